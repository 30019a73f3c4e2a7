"""Backends that answer the modes' requests: ``local`` (batched ``transformers`` generation in-process) and
``openai`` (any OpenAI-compatible server). Their request / result types and protocols are in ``base``."""

from medusa.selfdistill.backends.base import (
    Backend,
    BatchBackend,
    EndpointUnreachable,
    Request,
    Result,
    Sampling,
    ServerBackend,
)

__all__ = ["Backend", "BatchBackend", "EndpointUnreachable", "Request", "Result", "Sampling", "ServerBackend"]
