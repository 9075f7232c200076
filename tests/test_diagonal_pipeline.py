"""The lean conv2d path (``build_conv2d(..., lean=True)``) that csp-relaxed's block-diagonal
programs take (``tvm_csp_embed.depthwise.build_diagonal``): the accumulator zeroed by a
padding-only fill at the start of each tile and the tile's first loads released by the previous
tile's last GEMM (``vta_ext.lower.sync.release_after_gemm``), so that the next round of input
loads runs under the epilogue of the round before.

Checked here:

* DenseNet-121's 1x256x28x28 per-channel conv on ``pipelined`` at its searched point (2 x 2
  virtual threads, 14x28 tiles, one channel block per tile: 16 / 2 = 8 rounds of 4 tiles): by
  hand, the stock program's compute module waits once between every two rounds for most of a
  tile's input load (7 such waits); the lean one never waits between its first and last store, and waits in all less than one tile's input load plus one tile's store (the first
  round's loads, the last store);
* bit-exact against numpy and free of races (the token happens-before check) for block-diagonal
  programs and plain conv2d programs with several input-channel blocks per tile, reuse-aware
  double buffering, padding and strides, on ``default``, ``pipelined`` and ``pynq`` (whose
  programs also keep the hazard contract); the stock path's programs are pinned byte for byte
  by tests/test_emission_identity.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import conv2d_nchw, pack_activation, requantize

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
from tvm_csp_embed.depthwise import DepthwiseUnitWorkload, build_diagonal
from vta_ext.config import load_config
from vta_ext.isa import MemType, Opcode
from vta_ext.lower.racecheck import check_races
from vta_ext.lower.sync import RELEASED
from vta_ext.sim.cycles import CycleModel, timing
from vta_ext.templates.conv2d import build_conv2d
from vta_ext.templates.workload import Conv2dWorkload

EPILOGUE = (("bias",), ("shr", 9), ("clip", -128, 127))
#: DenseNet-121 112's searched point of its 1x256x28x28 per-channel conv on pipelined
POINT = dict(h_nthread=2, oc_nthread=2, reuse=False, tile_b=1, tile_ci=1, tile_co=1, tile_h=14,
             tile_w=28)


def _densenet_layer(cfg, lean: bool):
    """The block-diagonal program of the 1x256x28x28 1x1 per-channel conv (bias by GEMM) at
    :data:`POINT`, lean or on the stock path."""
    from tvm_csp_embed.codegen.biasfold import gemm_bias_epilogue
    from tvm_csp_embed.depthwise import diagonal_workload

    wl = DepthwiseUnitWorkload(1, 256, 28, 28, 1, 1, 0, 0, 1, 1, unit="gemm",
                               knobs=tuple(POINT.items()), bias_gemm=True)
    if lean:
        return build_diagonal(cfg, wl, EPILOGUE, "cycles")
    from vta_ext.templates.group_conv2d import build_group_conv2d

    return build_group_conv2d(cfg, diagonal_workload(cfg, wl), gemm_bias_epilogue(EPILOGUE), POINT)


def _between_stores(program, cfg):
    """The cycle report and the compute module's waits that start after the first STORE began
    and end before the last STORE began (the waits between rounds)."""
    report = CycleModel(cfg, record_timeline=True).run_program(program)
    insns = program.insns
    stores = [s for (m, s, _, _), i in zip(report.timeline, report.timeline_index)
              if m == "store" and insns[i].opcode == Opcode.STORE and insns[i].x_size]
    first, last = min(stores), max(stores)
    waits, free = [], 0
    for (module, start, end, _), _i in zip(report.timeline, report.timeline_index):
        if module != "compute":
            continue
        if start > free and free >= first and start <= last:
            waits.append(start - free)
        free = end
    return report, waits


def test_the_round_gap_is_gone():
    cfg = load_config("pipelined")
    rounds = 256 // cfg.BLOCK_OUT // (POINT["tile_co"] * POINT["oc_nthread"])
    assert rounds == 8
    tile_rows = POINT["tile_h"] * POINT["tile_w"]          # 392 accumulator rows per tile
    costs = timing(cfg)
    inp_load = costs.dma("INP").cycles(1, 1, tile_rows * cfg.inp_elem_bytes)
    store = costs.dma("OUT").cycles(1, 1, tile_rows * cfg.out_elem_bytes)

    stock = _densenet_layer(cfg, lean=False)
    report, waits = _between_stores(stock.program, cfg)
    long_waits = [w for w in waits if w > inp_load / 2]     # the rest: a bias tile's loads
    assert len(long_waits) == rounds - 1, waits

    lean = _densenet_layer(cfg, lean=True)
    assert lean.generated is None or lean.generated.release.startswith(RELEASED)
    lean_report, lean_waits = _between_stores(lean.program, cfg)
    assert lean_waits == []
    assert lean_report.modules["compute"].stall < inp_load + store
    assert lean_report.total_cycles <= report.total_cycles - sum(long_waits)


# ------------------------------------------------------------------------------ bit-exact
def _check(cfg, compiled, x, w, bias, stride, pad, groups=1):
    """Run ``compiled`` on the functional simulator against numpy; check its tokens."""
    bo, bi, b = cfg.BLOCK_OUT, cfg.BLOCK_IN, cfg.BATCH
    o, ci_g, kh, kw = w.shape
    kernel = np.ascontiguousarray(
        w.reshape(o // bo, bo, ci_g // bi, bi, kh, kw).transpose(0, 2, 4, 5, 1, 3))
    packed_bias = np.ascontiguousarray(np.broadcast_to(
        bias.reshape(1, o // bo, 1, 1, 1, bo), (1, o // bo, 1, 1, b, bo)))
    out, _ = compiled.run(pack_activation(x, cfg), kernel, packed_bias)
    n, cb, oh, ow, bb, co = out.shape
    got = out.transpose(0, 4, 1, 5, 2, 3).reshape(n * bb, cb * co, oh, ow)
    ref = requantize(conv2d_nchw(x, w, stride, pad, groups=groups), bias.reshape(1, -1, 1, 1), 9,
                     (-128, 127))
    np.testing.assert_array_equal(got, ref)
    check_races(compiled.program)
    fills = [i for i in compiled.program.insns if getattr(i, "opcode", None) == Opcode.LOAD
             and i.memory_type == MemType.ACC and i.y_size == 0]
    assert fills, "the lean path zeroes the accumulator by padding-only LOADs"


#: (channels, hw, kernel, stride, pad, knobs): a 1x1 of 4 rounds, a 3x3 s2 p1, reuse
DIAGONAL = [(64, 8, 1, 1, 0, dict(tile_h=4, tile_w=8, tile_co=1, oc_nthread=2, h_nthread=1)),
            (64, 7, 3, 2, 1, dict(tile_h=1, tile_w=4, tile_co=1, oc_nthread=2, h_nthread=2)),
            (64, 8, 3, 1, 1, dict(tile_h=2, tile_w=8, tile_co=1, oc_nthread=2, h_nthread=1,
                                  reuse=True))]


@pytest.mark.parametrize("config", ["default", "pipelined", "pynq"])
@pytest.mark.parametrize("case", DIAGONAL, ids=["1x1", "3x3s2", "reuse"])
@pytest.mark.parametrize("bias_gemm", [True, False], ids=["bias_gemm", "bias_add"])
def test_block_diagonal_lean_bit_exact_and_race_free(config, case, bias_gemm):
    from tvm_csp_embed.depthwise import diagonal_weight

    cfg = load_config(config)
    c, hw, k, stride, pad, knobs = case
    rng = np.random.default_rng(c + hw + k)
    x = rng.integers(-128, 128, (cfg.BATCH, c, hw, hw)).astype(np.int8)
    wd = rng.integers(-128, 128, (c, 1, k, k)).astype(np.int8)
    bias = rng.integers(-2000, 2000, c).astype(np.int32)
    wl = DepthwiseUnitWorkload(cfg.BATCH, c, hw, hw, k, k, pad, pad, stride, stride, unit="gemm",
                               knobs=tuple(knobs.items()), bias_gemm=bias_gemm)
    compiled = build_diagonal(cfg, wl, EPILOGUE, "cycles")
    assert dict(knobs).items() <= vars(compiled.knobs).items()
    block = cfg.BLOCK_IN
    _check(cfg, compiled, x, diagonal_weight(wd, c, block), bias, stride, pad,
           groups=c // block)


#: plain conv2d with 4 input-channel blocks: tile_ci 2 (a k_o0 loop of 2 load points), tile_ci 4
PLAIN = [dict(tile_ci=2, tile_co=1, tile_h=4, tile_w=8, oc_nthread=2, h_nthread=1),
         dict(tile_ci=4, tile_co=2, tile_h=2, tile_w=8, oc_nthread=1, h_nthread=2)]


@pytest.mark.parametrize("config", ["default", "pipelined", "pynq"])
@pytest.mark.parametrize("knobs", PLAIN, ids=["tile_ci2", "tile_ci4"])
def test_plain_conv2d_lean_bit_exact_and_race_free(config, knobs):
    cfg = load_config(config)
    c, o, hw = 4 * cfg.BLOCK_IN, 4 * cfg.BLOCK_OUT, 8
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (cfg.BATCH, c, hw, hw)).astype(np.int8)
    w = rng.integers(-128, 128, (o, c, 3, 3)).astype(np.int8)
    bias = rng.integers(-5000, 5000, o).astype(np.int32)
    wl = Conv2dWorkload(batch=cfg.BATCH, height=hw, width=hw, in_channels=c, out_channels=o,
                        kernel_h=3, kernel_w=3, pad_h=1, pad_w=1, stride_h=1, stride_w=1)
    compiled = build_conv2d(cfg, wl, EPILOGUE, knobs, lean=True)
    _check(cfg, compiled, x, w, bias, 1, 1)
