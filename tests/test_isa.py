"""Tests of :mod:`vta_ext.isa` (and the layouts of :mod:`vta_ext.layout`) against the reference facts.

Bit positions are typed from ``docs/vta-reference-facts.md`` §2 (tables 2.2-2.6 and the
config-dependent ALU example of §2.4) and from DESIGN.md "The ISA" (CLIP = ALU op 5, pad_min =
LOAD bit 58). Full encodings are computed by hand in the comments. Round trips use Hypothesis.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vta_ext import isa, layout
from vta_ext.config import VTAConfig, load_config
from vta_ext.isa import (AluInsn, AluOp, FieldRangeError, FinishInsn, GemmInsn, MemInsn, MemType,
                         Opcode, Uop, clip_bounds, clip_imm, decode_insn, decode_stream, disassemble,
                         encode_stream)

DEFAULT = load_config("default")
B2 = load_config("2x16x16")
W32 = load_config("1x32x32")
# facts §2.4 example, verified by compiling hw_spec.h: LOG_BATCH=1, LOG_BLOCK=5
EX24 = VTAConfig.from_dict({"LOG_BATCH": 1, "LOG_BLOCK": 5}, name="facts_2_4")


def as_int(data: bytes) -> int:
    assert isinstance(data, bytes)
    return int.from_bytes(data, "little")


# --------------------------------------------------------------------------- opcode numbering

def test_opcode_and_id_numbers():
    # facts §2.1
    assert [Opcode.LOAD, Opcode.STORE, Opcode.GEMM, Opcode.FINISH, Opcode.ALU] == [0, 1, 2, 3, 4]
    assert [MemType.UOP, MemType.WGT, MemType.INP, MemType.ACC, MemType.OUT,
            MemType.ACC_8BIT] == [0, 1, 2, 3, 4, 5]
    assert [AluOp.MIN, AluOp.MAX, AluOp.ADD, AluOp.SHR, AluOp.MUL] == [0, 1, 2, 3, 4]
    assert AluOp.CLIP == 5  # DESIGN.md extension


def test_stage_of_each_instruction_follows_facts_2_7():
    # facts §2.7: LOAD INP/WGT -> load; LOAD UOP/ACC/ACC_8BIT, GEMM, ALU, FINISH -> compute;
    # STORE -> store
    expected = {(Opcode.LOAD, MemType.INP): "LOAD", (Opcode.LOAD, MemType.WGT): "LOAD",
                (Opcode.LOAD, MemType.UOP): "COMPUTE", (Opcode.LOAD, MemType.ACC): "COMPUTE",
                (Opcode.LOAD, MemType.ACC_8BIT): "COMPUTE", (Opcode.STORE, MemType.OUT): "STORE",
                (Opcode.GEMM, None): "COMPUTE", (Opcode.ALU, None): "COMPUTE",
                (Opcode.FINISH, None): "COMPUTE"}
    for (opcode, mem), stage in expected.items():
        assert isa.stage_of(opcode, mem).name == stage, (opcode, mem)
    assert isa.insn_stage(MemInsn(opcode=Opcode.LOAD, memory_type=MemType.WGT)).name == "LOAD"
    assert isa.insn_stage(GemmInsn()).name == "COMPUTE"
    assert [s.index for s in isa.Stage] == [0, 1, 2]


def test_token_queues_follow_facts_2_7():
    # facts §2.7 (pop_prev, pop_next, push_prev, push_next) per module; None = unused (must be 0)
    expected = {"LOAD": (None, "g2l", None, "l2g"), "COMPUTE": ("l2g", "s2g", "g2l", "g2s"),
                "STORE": ("g2s", None, "s2g", None)}
    for stage in isa.Stage:
        q = isa.STAGE_QUEUES[stage]
        assert (q.pop_prev, q.pop_next, q.push_prev, q.push_next) == expected[stage.name]
    compute = isa.STAGE_QUEUES[isa.Stage.COMPUTE]
    assert compute.pops() == (("pop_prev_dep", "l2g"), ("pop_next_dep", "s2g"))
    assert compute.pushes() == (("push_prev_dep", "g2l"), ("push_next_dep", "g2s"))
    assert isa.STAGE_QUEUES[isa.Stage.LOAD].pops() == (("pop_next_dep", "g2l"),)
    assert isa.TOKEN_QUEUES == ("l2g", "g2l", "g2s", "s2g")
    assert isa.token_queue(isa.Stage.STORE, isa.Stage.COMPUTE) == "s2g"
    with pytest.raises(ValueError, match="no dependency-token queue between LOAD and STORE"):
        isa.token_queue(isa.Stage.LOAD, isa.Stage.STORE)


def test_limits_implied_by_field_widths():
    # facts §1.3: MEMOP_PAD_BIT_WIDTH 4, LOOP_ITER_WIDTH 14, ALUOP_IMM_BIT_WIDTH 16 (signed, §2.4),
    # MEMOP_SRAM_ADDR_BIT_WIDTH 16; DESIGN.md: CLIP bounds are the two int8 bytes of the immediate
    assert layout.MAX_DMA_PAD == 15
    assert layout.MAX_LOOP_EXTENT == 16383
    assert (layout.IMM_MIN, layout.IMM_MAX) == (-32768, 32767)
    assert (layout.CLIP_MIN, layout.CLIP_MAX) == (-128, 127)
    assert layout.MAX_SRAM_ENTRIES == 65536


# --------------------------------------------------------------------------- one field at a time

# (field, lsb, width), default config, typed from the facts tables
HEADER_FLAGS = [("pop_prev_dep", 3, 1), ("pop_next_dep", 4, 1), ("push_prev_dep", 5, 1),
                ("push_next_dep", 6, 1)]

MEM_FIELDS = HEADER_FLAGS + [  # facts §2.2
    ("memory_type", 7, 3), ("sram_base", 10, 16), ("dram_base", 26, 32),
    ("y_size", 64, 16), ("x_size", 80, 16), ("x_stride", 96, 16),
    ("y_pad_0", 112, 4), ("y_pad_1", 116, 4), ("x_pad_0", 120, 4), ("x_pad_1", 124, 4),
]

COMPUTE_HEAD = HEADER_FLAGS + [  # facts §2.3, shared by ALU (§2.4)
    ("reset_reg", 7, 1), ("uop_bgn", 8, 13), ("uop_end", 21, 14), ("iter_out", 35, 14),
    ("iter_in", 49, 14), ("dst_factor_out", 64, 11), ("dst_factor_in", 75, 11),
    ("src_factor_out", 86, 11), ("src_factor_in", 97, 11),
]

GEMM_FIELDS = COMPUTE_HEAD + [("wgt_factor_out", 108, 10), ("wgt_factor_in", 118, 10)]

ALU_FIELDS = COMPUTE_HEAD + [("alu_opcode", 108, 3), ("use_imm", 111, 1)]  # imm: separate test

UOP_FIELDS = [("dst_idx", 0, 11), ("src_idx", 11, 11), ("wgt_idx", 22, 10)]  # facts §2.6


def mem_zero(**kw):
    """A LOAD whose every field is zero (so the encoding is 0), with ``kw`` set."""
    return MemInsn(**{"opcode": Opcode.LOAD, "memory_type": 0, **kw})


def gemm_zero(**kw):
    return GemmInsn(**{"iter_out": 0, "iter_in": 0, **kw})


def alu_zero(**kw):
    return AluInsn(**{"iter_out": 0, "iter_in": 0, "alu_opcode": 0, **kw})


def _check_field(make, base, cfg, name, lsb, width, nbytes=16):
    top = (1 << width) - 1
    # all ones: pins lsb and (with the next check) the exact width
    assert as_int(make(**{name: top}).encode(cfg)) == base | (top << lsb)
    # a single one at the lowest bit and a distinctive pattern
    assert as_int(make(**{name: 1}).encode(cfg)) == base | (1 << lsb)
    if width >= 3:
        pattern = 0b101 << (width - 3)
        assert as_int(make(**{name: pattern}).encode(cfg)) == base | (pattern << lsb)
    assert len(make(**{name: top}).encode(cfg)) == nbytes
    with pytest.raises(FieldRangeError, match=rf"\b{name}\b"):
        make(**{name: top + 1}).encode(cfg)
    with pytest.raises(FieldRangeError, match=rf"\b{name}\b"):
        make(**{name: -1}).encode(cfg)


def test_all_zero_bases():
    assert as_int(mem_zero().encode(DEFAULT)) == 0
    assert as_int(gemm_zero().encode(DEFAULT)) == 2
    assert as_int(alu_zero().encode(DEFAULT)) == 4
    assert as_int(FinishInsn().encode(DEFAULT)) == 3
    assert as_int(Uop().encode(DEFAULT)) == 0


def test_mem_opcode_store():
    assert as_int(mem_zero(opcode=Opcode.STORE).encode(DEFAULT)) == 1


@pytest.mark.parametrize("name,lsb,width", MEM_FIELDS)
def test_mem_field_position(name, lsb, width):
    _check_field(mem_zero, 0, DEFAULT, name, lsb, width)


@pytest.mark.parametrize("name,lsb,width", GEMM_FIELDS)
def test_gemm_field_position(name, lsb, width):
    _check_field(gemm_zero, 2, DEFAULT, name, lsb, width)


@pytest.mark.parametrize("name,lsb,width", ALU_FIELDS)
def test_alu_field_position(name, lsb, width):
    _check_field(alu_zero, 4, DEFAULT, name, lsb, width)


@pytest.mark.parametrize("name,lsb,width", UOP_FIELDS)
def test_uop_field_position(name, lsb, width):
    _check_field(Uop, 0, DEFAULT, name, lsb, width, nbytes=4)


@pytest.mark.parametrize("name,lsb,width", HEADER_FLAGS)
def test_finish_flags(name, lsb, width):
    # facts §2.5: FINISH is opcode 3 with every other bit zero (flags aside)
    assert as_int(FinishInsn(**{name: True}).encode(DEFAULT)) == 3 | (1 << lsb)


def test_padding_bits_stay_zero():
    # facts §2.2: MEM padding 58-63 (58 is pad_min, tested separately); §2.3: GEMM/ALU bit 63
    mem = MemInsn(opcode=1, memory_type=7, sram_base=0xFFFF, dram_base=0xFFFFFFFF,
                  pop_prev_dep=True, pop_next_dep=True, push_prev_dep=True, push_next_dep=True)
    assert as_int(mem.encode(DEFAULT)) == ((1 << 58) - 1) & ~0b110  # opcode STORE = 0b001
    gemm = GemmInsn(pop_prev_dep=True, pop_next_dep=True, push_prev_dep=True, push_next_dep=True,
                    reset_reg=True, uop_bgn=(1 << 13) - 1, uop_end=(1 << 14) - 1,
                    iter_out=(1 << 14) - 1, iter_in=(1 << 14) - 1)
    assert as_int(gemm.encode(DEFAULT)) == ((1 << 63) - 1) & ~0b101  # opcode 2 = 0b010


# --------------------------------------------------------------------------- ALU immediate

@pytest.mark.parametrize("imm,raw", [(1, 0x0001), (0x7FFF, 0x7FFF), (-1, 0xFFFF), (-2, 0xFFFE),
                                     (-32768, 0x8000), (0x1234, 0x1234)])
def test_alu_imm_position_and_sign(imm, raw):
    # facts §2.4: imm 112-127, signed 16 bits
    insn = alu_zero(use_imm=True, imm=imm)
    word = as_int(insn.encode(DEFAULT))
    assert word == 4 | (1 << 111) | (raw << 112)
    decoded = decode_insn(DEFAULT, insn.encode(DEFAULT))
    assert decoded.imm == imm
    assert decoded.use_imm is True


@pytest.mark.parametrize("imm", [32768, -32769, 65535])
def test_alu_imm_out_of_range(imm):
    with pytest.raises(FieldRangeError, match=r"\bimm\b"):
        alu_zero(imm=imm).encode(DEFAULT)


def test_alu_imm_sign_extends_from_raw_bytes():
    # bytes with imm field 0xFFFF (bits 112-127), opcode ALU, alu_opcode ADD (2 at bit 108)
    word = 4 | (2 << 108) | (1 << 111) | (0xFFFF << 112)
    insn = decode_insn(DEFAULT, word.to_bytes(16, "little"))
    assert isinstance(insn, AluInsn)
    assert (insn.alu_opcode, insn.use_imm, insn.imm) == (AluOp.ADD, True, -1)


# --------------------------------------------------------------------------- full instructions

def test_full_load_by_hand():
    insn = MemInsn(opcode=Opcode.LOAD, memory_type=MemType.INP, sram_base=0x10, dram_base=0x1234,
                   y_size=3, x_size=5, x_stride=7, y_pad_0=1, y_pad_1=2, x_pad_0=3, x_pad_1=4,
                   pop_prev_dep=True, push_next_dep=True)
    # low word: pop_prev 1<<3 = 0x8, push_next 1<<6 = 0x40, INP 2<<7 = 0x100,
    #   sram 0x10<<10 = 0x4000, dram 0x1234<<26 = 0x48_D000_0000  -> 0x0000_0048_D000_4148
    # high word (bit 64 = bit 0): y 3, x 5<<16, stride 7<<32, y_pad_0 1<<48, y_pad_1 2<<52,
    #   x_pad_0 3<<56, x_pad_1 4<<60 -> 0x4321_0007_0005_0003
    expected = (0x4321_0007_0005_0003 << 64) | 0x0000_0048_D000_4148
    data = insn.encode(DEFAULT)
    assert as_int(data) == expected
    assert data.hex() == "484100d048000000" "0300050007002143"
    # the same bytes come from apache (bit 58 zero): decode gives the same record
    back = decode_insn(DEFAULT, bytes.fromhex("484100d0480000000300050007002143"))
    assert back == insn
    assert back.pad_min is False


def test_full_alu_by_hand():
    insn = AluInsn(uop_bgn=1, uop_end=2, iter_out=1, iter_in=1, dst_factor_in=1, src_factor_in=1,
                   alu_opcode=AluOp.SHR, use_imm=True, imm=-1)
    # low: opcode 4, uop_bgn 1<<8 = 0x100, uop_end 2<<21 = 0x40_0000, iter_out 1<<35 =
    #   0x8_0000_0000, iter_in 1<<49 = 0x2_0000_0000_0000 -> 0x0002_0008_0040_0104
    # high: dst_factor_in 1<<(75-64) = 0x800, src_factor_in 1<<(97-64) = 0x2_0000_0000,
    #   SHR 3<<(108-64) = 0x3000_0000_0000, use_imm 1<<47 = 0x8000_0000_0000,
    #   imm 0xFFFF<<48 -> 0xFFFF_B002_0000_0800
    assert as_int(insn.encode(DEFAULT)) == (0xFFFF_B002_0000_0800 << 64) | 0x0002_0008_0040_0104
    assert decode_insn(DEFAULT, insn.encode(DEFAULT)) == insn


def test_full_gemm_by_hand():
    insn = GemmInsn(reset_reg=True, uop_bgn=5, uop_end=6, iter_out=2, iter_in=3,
                    dst_factor_out=4, dst_factor_in=1, src_factor_out=2, src_factor_in=1,
                    wgt_factor_out=1, wgt_factor_in=0, pop_next_dep=True)
    # low: 2 | 1<<4 | 1<<7 | 5<<8 | 6<<21 | 2<<35 | 3<<49
    #   = 0x2 + 0x10 + 0x80 + 0x500 + 0xC0_0000 + 0x10_0000_0000 + 0x6_0000_0000_0000
    #   = 0x0006_0010_00C0_0592
    # high: 4 | 1<<11 | 2<<22 | 1<<33 | 1<<44 = 0x4 + 0x800 + 0x80_0000 + 0x2_0000_0000
    #   + 0x1000_0000_0000 = 0x0000_1002_0080_0804
    assert as_int(insn.encode(DEFAULT)) == (0x0000_1002_0080_0804 << 64) | 0x0006_0010_00C0_0592


def test_full_uop_by_hand():
    # dst 0x7FF (0-10), src 1 (11-21), wgt 0x200 (22-31): 0x7FF | 0x800 | 0x8000_0000
    assert Uop(dst_idx=0x7FF, src_idx=1, wgt_idx=0x200).encode(DEFAULT).hex() == "ff0f0080"


# --------------------------------------------------------------------------- NOPs, FINISH

def test_runtime_nops():
    # facts §2.5: compute-stage NOP = LOAD UOP x_size 0 carrying flags; store NOP = STORE UOP
    nop = MemInsn(opcode=Opcode.LOAD, memory_type=MemType.UOP, push_prev_dep=True)
    assert as_int(nop.encode(DEFAULT)) == 1 << 5
    assert nop.is_nop()
    snop = MemInsn(opcode=Opcode.STORE, memory_type=MemType.UOP, pop_prev_dep=True)
    assert as_int(snop.encode(DEFAULT)) == 1 | (1 << 3)
    assert decode_insn(DEFAULT, snop.encode(DEFAULT)) == snop


def test_finish_decodes():
    insn = decode_insn(DEFAULT, (3).to_bytes(16, "little"))
    assert isinstance(insn, FinishInsn)
    assert insn.opcode == Opcode.FINISH


@pytest.mark.parametrize("opcode", [5, 6, 7])
def test_unknown_opcode_rejected(opcode):
    with pytest.raises(ValueError):
        decode_insn(DEFAULT, opcode.to_bytes(16, "little"))


def test_wrong_lengths_rejected():
    with pytest.raises(ValueError):
        decode_insn(DEFAULT, bytes(15))
    with pytest.raises(ValueError):
        decode_stream(DEFAULT, bytes(17))
    with pytest.raises(ValueError):
        Uop.decode(DEFAULT, bytes(3))


# --------------------------------------------------------------------------- config dependence

EX24_ALU = [("dst_factor_out", 64, 9), ("dst_factor_in", 73, 9), ("src_factor_out", 82, 9),
            ("src_factor_in", 91, 9), ("alu_opcode", 100, 3), ("use_imm", 103, 1)]


@pytest.mark.parametrize("name,lsb,width", EX24_ALU)
def test_alu_layout_of_facts_example(name, lsb, width):
    # facts §2.4: LOG_BATCH=1, LOG_BLOCK=5 -> ALU factors 9 bits at 64-72, 73-81, 82-90, 91-99,
    # alu_opcode 100-102, use_imm 103, imm 104-119, padding 120-127
    _check_field(alu_zero, 4, EX24, name, lsb, width)


def test_alu_imm_of_facts_example():
    insn = alu_zero(use_imm=True, imm=-1)
    assert as_int(insn.encode(EX24)) == 4 | (1 << 103) | (0xFFFF << 104)
    full = alu_zero(dst_factor_out=511, dst_factor_in=511, src_factor_out=511, src_factor_in=511,
                    alu_opcode=7, use_imm=True, imm=-1)
    data = full.encode(EX24)
    assert data[15] == 0  # bits 120-127: padding
    assert as_int(data) >> 64 == (1 << 56) - 1
    assert decode_insn(EX24, data).imm == -1


def test_default_layout_header_unchanged_in_facts_example():
    # the first word does not depend on LOG_BATCH/LOG_BLOCK (uop depth unchanged)
    insn = gemm_zero(uop_bgn=(1 << 13) - 1, uop_end=(1 << 14) - 1)
    assert as_int(insn.encode(EX24)) == 2 | (((1 << 13) - 1) << 8) | (((1 << 14) - 1) << 21)


# --------------------------------------------------------------------------- extensions

def test_pad_min_is_bit_58():
    assert as_int(mem_zero(pad_min=True).encode(DEFAULT)) == 1 << 58
    insn = decode_insn(DEFAULT, (1 << 58).to_bytes(16, "little"))
    assert insn.pad_min is True


def test_apache_stream_decodes_with_pad_min_false():
    # a LOAD WGT with x_size 1, as apache would emit it (bit 58 zero)
    word = (1 << 7) | (1 << 80) | (1 << 64)
    insn = decode_insn(DEFAULT, word.to_bytes(16, "little"))
    assert isinstance(insn, MemInsn)
    assert insn.pad_min is False
    assert (insn.memory_type, insn.x_size, insn.y_size) == (MemType.WGT, 1, 1)


@pytest.mark.parametrize("lo,hi,imm", [
    (0, 127, 0x7F00),           # ReLU clip: hi byte 0x7F, lo byte 0x00
    (-128, 127, 0x7F80),        # int8 saturation
    (5, 5, 0x0505),             # equal bounds accepted
    (-1, -1, -1),               # 0xFFFF as a signed 16-bit value
    (-128, -128, 0x8080 - 0x10000),
    (-3, 100, 0x64FD),
])
def test_clip_imm_packing(lo, hi, imm):
    assert clip_imm(lo, hi) == imm
    assert clip_bounds(imm) == (lo, hi)


@pytest.mark.parametrize("lo,hi", [(1, 0), (127, -128), (0, -1)])
def test_clip_lo_above_hi_rejected(lo, hi):
    with pytest.raises(FieldRangeError):
        clip_imm(lo, hi)


@pytest.mark.parametrize("lo,hi", [(-129, 0), (0, 128)])
def test_clip_bounds_must_be_int8(lo, hi):
    with pytest.raises(FieldRangeError):
        clip_imm(lo, hi)


def test_clip_instruction_bytes():
    insn = alu_zero(alu_opcode=AluOp.CLIP, use_imm=True, imm=clip_imm(-3, 100))
    data = insn.encode(DEFAULT)
    assert as_int(data) == 4 | (5 << 108) | (1 << 111) | (0x64FD << 112)
    assert data[14] == 0xFD and data[15] == 100  # imm low byte = lo, high byte = hi
    assert clip_bounds(decode_insn(DEFAULT, data).imm) == (-3, 100)


@settings(max_examples=60, deadline=None)
@given(st.integers(-128, 127), st.integers(-128, 127))
def test_clip_round_trip(a, b):
    lo, hi = min(a, b), max(a, b)
    imm = clip_imm(lo, hi)
    assert -32768 <= imm <= 32767
    assert (imm & 0xFF) == (lo & 0xFF) and ((imm >> 8) & 0xFF) == (hi & 0xFF)
    assert clip_bounds(imm) == (lo, hi)


# --------------------------------------------------------------------------- disassembler

def test_disassembler_one_line_per_insn():
    prog = [
        MemInsn(opcode=Opcode.LOAD, memory_type=MemType.INP, x_size=1, y_size=1, x_stride=1),
        MemInsn(opcode=Opcode.LOAD, memory_type=MemType.UOP, push_next_dep=True),  # NOP
        GemmInsn(uop_bgn=0, uop_end=1),
        AluInsn(alu_opcode=AluOp.CLIP, use_imm=True, imm=clip_imm(0, 127), uop_end=1),
        MemInsn(opcode=Opcode.STORE, memory_type=MemType.OUT, x_size=1, y_size=1, x_stride=1),
        FinishInsn(),
    ]
    names = ["LOAD", "LOAD", "GEMM", "ALU", "STORE", "FINISH"]
    for source in (encode_stream(DEFAULT, prog), prog):
        lines = disassemble(DEFAULT, source).splitlines()
        assert len(lines) == len(prog)
        for line, name in zip(lines, names):
            assert name in line
    assert "CLIP" in disassemble(DEFAULT, prog).splitlines()[3]


# --------------------------------------------------------------------------- round trips

# hand-computed log depths (uop, inp, wgt, acc) per config, from facts §1.3 formulas:
#   default  : 15-2=13, 15-0-4-0=11, 18-4-4-0=10, 17-0-4-2=11
#   2x16x16  : 13, 15-1-4-0=10, 10, 17-1-4-2=10
#   1x32x32  : 13, 15-0-5-0=10, 20-5-5-0=10, 17-0-5-2=10
#   facts_2_4: 13, 15-1-5-0=9, 18-5-5-0=8, 17-1-5-2=9
DEPTHS = {"default": (13, 11, 10, 11), "2x16x16": (13, 10, 10, 10),
          "1x32x32": (13, 10, 10, 10), "facts_2_4": (13, 9, 8, 9)}
CONFIGS = {"default": DEFAULT, "2x16x16": B2, "1x32x32": W32, "facts_2_4": EX24}


def test_depth_table_matches_configs():
    for name, (u, i, w, a) in DEPTHS.items():
        cfg = CONFIGS[name]
        assert (cfg.log_uop_depth, cfg.log_inp_depth, cfg.log_wgt_depth, cfg.log_acc_depth) == (u, i, w, a)


def bits(n):
    return st.integers(0, (1 << n) - 1)


def flags():
    return {"pop_prev_dep": st.booleans(), "pop_next_dep": st.booleans(),
            "push_prev_dep": st.booleans(), "push_next_dep": st.booleans()}


def mem_strategy(_depths):
    return st.builds(MemInsn, opcode=st.sampled_from([0, 1]), memory_type=bits(3),
                     sram_base=bits(16), dram_base=bits(32), pad_min=st.booleans(),
                     y_size=bits(16), x_size=bits(16), x_stride=bits(16), y_pad_0=bits(4),
                     y_pad_1=bits(4), x_pad_0=bits(4), x_pad_1=bits(4), **flags())


def compute_kwargs(depths, src_depth):
    u, _, _, a = depths
    return dict(reset_reg=st.booleans(), uop_bgn=bits(u), uop_end=bits(u + 1), iter_out=bits(14),
                iter_in=bits(14), dst_factor_out=bits(a), dst_factor_in=bits(a),
                src_factor_out=bits(src_depth), src_factor_in=bits(src_depth), **flags())


def gemm_strategy(depths):
    _, i, w, _ = depths
    return st.builds(GemmInsn, wgt_factor_out=bits(w), wgt_factor_in=bits(w),
                     **compute_kwargs(depths, i))


def alu_strategy(depths):
    a = depths[3]
    return st.builds(AluInsn, alu_opcode=bits(3), use_imm=st.booleans(),
                     imm=st.integers(-32768, 32767), **compute_kwargs(depths, a))


def finish_strategy(_depths):
    return st.builds(FinishInsn, **flags())


STRATEGIES = {"mem": mem_strategy, "gemm": gemm_strategy, "alu": alu_strategy,
              "finish": finish_strategy}


@pytest.mark.parametrize("cfg_name", list(CONFIGS))
@pytest.mark.parametrize("kind", list(STRATEGIES))
def test_insn_round_trip(cfg_name, kind):
    cfg = CONFIGS[cfg_name]
    strategy = STRATEGIES[kind](DEPTHS[cfg_name])

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(strategy)
    def run(insn):
        data = insn.encode(cfg)
        assert len(data) == 16
        back = decode_insn(cfg, data)
        assert type(back) is type(insn)
        assert back == insn
        assert back.encode(cfg) == data
        assert decode_stream(cfg, encode_stream(cfg, [insn, insn])) == [insn, insn]

    run()


@pytest.mark.parametrize("cfg_name", list(CONFIGS))
def test_uop_round_trip(cfg_name):
    cfg = CONFIGS[cfg_name]
    _, i, w, a = DEPTHS[cfg_name]

    @settings(max_examples=40, deadline=None)
    @given(bits(a), bits(max(a, i)), bits(w))
    def run(dst, src, wgt):
        uop = Uop(dst_idx=dst, src_idx=src, wgt_idx=wgt)
        data = uop.encode(cfg)
        assert len(data) == 4
        assert Uop.decode(cfg, data) == uop
        # fields are packed back to back from bit 0 (they fit one 32-bit unit)
        assert as_int(data) == dst | (src << a) | (wgt << (a + max(a, i)))

    run()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, (1 << 128) - 1), st.sampled_from([0, 1]))
def test_apache_mem_words_round_trip(word, opcode):
    # any LOAD/STORE word whose padding bits 58-63 are zero is an apache instruction; decoding
    # and re-encoding reproduces it exactly
    word = (word & ~(0x3F << 58) & ~0x7) | opcode
    data = word.to_bytes(16, "little")
    insn = decode_insn(DEFAULT, data)
    assert insn.pad_min is False
    assert insn.encode(DEFAULT) == data


def test_uop_src_width_is_max_of_acc_and_inp():
    # facts §2.6: src_idx width = max(LOG_ACC_BUFF_DEPTH, LOG_INP_BUFF_DEPTH).
    # LOG_INP_BUFF_SIZE=14 -> inp depth 14-0-4-3+3 = 10 bits, acc stays 11: src_idx is 11 bits
    # (11-21), wgt_idx 22-31.
    cfg = VTAConfig.from_dict({"LOG_INP_BUFF_SIZE": 14}, name="small_inp")
    _check_field(Uop, 0, cfg, "src_idx", 11, 11, nbytes=4)
    _check_field(Uop, 0, cfg, "wgt_idx", 22, 10, nbytes=4)
    # GEMM src factors follow the inp depth (10 bits at 86-95, 96-105), wgt factors 106-115, 116-125
    _check_field(gemm_zero, 2, cfg, "src_factor_in", 96, 10)
    _check_field(gemm_zero, 2, cfg, "wgt_factor_in", 116, 10)
    # ALU src factors follow the acc depth (11 bits at 86-96, 97-107)
    _check_field(alu_zero, 4, cfg, "src_factor_in", 97, 11)


def _plain_packing(layout, record) -> bytes:
    """Reference encoder: Python-int shifts over the layout (no numpy, no grouping)."""
    word = 0
    for f in layout.fields:
        if hasattr(record, f.name):
            word |= (int(getattr(record, f.name)) & f.mask) << f.lsb
    return word.to_bytes(layout.total_bits // 8, "little")


def test_vectorised_stream_encoding_equals_plain_bit_packing():
    """encode_stream/encode_uops (numpy, grouped by record type) against plain Python shifts, on
    a random mix of records; decode_stream/decode_uops invert them; overflows are named."""
    import random

    from vta_ext.isa import decode_uops, encode_uops

    rng = random.Random(7)
    insns = []
    for _ in range(300):
        kind = rng.randrange(4)
        if kind == 0:
            insns.append(MemInsn(opcode=rng.randrange(2), memory_type=rng.randrange(6),
                                 sram_base=rng.randrange(1 << 16), dram_base=rng.randrange(1 << 32),
                                 pad_min=bool(rng.randrange(2)), y_size=rng.randrange(1 << 16),
                                 x_size=rng.randrange(1 << 16), x_stride=rng.randrange(1 << 16),
                                 x_pad_1=rng.randrange(16), push_next_dep=bool(rng.randrange(2))))
        elif kind == 1:
            insns.append(GemmInsn(reset_reg=bool(rng.randrange(2)), uop_bgn=rng.randrange(1 << 13),
                                  uop_end=rng.randrange(1 << 14), iter_out=rng.randrange(1 << 14),
                                  wgt_factor_in=rng.randrange(1 << 10), pop_prev_dep=True))
        elif kind == 2:
            insns.append(AluInsn(alu_opcode=rng.randrange(6), use_imm=True,
                                 imm=rng.randrange(-(1 << 15), 1 << 15), src_factor_in=rng.randrange(2048)))
        else:
            insns.append(FinishInsn(push_prev_dep=bool(rng.randrange(2))))
    layout_of = {MemInsn: "MEM", GemmInsn: "GEMM", AluInsn: "ALU", FinishInsn: "GEMM"}
    stream = encode_stream(DEFAULT, insns)
    assert stream == b"".join(_plain_packing(DEFAULT.layouts[layout_of[type(i)]], i)
                              for i in insns)
    assert decode_stream(DEFAULT, stream) == insns
    uops = [Uop(rng.randrange(2048), rng.randrange(2048), rng.randrange(1024)) for _ in range(50)]
    words = encode_uops(DEFAULT, uops)
    assert words == b"".join(_plain_packing(DEFAULT.layouts["UOP"], u) for u in uops)
    assert decode_uops(DEFAULT, words) == uops
    with pytest.raises(FieldRangeError, match=r"GEMM\.iter_in = 16384 of instruction 1 "):
        encode_stream(DEFAULT, [FinishInsn(), GemmInsn(iter_in=1 << 14)])


def test_clip_alu_ops_one_rule_for_every_clip():
    """CLIP [lo, hi] packs lo in the low byte, hi in the high byte (docs/isa.md); MIN/MAX otherwise."""
    from vta_ext.isa import clip_alu_ops

    assert clip_alu_ops(True, 0, 127) == [(AluOp.CLIP, 127 * 256)]
    assert clip_alu_ops(True, -128, 127) == [(AluOp.CLIP, 0x7F80)]
    assert clip_alu_ops(True, -1, -1) == [(AluOp.CLIP, -1)]                 # 0xFFFF as int16
    assert clip_alu_ops(False, 0, 127) == [(AluOp.MIN, 127), (AluOp.MAX, 0)]
    assert clip_alu_ops(True, -200, 100) == [(AluOp.MIN, 100), (AluOp.MAX, -200)]  # not int8
    with pytest.raises(FieldRangeError, match="clip bound 40000 does not fit the 16-bit"):
        clip_alu_ops(True, 0, 40000)
