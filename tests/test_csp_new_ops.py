"""Operators without a stock template through the CSP generator (``tvm_csp_embed.operators``).

* batched matmul (``R.matmul`` of rank-3 int8, ``A @ B`` and ``A @ permute_dims(B)``), dilated
  conv2d and conv1d (stride, padding, dilation) run on VTA under ``csp-relaxed`` and
  ``csp-strict``, bit-exact against the llvm build of the same module and against numpy; the
  build report says where each ran;
* under ``stock`` they stay on the CPU and the report says which strategy to build with;
* the workloads from the legalized PrimFuncs compute the operators (numpy definitions);
* non-conformable variants (rank-4 matmul, grouped conv1d, a matmul with broadcast batch) are
  refused with the reason; the int32 overflow proof of a multiply tail uses the batched matmul's
  reduction (K), not the weight's size.
"""
import re

import numpy as np
import pytest
from conftest import conv2d_nchw, conv_module, random_inputs, requantize, vta_and_llvm
from tvm import relax

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
import vta_ext
from tvm_csp_embed.operators import conv_reference, operator_workload
from tvm_csp_embed.strategy import CspWorkload


#: a fresh on-disk embedding cache for this module (conftest ``fresh_embedding_cache``)
pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")


# ------------------------------------------------------------------------------------ modules
def _tail(bb, y, bias=None, shift=6, clip=(-128, 127), mul=None):
    if bias is not None:
        y = bb.emit(relax.op.add(y, bias))
    if mul is not None:
        y = bb.emit(relax.op.multiply(y, relax.const(mul, "int32")))
    y = bb.emit(relax.op.right_shift(y, relax.const(shift, "int32")))
    y = bb.emit(relax.op.clip(y, *clip))
    return bb.emit(relax.op.astype(y, "int8"))


def bmm_module(b, n, k, m, transpose=False, bias=False, shift=6, mul=None, rank=3):
    """``matmul(A[b,n,k], B[b,k,m] or permute_dims(B[b,m,k], [0,2,1]))`` + the int8 tail
    (``rank=4``: one more leading batch dim)."""
    lead = (b,) if rank == 3 else (2, b)
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType(lead + (n, k), "int8"))
    w = relax.Var("w", relax.TensorType(lead + ((m, k) if transpose else (k, m)), "int8"))
    params = [a, w]
    bv = None
    if bias:
        bv = relax.Var("bias", relax.TensorType((b, 1, m), "int32"))
        params.append(bv)
    with bb.function("main", params):
        with bb.dataflow():
            axes = list(range(rank - 2)) + [rank - 1, rank - 2]
            rhs = bb.emit(relax.op.permute_dims(w, axes)) if transpose else w
            y = bb.emit(relax.op.matmul(a, rhs, out_dtype="int32"))
            out = bb.emit_output(_tail(bb, y, bv, shift, mul=mul))
        bb.emit_func_output(out)
    return bb.get()


