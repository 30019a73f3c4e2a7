"""The refill generator (finished rows take the next prompt): equal to one prompt at a time, seeded."""

from __future__ import annotations

import pytest
import torch

import medusa.selfdistill.backends.refill as R
from medusa.modeling import bf16_kernel, native_body
from medusa.modeling.cpu_linear import pack_linears

from tiny_models import STORIES, require_shared, stories_model, stories_tokenizer, tiny_model

TEXTS = ["Once upon a time", "Lily had a red ball. She", "The dog",
         "Tom and his mom went to the park. They saw",
         "One day, a little bird", "Sam", "The sun was hot and the children wanted to play in the water. So",
         "A big cat sat on the mat and"]


def _lone_generate(model, prompt, max_new, eos):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_refill_equals_one_prompt_at_a_time_greedy_float32(monkeypatch):
    require_shared(STORIES)
    tok, model = stories_tokenizer(), stories_model().float().eval()
    prompts = sorted((tok(t)["input_ids"] for t in TEXTS), key=len)  # shortest first: later rows need room
    period = tok(".", add_special_tokens=False)["input_ids"][-1]  # an "EOS" that ends rows at different steps
    monkeypatch.setattr(R, "COMPACT_EVERY", 4)  # compact often: shifts are exercised too
    admitted, shifts = [], []
    real_admit, real_shift = R.RefillLoop.admit, R.RefillLoop.shift_all
    monkeypatch.setattr(R.RefillLoop, "admit",
                        lambda self, t: (admitted.append(len(t)), real_admit(self, t))[1])
    monkeypatch.setattr(R.RefillLoop, "shift_all",
                        lambda self, d: (shifts.append(d), real_shift(self, d))[1])
    got = {i: (tokens, reason) for i, tokens, reason in R.generate_refill(
        model, prompts, max_new_tokens=12, batch_size=3, pad_id=0, eos_ids=[period])}
    assert sorted(got) == list(range(len(prompts)))
    for i, prompt in enumerate(prompts):
        ref = _lone_generate(model, prompt, 12, period)
        tokens, reason = got[i]
        assert tokens == ref, i
        assert reason == ("stop" if ref[-1] == period else "length")
    reasons = [r for _, r in got.values()]
    assert "stop" in reasons and "length" in reasons  # rows ended at different steps...
    assert len(admitted) > 2 and admitted[0] == 3  # ...and freed slots took the next prompts
    assert any(d < 0 for d in shifts) and any(d > 0 for d in shifts[1:])  # compaction and making room


def test_refill_sampling_is_seeded_and_top_k_1_is_greedy():
    require_shared(STORIES)
    tok, model = stories_tokenizer(), stories_model().float().eval()
    prompts = [tok(t)["input_ids"] for t in TEXTS[:4]]
    kw = dict(max_new_tokens=10, batch_size=2, pad_id=0, eos_ids=[2])

    def run(**more):
        return sorted(R.generate_refill(model, prompts, **kw, **more))

    assert run(temperature=1.0, seed=3) == run(temperature=1.0, seed=3)
    assert run(temperature=1.0, seed=3) != run(temperature=1.0, seed=4)
    assert run(temperature=0.7, top_k=1, seed=5) == run()


def test_refill_fits_the_tightest_buffer_in_any_prompt_order(monkeypatch):
    """The buffer holds longest prompt + max_new_tokens + COMPACT_EVERY columns: with COMPACT_EVERY = 1
    (the least room) and the longest prompt admitted among short ones, no step runs out of columns."""
    require_shared(STORIES)
    tok, model = stories_tokenizer(), stories_model().float().eval()
    prompts = [tok(t)["input_ids"] for t in TEXTS[::-1]]  # not sorted: a long prompt joins short ones
    monkeypatch.setattr(R, "COMPACT_EVERY", 1)
    got = {i: tokens for i, tokens, _ in R.generate_refill(model, prompts, max_new_tokens=9, batch_size=3,
                                                           pad_id=0, eos_ids=[2])}
    assert all(got[i] == _lone_generate(model, p, 9, 2) for i, p in enumerate(prompts))


