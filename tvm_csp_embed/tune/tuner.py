"""Tuners over a task's knob space, with AutoTVM's interface.

``tuner.tune(n_trial, measure_option, callbacks)`` measures up to ``n_trial`` valid points (pruned
points are never measured; ``n_trial`` beyond the space size stops at the space size), in batches
chosen by the tuner:

* :class:`GridSearchTuner` -- the space in its enumeration order;
* :class:`RandomTuner` -- a seeded random permutation;
* :class:`XGBTuner` -- seeded with the TPS point (and random points), then the points an XGBoost
  model of the measured objective ranks best (features: :mod:`.features`), with a little seeded
  random exploration.
* :class:`NeighbourhoodTuner` -- hill climbing: every valid point within Hamming distance
  ``radius`` of the best point (or of the TPS point), again from the new best while it improves.

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
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from .measure import MeasureResult
from .runner import MeasureOption, measure_option as _measure_option
from .task import Task

__all__ = ["Tuner", "GridSearchTuner", "RandomTuner", "XGBTuner", "NeighbourhoodTuner",
           "NeighbourhoodRound"]

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
                                         base.build_seconds, verified=True, device=base.device)
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
            tps = self.index_of(self.space.seed) if self.space.seed is not None else None
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


@dataclass
class NeighbourhoodRound:
    """One neighbourhood searched by a :class:`NeighbourhoodTuner`.

    Attributes
    ----------
    centre : int
        Index (in the knob space's points) of the point the neighbourhood is centred on.
    neighbours : int
        Valid points within the tuner's radius of the centre, the centre included.
    new : int
        Those of them not yet measured when the round began.
    best_before : int or None
        Cycles of the best point measured before the round (None if none yet).
    started : float
        ``time.time()`` when the round began.
    measured : int
        Points handed to the runner in this round so far.
    """

    centre: int
    neighbours: int
    new: int
    best_before: Optional[int]
    started: float
    measured: int = 0


class NeighbourhoodTuner(Tuner):
    """Hill-climbing grid search over a pruned subset: the valid points near the best one.

    The search starts from a centre: the best point already measured (resumed from a
    ``log_to_file`` callback's records) or, if there is none, the default point
    (``task.knob_space.seed``: the default knob policy's point; the TPS point, the fallback point,
    then the first valid point, if that is not a valid point). It measures every valid, not yet measured point within Hamming distance
    ``radius`` of the centre (the number of knobs whose values differ), in index order. When that
    neighbourhood is exhausted and the best point is better than the centre, it re-centres on the
    best point and goes on, at most ``rounds`` times. Tuning stops at a local optimum (no valid
    point within ``radius`` of the centre is better than it), when the re-centrings are used up, or
    when ``n_trial`` is spent; an ``n_trial`` larger than what the neighbourhoods offer stops at the
    local optimum (:attr:`stop_reason` says which). Batches never cross a neighbourhood.

    Parameters
    ----------
    task : Task
        The task to tune.
    radius : int
        Largest Hamming distance from the centre of a measured point (0 measures the centre only).
    rounds : int, optional
        Most re-centrings after the first neighbourhood; None (the default) climbs until no
        neighbourhood improves. ``rounds=0`` searches one neighbourhood.
    seed : int
        Kept for the common interface; the order is deterministic (sorted indices).
    batch_size : int
        Points measured between two updates of the tuner.
    objective : str
        ``"cycles"`` or ``"dram_bytes"`` (module docstring): "better" and the best point follow it.

    Attributes
    ----------
    centre : int or None
        Index of the current centre (None before tuning starts).
    history : list of NeighbourhoodRound
        The neighbourhoods searched by the last :meth:`tune` call, in order.
    stop_reason : str or None
        Why the climb stopped (``"local optimum"`` or ``"rounds exhausted"``); None while it runs
        or when ``n_trial``, ``early_stopping`` or the end of the space ended it.

    Examples
    --------
    Refine a task already tuned into ``net.json`` (its measured points are not measured again):

    .. code-block:: python

        tuner = tune.NeighbourhoodTuner(task, radius=2, rounds=3)
        tuner.tune(len(task.knob_space), callbacks=[tune.callback.log_to_file("net.json")])
    """

    def __init__(self, task: Task, radius: int = 2, rounds: Optional[int] = None, seed: int = 0,
                 batch_size: int = 8, objective: str = "cycles") -> None:
        if int(radius) < 0:
            raise ValueError(f"radius={radius!r}; the radius is a Hamming distance, at least 0")
        if rounds is not None and int(rounds) < 0:
            raise ValueError(f"rounds={rounds!r}; at least 0, or None for no limit")
        super().__init__(task, seed, batch_size, objective)
        self.radius = int(radius)
        self.rounds = None if rounds is None else int(rounds)
        names = tuple(self.space.names) or (tuple(self.space.points[0]) if len(self.space) else ())
        self._values = [tuple(p.get(k) for k in names) for p in self.space.points]
        self._reset_climb()

    def _reset_climb(self) -> None:
        self.centre: Optional[int] = None
        self.history: List[NeighbourhoodRound] = []
        self.stop_reason: Optional[str] = None
        self._near: List[int] = []

    # ------------------------------------------------------------------ neighbourhoods
    def distance(self, i: int, j: int) -> int:
        """Hamming distance between points ``i`` and ``j``: the number of knobs that differ."""
        return sum(a != b for a, b in zip(self._values[i], self._values[j]))

    def neighbours(self, index: int) -> List[int]:
        """Sorted indices of the valid points within :attr:`radius` of point ``index`` (itself
        included)."""
        centre = self._values[index]
        return [i for i, v in enumerate(self._values)
                if sum(a != b for a, b in zip(v, centre)) <= self.radius]

    def _start(self) -> int:
        if self.best_index is not None:
            return self.best_index
        for point in (self.space.seed, self.space.tps, self.space.fallback):
            index = None if point is None else self.index_of(point)
            if index is not None:
                return index
        return 0

    def _set_centre(self, index: int) -> None:
        self.centre = index
        self._near = self.neighbours(index)
        new = sum(i not in self.visited for i in self._near)
        self.history.append(NeighbourhoodRound(index, len(self._near), new, self.best_cycles,
                                               time.time()))
        logger.info("%s: round %d: %d valid point(s) within distance %d of %s, %d new",
                    self.task.name, len(self.history) - 1, len(self._near), self.radius,
                    self.space.points[index], new)

    def _stop(self, reason: str) -> bool:
        self.stop_reason = reason
        logger.info("%s: %s after %d neighbourhood(s) of radius %d; %d point(s) measured",
                    self.task.name, reason, len(self.history), self.radius, len(self.visited))
        return False

    def _ready(self) -> bool:
        """Whether the current neighbourhood has an unmeasured point, re-centring on an improved
        best point when it is exhausted."""
        if self.stop_reason is not None or not len(self.space):
            return False
        if self.centre is None:
            self._set_centre(self._start())
        while all(i in self.visited for i in self._near):
            best, here = self.best_index, self.results.get(self.centre)
            improved = best is not None and best != self.centre and (
                here is None or not here.ok or self.cost(self.results[best]) < self.cost(here))
            if not improved:
                return self._stop("local optimum")
            if self.rounds is not None and len(self.history) > self.rounds:
                return self._stop("rounds exhausted")
            self._set_centre(best)
        return True

    # ------------------------------------------------------------------ the Tuner interface
    def has_next(self) -> bool:
        """Whether the climb has an unmeasured point left (re-centres if needed)."""
        return self._ready()

    def next_batch(self, size: int) -> List[int]:
        """The next ``size`` unmeasured points of the current neighbourhood, in index order."""
        if not self._ready():
            return []
        chosen = [i for i in self._near if i not in self.visited][:size]
        self.history[-1].measured += len(chosen)
        return chosen

    def tune(self, n_trial: int, measure_option: Optional[MeasureOption] = None,
             callbacks: Sequence[Callable] = (), early_stopping: Optional[int] = None
             ) -> Optional[MeasureResult]:
        """:meth:`Tuner.tune`, climbing afresh from the best point measured so far (resumed
        records included); :attr:`history` and :attr:`stop_reason` describe this call."""
        self._reset_climb()
        return super().tune(n_trial, measure_option, callbacks, early_stopping)

    def __repr__(self) -> str:
        base = super().__repr__()
        rounds = "unlimited" if self.rounds is None else f"at most {self.rounds}"
        state = f"; stopped: {self.stop_reason}" if self.stop_reason else ""
        return (f"{base[:-1]}; radius {self.radius}, {len(self.history)} neighbourhood(s), "
                f"re-centrings {rounds}{state})")
