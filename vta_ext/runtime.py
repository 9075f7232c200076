"""The VTA runtime: a program builder that turns runtime calls into a binary instruction stream.

It plays the role of the original C runtime (``vta/runtime/runtime.cc``): 2-D loads with padding
and 2-D stores, micro-op kernels with up to two loop levels, GEMM and ALU pushes, dependency-token
push/pop with the runtime's NOP rules, and synchronisation, which appends the final handshakes and
FINISH. Micro-op kernels are cached in the micro-op SRAM; evicted kernels stay valid in the DRAM
staging area until the next synchronisation (the Intel Labs fork's behaviour, not the apache quirk).

The result of :meth:`CommandQueue.synchronize` is a :class:`Program`: a DRAM image holding the data
buffers, the encoded instruction stream(s) and the micro-op staging area, ready to be executed by
:class:`vta_ext.sim.FunctionalSimulator` any number of times with new data.
"""
from __future__ import annotations

import bisect
from dataclasses import MISSING, dataclass, field, fields
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .config import MAX_XFER, PAGE_BYTES, VTAConfig
from .errors import TemplateRefusal
from .hazard import cure, distance_of
from .isa import (AluInsn, AluOp, FieldRangeError, FinishInsn, GemmInsn, Insn, MemInsn, MemType,
                  Opcode, Stage, Uop, clip_bounds, decode_stream, disassemble, encode_stream,
                  encode_uops, stage_of)
from .layout import IMM_MAX, IMM_MIN, LOOP_ITER_BITS, MAX_LOOP_EXTENT

__all__ = ["CommandQueue", "UopKernel", "Program", "DramBuffer", "RuntimeError_",
           "MissingExtensionError", "Segment"]

#: the memory types by value, and the stage a LOAD of each runs on (:func:`~vta_ext.isa.stage_of`)
_MEM_TYPES = {int(m): m for m in MemType}
_LOAD_STAGES = {m: stage_of(Opcode.LOAD, m) for m in MemType}
#: the adjacent (from, to) stage pairs by value (the pairs :meth:`CommandQueue._check_pair` lets
#: through)
_PAIRS = {(int(a), int(b)): (a, b) for a in Stage for b in Stage if abs(a - b) == 1}
_LOAD, _STORE, _OUT, _UOP = Opcode.LOAD, Opcode.STORE, MemType.OUT, MemType.UOP
_COMPUTE = Stage.COMPUTE


def _maker(cls: type, names: Sequence[str]) -> Callable[..., Insn]:
    """A function taking ``names`` positionally and returning a new ``cls`` record with those
    fields set and every other field at its default.

    It does what the dataclass's ``__init__`` does (the records have plain defaults and no
    ``__post_init__``; checked here) without its keyword parsing and call, about three times
    cheaper per instruction. It is written from the dataclass's own field list, so it follows the
    record's definition."""
    all_fields = fields(cls)
    unknown = set(names) - {f.name for f in all_fields}
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
    if hasattr(cls, "__post_init__") or any(f.default is MISSING for f in all_fields):
        raise TypeError(f"{cls.__name__} needs its __init__ (a __post_init__ or a field without "
                        "a plain default)")
    ns = {"_new": object.__new__, "_cls": cls,
          **{f"_d{i}": f.default for i, f in enumerate(all_fields)}}
    body = "".join(f"    r.{f.name} = {f.name if f.name in names else f'_d{i}'}\n"
                   for i, f in enumerate(all_fields))
    exec(f"def make({', '.join(names)}):\n    r = _new(_cls)\n{body}    return r\n", ns)
    return ns["make"]


#: the records the runtime builds, each from the fields it sets (:func:`_maker`)
_MEM_FIELDS = ("opcode", "memory_type", "sram_base", "dram_base", "pad_min", "y_size", "x_size",
               "x_stride", "y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")
_new_mem = _maker(MemInsn, _MEM_FIELDS)
_new_nop = _maker(MemInsn, ("opcode", "memory_type", "push_prev_dep", "push_next_dep"))
_LOOP_FIELDS = ("iter_out", "iter_in", "dst_factor_out", "dst_factor_in", "src_factor_out",
                "src_factor_in")
_new_gemm = _maker(GemmInsn, ("uop_bgn", "uop_end", *_LOOP_FIELDS, "reset_reg", "wgt_factor_out",
                              "wgt_factor_in"))
