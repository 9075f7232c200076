"""Devices: VTA programs run through the original driver ABI (vta_ext.device) on the two
libraries of ../shared/vta-hw (the original fsim and the RTL), checked against numpy, the llvm
build and the built-in simulator."""
from __future__ import annotations

import numpy as np
import pytest

from vta_ext.config import load_config
from vta_ext.device import DeviceError, open_device, vta_hw_library
from vta_ext.isa import AluOp, MemType, Stage
from vta_ext.runtime import CommandQueue, UopKernel
from vta_ext.sim import FunctionalSimulator

KINDS = ("fsim", "rtl")


@pytest.fixture(scope="module")
def libraries():
    """kind -> library path; the module is skipped when ../shared/vta-hw is not there."""
    try:
        return {kind: vta_hw_library(kind) for kind in KINDS}
    except DeviceError as err:
        pytest.skip(f"the vta-hw libraries are not available: {err}")


ROWS, SHIFT, CAP, OFFSET = 4, 3, 60, -7


def gemm_alu_program(cfg):
    """Loads ROWS input vectors and one weight matrix, resets and accumulates ROWS accumulator
    rows (one per input row: no accumulator is written twice, so the RTL's hazard does not
    apply), SHR/MIN/ADD by immediates, stores the rows."""
    q = CommandQueue(cfg)
    inp = q.alloc(ROWS * cfg.inp_elem_bytes, "inp")
    wgt = q.alloc(cfg.wgt_elem_bytes, "wgt")
    out = q.alloc(ROWS * cfg.out_elem_bytes, "out")
    q.load_2d(inp, 0, ROWS, 1, ROWS, 0, 0, 0, 0, 0, MemType.INP)
    q.load_2d(wgt, 0, 1, 1, 1, 0, 0, 0, 0, 0, MemType.WGT)
    q.dep_push(Stage.LOAD, Stage.COMPUTE)
    q.dep_pop(Stage.LOAD, Stage.COMPUTE)
    reset = UopKernel("gemm", reset=True)
    reset.loop_begin(ROWS, 1, 0, 0)
    reset.push(0, 0, 0)
    reset.loop_end()
    q.push_gemm(reset)
    gemm = UopKernel("gemm")
    gemm.loop_begin(ROWS, 1, 1, 0)
    gemm.push(0, 0, 0)
    gemm.loop_end()
    q.push_gemm(gemm)
    for op, imm in ((AluOp.SHR, SHIFT), (AluOp.MIN, CAP), (AluOp.ADD, OFFSET)):
        alu = UopKernel("alu", alu_opcode=op, use_imm=True, imm=imm)
        alu.loop_begin(ROWS, 1, 1)
        alu.push(0, 0)
        alu.loop_end()
        q.push_alu(alu)
    q.dep_push(Stage.COMPUTE, Stage.STORE)
    q.dep_pop(Stage.COMPUTE, Stage.STORE)
    q.store_2d(0, MemType.OUT, out, 0, ROWS, 1, ROWS)
    return q.synchronize()


def numpy_reference(cfg, inp, wgt):
    acc = inp.astype(np.int32) @ wgt.reshape(cfg.BLOCK_OUT, cfg.BLOCK_IN).astype(np.int32).T
    acc = np.minimum(acc >> SHIFT, CAP) + OFFSET
    return acc.astype(np.int8)  # STORE keeps the low 8 bits


def filled_program(cfg, seed=0):
    rng = np.random.default_rng(seed)
    inp = rng.integers(-128, 128, (ROWS, cfg.BLOCK_IN), dtype=np.int8)
    wgt = rng.integers(-128, 128, cfg.wgt_elem_bytes, dtype=np.int8)
    program = gemm_alu_program(cfg)
    program.write("inp", inp)
    program.write("wgt", wgt)
    return program, numpy_reference(cfg, inp, wgt)


@pytest.mark.parametrize("kind", KINDS)
def test_hand_built_program_matches_numpy(libraries, kind):
    cfg = load_config("pynq")
    program, expected = filled_program(cfg)
    reference = program.run(FunctionalSimulator(cfg))
    assert np.array_equal(program.read("out", np.int8, expected.shape), expected)
    program.write("out", np.zeros(expected.size, np.int8))
    dev = open_device(libraries[kind])
    run = dev.run_program(program)
    assert np.array_equal(program.read("out", np.int8, expected.shape), expected)
    assert run.stats == reference     # the counters from the words equal the simulator's
    if kind == "rtl":
        assert dev.reports_cycles and run.cycles > 0 and run.cycles == sum(run.segment_cycles)
    else:
        assert not dev.reports_cycles and run.cycles is None
    # a second run on the same device (its SRAMs and blocks are reused) gives the same bytes
    program.write("out", np.zeros(expected.size, np.int8))
    assert dev.run_program(program).cycles == run.cycles
    assert np.array_equal(program.read("out", np.int8, expected.shape), expected)


def test_memory_latency_costs_cycles(libraries):
    cfg = load_config("pynq")
    program, expected = filled_program(cfg)
    fast = open_device(libraries["rtl"], mem_latency=0).run_program(program).cycles
    slow = open_device(libraries["rtl"], mem_latency=40).run_program(program).cycles
    assert np.array_equal(program.read("out", np.int8, expected.shape), expected)
    assert 0 < fast < slow
