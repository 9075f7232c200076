"""VTA instructions and micro-ops: records, binary encoding and disassembly.

Each instruction is a small dataclass whose fields are the fields of the apache VTA
``VTAMemInsn``/``VTAGemInsn``/``VTAAluInsn`` structs. ``encode`` produces the 16 little-endian
bytes the hardware reads, bit-identical to the C bit-field layout for the given configuration
(see :mod:`vta_ext.layout`); :func:`decode_insn` is its inverse. Values that do not fit their field
raise :class:`FieldRangeError` naming the field.

The reference semantics of each instruction are those of the apache functional simulator and are
implemented in :mod:`vta_ext.sim.fsim`; ``docs/isa.md`` states them in prose.
"""
from __future__ import annotations

import operator
from collections import defaultdict
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Dict, List, Sequence, Tuple, Union

import numpy as np

from .config import VTAConfig
from .layout import Layout

__all__ = [
    "Opcode", "MemType", "AluOp", "Stage", "FieldRangeError", "DepFlags",
    "MemInsn", "GemmInsn", "AluInsn", "FinishInsn", "Uop", "Insn",
    "decode_insn", "decode_stream", "encode_stream", "encode_uops", "disassemble", "insn_stage",
]


class Opcode(IntEnum):
    LOAD = 0
    STORE = 1
    GEMM = 2
    FINISH = 3
    ALU = 4


class MemType(IntEnum):
    UOP = 0
    WGT = 1
    INP = 2
    ACC = 3
    OUT = 4
    ACC_8BIT = 5


class AluOp(IntEnum):
    MIN = 0
    MAX = 1
    ADD = 2
    SHR = 3
    MUL = 4
    CLIP = 5  # extension: imm low byte = lo, high byte = hi (int8 each)


class Stage(IntEnum):
    """Pipeline stages (module queues) in the numbering of the runtime's dependency calls."""

    LOAD = 1
    COMPUTE = 2
    STORE = 3


class FieldRangeError(ValueError):
    """A value does not fit the instruction field it is meant for."""


@dataclass
class DepFlags:
    """Dependency-token flags of the common instruction header."""

    pop_prev_dep: bool = False
    pop_next_dep: bool = False
    push_prev_dep: bool = False
    push_next_dep: bool = False

    def dep_text(self) -> str:
        names = [("pop_prev", self.pop_prev_dep), ("pop_next", self.pop_next_dep),
                 ("push_prev", self.push_prev_dep), ("push_next", self.push_next_dep)]
        on = [n for n, v in names if v]
        return f" [{' '.join(on)}]" if on else ""


def _pack(layout: Layout, values: dict) -> int:
    word = 0
    for f in layout.fields:
        value = int(values.get(f.name, 0))
        if f.name == "imm":
            if not -(1 << (f.width - 1)) <= value < (1 << (f.width - 1)):
                raise FieldRangeError(f"{layout.name}.imm = {value} does not fit a signed "
                                      f"{f.width}-bit immediate")
            value &= f.mask
        elif not 0 <= value <= f.mask:
            raise FieldRangeError(f"{layout.name}.{f.name} = {value} does not fit its {f.width}-bit "
                                  f"field (0..{f.mask})")
        word |= value << f.lsb
    return word


def _unpack(layout: Layout, word: int) -> dict:
    out = {}
    for f in layout.fields:
        value = (word >> f.lsb) & f.mask
        if f.name == "imm" and value >> (f.width - 1):
            value -= 1 << f.width
        out[f.name] = value
    return out


def _to_bytes(word: int, nbytes: int) -> bytes:
    return word.to_bytes(nbytes, "little")


@dataclass
class MemInsn(DepFlags):
    """LOAD or STORE of a 2-D block between DRAM and an on-chip buffer.

    ``sram_base`` and ``dram_base`` are in elements of ``memory_type``; ``x_size == 0`` is a NOP
    that only carries dependency flags. ``pad_min`` (extension, bit 58) pads with the most negative
    lane value instead of zero.
    """

    opcode: int = Opcode.LOAD
    memory_type: int = MemType.INP
    sram_base: int = 0
    dram_base: int = 0
    pad_min: bool = False
    y_size: int = 0
    x_size: int = 0
    x_stride: int = 0
    y_pad_0: int = 0
    y_pad_1: int = 0
    x_pad_0: int = 0
    x_pad_1: int = 0

    LAYOUT = "MEM"

    def encode(self, config: VTAConfig) -> bytes:
        return _to_bytes(_pack(config.layouts["MEM"], vars(self)), 16)

    def is_nop(self) -> bool:
        return self.x_size == 0

    def __str__(self) -> str:
        op = Opcode(self.opcode).name
        if self.is_nop():
            return f"NOP-{op:<5}{self.dep_text()}"
        mem = MemType(self.memory_type).name if self.memory_type in MemType._value2member_map_ \
            else f"mem{self.memory_type}"
        pads = ""
        if self.pad_min or any((self.y_pad_0, self.y_pad_1, self.x_pad_0, self.x_pad_1)):
            pads = (f" pad(y {self.y_pad_0},{self.y_pad_1} x {self.x_pad_0},{self.x_pad_1}"
                    f"{' min' if self.pad_min else ''})")
        return (f"{op:<6}{mem:<8} sram {self.sram_base:#06x} dram {self.dram_base:#010x} "
                f"y {self.y_size} x {self.x_size} stride {self.x_stride}{pads}{self.dep_text()}")


