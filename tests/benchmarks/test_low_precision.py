"""Low-precision greedy fidelity: float32 is identical; a divergence is located and its margin measured."""

import torch

from benchmarks.low_precision import divergence, greedy_identity

from fit_heads import fitted_stories_heads, stories_prompts
from tiny_models import stories_tokenizer, tiny_model


def test_float32_is_identical_and_the_control_too():
    model = fitted_stories_heads(4, 1)
    r = greedy_identity(model, stories_tokenizer(), stories_prompts(2), 32)
    assert r["dtype"] == "float32" and r["prompts"] == 2
    assert r["identical_share"] == 1.0 and r["hf_no_cache_identical_share"] == 1.0
    assert all(row["identical"] for row in r["rows"])


def test_divergence_names_the_first_differing_token_and_the_margin():
    base = tiny_model("llama").eval()
    prompt = torch.tensor([[5, 6, 7]])  # [1, P]
    theirs = base.generate(prompt, max_new_tokens=6, do_sample=False)  # [1, P + 6]
    ours = theirs.clone()
    ours[0, 3 + 4] = (ours[0, 3 + 4] + 1) % base.config.vocab_size  # diverge at the 5th new token
    d = divergence(base, prompt, ours, theirs)
    logits = base(input_ids=theirs[:, :3 + 4]).logits[0, -1]
    top = logits.topk(2).values
    assert d["identical"] is False and d["first_difference"] == 4
    assert d["theirs"] == int(theirs[0, 7]) and d["ours"] == int(ours[0, 7])
    assert abs(d["margin"] - float(top[0] - top[1])) < 1e-6
    assert divergence(base, prompt, theirs, theirs.clone()) == {"identical": True}


def test_cli_prints_and_writes_the_report(tmp_path, capsys):
    import json

    from benchmarks.low_precision import main

    fitted_stories_heads(4, 1).save_pretrained(tmp_path / "heads")
    prompts = tmp_path / "p.txt"
    prompts.write_text("Once upon a time\nTom had a red ball\n")
    assert main(["--heads", str(tmp_path / "heads"), "--prompts", str(prompts), "--dtypes", "float32",
                 "--max-new-tokens", "16", "--out", str(tmp_path / "r.json")]) == 0
    assert "float32: MEDUSA identical to HF on 2/2 prompts" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())[0]["identical_share"] == 1.0
