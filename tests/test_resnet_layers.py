"""ResNet-18 C2-C11 (the original integration test's workloads) through the whole path:
Relax module -> relax.build(target="ext_vta") -> offload -> VTA program -> functional simulator,
bit-exact against a direct numpy conv2d with the original compute (>> 8, + bias, clip [0,127])."""
import numpy as np
import pytest
import tvm
from tvm import relax

import vta_ext
from conftest import conv2d_nchw, conv_module, requantize

# name: (H=W, in, out, kernel, pad, stride)  -- vta-reference-facts.md section 7.2
RESNET18 = {
    "C2": (56, 64, 64, 3, 1, 1), "C3": (56, 64, 128, 3, 1, 2), "C4": (56, 64, 128, 1, 0, 2),
    "C5": (28, 128, 128, 3, 1, 1), "C6": (28, 128, 256, 3, 1, 2), "C7": (28, 128, 256, 1, 0, 2),
    "C8": (14, 256, 256, 3, 1, 1), "C9": (14, 256, 512, 3, 1, 2), "C10": (14, 256, 512, 1, 0, 2),
    "C11": (7, 512, 512, 3, 1, 1),
}
DEFAULT_RUN = ("C7", "C10", "C11")


def _check(name):
    hw, cin, cout, k, pad, stride = RESNET18[name]
    rng = np.random.default_rng(0xDEADB)
    x = rng.integers(-128, 128, (1, cin, hw, hw)).astype(np.int8)
    w = rng.integers(-128, 128, (cout, cin, k, k)).astype(np.int8)
    b = rng.integers(-(1 << 14), 1 << 14, (1, cout, 1, 1)).astype(np.int32)
    order = ("shr", "bias", "clip")  # the original test's compute: (conv >> 8) + bias, clip [0, 127]
    mod = conv_module(1, cin, cout, hw, k, stride=stride, padding=pad, shift=8, clip=(0, 127),
                      order=order)
    vm = relax.VirtualMachine(relax.build(mod, target="ext_vta"), tvm.cpu())
    vta_ext.clear_run_log()
    got = vm["main"](*[tvm.runtime.tensor(a) for a in (x, w, b)]).numpy()
    assert vta_ext.last_build_report().placement() == [("relax.nn.conv2d", "vta")]
    assert [r.op for r in vta_ext.run_log()] == ["conv2d"]
    ref = requantize(conv2d_nchw(x, w, stride, pad), b, 8, (0, 127), order)
    assert (ref != 0).mean() > 0.2, "reference too degenerate to prove anything"
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("name", DEFAULT_RUN)
def test_resnet18_layer(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in RESNET18 if n not in DEFAULT_RUN])
def test_resnet18_layer_slow(name):
    _check(name)
