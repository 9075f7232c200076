"""Workload model: TE / PrimFunc extraction, conformability errors, islpy relations."""
import numpy as np
import pytest

from tvm_csp_embed.workload import (ConformabilityError, conv2d, dense, depthwise_conv2d, from_primfunc,
                                    from_te, matmul)

tvm = pytest.importorskip("tvm")
from tvm import te  # noqa: E402


def _te_matmul(M=4, N=6, K=8):
    A = te.placeholder((M, K), "int8", "A")
    B = te.placeholder((N, K), "int8", "B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k].astype("int32") * B[j, k].astype("int32"), axis=k), "C")
    return A, B, C


def _te_conv_nchw(n=1, c=3, h=7, w=7, kk=4, r=3, s=3, pad=1, stride=2):
    data = te.placeholder((n, c, h, w), "int8", "data")
    weight = te.placeholder((kk, c, r, s), "int8", "weight")
    padded = te.compute((n, c, h + 2 * pad, w + 2 * pad),
                        lambda a, b, y, x: tvm.tirx.if_then_else(
                            tvm.tirx.all(y >= pad, y < h + pad, x >= pad, x < w + pad),
                            data[a, b, y - pad, x - pad], tvm.tirx.const(0, "int8")), "pad")
    OH, OW = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1
    rc, ry, rx = te.reduce_axis((0, c), "c"), te.reduce_axis((0, r), "r"), te.reduce_axis((0, s), "s")
    out = te.compute((n, kk, OH, OW), lambda n, k, oh, ow: te.sum(
        padded[n, rc, oh * stride + ry, ow * stride + rx].astype("int32") * weight[k, rc, ry, rx].astype("int32"),
        axis=[rc, ry, rx]), "out")
    return data, weight, padded, out


def test_from_te_matmul_matches_builder_and_numpy():
    A, B, C = _te_matmul()
    wl = from_te(C)
    ref = matmul(4, 6, 8, transpose_b=True)
    assert wl.dims == ("i", "j", "k") and wl.extents == ref.extents and wl.reduction == ref.reduction
    assert [t.coef for t in wl.tensors] == [t.coef for t in ref.tensors]
    rng = np.random.default_rng(1)
    a = rng.integers(-128, 128, (4, 8))
    b = rng.integers(-128, 128, (6, 8))
    np.testing.assert_array_equal(wl.reference(a, b), a @ b.T)


def test_from_te_conv_matches_builder_and_numpy():
    data, weight, padded, out = _te_conv_nchw()
    wl = from_te(out)
    ref = conv2d(1, 3, 7, 7, 4, 3, 3, pad=(1, 1), stride=(2, 2))
    assert set(wl.dims) == set(ref.dims)
    perm = [wl.dims.index(d) for d in ref.dims]
    wp = wl.permuted(perm)
    assert wp.extents == ref.extents
    assert [t.coef for t in wp.tensors] == [t.coef for t in ref.tensors]
    # the reference semantics equal a direct numpy convolution on the padded input
    rng = np.random.default_rng(2)
    x = rng.integers(-128, 128, (1, 3, 9, 9))
    w = rng.integers(-128, 128, (4, 3, 3, 3))
    direct = np.zeros((1, 4, 4, 4), dtype=np.int64)
    for oh in range(4):
        for ow in range(4):
            patch = x[:, :, 2 * oh:2 * oh + 3, 2 * ow:2 * ow + 3]
            direct[:, :, oh, ow] = np.einsum("ncrs,kcrs->nk", patch, w)
    np.testing.assert_array_equal(wl.reference(x, w), direct)


def test_conditional_te_is_rejected_with_rule_and_expression():
    data, weight, padded, out = _te_conv_nchw()
    with pytest.raises(ConformabilityError) as ei:
        from_te(padded)
    assert "multiply-accumulate" in ei.value.rule or "conditional" in ei.value.rule
    A = te.placeholder((8,), "int8", "A")
    B = te.placeholder((8,), "int8", "B")
    k = te.reduce_axis((0, 8), "k")
    C = te.compute((1,), lambda i: te.sum(tvm.tirx.if_then_else(k < 4, A[k], B[k]) * B[k], axis=k), "C")
    with pytest.raises(ConformabilityError) as ei:
        from_te(C)
    assert ei.value.rule == "no conditionals" and "if_then_else" in ei.value.expr


def test_non_affine_subscript_is_rejected():
    A = te.placeholder((64,), "int8", "A")
    B = te.placeholder((8,), "int8", "B")
    k = te.reduce_axis((0, 8), "k")
    C = te.compute((8,), lambda i: te.sum(A[i * k] * B[k], axis=k), "C")
    with pytest.raises(ConformabilityError) as ei:
        from_te(C)
    assert ei.value.rule == "affine subscripts" and "i * k" in ei.value.expr


def test_from_primfunc_matches_te():
    A, B, C = _te_matmul()
    f = te.create_prim_func([A, B, C])
    wl = from_primfunc(f)
    assert wl.extents == (4, 6, 8) and wl.reduction == (False, False, True)
    assert [t.coef for t in wl.tensors] == [t.coef for t in matmul(4, 6, 8, True).tensors]


def test_primfunc_with_two_blocks_is_not_a_perfect_nest():
    data, weight, padded, out = _te_conv_nchw()
    f = te.create_prim_func([data, weight, out])
    with pytest.raises(ConformabilityError) as ei:
        from_primfunc(f)
    assert ei.value.rule == "perfect nest"


def test_primfunc_with_predicate_is_rejected():
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def f(A: T.Buffer((8, 8), "int8"), B: T.Buffer((8, 8), "int8"), C: T.Buffer((8, 8), "int32")):
        for i, j, k in T.grid(8, 8, 8):
            with T.sblock("C"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                T.where(i < 7)
                with T.init():
                    C[vi, vj] = 0
                C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vk]) * T.Cast("int32", B[vj, vk])
    with pytest.raises(ConformabilityError) as ei:
        from_primfunc(f)
    assert ei.value.rule == "no conditionals" and "i < 7" in ei.value.expr