def conv1d_module(n, c, w, k, kw, stride=1, padding=0, dilation=1, groups=1):
    """``conv1d(x[n,c,w], w[k,c/groups,kw])`` + bias (1,k,1) + ``>> 8``, clip [0, 127]."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, w), "int8"))
    wt = relax.Var("w", relax.TensorType((k, c // groups, kw), "int8"))
    bv = relax.Var("b", relax.TensorType((1, k, 1), "int32"))
    with bb.function("main", [x, wt, bv]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv1d(x, wt, strides=stride, padding=padding,
                                           dilation=dilation, groups=groups, out_dtype="int32"))
            out = bb.emit_output(_tail(bb, y, bv, shift=8, clip=(0, 127)))
        bb.emit_func_output(out)
    return bb.get()


# ------------------------------------------------------------------------------------ numpy
def np_conv1d(x, w, stride, padding, dilation):
    """Direct NCW x OIW convolution in int64 (``padding`` = (left, right))."""
    lo, hi = padding
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (lo, hi)))
    k, _, kw = w.shape
    ow = (xp.shape[2] - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((x.shape[0], k, ow), np.int64)
    for j in range(kw):
        patch = xp[:, :, j * dilation:j * dilation + stride * (ow - 1) + 1:stride]
        out += np.einsum("ncw,kc->nkw", patch, w[:, :, j].astype(np.int64))
    return out


def _vta_entry(report, kind, strategy):
    (entry,) = [e for e in report.on_vta if e.reason.startswith(kind + " ")]
    assert entry.reason == f"{kind} ({strategy} embedding)", entry.reason
    return entry


def _run(mod, arrays, strategy):
    """Build for VTA ranking by VTA cycles (the templates are under test: under the default
    end-to-end objective a small instance may run cheaper on the CPU, which
    ``test_small_instance_stays_on_the_cpu_end_to_end`` checks)."""
    with vta_ext.build_options(strategy=strategy, objective="cycles"):
        return vta_and_llvm(mod, arrays)


# ------------------------------------------------------------------------------------ batched matmul
@pytest.mark.parametrize("transpose,bias,strategy", [(False, False, "csp-relaxed"),
                                                      (True, True, "csp-relaxed"),
                                                      (True, False, "csp-strict")])
def test_batched_matmul_on_vta_bit_exact(transpose, bias, strategy):
    b, n, k, m = 2, 8, 32, 16
    mod = bmm_module(b, n, k, m, transpose=transpose, bias=bias)
    arrays = random_inputs(mod, 3)
    got, ref, report = _run(mod, arrays, strategy)
    a, w = arrays[0].astype(np.int64), arrays[1].astype(np.int64)
    acc = np.matmul(a, w.transpose(0, 2, 1) if transpose else w)
    np.testing.assert_array_equal(ref, requantize(acc, arrays[2] if bias else None, 6, (-128, 127)))
    np.testing.assert_array_equal(got, ref)
    entry = _vta_entry(report, "batch_matmul", strategy)
    assert entry.op == "relax.matmul"
    assert (f"2x8x32 @ 2x16x32^T" if transpose else "2x8x32 @ 2x32x16") in entry.detail
    assert ("epilogue bias+shr+clip" if bias else "epilogue shr+clip") in entry.detail
    assert not [e for e in report.on_cpu if e.op == "relax.matmul"]



def _shared_bias_module(bias):
    """``matmul(A[2,8,32], B[2,32,16]) + bias`` with ``bias`` shared by the batches."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((2, 8, 32), "int8"))
    w = relax.Var("w", relax.TensorType((2, 32, 16), "int8"))
    params = [a, w] + ([bias] if isinstance(bias, relax.Var) else [])
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(a, w, out_dtype="int32"))
            out = bb.emit_output(_tail(bb, y, bias, 6))
        bb.emit_func_output(out)
    return bb.get()


def test_batched_matmul_bias_shared_by_the_batches():
    """A constant ``(M,)`` bias is broadcast to every batch at build time and runs on VTA; a
    computed ``(1, 1, M)`` one keeps the operator on the CPU with the reason."""
    values = (np.arange(16, dtype=np.int32) - 8) * 700
    mod = _shared_bias_module(relax.const(values))
    arrays = random_inputs(mod, 15)
    got, ref, report = _run(mod, arrays, "csp-relaxed")
    acc = np.matmul(arrays[0].astype(np.int64), arrays[1].astype(np.int64))
    np.testing.assert_array_equal(ref, requantize(acc, values, 6, (-128, 127)))
    np.testing.assert_array_equal(got, ref)
    assert "epilogue bias+shr+clip" in _vta_entry(report, "batch_matmul", "csp-relaxed").detail
    mod = _shared_bias_module(relax.Var("bias", relax.TensorType((1, 1, 16), "int32")))
    got, ref, report = _run(mod, random_inputs(mod, 15), "csp-relaxed")
    np.testing.assert_array_equal(got, ref)
    assert not report.on_vta
    (entry,) = [e for e in report.on_cpu if e.op == "relax.matmul"]
    assert "shared by every batch but not a constant; give it as (2, 1, 16)" in entry.reason


