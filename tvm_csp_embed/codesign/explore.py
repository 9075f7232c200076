"""The co-design search: VTA configurations and the strategy's embeddings, evaluated together.

:func:`explore` searches a :class:`~.space.Space` for the Pareto front of cycles against the area
proxy (:mod:`.area`), for one module under one strategy. It is a search, not a grid:

1. every point of the space is validated by :class:`~vta_ext.config.VTAConfig` itself; the ones
   that do not exist are counted with the field at fault and never evaluated;
2. a first batch is spread over the range of areas (one random point per area stratum);
3. each further batch takes the unevaluated neighbours of the current front points (refinement;
   those whose lower bound is most promising first) and fills up with random points;
4. before every batch, a point whose lower bound (:mod:`.bound`) is no better than the cycles of
   an evaluated point of no more area is pruned: it cannot reach the front;
5. it stops after ``budget`` configurations (evaluated or answered from the records) or when no
   candidate is left.

Batches are fixed in size and decided only from completed batches, so for a given ``seed`` the
search visits the same configurations whatever runs the evaluations (this process, local
workers, a Dask cluster) and in whatever order they finish. Evaluations
(:func:`~.evaluate.evaluate_config`) are appended to the records as they arrive.
"""
from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from vta_ext.config import VTAConfig, available_configs, load_config

from .area import AREA_PROXY, AreaModel
from .bound import OperatorCost, lower_bound, matched_operators
from .evaluate import (Options, Records, default_records_path, evaluate_config, options_digest,
                       options_payload, save_module)
from .front import DesignPoint, Front, pareto
from .space import Point, Space

__all__ = ["explore", "BATCH_SIZE"]

logger = logging.getLogger("tvm_csp_embed.codesign")

#: configurations decided per round (independent of the runner, so the search is reproducible)
BATCH_SIZE = 4


def _error(i: int, why: str) -> Dict[str, Any]:
    return {"error": why, "seconds": 0.0}


def _shape(config: VTAConfig) -> Tuple[int, int, int]:
    return (config.BATCH, config.BLOCK_IN, config.BLOCK_OUT)


