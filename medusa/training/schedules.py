"""lambda_0(step): the weight of the heads' loss in MEDUSA-2 (``L = L_LM + lambda_0(step) * L_heads``).

The heads start as copies of the LM head and their early gradients are large and noisy; MEDUSA-2 warms
their weight up so they do not drag the backbone away from its own distribution. The formulas follow
the official MEDUSA-2 training code (the ``medusa_scheduler`` of the axolotl fork), with
``s = step / total_steps`` (``step`` counted from 0, optimizer steps):

- ``constant``:        ``lambda_0(step) = lambda0``
- ``linear``:          ``lambda_0(step) = lambda0 * s``
- ``sine``:            ``lambda_0(step) = lambda0 * sin(pi/2 * s)``
- ``sine_<f>`` (0 < f <= 1): a sine ramp over the first ``f`` of training, then flat:
  ``lambda_0(step) = lambda0 * sin(pi/2 * step / ramp_steps)`` while ``step < ramp_steps``
  (``ramp_steps = f * total_steps``), else ``lambda0``. ``sine_1`` is ``sine``.

Every schedule is clamped to ``[0, lambda0]`` (``s`` is clamped to ``[0, 1]``), so a step past
``total_steps`` (e.g. an extra eval step) keeps the final value.
"""

from __future__ import annotations

import math

from medusa.config.enums import LAMBDA0_SCHEDULES as SCHEDULES
from medusa.config.validate import parse_schedule
from medusa.errors import ConfigError

__all__ = ["SCHEDULES", "lambda0_at", "parse_schedule"]


def lambda0_at(step: int, total_steps: int, lambda0: float, schedule: str = "constant") -> float:
    """The heads' loss weight at optimizer step ``step`` (0-based) of ``total_steps``. See the module doc."""
    kind, fraction = parse_schedule(schedule)
    if lambda0 < 0:
        raise ConfigError(f"medusa2.lambda0: must be >= 0, got {lambda0}")
    if kind == "constant":
        return float(lambda0)
    if total_steps <= 0:
        raise ConfigError(f"a {schedule!r} lambda0 schedule needs a positive number of training steps, got "
                          f"{total_steps}")
    if kind == "linear":
        return float(lambda0) * min(max(step / total_steps, 0.0), 1.0)
    ramp_steps = fraction * total_steps
    if step >= ramp_steps:
        return float(lambda0)
    return float(lambda0) * math.sin(math.pi / 2 * max(step, 0) / ramp_steps)
