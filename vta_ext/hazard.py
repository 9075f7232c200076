"""The hazard contract: how far apart two micro-ops that touch one accumulator row must be.

The Vivado-HLS VTA (the original Pynq design) pipelines a GEMM or ALU instruction's micro-op loop
at one micro-op per issue slot and declares the accumulator dependence false, so a micro-op that
*reads* an accumulator row (GEMM: its destination; ALU: its destination, and its source unless the
operand is an immediate) sees the old value when a micro-op fewer than ``D`` positions before it
wrote that row. Between instructions the pipeline drains: the contract is per instruction. A GEMM
that resets its rows reads nothing.

``D`` is a configuration fact: ``ACC_DEP_DISTANCE_GEMM`` and ``ACC_DEP_DISTANCE_ALU``
(1: no constraint). Measured on the RTL of ``../shared/vta-hw`` (``tests/test_hazard.py``): a
distance of 2 is wrong and 3 is right, for GEMM and for ALU, for the destination and the source.

* :func:`first_violation` finds the first broken pair of an instruction (the simulator refuses the
  program with it, naming the instruction and the row); :func:`program_violations` scans a
  built program statically;
* :func:`cure` rewrites a micro-op kernel that breaks the contract into kernels that keep it and
  compute the same: reordered loops or micro-ops where the writes commute, else split into
  several instructions (the runtime applies it to every kernel it pushes, so no strategy or knob
  point can emit a violation).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .isa import AluInsn, GemmInsn, MemInsn, MemType, Opcode, decode_uops

__all__ = ["Violation", "distance_of", "operand_sequence", "first_violation", "kernel_violation",
           "cure", "program_violations"]


@dataclass(frozen=True)
class Violation:
    """Micro-op ``position`` of an instruction reads accumulator ``row`` (as ``operand``,
    ``"dst"`` or ``"src"``), which micro-op ``writer`` wrote fewer than ``distance`` positions
    before (positions count every micro-op the instruction runs, loops unrolled)."""

    position: int
    writer: int
    row: int
    operand: str
    distance: int

    def __str__(self) -> str:
        return (f"micro-op {self.position} reads accumulator row {self.row} ({self.operand}) "
                f"{self.position - self.writer} micro-op(s) after micro-op {self.writer} wrote it; "
                f"the configuration needs at least {self.distance}")


def distance_of(config, mode: str) -> int:
    """The contract's distance for ``mode`` ("gemm" or "alu") under ``config``."""
    return config.ACC_DEP_DISTANCE_GEMM if mode == "gemm" else config.ACC_DEP_DISTANCE_ALU


def operand_sequence(loops: Sequence[Tuple[int, int]], base: np.ndarray) -> np.ndarray:
    """The index an operand takes at every micro-op position: ``base`` (one entry per micro-op
    of the list) plus each loop's variable times its factor, loops outermost first."""
    index = np.asarray(base, np.int64)
    for extent, factor in reversed([(e, f) for e, f in loops]):
        index = (np.arange(extent, dtype=np.int64)[:, None] * factor + index[None, :]).ravel()
    return index


def first_violation(dst: np.ndarray, src: Optional[np.ndarray], distance: int,
                    reads_dst: bool = True) -> Optional[Violation]:
    """The first read of a row written fewer than ``distance`` positions before, or None.

    ``dst`` and ``src`` are the accumulator rows each micro-op writes and reads (in execution
    order); ``src`` is None when the source is not an accumulator row (GEMM, ALU immediate);
    ``reads_dst`` is False for a GEMM that resets its rows.
    """
    best: Optional[Violation] = None
    n = dst.size
    for lag in range(1, min(distance, n)):
        for operand, reads in (("dst", dst if reads_dst else None), ("src", src)):
            if reads is None:
                continue
            hits = np.flatnonzero(reads[lag:] == dst[:-lag])
            if hits.size:
                pos = int(hits[0]) + lag
                if best is None or pos < best.position:
                    best = Violation(pos, pos - lag, int(dst[pos - lag]), operand, distance)
    return best


