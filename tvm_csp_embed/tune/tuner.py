"""Tuners over a task's knob space, with AutoTVM's interface.

``tuner.tune(n_trial, measure_option, callbacks)`` measures up to ``n_trial`` valid points (pruned
points are never measured; ``n_trial`` beyond the space size stops at the space size), in batches
chosen by the tuner:

* :class:`GridSearchTuner` -- the space in its enumeration order;
* :class:`RandomTuner` -- a seeded random permutation;
* :class:`XGBTuner` -- seeded with the TPS point (and random points), then the points an XGBoost
  model of the measured objective ranks best (features: :mod:`.features`), with a little seeded
  random exploration.

Every tuner takes ``objective``: ``"cycles"`` (the default: the cycle model's total) or
``"dram_bytes"`` (the DRAM bytes the program moves, micro-ops included; ties broken by cycles).
The best point, the one verified and recorded as best, is the one of the least objective. Records
keep both figures, but :func:`.records.apply_history_best` picks the verified record of fewest
cycles: keep a ``dram_bytes`` run in its own records file.

Each result goes to the callbacks as soon as it is known (``log_to_file`` writes it at once). Points
already in a ``log_to_file`` callback's file are not measured again: a restarted job resumes. At the
end the best point is run on the functional simulator and compared bit for bit with the numpy
reference; only then is it written again as the verified best (a point that fails the check is an
error result, and the next best is tried). A measurement that raises is an error result, never
best. On Ctrl-C every finished result is already written; the exception propagates.
"""
from __future__ import annotations

import json
import logging
import math
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from .measure import MeasureResult
from .runner import MeasureOption, measure_option as _measure_option
from .task import Task

__all__ = ["Tuner", "GridSearchTuner", "RandomTuner", "XGBTuner"]

logger = logging.getLogger("tvm_csp_embed.tune")


