"""Correctness everywhere: every strategy and layout bit-exact against numpy and the llvm build.

* all 108 DeepBench inference convolutions under ``stock``, ``csp-strict`` NCHW, ``csp-strict``
  NHWC and ``csp-relaxed`` (the default run: layers 6, 28 and 107; the rest slow);
* ResNet-18 C1-C11 and MobileNet D1-D9 (facts §7.2) under ``csp-relaxed`` and ``csp-strict``
  (default run: D1; C1 at 224x224 slow, at 32x32 in the whole network);
* whole ResNet-18 and MobileNet-1.0 (quantised, ``relay_examples/models.py``) with ``csp-relaxed``
  against llvm (32x32 inputs in the default run, 224x224 slow).

The reference is a direct numpy convolution with the requantisation tail (``conftest``); the llvm
build of the same Relax module must agree too.
"""
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from conftest import conv2d_nchw, conv_module, requantize, run_module
from test_resnet_layers import RESNET18
from tvm import relax

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
import vta_ext

REPO = Path(__file__).resolve().parents[1]
#: a fresh on-disk embedding cache for this module (conftest ``fresh_embedding_cache``)
pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")
COMBOS = {"stock": dict(strategy="stock"), "csp-strict-NCHW": dict(strategy="csp-strict", layout="NCHW"),
          "csp-strict-NHWC": dict(strategy="csp-strict", layout="NHWC"),
          "csp-relaxed": dict(strategy="csp-relaxed")}
DEEPBENCH_DEFAULT = (6, 28, 107)
#: (H=W, in -> out, groups, kernel, pad, stride), facts §7.2
MOBILENET = {"D1": (112, 32, 2, 3, 1, 1), "D2": (112, 64, 4, 3, 1, 2), "D3": (56, 128, 8, 3, 1, 1),
             "D4": (56, 128, 8, 3, 1, 2), "D5": (28, 256, 16, 3, 1, 1), "D6": (28, 256, 16, 3, 1, 2),
             "D7": (14, 512, 32, 3, 1, 1), "D8": (14, 512, 32, 3, 1, 2), "D9": (7, 1024, 64, 3, 1, 1)}
RESNET_C1 = (224, 3, 64, 7, 3, 2)


def _deepbench():
    spec = importlib.util.spec_from_file_location("embed_deepbench", REPO / "scripts" / "embed_deepbench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {int(r["id"]): {k: int(v) for k, v in r.items() if k != "set"}
            for r in mod.read_layers(REPO / "data" / "deepbench_conv_inference.csv")}


DEEPBENCH = _deepbench()