@dataclass
class _ComputeInsn(DepFlags):
    reset_reg: bool = False
    uop_bgn: int = 0
    uop_end: int = 0
    iter_out: int = 1
    iter_in: int = 1
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0

    def _loops_text(self) -> str:
        return (f"uop [{self.uop_bgn},{self.uop_end}) out {self.iter_out}x(dst {self.dst_factor_out} "
                f"src {self.src_factor_out}{self._extra_out()}) in {self.iter_in}x(dst "
                f"{self.dst_factor_in} src {self.src_factor_in}{self._extra_in()})")

    def _extra_out(self) -> str:
        return ""

    def _extra_in(self) -> str:
        return ""


@dataclass
class GemmInsn(_ComputeInsn):
    """GEMM over a micro-op range inside two affine loops; ``reset_reg`` zeroes the accumulators."""

    opcode: int = Opcode.GEMM
    wgt_factor_out: int = 0
    wgt_factor_in: int = 0

    def encode(self, config: VTAConfig) -> bytes:
        return _to_bytes(_pack(config.layouts["GEMM"], vars(self)), 16)

    def _extra_out(self) -> str:
        return f" wgt {self.wgt_factor_out}"

    def _extra_in(self) -> str:
        return f" wgt {self.wgt_factor_in}"

    def __str__(self) -> str:
        name = "GEMM-RST" if self.reset_reg else "GEMM"
        return f"{name:<14} {self._loops_text()}{self.dep_text()}"


@dataclass
class AluInsn(_ComputeInsn):
    """Element-wise ALU operation on accumulator rows: ``dst = op(dst, src or imm)``."""

    opcode: int = Opcode.ALU
    alu_opcode: int = AluOp.ADD
    use_imm: bool = False
    imm: int = 0

    def encode(self, config: VTAConfig) -> bytes:
        return _to_bytes(_pack(config.layouts["ALU"], vars(self)), 16)

    def operand_text(self) -> str:
        if not self.use_imm:
            return "vec"
        if self.alu_opcode == AluOp.CLIP:
            lo, hi = clip_bounds(self.imm)
            return f"imm [{lo},{hi}]"
        return f"imm {self.imm}"

    def __str__(self) -> str:
        try:
            op = AluOp(self.alu_opcode).name
        except ValueError:
            op = f"op{self.alu_opcode}"
        return f"ALU-{op:<4} {self.operand_text():<9} {self._loops_text()}{self.dep_text()}"


@dataclass
class FinishInsn(DepFlags):
    """End of the program; encoded in the GEMM layout with every other field zero."""

    opcode: int = Opcode.FINISH

    def encode(self, config: VTAConfig) -> bytes:
        return _to_bytes(_pack(config.layouts["GEMM"], vars(self)), 16)

    def __str__(self) -> str:
        return f"FINISH{self.dep_text()}"


Insn = Union[MemInsn, GemmInsn, AluInsn, FinishInsn]


@dataclass
class Uop:
    """A 32-bit micro-op: accumulator, input and weight SRAM indices (ALU: dst, src, 0)."""

    dst_idx: int = 0
    src_idx: int = 0
    wgt_idx: int = 0

    def encode(self, config: VTAConfig) -> bytes:
        return _to_bytes(_pack(config.layouts["UOP"], vars(self)), 4)

    @classmethod
    def decode(cls, config: VTAConfig, data: bytes) -> "Uop":
        if len(data) != 4:
            raise ValueError(f"a micro-op is 4 bytes, got {len(data)}")
        return cls(**_unpack(config.layouts["UOP"], int.from_bytes(data, "little")))


def clip_bounds(imm: int) -> tuple:
    """Split a CLIP immediate into its (lo, hi) int8 bounds (low byte lo, high byte hi)."""
    raw = imm & 0xFFFF
    lo, hi = raw & 0xFF, raw >> 8
    return (lo - 256 if lo >= 128 else lo, hi - 256 if hi >= 128 else hi)


def clip_imm(lo: int, hi: int) -> int:
    """Pack int8 bounds ``lo <= hi`` into the signed 16-bit CLIP immediate."""
    if not (-128 <= lo <= 127 and -128 <= hi <= 127):
        raise FieldRangeError(f"CLIP bounds [{lo}, {hi}] must be int8 values")
    if lo > hi:
        raise FieldRangeError(f"CLIP bounds [{lo}, {hi}]: lo must not exceed hi")
    raw = (lo & 0xFF) | ((hi & 0xFF) << 8)
    return raw - 0x10000 if raw >= 0x8000 else raw


