"""Recipe parsing (medusa/config/parse.py): YAML files, ``dotted.key=value`` overrides, the typed coercer
(unknown keys with the closest known one suggested, wrong types), YAML boolean words."""

from pathlib import Path

import pytest

from medusa.config import load_recipe, parse_value
from medusa.config.parse import FLOAT_RE, BoolWord, read_yaml
from medusa.errors import ConfigError, MedusaError

from tiny_models import SHARED, require_shared

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").rglob("medusa1*.yaml"))
TINY = ROOT / "recipes" / "tiny" / "medusa1.yaml"
BENCH_RECIPES = sorted((ROOT / "benchmarks" / "recipes").glob("*.yaml"))


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


@pytest.mark.parametrize("path", BENCH_RECIPES, ids=lambda p: p.name)
def test_every_benchmark_recipe_parses(path):
    import yaml

    from medusa.config import Recipe
    from medusa.config.parse import _build

    assert path.read_text().startswith("# ")  # the command that runs it
    _build(Recipe, yaml.safe_load(path.read_text()), "")


@pytest.mark.parametrize("override, message", [
    ("train.learning_rate=1", r"unknown key train\.learning_rate \(did you mean train\.lr"),
    ("trian.lr=1", r"unknown key trian \(did you mean train\?\)"),
    ("train.batch_size=abc", r"train\.batch_size: expected int, got 'abc'"),
])
def test_bad_keys_and_types_name_the_key(override, message):
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


def test_one_float_pattern_for_files_and_overrides():
    assert FLOAT_RE.fullmatch("1e-4") and FLOAT_RE.fullmatch("-2.5E+3") and not FLOAT_RE.fullmatch("1.5")
    assert parse_value("3E2") == 300.0 and isinstance(parse_value("1e-4"), float)


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
    word = parse_value("No")
    assert isinstance(word, BoolWord) and word == "No" and word.value is False and parse_value("true") is True


def test_yaml_bool_words_in_a_recipe_file(tmp_path):
    require_shared(SHARED)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY.read_text().replace("train:\n", "train:\n  mixed_precision: no\n", 1))
    assert load_recipe(recipe).train.mixed_precision == "no"
    recipe.write_text(TINY.read_text().replace("data:\n", "data:\n  skip_invalid: on\n", 1))
    assert load_recipe(recipe).data.skip_invalid is True


def test_yaml_duplicate_keys_are_errors(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("train:\n  lr: 1\n  epochs: 2\n  lr: 3\n")
    with pytest.raises(ConfigError, match=r"r.yaml:4: duplicate key 'lr' \(first given on line 2\)"):
        read_yaml(path, ConfigError)
    path.write_text("a: {b: 1}\nc: [1, {d: 2}]\n")
    assert read_yaml(path) == {"a": {"b": 1}, "c": [1, {"d": 2}]}
    path.write_text("a: [1\n")
    with pytest.raises(MedusaError, match="r.yaml:2: invalid YAML"):
        read_yaml(path)


def test_a_yaml_alias_bomb_fails_fast_naming_the_file(tmp_path):
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]  # 9^9 values
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"bomb.yaml: its aliases expand to [\d,]+ values \(at most"):
        read_yaml(tmp_path / "bomb.yaml", ConfigError)
    (tmp_path / "ok.yaml").write_text("base: &b {lr: 1}\ntrain: *b\neval: *b\n")  # ordinary anchors load
    assert read_yaml(tmp_path / "ok.yaml") == {"base": {"lr": 1}, "train": {"lr": 1}, "eval": {"lr": 1}}
