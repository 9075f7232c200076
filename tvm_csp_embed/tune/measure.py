"""Measuring knob points: compile the point, run the cycle model; verify the best bit for bit.

* :func:`measure_point` compiles one knob point with the strategy's template
  (:meth:`vta_ext.strategy.OpTemplate.build`) and times the program with the cycle model
  (:class:`vta_ext.sim.cycles.CycleModel`): cycles are the cost. It never raises: a failure is a
  :class:`MeasureResult` with ``error`` set (never a best point).
* :func:`verify_point` runs the compiled point on the functional simulator with random inputs and
  compares the output with an independent numpy reference of the operator
  (:mod:`tvm_csp_embed.reference`), bit for bit.

Both take ``device``, the path of a library with the VTA driver ABI that reports cycles (the
vta-hw RTL, :mod:`vta_ext.device`): the point's program then runs there, its cycles are the
device's own (as AutoTVM measured on boards) and the result names the device; the verification
runs there too.

Both are plain module-level functions of JSON-able arguments (a task's :meth:`~Task.spec` and a
knob dict), so runners can execute them in worker processes or on a Dask cluster.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional

import numpy as np

from ..reference import reference_for

__all__ = ["MeasureResult", "measure_point", "verify_point", "measure_device"]


@dataclass(frozen=True)
class MeasureResult:
    """The outcome of measuring one knob point.

    Attributes
    ----------
    knobs : dict
        The point.
    cycles : int or None
        Total cycles of the program (cycle model); None if the measurement failed.
    error : str or None
        Why the measurement failed (exception type and message), else None.
    dram_bytes : int
        DRAM bytes the program moves (loads and stores, micro-ops included).
    insns : int
        Instructions of the program.
    build_seconds : float
        Wall time of compiling the point.
    verified : bool
        True for the result of a successful bit-exact check on the functional simulator (or on
        ``device``).
    timestamp : float
        When the measurement finished (``time.time()``).
    device : str
        The library the cycles were measured on (its file name), "" for the cycle model.
    """

    knobs: Dict[str, Any]
    cycles: Optional[int] = None
    error: Optional[str] = None
    dram_bytes: int = 0
    insns: int = 0
    build_seconds: float = 0.0
    verified: bool = False
    timestamp: float = field(default_factory=time.time)
    device: str = ""

    @property
    def ok(self) -> bool:
        """Whether the point was measured (no error)."""
        return self.error is None and self.cycles is not None

    def to_dict(self) -> Dict[str, Any]:
        """The fields as a dict (what a record line holds; ``device`` only when measured on
        one)."""
        values = asdict(self)
        if not self.device:
            del values["device"]
        return values

    def __repr__(self) -> str:
        what = f"{self.cycles:,} cycles" if self.ok else f"error: {self.error}"
        return f"MeasureResult({what}{', verified' if self.verified else ''}, knobs {self.knobs})"


def _task(spec: Dict[str, Any]):
    from .task import Task

    return Task.from_spec(spec)


def _build(task, knobs: Dict[str, Any]):
    return task.template.build(task.config, task.workload, task.epilogue, dict(knobs))


_DEVICES: Dict[str, Any] = {}


def measure_device(path: str):
    """The device of library ``path``, opened once per process.

    Raises
    ------
    vta_ext.device.DeviceError
        If the library cannot be opened or reports no cycles."""
    from vta_ext.device import DeviceError, open_device

    dev = _DEVICES.get(path)
    if dev is None:
        dev = open_device(path)
        if not dev.reports_cycles:
            raise DeviceError(f"{path}: this library reports no cycles (no VTARtlLastCycles): "
                              "tuning cannot measure on it; give the vta-hw RTL")
        _DEVICES[path] = dev
    return dev


def measure_point(spec: Dict[str, Any], knobs: Dict[str, Any],
                  device: Optional[str] = None) -> MeasureResult:
    """Compile ``knobs`` for the task ``spec`` and run the cycle model (or ``device``); never
    raises.

    Parameters
    ----------
    spec : dict
        :meth:`Task.spec` of the task.
    knobs : dict
        A point of the task's knob space.
    device : str, optional
        Path of a library that reports cycles (the vta-hw RTL): the program runs there (on
        the inputs it was built with: VTA's timing does not depend on data) and its cycles are
        the device's.

    Returns
    -------
    MeasureResult
        With ``cycles``, or with ``error`` if compiling or timing raised.
    """
    from vta_ext.sim.cycles import CycleModel

    start = time.perf_counter()
    try:
        task = _task(spec)
        compiled = _build(task, knobs)
        seconds = time.perf_counter() - start
        report = CycleModel(task.config).run_program(compiled.program)
        cycles = int(report.total_cycles)
        if device is not None:
            dev = measure_device(device)
            cycles = int(dev.run_program(compiled.program).cycles)
    except Exception as err:  # recorded as an error result, never as best
        return MeasureResult(dict(knobs), None, f"{type(err).__name__}: {err}",
                             build_seconds=time.perf_counter() - start,
                             device=_device_name(device))
    return MeasureResult(dict(knobs), cycles, None,
                         int(sum(report.dram_bytes.values())), int(compiled.program.insn_count),
                         seconds, device=_device_name(device))


def _device_name(device: Optional[str]) -> str:
    from pathlib import Path

    return Path(device).name if device else ""


def verify_point(spec: Dict[str, Any], knobs: Dict[str, Any], seed: int = 0,
                 device: Optional[str] = None) -> Optional[str]:
    """Check ``knobs`` bit for bit on the functional simulator (or ``device``, a library path)
    against the numpy reference.

    Parameters
    ----------
    spec : dict
        :meth:`Task.spec` of the task.
    knobs : dict
        The point.
    seed : int
        Seed of the random inputs.
    device : str, optional
        Path of a library with the VTA driver ABI to run on.

    Returns
    -------
    str or None
        None if the output equals the reference; otherwise what differs (or what failed).
    """
    from vta_ext.sim import FunctionalSimulator

    try:
        task = _task(spec)
        reference = reference_for(task.kind, task.strategy)
        inputs, expected, *unpack = reference(task.config, task.workload, task.epilogue,
                                              np.random.default_rng(seed))
        compiled = _build(task, knobs)
        simulator = FunctionalSimulator(task.config) if device is None else \
            measure_device(device).simulator(task.config)
        out, _ = compiled.run(*inputs, simulator=simulator)
        out = np.asarray(unpack[0](out) if unpack else out)
    except Exception as err:
        return f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
    if out.shape != expected.shape:
        return f"output shape {out.shape}, reference {expected.shape}"
    wrong = int(np.count_nonzero(out != expected))
    if wrong:
        return f"{wrong} of {out.size} output values differ from the numpy reference"
    return None
