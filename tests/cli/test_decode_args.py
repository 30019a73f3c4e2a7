"""The flags `medusa generate` and `medusa bench` share, defined once: the same options and defaults in
both."""

import argparse

from medusa.cli.decode_args import (
    add_checkpoint_args,
    add_output_length_args,
    add_sampling_args,
    add_tree_args,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_checkpoint_args(p, "heads")
    add_sampling_args(p)
    add_tree_args(p)
    add_output_length_args(p)
    return p


def test_shared_flags_parse(tmp_path):
    (tmp_path / "h").mkdir()
    args = _parser().parse_args(["--heads", str(tmp_path / "h"), "--top-k", "5", "--tree", "dynamic",
                                 "--nodes", "8", "--lookup-tokens", "4", "--max-new-tokens", "9"])
    got = (args.top_k, args.tree, args.nodes, args.lookup_tokens, args.max_new_tokens)
    assert got == (5, "dynamic", 8, 4, 9)
    defaults = _parser().parse_args(["--heads", str(tmp_path / "h")])
    assert defaults.max_new_tokens == 128 and defaults.temperature is None and defaults.tree is None


def test_generate_and_bench_take_the_same_decoding_flags():
    from medusa.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {name: {o for a in sub.choices[name]._actions for o in a.option_strings}
             for name in ("generate", "bench")}
    for flag in ("--heads", "--temperature", "--top-k", "--top-p", "--tree", "--nodes", "--lookup-tokens",
                 "--max-new-tokens", "--dtype"):
        assert flag in flags["generate"] and flag in flags["bench"], flag
