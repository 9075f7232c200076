"""VTA instructions and micro-ops: records, binary encoding and disassembly.

Each instruction is a small dataclass whose fields are the fields of the apache VTA
``VTAMemInsn``/``VTAGemInsn``/``VTAAluInsn`` structs. :func:`encode_stream` produces the 16
little-endian bytes per instruction the hardware reads, bit-identical to the C bit-field layout for
the given configuration (see :mod:`vta_ext.layout`); :func:`decode_stream` is its inverse. Values
that do not fit their field raise :class:`FieldRangeError` naming the field. Every encoder and
decoder of the package goes through :func:`encode_stream`/:func:`encode_uops` and
:func:`unpack_fields` (the one field decoder, vectorised, which the functional simulator also uses).

The module also holds the pipeline facts of facts §2.7, once: which module (:class:`Stage`)
executes an instruction (:func:`stage_of`, :func:`insn_stage`) and which dependency-token queue
each header flag of a stage pops or pushes (:func:`token_queue`, :data:`STAGE_QUEUES`,
:data:`TOKEN_QUEUES`).

The reference semantics of each instruction are those of the apache functional simulator and are
implemented in :mod:`vta_ext.sim.fsim`; ``docs/isa.md`` states them in prose.
"""
from __future__ import annotations

import itertools
import operator
from collections import defaultdict
from dataclasses import dataclass
from enum import IntEnum
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .config import VTAConfig
from .layout import (CLIP_BOUND_BITS, CLIP_MAX, CLIP_MIN, HEADER, IMM_MAX, IMM_MIN, INSN_BITS,
                     INSN_UNIT_BITS, AluOp, Layout, MemType, Opcode)

__all__ = [
    "Opcode", "MemType", "AluOp", "Stage", "FieldRangeError", "DepFlags",
    "MemInsn", "GemmInsn", "AluInsn", "FinishInsn", "Uop", "Insn",
    "decode_insn", "decode_stream", "decode_uops", "encode_stream", "encode_uops", "unpack_fields",
    "disassemble", "insn_stage", "stage_of", "token_queue", "StageQueues", "STAGE_QUEUES",
    "TOKEN_QUEUES", "clip_bounds", "clip_imm", "clip_alu_ops",
]


class Stage(IntEnum):
    """Pipeline stages (modules), in pipeline order, numbered as in the runtime's dependency calls.

    ``index`` is the 0-based position (for arrays indexed by module).
    """

    LOAD = 1
    COMPUTE = 2
    STORE = 3

    @property
    def index(self) -> int:
        return self - Stage.LOAD


#: one letter per stage in the token-queue names (the original fsim's l2g, g2l, g2s, s2g)
_QUEUE_LETTER = {Stage.LOAD: "l", Stage.COMPUTE: "g", Stage.STORE: "s"}


def token_queue(frm: Stage, to: Stage) -> str:
    """Name of the dependency-token queue from stage ``frm`` to the adjacent stage ``to``.

    Raises
    ------
    ValueError
        If the stages are not adjacent in the load -> compute -> store pipeline.
    """
    frm, to = Stage(frm), Stage(to)
    if abs(frm - to) != 1:
        raise ValueError(f"no dependency-token queue between {frm.name} and {to.name}: only "
                         "adjacent stages (LOAD-COMPUTE, COMPUTE-STORE) exchange tokens")
    return f"{_QUEUE_LETTER[frm]}2{_QUEUE_LETTER[to]}"


@dataclass(frozen=True)
class StageQueues:
    """The token queues that the four header flags of one stage's instructions refer to.

    ``None`` where the stage has no neighbour on that side (the flag must be 0, facts §2.7).
    """

    pop_prev: Optional[str]
    pop_next: Optional[str]
    push_prev: Optional[str]
    push_next: Optional[str]

    def pops(self) -> Tuple[Tuple[str, str], ...]:
        """``(header flag, queue)`` of each pop the stage can make (``pop_prev_dep`` first)."""
        return tuple((flag, q) for flag, q in (("pop_prev_dep", self.pop_prev),
                                               ("pop_next_dep", self.pop_next)) if q is not None)

    def pushes(self) -> Tuple[Tuple[str, str], ...]:
        """``(header flag, queue)`` of each push the stage can make (``push_prev_dep`` first)."""
        return tuple((flag, q) for flag, q in (("push_prev_dep", self.push_prev),
                                               ("push_next_dep", self.push_next)) if q is not None)


