"""The heads' weight file (medusa/modeling/heads_file.py): the xz-compressed form the project ships its
drafters in loads bit for bit as the plain file, the readers of a heads folder find it (the exports:
tests/export), and a folder with both forms, a corrupt .xz or an .xz of something else is refused with one
line naming the file."""

import lzma

import pytest
import torch
from export_helpers import perturb

from medusa import CheckpointError, MedusaModel
from medusa.modeling.heads_file import (
    PACKED_WEIGHTS_NAME,
    heads_weights_path,
    pack_heads_file,
)
from medusa.modeling.summary import summarize

from tiny_models import tiny_model


@pytest.mark.parametrize("head_type", ["linear", "hydra", "eagle3"])
def test_packed_heads_load_bit_for_bit(tmp_path, head_type):
    base = tiny_model("llama")
    model = perturb(MedusaModel.from_base(base, num_heads=2, head_type=head_type))
    model.save_pretrained(tmp_path / "ck")
    plain_bytes = (tmp_path / "ck" / "medusa_heads.safetensors").read_bytes()
    packed = pack_heads_file(tmp_path / "ck")
    assert packed == tmp_path / "ck" / PACKED_WEIGHTS_NAME and heads_weights_path(tmp_path / "ck") == packed
    assert not (tmp_path / "ck" / "medusa_heads.safetensors").exists()
    assert lzma.decompress(packed.read_bytes()) == plain_bytes  # `unxz` gives back the very file
    loaded = MedusaModel.from_pretrained(tmp_path / "ck", base_model=base)
    for key, value in model.heads.state_dict().items():
        assert torch.equal(loaded.heads.state_dict()[key], value), key


def test_the_summary_reads_the_packed_file(tmp_path):
    base = tiny_model("llama")
    model = perturb(MedusaModel.from_base(base, num_heads=2, head_type="eagle3"))
    model.save_pretrained(tmp_path / "plain")
    model.save_pretrained(tmp_path / "packed")
    pack_heads_file(tmp_path / "packed")
    plain, packed = summarize(tmp_path / "plain"), summarize(tmp_path / "packed")
    assert packed["parameters"] == plain["parameters"] > 0 and packed["head_type"] == "eagle3"


def test_a_folder_with_both_forms_is_refused(saved):
    base, ck = saved
    (ck / PACKED_WEIGHTS_NAME).write_bytes(lzma.compress((ck / "medusa_heads.safetensors").read_bytes()))
    with pytest.raises(CheckpointError, match="holds both medusa_heads.safetensors and "
                                              "medusa_heads.safetensors.xz; keep one"):
        MedusaModel.from_pretrained(ck, base_model=base)
    with pytest.raises(CheckpointError, match="already exists"):
        pack_heads_file(ck)


def test_corrupt_packed_files_are_named(saved):
    base, ck = saved
    data = (ck / "medusa_heads.safetensors").read_bytes()
    (ck / "medusa_heads.safetensors").unlink()
    packed = ck / PACKED_WEIGHTS_NAME
    packed.write_bytes(lzma.compress(data)[:-40])
    with pytest.raises(CheckpointError, match=f"{packed}: corrupt xz file"):
        MedusaModel.from_pretrained(ck, base_model=base)
    packed.write_bytes(lzma.compress(b"not a safetensors file"))
    with pytest.raises(CheckpointError, match=f"{packed}: corrupt safetensors file"):
        MedusaModel.from_pretrained(ck, base_model=base)
    packed.unlink()
    with pytest.raises(CheckpointError, match="medusa_heads.safetensors: not found"):
        MedusaModel.from_pretrained(ck, base_model=base)
