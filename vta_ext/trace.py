"""VTA runs as a trace that Perfetto and ``chrome://tracing`` open (Chrome Trace Event Format).

:func:`export_trace` writes the JSON object form of the format (``{"traceEvents": [...]}``) for a
list of operator runs (default: :func:`vta_ext.executor.run_log`). Each run is timed again by the
cycle model (:class:`vta_ext.sim.cycles.CycleModel` with ``record_timeline=True``), which gives
every instruction its module, start and end cycle. In the file:

* one process per VTA call, named by operator, call number, shapes and strategy (e.g.
  ``conv2d #3 (1x64x56x56 -> 64, csp-relaxed)``); the calls are laid back to back, in order (the
  host's time between them is not modelled);
* one thread per module: ``fetch``, ``load``, ``compute``, ``store``. The cycle model has no fetch
  module (each instruction's issue cost is part of its own duration), so the ``fetch`` thread is
  named and empty;
* every instruction a complete event (``"ph": "X"``) on its module's thread, with its stream index,
  disassembly, opcode and every field (sizes, strides, micro-op range) in ``args``;
* every dependency token that is pushed and popped a flow (``"ph": "s"`` on the pushing
  instruction, ``"ph": "f"`` on the popping one, named by its queue, e.g. ``l2g``), paired as the
  cycle model pairs them: the k-th push of a queue with its k-th pop, per program segment. Both
  ends are placed at the middle of their instruction so that each binds to it (the token itself
  moves when the pushing instruction ends);
* the DRAM bytes moved so far, per memory type, as a counter (``"ph": "C"``);
* where the run reports a device's own total (``run.device`` and ``run.device_cycles``, e.g. a
  hardware run), an instant event at that many cycles after the call's start.

Times: the cycle model counts cycles; the format's ``ts`` and ``dur`` are microseconds, so every
time is ``cycles / CLOCK_MHZ`` of the call's configuration (``otherData`` says so).
"""
from __future__ import annotations

import dataclasses
import json
from enum import IntEnum
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from .isa import STAGE_QUEUES, AluOp, MemInsn, MemType, Opcode, insn_stage

__all__ = ["export_trace", "trace_events", "THREADS"]

#: the thread id of each module; the cycle model times load, compute and store
THREADS = {"fetch": 0, "load": 1, "compute": 2, "store": 3}


def _shape_text(workload: dict) -> str:
    """``1x64x56x56 -> 64`` (input shape -> output channels or features) of a run's workload."""
    w = dict(workload)
    if isinstance(w.get("params"), (list, tuple)):   # a CSP plan's workload: named parameters
        w = {str(k): v for k, v in w["params"]}
        if all(k in w for k in "nchwk"):
            w = {"batch": w["n"], "in_channels": w["c"], "height": w["h"], "width": w["w"],
                 "out_channels": w["k"]}
    if all(w.get(k) is not None for k in ("batch", "in_channels", "height", "width")):
        out = w.get("out_channels")
        return (f"{w['batch']}x{w['in_channels']}x{w['height']}x{w['width']}"
                + ("" if out is None else f" -> {out}"))
    if all(w.get(k) is not None for k in ("batch", "in_features", "out_features")):
        return f"{w['batch']}x{w['in_features']} -> {w['out_features']}"
    if all(w.get(k) is not None for k in ("batch", "channels", "height", "width")):
        return f"{w['batch']}x{w['channels']}x{w['height']}x{w['width']}"
    return ", ".join(f"{k} {v}" for k, v in w.items() if isinstance(v, int))


def _insn_name(insn) -> str:
    """The slice name of an instruction: ``LOAD INP``, ``NOP-STORE``, ``GEMM``, ``ALU-ADD``..."""
    op = Opcode(insn.opcode).name
    if isinstance(insn, MemInsn):
        if insn.is_nop():
            return f"NOP-{op}"
        mem = insn.memory_type
        return f"{op} {MemType(mem).name if mem in MemType._value2member_map_ else mem}"
    if op == "GEMM":
        return "GEMM-RST" if insn.reset_reg else "GEMM"
    if op == "ALU":
        alu = insn.alu_opcode
        return f"ALU-{AluOp(alu).name if alu in AluOp._value2member_map_ else alu}"
    return op


def _fields(insn) -> Dict[str, object]:
    """Every field of an instruction, enums by name."""
    out = {}
    for key, value in dataclasses.asdict(insn).items():
        if isinstance(value, IntEnum):
            value = value.name
        elif isinstance(value, bool):
            value = int(value)
        out[key] = value
    out["opcode"] = Opcode(insn.opcode).name
    return out


def _token_queues(insn) -> Tuple[List[str], List[str]]:
    """The queues ``insn`` pops and pushes (its header flags on its module's queues)."""
    queues = STAGE_QUEUES[insn_stage(insn)]
    pops = [q for flag, q in queues.pops() if getattr(insn, flag)]
    pushes = [q for flag, q in queues.pushes() if getattr(insn, flag)]
    return pops, pushes


