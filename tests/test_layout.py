"""The package's shape, checked from its source: every module imports alone, the import graph has no
cycle, packages import downward only (the floors of docs/design.md), the library never imports the
command layer (medusa/cli/), and modules and functions stay small.

Run it directly for a summary a newcomer can check::

    python tests/test_layout.py      # modules, import edges, cycles, upward imports, size offenders

The import graph is read with :mod:`ast`: absolute ``medusa.`` imports and relative imports, at any depth
(function-level imports included, since they run too). ``from P import n`` is an edge to ``P.n`` when that
is a module, else to ``P``. Parent packages are not added as edges: Python initialises them first, which
cannot close a cycle by itself.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "medusa"

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# The `python -m` shims: entry points that may import the command layer.
CLI_SHIMS = {"medusa.__main__", "medusa.train"}
# Functions over MAX_FUNCTION_LINES today, with their current length (def line to last line). Being split
# by the restructuring; the test fails if one of them grows or if any other function passes the limit.
# Remove an entry once its function is split (the test says so when an entry is stale).
LONG_FUNCTIONS: dict[str, int] = {
}
# Modules over MAX_MODULE_LINES today, with their current line count (same rules).
LONG_MODULES: dict[str, int] = {}

# The floors of docs/design.md, top to bottom: a package imports only packages in lower layers. Peers
# (one layer) do not import each other, except that everyone may import errors and io (the bottom's shared
# pieces). The public API (medusa/__init__.py) and the `python -m` shims sit above everything.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("medusa", "__main__", "train"),
    ("cli",),
    ("demo",),
    ("eval",),
    ("calibrate",),
    ("training", "export", "selfdistill"),
    # MedusaModel.generate imports the decode loop (as HF models import GenerationMixin): decoding sits below
    # modeling and reads the heads through their methods and ``head_type``, never by importing modeling
    ("modeling",),
    ("decoding",),
    ("tree", "data"),
    ("config", "errors", "io", "manifest", "native"),
)
IMPORTABLE_BY_ALL = {"errors", "io", "manifest"}
# The repository's top level (git-tracked names). benchmarks/ holds the benchmark pipelines: it imports
# medusa, never the other way round (the wheel holds medusa/ only).
TOP_LEVEL = {".ci", ".gitignore", "Makefile", "README.md", "benchmarks", "configs", "data", "docs", "medusa",
             "pyproject.toml", "recipes", "scripts", "tests"}
# (file, imported package): upward or sideways imports that exist today.
# being removed in branches config-split / decode-step; delete when merged
KNOWN_UPWARD: set[tuple[str, str]] = set()  # none left (config -> training and modeling -> decoding removed)


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file of the package."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module name that ``from <node.module> import ...`` names, inside ``module``."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]  # a module's relative imports are relative to its package
    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules that ``module`` imports (at any depth of its source)."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            src = _absolute(module, is_package, node)
            names = [f"{src}.{a.name}" if f"{src}.{a.name}" in known else src for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # `import medusa.x.attr`: the nearest module
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
    return targets


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    files = module_files(package)
    known = set(files)
    return {m: imports_of(m, p, known) for m, p in files.items()}


def top_package(module: str) -> str:
    """``medusa.x.y`` -> ``x``; the package itself (``medusa``) -> ``medusa``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _layer_of(package: str) -> int:
    for rank, layer in enumerate(LAYERS):
        if package in layer:
            return rank
    raise AssertionError(f"package medusa.{package} is not in LAYERS (add it where docs/design.md puts it)")


def allowed_edge(src: str, dst: str) -> bool:
    """May top-level package ``src`` import ``dst``? Only downward, or to errors / io."""
    return src == dst or dst in IMPORTABLE_BY_ALL or _layer_of(dst) > _layer_of(src)


