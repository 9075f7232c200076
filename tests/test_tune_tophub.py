"""The original stack's tuned records (TopHub ``vta_v0.10.log``) apply as they are.

The log lines are read here with plain ``json`` and translated by hand (workload from the packed
shapes, knob = inner split factor), independently of ``tvm_csp_embed.tune.autotvm_log``; ResNet-18
C2-C11 are the layers of facts §7.2. The counters of the programs built with the original's knobs
are compared with a computation from the knobs of what the original schedule does: per output tile
(``tile_h x tile_w`` outputs, ``tile_co`` channel blocks) and input-channel step it loads the
``tile_ci`` input blocks of the tile's window (clipped to the image) and the weight tile and runs
one GEMM; per tile it resets the accumulator, loads the bias, runs the ALU stages and stores once.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from vta_ext.config import load_config
from vta_ext.isa import MemType, Opcode
from vta_ext.sim import FunctionalSimulator
from vta_ext.strategy import get_template

from conftest import conv2d_nchw, pack_nchw, requantize, unpack_nchw
from tvm_csp_embed import tune

# facts §7.2: name -> (H=W, in, out, kernel, pad, stride)
RESNET18 = {"C2": (56, 64, 64, 3, 1, 1), "C3": (56, 64, 128, 3, 1, 2), "C4": (56, 64, 128, 1, 0, 2),
            "C5": (28, 128, 128, 3, 1, 1), "C6": (28, 128, 256, 3, 1, 2),
            "C7": (28, 128, 256, 1, 0, 2), "C8": (14, 256, 256, 3, 1, 1),
            "C9": (14, 256, 512, 3, 1, 2), "C10": (14, 256, 512, 1, 0, 2),
            "C11": (7, 512, 512, 3, 1, 1)}
# facts §7.2: mobilenet D1-D9 -> (H=W, channels, groups, stride); kernel 3, pad 1
MOBILENET = [(112, 32, 2, 1), (112, 64, 4, 2), (56, 128, 8, 1), (56, 128, 8, 2), (28, 256, 16, 1),
             (28, 256, 16, 2), (14, 512, 32, 1), (14, 512, 32, 2), (7, 1024, 64, 1)]
EPILOGUE = (("shr", 8), ("bias",), ("clip", 0, 127))  # the original integration test's tail


def conv_wl(hw, cin, cout, k, pad, stride, groups=1):
    wl = dict(batch=1, height=hw, width=hw, in_channels=cin, out_channels=cout, kernel_h=k,
              kernel_w=k, pad_h=pad, pad_w=pad, stride_h=stride, stride_w=stride)
    if groups > 1:
        wl["groups"] = groups
    return wl


def original_records(template: str):
    """``[(line number, workload dict, knobs dict)]`` of the log's 1x16 lines of ``template``."""
    out = []
    for number, line in enumerate(open(tune.TOPHUB_LOG), 1):
        if line.startswith("#") or not line.strip():
            continue
        rec = json.loads(line)
        target, name, args = rec["input"][:3]
        if name != template or "-model=pynq_1x16_i8w8a32_15_15_18_17" not in target:
            continue
        data, kernel = args[0][1], args[1][1]
        groups = args[5] if template.startswith("group") else 1
        wl = conv_wl(data[2], data[1] * data[5], kernel[0] * kernel[4], kernel[2], args[3][0],
                     args[2][0], groups)
        knobs = {name: (value[1] if kind == "sp" else value)
                 for name, kind, value in rec["config"]["entity"]}
        knobs["reuse"] = False
        out.append((number, wl, knobs))
    return out


def resnet_records():
    """``{C2..C11: (line, knobs)}`` (the log has one record per layer)."""
    found = {}
    for number, wl, knobs in original_records("conv2d_packed.vta"):
        for name, spec in RESNET18.items():
            if wl == conv_wl(*spec):
                found.setdefault(name, (number, knobs))
    return found


@pytest.mark.parametrize("config", [pytest.param("apache", marks=pytest.mark.slow), "default"])
def test_every_resnet18_record_is_accepted_with_its_knobs(config):
    records = resnet_records()
    assert sorted(records) == sorted(RESNET18)
    history = tune.apply_history_best(tune.TOPHUB_LOG)
    cfg = load_config(config)
    for name, spec in RESNET18.items():
        number, knobs = records[name]
        got = history.best_knobs("conv2d", "stock", conv_wl(*spec), cfg)
        assert got == (knobs, f"tuned record from {tune.TOPHUB_LOG}:{number} "
                              "(AutoTVM conv2d_packed.vta)"), name
    assert history.skipped == []