def test_attention_chain_both_matmuls_on_vta_with_hand_over():
    """``softmax``-free attention ``((Q @ K^T) >> 7 -> int8) @ V >> 7``: both batched matmuls on
    VTA, the second takes the first's packed output over; bit-exact against numpy and llvm."""
    b, n, d = 2, 16, 32
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(nm, relax.TensorType((b, n, d), "int8")) for nm in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            kt = bb.emit(relax.op.permute_dims(k, [0, 2, 1]))
            s = _tail(bb, bb.emit(relax.op.matmul(q, kt, out_dtype="int32")), shift=7)
            out = bb.emit_output(_tail(bb, bb.emit(relax.op.matmul(s, v, out_dtype="int32")), shift=7))
        bb.emit_func_output(out)
    mod = bb.get()
    arrays = random_inputs(mod, 16)
    got, ref, report = _run(mod, arrays, "csp-relaxed")
    qa, ka, va = (a.astype(np.int64) for a in arrays)
    scores = requantize(np.matmul(qa, ka.transpose(0, 2, 1)), None, 7, (-128, 127))
    np.testing.assert_array_equal(
        ref, requantize(np.matmul(scores.astype(np.int64), va), None, 7, (-128, 127)))
    np.testing.assert_array_equal(got, ref)
    first, second = report.on_vta
    assert first.reason == second.reason == "batch_matmul (csp-relaxed embedding)"
    assert "input kept in the packed layout of the previous VTA operator" in second.detail

def test_multiply_tail_overflow_bound_uses_the_inner_extent():
    """A scalar multiply in the tail is offloaded when ``128*128*K*mul`` fits int32 (K = 32:
    2,048 fits, 1.07e9), refused when it does not (8,192: 4.3e9), whatever B's size (32 x 16)."""
    b, n, k, m = 2, 8, 32, 16
    mod = bmm_module(b, n, k, m, mul=2048, shift=12)
    arrays = random_inputs(mod, 5)
    got, ref, report = _run(mod, arrays, "csp-relaxed")
    np.testing.assert_array_equal(got, ref)
    _vta_entry(report, "batch_matmul", "csp-relaxed")
    mod = bmm_module(b, n, k, m, mul=8192, shift=14)
    got, ref, report = _run(mod, random_inputs(mod, 5), "csp-relaxed")
    np.testing.assert_array_equal(got, ref)
    assert not report.on_vta
    (entry,) = [e for e in report.on_cpu if e.op == "relax.matmul"]
    assert "int32" in entry.reason and "batch_matmul" in entry.reason, entry.reason


# ------------------------------------------------------------------------------------ dilated conv2d
@pytest.mark.parametrize("strategy", ["csp-relaxed", "csp-strict"])
def test_dilated_conv2d_on_vta_bit_exact(strategy):
    mod = conv_module(1, 16, 16, 12, 3, stride=1, padding=2, dilation=2)
    arrays = random_inputs(mod, 6)
    got, ref, report = _run(mod, arrays, strategy)
    x, w, b = arrays
    np.testing.assert_array_equal(ref, requantize(conv2d_nchw(x, w, 1, 2, dilation=2), b, 8, (0, 127)))
    np.testing.assert_array_equal(got, ref)
    entry = _vta_entry(report, "dilated_conv2d", strategy)
    assert entry.op == "relax.nn.conv2d" and "s1 p2 d2x2" in entry.detail, entry.detail


