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


@pytest.mark.parametrize("head_type", ["linear", "shared_lm_head"])
def test_interface_methods_of_medusa_heads(head_type):
    """MEDUSA heads read the hidden state alone: teacher_inputs is the hidden state, hidden_logits the
    forward; head_topk(k) is topk's row k."""
    heads = MedusaModel.from_base(tiny_model("llama"), num_heads=3, head_type=head_type).heads
    torch.manual_seed(0)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hidden = torch.randn(2, 4, 32)
    assert heads.teacher_inputs(hidden, torch.zeros(2, 4, dtype=torch.long)) is hidden
    assert heads.teacher_inputs(hidden, None) is hidden
    with torch.no_grad():
        assert torch.equal(heads.hidden_logits(hidden), heads(hidden))
    top = heads.topk(hidden, 5)  # [K, 2, 4, 5]
    for k in range(3):
        assert torch.equal(heads.head_topk(k, hidden, 5), top[k])


def test_shared_lm_head_is_held_outside_the_module_tree_and_bind_base_rebinds_it():
    base = tiny_model("llama")
    heads = MedusaModel.from_base(base, num_heads=2, head_type="shared_lm_head").heads
    assert heads.shared_lm_head is lm_head_of(base)
    assert not any(k.startswith("lm_head") or "_shared" in k for k in heads.state_dict())
    assert all(p is not base.lm_head.weight for p in heads.parameters())
    other = tiny_model("llama", seed=1)
    heads.bind_base(other)
    assert heads.shared_lm_head is lm_head_of(other)
    own = MedusaModel.from_base(base, num_heads=2).heads
    own.bind_base(other)  # heads with their own W2 read no LM head
    assert own.shared_lm_head is None


def test_stacked_cache_is_rebuilt_when_a_weight_changes():
    heads = MedusaModel.from_base(tiny_model("llama"), num_heads=2, num_layers=1).heads
    hidden = torch.randn(1, 3, 32)
    with torch.no_grad():
        heads(hidden)
        first = heads._stacked
        heads(hidden)
        assert heads._stacked is first  # reused
        heads.blocks[0][0].linear.weight.add_(0.5)
        out = heads(hidden)
        assert heads._stacked is not first
    with torch.enable_grad():
        ref = torch.stack([heads.head_logits(k, hidden) for k in range(2)]).detach()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
