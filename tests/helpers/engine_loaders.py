"""What each serving engine does with an export directory, as far as it runs without a GPU: which config keys
it reads (with its own defaults), which tensor names and shapes it loads, which backbone and tokenizer it
takes, and the head logits it then computes. Re-implemented from the engines' loading code as read on
2026-11-23 (not vendored; their code needs CUDA, TensorRT or a Rust router):

- vLLM: ``transformers_utils/configs/medusa.py`` (MedusaConfig), ``config/speculative.py`` (n_predict,
  num_lookahead_tokens), ``model_executor/models/medusa.py`` (Medusa.__init__ / load_weights /
  compute_logits) and the default loader's "weights not initialized" check.
- TGI: ``models/__init__.py`` (a config with medusa_num_heads names the backbone), ``layers/speculative.py``
  (MedusaHeadV1, falling back to MedusaHeadV2) and ``layers/medusa.py``; the router reads tokenizer.json
  from the Medusa directory.
- TensorRT-LLM: ``examples/medusa/convert_checkpoint.py`` (argument defaults, the engine config written from
  the flags, then ``load_medusa_hf``) and ``models/medusa/config.py`` (``from_hugging_face``).
- Official MEDUSA: FasterDecoding/Medusa ``medusa/model/medusa_model.py`` (``MedusaModel.from_pretrained``'s
  fallback path) and ``medusa_model_legacy.py``.

Each loader returns an :class:`Engine`: ``heads(hidden [T, d]) -> logits [K, T, V]`` plus what it read.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn


@dataclass
class Engine:
    heads: Callable[[torch.Tensor], torch.Tensor]  # hidden [T, d] -> logits [K, T, V]
    num_heads: int
    num_layers: int
    backbone: str  # the model the engine serves the heads on
    tokenizer: str | None = None
    info: dict = field(default_factory=dict)


def _silu_blocks(x: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor | None]]) -> torch.Tensor:
    for w, b in layers:
        x = x + F.silu(F.linear(x, w, b))
    return x


def save_tiny_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level fast tokenizer with ``vocab_size`` entries (0..2: unk / bos / eos), built in-process."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(path)


# ---------------------------------------------------------------------------------------------- vLLM
def vllm_load(draft_dir: Path, target: str, num_speculative_tokens: int | None = None) -> Engine:
    """``vllm serve TARGET --speculative-config '{"method": "medusa", "model": DRAFT_DIR, ...}'``."""
    raw = json.loads((draft_dir / "config.json").read_text())
    cfg: dict = {}
    for key, value in raw.items():  # MedusaConfig.from_pretrained renames these keys
        if "num" in key and "heads" in key:
            key = "num_heads"
        elif "num" in key and "layers" in key:
            key = "num_hidden_layers"
        cfg[key] = value
    hidden, vocab = cfg.get("hidden_size", 4096), cfg.get("vocab_size", 32001)
    num_heads, n_layers = cfg.get("num_heads", 5), cfg.get("num_hidden_layers", 1)
    truncated = cfg.get("truncated_vocab_size") or vocab
    if num_speculative_tokens is not None:  # num_lookahead_tokens' setter rewrites num_heads
        num_heads = num_speculative_tokens
    n_predict = cfg.get("n_predict")
    if n_predict is not None:
        if num_speculative_tokens is None:
            num_speculative_tokens = n_predict
        elif num_speculative_tokens > n_predict and num_speculative_tokens % n_predict:
            raise ValueError(f"num_speculative_tokens:{num_speculative_tokens} must be divisible by "
                             f"{n_predict=}")
    if num_speculative_tokens is None:
        raise ValueError("num_speculative_tokens must be provided with speculative model unless the draft "
                         "model config contains an n_predict parameter.")
    bias, shared = cfg.get("medusa_fc_bias", False), cfg.get("original_lm_head", False)
    blocks = [(i, j) for i in range(num_heads) for j in range(n_layers)]
    params = {f"blocks.{i}.layers.{j}.weight": (hidden, hidden) for i, j in blocks}
    if bias:
        params.update({f"blocks.{i}.layers.{j}.bias": (hidden,) for i, j in blocks})
    if shared:
        params["lm_head.weight"] = (truncated, hidden)
    else:
        params.update({f"lm_heads.{i}.weight": (truncated, hidden) for i in range(num_heads)})
    token_map, weights = None, {}
    for name, tensor in load_file(str(draft_dir / "model.safetensors")).items():  # load_weights
        name = name.replace("medusa_heads.", "")
        if name == "token_map":
            token_map = tensor if truncated < vocab else None
        elif name in params:
            weights[name] = tensor
        elif shared and name == "lm_heads.0.weight":
            weights["lm_head.weight"] = tensor
    for name, tensor in list(weights.items()):
        if "lm_head" in name and token_map is not None and tensor.shape[0] > token_map.shape[0]:
            weights[name] = tensor = tensor[token_map]
        assert tuple(tensor.shape) == params[name], (name, tuple(tensor.shape), params[name])
    missing = sorted(set(params) - set(weights))
    if missing:
        raise ValueError(f"Following weights were not initialized from checkpoint: {missing}")
    assert truncated == vocab or token_map is not None

    def heads(x: torch.Tensor) -> torch.Tensor:
        out = []
        for i in range(num_heads):
            layers = [(weights[f"blocks.{i}.layers.{j}.weight"], weights.get(f"blocks.{i}.layers.{j}.bias"))
                      for j in range(n_layers)]
            lm_head = weights["lm_head.weight" if shared else f"lm_heads.{i}.weight"]
            logits = F.linear(_silu_blocks(x, layers), lm_head)
            if token_map is not None:
                full = torch.full((*logits.shape[:-1], vocab), float("-inf"), dtype=logits.dtype)
                full[..., token_map] = logits
                logits = full
            out.append(logits)
        return torch.stack(out)

    return Engine(heads, num_heads, n_layers, target, info={"num_speculative_tokens": num_speculative_tokens})


# ----------------------------------------------------------------------------------------------- TGI
def tgi_load(model_id: Path) -> Engine:
    """``text-generation-launcher --model-id MODEL_ID`` (a local Medusa directory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = json.loads((model_id / "config.json").read_text())
    assert "medusa_num_heads" in cfg, "TGI would serve this directory as a plain model"
    backbone, speculate = cfg["base_model_name_or_path"], cfg["medusa_num_heads"]
    AutoConfig.from_pretrained(backbone)  # PretrainedConfig.get_config_dict(model_id)
    base = AutoModelForCausalLM.from_pretrained(backbone)
    lm_head = base.get_output_embeddings().weight  # TensorParallelHead.load(config, "lm_head")
    state = load_file(str(model_id / "medusa_lm_head.safetensors"))  # speculator model_paths
    tokenizer = str(model_id / "tokenizer.json") if (model_id / "tokenizer.json").is_file() else None
    try:  # MedusaHeadV1.load: MedusaModel -> MedusaHead -> ResBlock / FastLinear, every tensor required
        n = cfg["medusa_num_layers"]
        v1 = [([(state[f"{i}.{j}.linear.weight"], state[f"{i}.{j}.linear.bias"]) for j in range(n)],
               state[f"{i}.{n}.weight"]) for i in range(speculate)]

        def heads(x: torch.Tensor) -> torch.Tensor:
            return torch.stack([F.linear(_silu_blocks(x, layers), out) for layers, out in v1])

        return Engine(heads, speculate, n, backbone, tokenizer, info={"layout": "v1", "base": base})
    except KeyError:
        pass
    assert cfg["medusa_num_layers"] == 1  # MedusaHeadV2
    w = torch.cat([state[f"{i}.0.linear.weight"] for i in range(speculate)], dim=0)  # [K * d, d]
    b = torch.cat([state[f"{i}.0.linear.bias"] for i in range(speculate)], dim=0)  # [K * d]

    def heads_v2(x: torch.Tensor) -> torch.Tensor:
        res = F.silu(F.linear(x, w, b)).reshape(*x.shape[:-1], speculate, x.shape[-1])  # [T, K, d]
        return F.linear(x.unsqueeze(-2) + res, lm_head).movedim(-2, 0)  # [K, T, V]

    return Engine(heads_v2, speculate, 1, backbone, tokenizer, info={"layout": "v2", "base": base})


# ------------------------------------------------------------------------------------------ TensorRT-LLM
def _trt_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", default=None)
    p.add_argument("--medusa_model_dir", default=None)
    p.add_argument("--output_dir", default="tllm_checkpoint")
    p.add_argument("--dtype", default="float16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--num_medusa_heads", type=int, default=4)
    p.add_argument("--num_medusa_layers", type=int, default=1)
    p.add_argument("--max_medusa_token_len", type=int, default=63)
    return p


def trt_convert(command: str) -> Engine:
    """``python examples/medusa/convert_checkpoint.py ...`` followed by the engine built from its output."""
    from transformers import AutoConfig

    argv = shlex.split(command)
    assert argv[:2] == ["python", "examples/medusa/convert_checkpoint.py"], argv
    args = _trt_parser().parse_args(argv[2:])
    hf = AutoConfig.from_pretrained(args.model_dir)  # LlamaConfig.from_pretrained(args.model_dir)
    engine_cfg = {"num_medusa_heads": args.num_medusa_heads, "num_medusa_layers": args.num_medusa_layers,
                  "max_draft_len": args.max_medusa_token_len, "vocab_size": hf.vocab_size}  # from the FLAGS
    medusa_dir = Path(args.medusa_model_dir)
    cfg = json.loads((medusa_dir / "config.json").read_text())
    n_layers = cfg.get("medusa_num_layers", args.num_medusa_layers)  # read for the weights only
    ckpt = medusa_dir / "medusa_lm_head.pt"  # load_medusa_hf: .pt first, then .safetensors
    state = torch.load(ckpt, map_location="cpu") if ckpt.exists() else load_file(
        str(medusa_dir / "medusa_lm_head.safetensors"))
    dtype = getattr(torch, args.dtype)
    weights = {}
    for h in range(args.num_medusa_heads):
        for l in range(n_layers):
            for p in ("weight", "bias"):
                name = f"medusa_heads.{h}.medusa_layers.{l}.linear.{p}"
                weights[name] = state[f"{h}.{l}.linear.{p}"].to(dtype)
        weights[f"medusa_heads.{h}.lm_head.weight"] = state[f"{h}.{n_layers}.weight"].to(dtype)
    # the engine (MedusaForCausalLM) has the parameters its config says; model.load(weights) needs them all
    needed = {f"medusa_heads.{h}.medusa_layers.{l}.linear.{p}" for h in range(engine_cfg["num_medusa_heads"])
              for l in range(engine_cfg["num_medusa_layers"]) for p in ("weight", "bias")}
    needed |= {f"medusa_heads.{h}.lm_head.weight" for h in range(engine_cfg["num_medusa_heads"])}
    missing, unused = sorted(needed - set(weights)), sorted(set(weights) - needed)
    if missing:
        raise KeyError(f"engine weights not provided: {missing[:3]}")
    k, n = engine_cfg["num_medusa_heads"], engine_cfg["num_medusa_layers"]

    def heads(x: torch.Tensor) -> torch.Tensor:
        x = x.to(dtype)
        out = []
        for h in range(k):
            layers = [(weights[f"medusa_heads.{h}.medusa_layers.{l}.linear.weight"],
                       weights[f"medusa_heads.{h}.medusa_layers.{l}.linear.bias"]) for l in range(n)]
            out.append(F.linear(_silu_blocks(x, layers), weights[f"medusa_heads.{h}.lm_head.weight"]))
        return torch.stack(out)

    return Engine(heads, k, n, args.model_dir, info={"engine_config": engine_cfg, "unused_weights": unused,
                                                    "dtype": args.dtype})


def trt_from_hugging_face(medusa_dir: Path) -> tuple[int | None, int | None]:
    """What ``MedusaConfig.from_hugging_face(..., speculative_model_dir=DIR)`` reads: heads, layers."""
    cfg = json.loads((medusa_dir / "config.json").read_text())
    return cfg.get("num_medusa_heads", None), cfg.get("medusa_num_layers", None)


# ------------------------------------------------------------------------------------------ official MEDUSA
class _ResBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.linear = nn.Linear(d, d)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


def official_load(path: Path, legacy: bool = False) -> Engine:
    """FasterDecoding/Medusa ``MedusaModel.from_pretrained(path)`` (``legacy``: medusa_model_legacy.py)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = {"medusa_num_heads": 5, "medusa_num_layers": 1, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3",
           **json.loads((path / "config.json").read_text())}
    assert "model_type" not in cfg  # AutoConfig.from_pretrained(path) fails: the MedusaConfig fallback
    backbone = cfg["base_model_name_or_path"]
    base_cfg = AutoConfig.from_pretrained(backbone)
    assert base_cfg.model_type in ("llama", "mistral"), "Only support llama and mistral for now!!"
    num_heads = cfg["medusa_num_heads"] if legacy else 5  # medusa_model.py: medusa_num_heads = 5 # TODO
    n_layers = cfg["medusa_num_layers"]
    base = AutoModelForCausalLM.from_pretrained(backbone)
    AutoTokenizer.from_pretrained(backbone)  # MedusaModelABC.__init__: self.tokenizer
    d, vocab = base_cfg.hidden_size, base_cfg.vocab_size
    torch.manual_seed(1234)
    medusa_head = nn.ModuleList([nn.Sequential(*([_ResBlock(d)] * n_layers), nn.Linear(d, vocab, bias=False))
                                 for _ in range(num_heads)])
    filename = os.path.join(path, "medusa_lm_head.pt")
    assert os.path.exists(filename), "it would call hf_hub_download(path, 'medusa_lm_head.pt')"
    state = torch.load(filename, map_location="cpu")  # torch >= 2.6: weights_only=True
    result = medusa_head.load_state_dict(state, strict=False)

    def heads(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.stack([medusa_head[i](x) for i in range(num_heads)])

    return Engine(heads, num_heads, n_layers, backbone, backbone,
                  info={"missing": result.missing_keys, "unexpected": result.unexpected_keys, "base": base})
