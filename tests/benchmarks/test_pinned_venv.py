"""A peer's pinned venv: a stamped venv naming the same pins is reused without pip; a failed build step is the
caller's error, one line with the step, its exit status and the tool's last lines."""

import sys

import pytest

from benchmarks.pinned_venv import ensure_pinned, run_step, venv_python
from medusa.errors import MedusaError
from medusa.io import _lock_path


class _Unavailable(MedusaError):
    pass


def test_a_stamped_venv_with_the_same_pins_is_reused(tmp_path):
    venv = tmp_path / "v"
    venv_python(venv).parent.mkdir(parents=True)
    venv_python(venv).write_text("")
    (venv / ".stamp").write_text("a==1 b==2\n")
    completed = []

    def complete(path):  # runs while the venv's build lock is held: a second process would wait
        assert _lock_path(path, "build-lock").is_file()
        completed.append(path)

    python = ensure_pinned(venv, ".stamp", ("a==1", "b==2"), [["a==1"]], _Unavailable, complete=complete)
    assert python == venv / "bin" / "python"  # no pip run: it would fail on this fake venv
    assert completed == [venv] and sorted(p.name for p in tmp_path.iterdir()) == ["v"]


def test_a_failed_step_raises_the_callers_error():
    argv = [sys.executable, "-c", "import sys; sys.stderr.write('one\\ntwo\\nboom\\n'); sys.exit(3)"]
    with pytest.raises(_Unavailable, match=r"^pip install x failed \(exit 3\): one \| two \| boom$"):
        run_step(argv, "pip install x", _Unavailable)
    run_step([sys.executable, "-c", "pass"], "ok", _Unavailable)
