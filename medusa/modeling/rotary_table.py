"""The rotary embedding's cos / sin looked up from a table instead of recomputed at every decode step.

A Hugging Face rotary module computes, for each position p, ``cos(p * inv_freq)`` and ``sin(p * inv_freq)``
(times its attention scaling, in the hidden states' dtype): one product per element, so the values at a
position do not depend on which other positions share the call. The decoder asks for a handful of
positions per pass (the target's step, each drafting level) and the module's ~8 tensor ops cost ~0.1 ms a
call once a step's weights have pushed its code and data out of the caches; one ``index_select`` into a
table the module itself filled gives the same values bit for bit (``tests/modeling/test_rotary_table.py``).

Only rotary kinds whose frequencies never change are tabled (:data:`STATIC_KINDS`); dynamic kinds
(``dynamic``, ``longrope``), which rescale ``inv_freq`` with the sequence length, and anything unknown call
the module as before. A table is rebuilt when the module's ``inv_freq`` changed (moved, loaded, edited) and
doubled when a position past its end is asked for.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn

STATIC_KINDS = ("default", "linear", "llama3", "yarn")  # inv_freq fixed at construction
FIRST_ROWS = 4096  # positions in a new table (doubled as needed)


@dataclass(frozen=True)
class RotaryTable:
    """``rows [P, 2 hd]``: cos then sin of positions ``0 .. P-1`` in ``dtype``, and the ``inv_freq`` it
    was built from (its address, version and the scaling) to notice a change."""

    rows: torch.Tensor
    dtype: torch.dtype
    key: tuple


# rotary module -> {dtype: its table}
_TABLES: weakref.WeakKeyDictionary[nn.Module, dict[torch.dtype, RotaryTable]] = weakref.WeakKeyDictionary()


def tabled(module: nn.Module) -> bool:
    """Whether ``module``'s cos / sin depend on the position alone (a static rotary kind)."""
    inv_freq = getattr(module, "inv_freq", None)
    return (getattr(module, "rope_type", None) in STATIC_KINDS and isinstance(inv_freq, torch.Tensor)
            and inv_freq.device.type == "cpu")


def _key(module: nn.Module) -> tuple:
    inv = module.inv_freq
    return inv.data_ptr(), inv._version, float(getattr(module, "attention_scaling", 1.0))


def _build(module: nn.Module, dtype: torch.dtype, rows: int) -> RotaryTable:
    probe = torch.zeros(1, rows, 1, dtype=dtype)  # the module reads only its dtype and device
    cos, sin = module(probe, torch.arange(rows).view(1, rows))  # [1, P, hd] each
    return RotaryTable(torch.cat([cos[0], sin[0]], dim=-1).contiguous(), dtype, _key(module))


def table_for(module: nn.Module, dtype: torch.dtype, top: int) -> RotaryTable:
    """``module``'s table in ``dtype`` covering positions ``0 .. top`` (built, rebuilt or doubled as needed;
    ``module`` must be :func:`tabled`)."""
    per_dtype = _TABLES.setdefault(module, {})
    table = per_dtype.get(dtype)
    if table is None or table.key != _key(module) or top >= table.rows.shape[0]:
        size = max(FIRST_ROWS, 1 << top.bit_length()) if table is None else max(
            table.rows.shape[0], 1 << top.bit_length())
        table = per_dtype[dtype] = _build(module, dtype, size)
    return table


def cos_sin(module: nn.Module, like: torch.Tensor, positions: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``module(like, positions)`` returns: cos and sin ``[B, T, hd]`` at ``positions [B, T]`` in
    ``like``'s dtype, from the table where :func:`tabled` (then views with row stride ``2 hd``), else from
    the module."""
    if not tabled(module) or positions.device.type != "cpu" or positions.numel() == 0:
        return module(like, positions)
    table = table_for(module, like.dtype, int(positions.max()))
    hd = table.rows.shape[1] // 2
    picked = table.rows.index_select(0, positions.reshape(-1)).view(*positions.shape, 2 * hd)  # [B, T, 2hd]
    return picked[..., :hd], picked[..., hd:]


def row_major(t: torch.Tensor) -> torch.Tensor:
    """``t [..., R, hd]`` with unit stride along ``hd`` and rows evenly spaced (what the C ops read with one
    row stride, ``t.stride(-2)``); copied only when it is not."""
    rows = t.numel() // t.shape[-1]
    flat_ok = t.stride(-1) == 1 and all(
        t.stride(i) == t.stride(i + 1) * t.shape[i + 1] for i in range(t.dim() - 2))
    return t if flat_ok and rows else t.contiguous()


__all__ = ["FIRST_ROWS", "STATIC_KINDS", "RotaryTable", "cos_sin", "row_major", "table_for", "tabled"]
