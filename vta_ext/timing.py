"""Where a build's time goes: named phases, timed exclusively (a nested phase pauses its parent).

The offload pass opens a :class:`PhaseTimer` per build and publishes its totals with the build
report (``BuildReport.timings``); code anywhere below it marks its work with :func:`phase`:

.. code-block:: python

    with phase("solve"):
        ...

Outside a build (no timer open) :func:`phase` costs nothing and records nothing. The phases the
project uses are :data:`PHASES`; a name not listed is recorded as given.
"""
from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Dict, Iterator, List, Optional

__all__ = ["PHASES", "PhaseTimer", "phase", "current_timer"]

#: the phases of a build, in pipeline order
PHASES = {
    "offload": "the offload pass itself: matching, host relayout emission, report",
    "solve": "MiniZinc solves of embeddings (cache misses), the concurrent pool included",
    "plan": "planning outside the solver: candidates, packed programs, the plan cache",
    "choice": "timing candidate embeddings on the cycle model and choosing one",
    "knob search": "the knob search (TPS point) of the chosen and the timed plans",
    "codegen": "generating the VTA program of each chosen operator",
}


class PhaseTimer:
    """Exclusive seconds per phase name (see the module docstring)."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}
        self._stack: List[List] = []   # [name, start of the running slice]

    def __repr__(self) -> str:
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items())
        return f"PhaseTimer({parts})"

    def _add(self, name: str, now: float, start: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + (now - start)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as ``name``; the enclosing phase pauses meanwhile."""
        now = time.perf_counter()
        if self._stack:
            parent = self._stack[-1]
            self._add(parent[0], now, parent[1])
        self._stack.append([name, now])
        try:
            yield
        finally:
            now = time.perf_counter()
            top = self._stack.pop()
            self._add(top[0], now, top[1])
            if self._stack:
                self._stack[-1][1] = now

    @property
    def total(self) -> float:
        """Seconds over every phase."""
        return sum(self.seconds.values())


_CURRENT: contextvars.ContextVar = contextvars.ContextVar("vta_ext_phase_timer", default=None)


def current_timer() -> Optional[PhaseTimer]:
    """The timer of the build in progress, or None."""
    return _CURRENT.get()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as phase ``name`` of the build in progress (nothing outside a build)."""
    timer = _CURRENT.get()
    if timer is None:
        yield
        return
    with timer.phase(name):
        yield


@contextlib.contextmanager
def timed_build() -> Iterator[PhaseTimer]:
    """Open a fresh :class:`PhaseTimer` for one build (the offload pass does this)."""
    timer = PhaseTimer()
    token = _CURRENT.set(timer)
    try:
        with timer.phase("offload"):
            yield timer
    finally:
        _CURRENT.reset(token)
