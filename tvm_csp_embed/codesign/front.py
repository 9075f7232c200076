"""The result of a co-design search: design points, their Pareto front, the presets, the baseline.

A :class:`DesignPoint` is one evaluated configuration: its cycles (the cycle model, plus the host
model's cycles of operators left on the CPU), its area *proxy* relative to ``default``
(:mod:`.area`) and its DRAM bytes. :class:`Front` holds the search's points, the shipped presets
evaluated the same way, the front of a baseline strategy (``stock``) over the same space and
budget, and the search's counts; it writes CSV and PNG and answers :meth:`Front.best`.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from vta_ext.config import VTAConfig

from .space import timing_of

__all__ = ["DesignPoint", "Front", "pareto"]


@dataclass(frozen=True)
class DesignPoint:
    """One evaluated configuration.

    Attributes
    ----------
    config : VTAConfig
        The configuration (build it with ``vta_ext.vta_target(point.config)``).
    cycles : float
        VTA cycles of one inference (cycle model) plus the host model's cycles of the MACs left on
        the CPU (:attr:`cpu_macs`); the search minimises it.
    area : float
        The area proxy relative to the ``default`` preset (1.0); a proxy, not synthesis.
    dram_bytes : int
        DRAM bytes the VTA programs move.
    on_front : bool
        Whether no other point of its front has no more area and no more cycles (one of them
        fewer).
    vta_cycles : int
        The VTA part of :attr:`cycles`.
    cpu_macs : int
        MACs of conv2d / matmul operators left on the CPU.
    cpu_ops : tuple of str
        Those operators, each with why.
    lower_bound : float
        The bound the search pruned with (:mod:`.bound`); never above :attr:`cycles`.
    seconds : float
        Wall time of the evaluation.
    """

    config: VTAConfig
    cycles: float
    area: float
    dram_bytes: int = 0
    on_front: bool = False
    vta_cycles: int = 0
    cpu_macs: int = 0
    cpu_ops: Tuple[str, ...] = ()
    lower_bound: float = 0.0
    seconds: float = 0.0

    @property
    def shape(self) -> str:
        """``"1x16x16"``."""
        c = self.config
        return f"{c.BATCH}x{c.BLOCK_IN}x{c.BLOCK_OUT}"

    def dominates(self, other: "DesignPoint") -> bool:
        """Fewer cycles at no more area, or less area at no more cycles."""
        return (self.cycles <= other.cycles and self.area <= other.area
                and (self.cycles < other.cycles or self.area < other.area))

    def row(self) -> Dict[str, Any]:
        """The point as a CSV row."""
        c = self.config
        return {"name": c.name, "shape": self.shape, "log_inp_buff": c.LOG_INP_BUFF_SIZE,
                "log_wgt_buff": c.LOG_WGT_BUFF_SIZE, "log_acc_buff": c.LOG_ACC_BUFF_SIZE,
                "log_uop_buff": c.LOG_UOP_BUFF_SIZE, "bus_bits": c.BUS_WIDTH,
                "mem_bytes_per_cycle": c.MEM_BYTES_PER_CYCLE, "timing": timing_of(c),
                "area_proxy": round(self.area, 4), "cycles": round(self.cycles),
                "vta_cycles": self.vta_cycles, "cpu_macs": self.cpu_macs,
                "cpu_ops": len(self.cpu_ops), "dram_bytes": self.dram_bytes,
                "lower_bound": round(self.lower_bound), "on_front": self.on_front,
                "seconds": round(self.seconds, 2)}

    def __repr__(self) -> str:
        c = self.config
        cpu = f", {len(self.cpu_ops)} op(s) on the CPU" if self.cpu_ops else ""
        return (f"DesignPoint({c.name!r}: {self.shape}, {timing_of(c)}, {c.MEM_BYTES_PER_CYCLE} "
                f"B/cycle, {self.cycles:,.0f} cycles, area proxy {self.area:.2f}x default"
                f"{cpu}{', on front' if self.on_front else ''})")


def pareto(points: Sequence[DesignPoint]) -> List[DesignPoint]:
    """``points`` with :attr:`~DesignPoint.on_front` set (same order)."""
    return [replace(p, on_front=not any(q.dominates(p) for q in points)) for p in points]


@dataclass
class Front:
    """What :func:`~tvm_csp_embed.codesign.explore` found.

    Attributes
    ----------
    points : list of DesignPoint
        Every configuration of the space the search evaluated, in evaluation order; ``on_front``
        marks the Pareto front of these points.
    presets : list of DesignPoint
        The shipped presets, evaluated the same way (``on_front``: not dominated by a point).
    baseline : Front or None
        The same search under the baseline strategy (``stock``), or None.
    strategy : str
        The strategy of the evaluations.
    rejected : list of (str, str)
        The configurations of the space that do not exist (name, the field at fault); never
        evaluated.
    pruned : int
        Configurations the lower bound showed dominated; never evaluated.
    errors : list of (str, str)
        Configurations whose evaluation failed (name, why); not points.
    evaluated, cached : int
        Evaluations run, and configurations answered from the records.
    seconds : float
        Wall time of the search.
    space_size : int
        Points of the space.
    """

    points: List[DesignPoint]
    presets: List[DesignPoint] = field(default_factory=list)
    baseline: Optional["Front"] = None
    strategy: str = ""
    rejected: List[Tuple[str, str]] = field(default_factory=list)
    pruned: int = 0
    errors: List[Tuple[str, str]] = field(default_factory=list)
    evaluated: int = 0
    cached: int = 0
    seconds: float = 0.0
    space_size: int = 0

    @property
    def front(self) -> List[DesignPoint]:
        """The points on the front, by area."""
        return sorted((p for p in self.points if p.on_front), key=lambda p: (p.area, p.cycles))

    @property
    def per_minute(self) -> float:
        """Configurations evaluated per minute of wall time (records answered not counted)."""
        return 60.0 * self.evaluated / self.seconds if self.seconds > 0 else 0.0

    def best(self, area_budget: float = 1.0) -> DesignPoint:
        """The point with the fewest cycles whose area proxy is at most ``area_budget`` times
        that of ``default``.

        Raises
        ------
        ValueError
            When no point fits the budget (the message gives the smallest area found).
        """
        fits = [p for p in self.points if p.area <= area_budget]
        if not fits:
            smallest = min((p.area for p in self.points), default=float("nan"))
            raise ValueError(f"Front.best(area_budget={area_budget:g}): no point has an area "
                             f"proxy within {area_budget:g}x default; the smallest found is "
                             f"{smallest:.2f}x")
        return min(fits, key=lambda p: (p.cycles, p.area))

    def dominating(self, preset: DesignPoint) -> List[DesignPoint]:
        """The points with fewer cycles than ``preset`` at no more area proxy."""
        return [p for p in self.points if p.cycles < preset.cycles and p.area <= preset.area]

    def to_csv(self, path: Union[str, Path, None] = None) -> str:
        """Every point, preset and baseline point as CSV (column ``set``: ``explored``,
        ``preset`` or ``baseline``); written to ``path`` if given."""
        rows = [{"set": "explored", "strategy": self.strategy, **p.row()} for p in self.points]
        rows += [{"set": "preset", "strategy": self.strategy, **p.row()} for p in self.presets]
        if self.baseline is not None:
            rows += [{"set": "baseline", "strategy": self.baseline.strategy, **p.row()}
                     for p in self.baseline.points]
            rows += [{"set": "baseline preset", "strategy": self.baseline.strategy, **p.row()}
                     for p in self.baseline.presets]
        out = io.StringIO()
        if rows:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        if path is not None:
            Path(path).write_text(out.getvalue())
        return out.getvalue()

    def plot(self, path: Union[str, Path], title: str = "") -> None:
        """Cycles against the area proxy: the points, the front, the presets and the baseline's
        front, as PNG."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 5.5))
        ax.scatter([p.area for p in self.points], [p.cycles for p in self.points], s=12,
                   color="0.7", label=f"{self.strategy}: evaluated ({len(self.points)})")
        front = self.front
        ax.step([p.area for p in front], [p.cycles for p in front], where="post", color="C0",
                marker="o", label=f"{self.strategy} front ({len(front)})")
        if self.baseline is not None and self.baseline.front:
            bf = self.baseline.front
            ax.step([p.area for p in bf], [p.cycles for p in bf], where="post", color="C3",
                    marker="s", linestyle="--", label=f"{self.baseline.strategy} front ({len(bf)})")
        for p in self.presets:
            ax.scatter([p.area], [p.cycles], marker="*", s=120, color="C2", zorder=5)
            ax.annotate(p.config.name, (p.area, p.cycles), textcoords="offset points",
                        xytext=(5, 4), fontsize=8)
        if self.presets:
            ax.scatter([], [], marker="*", s=120, color="C2", label=f"presets ({self.strategy})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("area proxy (default = 1; a linear resource model, not synthesis)")
        ax.set_ylabel("cycles (cycle model + CPU operators)")
        ax.set_title(title or f"co-design front, {self.strategy}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    def table(self) -> str:
        """A text table: the front, the presets (with the front point dominating each), counts."""
        lines = [f"{self.strategy} front ({len(self.front)} of {len(self.points)} evaluated "
                 "points; area is a proxy, default = 1):",
                 f"  {'configuration':<38} {'area':>6} {'cycles':>14} {'DRAM bytes':>14} {'CPU ops':>7}"]
        for p in self.front:
            lines.append(f"  {p.config.name:<38} {p.area:>6.2f} {p.cycles:>14,.0f} "
                         f"{p.dram_bytes:>14,} {len(p.cpu_ops):>7}")
        if self.presets:
            lines.append("presets (evaluated the same way):")
            for p in self.presets:
                dom = self.dominating(p)
                best = min(dom, key=lambda q: q.cycles) if dom else None
                text = (f"dominated by {best.config.name} (x{p.cycles / best.cycles:.2f} fewer "
                        f"cycles, area {best.area:.2f})" if best else "not dominated")
                lines.append(f"  {p.config.name:<38} {p.area:>6.2f} {p.cycles:>14,.0f}  {text}")
        if self.errors:
            lines.append(f"failed under {self.strategy} (never a point):")
            lines += [f"  {name:<38} {why}" for name, why in self.errors]
        if self.baseline is not None:
            b = self.baseline
            lines.append(f"{b.strategy} front ({len(b.front)} of {len(b.points)} points):")
            for p in b.front:
                lines.append(f"  {p.config.name:<38} {p.area:>6.2f} {p.cycles:>14,.0f}")
            beaten = sum(1 for q in b.front if any(p.dominates(q) for p in self.front))
            lines.append(f"{self.strategy} front points dominate {beaten} of {len(b.front)} "
                         f"{b.strategy} front points")
        lines.append(self.counts())
        return "\n".join(lines)

    def counts(self) -> str:
        """One line: space size, rejected, pruned, evaluated, cached, errors, rate, wall time."""
        return (f"space {self.space_size} configurations: {len(self.rejected)} rejected (fields do "
                f"not fit), {self.pruned} pruned by the lower bound, {self.evaluated} evaluated, "
                f"{self.cached} from records, {len(self.errors)} failed; "
                f"{self.per_minute:.1f} evaluated/min, wall {self.seconds:.0f} s")

    def __repr__(self) -> str:
        best = min(self.points, key=lambda p: p.cycles) if self.points else None
        text = f", fastest {best!r}" if best else ""
        return (f"Front({self.strategy}: {len(self.front)} on the front of {len(self.points)} "
                f"points, {len(self.presets)} presets{text}; {self.counts()})")
