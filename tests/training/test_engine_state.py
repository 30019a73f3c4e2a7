"""The trained state of a checkpoint, engine-independent (one process here; DDP and DeepSpeed ZeRO-2/3
across process counts: tests/integration/test_distributed.py): full tensors, safetensors + JSON only, loaded
back exactly, and refused with one error naming the difference when it does not fit the running model."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from medusa.errors import CheckpointError
from medusa.training.engine_state import (
    OPTIMIZER_JSON,
    OPTIMIZER_TENSORS,
    WEIGHTS_NAME,
    group_value_error,
    load_engine_state,
    save_engine_state,
)


class _Accelerator:
    """What the engine-state functions ask of accelerate's Accelerator, for one process without an engine."""

    distributed_type = "DistributedType.NO"
    num_processes = 1
    is_main_process = True
    scaler = None

    class state:  # noqa: N801 - accelerate's attribute name
        deepspeed_plugin = None

    @staticmethod
    def unwrap_model(module: nn.Module) -> nn.Module:
        return module


def _trained(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A module with a frozen part and a buffer, two parameter groups, stepped 3 times."""
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    module[0].weight.requires_grad_(False)
    module.register_buffer("token_map", torch.arange(5))
    groups = [{"name": "decay", "params": [module[1].weight], "weight_decay": 0.1},
              {"name": "no_decay", "params": [module[0].bias, module[1].bias], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=1e-2)
    for _ in range(3):
        module(torch.randn(6, 4)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    optimizer.param_groups[0]["lr"] = 3e-3  # as a scheduler leaves it
    return module, optimizer


def test_round_trip_restores_weights_moments_steps_and_learning_rates(tmp_path):
    module, optimizer = _trained(0)
    save_engine_state(_Accelerator(), module, optimizer, tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([WEIGHTS_NAME, OPTIMIZER_TENSORS, OPTIMIZER_JSON])
    moments = load_file(tmp_path / OPTIMIZER_TENSORS)
    assert sorted(moments) == ["exp_avg/0.bias", "exp_avg/1.bias", "exp_avg/1.weight", "exp_avg_sq/0.bias",
                               "exp_avg_sq/1.bias", "exp_avg_sq/1.weight"]  # the frozen weight has none
    meta = json.loads((tmp_path / OPTIMIZER_JSON).read_text())
    assert (meta["engine"], meta["world_size"], meta["step"]) == ("NO", 1, {"0.bias": 3, "1.weight": 3,
                                                                            "1.bias": 3})

    other, fresh = _trained(1)  # other values everywhere
    other[0].weight.data.copy_(module[0].weight)  # the frozen part comes from the base model, not the file
    load_engine_state(_Accelerator(), other, fresh, tmp_path)
    for (name, p), q in zip(module.named_parameters(), other.parameters()):
        assert torch.equal(p, q), name
    assert [g["lr"] for g in fresh.param_groups] == [3e-3, 1e-2]
    for p, q in zip(module.parameters(), other.parameters()):
        if p.requires_grad:
            for key in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(optimizer.state[p][key], fresh.state[q][key]), key
    # the next step is the same step
    x = torch.randn(6, 4)
    for m, opt in ((module, optimizer), (other, fresh)):
        m(x).square().mean().backward()
        opt.step()
    for p, q in zip(module.parameters(), other.parameters()):
        assert torch.equal(p, q)


def test_a_state_that_does_not_fit_is_refused_naming_it(tmp_path):
    module, optimizer = _trained(0)
    save_engine_state(_Accelerator(), module, optimizer, tmp_path)
    bigger = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 5))
    bigger.register_buffer("token_map", torch.arange(5))
    bigger[0].weight.requires_grad_(False)
    groups = [{"name": "decay", "params": [bigger[1].weight]},
              {"name": "no_decay", "params": [bigger[0].bias, bigger[1].bias]}]
    with pytest.raises(CheckpointError, match=r"1.weight has shape \(2, 3\), this run's 1.weight \(5, 3\)"):
        load_engine_state(_Accelerator(), bigger, torch.optim.AdamW(groups), tmp_path)

    fresh_module, fresh = _trained(1)
    renamed = [{"name": "heads", "params": [fresh_module[1].weight]},
               {"name": "no_decay", "params": [fresh_module[0].bias, fresh_module[1].bias]}]
    with pytest.raises(CheckpointError, match="parameter group .* is not this run's 'heads'"):
        load_engine_state(_Accelerator(), fresh_module, torch.optim.AdamW(renamed), tmp_path)

    weights = load_file(tmp_path / WEIGHTS_NAME)
    save_file({k: v for k, v in weights.items() if k != "token_map"}, str(tmp_path / WEIGHTS_NAME))
    with pytest.raises(CheckpointError, match=r"tensors missing \['token_map'\]"):
        load_engine_state(_Accelerator(), fresh_module, fresh, tmp_path)

    (tmp_path / OPTIMIZER_JSON).write_text('{"format": "something else"}')
    with pytest.raises(CheckpointError, match="not a medusa-optimizer version 1 file"):
        load_engine_state(_Accelerator(), fresh_module, fresh, tmp_path)
    (tmp_path / OPTIMIZER_TENSORS).unlink()
    with pytest.raises(CheckpointError, match="unreadable trained state"):
        load_engine_state(_Accelerator(), fresh_module, fresh, tmp_path)


def test_a_trained_parameter_never_updated_round_trips_without_state(tmp_path):
    """A trained parameter that got no gradient yet has no AdamW state: saved without moments or step, loaded
    stateless (not refused); one whose step is missing while its moments are there is refused."""
    module, optimizer = _trained(0)
    extra = nn.Parameter(torch.ones(2))  # trained, never in the loss
    module.register_parameter("unused", extra)
    optimizer.add_param_group({"name": "unused", "params": [extra]})
    save_engine_state(_Accelerator(), module, optimizer, tmp_path)
    assert "unused" not in json.loads((tmp_path / OPTIMIZER_JSON).read_text())["step"]
    other, fresh = _trained(1)
    other.register_parameter("unused", nn.Parameter(torch.zeros(2)))
    fresh.add_param_group({"name": "unused", "params": [other.unused]})
    load_engine_state(_Accelerator(), other, fresh, tmp_path)
    assert torch.equal(other.unused, extra) and other.unused not in fresh.state

    meta = json.loads((tmp_path / OPTIMIZER_JSON).read_text())
    del meta["step"]["1.weight"]
    (tmp_path / OPTIMIZER_JSON).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="step of 1.weight is None"):
        load_engine_state(_Accelerator(), other, fresh, tmp_path)


def test_group_settings_of_the_wrong_kind_are_refused(tmp_path):
    module, optimizer = _trained(0)
    save_engine_state(_Accelerator(), module, optimizer, tmp_path)
    meta = json.loads((tmp_path / OPTIMIZER_JSON).read_text())
    for key, value in (("lr", "0.1; rm -rf /"), ("lr", float("inf")), ("betas", [0.9]), ("amsgrad", 1)):
        bad = json.loads(json.dumps(meta))
        bad["param_groups"][0][key] = value
        (tmp_path / OPTIMIZER_JSON).write_text(json.dumps(bad))
        other, fresh = _trained(1)
        with pytest.raises(CheckpointError, match=f"{key} = .* does not fit this run's optimizer"):
            load_engine_state(_Accelerator(), other, fresh, tmp_path)


@pytest.mark.parametrize("key, want, got, why", [
    ("lr", 1e-3, 1e308, "outside [0.0, 10.0]"), ("lr", 1e-3, -5, "outside"), ("betas", (0.9, 0.99), [2, 0.9],
     "outside"), ("eps", 1e-8, -1, "outside"), ("weight_decay", 0.0, 1e30, "outside"),
    ("amsgrad", False, True, "differs from this run's optimizer (False)"), ("lr", 1e-3, "x", "does not fit"),
])
def test_absurd_group_values_are_refused(key, want, got, why):
    assert why in group_value_error(key, want, got)


def test_sane_group_values_pass():
    assert group_value_error("lr", 1e-3, 5e-4) is None
    assert group_value_error("betas", (0.9, 0.99), [0.8, 0.9]) is None
    assert group_value_error("amsgrad", False, False) is None


def test_a_resumed_learning_rate_past_its_bound_is_refused(tmp_path):
    module, optimizer = _trained(0)
    save_engine_state(_Accelerator(), module, optimizer, tmp_path)
    meta = json.loads((tmp_path / OPTIMIZER_JSON).read_text())
    meta["param_groups"][0]["lr"] = 1e308
    (tmp_path / OPTIMIZER_JSON).write_text(json.dumps(meta))
    fresh_module, fresh = _trained(1)
    with pytest.raises(CheckpointError, match=r"optimizer.json: lr = 1e\+308 lies outside"):
        load_engine_state(_Accelerator(), fresh_module, fresh, tmp_path)
