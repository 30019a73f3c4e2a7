"""MEDUSA-2 (medusa/training/medusa2.py): end-to-end runs of the tiny recipes on stories260K (CPU): LoRA,
self-distillation, QLoRA, full fine-tuning under a 2-process accelerate launch; merged export (LoRA and
QLoRA), two-stage head loading, ZeRO-3-safe head init."""

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from decoding_helpers import memorise_heads, real_rows
from frozen import frozen_state, heads_and_lora, record_frozen
from medusa2_helpers import batch, naive_heads_loss

from medusa import MedusaModel
from medusa.config import load_recipe
from medusa.errors import CheckpointError, ConfigError
from medusa.modeling.base import lm_head_weight
from medusa.training import backbone as bb
from medusa.training import medusa2 as m2
from medusa.training.loop import train
from medusa.training.losses import medusa2_loss
from medusa.training.medusa2 import check_recipe
from medusa.training.setup import param_groups

from tiny_models import STORIES, require_module, require_shared, stories_model, stories_tokenizer, tiny_model

ROOT = Path(__file__).resolve().parents[2]


TINY = ROOT / "recipes" / "tiny"


IDS = torch.tensor([[1, 403, 407, 261, 378, 29, 261, 269, 363, 260, 365, 267]])  # [1, T]


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


@pytest.mark.usefixtures("tiny_recipe_env")
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


@pytest.mark.usefixtures("tiny_recipe_env")
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


@pytest.mark.usefixtures("tiny_recipe_env")
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


@pytest.mark.usefixtures("tiny_recipe_env")
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


@pytest.mark.usefixtures("tiny_recipe_env")
def test_full_finetune_with_quantization_is_refused():
    recipe = load_recipe(TINY / "medusa2_full.yaml", ["quantization=4bit"])
    with pytest.raises(ConfigError, match="lora.full_finetune"):
        check_recipe(recipe)


@pytest.mark.usefixtures("tiny_recipe_env")
def test_tiny_full_recipe_two_process_cpu_launch(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "accelerate" / "cpu.yaml"), "--num_processes", "2",
           "--main_process_port", "0", "--mixed_precision", "no",
           "-m", "medusa.train", str(TINY / "medusa2_full.yaml"), f"output_dir={out}", "train.max_steps=3",
           "train.batch_size=2", "data.max_length=32", "train.logging_steps=1", "data.eval_split=0.0",
           "medusa2.self_distill=true"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = re.findall(r"engine: MULTI_CPU, 2 process\(es\); rank (\d) holds", proc.stdout)
    assert sorted(ranks) == ["0", "1"]  # DDP over gloo, a world of 2
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    loaded = MedusaModel.from_pretrained(out / "final")
    fresh = stories_model()
    moved = [n for (n, p), q in zip(loaded.base_model.state_dict().items(), fresh.state_dict().values())
             if not torch.equal(p, q)]
    assert len(moved) > 10, "full fine-tuning left the backbone unchanged"


@pytest.mark.usefixtures("tiny_recipe_env")
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


@pytest.mark.usefixtures("tiny_recipe_env")
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


def _train_lora(model, steps=3, lr=5e-2, vocab=96, self_distill=False):
    ids, labels = batch(vocab)
    opt = torch.optim.AdamW(param_groups(model, lr=lr, lr_multiplier=4.0))
    model.train()
    for _ in range(steps):
        teacher = m2.teacher_logits(model, ids) if self_distill else None
        out = model(input_ids=ids)
        loss, _ = medusa2_loss(out.logits, labels, naive_heads_loss(out.head_logits, labels), 0.2,
                               teacher_logits=teacher)
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def _outputs(model, ids):
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.logits, out.head_logits


