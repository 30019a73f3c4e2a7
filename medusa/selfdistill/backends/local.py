"""The ``local`` backend: batched generation in-process (prompts sorted by length; finished rows refilled).

Where :func:`~medusa.selfdistill.backends.refill.refill_supported` allows, replies come from
:func:`~medusa.selfdistill.backends.refill.generate_refill` (a preallocated KV cache whose finished slots take
the next prompt); otherwise from ``model.generate`` a batch at a time. The default dtype is bfloat16 where the
device computes it natively (CUDA, or a CPU with AVX-512 BF16 / AMX), else float32.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from medusa.errors import ConfigError, MedusaError
from medusa.modeling.base import fast_dtype, load_base_model
from medusa.modeling.base import load_tokenizer as _load_tokenizer
from medusa.modeling.cpu_linear import auto_pack
from medusa.modeling.quantization import bnb_config
from medusa.selfdistill.backends.base import Request, Result, Sampling
from medusa.selfdistill.backends.refill import generate_refill, refill_supported


class NoChatTemplate(MedusaError):
    pass


def load_tokenizer(name_or_path: str, chat_template: str | None = None) -> Any:
    """The model's tokenizer, left-padded, with a pad token; ``chat_template`` (a file or a Jinja string)
    replaces the tokenizer's own."""
    return _load_tokenizer(name_or_path, chat_template=chat_template, padding_side="left")


