"""End-to-end MEDUSA-2 runs of the tiny recipes on stories260K (CPU): LoRA, self-distillation, QLoRA,
full fine-tuning under a 2-process accelerate launch."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from frozen import heads_and_lora, record_frozen

from medusa.config import load_recipe
from medusa.errors import ConfigError
from medusa.modeling.model import MedusaModel
from medusa.training.loop import train
from medusa.training.medusa2 import check_recipe

from tiny_models import require_module, stories_model

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny"
IDS = torch.tensor([[1, 403, 407, 261, 378, 29, 261, 269, 363, 260, 365, 267]])  # [1, T]


# stories260K present, run from the repository root (recipe paths), one torch thread (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_recipe_env")


def _recipe(name, tmp_path, *overrides):
    base = [f"output_dir={tmp_path / 'run'}", "data.max_length=64", "train.logging_steps=2",
            "data.eval_split=0.0", "train.eval_steps=0"]
    return load_recipe(TINY / f"{name}.yaml", base + list(overrides))


def _logits(model):
    with torch.no_grad():
        out = model(input_ids=IDS)
    return out.logits, out.head_logits


def _check_final(result, tmp_path):
    """final/ loads with no other files, equals the in-process trained model, and its backbone moved."""
    loaded = MedusaModel.from_pretrained(result.final_dir)
    assert loaded.config.recipe["method"] == "medusa2" and loaded.config.base_model_subdir == "base_model"
    assert not any(hasattr(m, "lora_A") for m in loaded.base_model.modules())
    result.model.eval()
    want_logits, want_heads = _logits(result.model)
    got_logits, got_heads = _logits(loaded)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_heads, want_heads, rtol=1e-5, atol=1e-5)
    plain = stories_model()
    with torch.no_grad():
        original = plain(input_ids=IDS).logits
    assert not torch.allclose(got_logits, original, atol=1e-4), "the backbone did not train"
    return loaded


def test_tiny_lora_recipe(tmp_path):
    result = train(_recipe("medusa2_lora", tmp_path, "train.max_steps=6"))
    rows = [json.loads(r) for r in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6] and all("head3_top1" in r for r in rows)
    loaded = _check_final(result, tmp_path)
    fresh = MedusaModel.from_base(stories_model(), num_heads=3, heads_dtype=torch.float32)
    for (name, p), q in zip(loaded.heads.state_dict().items(), fresh.heads.state_dict().values()):
        assert not torch.equal(p, q), f"head tensor {name} did not move"
    assert (result.final_dir / "base_model" / "tokenizer_config.json").is_file()


def _rows(result):
    return [json.loads(r) for r in (result.output_dir / "metrics.jsonl").read_text().splitlines()]


def _first_batch_ce(recipe):
    """The untouched base model's next-token cross-entropy on the run's first batch (the run's own data
    order), computed here with F.cross_entropy on the HF model's logits."""
    import torch.nn.functional as F

    from medusa.data import collate
    from medusa.training import setup as S

    data = S.load_data(recipe, S.load_tokenizer(recipe))
    order = S.epoch_order(len(data.train.examples), recipe.train.seed, 0)
    batch = collate([data.train.examples[i] for i in order[:recipe.train.batch_size]], data.pad_token_id)
    with torch.no_grad():
        logits = stories_model()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    v = logits.shape[-1]  # logits [B, T, V]: position t predicts label t + 1
    return float(F.cross_entropy(logits[:, :-1].reshape(-1, v), batch["labels"][:, 1:].reshape(-1),
                                 ignore_index=-100))


@pytest.mark.parametrize("name, first_term",
                         [("medusa2_lora", "lm_loss"), ("medusa2_selfdistill", "distill_kl")])
def test_metrics_log_the_loss_terms_every_step(tmp_path, name, first_term):
    """Each step's row carries L_LM (or the KL), L_heads and lambda0, and they add up to the logged loss.
    At step 1 the LoRA adapters are still zero (B = 0): the plain recipe's L_LM is the base model's CE on
    that batch, and the self-distillation recipe's is the KL of the model to itself, 0, though that CE > 0."""
    recipe = _recipe(name, tmp_path, "train.max_steps=3", "train.logging_steps=1", "train.batch_size=4",
                     "medusa2.schedule=linear")
    rows = _rows(train(recipe))
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        for key in ("lm_loss", first_term, "heads_loss", "lambda0", "loss"):
            assert math.isfinite(r[key]), (key, r)
        assert r["loss"] == pytest.approx(r["lm_loss"] + r["lambda0"] * r["heads_loss"], rel=1e-5, abs=1e-7)
        assert r["heads_loss"] > 0
    # the linear schedule over 3 steps: lambda0 * step / 3 at steps 0, 1, 2
    assert [r["lambda0"] for r in rows] == pytest.approx([recipe.medusa2.lambda0 * s / 3 for s in range(3)])
    ce = _first_batch_ce(recipe)
    assert ce > 1.0
    if first_term == "lm_loss":
        assert rows[0]["lm_loss"] == pytest.approx(ce, rel=1e-4)
    else:
        assert rows[0]["distill_kl"] == pytest.approx(0.0, abs=1e-6)


