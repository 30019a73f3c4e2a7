"""The local backend: refill generation (finished rows take the next prompt) with truncated rows kept, and
bitsandbytes NF4 loading."""

from __future__ import annotations

import json

from selfdistill_helpers import chat_tokenizer, tiny_chat_model

from medusa.selfdistill import SelfDistillConfig, self_distill
from medusa.selfdistill.backends.base import Sampling
from medusa.selfdistill.backends.local import LocalBackend

from tiny_models import STORIES, require_module, require_shared


def test_local_backend_uses_refill_and_keeps_truncated_rows(tmp_path):
    require_shared(STORIES)
    backend = LocalBackend(tiny_chat_model(), tokenizer=chat_tokenizer(), batch_size=2)
    assert backend.refill
    rows = [json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(5)]
    (tmp_path / "p.jsonl").write_text("".join(rows))
    s = self_distill(SelfDistillConfig(model="tiny-chat", prompts=str(tmp_path / "p.jsonl"),
                                       out=str(tmp_path / "o.jsonl"), on_length="keep", batch_size=2,
                                       sampling=Sampling(temperature=0.0, max_new_tokens=5), progress=False),
                     model=tiny_chat_model(), tokenizer=chat_tokenizer())
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert s["written"] == 5 and len(rows) == 5
    assert all(r["metadata"]["finish_reasons"] == ["length"] for r in rows)  # random weights: cut at 5 tokens


def test_local_backend_in_4bit(tmp_path):
    """bitsandbytes NF4 on CPU (its CPU kernels need layer widths that are multiples of 64)."""
    from medusa.selfdistill.backends import Request

    from tiny_models import tiny_model

    require_module("bitsandbytes")
    path = tmp_path / "m"
    tiny_model("llama", vocab_size=512, hidden_size=64, layers=1, intermediate_size=128).save_pretrained(path)
    chat_tokenizer().save_pretrained(path)
    backend = LocalBackend(str(path), load_in_4bit=True, batch_size=2)
    assert type(backend.model.model.layers[0].mlp.down_proj).__name__ == "Linear4bit"
    got = dict(backend.generate([Request(prompt="Once"),
                                 Request(messages=[{"role": "user", "content": "hi"}])],
                                Sampling(max_new_tokens=3)))
    assert sorted(got) == [0, 1] and all(r.completion_tokens == 3 and r.finish_reason == "length"
                                         for r in got.values())


def test_local_backend_from_a_path_packs_its_cpu_linears(tmp_path, monkeypatch):
    """A float32 model loaded by path runs its batched decode steps on pre-packed linears
    (medusa.modeling.cpu_linear); MEDUSA_CPU_PACK=0 keeps them stock. The replies are the same."""
    from medusa.modeling.cpu_linear import packed_count, packing_supported
    from medusa.selfdistill.backends import Request

    from tiny_models import tiny_model

    path = tmp_path / "m"
    tiny_model("llama", vocab_size=512, hidden_size=64, layers=1, intermediate_size=128).save_pretrained(path)
    chat_tokenizer().save_pretrained(path)
    requests = [Request(prompt="Once"), Request(prompt="Once upon"), Request(prompt="A")]
    packed = LocalBackend(str(path), batch_size=3, dtype="float32")
    assert (packed_count(packed.model) > 0) == packing_supported()
    monkeypatch.setenv("MEDUSA_CPU_PACK", "0")
    stock = LocalBackend(str(path), batch_size=3, dtype="float32")
    assert packed_count(stock.model) == 0
    sampling = Sampling(max_new_tokens=6)
    got = {i: (r.text, r.completion_tokens) for i, r in packed.generate(requests, sampling)}
    assert got == {i: (r.text, r.completion_tokens) for i, r in stock.generate(requests, sampling)}
    assert sorted(got) == [0, 1, 2] and all(n > 0 for _, n in got.values())
