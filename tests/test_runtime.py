"""Runtime (program builder): dependency NOP rules, synchronize, loop mapping, micro-op cache,
automatic segmenting and API errors. Expected streams are derived by hand from the rules of the
original C runtime (vta-reference-facts.md section 4)."""
import dataclasses

import numpy as np
import pytest

import vta_ext.runtime as runtime
from vta_ext.config import load_config
from vta_ext.isa import AluOp, FieldRangeError, MemType, Opcode, Stage
from vta_ext.runtime import CommandQueue, RuntimeError_, UopKernel
from vta_ext.sim import FunctionalSimulator

CFG = load_config("default")


def _flags(insn):
    return tuple(int(getattr(insn, f)) for f in ("pop_prev_dep", "pop_next_dep", "push_prev_dep",
                                                  "push_next_dep"))


def _summary(program):
    """(opcode name, memory type or '', x_size or '', flags) per instruction."""
    out = []
    for insn in program.insns:
        mem = getattr(insn, "memory_type", None)
        out.append((Opcode(insn.opcode).name, "" if mem is None else MemType(mem).name,
                    getattr(insn, "x_size", ""), _flags(insn)))
    return out


def test_push_merges_into_last_instruction_and_pop_rides_on_next():
    q = CommandQueue(CFG)
    buf = q.alloc(4096, "inp")
    q.load_2d(buf, 0, 1, 1, 1, 0, 0, 0, 0, 0, MemType.INP)
    q.dep_push(Stage.LOAD, Stage.COMPUTE)      # merged: the last instruction is a load-stage LOAD
    q.dep_pop(Stage.LOAD, Stage.COMPUTE)       # pending on compute
    k = UopKernel("alu", alu_opcode=AluOp.ADD, use_imm=True, imm=1)
    k.push(0, 0)
    q.push_alu(k)                               # LOAD UOP takes the pending pop, then ALU
    q.dep_push(Stage.COMPUTE, Stage.LOAD)      # merged on the ALU (push_prev)
    q.dep_push(Stage.COMPUTE, Stage.LOAD)      # already set -> a compute NOP carrying push_prev
    program = q.synchronize()
    assert _summary(program) == [
        ("LOAD", "INP", 1, (0, 0, 0, 1)),
        ("LOAD", "UOP", 1, (1, 0, 0, 0)),
        ("ALU", "", "", (0, 0, 1, 0)),
        ("LOAD", "UOP", 0, (0, 0, 1, 0)),
        # synchronize: push store->compute (store NOP), push load->compute (load NOP),
        # pop both on a compute NOP, then FINISH
        ("STORE", "UOP", 0, (0, 0, 1, 0)),
        ("LOAD", "INP", 0, (0, 0, 0, 1)),
        ("LOAD", "UOP", 0, (1, 1, 0, 0)),
        ("FINISH", "", "", (0, 0, 0, 0)),
    ]


def test_second_pending_pop_commits_a_nop():
    q = CommandQueue(CFG)
    q.dep_pop(Stage.COMPUTE, Stage.STORE)
    q.dep_pop(Stage.COMPUTE, Stage.STORE)      # same kind pending -> the first one as a NOP
    buf = q.alloc(4096, "out")
    q.store_2d(0, MemType.OUT, buf, 0, 1, 1, 1)
    program = q.synchronize()
    # the final store->compute push of synchronize merges onto the STORE (push_prev)
    assert _summary(program)[:2] == [("STORE", "UOP", 0, (1, 0, 0, 0)), ("STORE", "OUT", 1, (1, 0, 1, 0))]


def test_load_store_queue_does_not_exist():
    with pytest.raises(RuntimeError_, match="no dependency queue between LOAD and STORE"):
        CommandQueue(CFG).dep_push(Stage.LOAD, Stage.STORE)


def test_loop_levels_map_to_instruction_fields():
    gemm = UopKernel("gemm")
    gemm.loop_begin(3, 1, 2, 4)
    gemm.push(0, 0, 0)
    gemm.loop_end()
    insn = gemm.instruction(10)
    assert (insn.iter_out, insn.iter_in, insn.dst_factor_out, insn.src_factor_out,
            insn.wgt_factor_out, insn.uop_bgn, insn.uop_end) == (3, 1, 1, 2, 4, 10, 11)
    alu = UopKernel("alu", alu_opcode=AluOp.MAX, use_imm=True, imm=0)
    alu.loop_begin(5, 1, 1)
    alu.push(0, 0)
    alu.loop_end()
    insn = alu.instruction(0)   # one ALU loop becomes the INNER loop
    assert (insn.iter_out, insn.iter_in, insn.dst_factor_in, insn.src_factor_in) == (1, 5, 1, 1)
    two = UopKernel("alu", alu_opcode=AluOp.ADD)
    two.loop_begin(2, 8, 8)
    two.loop_begin(3, 1, 1)
    two.push(0, 100)
    insn = two.instruction(0)
    assert (insn.iter_out, insn.iter_in, insn.dst_factor_out, insn.dst_factor_in) == (2, 3, 8, 1)