class Tuner:
    """Base class: the tuning loop; subclasses choose the points (:meth:`next_batch`).

    Parameters
    ----------
    task : Task
        The task to tune.
    seed : int
        Seed of every random choice (tuning is deterministic for a fixed seed and batch size,
        whatever the runner).
    batch_size : int
        Points measured between two updates of the tuner.
    objective : str
        ``"cycles"`` or ``"dram_bytes"`` (module docstring).
    """

    #: the objectives a tuner can minimise
    OBJECTIVES = ("cycles", "dram_bytes")

    def __init__(self, task: Task, seed: int = 0, batch_size: int = 8,
                 objective: str = "cycles") -> None:
        if objective not in self.OBJECTIVES:
            raise ValueError(f"objective={objective!r}; valid objectives: "
                             f"{', '.join(self.OBJECTIVES)}")
        self.objective = objective
        self.task = task
        self.seed = seed
        self.batch_size = max(1, int(batch_size))
        self.rng = np.random.default_rng(seed)
        self.space = task.knob_space
        self._index = {json.dumps(p, sort_keys=True): i for i, p in enumerate(self.space.points)}
        self.visited: set = set()
        self.results: Dict[int, MeasureResult] = {}
        self.best_index: Optional[int] = None
        self.verified_index: Optional[int] = None
        self.done = False

    # ------------------------------------------------------------------ choosing points
    def next_batch(self, size: int) -> List[int]:
        """Indices of the next ``size`` unvisited points (subclasses)."""
        raise NotImplementedError

    def update(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
        """Learn from measured points (subclasses may override)."""

    def index_of(self, knobs: Dict[str, Any]) -> Optional[int]:
        """The index of a point in the knob space, or None if it is not a valid point."""
        return self._index.get(json.dumps(dict(knobs), sort_keys=True))

    def has_next(self) -> bool:
        """Whether an unmeasured valid point is left."""
        return len(self.visited) < len(self.space)

    # ------------------------------------------------------------------ results
    def cost(self, result: MeasureResult) -> tuple:
        """The sort key of a successful result under :attr:`objective`."""
        if self.objective == "dram_bytes":
            return (result.dram_bytes, result.cycles)
        return (result.cycles,)

    @property
    def best_cycles(self) -> Optional[int]:
        """Cycles of the best measured point so far (None before the first success)."""
        return None if self.best_index is None else self.results[self.best_index].cycles

    @property
    def best_knobs(self) -> Optional[Dict[str, Any]]:
        """The verified best point (None before verification or if none verified)."""
        return None if self.verified_index is None else dict(self.space.points[self.verified_index])

    def _record(self, index: int, result: MeasureResult) -> None:
        self.visited.add(index)
        self.results[index] = result
        if result.ok and (self.best_index is None or
                          (self.cost(result), index) < (self.cost(self.results[self.best_index]),
                                                        self.best_index)):
            self.best_index = index

    def _resume(self, callbacks: Sequence[Callable]) -> int:
        from .callback import LogToFile
        from .records import measured_points

        resumed = 0
        for cb in callbacks:
            if not isinstance(cb, LogToFile):
                continue
            for rec in measured_points(cb.path, self.task):
                index = self.index_of(rec.knobs)
                if index is None or rec.verified:
                    continue
                if index not in self.visited:
                    resumed += 1
                cycles = None if rec.cost is None else int(rec.cost)
                self._record(index, MeasureResult(dict(rec.knobs), cycles,
                                                  None if cycles is not None else "error (resumed)",
                                                  rec.dram_bytes, rec.insns))
        if resumed:
            ok = [i for i in self.visited if self.results[i].ok]
            self.update(ok, [self.results[i] for i in ok])
            logger.info("%s: resumed %d measured point(s) from the records", self.task.name, resumed)
        return resumed

    # ------------------------------------------------------------------ the loop
    def tune(self, n_trial: int, measure_option: Optional[MeasureOption] = None,
             callbacks: Sequence[Callable] = (), early_stopping: Optional[int] = None
             ) -> Optional[MeasureResult]:
        """Measure up to ``n_trial`` points, then verify and record the best.

        Parameters
        ----------
        n_trial : int
            Measurements, counting those resumed from a ``log_to_file`` callback's file; capped at
            the number of valid points (with a warning).
        measure_option : MeasureOption, optional
            Default ``measure_option()`` (one local worker process).
        callbacks : sequence of callable
            ``callback(tuner, inputs, results)``, e.g. :func:`.callback.progress_bar`,
            :func:`.callback.log_to_file`.
        early_stopping : int, optional
            Stop after this many measurements without improvement.

        Returns
        -------
        MeasureResult or None
            The verified best result, or None if no point was measured and verified.
        """
        option = measure_option or _measure_option()
        runner = option.runner
        callbacks = list(callbacks)
        size = len(self.space)
        self.done = False
        if size == 0:
            logger.warning("%s: the knob space has no valid point (%d pruned); nothing to tune",
                           self.task.name, len(self.space.pruned))
            self.done = True
            return None
        if n_trial > size:
            logger.warning("%s: n_trial=%d is larger than the knob space (%d valid points); "
                           "stopping at %d", self.task.name, n_trial, size, size)
        budget = min(n_trial, size)
        self._resume(callbacks)
        spec = self.task.spec()
        since_best, last_best = 0, self.best_index
        try:
            while len(self.visited) < budget and self.has_next():
                if early_stopping is not None and since_best >= early_stopping:
                    logger.info("%s: early stop after %d trials without improvement",
                                self.task.name, since_best)
                    break
                indices = self.next_batch(min(self.batch_size, budget - len(self.visited)))
                if not indices:
                    break
                batch = [self.space.points[i] for i in indices]
                results: List[Optional[MeasureResult]] = [None] * len(indices)
                for pos, result in runner.run(spec, batch):
                    results[pos] = result
                    self._record(indices[pos], result)
                    if not result.ok:
                        logger.info("%s: %s failed: %s", self.task.name, result.knobs, result.error)
                    for cb in callbacks:
                        cb(self, [batch[pos]], [result])
                self.update(indices, results)
                since_best = 0 if self.best_index != last_best else since_best + len(indices)
                last_best = self.best_index
            best = self._verify_best(runner, option, callbacks)
        except KeyboardInterrupt:
            logger.warning("%s: interrupted after %d measurement(s); every finished one is "
                           "already recorded", self.task.name, len(self.visited))
            close = getattr(runner, "close", None)
            if close is not None:
                close()
            raise
        finally:
            self.done = True
        for cb in callbacks:  # lets a progress bar close
            cb(self, [], [])
        return best

    def _verify_best(self, runner, option: MeasureOption, callbacks) -> Optional[MeasureResult]:
        if not option.verify:
            return None
        spec = self.task.spec()
        order = sorted((self.cost(r), i) for i, r in self.results.items() if r.ok)
        for _, index in order:
            cycles = self.results[index].cycles
            knobs = self.space.points[index]
            problem = runner.verify(spec, knobs, option.verify_seed)
            base = self.results[index]
            if problem is None:
                verified = MeasureResult(dict(knobs), cycles, None, base.dram_bytes, base.insns,
                                         base.build_seconds, verified=True)
                self.verified_index = index
                for cb in callbacks:
                    cb(self, [knobs], [verified])
                logger.info("%s: best (%s) %s cycles, %s DRAM bytes with %s, bit-exact on the "
                            "functional simulator", self.task.name, self.objective, f"{cycles:,}",
                            f"{base.dram_bytes:,}", knobs)
                return verified
            failed = MeasureResult(dict(knobs), None, f"verification failed: {problem}")
            self.results[index] = failed
            logger.error("%s: the best point %s is NOT bit-exact: %s", self.task.name, knobs,
                         problem)
            for cb in callbacks:
                cb(self, [knobs], [failed])
        self.best_index = None
        return None

    def __repr__(self) -> str:
        best = f", best {self.best_cycles:,} cycles" if self.best_cycles is not None else ""
        return (f"{type(self).__name__}({self.task.name}: {len(self.visited)}/{len(self.space)} "
                f"points measured{best})")


class GridSearchTuner(Tuner):
    """Measure the points in the knob space's enumeration order."""

    def next_batch(self, size: int) -> List[int]:
        out = []
        for i in range(len(self.space)):
            if len(out) == size:
                break
            if i not in self.visited:
                out.append(i)
        return out


class RandomTuner(Tuner):
    """Measure the points in a seeded random order."""

    def __init__(self, task: Task, seed: int = 0, batch_size: int = 8,
                 objective: str = "cycles") -> None:
        super().__init__(task, seed, batch_size, objective)
        self._order = [int(i) for i in self.rng.permutation(len(self.space))]

    def next_batch(self, size: int) -> List[int]:
        return [i for i in self._order if i not in self.visited][:size]


class XGBTuner(Tuner):
    """XGBoost-guided search: fit the log of the objective (``cycles`` or ``dram_bytes``) on the
    measured points, measure the points the model ranks best.

    Parameters
    ----------
    task : Task
        The task.
    seed : int
        Seed of the initial random points, the exploration and XGBoost.
    batch_size : int
        Points per batch (the model is refit after each). The first batch is the TPS point and
        random points.
    epsilon : float
        Fraction of each later batch chosen at random (exploration).
    objective : str
        ``"cycles"`` or ``"dram_bytes"``.
    """

    def __init__(self, task: Task, seed: int = 0, batch_size: int = 8,
                 epsilon: float = 0.1, objective: str = "cycles") -> None:
        super().__init__(task, seed, batch_size, objective)
        from .features import space_features

        self.epsilon = epsilon
        self.features = space_features(task) if len(self.space) else np.zeros((0, 0))
        self._model = None

    def _unvisited(self) -> List[int]:
        return [i for i in range(len(self.space)) if i not in self.visited]

    def next_batch(self, size: int) -> List[int]:
        free = self._unvisited()
        if not free:
            return []
        if self._model is None:
            chosen: List[int] = []
            tps = self.index_of(self.space.tps) if self.space.tps is not None else None
            if tps is not None and tps not in self.visited:
                chosen.append(tps)
            rest = [i for i in free if i not in chosen]
            want = min(size, len(free)) - len(chosen)
            if want > 0:
                chosen += [int(i) for i in self.rng.choice(rest, size=min(want, len(rest)),
                                                           replace=False)]
            return chosen[:size]
        n_random = int(math.floor(self.epsilon * size))
        pred = self._model.predict(self._dmatrix(free))
        order = [free[j] for j in np.lexsort((np.array(free), pred))]
        chosen = order[:size - n_random]
        rest = [i for i in free if i not in chosen]
        if n_random and rest:
            chosen += [int(i) for i in self.rng.choice(rest, size=min(n_random, len(rest)),
                                                       replace=False)]
        return chosen

    def _dmatrix(self, indices, labels=None):
        import xgboost as xgb

        return xgb.DMatrix(self.features[np.asarray(indices, dtype=int)], label=labels,
                           nthread=1)

    def update(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
        import xgboost as xgb

        done = sorted(i for i, r in self.results.items() if r.ok)
        if len(done) < 2:
            return
        labels = np.log([float(max(1, self.cost(self.results[i])[0])) for i in done])
        params = {"max_depth": 6, "eta": 0.3, "subsample": 1.0, "min_child_weight": 1,
                  "objective": "reg:squarederror", "seed": self.seed, "nthread": 1,
                  "verbosity": 0}
        self._model = xgb.train(params, self._dmatrix(done, labels), num_boost_round=60)
