"""relax.build(mod, target="ext_vta"): offload, packing, build report, bit-exactness vs llvm."""
import numpy as np
import pytest
import tvm
from tvm import relax

import vta_ext


def _conv_chain(bb, x, w, b, *, stride, padding, shift, clip, bias_first=True):
    y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=padding, out_dtype="int32"))
    if b is not None:
        y = bb.emit(relax.op.add(y, b))
    if shift is not None:
        y = bb.emit(relax.op.right_shift(y, relax.const(shift, "int32")))
    if clip is not None:
        y = bb.emit(relax.op.clip(y, *clip))
    return bb.emit(relax.op.astype(y, "int8"))


def _module(n, c, o, hw, k, *, stride=1, padding=1, bias=True, shift=8, clip=(0, 127), extra_cpu=False):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, hw, hw), "int8"))
    w = relax.Var("w", relax.TensorType((o, c, k, k), "int8"))
    params = [x, w]
    b = None
    if bias:
        b = relax.Var("b", relax.TensorType((1, o, 1, 1), "int32"))
        params.append(b)
    with bb.function("main", params):
        with bb.dataflow():
            y = _conv_chain(bb, x, w, b, stride=stride, padding=padding, shift=shift, clip=clip)
            if extra_cpu:
                y = bb.emit(relax.op.nn.max_pool2d(y, pool_size=2, strides=2))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _inputs(mod, seed):
    rng = np.random.default_rng(seed)
    arrays = []
    for p in mod["main"].params:
        shape = tuple(int(d) for d in p.ty.shape)
        if str(p.ty.dtype) == "int8":
            arrays.append(rng.integers(-128, 128, shape).astype(np.int8))
        else:
            arrays.append(rng.integers(-(1 << 14), 1 << 14, shape).astype(np.int32))
    return arrays


def _run(mod, target, arrays):
    vm = relax.VirtualMachine(relax.build(mod, target=target), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def _numpy_reference(x, w, b, stride, padding, shift, clip):
    """Direct int64 conv2d + epilogue, wrapping to int8 like astype."""
    n, c, h, wd = x.shape
    o, _, k, _ = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (padding,) * 2, (padding,) * 2))
    oh = (h + 2 * padding - k) // stride + 1
    ow = (wd + 2 * padding - k) // stride + 1
    acc = np.zeros((n, o, oh, ow), np.int64)
    for i in range(k):
        for j in range(k):
            patch = xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            acc += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j].astype(np.int64))
    acc = acc.astype(np.int32)
    if b is not None:
        acc = acc + b
    if shift is not None:
        acc = acc >> shift
    if clip is not None:
        acc = np.clip(acc, *clip)
    return acc.astype(np.int8)


@pytest.mark.parametrize("n,c,o,hw,k,stride,padding,bias,shift,clip", [
    (1, 16, 32, 8, 3, 1, 1, True, 8, (0, 127)),       # multiples of the block
    (1, 3, 20, 9, 3, 2, 1, True, 6, (-128, 127)),     # thin input, odd output channels, stride 2
    (1, 24, 16, 7, 1, 1, 0, False, 4, None),          # 1x1, no bias, no clip (wrapping store)
    (2, 16, 16, 6, 3, 2, 0, True, None, (-10, 90)),   # batch 2, no shift
])
def test_conv_chain_matches_llvm_and_numpy(n, c, o, hw, k, stride, padding, bias, shift, clip):
    mod = _module(n, c, o, hw, k, stride=stride, padding=padding, bias=bias, shift=shift, clip=clip)
    arrays = _inputs(mod, seed=c * 131 + o)
    vta_ext.clear_run_log()
    got = _run(mod, "ext_vta", arrays)
    assert len(vta_ext.run_log()) == 1, "the conv2d chain must run on VTA exactly once"
    cpu = _run(mod, "llvm", arrays)
    ref = _numpy_reference(arrays[0], arrays[1], arrays[2] if bias else None, stride, padding, shift, clip)
    np.testing.assert_array_equal(cpu, ref)
    np.testing.assert_array_equal(got, ref)
    report = vta_ext.last_build_report()
    assert [p.op for p in report.on_vta] == ["relax.nn.conv2d"]
    padded = c % 16 or o % 16 or n % 1
    assert ("PADDED" in report.on_vta[0].detail) == bool(padded)


