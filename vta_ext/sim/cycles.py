"""An explainable cycle model of VTA (our "tsim").

Load, compute and store are separate modules, each executing its instruction queue in order. They
are linked by the four dependency-token queues (load→compute, compute→load, compute→store,
store→compute): an instruction starts when its module is free and every token it pops can be
popped; its pushes happen when it finishes. A pushed token can be popped ``TOKEN_CYCLES`` later,
and an instruction pops ``POP_OFFSET_CYCLES`` after it starts (it reads its instruction word
first), so a token pushed at ``t`` lets its popper start at ``t + TOKEN_CYCLES -
POP_OFFSET_CYCLES`` (its module being free). Every module can start its first instruction ``FETCH_CYCLES + MEM_LATENCY_CYCLES`` after
the start (the instruction fetch). Durations come from the configuration, with ``issue =
INSN_ISSUE_CYCLES`` and, for a LOAD of memory type ``T`` (INP, WGT, ACC, UOP; ACC_8BIT counts as
ACC) or a STORE (``T`` = OUT):

* LOAD/STORE: ``issue + T_INSN_CYCLES + y_size * (DMA_OVERHEAD_CYCLES + T_ROW_CYCLES +
  MEM_LATENCY_CYCLES) + ceil(DRAM bytes / T_BYTES_PER_CYCLE) + PAD_ELEM_CYCLES * padding
  elements`` (the padding elements a LOAD writes into SRAM; ``T_BYTES_PER_CYCLE`` 0 is
  ``MEM_BYTES_PER_CYCLE``); a NOP (``x_size`` 0) takes ``issue + NOP_INSN_CYCLES``;
* GEMM: ``issue + GEMM_INSN_CYCLES + iter_out * iter_in * uops * GEMM_CYCLES_PER_UOP``;
* ALU: ``issue + ALU_INSN_CYCLES + iter_out * iter_in * uops * ALU_CYCLES_PER_UOP_IMM`` (or
  ``ALU_CYCLES_PER_UOP_VEC`` without an immediate);
* FINISH: ``issue + FINISH_INSN_CYCLES``.

Every structural key defaults to nothing added (bandwidth: the bus rate), which is the per-micro-op
model of the original presets; the ``pynq`` preset's values are fitted on the RTL of the Pynq HLS
design (``scripts/calibrate_rtl.py``). The schedule is a max-plus system, so the model is monotone:
lower per-uop or per-instruction cycles, or more bytes per cycle, never increase the total. It is
a model, not the hardware: see ``docs/isa.md`` for where the constants come from.
"""
from __future__ import annotations

import functools
import itertools
import operator
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..config import VTAConfig
from ..isa import (STAGE_QUEUES, TOKEN_QUEUES, AluInsn, GemmInsn, Insn, MemInsn, MemType, Opcode,
                   Stage, insn_stage, stage_of)

__all__ = ["CycleModel", "CycleReport", "ModuleTime", "DeadlockError", "insn_cycles", "DmaCost",
           "dma_cost", "timing"]


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
    #: with a timeline: the stream index of each timeline entry's instruction (a sum of reports
    #: counts the streams back to back), for :mod:`vta_ext.trace`
    timeline_index: List[int] = field(default_factory=list, repr=False)
    #: per token queue (:data:`~vta_ext.isa.TOKEN_QUEUES`), the tokens pushed and never popped by
    #: the end of the stream(s): they persist into the next run, as fsim's and the RTL's do
    tokens_left: Tuple[int, ...] = (0,) * len(TOKEN_QUEUES)

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
        out.tokens_left = other.tokens_left
        out.timeline = self.timeline + [(m, s + self.total_cycles, e + self.total_cycles, k)
                                        for m, s, e, k in other.timeline]
        # with a timeline every instruction has one entry, so a stream's length is its entries'
        out.timeline_index = self.timeline_index + [i + len(self.timeline)
                                                    for i in other.timeline_index]
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