def test_kernel_api_errors():
    k = UopKernel("gemm")
    k.push(0, 0, 0)
    with pytest.raises(RuntimeError_, match="after push"):
        k.loop_begin(2, 1, 1, 1)
    k = UopKernel("alu", alu_opcode=AluOp.ADD)
    k.loop_begin(2, 1, 1)
    k.loop_begin(2, 1, 1)
    with pytest.raises(RuntimeError_, match="at most 2"):
        k.loop_begin(2, 1, 1)
    with pytest.raises(RuntimeError_, match="unclosed"):
        CommandQueue(CFG).push_alu(_with_uop(k))
    with pytest.raises(RuntimeError_, match="empty"):
        CommandQueue(CFG).push_gemm(UopKernel("gemm"))
    q = CommandQueue(CFG)
    buf = q.alloc(100, "x")
    with pytest.raises(RuntimeError_, match="already exists"):
        q.alloc(100, "x")
    with pytest.raises(RuntimeError_, match="MemType.OUT"):
        q.store_2d(0, MemType.ACC, buf, 0, 1, 1, 1)
    with pytest.raises(RuntimeError_, match="not a data load"):
        q.load_2d(buf, 0, 1, 1, 1, 0, 0, 0, 0, 0, MemType.OUT)
    with pytest.raises(RuntimeError_, match="stages are LOAD=1, COMPUTE=2, STORE=3"):
        q.dep_push(0, Stage.COMPUTE)


def test_kernel_limits_of_the_field_widths():
    # facts §1.3: LOOP_ITER_WIDTH 14 -> at most 16383 iterations; ALUOP_IMM_BIT_WIDTH 16, signed
    UopKernel("gemm").loop_begin(16383, 1, 1, 1)
    with pytest.raises(FieldRangeError, match="16384 does not fit the 14-bit iter_out/iter_in"):
        UopKernel("gemm").loop_begin(16384, 1, 1, 1)
    for imm in (-32768, 32767):
        UopKernel("alu", alu_opcode=AluOp.ADD, use_imm=True, imm=imm)
    for imm in (-32769, 32768):
        with pytest.raises(FieldRangeError, match=f"ALU immediate {imm} does not fit int16"):
            UopKernel("alu", alu_opcode=AluOp.ADD, use_imm=True, imm=imm)


def _with_uop(kernel):
    kernel.push(0, 0)
    return kernel


def _add_kernel(base: int, count: int, value: int) -> UopKernel:
    """``count`` micro-ops adding ``value`` to accumulator rows base..base+count-1."""
    k = UopKernel("alu", alu_opcode=AluOp.ADD, use_imm=True, imm=value)
    for i in range(count):
        k.push(base + i, base + i)
    return k


def test_uop_cache_reuse_and_eviction_keep_programs_correct():
    """A 32-entry micro-op buffer holds one 20-uop kernel at a time: B evicts A, A is reloaded from
    its staging copy (the apache runtime would point the first LOAD UOP at stale data)."""
    cfg = dataclasses.replace(load_config("default"), name="tiny_uop", LOG_UOP_BUFF_SIZE=7)
    assert cfg.uop_depth == 32
    q = CommandQueue(cfg)
    acc = q.alloc(cfg.acc_elem_bytes * 40, "acc")
    out = q.alloc(cfg.out_elem_bytes * 40, "out")
    q.load_2d(acc, 0, 40, 1, 40, 0, 0, 0, 0, 0, MemType.ACC)
    a, b = _add_kernel(0, 20, 3), _add_kernel(20, 20, 5)
    q.push_alu(a)
    q.push_alu(_add_kernel(0, 20, 3))       # equal kernel, still resident: no reload
    q.push_alu(b)                            # does not fit after A -> placed at 0, evicts A
    q.push_alu(a)                            # reloaded
    q.dep_push(Stage.COMPUTE, Stage.STORE)
    q.dep_pop(Stage.COMPUTE, Stage.STORE)
    q.store_2d(0, MemType.OUT, out, 0, 40, 1, 40)
    program = q.synchronize()
    uop_loads = [i for i in program.insns if i.opcode == Opcode.LOAD and i.memory_type == MemType.UOP
                 and i.x_size]
    assert [(i.sram_base, i.x_size) for i in uop_loads] == [(0, 20), (0, 20), (0, 20)]
    assert uop_loads[0].dram_base == uop_loads[2].dram_base != uop_loads[1].dram_base
    lanes = cfg.BATCH * cfg.BLOCK_OUT
    start = np.arange(40 * lanes, dtype=np.int32).reshape(40, lanes) % 50
    program.write("acc", start)
    program.run(FunctionalSimulator(cfg))
    expected = start.copy()
    expected[:20] += 3 * 3
    expected[20:] += 5
    np.testing.assert_array_equal(program.read("out", np.int8, (40, lanes)), expected.astype(np.int8))


