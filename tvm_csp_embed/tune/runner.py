"""Where measurements run: this process, local worker processes, or a Dask cluster.

A runner takes a task's :meth:`~.task.Task.spec` and a batch of knob points and yields
``(index in the batch, MeasureResult)`` as measurements finish (:func:`~.measure.measure_point`).
A worker that dies does not take finished results with it: the unfinished points are measured
again (:class:`LocalRunner` measures its lost points again one at a time; Dask reschedules them on
other workers), and a point that still kills its worker is an error result.

* :class:`LocalRunner` -- ``n_parallel`` worker processes (``0``: in this process);
* :class:`DaskRunner` -- a ``distributed`` scheduler address (or a ``Client``);
* :func:`measure_option` -- bundles a runner with the verification settings, as AutoTVM's.

The local workers are TVM's Popen pool (:class:`tvm.support.popen_pool.PopenPoolExecutor`, the
pool AutoTVM and MetaSchedule use): fresh ``python -m tvm.exec.popen_worker`` processes that
import ``vta_ext``, ``tvm_csp_embed`` and the modules the runner names, never the user's
``__main__`` module. ``multiprocessing``'s ``spawn`` and ``forkserver`` start methods both import
the main module in every worker, so a tuning script without an ``if __name__ == "__main__":``
guard would run again in each of them; ``fork`` is unsafe with TVM's and BLAS's threads.
"""
from __future__ import annotations

import logging
import os
import sys
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from .measure import MeasureResult, measure_device, measure_point, verify_point

__all__ = ["LocalRunner", "DaskRunner", "MeasureOption", "measure_option", "in_worker"]

logger = logging.getLogger("tvm_csp_embed.tune")

Batch = Sequence[Dict[str, Any]]


#: seconds between a worker's checks that the tuning process that started it is still there
PARENT_POLL_SECONDS = 1.0

#: set in a measurement worker of :class:`LocalRunner` by its initializer
_IN_WORKER = [False]


def in_worker() -> bool:
    """Whether this process is a measurement worker started by a :class:`LocalRunner`."""
    return _IN_WORKER[0]


def _exit_with_parent(parent: int) -> None:
    """Runs in a worker: ends the worker once its parent is gone (a tuning job killed with SIGKILL
    or SIGTERM would otherwise leave it measuring on, an orphan holding a core)."""
    import time

    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)


def _init_worker(imports: Sequence[str] = (), sys_path: Sequence[str] = (),
                 log_level: int = logging.WARNING) -> None:
    """Worker start: the tuning process's ``sys.path`` (so that the modules it names import as
    they do there) and log level (``tvm.exec.popen_worker`` sets INFO); one BLAS thread; import
    vta_ext and tvm_csp_embed (they register the strategies) and the modules of ``imports`` (e.g.
    ones registering more templates); a watcher thread that ends the worker when the tuning
    process dies."""
    import importlib
    import threading

    _IN_WORKER[0] = True
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True,
                     name="exit-with-parent").start()
    sys.path[:] = list(sys_path) + [p for p in sys.path if p not in sys_path]
    logging.getLogger().setLevel(log_level)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    for name in ("vta_ext", "tvm_csp_embed", *imports):
        importlib.import_module(name)