def test_one_query_steps_leave_transformers_its_grouped_query_packing(monkeypatch):
    """Prefills read grouped K / V in place (``enable_gqa`` forced); one-query steps do not force it, so
    transformers folds each K / V head's query heads into one attention (``pack_gqa``, 4.6x faster on a CPU);
    the variable is restored afterwards."""
    require_shared(STORIES)
    tok, model = stories_tokenizer(), stories_model().to(torch.bfloat16).eval()
    assert model.model.layers[0].self_attn.num_key_value_groups > 1  # a grouped-query model
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "0")
    seen = []
    model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(
            (kwargs["hidden_states"].shape[1], R.os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA"))),
        with_kwargs=True)
    prompts = [tok(t)["input_ids"] for t in TEXTS[:3]]
    list(R.generate_refill(model, prompts, max_new_tokens=4, batch_size=2, pad_id=0, eos_ids=[]))
    assert {env for q, env in seen if q > 1} == {"1"}
    assert {env for q, env in seen if q == 1} == {None}
    assert R.os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] == "0"


@pytest.mark.skipif(not bf16_kernel.available(), reason="no native kernel on this CPU")
def test_bf16_steps_and_prompt_pieces_run_natively_and_reply_as_the_models_own_code(monkeypatch):
    """In bfloat16 every one-token step goes through the native body over the shared buffers (compaction
    included), and a prompt past its first FIRST_PIECE columns in pieces of at most MAX_ROWS tokens; on a
    model whose argmax is decisive the replies equal those of the model's own code
    (``MEDUSA_NATIVE_BODY=0``)."""
    model = tiny_model("llama", hidden_size=128, intermediate_size=256, layers=3).bfloat16()
    assert pack_linears(model) > 0
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 90, (int(n),), generator=g).tolist() for n in (5, 29, 3, 40, 17, 4, 33)]
    monkeypatch.setattr(R, "COMPACT_EVERY", 4)
    native_rows = []
    real = native_body.forward
    monkeypatch.setattr(native_body, "forward",
                        lambda *a, **k: (native_rows.append(tuple(a[1].shape)), real(*a, **k))[1])

    def run():
        return sorted(R.generate_refill(model, prompts, max_new_tokens=12, batch_size=3, pad_id=0,
                                        eos_ids=[]))

    got = run()
    steps = [shape for shape in native_rows if shape[1] == 1]
    pieces = [shape for shape in native_rows if shape[1] > 1]
    assert len(steps) >= 12 * len(prompts) // 3  # every step of three slots
    assert pieces and all(b * t <= native_body.MAX_ROWS for b, t in pieces)
    monkeypatch.setenv(native_body.ENV, "0")
    assert run() == got


def test_prompt_pieces_start_with_the_models_own_forward():
    loop = R.RefillLoop.__new__(R.RefillLoop)
    loop.native = ("body", "config")
    assert loop.pieces(3, 60) == [(0, 16), (16, 58), (58, 60)]  # 42 columns x 3 rows <= 128 tokens
    assert loop.pieces(3, 12) == [(0, 12)]
    assert loop.pieces(200, 60) == [(0, 60)]  # more rows than one native pass takes
    loop.native = None
    assert loop.pieces(3, 60) == [(0, 60)]


def test_prompts_of_like_length_are_prefilled_together():
    """Groups in length order, each one's longest at most LENGTH_SPREAD times its shortest (a left-padded
    batch then computes at most 20% of padding); every prompt in exactly one group."""
    assert R.length_groups([10, 12, 30, 11, 40, 13]) == [[0, 3, 1], [5], [2], [4]]
    lengths = [int(x) for x in torch.randint(5, 900, (64,), generator=torch.Generator().manual_seed(1))]
    groups = R.length_groups(lengths)
    assert sorted(j for g in groups for j in g) == list(range(64))
    for g in groups:
        longest, shortest = max(lengths[j] for j in g), min(lengths[j] for j in g)
        assert longest <= R.LENGTH_SPREAD * shortest
