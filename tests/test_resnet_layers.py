"""ResNet-18 C2-C11 (the original integration test's workloads) through the whole path:
Relax module -> relax.build(target="ext_vta") -> offload -> VTA program -> functional simulator,
bit-exact against a direct numpy conv2d with the original compute (>> 8, + bias, clip [0,127])."""
import numpy as np
import pytest
import tvm
from tvm import relax

import vta_ext

# name: (H=W, in, out, kernel, pad, stride)  -- vta-reference-facts.md section 7.2
RESNET18 = {
    "C2": (56, 64, 64, 3, 1, 1), "C3": (56, 64, 128, 3, 1, 2), "C4": (56, 64, 128, 1, 0, 2),
    "C5": (28, 128, 128, 3, 1, 1), "C6": (28, 128, 256, 3, 1, 2), "C7": (28, 128, 256, 1, 0, 2),
    "C8": (14, 256, 256, 3, 1, 1), "C9": (14, 256, 512, 3, 1, 2), "C10": (14, 256, 512, 1, 0, 2),
    "C11": (7, 512, 512, 3, 1, 1),
}
DEFAULT_RUN = ("C7", "C10", "C11")


def _module(hw, cin, cout, k, pad, stride):
    """conv2d -> >> 8 -> + bias -> clip [0, 127] -> int8 (the original test's order)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, cin, hw, hw), "int8"))
    w = relax.Var("w", relax.TensorType((cout, cin, k, k), "int8"))
    b = relax.Var("b", relax.TensorType((1, cout, 1, 1), "int32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=pad, out_dtype="int32"))
            y = bb.emit(relax.op.add(bb.emit(relax.op.right_shift(y, relax.const(8, "int32"))), b))
            y = bb.emit(relax.op.astype(bb.emit(relax.op.clip(y, 0, 127)), "int8"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _reference(x, w, b, pad, stride):
    n, c, h, wd = x.shape
    o, _, k, _ = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    acc = np.zeros((n, o, oh, ow), np.int64)
    for i in range(k):
        for j in range(k):
            acc += np.einsum("nchw,oc->nohw", xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride],
                             w[:, :, i, j].astype(np.int64))
    acc = (acc.astype(np.int32) >> 8) + b
    return np.clip(acc, 0, 127).astype(np.int8)


def _check(name):
    hw, cin, cout, k, pad, stride = RESNET18[name]
    rng = np.random.default_rng(0xDEADB)
    x = rng.integers(-128, 128, (1, cin, hw, hw)).astype(np.int8)
    w = rng.integers(-128, 128, (cout, cin, k, k)).astype(np.int8)
    b = rng.integers(-(1 << 14), 1 << 14, (1, cout, 1, 1)).astype(np.int32)
    vm = relax.VirtualMachine(relax.build(_module(hw, cin, cout, k, pad, stride), target="ext_vta"),
                              tvm.cpu())
    vta_ext.clear_run_log()
    got = vm["main"](*[tvm.runtime.tensor(a) for a in (x, w, b)]).numpy()
    assert [p.op for p in vta_ext.last_build_report().on_vta] == ["relax.nn.conv2d"]
    assert len(vta_ext.run_log()) == 1
    ref = _reference(x, w, b, pad, stride)
    assert (ref != 0).mean() > 0.2, "reference too degenerate to prove anything"
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("name", DEFAULT_RUN)
def test_resnet18_layer(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in RESNET18 if n not in DEFAULT_RUN])
def test_resnet18_layer_slow(name):
    _check(name)