def _call_events(run, pid: int, name: str, offset: float, flow_ids: List[int]
                 ) -> Tuple[List[dict], float, float]:
    """The events of one run as process ``pid`` starting at ``offset`` microseconds:
    ``(events, its duration in microseconds, the configuration's clock in MHz)``."""
    from .executor import compiled_op
    from .sim.cycles import CycleModel, _Costs

    program = compiled_op(run.key).program
    config = program.config
    mhz = float(config.CLOCK_MHZ)
    report = CycleModel(config, record_timeline=True).run_program(program)
    costs = _Costs(config)

    def us(cycles: float) -> float:
        return offset + cycles / mhz

    events: List[dict] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "ts": 0, "args": {"name": name}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "ts": 0,
         "args": {"sort_index": pid}},
        {"name": "process_labels", "ph": "M", "pid": pid, "tid": 0, "ts": 0,
         "args": {"labels": f"{config.name}, {mhz:g} MHz, {report.total_cycles:,} cycles"}}]
    for module, tid in THREADS.items():
        label = module if module != "fetch" else "fetch (not modelled: issue is in each insn)"
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "ts": 0,
                       "args": {"name": label}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "ts": 0,
                       "args": {"sort_index": tid}})
    slices: Dict[int, dict] = {}
    dram = {}
    counters = [{"name": "DMA bytes", "ph": "C", "pid": pid, "tid": 0, "ts": us(0), "args": {}}]
    for (module, start, end, kind), index in zip(report.timeline, report.timeline_index):
        insn = program.insns[index]
        _, counter, nbytes, _, _ = costs.of(insn)
        args = {"index": index, "insn": str(insn), "cycles": end - start, "start_cycle": start,
                **_fields(insn)}
        if counter is not None:
            args["dram_bytes"] = nbytes
        if hasattr(insn, "uop_bgn"):
            args["uops"] = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
        slices[index] = {"name": _insn_name(insn), "cat": kind, "ph": "X", "pid": pid,
                         "tid": THREADS[module], "ts": us(start), "dur": (end - start) / mhz,
                         "args": args}
        if counter is not None:
            dram[counter] = dram.get(counter, 0) + nbytes
            counters.append({"name": "DMA bytes", "ph": "C", "pid": pid, "tid": 0, "ts": us(end),
                             "args": dict(dram)})
    counters[0]["args"] = {key: 0 for key in dram}   # every series starts at 0
    events += sorted(slices.values(), key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    events += sorted(counters, key=lambda e: e["ts"])
    events += _flows(program, slices, pid, flow_ids)
    device_cycles = getattr(run, "device_cycles", None)
    if device_cycles is not None:
        device = getattr(run, "device", None) or "device"
        events.append({"name": f"{device}: {device_cycles:,} cycles", "ph": "i", "s": "p",
                       "pid": pid, "tid": 0, "ts": us(device_cycles),
                       "args": {"device": device, "device_cycles": device_cycles,
                                "model_cycles": report.total_cycles}})
    return events, report.total_cycles / mhz, mhz


def _flows(program, slices: Dict[int, dict], pid: int, flow_ids: List[int]) -> List[dict]:
    """Flow events of the tokens pushed and popped, paired in order over the whole program (the
    token counts persist across segments, as in the cycle model, fsim and the RTL)."""
    events = []
    pushed: Dict[str, List[int]] = {}
    popped: Dict[str, List[int]] = {}
    for index, insn in enumerate(program.insns):
        pops, pushes = _token_queues(insn)
        for q in pops:
            popped.setdefault(q, []).append(index)
        for q in pushes:
            pushed.setdefault(q, []).append(index)
    for queue, pushers in pushed.items():
        for pusher, popper in zip(pushers, popped.get(queue, [])):
            flow_ids[0] += 1
            src, dst = slices[pusher], slices[popper]
            common = {"name": queue, "cat": "token", "id": flow_ids[0], "pid": pid}
            events.append({**common, "ph": "s", "tid": src["tid"],
                           "ts": src["ts"] + src["dur"] / 2})
            events.append({**common, "ph": "f", "bp": "e", "tid": dst["tid"],
                           "ts": dst["ts"] + dst["dur"] / 2})
    return events


def trace_events(runs: Optional[Sequence] = None) -> dict:
    """The trace of ``runs`` as the JSON object of the Chrome Trace Event Format.

    Parameters
    ----------
    runs : sequence of vta_ext.executor.OpRun, optional
        The VTA calls, in order; default: :func:`vta_ext.executor.run_log`.

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}``.
    """
    from .executor import run_log

    runs = run_log() if runs is None else list(runs)
    events: List[dict] = []
    offset = 0.0
    clocks: Dict[str, float] = {}
    flow_ids = [0]
    for number, run in enumerate(runs, start=1):
        name = f"{run.op} #{number} ({_shape_text(run.workload)}, {run.strategy})"
        call, duration, mhz = _call_events(run, number, name, offset, flow_ids)
        events += call
        clocks[json.loads(run.key)["config"]] = mhz
        offset += duration
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"generator": "vta_ext.trace (the VTA cycle model)",
                          "time_unit": "ts and dur are microseconds: cycles / CLOCK_MHZ of the "
                                       "call's configuration",
                          "clock_mhz": clocks, "calls": len(runs),
                          "layout": "one process per VTA call, back to back (host time between "
                                    "calls not modelled); threads fetch (not modelled), load, "
                                    "compute, store"}}


def export_trace(path: Union[str, Path], runs: Optional[Sequence] = None) -> Path:
    """Write the trace of VTA ``runs`` to ``path`` (JSON; open it in https://ui.perfetto.dev or
    ``chrome://tracing``).

    Parameters
    ----------
    path : str or Path
        The file to write (parent directories are created).
    runs : sequence of vta_ext.executor.OpRun, optional
        The VTA calls, in order; default: :func:`vta_ext.executor.run_log` (every call since the
        last :func:`vta_ext.clear_run_log`).

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    ValueError
        If there is no run to trace (run the model first, or pass ``runs``).
    """
    runs = list(runs) if runs is not None else None
    data = trace_events(runs)
    if not data["otherData"]["calls"]:
        raise ValueError(f"export_trace {path}: no VTA call to trace; run a model built for "
                         "ext_vta first (the run log is empty), or pass runs=")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    return path
