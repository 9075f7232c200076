"""The build report: which operators run on VTA, which on the CPU, and why."""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

__all__ = ["OpPlacement", "BuildReport", "last_build_report"]

logger = logging.getLogger("vta_ext")

VTA = "vta"
CPU = "cpu"
LAYOUT_REASON = "layout transform around a VTA operator"


@dataclass(frozen=True)
class OpPlacement:
    """Where one operator runs and why."""

    op: str
    device: str
    reason: str
    detail: str = ""
    #: the Relax variable the operator was bound to in the input module
    name: str = ""
    #: the source layer (e.g. the torch module path) if the frontend recorded it
    layer: str = ""

    def __str__(self) -> str:
        extra = f" [{self.detail}]" if self.detail else ""
        layer = f" ({self.layer})" if self.layer else ""
        return f"{self.device.upper():<4} {self.op:<28}{layer} {self.reason}{extra}"


@dataclass
class BuildReport:
    """All placement decisions of one ``relax.build`` for ``ext_vta``."""

    config: str
    strategy: str = "stock"
    placements: List[OpPlacement] = field(default_factory=list)
    #: seconds of the offload pass per phase (:data:`vta_ext.timing.PHASES`), exclusive
    timings: Dict[str, float] = field(default_factory=dict, compare=False)
    #: the host model pricing host work (:mod:`vta_ext.host`); None: the default
    host: Any = field(default=None, compare=False)
    #: the compiled-operator key of every VTA call (``vta_ext.executor.op_key``), in order
    vta_keys: List[str] = field(default_factory=list, compare=False)
    #: bytes written by the host layout transforms per inference
    layout_bytes: int = 0
    #: MACs of the conv2d / matmul operators left on the CPU
    cpu_macs: int = 0

    def add(self, op: str, device: str, reason: str, detail: str = "", name: str = "",
            layer: str = "") -> None:
        """Record where operator ``op`` (bound to Relax variable ``name``, from source ``layer``)
        runs and why."""
        self.placements.append(OpPlacement(op, device, reason, detail, name, layer))

    @property
    def host_relayouts(self) -> int:
        """Host layout operations left per inference (packing and unpacking activations around VTA
        operators; constant operands are relayouted at build time and not counted)."""
        return sum(p.reason == LAYOUT_REASON for p in self.on_cpu)

    @property
    def vta_cycles(self) -> int:
        """Cycle-model cycles of all VTA calls of one inference (computed on first use)."""
        if "_vta_cycles" not in self.__dict__:
            from .executor import cycle_report

            self.__dict__["_vta_cycles"] = sum(cycle_report(k).total_cycles for k in self.vta_keys)
        return self.__dict__["_vta_cycles"]

    @property
    def host_model(self):
        """The :class:`~vta_ext.host.HostModel` of this build."""
        from .host import PYNQ_Z1

        return self.host or PYNQ_Z1

    @property
    def host_cycles(self) -> float:
        """Host layout traffic and CPU MACs in VTA cycles (:attr:`host_model`)."""
        h = self.host_model
        return h.layout_cycles(self.layout_bytes) + h.cpu_cycles(self.cpu_macs)

    @property
    def end_to_end_cycles(self) -> float:
        """The end-to-end estimate of one inference: VTA cycles plus host cycles, serialised (the
        host waits for VTA and VTA for the host)."""
        return self.vta_cycles + self.host_cycles

    def cost_summary(self) -> str:
        """One line: VTA cycles, host layout bytes, CPU MACs and the end-to-end estimate."""
        h = self.host_model
        return (f"end to end {self.end_to_end_cycles:,.0f} cycles = VTA {self.vta_cycles:,} + host "
                f"layout {self.layout_bytes:,} B ({h.layout_cycles(self.layout_bytes):,.0f}) + CPU "
                f"{self.cpu_macs:,} MACs ({h.cpu_cycles(self.cpu_macs):,.0f}); host model {h.name}")

    def placement(self, layout: bool = False) -> List[tuple]:
        """``(op, device)`` of every operator in report order; layout transforms only if asked."""
        return [(p.op, p.device) for p in self.placements
                if layout or p.reason != LAYOUT_REASON]

    def devices(self, op: str) -> List[str]:
        """The device of each occurrence of Relax operator ``op``, in report order (VTA first)."""
        return [p.device for p in self.placements if p.op == op]

    @property
    def on_vta(self) -> List[OpPlacement]:
        return [p for p in self.placements if p.device == VTA]

    @property
    def on_cpu(self) -> List[OpPlacement]:
        return [p for p in self.placements if p.device == CPU]

    def summary(self) -> str:
        """One log line: counts per device and operator."""
        vta = Counter(p.op for p in self.on_vta)
        cpu = Counter(p.op for p in self.on_cpu if p.reason != LAYOUT_REASON)
        layout = self.host_relayouts
        fmt = lambda c: ", ".join(f"{n}x {op}" for op, n in sorted(c.items())) or "nothing"
        return (f"ext_vta build ({self.config}, strategy {self.strategy}): VTA runs {fmt(vta)}; CPU runs {fmt(cpu)} "
                f"plus {layout} host layout transform(s) per inference")

    def __str__(self) -> str:
        lines = [self.summary()]
        lines += [f"  {p}" for p in self.placements if p.reason != LAYOUT_REASON]
        layout = Counter(p.op for p in self.on_cpu if p.reason == LAYOUT_REASON)
        if layout:
            lines.append(f"  CPU  {sum(layout.values())} host layout transform(s) per inference around "
                         "VTA operators (constant operands are relayouted at build time): "
                         + ", ".join(f"{n}x {op}" for op, n in sorted(layout.items())))
        lines.append("  " + self.cost_summary())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"BuildReport({self.config!r}, strategy {self.strategy!r}, {len(self.on_vta)} on VTA, "
                f"{len(self.on_cpu)} on CPU)")


_LAST: List[Optional[BuildReport]] = [None]


def publish(report: BuildReport) -> None:
    """Record ``report`` as the latest one and log its summary line."""
    _LAST[0] = report
    logger.info(report.summary())
    for p in report.placements:
        if p.device == CPU:
            logger.info("  %s", p)


def last_build_report() -> Optional[BuildReport]:
    """The report of the most recent ``relax.build`` for ``ext_vta`` in this process."""
    return _LAST[0]
