import pytest
import torch

from medusa import MedusaModel, ResBlock
from medusa.modeling.base import lm_head_of

from tiny_models import ARCHITECTURES, stories_model, tiny_model

ARCHS = [a for a in ARCHITECTURES]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head"])
def test_heads_start_equal_to_lm_head(arch, head_type):
    base = tiny_model(arch)
    model = MedusaModel.from_base(base, num_heads=3, num_layers=2, head_type=head_type)
    hidden = torch.randn(2, 5, base.config.hidden_size)
    logits = model.heads(hidden)  # [K, B, T, V]
    assert logits.shape == (3, 2, 5, base.config.vocab_size)
    ref = lm_head_of(base)(hidden)
    for k in range(3):
        torch.testing.assert_close(logits[k], ref, rtol=0, atol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_matches_base_logits(arch):
    base = tiny_model(arch)
    model = MedusaModel.from_base(base, num_heads=2, num_layers=1)
    ids = torch.randint(3, base.config.vocab_size, (2, 7))
    with torch.no_grad():
        out = model(input_ids=ids)
        ref = base(input_ids=ids).logits
        picked = model(input_ids=ids, positions=torch.tensor([6, 2]))
        per_row = model(input_ids=ids, positions=torch.tensor([[1], [5]]))
    torch.testing.assert_close(out.logits, ref, rtol=1e-5, atol=1e-5)
    assert out.head_logits.shape == (2, 2, 7, base.config.vocab_size)
    assert out.hidden_states.shape == (2, 7, base.config.hidden_size)
    torch.testing.assert_close(picked.logits, ref[:, [6, 2]], rtol=1e-5, atol=1e-5)
    assert picked.head_logits.shape == (2, 2, 2, base.config.vocab_size)
    torch.testing.assert_close(per_row.logits[:, 0], torch.stack([ref[0, 1], ref[1, 5]]),
                               rtol=1e-5, atol=1e-5)


def test_layers_are_distinct_modules():
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=2, num_layers=2)
    b0, b1 = model.heads.blocks[0][0], model.heads.blocks[0][1]
    assert isinstance(b0, ResBlock) and b0 is not b1
    assert b0.linear.weight.data_ptr() != b1.linear.weight.data_ptr()
    with torch.no_grad():
        b0.linear.weight.add_(1.0)
    assert torch.count_nonzero(b1.linear.weight) == 0
    assert torch.count_nonzero(model.heads.blocks[1][0].linear.weight) == 0
    assert model.heads.lm_heads[0].weight.data_ptr() != model.heads.lm_heads[1].weight.data_ptr()


def test_resblock_is_identity_at_init():
    block = ResBlock(16)
    x = torch.randn(3, 16)
    torch.testing.assert_close(block(x), x, rtol=0, atol=0)


def test_tied_embeddings_copied_not_shared():
    base = tiny_model("gemma")  # Gemma ties the LM head to the input embeddings
    model = MedusaModel.from_base(base, num_heads=2)
    emb = base.get_input_embeddings().weight
    torch.testing.assert_close(model.heads.lm_heads[0].weight, emb)
    assert model.heads.lm_heads[0].weight.data_ptr() != emb.data_ptr()


def test_frozen_base_exposes_only_head_parameters():
    model = MedusaModel.from_base(tiny_model("qwen2"), num_heads=3)
    model.freeze_base()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("heads.") for n in trainable)
    assert len(trainable) == len(list(model.heads.parameters()))


def test_shared_lm_head_has_no_own_projection():
    base = tiny_model("llama")
    model = MedusaModel.from_base(base, num_heads=2, head_type="shared_lm_head")
    names = [n for n, _ in model.heads.named_parameters()]
    assert names and not any("lm_heads" in n for n in names)


def test_stories260k_heads():
    base = stories_model()
    model = MedusaModel.from_base(base, num_heads=4, num_layers=1)
    ids = torch.tensor([[1, 100, 200, 300]])
    with torch.no_grad():
        out = model(input_ids=ids)
        ref = base(input_ids=ids).logits
    torch.testing.assert_close(out.logits, ref, rtol=1e-5, atol=1e-5)
    for k in range(4):
        torch.testing.assert_close(out.head_logits[k], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head"])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_batched_inference_path_equals_per_head_modules(num_layers, head_type):
    base = tiny_model("llama")
    model = MedusaModel.from_base(base, num_heads=3, num_layers=num_layers, head_type=head_type)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    hidden = torch.randn(2, 5, base.config.hidden_size)
    reference = torch.stack([model.heads.head_logits(k, hidden) for k in range(3)]).detach()  # autograd path
    with torch.no_grad():
        batched = model.heads(hidden)
    torch.testing.assert_close(batched, reference, rtol=1e-5, atol=1e-5)
    # the stacked copy follows in-place weight updates (optimizer steps, load_state_dict)
    with torch.no_grad():
        model.heads.blocks[1][0].linear.weight.add_(0.5)
        again = model.heads(hidden)
    assert not torch.allclose(again[1], batched[1])
    torch.testing.assert_close(again[0], batched[0], rtol=0, atol=0)
    torch.testing.assert_close(again[1], model.heads.head_logits(1, hidden).detach(), rtol=1e-5, atol=1e-5)


def test_loaders_expand_a_home_relative_model_path(monkeypatch, tmp_path):
    """A recipe's ``model: ~/...`` (as the SmolLM2 recipe writes it) loads: the loaders expand ``~``."""
    from medusa.modeling.base import expand_home, load_base_model, load_tokenizer

    from tiny_models import STORIES, require_shared

    require_shared()
    (tmp_path / "m").symlink_to(STORIES)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert expand_home("~/m") == str(tmp_path / "m") and expand_home("org/name") == "org/name"
    assert load_base_model("~/m").config.vocab_size == 512
    assert load_tokenizer("~/m").vocab_size == 512
