"""The solver as a build step: embeddings cached on disk.

:func:`cached_embeddings` returns the decoded best embeddings of an instruction into a workload
under a constraint mode, solving only when the cache has no entry. Entries are JSON files keyed by
a hash of

* the workload (dims, extents, reduction flags and every tensor access),
* the instruction graph (axes, sizes, operand axes),
* the mode (its constraint list), the number of solutions requested and the cost bound, and
* the constraint model's own text (a changed model invalidates the cache).

Only definite outcomes are stored: solutions (status ``ok``) and proven infeasibility. A timeout
is not stored, so a later build with more time retries. The directory is
``$TVM_CSP_EMBED_CACHE`` if set, else ``~/.cache/tvm_csp_embed``; :func:`cache_dir` gives it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from vta_ext.timing import phase

from .embedding import Embedding, decode
from .instructions import InstructionGraph
from . import solve_worker
from .solve import (CONSTRAINT_SETS, MODEL, Problem, RawSolution, SolveResult, permuted_solution,
                    solve)
from .workload import Workload

__all__ = ["CACHE_ENV", "SOLVERS_ENV", "cache_dir", "source_digest", "cache_key", "CachedSolve", "SolveRequest",
           "cached_embeddings", "permuted_embeddings", "solve_concurrently", "solved", "add_idle_work",
           "remove_idle_work", "solver_pool_size", "clear_cache", "BATCH_SIZES",
           "batches", "queue_solves", "start_queued"]

#: environment variable naming the cache directory
CACHE_ENV = "TVM_CSP_EMBED_CACHE"
#: environment variable bounding the MiniZinc processes a build runs at once (default: the cores)
SOLVERS_ENV = "TVM_CSP_EMBED_SOLVERS"
_VERSION = 1


@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    """A digest of the Python source of ``tvm_csp_embed`` and ``vta_ext`` (file names and bytes).

    The plan and choice caches key it (:func:`~.choice._choice_key`): a plan chosen by other code
    (a changed cycle model, knob estimate or choice rule) is never served, with no version number
    to bump by hand. Read once per process (about 150 files, a few milliseconds)."""
    import vta_ext

    digest = hashlib.sha256()
    for package in (Path(__file__).resolve().parent, Path(vta_ext.__file__).resolve().parent):
        for path in sorted(package.rglob("*.py")):
            digest.update(f"{package.name}/{path.relative_to(package).as_posix()}".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    """The embedding cache directory (``$TVM_CSP_EMBED_CACHE`` or ``~/.cache/tvm_csp_embed``)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "tvm_csp_embed"


def _workload_text(wl: Workload) -> Dict[str, Any]:
    return {"dims": list(wl.dims), "extents": list(wl.extents), "reduction": list(wl.reduction),
            "tensors": [{"shape": list(t.shape), "coef": [list(r) for r in t.coef], "const": list(t.const)}
                        for t in wl.tensors]}


