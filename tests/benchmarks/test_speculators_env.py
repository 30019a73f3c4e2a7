"""benchmarks.speculators_env without installing anything: a stamped venv is reused; where it lives."""

from benchmarks.speculators_env import PINS, STAMP, ensure_venv, venv_dir


def _fake_venv(root, stamp: str):
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / STAMP).write_text(stamp)
    return venv


def test_a_stamped_venv_is_reused(tmp_path):
    venv = _fake_venv(tmp_path, " ".join(PINS) + "\n")
    assert ensure_venv(venv) == venv / "bin" / "python"  # no pip run: it would fail on this fake venv
    assert (venv / STAMP).is_file()


def test_the_venv_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDUSA_SPECULATORS_VENV", str(tmp_path / "v"))
    assert venv_dir() == tmp_path / "v"
    monkeypatch.delenv("MEDUSA_SPECULATORS_VENV")
    assert venv_dir().name == "speculators-venv"
