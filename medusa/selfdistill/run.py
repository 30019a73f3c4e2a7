"""``self_distill``: prompts -> the model's own replies -> a resumable JSONL of conversations.

Output rows (loadable by ``medusa.data.load_tokenized``, format auto-detected; usable as ``data.train``):

- chat modes: ``{"id": "<source id>:<sample>", "messages": [{"role", "content"}...], "metadata": {...}}``
- completion mode: ``{"id": ..., "prompt": ..., "completion": ..., "metadata": {...}}``

``metadata`` = source_id, sample, mode, model, backend, sampling, finish_reasons, prompt/completion token
counts (and ``ended`` in self-talk).
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from medusa.errors import ConfigError, DataError, MedusaError
from medusa.io import output_lock
from medusa.selfdistill import synthesize as syn
from medusa.selfdistill.backends.base import BatchBackend, Sampling, ServerBackend
from medusa.selfdistill.backends.local import LocalBackend, load_tokenizer, require_chat_template
from medusa.selfdistill.backends.openai import OpenAIBackend
from medusa.selfdistill.modes import DEFAULT_USER_PROMPT, MODES, Job, Outcome, make_job, row_seed
from medusa.selfdistill.prompts import FORMATS, Prompt, PromptOptions, load_prompts
from medusa.selfdistill.writer import ResumableWriter

FAIL_FAST_ROWS = 10  # stop when the first this-many rows of a run all fail: a setup problem, not bad rows


@dataclass
class SelfDistillConfig:
    model: str | None
    prompts: str | None
    out: str
    mode: str = "replay"
    backend: str = "local"
    prompt_format: str = "auto"
    split: str = "train"
    limit: int | None = None
    prompt_sentences: int | None = None  # None: one sentence (at most one of the three is given)
    prompt_chars: int | None = None
    prompt_tokens: int | None = None
    turns: int | None = None
    user_prompt: str = DEFAULT_USER_PROMPT
    synthesize_prompts: int = 0  # > 0: the model writes this many user requests first (Magpie), then answers
    sampling: Sampling = field(default_factory=Sampling)
    num_samples: int = 1
    on_length: str | None = None  # default: "error" in chat modes, "keep" in completion mode
    retry_errors: bool = False
    chat_template: str | None = None
    tokenizer: str | None = None
    # local backend
    batch_size: int = 16
    dtype: str | None = None
    device: str | None = None
    load_in_4bit: bool = False
    # openai backend
    endpoint: str | None = None
    served_model: str | None = None
    api: str | None = None  # default: chat in chat modes, completions in completion mode
    api_key: str | None = None
    concurrency: int = 16
    timeout_s: float = 600.0
    retries: int = 5
    retry_backoff_s: float = 1.0
    progress: bool = True

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.backend not in ("local", "openai"):
            raise ConfigError(f"--backend must be local or openai, got {self.backend!r}")
        if self.prompt_format not in FORMATS:
            raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {self.prompt_format!r}")
        self.on_length = self.on_length or ("keep" if self.mode == "completion" else "error")
        if self.on_length not in ("error", "keep"):
            raise ConfigError(f"--on-length must be error or keep, got {self.on_length!r}")
        self.api = self.api or ("completions" if self.mode == "completion" else "chat")
        if (self.api == "chat") == (self.mode == "completion"):
            raise ConfigError(f"--mode {self.mode} needs --api "
                              f"{'completions' if self.mode == 'completion' else 'chat'}")
        if self.backend == "openai" and not self.endpoint:
            raise ConfigError("--backend openai needs --endpoint URL")
        if self.backend == "local" and not self.model:
            raise ConfigError("--backend local needs --model")
        rules = PromptOptions(self.prompt_sentences, self.prompt_chars, self.prompt_tokens).given()
        if len(rules) > 1:
            raise ConfigError(f"{' and '.join(rules)}: give one rule for cutting text documents into prompts")
        if self.synthesize_prompts < 0:
            raise ConfigError(f"--synthesize-prompts must be >= 0, got {self.synthesize_prompts}")
        if self.synthesize_prompts:
            if self.prompts:
                raise ConfigError("--synthesize-prompts writes its own prompt file (<out>.prompts.jsonl): "
                                  "drop --prompts")
            if self.backend != "local" or self.mode == "completion":
                raise ConfigError("--synthesize-prompts needs --backend local and a chat mode "
                                  "(replay or self-talk)")
            self.prompts = str(synthesized_path(self.out))
        elif not self.prompts:
            raise ConfigError("--prompts is required (or --synthesize-prompts N)")
        if self.num_samples < 1:
            raise ConfigError(f"--num-samples must be >= 1, got {self.num_samples}")
        if self.turns is not None and self.turns < 1:
            raise ConfigError(f"--turns must be >= 1, got {self.turns}")
        s = self.sampling
        if s.max_new_tokens < 1 or s.temperature < 0 or not 0 < s.top_p <= 1:
            raise ConfigError(f"bad sampling parameters {s.to_dict()} (max_new_tokens >= 1, "
                              "temperature >= 0, 0 < top_p <= 1)")


SYNTHESIS_CHUNK = 256  # synthesized requests appended per round trip (the rest of a killed run resumes)


def synthesized_path(out: str | Path) -> Path:
    """Where ``--synthesize-prompts`` keeps its requests: ``<out>.prompts.jsonl`` beside the output."""
    out = Path(out)
    return out.with_name(out.stem + ".prompts.jsonl")


def _synthesize(cfg: SelfDistillConfig, model: Any, tokenizer: Any) -> tuple[Any, dict[str, Any]]:
    """Write the missing synthesized requests to ``cfg.prompts``; returns the loaded local backend (reused
    for the answers) and a summary."""

    path = Path(cfg.prompts)
    have = syn.read_synthesized(path)
    backend = _make_backend(cfg, model, tokenizer)
    summary = {"synthesized_file": str(path), "synthesized_before": len(have), "synthesized": 0}
    missing = cfg.synthesize_prompts - len(have)
    if missing > 0:
        bar = tqdm(total=missing, unit="prompt", desc="synthesize prompts", disable=not cfg.progress,
                   dynamic_ncols=True)
        started, made = time.monotonic(), 0
        while made < missing:  # chunk by chunk, each appended: a kill loses one chunk at most
            want = min(SYNTHESIS_CHUNK, missing - made)
            opts = syn.SynthesisOptions(seed=cfg.sampling.seed + len(have))
            new = _synthesize_chunk(backend, have, want, opts)
            syn.append_synthesized(path, new, start=len(have))
            have, made = have + new, made + len(new)
            bar.update(len(new))
            if len(new) < want:  # the model ran out of new requests within max_rounds
                break
        bar.close()
        summary.update(synthesized=made, synthesis_s=round(time.monotonic() - started, 3))
        if made < missing:
            summary["synthesis_short"] = missing - made
    return backend, summary


def _synthesize_chunk(backend: Any, have: list[str], want: int, opts: syn.SynthesisOptions) -> list[str]:
    """Up to ``want`` new requests, none of ``have``, sampled with the local ``backend``."""

    def generate(prompts: list[list[int]], seed: int) -> list[tuple[list[int], str]]:
        return backend.sample(prompts, seed, opts.temperature, opts.top_p, opts.max_tokens)

    return syn.synthesize(generate, backend.tokenizer, want, opts, seen={syn.normalise(t) for t in have})


def _check_resumable(cfg: SelfDistillConfig, writer: ResumableWriter, model_name: str) -> None:
    meta = writer.first_meta
    if not meta:
        return
    checks = [("mode", cfg.mode), ("model", model_name)]
    if "sampling" in meta:  # recorded in every row this version writes
        checks.append(("sampling", cfg.sampling.to_dict()))
    for key, value in checks:
        had = meta.get(key)
        if had != value:
            if isinstance(had, dict) and isinstance(value, dict):  # name only the settings that differ
                names = sorted(set(had) | set(value), key=str)
                had = {k: had.get(k) for k in names if had.get(k) != value.get(k)}
                value = {k: value.get(k) for k in had}
            raise MedusaError(f"{cfg.out} already holds rows with {key} {had!r}, not {value!r}: "
                              "rows made with other settings are not appended; use another --out to start "
                              "a new file")


def _row(cfg: SelfDistillConfig, prompt: Prompt, sample: int, outcome: Outcome, model_name: str) -> dict:
    meta: dict[str, Any] = {
        "source_id": prompt.id, "sample": sample, "mode": cfg.mode, "model": model_name,
        "backend": cfg.backend, "source_format": prompt.source_format, "sampling": cfg.sampling.to_dict(),
        "finish_reasons": outcome.finish_reasons, "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
    }
    if cfg.mode == "self-talk":
        meta["ended"] = outcome.ended
    return {"id": f"{prompt.id}:{sample}", **(outcome.row or {}), "metadata": meta}


def _drive_local(backend: BatchBackend, jobs: list[tuple[Prompt, int, Job]], sampling: Sampling,
                 window: int) -> Iterator[tuple[Prompt, int, Outcome]]:
    """Run conversations ``window`` at a time; each round batches the pending request of every one."""
    for start in range(0, len(jobs), window):
        pending: list[tuple[Prompt, int, Job, Any]] = []
        for prompt, sample, job in jobs[start:start + window]:
            pending.append((prompt, sample, job, next(job)))
        while pending:
            next_round = []
            for i, result in backend.generate([req for *_, req in pending], sampling):
                prompt, sample, job, _ = pending[i]
                try:
                    next_round.append((prompt, sample, job, job.send(result)))
                except StopIteration as stop:
                    yield prompt, sample, stop.value
            pending = next_round


def _run_server_job(backend: ServerBackend, job: Job, sampling: Sampling) -> Outcome:
    request = next(job)
    while True:
        try:
            request = job.send(backend.complete(request, sampling))
        except StopIteration as stop:
            return stop.value


def _drive_server(backend: ServerBackend, jobs: list[tuple[Prompt, int, Job]],
                  sampling: Sampling) -> Iterator[tuple[Prompt, int, Outcome]]:
    """Each conversation in a worker thread; at most ``backend.concurrency`` in flight."""
    queue = iter(jobs)
    with cf.ThreadPoolExecutor(max_workers=backend.concurrency) as pool:
        inflight: dict[cf.Future, tuple[Prompt, int]] = {}
        try:
            while True:
                while len(inflight) < backend.concurrency:
                    item = next(queue, None)
                    if item is None:
                        break
                    prompt, sample, job = item
                    inflight[pool.submit(_run_server_job, backend, job, sampling)] = (prompt, sample)
                if not inflight:
                    return
                done, _ = cf.wait(inflight, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    prompt, sample = inflight.pop(fut)
                    yield prompt, sample, fut.result()
        finally:
            for fut in inflight:
                fut.cancel()


def _make_backend(cfg: SelfDistillConfig, model: Any, tokenizer: Any) -> BatchBackend | ServerBackend:
    if cfg.backend == "openai":

        return OpenAIBackend(cfg.endpoint, model=cfg.served_model or None, api=cfg.api, api_key=cfg.api_key,
                             timeout_s=cfg.timeout_s, retries=cfg.retries, backoff_s=cfg.retry_backoff_s,
                             concurrency=cfg.concurrency)

    return LocalBackend(model if model is not None else cfg.model, tokenizer=tokenizer,
                        batch_size=cfg.batch_size, dtype=cfg.dtype, device=cfg.device,
                        load_in_4bit=cfg.load_in_4bit, model_name=cfg.model)


def _tokenizers(cfg: SelfDistillConfig, tokenizer: Any) -> tuple[Any, PromptOptions]:
    """The generation tokenizer (local backend) and the options that cut text documents into prompts."""

    if cfg.backend == "local" and tokenizer is None:
        tokenizer = load_tokenizer(cfg.tokenizer or cfg.model, cfg.chat_template)
    elif tokenizer is not None and cfg.chat_template is not None:
        tokenizer.chat_template = cfg.chat_template
    if cfg.backend == "local" and cfg.mode != "completion":
        require_chat_template(tokenizer, cfg.model)
    text_tok = tokenizer if tokenizer is not None else (load_tokenizer(cfg.tokenizer)
                                                        if cfg.tokenizer else None)
    return tokenizer, PromptOptions(cfg.prompt_sentences, cfg.prompt_chars, cfg.prompt_tokens, text_tok)


def _log_invalid(writer: ResumableWriter, invalid: list[str], source_id: str, location: str,
                 reason: str) -> None:
    """``load_prompts``' ``on_invalid``: count the row and log it once (a re-run does not log it again)."""
    invalid.append(source_id)
    if not writer.skip((source_id, -1)):
        writer.write_error(source_id, -1, f"invalid prompt row: {reason}", location=location)


