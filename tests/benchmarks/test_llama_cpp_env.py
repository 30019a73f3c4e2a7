"""benchmarks.llama_cpp_env without installing anything: a stamped venv with its converter is reused, the
converter is taken out of the sdist's vendor/llama.cpp, the server binary is found or its absence named."""

import io
import tarfile

import pytest

from benchmarks.llama_cpp_env import (
    PINS,
    STAMP,
    LlamaCppUnavailable,
    converter_script,
    ensure_venv,
    extract_converter,
    server_binary,
)


def _stamped(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / STAMP).write_text(" ".join(PINS) + "\n")
    return venv


def test_a_stamped_venv_with_its_converter_is_reused(tmp_path):
    venv = _stamped(tmp_path)
    converter_script(venv).parent.mkdir(parents=True)
    converter_script(venv).write_text("")
    assert ensure_venv(venv) == venv / "bin" / "python"  # no pip run: it would fail on this fake venv


def test_the_converter_is_extracted_from_the_sdist(tmp_path):
    venv = _stamped(tmp_path)
    sdist = tmp_path / "sdist"
    sdist.mkdir()
    members = {"llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py": b"main",
               "llama_cpp_python-0.3.36/vendor/llama.cpp/conversion/llama.py": b"llama",
               "llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py/gguf/__init__.py": b"gguf",
               "llama_cpp_python-0.3.36/vendor/llama.cpp/src/llama.cpp": b"not needed",
               "llama_cpp_python-0.3.36/llama_cpp/__init__.py": b"not needed"}
    with tarfile.open(sdist / "llama_cpp_python-0.3.36.tar.gz", "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    extract_converter(sdist / "llama_cpp_python-0.3.36.tar.gz", venv / "converter")
    out = venv / "converter"
    assert converter_script(venv).read_text() == "main"
    assert (out / "conversion" / "llama.py").read_text() == "llama"
    assert (out / "gguf-py" / "gguf" / "__init__.py").read_text() == "gguf"
    assert sorted(p.name for p in out.iterdir()) == ["conversion", "convert_hf_to_gguf.py", "gguf-py"]


def test_a_missing_server_is_named(tmp_path):
    with pytest.raises(LlamaCppUnavailable, match="no llama-server"):
        server_binary(tmp_path)
