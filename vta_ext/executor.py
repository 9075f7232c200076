"""Prebuilt VTA operators and the packed function that runs them from the Relax VM.

Each offloaded operator is identified by a JSON key (:func:`op_key`): operator kind, strategy,
configuration name *and value*, workload, epilogue and knobs. The offload pass builds each one at
build time with :func:`compiled_op`; ``relax.call_dps_packed("vta_ext.run", inputs..., key, out)``
then only copies the inputs into the program's DRAM image (``vta_ext.run_placed`` takes an operand
as several parts and writes them side by side there), executes the instruction stream on the
functional simulator and copies the output back. A process that loads a built module without
having built it rebuilds the stream from the key on first use and logs that it did.

Builds are thread-safe: each key is built once, under its own lock, so programs of different keys
build in parallel threads (:func:`compiled_op`). Runs are thread-safe: the simulator of a
configuration is a device, and one lock per device serialises the runs on it (each run writes the operator's DRAM image and the device's SRAMs).
Inside :func:`vta_ext.run_on` the programs run on that device instead (a library with the
original driver ABI, :mod:`vta_ext.device`), under the device's own lock.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import tvm_ffi

from .config import VTAConfig
from .device import active_device

__all__ = ["op_key", "config_digest", "build_spec", "compiled_op", "OpRun", "run_log", "clear_run_log",
           "simulator_for", "cycle_report", "release"]

logger = logging.getLogger("vta_ext")

_COMPILED: Dict[str, object] = {}
_CYCLES: Dict[str, object] = {}
_SIMULATORS: Dict[str, object] = {}
_DEVICE_LOCKS: Dict[str, threading.Lock] = {}
#: guards the tables above; held only to read or change them (a build holds its key's lock,
#: :data:`_KEY_LOCKS`)
_BUILD_LOCK = threading.RLock()


def config_digest(config: VTAConfig) -> str:
    """A hash of the configuration's *value* (its JSON keys, not its name)."""
    text = json.dumps(config.to_dict(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def op_key(kind: str, strategy: str, config: VTAConfig, workload, epilogue: Sequence[tuple],
           knobs) -> str:
    """The JSON key of one compiled operator (what ``vta_ext.run`` receives)."""
    values = dataclasses.asdict(workload) if dataclasses.is_dataclass(workload) else dict(workload)
    return json.dumps({"op": kind, "strategy": strategy, "config": config.name,
                       "config_value": config.to_dict(), "workload": values,
                       "epilogue": [list(stage) for stage in epilogue], "knobs": knobs},
                      sort_keys=True)


@dataclass(frozen=True)
class OpRun:
    """One execution of a VTA operator: its key, counters, wall time and where it ran.

    ``device`` is the name of the device library it ran on (:func:`vta_ext.run_on`), "" for the
    built-in simulator; ``device_cycles`` the device's own clock cycles summed over the
    program's segments (e.g. the RTL's ``VTARtlLastCycles``), None when the device does not
    report cycles. :attr:`cycles` is the cycle model's report either way."""

    op: str
    workload: dict
    stats: object
    seconds: float
    key: str = ""
    device: str = ""
    device_cycles: Optional[int] = None

    @property
    def strategy(self) -> str:
        """The strategy that generated this operator's program."""
        return json.loads(self.key)["strategy"] if self.key else ""

    @property
    def cycles(self):
        """The cycle-model report of this operator's program (static: data does not matter)."""
        return cycle_report(self.key)

    def __repr__(self) -> str:
        where = f", on {self.device}" if self.device else ""
        if self.device_cycles is not None:
            where += f" ({self.device_cycles:,} cycles)"
        return f"OpRun({self.op}, {self.seconds * 1e3:.1f} ms{where}, {self.stats})"


_RUN_LOG: List[OpRun] = []


def run_log() -> List[OpRun]:
    """Executions of VTA operators in this process since the last :func:`clear_run_log`."""
    return list(_RUN_LOG)


def clear_run_log() -> None:
    """Forget the executions recorded so far."""
    _RUN_LOG.clear()


def simulator_for(config: VTAConfig):
    """The process-wide functional simulator of ``config``'s value (SRAMs persist, like a device).

    Two configurations that share a name but differ in value get different simulators."""
    from .sim import FunctionalSimulator

    digest = config_digest(config)
    with _BUILD_LOCK:
        if digest not in _SIMULATORS:
            _SIMULATORS[digest] = FunctionalSimulator(config)
            _DEVICE_LOCKS[digest] = threading.Lock()
    return _SIMULATORS[digest]


def _config_of(spec: dict, config: Optional[VTAConfig]) -> VTAConfig:
    if config is not None and config.to_dict() == spec["config_value"]:
        return config
    return VTAConfig.from_dict(spec["config_value"], name=spec["config"])


def build_spec(spec: dict, config: VTAConfig):
    """Compile the operator that key ``spec`` (a parsed :func:`op_key`) describes for ``config``,
    uncached (e.g. the same operator on another configuration, as a sweep does)."""
    from .strategy import get_template

    template = get_template(spec["op"], spec["strategy"])
    return template.build(config, template.workload_from_dict(spec["workload"]),
                          tuple(tuple(stage) for stage in spec["epilogue"]), spec["knobs"])


def compiled_op(key: str, config: Optional[VTAConfig] = None):
    """The compiled operator for ``key`` (see :func:`op_key`), built and cached on first request.

    ``config`` saves re-validating the configuration when the caller has it; it is used only if its
    value equals the key's.
    """
    def build():
        spec = json.loads(key)
        start = time.perf_counter()
        op = build_spec(spec, _config_of(spec, config))
        logger.info("built VTA %s (%s) %s: %d instructions in %.2f s", spec["op"],
                    spec["strategy"], spec["workload"], op.program.insn_count,
                    time.perf_counter() - start)
        return op
    return _once(_COMPILED, key, build)


def _once(table: Dict[str, object], key: str, make):
    """``table[key]``, made by ``make()`` the first time, under the key's lock
    (:data:`_KEY_LOCKS`): one thread makes it, a thread asking meanwhile waits for it."""
    value = table.get(key)
    if value is not None:
        return value
    with _KEY_LOCKS.hold(key):
        value = table.get(key)
        if value is None:
            value = make()
            with _BUILD_LOCK:
                table[key] = value
    return value


class KeyedLocks:
    """One reentrant lock per key, made when a thread asks for it and dropped when no thread holds
    or waits for it: :meth:`hold` of a key a second thread holds waits for it; other keys do not
    wait."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        #: ``[lock, threads holding or waiting for it]`` per key
        self._locks: Dict[str, list] = {}

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Hold the lock of ``key`` for the block."""
        with self._guard:
            entry = self._locks.setdefault(key, [threading.RLock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]


#: a key is built (and timed) once, by the first thread that asks, while other keys build in
#: other threads (TVM releases the GIL for much of the schedule and the lowering)
_KEY_LOCKS = KeyedLocks()


def _execute(key: str, arrays: List[np.ndarray], out, spec: Optional[str] = None) -> None:
    """Run operator ``key`` on ``arrays``, which form its operands as ``spec`` says (see
    ``vta_ext.run_placed``; None: one array per operand)."""
    op = compiled_op(key)
    info = json.loads(key)
    device = active_device()
    if device is None:
        simulator = simulator_for(op.program.config)
        lock = _DEVICE_LOCKS[config_digest(op.program.config)]
    else:
        simulator, lock = device.simulator(op.program.config), device.lock
    with lock:
        inputs = arrays if spec is None else _placed_inputs(op.program, arrays, spec, info["op"])
        if device is not None:
            simulator.take_cycles()
        start = time.perf_counter()
        try:
            result, stats = op.run(*inputs, simulator=simulator)
        except BaseException:
            op.program.check_placed(report=False)  # forget the stand-ins, keep this error
            raise
        seconds = time.perf_counter() - start
        op.program.check_placed()
        np.from_dlpack(out)[...] = result
        device_cycles = sum(simulator.take_cycles()) \
            if device is not None and device.reports_cycles else None
    _RUN_LOG.append(OpRun(info["op"], info["workload"], stats, seconds, key,
                          device.name if device is not None else "", device_cycles))


def _placed_inputs(program, arrays: List[np.ndarray], spec: str, what: str) -> list:
    """The operands of a ``vta_ext.run_placed`` call. ``spec`` lists the operands separated by
    ``,``, each as parts separated by ``+``; a part is one input tensor, whole (``*``) or its
    channel blocks ``b:e`` (axis 1 of a packed tensor with one batch block: a contiguous view),
    or ``b:e@a`` along axis ``a`` (every axis before it of extent 1: the rows of one channel
    block, a thread-padded output's prefix, ``vta_ext.packing.blocked_prefix``).
    An operand of several parts is a stand-in whose parts
    :meth:`Program.write <vta_ext.runtime.Program.write>` places side by side in DRAM."""
    operands = [p.split("+") for p in spec.split(",")]
    if sum(map(len, operands)) != len(arrays):
        raise ValueError(f"vta_ext.run_placed for {what}: spec {spec!r} does not cover the "
                         f"{len(arrays)} input tensors")
    inputs, tensors = [], iter(arrays)
    for parts in operands:
        group = []
        for part, array in zip(parts, tensors):
            if part != "*":
                blocks, _, axis = part.partition("@")
                axis = int(axis or 1)
                begin, end = (int(v) for v in blocks.split(":"))
                if array.ndim <= axis or any(v != 1 for v in array.shape[:axis]):
                    raise ValueError(f"vta_ext.run_placed for {what}: a slice {part} of a tensor "
                                     f"of shape {array.shape}: only a tensor of extent 1 before "
                                     f"axis {axis} is a contiguous range along it")
                array = array[(slice(None),) * axis + (slice(begin, end),)]
            group.append(array)
        if len(group) == 1:
            inputs.append(group[0])
            continue
        first = group[0].shape
        if any(g.ndim < 2 or g.shape[0] != 1 or g.shape[2:] != first[2:] for g in group):
            raise ValueError(f"vta_ext.run_placed for {what}: parts {[g.shape for g in group]} "
                             "are not packed tensors with one batch block that differ only in "
                             "the channel-block axis (their byte concatenation would not be "
                             "their concat)")
        shape = (1, sum(g.shape[1] for g in group)) + tuple(first[2:])
        inputs.append(program.placed(group, shape, group[0].dtype))
    return inputs


@tvm_ffi.register_global_func("vta_ext.run")
def _run(*args) -> None:
    """DPS entry: ``inputs..., key, out``; runs the prebuilt program on the simulator."""
    _execute(str(args[-2]), [np.from_dlpack(t) for t in args[:-2]], args[-1])


@tvm_ffi.register_global_func("vta_ext.run_placed")
def _run_placed(*args) -> None:
    """DPS entry: ``inputs..., spec, key, out``. ``spec`` (e.g. ``"*+0:3,*"``) says how the input
    tensors form the operands: operands separated by ``,``, the parts of one by ``+``, a part
    whole (``*``) or channel blocks ``b:e`` of a packed tensor with one batch block (a view, no
    copy), or ``b:e@a`` along axis ``a`` (:func:`_placed_inputs`). An operand of several parts is
    their concat along the channel-block axis, written part by part into the operand's DRAM
    buffer: no host concatenation, no host slice."""
    _execute(str(args[-2]), [np.from_dlpack(t) for t in args[:-3]], args[-1], str(args[-3]))


def cycle_report(key: str):
    """Cycle-model timing of the compiled operator ``key`` (computed once, then cached)."""
    from .sim.cycles import CycleModel

    def run():
        program = compiled_op(key).program
        return CycleModel(program.config).run_program(program)
    return _once(_CYCLES, key, run)


def release(config: VTAConfig) -> int:
    """Forget the compiled operators, cycle reports and simulator of ``config``'s value (a
    configuration sweep is done with them); returns how many compiled operators were dropped.

    Nothing is lost: a later :func:`compiled_op` or run of one of their keys builds it again."""
    value = config.to_dict()
    with _BUILD_LOCK:
        keys = [k for k in list(_COMPILED) + list(_CYCLES)
                if json.loads(k)["config_value"] == value]
        dropped = sum(_COMPILED.pop(k, None) is not None for k in keys)
        for k in keys:
            _CYCLES.pop(k, None)
        digest = config_digest(config)
        _SIMULATORS.pop(digest, None)
        _DEVICE_LOCKS.pop(digest, None)
    return dropped
