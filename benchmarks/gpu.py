"""GPU harness: ``python -m benchmarks.gpu --out DIR`` (on a CUDA machine, with the torch / transformers
it already has; ``PYTHONPATH=.``). Measures, and writes ``DIR/gpu_report.json``, then prints a short table:

1. verification-step cost on random-weight 7B-shaped models (Llama-2-7B, Llama-3-8B shapes; SDPA; bf16):
   a 1-node step (the plain 1-token step through the same static path) and 4 / 16 / 32 / 64-node tree
   verification, eager and compiled (CUDA graphs); overhead = verify(N) / verify(1);
2. MEDUSA vs HF generate on stories260K (eager vs eager, static+compiled vs static+compiled), greedy, with
   the exact-match check; ``--heads DIR``: trained stories260K heads (e.g. ``out/bench/stories260k/final``,
   carried to the machine) instead of random ones, so tokens/step is the trained one;
3. greedy fidelity per dtype (float32, bfloat16, and float16 on CUDA): the share of prompts whose MEDUSA
   output is identical to HF's, and where / at which top-2 logit margin the others diverge
   (:mod:`benchmarks.low_precision`);
4. the two drafter kinds' decoding step in bfloat16 on a random-weight 7B-shaped model: 4 MEDUSA heads (the
   built-in tree) and an EAGLE-3 drafter (its grown tree, a draft-layer pass per level), ms per step beside HF
   ``generate``'s ms per token and the share of tokens equal to HF greedy (random weights draft ~1 token a
   step: this is what a step costs, not what it gains);
5. data generation: completion-mode self-distillation (the local backend, batches of 32) of TinyStories
   prompts with stories260K, and with a random 7B-shaped model over stories260K's tokenizer, tokens/s;
6. the decoding tests (``pytest``), pass / fail recorded.

``--device cpu --small`` runs the same code on tiny shapes and a few steps (for the CI test of this module).
On a device machine it needs only the checkout and stories260K + the TinyStories sample, found in
``../shared`` or in a ``shared/`` folder inside the checkout (what a device call carries; ~5 MB)::

    mkdir -p shared/models shared/data && cp -r ../shared/models/stories260K shared/models/ \
        && cp ../shared/data/tinystories_sample.txt shared/data/ && echo /shared/ >> .git/info/exclude
    PYTHONPATH=. python3 -m benchmarks.gpu --out $OUT/gpu     # about 6 minutes on one H100
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.low_precision import STORY_PROMPTS, greedy_identity
from medusa import MedusaModel
from medusa.decoding.compiled import compact_function, verify_function
from medusa.decoding.generate import prefill
from medusa.decoding.kv_cache import cache_bucket
from medusa.decoding.proposals import choose_proposer
from medusa.decoding.static_cache import static_prefill
from medusa.decoding.tree_option import TreeChoice
from medusa.decoding.trees import static_tree
from medusa.demo.stages import distill
from medusa.eval.bench import bench
from medusa.eval.timing import sync
from medusa.modeling.base import load_base_model, load_tokenizer
from medusa.tree import DraftTreeShape, MedusaTree, default_tree

SHAPES = {  # hidden, intermediate, layers, heads, kv heads, vocab
    "llama2-7b": (4096, 11008, 32, 32, 32, 32000),
    "llama3-8b": (4096, 14336, 32, 32, 8, 128256),
}
SMALL_SHAPES = {"tiny-llama": (64, 128, 4, 4, 2, 512)}
NODES = (1, 4, 16, 32, 64)
SMALL_NODES = (1, 4)  # --small: the same compiled path, two trees to compile instead of five
ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """``shared/`` inside the checkout when it holds stories260K (a device call carries it), else
    ``../shared``."""
    inside = ROOT / "shared"
    return inside if (inside / "models" / "stories260K").is_dir() else ROOT.parent / "shared"


STORIES = shared_dir() / "models" / "stories260K"


def random_base(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> Any:
    """A random-weight Llama of ``shape`` (no EOS: every decode runs its whole budget)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, inter, layers, heads, kv, vocab = shape
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                      attn_implementation="sdpa", max_position_embeddings=4096, eos_token_id=None,
                      bos_token_id=1, pad_token_id=0)
    with torch.device(device):
        base = LlamaForCausalLM(cfg).to(dtype).eval()
    base.generation_config.eos_token_id = None
    return base


