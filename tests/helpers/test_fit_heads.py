"""The fitted-heads fixture really produces heads that predict the model's own continuation."""

import torch

from fit_heads import fitted_stories_heads, stories_prompts
from tiny_models import stories_tokenizer


def test_fitted_heads_predict_own_outputs():
    model = fitted_stories_heads(num_heads=4)
    tok = stories_tokenizer()
    prompt = stories_prompts(1)[0]
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        seq = model.base_model.generate(ids, max_new_tokens=48, do_sample=False, min_new_tokens=48)
        out = model(input_ids=seq)
    cont = seq[0]
    start = ids.shape[1]
    hits = []
    for k in range(4):
        pred = out.head_logits[k, 0].argmax(-1)  # [T]
        t = torch.arange(start, seq.shape[1] - k - 2)
        hits.append((pred[t] == cont[t + k + 2]).float().mean().item())
    # head 1 must beat chance by far; deeper heads are less accurate
    assert hits[0] > 0.5, hits
    print(hits)


def test_cache_key_changes_with_every_input(tmp_path):
    from fit_heads import FIT_ARGS, cache_key, code_files

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    (model / "model.safetensors").write_bytes(b"\x00" * 64)
    (model / "sub").mkdir()  # directories are not read (from_pretrained reads the top-level files)
    code = tmp_path / "fit.py"
    code.write_text("steps = 800\n")
    prompts = ["Once upon a time", "The cat sat"]
    args = {**FIT_ARGS, "num_heads": 4, "num_layers": 1}

    def key() -> str:
        return cache_key(model, prompts, args, [code])

    seen = {key()}
    assert key() in seen  # deterministic

    def changed(what: str) -> None:
        k = key()
        assert k not in seen, f"the key ignores a change of {what}"
        seen.add(k)

    (model / "model.safetensors").write_bytes(b"\x00" * 63 + b"\x01")  # same size, other weights
    changed("the weights")
    (model / "config.json").write_text('{"hidden_size": 9}')
    changed("the model config")
    (model / "tokenizer.json").write_text("{}")
    changed("a new model file")
    code.write_text("steps = 801\n")
    changed("the fitting code")
    prompts[1] = "The dog sat"
    changed("the prompts")
    prompts.append("A third one")
    changed("the number of prompts")
    for name, value in (("num_heads", 3), ("num_layers", 2), ("steps", 10), ("lr", 0.5), ("seed", 1),
                        ("new_tokens", 12)):
        args[name] = value
        changed(f"the argument {name}")
    assert len(seen) == 13  # the first key and one per change

    files = code_files()
    assert files[0].name == "fit_heads.py" and files[0].is_file()  # its own source is part of the key
    assert any(p.name == "heads.py" for p in files)  # and the heads' code
