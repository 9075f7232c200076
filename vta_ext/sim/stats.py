"""Statistics counters of the functional simulator (the fsim ``Profiler``).

The seven counters keep the names and rules of the apache fsim (``vta.simulator.profiler_status``):

* ``inp_load_nbytes``, ``wgt_load_nbytes``, ``acc_load_nbytes``, ``uop_load_nbytes``: bytes moved
  by non-NOP LOADs, ``x_size * y_size * element bytes`` of the target SRAM; padding is not counted
  and an ``ACC_8BIT`` load counts the full accumulator element size (64 bytes by default);
* ``out_store_nbytes``: ``x_size * y_size * BATCH * BLOCK_OUT * OUT_WIDTH / 8`` per STORE;
* ``gemm_counter``: ``iter_out * iter_in * (uop_end - uop_bgn)`` per non-reset GEMM;
* ``alu_counter``: ``iter_out * iter_in * (uop_end - uop_bgn)`` per ALU instruction.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Dict

__all__ = ["SimStats", "COUNTER_NAMES"]

#: counter names in the order of the fsim profiler's JSON report
COUNTER_NAMES = ("inp_load_nbytes", "wgt_load_nbytes", "acc_load_nbytes", "uop_load_nbytes",
                 "out_store_nbytes", "gemm_counter", "alu_counter")


@dataclass
class SimStats:
    """The seven fsim profiler counters.

    Instances add up with ``+`` (e.g. over the segments of a program) and subtract with ``-``.
    """

    inp_load_nbytes: int = 0
    wgt_load_nbytes: int = 0
    acc_load_nbytes: int = 0
    uop_load_nbytes: int = 0
    out_store_nbytes: int = 0
    gemm_counter: int = 0
    alu_counter: int = 0

    def as_dict(self) -> Dict[str, int]:
        """The counters as a plain dict with exactly the seven fsim keys."""
        return {name: int(getattr(self, name)) for name in COUNTER_NAMES}

    def copy(self) -> "SimStats":
        """An independent copy."""
        return SimStats(**self.as_dict())

    def clear(self) -> None:
        """Reset every counter to zero (``vta.simulator.profiler_clear``)."""
        for f in fields(self):
            setattr(self, f.name, 0)

    def __add__(self, other: "SimStats") -> "SimStats":
        if not isinstance(other, SimStats):
            return NotImplemented
        return SimStats(**{n: getattr(self, n) + getattr(other, n) for n in COUNTER_NAMES})

    def __sub__(self, other: "SimStats") -> "SimStats":
        if not isinstance(other, SimStats):
            return NotImplemented
        return SimStats(**{n: getattr(self, n) - getattr(other, n) for n in COUNTER_NAMES})

    def __repr__(self) -> str:
        body = ", ".join(f"{n}={getattr(self, n):,}" for n in COUNTER_NAMES)
        return f"SimStats({body})"
