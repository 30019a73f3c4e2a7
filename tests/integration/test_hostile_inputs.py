"""The hostile-input matrix, generated from the command line itself: for every command, every path argument
(its :class:`~medusa.cli.PathKind` says what it must be) gets the cases missing / wrong kind / non-empty /
the folder holding the inputs / non-UTF-8 content / unreadable / /dev/null, and every numeric option (a
:class:`~medusa.cli.Bounded`) 0, negative, absurdly large, nan and its bounds' neighbours; the training
recipe's path keys and numeric keys get the same treatment through ``key=value`` overrides.

Each case asserts exit status 2, exactly one line on stderr, starting ``error:`` and naming the culprit,
nothing on stdout, no traceback, and that every file and folder present before the call is byte-identical
(same mode too) after it, with nothing added. Calls are in-process (a few load stories260K: the error comes
after the model); the unreadable cases run as another user when the suite runs as root.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shutil
import tempfile
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from medusa.cli import Bounded, PathKind, build_parser, main
from medusa.config import Recipe

from tiny_models import STORIES, require_shared

BAD_BYTES = b"model: \xff\xfe\xc3\x28 not UTF-8\n"
NOBODY = 65534

# A valid command line per command: "@name" is <workspace>/name; ("dest", "@name") is a positional.
BASELINES: dict[str, list] = {
    "info": ["info", ("checkpoint", "@heads")],
    "heads init": ["heads", "init", "--base", "@model", "--out", "@new_heads"],
    "heads draft-vocab": ["heads", "draft-vocab", ("heads", "@heads"), "--size", "1",
                          "--out", "@narrow_heads"],
    "self-distill": ["self-distill", "--model", "@model", "--prompts", "@prompts.jsonl", "--out",
                     "@distill.jsonl", "--mode", "completion", "--max-new-tokens", "4", "--no-progress"],
    "train": ["train", ("recipe", "@recipe.yaml")],
    "cache-hidden": ["cache-hidden", ("recipe", "@recipe.yaml")],
    "calibrate": ["calibrate", "--heads", "@heads", "--data", "@data.jsonl", "--quiet"],
    "export": ["export", "--format", "tensorrt-llm", ("src", "@heads"), ("out", "@exported")],
    "import": ["import", ("src", "@v1"), ("out", "@imported")],
    "generate": ["generate", "--heads", "@heads", "--prompts", "@prompts.txt", "--max-new-tokens", "4"],
    "bench": ["bench", "--heads", "@heads", "--prompts", "@prompts.txt", "--max-new-tokens", "4",
              "--out", "@report.json", "--quiet", "--no-plots"],
    "demo": ["demo", "--model", "@model", "--out", "@demo", "--no-progress"],
}
# Recipe keys that name paths, with the PathKind they would have on a command line.
RECIPE_PATHS = {"model": "model", "data.train": "source", "data.eval": "source", "heads.init_from": "dir",
                "data.chat_template": "template", "output_dir": "out_dir", "train.resume": "dir",
                "train.hidden_cache": "cache_dir"}
# Numeric recipe keys for which 0 is a meaningful value (the rest must refuse it).
RECIPE_ZERO_OK = {"heads.num_layers", "heads.draft_vocab", "heads.teacher_loss", "data.eval_split",
                  "train.warmup_ratio", "train.weight_decay", "train.max_grad_norm", "train.seed",
                  "train.save_steps", "train.eval_steps", "lora.dropout", "medusa2.lambda0"}


# ----------------------------------------------------------------------------------------- the workspace
@pytest.fixture(scope="module")
def pristine() -> Iterator[Path]:
    """stories260K, a heads checkpoint on it (and its medusa-v1 export), prompts, data, a tree, a recipe;
    under a world-traversable temp dir (the unreadable cases run as another user when we are root)."""
    require_shared(STORIES)
    from medusa.export import export_checkpoint
    from medusa.modeling import MedusaModel
    from medusa.tree import MedusaTree

    root = Path(tempfile.mkdtemp(prefix="medusa-hostile-"))
    os.chmod(root, 0o755)
    ws = root / "pristine"
    shutil.copytree(STORIES, ws / "model")
    os.chmod(ws / "model", 0o755)  # the shared copy may be read-only; its copies here are written into
    MedusaModel.from_base(str(ws / "model"), num_heads=2, num_layers=1).save_pretrained(ws / "heads")
    export_checkpoint(ws / "heads", ws / "v1", "medusa-v1")
    stories = ["Once upon a time there was a little girl named Lily.", "Tom had a big red ball."]
    (ws / "prompts.txt").write_text("\n".join(stories) + "\n")
    (ws / "prompts.jsonl").write_text("".join(json.dumps({"prompt": s}) + "\n" for s in stories))
    (ws / "data.jsonl").write_text("".join(json.dumps({"prompt": s[:12], "completion": s[12:]}) + "\n"
                                           for s in stories))
    MedusaTree.from_choices([[0], [0, 0], [1]]).to_json(ws / "tree.json")
    (ws / "template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    (ws / "recipe.yaml").write_text(
        f"model: {ws / 'model'}\ndtype: float32\nheads: {{num_heads: 2}}\n"
        f"data: {{train: {ws / 'data.jsonl'}, format: prompt_completion, max_length: 64}}\n"
        f"train: {{max_steps: 1, batch_size: 2, logging_steps: 1}}\noutput_dir: {ws / 'run'}\n")
    yield ws
    shutil.rmtree(root, ignore_errors=True)


def _workspace(pristine: Path) -> Path:
    """A fresh copy of the workspace (files hard-linked: a write in place shows in the snapshot, a
    rename or delete too) at the same depth, so that the recipe's absolute paths point into the copy."""
    case = Path(tempfile.mkdtemp(prefix="case-", dir=pristine.parent))
    os.chmod(case, 0o755)
    ws = case / "ws"
    shutil.copytree(pristine, ws, copy_function=os.link)
    recipe = (ws / "recipe.yaml").read_text().replace(str(pristine), str(ws))
    (ws / "recipe.yaml").unlink()
    (ws / "recipe.yaml").write_text(recipe)
    return ws