_CLASSES = {Opcode.LOAD: (MemInsn, "MEM"), Opcode.STORE: (MemInsn, "MEM"),
            Opcode.GEMM: (GemmInsn, "GEMM"), Opcode.ALU: (AluInsn, "ALU"),
            Opcode.FINISH: (FinishInsn, "GEMM")}


def decode_insn(config: VTAConfig, data: bytes) -> Insn:
    """Decode one 16-byte instruction.

    Raises
    ------
    ValueError
        On a wrong length or an unknown opcode.
    """
    if len(data) != 16:
        raise ValueError(f"an instruction is 16 bytes, got {len(data)}")
    word = int.from_bytes(data, "little")
    opcode = word & 0x7
    if opcode not in _CLASSES.keys():
        raise ValueError(f"unknown opcode {opcode} in instruction {bytes(data).hex()}")
    cls, layout = _CLASSES[Opcode(opcode)]
    values = _unpack(config.layouts[layout], word)
    names = {f.name for f in fields(cls)}
    insn = cls(**{k: v for k, v in values.items() if k in names})
    for flag in ("pop_prev_dep", "pop_next_dep", "push_prev_dep", "push_next_dep", "reset_reg",
                 "use_imm", "pad_min"):
        if hasattr(insn, flag):
            setattr(insn, flag, bool(getattr(insn, flag)))
    return insn


def _encode_fields(layouts: Sequence[Tuple[Layout, type]], items: Sequence, words_per_item: int,
                   what: str) -> np.ndarray:
    """Vectorised encoding: little-endian 64-bit words of ``items`` grouped by record type."""
    words = np.zeros((len(items), words_per_item), dtype="<u8")
    groups: Dict[type, List[int]] = defaultdict(list)
    for i, item in enumerate(items):
        groups[type(item)].append(i)
    layout_of = dict((cls, layout) for layout, cls in layouts)
    for cls, index in groups.items():
        layout = layout_of[cls]
        present = [f for f in layout.fields if f.name in cls.__dataclass_fields__]
        getter = operator.attrgetter(*(f.name for f in present))
        rows = np.array([getter(items[i]) for i in index], dtype=np.int64).reshape(len(index), -1)
        index = np.asarray(index)
        for col, f in enumerate(present):
            values = rows[:, col]
            if f.name == "imm":
                low, high = -(1 << (f.width - 1)), (1 << (f.width - 1)) - 1
            else:
                low, high = 0, f.mask
            bad = np.flatnonzero((values < low) | (values > high))
            if bad.size:
                raise FieldRangeError(f"{layout.name}.{f.name} = {int(values[bad[0]])} of {what} "
                                      f"{int(index[bad[0]])} does not fit its {f.width}-bit field "
                                      f"({low}..{high})")
            words[index, f.lsb // 64] |= (values & f.mask).astype("<u8") << np.uint64(f.lsb % 64)
    return words


def encode_stream(config: VTAConfig, insns: Sequence[Insn]) -> bytes:
    """The 16-byte little-endian encodings of ``insns``, concatenated (vectorised).

    Raises
    ------
    FieldRangeError
        Naming the field, its value and the index of the first instruction that overflows it.
    """
    layouts = config.layouts
    kinds = [(layouts["MEM"], MemInsn), (layouts["GEMM"], GemmInsn), (layouts["ALU"], AluInsn),
             (layouts["GEMM"], FinishInsn)]
    return _encode_fields(kinds, list(insns), 2, "instruction").tobytes()


def encode_uops(config: VTAConfig, uops: Sequence["Uop"]) -> bytes:
    """The 4-byte encodings of ``uops``, concatenated (vectorised)."""
    words = _encode_fields([(config.layouts["UOP"], Uop)], list(uops), 1, "micro-op")
    return words.astype("<u4").tobytes()


def decode_stream(config: VTAConfig, data: bytes) -> List[Insn]:
    """Decode a byte string holding a whole number of instructions."""
    if len(data) % 16:
        raise ValueError(f"instruction stream of {len(data)} bytes is not a multiple of 16")
    return [decode_insn(config, bytes(data[i:i + 16])) for i in range(0, len(data), 16)]


def insn_stage(insn: Insn) -> Stage:
    """The module that executes ``insn`` (facts §2.7): load, compute or store."""
    if insn.opcode == Opcode.STORE:
        return Stage.STORE
    if insn.opcode == Opcode.LOAD and insn.memory_type in (MemType.INP, MemType.WGT):
        return Stage.LOAD
    return Stage.COMPUTE


def disassemble(config: VTAConfig, stream: Union[bytes, Sequence[Insn]]) -> str:
    """One readable line per instruction: index, executing module and fields."""
    insns = decode_stream(config, stream) if isinstance(stream, (bytes, bytearray, memoryview)) \
        else list(stream)
    width = len(str(max(len(insns) - 1, 0)))
    return "\n".join(f"{i:>{width}}  {insn_stage(x).name.lower():<7}  {x}" for i, x in enumerate(insns))