def _module(n, c, h, w, k, r, s, pad, stride, groups=1):
    from conftest import conv_chain

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, h, w), "int8"))
    wt = relax.Var("w", relax.TensorType((k, c // groups, r, s), "int8"))
    b = relax.Var("b", relax.TensorType((1, k, 1, 1), "int32"))
    with bb.function("main", [x, wt, b]):
        with bb.dataflow():
            y = conv_chain(bb, x, wt, b, stride=stride, padding=pad, shift=8, clip=(-128, 127),
                           groups=groups)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _check(mod, shapes, stride, pad, groups, combos, seed=0, llvm=True):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, shapes[0]).astype(np.int8)
    w = rng.integers(-128, 128, shapes[1]).astype(np.int8)
    b = rng.integers(-(1 << 14), 1 << 14, shapes[2]).astype(np.int32)
    ref = requantize(conv2d_nchw(x, w, stride, pad, groups=groups), b, 8, (-128, 127))
    assert (ref != 0).mean() > 0.2
    if llvm:
        np.testing.assert_array_equal(run_module(mod, "llvm", [x, w, b]), ref)
    reports = {}
    for name in combos:
        with vta_ext.build_options(**COMBOS[name]):
            got = run_module(mod, "ext_vta", [x, w, b])
        report = vta_ext.last_build_report()
        assert [p.op for p in report.on_vta] == ["relax.nn.conv2d"], (name, str(report))
        np.testing.assert_array_equal(got, ref, err_msg=f"{name}: {report.on_vta[0].detail}")
        reports[name] = report
    return reports


def _deepbench_case(layer, combos):
    r = DEEPBENCH[layer]
    n, c, h, w, k = r["n"], r["c"], r["h"], r["w"], r["k"]
    kh, kw, pad, stride = r["filter_h"], r["filter_w"], (r["pad_h"], r["pad_w"]), (r["hstride"], r["wstride"])
    _check(_module(n, c, h, w, k, kh, kw, pad, stride), [(n, c, h, w), (k, c, kh, kw), (1, k, 1, 1)],
           stride, pad, 1, combos, seed=layer)


@pytest.mark.parametrize("layer", [DEEPBENCH_DEFAULT[0], *(pytest.param(i, marks=pytest.mark.slow)
                                                        for i in DEEPBENCH_DEFAULT[1:])])
def test_deepbench_all_strategies(layer):
    _deepbench_case(layer, COMBOS)


@pytest.mark.slow
@pytest.mark.parametrize("layer", [i for i in sorted(DEEPBENCH) if i not in DEEPBENCH_DEFAULT])
def test_deepbench_all_strategies_slow(layer):
    _deepbench_case(layer, COMBOS)


def _resnet_case(name, combos):
    hw, cin, cout, k, pad, stride = RESNET_C1 if name == "C1" else RESNET18[name]
    return _check(conv_module(1, cin, cout, hw, k, stride=stride, padding=pad, shift=8, clip=(-128, 127),
                       order=("bias", "shr", "clip")),
           [(1, cin, hw, hw), (cout, cin, k, k), (1, cout, 1, 1)], stride, pad, 1, combos)


def _mobilenet_case(name, combos):
    hw, ch, groups, k, pad, stride = MOBILENET[name]
    _check(_module(1, ch, hw, hw, ch, k, k, (pad, pad), (stride, stride), groups),
           [(1, ch, hw, hw), (ch, ch // groups, k, k), (1, ch, 1, 1)], stride, pad, groups, combos)


@pytest.mark.slow
def test_resnet18_c1():
    """C1 at 224x224 (its fused-reduction candidates are timed at full size: slow; the whole
    ResNet-18 at 32x32 below covers C1's embedding in the default run)."""
    reports = _resnet_case("C1", ("csp-relaxed", "csp-strict-NCHW"))
    # the solver plans C1 (3 -> 64 channels, 7x7, stride 2): an embedding, not the stock fallback
    for name, report in reports.items():
        detail = report.on_vta[0].detail
        assert "STOCK FALLBACK" not in detail and "; embedding x=" in detail, (name, detail)
    assert "in channels 3->16" not in reports["csp-relaxed"].on_vta[0].detail


def test_mobilenet_d1():
    _mobilenet_case("D1", ("csp-relaxed", "csp-strict-NCHW"))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RESNET18))
def test_resnet18_layers_csp_slow(name):
    _resnet_case(name, ("csp-relaxed", "csp-strict-NHWC"))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in MOBILENET if n != "D1"])
def test_mobilenet_layers_csp_slow(name):
    _mobilenet_case(name, ("csp-relaxed", "csp-strict-NCHW"))


# ------------------------------------------------------------------------------------ networks
def _network(name, size):
    sys.path.insert(0, os.fspath(REPO / "relay_examples"))
    from models import quantized_example

    _, qm, _, data = quantized_example(name, size)
    llvm = relax.VirtualMachine(relax.build(qm.mod, target="llvm"), tvm.cpu())
    ref = llvm["main"](tvm.runtime.tensor(data))[0].numpy()
    with vta_ext.build_options(strategy="csp-relaxed"):
        vm = relax.VirtualMachine(relax.build(qm.mod, target="ext_vta"), tvm.cpu())
    report = vta_ext.last_build_report()
    got = vm["main"](tvm.runtime.tensor(data))[0].numpy()
    np.testing.assert_array_equal(got, ref)
    assert np.abs(ref).max() > 0
    convs = [p for p in report.on_vta if p.op == "relax.nn.conv2d"]
    # every conv: an embedding or the stock template; a depthwise conv: the GEMM block-diagonal
    # program or the stock ALU template, whichever its choice took
    assert convs and all("embedding" in p.reason or "stock" in p.reason
                         or p.reason.startswith("depthwise_conv2d (csp-relaxed")
                         for p in convs)
    assert any(p.reason == "conv2d (csp-relaxed embedding)" for p in convs)
    assert all("STOCK FALLBACK" not in p.detail for p in report.on_vta)


# the default run builds ResNet-18 at 32 under csp-relaxed in test_networks.py, with these checks
@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v1"])
def test_whole_network_csp_relaxed_small(name):
    _network(name, 32)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v1"])
def test_whole_network_csp_relaxed_224(name):
    _network(name, 224)