def test_dilated_conv2d_strided_thin_channels_relaxed():
    """3 input channels, stride 2, dilation (2, 3): the relaxed embeddings of a thin layer."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 15, 15), "int8"))
    wt = relax.Var("w", relax.TensorType((16, 3, 3, 3), "int8"))
    with bb.function("main", [x, wt]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, wt, strides=2, padding=1, dilation=(2, 3),
                                           out_dtype="int32"))
            out = bb.emit_output(_tail(bb, y, shift=7))
        bb.emit_func_output(out)
    mod = bb.get()
    arrays = random_inputs(mod, 7)
    got, ref, report = _run(mod, arrays, "csp-relaxed")
    np.testing.assert_array_equal(
        ref, requantize(conv2d_nchw(*arrays, 2, 1, dilation=(2, 3)), None, 7, (-128, 127)))
    np.testing.assert_array_equal(got, ref)
    _vta_entry(report, "dilated_conv2d", "csp-relaxed")


# ------------------------------------------------------------------------------------ conv1d
@pytest.mark.parametrize("stride,padding,dilation,strategy", [(1, (1, 1), 1, "csp-relaxed"),
                                                               (2, (2, 1), 2, "csp-relaxed"),
                                                               (1, (1, 1), 1, "csp-strict")])
def test_conv1d_on_vta_bit_exact(stride, padding, dilation, strategy):
    mod = conv1d_module(1, 16, 24, 32, 3, stride, padding, dilation)
    arrays = random_inputs(mod, 9)
    got, ref, report = _run(mod, arrays, strategy)
    x, w, b = arrays
    np.testing.assert_array_equal(ref, requantize(np_conv1d(x, w, stride, padding, dilation), b, 8,
                                                  (0, 127)))
    np.testing.assert_array_equal(got, ref)
    entry = _vta_entry(report, "conv1d", strategy)
    assert entry.op == "relax.nn.conv1d"
    assert f"1x16x24 * 32x16x3 s{stride} p{padding[0]} d{dilation}" in entry.detail, entry.detail



@pytest.mark.parametrize("case", ["bmm", "conv1d"])
def test_odd_shapes_are_padded_and_stay_bit_exact(case):
    """Extents that are no multiple of the 16x16 GEMM: the embedding pads them (the report says
    which) and the result stays bit-exact (conv1d: 3 -> 10 channels, filter 5, stride 3,
    dilation 2, batch 2; batched matmul 3x5x20 @ 3x20x7 with a per-batch bias)."""
    if case == "bmm":
        mod, kind, pads = bmm_module(3, 5, 20, 7, bias=True), "batch_matmul", "cols 7->16"
    else:
        mod, kind, pads = conv1d_module(2, 3, 30, 10, 5, 3, (2, 2), 2), "conv1d", "out channels 10->16"
    arrays = random_inputs(mod, 17)
    got, ref, report = _run(mod, arrays, "csp-relaxed")
    if case == "bmm":
        acc = np.matmul(arrays[0].astype(np.int64), arrays[1].astype(np.int64))
        np.testing.assert_array_equal(ref, requantize(acc, arrays[2], 6, (-128, 127)))
    else:
        np.testing.assert_array_equal(ref, requantize(np_conv1d(arrays[0], arrays[1], 3, (2, 2), 2),
                                                      arrays[2], 8, (0, 127)))
    np.testing.assert_array_equal(got, ref)
    assert "PADDED" in _vta_entry(report, kind, "csp-relaxed").detail
    assert pads in report.on_vta[0].detail

# ------------------------------------------------------------------------------------ stock
STOCK_CASES = {
    "batched matmul": (lambda: bmm_module(2, 8, 32, 16, transpose=True), "relax.matmul"),
    "dilated conv2d": (lambda: conv_module(1, 16, 16, 12, 3, stride=1, padding=2, dilation=2),
                       "relax.nn.conv2d"),
    "conv1d": (lambda: conv1d_module(1, 16, 24, 32, 3, 1, (1, 1)), "relax.nn.conv1d"),
}


@pytest.mark.parametrize("words", sorted(STOCK_CASES))
def test_under_stock_the_operator_stays_on_the_cpu_and_the_refusal_says_what_to_do(words):
    make, op = STOCK_CASES[words]
    mod = make()
    got, ref, report = _run(mod, random_inputs(mod, 4), "stock")
    np.testing.assert_array_equal(got, ref)
    assert not report.on_vta
    (entry,) = [e for e in report.on_cpu if e.op == op]
    assert entry.reason.startswith(f"no stock template for {words}; build with "
                                   "vta_ext.build_options(strategy='csp-relaxed')"), entry.reason


# ------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("case", ["rank4_matmul", "grouped_conv1d", "broadcast_batch"])
def test_non_conformable_variants_are_refused_with_the_reason(case):
    if case == "rank4_matmul":
        mod = bmm_module(3, 8, 16, 16, transpose=True, rank=4)
        op, reason = "relax.matmul", "matmul of rank 4 x rank 4 is not int8 [N,K] x permute_dims"
    elif case == "grouped_conv1d":
        mod = conv1d_module(1, 16, 24, 32, 3, 1, (1, 1), groups=2)
        op, reason = "relax.nn.conv1d", "grouped conv1d (groups=2) has no VTA template"
    else:
        bb = relax.BlockBuilder()
        a = relax.Var("a", relax.TensorType((2, 8, 16), "int8"))
        w = relax.Var("w", relax.TensorType((1, 16, 16), "int8"))
        with bb.function("main", [a, w]):
            with bb.dataflow():
                y = bb.emit(relax.op.matmul(a, w, out_dtype="int32"))
                out = bb.emit_output(_tail(bb, y))
            bb.emit_func_output(out)
        mod = bb.get()
        op, reason = "relax.matmul", "the batch and inner extents must agree (no broadcasting)"
    got, ref, report = _run(mod, random_inputs(mod, 11), "csp-relaxed")
    np.testing.assert_array_equal(got, ref)
    assert not report.on_vta
    (entry,) = [e for e in report.on_cpu if e.op == op]
    assert reason in entry.reason, entry.reason


# ------------------------------------------------------------------------------------ workloads
def test_legalized_workloads_compute_the_operators():
    """The workloads read from the legalized PrimFuncs (pad stage stripped) against numpy, on the
    zero-padded input, with every stride/dilation coefficient in the subscripts."""
    rng = np.random.default_rng(12)
    cw = CspWorkload("conv1d", (("n", 1), ("c", 3), ("w", 17), ("k", 4), ("kw", 3), ("pl", 2),
                                ("pr", 1), ("sw", 2), ("dw", 3)), layout="NCW")
    wl, shapes, steps, pads = operator_workload(cw)
    assert wl.dims == ("n", "k", "ow", "c", "s") and not steps
    x = rng.integers(-128, 128, shapes["data"]).astype(np.int8)
    w = rng.integers(-128, 128, shapes["weight"]).astype(np.int8)
    xp = np.pad(x, pads["data"])
    np.testing.assert_array_equal(wl.reference(xp, w), np_conv1d(x, w, 2, (2, 1), 3))

    cw = CspWorkload("dilated_conv2d", (("n", 1), ("c", 2), ("h", 9), ("w", 10), ("k", 3),
                                        ("kh", 3), ("kw", 2), ("pt", 1), ("pl", 1), ("pb", 1),
                                        ("pr", 1), ("sh", 1), ("sw", 2), ("dh", 2), ("dw", 3)))
    wl, shapes, _, pads = operator_workload(cw)
    assert wl.dims == ("n", "k", "oh", "ow", "c", "r", "s")
    x = rng.integers(-128, 128, shapes["data"]).astype(np.int8)
    w = rng.integers(-128, 128, shapes["weight"]).astype(np.int8)
    np.testing.assert_array_equal(wl.reference(np.pad(x, pads["data"]), w),
                                  conv2d_nchw(x, w, (1, 2), 1, dilation=(2, 3)))

    cw = CspWorkload("batch_matmul", (("b", 2), ("n", 3), ("k", 5), ("m", 4), ("t", 1)))
    wl, shapes, steps, _ = operator_workload(cw)
    assert steps == {"weight": (0, 2, 1)} and shapes["weight"] == (2, 4, 5)
    a = rng.integers(-128, 128, shapes["data"]).astype(np.int8)
    bt = rng.integers(-128, 128, shapes["weight"]).astype(np.int8)
    np.testing.assert_array_equal(wl.reference(a, bt.transpose(0, 2, 1)),
                                  np.matmul(a.astype(np.int64), bt.transpose(0, 2, 1).astype(np.int64)))


def test_no_embedding_keeps_the_operator_on_the_cpu_and_says_why(monkeypatch, tmp_path):
    """Without an embedding (a solver timeout) there is no stock template to fall back to: the
    operator stays on the CPU with the solver's reason (a refusal, not a silent fallback)."""
    from tvm_csp_embed import strategy as csp_strategy

    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    monkeypatch.setattr(csp_strategy, "DEFAULT_TIMEOUT", 0.02)
    mod = conv1d_module(1, 16, 24, 32, 3, 1, (1, 1))
    got, ref, report = _run(mod, random_inputs(mod, 13), "csp-relaxed")
    np.testing.assert_array_equal(got, ref)
    assert not report.on_vta
    (entry,) = [e for e in report.on_cpu if e.op == "relax.nn.conv1d"]
    assert entry.reason.startswith("csp-relaxed: NCW: no embedding found within"), entry.reason
    assert entry.reason.endswith("no stock template to fall back to for conv1d"), entry.reason