class LocalRunner:
    """Measure on this machine, in ``n_parallel`` worker processes.

    The workers are TVM's Popen pool (see the module docstring): they do not import the user's
    ``__main__`` module, so a tuning script needs no ``if __name__ == "__main__":`` guard.

    Parameters
    ----------
    n_parallel : int
        Worker processes (started on first use, reused for every batch). ``0`` measures in this
        process (no isolation: a crash of the compiler takes the tuner with it).
    imports : sequence of str
        Modules each worker imports at start, besides ``vta_ext`` and ``tvm_csp_embed``: those
        that register the strategies and templates being tuned. They are imported by name with
        this process's ``sys.path``.
    device : str, optional
        Path of a library with the VTA driver ABI that reports cycles (the vta-hw RTL,
        :mod:`vta_ext.device`): points are measured there (its cycles, not the cycle model's)
        and the best one is verified there, as AutoTVM measured on boards; each worker opens the
        library once. Keep such records in their own file: device cycles and model cycles are
        not comparable.
    """

    def __init__(self, n_parallel: int = 1, imports: Sequence[str] = (),
                 device: Optional[str] = None) -> None:
        if n_parallel < 0:
            raise ValueError(f"n_parallel={n_parallel} must be >= 0")
        self.n_parallel = n_parallel
        self.imports = tuple(imports)
        self.device = None
        if device is not None:
            from pathlib import Path

            self.device = str(Path(device).resolve())
            measure_device(self.device)   # a library that cannot measure fails here, once
        self._pool = None
        self._futures: Set[Future] = set()

    def _executor(self):
        """The worker pool (a :class:`tvm.support.popen_pool.PopenPoolExecutor`), started on first
        use."""
        if self._pool is None:
            from tvm.support.popen_pool import PopenPoolExecutor

            self._pool = PopenPoolExecutor(
                self.n_parallel, initializer=_init_worker,
                initargs=(self.imports, list(sys.path), logging.getLogger().getEffectiveLevel()))
        return self._pool

    def _submit(self, fn, *args) -> Future:
        future = self._executor().submit(fn, *args)
        self._futures.add(future)
        future.add_done_callback(self._futures.discard)
        return future

    def worker_pids(self) -> List[int]:
        """Process ids of the worker processes running now (started on demand, so fewer than
        ``n_parallel`` before the first batch)."""
        if self._pool is None:
            return []
        return [w._proc.pid for w in list(self._pool._worker_map.values())
                if w._proc is not None and w.is_alive()]

    def run(self, spec: Dict[str, Any], batch: Batch) -> Iterator[Tuple[int, MeasureResult]]:
        """Measure every point of ``batch``; yields ``(index, result)`` as they finish."""
        return self.map(measure_point, [(spec, knobs, self.device) for knobs in batch],
                        lambda i, why: MeasureResult(dict(batch[i]), None,
                                                     "the measurement worker process died"))

    def map(self, fn: Callable, jobs: Sequence[tuple], lost: Callable[[int, str], Any]
            ) -> Iterator[Tuple[int, Any]]:
        """``fn(*jobs[i])`` for every job in the workers; yields ``(i, result)`` as they finish.

        ``fn`` must be a module-level function of picklable arguments. A job whose worker died
        is run again, one at a time; one that kills its worker again yields ``lost(i, why)``.
        """
        if self.n_parallel == 0:
            for i, args in enumerate(jobs):
                yield i, fn(*args)
            return
        lost_jobs: List[int] = []
        futures = {self._submit(fn, *jobs[i]): i for i in range(len(jobs))}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    try:
                        yield futures[fut], fut.result()
                    except ChildProcessError:  # the worker died; the pool starts a new one
                        lost_jobs.append(futures[fut])
        finally:
            for fut in pending:  # the consumer stopped early (an error, Ctrl-C)
                fut.cancel()
        if lost_jobs:
            # run the lost jobs again one at a time, so that only a job that kills its worker
            # again fails
            logger.warning("a worker process died; running %d unfinished job(s) again, one at a "
                           "time", len(lost_jobs))
        for i in sorted(lost_jobs):
            try:
                yield i, self._submit(fn, *jobs[i]).result()
            except ChildProcessError:
                logger.warning("job %d kills the worker process; recorded as an error", i)
                yield i, lost(i, "the worker process died")

    def verify(self, spec: Dict[str, Any], knobs: Dict[str, Any], seed: int = 0) -> Optional[str]:
        """:func:`~.measure.verify_point` in a worker (or here with ``n_parallel=0``)."""
        if self.n_parallel == 0:
            return verify_point(spec, knobs, seed, self.device)
        try:
            return self._submit(verify_point, spec, knobs, seed, self.device).result()
        except ChildProcessError:
            return "the verification worker process died"

    def close(self) -> None:
        """Shut the worker processes down (they are started again when needed); measurements
        not started yet are cancelled."""
        for fut in list(self._futures):
            fut.cancel()
        self._futures.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def __repr__(self) -> str:
        where = "in this process" if self.n_parallel == 0 else f"{self.n_parallel} worker processes"
        on = f", on {self.device}" if self.device else ""
        return f"LocalRunner({where}{on})"


