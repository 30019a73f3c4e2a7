"""The speculators package (``speculators==0.9.0``, its own venv) computes our eagle3 drafter's draft logits
from our ``--format speculators`` export: position by position, at every training-time-test step.

``python -m benchmarks.speculators_check [--heads DIR] [--base DIR] [--prompt TEXT] [--steps K] [--out DIR]``
(default: the shipped SmolLM2 drafter on one chat prompt). Builds or reuses the venv
(:mod:`benchmarks.speculators_env`), exports the heads, computes the base's features of the prompt here, and
runs ``Eagle3DraftModel`` in :mod:`benchmarks.speculators_worker` on speculators' training layout: features at
t with token t + 1 at position t + 1, step j shifted by j. Our side drafts the same chains one entry at a
time through ``Eagle3Heads.layer`` / ``logits`` and the drafter's own KV cache, as decoding does: step j at
position i feeds the drafter its step-(j - 1) output with token i + 1 + j at position i + 1 + j and predicts
token i + 2 + j. Prints the largest |difference| per step and position, and argmax agreement.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.speculators_env import ensure_venv

WORKER = Path(__file__).with_name("speculators_worker.py")
HEADS = Path("data/heads/smollm2-135m-instruct/eagle3")


def ascending_features(heads: Any, feats: torch.Tensor) -> torch.Tensor:
    """Our features ``[B, T, 3d]`` (``heads.feature_layers`` order) -> the export's ascending layer order."""
    blocks = feats.split(heads.hidden_size, dim=-1)
    order = sorted(range(len(blocks)), key=lambda i: heads.feature_layers[i])
    return torch.cat([blocks[i] for i in order], dim=-1)


def chain_logits(heads: Any, feats: torch.Tensor, ids: torch.Tensor, i: int, steps: int) -> torch.Tensor:
    """Draft logits ``[steps, N]`` of the chain from position ``i`` (features ``[1, T, 3d]``, ids ``[1, T]``):
    step 0 over the causal prefix 0..i, then one entry per step fed the previous step's output."""
    from medusa.modeling.eagle3 import DraftKV

    cache, n = DraftKV(), i + 1
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    mask = torch.zeros(1, 1, n, n).masked_fill(~causal, torch.finfo(torch.float32).min)  # [1, 1, n, n]
    g = heads.layer(heads.embed(ids[:, 1:n + 1]), heads.fuse(feats[:, :n]), torch.arange(1, n + 1).view(1, n),
                    mask, cache)[:, -1:]  # [1, 1, d]
    out = [heads.logits(g[:, 0])[0]]
    for s in range(1, steps):
        g = heads.layer(heads.embed(ids[:, i + 1 + s:i + 2 + s]), g, torch.tensor([[i + 1 + s]]),
                        torch.zeros(1, 1, 1, cache.get_seq_length() + 1), cache)
        out.append(heads.logits(g[:, 0])[0])
    return torch.stack(out)  # [steps, N]


