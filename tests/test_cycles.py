"""Cycle model: hand-computed small programs, overlap under tokens, deadlock, monotonicity."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from vta_ext.config import VTAConfig, load_config
from vta_ext.isa import TOKEN_QUEUES, AluOp, MemType, Stage
from vta_ext.runtime import CommandQueue, UopKernel
from vta_ext.sim.cycles import CycleModel, DeadlockError
from vta_ext.sim.fsim import FunctionalSimulator

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


def _one_tile(cfg, inp_rows=1, inp_pad=0, out_rows=1, split=False):
    """LOAD inp ``inp_rows`` rows x 4 (``inp_pad`` padding elements before each row), LOAD wgt
    1 x 4, GEMM of 4 iterations, STORE ``out_rows`` rows x 1; with ``split`` the stream is
    synchronised between the GEMM's token push and the store's pop."""
    q = CommandQueue(cfg)
    inp, wgt, out = q.alloc(256, "inp"), q.alloc(1024, "wgt"), q.alloc(32, "out")
    q.load_2d(inp, 0, 4, inp_rows, 4, inp_pad, 0, 0, 0, 0, MemType.INP)
    q.load_2d(wgt, 0, 4, 1, 4, 0, 0, 0, 0, 0, MemType.WGT)
    q.dep_push(Stage.LOAD, Stage.COMPUTE)
    q.dep_pop(Stage.LOAD, Stage.COMPUTE)
    k = UopKernel("gemm")
    k.loop_begin(4, 0, 1, 1)
    k.push(0, 0, 0)
    k.loop_end()
    q.push_gemm(k)
    q.dep_push(Stage.COMPUTE, Stage.STORE)
    if split:
        q.synchronize()
    q.dep_pop(Stage.COMPUTE, Stage.STORE)
    q.store_2d(0, MemType.OUT, out, 0, 1, out_rows, 1)
    return q.synchronize()


def test_hand_computed_single_tile():
    # default: issue 1, DMA overhead 4 per row, 8 B/cycle, GEMM 4 cycles per uop
    # inp 1 + 4 + 64/8 = 13; wgt 1 + 4 + 1024/8 = 133; uop load 1+4+1 = 6, GEMM 1 + 4*4 = 17;
    # store 1 + 4 + 16/8 = 7
    report = CycleModel(CFG).run_program(_one_tile(CFG))
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


def split_tile(cfg, split=True):
    """:func:`_one_tile` with random data, and (``split``) the compute -> store token in flight
    across a segment boundary, as when a full instruction buffer closes a segment between two
    virtual threads."""
    program = _one_tile(cfg, split=split)
    rng = np.random.default_rng(5)
    program.write("inp", rng.integers(-128, 128, 256).astype(np.int8))
    program.write("wgt", rng.integers(-128, 128, 1024).astype(np.int8))
    return program


def test_tokens_in_flight_carry_into_the_next_segment():
    program = split_tile(CFG)
    assert len(program.segments) == 2
    model = CycleModel(CFG)
    first = model.run(program.insns[:program.segments[0][1]])
    # one g2s token pushed by the GEMM, popped by no store of the first segment
    assert dict(zip(TOKEN_QUEUES, first.tokens_left)) == {"l2g": 0, "g2l": 0, "g2s": 1, "s2g": 0}
    with pytest.raises(DeadlockError, match="store"):    # the second segment alone cannot run
        model.run(program.insns[program.segments[0][1]:])
    report = model.run_program(program)
    assert report.tokens_left == (0, 0, 0, 0)
    # the functional simulator keeps the token too: the split program stores what the one-segment
    # program stores
    whole = split_tile(CFG, split=False)
    program.run(FunctionalSimulator(CFG))
    whole.run(FunctionalSimulator(CFG))
    np.testing.assert_array_equal(program.read("out", np.int8, (1, 16)),
                                  whole.read("out", np.int8, (1, 16)))
    assert program.read("out", np.int8, (1, 16)).any()


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


# --------------------------------------------------------------------------- the RTL's structure
#: round structural constants (not a preset's): per-kind fixed costs, per-row costs, per-type
#: bandwidth, fetch and a token hop of TOKEN_CYCLES - POP_OFFSET_CYCLES = -4
STRUCTURED = {"GEMM_CYCLES_PER_UOP": 1, "INSN_ISSUE_CYCLES": 0, "DMA_OVERHEAD_CYCLES": 0,
              "INP_BYTES_PER_CYCLE": 8, "WGT_BYTES_PER_CYCLE": 4, "UOP_BYTES_PER_CYCLE": 4,
              "OUT_BYTES_PER_CYCLE": 8, "INP_INSN_CYCLES": 9, "WGT_INSN_CYCLES": 5,
              "UOP_INSN_CYCLES": 17, "OUT_INSN_CYCLES": 4, "INP_ROW_CYCLES": 19,
              "WGT_ROW_CYCLES": 15, "OUT_ROW_CYCLES": 14, "GEMM_INSN_CYCLES": 19,
              "NOP_INSN_CYCLES": 13, "FINISH_INSN_CYCLES": 11, "FETCH_CYCLES": 10,
              "TOKEN_CYCLES": 0, "POP_OFFSET_CYCLES": 4}


@pytest.mark.parametrize("latency", [0, 40])
def test_hand_computed_structure(latency):
    L = latency
    cfg = VTAConfig.from_dict({**CFG.to_dict(), **STRUCTURED, "MEM_LATENCY_CYCLES": L})
    report = CycleModel(cfg).run_program(_one_tile(cfg, inp_rows=2, inp_pad=1, out_rows=2))
    # every module starts at the fetch, 10 + L.
    # load: INP 9 + 2 rows x (19 + L) + 128 B / 8 + 2 padding elements = 65 + 2L;
    #       WGT 5 + (15 + L) + 1024 B / 4 = 276 + L, pushes at 10 + L + 341 + 3L = 351 + 4L;
    #       the closing LOAD NOP 13, pushes at 364 + 4L
    # compute: the uop load pops at 351 + 4L - 4 = 347 + 4L and takes 17 + (0 + L) + 4 B / 4
    #       = 18 + L -> 365 + 5L; GEMM 19 + 4 x 1 = 23 -> 388 + 5L, pushes
    # store: starts at 388 + 5L - 4, takes 4 + 2 x (14 + L) + 32 B / 8 = 36 + 2L -> 420 + 7L
    # compute: the NOP pops both (store's token: 416 + 7L), 13 -> 429 + 7L; FINISH 11
    assert report.total_cycles == 440 + 7 * L
    assert report.modules["load"].busy == (65 + 2 * L) + (276 + L) + 13
    assert report.modules["compute"].busy == (18 + L) + 23 + 13 + 11
    assert report.modules["store"].busy == 36 + 2 * L
    assert report.modules["store"].stall == (384 + 5 * L) - (10 + L)


@pytest.mark.parametrize("latency", [0, 40])
def test_timing_rules_for_the_estimates_are_the_models(latency):
    """``timing(cfg)``, what the knob estimate, the choice's bounds and the floor read: the
    durations of test_hand_computed_structure, by hand (a DmaCost sums instructions: 2 INP LOADs
    of 2 rows are 2 x (9 + 2 x (19 + L)) + their bytes / 8)."""
    from vta_ext.sim.cycles import timing

    L = latency
    cfg = VTAConfig.from_dict({**CFG.to_dict(), **STRUCTURED, "MEM_LATENCY_CYCLES": L})
    t = timing(cfg)
    assert t is timing(VTAConfig.from_dict(cfg.to_dict()))       # one per configuration value
    assert t.dma("INP").cycles(1, 2, 128, 2) == 65 + 2 * L
    assert t.dma("WGT").cycles(1, 1, 1024) == 276 + L
    assert t.dma("OUT").cycles(1, 2, 32) == 36 + 2 * L
    assert t.dma("UOP").cycles(1, 1, 4) == 18 + L
    assert t.dma("INP").cycles(2, 2, 256) == 2 * (9 + 2 * (19 + L)) + 32
    assert (t.gemm_fixed, t.nop, t.finish, t.fetch) == (19, 13, 11, 10 + L)
    # the bus rate where a kind says 0, and the per-micro-op model's issue and overhead
    d = timing(CFG).dma("ACC")
    assert (d.fixed, d.per_row, d.bytes_per_cycle, d.pad) == (1, 4, 8, 1)


def test_other_presets_take_the_structure_that_adds_nothing():
    """docs/isa.md: every preset but pynq keeps its per-micro-op model; the structural keys add
    nothing (bandwidth 0 = the bus rate, no fixed costs, no latency, one cycle per padding)."""
    from vta_ext.config import STRUCTURE_KEYS, available_configs

    for name in available_configs():
        if name == "pynq":
            continue
        cfg = load_config(name)
        for key in STRUCTURE_KEYS:
            assert getattr(cfg, key) == (1 if key == "PAD_ELEM_CYCLES" else 0), (name, key)


def test_structural_keys_are_monotone():
    """More bandwidth, fewer fixed cycles or a longer pop offset never cost cycles."""
    from vta_ext.config import DMA_KINDS

    base = {**CFG.to_dict(), **STRUCTURED, "ACC_INSN_CYCLES": 10, "ACC_ROW_CYCLES": 19,
            "ALU_INSN_CYCLES": 19, "MEM_LATENCY_CYCLES": 40}
    program = _gemm_program(CFG, tiles=3, double_buffer=True)
    total = CycleModel(VTAConfig.from_dict(base)).run_program(program).total_cycles
    for key, value in base.items():
        if key.endswith(("_INSN_CYCLES", "_ROW_CYCLES")) or key in (
                "FETCH_CYCLES", "TOKEN_CYCLES", "MEM_LATENCY_CYCLES") and value:
            cheaper = {**base, key: value - 1} if value else None
        elif key == "POP_OFFSET_CYCLES":
            cheaper = {**base, key: value + 1}
        elif key in tuple(f"{k}_BYTES_PER_CYCLE" for k in DMA_KINDS) and value and value < 8:
            cheaper = {**base, key: value * 2}
        else:
            continue
        if cheaper is None:
            continue
        assert CycleModel(VTAConfig.from_dict(cheaper)).run_program(program).total_cycles <= \
            total, key


def test_a_type_faster_than_the_bus_is_refused():
    from vta_ext.config import ConfigError

    with pytest.raises(ConfigError, match="WGT_BYTES_PER_CYCLE=16 exceeds the bus"):
        VTAConfig.from_dict({**CFG.to_dict(), "WGT_BYTES_PER_CYCLE": 16})
