"""Cycle model: hand-computed small programs, overlap under tokens, deadlock, monotonicity."""
import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from vta_ext.config import load_config
from vta_ext.isa import AluOp, MemType, Stage
from vta_ext.runtime import CommandQueue, UopKernel
from vta_ext.sim.cycles import CycleModel, DeadlockError

CFG = load_config("default")


def _gemm_program(cfg, tiles=1, double_buffer=False):
    """``tiles`` x (load inp 4 elems, load wgt 4 elems, GEMM 4 uop-iterations, store 1 elem)."""
    q = CommandQueue(cfg)
    inp = q.alloc(cfg.inp_elem_bytes * 4 * tiles, "inp")
    wgt = q.alloc(cfg.wgt_elem_bytes * 4 * tiles, "wgt")
    out = q.alloc(cfg.out_elem_bytes * tiles, "out")
    for t in range(tiles):
        base = 4 * (t % 2) if double_buffer else 0
        if t and not double_buffer:
            q.dep_pop(Stage.COMPUTE, Stage.LOAD)
        if t >= 2 and double_buffer:
            q.dep_pop(Stage.COMPUTE, Stage.LOAD)
        q.load_2d(inp, 4 * t, 4, 1, 4, 0, 0, 0, 0, base, MemType.INP)
        q.load_2d(wgt, 4 * t, 4, 1, 4, 0, 0, 0, 0, base, MemType.WGT)
        q.dep_push(Stage.LOAD, Stage.COMPUTE)
        q.dep_pop(Stage.LOAD, Stage.COMPUTE)
        if t and not double_buffer:
            q.dep_pop(Stage.STORE, Stage.COMPUTE)
        if t >= 2 and double_buffer:
            q.dep_pop(Stage.STORE, Stage.COMPUTE)
        k = UopKernel("gemm")
        k.loop_begin(4, 0, 1, 1)
        k.push(t % 2 if double_buffer else 0, base, base)
        k.loop_end()
        q.push_gemm(k)
        q.dep_push(Stage.COMPUTE, Stage.LOAD)
        q.dep_push(Stage.COMPUTE, Stage.STORE)
        q.dep_pop(Stage.COMPUTE, Stage.STORE)
        q.store_2d(t % 2 if double_buffer else 0, MemType.OUT, out, t, 1, 1, 1)
        q.dep_push(Stage.STORE, Stage.COMPUTE)
    # drain the tokens nobody waits for, so the stream stays balanced
    for _ in range(min(tiles, 2 if double_buffer else 1)):
        q.dep_pop(Stage.COMPUTE, Stage.LOAD)
        q.load_2d(inp, 0, 1, 1, 1, 0, 0, 0, 0, 0, MemType.INP)
        q.dep_pop(Stage.STORE, Stage.COMPUTE)
        k = UopKernel("alu", alu_opcode=AluOp.ADD, use_imm=True, imm=0)
        k.push(0, 0)
        q.push_alu(k)
    return q.synchronize()


def test_hand_computed_single_tile():
    # default: issue 1, DMA overhead 4 per row, 8 B/cycle, GEMM 4 cycles per uop
    q = CommandQueue(CFG)
    inp, wgt, out = q.alloc(64, "inp"), q.alloc(1024, "wgt"), q.alloc(16, "out")
    q.load_2d(inp, 0, 4, 1, 4, 0, 0, 0, 0, 0, MemType.INP)        # 1 + 4 + 64/8    = 13
    q.load_2d(wgt, 0, 4, 1, 4, 0, 0, 0, 0, 0, MemType.WGT)        # 1 + 4 + 1024/8  = 133
    q.dep_push(Stage.LOAD, Stage.COMPUTE)
    q.dep_pop(Stage.LOAD, Stage.COMPUTE)
    k = UopKernel("gemm")
    k.loop_begin(4, 0, 1, 1)
    k.push(0, 0, 0)
    k.loop_end()
    q.push_gemm(k)                                                # uop load 1+4+1 = 6, GEMM 1 + 4*4 = 17
    q.dep_push(Stage.COMPUTE, Stage.STORE)
    q.dep_pop(Stage.COMPUTE, Stage.STORE)
    q.store_2d(0, MemType.OUT, out, 0, 1, 1, 1)                   # 1 + 4 + 16/8 = 7
    report = CycleModel(CFG).run_program(q.synchronize())
    # load 0-13-146, compute uop 146-152, gemm 152-169, store 169-176, compute NOP 176-177, FINISH 178
    assert report.total_cycles == 178
    assert report.modules["load"].busy == 13 + 133 + 1
    assert report.modules["compute"].busy == 6 + 17 + 1 + 1
    assert report.modules["store"].busy == 7
    assert report.modules["compute"].stall == 146 + 7
    assert report.macs == 4 * 16 * 16
    assert dict(report.dram_bytes) == {"inp": 64, "wgt": 1024, "uop": 4, "out": 16}


