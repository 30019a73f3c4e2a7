"""The package medusa/config/__init__.py: every public name of the former medusa/config.py module is still
importable from ``medusa.config``."""

import medusa.config as config

OLD_PUBLIC_NAMES = ("METHODS", "DTYPES", "QUANTIZATIONS", "HEAD_TYPES", "HYDRA_PROJECTIONS", "FORMATS",
                    "SCHEDULERS", "REPORT_TO", "MIXED_PRECISION", "STEPS_MAX", "HeadsConfig", "DataConfig",
                    "TrainConfig", "LoraConfig", "Medusa2Config", "Recipe", "validate", "parse_value",
                    "apply_overrides", "recipe_from_dict", "load_recipe", "parse_schedule", "ConfigError")


def test_the_old_public_names_are_re_exported():
    assert sorted(config.__all__) == sorted(OLD_PUBLIC_NAMES)
    for name in OLD_PUBLIC_NAMES:
        assert getattr(config, name) is not None, name
    assert config.Recipe().to_dict()["method"] == "medusa1"


def test_config_imports_no_other_medusa_package():
    import ast
    from pathlib import Path

    folder = Path(config.__file__).parent
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("medusa"):
                assert node.module.split(".")[:2] in (["medusa", "config"], ["medusa", "errors"],
                                                      ["medusa", "io"]), (path.name, node.module)