def _sixty_adds(monkeypatch, value: int):
    """A program of 60 one-row ALU adds of ``value`` (step ``i`` on accumulator row ``i % 8``)
    between an ACC load and a store, in segments of at most 34 instructions."""
    monkeypatch.setattr(runtime, "MAX_XFER", 16 * 40)
    q = CommandQueue(CFG)
    acc = q.alloc(CFG.acc_elem_bytes * 8, "acc")
    out = q.alloc(CFG.out_elem_bytes * 8, "out")
    q.load_2d(acc, 0, 8, 1, 8, 0, 0, 0, 0, 0, MemType.ACC)
    for step in range(60):
        q.push_alu(_add_kernel(step % 8, 1, value))
    q.dep_push(Stage.COMPUTE, Stage.STORE)
    q.dep_pop(Stage.COMPUTE, Stage.STORE)
    q.store_2d(0, MemType.OUT, out, 0, 8, 1, 8)
    return q.synchronize()


def test_long_streams_are_split_into_segments(monkeypatch):
    program = _sixty_adds(monkeypatch, 1)
    assert len(program.segments) > 1
    assert all(count * 16 <= 16 * 40 for _, count in program.segments)
    lanes = CFG.BATCH * CFG.BLOCK_OUT
    program.write("acc", np.zeros((8, lanes), np.int32))
    stats = program.run(FunctionalSimulator(CFG))
    assert stats.alu_counter == 60
    adds_per_row = [len(range(row, 60, 8)) for row in range(8)]  # step % 8 == row
    expected = np.repeat(np.array(adds_per_row, np.int8)[:, None], lanes, axis=1)
    np.testing.assert_array_equal(program.read("out", np.int8, (8, lanes)), expected)


def test_a_program_is_encoded_only_when_its_image_is_read(monkeypatch):
    """Timing a program on the cycle model encodes nothing (a losing candidate never is); reading
    the image encodes every segment once, and the words decode back to the program's
    instructions."""
    from vta_ext.isa import decode_stream
    from vta_ext.sim.cycles import CycleModel

    calls = []
    real = runtime.encode_stream
    monkeypatch.setattr(runtime, "encode_stream", lambda cfg, insns: calls.append(1) or real(cfg, insns))
    program = _sixty_adds(monkeypatch, 2)
    lanes = CFG.BATCH * CFG.BLOCK_OUT
    program.write("acc", np.zeros((8, lanes), np.int32))
    assert CycleModel(CFG).run_program(program).total_cycles > 0
    assert calls == []
    image, start = program.dram, 0
    assert len(calls) == len(program.segments) > 1
    for phys, count in program.segments:
        offset = phys - program.dram_base
        words = image[offset:offset + count * CFG.INS_ELEM_BYTES].tobytes()
        assert decode_stream(CFG, words) == program.insns[start:start + count]
        start += count
    program.run(FunctionalSimulator(CFG))
    assert len(calls) == len(program.segments)          # encoded once
    expected = np.full((8, lanes), 2 * len(range(0, 60, 8)), np.int8)
    expected[4:] = 2 * len(range(4, 60, 8))
    np.testing.assert_array_equal(program.read("out", np.int8, (8, lanes)), expected)


def test_a_program_round_trips_through_plain_arrays(monkeypatch):
    """``Program.to_arrays`` / ``from_arrays`` (the depthwise program cache): a program of
    several segments comes back with the same instructions, image, segments and buffers (in
    allocation order), though its data buffers had been written and run, and runs to the
    hand-counted output."""
    program = _sixty_adds(monkeypatch, 3)
    lanes = CFG.BATCH * CFG.BLOCK_OUT
    program.write("acc", np.full((8, lanes), 7, np.int32))
    program.run(FunctionalSimulator(CFG))           # the data buffers are not part of the copy
    arrays = program.to_arrays()
    assert all(isinstance(a, np.ndarray) and a.dtype != object for a in arrays.values())
    copy = runtime.Program.from_arrays(CFG, arrays)
    assert len(copy.segments) > 1 and copy.segments == program.segments
    assert copy.insns == program.insns
    assert list(copy.buffers) == list(program.buffers) == ["acc", "out"]
    assert copy.buffers == program.buffers
    start = min(phys for phys, _ in program.segments) - program.dram_base
    np.testing.assert_array_equal(copy.dram[start:], program.dram[start:])
    assert not copy.dram[:start].any()
    copy.write("acc", np.zeros((8, lanes), np.int32))
    copy.run(FunctionalSimulator(CFG))
    expected = np.full((8, lanes), 3 * len(range(0, 60, 8)), np.int8)
    expected[4:] = 3 * len(range(4, 60, 8))
    np.testing.assert_array_equal(copy.read("out", np.int8, (8, lanes)), expected)
