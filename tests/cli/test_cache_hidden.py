"""``medusa cache-hidden`` (medusa/cli/cache_hidden.py) on a three-row recipe over stories260K: the cache it
reports is the one on disk, in the dtype asked, holding every token of the recipe's data; a second run writes
nothing. (The tiny recipe's cache used by training: tests/training/test_hidden_cache.py.)"""

from __future__ import annotations

import json

from medusa.cli import main
from medusa.data import load_tokenized

from tiny_models import STORIES, require_shared, stories_tokenizer

ROWS = [{"prompt": "Once upon a time", "completion": " there was a cat."},
        {"prompt": "Tom had", "completion": " a big red ball and a dog."},
        {"prompt": "The sun", "completion": " was hot."}]


def test_cache_hidden_writes_the_recipe_cache_once(tmp_path, capsys):
    require_shared(STORIES)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {STORIES}\ndtype: float32\nheads: {{num_heads: 2}}\n"
                      f"data: {{train: {data}, format: prompt_completion, max_length: 64, eval_split: 0.0}}\n"
                      f"train: {{max_steps: 1, batch_size: 2}}\noutput_dir: {tmp_path / 'run'}\n")
    cache = tmp_path / "cache"
    argv = ["cache-hidden", str(recipe), f"train.hidden_cache={cache}", "--dtype", "float32"]
    assert main(argv) == 0
    tokens = sum(len(ex["input_ids"]) for ex in load_tokenized(str(data), stories_tokenizer(), 64).examples)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"hidden cache {cache} complete: 3 examples, {tokens} tokens, 1 shard(s), float32"
    index = json.loads((cache / "cache.json").read_text())
    assert (index["num_examples"], index["num_tokens"], index["dtype"]) == (3, tokens, "float32")
    written = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert main(argv) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == last
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == written  # nothing rewritten
