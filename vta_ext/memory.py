"""VTA's on-chip memories (scratchpads): one immutable record per memory, derived from a configuration.

VTA has four on-chip memories: the micro-op buffer and the input, weight and accumulator buffers
(facts §1.3, §3.1). There is no separate output memory: a STORE reads accumulator entries and
truncates their lanes. In the style of exo-lang's "memories as classes", every property of a memory
lives in one :class:`Scratchpad` record. That covers the memory id of the LOADs that fill it, the
TIR storage scope, the depth in entries, the lane shape, type and bytes of one entry, and the value
of a pad-with-minimum lane. Every field is computed from the :class:`~vta_ext.config.VTAConfig`;
none is typed here.

Use::

    from vta_ext.isa import MemType
    from vta_ext.memory import ACC_SCOPE, scratchpad, scratchpad_of_scope, scratchpads

    inp = scratchpad(cfg, MemType.INP)       # the input buffer of cfg
    inp.depth, inp.entry_bytes, inp.lanes    # 2048 entries of 16 bytes = 16 int8 lanes (default)
    limits = {sp.name: sp.depth for sp in scratchpads(cfg).values()}   # uop, wgt, inp, acc
    acc = scratchpad_of_scope(cfg, ACC_SCOPE)

:func:`scratchpads` returns the four records keyed by memory id, in memory-id order (UOP, WGT,
INP, ACC). A LOAD of memory type ``ACC_8BIT`` fills the accumulator (:data:`LOAD_TARGETS`) and a
STORE reads it (:data:`STORE_SOURCE`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Mapping, Optional, Tuple

from .config import VTAConfig
from .isa import MemType
from .layout import UOP_BITS

__all__ = ["Scratchpad", "scratchpads", "scratchpad", "scratchpad_of_scope", "INP_SCOPE",
           "WGT_SCOPE", "ACC_SCOPE", "SCOPES", "LOAD_TARGETS", "STORE_SOURCE",
           "gemm_kernel_uop_budget"]

#: TIR storage scopes of the input, weight and accumulator buffers (the original stack's names)
INP_SCOPE = "local.inp_buffer"
WGT_SCOPE = "local.wgt_buffer"
ACC_SCOPE = "local.acc_buffer"
#: the scopes a schedule can allocate, in the order input, weight, accumulator
SCOPES = (INP_SCOPE, WGT_SCOPE, ACC_SCOPE)

#: the scratchpad each LOAD memory type writes (``ACC_8BIT`` sign-extends into the accumulator)
LOAD_TARGETS: Mapping[MemType, MemType] = MappingProxyType({
    MemType.UOP: MemType.UOP, MemType.WGT: MemType.WGT, MemType.INP: MemType.INP,
    MemType.ACC: MemType.ACC, MemType.ACC_8BIT: MemType.ACC})
#: the scratchpad a STORE (memory type OUT) reads
STORE_SOURCE = MemType.ACC


@dataclass(frozen=True)
class Scratchpad:
    """One on-chip memory of a configuration.

    Attributes
    ----------
    mem : MemType
        The memory id of the LOADs that fill it (``UOP``, ``WGT``, ``INP`` or ``ACC``).
    scope : str or None
        The TIR storage scope of its buffers (None for the micro-op buffer, which holds no tensor).
    log_depth : int
        log2 of the number of entries.
    lane_shape : tuple of int
        Lanes of one entry in their canonical row-major order: input ``(BATCH, BLOCK_IN)``, weight
        ``(BLOCK_OUT, BLOCK_IN)``, accumulator ``(BATCH, BLOCK_OUT)``, micro-op ``(1,)``.
    lane_bits : int
        Bits of one lane.
    signed : bool
        Whether lanes are two's-complement integers (micro-op words are unsigned).
    entry_bytes : int
        Bytes of one entry, in SRAM and in DRAM (``*_ELEM_BYTES``).
    """

    mem: MemType
    scope: Optional[str]
    log_depth: int
    lane_shape: Tuple[int, ...]
    lane_bits: int
    signed: bool
    entry_bytes: int

    @property
    def name(self) -> str:
        """Short lower-case name: ``"uop"``, ``"wgt"``, ``"inp"`` or ``"acc"``."""
        return self.mem.name.lower()

    @property
    def depth(self) -> int:
        """Number of entries."""
        return 1 << self.log_depth

    @property
    def lanes(self) -> int:
        """Scalars per entry."""
        return math.prod(self.lane_shape)

    @property
    def size_bytes(self) -> int:
        """Capacity in bytes (``*_BUFF_SIZE``)."""
        return self.depth * self.entry_bytes

    @property
    def dtype(self) -> str:
        """numpy/TVM name of the lane type, e.g. ``"int8"``, ``"int32"``, ``"uint32"``."""
        return f"{'' if self.signed else 'u'}int{self.lane_bits}"

    @property
    def pad_min_value(self) -> int:
        """Value of a padding lane of a LOAD with ``pad_min`` (extension ``EXT_PAD_MIN``).

        The lane has only its most significant bit set: the most negative value of a signed lane
        (-128 for int8, INT32_MIN for int32) and ``2**31`` for a micro-op word.
        """
        top = 1 << (self.lane_bits - 1)
        return -top if self.signed else top


@lru_cache(maxsize=64)
def _scratchpads(cfg: VTAConfig) -> Mapping[MemType, Scratchpad]:
    pads = (
        Scratchpad(MemType.UOP, None, cfg.log_uop_depth, (1,), UOP_BITS, False,
                   cfg.UOP_ELEM_BYTES),
        Scratchpad(MemType.WGT, WGT_SCOPE, cfg.log_wgt_depth, (cfg.BLOCK_OUT, cfg.BLOCK_IN),
                   cfg.WGT_WIDTH, True, cfg.wgt_elem_bytes),
        Scratchpad(MemType.INP, INP_SCOPE, cfg.log_inp_depth, (cfg.BATCH, cfg.BLOCK_IN),
                   cfg.INP_WIDTH, True, cfg.inp_elem_bytes),
        Scratchpad(MemType.ACC, ACC_SCOPE, cfg.log_acc_depth, (cfg.BATCH, cfg.BLOCK_OUT),
                   cfg.ACC_WIDTH, True, cfg.acc_elem_bytes),
    )
    return MappingProxyType({sp.mem: sp for sp in pads})


def scratchpads(cfg: VTAConfig) -> Mapping[MemType, Scratchpad]:
    """The four scratchpads of ``cfg``, keyed by memory id, in memory-id order (read-only)."""
    return _scratchpads(cfg)


def scratchpad(cfg: VTAConfig, mem: int) -> Scratchpad:
    """The scratchpad of ``cfg`` with memory id ``mem`` (``UOP``, ``WGT``, ``INP`` or ``ACC``).

    Raises
    ------
    KeyError
        For a memory id that names no scratchpad (``OUT``, ``ACC_8BIT``: use
        :data:`STORE_SOURCE` or :data:`LOAD_TARGETS` to find the memory they access).
    """
    try:
        return _scratchpads(cfg)[MemType(mem)]
    except (KeyError, ValueError):
        raise KeyError(f"memory id {mem} names no scratchpad; the scratchpads are "
                       f"{', '.join(m.name for m in _scratchpads(cfg))} (a LOAD of ACC_8BIT "
                       "fills ACC and a STORE of OUT reads ACC)") from None


def scratchpad_of_scope(cfg: VTAConfig, scope: str) -> Scratchpad:
    """The scratchpad of ``cfg`` whose TIR storage scope is ``scope``.

    Raises
    ------
    KeyError
        If ``scope`` is not one of :data:`SCOPES`.
    """
    for sp in _scratchpads(cfg).values():
        if sp.scope == scope:
            return sp
    raise KeyError(f"{scope!r} is not a VTA on-chip scope; the scopes are {SCOPES}")


def gemm_kernel_uop_budget(cfg: VTAConfig) -> int:
    """The most micro-ops one GEMM kernel of a tile may have: half the micro-op buffer, so that
    the tile's reset (or bias) kernel and its GEMM kernel fit in it together."""
    return cfg.uop_depth // 2