class _Search:
    """One strategy's search over the valid points of a space (see the module docstring)."""

    def __init__(self, mod_path: str, digest: str, ops: List[OperatorCost], space: Space,
                 valid: List[Point], strategy: str, runner, records: Records, area: AreaModel,
                 seed: int, batch_size: int, progress: bool, options: Options) -> None:
        self.mod_path, self.digest, self.ops = mod_path, digest, ops
        self.options, self.options_key = options, options_digest(options)
        self.space, self.strategy, self.runner, self.records = space, strategy, runner, records
        self.area_model, self.batch_size, self.progress = area, batch_size, progress
        self.rng = random.Random(seed)
        self.valid = valid
        self.configs = {p: space.config(p) for p in valid}
        self.area = {p: area.relative(c) for p, c in self.configs.items()}
        self.bound = {p: lower_bound(ops, c) for p, c in self.configs.items()}
        self.done: Dict[Point, Optional[DesignPoint]] = {}
        self.errors: List[Tuple[str, str]] = []
        self.evaluated = 0
        self.cached = 0
        self.shapes: set = set()  # GEMM shapes evaluated in this search (their solves are cached)

    # ---------------------------------------------------------------- evaluating
    def evaluate(self, configs: Sequence[VTAConfig], bar=None) -> List[Optional[DesignPoint]]:
        """Evaluate ``configs`` (records first); a failed one is None and listed in errors."""
        results: List[Optional[Dict[str, Any]]] = [None] * len(configs)
        todo = []
        for i, cfg in enumerate(configs):
            hit = self.records.get(self.digest, self.strategy, self.options_key, cfg)
            if hit is not None:
                results[i] = hit
                self.cached += 1
                if bar is not None:
                    bar.update(1)
            else:
                todo.append(i)
        # one scout per GEMM shape not evaluated yet runs first, alone with the other scouts: the
        # strategy's solves depend on the GEMM shape, and two workers starting on the same new
        # shape at once would both solve all its workloads (docs/codesign.md, "Solver work")
        scouts: Dict[Tuple[int, int, int], int] = {}
        for i in todo:
            shape = _shape(configs[i])
            if shape not in self.shapes and shape not in scouts:
                scouts[shape] = i
        first = sorted(scouts.values())
        for wave in (first, [i for i in todo if i not in first]):
            if wave:
                self._run(configs, wave, results, bar)
        points = []
        for cfg, result in zip(configs, results):
            if result.get("error"):
                self.errors.append((cfg.name, result["error"].splitlines()[0]))
                logger.warning("codesign: evaluating %s under %s failed: %s", cfg.name,
                               self.strategy, result["error"].splitlines()[0])
                points.append(None)
                continue
            bound = lower_bound(self.ops, cfg)
            if bound > result["cycles"] * (1 + 1e-9):
                logger.warning("codesign: the lower bound of %s (%.0f) exceeds its cycles (%.0f); "
                               "the bound is wrong", cfg.name, bound, result["cycles"])
            points.append(DesignPoint(cfg, float(result["cycles"]), self.area_model.relative(cfg),
                                      int(result["dram_bytes"]), False, int(result["vta_cycles"]),
                                      int(result["cpu_macs"]), tuple(result["cpu_ops"]), bound,
                                      float(result["seconds"])))
        return points

    def _run(self, configs: Sequence[VTAConfig], todo: List[int],
             results: List[Optional[Dict[str, Any]]], bar) -> None:
        jobs = [(self.mod_path, configs[i].to_dict(), configs[i].name, self.strategy, self.options)
                for i in todo]
        for j, result in self.runner.map(evaluate_config, jobs, _error):
            i = todo[j]
            results[i] = result
            self.records.add(self.digest, self.strategy, self.options_key, configs[i], result,
                             self.options)
            self.evaluated += 1
            self.shapes.add(_shape(configs[i]))
            if bar is not None:
                bar.update(1)

    # ---------------------------------------------------------------- choosing
    def _measured(self) -> List[DesignPoint]:
        return [p for p in self.done.values() if p is not None]

    def _pruned(self, point: Point, measured: List[DesignPoint]) -> bool:
        return any(q.area <= self.area[point] and q.cycles <= self.bound[point] for q in measured)

    def _initial(self) -> List[Point]:
        by_area = sorted(self.valid, key=lambda p: (self.area[p], p))
        n = min(self.batch_size, len(by_area))
        strata = [by_area[len(by_area) * k // n: len(by_area) * (k + 1) // n] for k in range(n)]
        return [self.rng.choice(s) for s in strata if s]

    def _next(self, k: int) -> List[Point]:
        measured = self._measured()
        open_ = [p for p in self.valid if p not in self.done and not self._pruned(p, measured)]
        if not open_:
            return []
        front = [p for p, dp in self.done.items() if dp is not None and dp.on_front]
        near = {n for p in front for n in self.space.neighbours(p)}
        refine = [p for p in open_ if p in near]

        def promise(p: Point) -> tuple:
            best = min((q.cycles for q in measured if q.area <= self.area[p]), default=None)
            return (self.bound[p] / best if best else 0.0, self.area[p], p)

        refine.sort(key=promise)
        chosen = refine[: max(1, k // 2)] if refine else []
        rest = [p for p in open_ if p not in chosen]
        self.rng.shuffle(rest)
        return chosen + rest[: k - len(chosen)]

    def run(self, budget: int) -> Tuple[List[DesignPoint], int]:
        """Search until ``budget`` configurations are visited; ``(points in visit order, pruned)``."""
        from tqdm.auto import tqdm

        bar = tqdm(total=budget, desc=f"codesign {self.strategy}", unit="config",
                   disable=not self.progress, leave=False)
        order: List[Point] = []
        try:
            batch = self._initial()[:budget]
            while batch:
                points = self.evaluate([self.configs[p] for p in batch], bar)
                for p, dp in zip(batch, points):
                    self.done[p] = dp
                    order.append(p)
                flagged = pareto(self._measured())
                for p, dp in zip([p for p in self.done if self.done[p] is not None], flagged):
                    self.done[p] = dp
                left = budget - len(self.done)
                batch = self._next(min(self.batch_size, left)) if left > 0 else []
        finally:
            bar.close()
        measured = self._measured()
        pruned = sum(1 for p in self.valid if p not in self.done and self._pruned(p, measured))
        return [self.done[p] for p in order if self.done[p] is not None], pruned


def _presets(names: Union[bool, Sequence[str]]) -> List[VTAConfig]:
    if names is True:
        names = available_configs()
    elif not names:
        names = []
    return [load_config(n) for n in names]


def explore(mod, space: Optional[Space] = None, budget: int = 200, strategy: str = "csp-relaxed",
            runner: Any = None, seed: int = 0, baseline: Optional[str] = "stock",
            presets: Union[bool, Sequence[str]] = True, records: Union[None, str, Path] = None,
            area_model: AreaModel = AREA_PROXY, batch_size: int = BATCH_SIZE,
            progress: bool = True) -> Front:
    """Search VTA configurations and the strategy's embeddings together for a Pareto front of
    cycles against the area proxy.

    Parameters
    ----------
    mod : tvm.IRModule
        The int8 Relax module (what ``relax.build(mod, target="ext_vta")`` takes).
    space : Space, optional
        The configurations to search (default ``Space()``).
    budget : int
        Configurations of the space to visit (evaluated, or answered by the records), at least 1.
    strategy : str
        The strategy that plans every operator (``"csp-relaxed"``, ``"csp-strict"``, ``"stock"``).
    runner : tune.LocalRunner or tune.DaskRunner, optional
        Where evaluations run (default ``tune.LocalRunner(n_parallel=1)``). Evaluations use the
        build options in effect around the call (``with vta_ext.build_options(knobs=...,
        objective=..., host=...)``; tuned records as ``tune.apply_history_best(...)``) with
        ``strategy`` in place of theirs, in this process and in every worker alike.
    seed : int
        Seed of the search's random choices: the same seed visits the same configurations.
    baseline : str or None
        A second strategy searched over the same space with the same budget and seed (default
        ``"stock``, the original templates), for :attr:`Front.baseline`; None: no baseline.
    presets : bool or sequence of str
        The presets to evaluate the same way (True: every shipped preset).
    records : str or Path, optional
        The JSON-lines records of evaluations (default: ``<embedding cache>/codesign/<module
        digest>.jsonl``); evaluations found there are not run again.
    area_model : AreaModel
        The area proxy's coefficients.
    batch_size : int
        Configurations decided per round.
    progress : bool
        Show a tqdm bar.

    Returns
    -------
    Front

    Raises
    ------
    ValueError
        ``budget`` below 1, a space with no valid configuration, a module with no operator the
        offload pass matches, or tuned records in the build options that are not
        ``tune.apply_history_best(...)``.
    """
    from ..tune.runner import LocalRunner

    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"explore: budget={budget!r}; give the number of configurations to "
                         "visit, at least 1")
    space = Space() if space is None else space
    if not isinstance(space, Space):
        raise ValueError(f"explore: space must be a codesign.Space, got {type(space).__name__}")
    start = time.perf_counter()
    options = options_payload()
    ops = matched_operators(mod, space.base)
    if not ops:
        raise ValueError("explore: the ext_vta offload pass matches no operator in this module "
                         "(no int8 conv2d / matmul / pool / add with the requantisation tail; see "
                         "docs/templates-api.md), so every configuration costs the same: nothing "
                         "to co-design")
    valid, rejected = space.validate()
    named_rejected = [(space.name(p), why) for p, why in rejected]
    if not valid:
        raise ValueError(f"explore: none of the {space.size} configurations of the space exists "
                         f"(e.g. {named_rejected[0][0]}: {named_rejected[0][1]}); widen the "
                         "ranges of the Space")
    runner = runner if runner is not None else LocalRunner(n_parallel=1)
    path, digest = save_module(mod, Path(records).parent if records is not None
                               else default_records_path("").parent)
    mod_path = str(path)
    store = Records(records if records is not None else default_records_path(digest))
    logger.info("codesign: %d operators matched; %d of %d configurations valid, %d rejected; %s",
                len(ops), len(valid), space.size, len(rejected), store)

    def one(strat: str) -> Front:
        t0 = time.perf_counter()
        search = _Search(mod_path, digest, ops, space, valid, strat, runner, store, area_model,
                         seed, batch_size, progress, options)
        points, pruned = search.run(budget)
        preset_points = [p for p in search.evaluate(_presets(presets)) if p is not None]
        flagged = pareto(points + preset_points)
        points = pareto(points)
        preset_points = flagged[len(points):]
        return Front(points, preset_points, None, strat, named_rejected, pruned, search.errors,
                     search.evaluated, search.cached, time.perf_counter() - t0, space.size)

    front = one(strategy)
    if baseline is not None and baseline != strategy:
        front.baseline = one(baseline)
    logger.info("codesign: %r in %.0f s", front, time.perf_counter() - start)
    return front
