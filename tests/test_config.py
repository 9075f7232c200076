"""Tests of :mod:`vta_ext.config` against the reference facts.

Every expected number below is typed from ``docs/vta-reference-facts.md`` §1 (tables 1.1-1.3,
SRAM banking of 1.2) or computed by hand from the formulas there (the arithmetic is written in the
comments). Nothing is recomputed with the code under test.
"""
from __future__ import annotations

import dataclasses
import json
import re

import pytest

from vta_ext.config import CONFIG_DIR, ConfigError, VTAConfig, available_configs, load_config
from vta_ext.isa import MemType
from vta_ext.memory import scratchpad, scratchpad_of_scope, scratchpads


@pytest.fixture(scope="module")
def default():
    return load_config("default")


# --------------------------------------------------------------------------- the default config

# facts §1.1: keys of vta_config.json and their defaults (+ the project's timing keys)
FACTS_DEFAULT_KEYS = {
    "TARGET": "sim",
    "HW_VER": "0.0.2",
    "LOG_INP_WIDTH": 3,
    "LOG_WGT_WIDTH": 3,
    "LOG_ACC_WIDTH": 5,
    "LOG_BATCH": 0,
    "LOG_BLOCK": 4,
    "LOG_UOP_BUFF_SIZE": 15,
    "LOG_INP_BUFF_SIZE": 15,
    "LOG_WGT_BUFF_SIZE": 18,
    "LOG_ACC_BUFF_SIZE": 17,
}


def test_default_json_holds_the_apache_defaults():
    data = json.loads((CONFIG_DIR / "default.json").read_text())
    for key, value in FACTS_DEFAULT_KEYS.items():
        assert data[key] == value, key
    # facts §1.2: log bus width 6 for sim
    assert data["LOG_BUS_WIDTH"] == 6


def test_default_keys(default):
    assert default.TARGET == "sim"
    assert default.HW_VER == "0.0.2"
    assert (default.LOG_INP_WIDTH, default.LOG_WGT_WIDTH, default.LOG_ACC_WIDTH) == (3, 3, 5)
    assert default.LOG_BATCH == 0
    # facts §1.2: LOG_BLOCK_IN = LOG_BLOCK_OUT = LOG_BLOCK = 4
    assert (default.LOG_BLOCK_IN, default.LOG_BLOCK_OUT) == (4, 4)
    assert default.LOG_OUT_WIDTH == 3
    assert default.LOG_OUT_BUFF_SIZE == 15
    assert default.LOG_BUS_WIDTH == 6


def test_default_equals_dataclass_defaults(default):
    assert VTAConfig().to_dict() == default.to_dict()


def test_default_widths_and_shape(default):
    # facts §1.3
    assert (default.INP_WIDTH, default.WGT_WIDTH, default.OUT_WIDTH, default.ACC_WIDTH) == (8, 8, 8, 32)
    assert (default.BATCH, default.BLOCK_IN, default.BLOCK_OUT) == (1, 16, 16)


def test_default_buffer_sizes(default):
    assert default.UOP_BUFF_SIZE == 32768
    assert default.INP_BUFF_SIZE == 32768
    assert default.WGT_BUFF_SIZE == 262144
    assert default.ACC_BUFF_SIZE == 131072
    assert default.OUT_BUFF_SIZE == 32768  # 2**15


def test_default_matrix_widths(default):
    assert default.INP_MATRIX_WIDTH == 128
    assert default.WGT_MATRIX_WIDTH == 2048
    assert default.ACC_MATRIX_WIDTH == 512
    assert default.OUT_MATRIX_WIDTH == 128


def test_default_axi_ratios(default):
    assert default.BUS_WIDTH == 64
    assert default.INP_MAT_AXI_RATIO == 2
    assert default.WGT_MAT_AXI_RATIO == 32
    assert default.ACC_MAT_AXI_RATIO == 8
    assert default.OUT_MAT_AXI_RATIO == 2


def test_default_elem_bytes(default):
    assert default.INS_ELEM_BYTES == 16
    assert default.UOP_ELEM_BYTES == 4
    assert default.inp_elem_bytes == 16
    assert default.wgt_elem_bytes == 256
    assert default.acc_elem_bytes == 64
    assert default.out_elem_bytes == 16
    # by memory id (facts §2.1: UOP=0, WGT=1, INP=2, ACC=3, OUT=4, ACC_8BIT=5); ACC_8BIT elements
    # are 16 bytes in DRAM (facts §3.2)
    assert [default.elem_bytes(m) for m in range(6)] == [4, 256, 16, 64, 16, 16]
    with pytest.raises(ConfigError):
        default.elem_bytes(6)