def public_names(package: Path = PACKAGE) -> dict[str, str]:
    """Name -> defining module for the public API's re-exports (``from medusa.x import Name`` in
    ``medusa/__init__.py``): ``from medusa import Name`` is an import of that module."""
    out = {}
    for node in ast.parse((package / "__init__.py").read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("medusa."):
            out.update({a.asname or a.name: node.module for a in node.names})
    return out


def layer_violations(module: str, source: str, known: set[str], is_package: bool = False,
                     filename: str = "<source>",
                     public: dict[str, str] | None = None) -> list[tuple[int, str, str]]:
    """``(line, package, imported package)`` for each import in ``source`` (the module ``module``; any depth,
    function-level included) of a medusa package that is not below the module's own package. ``public``:
    the re-exports of ``medusa/__init__.py`` (default: the real package's)."""
    public = public_names() if public is None else public
    src = top_package(module)
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known
                     else public.get(a.name, base) if base == "medusa" else base for a in node.names]
        else:
            continue
        for name in names:
            if name != "medusa" and not name.startswith("medusa."):
                continue
            dst = top_package(name)
            if not allowed_edge(src, dst):
                out.append((node.lineno, src, dst))
    return sorted(set(out))


def package_violations(package: Path = PACKAGE) -> list[str]:
    """``medusa/x/y.py:LINE: pkgA -> pkgB`` for every upward or sideways import not in KNOWN_UPWARD."""
    files = module_files(package)
    known, public = set(files), public_names(package)
    out = []
    for module, path in files.items():
        rel = path.relative_to(package.parent).as_posix()
        for line, src, dst in layer_violations(module, path.read_text(), known, path.name == "__init__.py",
                                               str(path), public):
            if (rel, dst) not in KNOWN_UPWARD:
                out.append(f"{rel}:{line}: {src} -> {dst}")
    return out


def known_upward_still_present(package: Path = PACKAGE) -> set[tuple[str, str]]:
    """The KNOWN_UPWARD entries that the source still has."""
    files = module_files(package)
    known, public = set(files), public_names(package)
    found = set()
    for module, path in files.items():
        rel = path.relative_to(package.parent).as_posix()
        for _, _, dst in layer_violations(module, path.read_text(), known, path.name == "__init__.py",
                                          str(path), public):
            found.add((rel, dst))
    return found & KNOWN_UPWARD


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component that has one, each as ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(sorted(c), graph) for c in components]


def _cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A concrete cycle through the first module of a strongly connected component (breadth-first)."""
    members = set(component)
    start = component[0]
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:  # back at the start: walk the parents from v
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle in component {component}")


def long_functions(package: Path = PACKAGE, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``module:qualname`` -> lines (``def`` to last line, no decorators) for functions over ``limit``."""
    out = {}
    for module, path in module_files(package).items():
        tree = ast.parse(path.read_text(), str(path))
        todo: list[tuple[str, ast.AST]] = [("", tree)]
        while todo:
            prefix, node = todo.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        lines = child.end_lineno - child.lineno + 1
                        if lines > limit:
                            out[f"{module}:{name}"] = lines
                    todo.append((f"{name}.", child))
                else:
                    todo.append((prefix, child))
    return out