_new_alu = _maker(AluInsn, ("uop_bgn", "uop_end", *_LOOP_FIELDS, "alu_opcode", "use_imm", "imm"))


class RuntimeError_(RuntimeError):
    """Invalid use of the runtime API (the message says which call and why)."""


class MissingExtensionError(RuntimeError_, TemplateRefusal):
    """An instruction needs an ISA extension that the configuration does not enable.

    It is a :class:`~vta_ext.errors.TemplateRefusal`: the operator stays on the CPU and the build
    report gives this message.

    The message names the extension, the instruction and the configuration key
    (``EXT_CLIP``, ``EXT_PAD_MIN``, ``ISA_ACC_8BIT_LOAD``, ``ISA_ALU_MUL``) that enables it.
    """


class _Signature(tuple):
    """A micro-op kernel's signature (:meth:`UopKernel.signature`) that hashes once: the micro-op
    cache looks a kernel up at every push, and a tuple's hash walks every micro-op."""

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            self._hash = tuple.__hash__(self)
            return self._hash


@dataclass(frozen=True)
class DramBuffer:
    """A page-aligned region of the simulated physical DRAM."""

    name: str
    phys_addr: int
    nbytes: int

    def __repr__(self) -> str:
        return f"DramBuffer({self.name!r}, phys={self.phys_addr:#x}, {self.nbytes} B)"


