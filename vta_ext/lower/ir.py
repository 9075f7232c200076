"""The intermediate representation of the lowering: the nodes between TIR and the generated code.

:mod:`.convert` builds :class:`SramBuf` and :class:`Loop` nodes and raw statement tuples;
:mod:`.patterns` turns the statements into :class:`Dma`, :class:`Alu` and :class:`GemmCall`;
:mod:`.uops` groups GEMM calls into :class:`GemmKernel`; :mod:`.sync` groups leaves into
:class:`Region` nodes with :class:`Dep` tokens; :mod:`.alloc` sets the ``base``/``stride`` of every
:class:`SramBuf`; :mod:`.codegen` emits the result. Every stage is a :class:`vta_ext.isa.Stage`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional, Tuple

from ..isa import MemType, Opcode, Stage, stage_of
from .affine import Aff

__all__ = ["LoweringError", "SramBuf", "Loop", "Dep", "Dma", "Alu", "GemmCall", "GemmKernel",
           "Region", "CopyLoop"]

#: a loop of a copy or element-wise stage: (variable, extent, SRAM stride, other stride), strides
#: in elements
CopyLoop = Tuple[str, int, int, int]


class LoweringError(ValueError):
    """The lowered TIR contains something this lowering cannot map onto VTA (message says what)."""


@dataclass
class SramBuf:
    """An on-chip buffer of the lowered function (a TIR allocation in a VTA scope)."""

    name: str
    scope: str
    nscalars: int              # flat size in scalars (one thread)
    elem: int                  # scalars per SRAM element
    vthread: bool = False      # allocated inside a virtual-thread loop
    alias: Optional["SramBuf"] = None
    base: int = -1             # element index of thread 0
    stride: int = 0            # elements between per-thread copies

    @property
    def root(self) -> "SramBuf":
        """The buffer at the end of the alias chain (in-place ALU stages alias their operand)."""
        b = self
        while b.alias is not None:
            b = b.alias
        return b

    @property
    def nelems(self) -> int:
        """SRAM elements of one thread's copy."""
        return -(-self.nscalars // self.elem)


@dataclass
class Loop:
    """A CPU loop (replayed in Python); ``vthread`` marks a virtual-thread loop."""

    var: str
    extent: int
    body: list
    vthread: bool = False


@dataclass
class Dep:
    """A dependency-token push or pop between two stages."""

    kind: str   # "push" | "pop"
    frm: Stage
    to: Stage


@dataclass
class Dma:
    """A 2-D DMA (analysed statically); ``cpu`` loops are replayed in Python."""

    kind: str                      # "load" | "store"
    mem: MemType
    sram: SramBuf
    dram: str                      # global buffer name
    sram_off: Aff                  # element units, outer vars
    dram_off: Aff                  # element units, outer vars
    x: Optional[CopyLoop]          # (var, extent, sram stride, dram stride) or None
    y: Optional[CopyLoop]
    cpu: List[CopyLoop]            # further loops, replayed in Python
    pads: Dict[str, Tuple[List[Aff], List[Aff]]] = field(default_factory=dict)
    # pads[var] = (lower bounds u >= -aff, upper bounds u <= aff) as Affs in outer vars
    guards: List[Aff] = field(default_factory=list)
    # conditions (aff >= 0) on outer vars only: when one fails the whole tile is padding
    pad_min: bool = False          # pad with the minimum value (extension EXT_PAD_MIN)
    fill: bool = False             # a zero fill: padding only (y_size 0), nothing read from DRAM

    @property
    def stage(self) -> Stage:
        """The module that executes the transfer (:func:`vta_ext.isa.stage_of`)."""
        return stage_of(Opcode.STORE if self.kind == "store" else Opcode.LOAD, self.mem)

    @property
    def acc_fill(self) -> bool:
        """Whether the transfer is an accumulator fill: a padding-only LOAD of the accumulator,
        which writes it and reads nothing (from DRAM or a buffer the load module writes)."""
        return self.fill and self.mem == MemType.ACC


@dataclass
class Alu:
    """An element-wise ALU stage on accumulator elements."""

    op: int
    use_imm: bool
    imm: int
    dst: SramBuf
    src: Optional[SramBuf]
    dst_off: Aff                   # element units (outer vars)
    src_off: Aff
    loops: List[CopyLoop]          # element loops (var, extent, dst stride, src stride)
    stage: ClassVar[Stage] = Stage.COMPUTE


@dataclass
class GemmCall:
    """One tensorized GEMM (or accumulator reset) call: operand buffers and scalar offsets."""

    reset: bool
    acc: Tuple[SramBuf, Aff]
    inp: Optional[Tuple[SramBuf, Aff]]
    wgt: Optional[Tuple[SramBuf, Aff]]
    stage: ClassVar[Stage] = Stage.COMPUTE


@dataclass
class GemmKernel:
    """A micro-op kernel: GEMM calls under up to two loops folded into the instruction."""

    reset: bool
    loops: List[Tuple[str, int]]     # folded loops (outer first), at most 2
    body: list                       # GemmCall / Loop of GemmCall (unrolled into micro-ops)
    stage: ClassVar[Stage] = Stage.COMPUTE


@dataclass
class Region:
    """Consecutive items of one stage with the dependency tokens around them (``stage`` None: a
    region holding only tokens)."""

    stage: Optional[Stage]
    items: list
    before: list = field(default_factory=list)
    after: list = field(default_factory=list)
