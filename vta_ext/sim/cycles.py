"""An explainable cycle model of VTA (our "tsim").

Load, compute and store are separate modules, each executing its instruction queue in order. They
are linked by the four dependency-token queues (load→compute, compute→load, compute→store,
store→compute): an instruction starts when its module is free and every token it pops has been
pushed; its pushes happen when it finishes. Durations come from the configuration:

* LOAD/STORE: ``INSN_ISSUE_CYCLES + y_size * DMA_OVERHEAD_CYCLES + ceil(DRAM bytes /
  MEM_BYTES_PER_CYCLE)`` plus one cycle per padding element written into SRAM; a NOP takes the
  issue cycles only;
* GEMM: ``INSN_ISSUE_CYCLES + iter_out * iter_in * uops * GEMM_CYCLES_PER_UOP``;
* ALU: the same with ``ALU_CYCLES_PER_UOP_IMM`` or ``ALU_CYCLES_PER_UOP_VEC``;
* FINISH: ``INSN_ISSUE_CYCLES``.

The schedule is a max-plus system, so the model is monotone: lower per-uop cycles or more bytes per
cycle never increase the total. It is a model, not the hardware: see ``docs/isa.md`` for where the
constants come from.
"""
from __future__ import annotations

import itertools
import operator
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..config import VTAConfig
from ..isa import (STAGE_QUEUES, TOKEN_QUEUES, AluInsn, GemmInsn, Insn, MemInsn, MemType, Opcode,
                   Stage, insn_stage, stage_of)

__all__ = ["CycleModel", "CycleReport", "ModuleTime", "DeadlockError", "insn_cycles"]


class DeadlockError(RuntimeError):
    """The token pattern of a stream can never let every instruction run."""


@dataclass
class ModuleTime:
    """Busy, stall (waiting for a token) and idle cycles of one module."""

    busy: int = 0
    stall: int = 0
    idle: int = 0
    insns: int = 0


