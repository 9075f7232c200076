"""Frontends: PyTorch PT2E and ONNX (float and QDQ) graphs through the quantiser; fixed-point
requantisation at its int32 bounds; the errors that explain what to export instead.

References are independent of the quantiser: exact rational arithmetic in Python integers, the
source QDQ graph run by TVM on llvm (the same graph's float semantics), torch's own converted
model, and the llvm build of the same int8 module for ext_vta.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import vta_ext
from vta_ext.quantize import (OnnxImportError, QuantizationError, fixed_point_multiplier,
                              import_onnx, import_pt2e, quantize_onnx, quantize_pt2e,
                              quantize_relax, symmetric_quantizer)
from vta_ext.quantize.graph import QNode
from vta_ext.quantize.scales import _fixed_point_requant

onnx = pytest.importorskip("onnx")  # in the "test" extra: present on a fresh setup


def _run(mod, x, target="llvm"):
    out = relax.VirtualMachine(relax.build(mod, target=target), tvm.cpu())["main"](
        tvm.runtime.tensor(x))
    return out.numpy() if hasattr(out, "numpy") else out[0].numpy()


class Small(nn.Module):
    """conv-ReLU-maxpool-conv-ReLU-flatten-linear, 3x8x8 input."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                  nn.Linear(32 * 4 * 4, 10))

    def forward(self, x):
        return self.body(x)


def _inputs(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(n)]