def _stream(cfg: SelfDistillConfig, backend: Any, todo: list[tuple[Prompt, int]]
            ) -> Iterator[tuple[Prompt, int, Outcome]]:
    jobs = [(p, s, make_job(cfg.mode, p, row_seed(cfg.sampling.seed, p.id, s), cfg.on_length, cfg.turns,
                            cfg.user_prompt)) for p, s in todo]
    if cfg.backend == "local":
        return _drive_local(backend, jobs, cfg.sampling, window=max(cfg.batch_size * 32, 256))
    return _drive_server(backend, jobs, cfg.sampling)


def _consume(cfg: SelfDistillConfig, stream: Iterator[tuple[Prompt, int, Outcome]], writer: ResumableWriter,
             model_name: str, total: int, summary: dict[str, Any]) -> None:
    """Write every finished conversation (or its error) as it arrives; stop when the first rows all fail."""
    started = time.monotonic()
    bar = tqdm(total=total, unit="row", desc="self-distill", disable=not cfg.progress, dynamic_ncols=True)
    try:
        for prompt, sample, outcome in stream:
            summary["completion_tokens"] += outcome.completion_tokens
            if outcome.error is None:
                writer.write(_row(cfg, prompt, sample, outcome, model_name))
                summary["written"] += 1
            else:
                writer.write_error(prompt.id, sample, outcome.error, finish_reasons=outcome.finish_reasons)
                summary["errors"] += 1
                finished = summary["written"] + summary["errors"]
                if summary["written"] == 0 and finished >= min(FAIL_FAST_ROWS, total):
                    raise MedusaError(f"the first {finished} rows all failed (see {writer.errors}); "
                                      f"last: {outcome.error}")
            bar.update(1)
            elapsed = max(time.monotonic() - started, 1e-9)
            bar.set_postfix(tok_s=f"{summary['completion_tokens'] / elapsed:.0f}", err=summary["errors"],
                            refresh=False)
    finally:
        bar.close()
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    summary["generation_s"] = round(time.monotonic() - started, 3)