def test_report_names_cpu_operators_and_reasons():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "int8"))
    w = relax.Var("w", relax.TensorType((16, 16, 3, 3), "int8"))
    wg = relax.Var("wg", relax.TensorType((16, 8, 3, 3), "int8"))
    xf = relax.Var("xf", relax.TensorType((1, 16, 8, 8), "float32"))
    wf = relax.Var("wf", relax.TensorType((16, 16, 3, 3), "float32"))
    with bb.function("main", [x, w, wg, xf, wf]):
        with bb.dataflow():
            a = _conv_chain(bb, x, w, None, stride=1, padding=1, shift=8, clip=(0, 127))
            g = bb.emit(relax.op.nn.conv2d(x, wg, padding=1, groups=2, out_dtype="int32"))
            g = bb.emit(relax.op.astype(bb.emit(relax.op.clip(g, -128, 127)), "int8"))
            f = bb.emit(relax.op.nn.conv2d(xf, wf, padding=1))
            p = bb.emit(relax.op.nn.max_pool2d(a, pool_size=2))
            s = bb.emit(relax.op.nn.softmax(f))
            out = bb.emit_output(relax.Tuple([p, g, s]))
        bb.emit_func_output(out)
    relax.build(bb.get(), target="ext_vta")
    report = vta_ext.last_build_report()
    assert [p.op for p in report.on_vta] == ["relax.nn.conv2d", "relax.nn.max_pool2d"]
    conv_reasons = [p.reason for p in report.on_cpu if p.op == "relax.nn.conv2d"]
    assert len(conv_reasons) == 2
    assert any("groups=2" in r for r in conv_reasons)
    assert any("float32" in r for r in conv_reasons)
    assert any(p.op == "relax.nn.softmax" and "no VTA template" in p.reason for p in report.on_cpu)
    assert "VTA runs 1x relax.nn.conv2d, 1x relax.nn.max_pool2d" in report.summary()


def test_llvm_target_is_untouched():
    mod = _module(1, 16, 16, 6, 3)
    vta_ext.clear_run_log()
    _run(mod, "llvm", _inputs(mod, 0))
    assert vta_ext.run_log() == []


def test_streams_are_built_at_build_time_not_at_run_time():
    from vta_ext import executor

    mod = _module(1, 16, 16, 5, 3, stride=1, padding=1, shift=7)
    executable = relax.build(mod, target="ext_vta")
    built = dict(executor._COMPILED)
    assert built, "building must generate the instruction stream"
    vm = relax.VirtualMachine(executable, tvm.cpu())
    arrays = _inputs(mod, 3)
    for _ in range(2):
        vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    assert executor._COMPILED.keys() == built.keys()
    assert all(executor._COMPILED[k] is built[k] for k in built)


def test_consecutive_vta_convs_keep_packed_layout():
    """conv -> conv: no unpack/pack pair in between, and still bit-exact. clip lo = 3 makes the
    producer's padded channels non-zero, so they must be cancelled by zero-padded weights."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 5, 8, 8), "int8"))
    w1 = relax.Var("w1", relax.TensorType((20, 5, 3, 3), "int8"))
    w2 = relax.Var("w2", relax.TensorType((12, 20, 1, 1), "int8"))
    with bb.function("main", [x, w1, w2]):
        with bb.dataflow():
            y = _conv_chain(bb, x, w1, None, stride=1, padding=1, shift=5, clip=(3, 100))
            y = _conv_chain(bb, y, w2, None, stride=2, padding=0, shift=4, clip=(-128, 127))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    arrays = _inputs(mod, 11)
    vta_ext.clear_run_log()
    got = _run(mod, "ext_vta", arrays)
    report = vta_ext.last_build_report()
    assert len(vta_ext.run_log()) == 2
    assert "kept in the packed layout" in report.on_vta[1].detail
    transposes = [p for p in report.on_cpu if p.op == "relax.permute_dims"]
    assert len(transposes) == 4  # pack data + 2 weights, one final unpack: none between the convs
    y1 = _numpy_reference(arrays[0], arrays[1], None, 1, 1, 5, (3, 100))
    np.testing.assert_array_equal(got, _numpy_reference(y1, arrays[2], None, 2, 0, 4, (-128, 127)))
    np.testing.assert_array_equal(got, _run(mod, "llvm", arrays))
