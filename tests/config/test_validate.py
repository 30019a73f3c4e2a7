"""Recipe validation (medusa/config/validate.py): every range, choice and file check names its key; the
heads' shape is checked by one function for recipes and checkpoints; MEDUSA-2's lambda_0 schedules."""

from pathlib import Path

import pytest

from medusa.config import Recipe, load_recipe, validate
from medusa.config.validate import HEAD_FIELDS, check_head_fields, parse_schedule
from medusa.errors import ConfigError

from tiny_models import SHARED, require_shared

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny" / "medusa1.yaml"


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("override, message", [
    ("train.warmup_ratio=1.5", r"train\.warmup_ratio: 1\.5 is out of range"),
    ("heads.num_heads=0", r"heads\.num_heads: 0 is out of range"),
    ("heads.head_type=lineer", r"heads\.head_type: 'lineer' is not one of .*did you mean linear"),
    ("quantization=3bit", r"quantization: '3bit'"),
    ("data.train=nowhere/data.jsonl", r"data\.train: nowhere/data\.jsonl does not exist"),
    ("model=./no/such/model", r"model: \./no/such/model does not exist"),
    ("medusa2.schedule=cosine", r"medusa2\.schedule: 'cosine'"),
    ("medusa2.schedule=sine_1.5", r"medusa2\.schedule"),
    ("lora.r=0", r"lora\.r: 0 is out of range"),
    ("train.max_steps=0", r"train\.max_steps"),
])
def test_bad_values_name_the_key(override, message):
    require_shared(SHARED)
    with pytest.raises(ConfigError, match=message):
        load_recipe(TINY, [override])


def test_validate_requires_model_and_data():
    with pytest.raises(ConfigError, match="model: required"):
        validate(Recipe())
    with pytest.raises(ConfigError, match=r"data\.train: required"):
        validate(Recipe(model="some/hub-id"))


def test_head_fields_are_the_recipe_and_checkpoint_ones():
    import dataclasses

    from medusa.config import HeadsConfig
    from medusa.modeling.config import MedusaConfig

    for cls in (HeadsConfig, MedusaConfig):
        assert set(HEAD_FIELDS) <= {f.name for f in dataclasses.fields(cls)}


def test_check_head_fields():
    check_head_fields(5, 1, "linear", 0, "own")
    check_head_fields(5, 1, "linear", 0, None, prefix="", unset=None)
    check_head_fields(4, 1, "hydra", 8192, "shared_lm_head", prefix="", unset=None)
    with pytest.raises(ConfigError, match=r"^heads\.num_heads: 65 is out of range"):
        check_head_fields(65, 1, "linear", 0, "own")
    with pytest.raises(ConfigError, match=r"^num_layers: hydra heads need at least 1 layer"):
        check_head_fields(2, 0, "hydra", 0, None, prefix="", unset=None)
    with pytest.raises(ConfigError, match=r"^hydra_projection: must be one of own, shared_lm_head, got 'x'"):
        check_head_fields(2, 1, "hydra", 0, "x", prefix="", unset=None)
    with pytest.raises(ConfigError, match=r"only for head_type: hydra .*only hydra heads"):
        check_head_fields(2, 1, "linear", 0, "own", prefix="", unset=None)
    with pytest.raises(ConfigError, match=r"^num_heads: expected int, got '5'"):
        check_head_fields("5", 1, "linear", 0, None, prefix="", unset=None)


@pytest.mark.parametrize("bad", ["cosine", "sine_", "sine_0", "sine_1.5", "sine_x", 3])
def test_bad_schedule_names_the_key(bad):
    with pytest.raises(ConfigError, match="medusa2.schedule"):
        parse_schedule(bad)


def test_parse():
    assert parse_schedule("sine_0.25") == ("sine", 0.25)
    assert parse_schedule("linear") == ("linear", 1.0)


def test_parse_schedule_names_the_given_key():
    assert parse_schedule("sine_0.1") == ("sine", 0.1) and parse_schedule("constant") == ("constant", 1.0)
    with pytest.raises(ConfigError, match=r"^m2\.sched: 'cos' is not one of constant \| linear"):
        parse_schedule("cos", "m2.sched")


def _hydra_recipe(tmp_path, *overrides):
    base = [f"output_dir={tmp_path / 'run'}", "data.max_length=64", "train.logging_steps=5",
            "data.eval_split=0.02", "train.eval_steps=0", "heads.head_type=hydra"]
    return load_recipe(TINY, base + list(overrides))


@pytest.mark.usefixtures("tiny_recipe_env")
def test_recipe_checks_hydra_keys(tmp_path):
    with pytest.raises(ConfigError, match="heads.teacher_loss"):
        _hydra_recipe(tmp_path, "heads.teacher_loss=1.5")
    with pytest.raises(ConfigError, match="heads.num_layers"):
        _hydra_recipe(tmp_path, "heads.num_layers=0")


@pytest.mark.usefixtures("tiny_recipe_env")
def test_recipe_checks_hydra_projection(tmp_path):
    base = [f"output_dir={tmp_path}"]
    assert load_recipe(TINY, base).heads.hydra_projection == "own"
    with pytest.raises(ConfigError, match="heads.hydra_projection: .*only for heads.head_type: hydra"):
        load_recipe(TINY, base + ["heads.hydra_projection=shared_lm_head"])
    with pytest.raises(ConfigError, match="heads.hydra_projection.*shared_lm_head"):
        load_recipe(TINY, base + ["heads.head_type=hydra", "heads.hydra_projection=shared_lm_heads"])
    with pytest.raises(ConfigError, match="did you mean heads.hydra_projection"):
        load_recipe(TINY, base + ["heads.hydra_projecton=own"])


@pytest.mark.usefixtures("tiny_recipe_env")
def test_eagle3_teacher_loss_needs_the_online_base(tmp_path):
    eagle3 = [f"output_dir={tmp_path / 'run'}", "heads.head_type=eagle3", "heads.num_layers=1"]
    assert load_recipe(TINY, eagle3 + ["heads.teacher_loss=0.5"]).heads.teacher_loss == 0.5
    with pytest.raises(ConfigError, match=r"heads.teacher_loss: eagle3 .* train.hidden_cache"):
        load_recipe(TINY, eagle3 + ["heads.teacher_loss=0.5", f"train.hidden_cache={tmp_path / 'cache'}"])