class UopKernel:
    """A micro-op kernel: up to two affine loop levels around a list of micro-ops.

    Parameters
    ----------
    mode : {"gemm", "alu"}
        Which compute instruction runs the kernel.
    reset : bool
        GEMM only: zero the accumulators instead of multiply-accumulate.
    alu_opcode, use_imm, imm
        ALU only: the operation, and the immediate operand if ``use_imm``. ``AluOp.CLIP``
        (extension ``EXT_CLIP``) needs ``use_imm=True`` and ``imm = isa.clip_imm(lo, hi)`` with
        ``lo <= hi``; whether the configuration has the extension is checked by
        :meth:`CommandQueue.push_alu`.
    """

    MAX_LOOPS = 2

    def __init__(self, mode: str, reset: bool = False, alu_opcode: Optional[int] = None,
                 use_imm: bool = False, imm: int = 0) -> None:
        if mode not in ("gemm", "alu"):
            raise RuntimeError_(f"UopKernel mode must be 'gemm' or 'alu', got {mode!r}")
        if mode == "alu" and alu_opcode is None:
            raise RuntimeError_("an ALU UopKernel needs alu_opcode")
        if mode == "gemm" and (alu_opcode is not None or use_imm):
            raise RuntimeError_("a GEMM UopKernel takes no ALU opcode or immediate")
        if not IMM_MIN <= int(imm) <= IMM_MAX:
            raise FieldRangeError(f"ALU immediate {imm} does not fit int16 ({IMM_MIN}..{IMM_MAX})")
        if mode == "alu" and alu_opcode not in AluOp._value2member_map_:
            raise RuntimeError_(f"unknown ALU opcode {alu_opcode}; expected one of "
                                f"{', '.join(f'{o.name}={o.value}' for o in AluOp)}")
        if mode == "alu" and alu_opcode == AluOp.CLIP:
            if not use_imm:
                raise RuntimeError_("ALU CLIP takes its bounds from the immediate: create the kernel "
                                    "with use_imm=True and imm=isa.clip_imm(lo, hi)")
            lo, hi = clip_bounds(int(imm))
            if lo > hi:
                raise RuntimeError_(f"ALU CLIP immediate {int(imm)} holds bounds lo={lo} > hi={hi}; "
                                    f"the low byte is lo and the high byte hi, with lo <= hi: "
                                    f"build it with isa.clip_imm(lo, hi)")
        self.mode = mode
        self.reset = bool(reset)
        self.alu_opcode = None if alu_opcode is None else int(alu_opcode)
        self.use_imm = bool(use_imm)
        self.imm = int(imm)
        self.loops: List[Tuple[int, int, int, int]] = []
        self.uops: List[Uop] = []
        self._open_loops = 0
        self._signature: Optional[tuple] = None
        #: (record maker, instruction fields but the micro-op range), built on first use
        self._insn_fields: Optional[tuple] = None

    def loop_begin(self, extent: int, dst_factor: int, src_factor: int, wgt_factor: int = 0) -> None:
        """Open a loop level (before any micro-op is pushed; at most two levels)."""
        if self.uops:
            raise RuntimeError_("UopKernel.loop_begin after push: loops must enclose all micro-ops")
        if len(self.loops) >= self.MAX_LOOPS:
            raise RuntimeError_(f"UopKernel supports at most {self.MAX_LOOPS} loop levels")
        if extent < 1:
            raise RuntimeError_(f"UopKernel loop extent must be >= 1, got {extent}")
        if extent > MAX_LOOP_EXTENT:
            raise FieldRangeError(f"UopKernel loop extent {extent} does not fit the "
                                  f"{LOOP_ITER_BITS}-bit iter_out/iter_in fields (at most "
                                  f"{MAX_LOOP_EXTENT}); split the loop")
        self.loops.append((int(extent), int(dst_factor), int(src_factor), int(wgt_factor)))
        self._signature = self._insn_fields = None
        self._open_loops += 1

    def loop_end(self) -> None:
        if self._open_loops == 0:
            raise RuntimeError_("UopKernel.loop_end without a matching loop_begin")
        self._open_loops -= 1

    def push(self, dst_idx: int, src_idx: int = 0, wgt_idx: int = 0) -> None:
        """Append a micro-op (ALU kernels use ``dst_idx`` and ``src_idx`` only)."""
        if self.mode == "alu" and wgt_idx:
            raise RuntimeError_("ALU micro-ops have no weight index")
        self.uops.append(Uop(int(dst_idx), int(src_idx), int(wgt_idx)))
        self._signature = self._insn_fields = None

    @property
    def size(self) -> int:
        return len(self.uops)

    def signature(self) -> tuple:
        """Value identity used by the micro-op cache (recomputed only after a change)."""
        if self._signature is None:
            self._signature = _Signature((
                self.mode, self.reset, self.alu_opcode, self.use_imm, self.imm, tuple(self.loops),
                tuple((u.dst_idx, u.src_idx, u.wgt_idx) for u in self.uops)))
        return self._signature

    def instruction(self, uop_bgn: int) -> Insn:
        """The GEMM/ALU instruction that runs this kernel from SRAM position ``uop_bgn``.

        GEMM: loop 0 is the outer loop and loop 1 the inner one. ALU: a single loop is the *inner*
        loop (the original runtime's rule); two loops map as for GEMM.
        """
        if self._insn_fields is None:
            loops = list(self.loops)
            if self.mode == "alu" and len(loops) == 1:
                loops = [(1, 0, 0, 0)] + loops
            loops += [(1, 0, 0, 0)] * (2 - len(loops))
            (n_out, d_out, s_out, w_out), (n_in, d_in, s_in, w_in) = loops
            loop_fields = (n_out, n_in, d_out, d_in, s_out, s_in)   # _LOOP_FIELDS
            if self.mode == "gemm":
                self._insn_fields = (_new_gemm, loop_fields + (self.reset, w_out, w_in))
            else:
                self._insn_fields = (_new_alu, loop_fields + (self.alu_opcode, self.use_imm,
                                                              self.imm))
        make, rest = self._insn_fields
        return make(uop_bgn, uop_bgn + len(self.uops), *rest)

    def __repr__(self) -> str:
        what = "GEMM-reset" if self.reset else ("GEMM" if self.mode == "gemm" else
                                                f"ALU-{AluOp(self.alu_opcode).name}")
        return f"UopKernel({what}, loops={self.loops}, {self.size} uops)"


@dataclass
class Segment:
    """Instructions and micro-op staging of one synchronisation (one device run)."""

    insns: List[Insn]
    staging: List[UopKernel]
    uop_loads: List[Tuple[MemInsn, int]]  # (LOAD UOP, element offset in staging) to relocate
    insn_phys: int = 0
    uop_phys: int = 0

    @property
    def insn_count(self) -> int:
        return len(self.insns)


