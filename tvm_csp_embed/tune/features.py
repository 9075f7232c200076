"""Features of knob points for the XGBoost cost model.

A point's feature vector is

* its knob values (``log2(1 + v)``; booleans 0/1), in the knob space's order;
* the workload's fields (``log2(1 + v)``), the same for every point of a task, so that a model can
  be shared between tasks;
* where the strategy's template has an analytic model, its estimates for the point: the modelled
  DRAM bytes per counter, the estimated instructions, the scratchpad entries and the micro-ops
  (``log2(1 + v)``). The stock GEMM templates have one (:func:`vta_ext.templates.tiling.evaluate`);
  other strategies register theirs with :func:`register_estimator`.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["register_estimator", "estimator_for", "point_features", "space_features"]

Estimator = Callable[[Any, Any, Sequence[tuple], Dict[str, Any]], Optional[Dict[str, float]]]
_ESTIMATORS: Dict[Tuple[str, str], Estimator] = {}


def register_estimator(kind: str, strategy: str, fn: Estimator) -> None:
    """Register ``fn(config, workload, epilogue, knobs) -> {name: value}`` (or None) as the
    analytic model of ``(kind, strategy)`` points."""
    _ESTIMATORS[(kind, strategy)] = fn


def estimator_for(kind: str, strategy: str) -> Optional[Estimator]:
    """The analytic model registered for ``(kind, strategy)`` points, or None."""
    return _ESTIMATORS.get((kind, strategy))


def _log(v: float) -> float:
    return math.log2(1.0 + max(0.0, float(v)))


def _stock_gemm(config, workload, epilogue, knobs) -> Optional[Dict[str, float]]:
    from vta_ext.templates import tiling

    choice = tiling.evaluate(config, workload, epilogue, knobs_type(workload)(**knobs))
    if not isinstance(choice, tiling.TilingChoice):
        return None
    values = dict(choice.bytes)
    values["total_bytes"] = choice.total_bytes
    values["insns"] = choice.insns
    values["uops"] = choice.uops
    values.update({f"sram_{k}": v for k, v in choice.sram.items()})
    return values


def knobs_type(workload):
    """The stock knob dataclass of a GEMM workload."""
    from vta_ext.templates.knobs import Conv2dKnobs, DenseKnobs
    from vta_ext.templates.workload import DenseWorkload

    return DenseKnobs if isinstance(workload, DenseWorkload) else Conv2dKnobs


for _kind in ("conv2d", "group_conv2d", "dense"):
    register_estimator(_kind, "stock", _stock_gemm)


def point_features(task, knobs: Dict[str, Any]) -> List[float]:
    """The feature vector of one point of ``task`` (module docstring)."""
    names = task.knob_space.names
    feats = [_log(knobs[n]) for n in names]
    feats += [_log(v) for v in task.workload_dict.values() if isinstance(v, (int, float))]
    estimator = estimator_for(task.kind, task.strategy)
    if estimator is not None:
        est = estimator(task.config, task.workload, task.epilogue, knobs) or {}
        feats += [_log(est[k]) for k in sorted(est)]
    return feats


def space_features(task) -> np.ndarray:
    """Features of every valid point of ``task``'s knob space, one row each (float32)."""
    rows = [point_features(task, p) for p in task.knob_space.points]
    width = max((len(r) for r in rows), default=0)
    return np.array([r + [0.0] * (width - len(r)) for r in rows], dtype=np.float32)
