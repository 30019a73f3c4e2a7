"""What one MEDUSA step costs against a plain decode step, split into what MEDUSA can and cannot change.

- ``verify_floor``: the base model's forward over the tree's N tokens (with the tree mask, exactly as the
  decode step calls it) against its 1-token forward, both over the same KV cache, timed interleaved. Their
  ratio is the overhead a MEDUSA step cannot go below with this model's forward on this device: the rest
  of the step (heads, acceptance, cache compaction, the host sync) only adds to it.
- ``step_op_counts``: the compute operators (aten ops that are not views or allocations) one MEDUSA step
  issues against one token of HF ``generate``. Counts do not depend on the machine's load; where a step is
  launch-bound (small batches on a GPU) they predict the fixed part of the overhead.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from medusa.decoding.hf import cache_kwargs
from medusa.decoding.kv_cache import new_cache
from medusa.decoding.trees import static_tree
from medusa.eval.timing import timed

T = TypeVar("T")

# aten ops that move no data through a kernel of their own (views, metadata, allocations)
_NOT_COMPUTE = frozenset({
    "aten::view", "aten::as_strided", "aten::slice", "aten::select", "aten::transpose", "aten::t",
    "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::reshape", "aten::_unsafe_view",
    "aten::narrow", "aten::_reshape_alias", "aten::permute", "aten::detach", "aten::detach_",
    "aten::alias", "aten::lift_fresh", "aten::empty", "aten::empty_strided", "aten::empty_like",
    "aten::resolve_conj", "aten::resolve_neg", "aten::item", "aten::_local_scalar_dense",
    "aten::is_nonzero", "aten::to", "aten::_to_copy",
})


@torch.no_grad()
def verify_floor(model: Any, input_ids: torch.Tensor, tree: Any, repeats: int = 50) -> dict[str, float]:
    """Median seconds of the verification forward over ``tree``'s N nodes and of a 1-token forward, timed
    alternately over the prompt's KV cache (``input_ids [1, P]``), and their ratio (``floor``)."""

    base, device = model.base_model, model.device
    dtype = next(p for p in base.parameters() if p.is_floating_point()).dtype
    dt = static_tree(tree, device, dtype)
    p, n = input_ids.shape[1], dt.num_nodes
    cache = new_cache()
    base(input_ids=input_ids, use_cache=True, **cache_kwargs(cache))
    one = input_ids[:, -1:]  # [1, 1]
    tokens = input_ids[:, -1:].expand(1, n).contiguous()  # [1, N]: the values do not change the cost
    mask = torch.zeros(1, 1, n, p + n, dtype=dtype, device=device)  # [1, 1, N, P + N]
    mask[0, 0, :, p:] = dt.float_mask
    tree_pos = (p + dt.depths).view(1, n)
    calls = {  # name: (call, tokens it writes to the cache)
        "plain": (lambda: base(input_ids=one, use_cache=True, **cache_kwargs(cache),
                               position_ids=torch.tensor([[p]], device=device)), 1),
        "verify": (lambda: model(input_ids=tokens, attention_mask=mask, position_ids=tree_pos,
                                 past_key_values=cache, use_cache=True, compute_heads=False), n),
    }
    seconds: dict[str, list[float]] = {"plain": [], "verify": []}
    for i in range(repeats + 2):  # two rounds of warm-up
        for name, (call, written) in calls.items():
            _, s = timed(call, device)
            cache.crop(-written)  # back to the prompt (transformers 5: a negative count)
            if i >= 2:
                seconds[name].append(s)
    plain, verify = statistics.median(seconds["plain"]), statistics.median(seconds["verify"])
    return {"tree_nodes": n, "plain_forward_ms": 1e3 * plain, "verify_forward_ms": 1e3 * verify,
            "floor": verify / plain}


def compute_ops(fn: Callable[[], T]) -> tuple[T, Counter]:
    """``fn()``'s result and the top-level compute aten ops it issued (profiled on the CPU side), by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = fn()
    ops: Counter = Counter()
    for event in prof.events():
        parent = event.cpu_parent
        if not event.name.startswith("aten::") or (parent is not None and parent.name.startswith("aten::")):
            continue
        if event.name not in _NOT_COMPUTE:
            ops[event.name] += 1
    return result, ops


@torch.no_grad()
def step_op_counts(model: Any, input_ids: torch.Tensor, max_new_tokens: int = 64, tree: Any = None
                   ) -> dict[str, Any]:
    """Compute ops per MEDUSA step (prefill included, spread over the steps) and per token of HF greedy
    ``generate`` on the same prompt ``[1, P]``, and the ops MEDUSA adds beyond the base forward."""
    base = model.base_model
    model.generate(input_ids, max_new_tokens=4, tree=tree, lookup_tokens=0)  # warm-up: not counted
    base.generate(input_ids, max_new_tokens=4, do_sample=False)
    out, medusa = compute_ops(lambda: model.generate(input_ids, max_new_tokens=max_new_tokens, tree=tree,
                                                     lookup_tokens=0, return_dict_in_generate=True))
    ref, hf = compute_ops(lambda: base.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False))
    hf_new = ref.shape[1] - input_ids.shape[1]
    steps = max(out.num_steps, 1)
    per_step = {k: v / steps for k, v in medusa.items()}
    per_token = {k: v / hf_new for k, v in hf.items()}
    names = set(per_step) | set(per_token)
    added = {k: round(per_step.get(k, 0.0) - per_token.get(k, 0.0), 1) for k in names}
    return {"medusa_ops_per_step": sum(per_step.values()), "hf_ops_per_token": sum(per_token.values()),
            "added_ops": dict(sorted(((k, v) for k, v in added.items() if abs(v) >= 0.5),
                                     key=lambda kv: -kv[1]))}


__all__ = ["compute_ops", "step_op_counts", "verify_floor"]