@dataclass(frozen=True)
class DmaCost:
    """What the LOADs or STOREs of one memory kind cost (module docstring): ``fixed`` cycles per
    instruction (``INSN_ISSUE_CYCLES + T_INSN_CYCLES``), ``per_row`` per DMA row
    (``DMA_OVERHEAD_CYCLES + T_ROW_CYCLES + MEM_LATENCY_CYCLES``), ``bytes_per_cycle`` (the kind's
    bandwidth) and ``pad`` per padding element written on chip (``PAD_ELEM_CYCLES``)."""

    fixed: int
    per_row: int
    bytes_per_cycle: int
    pad: int

    def cycles(self, insns, rows_per_insn, nbytes, pad_elems=0):
        """Summed durations of ``insns`` DMAs of ``rows_per_insn`` rows each moving ``nbytes`` and
        writing ``pad_elems`` padding elements in all (ints, floats or numpy arrays): the
        module docstring's duration summed, with the bytes divided once (a fraction, where the
        model rounds up per instruction: at most the model's sum). Computed as ``nbytes /
        bytes_per_cycle + insns * (fixed + per_row * rows_per_insn) + pad * pad_elems``, without
        the operations that add a 0 or multiply by a 1 (fast on numpy grids; the estimates that
        use it, :mod:`tvm_csp_embed.codegen.knobs`, :mod:`tvm_csp_embed.choice`,
        :mod:`vta_ext.floor`, stay as they were on a configuration whose structural keys are 0)."""
        out = nbytes / self.bytes_per_cycle
        per = self.fixed if self.per_row == 0 else (
            self.fixed + (rows_per_insn if self.per_row == 1 else self.per_row * rows_per_insn))
        if not (type(per) is int and per == 0):
            out = out + (insns if type(per) is int and per == 1 else insns * per)
        if not (type(pad_elems) is int and pad_elems == 0) and self.pad:
            out = out + (pad_elems if self.pad == 1 else self.pad * pad_elems)
        return out


