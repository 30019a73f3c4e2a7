#!/usr/bin/env bash
# Head variants for SmolLM2-135M-Instruct at one small data budget, compared on the same held-out
# self-distilled replies (docs/results/head-variants.md). Resumable: every step skips what is done.
#   bash scripts/head_variants.sh [OUT] [TRAIN_PROMPTS] [EPOCHS]
# Runs on one thread (taskset it to a core of your choice); ~45 minutes at the defaults on this project's CPU.
set -euo pipefail
OUT=${1:-out/head_variants}
N=${2:-400}
EPOCHS=${3:-2}
PY=${PY:-.venv/bin/python}
MEDUSA=${MEDUSA:-.venv/bin/medusa}
MODEL=$($PY -m benchmarks.chat_model | tail -1)
SHARED=${SHARED:-../shared}
export OMP_NUM_THREADS=1
mkdir -p "$OUT/data"

# Prompts: the first N Alpaca rows for training, the last 100 held out (never Spec-Bench / MT-bench).
$PY - "$SHARED/data/alpaca_5000.json" "$OUT/data" "$N" <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1], encoding="utf-8"))
out, n = sys.argv[2], int(sys.argv[3])
def write(name, part):
    with open(f"{out}/{name}", "w", encoding="utf-8") as f:
        for r in part:
            f.write(json.dumps(r) + "\n")
write("prompts_train.jsonl", rows[:n])   # also the human-answer training set (alpaca format: its outputs)
write("prompts_eval.jsonl", rows[-100:])
PYEOF

distill() {  # prompts -> the model's own greedy replies (resumes an interrupted run)
  $MEDUSA self-distill --model "$MODEL" --prompts "$1" --format alpaca --out "$2" --max-new-tokens 256 \
    --on-length keep --batch-size 64 --no-progress --json | tail -1
}
distill "$OUT/data/prompts_train.jsonl" "$OUT/data/self.jsonl"
distill "$OUT/data/prompts_eval.jsonl" "$OUT/data/eval.jsonl"

# Human answers at the self-distilled replies' token budget: Alpaca rows (never the held-out ones) until their
# answers hold as many tokens as the model's own replies to the N prompts.
$PY - "$SHARED/data/alpaca_5000.json" "$OUT/data" "$MODEL" <<'PYEOF'
import json, sys
from transformers import AutoTokenizer
rows = json.load(open(sys.argv[1], encoding="utf-8"))[:-100]
out, tok = sys.argv[2], AutoTokenizer.from_pretrained(sys.argv[3])
budget = sum(len(tok(m["content"]).input_ids) for line in open(f"{out}/self.jsonl", encoding="utf-8")
             for m in json.loads(line)["messages"] if m["role"] == "assistant")
used, picked = 0, []
for r in rows:
    if used >= budget:
        break
    picked.append(r)
    used += len(tok(r["output"]).input_ids)
with open(f"{out}/human_budget.jsonl", "w", encoding="utf-8") as f:
    for r in picked:
        f.write(json.dumps(r) + "\n")
print(f"human answers at the self-distilled budget: {len(picked)} rows, {used} answer tokens (budget {budget})")
PYEOF