def test_merged_lora_export_loads_alone_and_matches_unmerged(tmp_path):
    model = bb.apply_lora(MedusaModel.from_base(tiny_model("llama"), num_heads=2, num_layers=1), r=4, alpha=8,
                          dropout=0.0)
    _train_lora(model)
    ids, _ = batch(96, seed=1)
    logits, heads = _outputs(model, ids)  # the unmerged peft model
    plain = tiny_model("llama")
    assert not torch.allclose(_outputs(MedusaModel.from_base(plain, num_heads=2), ids)[0], logits, atol=1e-3)
    bb.save_merged(model, tmp_path / "final", recipe={"method": "medusa2"})
    # tiny_model has no name_or_path: the checkpoint can only load through its own merged backbone
    loaded = MedusaModel.from_pretrained(tmp_path / "final")
    assert not any(hasattr(m, "lora_A") for m in loaded.base_model.modules())
    got_logits, got_heads = _outputs(loaded, ids)
    torch.testing.assert_close(got_logits, logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_heads, heads, rtol=1e-5, atol=1e-5)
    config = json.loads((tmp_path / "final" / "medusa_config.json").read_text())
    assert config["base_model_subdir"] == "base_model" and config["recipe"] == {"method": "medusa2"}


def test_merged_shared_lm_head_export(tmp_path):
    model = bb.apply_lora(MedusaModel.from_base(tiny_model("qwen2"), num_heads=2, head_type="shared_lm_head"),
                          r=4, alpha=8, dropout=0.0)
    _train_lora(model, steps=2)
    ids, _ = batch(96, seed=2)
    logits, heads = _outputs(model, ids)
    bb.save_merged(model, tmp_path / "final")
    got_logits, got_heads = _outputs(MedusaModel.from_pretrained(tmp_path / "final"), ids)
    torch.testing.assert_close(got_logits, logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_heads, heads, rtol=1e-5, atol=1e-5)


def test_merged_stories_greedy_decoding_equals_backbone_greedy(tmp_path):
    require_shared(STORIES)
    tok = stories_tokenizer()
    model = bb.apply_lora(MedusaModel.from_base(stories_model(), num_heads=3, num_layers=1), r=4, alpha=8,
                          dropout=0.0)
    _train_lora(model, steps=3, lr=1e-2, vocab=512, self_distill=True)
    bb.save_merged(model, tmp_path / "final", tokenizer=tok)
    assert (tmp_path / "final" / "base_model" / "tokenizer_config.json").is_file()
    loaded = MedusaModel.from_pretrained(tmp_path / "final")
    tok.pad_token = tok.unk_token  # stories260K's tokenizer has no pad token
    ids = tok(["Once upon a time, there was a", "The little dog"], return_tensors="pt", padding=True,
              padding_side="left")
    with torch.no_grad():
        ref = loaded.base_model.generate(**ids, do_sample=False, max_new_tokens=24,
                                         pad_token_id=tok.pad_token_id)
    # heads fitted to the merged model's own greedy rows, so that tree paths through it get accepted
    memorise_heads(loaded, real_rows(ref, ids["attention_mask"]), steps=150)
    got = loaded.generate(ids["input_ids"], attention_mask=ids["attention_mask"], max_new_tokens=24,
                          acceptance="greedy", return_dict_in_generate=True)
    assert got.sequences.shape == ref.shape and torch.equal(got.sequences, ref)
    assert max(max(a) for a in got.accept_lengths) >= 3, got.accept_lengths


def _qlora_model(monkeypatch):
    """QLoRA through the training path: the tiny LoRA recipe with ``quantization: 4bit`` (fp32 compute)."""
    require_module("bitsandbytes")
    monkeypatch.chdir(ROOT)  # the recipe's paths are relative to the repository root
    recipe = load_recipe(ROOT / "recipes" / "tiny" / "medusa2_lora.yaml",
                         ["quantization=4bit", "heads.num_heads=2", "lora.r=4", "lora.alpha=8",
                          "lora.dropout=0.0"])
    model, _, _ = m2.setup_model(recipe, torch.device("cpu"), total_steps=2)
    return model