class _Costs:
    """The timing constants of one configuration, and what one instruction costs under them
    (:meth:`of`): the one home of the durations of the module docstring. Read them through
    :func:`timing` (one per configuration): ``gemm_fixed``, ``alu_fixed``, ``nop``, ``finish``
    (fixed cycles per instruction), ``fetch`` (when the modules start), ``gemm``, ``alu_imm``,
    ``alu_vec`` (per micro-op), :meth:`dma` (a :class:`DmaCost` per memory kind)."""

    def __init__(self, config: VTAConfig) -> None:
        self.config = config
        issue = self.issue = config.INSN_ISSUE_CYCLES
        self.nop = issue + config.NOP_INSN_CYCLES
        self.finish = issue + config.FINISH_INSN_CYCLES
        self.gemm_fixed = issue + config.GEMM_INSN_CYCLES
        self.alu_fixed = issue + config.ALU_INSN_CYCLES
        self.gemm = config.GEMM_CYCLES_PER_UOP
        self.alu_imm = config.ALU_CYCLES_PER_UOP_IMM
        self.alu_vec = config.ALU_CYCLES_PER_UOP_VEC
        self.pad = config.PAD_ELEM_CYCLES
        #: when every module can start its first instruction
        self.fetch = config.FETCH_CYCLES + config.MEM_LATENCY_CYCLES
        #: from a token's push to the earliest start of the instruction that pops it
        self.token = config.TOKEN_CYCLES - config.POP_OFFSET_CYCLES
        self.macs_per_uop = config.BATCH * config.BLOCK_IN * config.BLOCK_OUT
        self.ops_per_uop = config.BATCH * config.BLOCK_OUT
        #: (is a STORE, memory type) -> (element bytes, fixed cycles, cycles per row, bytes per
        #: cycle, DRAM counter), filled on first use
        self._mem: Dict[Tuple[bool, int], Tuple[int, int, int, int, str]] = {}
        self._dma: Dict[str, DmaCost] = {}
        #: the cost function of each instruction record type (:meth:`of` dispatches on it)
        self.by_type = {MemInsn: self.mem, GemmInsn: self.gemm_insn, AluInsn: self.alu_insn}

    def dma(self, kind: str) -> "DmaCost":
        """The :class:`DmaCost` of the DMAs of ``kind`` (a :data:`~vta_ext.config.DMA_KINDS`)."""
        cost = self._dma.get(kind)
        if cost is None:
            cfg = self.config
            cost = self._dma[kind] = DmaCost(
                self.issue + getattr(cfg, f"{kind}_INSN_CYCLES"),
                cfg.DMA_OVERHEAD_CYCLES + getattr(cfg, f"{kind}_ROW_CYCLES") + cfg.MEM_LATENCY_CYCLES,
                cfg.bytes_per_cycle(kind), self.pad)
        return cost

    def _mem_entry(self, store: bool, mem: int) -> Tuple[int, int, int, int, str]:
        kind = "OUT" if store else _DMA_KIND.get(mem, "INP")
        dma = self.dma(kind)
        entry = (self.config.elem_bytes(mem), dma.fixed, dma.per_row, dma.bytes_per_cycle,
                 "out" if store else (_MEM_NAMES.get(mem) or MemType(mem).name.lower()))
        self._mem[store, mem] = entry
        return entry

    def of(self, insn: Insn) -> Tuple[int, Optional[str], int, int, int]:
        """``(cycles, DRAM counter or None, DRAM bytes, MACs, ALU ops)`` of ``insn``: its duration
        and what the report counts for it (the counter of a LOAD is its memory type, of a STORE
        ``out``)."""
        cost = self.by_type.get(type(insn))
        if cost is not None:
            return cost(insn)
        if isinstance(insn, MemInsn):
            return self.mem(insn)
        if isinstance(insn, GemmInsn):
            return self.gemm_insn(insn)
        if isinstance(insn, AluInsn):
            return self.alu_insn(insn)
        return self.finish, None, 0, 0, 0

    def mem(self, insn: MemInsn) -> Tuple[int, Optional[str], int, int, int]:
        """:meth:`of` a LOAD or STORE."""
        x = insn.x_size
        if x == 0:
            return self.nop, None, 0, 0, 0
        y = insn.y_size
        key = (insn.opcode == _STORE, insn.memory_type)
        entry = self._mem.get(key)
        if entry is None:
            entry = self._mem_entry(*key)
        elem, fixed, per_row, bytes_per_cycle, name = entry
        nbytes = x * y * elem
        pad_elems = ((insn.x_pad_0 + x + insn.x_pad_1) * (insn.y_pad_0 + y + insn.y_pad_1)
                     - x * y)
        cycles = fixed + y * per_row + pad_elems * self.pad + -(-nbytes // bytes_per_cycle)
        return cycles, name, nbytes, 0, 0

    def gemm_insn(self, insn: GemmInsn) -> Tuple[int, Optional[str], int, int, int]:
        """:meth:`of` a GEMM."""
        uops = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
        return (self.gemm_fixed + uops * self.gemm, None, 0,
                0 if insn.reset_reg else uops * self.macs_per_uop, 0)

    def alu_insn(self, insn: AluInsn) -> Tuple[int, Optional[str], int, int, int]:
        """:meth:`of` an ALU instruction."""
        uops = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
        per_uop = self.alu_imm if insn.use_imm else self.alu_vec
        return self.alu_fixed + uops * per_uop, None, 0, 0, uops * self.ops_per_uop


_STORE = Opcode.STORE
_MEM_NAMES = {m: m.name.lower() for m in MemType}
#: LOAD memory type -> the DMA kind whose keys time it (docs/isa.md, "Cycle model")
_DMA_KIND = {MemType.INP: "INP", MemType.WGT: "WGT", MemType.ACC: "ACC", MemType.ACC_8BIT: "ACC",
             MemType.UOP: "UOP", MemType.OUT: "OUT"}


@functools.lru_cache(maxsize=64)
def timing(config: VTAConfig) -> _Costs:
    """The timing constants of ``config`` (one object per configuration value): the cycle model's
    own, for the estimates that sum instruction durations without a program
    (:mod:`tvm_csp_embed.codegen.knobs`, the bounds of :mod:`tvm_csp_embed.choice`,
    :mod:`vta_ext.floor`)."""
    return _Costs(config)


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
#: the module position of an instruction by (opcode, memory type, None for a record without one):
#: :func:`~vta_ext.isa.stage_of` tabulated, read per instruction instead of :func:`insn_stage`
_POSITION_OF = {(op, mem): _POSITION[stage_of(op, mem)] for op in Opcode for mem in (None, *MemType)}
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


class CycleModel:
    """Event-driven timing of instruction streams under a :class:`VTAConfig`.

    Parameters
    ----------
    config : VTAConfig
        Supplies every timing constant.
    record_timeline : bool
        Keep (module, start, end, kind) for every instruction, for :meth:`CycleReport.plot_timeline`,
        and its stream index (``CycleReport.timeline_index``).
    """

    def __init__(self, config: VTAConfig, record_timeline: bool = False) -> None:
        self.config = config
        self.record_timeline = record_timeline

    def run(self, insns: Sequence[Insn], carried: Sequence[int] = ()) -> CycleReport:
        """Time one stream (ending with FINISH); raises :class:`DeadlockError` if it cannot finish.

        ``carried``: per token queue, the tokens an earlier run left (its report's
        :attr:`CycleReport.tokens_left`); they can be popped from cycle 0, as the token counts of
        fsim and of the RTL persist across runs.

        Each module runs its queue in order and an instruction starts at
        ``max(module free, every popped token's push time)``; its pushes happen when it ends. The
        modules are visited in pipeline order, each as far as its tokens allow, until every
        instruction ran. Without a timeline, a run of instructions that pops nothing after its
        first and pushes nothing before its last is timed as one step (it runs back to back).
        """
        costs = _Costs(self.config)
        timeline = self.record_timeline
        # per module, in order, the steps: [first stream index, popped queues, cycles, pushed
        # queues, DRAM counters first met in the step, first instruction]
        queues: List[list] = [[] for _ in _STAGES]
        open_step: List[Optional[list]] = [None] * len(_STAGES)
        dram_total: Dict[str, int] = {}
        counts = [0] * len(_STAGES)
        macs = alu_ops = 0
        cost_by_type, cost_of, pos_of = costs.by_type, costs.of, _POSITION_OF
        for i, insn in enumerate(insns):
            cls = type(insn)
            if cls is MemInsn:
                pos = pos_of.get((insn.opcode, insn.memory_type))
            elif cls is GemmInsn or cls is AluInsn:
                pos = pos_of.get((insn.opcode, None))
            else:
                pos = None
            if pos is None:
                pos = _POSITION[insn_stage(insn)]
            counts[pos] += 1
            flags = _flags_of(insn)
            queues_of = _TOKENS[pos].get(flags)
            if queues_of is None:   # flags that are not bools: by truth value
                queues_of = _TOKENS[pos][tuple(bool(f) for f in flags)]
            needs, pushes = queues_of
            cycles, name, nbytes, m, a = cost_by_type.get(cls, cost_of)(insn)
            macs += m
            alu_ops += a
            step = open_step[pos]
            if step is None or needs or timeline:
                step = [i, needs, 0, (), (), insn]
                queues[pos].append(step)
            step[2] += cycles
            if name is not None:
                if name not in step[4]:
                    step[4] += (name,)
                dram_total[name] = dram_total.get(name, 0) + nbytes
            if pushes:
                step[3] = pushes
                open_step[pos] = None
            else:
                open_step[pos] = step
        heads = [0] * len(_STAGES)
        ready = [costs.fetch] * len(_STAGES)
        token_delay = costs.token
        busy = [0] * len(_STAGES)
        stall = [0] * len(_STAGES)
        tokens: List[List[int]] = [[0] * n for n in carried] or [[] for _ in TOKEN_QUEUES]
        popped = [0] * len(TOKEN_QUEUES)
        report = CycleReport(self.config)
        seen: List[str] = []
        remaining = sum(map(len, queues))
        while remaining:
            progressed = False
            for pos, queue in enumerate(queues):
                head = h = heads[pos]
                free = ready[pos]
                waited = worked = 0
                count = len(queue)
                while h < count:
                    _, needs, cycles, pushes, names, insn = queue[h]
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
                    free = start + cycles
                    worked += cycles
                    for q in pushes:
                        tokens[q].append(free + token_delay)
                    if names:
                        seen += names
                    if timeline:
                        report.timeline.append((_STAGES[pos].name.lower(), start, free,
                                                _kind(insn)))
                        report.timeline_index.append(queue[h][0])
                    h += 1
                if h != head:
                    progressed = True
                    remaining -= h - head
                    heads[pos] = h
                    ready[pos] = free
                    stall[pos] += waited
                    busy[pos] += worked
            if not progressed:
                stuck = [f"{s.name.lower()} at instruction {queues[p][heads[p]][0]} "
                         f"({queues[p][heads[p]][5]})"
                         for p, s in enumerate(_STAGES) if heads[p] < len(queues[p])]
                raise DeadlockError("dependency tokens can never be satisfied; waiting: " + "; ".join(stuck))
        for name in seen:   # the counters in the order the run met them
            if name not in report.dram_bytes:
                report.dram_bytes[name] = dram_total[name]
        report.total_cycles = max(ready)
        report.macs = macs
        report.alu_ops = alu_ops
        report.tokens_left = tuple(len(t) - p for t, p in zip(tokens, popped))
        for pos, stage in enumerate(_STAGES):
            report.modules[stage.name.lower()] = ModuleTime(
                busy[pos], stall[pos], report.total_cycles - busy[pos] - stall[pos], counts[pos])
        return report

    def run_program(self, program) -> CycleReport:
        """Time every segment of a :class:`vta_ext.runtime.Program`, back to back; the tokens a
        segment leaves carry into the next (a segment closed because the instruction buffer is
        full can end with tokens in flight between two virtual threads)."""
        total: Optional[CycleReport] = None
        start = 0
        for _, count in program.segments:
            part = self.run(program.insns[start:start + count],
                            total.tokens_left if total is not None else ())
            start += count
            total = part if total is None else total + part
        return total
