"""Recipe loading: overrides, and every config error raised before a model loads (exit 2 via the CLI)."""

from pathlib import Path

import pytest

from medusa.cli import main as cli_main
from medusa.config import load_recipe, parse_value
from medusa.errors import ConfigError

from tiny_models import SHARED, require_shared

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").rglob("medusa1*.yaml"))
TINY = ROOT / "recipes" / "tiny" / "medusa1.yaml"


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_tiny_recipe_and_overrides():
    require_shared(SHARED)
    r = load_recipe(TINY, ["train.lr=1e-4", "heads.num_heads=4", "data.eval=null",
                           "lora.target_modules=[q_proj,v_proj]", "medusa2.schedule=sine_0.3"])
    assert r.train.lr == 1e-4 and r.heads.num_heads == 4 and r.data.eval is None
    assert r.lora.target_modules == ["q_proj", "v_proj"] and r.medusa2.schedule == "sine_0.3"
    assert r.to_dict()["heads"]["decay"] == 0.8


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_parses_and_starts_with_its_command(path):
    assert path.read_text().startswith("# ") and "medusa.train" in path.read_text().splitlines()[0]
    import yaml

    from medusa.config import Recipe
    from medusa.config.parse import _build

    _build(Recipe, yaml.safe_load(path.read_text()), "")  # keys and types (files may be absent here)


@pytest.mark.parametrize("override, message", [
    ("train.learning_rate=1", r"unknown key train\.learning_rate \(did you mean train\.lr"),
    ("trian.lr=1", r"unknown key trian \(did you mean train\?\)"),
    ("train.batch_size=abc", r"train\.batch_size: expected int, got 'abc'"),
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


def test_missing_recipe_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: x\ntrain:\n  lr: [1,\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+: invalid YAML"):
        load_recipe(bad)


def test_parse_value():
    assert parse_value("1e-4") == 1e-4 and parse_value("null") is None and parse_value("true") is True
    assert parse_value("abc") == "abc" and parse_value("[1, 2]") == [1, 2]


def test_cli_exits_2_naming_the_key(capsys):
    require_shared(SHARED)
    assert cli_main(["train", str(TINY), "train.lr_rate=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "train.lr_rate" in err and "did you mean train.lr" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_bad_data_row_names_file_and_line(tmp_path, capsys):
    require_shared(SHARED)
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "a", "completion": " b c d"}\n{"prompt": "a", "completion": 3}\n')
    code = cli_main(["train", str(TINY), f"data.train={data}", "data.format=auto",
                     f"output_dir={tmp_path / 'o'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{data}:2" in err and "completion" in err


def test_module_entry_point_exits_2(capsys):
    from medusa.train import main

    assert main([str(ROOT / "recipes" / "does-not-exist.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "does-not-exist.yaml: not found" in err and err.count("\n") == 1


def test_yaml_bool_words_keep_their_text_in_string_fields():
    require_shared(SHARED)
    r = load_recipe(TINY, ["train.mixed_precision=no", "data.skip_invalid=yes"])
    assert r.train.mixed_precision == "no" and type(r.train.mixed_precision) is str
    assert r.data.skip_invalid is True
    assert load_recipe(TINY, ["--train.mixed_precision=no"]).train.mixed_precision == "no"
    assert load_recipe(TINY, ["train.mixed_precision=null"]).train.mixed_precision is None
    with pytest.raises(ConfigError, match=r"train\.mixed_precision: 'off' is not one of"):
        load_recipe(TINY, ["train.mixed_precision=off"])
    with pytest.raises(ConfigError, match=r"train\.batch_size: expected int, got 'on'"):
        load_recipe(TINY, ["train.batch_size=on"])
    with pytest.raises(ConfigError, match=r"train\.mixed_precision: expected str or null, got False"):
        load_recipe(TINY, ["train.mixed_precision=false"])
    assert parse_value("no") == "no" and parse_value("no").value is False and parse_value("true") is True


def test_yaml_bool_words_in_a_recipe_file(tmp_path):
    require_shared(SHARED)
    text = TINY.read_text()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text.replace("train:\n", "train:\n  mixed_precision: no\n", 1))
    assert load_recipe(recipe).train.mixed_precision == "no"