class DaskRunner:
    """Measure on a Dask cluster (``distributed``).

    Parameters
    ----------
    scheduler : str or distributed.Client or cluster
        The scheduler address (``"tcp://host:8786"``), a ``Client``, or a cluster object (e.g.
        ``distributed.LocalCluster``).
    n_parallel : int, optional
        For display; the cluster decides how many points run at once.
    timeout : float
        Seconds to wait for the scheduler when connecting to an address; an unreachable one
        raises :class:`ConnectionError` naming the address.
    """

    def __init__(self, scheduler: Any, n_parallel: Optional[int] = None,
                 timeout: float = 10.0) -> None:
        from distributed import Client

        self._own = not isinstance(scheduler, Client)
        if isinstance(scheduler, Client):
            self.client = scheduler
        else:
            try:
                self.client = Client(scheduler, timeout=timeout)
            except OSError as err:  # refused, unknown host, or no answer within the timeout
                raise ConnectionError(
                    f"DaskRunner: no Dask scheduler answers at {scheduler} within {timeout:g} s "
                    f"({type(err).__name__}: {err}); start one (`dask scheduler`) or give the "
                    "address of a running one") from None
        self.n_parallel = n_parallel or max(1, sum(
            w.get("nthreads", 1) for w in self.client.scheduler_info()["workers"].values()))

    def run(self, spec: Dict[str, Any], batch: Batch) -> Iterator[Tuple[int, MeasureResult]]:
        """Measure every point of ``batch`` on the cluster; yields ``(index, result)``."""
        return self.map(measure_point, [(spec, dict(knobs)) for knobs in batch],
                        lambda i, why: MeasureResult(dict(batch[i]), None, why))

    def map(self, fn: Callable, jobs: Sequence[tuple], lost: Callable[[int, str], Any]
            ) -> Iterator[Tuple[int, Any]]:
        """``fn(*jobs[i])`` for every job on the cluster; yields ``(i, result)`` as they finish
        (a job lost with its worker for good yields ``lost(i, why)``)."""
        from distributed import as_completed

        futures = {self.client.submit(fn, *args, pure=False): i for i, args in enumerate(jobs)}
        for fut in as_completed(list(futures)):
            i = futures[fut]
            try:
                yield i, fut.result()
            except Exception as err:  # a worker lost for good (KilledWorker), a comm error
                yield i, lost(i, f"Dask worker failure: {type(err).__name__}: {err}")

    def verify(self, spec: Dict[str, Any], knobs: Dict[str, Any], seed: int = 0) -> Optional[str]:
        """:func:`~.measure.verify_point` on the cluster."""
        try:
            return self.client.submit(verify_point, spec, dict(knobs), seed, pure=False).result()
        except Exception as err:
            return f"Dask worker failure: {type(err).__name__}: {err}"

    def close(self) -> None:
        """Close the client if this runner opened it."""
        if self._own:
            self.client.close()

    def __repr__(self) -> str:
        return f"DaskRunner({self.client.scheduler.address}, {self.n_parallel} threads)"


@dataclass(frozen=True)
class MeasureOption:
    """How a tuner measures: the runner, and how the best point is verified."""

    runner: Any
    verify: bool = True
    verify_seed: int = 0

    def __repr__(self) -> str:
        return f"measure_option(runner={self.runner!r}, verify={self.verify})"


def measure_option(runner: Any = None, verify: bool = True, verify_seed: int = 0,
                   builder: Any = None) -> MeasureOption:
    """AutoTVM's ``measure_option``: where and how to measure.

    Parameters
    ----------
    runner : LocalRunner or DaskRunner, optional
        Default ``LocalRunner(n_parallel=1)``.
    verify : bool
        Verify the best point bit for bit on the functional simulator before it is recorded as
        best (default True; without it no record is usable as best).
    verify_seed : int
        Seed of the verification inputs.
    builder : None
        Accepted for AutoTVM compatibility; compiling is part of a measurement here.
    """
    if builder is not None:
        logger.info("measure_option: builder=%r ignored (a measurement compiles its point)", builder)
    return MeasureOption(runner if runner is not None else LocalRunner(1), verify, verify_seed)
