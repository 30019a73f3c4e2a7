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
MODEL=$($PY -m medusa.pipelines.chat_model | tail -1)
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

RECIPE=medusa/pipelines/recipes/smollm2_medusa1.yaml
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
train shared_human  "$OUT/data/prompts_train.jsonl"    cache_human

$PY - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| heads (4, draft vocabulary 8,192) | training data | trained tokens | held-out top-1, heads 1-4 | predicted tokens/step (16 nodes) | head parameters |")
print("|---|---|---:|---|---:|---:|")
for name, what, data in (("shared_self", "MEDUSA-1, shared LM head", "self-distilled"),
                         ("linear_self", "MEDUSA-1, linear (own draft projection)", "self-distilled"),
                         ("hydra_self", "Hydra, shared LM head", "self-distilled"),
                         ("shared_human", "MEDUSA-1, shared LM head", "human (Alpaca answers)")):
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
