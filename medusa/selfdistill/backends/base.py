"""What the modes ask a backend for, what they get back, and the two backend shapes the runner drives."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from medusa.errors import MedusaError


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters; ``temperature == 0`` means greedy. ``top_k=None`` means no top-k cut."""

    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int | None = None
    max_new_tokens: int = 512
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Request:
    """Either a chat request (``messages``) or a raw completion request (``prompt``)."""

    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    seed: int = 0  # per-row seed, derived from the run seed, the source id and the sample index


@dataclass
class Result:
    text: str
    finish_reason: str  # "stop" (end of turn / EOS) | "length" (hit max_new_tokens) | "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


class EndpointUnreachable(MedusaError):
    """The server cannot be reached at all (after retries): the run stops, written rows are kept."""


class Backend(Protocol):
    name: str  # "local" | "openai"
    model_name: str  # written into every row's metadata


class BatchBackend(Backend, Protocol):
    """In-process generation: the runner hands it the pending request of many conversations at once."""

    def generate(self, requests: Sequence[Request], sampling: Sampling) -> Iterator[tuple[int, Result]]:
        """``(index into requests, Result)`` pairs, in any order."""
        ...


class ServerBackend(Backend, Protocol):
    """A server: one request per call, from at most ``concurrency`` worker threads."""

    concurrency: int

    def complete(self, request: Request, sampling: Sampling) -> Result: ...