def our_logits(heads: Any, feats: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Per step j, the logits ``[T - 1 - j, N]`` of every position whose chain stays inside ``ids [1, T]``."""
    T = ids.shape[1]
    with torch.no_grad():
        rows = [chain_logits(heads, feats, ids, i, min(steps, T - 1 - i)) for i in range(T - 1)]
    return [torch.stack([r[j] for r in rows if r.shape[0] > j]) for j in range(steps)]


def run_worker(export: Path, feats: torch.Tensor, ids: torch.Tensor, steps: int, work: Path,
               attn: str = "eager") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """speculators' ``logits [steps, T - 1, N]`` (and ``d2t [N]`` with a draft vocabulary) for the export
    (features ascending ``[1, T, 3d]``, ids ``[1, T]``: the worker sees features 0..T-2 with tokens
    1..T-1), and the worker's info."""
    from safetensors.torch import load_file, save_file

    python = ensure_venv()
    work.mkdir(parents=True, exist_ok=True)
    save_file({"hidden_states": feats[:, :-1].contiguous(), "input_ids": ids[:, 1:].contiguous()},
              str(work / "inputs.safetensors"))
    job = {"export": str(export), "inputs": str(work / "inputs.safetensors"), "ttt_steps": steps,
           "attn_implementation": attn}
    (work / "job.json").write_text(json.dumps(job))
    proc = subprocess.run([str(python), str(WORKER), str(work / "job.json"), str(work / "out")],
                          capture_output=True, text=True)
    (work / "worker_stderr.log").write_text(proc.stderr)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
        log = work / "worker_stderr.log"
        raise RuntimeError(f"speculators worker failed (exit {proc.returncode}; {log}): {tail}")
    info = json.loads((work / "out" / "info.json").read_text())
    return load_file(str(work / "out" / "logits.safetensors")), info


def compare(ours: list[torch.Tensor], theirs: torch.Tensor) -> list[dict[str, Any]]:
    """Per step: the largest |ours - theirs| at each position, the share of positions with equal argmax, and
    the largest |logit| (the scale the differences are read against)."""
    out = []
    for j, mine in enumerate(ours):
        other = theirs[j, :mine.shape[0]]
        out.append({"step": j, "max_abs_diff": (mine - other).abs().amax(-1).tolist(),
                    "argmax_equal": float((mine.argmax(-1) == other.argmax(-1)).float().mean()),
                    "max_abs_logit": float(mine.abs().max())})
    return out


def check(heads_dir: Path, base: str, ids: torch.Tensor, steps: int, work: Path,
          attn: str = "eager") -> dict[str, Any]:
    """Export ``heads_dir``, run both sides on ``ids [1, T]``; per-step comparison (our logits in the
    export's ascending draft order) + the worker's info."""
    from medusa import MedusaModel
    from medusa.export import export_checkpoint
    from medusa.modeling.eagle3 import base_features

    export_checkpoint(heads_dir, work / "export", "speculators", overwrite=True)
    model = MedusaModel.from_pretrained(str(heads_dir), base_model=base).eval()
    heads = model.heads
    feats = base_features(model.base_model, ids, None, heads.feature_layers)  # [1, T, 3d]
    ours = our_logits(heads, feats, ids, steps)
    theirs, info = run_worker(work / "export", ascending_features(heads, feats), ids, steps, work, attn)
    out: dict[str, Any] = {"worker": info}
    if heads.token_map is not None:  # the export's draft ids are ours sorted by target id
        sorted_map, order = torch.sort(heads.token_map.cpu())  # [N], [N]
        ours = [o[..., order] for o in ours]  # our logits in the export's draft order
        target = theirs["d2t"] + torch.arange(theirs["d2t"].numel())  # [N]: speculators' draft -> target
        out["d2t_equals_token_map"] = bool(torch.equal(target, sorted_map))
        out["d2t_ascending"] = bool((target[1:] > target[:-1]).all())
        base_head = model.base_model.get_output_embeddings().weight.detach().cpu()  # [V, d]
        verifier = theirs["verifier_lm_head"]  # [N, d]: speculators' verifier head, rows by t2d
        out["verifier_head_matches_d2t"] = bool(torch.equal(verifier, base_head[target].to(verifier.dtype)))
    out.update(positions=int(ids.shape[1] - 1), steps=compare(ours, theirs["logits"]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.speculators_check", description=__doc__)
    p.add_argument("--heads", type=Path, default=HEADS)
    p.add_argument("--base", default=None, help="default: the base the heads were trained on")
    p.add_argument("--prompt", default="Name three primary colors and say why they are primary.")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    from benchmarks.serve_check import chat_ids
    from medusa.modeling.config import MedusaConfig, base_location

    base = base_location(args.heads, MedusaConfig.load(args.heads), args.base)
    ids = torch.tensor([chat_ids(base, [args.prompt])[0]])
    work = args.out or Path(tempfile.mkdtemp(prefix="speculators-check-"))
    report = check(args.heads, base, ids, args.steps, work, args.attn)
    (work / "report.json").write_text(json.dumps(report, indent=2))
    for s in report["steps"]:
        print(f"step {s['step']}: {len(s['max_abs_diff'])} positions, max |diff| "
              f"{max(s['max_abs_diff']):.2e} (max |logit| {s['max_abs_logit']:.1f}), argmax equal "
              f"{s['argmax_equal']:.3f}")
    print(f"d2t = token_map: {report.get('d2t_equals_token_map')}; worker: {report['worker']}")
    print(f"report: {work / 'report.json'}")
    return 0


if __name__ == "__main__":
    from medusa.cli import run_script

    sys.exit(run_script(main))
