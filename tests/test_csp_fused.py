"""Fused-reduction conv2d embeddings (issue 9): the (r, s) and (c, r, s) workload variants.

* the variant workloads compute the convolution (numpy, from an independently written unfold);
* the host relayout of a variant (its source steps: pad, stencil unroll, permute, reshape) turns the
  NCHW input into that unfolded tensor;
* which variants are offered, and their padded reduction volume (hand-computed);
* a fused (r, s) and a fused (c, r, s) conv built for ``ext_vta`` under ``csp-relaxed``: bit-exact
  with the llvm build, on VTA, the report naming the fused embedding and its padding.
"""
from __future__ import annotations

import numpy as np
import pytest

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
from tvm_csp_embed import strategy as csp
from tvm_csp_embed.workload import conv2d_fused
from vta_ext.config import load_config

from conftest import conv2d_nchw, conv_chain, vta_and_llvm


def _cw(n, c, h, w, k, r, s, stride, pad, layout="NCHW"):
    sh, sw = stride
    ph, pw = pad
    return csp.CspWorkload("conv2d", (("n", n), ("c", c), ("h", h), ("w", w), ("k", k), ("kh", r),
                                      ("kw", s), ("pt", ph), ("pl", pw), ("pb", ph), ("pr", pw),
                                      ("sh", sh), ("sw", sw)), layout=layout)


def _unfold_rs(xp, S, sw):
    """``D[n, c, ow, h*S + j] = xp[n, c, h, ow*sw + j]`` by loops (the definition)."""
    n, c, H, W = xp.shape
    OW = (W - S) // sw + 1
    out = np.zeros((n, c, OW, H * S), xp.dtype)
    for o in range(OW):
        for h in range(H):
            out[:, :, o, h * S:(h + 1) * S] = xp[:, :, h, o * sw:o * sw + S]
    return out


def _im2col(xp, R, S, sh, sw):
    """``D[n, oh, ow, (c*R + r)*S + s] = xp[n, c, oh*sh + r, ow*sw + s]`` by loops."""
    n, c, H, W = xp.shape
    OH, OW = (H - R) // sh + 1, (W - S) // sw + 1
    out = np.zeros((n, OH, OW, c * R * S), xp.dtype)
    for i in range(OH):
        for j in range(OW):
            out[:, i, j, :] = xp[:, :, i * sh:i * sh + R, j * sw:j * sw + S].reshape(n, -1)
    return out


@pytest.mark.parametrize("variant,shape", [
    ("fused-rs", (2, 2, 9, 30, 3, 3, 5, (2, 3), (1, 2))),
    ("fused-crs", (1, 3, 11, 10, 4, 3, 3, (2, 1), (1, 1))),
])
def test_variant_workload_and_relayout_compute_the_conv(variant, shape):
    n, c, h, w, k, r, s, stride, pad = shape
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (n, c, h, w)).astype(np.int8)
    wt = rng.integers(-128, 128, (k, c, r, s)).astype(np.int8)
    ref = conv2d_nchw(x, wt, stride, pad)
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    unfolded = _unfold_rs(xp, s, stride[1]) if variant == "fused-rs" else \
        _im2col(xp, r, s, *stride)
    wl = conv2d_fused(n, c, h + 2 * pad[0], w + 2 * pad[1], k, r, s, stride, variant)
    wl.check_conformable()
    wf = wt.reshape((k, c, r * s) if variant == "fused-rs" else (k, c * r * s))
    np.testing.assert_array_equal(wl.reference(unfolded, wf), ref)
    # the operator's source steps produce the same tensors from the NCHW input and OIHW weights
    from tvm_csp_embed.codegen.relayout import HostLayout

    owl, shapes, steps, pads = csp.operator_workload(_cw(n, c, h, w, k, r, s, stride, pad, variant))
    assert (owl.dims, owl.extents, owl.inputs, owl.output) == (wl.dims, wl.extents, wl.inputs, wl.output)
    assert pads == {}
    got = HostLayout(shapes["data"], steps["data"]).pack_numpy(x)
    np.testing.assert_array_equal(got, unfolded)
    np.testing.assert_array_equal(HostLayout(shapes["weight"], steps["weight"]).pack_numpy(wt), wf)


