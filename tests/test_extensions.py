"""The two ISA extensions end to end: CLIP (ALU op 5) and pad-with-minimum (LOAD bit 58).

Programs are built through the runtime (:class:`vta_ext.runtime.CommandQueue`), run on the
functional simulator and compared with numpy references written here (``np.clip`` for CLIP, an
``np.full`` block with the data pasted in for padded loads). The rules come from DESIGN.md ("The
ISA: compatible first, then extended") and ``docs/isa.md``: CLIP needs ``use_imm``, packs ``lo`` in
the low and ``hi`` in the high byte of the immediate and computes ``max(min(a, hi), lo)``; a padded
LOAD with ``pad_min`` pads with -128 (int8 lanes) or INT32_MIN (int32 lanes). Each extension exists
only in configurations that enable it (``EXT_CLIP``, ``EXT_PAD_MIN``): ``default`` has both,
``apache`` neither.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from vta_ext.config import load_config
from vta_ext.isa import (AluOp, FieldRangeError, FinishInsn, MemInsn, MemType, Opcode, Stage,
                         clip_imm, decode_stream, disassemble, encode_stream)
from vta_ext.runtime import CommandQueue, MissingExtensionError, RuntimeError_, UopKernel
from vta_ext.sim import FunctionalSimulator, SimulationError

DEFAULT = load_config("default")
APACHE = load_config("apache")
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def test_presets_enable_the_extensions_as_documented():
    assert DEFAULT.EXT_CLIP is True and DEFAULT.EXT_PAD_MIN is True
    assert APACHE.EXT_CLIP is False and APACHE.EXT_PAD_MIN is False


# --------------------------------------------------------------------------- CLIP

#: accumulator values around every int8 boundary and far outside the int8 range
EDGE_VALUES = [INT32_MIN, INT32_MIN + 1, -(1 << 20), -65536, -32769, -32768, -257, -256, -129, -128,
               -127, -2, -1, 0, 1, 2, 126, 127, 128, 255, 256, 32767, 32768, 1 << 20,
               INT32_MAX - 1, INT32_MAX]


def clip_program(cfg, acc: np.ndarray, lo: int, hi: int, imm=None):
    """LOAD ``acc`` (n elements), ALU CLIP over all of them, STORE them; returns the program."""
    n = acc.shape[0]
    q = CommandQueue(cfg)
    src = q.alloc(acc.nbytes, "acc")
    out = q.alloc(n * cfg.out_elem_bytes, "out")
    q.load_2d(src, 0, n, 1, n, 0, 0, 0, 0, 0, MemType.ACC)
    kernel = UopKernel("alu", alu_opcode=AluOp.CLIP, use_imm=True,
                       imm=clip_imm(lo, hi) if imm is None else imm)
    kernel.loop_begin(n, 1, 1)
    kernel.push(0, 0)
    kernel.loop_end()
    q.push_alu(kernel)
    q.dep_push(Stage.COMPUTE, Stage.STORE)
    q.dep_pop(Stage.COMPUTE, Stage.STORE)
    q.store_2d(0, MemType.OUT, out, 0, n, 1, n)
    program = q.synchronize()
    program.write("acc", acc)
    return program


def acc_with_edges(cfg, lo: int, hi: int, seed: int = 0) -> np.ndarray:
    """int32 accumulator elements holding EDGE_VALUES, lo/hi +-1, then random int32 values."""
    lanes = cfg.BATCH * cfg.BLOCK_OUT
    values = EDGE_VALUES + [lo - 1, lo, lo + 1, hi - 1, hi, hi + 1]
    rng = np.random.default_rng(seed)
    n = -(-len(values) // lanes) + 2
    flat = rng.integers(INT32_MIN, INT32_MAX, n * lanes, dtype=np.int64, endpoint=True)
    flat[:len(values)] = values
    rng.shuffle(flat)
    return flat.astype(np.int32).reshape(n, cfg.BATCH, cfg.BLOCK_OUT)


@pytest.mark.parametrize("lo,hi", [(5, 5), (-128, 127), (0, 0), (0, 127), (-128, -128),
                                   (127, 127), (-3, 100), (-100, -99)])
def test_clip_matches_numpy(lo, hi):
    acc = acc_with_edges(DEFAULT, lo, hi)
    program = clip_program(DEFAULT, acc, lo, hi)
    sim = FunctionalSimulator(DEFAULT)
    stats = program.run(sim)
    expected = np.clip(acc.astype(np.int64), lo, hi)
    n = acc.shape[0]
    np.testing.assert_array_equal(sim.sram("acc")[:n], expected)
    # the clipped values fit int8, so the truncating STORE returns them exactly
    np.testing.assert_array_equal(program.read("out", np.int8, acc.shape), expected)
    assert stats.alu_counter == n


@settings(max_examples=15, deadline=None)
@given(bounds=st.tuples(st.integers(-128, 127), st.integers(-128, 127)).map(sorted),
       seed=st.integers(0, 2**16))
def test_clip_matches_numpy_for_any_bounds(bounds, seed):
    lo, hi = bounds
    acc = acc_with_edges(DEFAULT, lo, hi, seed)
    sim = FunctionalSimulator(DEFAULT)
    clip_program(DEFAULT, acc, lo, hi).run(sim)
    np.testing.assert_array_equal(sim.sram("acc")[:acc.shape[0]],
                                  np.clip(acc.astype(np.int64), lo, hi))


def test_clip_on_a_batch_2_config():
    cfg = load_config("2x16x16")
    assert cfg.EXT_CLIP
    acc = acc_with_edges(cfg, -128, 127, seed=1)
    program = clip_program(cfg, acc, -128, 127)
    sim = FunctionalSimulator(cfg)
    program.run(sim)
    np.testing.assert_array_equal(sim.sram("acc")[:acc.shape[0]],
                                  np.clip(acc.astype(np.int64), -128, 127))


def test_clip_saturates_where_a_plain_store_wraps():
    # without CLIP the STORE truncates (300 -> 44, -129 -> 127); with CLIP it saturates
    acc = np.zeros((1, 1, 16), np.int32)
    acc[0, 0, :4] = [300, -129, 128, -200]
    program = clip_program(DEFAULT, acc, -128, 127)
    program.run()
    assert program.read("out", np.int8, (4,)).tolist() == [127, -128, 127, -128]


def test_clip_lo_above_hi_is_rejected():
    with pytest.raises(FieldRangeError, match="lo must not exceed hi"):
        clip_imm(5, -5)
    raw = 5 | ((-5 & 0xFF) << 8)                       # lo = 5 in the low byte, hi = -5 in the high
    raw -= 1 << 16                                      # as a signed 16-bit immediate
    with pytest.raises(RuntimeError_, match=r"lo=5 > hi=-5"):
        UopKernel("alu", alu_opcode=AluOp.CLIP, use_imm=True, imm=raw)


def test_clip_needs_an_immediate():
    with pytest.raises(RuntimeError_, match="use_imm=True"):
        UopKernel("alu", alu_opcode=AluOp.CLIP, use_imm=False)


def test_clip_without_the_extension_is_rejected_at_build_time():
    q = CommandQueue(APACHE)
    kernel = UopKernel("alu", alu_opcode=AluOp.CLIP, use_imm=True, imm=clip_imm(0, 127))
    kernel.push(0, 0)
    with pytest.raises(MissingExtensionError) as err:
        q.push_alu(kernel)
    message = str(err.value)
    for needle in ("CLIP", "push_alu", "EXT_CLIP", "'apache'"):
        assert needle in message, (needle, message)
    # nothing was appended: the queue can still be used (a MIN/MAX pair does the same clip)
    for op, bound in ((AluOp.MIN, 127), (AluOp.MAX, 0)):
        k = UopKernel("alu", alu_opcode=op, use_imm=True, imm=bound)
        k.push(0, 0)
        q.push_alu(k)
    assert [i.alu_opcode for i in q.synchronize().insns if i.opcode == Opcode.ALU] == [0, 1]


def test_clip_without_the_extension_is_rejected_by_the_simulator():
    acc = acc_with_edges(DEFAULT, 0, 127)
    program = clip_program(DEFAULT, acc, 0, 127)      # the same bits are valid under default
    clip_index = next(i for i, x in enumerate(program.insns)
                      if x.opcode == Opcode.ALU and x.alu_opcode == AluOp.CLIP)
    with pytest.raises(SimulationError, match="EXT_CLIP") as err:
        program.run(FunctionalSimulator(APACHE))
    assert err.value.insn_index == clip_index
    assert "ALU-CLIP" in err.value.insn_text


def test_clip_vector_form_is_rejected_by_the_simulator():
    q = CommandQueue(DEFAULT)
    kernel = UopKernel("alu", alu_opcode=AluOp.ADD, use_imm=False)
    kernel.push(0, 1)
    q.push_alu(kernel)
    program = q.synchronize()
    alu = next(x for x in program.insns if x.opcode == Opcode.ALU)
    alu.alu_opcode = AluOp.CLIP                      # hand-edit the stream: CLIP without use_imm
    program = _reencode(program)
    with pytest.raises(SimulationError, match="use_imm must be 1"):
        program.run(FunctionalSimulator(DEFAULT))


def _reencode(program):
    """Write the (edited) instruction records of a one-segment program back into its image."""
    (insn_phys, count), = program.segments
    stream = encode_stream(program.config, program.insns)
    start = insn_phys - program.dram_base
    program.dram[start:start + len(stream)] = np.frombuffer(stream, np.uint8)
    return program


# --------------------------------------------------------------------------- pad_min

LANE_INFO = {  # memory type -> (sram name, DRAM dtype, lanes shape, pad value with pad_min)
    MemType.INP: ("inp", np.int8, lambda c: (c.BATCH, c.BLOCK_IN), -128),
    MemType.WGT: ("wgt", np.int8, lambda c: (c.BLOCK_OUT, c.BLOCK_IN), -128),
    MemType.ACC: ("acc", np.int32, lambda c: (c.BATCH, c.BLOCK_OUT), INT32_MIN),
    MemType.ACC_8BIT: ("acc", np.int8, lambda c: (c.BATCH, c.BLOCK_OUT), INT32_MIN),
}
#: (y_pad_before, y_pad_after, x_pad_before, x_pad_after)
PADS = [(1, 0, 0, 0), (0, 2, 0, 0), (0, 0, 3, 0), (0, 0, 0, 1), (2, 1, 1, 3)]


def padded_load(cfg, mem: MemType, pads, pad_min: bool, y: int = 3, x: int = 2, stride: int = 5,
                sram: int = 4, seed: int = 0):
    """Run one padded 2-D LOAD; return (SRAM contents, data rows, block shape)."""
    name, dtype, lanes_of, _ = LANE_INFO[mem]
    lanes = lanes_of(cfg)
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    # DRAM holds y rows of `stride` elements; the load takes the first x of each row. The values
    # avoid the type minimum, so a pad position can never be mistaken for data.
    dram = rng.integers(info.min + 1, info.max, (y, stride) + lanes, dtype=np.int64,
                        endpoint=True).astype(dtype)
    dram[0, 0].flat[:2] = [info.min + 1, info.max]
    q = CommandQueue(cfg)
    src = q.alloc(dram.nbytes, "src")
    yp0, yp1, xp0, xp1 = pads
    q.load_2d(src, 0, x, y, stride, xp0, yp0, xp1, yp1, sram, mem, pad_min=pad_min)
    program = q.synchronize()
    program.write("src", dram)
    sim = FunctionalSimulator(cfg)
    program.run(sim)
    return sim.sram(name), dram[:, :x], (yp0 + y + yp1, xp0 + x + xp1)


@pytest.mark.parametrize("pads", PADS, ids=lambda p: "y%d,%d_x%d,%d" % p)
@pytest.mark.parametrize("mem", list(LANE_INFO), ids=lambda m: MemType(m).name)
@pytest.mark.parametrize("pad_min", [True, False], ids=["min", "zero"])
def test_padded_load_matches_numpy(mem, pads, pad_min):
    sram_base = 4
    sram, data, (y_total, x_total) = padded_load(DEFAULT, mem, pads, pad_min, sram=sram_base)
    pad_value = LANE_INFO[mem][3] if pad_min else 0
    lanes = sram.shape[1:]
    expected = np.full((y_total, x_total) + lanes, pad_value, np.int64)
    yp0, _, xp0, _ = pads
    expected[yp0:yp0 + data.shape[0], xp0:xp0 + data.shape[1]] = data   # ACC_8BIT: sign-extends
    block = sram[sram_base:sram_base + y_total * x_total].reshape(expected.shape)
    np.testing.assert_array_equal(block, expected)
    # nothing outside the block is written (the SRAM starts zeroed)
    assert not sram[:sram_base].any()
    assert not sram[sram_base + y_total * x_total:].any()


def test_pad_min_needs_padding_to_show():
    # without padding the flag changes nothing: the block is the data
    with_flag, data, shape = padded_load(DEFAULT, MemType.INP, (0, 0, 0, 0), True)
    without, _, _ = padded_load(DEFAULT, MemType.INP, (0, 0, 0, 0), False)
    np.testing.assert_array_equal(with_flag, without)
    np.testing.assert_array_equal(with_flag[4:4 + data.size // 16].reshape(data.shape), data)


def test_pad_min_on_a_wide_config():
    cfg = load_config("1x32x32")
    sram, data, (y_total, x_total) = padded_load(cfg, MemType.WGT, (1, 1, 1, 1), True, y=1, x=1,
                                                 stride=1)
    block = sram[4:4 + y_total * x_total].reshape((y_total, x_total) + sram.shape[1:])
    assert (block[1, 1] == data[0, 0]).all()
    assert (block[0] == -128).all() and (block[2] == -128).all()
    assert (block[1, 0] == -128).all() and (block[1, 2] == -128).all()


def test_pad_min_without_the_extension_is_rejected_at_build_time():
    q = CommandQueue(APACHE)
    src = q.alloc(4096, "src")
    with pytest.raises(MissingExtensionError) as err:
        q.load_2d(src, 0, 1, 1, 1, 1, 0, 0, 0, 0, MemType.ACC, pad_min=True)
    message = str(err.value)
    for needle in ("pad-with-minimum", "LOAD ACC", "pad_min", "EXT_PAD_MIN", "'apache'"):
        assert needle in message, (needle, message)
    # zero padding is the original behaviour and stays available
    q.load_2d(src, 0, 1, 1, 1, 1, 0, 0, 0, 0, MemType.ACC)
    program = q.synchronize()
    sim = FunctionalSimulator(APACHE)
    program.run(sim)
    assert not sim.sram("acc")[:2].any()


def test_pad_min_without_the_extension_is_rejected_by_the_simulator():
    q = CommandQueue(DEFAULT)
    src = q.alloc(4096, "src")
    q.load_2d(src, 0, 1, 1, 1, 1, 0, 0, 0, 0, MemType.INP, pad_min=True)
    program = q.synchronize()
    with pytest.raises(SimulationError, match="EXT_PAD_MIN") as err:
        program.run(FunctionalSimulator(APACHE))
    assert err.value.insn_index == 0
    assert "min)" in err.value.insn_text


def test_pad_min_in_a_store_is_rejected_by_the_simulator():
    q = CommandQueue(DEFAULT)
    out = q.alloc(4096, "out")
    q.store_2d(0, MemType.OUT, out, 0, 1, 1, 1)
    program = q.synchronize()
    store = next(x for x in program.insns if x.opcode == Opcode.STORE)
    store.pad_min = True
    with pytest.raises(SimulationError, match="LOAD flag"):
        _reencode(program).run(FunctionalSimulator(DEFAULT))


# --------------------------------------------------------------------------- compatibility

ACC_VALUES = (np.arange(64, dtype=np.int64) - 32) * 7919     # 4 accumulator elements, +-253k


def test_apache_streams_are_unchanged_by_the_extensions():
    """A program without extensions encodes and runs identically under apache and default."""
    results = []
    for cfg in (APACHE, DEFAULT):
        q = CommandQueue(cfg)
        src = q.alloc(4 * 64, "acc")
        out = q.alloc(6 * 16, "out")
        q.load_2d(src, 0, 2, 2, 2, 0, 0, 1, 0, 0, MemType.ACC)       # one zero pad after each row
        for op, imm in ((AluOp.MIN, 100), (AluOp.MAX, -100), (AluOp.SHR, 1), (AluOp.ADD, 3)):
            k = UopKernel("alu", alu_opcode=op, use_imm=True, imm=imm)
            k.loop_begin(6, 1, 1)
            k.push(0, 0)
            k.loop_end()
            q.push_alu(k)
        q.dep_push(Stage.COMPUTE, Stage.STORE)
        q.dep_pop(Stage.COMPUTE, Stage.STORE)
        q.store_2d(0, MemType.OUT, out, 0, 6, 1, 6)
        program = q.synchronize()
        program.write("acc", ACC_VALUES.astype(np.int32))
        program.run(FunctionalSimulator(cfg))
        results.append((encode_stream(cfg, program.insns), program.read("out", np.int8, (96,))))
    (bits_a, out_a), (bits_d, out_d) = results
    assert bits_a == bits_d
    np.testing.assert_array_equal(out_a, out_d)
    # and the result is the hand-computed one: rows 0-1 data row 0, row 2 zero pad, rows 3-4
    # data row 1, row 5 zero pad; min(.,100), max(.,-100), >> 1, + 3; truncated to int8
    acc = ACC_VALUES.reshape(4, 16)
    rows = np.stack([acc[0], acc[1], np.zeros(16), acc[2], acc[3], np.zeros(16)]).astype(np.int64)
    expected = (np.clip(rows, -100, 100) >> 1) + 3
    np.testing.assert_array_equal(out_a.reshape(6, 16), expected.astype(np.int8))


# --------------------------------------------------------------------------- disassembly

def test_disassembler_shows_both_extensions():
    q = CommandQueue(DEFAULT)
    src = q.alloc(4096, "src")
    q.load_2d(src, 0, 2, 1, 2, 3, 1, 1, 2, 0, MemType.INP, pad_min=True)
    q.load_2d(src, 0, 2, 1, 2, 3, 1, 1, 2, 16, MemType.INP)
    q.load_2d(src, 0, 2, 1, 2, 0, 0, 0, 0, 32, MemType.INP, pad_min=True)
    kernel = UopKernel("alu", alu_opcode=AluOp.CLIP, use_imm=True, imm=clip_imm(-128, 127))
    kernel.push(0, 0)
    q.push_alu(kernel)
    program = q.synchronize()
    for text in (program.disassemble(),
                 disassemble(DEFAULT, encode_stream(DEFAULT, program.insns))):  # from the bits
        lines = text.splitlines()
        assert "pad(y 1,2 x 3,1 min)" in lines[0]
        assert "pad(y 1,2 x 3,1)" in lines[1] and "min" not in lines[1]
        assert "pad(y 0,0 x 0,0 min)" in lines[2]
        assert any("ALU-CLIP imm [-128,127]" in line for line in lines)


def test_extension_bits_round_trip():
    insns = [MemInsn(opcode=Opcode.LOAD, memory_type=MemType.ACC, x_size=1, y_size=1, x_stride=1,
                     x_pad_0=1, pad_min=True), FinishInsn()]
    back = decode_stream(APACHE, encode_stream(APACHE, insns))
    assert back[0].pad_min is True
    assert int.from_bytes(encode_stream(DEFAULT, insns[:1]), "little") >> 58 & 1 == 1
