"""The ``openai`` backend: any OpenAI-compatible server (vLLM, TGI, SGLang, ``transformers serve``).

Uses the official ``openai`` Python client (synchronous, one client shared by the worker threads; the
runner bounds concurrency). The client's own retries are off: this module retries connection errors,
timeouts, 429 and 5xx with exponential backoff and jitter, and gives up on other 4xx at once.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any
from urllib.parse import urlparse

from medusa.errors import ConfigError
from medusa.selfdistill.backends.base import EndpointUnreachable, Request, Result, Sampling


def normalize_endpoint(endpoint: str) -> str:
    """``http://host:8000`` -> ``http://host:8000/v1``; a URL that already has a path is kept."""
    parsed = urlparse(endpoint)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"--endpoint {endpoint!r} is not an http(s) URL")
    return endpoint.rstrip("/") + ("/v1" if parsed.path in ("", "/") else "")


class OpenAIBackend:
    name = "openai"

    def __init__(self, endpoint: str, model: str | None = None, api: str = "chat", api_key: str | None = None,
                 timeout_s: float = 600.0, retries: int = 5, backoff_s: float = 1.0,
                 concurrency: int = 16) -> None:
        import openai

        if api not in ("chat", "completions"):
            raise ConfigError(f"--api must be chat or completions, got {api!r}")
        if concurrency < 1:
            raise ConfigError(f"--concurrency must be >= 1, got {concurrency}")
        self.openai = openai
        self.endpoint = normalize_endpoint(endpoint)
        self.api = api
        self.retries = retries
        self.backoff_s = backoff_s
        self.concurrency = concurrency
        self.client = openai.OpenAI(base_url=self.endpoint,
                                    api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
                                    timeout=timeout_s, max_retries=0)
        self.model_name = model or self._first_served_model()

    def _first_served_model(self) -> str:
        try:
            models = self.client.models.list().data
        except self.openai.APIConnectionError as exc:
            raise EndpointUnreachable(f"cannot reach {self.endpoint}: {exc}") from exc
        except self.openai.APIStatusError as exc:
            raise ConfigError(f"{self.endpoint}/models answered {exc.status_code}; name the model with "
                              "--served-model") from exc
        if not models:
            raise ConfigError(f"{self.endpoint} serves no models; name one with --served-model")
        return models[0].id

    def _retryable(self, exc: Exception) -> bool:
        o = self.openai
        return isinstance(exc, (o.APIConnectionError, o.RateLimitError, o.InternalServerError)) or (
            isinstance(exc, o.APIStatusError) and exc.status_code >= 500)

    def complete(self, request: Request, sampling: Sampling) -> Result:
        """One request with retries. A server that stays unreachable raises :class:`EndpointUnreachable`;
        any other failure comes back as a ``Result`` with ``finish_reason == "error"``."""
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                return self._call(request, sampling)
            except self.openai.OpenAIError as exc:
                last = exc
                if not self._retryable(exc) or attempt == self.retries:
                    break
                time.sleep(self.backoff_s * (2 ** attempt) * (0.5 + random.random()))
        assert last is not None
        o = self.openai
        if isinstance(last, o.APIConnectionError) and not isinstance(last, o.APITimeoutError):
            raise EndpointUnreachable(f"cannot reach {self.endpoint} after {self.retries} retries: {last}")
        message = getattr(last, "message", None) or str(last)
        return Result("", "error", 0, 0, f"{type(last).__name__}: {message}".splitlines()[0][:500])

    def _call(self, request: Request, sampling: Sampling) -> Result:
        common: dict[str, Any] = dict(model=self.model_name, max_tokens=sampling.max_new_tokens,
                                      temperature=sampling.temperature, top_p=sampling.top_p,
                                      seed=request.seed)
        if sampling.top_k is not None:
            common["extra_body"] = {"top_k": sampling.top_k}
        if request.messages is not None:
            if self.api != "chat":
                raise ConfigError("chat modes need --api chat (the server applies the chat template)")
            resp = self.client.chat.completions.create(messages=request.messages, **common)
            choice = resp.choices[0]
            text = choice.message.content or ""
        else:
            if self.api != "completions":
                raise ConfigError("completion mode needs --api completions")
            resp = self.client.completions.create(prompt=request.prompt, **common)
            choice = resp.choices[0]
            text = choice.text or ""
        usage = getattr(resp, "usage", None)
        return Result(text, choice.finish_reason or "stop",
                      getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "completion_tokens", 0) or 0)
