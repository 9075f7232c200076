"""Shared helpers of the hand-scheduled ALU templates (pooling, residual add, depthwise conv2d).

These templates are not TE / s_tir schedules: they emit their VTA programs directly through the
runtime (:class:`vta_ext.runtime.CommandQueue`). This module holds what they have in common:

* workload checks that raise :class:`~vta_ext.templates.errors.AluTemplateRefusal` (the operator
  stays on the CPU) and the row-tile choice (:func:`choose_row_tiles`; explicit tile knobs that do
  not fit raise :class:`~vta_ext.templates.errors.KnobError`);
* :func:`alu` -- one ALU instruction over an affine (up to two loops) range of accumulator rows,
  :func:`alu_range` and :func:`copy_rows`;
* :class:`StorePipeline` -- the dependency tokens between the compute and store modules;
* :class:`CompiledAluOp` -- the compiled operator.

The epilogue stages are emitted by :func:`vta_ext.templates.epilogue.emit_epilogue`.

Dependency model. Every data load of these templates is a LOAD ACC / ACC_8BIT, executed by the
*compute* module in program order with the ALU instructions, so loads, ALU work and micro-op loads
need no tokens among themselves. Only the STORE module runs concurrently: each tile's output rows
live in one of ``slots`` accumulator regions (double buffering with two); the compute module pushes
a token to the store module when a tile is ready (RAW), and before it writes a slot again it pops
the token the store of that slot's previous tile pushed back (WAR). The remaining store tokens are
popped at the end, so every token is consumed inside the program and a program can run any number
of times on the same simulator.

Input paths (:data:`INPUT_PATHS`). ``"acc8"`` is the model above. ``"gemm"``
(:class:`IdentityInput`) brings the int8 input rows in by LOAD INP on the *load* module instead,
into ``slots`` regions of the input buffer, and writes them into the accumulator by GEMM
micro-ops through a 16x16 identity weight tile (``BLOCK_IN == BLOCK_OUT``; one constant, the DRAM
buffer ``identity``, loaded once at the start of the program): a reset GEMM zeroes the
accumulator rows, then each GEMM micro-op adds one int8 row as int32. The load and compute
modules then need tokens: the compute module pops a load->compute token before a tile's first
GEMM (RAW) and pushes a compute->load token after its last one; the load module pops that token
before it writes the same input region again (WAR), and the remaining ones at the end.
"""
from __future__ import annotations

import numbers
import time
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from ..config import VTAConfig
from ..isa import AluOp, MemType, Stage
from ..layout import IMM_MAX, IMM_MIN, MAX_LOOP_EXTENT
from ..runtime import CommandQueue, UopKernel
from .errors import AluTemplateError, AluTemplateRefusal, KnobError

__all__ = ["MAX_KERNEL_UOPS", "INPUT_PATHS", "check_input_path", "IdentityInput",
           "choose_row_tiles", "alu", "alu_range", "copy_rows", "TokenRing", "StorePipeline", "LoadPipeline",
           "CompiledAluOp", "check_positive", "check_non_negative", "require_multiple", "check_slots"]

#: largest micro-op kernel a tile of an ALU template may use (channel blocks x window elements)
MAX_KERNEL_UOPS = 1024

#: how an ALU template brings its int8 inputs into the accumulator: ``"acc8"`` (LOAD ACC_8BIT on
#: the compute module, the stock programs), ``"gemm"`` (LOAD INP on the load module, then GEMM
#: micro-ops through an identity weight tile: :class:`IdentityInput`) or, for a two-operand
#: template (the add), ``"split"`` (the first operand by LOAD ACC_8BIT, which overwrites its
#: rows, the second by LOAD INP and an identity GEMM adding it: no reset, and the two modules
#: share the loads)
INPUT_PATHS = ("acc8", "gemm", "split")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_non_negative(wl, names: Sequence[str], what: str, max_value: Optional[int] = None,
                       field: str = "") -> None:
    """Refuse a workload whose fields ``names`` are not integers in ``0..max_value``."""
    for name in names:
        value = getattr(wl, name)
        if not _is_int(value) or value < 0:
            raise AluTemplateRefusal(f"{what}: {name}={value!r} must be a non-negative integer")
        if max_value is not None and value > max_value:
            raise AluTemplateRefusal(f"{what}: {name}={value} exceeds {field} (max {max_value})")