def _snapshot(root: Path) -> dict[str, tuple[bytes | None, int]]:
    out = {}
    for p in sorted(root.rglob("*")):
        content = None
        if p.is_file():
            try:
                content = p.read_bytes()
            except PermissionError:
                content = b"<unreadable>"
        out[p.relative_to(root).as_posix()] = (content, p.lstat().st_mode)
    return out


# ----------------------------------------------------------------------------------------- hostile values
def _copy(src: Path, dst: Path) -> Path:
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy(src, dst)
    return dst


def _suffix(kind: str, dest: str) -> str:
    return {"template": ".jinja", "tree": ".json", "source": ".jsonl"}.get(
        kind, ".yaml" if dest == "recipe" else ".txt")


def _missing(ws: Path, kind: str, dest: str) -> Path | None:
    if kind in PathKind.OUTPUTS or kind == "cache_dir":
        return None  # an output that does not exist yet is the normal case
    return ws / f"missing{'' if kind in ('dir', 'model') else _suffix(kind, dest)}"


def _wrong_kind(ws: Path, kind: str, dest: str) -> Path | None:
    if kind == "path":
        return None  # a file or a directory: both are right
    if kind in ("dir", "model", "out_dir", "out_into", "cache_dir"):
        path = ws / "a_file.txt"
        path.write_text("not a directory\n")
        return path
    path = ws / f"a_dir{_suffix(kind, dest)}"
    path.mkdir()
    (path / "inside.txt").write_text("x\n")
    return path


def _non_empty(ws: Path, kind: str, dest: str) -> Path | None:
    if kind in ("out_dir", "cache_dir"):
        path = ws / "full"
        path.mkdir()
        (path / "keep.txt").write_text("the user's\n")
        return path
    if kind == "out_into":  # a folder receiving named files: one of them is already there
        path = ws / "plots"
        path.mkdir()
        (path / "tree.png").write_bytes(b"the user's plot")
        return path
    if kind == "out_file":
        path = ws / "existing.jsonl"
        path.write_text('{"the": "user\'s"}\n')
        return path
    return None


def _own_folder(ws: Path, kind: str, dest: str) -> Path | None:
    if kind == "out_dir":
        return ws  # the folder that holds every input
    if kind == "out_file":
        return ws / "prompts.txt" if (ws / "prompts.txt").exists() else None  # the input itself
    return None


def _non_utf8(ws: Path, kind: str, dest: str) -> Path | None:
    if kind in ("file", "tree", "template", "source", "out_file"):
        path = ws / f"not_utf8{_suffix(kind, dest) if kind != 'out_file' else '.jsonl'}"
        path.write_bytes(BAD_BYTES)
        return path
    if kind in ("dir", "path"):  # a checkpoint whose config is not UTF-8
        path = _copy(ws / "heads", ws / "not_utf8_heads")
        (path / "medusa_config.json").write_bytes(BAD_BYTES)
        return path
    if kind == "model":
        path = _copy(ws / "model", ws / "not_utf8_model")
        (path / "config.json").write_bytes(BAD_BYTES)
        return path
    return None


