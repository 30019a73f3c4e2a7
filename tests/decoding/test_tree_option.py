"""The user's tree option resolved once per run: the CLI's --tree / --nodes / --lookup-tokens, a draft tree
file for eagle3 heads, and the refusals that name what is wrong."""

import pytest

from medusa import MedusaModel, MedusaTree
from medusa.decoding.tree_option import DynamicTreeOption, resolve_tree, tree_option
from medusa.errors import MedusaError
from medusa.tree import DraftTreeShape

from tiny_models import tiny_model


def test_cli_options(tmp_path):
    assert tree_option(None) is None
    assert tree_option("dynamic", nodes=8) == DynamicTreeOption(8)
    assert tree_option("lookup", lookup_tokens=3) == "lookup"
    with pytest.raises(MedusaError, match="--nodes applies to --tree dynamic"):
        tree_option(None, nodes=8)
    with pytest.raises(MedusaError, match="needs --lookup-tokens"):
        tree_option("lookup")
    DraftTreeShape(8, 4, 2, 2).to_json(tmp_path / "draft.json")
    assert tree_option(str(tmp_path / "draft.json")) == DraftTreeShape(8, 4, 2, 2)
    MedusaTree.from_choices([[0], [1]]).to_json(tmp_path / "tree.json")
    assert isinstance(tree_option(str(tmp_path / "tree.json")), MedusaTree)


def test_resolve_for_each_head_family():
    base = tiny_model("llama", layers=4)
    medusa = MedusaModel.from_base(base, num_heads=2)
    choice = resolve_tree(medusa, MedusaTree.from_choices([[0], [0, 0]]), lookup_tokens=3)
    assert choice.static is not None and choice.lookup_tokens == 3 and choice.draft is None
    with pytest.raises(MedusaError, match="eagle3 heads"):
        resolve_tree(medusa, DraftTreeShape())
    eagle = MedusaModel.from_base(base, num_heads=2, head_type="eagle3")
    choice = resolve_tree(eagle, None, lookup_tokens=2)
    assert choice.draft == DraftTreeShape(lookup_tokens=2) and choice.depth == 5
    assert resolve_tree(eagle, "lookup", lookup_tokens=2).lookup_only
