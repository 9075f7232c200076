"""The solver's own Python work in a process of its own.

A build solves in the background while it plans (:func:`tvm_csp_embed.cache.solve_concurrently`).
The MiniZinc and Gecode runs are processes anyway, but :func:`~tvm_csp_embed.solve.solve_batch`
also does Python work per instance (the model's data, cutting a batch's FlatZinc apart, reading
the solutions): 10-30 ms each, about a fifth of a cold build's own CPU, and while a solver thread
runs it the planning thread waits for Python's interpreter lock. :func:`solve_batch` runs the
same function in one worker process per build process instead, so that work runs beside the
planning on another core. The results are the same objects, in the same order.

The worker is started by ``import tvm_csp_embed`` (:func:`start`; ``python -c``, importing only
:mod:`tvm_csp_embed.solve` and what it needs, not TVM: about 0.2 s, in the background), or on
first use in a process that has none (a forked child), and ends when its parent closes its input. It runs at a lower
priority (``$TVM_CSP_EMBED_SOLVER_NICE``, default 10), and so do the MiniZinc and Gecode runs it
starts: the planning thread goes first, and the solves use the cycles it leaves. It serves the
batches it is sent concurrently, each on a thread of its own, and the searches of every batch on
one pool of ``workers`` threads (``workers`` as the caller sends it). Messages are pickles, each
after its length (8 bytes).
"""
from __future__ import annotations

import atexit
import itertools
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterator, Optional, Sequence, Union

__all__ = ["NICE_ENV", "DEFAULT_NICE", "solver_nice", "start", "solve_batch", "serve"]

_HEADER = struct.Struct("<Q")
#: environment variable: the niceness the worker (and so every MiniZinc and Gecode run of the
#: build) adds to its own (default :data:`DEFAULT_NICE`; 0 keeps the build's priority)
NICE_ENV = "TVM_CSP_EMBED_SOLVER_NICE"
#: the worker's default niceness: the planning thread, which waits for the solves it needs first
#: and for nothing else, goes first; the solves take the cycles it leaves (figures:
#: docs/results.md, "Sixth session")
DEFAULT_NICE = 10
#: the worker's start: :mod:`tvm_csp_embed` as a bare package (no ``__init__``: no TVM), then serve
_BOOT = ("import os, sys, types; os.nice({nice}); pkg = types.ModuleType('tvm_csp_embed'); "
         "pkg.__path__ = [{path!r}]; sys.modules['tvm_csp_embed'] = pkg; "
         "from tvm_csp_embed.solve_worker import serve; serve()")


def solver_nice() -> int:
    """The niceness the solver worker adds: ``$TVM_CSP_EMBED_SOLVER_NICE``, else
    :data:`DEFAULT_NICE`."""
    env = os.environ.get(NICE_ENV)
    if env is None or env == "":
        return DEFAULT_NICE
    try:
        n = int(env)
    except ValueError:
        raise ValueError(f"{NICE_ENV}={env!r} is not a number; set it to the niceness (0-19) the "
                         "solver processes add, e.g. 10, or 0 for none") from None
    if not 0 <= n <= 19:
        raise ValueError(f"{NICE_ENV}={n}: set it to a niceness from 0 to 19")
    return n


def _send(stream, lock: threading.Lock, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    with lock:
        stream.write(_HEADER.pack(len(data)) + data)
        stream.flush()


def _receive(stream) -> Any:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    n = _HEADER.unpack(head)[0]
    data = stream.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


# ------------------------------------------------------------------------------------ the worker
def serve() -> None:
    """The worker's loop: read ``(request id, problems, workers)`` messages from standard input,
    answer each problem's result as ``(request id, index, result)`` and every request's end as
    ``(request id, None, None)`` on standard output, until the input ends."""
    from .solve import solve_batch as batch

    out, lock = sys.stdout.buffer, threading.Lock()
    inp = sys.stdin.buffer
    pools: Dict[int, ThreadPoolExecutor] = {}

    def run(rid: int, problems, workers: int) -> None:
        try:
            pool = pools.setdefault(workers, ThreadPoolExecutor(workers, thread_name_prefix="gecode"))
            for i, res in enumerate(batch(problems, pool)):
                _send(out, lock, (rid, i, res))
        except BaseException as err:  # noqa: BLE001 -- the caller's batch ends with it
            _send(out, lock, (rid, -1, RuntimeError(f"solver worker: {err!r}")))
        _send(out, lock, (rid, None, None))
    while True:
        try:
            rid, problems, workers = _receive(inp)
        except EOFError:
            return
        threading.Thread(target=run, args=(rid, problems, workers), daemon=True).start()


# ------------------------------------------------------------------------------------ the client
class _Worker:
    """The worker process of this process, and the answers it sends, by request."""

    def __init__(self) -> None:
        path = os.path.dirname(os.path.abspath(__file__))
        self.proc = subprocess.Popen([sys.executable, "-c", _BOOT.format(path=path, nice=solver_nice())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.lock = threading.Lock()
        self.answers: Dict[int, "queue.Queue"] = {}
        self.ids = itertools.count()
        threading.Thread(target=self._read, daemon=True, name="solver-worker").start()

    def _read(self) -> None:
        try:
            while True:
                rid, i, res = _receive(self.proc.stdout)
                q = self.answers.get(rid)
                if q is not None:       # (None: its caller stopped reading, e.g. after the last)
                    q.put((i, res))
        except (EOFError, OSError, pickle.UnpicklingError):
            pass
        for q in list(self.answers.values()):    # the worker is gone: end every open request
            q.put((-1, RuntimeError("the solver worker process ended")))
            q.put((None, None))

    def batch(self, problems: Sequence[Any], workers: int) -> Iterator[Any]:
        rid = next(self.ids)
        q: "queue.Queue" = queue.Queue()
        self.answers[rid] = q
        try:
            try:
                _send(self.proc.stdin, self.lock, (rid, list(problems), workers))
            except (OSError, ValueError) as err:   # a closed pipe: the worker is gone
                raise RuntimeError(f"the solver worker process ended (exit status "
                                   f"{self.proc.poll()}): {err}") from err
            while True:
                i, res = q.get()
                if i is None:
                    return
                if i < 0:
                    raise res
                yield res
        finally:
            self.answers.pop(rid, None)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass


_WORKER: Optional[_Worker] = None
_WORKER_LOCK = threading.Lock()


def _worker() -> _Worker:
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None or _WORKER.proc.poll() is not None:
            _WORKER = _Worker()
            atexit.register(_WORKER.close)
        return _WORKER


def start() -> None:
    """Start the worker now, so that a build's first solves do not wait for its start-up (about
    0.2 s; ``import tvm_csp_embed`` calls this). A bad ``$TVM_CSP_EMBED_SOLVER_NICE`` is left for
    the first solve to report."""
    try:
        _worker()
    except (ValueError, OSError):
        pass


def solve_batch(problems: Sequence[Any], workers: int = 2) -> Iterator[Union[Any, Exception]]:
    """:func:`tvm_csp_embed.solve.solve_batch` of ``problems`` run in the worker process (its
    searches on ``workers`` threads there): the same results, in order, as each is done.

    Raises
    ------
    RuntimeError
        If the worker process ends or fails before the batch is done.
    """
    return _worker().batch(problems, workers)