def test_mobilenet_group_records_accepted_count():
    history = tune.apply_history_best(tune.TOPHUB_LOG)
    cfg = load_config("default")
    originals = {json.dumps(wl, sort_keys=True): knobs
                 for _, wl, knobs in original_records("group_conv2d_packed.vta")}
    accepted = 0
    for hw, c, g, s in MOBILENET:
        wl = conv_wl(hw, c, c, 3, 1, s, g)
        got = history.best_knobs("group_conv2d", "stock", wl, cfg)
        if got is not None:
            assert got[0] == originals[json.dumps(wl, sort_keys=True)]
            accepted += 1
    print(f"MobileNet D1-D9: {accepted} of 9 original group_conv2d records accepted")
    assert accepted == 9


def test_records_do_not_apply_to_another_hardware_shape():
    history = tune.apply_history_best(tune.TOPHUB_LOG)
    wl = conv_wl(*RESNET18["C2"])
    assert history.best_knobs("conv2d", "stock", wl, load_config("1x32x32")) is None


def clipped(n_out, tile, stride, kernel, pad, size):
    """Input rows read by the row tiles of ``tile`` outputs, clipped to ``[0, size)``."""
    total = 0
    for t in range(n_out // tile):
        lo = t * tile * stride - pad
        total += max(0, min(lo + (tile - 1) * stride + kernel, size) - max(lo, 0))
    return total


def expected_counters(cfg, spec, k, n_alu):
    hw, cin, cout, kk, pad, stride = spec
    out = (hw + 2 * pad - kk) // stride + 1
    b, bi, bo = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    ob, cb = cout // bo, cin // bi
    tiles_hw = (out // k["tile_h"]) * (out // k["tile_w"])
    tiles = (ob // k["tile_co"]) * tiles_hw
    steps = cb // k["tile_ci"]
    rows = clipped(out, k["tile_h"], stride, kk, pad, hw)
    cols = clipped(out, k["tile_w"], stride, kk, pad, hw)
    counters = {"inp_load_nbytes": (ob // k["tile_co"]) * cb * rows * cols * b * bi,
                "wgt_load_nbytes": tiles_hw * ob * cb * kk * kk * bo * bi,
                "acc_load_nbytes": tiles * k["tile_co"] * b * bo * 4,
                "out_store_nbytes": cout * out * out,
                "gemm_counter": ob * out * out * cb * kk * kk,
                "alu_counter": ob * out * out * n_alu}
    insns = {"load_inp": tiles * steps, "load_wgt": tiles * steps, "gemm": tiles * steps,
             "reset": tiles, "load_acc": tiles, "alu": tiles * n_alu, "store": tiles}
    return counters, insns


def program_insns(program):
    count = dict.fromkeys(("load_inp", "load_wgt", "gemm", "reset", "load_acc", "alu", "store"), 0)
    for insn in program.insns:
        if insn.opcode == Opcode.LOAD and insn.x_size:
            mem = MemType(insn.memory_type)
            key = {MemType.INP: "load_inp", MemType.WGT: "load_wgt", MemType.ACC: "load_acc"}.get(mem)
            if key:
                count[key] += 1
        elif insn.opcode == Opcode.GEMM:
            count["reset" if insn.reset_reg else "gemm"] += 1
        elif insn.opcode == Opcode.ALU:
            count["alu"] += 1
        elif insn.opcode == Opcode.STORE and insn.x_size:
            count["store"] += 1
    return count


FAST = ["C9", "C10", "C11"]


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in RESNET18])
def test_counters_of_the_original_knobs(name):
    cfg = load_config("apache")  # no CLIP extension: clip is MIN + MAX, as in the original
    spec = RESNET18[name]
    _, knobs = resnet_records()[name]
    template = get_template("conv2d", "stock")
    wl = template.workload_from_dict(conv_wl(*spec))
    op = template.build(cfg, wl, EPILOGUE, knobs)
    rng = np.random.default_rng(0)
    hw, cin, cout, kk, pad, stride = spec
    x = rng.integers(-128, 128, (1, cin, hw, hw)).astype(np.int8)
    w = rng.integers(-128, 128, (cout, cin, kk, kk)).astype(np.int8)
    bias = rng.integers(-(1 << 14), 1 << 14, (1, cout, 1, 1)).astype(np.int32)
    bi, bo = cfg.BLOCK_IN, cfg.BLOCK_OUT
    kernel = w.reshape(cout // bo, bo, cin // bi, bi, kk, kk).transpose(0, 2, 4, 5, 1, 3)
    out, stats = op.run(pack_nchw(x, 1, bi), np.ascontiguousarray(kernel),
                        pack_nchw(np.broadcast_to(bias, (1, cout, 1, 1)), 1, bo),
                        simulator=FunctionalSimulator(cfg))
    reference = requantize(conv2d_nchw(x, w, stride, pad), bias.reshape(1, cout, 1, 1), 8, (0, 127),
                           order=("shr", "bias", "clip"))
    np.testing.assert_array_equal(unpack_nchw(out), reference)
    counters, insns = expected_counters(cfg, spec, knobs, n_alu=4)  # shr, add, min, max
    assert {k: getattr(stats, k) for k in counters} == counters
    assert program_insns(op.program) == insns