# ------------------------------------------------------------------ fixed-point requantisation
def _requant_module(shape, rq, lo=-128, hi=127):
    x = relax.Var("acc", relax.TensorType(shape, "int32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            acc = x
            if rq["pre_shift"]:
                acc = bb.emit(relax.op.add(acc, relax.const(1 << (rq["pre_shift"] - 1), "int32")))
                acc = bb.emit(relax.op.right_shift(acc, relax.const(rq["pre_shift"], "int32")))
            m = np.asarray(rq["multiplier"], np.int32)
            acc = bb.emit(relax.op.multiply(acc, relax.const(m.reshape(1, -1, 1, 1))))
            acc = bb.emit(relax.op.add(acc, relax.const(1 << (rq["shift"] - 1), "int32")))
            acc = bb.emit(relax.op.right_shift(acc, relax.const(rq["shift"], "int32")))
            out = bb.emit_output(relax.op.clip(acc, lo, hi))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("ratio", [1.7e-5, 3.7e-6, 1e-4])
def test_fixed_point_requant_at_the_int32_bounds(ratio):
    """The chosen (s1, M, k) never overflows int32 for the proven accumulator bound, and is
    within one LSB of exact rounding of acc * ratio, at the bound and inside it."""
    channels, reduction = 4, 3 * 3 * 512  # a 3x3 conv over 512 channels, all weights at 127
    node = QNode("conv", "c", [0], weight=np.full((channels, 512, 3, 3), 1.0),
                 params={"qweight": (np.full((channels, 512, 3, 3), 127),
                                     np.array([1.0, 0.9, 0.5, 0.25]))}, qscale=1.0)
    src = QNode("input", "x", qscale=ratio)
    rq = _fixed_point_requant(node, [src, node])
    bound = 128 * 127 * reduction
    assert rq["bound"] >= -(-bound // 2 ** rq["pre_shift"])
    m = np.asarray(rq["multiplier"], np.int64)
    # the overflow proof, checked: every product and rounding term fits int32
    assert (rq["bound"] * m + (1 << rq["shift"] - 1)).max() <= 2 ** 31 - 1
    assert m.max() <= 2 ** 15 - 1 and rq["error"] < 0.5  # worst-case error in output LSB
    rng = np.random.default_rng(0)
    acc = rng.integers(-bound, bound + 1, (1, channels, 6, 6)).astype(np.int64)
    acc[0, :, 0, 0], acc[0, :, 0, 1], acc[0, :, 0, 2] = bound, -bound, 0  # the bounds
    got = _run(_requant_module(acc.shape, rq), acc.astype(np.int32))
    ratios = ratio * np.array([1.0, 0.9, 0.5, 0.25]) / 1.0
    exact = np.empty_like(acc)
    for c in range(channels):  # round half up of acc * ratio, in exact rationals
        r = Fraction(float(ratios[c]))
        exact[0, c] = np.reshape([int((Fraction(int(a)) * r + Fraction(1, 2)) // 1)
                                  for a in acc[0, c].ravel()], acc.shape[2:])
    exact = np.clip(exact, -128, 127)
    assert np.abs(got - exact).max() <= 1
    # and the same formula in int64 (no wrap possible) gives the same bits: no int32 overflow
    s1, k = rq["pre_shift"], rq["shift"]
    pre = (acc + (1 << s1 >> 1)) >> s1 if s1 else acc
    ref64 = np.clip((pre * m.reshape(1, -1, 1, 1) + (1 << k - 1)) >> k, -128, 127)
    np.testing.assert_array_equal(got, ref64)


def test_fixed_point_multiplier_refuses_what_cannot_fit():
    with pytest.raises(QuantizationError, match="no fixed-point multiplier"):
        fixed_point_multiplier(1e6, 2 ** 20)
    m, k = fixed_point_multiplier(1 / 3, 1000)
    assert m <= 2 ** 15 - 1 and 1000 * m + (1 << k - 1) < 2 ** 31
    assert abs(m / 2 ** k - 1 / 3) <= 2 ** -(k + 1)


# ------------------------------------------------------------------------------------ PT2E
def _pt2e(model, cal, per_channel):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    exported = torch.export.export(model, (torch.from_numpy(cal[0]),))
    prepared = prepare_pt2e(exported.module(), symmetric_quantizer(per_channel=per_channel))
    for c in cal:
        prepared(torch.from_numpy(c))
    return convert_pt2e(prepared)


@pytest.mark.parametrize("per_channel", [pytest.param(False, marks=pytest.mark.slow), True])
def test_pt2e_graph_within_one_lsb_and_bit_exact_on_vta(per_channel):
    model, cal = Small().eval(), _inputs()
    converted = _pt2e(model, cal, per_channel)
    qm = quantize_pt2e(converted, cal)
    assert qm.cpu_float_ops == []
    kinds = [n.kind for n in qm.nodes]
    assert kinds == ["input", "conv", "maxpool", "conv", "layout", "linear"]
    # the graph's own scales are kept (not powers of two) ...
    scales = [n.scale for n in qm.nodes]
    assert all(s is not None and not float(np.log2(s)).is_integer() for s in scales[:4])
    # ... and its int8 weights: per channel, one multiplier per output channel
    conv = qm.nodes[1]
    assert conv.params["qweight"][1].size == 16
    assert np.asarray(conv.params["requant"]["multiplier"]).size == 16
    x = _inputs(1, seed=7)[0]
    source = _run(import_pt2e(converted, x), x)  # the source QDQ graph, float semantics
    out = _run(qm.mod, x)
    step = qm.nodes[qm.outputs[0]].scale
    assert np.abs(out - source).max() <= step * 1.0001  # at most one output LSB
    torch_out = converted(torch.from_numpy(x)).detach().numpy()
    assert np.abs(out - torch_out).max() <= step * 1.0001
    vta = _run(qm.mod, x, target="ext_vta")
    np.testing.assert_array_equal(vta, out)
    _assert_all_macs_on_vta(qm, "mulv" if per_channel else "+mul+", layers=True)


def _assert_all_macs_on_vta(qm, multiply, layers=False):
    """Every conv2d / matmul of the quantised graph ran on VTA with the fixed-point tail
    (``multiply``: the per-channel vector MUL or the MUL immediate) in its epilogue."""
    report = vta_ext.last_build_report()
    assert report.devices("relax.nn.conv2d") == ["vta", "vta"]
    assert report.devices("relax.matmul") == ["vta"]
    assert report.devices("relax.nn.max_pool2d") == ["vta"]
    for p in report.on_vta:
        if p.op != "relax.nn.max_pool2d":
            assert multiply in p.detail and "+shr+add+shr+clip" in p.detail, p.detail
            assert p.layer or not layers  # the torch layer
    macs = vta_ext.quantize.op_macs(qm.mod)
    on_cpu = {p.detail for p in report.on_cpu}
    assert sum(m for name, (_, m) in macs.items() if name not in on_cpu) == \
        sum(m for _, m in macs.values()) > 0


#: networks of relay_examples/models.py through PT2E (32x32): all their MACs on VTA
PT2E_NETWORKS = ("resnet18", "mobilenet_v2", "mobilenet_v3_small", "squeezenet1_1", "mnasnet0_5",
                 "shufflenet_v2_x0_5")


@pytest.mark.slow
@pytest.mark.parametrize("name", PT2E_NETWORKS)
def test_pt2e_network_on_vta(name):
    """A whole network quantised by PT2E (symmetric int8, per-channel weights): bit-exact against
    llvm, every conv2d / matmul on VTA with the fixed-point tail (1-5 min each)."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "relay_examples"))
    from models import mac_placement, pt2e_quantized

    qm, x = pt2e_quantized(name, 32)
    out = _run(qm.mod, x)
    vta = _run(qm.mod, x, target="ext_vta")
    report = vta_ext.last_build_report()
    np.testing.assert_array_equal(vta, out)
    assert np.abs(out).max() > 0
    placed = mac_placement(vta_ext.quantize.op_macs(qm.mod), report)
    assert placed["consistent"] and placed["cpu"] == 0 and placed["vta"] > 0, placed
    gemm = [p for p in report.on_vta if p.op in ("relax.nn.conv2d", "relax.matmul")]
    assert gemm and all("mul" in p.detail for p in gemm)  # the fixed-point multiply
    print(f"{name} PT2E 32x32: bit-exact, 100 % of {placed['total'] / 1e6:.1f} M MACs on VTA")


def test_pt2e_asymmetric_activations_stay_float_with_the_reason():
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)

    model, cal = Small().eval(), _inputs(2)
    exported = torch.export.export(model, (torch.from_numpy(cal[0]),))
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported.module(), quantizer)
    for c in cal:
        prepared(torch.from_numpy(c))
    qm = quantize_pt2e(convert_pt2e(prepared), cal)
    reasons = {o.op: o.reason for o in qm.cpu_float_ops}
    assert "relax.quantize" in reasons or "relax.dequantize" in reasons
    assert all("zero point" in r and "symmetric" in r for op, r in reasons.items()
               if op in ("relax.quantize", "relax.dequantize"))


# ------------------------------------------------------------------------------------ ONNX
@pytest.fixture(scope="module")
def onnx_models(tmp_path_factory):
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    tmp = tmp_path_factory.mktemp("onnx")
    model, cal = Small().eval(), _inputs()
    float_path = str(tmp / "small.onnx")
    torch.onnx.export(model, (torch.from_numpy(cal[0]),), float_path, input_names=["x"],
                      dynamo=False)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(cal)

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else {"x": x}

    paths = {"float": float_path}
    for fmt in ("QDQ", "QOperator"):
        paths[fmt] = str(tmp / f"small_{fmt}.onnx")
        quantize_static(float_path, paths[fmt], Reader(), quant_format=getattr(QuantFormat, fmt),
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        per_channel=True, extra_options={"ActivationSymmetric": True,
                                                         "WeightSymmetric": True})
    return model, cal, paths


def test_onnx_float_model(onnx_models):
    model, cal, paths = onnx_models
    qm = quantize_onnx(paths["float"], cal)
    assert [n.kind for n in qm.nodes] == ["input", "conv", "maxpool", "conv", "layout", "linear"]
    assert all(n.qscale is None for n in qm.nodes)  # power-of-two scales, calibrated
    x = _inputs(1, seed=7)[0]
    ref = model(torch.from_numpy(x)).detach().numpy()
    out = _run(qm.mod, x)
    assert float(out.ravel() @ ref.ravel() / np.linalg.norm(out) / np.linalg.norm(ref)) > 0.99
    np.testing.assert_array_equal(_run(qm.mod, x, target="ext_vta"), out)


def test_onnx_qdq_model(onnx_models):
    _, cal, paths = onnx_models
    qm = quantize_onnx(paths["QDQ"], cal)
    assert qm.cpu_float_ops == []
    assert qm.nodes[1].qscale is not None and "qweight" in qm.nodes[1].params
    x = _inputs(1, seed=7)[0]
    source = _run(import_onnx(paths["QDQ"], x.shape), x)
    out = _run(qm.mod, x)
    # ONNX Runtime leaves the last Gemm's output unquantised: ours rounds it to its int8 step
    step = qm.nodes[qm.outputs[0]].scale
    assert np.abs(out - source).max() <= step * 1.0001
    np.testing.assert_array_equal(_run(qm.mod, x, target="ext_vta"), out)
    _assert_all_macs_on_vta(qm, "mulv")  # ONNX Runtime's per-channel weights


def test_onnx_qoperator_format_is_explained(onnx_models):
    _, _, paths = onnx_models
    with pytest.raises(OnnxImportError, match=r"QLinearConv.*QuantFormat\.QDQ"):
        import_onnx(paths["QOperator"])


# ------------------------------------------------------------------------------------ errors
def test_error_for_several_inputs_says_what_to_do():
    a = relax.Var("a", relax.TensorType((1, 4), "float32"))
    b = relax.Var("b", relax.TensorType((1, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [a, b]):
        out = bb.emit(relax.op.add(a, b))
        bb.emit_func_output(out)
    with pytest.raises(QuantizationError, match="one tensor input, it takes 2"):
        quantize_relax(bb.get(), np.zeros((1, 4), np.float32))


def test_float_operator_names_the_torch_layer():
    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
            self.head = nn.Sequential(nn.Conv2d(8, 8, 1), nn.Tanh())

        def forward(self, x):
            return self.head(self.features(x))

    from vta_ext.quantize import quantize_torch

    qm = quantize_torch(Gate().eval(), _inputs(1)[0])
    (op,) = qm.cpu_float_ops
    assert (op.layer, op.source_op, op.op) == ("head.1", "aten.tanh", "relax.tanh")
    assert str(op).startswith("relax.tanh at head.1 (aten.tanh): tanh has no int8 form")


@pytest.mark.slow
def test_digits_accuracy_within_the_bar():
    """relay_examples/digits.py: both int8 flows on ext_vta within 1.5 points of float (about
    1 min)."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "relay_examples"))
    import digits

    assert digits.main(["--epochs", "15"]) == 0  # every int8 build bit-exact vs llvm
    results = digits.main.results
    assert results["float"] > 0.95
    assert all(results["float"] - acc <= 0.015 for name, acc in results.items() if name != "float")