def test_default_depths(default):
    assert (default.uop_depth, default.log_uop_depth) == (8192, 13)
    assert (default.inp_depth, default.log_inp_depth) == (2048, 11)
    assert (default.wgt_depth, default.log_wgt_depth) == (1024, 10)
    assert (default.acc_depth, default.log_acc_depth) == (2048, 11)


def test_default_scratchpads(default):
    # facts §1.3 (depths, element bytes, buffer sizes), §3.1 (lane order and types of the SRAMs)
    # and the intrinsic scopes of the original stack (facts §1.4)
    pads = scratchpads(default)
    assert list(pads) == [MemType.UOP, MemType.WGT, MemType.INP, MemType.ACC]
    expected = {  # mem: (name, scope, depth, entry bytes, size, lane shape, dtype)
        MemType.UOP: ("uop", None, 8192, 4, 32768, (1,), "uint32"),
        MemType.WGT: ("wgt", "local.wgt_buffer", 1024, 256, 262144, (16, 16), "int8"),
        MemType.INP: ("inp", "local.inp_buffer", 2048, 16, 32768, (1, 16), "int8"),
        MemType.ACC: ("acc", "local.acc_buffer", 2048, 64, 131072, (1, 16), "int32"),
    }
    for mem, (name, scope, depth, entry, size, shape, dtype) in expected.items():
        sp = scratchpad(default, mem)
        assert sp is pads[mem]
        assert (sp.name, sp.scope, sp.depth, sp.entry_bytes, sp.size_bytes, sp.lane_shape,
                sp.dtype) == (name, scope, depth, entry, size, shape, dtype), name
    # pad-with-minimum lanes (DESIGN.md, extension): -128 for int8, INT32_MIN, 0x80000000 for uops
    assert [pads[m].pad_min_value for m in pads] == [0x80000000, -128, -128, -2147483648]
    assert scratchpad_of_scope(default, "local.acc_buffer") is pads[MemType.ACC]
    with pytest.raises(KeyError, match="local.out_buffer"):
        scratchpad_of_scope(default, "local.out_buffer")
    with pytest.raises(KeyError, match="STORE of OUT reads ACC"):
        scratchpad(default, MemType.OUT)


def test_scratchpads_of_the_2x16x16_preset():
    # depths inp 15-1-4-3+3 = 10, wgt 18-4-4-3+3 = 10, acc 17-1-4-5+3 = 10 (see test_preset_2x16x16)
    pads = scratchpads(load_config("2x16x16"))
    assert [(p.depth, p.entry_bytes, p.lane_shape) for p in pads.values()] == [
        (8192, 4, (1,)), (1024, 256, (16, 16)), (1024, 32, (2, 16)), (1024, 128, (2, 16))]


def test_default_names(default):
    assert default.bitstream == "1x16_i8w8a32_15_15_18_17"
    assert default.MODEL == "sim_1x16_i8w8a32_15_15_18_17"


def test_default_sram_banking(default):
    # facts §1.2: inp 128-bit, 1 bank, depth 2048, ratio 2; wgt 2048-bit, 2 banks, width 1024,
    # depth 1024, ratio 16; out 128-bit, 1 bank, depth 2048, ratio 2
    assert default.sram_banking("inp") == {"bus_width": 128, "banks": 1, "width": 128,
                                           "depth": 2048, "axi_ratio": 2}
    assert default.sram_banking("wgt") == {"bus_width": 2048, "banks": 2, "width": 1024,
                                           "depth": 1024, "axi_ratio": 16}
    assert default.sram_banking("out") == {"bus_width": 128, "banks": 1, "width": 128,
                                           "depth": 2048, "axi_ratio": 2}


# --------------------------------------------------------------------------- LOG_BLOCK handling

def test_log_block_sets_both():
    cfg = VTAConfig.from_dict({"LOG_BLOCK": 5})
    assert (cfg.LOG_BLOCK_IN, cfg.LOG_BLOCK_OUT) == (5, 5)
    assert (cfg.BLOCK_IN, cfg.BLOCK_OUT) == (32, 32)
    # depths: inp 15-0-5-3+3 = 10, wgt 18-5-5-3+3 = 8, acc 17-0-5-5+3 = 10
    assert (cfg.log_inp_depth, cfg.log_wgt_depth, cfg.log_acc_depth) == (10, 8, 10)
    # LOG_BLOCK 3 with default buffers needs 12-bit factors: 6*12 = 72 bits > 64 -> rejected
    with pytest.raises(ConfigError, match="factor"):
        VTAConfig.from_dict({"LOG_BLOCK": 3})


