"""Train the embedded default model: a small Llama code-completion model on the Python standard library.

The medusa project ships its own base model so that `medusa demo` works on any machine, offline. This
script makes it from data every Python installation carries: the ``*.py`` files of the standard library
(``sysconfig.get_paths()["stdlib"]``, without site-packages). It

1. collects the files (sorted, deterministic) and splits them: the top-level modules in ``HELD_OUT``
   (and their ``test/test_<name>*`` files) are held out for evaluation, everything else is training data;
2. trains a byte-level BPE tokenizer (``tokenizers``) on the training files;
3. trains a ``LlamaForCausalLM`` (tied embeddings) on random windows of the concatenated training
   tokens (each file wrapped in ``<s> ... </s>``), AdamW + warmup + cosine, checkpointing every
   ``--eval-every`` steps to ``--work-dir`` (``--resume`` continues from there bit-for-bit);
4. evaluates held-out loss / perplexity / bits per byte, and writes a Hugging Face model directory
   (config, safetensors weights, tokenizer, generation config) plus the model card README.md.

Commands (the committed model was made by the first; ``--quick`` is the ~1 minute smoke test):

    python data/default_model/train.py --out data/default_model
    python data/default_model/train.py --quick --out /tmp/tiny_default_model

Load it with ``AutoTokenizer.from_pretrained("data/default_model")`` and
``AutoModelForCausalLM.from_pretrained("data/default_model")``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import torch
import torch.nn.functional as F

# Top-level stdlib modules/packages never seen in training (nor their test/test_<name>* files).
HELD_OUT = ("argparse", "csv", "dataclasses", "difflib", "fractions", "heapq", "json", "shlex",
            "statistics", "textwrap")
# Not code (prose, generated character tables) or not ours to learn from.
EXCLUDED_TOP = ("site-packages", "dist-packages", "pydoc_data", "encodings")
MAX_FILE_BYTES = 400_000
SPECIAL = {"bos": "<s>", "eos": "</s>", "pad": "<pad>"}


@dataclass
class Sizes:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    context: int


FULL = Sizes(vocab_size=4096, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, context=256)
QUICK = Sizes(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, context=64)


def stdlib_files(root: Path | None = None) -> tuple[list[Path], list[Path], Path]:
    """(train files, held-out files, stdlib root), each list sorted by relative path."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    train, held = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in EXCLUDED_TOP or not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            continue
        if is_held_out(rel):
            held.append(path)
        else:
            train.append(path)
    return train, held, root


def is_held_out(rel: Path) -> bool:
    """True for ``<name>.py``, ``<name>/...`` and ``test/test_<name>*`` with ``<name>`` in HELD_OUT."""
    top = rel.parts[0].removesuffix(".py")
    if top in HELD_OUT:
        return True
    if top == "test" and len(rel.parts) > 1:
        sub = rel.parts[1].removesuffix(".py")
        return any(sub == f"test_{m}" or sub.startswith(f"test_{m}_") for m in HELD_OUT)
    return False


def read_texts(paths: list[Path]) -> list[str]:
    texts = []
    for p in paths:
        text = p.read_bytes().decode("utf-8", errors="replace")
        if text.strip():
            texts.append(text)
    return texts


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (GPT-2 pre-tokenisation); ``<s>`` is prepended to every encoding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    bos = SPECIAL["bos"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL["bos"], eos_token=SPECIAL["eos"],
                                   pad_token=SPECIAL["pad"], clean_up_tokenization_spaces=False,
                                   model_max_length=FULL.context)


def encode_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """All texts as one stream ``<s> text </s> <s> text </s> ...``. Returns ids: [N_tokens] int64."""
    enc = [e.ids for e in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=True)]
    eos = tokenizer.eos_token_id
    flat = [i for ids in enc for i in (*ids, eos)]
    return torch.tensor(flat, dtype=torch.long)


