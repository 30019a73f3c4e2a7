"""Heads that are actually accepted often: stories260K with heads fitted to its own greedy outputs.

Fitting reads the frozen base's last hidden states once, then trains only the heads on them with the
plain (unchunked) MEDUSA loss — a test fixture, independent of the training package it may test.
Cached in-process and on disk (``$MEDUSA_TEST_CACHE``, default a temp dir), so later calls are free; the
fit runs under a lock on its cache file, so two pytest-xdist workers asking at once fit it once. The
disk cache is keyed on everything that makes the heads (:func:`cache_key`): this file's source and the
``medusa/modeling`` sources, the model directory's files, the training prompts, the fitting arguments and
the torch version, so a change to any of them refits instead of loading stale heads.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from tiny_models import SHARED, STORIES, require_shared

HELD_OUT = 24  # the last stories of the sample are never used for fitting


def _stories() -> list[str]:
    require_shared(SHARED)
    text = (SHARED / "data" / "tinystories_sample.txt").read_text()
    return [s.strip() for s in text.split("\n\n") if len(s.split()) > 12]


def stories_prompts(n: int = 8, words: int = 8) -> list[str]:
    """Held-out prompts: the first ``words`` words of the last stories of the sample."""
    stories = _stories()[-HELD_OUT:]
    return [" ".join(s.split()[:words]) for s in stories[:n]]


def _train_prompts(words: int = 8) -> list[str]:
    return [" ".join(s.split()[:words]) for s in _stories()[:-HELD_OUT]]


def _cache_dir() -> Path:
    root = Path(os.environ.get("MEDUSA_TEST_CACHE", Path(tempfile.gettempdir()) / "medusa-test-cache"))
    root.mkdir(parents=True, exist_ok=True)
    return root


# How the cached heads are made (arguments of _self_outputs and fit_heads): part of the cache key.
FIT_ARGS: dict[str, Any] = {"new_tokens": 96, "steps": 800, "lr": 1e-2, "seed": 0}
# The code besides this file that shapes the fitted heads (heads architecture, init, base-model access).
MODELING = Path(__file__).resolve().parents[2] / "medusa" / "modeling"


def code_files() -> list[Path]:
    """The sources whose change must invalidate the cache: this file and ``medusa/modeling/*.py``."""
    return [Path(__file__).resolve(), *sorted(MODELING.glob("*.py"))]


def cache_key(model_dir: Path, prompts: Sequence[str], args: dict[str, Any], code: Sequence[Path]) -> str:
    """A digest of everything that makes the heads: the contents of the model directory's files (weights,
    config, tokenizer) and of the ``code`` files, the prompts, the arguments and the torch version."""
    h = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        h.update(f"{label}:{len(data)}:".encode())
        h.update(data)

    for path in sorted(p for p in Path(model_dir).iterdir() if p.is_file()):
        add(f"model/{path.name}", path.read_bytes())
    for path in code:
        add(f"code/{Path(path).name}", Path(path).read_bytes())
    add("prompts", json.dumps(list(prompts)).encode())
    add("args", json.dumps(args, sort_keys=True).encode())
    add("torch", torch.__version__.encode())
    return h.hexdigest()[:16]


@torch.no_grad()
def _self_outputs(base, tokenizer, prompts: list[str], new_tokens: int) -> torch.Tensor:
    """Greedy continuations of ``prompts``: ``[N, T]`` token ids (continuation only)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.unk_token or tokenizer.eos_token
    rows = []
    for i in range(0, len(prompts), 64):
        enc = tokenizer(prompts[i:i + 64], return_tensors="pt", padding=True)
        out = base.generate(**enc, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens,
                            pad_token_id=tokenizer.pad_token_id)
        rows.append(out[:, enc["input_ids"].shape[1]:])  # [b, new_tokens] continuation only
    return torch.cat(rows)


def fit_heads(model, sequences: torch.Tensor, steps: int = 800, lr: float = 1e-2, seed: int = 0) -> None:
    """Fit ``model.heads`` on ``sequences [N, T]`` (frozen base), plain MEDUSA loss, in place (Hydra heads:
    teacher-forced on the sequences' own tokens; a draft vocabulary: targets outside it are no target)."""
    from medusa.modeling.base import decoder_of

    torch.manual_seed(seed)
    with torch.no_grad():
        hidden = decoder_of(model.base_model)(input_ids=sequences).last_hidden_state  # [N, T, d]
        hidden = model.heads.teacher_inputs(hidden, sequences)  # Hydra: [N, T, d * (K+1)]
    params = [p for p in model.heads.parameters()]
    opt = torch.optim.Adam(params, lr=lr)
    K = model.num_heads
    t2d = model.heads.target_to_draft()  # [V] target -> draft id, -1 outside (None: the full vocabulary)
    for _ in range(steps):
        idx = torch.randint(0, sequences.shape[0], (32,))
        h, ids = hidden[idx], sequences[idx]
        loss = 0.0
        for k in range(K):
            shift = k + 2  # head k (0-based) at position t predicts token t + k + 2
            logits = model.heads.head_logits(k, h[:, :-shift])  # [32, T - shift, N]
            target = ids[:, shift:] if t2d is None else t2d[ids[:, shift:]]
            loss = loss + 0.8 ** k * F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     target.reshape(-1), ignore_index=-1)
        opt.zero_grad()
        loss.backward()
        opt.step()


def _head_options(hydra_projection: str, draft_vocab: int) -> dict[str, Any]:
    """The new heads options that are not at their defaults (so the defaults keep their old cache keys)."""
    return {**({"hydra_projection": hydra_projection} if hydra_projection != "own" else {}),
            **({"draft_vocab": draft_vocab} if draft_vocab else {})}


@functools.lru_cache(maxsize=None)
def _fitted_state(num_heads: int, num_layers: int, head_type: str = "linear", hydra_projection: str = "own",
                  draft_vocab: int = 0) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from medusa.io import build_lock

    prompts = _train_prompts()
    args = {**FIT_ARGS, "num_heads": num_heads, "num_layers": num_layers, "head_type": head_type,
            **_head_options(hydra_projection, draft_vocab)}
    key = cache_key(STORIES, prompts, args, code_files())
    path = _cache_dir() / f"stories-heads-{key}.safetensors"
    with build_lock(path):  # pytest-xdist workers asking at once: one fits, the other waits and loads
        if path.is_file():
            return load_file(str(path))
        return _fit_and_save(path, num_heads, num_layers, head_type, hydra_projection, draft_vocab, prompts)


def _fit_and_save(path: Path, num_heads: int, num_layers: int, head_type: str, hydra_projection: str,
                  draft_vocab: int, prompts: list[str]) -> dict[str, torch.Tensor]:
    from safetensors.torch import save_file

    from medusa import MedusaModel
    from medusa.modeling.draft_vocab import build_token_map

    from tiny_models import stories_model, stories_tokenizer

    base = stories_model()
    sequences = _self_outputs(base, stories_tokenizer(), prompts, new_tokens=FIT_ARGS["new_tokens"])
    token_map = None  # a draft vocabulary: the ids most frequent in the fitting sequences
    if draft_vocab:
        token_map = build_token_map([{"labels": row.tolist()} for row in sequences], base.config.vocab_size,
                                    draft_vocab)
    model = MedusaModel.from_base(base, num_heads=num_heads, num_layers=num_layers, head_type=head_type,
                                  token_map=token_map, **_head_options(hydra_projection, 0))
    model.freeze_base()
    fit_heads(model, sequences, steps=FIT_ARGS["steps"], lr=FIT_ARGS["lr"], seed=FIT_ARGS["seed"])
    state = {k: v.detach().clone() for k, v in model.heads.state_dict().items()}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    save_file(state, str(tmp))
    os.replace(tmp, path)
    return state


def fitted_stories_heads(num_heads: int = 4, num_layers: int = 1, head_type: str = "linear",
                         hydra_projection: str = "own", draft_vocab: int = 0):
    """stories260K + heads (``head_type``; hydra: ``hydra_projection``; ``draft_vocab`` > 0: over the
    ``draft_vocab`` ids most frequent in the fitting sequences) fitted on its own greedy outputs (a fresh
    MedusaModel per call)."""
    from medusa import MedusaModel

    from tiny_models import stories_model

    state = _fitted_state(num_heads, num_layers, head_type, hydra_projection, draft_vocab)
    model = MedusaModel.from_base(stories_model(), num_heads=num_heads, num_layers=num_layers,
                                  head_type=head_type, token_map=state.get("token_map"),
                                  **_head_options(hydra_projection, 0))
    model.heads.load_state_dict(state)
    model.freeze_base()
    return model.eval()
