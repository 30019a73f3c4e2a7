"""MEDUSA-2 (self-distilled, LoRA) vs MEDUSA-1 on stories260K: tokens/step and backbone quality.

1. Self-distillation data: stories260K's own greedy continuations of TinyStories prompts (prompt_completion).
2. MEDUSA-1 (recipes/tiny/medusa1.yaml) and MEDUSA-2 (recipes/tiny/medusa2_selfdistill.yaml) trained on
   it for the same number of steps with the same heads shape.
3. Tokens per step of greedy MEDUSA decoding on held-out prompts, same tree (the built-in default) for both.
4. Backbone loss on held-out TinyStories text: the original backbone vs MEDUSA-2's merged backbone.

Run from the repository root:  .venv/bin/python scripts/benchmarks/medusa2_vs_medusa1.py [--steps 300]
Writes a JSON summary to --out (default out/bench/medusa2_vs_medusa1.json) and prints it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

SHARED = Path("../shared")
STORIES = SHARED / "models" / "stories260K"
HELD_OUT = 24


def stories() -> list[str]:
    text = (SHARED / "data" / "tinystories_sample.txt").read_text()
    return [s.strip() for s in text.split("\n\n") if len(s.split()) > 12]


@torch.no_grad()
def self_distill(base, tok, prompts: list[str], new_tokens: int, path: Path) -> None:
    rows = []
    for i in range(0, len(prompts), 128):
        enc = tok(prompts[i:i + 128], return_tensors="pt", padding=True, padding_side="left")
        out = base.generate(**enc, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        for p, seq in zip(prompts[i:i + 128], out[:, enc["input_ids"].shape[1]:]):
            rows.append({"prompt": p, "completion": " " + tok.decode(seq, skip_special_tokens=True).strip()})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@torch.no_grad()
def text_loss(base, tok, texts: list[str]) -> float:
    """Mean next-token cross-entropy (nats/token) of ``base`` over ``texts`` (max 256 tokens each)."""
    total, count = 0.0, 0
    for t in texts:
        ids = tok(t, return_tensors="pt")["input_ids"][:, :256]  # [1, T]
        logits = base(input_ids=ids).logits[:, :-1]  # [1, T-1, V]
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"))
        count += ids.shape[1] - 1
    return total / count


@torch.no_grad()
def tokens_per_step(model, tok, prompts: list[str], new_tokens: int) -> float:
    gained = steps = 0
    for p in prompts:
        ids = tok(p, return_tensors="pt")["input_ids"]
        out = model.generate(ids, max_new_tokens=new_tokens, acceptance="greedy", return_dict_in_generate=True)
        gained += sum(sum(a) for a in out.accept_lengths)
        steps += sum(len(a) for a in out.accept_lengths)
    return gained / steps


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from medusa import MedusaModel
    from medusa.config import load_recipe
    from medusa.training.train import train

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--work", default="out/bench/medusa2_vs_medusa1")
    ap.add_argument("--out", default="out/bench/medusa2_vs_medusa1.json")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    tok = AutoTokenizer.from_pretrained(STORIES)
    tok.pad_token = tok.unk_token
    base = AutoModelForCausalLM.from_pretrained(STORIES).eval()
    all_stories = stories()
    train_prompts = [" ".join(s.split()[:8]) for s in all_stories[:-HELD_OUT]]
    held_prompts = [" ".join(s.split()[:8]) for s in all_stories[-HELD_OUT:]][:16]
    held_text = all_stories[-HELD_OUT:]
    data = work / "selfdistill.jsonl"
    if not data.is_file():
        self_distill(base, tok, train_prompts, args.new_tokens, data)

    common = [f"data.train={data}", "data.format=prompt_completion", "data.max_length=96", "data.eval_split=0.0",
              f"train.max_steps={args.steps}", "train.eval_steps=0", "train.logging_steps=50", "heads.num_heads=4"]
    m1 = train(load_recipe("recipes/tiny/medusa1.yaml", common + [f"output_dir={work / 'm1'}"]))
    m2 = train(load_recipe("recipes/tiny/medusa2_selfdistill.yaml",
                           common + [f"output_dir={work / 'm2'}", "train.lr=7.5e-4"]))  # heads: 4 x 7.5e-4 = M1's 3e-3

    medusa1 = MedusaModel.from_pretrained(m1.final_dir, base_model=AutoModelForCausalLM.from_pretrained(STORIES)).eval()
    medusa2 = MedusaModel.from_pretrained(m2.final_dir).eval()
    before = text_loss(base, tok, held_text)
    after = text_loss(medusa2.base_model, tok, held_text)
    result = {
        "steps": args.steps,
        "tokens_per_step": {"medusa1": tokens_per_step(medusa1, tok, held_prompts, args.new_tokens),
                            "medusa2_selfdistill": tokens_per_step(medusa2, tok, held_prompts, args.new_tokens)},
        "heldout_text_loss": {"original_backbone": before, "medusa2_backbone": after,
                              "relative_change": (after - before) / before,
                              "perplexity_before": math.exp(before), "perplexity_after": math.exp(after)},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
