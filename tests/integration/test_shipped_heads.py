"""The heads shipped for SmolLM2-135M-Instruct (data/heads/smollm2-135m-instruct/{medusa1,hydra,eagle3}): they
load through the packaged base (found or converted like ``make test`` does), are refused on another base, and
greedy decoding with their calibrated tree equals HF greedy through EOS on chat prompts, with runs accepted.
The EAGLE-3 drafter is stored in bfloat16 and decodes in the float32 its config names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from real_models import smollm2_dir

from medusa import MedusaModel
from medusa.errors import CheckpointError
from medusa.modeling.config import CONFIG_NAME, MedusaConfig, base_location
from medusa.modeling.heads_file import PACKED_WEIGHTS_NAME
from medusa.modeling.packaged import MARKER, PACKAGED_KEY

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "heads" / "smollm2-135m-instruct"
PROMPTS = ["What is the capital of France?", "Give three tips for staying healthy."]
SETS = ["medusa1", "hydra"]
ALL_SETS = [*SETS, "eagle3"]


@pytest.fixture(scope="module")
def base():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir())


@pytest.fixture(scope="module")
def references(base, tokenizer):
    """Per prompt: the chat-templated ids and HF's greedy reply through EOS (shared by every head set)."""
    refs = []
    for prompt in PROMPTS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            refs.append((ids, base.generate(ids, max_new_tokens=256, do_sample=False)))
    return refs


@pytest.mark.parametrize("name", ALL_SETS)
def test_shipped_heads_are_tied_to_the_packaged_base(name):
    smollm2_dir()
    config = MedusaConfig.load(SHIPPED / name)
    info = config.extra[PACKAGED_KEY]
    assert info["name"] == "smollm2-135m-instruct" and len(info["gguf_sha256"]) == 64 and info["weights"]
    assert (SHIPPED / name / "tree.json").is_file()
    assert Path(base_location(SHIPPED / name, config)) == smollm2_dir()  # found where make test put it
    total = sum(f.stat().st_size for s in SETS for f in (SHIPPED / s).rglob("*") if f.is_file())
    assert total < 16 * 2**20  # both head sets, bf16, trimmed to their trees' depth, xz-compressed
    assert (SHIPPED / name / PACKED_WEIGHTS_NAME).is_file()  # lossless: medusa/modeling/heads_file.py
    drafter = sum(f.stat().st_size for f in (SHIPPED / "eagle3").rglob("*") if f.is_file())
    assert drafter < 16 * 2**20  # the eagle3 drafter: 9.8M parameters stored in bf16, xz-compressed


@pytest.mark.parametrize("name", ALL_SETS)
def test_shipped_heads_greedy_equal_hf_through_eos(name, base, references):
    model = MedusaModel.from_pretrained(SHIPPED / name, base_model=base)
    config_dtype = getattr(torch, MedusaConfig.load(SHIPPED / name).dtype)
    assert {p.dtype for p in model.heads.parameters()} == {config_dtype}  # eagle3: bf16 on disk, float32 here
    gains = []
    for ids, ref in references:
        assert ref[0, -1].item() == 2  # the reply ended with <|im_end|>
        out = model.generate(ids, max_new_tokens=256, return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref)
        gains += list(out.accept_lengths[0])
    assert max(gains) >= 3  # the trained heads got whole runs accepted


def test_shipped_heads_refuse_another_base(base, tmp_path):
    other = type(base)(base.config)
    other.load_state_dict(base.state_dict())
    with torch.no_grad():
        other.model.layers[3].mlp.down_proj.weight.mul_(1.01)  # same shape, other weights
    with pytest.raises(CheckpointError, match="another model"):
        MedusaModel.from_pretrained(SHIPPED / "medusa1", base_model=other)
    fake = tmp_path / "fake-base"  # a converted directory made from another GGUF
    fake.mkdir()
    marker = json.loads((smollm2_dir() / MARKER).read_text())
    (fake / MARKER).write_text(json.dumps({**marker, "gguf_sha256": "0" * 64}))
    with pytest.raises(CheckpointError, match="trained on smollm2-135m-instruct"):
        base_location(SHIPPED / "medusa1", MedusaConfig.load(SHIPPED / "medusa1"), base=str(fake))
    copy = tmp_path / "heads"
    shutil.copytree(SHIPPED / "medusa1", copy)
    data = json.loads((copy / CONFIG_NAME).read_text())
    data["extra"][PACKAGED_KEY]["name"] = "no-such-model"
    (copy / CONFIG_NAME).write_text(json.dumps(data))
    with pytest.raises(Exception, match="no-such-model"):
        MedusaModel.from_pretrained(copy)