def test_block_in_and_out_separately():
    cfg = VTAConfig.from_dict({"LOG_BLOCK_IN": 4, "LOG_BLOCK_OUT": 5})
    assert (cfg.BLOCK_IN, cfg.BLOCK_OUT) == (16, 32)
    assert cfg.INP_MATRIX_WIDTH == 8 * 1 * 16
    assert cfg.WGT_MATRIX_WIDTH == 8 * 32 * 16
    assert cfg.ACC_MATRIX_WIDTH == 32 * 1 * 32
    assert cfg.OUT_MATRIX_WIDTH == 8 * 1 * 32
    # inp 15-0-4-3+3 = 11, wgt 18-5-4-3+3 = 9, acc 17-0-5-5+3 = 10
    assert (cfg.log_inp_depth, cfg.log_wgt_depth, cfg.log_acc_depth) == (11, 9, 10)


# --------------------------------------------------------------------------- presets

def test_presets_listed_and_load_by_name():
    names = available_configs()
    for name in ("default", "2x16x16", "1x32x32"):
        assert name in names
        cfg = load_config(name)
        assert isinstance(cfg, VTAConfig)
        assert cfg.name == name


def test_load_config_passes_configs_and_paths_through(default):
    assert load_config(default) is default
    assert load_config(CONFIG_DIR / "2x16x16.json").BATCH == 2


@pytest.mark.parametrize("name", ["2x16x16", "1x32x32"])
def test_presets_have_the_keys_of_default(name):
    keys = set(json.loads((CONFIG_DIR / "default.json").read_text()))
    assert set(json.loads((CONFIG_DIR / f"{name}.json").read_text())) == keys


def test_preset_2x16x16():
    cfg = load_config("2x16x16")
    assert (cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT) == (2, 16, 16)
    # matrix widths: inp 8*2*16, wgt 8*16*16, acc 32*2*16, out 8*2*16
    assert (cfg.INP_MATRIX_WIDTH, cfg.WGT_MATRIX_WIDTH, cfg.ACC_MATRIX_WIDTH,
            cfg.OUT_MATRIX_WIDTH) == (256, 2048, 1024, 256)
    assert (cfg.inp_elem_bytes, cfg.wgt_elem_bytes, cfg.acc_elem_bytes,
            cfg.out_elem_bytes) == (32, 256, 128, 32)
    # default byte sizes; depths inp 15-1-4-3+3 = 10, wgt 18-4-4-3+3 = 10, acc 17-1-4-5+3 = 10
    assert (cfg.LOG_UOP_BUFF_SIZE, cfg.LOG_INP_BUFF_SIZE, cfg.LOG_WGT_BUFF_SIZE,
            cfg.LOG_ACC_BUFF_SIZE) == (15, 15, 18, 17)
    assert (cfg.log_uop_depth, cfg.log_inp_depth, cfg.log_wgt_depth, cfg.log_acc_depth) == (13, 10, 10, 10)
    assert (cfg.uop_depth, cfg.inp_depth, cfg.wgt_depth, cfg.acc_depth) == (8192, 1024, 1024, 1024)
    # bus 64: 256/64, 2048/64, 1024/64, 256/64
    assert (cfg.INP_MAT_AXI_RATIO, cfg.WGT_MAT_AXI_RATIO, cfg.ACC_MAT_AXI_RATIO,
            cfg.OUT_MAT_AXI_RATIO) == (4, 32, 16, 4)
    assert cfg.bitstream == "2x16_i8w8a32_15_15_18_17"
    assert cfg.MODEL == "sim_2x16_i8w8a32_15_15_18_17"
    assert cfg.sram_banking("inp") == {"bus_width": 256, "banks": 1, "width": 256,
                                       "depth": 1024, "axi_ratio": 4}
    assert cfg.sram_banking("out") == {"bus_width": 256, "banks": 1, "width": 256,
                                       "depth": 1024, "axi_ratio": 4}


