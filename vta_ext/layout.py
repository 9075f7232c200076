"""Bit-field layouts of VTA instructions and micro-ops, derived from a configuration.

Apache VTA declares its instructions as C bit-fields of ``uint64_t`` (``hw_spec.h``). With GCC and
Clang a field never straddles a 64-bit storage unit: when it does not fit in the bits left in the
current word it starts at the next word, leaving padding bits. The micro-op follows the same rule
with a 32-bit unit. This module reproduces that rule so that the encodings are bit-identical to the
original for every configuration, and reports fields that would overflow the 128-bit instruction
or the 32-bit micro-op.

It is also the one home of the values of the enumerated fields (:class:`Opcode`,
:class:`MemType`, :class:`AluOp`; :mod:`vta_ext.isa` re-exports them) and of the limits that the fixed field widths imply: :data:`MAX_DMA_PAD`, :data:`MAX_DMA_STRIDE`
(4-bit pad fields), :data:`MAX_LOOP_EXTENT` (14-bit loop fields), :data:`IMM_MIN`/:data:`IMM_MAX`
(signed 16-bit immediate), :data:`CLIP_MIN`/:data:`CLIP_MAX` (the int8 CLIP bounds) and
:data:`MAX_SRAM_ENTRIES` (16-bit ``sram_base``). Import them from here rather than retyping them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Dict, Iterable, List, Tuple

class Opcode(IntEnum):
    """Values of the ``opcode`` field (facts §2.1)."""

    LOAD = 0
    STORE = 1
    GEMM = 2
    FINISH = 3
    ALU = 4


class MemType(IntEnum):
    """Values of the ``memory_type`` field of LOAD/STORE (facts §2.1)."""

    UOP = 0
    WGT = 1
    INP = 2
    ACC = 3
    OUT = 4
    ACC_8BIT = 5


class AluOp(IntEnum):
    """Values of the ``alu_opcode`` field (apache numbering, plus the CLIP extension)."""

    MIN = 0
    MAX = 1
    ADD = 2
    SHR = 3
    MUL = 4
    CLIP = 5  # extension: imm low byte = lo, high byte = hi (int8 each)


# field widths of ``hw_spec_const.h`` (facts §1.3)
LOG_INSN_BITS = 7
LOG_UOP_BITS = 5
INSN_BITS = 1 << LOG_INSN_BITS
UOP_BITS = 1 << LOG_UOP_BITS
#: storage unit of the C bit-fields of an instruction (``uint64_t``)
INSN_UNIT_BITS = 64

OPCODE_BITS = 3
MEMOP_ID_BITS = 3
MEMOP_SRAM_ADDR_BITS = 16
MEMOP_DRAM_ADDR_BITS = 32
MEMOP_SIZE_BITS = 16
MEMOP_STRIDE_BITS = 16
MEMOP_PAD_BITS = 4
LOOP_ITER_BITS = 14
ALU_OPCODE_BITS = 3
ALU_IMM_BITS = 16

HEADER_FIELDS = (
    ("opcode", OPCODE_BITS),
    ("pop_prev_dep", 1),
    ("pop_next_dep", 1),
    ("push_prev_dep", 1),
    ("push_next_dep", 1),
)
#: names of the four dependency-token flags of the common header
DEP_FLAGS = tuple(name for name, _ in HEADER_FIELDS[1:])

# ------------------------------------------------------------------ limits implied by field widths
#: most padding rows or elements one side of a LOAD can have (the 4-bit ``x_pad_*``/``y_pad_*``)
MAX_DMA_PAD = (1 << MEMOP_PAD_BITS) - 1
#: largest DRAM row stride of a LOAD/STORE, in elements (the 16-bit ``x_stride``)
MAX_DMA_STRIDE = (1 << MEMOP_STRIDE_BITS) - 1
#: most iterations of one GEMM/ALU loop level (the 14-bit ``iter_out``/``iter_in``)
MAX_LOOP_EXTENT = (1 << LOOP_ITER_BITS) - 1
#: range of the signed 16-bit ALU immediate ``imm``
IMM_MIN = -(1 << (ALU_IMM_BITS - 1))
IMM_MAX = (1 << (ALU_IMM_BITS - 1)) - 1
#: bits of each of the two CLIP bounds packed into the immediate (low byte lo, high byte hi)
CLIP_BOUND_BITS = ALU_IMM_BITS // 2
#: range of each signed CLIP bound
CLIP_MIN = -(1 << (CLIP_BOUND_BITS - 1))
CLIP_MAX = (1 << (CLIP_BOUND_BITS - 1)) - 1
#: most on-chip entries a LOAD/STORE can address (the 16-bit ``sram_base``)
MAX_SRAM_ENTRIES = 1 << MEMOP_SRAM_ADDR_BITS


@dataclass(frozen=True)
class Field:
    """One bit-field: ``width`` bits starting at bit ``lsb`` of the little-endian word."""

    name: str
    lsb: int
    width: int
    mask: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mask", (1 << self.width) - 1)


@dataclass(frozen=True)
class Layout:
    """The fields of one instruction or micro-op format, in declaration order."""

    name: str
    fields: Tuple[Field, ...]
    total_bits: int

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.name} has no field {name!r}")

    @property
    def used_bits(self) -> int:
        """Bit index one past the last field."""
        return max(f.lsb + f.width for f in self.fields)

    def __repr__(self) -> str:
        body = ", ".join(f"{f.name}[{f.lsb}:{f.lsb + f.width - 1}]" for f in self.fields)
        return f"Layout({self.name}: {body})"


class LayoutOverflowError(ValueError):
    """A configuration makes an instruction or micro-op field fall outside its word."""


def pack_bitfields(name: str, fields: Iterable[Tuple[str, int]], unit: int, total_bits: int) -> Layout:
    """Place ``fields`` LSB first with the C rule: no field crosses a ``unit``-bit boundary.

    Raises
    ------
    LayoutOverflowError
        If a field does not fit in ``total_bits``; the message names the field.
    """
    placed: List[Field] = []
    pos = 0
    for fname, width in fields:
        if width <= 0 or width > unit:
            raise LayoutOverflowError(f"{name}.{fname}: width {width} is not in 1..{unit}")
        if pos // unit != (pos + width - 1) // unit:
            pos = (pos // unit + 1) * unit
        if pos + width > total_bits:
            raise LayoutOverflowError(
                f"{name}.{fname} ({width} bits) would occupy bits {pos}..{pos + width - 1}, beyond the "
                f"{total_bits}-bit {name.lower()} word; reduce the buffer sizes (LOG_*_BUFF_SIZE) or the "
                f"block sizes of the configuration")
        placed.append(Field(fname, pos, width))
        pos += width
    return Layout(name, tuple(placed), total_bits)


#: the common header of every instruction (the first fields of each instruction layout)
HEADER = pack_bitfields("HEADER", HEADER_FIELDS, INSN_UNIT_BITS, INSN_UNIT_BITS)


def instruction_layouts(log_uop_depth: int, log_inp_depth: int, log_wgt_depth: int,
                        log_acc_depth: int) -> Dict[str, Layout]:
    """Layouts of the MEM (LOAD/STORE), GEMM and ALU instructions and the UOP micro-op.

    Parameters
    ----------
    log_uop_depth, log_inp_depth, log_wgt_depth, log_acc_depth
        log2 of the number of entries of each on-chip buffer.

    Returns
    -------
    dict
        ``{"MEM": Layout, "GEMM": Layout, "ALU": Layout, "UOP": Layout}``.
    """
    mem = pack_bitfields("MEM", HEADER_FIELDS + (
        ("memory_type", MEMOP_ID_BITS),
        ("sram_base", MEMOP_SRAM_ADDR_BITS),
        ("dram_base", MEMOP_DRAM_ADDR_BITS),
        ("pad_min", 1),  # extension: bit 58, zero in apache streams
        ("y_size", MEMOP_SIZE_BITS),
        ("x_size", MEMOP_SIZE_BITS),
        ("x_stride", MEMOP_STRIDE_BITS),
        ("y_pad_0", MEMOP_PAD_BITS),
        ("y_pad_1", MEMOP_PAD_BITS),
        ("x_pad_0", MEMOP_PAD_BITS),
        ("x_pad_1", MEMOP_PAD_BITS),
    ), INSN_UNIT_BITS, INSN_BITS)
    compute_head = HEADER_FIELDS + (
        ("reset_reg", 1),
        ("uop_bgn", log_uop_depth),
        ("uop_end", log_uop_depth + 1),
        ("iter_out", LOOP_ITER_BITS),
        ("iter_in", LOOP_ITER_BITS),
        ("dst_factor_out", log_acc_depth),
        ("dst_factor_in", log_acc_depth),
    )
    gemm = pack_bitfields("GEMM", compute_head + (
        ("src_factor_out", log_inp_depth),
        ("src_factor_in", log_inp_depth),
        ("wgt_factor_out", log_wgt_depth),
        ("wgt_factor_in", log_wgt_depth),
    ), INSN_UNIT_BITS, INSN_BITS)
    alu = pack_bitfields("ALU", compute_head + (
        ("src_factor_out", log_acc_depth),
        ("src_factor_in", log_acc_depth),
        ("alu_opcode", ALU_OPCODE_BITS),
        ("use_imm", 1),
        ("imm", ALU_IMM_BITS),
    ), INSN_UNIT_BITS, INSN_BITS)
    uop = pack_bitfields("UOP", (
        ("dst_idx", log_acc_depth),
        ("src_idx", max(log_acc_depth, log_inp_depth)),
        ("wgt_idx", log_wgt_depth),
    ), UOP_BITS, UOP_BITS)
    return {"MEM": mem, "GEMM": gemm, "ALU": alu, "UOP": uop}
