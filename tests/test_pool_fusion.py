"""A max pool fused into the conv program that produces its input
(:mod:`tvm_csp_embed.codegen.poolstage`).

* the fused program's output is numpy's max pool of numpy's conv + epilogue, bit for bit, on
  ``default`` and ``pipelined``: one row tile per channel block (fire-like 3x3 s2), row tiles
  whose windows overlap (the halo rows recomputed), row tiles of a 2x2 s2 pool, a preset's point,
  an epilogue whose lower bound is negative (the pool's initial value), the bias as a GEMM;
* what cannot fuse is refused in one line naming why;
* on ``pipelined`` the cycle model ranks squeezenet1_1's fire3 1x1 expand conv with its 3x3 s2
  pool fused below the conv's own program plus the pool template's;
* one small fused program runs on the ``pynq`` RTL bit-exactly.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import apply_epilogue, conv2d_nchw, max_pool_nchw, rtl_device

from tvm_csp_embed import conv2d, embed_all, gemm
from tvm_csp_embed.codegen import build_gemm, packed_gemm
from tvm_csp_embed.codegen.poolstage import PoolStage
from vta_ext.config import load_config
from vta_ext.sim.cycles import CycleModel
from vta_ext.templates.errors import Conv2dRefusal

PERMS = {"data": (0, 1, 2, 3), "weight": (0, 1, 2, 3), "out": (0, 1, 2, 3)}
EPILOGUE = (("bias",), ("shr", 5), ("clip", 0, 127))


def _case(cfg, c, hw, k, r, pad, stride=1, seed=32):
    """A conv's plan (the first relaxed embedding: output ``(n, k, oh, ow, x, y)``), operands
    and numpy's conv accumulator."""
    wl = conv2d(1, c, hw + 2 * pad, hw + 2 * pad, k, r, r, stride=(stride, stride))
    ohw = (hw + 2 * pad - r) // stride + 1
    shapes = {"data": (1, c, hw, hw), "weight": (k, c, r, r), "out": (1, k, ohw, ohw)}
    dims = {"n": (0, 0), "c": (0, 0), "h": (pad, pad), "w": (pad, pad)}
    pads = {"data": tuple(dims[d] for d in wl.inputs[0].dim_names)}
    pg = packed_gemm(embed_all(wl, gemm(cfg), "relaxed")[0][0], shapes, PERMS, pads)
    assert [d.terms[0][0] for d in pg.operands["C"].dims] == ["n", "k", "oh", "ow", "@x", "@y"]
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, shapes["data"]).astype(np.int8)
    w = rng.integers(-128, 128, shapes["weight"]).astype(np.int8)
    b = rng.integers(-(1 << 14), 1 << 14, (1, k, 1, 1)).astype(np.int32)
    return pg, x, w, b, conv2d_nchw(x, w, stride, pad)


def _run(compiled, pg, x, w, b, simulator=None):
    """The fused program's output, unpacked to NCHW (``(n, k/co, oh, ow, 1, co)`` packed)."""
    out, _ = compiled.run(pg.operands["A"].host.pack_numpy(x),
                          pg.operands["B"].host.pack_numpy(w),
                          pg.bias_layout(b.shape).pack_numpy(b), simulator=simulator)
    n, kb, oh, ow, _, co = out.shape
    return out.transpose(0, 1, 5, 2, 3, 4).reshape(n, kb * co, oh, ow)


CASES = {
    # squeezenet1_1 fire-like: 27x27 -> 13x13, one row tile per channel block
    "whole-plane": ((16, 27, 32, 1, 0), PoolStage(3, 3, 2, 2), "cycles", EPILOGUE),
    # overlapping windows, 3 row tiles of 5 pooled rows: conv rows 10 and 20 computed twice
    "halo": ((16, 31, 32, 3, 1), PoolStage(3, 3, 2, 2, rows=5),
             {"tile_k": 1, "vt_k": 2}, EPILOGUE),
    # 2x2 s2, row tiles of 4 pooled rows, a negative lower bound (the pool's initial value)
    "2x2": ((16, 32, 32, 1, 0), PoolStage(2, 2, 2, 2, rows=4), {"tile_k": 2, "vt_k": 1},
            (("bias",), ("shr", 6), ("clip", -100, 90))),
    # the bias as a GEMM (the network's fire convs' epilogue), halo row tiles of a preset
    "bias-gemm": ((16, 27, 32, 3, 1), PoolStage(3, 3, 2, 2, rows=1), "cycles",
                  (("bias_gemm",), ("shr", 7), ("clip", 0, 127))),
}


