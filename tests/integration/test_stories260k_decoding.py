"""On the real stories260K model with heads fitted to its own outputs: exact greedy output, real speed-up in
tokens/step, and the ``medusa generate`` command (MEDUSA heads; Hydra heads with a dynamic tree)."""

import json

import pytest
import torch

from medusa.cli import main

from fit_heads import fitted_stories_heads, stories_prompts
from tiny_models import STORIES, stories_tokenizer


@pytest.fixture(scope="module")
def fitted():
    return fitted_stories_heads(num_heads=4, num_layers=1)


@pytest.fixture(scope="module")
def hydra():
    return fitted_stories_heads(num_heads=4, num_layers=1, head_type="hydra")


def _tokenizer():
    tok = stories_tokenizer()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.unk_token or tok.eos_token
    return tok


def test_fitted_heads_greedy_equal_and_fast(fitted):
    tok = _tokenizer()
    base = fitted.base_model
    enc = tok(stories_prompts(3), return_tensors="pt", padding=True)
    assert (enc["attention_mask"] == 0).any()  # a real left-padded batch
    ref = base.generate(**enc, do_sample=False, max_new_tokens=96, pad_token_id=tok.pad_token_id)
    out = fitted.generate(enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=96,
                          pad_token_id=tok.pad_token_id, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)  # padding of finished rows included
    one = fitted.generate(enc["input_ids"][2:], max_new_tokens=96, return_dict_in_generate=True)
    ref1 = base.generate(enc["input_ids"][2:], do_sample=False, max_new_tokens=96)
    assert torch.equal(one.sequences, ref1)
    assert out.tokens_per_step > 1.8 and one.tokens_per_step > 1.8, (out.tokens_per_step, one.tokens_per_step)


def test_cli_generate_prints_text_and_tokens_per_step(fitted, tmp_path, capsys):
    heads = tmp_path / "heads"
    fitted.save_pretrained(heads)
    prompt = stories_prompts(1)[0]
    assert main(["generate", "--heads", str(heads), "--prompt", prompt, "--max-new-tokens", "40"]) == 0
    text = capsys.readouterr().out
    tok = _tokenizer()
    ids = tok(prompt, return_tensors="pt").input_ids
    ref = fitted.base_model.generate(ids, do_sample=False, max_new_tokens=40)
    assert tok.decode(ref[0], skip_special_tokens=True) in text
    assert "tokens/step" in text
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": prompt}) + "\n" + json.dumps({"turns": ["Tom had a"]}) + "\n")
    assert main(["generate", "--heads", str(heads), "--prompts", str(prompts), "--max-new-tokens", "8",
                 "--acceptance", "sample", "--seed", "0", "--stream"]) == 0
    out = capsys.readouterr().out
    assert "Tom had a" in out and "all prompts" in out


def test_cli_generate_user_errors(fitted, tmp_path, capsys):
    heads = tmp_path / "heads"
    fitted.save_pretrained(heads)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "ok"}) + "\n{oops\n")
    assert main(["generate", "--heads", str(heads), "--prompts", str(bad)]) == 2
    assert f"{bad}:2" in capsys.readouterr().err
    assert main(["generate", "--heads", str(heads), "--prompt", "hi", "--chat"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("error: --chat") and "chat template" in err
    assert main(["generate", "--heads", str(tmp_path / "missing"), "--prompt", "hi"]) == 2
    assert "missing" in capsys.readouterr().err
    assert STORIES.exists()


def test_fitted_heads_with_generation_config_processors(fitted):
    """Qwen-style repetition_penalty plus no_repeat_ngram_size in the generation_config: still HF's exact
    output (whole tensors, padding of finished rows included) with long accepted runs."""
    tok = _tokenizer()
    base = fitted.base_model
    enc = tok(stories_prompts(3), return_tensors="pt", padding=True)
    saved = {k: getattr(base.generation_config, k) for k in ("repetition_penalty", "no_repeat_ngram_size",
                                                               "pad_token_id")}
    base.generation_config.repetition_penalty = 1.05
    base.generation_config.no_repeat_ngram_size = 4
    base.generation_config.pad_token_id = None  # HF then pads finished rows with the EOS id
    try:
        plain_ref = base.generate(**enc, do_sample=False, max_new_tokens=96, repetition_penalty=1.0,
                                  no_repeat_ngram_size=0)
        ref = base.generate(**enc, do_sample=False, max_new_tokens=96)
        assert not torch.equal(ref, plain_ref)  # the processors change this model's output
        out = fitted.generate(enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=96,
                              return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref)
        one = fitted.generate(enc["input_ids"][2:], max_new_tokens=96, return_dict_in_generate=True)
        assert torch.equal(one.sequences, base.generate(enc["input_ids"][2:], do_sample=False,
                                                        max_new_tokens=96))
        assert max(max(a) for a in out.accept_lengths) >= 4
        assert out.tokens_per_step > 1.5, out.tokens_per_step
    finally:
        for key, value in saved.items():
            setattr(base.generation_config, key, value)


def test_cli_generate_hydra_with_dynamic_tree(hydra, tmp_path, capsys):
    heads = tmp_path / "hydra"
    hydra.save_pretrained(heads)
    prompt = stories_prompts(1)[0]
    assert main(["generate", "--heads", str(heads), "--prompt", prompt, "--max-new-tokens", "40",
                 "--tree", "dynamic", "--nodes", "16"]) == 0
    text = capsys.readouterr().out
    tok = stories_tokenizer()
    ids = tok(prompt, return_tensors="pt").input_ids
    ref = hydra.base_model.generate(ids, do_sample=False, max_new_tokens=40)
    assert tok.decode(ref[0], skip_special_tokens=True) in text and "tokens/step" in text
    assert main(["generate", "--heads", str(heads), "--prompt", prompt, "--nodes", "16"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: --nodes")