def test_polyhedral_relations_of_conv():
    import islpy as isl
    wl = conv2d(1, 2, 5, 5, 3, 3, 3, pad=(0, 0), stride=(2, 2))
    P = wl.polyhedral
    assert P.instance_set.count_val().to_python() == 2 * wl.num_points
    # access: multiply at (n,k,oh,ow,c,r,s) = (0,1,1,0,1,2,1) reads data[0,1,2*1+2,0*2+1]
    pt = isl.Map("{ S[0,1,1,0,1,2,1,0] -> data[0,1,4,1] }")
    assert pt.is_subset(P.access["data"])
    assert not isl.Map("{ S[0,1,1,0,1,2,1,0] -> data[0,1,3,1] }").is_subset(P.access["data"])
    # the add (statement 1) writes the output, the multiply (statement 0) does not
    assert isl.Map("{ S[0,1,1,0,1,2,1,1] -> out[0,1,1,0] }").is_subset(P.access["out"])
    assert not isl.Map("{ S[0,1,1,0,1,2,1,0] -> out[0,1,1,0] }").is_subset(P.access["out"])
    # reduction chain: lexicographic successor over (c, r, s); a function
    assert P.reduction_chain.is_single_valued()
    assert isl.Map("{ S[0,0,0,0,0,0,2,1] -> S[0,0,0,0,0,1,0,1] }").is_subset(P.reduction_chain)
    assert isl.Map("{ S[0,0,0,0,0,0,0,1] -> S[0,0,0,0,1,2,2,1] }").is_subset(P.reduction_pairs)
    assert not isl.Map("{ S[0,0,0,0,0,0,0,1] -> S[0,1,0,0,0,0,1,1] }").is_subset(P.reduction_pairs)
    assert isl.Map("{ S[0,0,0,0,0,0,0,0] -> S[0,1,0,0,0,0,0,0] }").is_subset(P.spatial)
    assert not isl.Map("{ S[0,0,0,0,0,0,0,0] -> S[0,0,0,0,1,0,0,0] }").is_subset(P.spatial)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "HWNC"])
def test_conv_layouts_compute_the_same_convolution(layout):
    wl = conv2d(2, 3, 6, 5, 4, 3, 2, pad=(1, 0), stride=(1, 2), layout=layout)
    ref = conv2d(2, 3, 6, 5, 4, 3, 2, pad=(1, 0), stride=(1, 2), layout="NCHW")
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, ref.inputs[0].shape)
    w = rng.integers(-128, 128, ref.inputs[1].shape)
    tr = {"NCHW": ((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3)), "NHWC": ((0, 2, 3, 1), (2, 3, 1, 0), (0, 2, 3, 1)),
          "HWNC": ((2, 3, 0, 1), (2, 3, 0, 1), (2, 3, 0, 1))}[layout]
    got = wl.reference(x.transpose(tr[0]), w.transpose(tr[1]))
    np.testing.assert_array_equal(got, ref.reference(x, w).transpose(tr[2]))


def test_depthwise_and_dense_reference():
    wl = depthwise_conv2d(1, 4, 5, 5, 3, 3, pad=(1, 1))
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, wl.inputs[0].shape)
    w = rng.integers(-128, 128, wl.inputs[1].shape)
    direct = np.zeros((1, 4, 5, 5), dtype=np.int64)
    for r in range(3):
        for s in range(3):
            direct += x[:, :, r:r + 5, s:s + 5] * w[None, :, r, s, None, None]
    np.testing.assert_array_equal(wl.reference(x, w), direct)
    d = dense(3, 5, 7)
    a, b = rng.integers(-9, 9, (3, 5)), rng.integers(-9, 9, (7, 5))
    np.testing.assert_array_equal(d.reference(a, b), a @ b.T)
