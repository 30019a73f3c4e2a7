"""The shared assets the suite relies on are present (a failure in CI, a skip elsewhere)."""

from tiny_models import SHARED, STORIES, require_shared


def test_shared_assets_present():
    require_shared(SHARED)
    for rel in ["data/tinystories_sample.txt", "data/mt_bench_questions.jsonl",
                "data/sharegpt_dummy_conversation.json", "data/alpaca_5000.json"]:
        assert (SHARED / rel).is_file(), rel
    assert (STORIES / "model.safetensors").is_file()
