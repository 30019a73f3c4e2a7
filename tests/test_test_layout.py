"""The tests mirror the package: every module with logic, ``medusa/<package>/<module>.py``, has its test
module ``tests/<package>/test_<module>.py`` holding at least one test; a package's ``__init__.py`` is tested
in ``tests/<package>/test_<package>.py``; a top-level ``medusa/<module>.py`` in ``tests/test_<module>.py``.
Subpackages mirror too: ``medusa/selfdistill/backends/refill.py`` ->
``tests/selfdistill/backends/test_refill.py``.
Scenarios that span packages live in ``tests/integration/``, shared test code in ``tests/helpers/``.

The other direction holds as well: a ``tests/<package>/test_<name>.py`` names a module (or a package data
directory) of ``medusa/<package>/``, and every folder of test modules is a Python package (an
``__init__.py``) so that two packages' test modules may share a name (``tests/cli/test_bench.py`` and
``tests/eval/test_bench.py``).

Modules without a test module are listed below with the reason; an entry that no longer applies (the module
is gone, or now has its test module) fails the check, so the lists only shrink.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "medusa"
BENCHMARKS = ROOT / "benchmarks"  # the benchmark pipelines, outside the package: tests/benchmarks/ mirrors it
TESTS = ROOT / "tests"

# Modules that are pure declarations or entry shims: nothing of their own to test.
NO_TEST_MODULE: dict[str, str] = {
    "medusa/__init__.py": "the public API: re-exports and __version__",
    "medusa/modeling/__init__.py": "re-exports (MedusaConfig, MedusaHeads, MedusaModel...)",
    "medusa/__main__.py": "`python -m medusa` shim: calls medusa.cli.main (tests/cli/test_cli.py runs it)",
    "medusa/train.py": "`python -m medusa.train` shim: calls medusa.cli.train.main (tests/cli/test_train.py)",
    "medusa/decoding/__init__.py": "re-exports medusa_generate and the acceptance rules",
    "medusa/eval/__init__.py": "a docstring only",
    "medusa/demo/__init__.py": "a docstring only",
    "medusa/native/__init__.py": "a docstring only",
    "benchmarks/__init__.py": "a docstring only",
    "benchmarks/speculators_worker.py": "runs inside the speculators venv (its imports are not ours): "
                                        "tests/benchmarks/test_speculators_check.py runs it end to end",
    "medusa/selfdistill/__init__.py": "re-exports the library entry points",
    "medusa/selfdistill/backends/__init__.py": "re-exports the backend types",
    "medusa/selfdistill/backends/base.py": "request / result dataclasses and the backend Protocols",
    "medusa/training/__init__.py": "a docstring only",
}
# paths another branch is reorganising (skipped until it merges); none now
OWNED_ELSEWHERE: dict[str, str] = {}
# Test modules outside tests/integration and tests/helpers that mirror no module, with the reason.
NOT_A_MIRROR: dict[str, str] = {
    "tests/test_shared_assets.py": "checks the shared assets in ../shared, not a module",
    "tests/test_test_layout.py": "this check: the layout of tests/ itself",
    "tests/test_layout.py": "checks the package as a whole: import graph, package order, module sizes",
    "tests/test_design_doc.py": "checks docs/design.md's one-token path against a traced decode step",
}
NOT_MIRRORED_FOLDERS = ("tests/integration/", "tests/helpers/")


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() + ("/" if path.is_dir() else "")


def _owned_elsewhere(rel: str) -> bool:
    return any(rel.startswith(prefix) for prefix in OWNED_ELSEWHERE)


def package_modules() -> list[Path]:
    """Every ``.py`` file of the package and of ``benchmarks/``, without following links (package data
    such as ``medusa/demo/default_model`` links to ``data/``)."""
    out = []
    for root in (PACKAGE, BENCHMARKS):
        for folder, dirs, files in os.walk(root, followlinks=False):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            out += [Path(folder) / name for name in sorted(files) if name.endswith(".py")]
    return out


def mirror_of(module: Path) -> Path:
    """``medusa/a/b.py`` -> ``tests/a/test_b.py``; ``medusa/a/__init__.py`` -> ``tests/a/test_a.py``;
    ``benchmarks/b.py`` -> ``tests/benchmarks/test_b.py``."""
    parts = module.relative_to(ROOT if module.is_relative_to(BENCHMARKS) else PACKAGE).parts
    if parts[-1] == "__init__.py":
        name = parts[-2] if len(parts) > 1 else PACKAGE.name
        return TESTS.joinpath(*parts[:-1], f"test_{name}.py")
    return TESTS.joinpath(*parts[:-1], f"test_{parts[-1]}")


def _test_files() -> list[Path]:
    """Every ``test_*.py`` under tests/."""
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def has_a_test(path: Path) -> bool:
    tree = ast.parse(path.read_text(), str(path))
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
               for node in tree.body)


def test_mirror_of():
    assert mirror_of(PACKAGE / "io.py") == TESTS / "test_io.py"
    assert mirror_of(PACKAGE / "__init__.py") == TESTS / "test_medusa.py"
    assert mirror_of(PACKAGE / "cli" / "__init__.py") == TESTS / "cli" / "test_cli.py"
    assert mirror_of(PACKAGE / "eval" / "bench.py") == TESTS / "eval" / "test_bench.py"
    assert mirror_of(BENCHMARKS / "smollm2.py") == TESTS / "benchmarks" / "test_smollm2.py"
    assert mirror_of(PACKAGE / "selfdistill" / "backends" / "__init__.py") == (
        TESTS / "selfdistill" / "backends" / "test_backends.py")
    assert mirror_of(PACKAGE / "selfdistill" / "backends" / "refill.py") == (
        TESTS / "selfdistill" / "backends" / "test_refill.py")


def test_every_module_with_logic_has_its_test_module():
    missing, empty = [], []
    for module in package_modules():
        rel = _rel(module)
        if rel in NO_TEST_MODULE or _owned_elsewhere(rel):
            continue
        mirror = mirror_of(module)
        if not mirror.is_file():
            missing.append(f"{rel} -> {_rel(mirror)}")
        elif not has_a_test(mirror):
            empty.append(_rel(mirror))
    assert not missing, "modules without their test module (write it, or list the module in NO_TEST_MODULE " \
                        "with the reason):\n" + "\n".join(missing)
    assert not empty, "test modules without a test function:\n" + "\n".join(empty)


def test_allowlist_entries_still_apply():
    stale = [f"{rel}: no such module" for rel in NO_TEST_MODULE if not (ROOT / rel).is_file()]
    stale += [f"{rel}: {_rel(mirror_of(ROOT / rel))} exists now" for rel in NO_TEST_MODULE
              if (ROOT / rel).is_file() and mirror_of(ROOT / rel).is_file()]
    stale += [f"{rel}: no such test module" for rel in NOT_A_MIRROR if not (ROOT / rel).is_file()]
    assert not stale, "remove these entries:\n" + "\n".join(stale)


def test_every_test_module_mirrors_a_module():
    strays = []
    for path in _test_files():
        rel = _rel(path)
        if rel in NOT_A_MIRROR or _owned_elsewhere(rel) or rel.startswith(NOT_MIRRORED_FOLDERS):
            continue
        parts = path.relative_to(TESTS).parts[:-1]
        folder = (ROOT if parts[:1] == (BENCHMARKS.name,) else PACKAGE).joinpath(*parts)
        name = path.stem.removeprefix("test_")
        candidates = [folder / f"{name}.py", folder / name]  # a module, or a package data directory
        if folder.name == name:
            candidates.append(folder / "__init__.py")
        if not any(c.exists() for c in candidates):
            strays.append(f"{rel}: no {_rel(folder)}{name}.py")
    assert not strays, ("test modules that mirror no module (move their tests to the module they exercise, "
                        "or to tests/integration/ when they span packages):\n" + "\n".join(strays))


def test_test_folders_are_packages():
    """Folders of test modules are packages, so pytest names their modules by package (two folders may
    hold a test_bench.py each)."""
    folders = {p.parent for p in _test_files()} | {TESTS}
    loose = [_rel(f) for f in sorted(folders)
             if not (f / "__init__.py").is_file() and not _owned_elsewhere(_rel(f))
             and _rel(f) != "tests/helpers/"]
    assert not loose, "test folders without an __init__.py:\n" + "\n".join(loose)
