"""The same heads without their draft vocabulary: what restricting shared-LM-head heads to N tokens costs
them, measured without training anything.

Heads of ``head_type="shared_lm_head"`` own only their ResBlocks; their logits are the base LM head's rows
(the draft vocabulary's N rows, or all V). The *full-vocabulary twin* keeps the trained ResBlocks and
projects on all V rows, so it can propose every token the draft heads cannot. Calibrating both on the same
held-out data at the same node count gives each its own best tree, and ``1 - draft / twin`` is the
tokens/step the draft vocabulary loses for these heads.

Caveat, stated with the figure: the twin's ResBlocks were trained against the draft softmax, so nothing
pushed its out-of-vocabulary logits down or up; heads trained on the full vocabulary could rank those
tokens better (or worse). :func:`medusa.calibrate.calibrate.draft_vocab_loss` gives the matching upper
bound (every out-of-vocabulary target guessed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from medusa.calibrate.calibrate import calibrate
from medusa.errors import MedusaError
from medusa.modeling.model import MedusaModel


def full_vocab_twin(model: Any) -> MedusaModel:
    """``model``'s shared-LM-head heads over the full vocabulary (same ResBlocks, same base, eval mode)."""
    cfg = model.config
    if cfg.head_type != "shared_lm_head" or getattr(model.heads, "token_map", None) is None:
        n = getattr(model.heads, "draft_vocab", 0)
        raise MedusaError("a full-vocabulary twin needs shared_lm_head heads with a draft vocabulary, got "
                          f"head_type={cfg.head_type!r}, draft_vocab={n}")
    twin = MedusaModel.from_base(model.base_model, num_heads=model.num_heads, num_layers=cfg.num_layers,
                                 head_type="shared_lm_head", heads_dtype=next(model.heads.parameters()).dtype)
    state = {k: v for k, v in model.heads.state_dict().items() if k != "token_map"}
    twin.heads.load_state_dict(state)
    return twin.eval()


def draft_vs_full_vocab(model: Any, examples: Sequence[dict], nodes: int, progress: bool = True,
                        draft: dict[str, Any] | None = None) -> dict[str, Any]:
    """Calibrated tokens/step at ``nodes`` nodes of the draft heads and of their full-vocabulary twin, and
    ``lost = 1 - draft / full`` (negative: the twin does worse). ``draft``: the draft heads' calibration on
    the same ``examples`` at ``nodes`` nodes when already made (its ``expected_tokens_per_step`` and
    ``top1``); else they are calibrated here."""
    if draft is None:
        draft = calibrate(model, examples, nodes=nodes, progress=progress).calibration
    full = calibrate(full_vocab_twin(model), examples, nodes=nodes, progress=progress).calibration
    d, f = draft["expected_tokens_per_step"], full["expected_tokens_per_step"]
    return {"nodes": nodes, "draft_tokens_per_step": d, "full_vocab_tokens_per_step": f, "lost": 1 - d / f,
            "draft_top1": draft["top1"], "full_vocab_top1": full["top1"],
            "draft_vocab": int(model.heads.token_map.shape[0])}


__all__ = ["draft_vs_full_vocab", "full_vocab_twin"]
