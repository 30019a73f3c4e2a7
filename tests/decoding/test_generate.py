"""Greedy MEDUSA decoding returns exactly the tokens of ``base_model.generate(do_sample=False)``."""

import pytest
import torch
from decoding_helpers import left_padded_batch, memorise_heads, randomize_heads, real_rows

from medusa import MedusaModel, MedusaTree
from medusa.errors import MedusaError

from tiny_models import ARCHITECTURES, tiny_model

NEW = 72
SMALL_TREE = MedusaTree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0],
                                      [0, 0, 1], [0, 0, 0, 0]])


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("heads", ["random-mostly-root-path", "fitted"])
def test_greedy_equals_hf_generate(arch, heads):
    """Random heads are rarely accepted: the root path and rejected proposals (at most depth 1 accepted);
    fitted heads: long accepted runs."""
    base = tiny_model(arch)
    ids, mask = left_padded_batch(base.config.vocab_size, seed=ARCHITECTURES.index(arch))
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW)
    ref1 = base.generate(ids[:1], do_sample=False, max_new_tokens=NEW)
    model = MedusaModel.from_base(base, num_heads=4)
    if heads != "fitted":
        randomize_heads(model)
    else:
        memorise_heads(model, real_rows(ref, mask, base.generation_config.eos_token_id))
    tree = SMALL_TREE if heads != "fitted" else None  # fitted heads decode with the default 64-node tree
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, tree=tree,
                         return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    one = model.generate(ids[:1], max_new_tokens=NEW, tree=tree, return_dict_in_generate=True)
    assert torch.equal(one.sequences, ref1)
    produced = [sum(a) + 1 for a in out.accept_lengths]  # +1: the prefill's token
    assert max(produced) == ref.shape[1] - ids.shape[1]
    if heads == "fitted":  # long accepted runs (and hence cache compaction) really happened
        assert one.tokens_per_step > 2.0, one.accept_lengths
        assert max(max(a) for a in out.accept_lengths) >= 4


def test_exact_max_new_tokens_and_eos_list():
    base = tiny_model("llama")
    model = MedusaModel.from_base(base, num_heads=4)
    ids, mask = left_padded_batch(base.config.vocab_size, seed=3)
    plain = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, eos_token_id=None)
    memorise_heads(model, real_rows(plain, mask)[:2], steps=150)  # rows 0 and 1 accept long runs, row 2 not
    for new in (1, 2, 5, 17):
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, eos_token_id=[], tree=SMALL_TREE)
        assert out.shape == (3, ids.shape[1] + new)
        ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, min_new_tokens=new)
        assert torch.equal(out, ref)
    # Stop at an EOS list: pick tokens the rows actually produce; each row stops at its first one.
    full = model.generate(ids, attention_mask=mask, max_new_tokens=30, eos_token_id=[], tree=SMALL_TREE)
    new_part = full[:, ids.shape[1]:]
    eos = [int(new_part[0, 5]), int(new_part[1, 9])]
    stopped = model.generate(ids, attention_mask=mask, max_new_tokens=30, eos_token_id=eos, tree=SMALL_TREE,
                             return_dict_in_generate=True)
    out = stopped.sequences
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, eos_token_id=eos,
                        pad_token_id=0)
    assert torch.equal(out, ref)
    assert max(stopped.accept_lengths[0]) >= 3 and max(stopped.accept_lengths[1]) >= 3  # runs cut at EOS
    for row in range(3):
        gen = out[row, ids.shape[1]:].tolist()
        hits = [i for i, t in enumerate(gen) if t in eos]
        if hits:
            assert all(t == 0 for t in gen[hits[0] + 1:])


def test_streamer_gets_prompt_then_every_token():
    class Collect:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.view(-1).tolist())

        def end(self):
            self.ended = True

    base = tiny_model("qwen2")
    model = MedusaModel.from_base(base, num_heads=3)
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(5))
    memorise_heads(model, [base.generate(ids, do_sample=False, max_new_tokens=20, eos_token_id=None)[0]],
                   steps=150)
    streamer = Collect()
    out = model.generate(ids, max_new_tokens=20, streamer=streamer, eos_token_id=[])
    assert streamer.ended and streamer.chunks[0] == ids[0].tolist()
    assert [t for c in streamer.chunks[1:] for t in c] == out[0, 6:].tolist()
    assert max(len(c) for c in streamer.chunks[1:]) >= 3  # an accepted run arrives as one chunk
    with pytest.raises(MedusaError, match="batch size 1"):
        model.generate(torch.ones(2, 3, dtype=torch.long), streamer=Collect())


def test_user_errors():
    base = tiny_model("llama")
    model = MedusaModel.from_base(base, num_heads=2)
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(MedusaError, match="acceptance"):
        model.generate(ids, acceptance="beam")
    with pytest.raises(MedusaError, match="depth 3 exceeds"):
        model.generate(ids, tree=MedusaTree.from_choices([[0], [0, 0], [0, 0, 0]]))
    with pytest.raises(MedusaError, match="right-padded"):
        model.generate(torch.tensor([[5, 6, 0], [5, 6, 7]]),
                       attention_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]))
    with pytest.raises(MedusaError, match="temperature"):
        model.generate(ids, acceptance="sample", temperature=0.0)


def test_flash_attention_is_a_clear_error():
    base = tiny_model("llama")
    base.config._attn_implementation = "flash_attention_2"
    model = MedusaModel.from_base(base, num_heads=2)
    with pytest.raises(MedusaError, match="4-D tree attention mask"):
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4)