def test_qlora_trains_on_cpu_and_merges_into_an_unquantised_copy(tmp_path, monkeypatch):
    require_shared(STORIES)
    model = _qlora_model(monkeypatch)
    assert bb.is_4bit(model.base_model)
    assert next(model.heads.parameters()).dtype == torch.float32
    frozen = frozen_state(model, heads_and_lora)  # every tensor but the adapters and heads, every dtype
    assert any(t.dtype == torch.uint8 for t in frozen.values()) and any("embed" in n for n in frozen)
    m2._WARNED_4BIT_TEACHER[0] = False
    with pytest.warns(UserWarning, match="4-bit") as record:
        _train_lora(model, steps=2, lr=1e-2, vocab=512, self_distill=True)
    assert sum("4-bit" in str(w.message) for w in record) == 1  # once, not per step
    after = model.state_dict()
    assert [n for n, t in frozen.items() if not torch.equal(after[n], t)] == []
    from peft import get_peft_model_state_dict

    adapters = {k: v.clone() for k, v in get_peft_model_state_dict(model.base_model).items()}
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in adapters.items())
    heads_before = {n: p.detach().clone() for n, p in model.heads.state_dict().items()}
    bb.save_merged(model, tmp_path / "final", dtype="float32")
    base_cfg = json.loads((tmp_path / "final" / "base_model" / "config.json").read_text())
    assert "quantization_config" not in base_cfg
    loaded = MedusaModel.from_pretrained(tmp_path / "final")
    # the merged weights are exactly W + (alpha / r) * B @ A on the unquantised base, for every adapted layer
    plain = stories_model().state_dict()
    merged = loaded.base_model.state_dict()
    adapted = [k.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
               for k in adapters if k.endswith(".lora_A.weight")]
    assert len(adapted) == 7 * stories_model().config.num_hidden_layers
    for name in adapted:
        a = adapters[f"base_model.model.{name}.lora_A.weight"]  # [r, in]
        b = adapters[f"base_model.model.{name}.lora_B.weight"]  # [out, r]
        torch.testing.assert_close(merged[f"{name}.weight"], plain[f"{name}.weight"] + 2.0 * b @ a,
                                   rtol=1e-5, atol=1e-6)
    for name in set(merged) - {f"{n}.weight" for n in adapted}:
        assert torch.equal(merged[name], plain[name]), name
    for name, tensor in loaded.heads.state_dict().items():
        assert torch.equal(tensor, heads_before[name]), name
    # and the merged model computes what the unmerged adapters on the unquantised base compute
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    ref = get_peft_model(stories_model(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                     target_modules=bb.LORA_TARGETS["llama"]))
    set_peft_model_state_dict(ref, adapters)
    ids, _ = batch(512, seed=3)
    with torch.no_grad():
        want = ref.eval()(input_ids=ids).logits
        original = stories_model()(input_ids=ids).logits
    got_logits, _ = _outputs(loaded, ids)
    torch.testing.assert_close(got_logits, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got_logits, original, atol=1e-4)


def test_load_heads_from_medusa1_checkpoint(tmp_path):
    stage1 = MedusaModel.from_base(tiny_model("llama"), num_heads=2, num_layers=1)
    with torch.no_grad():
        for p in stage1.heads.parameters():
            p.add_(torch.randn_like(p))
    stage1.save_pretrained(tmp_path / "m1")
    stage2 = MedusaModel.from_base(tiny_model("llama"), num_heads=2, num_layers=1)
    m2.load_heads_from(stage2, tmp_path / "m1")
    for (n, a), b in zip(stage2.heads.state_dict().items(), stage1.heads.state_dict().values()):
        assert torch.equal(a, b), n
    other = MedusaModel.from_base(tiny_model("llama"), num_heads=3, num_layers=1)
    with pytest.raises(CheckpointError, match="heads.init_from.*num_heads=2"):
        m2.load_heads_from(other, tmp_path / "m1")


def test_init_heads_from_lm_head_resets_w2():
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=2)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(1.0)
    m2.init_heads_from_lm_head(model)
    for head in model.heads.lm_heads:
        assert torch.equal(head.weight, lm_head_weight(model.base_model))