def test_tiny_selfdistill_recipe_from_medusa1_heads(tmp_path):
    stage1 = MedusaModel.from_base(stories_model(), num_heads=3, heads_dtype=torch.float32)
    with torch.no_grad():
        stage1.heads.blocks[0][0].linear.bias.fill_(0.5)
    stage1.save_pretrained(tmp_path / "m1")
    result = train(_recipe("medusa2_selfdistill", tmp_path, "train.max_steps=4",
                           f"heads.init_from={tmp_path / 'm1'}", "train.lr=1e-2"))
    loaded = _check_final(result, tmp_path)
    # started from the stage-1 heads (the bias was 0.5 there, 0 in a fresh head), then trained
    bias = loaded.heads.blocks[0][0].linear.bias
    assert (bias - 0.5).abs().max() < 0.3 and not torch.equal(bias, torch.full_like(bias, 0.5))


def test_tiny_qlora_recipe(tmp_path, monkeypatch):
    require_module("bitsandbytes")
    frozen = record_frozen(monkeypatch, heads_and_lora)
    result = train(_recipe("medusa2_lora", tmp_path, "train.max_steps=3", "quantization=4bit",
                           "train.lr=1e-2"))
    # every 4-bit weight, its quantisation state, norm, embedding and the LM head: all but adapters and heads
    assert any(t.dtype == torch.uint8 for t in frozen.before[0].values())
    frozen.assert_unchanged()
    loaded = MedusaModel.from_pretrained(result.final_dir)
    config = json.loads((result.final_dir / "base_model" / "config.json").read_text())
    assert "quantization_config" not in config
    assert next(loaded.base_model.parameters()).dtype == torch.float32
    with torch.no_grad():
        assert not torch.allclose(loaded.base_model(input_ids=IDS).logits,
                                  stories_model()(input_ids=IDS).logits, atol=1e-4)


def test_full_finetune_with_quantization_is_refused():
    recipe = load_recipe(TINY / "medusa2_full.yaml", ["quantization=4bit"])
    with pytest.raises(ConfigError, match="lora.full_finetune"):
        check_recipe(recipe)


def test_tiny_full_recipe_two_process_cpu_launch(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--cpu",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "-m", "medusa.train", str(TINY / "medusa2_full.yaml"), f"output_dir={out}", "train.max_steps=3",
           "train.batch_size=2", "data.max_length=32", "train.logging_steps=1", "data.eval_split=0.0",
           "medusa2.self_distill=true"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    loaded = MedusaModel.from_pretrained(out / "final")
    fresh = stories_model()
    moved = [n for (n, p), q in zip(loaded.base_model.state_dict().items(), fresh.state_dict().values())
             if not torch.equal(p, q)]
    assert len(moved) > 10, "full fine-tuning left the backbone unchanged"


def test_tiny_full_recipe_deepspeed_zero3_cpu(tmp_path):
    """ZeRO-3 on CPU (one process): partitioned backbone, heads from the gathered LM head, gathered export."""
    require_module("deepspeed")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2,
                              "gradient_accumulation_steps": 1, "zero_force_ds_cpu_optimizer": False,
                              "gradient_clipping": 1.0}))
    acc = tmp_path / "accelerate.yaml"
    acc.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
                   f"  deepspeed_config_file: {ds}\n  zero3_init_flag: true\nnum_machines: "
                   f"1\nnum_processes: 1\n"
                   "use_cpu: true\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = tmp_path / "zero3"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(acc),
           "-m", "medusa.train", str(TINY / "medusa2_full.yaml"), f"output_dir={out}", "train.max_steps=2",
           "train.batch_size=2", "data.max_length=32", "train.logging_steps=1", "data.eval_split=0.0"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = MedusaModel.from_pretrained(out / "final")
    fresh = stories_model()
    assert all(not torch.equal(p, q) for p, q in zip(loaded.base_model.state_dict().values(),
                                                      fresh.state_dict().values()))
    # every head started as the (gathered) LM head: W2 is close to it after 2 small steps, not zero / garbage
    for head in loaded.heads.lm_heads:
        assert (head.weight - fresh.lm_head.weight).abs().max() < 0.05


@pytest.mark.parametrize("name", ["medusa2_lora", "medusa2_qlora", "medusa2_selfdistill",
                                  "medusa2_full_zero3"])
def test_full_size_recipes_validate(name):
    path = ROOT / "recipes" / f"{name}.yaml"
    assert path.read_text().splitlines()[0].startswith("# ") and f"recipes/{name}.yaml" in path.read_text()
    # their data is the user's own; the rest of the recipe must validate as written
    recipe = load_recipe(path, ["data.train=../shared/data/sharegpt_dummy_conversation.json"])
    assert recipe.method == "medusa2"
    check_recipe(recipe)
    if name == "medusa2_selfdistill":
        m = recipe.medusa2
        assert (recipe.train.lr, m.lambda0, m.schedule, m.self_distill) == (1e-4, 0.01, "sine", True)
