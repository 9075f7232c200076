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
"""
from __future__ import annotations

import numbers
import time
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from ..config import VTAConfig
from ..isa import AluOp, Stage
from ..layout import IMM_MAX, IMM_MIN, MAX_LOOP_EXTENT
from ..runtime import CommandQueue, UopKernel
from .errors import AluTemplateError, AluTemplateRefusal, KnobError

__all__ = ["MAX_KERNEL_UOPS", "choose_row_tiles", "alu", "alu_range", "copy_rows", "StorePipeline",
           "CompiledAluOp", "check_positive", "check_non_negative", "require_multiple", "check_slots"]

#: largest micro-op kernel a tile of an ALU template may use (channel blocks x window elements)
MAX_KERNEL_UOPS = 1024


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
    loops = [lp for lp in loops if lp[0] > 1] or []
    for extent, d_f, s_f in loops:
        k.loop_begin(extent, d_f, s_f)
    for d, s in uops:
        k.push(d, s)
    for _ in loops:
        k.loop_end()
    q.push_alu(k)


def alu_range(q: CommandQueue, op: int, base: int, size: int, imm: int) -> None:
    """``acc[base:base+size] = op(acc, imm)``: one instruction per :data:`MAX_LOOP_EXTENT` rows."""
    for start in range(base, base + size, MAX_LOOP_EXTENT):
        alu(q, op, [(start, start)], [(min(MAX_LOOP_EXTENT, base + size - start), 1, 1)], imm)


def copy_rows(q: CommandQueue, uops, loops) -> None:
    """``dst = src`` over the affine range: ``dst *= 0`` then ``dst += src`` (VTA has no MOV)."""
    alu(q, AluOp.MUL, [(d, d) for d, _ in uops], [(e, d_f, d_f) for e, d_f, _ in loops], 0)
    alu(q, AluOp.ADD, uops, loops)


class StorePipeline:
    """Compute/store dependency tokens for tiles whose outputs rotate through ``slots`` regions.

    Usage per tile: ``slot = p.begin_tile()`` (before the tile's first compute instruction),
    compute, ``p.end_compute()``, ``p.begin_store()``, the STOREs, ``p.end_store()``; after the
    last tile ``p.finish()``.
    """

    def __init__(self, q: CommandQueue, slots: int) -> None:
        if slots < 1:
            raise AluTemplateError(f"at least one output slot is needed, got slots={slots}")
        self.q, self.slots, self.tiles = q, slots, 0

    def begin_tile(self) -> int:
        if self.tiles >= self.slots:  # WAR: the store of this slot's previous tile has finished
            self.q.dep_pop(Stage.STORE, Stage.COMPUTE)
        return self.tiles % self.slots

    def end_compute(self) -> None:
        self.q.dep_push(Stage.COMPUTE, Stage.STORE)

    def begin_store(self) -> None:
        self.q.dep_pop(Stage.COMPUTE, Stage.STORE)

    def end_store(self) -> None:
        self.q.dep_push(Stage.STORE, Stage.COMPUTE)
        self.tiles += 1

    def finish(self) -> None:
        for _ in range(min(self.tiles, self.slots)):
            self.q.dep_pop(Stage.STORE, Stage.COMPUTE)


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