def _stage_queues(stage: Stage) -> StageQueues:
    prev = Stage(stage - 1) if stage > Stage.LOAD else None
    nxt = Stage(stage + 1) if stage < Stage.STORE else None
    return StageQueues(pop_prev=None if prev is None else token_queue(prev, stage),
                       pop_next=None if nxt is None else token_queue(nxt, stage),
                       push_prev=None if prev is None else token_queue(stage, prev),
                       push_next=None if nxt is None else token_queue(stage, nxt))


#: the token queues of each stage (pops are taken before execution, pushes made after it)
STAGE_QUEUES: Dict[Stage, StageQueues] = {s: _stage_queues(s) for s in Stage}
#: the four token queues, in pipeline order of the stage that pushes them: l2g, g2l, g2s, s2g
TOKEN_QUEUES: Tuple[str, ...] = tuple(q for s in Stage for q in (STAGE_QUEUES[s].push_prev,
                                                                  STAGE_QUEUES[s].push_next) if q)


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
        """The 16 bytes of this instruction (see :func:`encode_stream`)."""
        return encode_stream(config, [self])

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
        """The 16 bytes of this instruction (see :func:`encode_stream`)."""
        return encode_stream(config, [self])

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
        """The 16 bytes of this instruction (see :func:`encode_stream`)."""
        return encode_stream(config, [self])

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
        """The 16 bytes of this instruction (see :func:`encode_stream`)."""
        return encode_stream(config, [self])

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
        """The 4 bytes of this micro-op (see :func:`encode_uops`)."""
        return encode_uops(config, [self])

    @classmethod
    def decode(cls, config: VTAConfig, data: bytes) -> "Uop":
        """The micro-op encoded in the 4 bytes ``data``."""
        if len(data) != config.UOP_ELEM_BYTES:
            raise ValueError(f"a micro-op is {config.UOP_ELEM_BYTES} bytes, got {len(data)}")
        return decode_uops(config, data)[0]


