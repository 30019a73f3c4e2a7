"""The decoding arguments ``medusa generate`` and ``medusa bench`` share (one definition of each flag)."""

from __future__ import annotations

import argparse

from medusa.cli import LOOKUP_TOKENS, NEW_TOKENS, NODES, TEMPERATURE, TOP_K, TOP_P, PathKind

TREE_HELP = ("a tree.json, or 'dynamic': per step and row the --nodes most probable paths (scored by the "
             "calibrated path score when tree.json has one; 'dynamic-raw': by the heads' raw probabilities), "
             "'lookup': the context-lookup chain alone, no heads (needs --lookup-tokens >= 1), or 'plain': "
             "no drafts (our own plain decode) (default: the checkpoint's tree, else built-in)")


def add_checkpoint_args(p: argparse.ArgumentParser, heads_help: str) -> None:
    """``--heads`` (a checkpoint directory) and ``--base``."""
    p.add_argument("--heads", required=True, type=PathKind("dir"), help=heads_help)
    p.add_argument("--base", default=None, type=PathKind("model"),
                   help="base model path or id (default: the checkpoint's)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """``--temperature`` / ``--top-k`` / ``--top-p``, unset meaning the generation_config's (as HF)."""
    p.add_argument("--temperature", type=TEMPERATURE, default=None,
                   help="as HF generate (unset: the model's generation_config, then 1.0)")
    p.add_argument("--top-k", type=TOP_K, default=None,
                   help="as HF generate (unset: generation_config, then 50)")
    p.add_argument("--top-p", type=TOP_P, default=None,
                   help="as HF generate, in (0, 1] (unset: generation_config, then 1.0)")


def add_tree_args(p: argparse.ArgumentParser) -> None:
    """``--tree`` / ``--nodes`` / ``--lookup-tokens`` (resolved by
    :func:`medusa.decoding.tree_option.tree_option`)."""
    p.add_argument("--tree", default=None, type=PathKind("tree"), help=TREE_HELP)
    p.add_argument("--nodes", type=NODES, default=None, help="nodes of the dynamic tree (default 32)")
    p.add_argument("--lookup-tokens", type=LOOKUP_TOKENS, default=None, metavar="L",
                   help="verify a chain of L context-lookup tokens beside the heads' tree in the same "
                        "forward (0: heads only; default: the checkpoint tree's lookup_tokens)")


def add_output_length_args(p: argparse.ArgumentParser, max_new_help: str | None = None) -> None:
    """``--max-new-tokens`` and ``--dtype``."""
    p.add_argument("--max-new-tokens", type=NEW_TOKENS, default=128, help=max_new_help)
    p.add_argument("--dtype", default=None, help="base model dtype (float32 | bfloat16 | float16)")


__all__ = ["TREE_HELP", "add_checkpoint_args", "add_output_length_args", "add_sampling_args", "add_tree_args"]
