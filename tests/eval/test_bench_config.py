"""The bench report's ``config``: the lookup keys (the MEDUSA row's chain, the compared L) and what was
measured on what (the full bench run: tests/eval/test_bench.py)."""

from types import SimpleNamespace

from medusa import MedusaTree
from medusa.eval.bench_config import bench_config, lookup_config


def _setup(model, tree=None, lookup_tokens=None, compare_lookup=0):
    return SimpleNamespace(model=model, tree=tree, lookup_tokens=lookup_tokens, compare_lookup=compare_lookup,
                           max_new_tokens=8, acceptance="greedy", temperature=None, top_k=None, top_p=None,
                           seed=0)


def test_lookup_config_resolves_the_chain_as_generate_does(stories_medusa):
    model = stories_medusa
    assert lookup_config(_setup(model)) == {"lookup_tokens": getattr(model.tree, "lookup_tokens", 0),
                                            "compare_lookup": None}
    tree = MedusaTree.from_choices([[0], [1]], lookup_tokens=6)
    assert lookup_config(_setup(model, tree)) == {"lookup_tokens": 6, "compare_lookup": None}
    assert lookup_config(_setup(model, tree, lookup_tokens=0, compare_lookup=4)) == {
        "lookup_tokens": 0, "compare_lookup": 4}
    assert lookup_config(_setup(model, "lookup", lookup_tokens=3))["lookup_tokens"] == 3
    assert lookup_config(_setup(model, "dynamic:8"))["lookup_tokens"] == 0


def test_bench_config_names_the_tree_and_the_machine(stories_medusa):
    model = stories_medusa
    tree = MedusaTree.from_choices([[0], [1], [0, 0]])
    cfg = bench_config(_setup(model, tree), None, prompt_lookup=True, lookup_tokens=10, repeats=2,
                       ignore_eos=True)
    assert cfg["tree_nodes"] == 4 and cfg["tree_kind"] == "static" and cfg["tree_source"] == "given"
    assert cfg["prompt_lookup_num_tokens"] == 10 and cfg["repeats"] == 2 and cfg["assistant_model"] is None
    assert cfg["dtype"] == "float32" and "CPU" in cfg["hardware"]
    alone = bench_config(_setup(model, "lookup", lookup_tokens=5), None, prompt_lookup=False,
                         lookup_tokens=10, repeats=1, ignore_eos=False)
    assert alone["tree_nodes"] == 6 and alone["tree_kind"] == "lookup"
    assert alone["prompt_lookup_num_tokens"] is None
