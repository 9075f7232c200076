"""The bias by one GEMM of a constant block in the block-diagonal programs of depthwise convs
(``tvm_csp_embed.depthwise``) and of narrow grouped convs (``tvm_csp_embed.grouped``).

The block-diagonal program (the stock ``group_conv2d_packed`` template on diagonal weight tiles)
adds a constant bias by one GEMM per output tile, as the CSP programs do
(``tvm_csp_embed.codegen.biasfold``): the constant row ``(1, -128 x 15)`` times one weight tile of
the bias's digits per output channel block, instead of the vector ALU ADD. Checked here:

* bit-exact against a numpy convolution for a depthwise 3x3 and 1x1 and a grouped conv of 4
  channels per group, with biases over the whole range and at both its ends, on ``default``,
  ``pipelined`` and ``pynq`` (functional simulator; the pynq program free of RAW hazards) and on
  the RTL of the pynq design when its library is there;
* the instructions by kind against a hand count: the vector ADD micro-ops that disappear (one per
  accumulator entry), the GEMM micro-ops that appear (as many), the bias rows no longer loaded;
* a Relax build: bit-exact against llvm, the report's sentence (the bias GEMM chosen by cycles,
  with both counts), and the reason when the ADD stays (runtime bias, out of range).
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import (conv2d_nchw, conv_module, pack_activation, requantize, rtl_device,
                      run_module)

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
import vta_ext
from test_bias_gemm import _by_kind, assert_no_vector_pass
from tvm_csp_embed.depthwise import DepthwiseUnitWorkload, build_diagonal, diagonal_weight
from tvm_csp_embed.grouped import NarrowGroupWorkload
from vta_ext.config import load_config

EPILOGUE = (("bias",), ("shr", 9), ("clip", -128, 127))
#: what 16 lanes hold with the constants (1, -128, ...), by hand: 127 + 15 * 128 * 128 and
#: -128 - 15 * 127 * 128
HI, LO = 127 + 15 * 128 * 128, -128 - 15 * 127 * 128
#: (channels, kernel, channels per group): depthwise 3x3, depthwise 1x1, grouped of 4
CASES = [(32, 3, 1), (32, 1, 1), (32, 3, 4)]


def _workload(cfg, c, k, width, hw, bias_gemm):
    pad = k // 2
    if width == 1:
        return DepthwiseUnitWorkload(cfg.BATCH, c, hw, hw, k, k, pad, pad, 1, 1, unit="gemm",
                                     bias_gemm=bias_gemm)
    return NarrowGroupWorkload(cfg.BATCH, hw, hw, c, c, k, k, pad, pad, 1, 1, groups=c // width,
                               group_width=width, bias_gemm=bias_gemm)


def _biases(n, seed):
    """``n`` biases over the whole range, its two ends among them."""
    b = np.random.default_rng(seed).integers(LO, HI + 1, n)
    b[:2] = LO, HI
    return b.astype(np.int32)


def _run(cfg, c, k, width, hw=8, bias_gemm=True, knobs=None, device=None, seed=0):
    """Build the block-diagonal program, run it on random data; ``(compiled, output NCHW, numpy
    reference NCHW)``."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (cfg.BATCH, c, hw, hw)).astype(np.int8)
    w = rng.integers(-128, 128, (c, width, k, k)).astype(np.int8)
    bias = _biases(c, seed + 1)
    ref = requantize(conv2d_nchw(x, w, 1, k // 2, groups=c // width), bias.reshape(1, c, 1, 1),
                     9, (-128, 127))
    block, bo = cfg.BLOCK_IN, cfg.BLOCK_OUT
    oihw = diagonal_weight(w, c, block, width)
    kernel = np.ascontiguousarray(oihw.reshape(c // bo, bo, 1, block, k, k).transpose(0, 2, 4, 5, 1, 3))
    packed_bias = np.ascontiguousarray(np.broadcast_to(
        bias.reshape(1, c // bo, 1, 1, 1, bo), (1, c // bo, 1, 1, cfg.BATCH, bo)))
    compiled = build_diagonal(cfg, _workload(cfg, c, k, width, hw, bias_gemm), EPILOGUE, knobs)
    if device is not None:      # on the device itself, which must count its cycles
        sim = device.simulator(cfg)
        out, _ = compiled.run(pack_activation(x, cfg), kernel, packed_bias, simulator=sim)
        cycles = sim.take_cycles()
        assert cycles and all(cycles), cycles
    else:
        out, _ = compiled.run(pack_activation(x, cfg), kernel, packed_bias)
    n, cb, oh, ow, b, co = out.shape
    return compiled, out.transpose(0, 4, 1, 5, 2, 3).reshape(n * b, cb * co, oh, ow), ref


# ------------------------------------------------------------------------------ bit-exact
@pytest.mark.parametrize("config", ["default", "pipelined", "pynq"])
@pytest.mark.parametrize("case", CASES, ids=["dw3x3", "dw1x1", "grouped4"])
def test_block_diagonal_bias_by_gemm_bit_exact(config, case):
    cfg = load_config(config)
    compiled, got, ref = _run(cfg, *case)
    np.testing.assert_array_equal(got, ref)
    assert_no_vector_pass(compiled, config)


def test_block_diagonal_bias_by_gemm_on_the_pynq_rtl():
    device = rtl_device()
    cfg = load_config("pynq")
    for case in CASES:
        _, got, ref = _run(cfg, *case, device=device, seed=7)
        np.testing.assert_array_equal(got, ref)


# ------------------------------------------------------------------------------ hand count
@pytest.mark.parametrize("case", CASES, ids=["dw3x3", "dw1x1", "grouped4"])
def test_instructions_counted_by_hand(case):
    """32 channels of 8x8 outputs on ``default`` (batch 1, 16-lane blocks): 2 channel blocks x 64
    pixels = 128 accumulator entries. The ADD program adds the bias by 128 vector ADD micro-ops
    after loading the bias rows into the accumulator; the GEMM program has neither and exactly 128
    more GEMM micro-ops (one per entry), at the same knobs."""
    cfg = load_config("default")
    assert (cfg.BATCH, cfg.BLOCK_OUT) == (1, 16)
    add, got_add, ref = _run(cfg, *case, bias_gemm=False)
    gem, got_gem, _ = _run(cfg, *case, knobs=add.knobs)
    np.testing.assert_array_equal(got_add, ref)
    np.testing.assert_array_equal(got_gem, ref)
    a, g = _by_kind(add.program), _by_kind(gem.program)
    entries = 2 * 8 * 8
    assert (a["vector_add"], g["vector_add"]) == (entries, 0)
    assert g["gemm"] - a["gemm"] == entries
    assert a["ACC"] > 0 and g["ACC"] == 0


# ------------------------------------------------------------------------------ Relax
def _module(c, groups, k, bias):
    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, (c, c // groups, k, k)).astype(np.int8)
    x = rng.integers(-128, 128, (1, c, 14, 14)).astype(np.int8)
    if bias is None:       # runtime weights and bias
        mod = conv_module(1, c, c, 14, k, padding=k // 2, groups=groups, shift=9, clip=(-128, 127))
        return mod, [x, w, rng.integers(-5000, 5000, (1, c, 1, 1)).astype(np.int32)]
    mod = conv_module(1, c, c, 14, k, padding=k // 2, groups=groups, shift=9, clip=(-128, 127),
                      constants=(w, np.asarray(bias, np.int32).reshape(1, c, 1, 1)))
    return mod, [x]


def _build(mod, arrays, config):
    import tvm
    from tvm import relax

    with vta_ext.build_options(strategy="csp-relaxed"):
        vm = relax.VirtualMachine(relax.build(mod, target=vta_ext.vta_target(config)), tvm.cpu())
        got = vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    (p,) = [p for p in vta_ext.last_build_report().placements if p.op == "relax.nn.conv2d"]
    np.testing.assert_array_equal(got, run_module(mod, "llvm", arrays))
    return p


@pytest.mark.usefixtures("fresh_embedding_cache")
@pytest.mark.parametrize("groups", [64, 16], ids=["depthwise", "grouped4"])
def test_relax_build_chooses_the_gemm_bias_and_says_why_not_otherwise(groups):
    p = _build(*_module(64, groups, 3, _biases(64, 15)), "pipelined")
    assert "block-diagonal" in p.plan
    assert "bias added by one GEMM per output tile" in p.detail, p.detail
    assert "cycles with the ALU ADD" in p.detail
    p = _build(*_module(64, groups, 3, None), "pipelined")
    assert "bias by the vector ALU ADD (not by a GEMM: bias is runtime data)" in p.detail, p.detail
    out = _biases(64, 16)
    out[3] = HI + 1
    p = _build(*_module(64, groups, 3, out), "pipelined")
    assert "bias by the vector ALU ADD (not by a GEMM: bias" in p.detail and "outside" in p.detail