@dataclass
class CycleReport:
    """Result of the cycle model for one or more instruction streams run back to back."""

    config: VTAConfig
    total_cycles: int = 0
    modules: Dict[str, ModuleTime] = field(default_factory=lambda: {s.name.lower(): ModuleTime()
                                                                     for s in Stage})
    dram_bytes: Dict[str, int] = field(default_factory=lambda: defaultdict(int))
    macs: int = 0
    alu_ops: int = 0
    timeline: List[Tuple[str, int, int, str]] = field(default_factory=list, repr=False)

    @property
    def milliseconds(self) -> float:
        """Accelerator time at the configuration's clock."""
        return self.total_cycles / (self.config.CLOCK_MHZ * 1e3)

    def __add__(self, other: "CycleReport") -> "CycleReport":
        out = CycleReport(self.config, self.total_cycles + other.total_cycles)
        for name in out.modules:
            a, b = self.modules[name], other.modules[name]
            out.modules[name] = ModuleTime(a.busy + b.busy, a.stall + b.stall, a.idle + b.idle,
                                           a.insns + b.insns)
        for src in (self.dram_bytes, other.dram_bytes):
            for key, value in src.items():
                out.dram_bytes[key] += value
        out.macs = self.macs + other.macs
        out.alu_ops = self.alu_ops + other.alu_ops
        out.timeline = self.timeline + [(m, s + self.total_cycles, e + self.total_cycles, k)
                                        for m, s, e, k in other.timeline]
        return out

    def summary(self) -> str:
        lines = [f"{self.total_cycles:,} cycles ({self.milliseconds:.3f} ms at "
                 f"{self.config.CLOCK_MHZ} MHz), {self.macs:,} MACs"]
        for name, t in self.modules.items():
            lines.append(f"  {name:<8} busy {t.busy:>12,}  stall {t.stall:>12,}  idle {t.idle:>12,}"
                         f"  ({t.insns:,} insns)")
        lines.append("  DRAM bytes: " + ", ".join(f"{k} {v:,}" for k, v in sorted(self.dram_bytes.items())))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"CycleReport({self.config.name}: {self.total_cycles:,} cycles, {self.macs:,} MACs)"

    # ------------------------------------------------------------------ plots
    def plot_timeline(self, path: str, max_cycles: Optional[int] = None) -> None:
        """Activity timeline (one row per module) as a PNG, like the extension paper's Fig. 2-4."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        colors = {"load": "tab:blue", "gemm": "tab:red", "alu": "tab:orange", "uop": "tab:gray",
                  "acc": "tab:purple", "store": "tab:green", "nop": "lightgray", "finish": "black"}
        fig, ax = plt.subplots(figsize=(12, 2.8))
        rows = {"load": 2, "compute": 1, "store": 0}
        for module, start, end, kind in self.timeline:
            if max_cycles is not None and start > max_cycles:
                continue
            ax.broken_barh([(start, max(end - start, 1))], (rows[module] - 0.4, 0.8),
                           color=colors.get(kind, "tab:gray"), linewidth=0)
        ax.set_yticks(list(rows.values()), list(rows.keys()))
        ax.set_xlabel("cycle")
        ax.set_xlim(0, max_cycles or self.total_cycles)
        ax.set_title(f"VTA activity ({self.config.name}, {self.total_cycles:,} cycles)")
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
        ax.legend(handles, list(colors), ncol=8, fontsize=7, loc="upper right")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    def plot_roofline(self, path: str) -> None:
        """Roofline of the GEMM core: achieved ops/cycle against ops per DRAM byte."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        cfg = self.config
        peak = 2 * cfg.BATCH * cfg.BLOCK_IN * cfg.BLOCK_OUT / cfg.GEMM_CYCLES_PER_UOP
        bandwidth = cfg.MEM_BYTES_PER_CYCLE
        total_bytes = max(sum(self.dram_bytes.values()), 1)
        intensity = 2 * self.macs / total_bytes
        achieved = 2 * self.macs / max(self.total_cycles, 1)
        xs = [2 ** e for e in range(-4, 14)]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.loglog(xs, [min(peak, bandwidth * x) for x in xs], "k-", label="roof")
        ax.loglog([intensity], [achieved], "o", color="tab:red", label="this program")
        ax.set_xlabel("ops per DRAM byte")
        ax.set_ylabel("ops per cycle")
        ax.set_title(f"Roofline ({cfg.name}: peak {peak:g} ops/cycle, {bandwidth} B/cycle)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


class _Costs:
    """The timing constants of one configuration, and what instructions cost under them: the one
    home of the durations of the module docstring.

    The formulas work on numpy arrays of instruction fields, one element per instruction
    (:meth:`mem_arrays`, :meth:`gemm_arrays`, :meth:`alu_arrays`), which is how
    :meth:`CycleModel.run` times a whole stream at once; :meth:`of` applies them to one
    instruction."""

    def __init__(self, config: VTAConfig) -> None:
        self.issue = config.INSN_ISSUE_CYCLES
        self.dma = config.DMA_OVERHEAD_CYCLES
        self.bytes_per_cycle = config.MEM_BYTES_PER_CYCLE
        self.gemm = config.GEMM_CYCLES_PER_UOP
        self.alu_imm = config.ALU_CYCLES_PER_UOP_IMM
        self.alu_vec = config.ALU_CYCLES_PER_UOP_VEC
        self.macs_per_uop = config.BATCH * config.BLOCK_IN * config.BLOCK_OUT
        self.ops_per_uop = config.BATCH * config.BLOCK_OUT
        self.elem_bytes = config.elem_bytes

    def mem_arrays(self, opcode: np.ndarray, memory_type: np.ndarray, x_size: np.ndarray,
                   y_size: np.ndarray, x_pad_0: np.ndarray, x_pad_1: np.ndarray,
                   y_pad_0: np.ndarray, y_pad_1: np.ndarray
                   ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """LOADs and STOREs: ``(cycles, DRAM bytes, DRAM counter)`` per instruction; the counter
        is ``-1`` for a NOP (``x_size == 0``, which reads nothing), else a memory type: that of a
        LOAD, :attr:`MemType.OUT` for a STORE."""
        x, y = x_size, y_size
        nop = x == 0
        elem = np.zeros_like(x)
        for mem in np.unique(memory_type[~nop]).tolist():
            elem[memory_type == mem] = self.elem_bytes(mem)
        nbytes = x * y * elem
        pad_elems = (x_pad_0 + x + x_pad_1) * (y_pad_0 + y + y_pad_1) - x * y
        cycles = (self.issue + y * self.dma + pad_elems
                  + np.ceil(nbytes / self.bytes_per_cycle).astype(np.int64))
        counter = np.where(opcode == Opcode.STORE, int(MemType.OUT), memory_type)
        return np.where(nop, self.issue, cycles), nbytes, np.where(nop, -1, counter)

    def gemm_arrays(self, iter_out: np.ndarray, iter_in: np.ndarray, uop_bgn: np.ndarray,
                    uop_end: np.ndarray, reset_reg: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """GEMMs: ``(cycles, MACs)`` per instruction (a reset does no MAC)."""
        uops = iter_out * iter_in * (uop_end - uop_bgn)
        return self.issue + uops * self.gemm, np.where(reset_reg, 0, uops * self.macs_per_uop)

    def alu_arrays(self, iter_out: np.ndarray, iter_in: np.ndarray, uop_bgn: np.ndarray,
                   uop_end: np.ndarray, use_imm: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """ALU instructions: ``(cycles, ALU ops)`` per instruction."""
        uops = iter_out * iter_in * (uop_end - uop_bgn)
        per_uop = np.where(use_imm, self.alu_imm, self.alu_vec)
        return self.issue + uops * per_uop, uops * self.ops_per_uop

    def of(self, insn: Insn) -> Tuple[int, Optional[str], int, int, int]:
        """``(cycles, DRAM counter or None, DRAM bytes, MACs, ALU ops)`` of ``insn``: its duration
        and what the report counts for it (the counter of a LOAD is its memory type, of a STORE
        ``out``)."""
        for cls, _, getter, _ in _RECORD_FIELDS:
            if isinstance(insn, cls):
                fields = [np.array([v], np.int64) for v in getter(insn)]
                break
        else:
            return self.issue, None, 0, 0, 0
        if cls is MemInsn:
            cycles, nbytes, counter = self.mem_arrays(*fields)
            counter = int(counter[0])
            return (int(cycles[0]), None if counter < 0 else _MEM_NAMES[counter],
                    int(nbytes[0]) if counter >= 0 else 0, 0, 0)
        if cls is GemmInsn:
            cycles, macs = self.gemm_arrays(*fields)
            return int(cycles[0]), None, 0, int(macs[0]), 0
        cycles, ops = self.alu_arrays(*fields)
        return int(cycles[0]), None, 0, 0, int(ops[0])


#: per record class with a cost formula: the fields the formula takes (in its argument order), a
#: getter of them, and the :class:`_Costs` method that holds the formula
_RECORD_FIELDS = tuple(
    (cls, len(names), operator.attrgetter(*names), method) for cls, names, method in (
        (MemInsn, ("opcode", "memory_type", "x_size", "y_size", "x_pad_0", "x_pad_1", "y_pad_0",
                   "y_pad_1"), _Costs.mem_arrays),
        (GemmInsn, ("iter_out", "iter_in", "uop_bgn", "uop_end", "reset_reg"),
         _Costs.gemm_arrays),
        (AluInsn, ("iter_out", "iter_in", "uop_bgn", "uop_end", "use_imm"), _Costs.alu_arrays)))
_opcode_of = operator.attrgetter("opcode")


_MEM_NAMES = {m: m.name.lower() for m in MemType}


def insn_cycles(config: VTAConfig, insn: Insn) -> int:
    """Duration of one instruction under ``config`` (see the module docstring)."""
    return _Costs(config).of(insn)[0]


def _kind(insn: Insn) -> str:
    if isinstance(insn, MemInsn):
        if insn.x_size == 0:
            return "nop"
        if insn.opcode == Opcode.STORE:
            return "store"
        return {MemType.UOP: "uop", MemType.ACC: "acc", MemType.ACC_8BIT: "acc"}.get(insn.memory_type, "load")
    if isinstance(insn, GemmInsn):
        return "gemm"
    if isinstance(insn, AluInsn):
        return "alu"
    return "finish"


#: the modules in the order :meth:`CycleModel.run` visits them, and each one's position
_STAGES = tuple(Stage)
_POSITION = {s: i for i, s in enumerate(_STAGES)}
_QUEUE_INDEX = {q: i for i, q in enumerate(TOKEN_QUEUES)}
_FLAGS = ("pop_prev_dep", "pop_next_dep", "push_prev_dep", "push_next_dep")
_flags_of = operator.attrgetter(*_FLAGS)


def _token_table(stage: Stage) -> Dict[Tuple[bool, ...], Tuple[Tuple[int, ...], Tuple[int, ...]]]:
    """For each value of the four header flags: the token queues (indices into
    :data:`TOKEN_QUEUES`) that an instruction of ``stage`` pops and pushes; a flag without a
    queue on that side of the stage is ignored."""
    sq = STAGE_QUEUES[stage]
    table = {}
    for flags in itertools.product((False, True), repeat=4):
        on = dict(zip(_FLAGS, flags))
        table[flags] = (tuple(_QUEUE_INDEX[q] for f, q in sq.pops() if on[f]),
                        tuple(_QUEUE_INDEX[q] for f, q in sq.pushes() if on[f]))
    return table


_TOKENS = tuple(_token_table(s) for s in _STAGES)
#: the same per 4-bit flag code (``pop_prev_dep`` the high bit), and whether each code pops or
#: pushes anything, per module position
_TOKENS_BY_CODE = tuple(tuple(table[tuple(bool(code >> (3 - j) & 1) for j in range(4))]
                              for code in range(16)) for table in _TOKENS)
_NEEDS_ANY = np.array([[bool(t[0]) for t in table] for table in _TOKENS_BY_CODE])
_PUSHES_ANY = np.array([[bool(t[1]) for t in table] for table in _TOKENS_BY_CODE])
_FLAG_WEIGHTS = np.array([8, 4, 2, 1])


def _steps(costs: _Costs, insns: List[Insn], timeline: bool):
    """The first part of :meth:`CycleModel.run`, for the whole stream at once: per module, its
    steps in order, as five lists (first stream index, popped queues, cycles, pushed queues, DRAM
    counters first met in the step); a step is one instruction, or without a timeline a run of
    instructions that pops nothing after its first and pushes nothing before its last. Also
    returns the instruction count per module, the DRAM bytes per counter, MACs and ALU ops.
    """
    n = len(insns)
    kinds = list(map(type, insns))
    classes = list(dict.fromkeys(kinds))
    code_of = {cls: c for c, cls in enumerate(classes)}
    kind = np.fromiter(map(code_of.__getitem__, kinds), np.int64, n)
    pos = np.empty(n, np.int64)
    cycles = np.empty(n, np.int64)
    nbytes = np.zeros(n, np.int64)
    counter = np.full(n, -1, np.int64)
    macs = alu_ops = 0
    for c, cls in enumerate(classes):
        rows = np.flatnonzero(kind == c) if len(classes) > 1 else np.arange(n)
        sub = list(map(insns.__getitem__, rows.tolist()))
        for base, width, getter, formula in _RECORD_FIELDS:
            if issubclass(cls, base):
                break
        else:   # FINISH and other records: the issue cycles, nothing counted
            cycles[rows] = costs.issue
            pos[rows] = [_POSITION[insn_stage(x)] for x in sub]
            continue
        flat = np.fromiter(itertools.chain.from_iterable(map(getter, sub)), np.int64,
                           len(sub) * width)
        fields = flat.reshape(len(sub), width).T
        out = formula(costs, *fields)
        cycles[rows] = out[0]
        if base is MemInsn:
            nbytes[rows], counter[rows] = out[1], out[2]
            opcode, mem = fields[0], fields[1]
            low, span = int(mem.min()), int(mem.max() - mem.min()) + 1
            keys, inverse = np.unique(opcode * span + (mem - low), return_inverse=True)
            table = np.array([_POSITION[stage_of(k // span, k % span + low)] for k in keys.tolist()])
            pos[rows] = table[inverse.reshape(-1)]
        else:
            if base is GemmInsn:
                macs += int(out[1].sum())
            else:
                alu_ops += int(out[1].sum())
            if cls is base:   # the module of a GEMM/ALU record follows from its opcode
                opcodes = np.fromiter(map(_opcode_of, sub), np.int64, len(sub))
                keys, inverse = np.unique(opcodes, return_inverse=True)
                table = np.array([_POSITION[stage_of(op)] for op in keys.tolist()])
                pos[rows] = table[inverse.reshape(-1)]
            else:
                pos[rows] = [_POSITION[insn_stage(x)] for x in sub]
    flags = np.fromiter(itertools.chain.from_iterable(map(_flags_of, insns)), bool, 4 * n)
    code = flags.reshape(n, 4) @ _FLAG_WEIGHTS
    dram_total = {_MEM_NAMES[m]: int(nbytes[counter == m].sum())
                  for m in np.unique(counter[counter >= 0]).tolist()}
    queues: List[list] = []
    counts: List[int] = []
    for p in range(len(_STAGES)):
        idx = np.flatnonzero(pos == p)
        counts.append(int(idx.size))
        if not idx.size:
            queues.append(([], [], [], [], []))
            continue
        cp = code[idx]
        if timeline:
            start = np.ones(idx.size, bool)
        else:
            start = _NEEDS_ANY[p][cp]
            start[0] = True
            start[1:] |= _PUSHES_ANY[p][cp[:-1]]
        firsts = np.flatnonzero(start)
        lasts = np.append(firsts[1:], idx.size) - 1
        names: List[tuple] = [()] * firsts.size
        cn = counter[idx]
        named = np.flatnonzero(cn >= 0)
        if named.size:   # the counters of each step, in the order the step meets them
            sid = np.searchsorted(firsts, named, side="right") - 1
            key = sid * (int(cn.max()) + 1) + cn[named]
            first = np.sort(np.unique(key, return_index=True)[1])
            for s, m in zip(sid[first].tolist(), cn[named][first].tolist()):
                names[s] += (_MEM_NAMES[m],)
        table = _TOKENS_BY_CODE[p]
        queues.append((idx[firsts].tolist(),
                       [table[c][0] for c in cp[firsts].tolist()],
                       np.add.reduceat(cycles[idx], firsts).tolist(),
                       [table[c][1] for c in cp[lasts].tolist()],
                       names))
    return queues, counts, dram_total, macs, alu_ops


class CycleModel:
    """Event-driven timing of instruction streams under a :class:`VTAConfig`.

    Parameters
    ----------
    config : VTAConfig
        Supplies every timing constant.
    record_timeline : bool
        Keep (module, start, end, kind) for every instruction, for :meth:`CycleReport.plot_timeline`.
    """

    def __init__(self, config: VTAConfig, record_timeline: bool = False) -> None:
        self.config = config
        self.record_timeline = record_timeline

    def run(self, insns: Sequence[Insn]) -> CycleReport:
        """Time one stream (ending with FINISH); raises :class:`DeadlockError` if it cannot finish.

        Each module runs its queue in order and an instruction starts at
        ``max(module free, every popped token's push time)``; its pushes happen when it ends. The
        modules are visited in pipeline order, each as far as its tokens allow, until every
        instruction ran. Without a timeline, a run of instructions that pops nothing after its
        first and pushes nothing before its last is timed as one step (it runs back to back).
        """
        timeline = self.record_timeline
        insns = insns if isinstance(insns, list) else list(insns)
        queues, counts, dram_total, macs, alu_ops = _steps(_Costs(self.config), insns, timeline)
        heads = [0] * len(_STAGES)
        ready = [0] * len(_STAGES)
        busy = [0] * len(_STAGES)
        stall = [0] * len(_STAGES)
        tokens: List[List[int]] = [[] for _ in TOKEN_QUEUES]
        popped = [0] * len(TOKEN_QUEUES)
        report = CycleReport(self.config)
        seen: List[str] = []
        remaining = sum(len(q[0]) for q in queues)
        while remaining:
            progressed = False
            for pos, (firsts, step_needs, step_cycles, step_pushes, step_names) in \
                    enumerate(queues):
                head = h = heads[pos]
                free = ready[pos]
                waited = worked = 0
                count = len(firsts)
                while h < count:
                    needs = step_needs[h]
                    start = free
                    if needs:
                        if popped[needs[0]] >= len(tokens[needs[0]]) or (
                                len(needs) > 1 and popped[needs[1]] >= len(tokens[needs[1]])):
                            break
                        for q in needs:
                            t = tokens[q][popped[q]]
                            popped[q] += 1
                            if t > start:
                                start = t
                        waited += start - free
                    cycles = step_cycles[h]
                    free = start + cycles
                    worked += cycles
                    for q in step_pushes[h]:
                        tokens[q].append(free)
                    if step_names[h]:
                        seen += step_names[h]
                    if timeline:
                        report.timeline.append((_STAGES[pos].name.lower(), start, free,
                                                _kind(insns[firsts[h]])))
                    h += 1
                if h != head:
                    progressed = True
                    remaining -= h - head
                    heads[pos] = h
                    ready[pos] = free
                    stall[pos] += waited
                    busy[pos] += worked
            if not progressed:
                stuck = [f"{s.name.lower()} at instruction {queues[p][0][heads[p]]} "
                         f"({insns[queues[p][0][heads[p]]]})"
                         for p, s in enumerate(_STAGES) if heads[p] < len(queues[p][0])]
                raise DeadlockError("dependency tokens can never be satisfied; waiting: " + "; ".join(stuck))
        for name in seen:   # the counters in the order the run met them
            if name not in report.dram_bytes:
                report.dram_bytes[name] = dram_total[name]
        report.total_cycles = max(ready)
        report.macs = macs
        report.alu_ops = alu_ops
        for pos, stage in enumerate(_STAGES):
            report.modules[stage.name.lower()] = ModuleTime(
                busy[pos], stall[pos], report.total_cycles - busy[pos] - stall[pos], counts[pos])
        return report

    def run_program(self, program) -> CycleReport:
        """Time every segment of a :class:`vta_ext.runtime.Program`, back to back."""
        total: Optional[CycleReport] = None
        start = 0
        for _, count in program.segments:
            part = self.run(program.insns[start:start + count])
            start += count
            total = part if total is None else total + part
        return total
