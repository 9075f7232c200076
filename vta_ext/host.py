"""The host CPU beside VTA, as a model of two rates: what its layout copies and its leftover
operators cost, in VTA cycles.

A VTA build leaves two kinds of work on the host:

* **layout traffic**: packing activations into VTA's blocked layouts and unpacking results, per
  inference (constant operands are packed at build time and cost nothing at run time);
* **operators on the CPU**: conv2d / matmul MACs that no VTA template took.

:class:`HostModel` turns them into VTA cycles with two constants, so that a plan's objective and a
build's end-to-end estimate can add them to the cycle model's VTA cycles:

``host cycles = layout bytes / layout_bytes_per_cycle + CPU MACs / cpu_macs_per_cycle``

The default, :data:`PYNQ_Z1`, describes the original VTA board (see ``docs/host-model.md`` for the
sources): a Zynq-7020 whose two ARM Cortex-A9 cores run at 650 MHz beside VTA's 100 MHz fabric,
6.5 host cycles per VTA cycle.

* ``layout_bytes_per_cycle = 6.5``: a layout copy is a strided byte gather that moves one byte per
  host cycle (one load and one store per byte on the dual-issue A9; 650 MB/s, below the 1,776 MB/s
  of the central interconnect the CPU reaches DDR through);
* ``cpu_macs_per_cycle = 13``: int8 MACs at 2 per host cycle, a quarter of one core's NEON peak
  (``VMLAL.S8`` over 8 lanes a cycle), for the leftover operators' hand-written or generic kernels.

Both are settable: ``vta_ext.build_options(host=HostModel(...))`` or ``host={"...": value}``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping, Union

__all__ = ["HostModel", "PYNQ_Z1", "host_model", "VIEW_OPS", "layout_traffic"]

#: host layout operators that are views, not copies: they move no bytes
VIEW_OPS = ("relax.reshape",)


@dataclass(frozen=True)
class HostModel:
    """Host work in VTA cycles (module docstring).

    Attributes
    ----------
    layout_bytes_per_cycle : float
        Bytes of host layout traffic (packing + unpacking) per VTA cycle.
    cpu_macs_per_cycle : float
        int8 multiply-accumulates of operators left on the CPU per VTA cycle.
    name : str
        What the constants describe (shown in reports).
    """

    layout_bytes_per_cycle: float = 6.5
    cpu_macs_per_cycle: float = 13.0
    name: str = "pynq-z1"

    def __post_init__(self) -> None:
        for f in ("layout_bytes_per_cycle", "cpu_macs_per_cycle"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"HostModel.{f}={v!r}: must be a positive number (per VTA cycle)")

    def layout_cycles(self, nbytes: float) -> float:
        """VTA cycles of ``nbytes`` of host layout traffic."""
        return nbytes / self.layout_bytes_per_cycle

    def cpu_cycles(self, macs: float) -> float:
        """VTA cycles of ``macs`` int8 MACs on the CPU."""
        return macs / self.cpu_macs_per_cycle

    def __repr__(self) -> str:
        return (f"HostModel({self.name}: {self.layout_bytes_per_cycle:g} layout B/cycle, "
                f"{self.cpu_macs_per_cycle:g} CPU MACs/cycle)")


#: the original VTA board's host (module docstring)
PYNQ_Z1 = HostModel()


def host_model(value: Union[None, HostModel, Mapping[str, Any]]) -> HostModel:
    """A :class:`HostModel` from ``None`` (:data:`PYNQ_Z1`), a model, or a dict of its fields.

    Raises
    ------
    ValueError
        Naming an unknown field or a bad value.
    """
    if value is None:
        return PYNQ_Z1
    if isinstance(value, HostModel):
        return value
    if isinstance(value, Mapping):
        known = {f.name for f in fields(HostModel)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown host model field(s) {', '.join(unknown)}; valid: "
                             f"{', '.join(sorted(known))}")
        return HostModel(**{"name": "custom", **dict(value)})
    raise ValueError(f"host must be a vta_ext.HostModel or a dict of its fields, got "
                     f"{type(value).__name__}")


def layout_traffic(layout, unpack: bool = False) -> int:
    """Bytes the host writes to pack (``unpack``: to unpack) one int8 tensor in ``layout``: the
    output of every op the layout emits that copies (a reshape is a view, see :data:`VIEW_OPS`;
    a chain of copying steps of a CSP layout is one fused kernel that writes its output once,
    :func:`tvm_csp_embed.codegen.relayout.emission`), as the layout's ``copied`` (``unpack``:
    ``unpack_copied``) property counts it; 0 for no layout. A layout without ``unpack_copied``
    (the stock blocked layouts of :mod:`vta_ext.packing`) prices its unpacking as its packing.
    """
    if layout is None:
        return 0
    return int(getattr(layout, "unpack_copied", layout.copied) if unpack else layout.copied)