def _signed(value: int, bits: int) -> int:
    """The two's-complement value of the low ``bits`` bits of ``value``."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def clip_bounds(imm: int) -> Tuple[int, int]:
    """Split a CLIP immediate into its (lo, hi) int8 bounds (low byte lo, high byte hi)."""
    return _signed(imm, CLIP_BOUND_BITS), _signed(imm >> CLIP_BOUND_BITS, CLIP_BOUND_BITS)


def clip_imm(lo: int, hi: int) -> int:
    """Pack int8 bounds ``lo <= hi`` into the signed 16-bit CLIP immediate."""
    if not (CLIP_MIN <= lo <= CLIP_MAX and CLIP_MIN <= hi <= CLIP_MAX):
        raise FieldRangeError(f"CLIP bounds [{lo}, {hi}] must be int8 values "
                              f"({CLIP_MIN}..{CLIP_MAX})")
    if lo > hi:
        raise FieldRangeError(f"CLIP bounds [{lo}, {hi}]: lo must not exceed hi")
    mask = (1 << CLIP_BOUND_BITS) - 1
    return _signed((lo & mask) | ((hi & mask) << CLIP_BOUND_BITS), 2 * CLIP_BOUND_BITS)


def clip_alu_ops(ext_clip: bool, lo: int, hi: int) -> List[Tuple[AluOp, int]]:
    """The ALU instructions ``(op, immediate)`` of ``max(min(x, hi), lo)``: one CLIP when the
    configuration has the extension (``EXT_CLIP``) and both bounds are int8, else MIN hi then MAX lo.

    Raises
    ------
    FieldRangeError
        If a bound needs MIN/MAX and does not fit the signed 16-bit immediate.
    """
    if ext_clip and CLIP_MIN <= lo <= hi <= CLIP_MAX:
        return [(AluOp.CLIP, clip_imm(lo, hi))]
    for bound in (lo, hi):
        if not IMM_MIN <= bound <= IMM_MAX:
            raise FieldRangeError(f"clip bound {bound} does not fit the 16-bit ALU immediate "
                                  f"({IMM_MIN}..{IMM_MAX})")
    return [(AluOp.MIN, hi), (AluOp.MAX, lo)]


_CLASSES = {Opcode.LOAD: (MemInsn, "MEM"), Opcode.STORE: (MemInsn, "MEM"),
            Opcode.GEMM: (GemmInsn, "GEMM"), Opcode.ALU: (AluInsn, "ALU"),
            Opcode.FINISH: (FinishInsn, "GEMM")}


_FLAGS = ("pop_prev_dep", "pop_next_dep", "push_prev_dep", "push_next_dep", "reset_reg",
          "use_imm", "pad_min")


def unpack_fields(layout: Layout, words: np.ndarray) -> Dict[str, np.ndarray]:
    """Every field of ``layout`` for every row of ``words``: the package's one field decoder.

    Parameters
    ----------
    layout : Layout
        An instruction or micro-op layout (``config.layouts[...]`` or :data:`layout.HEADER`).
    words : numpy.ndarray
        ``(n, k)`` unsigned array; row ``i`` holds the little-endian 64-bit words of item ``i``
        (one word for a micro-op or the header, two for an instruction).

    Returns
    -------
    dict
        Field name -> int64 array of ``n`` values; the signed ``imm`` field is sign-extended.
    """
    words = np.asarray(words).astype(np.uint64, copy=False)
    out: Dict[str, np.ndarray] = {}
    for f in layout.fields:
        word = words[:, f.lsb // INSN_UNIT_BITS]
        value = ((word >> np.uint64(f.lsb % INSN_UNIT_BITS)) & np.uint64(f.mask)).astype(np.int64)
        if f.name == "imm":
            value = np.where(value >> (f.width - 1), value - (1 << f.width), value)
        out[f.name] = value
    return out


def _insn_words(config: VTAConfig, data: bytes) -> np.ndarray:
    size = config.INS_ELEM_BYTES
    if len(data) % size:
        raise ValueError(f"instruction stream of {len(data)} bytes is not a multiple of {size}")
    return np.frombuffer(bytes(data), "<u8").reshape(len(data) // size, -1)


def decode_stream(config: VTAConfig, data: bytes) -> List[Insn]:
    """Decode a byte string holding a whole number of 16-byte instructions.

    Raises
    ------
    ValueError
        On a length that is not a whole number of instructions, or an unknown opcode.
    """
    words = _insn_words(config, data)
    opcodes = unpack_fields(HEADER, words)["opcode"]
    unknown = np.flatnonzero(~np.isin(opcodes, list(_CLASSES)))
    if unknown.size:
        i = int(unknown[0])
        raise ValueError(f"unknown opcode {int(opcodes[i])} in instruction #{i} "
                         f"({words[i].tobytes().hex()})")
    insns: List[Optional[Insn]] = [None] * len(opcodes)
    for opcode, (cls, layout) in _CLASSES.items():
        rows = np.flatnonzero(opcodes == opcode)
        if not rows.size:
            continue
        names = [f.name for f in config.layouts[layout].fields if f.name in cls.__dataclass_fields__]
        values = unpack_fields(config.layouts[layout], words[rows])
        for i, row in zip(rows.tolist(), zip(*(values[n].tolist() for n in names))):
            kwargs = dict(zip(names, row))
            for flag in _FLAGS:
                if flag in kwargs:
                    kwargs[flag] = bool(kwargs[flag])
            insns[i] = cls(**kwargs)
    return insns


def decode_insn(config: VTAConfig, data: bytes) -> Insn:
    """Decode one 16-byte instruction (see :func:`decode_stream`).

    Raises
    ------
    ValueError
        On a wrong length or an unknown opcode.
    """
    if len(data) != config.INS_ELEM_BYTES:
        raise ValueError(f"an instruction is {config.INS_ELEM_BYTES} bytes, got {len(data)}")
    return decode_stream(config, data)[0]


def decode_uops(config: VTAConfig, data: bytes) -> List[Uop]:
    """Decode a byte string holding a whole number of 4-byte micro-ops."""
    size = config.UOP_ELEM_BYTES
    if len(data) % size:
        raise ValueError(f"micro-op data of {len(data)} bytes is not a multiple of {size}")
    words = np.frombuffer(bytes(data), "<u4").reshape(-1, 1)
    values = unpack_fields(config.layouts["UOP"], words)
    return [Uop(*row) for row in zip(*(values[n].tolist() for n in ("dst_idx", "src_idx",
                                                                      "wgt_idx")))]


def _encode_fields(layouts: Sequence[Tuple[Layout, type]], items: Sequence, words_per_item: int,
                   what: str) -> np.ndarray:
    """Vectorised encoding: little-endian 64-bit words of ``items`` grouped by record type."""
    words = np.zeros((len(items), words_per_item), dtype="<u8")
    kinds = list(map(type, items))
    layout_of = dict((cls, layout) for layout, cls in layouts)
    for cls in dict.fromkeys(kinds):
        layout = layout_of[cls]
        index = [i for i, k in enumerate(kinds) if k is cls] if len(layout_of) > 1 else \
            list(range(len(items)))
        present = [f for f in layout.fields if f.name in cls.__dataclass_fields__]
        getter = operator.attrgetter(*(f.name for f in present))
        if len(present) == 1:
            getter = (lambda item, get=getter: (get(item),))
        flat = itertools.chain.from_iterable(map(getter, map(items.__getitem__, index)))
        rows = np.fromiter(flat, dtype=np.int64, count=len(index) * len(present))
        rows = rows.reshape(len(index), len(present))
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
            words[index, f.lsb // INSN_UNIT_BITS] |= \
                (values & f.mask).astype("<u8") << np.uint64(f.lsb % INSN_UNIT_BITS)
    return words


def encode_stream(config: VTAConfig, insns: Sequence[Insn]) -> bytes:
    """The 16-byte little-endian encodings of ``insns``, concatenated (vectorised).

    Raises
    ------
    FieldRangeError
        Naming the field, its value and the index of the first instruction that overflows it.
    """
    kinds = [(config.layouts[layout], cls) for cls, layout in _CLASSES.values()]
    return _encode_fields(kinds, list(insns), INSN_BITS // INSN_UNIT_BITS, "instruction").tobytes()


def encode_uops(config: VTAConfig, uops: Sequence["Uop"]) -> bytes:
    """The 4-byte encodings of ``uops``, concatenated (vectorised)."""
    words = _encode_fields([(config.layouts["UOP"], Uop)], list(uops), 1, "micro-op")
    return words.astype("<u4").tobytes()


def stage_of(opcode: int, memory_type: Optional[int] = None) -> Stage:
    """The module that executes an instruction (facts §2.7): the one home of this rule.

    LOAD of INP or WGT: load; STORE: store; every other LOAD (UOP, ACC, ACC_8BIT), GEMM, ALU and
    FINISH: compute. ``memory_type`` matters for LOAD only.
    """
    if opcode == Opcode.STORE:
        return Stage.STORE
    if opcode == Opcode.LOAD and memory_type in (MemType.INP, MemType.WGT):
        return Stage.LOAD
    return Stage.COMPUTE


#: :func:`stage_of` of every (opcode, memory type or None) pair, looked up per instruction
_STAGE_OF = {(op, mem): stage_of(op, mem) for op in Opcode for mem in (None, *MemType)}


#: instruction records without a ``memory_type`` (saves a failing attribute lookup per call)
_NO_MEMORY_TYPE = frozenset((GemmInsn, AluInsn, FinishInsn))


def insn_stage(insn: Insn) -> Stage:
    """The module that executes ``insn`` (see :func:`stage_of`)."""
    key = (insn.opcode, None if type(insn) in _NO_MEMORY_TYPE else
           getattr(insn, "memory_type", None))
    stage = _STAGE_OF.get(key)
    return stage if stage is not None else stage_of(*key)


def disassemble(config: VTAConfig, stream: Union[bytes, Sequence[Insn]]) -> str:
    """One readable line per instruction: index, executing module and fields."""
    insns = decode_stream(config, stream) if isinstance(stream, (bytes, bytearray, memoryview)) \
        else list(stream)
    width = len(str(max(len(insns) - 1, 0)))
    return "\n".join(f"{i:>{width}}  {insn_stage(x).name.lower():<7}  {x}" for i, x in enumerate(insns))