def test_preset_1x32x32():
    cfg = load_config("1x32x32")
    assert (cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT) == (1, 32, 32)
    assert (cfg.INP_MATRIX_WIDTH, cfg.WGT_MATRIX_WIDTH, cfg.ACC_MATRIX_WIDTH,
            cfg.OUT_MATRIX_WIDTH) == (256, 8192, 1024, 256)
    assert (cfg.inp_elem_bytes, cfg.wgt_elem_bytes, cfg.acc_elem_bytes,
            cfg.out_elem_bytes) == (32, 1024, 128, 32)
    # inp/acc/uop keep the default byte sizes; the weight buffer is 1 MiB so that it keeps the
    # default's 1024 entries: wgt 20-5-5-3+3 = 10, inp 15-0-5-3+3 = 10, acc 17-0-5-5+3 = 10
    assert (cfg.LOG_UOP_BUFF_SIZE, cfg.LOG_INP_BUFF_SIZE, cfg.LOG_WGT_BUFF_SIZE,
            cfg.LOG_ACC_BUFF_SIZE) == (15, 15, 20, 17)
    assert cfg.WGT_BUFF_SIZE == 1048576
    assert (cfg.uop_depth, cfg.inp_depth, cfg.wgt_depth, cfg.acc_depth) == (8192, 1024, 1024, 1024)
    # wide memory: 32 bytes per cycle, a 256-bit bus
    assert cfg.MEM_BYTES_PER_CYCLE == 32
    assert cfg.BUS_WIDTH == 256
    assert (cfg.INP_MAT_AXI_RATIO, cfg.WGT_MAT_AXI_RATIO, cfg.ACC_MAT_AXI_RATIO,
            cfg.OUT_MAT_AXI_RATIO) == (1, 32, 4, 1)
    assert cfg.bitstream == "1x32_i8w8a32_15_15_20_17"
    assert cfg.MODEL == "sim_1x32_i8w8a32_15_15_20_17"
    # wgt: 8192-bit bus -> 8 banks of 1024, depth 2**20*8/8192 = 1024, ratio 1024/256 = 4
    assert cfg.sram_banking("wgt") == {"bus_width": 8192, "banks": 8, "width": 1024,
                                       "depth": 1024, "axi_ratio": 4}


# --------------------------------------------------------------------------- rejection

@pytest.mark.parametrize("key", ["LOG_BATCH", "LOG_WGT_BUFF_SIZE", "GEMM_CYCLES_PER_UOP",
                                 "MEM_BYTES_PER_CYCLE"])
@pytest.mark.parametrize("bad", ["4", 4.0, True, None, [4]])
def test_non_integer_values_rejected(key, bad):
    with pytest.raises(ConfigError, match=rf"\b{key}\b"):
        VTAConfig.from_dict({key: bad})


@pytest.mark.parametrize("bad", ["5", 5.0, True])
def test_non_integer_log_block_rejected_naming_log_block(bad):
    # the user wrote LOG_BLOCK, so the error must name LOG_BLOCK (not only LOG_BLOCK_IN)
    with pytest.raises(ConfigError, match=r"\bLOG_BLOCK\b"):
        VTAConfig.from_dict({"LOG_BLOCK": bad})


def test_non_integer_in_json_file_rejected(tmp_path):
    path = tmp_path / "strcfg.json"
    path.write_text(json.dumps({"LOG_BATCH": "1"}))
    with pytest.raises(ConfigError, match=r"\bLOG_BATCH\b"):
        load_config(path)


def test_non_integer_direct_construction_rejected():
    with pytest.raises(ConfigError, match=r"\bLOG_INP_BUFF_SIZE\b"):
        VTAConfig(LOG_INP_BUFF_SIZE=15.0)


def test_negative_value_rejected():
    with pytest.raises(ConfigError, match=r"\bLOG_BATCH\b"):
        VTAConfig.from_dict({"LOG_BATCH": -1})


def test_unknown_key_rejected():
    with pytest.raises(ConfigError, match="LOG_BACTH"):
        VTAConfig.from_dict({"LOG_BACTH": 1})


@pytest.mark.parametrize("key,value", [("LOG_INP_WIDTH", 4), ("LOG_WGT_WIDTH", 2),
                                       ("LOG_ACC_WIDTH", 4), ("LOG_ACC_WIDTH", 6)])
def test_widths_other_than_8_8_32_rejected(key, value):
    with pytest.raises(ConfigError, match=rf"\b{key}\b"):
        VTAConfig.from_dict({key: value})


def test_uop_buffer_16_overflows_gemm():
    # facts §1.5: LOG_UOP_BUFF_SIZE=16 pushes GEMM/ALU fields past bit 128.
    # By hand with the C rule: log uop depth 16-5+3 = 14 -> uop_bgn 8-21, uop_end (15) 22-36,
    # iter_out 37-50, iter_in (14) would be 51-64, crosses bit 64 -> 64-77; dst_factor_out 78-88,
    # dst_factor_in 89-99, src_factor_out 100-110, src_factor_in 111-121; wgt_factor_out (10 bits)
    # would be 122-131, crosses 128 -> first GEMM field out of the word. (ALU: alu_opcode 122-124,
    # use_imm 125, imm 126-141 -> also out.)
    with pytest.raises(ConfigError, match=r"wgt_factor_out"):
        VTAConfig.from_dict({"LOG_UOP_BUFF_SIZE": 16})


