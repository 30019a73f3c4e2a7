"""Shared pieces of the export tests: a tiny base model on disk and heads checkpoints on it (perturbed, so
that every tensor a format writes is distinguishable), with or without a draft vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tiny_models import tiny_model

DRAFT_N = 40  # the draft vocabulary of draft_checkpoint's heads


def save_tiny_base(path: Path) -> Path:
    """A tiny Llama saved at ``path``, with the tokenizer files TGI export must copy (their content is not
    read by anything here)."""
    tiny_model("llama").save_pretrained(path)
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    (path / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>"}))
    return path


def perturb(model, seed=1, scale=0.1):
    """Heads moved off their initialisation (in place): W1 / b no longer zero, W2 no longer the LM head."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def checkpoint(tmp_path, base_dir, num_heads=3, num_layers=2, head_type="linear", dtype=None, tree=None):
    """Perturbed heads on the base at ``base_dir``, saved under ``tmp_path``: ``(path, model)``."""
    from transformers import AutoModelForCausalLM

    from medusa import MedusaModel

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    model = perturb(MedusaModel.from_base(base, num_heads=num_heads, num_layers=num_layers,
                                          head_type=head_type, heads_dtype=dtype))
    model.tree = tree
    path = tmp_path / f"ck-{head_type}-{num_heads}x{num_layers}"
    model.save_pretrained(path)
    return path, model


def draft_checkpoint(tmp_path, base_dir, head_type="linear", num_heads=3, num_layers=2):
    """Perturbed heads over a random draft vocabulary of :data:`DRAFT_N` ids: ``(path, model, token_map)``."""
    from transformers import AutoModelForCausalLM

    from medusa import MedusaModel

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    tm = torch.randperm(base.config.vocab_size, generator=torch.Generator().manual_seed(3))[:DRAFT_N]
    model = perturb(MedusaModel.from_base(base, num_heads=num_heads, num_layers=num_layers,
                                          head_type=head_type, token_map=tm), seed=1)
    path = tmp_path / f"ck-{head_type}"
    model.save_pretrained(path)
    return path, model, tm


def heads_tensors(path):
    """The tensors of our checkpoint's ``medusa_heads.safetensors``."""
    from safetensors.torch import load_file

    return load_file(str(path / "medusa_heads.safetensors"))