def build_model(sizes: Sizes, tokenizer, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=sizes.hidden_size,
                      intermediate_size=sizes.intermediate_size, num_hidden_layers=sizes.num_hidden_layers,
                      num_attention_heads=sizes.num_attention_heads,
                      num_key_value_heads=sizes.num_key_value_heads, max_position_embeddings=sizes.context,
                      tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      rms_norm_eps=1e-5, initializer_range=0.02)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.config._attn_implementation = "sdpa"
    return model


def lm_loss(model, batch: torch.Tensor, bf16: bool = False) -> torch.Tensor:
    """Mean next-token cross-entropy of windows batch: [B, T + 1] (bf16: autocast the forward)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=batch[:, :-1]).logits  # logits: [B, T, V]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), batch[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model, stream: torch.Tensor, context: int, max_tokens: int, batch_size: int = 16,
             bf16: bool = False) -> float:
    """Mean loss over consecutive non-overlapping windows of the held-out stream (first max_tokens)."""
    model.eval()
    n_win = max(1, min((stream.numel() - 1) // context, max_tokens // context))
    total, count = 0.0, 0
    for start in range(0, n_win, batch_size):
        idx = range(start, min(n_win, start + batch_size))
        batch = torch.stack([stream[i * context: i * context + context + 1] for i in idx])  # [b, T + 1]
        total += lm_loss(model, batch, bf16).item() * len(idx)
        count += len(idx)
    model.train()
    return total / count


def lr_at(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model, args) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def save_checkpoint(path: Path, model, opt, gen: torch.Generator, step: int, tokens: int, elapsed: float):
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                "step": step, "tokens": tokens, "elapsed": elapsed}, tmp)
    os.replace(tmp, path)


@torch.no_grad()
def sample_completion(model, tokenizer, prompt: str, max_new_tokens: int) -> str:
    model.eval()
    ids = tokenizer(prompt, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file() and p.suffix != ".py"
               and p.name != "README.md")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                    help="model directory to write (default: this script's directory)")
    ap.add_argument("--work-dir", type=Path, default=None,
                    help="checkpoints and log (default: out/default_model_train next to the repo root, "
                         "or <out>/.train with --quick)")
    ap.add_argument("--quick", action="store_true", help="tiny model, few files, ~1 minute: a smoke test")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default 800, quick 30)")
    ap.add_argument("--batch-size", type=int, default=8, help="windows per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=None, help="warmup steps (default 40, quick 5)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=100, help="steps between held-out evals + checkpoints")
    ap.add_argument("--eval-tokens", type=int, default=None,
                    help="held-out tokens for the periodic (bf16) eval (default 8192; the final fp32 eval uses 8x)")
    ap.add_argument("--no-bf16", dest="bf16", action="store_false",
                    help="train in plain fp32 (default: bf16 autocast forward, fp32 master weights)")
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="stop this invocation's training after this many minutes (the card reports the steps done)")
    ap.add_argument("--max-files", type=int, default=None, help="use only the first N training files")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--save-dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--resume", action="store_true", help="continue from <work-dir>/checkpoint.pt")
    ap.add_argument("--stdlib", type=Path, default=None, help="stdlib directory (default: this Python's)")
    args = ap.parse_args(argv)
    q = args.quick
    args.sizes = QUICK if q else FULL
    args.steps = args.steps or (30 if q else 800)
    args.warmup = args.warmup if args.warmup is not None else (5 if q else 40)
    args.eval_tokens = args.eval_tokens or (1024 if q else 8192)
    args.max_files = args.max_files or (40 if q else None)
    if q:
        args.eval_every = min(args.eval_every, 15)
    if args.work_dir is None:
        args.work_dir = (args.out / ".train") if q else Path(__file__).resolve().parents[2] / "out" / "default_model_train"
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes: Sizes = args.sizes
    args.out.mkdir(parents=True, exist_ok=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    log = open(args.work_dir / "log.jsonl", "a")

    def emit(**rec):
        line = json.dumps(rec)
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    t0 = time.time()
    train_paths, held_paths, root = stdlib_files(args.stdlib)
    if args.max_files:
        train_paths, held_paths = train_paths[: args.max_files], held_paths[: max(4, args.max_files // 10)]
    train_texts, held_texts = read_texts(train_paths), read_texts(held_paths)
    tokenizer = train_tokenizer(train_texts, sizes.vocab_size)
    train_stream = encode_stream(tokenizer, train_texts)  # [N_train]
    held_stream = encode_stream(tokenizer, held_texts)  # [N_held]
    held_bytes = sum(len(t.encode()) for t in held_texts)
    emit(event="data", stdlib=str(root), train_files=len(train_paths), held_out_files=len(held_paths),
         train_tokens=train_stream.numel(), held_out_tokens=held_stream.numel(),
         train_bytes=sum(len(t.encode()) for t in train_texts), held_out_bytes=held_bytes,
         prep_s=round(time.time() - t0, 1))

    model = build_model(sizes, tokenizer, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    opt = make_optimizer(model, args)
    gen = torch.Generator().manual_seed(args.seed)
    step, tokens, elapsed = 0, 0, 0.0
    ckpt = args.work_dir / "checkpoint.pt"
    if args.resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen"])
        step, tokens, elapsed = state["step"], state["tokens"], state["elapsed"]
        emit(event="resume", step=step)
    emit(event="model", params=n_params, **asdict(sizes), steps=args.steps, batch_size=args.batch_size)

    T = sizes.context
    hi = train_stream.numel() - T - 1
    from tqdm import tqdm

    bar = tqdm(total=args.steps, initial=step, desc="train", disable=not sys.stderr.isatty())
    t_seg = t_run = time.time()  # t_run: --max-minutes counts this invocation only
    model.train()
    while step < args.steps:
        starts = torch.randint(0, hi, (args.batch_size,), generator=gen)
        batch = torch.stack([train_stream[s: s + T + 1] for s in starts.tolist()])  # [B, T + 1]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        loss = lm_loss(model, batch, args.bf16)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += batch.numel() - args.batch_size
        bar.update(1)
        if step % 10 == 0 or step == args.steps:
            now = time.time()
            elapsed += now - t_seg
            t_seg = now
            emit(event="step", step=step, loss=round(loss.item(), 4), lr=round(lr_at(step - 1, args), 6),
                 tokens=tokens, elapsed_s=round(elapsed, 1), tok_per_s=round(tokens / max(elapsed, 1e-9)))
        if step % args.eval_every == 0 or step == args.steps:
            held = evaluate(model, held_stream, T, args.eval_tokens, bf16=args.bf16)
            emit(event="eval", step=step, held_out_loss=round(held, 4))
            save_checkpoint(ckpt, model, opt, gen, step, tokens, elapsed)
            t_seg = time.time()
        if args.max_minutes is not None and time.time() - t_run > 60 * args.max_minutes:
            emit(event="stopped_early", step=step, max_minutes=args.max_minutes)
            break
    bar.close()

    final_tokens = min(held_stream.numel(), 8 * args.eval_tokens)
    held = evaluate(model, held_stream, T, final_tokens)
    eval_tok = (min(held_stream.numel() - 1, final_tokens) // T) * T
    bytes_per_token = held_bytes / held_stream.numel()
    summary = {
        "params": n_params, "sizes": asdict(sizes), "seed": args.seed, "steps": step, "planned_steps": args.steps,
        "batch_size": args.batch_size, "tokens_seen": tokens, "train_time_s": round(elapsed, 1),
        "train_tokens": train_stream.numel(), "train_files": len(train_paths),
        "held_out_modules": list(HELD_OUT), "held_out_files": len(held_paths),
        "held_out_eval_tokens": eval_tok, "held_out_loss": round(held, 4),
        "held_out_perplexity": round(math.exp(held), 3),
        "held_out_bits_per_byte": round(held / math.log(2) / bytes_per_token, 4),
        "python": platform.python_version(), "torch": torch.__version__, "save_dtype": args.save_dtype,
        "bf16_autocast": args.bf16,
        "command": "python data/default_model/train.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    save_model(model, tokenizer, args)
    first = held_texts[0]
    at = first.find("\ndef ") + 1  # the sample continues the first function of the first held-out file
    prompt = first[at: at + (100 if args.quick else 300)]
    summary["sample_prompt"] = prompt
    summary["sample_completion"] = sample_completion(model, tokenizer, prompt, 48 if args.quick else 96)
    summary["size_bytes"] = dir_size(args.out)
    (args.out / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "README.md").write_text(model_card(summary))
    emit(event="done", **{k: v for k, v in summary.items() if not k.startswith("sample")})
    return summary


def save_model(model, tokenizer, args) -> None:
    from transformers import GenerationConfig

    model = model.to(getattr(torch, args.save_dtype))
    model.config.dtype = args.save_dtype
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, do_sample=False,
                     max_length=args.sizes.context).save_pretrained(args.out)
    model.to(torch.float32)


def model_card(s: dict) -> str:
    z = s["sizes"]
    return f"""# medusa default model: a {s['params'] / 1e6:.2f}M-parameter Python code-completion Llama