def test_padding_costs_one_cycle_per_padded_element():
    q = CommandQueue(CFG)
    inp = q.alloc(64 * 16, "inp")
    q.load_2d(inp, 0, 3, 2, 3, 1, 1, 1, 1, 0, MemType.INP)
    insn = q.synchronize().insns[0]
    from vta_ext.sim.cycles import insn_cycles
    # 2 rows x 3 elements x 16 B = 96 B -> 12 cycles; block 5x4 = 20 elements, 6 data -> 14 pad
    assert insn_cycles(CFG, insn) == 1 + 2 * 4 + 12 + 14


def test_double_buffering_overlaps_load_and_compute():
    serial = CycleModel(CFG).run_program(_gemm_program(CFG, tiles=6))
    overlap = CycleModel(CFG).run_program(_gemm_program(CFG, tiles=6, double_buffer=True))
    assert overlap.macs == serial.macs
    assert overlap.total_cycles < serial.total_cycles


def test_deadlock_is_reported():
    q = CommandQueue(CFG)
    q.dep_pop(Stage.LOAD, Stage.COMPUTE)  # nobody ever pushes this token
    k = UopKernel("alu", alu_opcode=AluOp.ADD, use_imm=True, imm=1)
    k.push(0, 0)
    q.push_alu(k)
    program = q.synchronize()
    with pytest.raises(DeadlockError, match="compute"):
        CycleModel(CFG).run_program(program)


@settings(max_examples=25, deadline=None)
@given(gemm=st.integers(1, 4), alu_imm=st.integers(1, 5), alu_vec=st.integers(2, 6),
       bw_log=st.integers(3, 6), faster=st.sampled_from(["gemm", "alu", "bw"]))
def test_monotone_in_initiation_interval_and_bandwidth(gemm, alu_imm, alu_vec, bw_log, faster):
    base = dataclasses.replace(CFG, GEMM_CYCLES_PER_UOP=gemm, ALU_CYCLES_PER_UOP_IMM=alu_imm,
                               ALU_CYCLES_PER_UOP_VEC=alu_vec, MEM_BYTES_PER_CYCLE=1 << bw_log)
    better = {"gemm": dict(GEMM_CYCLES_PER_UOP=max(1, gemm - 1)),
              "alu": dict(ALU_CYCLES_PER_UOP_IMM=max(1, alu_imm - 1)),
              "bw": dict(MEM_BYTES_PER_CYCLE=2 << bw_log)}[faster]
    improved = dataclasses.replace(base, **better)
    for double_buffer in (False, True):
        program = _gemm_program(base, tiles=4, double_buffer=double_buffer)
        slow = CycleModel(base).run_program(program).total_cycles
        fast = CycleModel(improved).run_program(program).total_cycles
        assert fast <= slow


def test_clip_is_timed_as_an_immediate_alu_op():
    # the CLIP extension reads one operand (its bounds are in the immediate): ALU_CYCLES_PER_UOP_IMM
    from vta_ext.isa import AluInsn, clip_imm
    from vta_ext.sim.cycles import insn_cycles
    clip = AluInsn(alu_opcode=AluOp.CLIP, use_imm=True, imm=clip_imm(-128, 127), uop_bgn=0,
                   uop_end=2, iter_out=3, iter_in=4)
    assert insn_cycles(CFG, clip) == 1 + 3 * 4 * 2 * 5
    assert insn_cycles(load_config("pipelined"), clip) == 1 + 3 * 4 * 2 * 1