RECIPE=benchmarks/recipes/smollm2_medusa1.yaml
train() {  # name data cache [overrides...]
  local name=$1 data=$2 cache=$3; shift 3
  if [ ! -d "$OUT/$name/final" ]; then
    $MEDUSA train $RECIPE model="$MODEL" data.train="$data" data.eval="$OUT/data/eval.jsonl" \
      train.epochs=$EPOCHS train.mixed_precision=${MIXED:-null} train.hidden_cache="$OUT/$cache" \
      train.save_steps=100000 output_dir="$OUT/$name" "$@" 2>&1 | tee "$OUT/$name.log" | grep -v "it/s"
  fi
  if [ ! -f "$OUT/$name/final/tree.json" ]; then
    $MEDUSA calibrate --heads "$OUT/$name/final" --data "$OUT/data/eval.jsonl" --nodes 16 --no-plots --quiet
  fi
}
train shared_self   "$OUT/data/self.jsonl"             cache_self
train linear_self   "$OUT/data/self.jsonl"             cache_self heads.head_type=linear
train hydra_self    "$OUT/data/self.jsonl"             cache_self heads.head_type=hydra
# heads.teacher_loss: the KL to the base distribution over the draft vocabulary (renormalised there) in place of
# (w = 1, Hydra++) or beside (w = 0.5) the hard labels; same data, cache and budget as shared_self / hydra_self
train shared_teacher      "$OUT/data/self.jsonl"       cache_self heads.teacher_loss=1.0
train hydra_teacher       "$OUT/data/self.jsonl"       cache_self heads.head_type=hydra heads.teacher_loss=1.0
# MEDUSA-2 (LoRA backbone + heads, self-distilled) from the shared_self heads, one epoch on the same replies:
# online backbone forward + backward (no cache), so it is by far the slowest row (MEDUSA2=0 skips it)
if [ "${MEDUSA2:-1}" = 1 ]; then
  if [ ! -d "$OUT/medusa2/final" ]; then
    $MEDUSA train benchmarks/recipes/smollm2_medusa2.yaml model="$MODEL" data.train="$OUT/data/self.jsonl" \
      data.eval="$OUT/data/eval.jsonl" heads.init_from="$OUT/shared_self/final" heads.draft_vocab=8192 \
      train.save_steps=20 output_dir="$OUT/medusa2" 2>&1 | tee "$OUT/medusa2.log" | grep -v "it/s"
  fi
  if [ ! -f "$OUT/medusa2/final/tree.json" ]; then
    $MEDUSA calibrate --heads "$OUT/medusa2/final" --data "$OUT/data/eval.jsonl" --nodes 16 --no-plots --quiet
  fi
fi
train shared_teacher_half "$OUT/data/self.jsonl"       cache_self heads.teacher_loss=0.5
train shared_human  "$OUT/data/prompts_train.jsonl"    cache_human
train shared_human_budget "$OUT/data/human_budget.jsonl" cache_human_budget

$PY - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| heads (4; draft vocabulary 8,192 unless noted) | training data | trained tokens | held-out top-1, heads 1-4 | predicted tokens/step (16 nodes) | head parameters |")
print("|---|---|---:|---|---:|---:|")
for name, what, data in (("shared_self", "MEDUSA-1, shared LM head", "self-distilled"),
                         ("linear_self", "MEDUSA-1, linear (own draft projection)", "self-distilled"),
                         ("hydra_self", "Hydra, shared LM head", "self-distilled"),
                         ("shared_human", "MEDUSA-1, shared LM head", "human (Alpaca answers), same prompts"),
                         ("shared_human_budget", "MEDUSA-1, shared LM head",
                          "human (Alpaca answers), same token budget"),
                         ("shared_teacher", "MEDUSA-1, shared LM head, `teacher_loss: 1.0`", "self-distilled"),
                         ("shared_teacher_half", "MEDUSA-1, shared LM head, `teacher_loss: 0.5`", "self-distilled"),
                         ("hydra_teacher", "Hydra, shared LM head, `teacher_loss: 1.0`", "self-distilled"),
                         ("medusa2", "MEDUSA-2 (LoRA r=16, self-distilled KL) from the shared LM head row, 1 epoch",
                          "self-distilled")):
    d = out / name
    if not (d / "final" / "tree.json").exists():
        continue
    rows = [json.loads(l) for l in open(d / "metrics.jsonl")]
    ev = [r for r in rows if any(k.startswith("eval_head1") for k in r)][-1]
    top1 = " / ".join(f"{ev[f'eval_head{i}_top1']:.3f}" for i in range(1, 5))
    tree = json.loads((d / "final" / "tree.json").read_text())
    tps = tree.get("calibration", tree).get("expected_tokens_per_step")
    from safetensors.torch import load_file
    params = sum(t.numel() for f in (d / "final").glob("*.safetensors") for t in load_file(f).values())
    import re
    m = re.search(r"\(([\d,]+) trained tokens\)", (out / f"{name}.log").read_text())
    tokens = m.group(1) if m else None
    print(f"| {what} | {data} | {tokens if tokens is not None else '-'} | {top1} | {tps:.2f} | {params/1e6:.1f}M |")
PYEOF
