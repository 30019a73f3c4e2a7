"""docs/design.md's one-token path is the code's: the modules its ``step:medusa`` / ``step:eagle3`` blocks
name (first column) are exactly the medusa modules whose code runs during a greedy decode step of MEDUSA
heads / the EAGLE-3 drafter (traced with ``sys.setprofile``). A module the step enters or leaves without the
doc changing fails here, and so does a doc naming a module the step does not cross."""

import re
import sys
from pathlib import Path

import pytest
import torch

import medusa.decoding.step as step_module
from medusa import MedusaModel
from medusa.tree import DraftTreeShape

from tiny_models import tiny_model

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"


def documented(kind: str, text: str | None = None) -> set[str]:
    """The modules (``decoding/step.py`` style) in the first column of the ``step:<kind>`` block."""
    text = DESIGN.read_text() if text is None else text
    block = re.search(rf"```step:{kind}\n(.*?)```", text, re.S)
    assert block, f"docs/design.md has no ```step:{kind} block"
    return {line.split()[0] for line in block.group(1).splitlines() if re.match(r"[a-z_]+/\w+\.py\b", line)}


def traced(head_type: str, tree, monkeypatch) -> set[str]:
    """The medusa modules whose functions run during the greedy steps of a short generate call."""
    base = tiny_model("llama", layers=4, seed=2)
    model = MedusaModel.from_base(base, num_heads=3, head_type=head_type).eval()
    seen: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("medusa."):
                seen.add(name)

    real = step_module.step

    def step(*args, **kwargs):
        sys.setprofile(profile)
        try:
            return real(*args, **kwargs)
        finally:
            sys.setprofile(None)

    with monkeypatch.context() as patch:
        patch.setattr(step_module, "step", step)  # decode_loop looks ``step`` up in its module at each call
        ids = torch.randint(3, 96, (1, 5), generator=torch.Generator().manual_seed(0))
        model.generate(ids, max_new_tokens=4, tree=tree, eos_token_id=[])
    return {name.removeprefix("medusa.").replace(".", "/") + ".py" for name in seen}


@pytest.mark.parametrize("kind, head_type, tree", [("medusa", "linear", None),
                                                   ("eagle3", "eagle3", DraftTreeShape(6, 3, 2, 2))])
def test_the_documented_step_is_the_traced_step(kind, head_type, tree, monkeypatch):
    doc, run = documented(kind), traced(head_type, tree, monkeypatch)
    assert doc == run, f"named, not crossed: {sorted(doc - run)}; crossed, not named: {sorted(run - doc)}"


def test_a_doc_missing_a_module_fails(monkeypatch):
    """The comparison can fail: the same doc with one module line removed no longer matches the trace."""
    text = DESIGN.read_text()
    cut = re.sub(r"\ndecoding/acceptance\.py[^\n]*", "\n", text)
    assert documented("medusa", cut) != documented("medusa")
    assert "decoding/acceptance.py" in traced("linear", None, monkeypatch) - documented("medusa", cut)