# ------------------------------------------------------------------------------------ tuning
def test_conv_reference_is_the_convolution():
    """The tuner's reference convolution against the direct definitions of conftest / above."""
    rng = np.random.default_rng(14)
    x, w = rng.integers(-128, 128, (2, 3, 19)).astype(np.int8), rng.integers(-128, 128, (5, 3, 4))
    np.testing.assert_array_equal(conv_reference(x, w.astype(np.int8), ((3, 1),), (2,), (3,)),
                                  np_conv1d(x, w.astype(np.int8), 2, (3, 1), 3))
    x = rng.integers(-128, 128, (1, 3, 11, 12)).astype(np.int8)
    w = rng.integers(-128, 128, (4, 3, 3, 2)).astype(np.int8)
    np.testing.assert_array_equal(conv_reference(x, w, ((2, 2), (1, 1)), (1, 2), (2, 3)),
                                  conv2d_nchw(x, w, (1, 2), (2, 1), dilation=(2, 3)))


@pytest.mark.parametrize("words", sorted(STOCK_CASES))
def test_tuning_tasks_of_the_new_kinds_verify_on_the_simulator(words):
    """``extract_tasks`` gives one task per operator with a knob space; its TPS point and its
    last valid point equal the numpy reference bit for bit on the functional simulator."""
    from tvm_csp_embed import tune
    from tvm_csp_embed.tune.measure import verify_point

    make, op = STOCK_CASES[words]
    with vta_ext.build_options(strategy="csp-relaxed", objective="cycles"):
        (task,) = tune.extract_tasks(make(), target="ext_vta")
    assert task.kind == {"relax.matmul": "batch_matmul", "relax.nn.conv1d": "conv1d",
                         "relax.nn.conv2d": "dilated_conv2d"}[op]
    assert len(task.knob_space) > 1
    for point in (task.knob_space.tps, task.knob_space.points[-1]):
        assert verify_point(task.spec(), point) is None