def check_positive(wl, names: Sequence[str], what: str) -> None:
    """Refuse a workload whose fields ``names`` are not positive integers."""
    for name in names:
        value = getattr(wl, name)
        if not _is_int(value) or value < 1:
            raise AluTemplateRefusal(f"{what}: {name}={value!r} must be a positive integer")


def require_multiple(value: int, block: int, name: str, key: str, what: str) -> None:
    """Refuse a workload whose ``name`` is not a multiple of the block ``key``."""
    if value % block:
        raise AluTemplateRefusal(f"{what}: {name}={value} is not a multiple of {key}={block}; the "
                                 f"caller pads it to a multiple of the block")


def check_slots(slots, what: str) -> int:
    """The ``slots`` knob (output regions: 1, or 2 for double buffering against the STORE)."""
    if slots not in (1, 2) or isinstance(slots, bool):
        raise KnobError(f"{what}: knob slots={slots!r}; valid values: 1, 2")
    return int(slots)


def choose_row_tiles(what: str, cfg: VTAConfig, usage: Callable[[int, int, int], int],
                     out_rows: int, channel_blocks: int, slots: int, tile_h: Optional[int],
                     tile_c: Optional[int], max_tile_c: int, row_text: str) -> Tuple[int, int, int]:
    """Pick ``(tile_h, tile_c, slots)``: output rows and channel blocks per tile, output slots.

    ``usage(tile_h, tile_c, slots)`` is the accumulator entries a tile needs. Explicit ``tile_h`` /
    ``tile_c`` knobs are checked against the accumulator (:class:`KnobError` if they do not fit);
    otherwise the tile takes as many output rows as fit (all of them first), then as many channel
    blocks (at most ``max_tile_c``), and falls back to one output slot when two do not fit.
    ``row_text`` describes one output row's footprint in the refusal raised when not even that fits
    (rows are never split).
    """
    acc = cfg.acc_depth
    if usage(1, 1, 1) > acc:
        raise AluTemplateRefusal(
            f"{what}: one output row of one channel block needs {usage(1, 1, 1)} accumulator "
            f"(acc) entries ({row_text}), more than the accumulator buffer's {acc} on "
            f"{cfg.name!r}; the template does not split rows")
    if tile_h is not None or tile_c is not None:
        for name, value in (("tile_h", tile_h), ("tile_c", tile_c)):
            if value is not None and (not _is_int(value) or value < 1):
                raise KnobError(f"{what}: knob {name}={value!r} must be None (as large as fits) or "
                                "an integer >= 1")
        th, tc = min(tile_h or out_rows, out_rows), min(tile_c or 1, channel_blocks)
        if usage(th, tc, slots) > acc:
            raise KnobError(f"{what}: knobs tile_h={th}, tile_c={tc}, slots={slots} need "
                            f"{usage(th, tc, slots)} accumulator (acc) entries, more than the "
                            f"accumulator buffer's {acc}; reduce tile_h / tile_c")
        return th, tc, slots
    if usage(1, 1, slots) > acc:
        slots = 1
    th = max(t for t in range(1, out_rows + 1) if usage(t, 1, slots) <= acc)
    tc = 1
    if th == out_rows:
        tc = max((c for c in range(1, min(channel_blocks, max_tile_c) + 1)
                  if usage(out_rows, c, slots) <= acc), default=1)
    return th, tc, slots


