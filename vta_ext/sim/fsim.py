"""Vectorised functional simulator of VTA, with the semantics of the apache fsim.

:class:`FunctionalSimulator` plays the role of the fsim ``Device``: it owns the on-chip buffers
(input, weight, accumulator and micro-op SRAMs, which persist across runs), the four dependency
token queues and the profiler counters, and executes a binary instruction stream stored in a DRAM
image, like ``VTADeviceRun(device, insn_phys, insn_count, wait_cycles)``.

Semantics (``docs/vta-reference-facts.md`` §3, apache fsim):

* LOAD copies a 2-D block of ``y_size`` rows of ``x_size`` elements (DRAM row stride ``x_stride``)
  into a dense SRAM block with ``x_pad_0/x_pad_1/y_pad_0/y_pad_1`` elements of zero padding.
  ``ACC_8BIT`` reads int8 values (16 DRAM bytes per element by default) and sign-extends them into
  the int32 accumulator lanes. Extension ``pad_min`` pads with -128 (INP, WGT) or INT32_MIN (ACC,
  ACC_8BIT; 0x80000000 for UOP words) instead of zero.
* STORE truncates each int32 accumulator lane to its low 8 bits (no saturation); the memory type
  must be OUT and the pads zero.
* GEMM accumulates ``inp[i] . wgt[j]`` into ``acc`` over the affine ``(iter_out, iter_in, uop)``
  grid, wrapping modulo 2^32; ``reset_reg`` zeroes the accumulators instead.
* ALU computes ``dst = f(dst, imm)`` or ``dst = f(dst, src)`` lane-wise on accumulators: MIN, MAX,
  ADD and MUL (wrapping), SHR (arithmetic right shift; a negative amount shifts left), and the
  extension CLIP (``use_imm`` only; ``max(min(a, hi), lo)`` with the int8 bounds packed in the
  immediate). Shift amounts are taken modulo 32, as the x86 shift instructions under the compiled
  fsim do.
* The extensions exist only if the configuration enables them (``EXT_CLIP``, ``EXT_PAD_MIN``); an
  ALU CLIP or a LOAD with ``pad_min`` under a configuration without them is an error. ``pad_min``
  in a STORE is always an error.
* Each instruction goes to the in-order queue of its module (load: LOAD INP/WGT; compute: LOAD
  UOP/ACC/ACC_8BIT, GEMM, ALU, FINISH; store: STORE). Dependency pops are taken before execution
  and pushes made after it, through the token queues l2g, s2g, g2l and g2s. The modules run round
  robin in the fixed order load, compute, store, each until it blocks (fsim starts each round at a
  random module; correctly synchronised programs do not depend on the order). The run ends when
  FINISH has executed; instructions still queued at that point are dropped, as in fsim, and listed
  in ``FunctionalSimulator.unexecuted``. The token counts persist across runs, as fsim's global
  queues do.

Where the original loops forever or aborts, this simulator raises :class:`SimulationError` naming
the instruction (index and disassembly): unsatisfiable token waits (deadlock), SRAM or DRAM indices
out of range (no wrapping), a STORE of a non-OUT memory type or with padding, unknown opcodes,
memory types or ALU operations, and dependency flags that name a queue the module does not have.

Implementation: the stream is decoded at once from its 64-bit words (and the decoding is reused
when the same stream runs again); every instruction executes as whole-array numpy operations. A
GEMM is mapped onto batched float32 matrix products (exact: each product of int8 values is at most
2^14 in magnitude and chunks of at most 1024 lanes keep every partial sum within 2^24) by
classifying its three loop axes (outer, inner, micro-op) into reduction, row, column and batch axes
from which indices they leave invariant. An ALU instruction runs as one vector operation when no
execution reads a value written by an earlier one, as an unordered reduction (``ufunc.at``) when
an associative operation accumulates into repeated destinations from sources it never writes, and
otherwise as a sequence of hazard-free runs, so results always equal strictly sequential
execution. These index analyses ("plans") depend only on the instruction bits and the micro-op
words, and are cached under that key.

Speed: on a shared 2-core machine single-threaded BLAS (``OPENBLAS_NUM_THREADS=1``) is faster and
more stable than two threads for the matrix sizes of VTA programs; see ``scripts/bench_fsim.py``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from ..config import VTAConfig
from ..hazard import distance_of, first_violation, operand_sequence
from ..isa import (STAGE_QUEUES, TOKEN_QUEUES, AluOp, MemType, Opcode, Stage, clip_bounds,
                   decode_insn, insn_stage, stage_of, unpack_fields)
from ..layout import DEP_FLAGS, HEADER
from ..memory import LOAD_TARGETS, scratchpads
from .stats import SimStats

__all__ = ["FunctionalSimulator", "SimulationError", "run_binary"]

#: largest number of int8 x int8 products summed in one float32 dot product (2^24 / 2^14)
_EXACT_LANES = 1 << 10
#: element budget of the operand gathers of one batched GEMM step
_GATHER_BUDGET = 1 << 22
#: largest number of (iter_out, iter_in, uop) executions materialised at once
_GRID_BUDGET = 1 << 22
#: total index elements kept in the plan cache before it is cleared
_PLAN_CACHE_ELEMS = 1 << 24
_MEM_IDS = frozenset(int(m) for m in MemType)
_OPCODES = frozenset(int(o) for o in Opcode)
#: mask clearing the dependency flags of an instruction's first word
_NOT_DEP_FLAGS = ~np.uint64(sum(1 << HEADER[flag].lsb for flag in DEP_FLAGS))
_ALU_OPS = frozenset(int(o) for o in AluOp)


class SimulationError(RuntimeError):
    """An instruction stream that the hardware cannot execute.

    Attributes
    ----------
    insn_index : int or None
        Index of the offending instruction in the stream (None for stream-level errors).
    insn_text : str
        Disassembly of that instruction ("" if none).
    """

    def __init__(self, message: str, insn_index: Optional[int] = None, insn_text: str = "") -> None:
        self.insn_index = insn_index
        self.insn_text = insn_text
        where = f"instruction #{insn_index} ({insn_text}): " if insn_index is not None else ""
        super().__init__(where + message)


_MEM_KEYS = ("memory_type", "sram_base", "dram_base", "pad_min", "y_size", "x_size", "x_stride",
             "y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")
_COMPUTE_KEYS = ("uop_bgn", "uop_end", "iter_out", "iter_in", "dst_factor_out", "dst_factor_in",
                 "src_factor_out", "src_factor_in")
_GEMM_KEYS = _COMPUTE_KEYS + ("wgt_factor_out", "wgt_factor_in", "reset_reg")
_ALU_KEYS = _COMPUTE_KEYS + ("alu_opcode", "use_imm", "imm")


@dataclass
class _Stream:
    """A decoded instruction stream.

    ``fields[i]`` is the tuple of the fields of instruction ``i`` in the order of ``_MEM_KEYS``,
    ``_GEMM_KEYS`` or ``_ALU_KEYS`` (by opcode; None for FINISH and unknown opcodes).
    """

    raw: np.ndarray  # (n, INS_ELEM_BYTES) uint8
    opcode: List[int]
    pop_prev: List[int]
    pop_next: List[int]
    push_prev: List[int]
    push_next: List[int]
    fields: List[Optional[tuple]]
    plan_key: np.ndarray  # the words with the dependency flags cleared (plans do not depend on them)

    @classmethod
    def decode(cls, config: VTAConfig, raw: np.ndarray) -> "_Stream":
        words = raw.view("<u8").reshape(raw.shape[0], -1)
        header = unpack_fields(HEADER, words)
        opcodes = header["opcode"]
        per_format = {}
        for ops, layout, keys in (((Opcode.LOAD, Opcode.STORE), "MEM", _MEM_KEYS),
                                  ((Opcode.GEMM,), "GEMM", _GEMM_KEYS),
                                  ((Opcode.ALU,), "ALU", _ALU_KEYS)):
            rows = np.flatnonzero(np.isin(opcodes, ops))
            if rows.size:
                cols = unpack_fields(config.layouts[layout], words[rows])
                per_format.update(zip(rows.tolist(), zip(*(cols[k].tolist() for k in keys))))
        fields = [per_format.get(i) for i in range(len(opcodes))]
        plan_key = words.copy()
        plan_key[:, 0] &= _NOT_DEP_FLAGS
        return cls(raw, opcodes.tolist(), *(header[f].tolist() for f in DEP_FLAGS), fields=fields,
                   plan_key=plan_key)

    def __len__(self) -> int:
        return len(self.opcode)


def _alu_apply(op: int, a: np.ndarray, b, imm: int) -> np.ndarray:
    """``f(a, b)`` lane-wise on int32 values with the fsim rules (wrapping arithmetic).

    ``b`` is an int32 array shaped like ``a``, or an ``np.int32`` scalar (immediate).
    """
    if op == AluOp.MIN:
        return np.minimum(a, b)
    if op == AluOp.MAX:
        return np.maximum(a, b)
    if op == AluOp.ADD:
        return (a.view(np.uint32) + np.asarray(b, np.int32).view(np.uint32)).view(np.int32)
    if op == AluOp.MUL:
        return (a.view(np.uint32) * np.asarray(b, np.int32).view(np.uint32)).view(np.int32)
    if op == AluOp.SHR:
        b64 = np.asarray(b, np.int64)
        right = a >> (b64 & 31).astype(np.int32)
        left = (a.view(np.uint32) << ((-b64) & 31).astype(np.uint32)).view(np.int32)
        return np.where(b64 >= 0, right, left).astype(np.int32, copy=False)
    if op == AluOp.CLIP:
        lo, hi = clip_bounds(imm)
        return np.maximum(np.minimum(a, np.int32(hi)), np.int32(lo))
    raise ValueError(f"unknown ALU opcode {op}")  # callers check first


def _indexer(idx: np.ndarray):
    """``idx`` itself, or ``(slice, shape)`` if its elements are consecutive (a cheap view)."""
    flat = idx.reshape(-1)
    n = flat.size
    if n and int(flat[-1]) - int(flat[0]) == n - 1 and (n == 1 or bool(np.all(np.diff(flat) == 1))):
        return slice(int(flat[0]), int(flat[0]) + n), idx.shape
    return np.ascontiguousarray(idx)


def _slice_or_array(idx: np.ndarray):
    """A slice if the 1-D ``idx`` is a run of consecutive indices, else ``idx``."""
    index = _indexer(idx)
    return index[0] if type(index) is tuple else index


def _size(index) -> int:
    return 1 if type(index) is tuple else index.size


def _gather(array: np.ndarray, index) -> np.ndarray:
    """``array[idx]`` for an index made by :func:`_indexer` (shape ``idx.shape + element``)."""
    if type(index) is tuple:
        return array[index[0]].reshape(index[1] + array.shape[1:])
    return array[index]


class FunctionalSimulator:
    """The VTA functional simulator (a simulated ``Device``).

    Parameters
    ----------
    config : VTAConfig
        Hardware configuration (block sizes, buffer depths, instruction layouts).

    Attributes
    ----------
    acc : numpy.ndarray
        The accumulator SRAM, int32 ``(depth, BATCH, BLOCK_OUT)``.
    tokens : dict
        Token counts of the queues ``l2g``, ``s2g``, ``g2l``, ``g2s``.
    stats : SimStats
        Counters accumulated over every run since construction or :meth:`clear_stats`.
    unexecuted : list of int
        Indices of the instructions of the last run still queued when FINISH ended it (a correctly
        synchronised program leaves none).

    Notes
    -----
    The SRAM contents and the dependency-token counts persist across :meth:`run` calls on the same
    object; :meth:`reset` clears them. Each :meth:`run` returns the counters of that run alone.
    """

    def __init__(self, config: VTAConfig) -> None:
        if (config.INP_WIDTH, config.WGT_WIDTH, config.ACC_WIDTH) != (8, 8, 32):
            raise ValueError("the functional simulator supports int8 inputs/weights and int32 "
                             f"accumulators only, got {config!r}")
        self.config = config
        self.stats = SimStats()
        self._last_stream: Optional[_Stream] = None
        self.unexecuted: List[int] = []
        # execution plans of GEMM/ALU instructions, keyed by their bits and micro-op words; they
        # do not depend on SRAM data, so they survive reset()
        self._plans: Dict[bytes, list] = {}
        self._plan_elems = 0
        self._batch, self._bin, self._bout = config.BATCH, config.BLOCK_IN, config.BLOCK_OUT
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Zero every SRAM and empty the dependency-token queues."""
        cfg = self.config
        pads = scratchpads(cfg)
        inp, wgt, acc, uop = (pads[m] for m in (MemType.INP, MemType.WGT, MemType.ACC,
                                                 MemType.UOP))
        # inputs and weights are held as float32 (exact for int8) so GEMMs run on BLAS;
        # the weight buffer is kept transposed, [BLOCK_IN][BLOCK_OUT] per element
        self._inp = np.zeros((inp.depth,) + inp.lane_shape, np.float32)
        self._wgt_t = np.zeros((wgt.depth,) + wgt.lane_shape[::-1], np.float32)
        self.acc = np.zeros((acc.depth,) + acc.lane_shape, acc.dtype)
        self._uop_raw = np.zeros(uop.depth, uop.dtype)
        self._uop_dst = np.zeros(uop.depth, np.int64)
        self._uop_src = np.zeros(uop.depth, np.int64)
        self._uop_wgt = np.zeros(uop.depth, np.int64)
        self.tokens: Dict[str, int] = {q: 0 for q in TOKEN_QUEUES}
        # per loadable memory type: 2-D view of the scratchpad it fills, depth, DRAM element
        # bytes, counted bytes, counter name, pad-min value
        arrays = {MemType.INP: self._inp, MemType.WGT: self._wgt_t, MemType.ACC: self.acc,
                  MemType.UOP: self._uop_raw}
        self._load_specs = {}
        for mem, target in LOAD_TARGETS.items():
            sp = pads[target]
            self._load_specs[mem] = (arrays[target].reshape(sp.depth, -1), sp.depth,
                                     cfg.elem_bytes(mem), sp.entry_bytes, f"{sp.name}_load_nbytes",
                                     sp.pad_min_value)

    def clear_stats(self) -> None:
        """Reset the cumulative counters (``vta.simulator.profiler_clear``)."""
        self.stats.clear()

    def sram(self, memory: str) -> np.ndarray:
        """A copy of one on-chip buffer in its canonical lane layout.

        Parameters
        ----------
        memory : {"inp", "wgt", "acc", "uop"}
            ``inp``: int8 (depth, BATCH, BLOCK_IN); ``wgt``: int8 (depth, BLOCK_OUT, BLOCK_IN);
            ``acc``: int32 (depth, BATCH, BLOCK_OUT); ``uop``: uint32 (depth,).
        """
        if memory == "inp":
            return self._inp.astype(np.int8)
        if memory == "wgt":
            return self._wgt_t.transpose(0, 2, 1).astype(np.int8)
        if memory == "acc":
            return self.acc.copy()
        if memory == "uop":
            return self._uop_raw.copy()
        raise ValueError(f"unknown memory {memory!r}; expected inp, wgt, acc or uop")

    # ------------------------------------------------------------------ entry point
    def run(self, dram: np.ndarray, dram_base: int, insn_phys: int, insn_count: int) -> SimStats:
        """Execute ``insn_count`` instructions stored at physical address ``insn_phys``.

        Parameters
        ----------
        dram : numpy.ndarray
            The DRAM image, a writable 1-D uint8 array; STOREs write into it.
        dram_base : int
            Physical address of ``dram[0]``. ``dram_base`` fields of instructions are physical
            addresses divided by the element size of their memory type.
        insn_phys : int
            Physical address of the first instruction (``INS_ELEM_BYTES`` = 16 bytes each).
        insn_count : int
            Number of instructions.

        Returns
        -------
        SimStats
            The counters of this run (also added to :attr:`stats`).

        Raises
        ------
        SimulationError
            On a deadlock, an out-of-range access, or an invalid instruction.
        """
        if not isinstance(dram, np.ndarray) or dram.dtype != np.uint8 or dram.ndim != 1:
            raise TypeError("dram must be a 1-D numpy uint8 array")
        if not dram.flags.writeable:
            raise ValueError("dram must be writable (STOREs write into it)")
        if insn_count <= 0:
            raise SimulationError(f"insn_count must be positive, got {insn_count}")
        size = self.config.INS_ELEM_BYTES
        start = int(insn_phys) - int(dram_base)
        end = start + size * int(insn_count)
        if start < 0 or end > dram.size:
            raise SimulationError(
                f"instruction stream [{insn_phys:#x}, {insn_phys + size * insn_count:#x}) lies "
                f"outside "
                f"the DRAM image [{dram_base:#x}, {dram_base + dram.size:#x})")
        raw = dram[start:end].reshape(insn_count, size)
        cached = self._last_stream
        if cached is None or cached.raw.shape != raw.shape or not np.array_equal(cached.raw, raw):
            cached = self._last_stream = _Stream.decode(self.config, raw.copy())
        self._stream = cached
        self._dram, self._dram_base = dram, int(dram_base)
        before = self.stats.copy()
        try:
            queues = self._dispatch()
            self._schedule(queues)
        finally:
            self._dram = self._stream = None
        return self.stats - before

    # ------------------------------------------------------------------ scheduling
    def _describe(self, i: int) -> str:
        raw = bytes(self._stream.raw[i])
        try:
            insn = decode_insn(self.config, raw)
            return f"{insn_stage(insn).name.lower()}: {insn}"
        except ValueError:  # unknown opcode or enum value: show the raw bits
            return f"raw {raw.hex()}"

    def _error(self, i: int, message: str) -> SimulationError:
        return SimulationError(message, i, self._describe(i))

    def _dispatch(self) -> Dict[Stage, List[int]]:
        """Split the stream into the three module queues and check the header fields."""
        s = self._stream
        queues: Dict[Stage, List[int]] = {stage: [] for stage in Stage}
        for i, op in enumerate(s.opcode):
            if op not in _OPCODES:
                raise self._error(i, f"unknown opcode {op}")
            module = stage_of(op, s.fields[i][0] if op == Opcode.LOAD else None)
            side = STAGE_QUEUES[module]
            if side.pop_prev is None and (s.pop_prev[i] or s.push_prev[i]):
                raise self._error(i, f"a {module.name.lower()}-module instruction has no previous "
                                     "module: pop_prev/push_prev must be 0")
            if side.pop_next is None and (s.pop_next[i] or s.push_next[i]):
                raise self._error(i, f"a {module.name.lower()}-module instruction has no next "
                                     "module: pop_next/push_next must be 0")
            queues[module].append(i)
        return queues

    def _schedule(self, queues: Dict[Stage, List[int]]) -> None:
        """Run the three modules round-robin until FINISH; detect deadlocks."""
        s, tokens = self._stream, self.tokens
        heads = {stage: 0 for stage in Stage}
        while True:
            progress = False
            for module in Stage:
                side = STAGE_QUEUES[module]
                pop_p, pop_n, push_p, push_n = side.pop_prev, side.pop_next, side.push_prev, \
                    side.push_next
                queue = queues[module]
                while heads[module] < len(queue):
                    i = queue[heads[module]]
                    want_p, want_n = s.pop_prev[i], s.pop_next[i]
                    if (want_p and tokens[pop_p] == 0) or (want_n and tokens[pop_n] == 0):
                        break
                    if want_n:
                        tokens[pop_n] -= 1
                    if want_p:
                        tokens[pop_p] -= 1
                    self._execute(i)
                    if s.push_prev[i]:
                        tokens[push_p] += 1
                    if s.push_next[i]:
                        tokens[push_n] += 1
                    heads[module] += 1
                    progress = True
                    if s.opcode[i] == Opcode.FINISH:
                        self.unexecuted = sorted(q for m in Stage for q in queues[m][heads[m]:])
                        return
            if not progress:
                self._raise_stuck(queues, heads)

    def _raise_stuck(self, queues, heads) -> None:
        s = self._stream
        blocked = []
        for module in Stage:
            if heads[module] < len(queues[module]):
                i = queues[module][heads[module]]
                side = STAGE_QUEUES[module]
                need = [q for q, want in ((side.pop_prev, s.pop_prev[i]),
                                          (side.pop_next, s.pop_next[i]))
                        if want and self.tokens[q] == 0]
                blocked.append((i, f"{module.name.lower()} module waits for a token on "
                                   f"{' and '.join(need)}"))
        tokens = ", ".join(f"{k}={v}" for k, v in self.tokens.items())
        if not blocked:
            raise SimulationError(f"the stream of {len(s)} instructions ended without FINISH "
                                  f"(tokens: {tokens})")
        first = blocked[0][0]
        lines = "; ".join(f"#{i} ({self._describe(i)}): {why}" for i, why in blocked)
        raise SimulationError(f"deadlock: no module can make progress and FINISH was not reached; "
                              f"blocked: {lines} (tokens: {tokens})", first, self._describe(first))

    def _execute(self, i: int) -> None:
        op = self._stream.opcode[i]
        if op == Opcode.LOAD:
            self._load(i)
        elif op == Opcode.STORE:
            self._store(i)
        elif op == Opcode.GEMM:
            self._gemm(i)
        elif op == Opcode.ALU:
            self._alu(i)
        # FINISH: nothing to compute

    # ------------------------------------------------------------------ LOAD / STORE
    def _dram_bytes(self, i: int, what: str, dram_base: int, elem: int, y_size: int, x_size: int,
                    x_stride: int) -> np.ndarray:
        """The DRAM bytes of a transfer as ``(y_size * x_size * elem,)``, or a strided
        ``(y_size, x_size * elem)`` view if the rows are not contiguous."""
        start = dram_base * elem - self._dram_base
        contiguous = x_stride == x_size or y_size == 1
        end = start + ((y_size - 1) * x_stride + x_size) * elem
        if start < 0 or end > self._dram.size:
            raise self._error(i, f"{what} DRAM range [{start + self._dram_base:#x}, "
                                 f"{end + self._dram_base:#x}) lies outside the DRAM image "
                                 f"[{self._dram_base:#x}, {self._dram_base + self._dram.size:#x})")
        if contiguous:
            return self._dram[start:start + y_size * x_size * elem]
        return np.lib.stride_tricks.as_strided(self._dram[start:], shape=(y_size, x_size * elem),
                                               strides=(x_stride * elem, 1), writeable=True)

    def _load(self, i: int) -> None:
        (mem, sram_base, dram_base, pad_min, y_size, x_size, x_stride, y_pad_0, y_pad_1, x_pad_0,
         x_pad_1) = self._stream.fields[i]
        if x_size == 0:
            return
        if pad_min and not self.config.EXT_PAD_MIN:
            raise self._error(i, self.config.missing_extension("EXT_PAD_MIN",
                                                               "LOAD with pad_min set"))
        if mem == MemType.ACC_8BIT and not self.config.ISA_ACC_8BIT_LOAD:
            raise self._error(i, self.config.missing_extension("ISA_ACC_8BIT_LOAD",
                                                               "LOAD ACC_8BIT"))
        spec = self._load_specs.get(mem)
        if spec is None:
            raise self._error(i, f"LOAD of unknown memory type {mem}")
        target, depth, elem, counted, counter, min_value = spec
        count = x_size * y_size
        # fsim counts before it checks anything else; padding is not counted
        setattr(self.stats, counter, getattr(self.stats, counter) + count * counted)
        x_total = x_pad_0 + x_size + x_pad_1
        y_total = y_pad_0 + y_size + y_pad_1
        if sram_base + x_total * y_total > depth:
            raise self._error(i, f"LOAD {MemType(mem).name} writes SRAM elements "
                                 f"[{sram_base}, {sram_base + x_total * y_total}) beyond the "
                                 f"buffer depth {depth}")
        values = None
        if count:
            data = self._dram_bytes(i, "LOAD", dram_base, elem, y_size, x_size, x_stride)
            data = data.reshape(-1)  # copies strided rows
            if mem == MemType.WGT:  # DRAM lanes [BLOCK_OUT][BLOCK_IN] -> SRAM [BLOCK_IN][BLOCK_OUT]
                values = data.view(np.int8).reshape(count, self._bout, self._bin).transpose(0, 2, 1)
                values = values.reshape(count, -1)
            elif mem in (MemType.INP, MemType.ACC_8BIT):  # int8 lanes (ACC_8BIT sign-extends)
                values = data.view(np.int8).reshape(count, -1)
            elif mem == MemType.ACC:
                values = data.view("<i4").reshape(count, -1)
            else:  # UOP words
                values = data.view("<u4").reshape(count, 1)
        if not (y_pad_0 or y_pad_1 or x_pad_0 or x_pad_1):
            if count:
                target[sram_base:sram_base + count] = values
        else:
            block = target[sram_base:sram_base + x_total * y_total].reshape(y_total, x_total, -1)
            block[...] = min_value if pad_min else 0
            if count:
                block[y_pad_0:y_pad_0 + y_size, x_pad_0:x_pad_0 + x_size] = \
                    values.reshape(y_size, x_size, -1)
        if mem == MemType.UOP:
            self._decode_uops(sram_base, sram_base + x_total * y_total)

    def _decode_uops(self, begin: int, end: int) -> None:
        values = unpack_fields(self.config.layouts["UOP"], self._uop_raw[begin:end, None])
        self._uop_dst[begin:end] = values["dst_idx"]
        self._uop_src[begin:end] = values["src_idx"]
        self._uop_wgt[begin:end] = values["wgt_idx"]

    def _store(self, i: int) -> None:
        (mem, sram_base, dram_base, _pad_min, y_size, x_size, x_stride, y_pad_0, y_pad_1, x_pad_0,
         x_pad_1) = self._stream.fields[i]
        if x_size == 0:
            return
        cfg = self.config
        if mem != MemType.OUT:
            name = MemType(mem).name if mem in _MEM_IDS else str(mem)
            raise self._error(i, f"STORE supports memory type OUT only, got {name}")
        if y_pad_0 or y_pad_1 or x_pad_0 or x_pad_1:
            raise self._error(i, "STORE must not have padding")
        if _pad_min:
            raise self._error(i, "pad_min (bit 58) is a LOAD flag; it must be 0 in a STORE")
        count = x_size * y_size
        self.stats.out_store_nbytes += count * cfg.out_elem_bytes
        if sram_base + count > cfg.acc_depth:
            raise self._error(i, f"STORE reads accumulator elements [{sram_base}, "
                                 f"{sram_base + count}) beyond the buffer depth {cfg.acc_depth}")
        if count == 0:
            return
        rows = self._dram_bytes(i, "STORE", dram_base, cfg.out_elem_bytes, y_size, x_size,
                                x_stride)
        data = self.acc[sram_base:sram_base + count].astype(np.int8).view(np.uint8)  # truncates
        if rows.ndim == 1:
            rows[...] = data.reshape(-1)
            return
        data = data.reshape(y_size, -1)
        if x_stride < x_size:  # overlapping rows: later rows win, as in sequential order
            for y in range(y_size):
                rows[y] = data[y]
        else:
            rows[...] = data

    # ------------------------------------------------------------------ GEMM / ALU
    def _check_uops(self, i: int, bgn: int, end: int) -> None:
        if end < bgn:
            raise self._error(i, f"uop_end {end} is below uop_bgn {bgn}")
        if end > self.config.uop_depth:
            raise self._error(i, f"micro-op range [{bgn}, {end}) exceeds the micro-op buffer "
                                 f"depth {self.config.uop_depth}")

    def _check_index(self, i: int, what: str, base: np.ndarray, f_out: int, f_in: int,
                     n_out: int, n_in: int, depth: int) -> None:
        top = int(base.max()) + (n_out - 1) * f_out + (n_in - 1) * f_in
        if top >= depth:
            raise self._error(i, f"{what} index reaches {top}, beyond the buffer depth {depth}")

    @staticmethod
    def _grid(base: np.ndarray, f_out: int, f_in: int, n_out: int, n_in: int) -> np.ndarray:
        """Indices ``base[u] + y * f_out + x * f_in`` on the ``(n_out, n_in, n_uop)`` grid."""
        return (base[None, None, :] + (np.arange(n_out, dtype=np.int64) * f_out)[:, None, None]
                + (np.arange(n_in, dtype=np.int64) * f_in)[None, :, None])

    @staticmethod
    def _y_chunks(n_out: int, n_in: int, n_uop: int):
        """Split the outer loop so that at most ``_GRID_BUDGET`` executions are materialised."""
        step = max(1, _GRID_BUDGET // max(1, n_in * n_uop))
        for y0 in range(0, n_out, step):
            yield y0, min(step, n_out - y0)

    def _plan(self, i: int, bgn: int, end: int, build) -> list:
        """The cached execution plan of instruction ``i`` (built by ``build()`` on a miss).

        A plan depends only on the instruction's bits (without dependency flags) and on the
        micro-op words it reads, which together form the key.
        """
        key = self._stream.plan_key[i].tobytes() + self._uop_raw[bgn:end].tobytes()
        plan = self._plans.get(key)
        if plan is None:
            plan, elems = build()
            if elems <= _GRID_BUDGET:
                if self._plan_elems + elems > _PLAN_CACHE_ELEMS:
                    self._plans.clear()
                    self._plan_elems = 0
                self._plans[key] = plan
                self._plan_elems += elems + 64
        return plan

    def _check_hazard(self, i: int, mode: str, loops, dst: np.ndarray,
                      src: Optional[tuple]) -> None:
        """Refuse instruction ``i`` if it breaks the configuration's hazard contract
        (:mod:`vta_ext.hazard`); ``src`` is ``(source loops, source micro-op indices)`` for an ALU
        instruction that reads an accumulator source, else None."""
        distance = distance_of(self.config, mode)
        if distance <= 1:
            return
        rows = operand_sequence(loops, dst)
        reads = None if src is None else operand_sequence(*src)
        violation = first_violation(rows, reads, distance)
        if violation is not None:
            raise self._error(i, f"breaks the hazard contract of configuration "
                                 f"{self.config.name!r}: {violation}")

    def _gemm(self, i: int) -> None:
        (bgn, end, n_out, n_in, d_out, d_in, s_out, s_in, w_out, w_in,
         reset) = self._stream.fields[i]
        self._check_uops(i, bgn, end)
        n_uop = end - bgn
        if not reset:
            self.stats.gemm_counter += n_out * n_in * n_uop
        if n_uop == 0 or n_out == 0 or n_in == 0:
            return
        plan = self._plan(i, bgn, end, lambda: self._gemm_plan(i, self._stream.fields[i]))
        if reset:
            for idx in plan:
                self.acc[idx if type(idx) is not tuple else idx[0]] = 0
            return
        batch, b_in, b_out = self._batch, self._bin, self._bout
        acc_u = self.acc.view(np.uint32)
        for acc_idx, unique, nm, nn, parts in plan:
            total = None
            for inp_idx, wgt_idx in parts:
                a = _gather(self._inp, inp_idx)             # (b, M, k, BATCH, BI)
                w = _gather(self._wgt_t, wgt_idx)           # (b, N, k, BI, BO)
                nb, kk = a.shape[0], a.shape[2]
                a = a.transpose(0, 1, 3, 2, 4).reshape(nb, nm * batch, kk * b_in)
                w = w.transpose(0, 2, 3, 1, 4).reshape(nb, kk * b_in, nn * b_out)
                part = np.matmul(a, w)                      # exact: |partial sums| <= 2^24
                if len(parts) == 1:
                    total = part
                elif total is None:
                    total = part.astype(np.float64)
                else:
                    total += part
            vals = total.astype(np.int32 if len(parts) == 1 else np.int64)
            if len(parts) > 1:
                vals = vals.astype(np.int32)                # wrap modulo 2^32
            vals = vals.reshape(-1, nm, batch, nn, b_out)
            if batch > 1:
                vals = vals.transpose(0, 1, 3, 2, 4)
            vals = vals.reshape(-1, batch, b_out).view(np.uint32)
            if type(acc_idx) is tuple:
                acc_u[acc_idx[0]] += vals
            elif unique:
                acc_u[acc_idx] += vals
            else:
                np.add.at(acc_u, acc_idx, vals)

    def _gemm_plan(self, i: int, fields: tuple):
        """Check the indices of a GEMM and arrange them as batched matrix products.

        Returns ``(plan, number of index elements)``. For a reset GEMM the plan is a list of
        accumulator index arrays. Otherwise it is a list of steps ``(acc_idx, unique, M, N,
        parts)``; ``parts`` holds ``(inp_idx (b, M, k), wgt_idx (b, N, k))`` pairs over chunks of
        the reduction axis, whose products add up to the ``(b, M, N)`` accumulators ``acc_idx``.
        """
        (bgn, end, n_out, n_in, d_out, d_in, s_out, s_in, w_out, w_in, reset) = fields
        cfg = self.config
        dst, src, wgt = self._uop_dst[bgn:end], self._uop_src[bgn:end], self._uop_wgt[bgn:end]
        self._check_index(i, "GEMM accumulator", dst, d_out, d_in, n_out, n_in, cfg.acc_depth)
        if reset:
            plan = [_indexer(self._grid(dst + y0 * d_out, d_out, d_in, ny, n_in).reshape(-1))
                    for y0, ny in self._y_chunks(n_out, n_in, end - bgn)]
            return plan, sum(p.size for p in plan if type(p) is not tuple)
        self._check_index(i, "GEMM input", src, s_out, s_in, n_out, n_in, cfg.inp_depth)
        self._check_index(i, "GEMM weight", wgt, w_out, w_in, n_out, n_in, cfg.wgt_depth)
        self._check_hazard(i, "gemm", ((n_out, d_out), (n_in, d_in)), dst, None)
        plan, elems = [], 0
        for y0, ny in self._y_chunks(n_out, n_in, end - bgn):
            steps = self._gemm_steps(dst + y0 * d_out, src + y0 * s_out, wgt + y0 * w_out, ny,
                                     n_in, (d_out, d_in), (s_out, s_in), (w_out, w_in))
            plan += steps
            elems += sum(_size(st[0]) + sum(_size(p[0]) + _size(p[1]) for p in st[4])
                         for st in steps)
        return plan, elems

    def _gemm_steps(self, dst, src, wgt, n_out, n_in, d_f, s_f, w_f) -> list:
        """Classify the three loop axes and build the batched-matmul steps of one grid."""
        sizes = (n_out, n_in, len(dst))

        def invariant(factors, base):
            return (factors[0] == 0, factors[1] == 0, bool(np.all(base == base[0])))

        acc_inv, inp_inv, wgt_inv = invariant(d_f, dst), invariant(s_f, src), invariant(w_f, wgt)
        roles: Dict[str, List[int]] = {"B": [], "M": [], "N": [], "K": []}
        for axis, size in enumerate(sizes):
            if size == 1:
                roles["B"].append(axis)
            elif acc_inv[axis]:
                roles["K"].append(axis)   # reduction: the accumulator index does not move
            elif wgt_inv[axis]:
                roles["M"].append(axis)   # rows: the weight does not move
            elif inp_inv[axis]:
                roles["N"].append(axis)   # columns: the input does not move
            else:
                roles["B"].append(axis)   # batch of independent products
        perm = roles["B"] + roles["M"] + roles["N"] + roles["K"]
        nb, nm, nn, nk = (math.prod(sizes[a] for a in roles[r]) for r in "BMNK")

        def arranged(base, factors):
            grid = self._grid(base, factors[0], factors[1], n_out, n_in)
            return grid.transpose(perm).reshape(nb, nm, nn, nk)

        acc_idx = arranged(dst, d_f)[:, :, :, 0]      # (B, M, N)
        inp_idx = arranged(src, s_f)[:, :, 0, :]      # (B, M, K)
        wgt_idx = arranged(wgt, w_f)[:, 0, :, :]      # (B, N, K)
        batch, b_in, b_out = self._batch, self._bin, self._bout
        per_point = nm * batch * nk * b_in + nk * b_in * nn * b_out + nm * batch * nn * b_out
        step = max(1, _GATHER_BUDGET // per_point)
        k_step = max(1, _EXACT_LANES // b_in)
        steps = []
        for b0 in range(0, nb, step):
            bs = slice(b0, min(nb, b0 + step))
            flat = np.ascontiguousarray(acc_idx[bs]).reshape(-1)
            unique = flat.size <= 1 or int(np.bincount(flat - flat.min()).max()) <= 1
            parts = [(_indexer(inp_idx[bs, :, k0:k0 + k_step]),
                      _indexer(wgt_idx[bs, :, k0:k0 + k_step]))
                     for k0 in range(0, nk, k_step)]
            steps.append((_indexer(flat), unique, nm, nn, parts))
        return steps

    def _alu(self, i: int) -> None:
        bgn, end, n_out, n_in, d_out, d_in, s_out, s_in, op, use_imm, imm = self._stream.fields[i]
        if op not in _ALU_OPS:
            raise self._error(i, f"unknown ALU opcode {op}")
        if op == AluOp.CLIP and not self.config.EXT_CLIP:
            raise self._error(i, self.config.missing_extension("EXT_CLIP", "ALU CLIP"))
        if op == AluOp.MUL and not self.config.ISA_ALU_MUL:
            raise self._error(i, self.config.missing_extension("ISA_ALU_MUL", "ALU MUL"))
        if op == AluOp.CLIP and not use_imm:
            raise self._error(i, "ALU CLIP takes its bounds from the immediate: use_imm must be 1")
        self._check_uops(i, bgn, end)
        n_uop = end - bgn
        self.stats.alu_counter += n_out * n_in * n_uop
        if n_uop == 0 or n_out == 0 or n_in == 0:
            return
        plan = self._plan(i, bgn, end, lambda: self._alu_plan(i, self._stream.fields[i]))
        acc = self.acc
        b_imm = np.int32(imm)
        for kind, first, second in plan:
            if kind == "vec":        # no execution reads what an earlier one wrote
                acc[first] = _alu_apply(op, acc[first], acc[second], imm)
            elif kind == "imm":      # one application per round to distinct destinations
                for dst in first:
                    acc[dst] = _alu_apply(op, acc[dst], b_imm, imm)
            elif kind == "reduce":   # associative reduction from sources never written
                vals = acc[second]
                if op == AluOp.MIN:
                    np.minimum.at(acc, first, vals)
                elif op == AluOp.MAX:
                    np.maximum.at(acc, first, vals)
                elif op == AluOp.ADD:
                    np.add.at(acc.view(np.uint32), first, vals.view(np.uint32))
                else:
                    np.multiply.at(acc.view(np.uint32), first, vals.view(np.uint32))
            else:                    # "runs": hazard-free runs executed one after another
                for dst, src in zip(first, second):
                    acc[dst] = _alu_apply(op, acc[dst], acc[src], imm)

    def _alu_plan(self, i: int, fields: tuple):
        """Check the indices of an ALU instruction and plan a sequentially exact execution.

        Returns ``(plan, number of index elements)``; the plan is a list of
        ``(kind, first, second)`` entries (see :meth:`_alu`).
        """
        bgn, end, n_out, n_in, d_out, d_in, s_out, s_in, op, use_imm, _imm = fields
        depth = self.config.acc_depth
        dst_u, src_u = self._uop_dst[bgn:end], self._uop_src[bgn:end]
        self._check_index(i, "ALU destination", dst_u, d_out, d_in, n_out, n_in, depth)
        self._check_index(i, "ALU source", src_u, s_out, s_in, n_out, n_in, depth)
        self._check_hazard(i, "alu", ((n_out, d_out), (n_in, d_in)), dst_u,
                           None if use_imm else (((n_out, s_out), (n_in, s_in)), src_u))
        plan, elems = [], 0
        for y0, ny in self._y_chunks(n_out, n_in, end - bgn):
            dst = self._grid(dst_u + y0 * d_out, d_out, d_in, ny, n_in).reshape(-1)
            src = self._grid(src_u + y0 * s_out, s_out, s_in, ny, n_in).reshape(-1)
            plan.append(self._alu_imm_plan(dst) if use_imm else self._alu_vec_plan(op, dst, src))
            elems += 2 * dst.size
        return plan, elems

    @staticmethod
    def _alu_imm_plan(dst: np.ndarray) -> tuple:
        """``dst = f(dst, imm)`` only reads its own destination: repeated destinations are
        applied in rounds, round ``r`` holding the ``r``-th occurrence of each destination."""
        order = np.argsort(dst, kind="stable")
        sorted_dst = dst[order]
        first = np.ones(dst.size, bool)
        first[1:] = sorted_dst[1:] != sorted_dst[:-1]
        if first.all():
            return ("imm", [_slice_or_array(dst)], None)
        starts = np.flatnonzero(first)
        rank = np.arange(dst.size) - np.repeat(starts, np.diff(np.append(starts, dst.size)))
        return ("imm", [sorted_dst[rank == r] for r in range(int(rank.max()) + 1)], None)

    def _alu_vec_plan(self, op: int, dst: np.ndarray, src: np.ndarray) -> tuple:
        """``dst = f(dst, src)`` with the results of strictly sequential execution."""
        n = dst.size
        writer = np.full(self.config.acc_depth, n, np.int64)
        writer[dst] = np.arange(n)
        unique = np.bincount(dst).max() <= 1
        if unique and not np.any(writer[src] < np.arange(n)):
            return ("vec", _slice_or_array(dst), _slice_or_array(src))
        if op in (AluOp.MIN, AluOp.MAX, AluOp.ADD, AluOp.MUL) and not (writer[src] < n).any():
            return ("reduce", dst, src)
        # general case: maximal runs in which nothing reads or rewrites an element written earlier
        dst_l, src_l = dst.tolist(), src.tolist()
        runs_d, runs_s, start, seen = [], [], 0, set()
        for e in range(n + 1):
            if e == n or dst_l[e] in seen or src_l[e] in seen:
                runs_d.append(dst[start:e])
                runs_s.append(src[start:e])
                if e == n:
                    break
                start, seen = e, set()
            seen.add(dst_l[e])
        return ("runs", runs_d, runs_s)


def run_binary(config: VTAConfig, dram: np.ndarray, dram_base: int, insn_phys: int,
               insn_count: int) -> SimStats:
    """Run a binary instruction stream on a fresh :class:`FunctionalSimulator`.

    See :meth:`FunctionalSimulator.run` for the parameters.
    """
    return FunctionalSimulator(config).run(dram, dram_base, insn_phys, insn_count)
