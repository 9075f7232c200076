"""Ceil-mode max pooling on VTA: the windows past the bottom / right edge see the input padded
by -128 on the host, which never beats a real int8 value. References: a direct numpy max pool
(windows clipped to the input, ceil-mode output size computed by hand) and the llvm build."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from conftest import vta_and_llvm


def ref_max_pool_ceil(x, k, s, p):
    n, c, h, w = x.shape
    oh = -(-(h + 2 * p - k) // s) + 1
    if (oh - 1) * s >= h + p:  # the last window must start inside the input or the left padding
        oh -= 1
    out = np.empty((n, c, oh, oh), x.dtype)
    for i in range(oh):
        for j in range(oh):
            r0, c0 = i * s - p, j * s - p
            win = x[:, :, max(r0, 0):min(r0 + k, h), max(c0, 0):min(c0 + k, w)]
            out[:, :, i, j] = win.max(axis=(2, 3))
    return out


def _pool_module(shape, k, s, p, ceil_mode):
    x = relax.Var("x", relax.TensorType(shape, "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.max_pool2d(x, k, s, p, ceil_mode=ceil_mode))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("h,k,s,p,extra", [(7, 2, 2, 0, 1), (14, 3, 2, 1, 1), (28, 3, 2, 0, 1),
                                           (13, 3, 2, 0, 0), (12, 3, 3, 1, 1),
                                           (11, 3, 3, 1, 0)])
def test_ceil_mode_max_pool_on_vta(h, k, s, p, extra):
    rng = np.random.default_rng(h + k)
    x = rng.integers(-128, 128, (1, 16, h, h)).astype(np.int8)
    x[0, :8, -1, :] = -128  # border windows that hold only the minimum value
    x[0, :8, :, -1] = -128
    mod = _pool_module(x.shape, k, s, p, True)
    got, ref, report = vta_and_llvm(mod, [x])
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got, ref_max_pool_ceil(x, k, s, p))
    assert report.placement() == [("relax.nn.max_pool2d", "vta")]
    (op,) = report.on_vta
    assert (f"ceil mode (input padded by {extra}x{extra} of -128" in op.detail) == bool(extra)