def test_small_instance_stays_on_the_cpu_end_to_end():
    """Under the default end-to-end objective, a 2x8x32 @ 2x32x16 batched matmul (the stock
    template refuses it) costs fewer cycles on the CPU (8,192 MACs at the host model's rate, no
    host layout) than on VTA with its packing: it stays there, the report says why with both
    figures, and the result is the llvm build's."""
    mod = bmm_module(2, 8, 32, 16)
    arrays = random_inputs(mod, 3)
    with vta_ext.build_options(strategy="csp-relaxed"):
        got, ref, report = vta_and_llvm(mod, arrays)
    np.testing.assert_array_equal(got, ref)
    (entry,) = [e for e in report.on_cpu if e.op == "relax.matmul"]
    assert "end to end cheaper on the CPU" in entry.reason and "8,192 MACs" in entry.reason, entry.reason
    on_cpu = float(re.search(r"CPU: ([\d,]+) cycles", entry.reason).group(1).replace(",", ""))
    assert on_cpu == pytest.approx(8192 / vta_ext.PYNQ_Z1.cpu_macs_per_cycle, abs=1)
    assert report.cpu_macs == 8192


# ------------------------------------------------------------------------------------ realistic
REALISTIC = {
    "attention heads 12x64x64 @ 12x64x64^T": (lambda: bmm_module(12, 64, 64, 64, transpose=True),
                                               "batch_matmul"),
    "conv1d 1x64x256 k3": (lambda: conv1d_module(1, 64, 256, 64, 3, 1, (1, 1)), "conv1d"),
    "dilated 3x3 d2 on 1x64x28x28": (lambda: conv_module(1, 64, 64, 28, 3, padding=2, dilation=2),
                                     "dilated_conv2d"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REALISTIC))
def test_realistic_shapes_bit_exact_on_vta(name):
    make, kind = REALISTIC[name]
    mod = make()
    got, ref, report = _run(mod, random_inputs(mod, 1), "csp-relaxed")
    np.testing.assert_array_equal(got, ref)
    _vta_entry(report, kind, "csp-relaxed")