def alu(q: CommandQueue, op: int, uops, loops=(), imm: Optional[int] = None) -> None:
    """Push one ALU instruction.

    ``uops``: list of ``(dst, src)`` accumulator rows (for an immediate op, ``src`` is only range
    checked; pass ``dst``). ``loops``: up to two ``(extent, dst_factor, src_factor)``, outer first.
    ``imm``: the immediate operand (int16), or None for vector-vector.
    """
    if imm is not None and not IMM_MIN <= int(imm) <= IMM_MAX:
        raise AluTemplateError(f"ALU immediate {imm} does not fit the 16-bit immediate "
                               f"({IMM_MIN}..{IMM_MAX})")
    k = UopKernel("alu", alu_opcode=op, use_imm=imm is not None, imm=0 if imm is None else int(imm))
    q.push_alu(_filled(k, uops, loops))


def _filled(k: UopKernel, uops, loops) -> UopKernel:
    """``k`` with the ``(dst, src)`` micro-ops inside the ``(extent, dst_factor, src_factor)``
    loops, outer first (loops of extent 1 left out; a GEMM's weight index and factors 0)."""
    loops = [lp for lp in loops if lp[0] > 1]
    for extent, d_f, s_f in loops:
        k.loop_begin(extent, d_f, s_f)
    for d, s in uops:
        k.push(d, s)
    for _ in loops:
        k.loop_end()
    return k


def alu_range(q: CommandQueue, op: int, base: int, size: int, imm: int) -> None:
    """``acc[base:base+size] = op(acc, imm)``: one instruction per :data:`MAX_LOOP_EXTENT` rows."""
    for start in range(base, base + size, MAX_LOOP_EXTENT):
        alu(q, op, [(start, start)], [(min(MAX_LOOP_EXTENT, base + size - start), 1, 1)], imm)


def copy_rows(q: CommandQueue, uops, loops) -> None:
    """``dst = src`` over the affine range: ``dst *= 0`` then ``dst += src`` (VTA has no MOV)."""
    alu(q, AluOp.MUL, [(d, d) for d, _ in uops], [(e, d_f, d_f) for e, d_f, _ in loops], 0)
    alu(q, AluOp.ADD, uops, loops)


class TokenRing:
    """Dependency tokens for tiles that rotate through ``slots`` SRAM regions between a producing
    and a consuming module: the producer's work on a region waits until the consumer released
    that region's previous tile (WAR), the consumer's until the producer handed the tile over
    (RAW); :meth:`finish` consumes the release tokens still queued, so that every token stays
    inside the program.

    Parameters
    ----------
    q : CommandQueue
        The program being written.
    slots : int
        Regions (2 lets the producer work on one tile while the consumer works on the previous).
    producer, consumer : Stage
        The two modules (e.g. LOAD and COMPUTE, or COMPUTE and STORE).
    """

    def __init__(self, q: CommandQueue, slots: int, producer: Stage, consumer: Stage) -> None:
        if slots < 1:
            raise AluTemplateError(f"at least one region is needed, got slots={slots}")
        self.q, self.slots, self.tiles = q, slots, 0
        self.producer, self.consumer = producer, consumer

    def acquire(self) -> int:
        """Before the producer's first instruction of a tile: its region (0 .. slots-1), once
        the consumer has released that region's previous tile."""
        if self.tiles >= self.slots:
            self.q.dep_pop(self.consumer, self.producer)
        return self.tiles % self.slots

    def hand_over(self) -> None:
        """After the producer's last instruction of a tile."""
        self.q.dep_push(self.producer, self.consumer)

    def take(self) -> None:
        """Before the consumer's first instruction of a tile."""
        self.q.dep_pop(self.producer, self.consumer)

    def release(self) -> None:
        """After the consumer's last instruction of a tile: its region may be produced again."""
        self.q.dep_push(self.consumer, self.producer)
        self.tiles += 1

    def finish(self) -> None:
        """After the last tile: consume the release tokens still queued."""
        for _ in range(min(self.tiles, self.slots)):
            self.q.dep_pop(self.consumer, self.producer)