class _UopCache:
    """Residency of micro-op kernels in the micro-op SRAM, and the DRAM staging of one segment."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.resident: Dict[tuple, int] = {}  # signature -> SRAM start
        # the resident kernels by SRAM position: disjoint [start, end) ranges sorted by start
        self._starts: List[int] = []
        self._ends: List[int] = []
        self._sigs: List[tuple] = []
        self.sram_end = 0
        self.staging: List[UopKernel] = []
        self.staging_offset: Dict[tuple, int] = {}
        self.staging_size = 0

    def place(self, kernel: UopKernel) -> Tuple[int, Optional[int]]:
        """Return (SRAM start, staging offset to load from, or None if already resident)."""
        sig = kernel.signature()
        start = self.resident.get(sig)
        if start is not None:
            return start, None
        if kernel.size == 0:
            raise RuntimeError_("cannot push an empty micro-op kernel")
        if kernel.size > self.depth:
            raise RuntimeError_(f"micro-op kernel of {kernel.size} uops exceeds the micro-op buffer "
                                f"({self.depth} entries); split the kernel")
        start = self.sram_end if self.sram_end + kernel.size <= self.depth else 0
        end = start + kernel.size
        # evict every kernel overlapping [start, end): those from the first ending after start
        # to the last starting before end
        first = bisect.bisect_right(self._ends, start)
        last = bisect.bisect_left(self._starts, end, first)
        for e_sig in self._sigs[first:last]:
            del self.resident[e_sig]
        self._starts[first:last] = [start]
        self._ends[first:last] = [end]
        self._sigs[first:last] = [sig]
        self.resident[sig] = start
        self.sram_end = end
        if sig not in self.staging_offset:  # evicted kernels keep their staging copy
            self.staging_offset[sig] = self.staging_size
            self.staging.append(kernel)
            self.staging_size += kernel.size
        return start, self.staging_offset[sig]


class CommandQueue:
    """Builds a VTA program from runtime calls (see ``docs/runtime-api.md``).

    Parameters
    ----------
    config : VTAConfig
        The hardware configuration; passed explicitly, never global.
    """

    def __init__(self, config: VTAConfig) -> None:
        self.config = config
        self._insn_bytes = config.INS_ELEM_BYTES
        # a segment is closed once it holds more instructions than this: (count + 6) instruction
        # words, the closing handshakes included, must fit one transfer of MAX_XFER bytes
        self._max_insns = MAX_XFER // self._insn_bytes - 6
        self._elem_bytes: Dict[int, int] = {}   # memory type -> element bytes (config.elem_bytes)
        self.buffers: Dict[str, DramBuffer] = {}
        self._next_page = 1  # physical address 0 is never valid
        #: (kernel signature, distance) -> the kernels that keep the hazard contract
        self._cured: Dict[tuple, List[UopKernel]] = {}
        self.segments: List[Segment] = []
        self._start_segment()

    # ------------------------------------------------------------------ memory
    def alloc(self, nbytes: int, name: str) -> DramBuffer:
        """Allocate ``nbytes`` of page-aligned simulated DRAM under a unique ``name``."""
        if name in self.buffers:
            raise RuntimeError_(f"a DRAM buffer named {name!r} already exists")
        if nbytes <= 0:
            raise RuntimeError_(f"DRAM buffer {name!r}: size must be positive, got {nbytes}")
        pages = -(-nbytes // PAGE_BYTES)
        buf = DramBuffer(name, self._next_page * PAGE_BYTES, int(nbytes))
        self._next_page += pages
        self.buffers[name] = buf
        return buf

    # ------------------------------------------------------------------ instructions
    def _start_segment(self) -> None:
        self._insns: List[Insn] = []
        self._uops = _UopCache(self.config.uop_depth)
        self._uop_loads: List[Tuple[MemInsn, int]] = []
        # per stage (indexed by its value): a pop is pending for the stage's next instruction
        self._pending_pop_prev = [False] * (max(Stage) + 1)
        self._pending_pop_next = [False] * (max(Stage) + 1)
        # the stage whose push flags the last instruction may take (the original runtime's
        # GetPipelineStage): its stage, but None for a LOAD NOP and for an empty segment
        self._last_stage: Optional[Stage] = None

    def _append(self, insn: Insn, stage: Stage, pipeline_stage: Optional[Stage]) -> Insn:
        """Append ``insn`` (a new record, dependency flags clear) of ``stage``; it takes the
        stage's pending pops. ``pipeline_stage`` is ``stage``, or None if ``insn`` is a LOAD
        NOP (:attr:`_last_stage`)."""
        if self._pending_pop_prev[stage]:
            insn.pop_prev_dep = True
            self._pending_pop_prev[stage] = False
        if self._pending_pop_next[stage]:
            insn.pop_next_dep = True
            self._pending_pop_next[stage] = False
        self._insns.append(insn)
        self._last_stage = pipeline_stage
        return insn

    def _dram_base(self, buf: DramBuffer, elem_offset: int, mem: int, what: str) -> int:
        elem = self._elem_bytes.get(mem)
        if elem is None:
            elem = self._elem_bytes[mem] = self.config.elem_bytes(mem)
        if buf.phys_addr % elem:
            raise RuntimeError_(f"{what}: buffer {buf.name!r} at {buf.phys_addr:#x} is not aligned to "
                                f"the {elem}-byte {MemType(mem).name} element")
        return buf.phys_addr // elem + int(elem_offset)

    def load_2d(self, src: DramBuffer, src_elem_offset: int, x_size: int, y_size: int,
                x_stride: int, x_pad_before: int, y_pad_before: int, x_pad_after: int,
                y_pad_after: int, dst_sram_index: int, mem_type: int, pad_min: bool = False) -> None:
        """Append a 2-D LOAD of ``y_size`` rows of ``x_size`` elements into an on-chip buffer."""
        try:
            mem = _MEM_TYPES[mem_type]
        except (KeyError, TypeError):
            mem = MemType(mem_type)
        if mem is _OUT or mem is _UOP:
            raise RuntimeError_(f"load_2d into {mem.name} is not a data load")
        if pad_min and not self.config.EXT_PAD_MIN:
            raise MissingExtensionError(self.config.missing_extension(
                "EXT_PAD_MIN", f"LOAD {mem.name} with pad_min=True (load_2d)"))
        if mem is MemType.ACC_8BIT and not self.config.ISA_ACC_8BIT_LOAD:
            raise MissingExtensionError(self.config.missing_extension(
                "ISA_ACC_8BIT_LOAD", "LOAD ACC_8BIT (load_2d)"))
        stage = _LOAD_STAGES[mem]
        insn = _new_mem(_LOAD, mem, dst_sram_index,
                        self._dram_base(src, src_elem_offset, mem, "load_2d"), bool(pad_min),
                        y_size, x_size, x_stride, y_pad_before, y_pad_after, x_pad_before,
                        x_pad_after)
        self._append(insn, stage, None if x_size == 0 else stage)
        if len(self._insns) > self._max_insns:
            self._close_segment()

    def store_2d(self, src_sram_index: int, mem_type: int, dst: DramBuffer, dst_elem_offset: int,
                 x_size: int, y_size: int, x_stride: int) -> None:
        """Append a 2-D STORE of accumulator rows (truncated to the output width) to DRAM."""
        if MemType(mem_type) != MemType.OUT:
            raise RuntimeError_(f"store_2d must use MemType.OUT, got {MemType(mem_type).name}")
        insn = MemInsn(opcode=Opcode.STORE, memory_type=MemType.OUT, sram_base=src_sram_index,
                       dram_base=self._dram_base(dst, dst_elem_offset, MemType.OUT, "store_2d"),
                       y_size=y_size, x_size=x_size, x_stride=x_stride)
        self._append(insn, Stage.STORE, Stage.STORE)
        if len(self._insns) > self._max_insns:
            self._close_segment()

    def _push_kernel(self, kernel: UopKernel, mode: str) -> None:
        if kernel.mode != mode:
            raise RuntimeError_(f"push_{mode} got a {kernel.mode} kernel")
        if kernel._open_loops:
            raise RuntimeError_(f"{kernel!r} has {kernel._open_loops} unclosed loop(s)")
        if kernel.mode == "alu" and kernel.alu_opcode == AluOp.CLIP and not self.config.EXT_CLIP:
            raise MissingExtensionError(self.config.missing_extension(
                "EXT_CLIP", f"ALU CLIP (push_alu of {kernel!r})"))
        if kernel.mode == "alu" and kernel.alu_opcode == AluOp.MUL and not self.config.ISA_ALU_MUL:
            raise MissingExtensionError(self.config.missing_extension(
                "ISA_ALU_MUL", f"ALU MUL (push_alu of {kernel!r})"))
        distance = distance_of(self.config, kernel.mode)
        if distance > 1:   # the hazard contract (vta_ext.hazard): push what keeps it instead
            key = (kernel.signature(), distance)
            cured = self._cured.get(key)
            if cured is None:
                cured = self._cured[key] = cure(kernel, distance, self.config.uop_depth)
            if cured[0] is not kernel:
                for part in cured:
                    self._push_one(part)
                return
        self._push_one(kernel)

    def _push_one(self, kernel: UopKernel) -> None:
        """Append ``kernel``'s instruction (after its micro-op load if it is not resident)."""
        start, staging_offset = self._uops.place(kernel)
        if staging_offset is not None:
            size = len(kernel.uops)
            load = _new_mem(_LOAD, _UOP, start, 0, False, 1, size, size, 0, 0, 0, 0)
            self._append(load, _COMPUTE, _COMPUTE)
            self._uop_loads.append((load, staging_offset))
        self._append(kernel.instruction(start), _COMPUTE, _COMPUTE)
        if len(self._insns) > self._max_insns:
            self._close_segment()

    def push_gemm(self, kernel: UopKernel) -> None:
        """Append a GEMM running ``kernel`` (and the micro-op load if it is not resident)."""
        self._push_kernel(kernel, "gemm")

    def push_alu(self, kernel: UopKernel) -> None:
        """Append an ALU instruction running ``kernel``."""
        self._push_kernel(kernel, "alu")

    # ------------------------------------------------------------------ dependencies
    def _push_noop(self, stage: Stage, push_prev: bool, push_next: bool) -> None:
        if stage == Stage.STORE:
            self._append(_new_nop(_STORE, _UOP, push_prev, push_next), stage, stage)
        else:   # a LOAD NOP: no stage takes push flags on it
            mem = MemType.INP if stage == Stage.LOAD else _UOP
            self._append(_new_nop(_LOAD, mem, push_prev, push_next), stage, None)

    def _commit_pending_pop(self, stage: Stage) -> None:
        if self._pending_pop_prev[stage] or self._pending_pop_next[stage]:
            self._push_noop(stage, False, False)

    @staticmethod
    def _check_pair(from_stage: Stage, to_stage: Stage) -> Tuple[Stage, Stage]:
        try:
            a, b = Stage(from_stage), Stage(to_stage)
        except ValueError:
            raise RuntimeError_(f"dependency between {from_stage!r} and {to_stage!r}: stages are "
                                f"{', '.join(f'{s.name}={s.value}' for s in Stage)}") from None
        if abs(a - b) != 1:
            raise RuntimeError_(f"no dependency queue between {a.name} and {b.name}")
        return a, b

    def dep_push(self, from_stage: Stage, to_stage: Stage) -> None:
        """Signal a token from ``from_stage`` to the adjacent ``to_stage``."""
        try:
            a, b = _PAIRS[from_stage, to_stage]
        except (KeyError, TypeError):
            a, b = self._check_pair(from_stage, to_stage)
        if self._pending_pop_prev[a] or self._pending_pop_next[a]:
            self._push_noop(a, False, False)
        if self._last_stage == a:
            last = self._insns[-1]
            if a < b:
                if not last.push_next_dep:
                    last.push_next_dep = True
                    return
            elif not last.push_prev_dep:
                last.push_prev_dep = True
                return
        self._push_noop(a, a > b, a < b)

    def dep_pop(self, from_stage: Stage, to_stage: Stage) -> None:
        """Make the next instruction of ``to_stage`` wait for a token from ``from_stage``."""
        try:
            a, b = _PAIRS[from_stage, to_stage]
        except (KeyError, TypeError):
            a, b = self._check_pair(from_stage, to_stage)
        pending = self._pending_pop_prev if a < b else self._pending_pop_next
        if pending[b]:
            self._commit_pending_pop(b)
        pending[b] = True

    # ------------------------------------------------------------------ synchronisation
    def _close_segment(self) -> None:
        self.dep_push(Stage.STORE, Stage.COMPUTE)
        self.dep_push(Stage.LOAD, Stage.COMPUTE)
        self.dep_pop(Stage.STORE, Stage.COMPUTE)
        self.dep_pop(Stage.LOAD, Stage.COMPUTE)
        self._commit_pending_pop(Stage.COMPUTE)
        self._insns.append(FinishInsn())
        self.segments.append(Segment(self._insns, self._uops.staging, self._uop_loads))
        self._start_segment()

    def synchronize(self) -> "Program":
        """Finish the current instruction stream (handshakes + FINISH) and return the program."""
        if self._insns:
            self._close_segment()
        return self.program()

    def program(self) -> "Program":
        """Lay out every finished segment in DRAM and return the executable :class:`Program`."""
        if not self.segments:
            raise RuntimeError_("no instructions: call synchronize() after emitting some")
        cfg = self.config
        top_page = self._next_page
        placements = []
        for seg in self.segments:
            seg.insn_phys = top_page * PAGE_BYTES
            top_page += -(-seg.insn_count * cfg.INS_ELEM_BYTES // PAGE_BYTES)
            uop_bytes = sum(k.size for k in seg.staging) * cfg.UOP_ELEM_BYTES
            seg.uop_phys = top_page * PAGE_BYTES
            top_page += max(1, -(-uop_bytes // PAGE_BYTES))
            placements.append(seg)
        dram = np.zeros((top_page - 1) * PAGE_BYTES, np.uint8)
        base = PAGE_BYTES
        segments = list(self.segments)
        for seg in segments:
            for load, offset in seg.uop_loads:
                load.dram_base = seg.uop_phys // cfg.UOP_ELEM_BYTES + offset

        def encode(image: np.ndarray) -> None:
            for seg in segments:
                stream = encode_stream(cfg, seg.insns)
                image[seg.insn_phys - base: seg.insn_phys - base + len(stream)] = \
                    np.frombuffer(stream, np.uint8)
                uops = encode_uops(cfg, [u for k in seg.staging for u in k.uops])
                image[seg.uop_phys - base: seg.uop_phys - base + len(uops)] = \
                    np.frombuffer(uops, np.uint8)

        return Program(cfg, dram, base, [(s.insn_phys, s.insn_count) for s in segments],
                       dict(self.buffers), [i for s in segments for i in s.insns], _encode=encode)


@dataclass
class Program:
    """An executable VTA program: a DRAM image with data buffers, instructions and micro-ops.

    The instruction and micro-op words are written into the image when it is first read
    (:attr:`dram`): a program that is only timed on the cycle model (a candidate that loses the
    choice) is never encoded."""

    config: VTAConfig
    _dram: np.ndarray
    dram_base: int
    segments: List[Tuple[int, int]]
    buffers: Dict[str, DramBuffer]
    insns: List[Insn] = field(repr=False)
    #: operands made of parts (:meth:`placed`): data address of the stand-in array -> the parts
    _placements: Dict[int, List[np.ndarray]] = field(default_factory=dict, repr=False)
    #: writes the instruction and micro-op words into the image; None once done
    _encode: Optional[Callable[[np.ndarray], None]] = field(default=None, repr=False)

    @property
    def dram(self) -> np.ndarray:
        """The DRAM image (from physical address :attr:`dram_base`), instructions encoded."""
        encode = self._encode
        if encode is not None:
            encode(self._dram)
            self._encode = None
        return self._dram

    def _view(self, name: str, nbytes: Optional[int] = None) -> np.ndarray:
        try:
            buf = self.buffers[name]
        except KeyError:
            raise KeyError(f"program has no DRAM buffer {name!r}; buffers: {sorted(self.buffers)}") from None
        nbytes = buf.nbytes if nbytes is None else nbytes
        if nbytes > buf.nbytes:
            raise ValueError(f"{nbytes} bytes do not fit DRAM buffer {buf!r}")
        start = buf.phys_addr - self.dram_base
        return self._dram[start:start + nbytes]   # a data buffer: no need to encode

    def write(self, name: str, array: np.ndarray) -> None:
        """Copy the bytes of ``array`` (C order) into buffer ``name`` of the DRAM image.

        If ``array`` is (a view of the whole of) a stand-in from :meth:`placed`, its parts are
        written side by side instead, each at the offset where it starts in the operand."""
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        parts = self._placements.pop(data.__array_interface__["data"][0], None) \
            if self._placements else None
        if parts is None:
            self._view(name, data.size)[:] = data
            return
        view, offset = self._view(name, data.size), 0
        for part in parts:
            part = np.ascontiguousarray(part).view(np.uint8).reshape(-1)
            view[offset:offset + part.size] = part
            offset += part.size

    def placed(self, parts: Sequence[np.ndarray], shape: Sequence[int], dtype) -> np.ndarray:
        """A stand-in for an operand of ``shape`` and ``dtype`` whose C-order bytes are the bytes
        of ``parts`` one after the other (e.g. a channel concat of packed tensors with one batch
        block). Pass it to the operator's ``run`` like the operand itself: :meth:`write` then
        places each part in the DRAM buffer directly, with no host concatenation. The stand-in's
        own contents are undefined; :meth:`check_placed` says whether every stand-in was written.

        Raises
        ------
        ValueError
            If the parts' dtypes or total size do not match ``shape`` and ``dtype``.
        """
        dtype = np.dtype(dtype)
        stand_in = np.empty(tuple(shape), dtype)
        if any(np.dtype(p.dtype) != dtype for p in parts) \
                or sum(p.nbytes for p in parts) != stand_in.nbytes:
            raise ValueError(f"parts {[(tuple(p.shape), str(p.dtype)) for p in parts]} do not "
                             f"make an operand of shape {tuple(shape)} {dtype}")
        self._placements[stand_in.__array_interface__["data"][0]] = list(parts)
        return stand_in

    def check_placed(self, report: bool = True) -> None:
        """Forget the stand-ins of :meth:`placed`; raise ``RuntimeError_`` (if ``report``) when
        one was not written by :meth:`write` (its operand was copied before writing, so the
        program ran on undefined data)."""
        if self._placements and not report:
            self._placements.clear()
        if self._placements:
            count = len(self._placements)
            self._placements.clear()
            raise RuntimeError_(f"{count} operand(s) made of parts were not written to the DRAM "
                                "image as given (the operator's run copied them): its result is "
                                "undefined; place the parts only for operators that write their "
                                "inputs unchanged")

    def read(self, name: str, dtype, shape: Sequence[int]) -> np.ndarray:
        """A copy of buffer ``name`` as an array of ``dtype`` and ``shape``."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        return self._view(name, count * dtype.itemsize).view(dtype).reshape(shape).copy()

    def run(self, simulator=None):
        """Execute every segment on ``simulator`` (a new functional simulator if None).

        Returns
        -------
        SimStats
            The counters accumulated over all segments.
        """
        from .sim import FunctionalSimulator

        sim = simulator if simulator is not None else FunctionalSimulator(self.config)
        total = None
        for insn_phys, count in self.segments:
            stats = sim.run(self.dram, self.dram_base, insn_phys, count)
            total = stats if total is None else total + stats
        return total

    @property
    def insn_count(self) -> int:
        return len(self.insns)

    def disassemble(self) -> str:
        return disassemble(self.config, self.insns)

    def to_arrays(self) -> Dict[str, np.ndarray]:
        """The program as plain arrays (no Python objects), for a disk cache
        (:meth:`from_arrays` rebuilds it): the encoded instructions and micro-ops (the DRAM
        image from the first segment on; :meth:`CommandQueue.program` lays them out after every
        data buffer, which a new program has zero), the image's size and base, the segments and
        the buffers.

        Raises
        ------
        RuntimeError_
            When a data buffer lies after the first segment (not a layout
            :class:`CommandQueue` makes).
        """
        image = self.dram
        start = min(phys for phys, _ in self.segments) - self.dram_base
        names = list(self.buffers)     # in allocation order
        late = [n for n in names if self.buffers[n].phys_addr - self.dram_base >= start]
        if late:
            raise RuntimeError_(f"Program.to_arrays: buffer(s) {late} lie after the instructions")
        return {"image": image[start:].copy(),
                "layout": np.array([image.size, start, self.dram_base], np.int64),
                "segments": np.array(self.segments, np.int64).reshape(-1, 2),
                "buffer_names": np.array(names, dtype=str),
                "buffers": np.array([[self.buffers[n].phys_addr, self.buffers[n].nbytes]
                                     for n in names], np.int64).reshape(-1, 2)}

    @classmethod
    def from_arrays(cls, config: VTAConfig, arrays: Dict[str, np.ndarray]) -> "Program":
        """The program :meth:`to_arrays` gave ``arrays`` for, on ``config``: the same DRAM image
        and the instructions decoded from it (:func:`~vta_ext.isa.decode_stream`)."""
        size, start, dram_base = (int(v) for v in arrays["layout"])
        dram = np.zeros(size, np.uint8)
        dram[start:] = arrays["image"]
        segments = [(int(phys), int(count)) for phys, count in arrays["segments"]]
        step = config.INS_ELEM_BYTES
        insns: List[Insn] = []
        for phys, count in segments:
            insns += decode_stream(config, dram[phys - dram_base: phys - dram_base + count * step]
                                   .tobytes())
        buffers = {str(n): DramBuffer(str(n), int(a), int(b))
                   for n, (a, b) in zip(arrays["buffer_names"], arrays["buffers"])}
        return cls(config, dram, dram_base, segments, buffers, insns)

    def __repr__(self) -> str:
        return (f"Program({self.config.name}, {self.insn_count} instructions in "
                f"{len(self.segments)} segment(s), {self._dram.size // 1024} KiB DRAM, "
                f"buffers {sorted(self.buffers)})")
