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

import hashlib
import json
import os
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from vta_ext.timing import phase

from .embedding import Embedding, decode
from .instructions import InstructionGraph
from .solve import CONSTRAINT_SETS, MODEL, RawSolution, solve
from .workload import Workload

__all__ = ["CACHE_ENV", "SOLVERS_ENV", "cache_dir", "cache_key", "CachedSolve", "SolveRequest",
           "cached_embeddings", "solve_concurrently", "solver_pool_size", "clear_cache"]

#: environment variable naming the cache directory
CACHE_ENV = "TVM_CSP_EMBED_CACHE"
#: environment variable bounding the MiniZinc processes a build runs at once (default: the cores)
SOLVERS_ENV = "TVM_CSP_EMBED_SOLVERS"
_VERSION = 1


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
    ``max_cost``), from the disk cache or solved now (one MiniZinc process,
    :func:`tvm_csp_embed.solve.solve`) and stored.

    Raises
    ------
    tvm_csp_embed.solve.SolverError
        If MiniZinc itself fails (not cached).
    """
    key = cache_key(wl, instr, mode, solutions, max_cost)
    pending = _INFLIGHT.get(key) if use_cache else None
    if pending is not None:     # solving in the background pool (solve_concurrently): wait for it
        with phase("solve"):
            pending.result()
    return _cached_or_solved(key, wl, instr, mode, solutions, timeout, cfg, max_cost, use_cache)


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
    embs = [decode(s, wl, instr, mode, cfg) for s in res.solutions]
    stats = {"runs": res.stats.runs, "nodes": res.stats.nodes, "flatten_seconds": res.stats.flatten_seconds,
             "solve_seconds": res.stats.solve_seconds}
    if use_cache and res.status in ("ok", "infeasible"):
        _write(path, {"key": key, "workload": wl.name, "instruction": instr.name, "mode": mode,
                      "status": res.status, "message": res.message, "seconds": res.stats.wall_seconds,
                      "stats": stats, "solutions": [_raw_to_json(s) for s in res.solutions]})
    return CachedSolve(res.status, embs, res.message, False, res.stats.wall_seconds, stats)


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
_POOL: Dict[int, ThreadPoolExecutor] = {}
_POOL_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """The process-wide pool of ``workers`` solver threads (each runs one MiniZinc process)."""
    with _POOL_LOCK:
        if workers not in _POOL:
            _POOL[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="minizinc")
        return _POOL[workers]


def solve_concurrently(requests: Sequence[SolveRequest], workers: Optional[int] = None,
                       wait: bool = True) -> int:
    """Solve the distinct requests that the disk cache does not hold yet (and that no earlier call
    is solving), ``workers`` MiniZinc processes at a time (default :func:`solver_pool_size`), in
    the order given, and store the outcomes. A request that fails is left for the caller's own
    :func:`cached_embeddings` call to report.

    With ``wait=False`` the solves run in the background: a :func:`cached_embeddings` call for one
    of them waits for that solve only, so the caller can work on the operators whose solves are
    done while the others run (a build plans its first operator as soon as its layouts are solved).

    Returns the number of solves started.
    """
    todo: Dict[str, SolveRequest] = {}
    for r in requests:
        if (r.key not in todo and r.key not in _INFLIGHT
                and not (cache_dir() / f"{r.key}.json").exists()):
            todo[r.key] = r
    if not todo:
        return 0

    def one(r: SolveRequest) -> None:
        try:
            _cached_or_solved(r.key, r.wl, r.instr, r.mode, r.solutions, r.timeout, r.cfg,
                              r.max_cost, True)
        except Exception:  # noqa: BLE001 -- reported by the caller's own call, in context
            pass
    pool = _pool(workers or solver_pool_size())
    futures = []
    for key, r in todo.items():
        fut = pool.submit(one, r)
        _INFLIGHT[key] = fut
        fut.add_done_callback(lambda _f, key=key: _INFLIGHT.pop(key, None))
        if fut.done():                       # finished before it was registered
            _INFLIGHT.pop(key, None)
        futures.append(fut)
    if wait:
        for fut in futures:
            fut.result()
    return len(todo)


def clear_cache() -> int:
    """Delete every cached entry; returns how many files were removed."""
    n = 0
    d = cache_dir()
    if d.exists():
        for p in d.glob("*.json"):
            p.unlink()
            n += 1
    return n
