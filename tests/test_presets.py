"""Configuration presets: each loads, validates, lists every key, and has the documented values.

The expected values are typed here by hand from DESIGN.md ("The cycle model") and the facts file
§6: original Chisel GEMM 4 cycles per uop, ALU 5 (immediate) / 6 (vector); pipelined GEMM II 1,
ALU II 1 / 2; a 64-bit memory bus (8 bytes per cycle) unless the preset is wide; the Intel fsim's 4
cycles of DMA overhead per transfer. ``docs/isa.md`` carries the same table, which is checked too.
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from vta_ext.config import _TIMING_KEYS as _TIMING
from vta_ext.config import CONFIG_DIR, VTAConfig, available_configs, load_config
from vta_ext.isa import AluOp, MemType, Stage
from vta_ext.runtime import CommandQueue, UopKernel
from vta_ext.sim.cycles import CycleModel

DOC = Path(__file__).resolve().parents[1] / "docs" / "isa.md"

#: name -> (BATCH, BLOCK_IN, BLOCK_OUT), (LOG_UOP/INP/WGT/ACC_BUFF_SIZE), LOG_BUS_WIDTH,
#: (GEMM, ALU imm, ALU vec cycles per uop), bytes per cycle, DMA overhead, issue cycles, MHz,
#: (EXT_CLIP, EXT_PAD_MIN)
PRESETS = {
    "default": ((1, 16, 16), (15, 15, 18, 17), 6, (4, 5, 6), 8, 4, 1, 100, (True, True)),
    "apache": ((1, 16, 16), (15, 15, 18, 17), 6, (4, 5, 6), 8, 4, 1, 100, (False, False)),
    # the Pynq HLS design: apache's ISA and geometry; timing fitted on its RTL (docs/isa.md)
    "pynq": ((1, 16, 16), (15, 15, 18, 17), 6, (1, 2, 2), 8, 0, 0, 100, (False, False)),
    "pipelined": ((1, 16, 16), (15, 15, 18, 17), 6, (1, 1, 2), 8, 4, 1, 100, (True, True)),
    "2x16x16": ((2, 16, 16), (15, 15, 18, 17), 6, (4, 5, 6), 8, 4, 1, 100, (True, True)),
    "1x32x32": ((1, 32, 32), (15, 15, 20, 17), 8, (4, 5, 6), 32, 4, 1, 100, (True, True)),
    "1x32x32_pipelined": ((1, 32, 32), (15, 15, 20, 17), 8, (1, 1, 2), 32, 4, 1, 100,
                          (True, True)),
}


def test_the_presets_are_exactly_the_documented_ones():
    assert available_configs() == sorted(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_lists_every_key(name):
    data = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    keys = set(data)
    if "LOG_BLOCK" in keys:  # the apache spelling of LOG_BLOCK_IN = LOG_BLOCK_OUT
        keys = (keys - {"LOG_BLOCK"}) | {"LOG_BLOCK_IN", "LOG_BLOCK_OUT"}
    assert keys == {f.name for f in dataclasses.fields(VTAConfig)} - {"name"}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_values(name):
    shape, sizes, log_bus, (gemm, alu_imm, alu_vec), bpc, dma, issue, mhz, exts = PRESETS[name]
    cfg = load_config(name)
    assert cfg.name == name
    assert (cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT) == shape
    assert (cfg.LOG_UOP_BUFF_SIZE, cfg.LOG_INP_BUFF_SIZE, cfg.LOG_WGT_BUFF_SIZE,
            cfg.LOG_ACC_BUFF_SIZE) == sizes
    assert cfg.LOG_BUS_WIDTH == log_bus
    assert (cfg.GEMM_CYCLES_PER_UOP, cfg.ALU_CYCLES_PER_UOP_IMM, cfg.ALU_CYCLES_PER_UOP_VEC) == \
        (gemm, alu_imm, alu_vec)
    assert cfg.MEM_BYTES_PER_CYCLE == bpc
    # the model's memory bandwidth is the bus width of the preset
    assert cfg.MEM_BYTES_PER_CYCLE * 8 == cfg.BUS_WIDTH
    assert (cfg.DMA_OVERHEAD_CYCLES, cfg.INSN_ISSUE_CYCLES, cfg.CLOCK_MHZ) == (dma, issue, mhz)
    assert (cfg.EXT_CLIP, cfg.EXT_PAD_MIN) == exts
    # validation also holds for the dataclass built from the same keys
    assert VTAConfig.from_dict(cfg.to_dict(), name=name) == cfg


def test_apache_is_default_without_extensions():
    default, apache = load_config("default").to_dict(), load_config("apache").to_dict()
    assert {k for k in default if default[k] != apache[k]} == {"EXT_CLIP", "EXT_PAD_MIN"}
    # and the instruction layouts are the same, bit for bit
    assert load_config("default").layouts == load_config("apache").layouts


def test_pynq_is_apache_without_acc8_and_mul_and_with_the_hazard_contract():
    """The facts of ../shared/vta-hw/README.md: the HLS design ignores LOAD ACC_8BIT and ALU MUL,
    and needs 3 micro-ops between two GEMM writes of one accumulator row (README); ALU needs 3 as well (measured here, tests/test_hazard.py: the README says 2)."""
    apache, pynq = load_config("apache"), load_config("pynq")
    assert (pynq.ISA_ACC_8BIT_LOAD, pynq.ISA_ALU_MUL) == (False, False)
    assert (pynq.ACC_DEP_DISTANCE_GEMM, pynq.ACC_DEP_DISTANCE_ALU) == (3, 3)
    assert (apache.ISA_ACC_8BIT_LOAD, apache.ISA_ALU_MUL) == (True, True)
    assert (apache.ACC_DEP_DISTANCE_GEMM, apache.ACC_DEP_DISTANCE_ALU) == (1, 1)
    assert pynq.layouts == apache.layouts
    a, p = apache.to_dict(), pynq.to_dict()
    differ = {k for k in a if a[k] != p[k]}
    assert differ - set(_TIMING) == {"TARGET", "ISA_ACC_8BIT_LOAD", "ISA_ALU_MUL",
                                     "ACC_DEP_DISTANCE_GEMM", "ACC_DEP_DISTANCE_ALU"}


@pytest.mark.parametrize("slow,fast", [("default", "pipelined"), ("1x32x32", "1x32x32_pipelined")])
def test_pipelined_differs_only_in_the_compute_timing(slow, fast):
    a, b = load_config(slow).to_dict(), load_config(fast).to_dict()
    assert {k for k in a if a[k] != b[k]} == {"GEMM_CYCLES_PER_UOP", "ALU_CYCLES_PER_UOP_IMM",
                                              "ALU_CYCLES_PER_UOP_VEC"}


def test_doc_table_matches_the_presets():
    text = DOC.read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 11 and cells[0] in PRESETS:
            rows[cells[0]] = cells[1:]
    assert set(rows) == set(PRESETS)
    for name, cells in rows.items():
        shape, _, _, (gemm, alu_imm, alu_vec), bpc, dma, issue, mhz, (clip, pad) = PRESETS[name]
        expected = ["x".join(map(str, shape)), gemm, alu_imm, alu_vec, bpc, dma, issue, mhz,
                    "yes" if clip else "no", "yes" if pad else "no"]
        assert cells == [str(e) for e in expected], name


# --------------------------------------------------------------------------- cycle model

def small_program(cfg):
    """LOAD inp (4 elements), LOAD wgt (4), GEMM 4 uop-iterations, ALU SHR imm, ALU ADD vector,
    STORE 1 element."""
    q = CommandQueue(cfg)
    inp = q.alloc(4 * cfg.inp_elem_bytes, "inp")
    wgt = q.alloc(4 * cfg.wgt_elem_bytes, "wgt")
    out = q.alloc(cfg.out_elem_bytes, "out")
    q.load_2d(inp, 0, 4, 1, 4, 0, 0, 0, 0, 0, MemType.INP)
    q.load_2d(wgt, 0, 4, 1, 4, 0, 0, 0, 0, 0, MemType.WGT)
    q.dep_push(Stage.LOAD, Stage.COMPUTE)
    q.dep_pop(Stage.LOAD, Stage.COMPUTE)
    gemm = UopKernel("gemm")
    gemm.loop_begin(4, 0, 1, 1)
    gemm.push(0, 0, 0)
    gemm.loop_end()
    q.push_gemm(gemm)
    shr = UopKernel("alu", alu_opcode=AluOp.SHR, use_imm=True, imm=2)
    shr.push(0, 0)
    q.push_alu(shr)
    add = UopKernel("alu", alu_opcode=AluOp.ADD)
    add.push(0, 1)
    q.push_alu(add)
    q.dep_push(Stage.COMPUTE, Stage.STORE)
    q.dep_pop(Stage.COMPUTE, Stage.STORE)
    q.store_2d(0, MemType.OUT, out, 0, 1, 1, 1)
    return q.synchronize()


def test_pipelined_is_faster_than_default_by_the_hand_computed_amount():
    default, pipelined = load_config("default"), load_config("pipelined")
    program = small_program(default)
    slow = CycleModel(default).run_program(program)
    fast = CycleModel(pipelined).run_program(program)
    # loads are the same: inp 1 + 4 + 64/8 = 13, wgt 1 + 4 + 1024/8 = 133 -> compute starts at 146.
    # compute: 3 uop loads of 1 + 4 + ceil(4/8) = 6 each; GEMM 1 + 4*4 = 17 (pipelined 1 + 4*1 = 5);
    # SHR imm 1 + 5 = 6 (1 + 1 = 2); ADD vec 1 + 6 = 7 (1 + 2 = 3); then the store 1 + 4 + 16/8 = 7,
    # the closing compute NOP (1) and FINISH (1).
    assert slow.modules["compute"].busy == 3 * 6 + 17 + 6 + 7 + 1 + 1
    assert fast.modules["compute"].busy == 3 * 6 + 5 + 2 + 3 + 1 + 1
    assert slow.total_cycles == 146 + (3 * 6 + 17 + 6 + 7) + 7 + 1 + 1
    assert fast.total_cycles == 146 + (3 * 6 + 5 + 2 + 3) + 7 + 1 + 1
    assert fast.total_cycles < slow.total_cycles


def test_wide_pipelined_is_never_slower_than_wide():
    wide, fast = load_config("1x32x32"), load_config("1x32x32_pipelined")
    program = small_program(wide)
    slow_report = CycleModel(wide).run_program(program)
    fast_report = CycleModel(fast).run_program(program)
    assert fast_report.total_cycles <= slow_report.total_cycles
    # same saving on the compute module as for 1x16x16: GEMM 12, SHR 4, ADD 4 cycles
    assert slow_report.modules["compute"].busy - fast_report.modules["compute"].busy == 12 + 4 + 4
