"""relax.build(..., target="ext_vta") of the ALU-template operators (max / avg pooling, residual add,
depthwise conv2d) versus target="llvm": bit-exact, and the build report places them on VTA."""
import numpy as np
import pytest
from tvm import relax

import vta_ext
from conftest import add_module, random_inputs, run_module
from vta_ext.target import vta_target


_run = run_module


def _inputs(mod, seed, int32_range=1 << 12):
    return random_inputs(mod, seed, int32_range)


def _check(mod, op, kind, seed=0, target="ext_vta", arrays=None):
    arrays = arrays if arrays is not None else _inputs(mod, seed)
    vta_ext.clear_run_log()
    got = _run(mod, target, arrays)
    report = vta_ext.last_build_report()
    assert report.placement() == [(op, "vta")], str(report)
    assert [r.op for r in vta_ext.run_log()] == [kind], vta_ext.run_log()
    want = _run(mod, "llvm", arrays)
    np.testing.assert_array_equal(got, want)
    return got, report


def _max_pool_module(n, c, hw, pool, stride, pad):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, hw, hw), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.max_pool2d(x, pool_size=pool, strides=stride, padding=pad))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("n,c,hw,pool,stride,pad", [
    (1, 16, 8, 2, 2, 0),
    (1, 24, 9, 3, 2, 1),     # ResNet-style stem pool, channels padded to the block
])
def test_max_pool2d_on_vta(n, c, hw, pool, stride, pad):
    _check(_max_pool_module(n, c, hw, pool, stride, pad), "relax.nn.max_pool2d", "max_pool2d")


def test_max_pool2d_with_padding_stays_on_cpu_without_pad_min():
    mod = _max_pool_module(1, 16, 8, 3, 2, 1)
    arrays = _inputs(mod, 1)
    got = _run(mod, vta_target("apache"), arrays)
    report = vta_ext.last_build_report()
    assert report.placement() == [("relax.nn.max_pool2d", "cpu")], str(report)
    assert "EXT_PAD_MIN" in report.on_cpu[0].reason, str(report)
    np.testing.assert_array_equal(got, _run(mod, "llvm", arrays))


def _avg_pool_module(n, c, hw, pool, stride=1, pad=0, count_include_pad=False, clip=(-128, 127)):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, hw, hw), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.astype(x, "int32"))
            y = bb.emit(relax.op.nn.avg_pool2d(y, pool_size=pool, strides=stride, padding=pad,
                                               count_include_pad=count_include_pad))
            y = bb.emit(relax.op.clip(y, *clip))
            out = bb.emit_output(bb.emit(relax.op.astype(y, "int8")))
        bb.emit_func_output(out)
    return bb.get()


def test_global_avg_pool2d_on_vta():
    """ResNet's global pool: 7x7, no padding, int32 sum / 49 truncated toward zero."""
    _check(_avg_pool_module(1, 32, 7, (7, 7)), "relax.nn.avg_pool2d", "avg_pool2d")


@pytest.mark.parametrize("count_include_pad", [False, True])
def test_avg_pool2d_padded_on_vta(count_include_pad):
    mod = _avg_pool_module(1, 16, 6, (3, 3), 1, 1, count_include_pad, clip=(-100, 100))
    _check(mod, "relax.nn.avg_pool2d", "avg_pool2d", seed=3)


@pytest.mark.parametrize("preset,n,c", [("default", 1, 32), ("2x16x16", 3, 24)])
def test_residual_add_on_vta(preset, n, c):
    _check(add_module(n, c, 7), "relax.add", "add", target=vta_target(preset))


@pytest.mark.parametrize("c,hw,stride", [(32, 8, 1), (24, 9, 2)])
def test_depthwise_conv2d_on_vta(c, hw, stride):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, hw, hw), "int8"))
    w = relax.Var("w", relax.TensorType((c, 1, 3, 3), "int8"))
    bias = relax.Var("bias", relax.TensorType((1, c, 1, 1), "int32"))
    with bb.function("main", [x, w, bias]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=1, groups=c,
                                           out_dtype="int32"))
            y = bb.emit(relax.op.add(y, bias))
            y = bb.emit(relax.op.right_shift(y, relax.const(6, "int32")))
            y = bb.emit(relax.op.clip(y, -128, 127))
            out = bb.emit_output(bb.emit(relax.op.astype(y, "int8")))
        bb.emit_func_output(out)
    _check(bb.get(), "relax.nn.conv2d", "depthwise_conv2d", seed=c)