class StorePipeline(TokenRing):
    """Compute/store dependency tokens for tiles whose outputs rotate through ``slots`` regions.

    Usage per tile: ``slot = p.begin_tile()`` (before the tile's first compute instruction),
    compute, ``p.end_compute()``, ``p.begin_store()``, the STOREs, ``p.end_store()``; after the
    last tile ``p.finish()``.
    """

    def __init__(self, q: CommandQueue, slots: int) -> None:
        if slots < 1:
            raise AluTemplateError(f"at least one output slot is needed, got slots={slots}")
        super().__init__(q, slots, Stage.COMPUTE, Stage.STORE)

    begin_tile = TokenRing.acquire
    end_compute = TokenRing.hand_over
    begin_store = TokenRing.take
    end_store = TokenRing.release


class LoadPipeline(TokenRing):
    """Load/compute dependency tokens for tiles whose inputs rotate through ``slots`` regions of
    the input (and weight) buffers.

    Usage per tile: ``slot = p.begin_load()``, the LOADs, ``p.end_load()``; on the compute side
    ``p.begin_compute()``, the GEMMs, ``p.end_compute()``; after the last tile ``p.finish()``.
    """

    def __init__(self, q: CommandQueue, slots: int) -> None:
        super().__init__(q, slots, Stage.LOAD, Stage.COMPUTE)

    begin_load = TokenRing.acquire
    end_load = TokenRing.hand_over
    begin_compute = TokenRing.take
    end_compute = TokenRing.release


def check_input_path(cfg: VTAConfig, input_path: str, what: str) -> bool:
    """Whether ``input_path`` (one of :data:`INPUT_PATHS`) uses the identity GEMM (``"gemm"``,
    ``"split"``).

    Raises
    ------
    AluTemplateError
        For a name not in :data:`INPUT_PATHS`.
    AluTemplateRefusal
        For ``"gemm"`` where an input row is not an accumulator row (``BLOCK_IN != BLOCK_OUT``).
    """
    if input_path not in INPUT_PATHS:
        raise AluTemplateError(f"{what}: input_path {input_path!r}; one of "
                               f"{', '.join(INPUT_PATHS)}")
    if input_path == "acc8":
        return False
    if cfg.BLOCK_IN != cfg.BLOCK_OUT:
        raise AluTemplateRefusal(f"{what}: the identity-GEMM input path needs BLOCK_IN == "
                                 f"BLOCK_OUT (an input row is an accumulator row); {cfg.name!r} "
                                 f"has {cfg.BLOCK_IN} and {cfg.BLOCK_OUT}")
    return True


