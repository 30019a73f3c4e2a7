"""medusa.export.common: the canonical heads every format is written from (shapes checked), tensor names per
format, reading our checkpoint (W2 per head, once, or not at all), tokenizer files, the tree's depth."""

import json

import pytest
import torch
from export_helpers import checkpoint, save_tiny_base
from safetensors.torch import load_file, save_file

from medusa.errors import CheckpointError, MedusaError
from medusa.export.common import (
    HeadsState,
    copy_tokenizer,
    named_tensors,
    read_json,
    read_our_checkpoint,
    require_tree_fits,
)

D, V = 4, 6


def _heads(k=2, layers=1, w2=True, **kw) -> HeadsState:
    w1 = [[torch.full((D, D), float(10 * h + l)) for l in range(layers)] for h in range(k)]
    b1 = [[torch.full((D,), float(10 * h + l)) for l in range(layers)] for h in range(k)]
    return HeadsState(w1, b1, [torch.full((V, D), float(h)) for h in range(k)] if w2 else None, **kw)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny_base(tmp_path_factory.mktemp("base") / "llama")


def test_properties_and_a_consistent_state_passes():
    heads = _heads(k=3, layers=2)
    heads.check("x")
    assert (heads.num_heads, heads.num_layers, heads.hidden_size, heads.vocab_size) == (3, 2, D, V)
    shared = _heads(w2=False)
    shared.check("x")
    assert shared.shared_lm_head and shared.vocab_size is None and shared.hidden_size == D


@pytest.mark.parametrize("break_it, message", [
    (lambda h: h.w1.clear() or h.b1.clear(), "holds no heads"),
    (lambda h: h.w1[1].pop(), "head 1 has 0 layer"),
    (lambda h: h.w2.__setitem__(1, torch.zeros(V + 1, D)),
     r"head 1 W2 has shape \(7, 4\), expected \(6, 4\)"),
    (lambda h: h.b1[0].__setitem__(0, torch.zeros(D + 1)), r"head 0 layer 0 has W1 \(4, 4\) / bias \(5,\)"),
    (lambda h: h.b1.pop(), "ResBlocks found for 2 heads but biases for 1 and W2 for 2"),
])
def test_inconsistent_states_name_the_source_and_the_culprit(break_it, message):
    heads = _heads()
    break_it(heads)
    with pytest.raises(CheckpointError, match=rf"^src\.safetensors: .*{message}"):
        heads.check("src.safetensors")


def test_token_map_and_tied_w2_rules():
    with pytest.raises(CheckpointError, match="a token_map needs the full vocabulary size"):
        _heads(token_map=torch.arange(V)).check("s")
    with pytest.raises(CheckpointError, match="W2 has 6 rows but token_map 5 ids"):
        _heads(token_map=torch.arange(5), full_vocab_size=50).check("s")
    with pytest.raises(ValueError, match="one and the same tensor"):
        _heads(tied_w2=True).check("s")  # two distinct W2 tensors
    with pytest.raises(CheckpointError, match="would all be the base LM head"):
        _heads(layers=0, w2=False).check("s")


def test_named_tensors_fill_each_format_template():
    heads = _heads(k=2, layers=1)
    names = named_tensors(heads, "{k}.{l}.linear", "{k}.{n}.weight")
    assert sorted(names) == ["0.0.linear.bias", "0.0.linear.weight", "0.1.weight",
                             "1.0.linear.bias", "1.0.linear.weight", "1.1.weight"]
    assert torch.equal(names["1.0.linear.weight"], heads.w1[1][0]) and torch.equal(names["1.1.weight"],
                                                                                   heads.w2[1])
    with pytest.raises(ValueError, match="needed exactly when the heads have their own W2"):
        named_tensors(heads, "{k}.{l}.linear", None)
    shared = _heads(w2=False)
    assert sorted(named_tensors(shared, "b.{k}.{l}", None)) == ["b.0.0.bias", "b.0.0.weight", "b.1.0.bias",
                                                                "b.1.0.weight"]
    one = torch.zeros(V, D)
    tied = HeadsState(shared.w1, shared.b1, [one, one], tied_w2=True)
    assert "lm_head.weight" in named_tensors(tied, "b.{k}.{l}", "lm_head.weight")
    with pytest.raises(ValueError, match="has \\{k\\} exactly when every head has a W2 of its own"):
        named_tensors(tied, "b.{k}.{l}", "lm_heads.{k}.weight")


def test_read_our_checkpoint_materialises_w2_as_asked(tmp_path, base_dir):
    ck, model = checkpoint(tmp_path, base_dir, num_heads=2, num_layers=1, head_type="shared_lm_head")
    lm = model.base_model.get_output_embeddings().weight
    config, per_head = read_our_checkpoint(ck)
    assert config.head_type == "shared_lm_head" and per_head.num_heads == 2 and not per_head.tied_w2
    assert all(torch.equal(w, lm) for w in per_head.w2) and per_head.w2[0] is not per_head.w2[1]
    _, once = read_our_checkpoint(ck, materialise="once")
    assert once.tied_w2 and once.w2[0] is once.w2[1] and torch.equal(once.w2[0], lm)
    _, none = read_our_checkpoint(ck, materialise="none")
    assert none.shared_lm_head and none.choices is None
    with pytest.raises(ValueError, match="materialise='twice'"):
        read_our_checkpoint(ck, materialise="twice")
    state = load_file(str(ck / "medusa_heads.safetensors"))
    del state["blocks.1.0.linear.bias"]
    save_file(state, str(ck / "medusa_heads.safetensors"))
    with pytest.raises(CheckpointError, match="missing tensor blocks.1.0.linear.bias"):
        read_our_checkpoint(ck, materialise="none")


def test_read_json_copy_tokenizer_and_tree_depth(tmp_path):
    with pytest.raises(CheckpointError, match="c.json: not found"):
        read_json(tmp_path / "c.json")
    (tmp_path / "c.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        read_json(tmp_path / "c.json")
    (tmp_path / "c.json").write_text("{oops")
    with pytest.raises(CheckpointError, match="c.json: corrupt JSON"):
        read_json(tmp_path / "c.json")
    src, out = tmp_path / "tok", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "tokenizer.json").write_text(json.dumps({"v": 1}))
    (src / "merges.txt").write_text("a b\n")
    (src / "model.safetensors").write_bytes(b"weights")
    assert copy_tokenizer(str(src), out) == ["tokenizer.json", "merges.txt"]
    assert sorted(p.name for p in out.iterdir()) == ["merges.txt", "tokenizer.json"]
    assert copy_tokenizer("org/hub-model", out) == [] and copy_tokenizer("", out) == []
    require_tree_fits([[0], [0, 1], [1]], 2, "tree.json")
    with pytest.raises(MedusaError, match="tree.json: tree depth 3 is deeper than the 2 heads"):
        require_tree_fits([[0], [0, 0, 0]], 2, "tree.json")