def long_modules(package: Path = PACKAGE, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    out = {}
    for module, path in module_files(package).items():
        lines = len(path.read_text().splitlines())
        if lines > limit:
            out[module] = lines
    return out


def _check_allowlist(found: dict[str, int], allowed: dict[str, int], what: str, limit: int) -> None:
    grown = {k: (v, allowed[k]) for k, v in found.items() if k in allowed and v > allowed[k]}
    new = {k: v for k, v in found.items() if k not in allowed}
    stale = sorted(k for k in allowed if k not in found)
    assert not new, f"{what} over {limit} lines: {new} (split them)"
    assert not grown, f"allow-listed {what} grew (now, allowed): {grown}"
    assert not stale, f"allow-listed {what} now within {limit} lines: {stale} (remove them from the list)"


# --- tests
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def import_probe():
    """One server that preloads torch / transformers and forks a medusa-free child per import."""
    from import_probe import ImportProbe

    probe = ImportProbe(ROOT)
    yield probe
    probe.close()


@pytest.mark.parametrize("module", sorted(module_files()))
def test_module_imports_alone_in_a_fresh_interpreter(module, import_probe):
    code = f"import {module}"
    if module == "medusa.__main__":  # it runs the CLI on import: give it `--help` (exits 0)
        code = f"import sys; sys.argv = ['medusa', '--help']; {code}"
    ok, error = import_probe.run(code)
    assert ok, f"import {module} failed:\n{error}"


def test_the_import_probe_starts_each_import_without_medusa_and_reports_failures(import_probe):
    assert import_probe.run("import sys; assert not any(m.startswith('medusa') for m in sys.modules)")[0]
    ok, error = import_probe.run("import medusa.no_such_module")
    assert not ok and "ModuleNotFoundError" in error
    assert import_probe.run("import medusa.training.loop") == (True, "")
    assert import_probe.run("import sys; assert 'medusa.training.loop' not in sys.modules")[0]  # not kept


def test_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 10 and sum(map(len, graph.values())) > 10  # the scan really saw the package
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_planted_cycle(tmp_path):
    pkg = tmp_path / "medusa"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import f\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from medusa.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from . import c\n")
    (pkg / "sub" / "c.py").write_text("import medusa.sub.a\nfrom .. import sub\n")
    graph = import_graph(pkg)
    assert graph["medusa.sub.a"] == {"medusa.sub.b"}  # a function-level import counts
    assert graph["medusa.sub.b"] == {"medusa.sub.c"}  # `from . import c` is the module c
    assert graph["medusa.sub.c"] == {"medusa.sub.a", "medusa.sub"}
    assert find_cycles(graph) == [["medusa.sub", "medusa.sub.a", "medusa.sub.b",
                                   "medusa.sub.c", "medusa.sub"]]
    (pkg / "sub" / "c.py").write_text("import medusa\n")
    assert find_cycles(import_graph(pkg)) == []


def test_packages_import_downward_only():
    assert {top_package(m) for m in module_files()} <= {p for layer in LAYERS for p in layer}
    violations = package_violations()
    assert not violations, ("imports against the package order (docs/design.md: cli -> demo -> eval -> "
                            "calibrate -> training / export / selfdistill -> modeling -> decoding -> "
                            "tree / data -> config / errors / io):\n" + "\n".join(violations))
    stale = sorted(KNOWN_UPWARD - known_upward_still_present())
    assert not stale, f"KNOWN_UPWARD entries no longer in the source (delete them): {stale}"


def test_package_order_check_catches_planted_imports():
    known = set(module_files())
    upward = "import torch\n\n\ndef f():\n    from medusa.decoding.generate import medusa_generate\n"
    assert layer_violations("medusa.tree.fake", upward, known) == [(5, "tree", "decoding")]
    relative = "from ..calibrate import auto\nfrom . import tree\nfrom .. import errors\n"
    assert layer_violations("medusa.tree.fake", relative, known) == [(1, "tree", "calibrate")]
    sideways = "import medusa.training.schedules\nfrom medusa.data import readers\nfrom medusa import io\n"
    assert layer_violations("medusa.decoding.fake", sideways, known) == [(1, "decoding", "training")]
    peers = "from medusa.data.tokenize import IGNORE_INDEX\nfrom medusa import MedusaModel\nimport medusa\n"
    assert layer_violations("medusa.tree.fake", peers, known) == [
        (1, "tree", "data"), (2, "tree", "modeling"), (3, "tree", "medusa")]
    bottom = "from medusa.errors import ConfigError\nfrom medusa.config import load_recipe\n"
    assert layer_violations("medusa.io", bottom, known) == [(2, "io", "config")]
    downward = "from medusa.decoding import medusa_generate\nfrom medusa.tree import MedusaTree\n"
    assert layer_violations("medusa.calibrate.fake", downward, known) == []
    assert layer_violations("medusa.cli.fake", "from medusa.demo import run\n", known) == []


def test_library_never_imports_the_command_layer():
    offenders = cli_importers(import_graph())
    assert not offenders, f"library modules importing medusa.cli: {offenders}"
    graph = import_graph()
    for shim in CLI_SHIMS:  # the shims exist and are the only importers outside medusa/cli/
        assert any(_in_cli(t) for t in graph[shim]), shim


def test_cli_importers_finds_a_planted_one(tmp_path):
    pkg = tmp_path / "medusa"
    (pkg / "cli").mkdir(parents=True)
    for rel in ("__init__.py", "cli/__init__.py", "cli/train.py"):
        (pkg / rel).write_text("")
    (pkg / "train.py").write_text("from medusa.cli.train import main\n")
    (pkg / "lib.py").write_text("def f():\n    from .cli import train\n")
    assert cli_importers(import_graph(pkg)) == ["medusa.lib"]


def test_no_module_over_400_lines():
    _check_allowlist(long_modules(), LONG_MODULES, "modules", MAX_MODULE_LINES)


def test_no_function_over_60_lines():
    _check_allowlist(long_functions(), LONG_FUNCTIONS, "functions", MAX_FUNCTION_LINES)


def test_top_level_holds_only_the_layout_entries():
    """The repository's top level is fixed (the design's layout); the benchmark pipelines live in
    ``benchmarks/``, outside the installed package."""
    proc = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    top = {line.split("/", 1)[0] for line in proc.stdout.splitlines() if line}
    assert "benchmarks" in top and "medusa" in top
    assert not top - TOP_LEVEL, f"unexpected top-level entries: {sorted(top - TOP_LEVEL)}"


def test_the_package_never_imports_the_benchmarks():
    offenders = benchmark_importers()
    assert not offenders, f"medusa/ modules importing benchmarks/ (the wheel does not hold it): {offenders}"


def test_benchmark_importers_finds_a_planted_one(tmp_path):
    pkg = tmp_path / "medusa"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ok.py").write_text("import benchmarks_like\nfrom medusa import ok\n")
    (pkg / "bad.py").write_text("def f():\n    from benchmarks.stages import run_stage\n")
    (pkg / "bad2.py").write_text("import benchmarks\n")
    assert benchmark_importers(pkg) == ["medusa/bad.py", "medusa/bad2.py"]


def benchmark_importers(package: Path = PACKAGE) -> list[str]:
    """Files of the package that import ``benchmarks`` (at any depth)."""
    out = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            if any(n == "benchmarks" or n.startswith("benchmarks.") for n in names):
                out.append(path.relative_to(package.parent).as_posix())
                break
    return out


def cli_importers(graph: dict[str, set[str]]) -> list[str]:
    """Modules outside medusa/cli/ (the shims aside) that import the command layer."""
    return sorted(m for m, targets in graph.items()
                  if not _in_cli(m) and m not in CLI_SHIMS and any(_in_cli(t) for t in targets))


def _in_cli(module: str) -> bool:
    return module == "medusa.cli" or module.startswith("medusa.cli.")


def main() -> int:
    """Print the summary; exit status 1 on a cycle, an import against the package order or a library module
    importing medusa.cli."""
    graph = import_graph()
    cycles = find_cycles(graph)
    offenders = cli_importers(graph)
    violations = package_violations()
    print(f"modules: {len(graph)}")
    print(f"import edges: {sum(map(len, graph.values()))}")
    print("cycles: " + ("none" if not cycles else "\n  " + "\n  ".join(" -> ".join(c) for c in cycles)))
    print("imports against the package order: "
          + ("none" if not violations else "\n  " + "\n  ".join(violations)))
    print("known upward imports (being removed): "
          + ", ".join(f"{f} -> {p}" for f, p in sorted(KNOWN_UPWARD)))
    print(f"library modules importing medusa.cli: {', '.join(offenders) or 'none'}"
          f" (the shims {', '.join(sorted(CLI_SHIMS))} may)")
    for what, found, limit in (("modules", long_modules(), MAX_MODULE_LINES),
                               ("functions", long_functions(), MAX_FUNCTION_LINES)):
        listed = ", ".join(f"{k} ({v})" for k, v in sorted(found.items()))
        print(f"{what} over {limit} lines: {listed or 'none'}")
    return 1 if cycles or offenders or violations else 0


if __name__ == "__main__":
    sys.exit(main())
