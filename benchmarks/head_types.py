"""The head-type rows of the benchmark pipelines (on by default, ``--no-hydra`` skips them).

After the MEDUSA-1 bench, at the node budget MEDUSA-1's calibration chose (N nodes, root included):

1. ``hydra_train``: the MEDUSA-1 recipe with ``heads.head_type=hydra`` (and the same projection: the
   base LM head when MEDUSA-1's heads share it; then the user's ``--set`` overrides), on the same data;
2. ``hydra_calibrate``: the Hydra heads' accuracy-ranked tree of N nodes;
3. ``hydra_bench``: benchmarked like MEDUSA-1;
4. ``dynamic_bench``: the MEDUSA-1 heads with the dynamic tree of N nodes
   (:class:`medusa.decoding.tree_option.DynamicTreeOption`, as ``medusa bench --tree dynamic --nodes N``);
5. ``hydra_dynamic_bench``: the Hydra heads with the same dynamic tree.

The rows, the tokens/step ratios and the fastest (heads, tree) land in ``summary["head_types"]``
(:func:`benchmarks.stages.head_type_rows`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import stages as S
from medusa.decoding.tree_option import DynamicTreeOption

# (heads dir, report path, tree: None for the checkpoint's tree.json, or a DynamicTreeOption) -> bench summary
BenchFn = Callable[[Path, Path, Any], dict[str, Any]]
STAGES = ("hydra_train", "hydra_calibrate", "hydra_bench", "dynamic_bench", "hydra_dynamic_bench")


@dataclass(frozen=True)
class HeadTypePlan:
    """Where the head-type stages read and write.

    ``overrides``: the MEDUSA-1 recipe's pipeline overrides (``model=``, ``data.train=``, ...) with
    ``output_dir=`` the Hydra training directory; ``user_overrides`` (``--set``) come after
    ``heads.head_type=hydra``. ``reports``: report paths for ``hydra``, ``dynamic`` and ``hydra_dynamic``.
    """

    recipe: str
    overrides: tuple[str, ...]
    user_overrides: tuple[str, ...]
    calib_data: Path
    medusa1_final: Path
    hydra_final: Path
    reports: dict[str, Path]
    timing_threads: int | None = None
    progress: bool = True


def hydra_overrides(plan: HeadTypePlan) -> list[str]:
    """The Hydra recipe overrides: the pipeline's, ``heads.head_type=hydra`` (with
    ``heads.hydra_projection=shared_lm_head`` when the MEDUSA-1 heads share the base LM head, so both head
    types project the same way), then the user's."""
    import yaml

    head_type = ((yaml.safe_load(Path(plan.recipe).read_text()) or {}).get("heads") or {}).get("head_type")
    for item in plan.overrides:
        if item.startswith("heads.head_type="):
            head_type = item.split("=", 1)[1]
    shared = ["heads.hydra_projection=shared_lm_head"] if head_type == "shared_lm_head" else []
    return [*plan.overrides, "heads.head_type=hydra", *shared, *plan.user_overrides]


def run_head_types(root: Path, plan: HeadTypePlan, medusa1: dict[str, Any], bench: BenchFn,
                   log: Any = print) -> dict[str, Any]:
    """The five stages; ``medusa1``: the MEDUSA-1 ``calibrate`` and ``bench`` stage summaries. Returns
    ``{"hydra": {train, calibrate, bench, dynamic_bench, hydra_dynamic_bench}, "head_types": rows}``."""

    nodes = int(medusa1["calibrate"]["nodes"])
    trained = S.run_stage(root, "hydra_train", lambda: S.train_recipe(
        plan.recipe, hydra_overrides(plan), progress=plan.progress), log)
    dynamic = DynamicTreeOption(nodes)  # the same node budget, root included (as len(MedusaTree))
    with S.torch_threads(plan.timing_threads):
        calibrated = S.run_stage(root, "hydra_calibrate", lambda: S.calibrate_stage(
            trained["final_dir"], plan.hydra_final, plan.calib_data, nodes=nodes, progress=plan.progress),
                                 log)
        hydra = S.run_stage(root, "hydra_bench", lambda: bench(plan.hydra_final, plan.reports["hydra"], None),
                            log)
        m1_dynamic = S.run_stage(root, "dynamic_bench", lambda: bench(
            plan.medusa1_final, plan.reports["dynamic"], dynamic), log)
        hydra_dynamic = S.run_stage(root, "hydra_dynamic_bench", lambda: bench(
            plan.hydra_final, plan.reports["hydra_dynamic"], dynamic), log)
    rows = S.head_type_rows([("medusa1", "static", nodes, medusa1["bench"]),
                             ("hydra", "static", calibrated["nodes"], hydra),
                             ("medusa1", "dynamic", nodes, m1_dynamic),
                             ("hydra", "dynamic", nodes, hydra_dynamic)])
    return {"hydra": {"train": trained, "calibrate": calibrated, "bench": hydra, "dynamic_bench": m1_dynamic,
                      "hydra_dynamic_bench": hydra_dynamic},
            "head_types": {"nodes": nodes, **rows}}


__all__ = ["BenchFn", "HeadTypePlan", "STAGES", "hydra_overrides", "run_head_types"]