# small input, weight and accumulator buffers leave room in the instruction words for a large
# micro-op buffer: log depths inp 12-0-4-3+3 = 8, wgt 16-4-4-3+3 = 8, acc 13-0-4-5+3 = 7
SMALL_DATA_BUFFERS = {"LOG_INP_BUFF_SIZE": 12, "LOG_WGT_BUFF_SIZE": 16, "LOG_ACC_BUFF_SIZE": 13}


def test_uop_depth_beyond_sram_base_rejected_naming_the_field():
    # LOG_UOP_BUFF_SIZE 19 -> 19-5+3 = 17-bit uop depth, 131072 entries; the 16-bit sram_base of a
    # LOAD UOP (facts §2.2) reaches only 65536 of them. The instruction words still fit: uop_bgn
    # 8-24, uop_end (18) 25-42, iter_out 43-56, iter_in 64-77; GEMM factors 78-84, 85-91, 92-99,
    # 100-107, 108-115, 116-123; ALU factors 78-105, alu_opcode 106-108, use_imm 109, imm 110-125.
    with pytest.raises(ConfigError, match=r"LOG_UOP_BUFF_SIZE=19 .*MEM\.sram_base.* at most 18"):
        VTAConfig.from_dict({"LOG_UOP_BUFF_SIZE": 19, **SMALL_DATA_BUFFERS})
    with pytest.raises(ConfigError, match=r"MEM\.sram_base"):
        VTAConfig.from_dict({"LOG_UOP_BUFF_SIZE": 19})


def test_uop_depth_that_sram_base_reaches_accepted():
    # LOG_UOP_BUFF_SIZE 18 -> 16-bit depth: exactly the 65536 entries sram_base addresses
    cfg = VTAConfig.from_dict({"LOG_UOP_BUFF_SIZE": 18, **SMALL_DATA_BUFFERS})
    assert cfg.uop_depth == 65536


def test_alu_only_overflow_names_imm():
    # LOG_ACC_BUFF_SIZE=18 -> acc depth 18-0-4-5+3 = 12 bits; LOG_WGT_BUFF_SIZE=16 -> wgt 16-4-4-3+3 = 8.
    # GEMM word 2: 12+12+11+11+8+8 = 62 bits, fits (64-125).
    # ALU word 2: dst 64-75, 76-87, src 88-99, 100-111, alu_opcode 112-114, use_imm 115,
    # imm (16) would be 116-131 -> overflow in the imm field only.
    # UOP: dst 0-11, src 12-23, wgt 24-31 fits.
    with pytest.raises(ConfigError, match=r"\bimm\b"):
        VTAConfig.from_dict({"LOG_ACC_BUFF_SIZE": 18, "LOG_WGT_BUFF_SIZE": 16})


def test_uop_overflow_rejected():
    # acc 11, inp 14-0-4-3+3 = 10, wgt 19-4-4-3+3 = 11: the instructions fit exactly
    # (GEMM word 2: 11+11+10+10+11+11 = 64; ALU: 4*11+3+1+16 = 64) but the uop needs
    # dst 0-10, src 11-21, wgt (11 bits) 22-32 -> beyond 32 bits.
    with pytest.raises(ConfigError, match=r"wgt_idx"):
        VTAConfig.from_dict({"LOG_WGT_BUFF_SIZE": 19, "LOG_INP_BUFF_SIZE": 14})


def test_big_buffers_rejected():
    with pytest.raises(ConfigError, match=r"factor|idx|imm"):
        VTAConfig.from_dict({"LOG_INP_BUFF_SIZE": 20, "LOG_WGT_BUFF_SIZE": 22,
                             "LOG_ACC_BUFF_SIZE": 22})


def test_element_larger_than_a_page_rejected():
    # facts §1.5: element sizes must not exceed the 4096-byte page; LOG_BLOCK 7 -> 128x128 int8
    # weights = 16384 bytes
    with pytest.raises(ConfigError, match="WGT"):
        VTAConfig.from_dict({"LOG_BLOCK": 7})


def test_invalid_json_file_rejected(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"LOG_BATCH": 1,')
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_config(path)


def test_json_that_is_not_an_object_rejected(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError):
        load_config(path)


def test_unknown_preset_rejected():
    with pytest.raises(ConfigError, match="no_such_preset"):
        load_config("no_such_preset")


def test_config_is_immutable(default):
    with pytest.raises(dataclasses.FrozenInstanceError, match="LOG_BATCH"):
        default.LOG_BATCH = 1