def kernel_violation(kernel, distance: int) -> Optional[Violation]:
    """:func:`first_violation` of a :class:`~vta_ext.runtime.UopKernel` run as one instruction."""
    if distance <= 1 or (kernel.mode == "gemm" and kernel.reset):
        return None
    return first_violation(*_rows(kernel), distance)


def _rows(kernel) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """The accumulator rows a kernel's micro-ops write, and those they read as a source (None
    for GEMM and ALU immediates), in execution order. The kernel's loops are outermost first (an
    ALU kernel's single loop is the inner one, which changes nothing here)."""
    dst = operand_sequence([(e, d) for e, d, _, _ in kernel.loops],
                           [u.dst_idx for u in kernel.uops])
    if kernel.mode == "gemm" or kernel.use_imm:
        return dst, None
    return dst, operand_sequence([(e, s) for e, _, s, _ in kernel.loops],
                                 [u.src_idx for u in kernel.uops])


def _like(kernel, loops, uops):
    """A kernel of ``kernel``'s kind with ``loops`` and ``uops`` (tuples dst, src, wgt)."""
    new = type(kernel)(kernel.mode, reset=kernel.reset, alu_opcode=kernel.alu_opcode,
                    use_imm=kernel.use_imm, imm=kernel.imm)
    for loop in loops:
        new.loop_begin(*loop)
    for u in uops:
        new.push(*u)
    for _ in loops:
        new.loop_end()
    return new


def _unrolled(kernel, loops, u_major: bool):
    """The micro-op list of ``kernel`` with ``loops`` (outermost first) unrolled into it; with
    ``u_major`` the list's own micro-ops are outermost, else the loops."""
    uops = [(u.dst_idx, u.src_idx, u.wgt_idx) for u in kernel.uops]
    for extent, d, s, w in reversed(loops):
        steps = range(extent)
        if u_major:
            uops = [(a + i * d, b + i * s, c + i * w) for a, b, c in uops for i in steps]
        else:
            uops = [(a + i * d, b + i * s, c + i * w) for i in steps for a, b, c in uops]
    return uops


def _round_robin(uops):
    """``uops`` reordered so that writes of one row are as far apart as the rows allow: the
    first micro-op of every row, then the second of every row, and so on (stable)."""
    rows: dict = {}
    for u in uops:
        rows.setdefault(u[0], []).append(u)
    groups = list(rows.values())
    out = []
    for k in range(max(map(len, groups))):
        out.extend(g[k] for g in groups if k < len(g))
    return out


def _commutes(kernel) -> bool:
    """Whether the kernel's micro-ops may run in any order: GEMM accumulation, and ALU kernels
    whose sources are never written by the kernel (each row then sees one operation applied
    repeatedly with fixed operands: MIN, MAX, ADD, SHR, MUL and CLIP commute with themselves)."""
    dst, src = _rows(kernel)
    return src is None or not np.isin(src, dst).any()


def _candidates(kernel):
    """Reorderings of a commuting kernel, fewest micro-ops first: (loops, uops)."""
    loops = list(kernel.loops)
    uops = [(u.dst_idx, u.src_idx, u.wgt_idx) for u in kernel.uops]
    if len(loops) == 2:
        yield [loops[1], loops[0]], uops
    yield loops, _round_robin(uops)
    if loops:
        inner = loops[-1:]
        for u_major in (True, False):
            yield loops[:-1], _unrolled(kernel, inner, u_major)
        if len(loops) == 2:
            outer = [loops[0]]
            yield [loops[1]], _unrolled(kernel, outer, True)
            yield [loops[1]], _unrolled(kernel, outer, False)
        yield [], _round_robin(_unrolled(kernel, loops, False))