def cache_key(wl: Workload, instr: InstructionGraph, mode: str, solutions: int,
              max_cost: Optional[int] = None) -> str:
    """The hex key of one solve (module docstring)."""
    text = json.dumps({"v": _VERSION, "workload": _workload_text(wl),
                       "instr": {"axes": list(instr.axes), "sizes": list(instr.sizes),
                                 "reduction": list(instr.reduction),
                                 "operands": {k: list(v) for k, v in sorted(instr.operand_axes.items())}},
                       "constraints": list(CONSTRAINT_SETS.get(mode, mode)), "solutions": solutions,
                       "max_cost": max_cost,
                       "model": hashlib.sha256(MODEL.read_bytes()).hexdigest()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class CachedSolve:
    """The outcome of :func:`cached_embeddings`.

    Attributes
    ----------
    status : str
        ``"ok"``, ``"infeasible"`` or ``"timeout"``.
    embeddings : list of Embedding
        Best first (empty unless ``ok``).
    message : str
    cached : bool
        True if the result came from the disk cache.
    seconds : float
        Solve time (of the original solve for a cached entry).
    """

    status: str
    embeddings: List[Embedding]
    message: str
    cached: bool
    seconds: float = 0.0
    stats: Dict[str, Any] = field(default_factory=dict)


def _raw_to_json(s: RawSolution) -> Dict[str, Any]:
    return {"binding": s.binding, "bit_dims": list(s.bit_dims), "bit_steps": list(s.bit_steps),
            "pad": list(s.pad), "cost": s.cost, "optimal": s.optimal}


def _raw_from_json(d: Dict[str, Any]) -> RawSolution:
    return RawSolution(int(d["binding"]), tuple(d["bit_dims"]), tuple(d["bit_steps"]), tuple(d["pad"]),
                       int(d["cost"]), bool(d["optimal"]), [], {})


def _write(path: Path, data: Dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp_", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)       # atomic: concurrent builds never read half a file


def cached_embeddings(wl: Workload, instr: InstructionGraph, mode: str = "relaxed", *,
                      solutions: int = 4, timeout: float = 30.0, cfg: Any = None,
                      max_cost: Optional[int] = None, use_cache: bool = True) -> CachedSolve:
    """The ``solutions`` best embeddings of ``instr`` into ``wl`` under ``mode`` (of cost at most
    ``max_cost``), from the disk cache or solved now (:func:`tvm_csp_embed.solve.solve`) and
    stored.

    Raises
    ------
    tvm_csp_embed.solve.SolverError
        If MiniZinc itself fails (not cached).
    """
    if _QUEUED:     # queued solves nobody started (no start_queued call): start them now
        start_queued()
    key = cache_key(wl, instr, mode, solutions, max_cost)
    pending = _INFLIGHT.get(key) if use_cache else None
    if pending is not None:     # solving in the background pool (solve_concurrently): wait for it
        with phase("solve"):
            _wait(pending)
    return _cached_or_solved(key, wl, instr, mode, solutions, timeout, cfg, max_cost, use_cache)


def permuted_embeddings(source: CachedSolve, order: Sequence[int], wl: Workload,
                        instr: InstructionGraph, mode: str, cfg: Any = None) -> CachedSolve:
    """The outcome of the solve for ``wl``, a dim permutation of the workload ``source`` was solved
    for (``order``: :meth:`~tvm_csp_embed.workload.Workload.permutation_of`), under the same
    instruction, constraint set (one with :data:`~tvm_csp_embed.solve.PERMUTABLE`), number of
    solutions and cost bound: ``source``'s status, and its embeddings, best first, each
    :func:`~tvm_csp_embed.solve.permuted_solution` decoded for ``wl``. Nothing is solved or
    stored. ``tests/test_embed_permuted.py`` checks this against the solver on every NHWC solve of
    the reference table (the same solutions in the same order)."""
    if source.status not in ("ok", "infeasible"):
        raise ValueError(f"permuted_embeddings of {wl.name}: the source solve's outcome is "
                         f"{source.status!r}; only a definite one (ok, infeasible) carries over, "
                         "solve this workload itself")
    embs = [decode(permuted_solution(e.raw, order, instr), wl, instr, mode, cfg)
            for e in source.embeddings]
    return CachedSolve(source.status, embs, source.message, source.cached, 0.0,
                       {"permuted_from": source.embeddings[0].workload.name if source.embeddings
                        else None})


def _cached_or_solved(key: str, wl: Workload, instr: InstructionGraph, mode: str, solutions: int,
                      timeout: float, cfg: Any, max_cost: Optional[int], use_cache: bool
                      ) -> CachedSolve:
    path = cache_dir() / f"{key}.json"
    if use_cache and path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = None
        if data and data.get("key") == key:
            embs = [decode(_raw_from_json(d), wl, instr, mode, cfg) for d in data["solutions"]]
            return CachedSolve(data["status"], embs, data["message"], True, data.get("seconds", 0.0),
                               data.get("stats", {}))
    with phase("solve"):
        res = solve(wl, instr, mode, solutions=solutions, timeout=timeout, max_cost=max_cost)
    return _stored(key, wl, instr, mode, cfg, res, use_cache)


def _stored(key: str, wl: Workload, instr: InstructionGraph, mode: str, cfg: Any, res: SolveResult,
            use_cache: bool = True) -> CachedSolve:
    """Decode a solve's embeddings and store a definite outcome under ``key``."""
    embs = [decode(s, wl, instr, mode, cfg) for s in res.solutions]
    stats = _store(key, wl, instr, mode, res) if use_cache else _solve_stats(res)
    return CachedSolve(res.status, embs, res.message, False, res.stats.wall_seconds, stats)


def _solve_stats(res: SolveResult) -> Dict[str, Any]:
    return {"runs": res.stats.runs, "nodes": res.stats.nodes, "flatten_seconds": res.stats.flatten_seconds,
            "solve_seconds": res.stats.solve_seconds}


def _store(key: str, wl: Workload, instr: InstructionGraph, mode: str, res: SolveResult) -> Dict[str, Any]:
    """Write a definite outcome (``ok`` or ``infeasible``) under ``key``; its statistics."""
    stats = _solve_stats(res)
    if res.status in ("ok", "infeasible"):
        _write(cache_dir() / f"{key}.json",
               {"key": key, "workload": wl.name, "instruction": instr.name, "mode": mode,
                "status": res.status, "message": res.message, "seconds": res.stats.wall_seconds,
                "stats": stats, "solutions": [_raw_to_json(s) for s in res.solutions]})
    return stats


@dataclass(frozen=True)
class SolveRequest:
    """The arguments of one :func:`cached_embeddings` call."""

    wl: Workload
    instr: InstructionGraph
    mode: str
    solutions: int
    timeout: float
    max_cost: Optional[int] = None
    cfg: Any = None

    @property
    def key(self) -> str:
        """Its cache key (:func:`cache_key`)."""
        return cache_key(self.wl, self.instr, self.mode, self.solutions, self.max_cost)


def solver_pool_size() -> int:
    """MiniZinc processes a build runs at once: ``$TVM_CSP_EMBED_SOLVERS``, else the cores."""
    env = os.environ.get(SOLVERS_ENV)
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"{SOLVERS_ENV}={env!r} is not a number; set it to the count of "
                             "MiniZinc processes to run at once (e.g. 2)") from None
        if n < 1:
            raise ValueError(f"{SOLVERS_ENV}={n}: set it to 1 or more")
        return n
    return max(1, os.cpu_count() or 1)


#: solves running or queued in the background pool, by cache key (:func:`solve_concurrently`)
_INFLIGHT: Dict[str, Future] = {}
#: work a build does while it waits for a solve (:func:`add_idle_work`)
_IDLE: List[Callable[[], bool]] = []


def solved(key: str) -> bool:
    """Whether the solve of cache key ``key`` is neither running nor queued in the background
    pool, and its outcome is on disk (a timeout or a failure is not)."""
    return key not in _INFLIGHT and (cache_dir() / f"{key}.json").exists()


def add_idle_work(step: Callable[[], bool]) -> None:
    """Have a thread that waits for a background solve (:func:`cached_embeddings`) call ``step``
    meanwhile, again while it returns True (it did one unit of work; False: none is ready now),
    until the solve is done. ``step`` must do only work that is needed anyway and gives the same
    results whenever it runs (it fills caches); it removes itself (:func:`remove_idle_work`) when
    it has nothing left."""
    _IDLE.append(step)


def remove_idle_work(step: Callable[[], bool]) -> None:
    """Stop calling ``step`` (:func:`add_idle_work`); nothing if it is not registered."""
    if step in _IDLE:
        _IDLE.remove(step)


def _wait(pending: Future) -> None:
    """Wait for ``pending``, doing idle work (:func:`add_idle_work`) whenever some is ready: when
    none is, until the next background solve ends."""
    while not pending.done() and _IDLE:
        if not any(step() for step in list(_IDLE)):
            futures_wait([pending, *list(_INFLIGHT.values())], return_when=FIRST_COMPLETED)
    pending.result()
_POOL: Dict[Tuple[int, str], ThreadPoolExecutor] = {}
_POOL_LOCK = threading.Lock()


def _pool(workers: int, kind: str = "minizinc") -> ThreadPoolExecutor:
    """The process-wide pool of ``workers`` solver threads: ``"minizinc"``, each runs one batch
    of solves at a time (its flattening); ``"gecode"``, each runs one search of a flattened batch
    (a separate pool: a batch waits for its searches)."""
    with _POOL_LOCK:
        if (workers, kind) not in _POOL:
            _POOL[workers, kind] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=kind)
        return _POOL[workers, kind]


#: sizes of the batches :func:`solve_concurrently` flattens in one MiniZinc process, in order (the
#: last repeats): small first, so the first operators' embeddings arrive early (the first
#: operator's first layout alone: a cold ResNet-18 224 task extraction waits 0.34 s for solves
#: instead of 0.39 s with (2, 4, 8, 16), median of 8); then larger, so MiniZinc's start-up (about
#: 0.06 s of CPU per process) is paid fewer times
BATCH_SIZES = (1, 2, 4, 8, 16)


def batches(items: Sequence[Any]) -> List[List[Any]]:
    """``items`` cut, in order, into batches of :data:`BATCH_SIZES`."""
    out, at, i = [], 0, 0
    while at < len(items):
        n = BATCH_SIZES[min(i, len(BATCH_SIZES) - 1)]
        out.append(list(items[at:at + n]))
        at, i = at + n, i + 1
    return out


def solve_batch(problems: Sequence[Problem], searches=None):
    """:func:`tvm_csp_embed.solve.solve_batch` of ``problems`` in the solver's worker process
    (:mod:`.solve_worker`), its searches on as many threads there as the executor ``searches``
    has (default :func:`solver_pool_size`): the same results, in order."""
    workers = getattr(searches, "_max_workers", None) or solver_pool_size()
    return solve_worker.solve_batch(problems, workers)


def solve_concurrently(requests: Sequence[SolveRequest], workers: Optional[int] = None,
                       wait: bool = True) -> int:
    """Solve the distinct requests that the disk cache does not hold yet (and that no earlier call
    is solving), in the order given, and store the outcomes. The requests are cut into
    :func:`batches`, each flattened by one MiniZinc process and searched instance by instance
    (:func:`tvm_csp_embed.solve.solve_batch`: the same embeddings as one solve each), ``workers``
    batches at a time (default :func:`solver_pool_size`); a batch's searches run on a second pool
    of ``workers`` threads, so they share the cores while the flattening of the next batch runs.
    The batches run in the solver's worker process (:func:`solve_batch`), so that their Python
    work does not hold up the caller's.
    A request that fails is left for the caller's own :func:`cached_embeddings` call to report.

    With ``wait=False`` the solves run in the background: a :func:`cached_embeddings` call for one
    of them waits for that solve only (not for the rest of its batch), so the caller can work on
    the operators whose solves are done while the others run (a build plans its first operator as
    soon as its layouts are solved).

    Returns the number of solves started.
    """
    todo: Dict[str, SolveRequest] = {}
    for r in requests:
        if (r.key not in todo and r.key not in _INFLIGHT
                and not (cache_dir() / f"{r.key}.json").exists()):
            todo[r.key] = r
    if not todo:
        return 0
    futures: Dict[str, Future] = {}
    for key in todo:
        futures[key] = _INFLIGHT[key] = Future()

    def done(key: str) -> None:
        _INFLIGHT.pop(key, None)
        futures[key].set_result(None)

    def one_batch(batch: List[SolveRequest]) -> None:
        try:
            problems = [Problem(r.wl, r.instr, r.mode, solutions=r.solutions, timeout=r.timeout,
                                max_cost=r.max_cost) for r in batch]
            for r, res in zip(batch, solve_batch(problems, searches)):
                if not isinstance(res, Exception):   # decoded by the caller's own call
                    _store(r.key, r.wl, r.instr, r.mode, res)
                done(r.key)
        except Exception:  # noqa: BLE001 -- reported by the caller's own call, in context
            pass
        finally:
            for r in batch:
                if not futures[r.key].done():
                    done(r.key)
    pool = _pool(workers or solver_pool_size())
    searches = _pool(workers or solver_pool_size(), "gecode")
    jobs = [pool.submit(one_batch, b) for b in batches(list(todo.values()))]
    if wait:
        for job in jobs:
            job.result()
    return len(todo)


#: solves queued by :func:`queue_solves` (each with its operator's name) until
#: :func:`start_queued` starts them
_QUEUED: List[Tuple[str, SolveRequest]] = []


def queue_solves(op_name: str, requests: Sequence[SolveRequest]) -> None:
    """Queue the background solves of ``requests`` (the operator ``op_name``'s), to be started
    by :func:`start_queued` together with every other template's, in the module's operator
    order."""
    _QUEUED.extend((op_name, r) for r in requests)


def start_queued(order: Sequence[str] = ()) -> int:
    """Start every queued solve (:func:`queue_solves`) in the background
    (:func:`solve_concurrently` with ``wait=False``), ordered by its operator's place in
    ``order`` (the names of the module's operators, first planned first; an operator not named
    goes last; one operator's requests keep their own order). A build plans its operators in
    that order, so each solve is queued before those of every later operator, whatever its kind:
    ResNeXt-50's first narrow grouped conv2d no longer waits behind the 1x1 conv2d solves of the
    whole network. The order decides only when a solve runs, never its outcome. Returns the number
    of solves started."""
    place = {name: i for i, name in enumerate(order)}
    queued = sorted(_QUEUED, key=lambda item: place.get(item[0], len(place)))   # stable
    _QUEUED.clear()
    return solve_concurrently([r for _, r in queued], wait=False)


def clear_cache() -> int:
    """Delete every cached entry; returns how many files were removed."""
    n = 0
    d = cache_dir()
    if d.exists():
        for p in d.glob("*.json"):
            p.unlink()
            n += 1
    return n