def test_heads_init_from_zero3_partitioned_lm_head():
    """DeepSpeed ZeRO-3 (one CPU process, gloo) partitions the LM head; the heads still start equal to it."""
    require_module("deepspeed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = Path(__file__).resolve().parents[1] / "helpers" / "zero3_init_probe.py"
    env = dict(os.environ, MASTER_PORT=str(port))
    proc = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), (proc.stdout[-2000:]
                                                                         + proc.stderr[-4000:])


@pytest.mark.parametrize("head_type,projection", [("linear", "own"), ("hydra", "shared_lm_head")])
def test_zero3_gathered_save_equals_plain_save_with_draft_vocab(tmp_path, head_type, projection):
    """The ZeRO-3 save path rebuilds the module from gathered tensors (m2._gathered_module; a no-op gather
    here): its checkpoint must equal the plain path's, draft-vocabulary token_map and Hydra projection
    included."""
    require_shared(STORIES)
    recipe = load_recipe(ROOT / "recipes" / "tiny" / "medusa2_lora.yaml",
                         [f"model={STORIES}", f"heads.head_type={head_type}", "heads.num_heads=2"])
    model = MedusaModel.from_base(stories_model(), num_heads=2, num_layers=1, head_type=head_type,
                                  heads_dtype=torch.float32, hydra_projection=projection)
    token_map = torch.randperm(512, generator=torch.Generator().manual_seed(0))[:64]  # [64], not arange
    model.use_draft_vocab(token_map)
    lo = recipe.lora  # as the training run applied it
    bb.apply_lora(model, r=lo.r, alpha=lo.alpha, dropout=lo.dropout, target_modules=lo.target_modules)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # "trained": LoRA B and the ResBlocks away from their zero init
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    width = model.config.hidden_size * (3 if head_type == "hydra" else 1)  # hydra: [h, e_1, e_2]
    wide = torch.randn(1, 5, width, generator=g)  # [B, T, d or d * (K+1)]
    with torch.no_grad():
        want = model.heads(wide)  # [K, B, T, V]

    gathered = m2._gathered_module(m2.Medusa2Module(model, 0.8, 64), model, recipe, is_main=True)
    bb.save_merged(gathered.model, str(tmp_path / "zero3"), recipe=recipe.to_dict())
    bb.save_merged(model, str(tmp_path / "plain"), recipe=recipe.to_dict())
    config = "medusa_config.json"
    assert json.loads((tmp_path / "zero3" / config).read_text()) == json.loads(
        (tmp_path / "plain" / config).read_text())
    zero3 = MedusaModel.from_pretrained(tmp_path / "zero3")
    plain = MedusaModel.from_pretrained(tmp_path / "plain")
    a, b = zero3.heads.state_dict(), plain.heads.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert zero3.config.draft_vocab == 64 and torch.equal(zero3.heads.token_map, token_map)
    assert zero3.config.hydra_projection == plain.config.hydra_projection
    with torch.no_grad():
        assert torch.equal(zero3.heads(wide), want)
    merged_a, merged_b = zero3.base_model.state_dict(), plain.base_model.state_dict()
    assert merged_a.keys() == merged_b.keys() and all(torch.equal(merged_a[k], merged_b[k]) for k in merged_a)


def test_method_checks_the_recipe_and_groups_heads_at_the_lr_multiplier():
    from medusa.config import Recipe

    bad = Recipe(model="m", method="medusa2", quantization="4bit")
    bad.lora.full_finetune = True
    with pytest.raises(ConfigError, match="lora.full_finetune"):
        m2.METHOD.check_recipe(bad)
    recipe = Recipe(model="m", method="medusa2")
    model = m2.medusa_from_base(tiny_model("llama"), num_heads=2)
    module = m2.Medusa2Module(model, 0.8, 64)
    lrs = {g["name"]: g["lr"] for g in m2.METHOD.param_groups(recipe, module)}
    assert lrs["heads_decay"] == pytest.approx(recipe.train.lr * recipe.medusa2.lr_multiplier)
    assert lrs["backbone_decay"] == pytest.approx(recipe.train.lr)
    assert m2.METHOD.name == "medusa2" and m2.METHOD.trained_model(None, model, module) is model
