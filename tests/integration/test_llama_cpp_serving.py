"""The shipped SmolLM2 EAGLE-3 drafter, exported with ``medusa export --format gguf``, loads unmodified in the
pinned prebuilt llama-server (build 10434, its own venv: benchmarks.llama_cpp_env) beside SmolLM2 converted
to an f32 GGUF by llama.cpp's own converter; on chat-templated prompts, greedy, one thread, its drafts are
accepted and the text equals plain decoding's on every prompt.

The venv and the converted GGUFs are built once per session. Outside CI the test skips when the venv cannot
be built (no network, no wheel for this platform); in CI (MEDUSA_REQUIRE_SHARED=1) that fails. A minute or
two once the venv exists (six server starts, 3 prompts x 32 tokens each). ``--with-base`` writes the base
itself at f32 / bf16 / q4_1: served plain, its f32 text equals the converter's GGUF's and HF greedy's; the
drafter exported at bf16 (``--draft-precision bf16``) serves beside the bf16 base.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from real_models import smollm2_dir

from benchmarks.llama_cpp_env import LlamaCppUnavailable, convert_target, ensure_venv
from benchmarks.llama_cpp_server import LlamaServer, ServerConfig
from benchmarks.serve_check import chat_ids
from medusa.export import export_checkpoint

# llama.cpp's server and converter: run first (tests/conftest.py)
pytestmark = pytest.mark.heavy(200)

HEADS = Path(__file__).resolve().parents[2] / "data" / "heads" / "smollm2-135m-instruct" / "eagle3"
PROMPTS = ["What is the capital of France? Answer in one sentence.",
           "Write a Python function that reverses a string.",
           "List three facts about the moon."]
TOKENS = 32


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    base = smollm2_dir()
    try:
        ensure_venv()
    except LlamaCppUnavailable as exc:
        if os.environ.get("MEDUSA_REQUIRE_SHARED") == "1":
            pytest.fail(f"the llama.cpp venv cannot be built and MEDUSA_REQUIRE_SHARED=1: {exc}")
        pytest.skip(f"llama.cpp cannot be installed here: {exc}")
    root = tmp_path_factory.mktemp("llama_cpp")
    summary = export_checkpoint(HEADS, root / "export", "gguf", base=str(base))
    target = convert_target(base, "f32", root / "target-f32.gguf")
    ids = chat_ids(str(base), PROMPTS)
    out = {}
    draft = root / "export" / "draft.gguf"
    for cfg in (ServerConfig("plain"), ServerConfig("eagle3", "draft-eagle3", draft, 3)):
        with LlamaServer(target, cfg, root / f"{cfg.name}.log") as server:
            out[cfg.name] = [server.complete(p, TOKENS) for p in ids]
    return summary, out, root


@pytest.fixture(scope="session")
def with_base(served):
    """``--with-base`` at each precision (its own export folder), served plain on the same prompts."""
    _, _, root = served
    base = smollm2_dir()
    ids = chat_ids(str(base), PROMPTS)
    out = {}
    for precision in ("f32", "bf16", "q4_1"):
        folder = root / f"with-base-{precision}"
        export_checkpoint(HEADS, folder, "gguf", base=str(base), base_precision=precision,
                          draft_precision="bf16" if precision == "bf16" else None)
        with LlamaServer(folder / f"base-{precision}.gguf", ServerConfig("plain"),
                         root / f"base-{precision}.log") as server:
            out[precision] = [server.complete(p, TOKENS)["tokens"] for p in ids]
    # the bf16 drafter (--draft-precision bf16) beside the bf16 base, as a bf16 user serves it
    drafter = ServerConfig("eagle3", "draft-eagle3", root / "with-base-bf16" / "draft.gguf", 3)
    with LlamaServer(root / "with-base-bf16" / "base-bf16.gguf", drafter, root / "bf16-eagle3.log") as server:
        out["bf16 eagle3"] = [server.complete(p, TOKENS) for p in ids]
    return ids, out


def _hf_greedy(ids: list[list[int]]) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir()), dtype=torch.float32).eval()
    out = []
    for p in ids:
        x = torch.tensor([p])
        with torch.no_grad():
            y = model.generate(x, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False)
        out.append(y[0, len(p):].tolist())
    return out


def test_with_base_f32_greedy_equals_hf_and_the_converters_gguf(served, with_base):
    _, out, _ = served
    ids, texts = with_base
    assert texts["f32"] == [r["tokens"] for r in out["plain"]]  # llama.cpp's own converter, f32
    assert texts["f32"] == _hf_greedy(ids)


def test_with_base_bf16_and_q4_1_load_and_decode(with_base):
    _, texts = with_base
    for precision in ("bf16", "q4_1"):
        assert [len(t) for t in texts[precision]] == [TOKENS] * len(PROMPTS)
    # a tensor under the wrong name or unpermuted Q / K rows would give other text from the first token;
    # bf16 / Q4_1 rounding moves near-ties later on, so only the opening tokens must agree with f32
    assert all(b[:4] == f[:4] for b, f in zip(texts["bf16"], texts["f32"]))
    assert all(q[:2] == f[:2] for q, f in zip(texts["q4_1"], texts["f32"]))


def test_a_bf16_drafter_loads_beside_the_bf16_base_and_its_drafts_are_accepted(served, with_base):
    _, _, root = served
    _, texts = with_base
    runs = texts["bf16 eagle3"]
    log = (root / "bf16-eagle3.log").read_text(errors="replace")
    draft = log[log.index("loading draft model"):]  # the drafter's own loader lines: 9 matrices, 4 norms
    assert re.search(r"type bf16: +9 tensors", draft) and re.search(r"type +f32: +4 tensors", draft)
    assert sum(r["draft_n_accepted"] for r in runs) > 0
    # verifying drafts in one batch rounds bf16 near-ties otherwise than one token at a time (as our own
    # decoder's bf16 does): the opening tokens must agree with plain bf16 decoding
    assert all(r["tokens"][:4] == p[:4] for r, p in zip(runs, texts["bf16"]))


def test_the_export_loads_and_its_drafts_are_accepted(served):
    summary, out, root = served
    assert summary["format"] == "gguf" and summary["target_layers"] == [2, 15, 27]
    log = (root / "eagle3.log").read_text(errors="replace")
    assert "EAGLE3 using d2t mapping (draft_vocab_size = 8192)" in log
    drafted = sum(r["draft_n"] for r in out["eagle3"])
    accepted = sum(r["draft_n_accepted"] for r in out["eagle3"])
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    assert all(r["draft_n"] == 0 for r in out["plain"])


def test_greedy_text_equals_plain(served):
    _, out, _ = served
    for plain, spec in zip(out["plain"], out["eagle3"]):
        assert len(plain["tokens"]) == TOKENS
        assert spec["tokens"] == plain["tokens"]