@pytest.mark.parametrize("preset", ["default", "pipelined"])
@pytest.mark.parametrize("name", list(CASES))
def test_fused_pool_matches_numpy(preset, name):
    cfg = load_config(preset)
    shape, pool, knobs, epilogue = CASES[name]
    pg, x, w, b, acc = _case(cfg, *shape)
    if isinstance(knobs, dict):
        knobs = dict(tile_n=1, tile_oh=1, tile_ow=pg.operands["C"].shape[3], tile_c=1, vt_oh=1,
                     **knobs)
    compiled = build_gemm(cfg, pg, epilogue, knobs, pool=pool)
    reference = tuple(("bias",) if st == ("bias_gemm",) else st for st in epilogue)
    expected = max_pool_nchw(apply_epilogue(acc, reference, b), (pool.pool_h, pool.pool_w),
                             (pool.stride_h, pool.stride_w))
    got = _run(compiled, pg, x, w, b)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    assert compiled.pool is not None and compiled.pool.rows is not None


@pytest.mark.parametrize("epilogue, pool, words", [
    ((("bias",), ("shr", 5)), PoolStage(3, 3, 2, 2), "clip inside int8"),
    ((("bias",), ("shr", 5), ("clip", 0, 300)), PoolStage(3, 3, 2, 2), "clip inside int8"),
    (EPILOGUE, PoolStage(3, 3, 2, 2, rows=4), "do not divide the 13 pooled rows"),
    (EPILOGUE + (("residual",), ("clip", 0, 127)), PoolStage(3, 3, 2, 2), "residual stage"),
])
def test_refusals_name_the_reason(epilogue, pool, words):
    cfg = load_config("pipelined")
    pg, *_ = _case(cfg, 16, 27, 32, 1, 0)
    with pytest.raises(Conv2dRefusal, match=words):
        build_gemm(cfg, pg, epilogue, "cycles", pool=pool)


def test_cycle_model_ranks_fused_below_conv_and_pool():
    """squeezenet1_1 112's fire3 1x1 expand conv (16 -> 64 channels on 27x27) and its 3x3 s2
    pool: the fused program against the conv's own (``"cycles"``) plus the pool template's as a
    network builds it (in place, identity-GEMM input, lean)."""
    from vta_ext.templates.pool import PoolWorkload, build_max_pool2d

    cfg = load_config("pipelined")
    pg, *_ = _case(cfg, 16, 27, 64, 1, 0)
    model = CycleModel(cfg)
    fused = build_gemm(cfg, pg, EPILOGUE, "cycles", pool=PoolStage(3, 3, 2, 2))
    conv = build_gemm(cfg, pg, EPILOGUE, "cycles")
    pool = build_max_pool2d(cfg, PoolWorkload(1, 64, 27, 27, 3, 3, 2, 2, 0, 0), (), "cycles",
                            schedule="inplace", input_path="gemm", lean=True)
    apart = sum(model.run_program(c.program).total_cycles for c in (conv, pool))
    assert model.run_program(fused.program).total_cycles < apart


def test_fused_pool_on_the_pynq_rtl():
    """A small fused program (the halo case's row tiles) on the original design's RTL."""
    device = rtl_device()
    cfg = load_config("pynq")
    pg, x, w, b, acc = _case(cfg, 16, 15, 16, 3, 1, seed=7)
    pool = PoolStage(3, 3, 2, 2, rows=1)
    compiled = build_gemm(cfg, pg, EPILOGUE, "tps", pool=pool)
    sim = device.simulator(cfg)
    sim.take_cycles()
    got = _run(compiled, pg, x, w, b, simulator=sim)
    assert sum(sim.take_cycles()) > 0      # the device ran it
    np.testing.assert_array_equal(
        got, max_pool_nchw(apply_epilogue(acc, EPILOGUE, b), (3, 3), (2, 2)))