def _random_medusa(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> Any:
    base = random_base(shape, device, dtype)
    return MedusaModel.from_base(base, num_heads=4).to(device=device, dtype=dtype).eval()


def _tree(nodes: int) -> Any:

    return MedusaTree.from_choices([]) if nodes == 1 else default_tree(4, nodes)


def _time_verify(model: Any, nodes: int, compile: bool, prompt: int, steps: int) -> float:
    """Median seconds of one verify forward of a ``nodes``-node tree after a ``prompt``-token prefill."""

    device = model.device
    tree, dtype = _tree(nodes), next(model.parameters()).dtype
    dt = static_tree(tree, device, dtype)
    ids = torch.randint(3, model.base_model.config.vocab_size, (1, prompt), device=device)
    verify = verify_function(model, compile)
    with torch.no_grad():
        new_cache = functools.partial(static_prefill, num_nodes=dt.num_nodes,
                                      capacity=cache_bucket(prompt + 2 * nodes + 8), dtype=dt.dtype,
                                      compact_fn=compact_function(model, compile))
        proposer = choose_proposer(model.heads, TreeChoice(static=tree), device, dtype)
        state = prefill(model, ids, torch.ones_like(ids), proposer, new_cache=new_cache)
        tokens = state.proposer.propose(state.root, state.hidden).tokens  # [1, N]
        pos = state.n_valid.view(1, 1) + dt.depths.view(1, -1)
        times = []
        for _ in range(steps + 2):  # the first two: compilation / CUDA-graph recording
            if compile and device.type == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            t0 = time.perf_counter()
            verify(model, state.cache, tokens, pos, dt.float_mask)
            sync(device)
            times.append(time.perf_counter() - t0)
    return sorted(times[2:])[len(times[2:]) // 2]


def step_costs(shapes: dict[str, tuple[int, ...]], device: torch.device, dtype: torch.dtype, steps: int,
               prompt: int, nodes: Sequence[int] = NODES) -> list[dict[str, Any]]:
    """Per shape and mode: verify(N) seconds and overhead verify(N) / verify(1)."""
    rows = []
    for name, shape in shapes.items():
        model = _random_medusa(shape, device, dtype)
        for compile in (False, True):
            times = {n: _time_verify(model, n, compile, prompt, steps) for n in nodes}
            rows.append({"shape": name, "compiled": compile,
                         "step_ms": {n: 1e3 * t for n, t in times.items()},
                         "overhead": {n: times[n] / times[1] for n in nodes}})
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def stories_model(device: torch.device, dtype: torch.dtype, heads: str | None) -> Any:
    """stories260K with ``heads`` (a trained checkpoint, its tree) or 4 random heads (the built-in tree)."""

    base = load_base_model(str(STORIES), dtype=dtype).to(device).eval()
    if heads is None:
        return MedusaModel.from_base(base, num_heads=4).to(device=device, dtype=dtype).eval()
    return MedusaModel.from_pretrained(heads, base_model=base).to(device=device, dtype=dtype).eval()


def stories_vs_hf(device: torch.device, max_new_tokens: int, prompts: Sequence[str],
                  heads: str | None = None) -> dict[str, Any]:
    """MEDUSA vs HF on stories260K, eager and compiled (random heads: tokens/step is not a trained one)."""

    model = stories_model(device, torch.float32, heads)
    report = bench(model, load_tokenizer(str(STORIES)), prompts, max_new_tokens=max_new_tokens,
                   progress=False, compile=True, plain_step_samples=4)
    return {**report["compiled"], "heads": heads or "random", "tokens_per_step": report["tokens_per_step"]}


def fidelity(device: torch.device, max_new_tokens: int, prompts: Sequence[str], heads: str | None
             ) -> list[dict[str, Any]]:
    """:func:`benchmarks.low_precision.greedy_identity` in float32, bfloat16 (and float16 on CUDA)."""

    dtypes = [torch.float32, torch.bfloat16] + ([torch.float16] if device.type == "cuda" else [])
    return [greedy_identity(stories_model(device, dtype, heads), load_tokenizer(str(STORIES)), prompts,
                            max_new_tokens) for dtype in dtypes]


def _timed(fn: Any, device: torch.device) -> tuple[float, Any]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def drafter_steps(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype, new_tokens: int,
                  prompt: int) -> list[dict[str, Any]]:
    """Per drafter kind on one random base in ``dtype``: ms per decoding step (second of two runs) against HF
    greedy ``generate``'s ms per token, tokens per step, and the share of new tokens equal to HF's."""
    base = random_base(shape, device, dtype)
    ids = torch.randint(3, shape[-1], (1, prompt), device=device)
    with torch.no_grad():
        base.generate(ids, max_new_tokens=4, do_sample=False)  # warm-up
        hf_s, ref = _timed(lambda: base.generate(ids, max_new_tokens=new_tokens, do_sample=False), device)
    rows = []
    for kind, head_type, tree in (("medusa", "linear", None), ("eagle3", "eagle3", DraftTreeShape())):
        model = MedusaModel.from_base(base, num_heads=4, head_type=head_type).to(device=device, dtype=dtype)
        if tree is not None:
            model.tree = tree
        run = functools.partial(model.generate, ids, max_new_tokens=new_tokens, return_dict_in_generate=True)
        with torch.no_grad():
            run()  # warm-up
            seconds, out = _timed(run, device)
        steps, n = len(out.accept_lengths[0]), min(out.sequences.shape[1], ref.shape[1]) - prompt
        equal = (out.sequences[0, prompt:prompt + n] == ref[0, prompt:prompt + n]).float().mean()
        rows.append({"drafter": kind, "dtype": str(dtype).replace("torch.", ""), "steps": steps,
                     "tokens_per_step": (out.sequences.shape[1] - prompt) / steps,
                     "step_ms": 1e3 * seconds / steps, "hf_token_ms": 1e3 * hf_s / (ref.shape[1] - prompt),
                     "equal_to_hf": float(equal)})
        del model
    return rows


def data_generation(device: torch.device, out: Path, shapes: dict[str, tuple[int, ...]], rows: int,
                    new_tokens: int) -> list[dict[str, Any]]:
    """Completion-mode self-distillation of ``rows`` TinyStories first sentences (batches of 32): stories260K
    and, per shape, a random model of that shape over stories260K's tokenizer (vocabulary 512)."""
    text = (shared_dir() / "data" / "tinystories_sample.txt").read_text()
    firsts = [s.strip().split(". ")[0] + "." for s in text.split("\n\n") if s.strip()][:rows]
    prompts = out / "distill_prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in firsts))
    tokenizer = load_tokenizer(str(STORIES))
    models = {"stories260K": lambda: load_base_model(str(STORIES), dtype=torch.bfloat16).to(device).eval()}
    models.update({name: functools.partial(random_base, (*shape[:-1], 512), device, torch.bfloat16)
                   for name, shape in shapes.items()})
    report = []
    for name, make in models.items():
        target = out / f"distill_{name}.jsonl"
        target.unlink(missing_ok=True)
        s = distill(name, prompts, target, new_tokens, batch_size=32, progress=False, model=make(),
                    tokenizer=tokenizer)
        report.append({"model": name, "rows": s["written"], "completion_tokens": s["completion_tokens"],
                       "tokens_per_s": s["tokens_per_s"]})
    return report


def run_tests(small: bool) -> dict[str, Any]:
    """The decoding step's tests in a subprocess (CPU tests: on a GPU machine they check the code, not CUDA;
    ``tests/decoding/test_step.py`` only, so the whole script stays within 10 minutes)."""
    small_target = "tests/decoding/test_static_cache.py::test_cache_bucket_and_errors"
    target = [small_target] if small else ["tests/decoding/test_step.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *target],
                          capture_output=True, text=True)
    return {"target": target, "returncode": proc.returncode, "tail": proc.stdout[-400:]}


def format_table(report: dict[str, Any]) -> str:
    nodes = list(report["step_costs"][0]["step_ms"])
    lines = ["shape        mode      " + "  ".join(f"N={n:<3d}ms/ovh  " for n in nodes)]
    for r in report["step_costs"]:
        cells = "  ".join(f"{r['step_ms'][n]:7.2f}/{r['overhead'][n]:4.2f}" for n in nodes)
        lines.append(f"{r['shape']:<12} {'compiled' if r['compiled'] else 'eager':<9} {cells}")
    s = report["stories"]
    lines.append(f"stories260K: eager {s['eager_speedup']:.2f}x, compiled "
                 f"{s['compiled_speedup']:.2f}x over HF (same mode); exact match {s['compiled_exact_match']}")
    for f in report["fidelity"]:
        lines.append(f"greedy identical to HF, {f['dtype']}: {f['identical']}/{f['prompts']} prompts "
                     f"({f['near_tie_divergences']} divergences at a near-tie); control, HF without vs with "
                     f"its KV cache: {f['hf_no_cache_identical_share']:.2f} identical")
    for d in report["drafters"]:
        lines.append(f"{d['drafter']:<7} {d['dtype']}: {d['step_ms']:.2f} ms/step, "
                     f"{d['tokens_per_step']:.2f} tokens/step; HF {d['hf_token_ms']:.2f} ms/token; "
                     f"equal to HF {d['equal_to_hf']:.2f}")
    for g in report["data_generation"]:
        lines.append(f"self-distill {g['model']}: {g['rows']} rows, {g['tokens_per_s']:.0f} tokens/s")
    lines.append(f"tests: rc={report['tests']['returncode']} {report['tests']['target']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true",
                   help="tiny shapes and a few steps (CPU check of the harness)")
    p.add_argument("--heads", default=None, help="trained stories260K heads (default: random heads)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    small = args.small
    shapes = SMALL_SHAPES if small else SHAPES
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = ["Once upon a time"] if small else STORY_PROMPTS
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "small": small, "torch": torch.__version__,
        "step_costs": step_costs(shapes, device,
                                 torch.float32 if small else torch.bfloat16, 3 if small else 20,
                                 16 if small else 512, SMALL_NODES if small else NODES),
        "stories": stories_vs_hf(device, 8 if small else 128, prompts, args.heads),
        "fidelity": fidelity(device, 8 if small else 128, prompts, args.heads),
        "drafters": drafter_steps(shapes["llama2-7b"] if not small else shapes["tiny-llama"], device,
                                  torch.bfloat16, 8 if small else 128, 16 if small else 256),
        "data_generation": data_generation(device, out, {} if small else {"llama2-7b": shapes["llama2-7b"]},
                                           4 if small else 256, 8 if small else 128),
        "tests": run_tests(small),
    }
    (out / "gpu_report.json").write_text(json.dumps(report, indent=2))
    print(format_table(report))
    return 0 if report["tests"]["returncode"] == 0 else 1


if __name__ == "__main__":
    from medusa.cli import run_script

    sys.exit(run_script(main))