def test_offered_variants_pad_the_reduction_less_than_stock():
    cfg = load_config("default")          # BLOCK_IN 16
    # c=1 5x20: stock 16*100 = 1600; fused (r, s) 1 * 112; (c, r, s) also 112: not offered twice
    assert csp.fused_variants(_cw(1, 1, 24, 64, 16, 5, 20, (2, 2), (0, 0)), cfg) == ["fused-rs"]
    # c=3 7x7: stock 16*49 = 784; (r, s) 3*64 = 192; (c, r, s) 147 -> 160
    assert csp.fused_variants(_cw(1, 3, 24, 24, 32, 7, 7, (2, 2), (3, 3)), cfg) == \
        ["fused-rs", "fused-crs"]
    # c=64 3x3: stock 64*9 = 576 is not beaten (64*16 = 1024, 576 -> 576)
    assert csp.fused_variants(_cw(1, 64, 14, 14, 64, 3, 3, (1, 1), (1, 1)), cfg) == []
    # strict mode, an explicit layout and dense keep their layouts
    t = csp.CspGemmTemplate("conv2d", "csp-strict")
    assert t._layouts("auto", _cw(1, 1, 24, 64, 16, 5, 20, (2, 2), (0, 0)), cfg) == ["NCHW", "NHWC"]
    t = csp.CspGemmTemplate("conv2d", "csp-relaxed")
    assert t._layouts("NCHW", _cw(1, 1, 24, 64, 16, 5, 20, (2, 2), (0, 0)), cfg) == ["NCHW"]
    assert t._layouts("auto", _cw(1, 1, 24, 64, 16, 5, 20, (2, 2), (0, 0)), cfg) == \
        ["NCHW", "NHWC", "fused-rs"]


def _module(n, c, h, w, k, r, s, stride, pad):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, h, w), "int8"))
    wt = relax.Var("w", relax.TensorType((k, c, r, s), "int8"))
    with bb.function("main", [x, wt]):
        with bb.dataflow():
            y = conv_chain(bb, x, wt, None, stride=stride, padding=pad, shift=8, clip=(0, 127))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _build(shape):
    """Build and run under csp-relaxed ranking by VTA cycles alone (the fused embeddings win on
    cycles; under the default end-to-end objective their larger host unroll can lose)."""
    import vta_ext

    rng = np.random.default_rng(0)
    n, c, h, w, k, r, s, stride, pad = shape
    x = rng.integers(-128, 128, (n, c, h, w)).astype(np.int8)
    wt = rng.integers(-128, 128, (k, c, r, s)).astype(np.int8)
    with vta_ext.build_options(strategy="csp-relaxed", objective="cycles"):
        got, ref, report = vta_and_llvm(_module(*shape), [x, wt])
    np.testing.assert_array_equal(got, ref)
    assert [e.op for e in report.on_vta] == ["relax.nn.conv2d"]
    return report.on_vta[0].detail


def test_fused_rs_conv_on_vta_bit_exact():
    # c = 1, 5x20 filter, stride 2: the relaxed bit model's best is z = r2*s8 (r 5->6, s 20->24,
    # 144 of 100); the fused (r, s) dim pads 100 -> 112 (7 blocks of 16)
    detail = _build((1, 1, 24, 64, 16, 5, 20, 2, 0))
    assert "in layout fused-rs" in detail, detail
    assert "z=rs16" in detail
    assert f"filter rows x columns (fused) {5 * 20}->{7 * 16}" in detail


def test_fused_crs_conv_on_vta_bit_exact():
    # c = 3, 3x3, stride 2: (c, r, s) = 27 -> 32 against 3 x (9 -> 16) = 48 for (r, s) per channel
    detail = _build((1, 3, 16, 16, 16, 3, 3, 2, 1))
    assert "in layout fused-crs" in detail, detail
    assert f"in channels x filter rows x columns (fused) {3 * 3 * 3}->{2 * 16}" in detail


@pytest.mark.slow
def test_fused_crs_7x7_conv_on_vta_bit_exact():
    # c = 3, 7x7, stride 2 (the DeepBench 27/34 filter on a small image): 147 -> 160
    detail = _build((1, 3, 24, 24, 32, 7, 7, 2, 3))
    assert "in layout fused-crs" in detail, detail
    assert f"in channels x filter rows x columns (fused) {3 * 7 * 7}->{10 * 16}" in detail
