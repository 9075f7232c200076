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

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..config import VTAConfig
from ..isa import (STAGE_QUEUES, TOKEN_QUEUES, AluInsn, GemmInsn, Insn, MemInsn, MemType, Opcode,
                   Stage, insn_stage)

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


def _dram_bytes(config: VTAConfig, insn: MemInsn) -> int:
    elem = config.elem_bytes(insn.memory_type)
    return insn.x_size * insn.y_size * elem


def insn_cycles(config: VTAConfig, insn: Insn) -> int:
    """Duration of one instruction under ``config`` (see the module docstring)."""
    issue = config.INSN_ISSUE_CYCLES
    if isinstance(insn, MemInsn):
        if insn.x_size == 0:
            return issue
        pad_elems = ((insn.x_pad_0 + insn.x_size + insn.x_pad_1) * (insn.y_pad_0 + insn.y_size + insn.y_pad_1)
                     - insn.x_size * insn.y_size)
        return (issue + insn.y_size * config.DMA_OVERHEAD_CYCLES + pad_elems
                + math.ceil(_dram_bytes(config, insn) / config.MEM_BYTES_PER_CYCLE))
    if isinstance(insn, GemmInsn):
        return issue + insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn) * config.GEMM_CYCLES_PER_UOP
    if isinstance(insn, AluInsn):
        per_uop = config.ALU_CYCLES_PER_UOP_IMM if insn.use_imm else config.ALU_CYCLES_PER_UOP_VEC
        return issue + insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn) * per_uop
    return issue


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


# per module: the (header flag, token queue) pairs it pops and pushes
_POPS = {s: STAGE_QUEUES[s].pops() for s in Stage}
_PUSHES = {s: STAGE_QUEUES[s].pushes() for s in Stage}


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
        """Time one stream (ending with FINISH); raises :class:`DeadlockError` if it cannot finish."""
        cfg = self.config
        stages = list(Stage)
        queue_index = {q: i for i, q in enumerate(TOKEN_QUEUES)}
        pop_flags = {s: [(flag, queue_index[q]) for flag, q in _POPS[s]] for s in Stage}
        push_flags = {s: [(flag, queue_index[q]) for flag, q in _PUSHES[s]] for s in Stage}
        # per instruction, once: its module, duration, and the token queues it pops and pushes
        queues: List[List[int]] = [[] for _ in stages]
        duration, pops, pushes = [], [], []
        for i, insn in enumerate(insns):
            stage = insn_stage(insn)
            queues[stages.index(stage)].append(i)
            duration.append(insn_cycles(cfg, insn))
            pops.append([q for flag, q in pop_flags[stage] if getattr(insn, flag)])
            pushes.append([q for flag, q in push_flags[stage] if getattr(insn, flag)])
        heads = [0] * len(stages)
        ready = [0] * len(stages)
        busy, stall, count = [0] * len(stages), [0] * len(stages), [0] * len(stages)
        tokens: List[List[int]] = [[] for _ in TOKEN_QUEUES]
        popped = [0] * len(TOKEN_QUEUES)
        report = CycleReport(cfg)
        timeline = report.timeline if self.record_timeline else None
        remaining = len(insns)
        while remaining:
            progressed = False
            for si in range(len(stages)):
                queue = queues[si]
                head = heads[si]
                while head < len(queue):
                    i = queue[head]
                    needs = pops[i]
                    token_time = 0
                    blocked = False
                    for q in needs:
                        if popped[q] >= len(tokens[q]):
                            blocked = True
                            break
                        t = tokens[q][popped[q]]
                        if t > token_time:
                            token_time = t
                    if blocked:
                        break
                    for q in needs:
                        popped[q] += 1
                    start = ready[si] if ready[si] > token_time else token_time
                    end = start + duration[i]
                    stall[si] += start - ready[si]
                    busy[si] += end - start
                    count[si] += 1
                    ready[si] = end
                    for q in pushes[i]:
                        tokens[q].append(end)
                    if timeline is not None:
                        timeline.append((stages[si].name.lower(), start, end, _kind(insns[i])))
                    head += 1
                    remaining -= 1
                    progressed = True
                heads[si] = head
            if not progressed:
                stuck = [f"{s.name.lower()} at instruction {queues[k][heads[k]]} "
                         f"({insns[queues[k][heads[k]]]})"
                         for k, s in enumerate(stages) if heads[k] < len(queues[k])]
                raise DeadlockError("dependency tokens can never be satisfied; waiting: " + "; ".join(stuck))
        for insn in insns:
            self._account(report, insn)
        report.total_cycles = max(ready)
        for k, stage in enumerate(stages):
            module = report.modules[stage.name.lower()]
            module.busy, module.stall, module.insns = busy[k], stall[k], count[k]
            module.idle = report.total_cycles - module.busy - module.stall
        return report

    def _account(self, report: CycleReport, insn: Insn) -> None:
        cfg = self.config
        if isinstance(insn, MemInsn) and insn.x_size:
            name = "out" if insn.opcode == Opcode.STORE else MemType(insn.memory_type).name.lower()
            report.dram_bytes[name] += _dram_bytes(cfg, insn)
        elif isinstance(insn, GemmInsn) and not insn.reset_reg:
            report.macs += (insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
                            * cfg.BATCH * cfg.BLOCK_IN * cfg.BLOCK_OUT)
        elif isinstance(insn, AluInsn):
            report.alu_ops += (insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
                               * cfg.BATCH * cfg.BLOCK_OUT)

    def run_program(self, program) -> CycleReport:
        """Time every segment of a :class:`vta_ext.runtime.Program`, back to back."""
        total: Optional[CycleReport] = None
        start = 0
        for _, count in program.segments:
            part = self.run(program.insns[start:start + count])
            start += count
            total = part if total is None else total + part
        return total
