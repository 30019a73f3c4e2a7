"""medusa.training.setup: ``train.mixed_precision: auto`` resolves by what the device computes natively."""

from pathlib import Path

import pytest

from medusa.config import load_recipe
from medusa.training import setup

from tiny_models import SHARED, require_shared

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    require_shared(SHARED)
    monkeypatch.chdir(ROOT)  # the tiny recipe's data paths are relative to the repository root


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "no")])
def test_auto_mixed_precision_follows_native_bf16(monkeypatch, native, expected):
    recipe = load_recipe(ROOT / "recipes" / "tiny" / "medusa1.yaml", ["train.mixed_precision=auto"])
    monkeypatch.setattr(setup, "native_bf16", lambda device: native)
    assert setup.mixed_precision(recipe) == expected


@pytest.mark.parametrize("value", ["no", "bf16", "fp16", None])
def test_explicit_mixed_precision_is_kept(value):
    override = "null" if value is None else f'"{value}"'  # bare `no` is YAML's false
    recipe = load_recipe(ROOT / "recipes" / "tiny" / "medusa1.yaml", [f"train.mixed_precision={override}"])
    assert setup.mixed_precision(recipe) == value


@pytest.mark.parametrize("kind, hf_name", [("cosine", "cosine"), ("linear", "linear"),
                                           ("constant", "constant_with_warmup")])
@pytest.mark.parametrize("warmup, total", [(0, 7), (3, 10), (5, 5), (1, 1)])
def test_lr_schedule_equals_transformers_schedule(kind, hf_name, warmup, total):
    """Our LambdaLR gives transformers' schedule factor at every step (and past the end), and its state is the
    same plain data (a partial's empty dict), so scheduler.json written by either one loads into the other."""
    import torch
    from transformers import get_scheduler

    recipe = load_recipe(ROOT / "recipes" / "tiny" / "medusa1.yaml", [f"train.scheduler={kind}"])
    plan = setup.Plan(steps_per_epoch=total, total_steps=total, warmup_steps=warmup, world=1, micro_batch=1,
                      grad_accum=1)
    ours = setup.make_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0), recipe, plan)
    theirs = get_scheduler(hf_name, torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0),
                           num_warmup_steps=warmup, num_training_steps=total)
    for _ in range(total + 3):
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), abs=1e-12)
        ours.optimizer.step(), theirs.optimizer.step()
        ours.step(), theirs.step()
    assert ours.state_dict() == theirs.state_dict()


def test_max_length_past_the_models_positions(tmp_path, capsys):
    """An explicit data.max_length past the model's max_position_embeddings is refused naming both numbers;
    the default (2048) is cut to the model's positions, said in one line."""
    from medusa.errors import ConfigError

    tok = setup.load_tokenizer(load_recipe(ROOT / "recipes" / "tiny" / "medusa1.yaml"))
    limit = setup.max_positions(load_recipe(ROOT / "recipes" / "tiny" / "medusa1.yaml").model)
    assert limit == 512  # stories260K
    recipe = load_recipe(ROOT / "recipes" / "tiny" / "medusa1.yaml", ["data.max_length=513"])
    with pytest.raises(ConfigError, match="data.max_length 513 exceeds the model's 512 positions"):
        setup.load_data(recipe, tok)
    recipe = load_recipe(ROOT / "recipes" / "tiny" / "medusa1.yaml", ["data.max_length=2048"])
    lines = []
    data = setup.load_data(recipe, tok, log=lines.append)
    assert lines == ["data.max_length: the default 2048 is past the model's 512 positions "
                     "(max_position_embeddings); using 512"]
    assert max(len(e["input_ids"]) for e in data.train.examples) <= 512
    recipe = load_recipe(ROOT / "recipes" / "tiny" / "medusa1.yaml", ["data.max_length=512"])
    setup.load_data(recipe, tok, log=lines.append)
    assert len(lines) == 1


def test_param_groups_read_a_zero3_partition_by_its_full_shape():
    """Under ZeRO-3 every parameter is a 1-D partition (``ds_shape`` keeps its shape): a weight matrix stays
    in the decay group, as in a 1-process run (it fell into no_decay: another optimizer, another group
    count)."""
    import torch
    from torch import nn

    model = nn.Module()
    model.heads = nn.Linear(2, 2)
    model.proj = nn.Linear(4, 4)
    for p in model.proj.parameters():  # what ZeRO-3 leaves in the module: an empty 1-D tensor
        p.ds_shape = p.shape
        p.data = torch.empty(0)
    groups = {g["name"]: g["params"] for g in setup.param_groups(model, lr=1e-3, weight_decay=0.1)}
    assert groups["backbone_decay"] == [model.proj.weight]
    assert groups["backbone_no_decay"] == [model.proj.bias]


def test_epoch_order_without_lengths_is_the_plain_shuffle():
    import torch
    order = setup.epoch_order(50, seed=3, epoch=1)
    assert order == torch.randperm(50, generator=torch.Generator().manual_seed(3001)).tolist()


def test_group_by_length_batches_rows_of_like_length_and_keeps_every_row():
    import random
    rng = random.Random(0)
    lengths = [rng.randint(5, 800) for _ in range(1003)]
    block = 8  # micro_batch x world
    grouped = setup.epoch_order(len(lengths), seed=0, epoch=0, lengths=lengths, block=block)
    plain = setup.epoch_order(len(lengths), seed=0, epoch=0)
    assert sorted(grouped) == list(range(len(lengths)))  # a permutation: nothing lost or repeated

    def padded(order):  # tokens a batch pads to, summed over the full blocks
        full = len(order) // block * block
        return sum(block * max(lengths[i] for i in order[at:at + block]) for at in range(0, full, block))
    real = sum(lengths[i] for i in grouped[:len(grouped) // block * block])
    assert padded(grouped) < 1.05 * real < 0.6 * padded(plain)  # ~no padding, against ~1.8x
    firsts = [lengths[grouped[at]] for at in range(0, len(grouped) // block * block, block)]
    assert firsts != sorted(firsts, reverse=True)  # the blocks are shuffled, not longest first
    assert setup.epoch_order(len(lengths), 0, 1, lengths, block) != grouped  # another epoch, another order
    assert setup.epoch_order(len(lengths), 0, 0, lengths, block) == grouped  # the same on every process


def test_group_by_length_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="3 lengths for 4 examples"):
        setup.epoch_order(4, 0, 0, [1, 2, 3], 2)


def test_training_order_groups_in_blocks_of_one_global_batch():
    from medusa.config import Recipe

    examples = [{"input_ids": [0] * n} for n in (5, 90, 7, 60, 3, 80, 9, 70, 4, 50)]
    recipe = Recipe(model="m")
    plan = setup.Plan(steps_per_epoch=2, total_steps=2, warmup_steps=0, world=2, micro_batch=1, grad_accum=2)
    assert setup.training_order(examples, recipe, plan, 0) == setup.epoch_order(10, recipe.train.seed, 0)
    recipe.data.group_by_length = True
    lengths = [len(e["input_ids"]) for e in examples]
    assert setup.training_order(examples, recipe, plan, 1) == setup.epoch_order(10, recipe.train.seed, 1,
                                                                                  lengths, 4)