def _generate(cfg: SelfDistillConfig, writer: ResumableWriter, todo: list[tuple[Prompt, int]], model: Any,
              tokenizer: Any, summary: dict[str, Any], backend: Any = None) -> None:
    """Check the output can be resumed with this model, start the backend and run the ``todo`` rows."""
    if cfg.backend == "local":
        _check_resumable(cfg, writer, cfg.model)
    backend = backend or _make_backend(cfg, model, tokenizer)
    model_name = cfg.model if cfg.backend == "local" else backend.model_name
    _check_resumable(cfg, writer, model_name)
    _consume(cfg, _stream(cfg, backend, todo), writer, model_name, len(todo), summary)


def _write_rows(cfg: SelfDistillConfig, model: Any, tokenizer: Any, opts: PromptOptions) -> dict[str, Any]:
    """Synthesize prompts if asked, then generate and append the rows ``cfg.out`` lacks (lock held)."""
    backend, synthesis = None, {}
    if cfg.synthesize_prompts:
        backend, synthesis = _synthesize(cfg, model, tokenizer)
    rejected: list[tuple[str, str, str]] = []  # (source id, location, reason) of each invalid row
    prompts = load_prompts(cfg.prompts, cfg.prompt_format, opts, cfg.split, cfg.limit,
                           lambda *row: rejected.append(row))
    if not prompts:  # before the output is opened: nothing is created for a run that has nothing to do
        raise DataError(f"{cfg.prompts}: no prompts" + (f" ({len(rejected)} invalid rows; the first, "
                                                        f"{rejected[0][1]}: {rejected[0][2]})" if rejected
                                                        else " (it holds no rows)"))
    with ResumableWriter(cfg.out, retry_errors=cfg.retry_errors) as writer:
        invalid: list[str] = []
        for row in rejected:
            _log_invalid(writer, invalid, *row)
        keys = [(p, s) for p in prompts for s in range(cfg.num_samples)]
        todo = [(p, s) for p, s in keys if not writer.skip((p.id, s))]
        summary: dict[str, Any] = {
            "out": str(writer.out), "errors_file": str(writer.errors), "prompts": len(prompts),
            "invalid_prompts": len(invalid), "already_done": sum((p.id, s) in writer.done for p, s in keys),
            "skipped_failed_before": sum((p.id, s) in writer.failed_before for p, s in keys),
            "written": 0, "errors": 0, "completion_tokens": 0, **synthesis,
        }
        if todo:
            _generate(cfg, writer, todo, model, tokenizer, summary, backend)
    return summary


def self_distill(cfg: SelfDistillConfig, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Generate the dataset described by ``cfg``; returns a summary (rows, errors, tokens, rates).

    ``model``/``tokenizer`` let a caller pass an in-process model to the local backend (``cfg.model`` then
    only names it in the metadata). Everything that can be checked is checked before a model loads.
    """
    cfg.validate()
    tokenizer, opts = _tokenizers(cfg, tokenizer)
    started = time.monotonic()
    with output_lock(cfg.out):  # one run per output: a second one would write the same rows
        summary = _write_rows(cfg, model, tokenizer, opts)
    summary["elapsed_s"] = round(time.monotonic() - started, 3)
    gen = summary.get("generation_s") or 0.0
    summary["rows_per_s"] = round((summary["written"] + summary["errors"]) / gen, 3) if gen else 0.0
    summary["tokens_per_s"] = round(summary["completion_tokens"] / gen, 1) if gen else 0.0
    summary["config"] = {k: v for k, v in asdict(cfg).items() if k != "api_key"}
    return summary
