"""MEDUSA-2's lambda_0 schedules (medusa/training/schedules.py); the schedule names are checked by
medusa.config.validate.parse_schedule (tests/config/test_validate.py)."""

import itertools
import math

import pytest

from medusa.training.schedules import lambda0_at


def test_constant():
    assert [lambda0_at(s, 100, 0.2, "constant") for s in (0, 50, 100)] == [0.2, 0.2, 0.2]


def test_linear():
    assert lambda0_at(0, 100, 0.2, "linear") == 0.0
    assert lambda0_at(25, 100, 0.2, "linear") == pytest.approx(0.05)
    assert lambda0_at(100, 100, 0.2, "linear") == pytest.approx(0.2)
    assert lambda0_at(150, 100, 0.2, "linear") == pytest.approx(0.2)  # clamped past the end


def test_sine_over_all_training():
    assert lambda0_at(0, 100, 0.2, "sine") == 0.0
    assert lambda0_at(50, 100, 0.2, "sine") == pytest.approx(0.2 * math.sin(math.pi / 4))
    assert lambda0_at(100, 100, 0.2, "sine") == pytest.approx(0.2)


def test_sine_fraction_ramps_then_flat():
    # ramp over the first 10% (10 of 100 steps): lambda0 * sin(pi/2 * step / 10), then lambda0
    assert lambda0_at(0, 100, 0.01, "sine_0.1") == 0.0
    assert lambda0_at(5, 100, 0.01, "sine_0.1") == pytest.approx(0.01 * math.sin(math.pi / 4))
    assert lambda0_at(9, 100, 0.01, "sine_0.1") == pytest.approx(0.01 * math.sin(math.pi / 2 * 0.9))
    assert lambda0_at(10, 100, 0.01, "sine_0.1") == 0.01
    assert lambda0_at(73, 100, 0.01, "sine_0.1") == 0.01
    assert lambda0_at(50, 100, 0.2, "sine_1") == lambda0_at(50, 100, 0.2, "sine")


def test_schedules_are_monotone_and_bounded():
    for sched in ("linear", "sine", "sine_0.3"):
        values = [lambda0_at(s, 40, 0.5, sched) for s in range(41)]
        assert all(a <= b for a, b in itertools.pairwise(values))
        assert min(values) == 0.0 and max(values) == pytest.approx(0.5)
