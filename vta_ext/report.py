"""The build report: which operators run on VTA, which on the CPU, and why.

``print(report)`` gives one line per operator (device, operator, source layer, strategy and
embedding, padding, cycles, efficiency: the floor over the cycles, :mod:`vta_ext.floor`) and a
summary (operators per device, MACs, cycles, the floor and efficiency of all VTA calls, host layout
operations, the end-to-end estimate). :meth:`BuildReport.explain` gives an operator's full
rationale (candidates, figures, tiling); :meth:`BuildReport.to_json` and
:meth:`BuildReport.to_csv` export the report.
"""
from __future__ import annotations

import csv
import dataclasses
import difflib
import io
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

__all__ = ["OpPlacement", "BuildReport", "last_build_report", "config_label", "LAYERS_ATTR",
           "CPU_REASONS_ATTR", "executed_macs"]

logger = logging.getLogger("vta_ext")

VTA = "vta"
CPU = "cpu"
LAYOUT_REASON = "layout transform around a VTA operator"
#: function attributes a frontend may set on a Relax function for the build report: variable name
#: -> source layer (e.g. the torch module path), and variable name -> why it stays on the CPU
LAYERS_ATTR = "vta_ext.layers"
CPU_REASONS_ATTR = "vta_ext.cpu_reasons"
#: the longest line :meth:`BuildReport.__str__` prints for an operator
LINE_WIDTH = 150
#: the columns of :meth:`BuildReport.to_csv`
CSV_COLUMNS = ("index", "device", "op", "kind", "layer", "name", "plan", "padding_pct",
               "padding_of", "padding", "cycles", "floor", "floor_bound", "efficiency", "macs",
               "reason", "detail")


@dataclass(frozen=True)
class OpPlacement:
    """Where one operator runs and why.

    Attributes
    ----------
    op : str
        The Relax operator (``"relax.nn.conv2d"``).
    device : str
        ``"vta"`` or ``"cpu"``.
    reason : str
        VTA: the operator kind and template (``"conv2d (stock template)"``); CPU: why it stays.
    detail : str
        VTA: the full rationale (plan, choice, candidates, epilogue, tiling, padding); CPU: the
        Relax variable.
    name : str
        The Relax variable the operator was bound to in the input module.
    layer : str
        The source layer (e.g. the torch module path) if the frontend recorded it.
    kind : str
        VTA: the operator kind of the template (``"conv2d"``, ``"max_pool2d"``, ...).
    plan : str
        VTA: the strategy and embedding in a few words (``"stock"``,
        ``"csp-relaxed NHWC x=1 y=k16 z=c16"``; :meth:`vta_ext.OpTemplate.plan_summary`).
    padding : str
        VTA: what the packed layouts pad (``"in channels 3->16"``), ``""`` for nothing.
    macs : int
        VTA: multiply-accumulates of the operator as written (conv2d, conv1d, matmul; else 0).
    elements : int
        VTA: elements of the operator's output.
    packed_elements : int
        VTA: elements of its packed output (padding included).
    call : int or None
        VTA: the index of its call in :attr:`BuildReport.vta_keys`.
    """

    op: str
    device: str
    reason: str
    detail: str = ""
    name: str = ""
    layer: str = ""
    kind: str = ""
    plan: str = ""
    padding: str = ""
    macs: int = 0
    elements: int = 0
    packed_elements: int = 0
    call: Optional[int] = None

    @property
    def short_op(self) -> str:
        """The operator in a word: the template's kind on VTA, else the Relax operator without
        its ``relax.`` / ``relax.nn.`` prefix."""
        if self.kind:
            return self.kind
        return self.op.replace("relax.nn.", "").replace("relax.", "")

    @property
    def source(self) -> str:
        """The source layer if known, else the Relax variable."""
        return self.layer or self.name

    def __str__(self) -> str:
        extra = f" [{self.detail}]" if self.detail else ""
        layer = f" ({self.layer})" if self.layer else ""
        return f"{self.device.upper():<4} {self.op:<28}{layer} {self.reason}{extra}"