def require_chat_template(tokenizer: Any, model_name: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise NoChatTemplate(f"model {model_name!r} has no chat template: use --mode completion, "
                             "or give one with --chat-template FILE")


class LocalBackend:
    """Generates with a Hugging Face causal LM in-process.

    ``model`` may be a loaded ``PreTrainedModel`` (tests) or a path / hub id; on CUDA the default dtype is
    bfloat16; ``load_in_4bit`` quantises with bitsandbytes NF4.
    """

    name = "local"

    def __init__(self, model: Any, tokenizer: Any = None, batch_size: int = 16, dtype: str | None = None,
                 device: str | None = None, load_in_4bit: bool = False, chat_template: str | None = None,
                 model_name: str | None = None) -> None:

        if batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        if isinstance(model, (str, Path)):
            self.model_name = model_name or str(model)
            self.tokenizer = tokenizer or load_tokenizer(str(model), chat_template)
            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            kwargs: dict[str, Any] = {}
            if load_in_4bit:

                kwargs["quantization_config"] = bnb_config(
                    "4bit", compute_dtype=torch.bfloat16 if device.startswith("cuda") else torch.float32,
                    double_quant=False)
                kwargs["device_map"] = {"": device}
            dtype = dtype or fast_dtype(device)
            self.model = load_base_model(str(model), dtype=dtype, **kwargs)
            if not load_in_4bit:
                self.model.to(device)
                auto_pack(self.model)  # float32 on a CPU: batched decode steps are few-row matmuls
        else:
            self.model = model
            self.model_name = model_name or getattr(model.config, "name_or_path", "") or type(model).__name__
            if tokenizer is None:
                raise ConfigError("an in-process model needs its tokenizer")
            self.tokenizer = tokenizer
            if chat_template is not None:
                self.tokenizer.chat_template = chat_template
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.unk_token or self.tokenizer.eos_token
        self.model.eval()
        self.device = next(self.model.parameters()).device
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self.eos_ids = self._eos_ids()
        self.refill = refill_supported(self.model) is None

    def _eos_ids(self) -> list[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            eos = getattr(source, "eos_token_id", None)
            if eos is None:
                continue
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
        if not ids:
            raise ConfigError(f"{self.model_name}: neither the model nor the tokenizer defines an EOS token")
        return sorted(ids)

    def encode(self, request: Request) -> list[int]:
        if request.messages is not None:
            require_chat_template(self.tokenizer, self.model_name)
            text = self.tokenizer.apply_chat_template(request.messages, add_generation_prompt=True,
                                                      tokenize=False)
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.tokenizer(request.prompt)["input_ids"]

    def generate(self, requests: Sequence[Request], sampling: Sampling) -> Iterator[tuple[int, Result]]:
        """Yield ``(index into requests, Result)``, a batch at a time, shortest prompts first."""
        encoded: list[tuple[int, list[int]]] = []
        for i, req in enumerate(requests):
            ids = self.encode(req)
            if self.max_positions and len(ids) + sampling.max_new_tokens > self.max_positions:
                yield i, Result("", "error", len(ids), 0,
                                f"prompt of {len(ids)} tokens + max_new_tokens {sampling.max_new_tokens} "
                                f"exceeds the model's {self.max_positions} positions")
                continue
            encoded.append((i, ids))
        encoded.sort(key=lambda item: len(item[1]))
        if self.refill:
            yield from self._generate_refill(requests, encoded, sampling)
            return
        for start in range(0, len(encoded), self.batch_size):
            batch = encoded[start:start + self.batch_size]
            seed = zlib.crc32(repr([requests[i].seed for i, _ in batch]).encode())
            chat = [requests[i].messages is not None for i, _ in batch]
            yield from zip([i for i, _ in batch],
                           self._generate_batch([ids for _, ids in batch], chat, sampling, seed))

    def _generate_refill(self, requests: Sequence[Request], encoded: list[tuple[int, list[int]]],
                         sampling: Sampling) -> Iterator[tuple[int, Result]]:
        seed = zlib.crc32(repr([requests[i].seed for i, _ in encoded]).encode())
        stream = generate_refill(self.model, [ids for _, ids in encoded],
                                 max_new_tokens=sampling.max_new_tokens,
                                 batch_size=self.batch_size, pad_id=self.tokenizer.pad_token_id,
                                 eos_ids=self.eos_ids, temperature=sampling.temperature, top_k=sampling.top_k,
                                 top_p=sampling.top_p, seed=seed)
        eos = set(self.eos_ids)
        for j, tokens, reason in stream:
            i, prompt = encoded[j]
            text = tokens[:-1] if tokens and tokens[-1] in eos else tokens
            yield i, Result(self._decode(prompt, text, requests[i].messages is not None), reason,
                            len(prompt), len(tokens))

    def sample(self, prompts: list[list[int]], seed: int, temperature: float, top_p: float,
               max_new_tokens: int) -> list[tuple[list[int], str]]:
        """One sampled continuation per prompt (token ids, the end token dropped) and why it ended."""
        if self.refill:
            stream = generate_refill(self.model, prompts, max_new_tokens=max_new_tokens,
                                     batch_size=self.batch_size, pad_id=self.tokenizer.pad_token_id,
                                     eos_ids=self.eos_ids, temperature=temperature, top_p=top_p, seed=seed)
            found = {j: (tokens, reason) for j, tokens, reason in stream}
            done = [found[j] for j in range(len(prompts))]
        else:
            sampling = Sampling(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                seed=seed)
            done = []
            for start in range(0, len(prompts), self.batch_size):
                for r in self._raw_batch(prompts[start:start + self.batch_size], sampling, seed + start):
                    done.append(r)
        eos = set(self.eos_ids)
        return [(t[:-1] if t and t[-1] in eos else t, reason) for t, reason in done]

    @torch.inference_mode()
    def _raw_batch(self, batch: list[list[int]], sampling: Sampling,
                   seed: int) -> list[tuple[list[int], str]]:
        """``model.generate`` on one left-padded batch: each row's new tokens (up to its EOS) and reason."""
        pad = self.tokenizer.pad_token_id
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)  # [B, T] left-padded
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)  # [B, T]
        for row, ids in enumerate(batch):
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention_mask[row, width - len(ids):] = 1
        do_sample = sampling.temperature > 0
        kwargs: dict[str, Any] = dict(max_new_tokens=sampling.max_new_tokens, do_sample=do_sample,
                                      pad_token_id=pad, eos_token_id=self.eos_ids)
        if do_sample:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or 0)
            torch.manual_seed(seed)
        out = self.model.generate(input_ids=input_ids.to(self.device),
                                  attention_mask=attention_mask.to(self.device), **kwargs)
        eos = set(self.eos_ids)
        rows = []
        for ids in out[:, width:].tolist():  # [B, <= max_new_tokens]
            stop = next((j for j, t in enumerate(ids) if t in eos), None)
            if stop is None:  # never finished, so generate did not pad this row
                rows.append((ids, "length" if len(ids) >= sampling.max_new_tokens else "stop"))
            else:
                rows.append((ids[:stop + 1], "stop"))
        return rows

    @torch.inference_mode()
    def _decode(self, prompt: list[int], new: list[int], chat: bool) -> str:
        """Chat replies are decoded on their own. A completion is the text the new tokens add to the
        prompt (decoded together, minus the prompt), so ``prompt + completion`` keeps its spaces."""
        if chat:
            return self.tokenizer.decode(new, skip_special_tokens=True)
        head = self.tokenizer.decode(prompt, skip_special_tokens=True)
        full = self.tokenizer.decode(prompt + new, skip_special_tokens=True)
        if full.startswith(head):
            return full[len(head):]
        return self.tokenizer.decode(new, skip_special_tokens=True)

    def _generate_batch(self, batch: list[list[int]], chat: list[bool], sampling: Sampling,
                        seed: int) -> list[Result]:
        eos = set(self.eos_ids)
        results = []
        for (ids, reason), prompt, is_chat in zip(self._raw_batch(batch, sampling, seed), batch, chat):
            text = ids[:-1] if ids and ids[-1] in eos else ids
            results.append(Result(self._decode(prompt, text, is_chat), reason, len(prompt), len(ids)))
        return results
