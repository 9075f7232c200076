"""The design space of a co-design search: ranges of VTA configuration keys.

A :class:`Space` holds one tuple of candidate values per configuration key (GEMM shape, the four
scratchpads, the memory interface, the timing of the GEMM and ALU units). Its points are index
tuples into those ranges; :meth:`Space.config` turns a point into a
:class:`~vta_ext.config.VTAConfig`, whose own validation (:class:`~vta_ext.config.ConfigError`,
naming the field) decides whether it exists: a point whose instruction fields do not fit is
*rejected*, counted with its reason, and never evaluated. There is no second copy of those rules
here.

The timings are those of the shipped presets: ``"original"`` takes the GEMM/ALU cycles per micro-op
of ``default`` (the published VTA), ``"pipelined"`` those of ``pipelined`` (the Intel stack's fully
pipelined units).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from vta_ext.config import ConfigError, VTAConfig, load_config

__all__ = ["Space", "TIMINGS", "timing_keys", "timing_of"]

#: timing name -> the preset whose GEMM/ALU cycles per micro-op it takes
TIMINGS = {"original": "default", "pipelined": "pipelined"}
_TIMING_FIELDS = ("GEMM_CYCLES_PER_UOP", "ALU_CYCLES_PER_UOP_IMM", "ALU_CYCLES_PER_UOP_VEC")

Point = Tuple[int, ...]


def timing_keys(timing: str) -> Dict[str, int]:
    """The GEMM/ALU cycles per micro-op of timing ``timing`` (read from its preset)."""
    if timing not in TIMINGS:
        raise ValueError(f"unknown timing {timing!r}; choose from {sorted(TIMINGS)}")
    preset = load_config(TIMINGS[timing])
    return {key: getattr(preset, key) for key in _TIMING_FIELDS}


def timing_of(config: VTAConfig) -> str:
    """``"original"``, ``"pipelined"`` or ``"custom"``: which preset timing ``config`` has."""
    for name in TIMINGS:
        if all(getattr(config, k) == v for k, v in timing_keys(name).items()):
            return name
    return "custom"


#: Space field -> the configuration key it sets (LOG_BUS_WIDTH and the timing are derived)
_KEYS = {"log_batch": "LOG_BATCH", "log_block_in": "LOG_BLOCK_IN", "log_block_out": "LOG_BLOCK_OUT",
         "log_inp_buff": "LOG_INP_BUFF_SIZE", "log_wgt_buff": "LOG_WGT_BUFF_SIZE",
         "log_acc_buff": "LOG_ACC_BUFF_SIZE", "log_uop_buff": "LOG_UOP_BUFF_SIZE",
         "mem_bytes_per_cycle": "MEM_BYTES_PER_CYCLE"}


@dataclass(frozen=True)
class Space:
    """Ranges of the VTA configuration keys a co-design search varies.

    Every field is a tuple of candidate values (give one value to fix a key). The other keys come
    from ``base``.

    Parameters
    ----------
    log_batch : tuple of int
        ``LOG_BATCH``.
    log_block_in, log_block_out : tuple of int
        ``LOG_BLOCK_IN`` and ``LOG_BLOCK_OUT``.
    square_block : bool
        Only the points with ``LOG_BLOCK_IN == LOG_BLOCK_OUT`` (the presets' shapes); default True.
    log_inp_buff, log_wgt_buff, log_acc_buff, log_uop_buff : tuple of int
        ``LOG_INP_BUFF_SIZE``, ``LOG_WGT_BUFF_SIZE``, ``LOG_ACC_BUFF_SIZE``, ``LOG_UOP_BUFF_SIZE``
        (log2 of bytes).
    mem_bytes_per_cycle : tuple of int
        ``MEM_BYTES_PER_CYCLE``, the cycle model's DRAM bandwidth.
    log_bus_width : tuple of int or None
        ``LOG_BUS_WIDTH``; None (default) ties the bus to the bandwidth, ``8 * bytes per cycle``
        bits, as the wide presets do.
    timing : tuple of str
        ``"original"`` and/or ``"pipelined"`` GEMM/ALU timing (:data:`TIMINGS`).
    base : str or VTAConfig
        The configuration the other keys come from (default ``"default"``).

    Examples
    --------
    >>> Space(log_block_in=(4,), log_block_out=(4,), timing=("pipelined",)).size
    432
    """

    log_batch: Tuple[int, ...] = (0, 1)
    log_block_in: Tuple[int, ...] = (4, 5)
    log_block_out: Tuple[int, ...] = (4, 5)
    square_block: bool = True
    log_inp_buff: Tuple[int, ...] = (14, 15, 16)
    log_wgt_buff: Tuple[int, ...] = (17, 18, 19, 20)
    log_acc_buff: Tuple[int, ...] = (16, 17, 18)
    log_uop_buff: Tuple[int, ...] = (14, 15)
    mem_bytes_per_cycle: Tuple[int, ...] = (8, 16, 32)
    log_bus_width: Optional[Tuple[int, ...]] = None
    timing: Tuple[str, ...] = ("original", "pipelined")
    base: Any = "default"

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name in ("square_block", "base"):
                continue
            value = getattr(self, f.name)
            if value is None and f.name == "log_bus_width":
                continue
            if isinstance(value, (int, str)):
                value = (value,)
            try:
                value = tuple(value)
            except TypeError:
                raise ValueError(f"Space.{f.name}={value!r}: give a tuple of values") from None
            if not value:
                raise ValueError(f"Space.{f.name} is empty: give at least one value (the space "
                                 "would have no configuration)")
            if len(set(value)) != len(value):
                raise ValueError(f"Space.{f.name}={value!r} repeats a value")
            if f.name == "timing":
                for t in value:
                    timing_keys(t)  # an unknown name raises, listing the known ones
            elif any(isinstance(v, bool) or not isinstance(v, int) for v in value):
                raise ValueError(f"Space.{f.name}={value!r}: values must be integers")
            object.__setattr__(self, f.name, value)
        object.__setattr__(self, "base", load_config(self.base))
        if self.square_block and not set(self.log_block_in) & set(self.log_block_out):
            raise ValueError(f"Space: square_block=True but log_block_in={self.log_block_in} and "
                             f"log_block_out={self.log_block_out} share no value: the space is "
                             "empty (set square_block=False or share a value)")

    # ---------------------------------------------------------------- the axes
    @property
    def axes(self) -> Dict[str, Tuple[Any, ...]]:
        """Axis name -> its values, in point order (``log_bus_width`` only when not tied)."""
        axes = {name: getattr(self, name) for name in _KEYS}
        if self.log_bus_width is not None:
            axes["log_bus_width"] = self.log_bus_width
        axes["timing"] = self.timing
        return axes

    def points(self) -> Iterator[Point]:
        """Every point (index tuple), in a deterministic order (square blocks only if asked)."""
        names = list(self.axes)
        i_in, i_out = names.index("log_block_in"), names.index("log_block_out")
        for point in itertools.product(*(range(len(v)) for v in self.axes.values())):
            if self.square_block and (self.log_block_in[point[i_in]]
                                      != self.log_block_out[point[i_out]]):
                continue
            yield point

    @property
    def size(self) -> int:
        """How many points the space has (valid or not)."""
        return sum(1 for _ in self.points())

    def values(self, point: Point) -> Dict[str, Any]:
        """Axis name -> value of ``point``."""
        return {name: vals[i] for (name, vals), i in zip(self.axes.items(), point)}

    def config(self, point: Point) -> VTAConfig:
        """The configuration of ``point``; raises :class:`~vta_ext.config.ConfigError` naming the
        field when it does not exist (the configuration's own validation)."""
        v = self.values(point)
        keys = {_KEYS[name]: v[name] for name in _KEYS}
        keys["LOG_BUS_WIDTH"] = v.get("log_bus_width", (8 * v["mem_bytes_per_cycle"]).bit_length() - 1)
        keys.update(timing_keys(v["timing"]))
        return VTAConfig.from_dict({**self.base.to_dict(), **keys}, name=self.name(point))

    def name(self, point: Point) -> str:
        """A short name: ``"1x16x16_i15w18a17u15_8B_orig"``."""
        v = self.values(point)
        bus = f"_bus{1 << v['log_bus_width']}" if "log_bus_width" in v else ""
        return (f"{1 << v['log_batch']}x{1 << v['log_block_in']}x{1 << v['log_block_out']}_"
                f"i{v['log_inp_buff']}w{v['log_wgt_buff']}a{v['log_acc_buff']}u{v['log_uop_buff']}_"
                f"{v['mem_bytes_per_cycle']}B{bus}_{v['timing'][:4]}")

    def validate(self) -> Tuple[List[Point], List[Tuple[Point, str]]]:
        """``(valid points, [(rejected point, reason)])``; the reason names the field at fault."""
        valid, rejected = [], []
        for point in self.points():
            try:
                self.config(point)
            except ConfigError as err:
                rejected.append((point, str(err)))
            else:
                valid.append(point)
        return valid, rejected

    def neighbours(self, point: Point) -> List[Point]:
        """The points one step away along one axis (with square blocks, the block axes move
        together)."""
        names = list(self.axes)
        tied = ({names.index("log_block_in"), names.index("log_block_out")}
                if self.square_block else set())
        sizes = [len(v) for v in self.axes.values()]
        out: List[Point] = []
        for axis, n in enumerate(sizes):
            if axis in tied and axis != min(tied):
                continue
            for step in (-1, 1):
                p = list(point)
                moved = tied if axis in tied else {axis}
                ok = True
                for a in moved:
                    p[a] += step
                    ok &= 0 <= p[a] < sizes[a]
                if not ok:
                    continue
                if self.square_block and tied and len({self.axes[names[a]][p[a]] for a in tied}) > 1:
                    continue  # the tied axes' values differ: not a square block
                out.append(tuple(p))
        return out

    def __repr__(self) -> str:
        ranges = ", ".join(f"{name}={list(vals)}" for name, vals in self.axes.items())
        tie = "" if self.log_bus_width is not None else ", bus tied to bandwidth"
        return f"Space({self.size} points: {ranges}{tie}, base {self.base.name!r})"