def _unreadable(ws: Path, kind: str, dest: str) -> Path | None:
    if kind in PathKind.OUTPUTS or kind == "cache_dir":
        return None
    if kind in ("dir", "model", "path"):
        path = _copy(ws / ("model" if kind == "model" else "heads"), ws / "locked")
    else:
        path = _copy(ws / {"tree": "tree.json", "source": "data.jsonl"}.get(
            kind, "recipe.yaml" if dest == "recipe" else "prompts.txt"), ws / f"locked{_suffix(kind, dest)}")
    os.chmod(path, 0)
    return path


def _device(ws: Path, kind: str, dest: str) -> Path | None:
    """/dev/null, which is neither a file nor a directory: an input that reads as nothing, an output that a
    rename would replace (the device itself, as root)."""
    return Path(os.devnull)


CASES: dict[str, Callable[[Path, str, str], Path | None]] = {
    "missing": _missing, "wrong_kind": _wrong_kind, "non_empty": _non_empty, "own_folder": _own_folder,
    "non_utf8": _non_utf8, "unreadable": _unreadable, "device": _device}


# ----------------------------------------------------------------------------------------- the generator
def _leaf_parsers(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {prefix.strip(): parser}
    out = {}
    for action in subs:
        for name, sub in action.choices.items():
            out.update(_leaf_parsers(sub, f"{prefix} {name}"))
    return out


LEAVES = _leaf_parsers(build_parser())


@dataclasses.dataclass
class Case:
    command: str
    target: str  # the option, positional or recipe key under attack
    kind: str  # a PathKind kind, "cache_dir", or "number"
    name: str  # the case class (missing, non_utf8, ...) or the numeric value
    overwrite: bool = False

    @property
    def id(self) -> str:
        return f"{self.command}:{self.target}:{self.name}" + (":overwrite" if self.overwrite else "")


def _applies(name: str, kind: str) -> bool:
    """Whether case class ``name`` means anything for a ``kind`` path (its creator returns a path)."""
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        for item in ("heads", "model"):
            (ws / item).mkdir()
        for item in ("prompts.txt", "data.jsonl", "tree.json", "recipe.yaml"):
            (ws / item).write_text("x\n")
        path = CASES[name](ws, kind, "x")
        if path is not None and path.exists() and ws in path.parents:  # never /dev/null's mode
            os.chmod(path, 0o755)
        return path is not None


def _path_cases(command: str, target: str, kind: str, can_overwrite: bool) -> list[Case]:
    cases = [Case(command, target, kind, name) for name in CASES if _applies(name, kind)]
    # --overwrite never lets a command write into the folder that holds its input
    if can_overwrite and _applies("own_folder", kind):
        cases.append(Case(command, target, kind, "own_folder", overwrite=True))
    return cases


def _numbers(kind: Bounded) -> list[str]:
    huge = str(10**30) if kind.kind is int else "1e30"
    values = ["-1", huge]
    if kind.lo > 0 or kind.lo_open:
        values.append("0")
    if kind.kind is int:
        values += [str(kind.hi + 1)] + ([str(kind.lo - 1)] if kind.lo > 0 else [])
    else:
        values += ["nan", "inf"]
    return list(dict.fromkeys(values))


def _recipe_numeric_keys() -> dict[str, type]:
    out = {}
    for section in dataclasses.fields(Recipe):
        tp = typing.get_type_hints(Recipe)[section.name]
        if dataclasses.is_dataclass(tp):
            for f in dataclasses.fields(tp):
                hint = typing.get_type_hints(tp)[f.name]
                if hint in (int, float):
                    out[f"{section.name}.{f.name}"] = hint
    return out


def generate() -> list[Case]:
    cases = []
    for command, parser in LEAVES.items():
        can_overwrite = any("--overwrite" in a.option_strings for a in parser._actions)
        for action in parser._actions:
            target = action.option_strings[0] if action.option_strings else action.dest
            if isinstance(action.type, PathKind):
                cases += _path_cases(command, target, action.type.kind, can_overwrite)
            elif isinstance(action.type, Bounded):
                cases += [Case(command, target, "number", v) for v in _numbers(action.type)]
    for key, kind in RECIPE_PATHS.items():
        cases += _path_cases("train", key, kind, can_overwrite=True)
    for key, tp in _recipe_numeric_keys().items():
        values = ["-2" if key == "train.max_steps" else "-1", str(10**30) if tp is int else "1e30"]
        values += [] if key in RECIPE_ZERO_OK else ["0"]
        cases += [Case("train", key, "number", v) for v in values]
    return cases


def _argv(case: Case, ws: Path, value: str) -> list[str]:
    """The command's baseline with ``case.target`` set to ``value`` (appended when the baseline lacks it)."""
    argv, found = [], False
    tokens = BASELINES[case.command]
    for i, tok in enumerate(tokens):
        if isinstance(tok, tuple):
            dest, tok = tok
            if dest == case.target:
                tok, found = value, True
        elif i and tokens[i - 1] == case.target:
            tok, found = value, True
        argv.append(str(ws / tok[1:]) if isinstance(tok, str) and tok.startswith("@") else tok)
    if "." in case.target or case.target in RECIPE_PATHS:  # a recipe key
        argv.append(f"{case.target}={value}")
    elif not found:
        argv += [case.target, value]
    return argv + (["--overwrite"] if case.overwrite else [])


def _call(argv: list[str], as_other_user: bool) -> tuple[int, str, str]:
    if not as_other_user:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
        return code, out.getvalue(), err.getvalue()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, run the command, report, exit without pytest's teardown
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(argv)
                except BaseException as exc:  # reported to the parent as a failure
                    code, err = 99, io.StringIO(f"Traceback: {type(exc).__name__}: {exc}\n")
            os.write(write_end, json.dumps([code, out.getvalue(), err.getvalue()]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    return tuple(json.loads(data))


ALL_CASES = generate()


def test_every_command_has_a_baseline_and_every_number_is_bounded():
    assert set(LEAVES) == set(BASELINES)
    for command, parser in LEAVES.items():
        for action in parser._actions:
            assert action.type not in (int, float), f"{command} {action.option_strings}: unbounded number"
            if isinstance(action.type, Bounded):
                assert action.type.lo >= 0 and action.type.hi < 1e30, (command, action.option_strings)
    assert len(ALL_CASES) > 300


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_hostile_input(case: Case, pristine: Path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ws = _workspace(pristine)
    try:
        if case.kind == "number":
            value, needle = case.name, case.target
        else:
            path = CASES[case.name](ws, case.kind, case.target)
            assert path is not None
            value, needle = str(path), str(path)
        as_other_user = case.name == "unreadable" and os.geteuid() == 0
        argv = _argv(case, ws, value)
        before = _snapshot(ws.parent)
        code, out, err = _call(argv, as_other_user)
        assert code == 2, (argv, out, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)
        assert needle in lines[0], (needle, lines[0])
        assert out == "" and "Traceback" not in err
        after = _snapshot(ws.parent)
        assert after == before, sorted(set(after.items()) ^ set(before.items()), key=str)[:4]
    finally:
        for p in ws.glob("locked*"):  # hard links elsewhere keep their modes: only what the case locked
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        shutil.rmtree(ws.parent)


# ------------------------------------------------------------------------------------- the issue's classes
def _json_array_bad_row(ws: Path) -> list[str]:
    rows = [{"prompt": "Once upon", "completion": " a time"}, {"prompt": 5, "completion": "x"}]
    (ws / "rows.json").write_text(json.dumps(rows))  # one line: the row index is what names the culprit
    return ["train", str(ws / "recipe.yaml"), f"data.train={ws / 'rows.json'}", "data.format=auto"]


def _alpaca_empty_output(ws: Path) -> list[str]:
    rows = [{"instruction": "Say hi.", "input": "", "output": "Hi."},
            {"instruction": "Say no.", "output": ""}]
    (ws / "alpaca.json").write_text(json.dumps(rows))
    return ["train", str(ws / "recipe.yaml"), f"data.train={ws / 'alpaca.json'}", "data.format=alpaca",
            "data.chat_template=chatml"]


def _duplicate_key(ws: Path) -> list[str]:
    recipe = ws / "recipe.yaml"
    recipe.write_text(recipe.read_text() + "dtype: bfloat16\n")
    return ["train", str(recipe)]


class _Payload:
    """A pickle that creates ``marker`` when loaded: what a crafted checkpoint carries."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _crafted_checkpoint(ws: Path) -> list[str]:
    """A training checkpoint someone else made, carrying a pickle that would run a command when loaded: the
    marker it would create is a new file the snapshot would show."""
    import pickle

    ckpt = ws / "elsewhere" / "checkpoint-2"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text('{"global_step": 2}')
    (ckpt / "custom_checkpoint_0.pkl").write_bytes(pickle.dumps(_Payload(ws / "PWNED")))
    return ["train", str(ws / "recipe.yaml"), f"train.resume={ckpt}"]


def _resume_into_user_files(ws: Path) -> list[str]:
    ckpt = ws / "elsewhere" / "checkpoint-2"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text('{"global_step": 2}')
    (ws / "run").mkdir()
    (ws / "run" / "recipe.json").write_text('{"the": "user\'s"}')
    (ws / "run" / "metrics.jsonl").write_text('{"step": 1, "the": "user\'s"}\n')
    return ["train", str(ws / "recipe.yaml"), f"train.resume={ckpt}"]


def _not_a_distill_output(ws: Path) -> list[str]:
    (ws / "notes.jsonl").write_text('{"my": "notes"}\n{this line is mine, not a cut row')
    return _distill(ws, ws / "notes.jsonl")


def _only_a_cut_line(ws: Path) -> list[str]:
    (ws / "notes.jsonl").write_text('{"id": "x:0", "my unfinished note')
    return _distill(ws, ws / "notes.jsonl")


def _distill(ws: Path, out: Path) -> list[str]:
    return ["self-distill", "--model", str(ws / "model"), "--prompts", str(ws / "prompts.jsonl"), "--out",
            str(out), "--mode", "completion", "--max-new-tokens", "4", "--no-progress"]


_HELD: list[int] = []  # lock files the test itself holds (closed after each case)


def _output_held(ws: Path) -> list[str]:
    import fcntl

    fd = os.open(ws / ".distill.jsonl.lock", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"4242\n")
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _HELD.append(fd)
    return _distill(ws, ws / "distill.jsonl")


def _export_over_a_user_folder(ws: Path) -> list[str]:
    (ws / "exported" / "model.safetensors").mkdir(parents=True)  # the user's folder, a name export writes
    (ws / "exported" / "model.safetensors" / "keep.txt").write_text("the user's")
    return ["export", "--format", "vllm", str(ws / "heads"), str(ws / "exported"), "--overwrite"]


def _tree_with(**values: object) -> Callable[[Path], list[str]]:
    def build(ws: Path) -> list[str]:
        data = json.loads((ws / "tree.json").read_text())
        data.update(values)
        (ws / "bad_tree.json").write_text(json.dumps(data))
        return ["generate", "--heads", str(ws / "heads"), "--prompt", "Once", "--max-new-tokens", "4",
                "--tree", str(ws / "bad_tree.json")]
    return build


def _config_with(key: str, value: object) -> Callable[[Path], list[str]]:
    def build(ws: Path) -> list[str]:
        heads = _copy(ws / "heads", ws / "bad_heads")
        data = json.loads((heads / "medusa_config.json").read_text())
        data[key] = value
        (heads / "medusa_config.json").write_text(json.dumps(data))
        return ["info", str(heads)]
    return build


def _into_the_base_folder(ws: Path) -> list[str]:
    """The heads name ws/model as their base; ws/model carries a (kind-less, pre-kind) manifest, as the
    converted models of the model cache do: it is never an export's output."""
    from medusa.manifest import MANIFEST_NAME, stamp

    heads = _copy(ws / "heads", ws / "heads_on_model")
    data = json.loads((heads / "medusa_config.json").read_text())
    data["base_model_name_or_path"] = str(ws / "model")
    (heads / "medusa_config.json").write_text(json.dumps(data))
    names = [p.name for p in (ws / "model").iterdir()]
    (ws / "model" / MANIFEST_NAME).write_text(json.dumps({"entries": {n: stamp(ws / "model" / n)
                                                                       for n in names}}))
    return ["export", "--format", "vllm", str(heads), str(ws / "model"), "--overwrite"]


def _deep(name: str, text: str, argv: Callable[[Path], list[str]]) -> Callable[[Path], list[str]]:
    def build(ws: Path) -> list[str]:
        target = ws / name
        if target.parent != ws and not target.parent.exists():
            _copy(ws / "heads", target.parent)
        target.write_text(text)
        return argv(ws)
    return build


DEEP = "[" * 100000 + "]" * 100000


def _alias_bomb(ws: Path) -> list[str]:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    (ws / "bomb.yaml").write_text("\n".join(lines) + "\n")
    return ["train", str(ws / "bomb.yaml")]


def _tree_into(heads: Path, choices: list[list[int]]) -> Path:
    """``heads`` with a tree.json of ``choices`` (for commands that read the checkpoint's own tree)."""
    data = {"format": "medusa-tree", "version": 1, "num_heads": 2, "choices": choices}
    (heads / "tree.json").write_text(json.dumps(data))
    return heads


def _distill_with(content: str, *extra: str) -> Callable[[Path], list[str]]:
    def build(ws: Path) -> list[str]:
        (ws / "my_prompts.jsonl").write_text(content)
        argv = _distill(ws, ws / "distill.jsonl")
        argv[argv.index("--prompts") + 1] = str(ws / "my_prompts.jsonl")
        return argv + list(extra)
    return build


def _ok(argv: list[str]) -> None:
    code, _, err = _call(argv, as_other_user=False)
    assert code == 0, (argv, err)


def _resume_with(change: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    """A real checkpoint-2 of the workspace's recipe, ``change``d, then resumed."""
    def build(ws: Path) -> list[str]:
        steps = ["train.max_steps=4", "train.save_steps=2"]
        _ok(["train", str(ws / "recipe.yaml"), *steps, f"output_dir={ws / 'first'}"])
        ckpt = ws / "first" / "checkpoint-2"
        change(ckpt)
        return ["train", str(ws / "recipe.yaml"), *steps, f"train.resume={ckpt}",
                f"output_dir={ws / 'second'}"]
    return build


def _pickle_as_weights(ckpt: Path) -> None:
    import pickle

    (ckpt / "model.safetensors").write_bytes(pickle.dumps(_Payload(ckpt.parent.parent / "PWNED")))


def _json_edit(name: str, edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def change(ckpt: Path) -> None:
        data = json.loads((ckpt / name).read_text())
        edit(data)
        (ckpt / name).write_text(json.dumps(data))
    return change


def _drafter(ws: Path) -> Path:
    _ok(["heads", "init", "--base", str(ws / "model"), "--out", str(ws / "e3"), "--head-type", "eagle3",
         "--num-heads", "2"])
    return ws / "e3"


def _truncated_base(ws: Path) -> list[str]:
    base = _copy(ws / "model", ws / "cut_model")
    data = (base / "model.safetensors").read_bytes()
    (base / "model.safetensors").unlink()
    (base / "model.safetensors").write_bytes(data[: len(data) // 2])
    return ["heads", "init", "--base", str(base), "--out", str(ws / "new_heads")]


def _speculators_on_a_pickled_base(ws: Path) -> list[str]:
    """The base's weights a pickle that would run a command when loaded (its marker would show)."""
    import pickle

    base = ws / "pickled_model"
    base.mkdir()
    for item in (ws / "model").iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            shutil.copy(item, base / item.name)
    (base / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(ws / "PWNED")))
    return ["export", "--format", "speculators", str(_drafter(ws)), str(ws / "spec"), "--base", str(base)]


def _speculators_on_a_missing_base(ws: Path) -> list[str]:
    heads = _drafter(ws)
    data = json.loads((heads / "medusa_config.json").read_text())
    data["base_model_name_or_path"] = str(ws / "gone")
    (heads / "medusa_config.json").write_text(json.dumps(data))
    return ["export", "--format", "speculators", str(heads), str(ws / "spec")]


def _init_from(extra: list[str]) -> Callable[[Path], list[str]]:
    def build(ws: Path) -> list[str]:
        return ["train", str(ws / "recipe.yaml"), f"heads.init_from={_drafter(ws)}", *extra]
    return build


ISSUE_CASES = {
    "prompt_past_positions": (lambda ws: ["generate", "--heads", str(ws / "heads"), "--prompt", "Once upon a",
                                          "--max-new-tokens", "600"],
                              "exceed the base model's 512 positions (max_position_embeddings); allowed "
                              "--max-new-tokens for this prompt: 1.."),
    "nodes_past_the_possible_tree": (lambda ws: ["calibrate", "--heads", str(ws / "heads"), "--data",
                                                 str(ws / "data.jsonl"), "--topk", "2", "--nodes", "100"],
                                     "--nodes 100: a tree of --topk 2 ranks and depth 2 has at most 7 nodes"),
    "json_array_bad_row_index": (_json_array_bad_row, "rows.json: row 1 (line 1)"),
    "alpaca_empty_output_hints_skip_invalid": (_alpaca_empty_output, "data.skip_invalid: true"),
    "duplicate_yaml_key": (_duplicate_key, "recipe.yaml:7: duplicate key 'dtype' (first given on line 2)"),
    "export_into_the_source_folder": (lambda ws: ["export", "--format", "vllm", str(ws / "heads"), str(ws),
                                                  "--overwrite"], "holds the input"),
    "bench_limit_0": (lambda ws: ["bench", "--heads", str(ws / "heads"), "--prompts", str(ws / "prompts.txt"),
                                  "--limit", "0"], "argument --limit: 0 is out of range (must be >= 1"),
    # issue 38: no code from a checkpoint's pickle, no user file replaced, file values bounded
    "resume_from_a_crafted_pickle": (_crafted_checkpoint, "custom_checkpoint_0.pkl: a pickle"),
    "resume_into_a_folder_of_user_files": (_resume_into_user_files, "run exists and is not empty"),
    "distill_out_not_a_distill_output": (_not_a_distill_output, "notes.jsonl:1: not a self-distill output"),
    "distill_out_only_a_cut_line": (_only_a_cut_line, "notes.jsonl:1: not JSON, and no complete"),
    "distill_out_held_by_another_run": (_output_held, "another run (pid 4242) is writing this output"),
    "export_overwrite_over_a_user_folder": (_export_over_a_user_folder,
                                            "model.safetensors: exists and was not written by medusa"),
    "bench_out_inside_the_checkpoint": (lambda ws: ["bench", "--heads", str(ws / "heads"), "--prompts",
                                                    str(ws / "prompts.txt"), "--out",
                                                    str(ws / "heads" / "r.json")], "is part of the input"),
    "calibrate_plots_beside_the_data": (lambda ws: ["calibrate", "--heads", str(ws / "heads"), "--data",
                                                    str(ws / "data.jsonl"), "--plots", str(ws), "--quiet"],
                                        "holds the input"),
    "tree_rank_past_the_bound": (_tree_with(choices=[[0], [10**12]]), "rank past 999"),
    "tree_of_2000_nodes": (_tree_with(choices=[[i] for i in range(2000)]), "2001 nodes; at most 1024"),
    "tree_absurd_lookup_tokens": (_tree_with(lookup_tokens=10**12), "lookup_tokens must be an integer"),
    "tree_path_score_not_numbers": (_tree_with(calibration={"path_score": {"weight": ["a"], "bias": [0]}}),
                                    "path_score.weight must be a list of finite numbers"),
    "config_dtype_garbage": (_config_with("dtype", "float33"), "dtype: expected one of"),
    "config_hidden_size_a_string": (_config_with("hidden_size", "64"), "hidden_size: expected an integer"),
    "recipe_alias_bomb": (_alias_bomb, "aliases expand to"),
    "out_name_too_long_once_suffixed": (lambda ws: _distill(ws, ws / ("d" * 250 + ".jsonl")),
                                        "name too long"),
    # issue 38, second part: lengths past the model's positions, prompt files that give nothing, options that
    # would silently not apply, a --set that would fail only after two demo stages
    "train_max_length_past_positions": (lambda ws: ["train", str(ws / "recipe.yaml"), "data.max_length=4096"],
                                        "data.max_length 4096 exceeds the model's 512 positions"),
    "calibrate_max_length_past_positions": (lambda ws: ["calibrate", "--heads", str(ws / "heads"), "--data",
                                                        str(ws / "data.jsonl"), "--quiet", "--max-length",
                                                        "4096"],
                                            "--max-length 4096 exceeds the model's 512 positions"),
    "distill_empty_prompt_file": (_distill_with(""), "my_prompts.jsonl: no prompts (it holds no rows)"),
    "distill_all_invalid_prompts": (_distill_with('{"foo": 1}\n{"bar": 2}\n'),
                                    "my_prompts.jsonl: no prompts (2 invalid rows; the first, "),
    "distill_prompt_chars_on_prompt_rows": (_distill_with('{"prompt": "Once upon a time"}\n',
                                                          "--prompt-chars", "5"),
                                            "my_prompts.jsonl:1: --prompt-chars cuts text documents"),
    "distill_two_prompt_rules": (_distill_with('{"text": "Once upon a time."}\n', "--prompt-chars", "5",
                                               "--prompt-tokens", "2"),
                                 "--prompt-chars and --prompt-tokens: give one rule"),
    "info_tree_of_2000_nodes": (lambda ws: ["info", str(_tree_into(_copy(ws / "heads", ws / "big_heads"),
                                                                   [[i] for i in range(2000)]))],
                                "2001 nodes; at most 1024"),
    "demo_set_unknown_key": (lambda ws: ["demo", "--model", str(ws / "model"), "--out", str(ws / "demo"),
                                         "--no-progress", "--set", "foo.bar=1"], "unknown key foo"),
    # issue 47: a base model folder is never an output; files nested past the recursion limit
    "export_into_the_base_model_folder": (_into_the_base_folder, "holds the input"),
    "tree_rank_past_the_vocabulary": (_tree_with(choices=[[0], [600]]), "rank 600 is past the heads' vocab"),
    "config_feature_layers_on_linear_heads": (_config_with("feature_layers", [0, 1, 2]),
                                              "feature_layers: only for head_type: eagle3"),
    "generate_temperature_1e-45": (lambda ws: ["generate", "--heads", str(ws / "heads"), "--prompt", "Once",
                                               "--temperature", "1e-45"], "1e-45 is out of range"),
    "config_nested_too_deeply": (_deep("deep_heads/medusa_config.json", DEEP,
                                       lambda ws: ["info", str(ws / "deep_heads")]),
                                 "medusa_config.json: corrupt JSON"),
    "recipe_nested_too_deeply": (_deep("deep.yaml", "model: " + DEEP + "\n",
                                       lambda ws: ["train", str(ws / "deep.yaml")]),
                                 "deep.yaml: YAML nested too deeply"),
    "data_nested_too_deeply": (_deep("deep.json", '{"rows": ' + DEEP + "}",
                                     lambda ws: ["train", str(ws / "recipe.yaml"),
                                                 f"data.train={ws / 'deep.json'}"]),
                               "deep.json: JSON nested too deeply"),
    # issue 47, the rest: truncated / pickled / missing bases, resumed state out of bounds, init_from's kind
    "heads_init_truncated_base": (_truncated_base, "cannot load base model"),
    "speculators_pickled_base": (_speculators_on_a_pickled_base,
                                 "pytorch_model.bin: the base's weights are a pickle"),
    "speculators_missing_base": (_speculators_on_a_missing_base, "cannot read the base model's config"),
    "resume_pickle_as_model_safetensors": (_resume_with(_pickle_as_weights), "unreadable trained state"),
    "resume_optimizer_step_10e400": (_resume_with(_json_edit("optimizer.json", lambda d: d["step"].update(
        {k: 10**400 for k in d["step"]}))), "optimizer.json: step of heads."),
    "resume_scheduler_negative_base_lrs": (_resume_with(_json_edit("scheduler.json", lambda d: d.update(
        base_lrs=[-5.0 for _ in d["base_lrs"]]))), "scheduler.json: base_lrs = [-5.0"),
    "init_from_the_other_head_family": (_init_from([]),
                                        "has head_type 'eagle3', the recipe's heads.head_type is 'linear'"),
    "init_from_overriding_feature_layers": (
        _init_from(["heads.head_type=eagle3", "heads.feature_layers=[0,1,2]"]),
        "has feature_layers [1, 2, 4], the recipe's heads.feature_layers is [0, 1, 2]"),
}


def test_heads_init_over_an_export_keeps_the_exports_files(pristine: Path):
    """``heads init --overwrite`` into a folder an export wrote: the export's files (its manifest's kind) are
    not the heads checkpoint's to remove; the heads are added beside them."""
    ws = _workspace(pristine)
    try:
        assert _call(["export", "--format", "vllm", str(ws / "heads"), str(ws / "out")], False)[0] == 0
        before = {p.name: p.read_bytes() for p in (ws / "out").iterdir() if p.name != ".medusa-manifest.json"}
        code, _, err = _call(["heads", "init", "--base", str(ws / "model"), "--out", str(ws / "out"),
                              "--num-heads", "1", "--overwrite"], False)
        assert code == 0, err
        after = {p.name: p.read_bytes() for p in (ws / "out").iterdir()}
        assert all(after.get(name) == data for name, data in before.items())
        assert "medusa_heads.safetensors" in after
    finally:
        shutil.rmtree(ws.parent)


@pytest.mark.parametrize("name", ISSUE_CASES)
def test_issue_case(name: str, pristine: Path):
    """The classes the issue reported, by example: one ``error:`` line naming the culprit, files untouched."""
    build, needle = ISSUE_CASES[name]
    ws = _workspace(pristine)
    try:
        argv = build(ws)
        before = _snapshot(ws.parent)
        code, out, err = _call(argv, as_other_user=False)
        assert code == 2 and out == "" and "Traceback" not in err, (argv, out, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (needle, err)
        after = _snapshot(ws.parent)  # every file byte- and mode-identical, nothing added (no marker)
        assert after == before, sorted(set(after.items()) ^ set(before.items()), key=str)[:4]
    finally:
        while _HELD:
            os.close(_HELD.pop())
        shutil.rmtree(ws.parent)


@pytest.mark.parametrize("command", [["export", "--format", "vllm", "@heads", "@out"],
                                     ["export", "--format", "medusa-v1", "@heads", "@out"],
                                     ["heads", "init", "--base", "@model", "--out", "@out"]])
def test_a_full_disk_while_writing_is_one_line_and_leaves_nothing(command: list[str], pristine: Path):
    """The file-size limit (RLIMIT_FSIZE: writes past it fail with EFBIG, as a full disk fails with ENOSPC)
    set below the weights' size, in a real process: one error line naming the file, exit 2, no output and no
    temp folder left behind."""
    import resource
    import subprocess
    import sys

    ws = _workspace(pristine)
    try:
        argv = [str(ws / a[1:]) if a.startswith("@") else a for a in command]
        limit = 20_000  # bytes: the configs fit, the weights do not

        def small_files() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        before = sorted(p.name for p in ws.iterdir())
        proc = subprocess.run([sys.executable, "-m", "medusa", *argv], capture_output=True, text=True,
                              preexec_fn=small_files, cwd=Path(__file__).resolve().parents[2],
                              env=dict(os.environ, HF_HUB_OFFLINE="1"))
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
        assert lines[0].startswith(f"error: {ws / 'out'}/") and lines[0].endswith(": file too large")
        assert sorted(p.name for p in ws.iterdir()) == before  # no out, no .out.tmp-*
    finally:
        shutil.rmtree(ws.parent)
