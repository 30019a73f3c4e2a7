import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The test models are tiny: one intra-op thread per process is as fast, and it keeps subprocesses
# (accelerate launches, servers) from oversubscribing the 2 cores CI has.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))  # tests/helpers: shared test code


@pytest.fixture
def tiny_recipe_env(monkeypatch):
    """For tests that run the tiny recipes on stories260K: the model must be present, paths in the recipes
    are relative to the repository root, and the tiny model is fastest on one torch thread."""
    from tiny_models import STORIES, require_shared

    require_shared(STORIES)
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def stories_medusa():
    """stories260K with 4 heads fitted on its own greedy outputs (shared with the decoding tests): their
    tree paths are accepted, so the greedy checks cover accepted runs, not only the root."""
    from fit_heads import fitted_stories_heads

    return fitted_stories_heads(num_heads=4, num_layers=1)



def _file(item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_modifyitems(items):
    """Files marked ``heavy(seconds)`` first, the longest first (the rest in collection order): ``make test``
    runs the files on two pytest-xdist workers (``--dist loadfile``: a file's tests and module fixtures on
    one worker), and a file of minutes started last would leave one worker running it alone at the end."""
    weight: dict[str, float] = {}
    for item in items:
        marker = item.get_closest_marker("heavy")
        weight[_file(item)] = max(weight.get(_file(item), 0.0), float(marker.args[0]) if marker else 0.0)
    items.sort(key=lambda item: -weight[_file(item)])  # stable: a file's own order is kept