class IdentityInput(LoadPipeline):
    """The identity-GEMM input path (module docstring): LOAD INP into ``slots`` input-buffer
    regions of ``region`` rows each, and GEMMs through the identity weight tile.

    Usage per tile: ``base = p.begin_load()``, the :meth:`load` calls (input-buffer rows from
    ``base``), ``p.end_load()``; then, on the compute side, ``p.begin_compute()``, the
    :meth:`reset` / :meth:`gemm` calls, ``p.end_compute()``; after the last tile ``p.finish()``
    and, on the built program, :meth:`write_identity`.

    Parameters
    ----------
    q : CommandQueue
        The program being written (the identity tile's load is appended here).
    slots : int
        Input regions (2 lets the loads of one tile overlap the previous tile's compute).
    region : int
        Input-buffer rows of one region.
    what : str
        The operator, for errors.
    """

    #: the DRAM buffer of the identity weight tile
    BUFFER = "identity"

    def __init__(self, q: CommandQueue, slots: int, region: int, what: str) -> None:
        cfg = q.config
        if slots < 1 or region < 1 or slots * region > cfg.inp_depth:
            raise AluTemplateError(f"{what}: {slots} input region(s) of {region} rows do not fit "
                                   f"the input buffer's {cfg.inp_depth}")
        super().__init__(q, slots)
        self.region = region
        wgt = q.alloc(cfg.elem_bytes(MemType.WGT), self.BUFFER)
        q.load_2d(wgt, 0, 1, 1, 1, 0, 0, 0, 0, 0, MemType.WGT)

    def begin_load(self) -> int:
        """Before a tile's loads: wait until its region is free (WAR); its first row."""
        return LoadPipeline.begin_load(self) * self.region

    def load(self, src, offset: int, x_size: int, y_size: int, x_stride: int, x_pad: int,
             y_pad_before: int, y_pad_after: int, dst: int) -> None:
        """LOAD INP of ``y_size`` rows of ``x_size`` elements (zero padding: ``x_pad`` each side,
        ``y_pad_before`` / ``y_pad_after`` rows) into input-buffer row ``dst``."""
        self.q.load_2d(src, offset, x_size, y_size, x_stride, x_pad, y_pad_before, x_pad,
                       y_pad_after, dst, MemType.INP)

    def reset(self, base: int, size: int) -> None:
        """Zero the accumulator rows ``base .. base+size-1`` (reset GEMMs)."""
        for start in range(base, base + size, MAX_LOOP_EXTENT):
            self.gemm([(start, 0)], [(min(MAX_LOOP_EXTENT, base + size - start), 1, 0)],
                      reset=True)

    def gemm(self, uops, loops=(), reset: bool = False) -> None:
        """One GEMM: ``acc[dst] += inp[src]`` (the identity tile) for each ``(dst, src)`` micro-op
        over up to two ``(extent, dst_factor, src_factor)`` loops, outer first."""
        self.q.push_gemm(_filled(UopKernel("gemm", reset=reset), uops, loops))

    @classmethod
    def write_identity(cls, program) -> None:
        """Write the identity weight tile into ``program``'s DRAM image."""
        cfg = program.config
        program.write(cls.BUFFER, np.eye(cfg.BLOCK_OUT, cfg.BLOCK_IN, dtype=np.int8))


class CompiledAluOp:
    """An ALU-template operator compiled into one :class:`~vta_ext.runtime.Program` (built once).

    ``inputs``: ordered ``(buffer name, packed shape, dtype)`` of the operands :meth:`run` takes;
    ``out_shape``: the packed int8 output shape. :meth:`run` only writes the inputs into the DRAM
    image, executes the program and reads the output back.
    """

    def __init__(self, config: VTAConfig, workload, epilogue, program, inputs, out_shape,
                 timings=None, info=None) -> None:
        self.config = config
        self.workload = workload
        self.epilogue = epilogue
        self.program = program
        self.inputs = list(inputs)
        self.out_shape = tuple(out_shape)
        self.timings = dict(timings or {})
        self.info = dict(info or {})

    @property
    def shapes(self):
        d = {name: shape for name, shape, _ in self.inputs}
        d["out"] = self.out_shape
        return d

    def run(self, *packed_inputs, simulator=None):
        """Execute on the simulator; returns ``(packed_out_int8, SimStats)``."""
        if len(packed_inputs) != len(self.inputs):
            names = ", ".join(n for n, _, _ in self.inputs)
            raise AluTemplateError(f"expected {len(self.inputs)} packed input(s) ({names}), got "
                                   f"{len(packed_inputs)}")
        for (name, shape, dtype), arr in zip(self.inputs, packed_inputs):
            arr = np.asarray(arr)
            if arr.shape != tuple(shape) and name in ("bias", "mult") and arr.ndim == len(shape) \
                    and arr.size == int(np.prod(shape)):
                arr = arr.reshape(shape)
            if arr.shape != tuple(shape):
                raise AluTemplateError(f"{name}: expected shape {tuple(shape)}, got {arr.shape}")
            if arr.dtype != np.dtype(dtype):
                raise AluTemplateError(f"{name}: expected dtype {np.dtype(dtype)}, got {arr.dtype}")
            self.program.write(name, np.ascontiguousarray(arr))
        t = time.perf_counter()
        stats = self.program.run(simulator)
        self.timings["last_run"] = time.perf_counter() - t
        return self.program.read("out", np.int8, self.out_shape), stats

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.workload}, epilogue={self.epilogue}, "
                f"{self.program.insn_count} insns)")
