"""The original VTA unit tests (``vta/tests/python/unittest/test_vta_insn.py``, facts §7.1),
re-created with the program-builder runtime and the functional simulator, checked against numpy.

Tensors use the original shapes and DRAM layouts: accumulator tensors are
``(rows, cols, BATCH, BLOCK_OUT)`` int32, inputs ``(o, n, BATCH, BLOCK_IN)`` int8, weights
``(m, n, BLOCK_OUT, BLOCK_IN)`` int8; one ``(row, col)`` position is one SRAM element. As in the
original, every load of accumulators is followed by an ALU ``>> 0`` before the store (the "no-op
that won't be optimized away"), and the random seed is ``0xDEADB``.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import pytest

from vta_ext.config import VTAConfig, load_config
from vta_ext.isa import AluOp, MemType, Opcode, Stage, encode_stream
from vta_ext.runtime import CommandQueue, Program, UopKernel
from vta_ext.sim import FunctionalSimulator, SimStats

SEED = 0xDEADB
CONFIGS = [load_config("default"), load_config("2x16x16")]


def acc_shape(cfg: VTAConfig, rows: int, cols: int) -> Tuple[int, ...]:
    return (rows, cols, cfg.BATCH, cfg.BLOCK_OUT)


def alu_kernel(op: int, rows: int, cols: int, dst: int = 0, src: Optional[int] = None,
               imm: Optional[int] = None) -> UopKernel:
    """An ALU kernel over a ``rows x cols`` block of accumulators (outer loop rows, inner cols).

    With ``imm`` the operand is the immediate (and ``src`` equals ``dst``, as the compiler emits);
    otherwise the operand is the block starting at accumulator ``src``.
    """
    kernel = UopKernel("alu", alu_opcode=op, use_imm=imm is not None, imm=0 if imm is None else imm)
    kernel.loop_begin(rows, cols, cols)
    kernel.loop_begin(cols, 1, 1)
    kernel.push(dst, dst if src is None else src)
    kernel.loop_end()
    kernel.loop_end()
    return kernel


def elementwise_program(cfg: VTAConfig, inputs: Sequence[np.ndarray], pads=((0, 0), (0, 0)),
                        kernels: Callable[[int, int], List[UopKernel]] = lambda r, c: []
                        ) -> Tuple[Program, Tuple[int, int]]:
    """LOAD ACC every input (the first one padded), run the ALU kernels, STORE the first block.

    Input ``k`` occupies the accumulators from ``k * rows * cols``; ``pads`` is
    ``((y_before, y_after), (x_before, x_after))`` applied by the DMA to the first input.
    Returns the program and the (rows, cols) of the stored block.
    """
    rows, cols = inputs[0].shape[:2]
    (y0, y1), (x0, x1) = pads
    out_rows, out_cols = rows + y0 + y1, cols + x0 + x1
    q = CommandQueue(cfg)
    for k, array in enumerate(inputs):
        buf = q.alloc(array.nbytes, f"in{k}")
        if k == 0:
            q.load_2d(buf, 0, cols, rows, cols, x0, y0, x1, y1, 0, MemType.ACC)
        else:
            q.load_2d(buf, 0, cols, rows, cols, 0, 0, 0, 0, k * out_rows * out_cols, MemType.ACC)
    for kernel in [alu_kernel(AluOp.SHR, out_rows, out_cols, imm=0)] + kernels(out_rows, out_cols):
        q.push_alu(kernel)
    out = q.alloc(out_rows * out_cols * cfg.BATCH * cfg.BLOCK_OUT, "out")
    q.dep_push(Stage.COMPUTE, Stage.STORE)
    q.dep_pop(Stage.COMPUTE, Stage.STORE)
    q.store_2d(0, MemType.OUT, out, 0, out_cols, out_rows, out_cols)
    prog = q.synchronize()
    for k, array in enumerate(inputs):
        prog.write(f"in{k}", array.astype(np.int32))
    return prog, (out_rows, out_cols)


def run_program(cfg: VTAConfig, prog: Program,
                shape: Tuple[int, int]) -> Tuple[np.ndarray, SimStats]:
    stats = prog.run(FunctionalSimulator(cfg))
    return prog.read("out", np.int8, acc_shape(cfg, *shape)), stats


def as_int8(values: np.ndarray) -> np.ndarray:
    """Wrapping cast to int8, the STORE rule (independent of numpy's cast: explicit modulo)."""
    return ((np.asarray(values, np.int64) + 128) % 256 - 128).astype(np.int8)


# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_save_load_out(cfg: VTAConfig) -> None:
    rng = np.random.default_rng(SEED)
    x = rng.integers(1, 10, acc_shape(cfg, 6, 6)).astype(np.int32)
    prog, shape = elementwise_program(cfg, [x])
    y, stats = run_program(cfg, prog, shape)
    np.testing.assert_array_equal(y, x.astype(np.int8))
    assert stats.acc_load_nbytes == 36 * cfg.acc_elem_bytes
    assert stats.out_store_nbytes == 36 * cfg.BATCH * cfg.BLOCK_OUT
    assert stats.alu_counter == 36 and stats.gemm_counter == 0


PAD_CASES = {  # name: (pad_before, pad_after) over the (rows, cols) axes, as in the original test
    "Y0": ([2, 0, 0, 0], [0, 0, 0, 0]),
    "Y1": ([0, 2, 0, 0], [0, 0, 0, 0]),
    "X0": ([0, 0, 0, 0], [2, 0, 0, 0]),
    "X1": ([0, 0, 0, 0], [0, 2, 0, 0]),
    "all": ([1, 1, 0, 0], [1, 1, 0, 0]),
}


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("case", list(PAD_CASES))
def test_padded_load(cfg: VTAConfig, case: str) -> None:
    before, after = PAD_CASES[case]
    rng = np.random.default_rng(SEED)
    x = rng.integers(0, 10, acc_shape(cfg, 3, 5)).astype(np.int32)
    pads = ((before[0], after[0]), (before[1], after[1]))
    prog, shape = elementwise_program(cfg, [x], pads=pads)
    y, stats = run_program(cfg, prog, shape)
    expected = np.zeros(acc_shape(cfg, *shape), np.int8)
    expected[before[0]:before[0] + 3, before[1]:before[1] + 5] = x
    np.testing.assert_array_equal(y, expected)
    assert stats.acc_load_nbytes == 15 * cfg.acc_elem_bytes  # padding is not counted


# ---------------------------------------------------------------------------------------------
def gemm_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``min(max((x . w) >> 8, 0), 127)`` as int8; x (o, n, B, BI), w (m, n, BO, BI)."""
    acc = np.einsum("onbk,mnck->ombc", x.astype(np.int64), w.astype(np.int64))
    return np.clip(acc >> 8, 0, 127).astype(np.int8)


def gemm_kernels(rows: int, m: int, n: int, acc_base: int, inp_base: int) -> List[UopKernel]:
    """Reset + GEMM + requantisation (>> 8, max 0, min 127) of ``rows`` output rows."""
    reset = UopKernel("gemm", reset=True)
    reset.loop_begin(rows, m, 0, 0)
    reset.loop_begin(m, 1, 0, 0)
    reset.push(acc_base, 0, 0)
    reset.loop_end()
    reset.loop_end()
    gemm = UopKernel("gemm")
    gemm.loop_begin(rows, m, n, 0)     # output rows: accumulator and input advance
    gemm.loop_begin(m, 1, 0, n)        # output column blocks: accumulator and weight advance
    for k in range(n):                 # reduction over the input blocks
        gemm.push(acc_base, inp_base + k, k)
    gemm.loop_end()
    gemm.loop_end()
    requant = [alu_kernel(AluOp.SHR, rows, m, dst=acc_base, imm=8),
               alu_kernel(AluOp.MAX, rows, m, dst=acc_base, imm=0),
               alu_kernel(AluOp.MIN, rows, m, dst=acc_base, imm=127)]
    return [reset, gemm] + requant


def gemm_program(cfg: VTAConfig, o: int, n: int, m: int, virtual_threads: int) -> Program:
    """GEMM of ``o`` rows split into tiles of one row alternating between SRAM buffer sets.

    With ``virtual_threads == 1`` everything runs as one tile in one buffer set (the "default"
    schedule). With 2, tile ``t`` uses input and accumulator set ``t % 2``; the load of tile
    ``t`` waits for the compute of tile ``t - 2`` to release its input buffer (compute -> load
    token), and the compute of tile ``t`` waits for the store of tile ``t - 2`` to release its
    accumulators (store -> compute token), so that loads and stores overlap with compute.
    """
    q = CommandQueue(cfg)
    x_buf = q.alloc(o * n * cfg.inp_elem_bytes, "x")
    w_buf = q.alloc(m * n * cfg.wgt_elem_bytes, "w")
    y_buf = q.alloc(o * m * cfg.out_elem_bytes, "y")
    q.load_2d(w_buf, 0, m * n, 1, m * n, 0, 0, 0, 0, 0, MemType.WGT)
    tiles = o if virtual_threads > 1 else 1
    rows = o // tiles
    for t in range(tiles):
        slot = t % virtual_threads
        inp_base, acc_base = slot * rows * n, slot * rows * m
        if t >= virtual_threads:
            q.dep_pop(Stage.COMPUTE, Stage.LOAD)
        q.load_2d(x_buf, t * rows * n, rows * n, 1, rows * n, 0, 0, 0, 0, inp_base, MemType.INP)
        q.dep_push(Stage.LOAD, Stage.COMPUTE)
        q.dep_pop(Stage.LOAD, Stage.COMPUTE)
        if t >= virtual_threads:
            q.dep_pop(Stage.STORE, Stage.COMPUTE)
        kernels = gemm_kernels(rows, m, n, acc_base, inp_base)
        q.push_gemm(kernels[0])
        q.push_gemm(kernels[1])
        if t + virtual_threads < tiles:
            q.dep_push(Stage.COMPUTE, Stage.LOAD)
        for alu in kernels[2:]:
            q.push_alu(alu)
        q.dep_push(Stage.COMPUTE, Stage.STORE)
        q.dep_pop(Stage.COMPUTE, Stage.STORE)
        q.store_2d(acc_base, MemType.OUT, y_buf, t * rows * m, rows * m, 1, rows * m)
        if t + virtual_threads < tiles:
            q.dep_push(Stage.STORE, Stage.COMPUTE)
    return q.synchronize()


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("schedule,threads", [("default", 1), ("smt", 2)])
def test_gemm(cfg: VTAConfig, schedule: str, threads: int) -> None:
    o, n, m = 4, 1, 4
    rng = np.random.default_rng(SEED)
    x = rng.integers(-128, 128, (o, n, cfg.BATCH, cfg.BLOCK_IN)).astype(np.int8)
    w = rng.integers(-128, 128, (m, n, cfg.BLOCK_OUT, cfg.BLOCK_IN)).astype(np.int8)
    prog = gemm_program(cfg, o, n, m, threads)
    prog.write("x", x)
    prog.write("w", w)
    stats = prog.run(FunctionalSimulator(cfg))
    y = prog.read("y", np.int8, (o, m, cfg.BATCH, cfg.BLOCK_OUT))
    np.testing.assert_array_equal(y, gemm_reference(x, w))
    assert stats.gemm_counter == o * m * n
    assert stats.alu_counter == 3 * o * m
    assert stats.inp_load_nbytes == o * n * cfg.inp_elem_bytes
    assert stats.wgt_load_nbytes == m * n * cfg.wgt_elem_bytes


def test_gemm_smt_depends_on_its_tokens() -> None:
    """Without the buffer-release tokens the load module overwrites a busy input buffer.

    This shows that the two-thread schedule is really double buffered: the same program minus its
    compute -> load tokens gives a wrong result in the simulator (the load module runs ahead).
    """
    cfg = CONFIGS[0]
    o, n, m = 4, 1, 4
    rng = np.random.default_rng(SEED)
    x = rng.integers(-128, 128, (o, n, cfg.BATCH, cfg.BLOCK_IN)).astype(np.int8)
    w = rng.integers(-128, 128, (m, n, cfg.BLOCK_OUT, cfg.BLOCK_IN)).astype(np.int8)
    prog = gemm_program(cfg, o, n, m, 2)
    assert len(prog.segments) == 1
    for insn in prog.insns:  # drop the compute -> load tokens: their pops and their pushes
        if insn.opcode == Opcode.LOAD and insn.memory_type == MemType.INP:
            insn.pop_next_dep = False
        if insn.opcode in (Opcode.GEMM, Opcode.ALU) or (
                insn.opcode == Opcode.LOAD and insn.memory_type == MemType.UOP):
            insn.push_prev_dep = False
    stream = encode_stream(cfg, prog.insns)
    start = prog.segments[0][0] - prog.dram_base
    prog.dram[start:start + len(stream)] = np.frombuffer(stream, np.uint8)
    prog.write("x", x)
    prog.write("w", w)
    prog.run(FunctionalSimulator(cfg))
    y = prog.read("y", np.int8, (o, m, cfg.BATCH, cfg.BLOCK_OUT))
    assert not np.array_equal(y, gemm_reference(x, w))


# ---------------------------------------------------------------------------------------------
def alu_reference(op: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The fsim ALU rule in int64 numpy, wrapped to int32 (shift amounts here are < 32)."""
    a, b = a.astype(np.int64), np.broadcast_to(np.asarray(b, np.int64), a.shape)
    if op == AluOp.MIN:
        r = np.minimum(a, b)
    elif op == AluOp.MAX:
        r = np.maximum(a, b)
    elif op == AluOp.ADD:
        r = a + b
    elif op == AluOp.MUL:
        r = a * b
    else:  # SHR: arithmetic right shift, negative amount shifts left
        r = np.where(b >= 0, a >> np.maximum(b, 0), a << np.maximum(-b, 0))
    return (r + (1 << 31)) % (1 << 32) - (1 << 31)


ALU_OPS = {"MIN": AluOp.MIN, "MAX": AluOp.MAX, "ADD": AluOp.ADD, "SHR": AluOp.SHR,
           "MUL": AluOp.MUL}


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("name,operand", [(n, o) for n in ALU_OPS for o in ("imm", "vector")]
                         + [("SHL", "imm")])  # vector SHR already has negative (left) amounts
def test_alu(cfg: VTAConfig, name: str, operand: str) -> None:
    op = ALU_OPS.get(name, AluOp.SHR)
    rng = np.random.default_rng(SEED)
    rows, cols = 8, 8
    a = rng.integers(-16, 16, acc_shape(cfg, rows, cols)).astype(np.int32)
    if operand == "imm":
        imm = int(rng.integers(1, 5))
        if name == "SHL":
            imm = -imm  # the compiler's encoding of a left shift
        prog, shape = elementwise_program(
            cfg, [a], kernels=lambda r, c: [alu_kernel(op, r, c, imm=imm)])
        expected = alu_reference(op, a, imm)
    else:
        b = rng.integers(-16, 16, acc_shape(cfg, rows, cols)).astype(np.int32)
        prog, shape = elementwise_program(
            cfg, [a, b], kernels=lambda r, c: [alu_kernel(op, r, c, src=r * c)])
        expected = alu_reference(op, a, b)
    y, stats = run_program(cfg, prog, shape)
    np.testing.assert_array_equal(y, as_int8(expected))
    assert stats.alu_counter == 2 * rows * cols  # the >> 0 no-op and the operation


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_relu(cfg: VTAConfig) -> None:
    rng = np.random.default_rng(SEED)
    a = rng.integers(-256, 256, acc_shape(cfg, 8, 10)).astype(np.int32)
    prog, shape = elementwise_program(cfg, [a], kernels=lambda r, c: [
        alu_kernel(AluOp.MAX, r, c, imm=0), alu_kernel(AluOp.MIN, r, c, imm=127)])
    y, _ = run_program(cfg, prog, shape)
    np.testing.assert_array_equal(y, np.clip(a, 0, 127).astype(np.int8))


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_shift_and_scale(cfg: VTAConfig) -> None:
    rng = np.random.default_rng(SEED)
    a = rng.integers(-10, 10, acc_shape(cfg, 2, 8)).astype(np.int32)
    imm_shift = int(rng.integers(0, 8))
    imm_scale = int(rng.integers(1, 5))
    prog, shape = elementwise_program(cfg, [a], kernels=lambda r, c: [
        alu_kernel(AluOp.ADD, r, c, imm=imm_shift), alu_kernel(AluOp.SHR, r, c, imm=imm_scale)])
    y, _ = run_program(cfg, prog, shape)
    np.testing.assert_array_equal(y, as_int8((a.astype(np.int64) + imm_shift) >> imm_scale))