The embedded base model of the medusa project (`medusa demo` uses it). Made from scratch by
`data/default_model/train.py`; nothing downloaded. A completion model: no chat template.

| | |
|---|---|
| architecture | `LlamaForCausalLM`, {z['num_hidden_layers']} layers, hidden {z['hidden_size']}, MLP {z['intermediate_size']}, {z['num_attention_heads']} heads ({z['num_key_value_heads']} KV heads), tied embeddings, context {z['context']} |
| parameters | {s['params']:,} |
| weights | safetensors, {s['save_dtype']}; whole directory (weights + tokenizer + configs) {s['size_bytes'] / 1e6:.2f} MB |
| tokenizer | byte-level BPE (`tokenizers`), vocabulary {z['vocab_size']}, `<s>` prepended; `<s>` bos, `</s>` eos, `<pad>` pad; round-trips any text exactly |
| data | the `*.py` files of the Python {s['python']} standard library (no site-packages, `encodings`, `pydoc_data`, files > 400 KB): {s['train_files']} training files, {s['train_tokens']:,} tokens |
| held out | top-level modules {', '.join('`' + m + '`' for m in s['held_out_modules'])} and their `test/test_<name>*` files ({s['held_out_files']} files) |
| training | {s['steps']} AdamW steps (of {s['planned_steps']} planned) x {s['batch_size']} windows of {z['context']} tokens = {s['tokens_seen']:,} tokens seen, seed {s['seed']}, {'bf16 autocast, ' if s['bf16_autocast'] else ''}{s['train_time_s'] / 60:.1f} minutes on a shared 2-core CPU (torch {s['torch']}, 2 threads) |
| held-out loss | **{s['held_out_loss']:.3f}** nats/token (perplexity {s['held_out_perplexity']:.2f}, {s['held_out_bits_per_byte']:.3f} bits/byte) over the first {s['held_out_eval_tokens']:,} held-out tokens |

Reproduce (the standard library differs between Python versions, so figures move slightly on other versions):

```
{s['command']}
```

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained("data/default_model")
model = AutoModelForCausalLM.from_pretrained("data/default_model")
ids = tok("def fibonacci(n):\\n", return_tensors="pt")
print(tok.decode(model.generate(**ids, max_new_tokens=64, do_sample=False)[0], skip_special_tokens=True))
```

Sample (greedy, {len(s['sample_completion'])} characters) continuing the start of a held-out file:

```python
{s['sample_prompt']}
```
continues as
```python
{s['sample_completion']}
```

Licence: the training data is the CPython standard library (PSF License); the weights are released with
this project.
"""


if __name__ == "__main__":
    main()
