"""A scope in which the weights do not change: one ``generate`` call.

The native passes run on weights packed once (:mod:`medusa.modeling.native_body`,
:mod:`medusa.modeling.native_draft`), and each call checks that nothing it packed was trained, loaded or
replaced since -- every weight's ``(data_ptr, _version)``, ~0.3 ms per check for SmolLM2's 200 tensors,
five checks a step with an EAGLE-3 drafter. Within one ``generate`` call the weights are fixed (decoding runs
under ``torch.no_grad`` and touches no parameter), so :func:`medusa.decoding.generate.medusa_generate` opens
:func:`during` around its prefill and steps: the first check of each packed module runs in full, and later
calls in the same scope reuse its answer. Outside a scope every call checks, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

# (what, id(owner)) -> (owner, the checked answer): the owner kept, so its id is not reused in the scope
_SCOPE: ContextVar[dict[tuple[str, int], tuple[Any, Any]] | None] = ContextVar("medusa_fixed_weights",
                                                                             default=None)


@contextmanager
def during() -> Iterator[None]:
    """Weights fixed until the block ends (nested scopes share the outermost one's answers)."""
    if _SCOPE.get() is not None:
        yield
        return
    token = _SCOPE.set({})
    try:
        yield
    finally:
        _SCOPE.reset(token)


def checked(what: str, owner: object, check: Callable[[], T]) -> T:
    """``check()``'s answer for ``owner`` (``what`` names the kind of check): run once per scope, each call
    outside one."""
    memo = _SCOPE.get()
    if memo is None:
        return check()
    key = (what, id(owner))
    if key not in memo:  # the owner is kept with its answer: its id is not reused within the scope
        memo[key] = (owner, check())
    return memo[key][1]


__all__ = ["checked", "during"]
