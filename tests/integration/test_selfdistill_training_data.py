"""Self-distilled rows are training data: both output shapes (chat and completion) load with
``medusa.data.load_tokenized``, format auto-detected, every example with labelled tokens."""

from __future__ import annotations

from selfdistill_helpers import chat_tokenizer, tiny_chat_model
from selfdistill_helpers import local_config as _cfg
from selfdistill_helpers import write_prompts as _write_prompts

from medusa.selfdistill import self_distill


def test_output_is_training_data_for_load_tokenized(tmp_path):
    """Both output shapes load with ``medusa.data.load_tokenized`` (format auto-detected)."""
    from medusa.data import IGNORE_INDEX, load_tokenized
    _write_prompts(tmp_path, [{"turns": ["Hi there", "And then?"]}, {"prompt": "Tell a story."}])
    tok = chat_tokenizer()
    self_distill(_cfg(tmp_path, mode="replay"), model=tiny_chat_model(), tokenizer=tok)
    self_distill(_cfg(tmp_path, mode="completion", out=str(tmp_path / "c.jsonl")), model=tiny_chat_model(),
                 tokenizer=tok)
    for name, n in (("out.jsonl", 2), ("c.jsonl", 2)):
        data = load_tokenized(str(tmp_path / name), tok, max_length=256)
        assert len(data.examples) == n and not data.skipped
        assert all(any(x != IGNORE_INDEX for x in ex["labels"]) for ex in data.examples)