def config_label(config) -> str:
    """How the report names ``config``: its name, marked when the value is not the preset of
    that name.

    Parameters
    ----------
    config : VTAConfig
        The configuration of the build.

    Returns
    -------
    str
        ``"default"`` for the preset itself (or a configuration that is not named after a preset);
        ``"default (modified, 3f2a9c1b)"`` (the first digits of
        :func:`vta_ext.executor.config_digest`) for a preset's name on another value, e.g.
        ``dataclasses.replace(load_config("default"), LOG_INP_BUFF_SIZE=14)``.
    """
    from .config import available_configs, load_config
    from .executor import config_digest

    if config.name in available_configs():
        try:
            same = load_config(config.name).to_dict() == config.to_dict()
        except Exception:  # noqa: BLE001 -- an unreadable preset: say so by the digest
            same = False
        if not same:
            return f"{config.name} (modified, {config_digest(config)[:8]})"
    return config.name


def _fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in ``...`` when cut."""
    return text if len(text) <= width else text[:max(width - 3, 0)] + "..."


def _percent(fraction: Optional[float]) -> str:
    """``"31%"``, ``"0.8%"``, ``"0%"``, or ``"-"`` for None."""
    if fraction is None:
        return "-"
    pct = 100 * fraction
    if pct == 0:
        return "0%"
    return f"{pct:.1f}%" if abs(pct) < 10 else f"{pct:.0f}%"


@dataclass
class BuildReport:
    """All placement decisions of one ``relax.build`` for ``ext_vta``.

    ``str(report)`` gives one line per operator of :attr:`operators` (at most about
    :data:`LINE_WIDTH` characters) and a summary; :meth:`explain` the full rationale of one
    operator; :meth:`to_json` / :meth:`to_csv` export it.
    """

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
            layer: str = "", **fields: Any) -> None:
        """Record where operator ``op`` (bound to Relax variable ``name``, from source ``layer``)
        runs and why; ``fields`` are the other :class:`OpPlacement` fields (VTA: ``kind``,
        ``plan``, ``padding``, ``macs``, ``elements``, ``packed_elements``, ``call``)."""
        self.placements.append(OpPlacement(op, device, reason, detail, name, layer, **fields))

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

    @property
    def operators(self) -> List[OpPlacement]:
        """The placements that :meth:`__str__` prints one line each, in order (every placement
        but the host layout transforms, which it summarises): :meth:`explain` takes an index
        into this list."""
        return [p for p in self.placements if p.reason != LAYOUT_REASON]

    # ---------------------------------------------------------------- per operator figures
    def floor(self, p: OpPlacement):
        """The floor of VTA placement ``p`` (:func:`vta_ext.floor.key_floor` of its call's key,
        the operator's MACs and output elements as written; computed on first use); None on the
        CPU."""
        key = self.key_of(p)
        if key is None:
            return None
        floors = self.__dict__.setdefault("_floors", {})
        if key not in floors:
            from .floor import key_floor

            floors[key] = key_floor(key, p.macs, p.elements)
        return floors[key]

    def efficiency(self, p: OpPlacement) -> Optional[float]:
        """Floor over modelled cycles of VTA placement ``p`` (1 is the best any plan can do);
        None on the CPU."""
        floor, cycles = self.floor(p), self.cycles(p)
        if floor is None or not cycles:
            return None
        from .floor import efficiency

        return efficiency(floor, cycles)

    @property
    def vta_floor(self) -> float:
        """Sum of the floors of all VTA calls of one inference (cycles)."""
        return sum(self.floor(p).total for p in self.on_vta if p.call is not None)

    @property
    def vta_efficiency(self) -> Optional[float]:
        """:attr:`vta_floor` over :attr:`vta_cycles` (None without VTA calls)."""
        cycles = self.vta_cycles
        return self.vta_floor / cycles if cycles else None

    def floor_text(self) -> str:
        """``"floor 1,931,776 cycles, efficiency 0.91"`` for the VTA calls, or ``""`` without."""
        if not self.vta_keys:
            return ""
        return f"floor {self.vta_floor:,.0f} cycles, efficiency {self.vta_efficiency:.2f}"

    def key_of(self, p: OpPlacement) -> Optional[str]:
        """The compiled-operator key of VTA placement ``p`` (None on the CPU, or when the report
        holds no key for its call, as in a report put together by hand)."""
        if p.device != VTA or p.call is None or p.call >= len(self.vta_keys):
            return None
        return self.vta_keys[p.call]

    def cycles(self, p: OpPlacement) -> Optional[int]:
        """Cycle-model cycles of VTA placement ``p``'s call
        (``vta_ext.executor.cycle_report(key).total_cycles``, computed on first use); None on
        the CPU."""
        key = self.key_of(p)
        if key is None:
            return None
        from .executor import cycle_report

        return cycle_report(key).total_cycles

    def padding_overhead(self, p: OpPlacement) -> Tuple[Optional[float], str]:
        """The extra work padding adds to VTA placement ``p``, as a fraction of the operator's own.

        Parameters
        ----------
        p : OpPlacement
            One of :attr:`placements`.

        Returns
        -------
        tuple of (float or None, str)
            ``(fraction, "MACs")`` for an operator on the GEMM core: the MACs its program executes
            (the cycle model's count; not those of a bias added by GEMM, :func:`bias_gemm_macs`,
            the epilogue's work) over the operator's MACs, minus 1 (7x7 filter taps padded to
            8x8: 0.306); ``(fraction, "elements")`` for the others: the packed output's elements
            over the output's, minus 1 (100 channels padded to 112: 0.12); ``(None, "")`` on the
            CPU or when neither is known.
        """
        key = self.key_of(p)
        if key is None:
            return None, ""
        if p.macs:
            executed = executed_macs(key) - bias_gemm_macs(key, p.packed_elements)
            if executed > 0:
                return executed / p.macs - 1, "MACs"
        if p.elements and p.packed_elements:
            return p.packed_elements / p.elements - 1, "elements"
        return None, ""

    @property
    def vta_macs(self) -> int:
        """MACs of the operators on VTA as written (conv2d, conv1d, matmul; no padding)."""
        return sum(p.macs for p in self.on_vta)

    @property
    def padded(self) -> List[OpPlacement]:
        """The VTA placements whose packed layouts pad the operands
        (:attr:`OpPlacement.padding`)."""
        return [p for p in self.on_vta if p.padding]

    def padding_text(self) -> str:
        """``"2 of 31 VTA operators pad their operands (max 31 % extra MACs)"``, or ``""``."""
        padded = self.padded
        if not padded:
            return ""
        worst: Dict[str, float] = {}
        for p in padded:
            try:
                fraction, unit = self.padding_overhead(p)
            except Exception:  # noqa: BLE001 -- a figure must not fail a build's log line
                continue
            if fraction is not None:
                worst[unit] = max(worst.get(unit, fraction), fraction)
        figures = ", ".join(f"{_percent(worst[u]).rstrip('%')} % extra {u}"
                            for u in ("MACs", "elements") if u in worst)
        return (f"{len(padded)} of {len(self.on_vta)} VTA operators pad their operands"
                + (f" (max {figures})" if figures else ""))

    # ---------------------------------------------------------------- text
    def summary(self) -> str:
        """One log line: counts per device and operator."""
        vta = Counter(p.op for p in self.on_vta)
        cpu = Counter(p.op for p in self.on_cpu if p.reason != LAYOUT_REASON)
        layout = self.host_relayouts
        fmt = lambda c: ", ".join(f"{n}x {op}" for op, n in sorted(c.items())) or "nothing"
        return (f"ext_vta build ({self.config}, strategy {self.strategy}): VTA runs {fmt(vta)}; CPU runs {fmt(cpu)} "
                f"plus {layout} host layout transform(s) per inference")

    def _rows(self) -> List[List[str]]:
        rows = []
        for i, p in enumerate(self.operators):
            if p.device == VTA:
                cycles, eff = self.cycles(p), self.efficiency(p)
                rows.append([str(i), "VTA", p.short_op, p.source, p.plan or p.reason,
                             _percent(self.padding_overhead(p)[0]),
                             "-" if cycles is None else f"{cycles:,}",
                             "-" if eff is None else f"{eff:.2f}"])
            else:
                rows.append([str(i), "CPU", p.short_op, p.source, p.reason])
        return rows

    def lines(self) -> List[str]:
        """The per-operator lines of :meth:`__str__` (a header, then one line per operator of
        :attr:`operators`, each at most :data:`LINE_WIDTH` characters)."""
        rows = self._rows()
        head = ["#", "on", "operator", "layer / variable", "strategy / embedding", "pad", "cycles",
                "eff"]
        caps = [6, 3, 18, 38, 38, 7, 13, 4]
        widths = [min(cap, max([len(head[c])] + [len(r[c]) for r in rows if len(r) > c]))
                  for c, cap in enumerate(caps)]
        right = {0, 5, 6, 7}

        def line(cells: List[str]) -> str:
            out = []
            for c, cell in enumerate(cells):
                last = c == len(cells) - 1 and len(cells) < len(head)
                if last:  # a CPU line: the reason takes the rest of the line
                    used = len("  " + "  ".join(out)) + 2
                    out.append(_fit(cell, LINE_WIDTH - used))
                else:
                    cell = _fit(cell, widths[c])
                    out.append(cell.rjust(widths[c]) if c in right else cell.ljust(widths[c]))
            return ("  " + "  ".join(out)).rstrip()

        return [line(head)] + [line(r) for r in rows]

    def _layout_line(self) -> Optional[str]:
        layout = Counter(p.short_op for p in self.on_cpu if p.reason == LAYOUT_REASON)
        if not layout:
            return None
        return (f"host layout operations: {sum(layout.values())} per inference, "
                f"{self.layout_bytes:,} B: " + ", ".join(f"{n}x {op}" for op, n in
                                                         sorted(layout.items())))

    def __str__(self) -> str:
        vta, cpu = len(self.on_vta), len(self.operators) - len(self.on_vta)
        total = self.vta_macs + self.cpu_macs
        share = f" ({100 * self.vta_macs / total:.1f} %)" if total else ""
        lines = [f"ext_vta build ({self.config}, strategy {self.strategy}): {vta} operator(s) on "
                 f"VTA, {cpu} on the CPU"]
        lines += self.lines()
        floor = f" ({self.floor_text()})" if self.vta_keys else ""
        lines.append(f"  MACs: {self.vta_macs:,} on VTA{share}, {self.cpu_macs:,} on the CPU; "
                     f"VTA cycles: {self.vta_cycles:,} in {len(self.vta_keys)} call(s){floor}")
        padding = self.padding_text()
        if padding:
            lines.append(f"  padding: {padding}")
        layout = self._layout_line()
        lines.append("  " + (layout or "host layout operations: none"))
        lines.append("  " + self.cost_summary())
        lines.append("  report.explain(i) or report.explain('layer') gives an operator's full "
                     "rationale")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"BuildReport({self.config!r}, strategy {self.strategy!r}, {len(self.on_vta)} on VTA, "
                f"{len(self.on_cpu)} on CPU)")

    # ---------------------------------------------------------------- explain
    def find(self, which: Union[int, str]) -> int:
        """The index in :attr:`operators` of ``which``: an index, a Relax variable name or a source
        layer (its full text, or without the ``" (aten....)"`` suffix).

        Raises
        ------
        IndexError
            An index out of range (the message gives the range).
        KeyError
            A name that no operator has, or a layer of several operators (the message names the
            valid choices).
        """
        ops = self.operators
        if isinstance(which, bool) or not isinstance(which, (int, str)):
            raise TypeError(f"explain() takes an operator index or a layer / variable name, not "
                            f"{type(which).__name__}")
        if isinstance(which, int):
            if not -len(ops) <= which < len(ops):
                raise IndexError(f"operator index {which} out of range: the report has "
                                 f"{len(ops)} operator line(s), 0..{len(ops) - 1}")
            return which % len(ops)
        by_name = [i for i, p in enumerate(ops) if p.name == which]
        if len(by_name) == 1:
            return by_name[0]
        by_layer = [i for i, p in enumerate(ops)
                    if p.layer and which in (p.layer, p.layer.split(" (")[0])]
        if len(by_layer) == 1:
            return by_layer[0]
        if by_layer:
            raise KeyError(f"layer {which!r} has {len(by_layer)} operators: give one of the "
                           f"indices {by_layer} or a variable "
                           f"({', '.join(ops[i].name for i in by_layer)})")
        choices = list(dict.fromkeys([p.layer.split(" (")[0] for p in ops if p.layer]
                                     + [p.name for p in ops if p.name]))
        close = difflib.get_close_matches(which, choices, n=3)
        raise KeyError(f"no operator of this report has variable or layer {which!r}"
                       + (f" (close: {', '.join(close)})" if close else "")
                       + f"; give an index 0..{len(ops) - 1} or one of: {', '.join(choices)}")

    def explain(self, which: Union[int, str]) -> str:
        """The full rationale of one operator of the report.

        Parameters
        ----------
        which : int or str
            Its index among the per-operator lines (the ``#`` column, :attr:`operators`), its
            Relax variable, or its source layer (``"layers.0.conv1"``).

        Returns
        -------
        str
            VTA: :attr:`OpPlacement.detail` (the plan, why it was chosen over the candidates,
            their figures, epilogue, tiling, padding); CPU: why it stays there
            (:attr:`OpPlacement.reason`).

        Raises
        ------
        IndexError, KeyError
            For an index or name that is not in the report; the message names the valid ones.
        """
        p = self.operators[self.find(which)]
        if p.device != VTA:
            return p.reason
        floor, eff = self.floor(p), self.efficiency(p)
        if floor is None:
            return p.detail
        return (f"{p.detail}; floor {floor.total:,.0f} cycles ({floor.bound} bound: GEMM "
                f"{floor.compute_gemm:,.0f} + ALU {floor.compute_alu:,.0f} compute, memory "
                f"{floor.memory:,.0f}), {self.cycles(p):,} modelled cycles, efficiency {eff:.2f}")

    # ---------------------------------------------------------------- export
    def _placement_dict(self, p: OpPlacement, index: Optional[int]) -> Dict[str, Any]:
        fraction, unit = self.padding_overhead(p)
        floor = self.floor(p)
        return {**dataclasses.asdict(p), "index": index, "cycles": self.cycles(p),
                "padding_pct": None if fraction is None else 100 * fraction,
                "padding_of": unit or None,
                "floor": None if floor is None else floor.total,
                "floor_parts": None if floor is None else floor.as_dict(),
                "floor_bound": None if floor is None else floor.bound,
                "efficiency": self.efficiency(p)}

    def to_dict(self) -> Dict[str, Any]:
        """The report as JSON-able values (what :meth:`to_json` writes).

        Returns
        -------
        dict
            ``config``, ``strategy``, ``placements`` (every :class:`OpPlacement` field, plus
            ``index`` in :attr:`operators` or None for a layout transform, ``cycles``,
            ``padding_pct`` and ``padding_of`` (:meth:`padding_overhead`), ``floor`` (cycles),
            ``floor_parts`` (:meth:`vta_ext.floor.Floor.as_dict`), ``floor_bound`` and
            ``efficiency`` (:meth:`floor`, :meth:`efficiency`)), ``timings``, ``host``
            (the host model's fields, or None for the default), ``vta_keys``, ``layout_bytes``,
            ``cpu_macs`` and ``summary`` (the figures of the summary lines).
        """
        index = {id(p): i for i, p in enumerate(self.operators)}
        host = dataclasses.asdict(self.host) if dataclasses.is_dataclass(self.host) else self.host
        padded = self.padded
        return {
            "config": self.config, "strategy": self.strategy,
            "placements": [self._placement_dict(p, index.get(id(p))) for p in self.placements],
            "timings": dict(self.timings), "host": host, "vta_keys": list(self.vta_keys),
            "layout_bytes": self.layout_bytes, "cpu_macs": self.cpu_macs,
            "summary": {
                "operators_on_vta": len(self.on_vta),
                "operators_on_cpu": len(self.operators) - len(self.on_vta),
                "vta_macs": self.vta_macs, "cpu_macs": self.cpu_macs,
                "vta_cycles": self.vta_cycles, "vta_floor": self.vta_floor,
                "vta_efficiency": self.vta_efficiency, "host_relayouts": self.host_relayouts,
                "layout_bytes": self.layout_bytes, "host_cycles": self.host_cycles,
                "end_to_end_cycles": self.end_to_end_cycles, "host_model": self.host_model.name,
                "padded_operators": len(padded), "padding": self.padding_text(),
                "line": self.summary(), "cost": self.cost_summary()},
        }

    def to_json(self, indent: Optional[int] = None) -> str:
        """The report as a JSON string (:meth:`to_dict`; ``indent`` as in :func:`json.dumps`)."""
        return json.dumps(self.to_dict(), indent=indent)

    def to_csv(self, path: Union[str, Path, None] = None) -> str:
        """One CSV row per operator of :attr:`operators` (columns :data:`CSV_COLUMNS`).

        Parameters
        ----------
        path : str, Path or None
            Where to write it too; None: only return it.

        Returns
        -------
        str
            The CSV text (a header row, then one row per operator).
        """
        out = io.StringIO()
        writer = csv.DictWriter(out, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for i, p in enumerate(self.operators):
            writer.writerow({k: ("" if v is None else v) for k, v in
                             self._placement_dict(p, i).items()})
        text = out.getvalue()
        if path is not None:
            Path(path).write_text(text)
        return text


def executed_macs(key: str) -> int:
    """MACs the program of compiled operator ``key`` executes, as the cycle model counts them.

    Parameters
    ----------
    key : str
        A compiled-operator key (:func:`vta_ext.executor.op_key`).

    Returns
    -------
    int
        The sum of the cycle model's own MAC count of each GEMM instruction
        (:meth:`vta_ext.sim.cycles.timing` ``.gemm_insn``): ``cycle_report(key).macs`` without
        timing the program (a build's padding figure needs only this count, and a warm build has
        no cycle report of its programs).
    """
    from .executor import compiled_op
    from .isa import GemmInsn
    from .sim.cycles import timing

    program = compiled_op(key).program
    gemm = timing(program.config).gemm_insn
    return sum(gemm(insn)[3] for insn in program.insns if isinstance(insn, GemmInsn))


def bias_gemm_macs(key: str, packed_elements: int) -> int:
    """MACs of the bias added by GEMM in the program of compiled operator ``key`` (0 without).

    A program whose workload sets ``bias_gemm`` adds the bias with one GEMM micro-op per
    accumulator row of its packed output (``docs/epilogue.md`` item 5): ``BATCH x BLOCK_OUT``
    output lanes times ``BLOCK_IN`` reduction lanes, so ``BLOCK_IN`` MACs per packed output
    element (``packed_elements``, padding included).
    """
    from .config import VTAConfig

    spec = json.loads(key)
    workload = spec.get("workload")
    if not (isinstance(workload, dict) and workload.get("bias_gemm")):
        return 0
    config = VTAConfig.from_dict(spec["config_value"], name=spec["config"])
    return int(packed_elements) * config.BLOCK_IN


_LAST: List[Optional[BuildReport]] = [None]


def publish(report: BuildReport) -> None:
    """Record ``report`` as the latest one and log it: the summary line and the CPU placements at
    INFO, and one WARNING line when operators are padded (the per-operator text is at INFO)."""
    _LAST[0] = report
    logger.info(report.summary())
    for p in report.placements:
        if p.device == CPU:
            logger.info("  %s", p)
    padding = report.padding_text()
    if padding:
        logger.warning("ext_vta build: %s: print(vta_ext.last_build_report()) for details",
                       padding)


def last_build_report() -> Optional[BuildReport]:
    """The report of the most recent ``relax.build`` for ``ext_vta`` in this process."""
    return _LAST[0]
