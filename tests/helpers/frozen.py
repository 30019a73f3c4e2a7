"""Frozen means every weight: a snapshot of every tensor a run must not change, taken by the training loop's
own ``setup_model`` just before the first step, and an exact comparison with the same tensors at the end.

The snapshot is the whole ``MedusaModel.state_dict()`` (the backbone and the heads: parameters of every
dtype, 4-bit packed weights and their quantisation states, buffers) minus the tensors the run is meant to
train, chosen by name and identity (:func:`heads_only`, :func:`heads_and_lora`) — not by ``requires_grad``,
so a parameter wrongly left trainable (an input embedding, say) is still held to its starting value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

Trained = Callable[[Any, str, torch.Tensor], bool]  # (model, state_dict name, tensor) -> meant to train


def heads_only(model: Any, name: str, tensor: torch.Tensor) -> bool:
    """MEDUSA-1: only the heads' own parameters train (not their buffers, nor the base's LM head or input
    embedding that Hydra heads read)."""
    return isinstance(tensor, torch.nn.Parameter) and any(tensor is p for p in model.heads.parameters())


def heads_and_lora(model: Any, name: str, tensor: torch.Tensor) -> bool:
    """MEDUSA-2 with (Q)LoRA: the heads' parameters and the LoRA adapters."""
    return heads_only(model, name, tensor) or ".lora_" in name


def frozen_state(model: Any, trained: Trained) -> dict[str, torch.Tensor]:
    """Clones of every tensor of ``model.state_dict()`` that ``trained`` does not claim."""
    state = model.state_dict(keep_vars=True)
    return {n: t.detach().cpu().clone() for n, t in state.items() if not trained(model, n, t)}


@dataclass
class FrozenRecord:
    """Per training run: the frozen tensors at set-up and the same tensors when ``final/`` is about to be
    written (before MEDUSA-2 merges its adapters into the backbone)."""

    before: list[dict[str, torch.Tensor]] = field(default_factory=list)
    after: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def assert_unchanged(self, run: int = 0) -> None:
        """Every tensor snapshotted at set-up is there at the end, bit for bit (``torch.equal``)."""
        before, after = self.before[run], self.after[run]
        assert before and set(before) == set(after), sorted(set(before) ^ set(after))[:5]
        changed = [n for n, t in before.items() if not torch.equal(after[n], t)]
        assert not changed, f"frozen tensors changed: {changed[:8]}"


def record_frozen(monkeypatch: Any, trained: Trained) -> FrozenRecord:
    """Wrap ``medusa.training.session``'s ``setup_model`` (snapshot after set-up, before any optimizer step)
    and ``medusa.training.output``'s ``save_final`` (the same names again, before the final save)."""
    import medusa.training.output as output
    import medusa.training.session as session

    record = FrozenRecord()
    setup, save = session.setup_model, output.save_final

    def recording_setup(*args: Any, **kwargs: Any) -> Any:
        out = setup(*args, **kwargs)
        record.before.append(frozen_state(out[0], trained))
        return out

    def recording_save(run: Any, *args: Any, **kwargs: Any) -> Any:
        state = run.model.state_dict()
        names = record.before[len(record.after)]
        record.after.append({n: state[n].detach().cpu().clone() for n in names if n in state})
        return save(run, *args, **kwargs)

    monkeypatch.setattr(session, "setup_model", recording_setup)
    monkeypatch.setattr(output, "save_final", recording_save)
    return record