def _split(kernel, distance: int, order, max_uops: int):
    """``order`` (micro-ops, loops unrolled) cut into loop-free kernels, each as long as the
    contract and ``max_uops`` allow."""
    pieces, current, written = [], [], {}
    reads_src = kernel.mode == "alu" and not kernel.use_imm
    for u in order:
        p = len(current)
        near = [r for r, at in written.items() if p - at < distance]
        if current and (len(current) >= max_uops or u[0] in near or (reads_src and u[1] in near)):
            pieces.append(current)
            current, written, p = [], {}, 0
        current.append(u)
        written[u[0]] = p
    if current:
        pieces.append(current)
    return [_like(kernel, [], piece) for piece in pieces]


def cure(kernel, distance: int, max_uops: int) -> list:
    """Kernels that compute what ``kernel`` computes, run one after the other, each keeping the
    contract (no micro-op within ``distance`` of a write of a row it reads) and each at most
    ``max_uops`` micro-ops long. ``[kernel]`` itself when it keeps the contract.

    The writes of a commuting kernel (:func:`_commutes`) are reordered first: loops swapped,
    micro-ops interleaved by row, a loop unrolled into the micro-op list; the first candidate
    that keeps the contract wins. Otherwise (or if none does) the kernel is cut into several
    instructions: the pipeline drains between instructions.
    """
    if kernel_violation(kernel, distance) is None:
        return [kernel]
    commutes = _commutes(kernel)
    if commutes:
        for loops, uops in _candidates(kernel):
            if len(uops) > max_uops:
                continue
            candidate = _like(kernel, loops, uops)
            if kernel_violation(candidate, distance) is None:
                return [candidate]
    loops = list(kernel.loops)
    order = _unrolled(kernel, loops, False)
    if commutes:
        order = _round_robin(order)
    return _split(kernel, distance, order, max_uops)


def program_violations(program, distances: Optional[Tuple[int, int]] = None
                       ) -> List[Tuple[int, Violation]]:
    """Every GEMM / ALU instruction of ``program`` (a :class:`~vta_ext.runtime.Program`) that
    breaks the contract, as ``(instruction index, first violation)``, read from the encoded
    micro-ops the program loads (a static scan: nothing runs).

    ``distances`` is ``(GEMM, ALU)``; default: the program's configuration's.
    """
    cfg = program.config
    gemm_d, alu_d = distances or (cfg.ACC_DEP_DISTANCE_GEMM, cfg.ACC_DEP_DISTANCE_ALU)
    depth = cfg.uop_depth
    dst_sram = np.zeros(depth, np.int64)
    src_sram = np.zeros(depth, np.int64)
    image, base, size = program.dram, program.dram_base, cfg.UOP_ELEM_BYTES
    found = []
    for i, insn in enumerate(program.insns):
        kind = type(insn)
        if kind is MemInsn:
            if insn.opcode == Opcode.LOAD and insn.memory_type == MemType.UOP and insn.x_size:
                start = insn.dram_base * size - base
                uops = decode_uops(cfg, image[start:start + insn.x_size * size].tobytes())
                at = insn.sram_base
                dst_sram[at:at + len(uops)] = [u.dst_idx for u in uops]
                src_sram[at:at + len(uops)] = [u.src_idx for u in uops]
            continue
        if kind is GemmInsn:
            distance = 1 if insn.reset_reg else gemm_d
        elif kind is AluInsn:
            distance = alu_d
        else:
            continue
        if distance <= 1 or insn.uop_end <= insn.uop_bgn:
            continue
        span = slice(insn.uop_bgn, insn.uop_end)
        dst = operand_sequence(((insn.iter_out, insn.dst_factor_out),
                                (insn.iter_in, insn.dst_factor_in)), dst_sram[span])
        src = None
        if kind is AluInsn and not insn.use_imm:
            src = operand_sequence(((insn.iter_out, insn.src_factor_out),
                                    (insn.iter_in, insn.src_factor_in)), src_sram[span])
        violation = first_violation(dst, src, distance)
        if violation is not None:
            found.append((i, violation))
    return found
