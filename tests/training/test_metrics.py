"""The training run's metrics rows (medusa/training/metrics.py): a window sums its micro-batches and its row
averages them (losses, loss terms) or sums them (tokens), with per-head accuracy from the summed stats."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from medusa.training.losses import STATS_ROWS
from medusa.training.metrics import log_window, new_window, write_metrics


class _OneProcess:
    """accelerate's calls the metrics make, for one process: reduce is the identity."""

    device = torch.device("cpu")
    is_main_process = True

    def __init__(self):
        self.logged = []

    def reduce(self, tensor, reduction):
        assert reduction == "sum"
        return tensor

    def log(self, row, step):
        self.logged.append((step, row))


def test_a_window_row_averages_its_micro_batches(tmp_path):
    window = new_window(num_heads=2)
    stats = torch.zeros(STATS_ROWS, 2)
    stats[0], stats[1], stats[2], stats[3] = torch.tensor([4.0, 6.0]), torch.tensor([3.0, 1.0]), 4.0, 4.0
    window.add(torch.tensor(2.0), stats, tokens=10, parts={"lm_loss": 1.0})
    window.add(torch.tensor(4.0), stats, tokens=6, parts={"lm_loss": 3.0})
    assert (window.micro, window.tokens, window.loss) == (2, 16, 6.0)
    recipe = SimpleNamespace(heads=SimpleNamespace(num_heads=2))
    run = SimpleNamespace(accelerator=_OneProcess(), recipe=recipe,
                          plan=SimpleNamespace(steps_per_epoch=8), metrics_path=tmp_path / "metrics.jsonl",
                          scheduler=SimpleNamespace(get_last_lr=lambda: [1e-3]))
    row = log_window(run, window, step=4, grad_norm=torch.tensor(0.5))
    assert row["loss"] == pytest.approx(3.0) and row["lm_loss"] == pytest.approx(2.0)
    assert (row["step"], row["epoch"], row["tokens"], row["lr"]) == (4, 0.5, 16, 1e-3)
    assert row["head1_loss"] == pytest.approx(1.0) and row["head2_loss"] == pytest.approx(1.5)
    assert row["head1_top1"] == pytest.approx(0.75) and row["head2_top1"] == pytest.approx(0.25)
    assert row["grad_norm"] == pytest.approx(0.5) and row["tokens_per_s"] > 0
    assert json.loads(run.metrics_path.read_text()) == row
    assert run.accelerator.logged == [(4, row)]


def test_write_metrics_appends_one_json_row_per_call(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_metrics(path, {"step": 1, "loss": 2.0})
    write_metrics(path, {"step": 2, "eval_loss": 1.5})
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"step": 1, "loss": 2.0},
                                                                      {"step": 2, "eval_loss": 1.5}]
