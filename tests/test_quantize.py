"""The VTA-style quantiser (vta_ext.quantize): canonical patterns, numerics, accuracy, determinism.

Accuracy bars (measured on this machine, seed 0, 32x32 inputs; random-weight networks, so the
metric is relative to how much the float logits depend on the input at all):

* ``cos``: cosine similarity of the int8 logits (llvm) and the float torch logits;
* ``rel``: ``|q(x) - f(x)| / |f(x) - f(x')|`` for an unrelated input ``x'`` — the quantisation
  error as a fraction of the input-dependent part of the output.

ResNet-18 measured cos 0.984-0.991, rel 0.14-0.20 over 8 inputs; MobileNet v1 cos 0.80-0.90,
rel 0.45-0.70 (the random MobileNet is sensitive: 1 % input noise alone gives cos 0.993 at 64x64).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

from vta_ext.quantize import (QuantizationError, fold_batchnorm, equalize_cross_layer, op_macs,
                              quantize_torch)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "relay_examples"))
from models import make_model, quantized_example  # noqa: E402

Constant = tvm.ir.expr.Constant


# ----------------------------------------------------------------------- pattern checker
def _op(expr):
    return expr.op.name if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) else None


def _shape(expr):
    return tuple(int(d) for d in expr.ty.shape)


def _dtype(expr):
    return str(expr.ty.dtype)


def _requant_tail(value_of, users, var, *, shift_required):
    """Follow ``var`` -> [right_shift] -> clip -> astype int8; return a problem or None."""
    nxt = users.get(var.name, [])
    if len(nxt) != 1:
        return f"{var.name} has {len(nxt)} users, expected one requantisation chain"
    call = value_of[nxt[0]]
    if _op(call) == "relax.right_shift":
        amount = call.args[1]
        if not isinstance(amount, Constant) or _shape(amount) != () or _dtype(amount) != "int32":
            return f"{nxt[0]}: shift amount is not a scalar int32 constant"
        if not 0 <= int(amount.value.numpy()) <= 31:
            return f"{nxt[0]}: shift {int(amount.value.numpy())} outside 0..31"
        nxt = users.get(nxt[0], [])
        if len(nxt) != 1:
            return "right_shift must have one user (clip)"
        call = value_of[nxt[0]]
    elif shift_required:
        return f"{var.name}: expected right_shift, found {_op(call)}"
    if _op(call) != "relax.clip":
        return f"expected clip, found {_op(call)}"
    bounds = (int(call.args[1].value), int(call.args[2].value))
    if bounds not in ((0, 127), (-128, 127)):
        return f"{nxt[0]}: clip bounds {bounds}"
    nxt = users.get(nxt[0], [])
    if len(nxt) != 1 or _op(value_of[nxt[0]]) != "relax.astype" \
            or str(value_of[nxt[0]].attrs.dtype) != "int8":
        return "clip is not followed by astype int8"
    return None


def canonical_violations(mod):
    """Every conv2d/matmul/pool/add of ``main`` checked against the quantiser/offload contract."""
    bindings = [b for block in mod["main"].body.blocks for b in block.bindings]
    value_of = {b.var.name: b.value for b in bindings}
    users = {}
    for b in bindings:
        relax.analysis.post_order_visit(
            b.value, lambda e, n=b.var.name: users.setdefault(e.name, []).append(n)
            if isinstance(e, relax.Var) else None)
    problems, counts = [], {}
    for b in bindings:
        op, v, name = _op(b.value), b.value, b.var.name
        counts[op] = counts.get(op, 0) + 1
        problem = None
        if op == "relax.nn.conv2d":
            data, weight = v.args
            if (_dtype(data), _dtype(weight), str(v.attrs.out_dtype)) != ("int8", "int8", "int32"):
                problem = "conv2d dtypes"
            elif not isinstance(weight, Constant):
                problem = "conv2d weight is not a constant"
            elif (v.attrs.data_layout, v.attrs.kernel_layout) != ("NCHW", "OIHW"):
                problem = "conv2d layout"
            else:
                nxt = users.get(name, [])
                bias = value_of[nxt[0]] if len(nxt) == 1 else None
                if _op(bias) == "relax.add":
                    const = bias.args[1]
                    o = _shape(weight)[0]
                    if not isinstance(const, Constant) or _dtype(const) != "int32" \
                            or _shape(const) != (1, o, 1, 1):
                        problem = f"conv2d bias is not an int32 constant (1, {o}, 1, 1)"
                    else:
                        problem = _requant_tail(value_of, users, b_var(bindings, nxt[0]),
                                                shift_required=True)
                else:
                    problem = _requant_tail(value_of, users, b.var, shift_required=True)
        elif op == "relax.matmul":
            lhs, rhs = v.args
            perm = value_of.get(rhs.name) if isinstance(rhs, relax.Var) else None
            if (_dtype(lhs), str(v.attrs.out_dtype), len(_shape(lhs))) != ("int8", "int32", 2):
                problem = "matmul dtypes/rank"
            elif _op(perm) != "relax.permute_dims" or not isinstance(perm.args[0], Constant) \
                    or _dtype(perm.args[0]) != "int8" \
                    or [int(a) for a in perm.attrs.axes] != [1, 0]:
                problem = "matmul rhs is not permute_dims(int8 constant [M, K])"
            else:
                nxt = users.get(name, [])
                bias = value_of[nxt[0]] if len(nxt) == 1 else None
                m = _shape(perm.args[0])[0]
                if _op(bias) == "relax.add":
                    const = bias.args[1]
                    if not isinstance(const, Constant) or _dtype(const) != "int32" \
                            or _shape(const) != (m,):
                        problem = f"matmul bias is not an int32 constant [{m}]"
                    else:
                        problem = _requant_tail(value_of, users, b_var(bindings, nxt[0]),
                                                shift_required=True)
                else:
                    problem = _requant_tail(value_of, users, b.var, shift_required=True)
        elif op == "relax.nn.max_pool2d":
            if _dtype(v.args[0]) != "int8":
                problem = "max_pool2d input is not int8"
        elif op == "relax.nn.avg_pool2d":
            src = value_of.get(v.args[0].name) if isinstance(v.args[0], relax.Var) else None
            if _op(src) != "relax.astype" or _dtype(src.args[0]) != "int8" or _dtype(v.args[0]) != "int32":
                problem = "avg_pool2d input is not astype(int8 -> int32)"
            elif tuple(int(p) for p in v.attrs.pool_size) != _shape(v.args[0])[2:]:
                problem = "avg_pool2d is not global"
            else:
                problem = _requant_tail(value_of, users, b.var, shift_required=False)
        elif op == "relax.add":
            lhs, rhs = v.args
            if isinstance(rhs, Constant):  # a bias: must directly follow a conv2d or matmul
                if _op(value_of.get(getattr(lhs, "name", ""), None)) not in (
                        "relax.nn.conv2d", "relax.matmul"):
                    problem = "constant add that is not a conv/matmul bias"
            else:
                srcs = [value_of.get(a.name) if isinstance(a, relax.Var) else None for a in v.args]
                if any(_op(s) != "relax.astype" or _dtype(s.args[0]) != "int8" for s in srcs):
                    problem = "residual add operands are not astype(int8 -> int32)"
                elif _shape(lhs) != _shape(rhs):
                    problem = "residual add of different shapes"
                else:
                    problem = _requant_tail(value_of, users, b.var, shift_required=False)
        elif op is not None and getattr(b.var.ty, "dtype", None) == "float32" and op not in (
                "relax.multiply", "relax.round", "relax.clip", "relax.astype"):
            problem = f"float operator {op} outside input quantisation / output dequantisation"
        if problem:
            problems.append(f"{name} ({op}): {problem}")
    return problems, counts


def b_var(bindings, name):
    return next(b.var for b in bindings if b.var.name == name)


# --------------------------------------------------------------------------- helpers
def _run_llvm(mod, x):
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x))[0].numpy()


def _cos(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


class Tiny(nn.Module):
    """conv(+BN)-ReLU-maxpool-linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(torch.relu(self.bn(self.conv(x)))), 1))


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = Tiny().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.3, 0.3)
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn.weight.uniform_(0.5, 1.5)
        model.bn.bias.uniform_(-0.2, 0.2)
    rng = np.random.default_rng(0)
    cal = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    return model, quantize_torch(model, cal), cal


# ---------------------------------------------------------------------------- tiny model
def test_tiny_patterns_and_accuracy(tiny):
    model, qm, cal = tiny
    problems, counts = canonical_violations(qm.mod)
    assert problems == []
    assert counts.get("relax.nn.conv2d") == 1 and counts.get("relax.matmul") == 1
    assert counts.get("relax.nn.max_pool2d") == 1
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    ref = model(torch.from_numpy(x)).detach().numpy()
    out = _run_llvm(qm.mod, x)
    assert _cos(out, ref) > 0.99  # measured 0.999+


def test_tiny_matches_documented_integer_scheme(tiny):
    """Recompute the int8 network in numpy from the node scales and the float weights."""
    model, qm, cal = tiny
    kinds = [n.kind for n in qm.nodes]
    assert kinds == ["input", "conv", "maxpool", "layout", "linear"]
    inp, conv, _, _, lin = qm.nodes
    assert conv.relu and not lin.relu
    folded = fold_batchnorm(model)
    equalize_cross_layer(folded)  # no conv-relu-conv pair here: nothing changes
    w = folded.conv.weight.detach().double().numpy()
    b = folded.conv.bias.detach().double().numpy()

    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8))
    xq = np.clip(np.round(x * 2.0 ** -inp.exponent), -128, 127).astype(np.int64)
    wq = np.clip(np.round(w * 2.0 ** -conv.weight_exponent), -128, 127).astype(np.int64)
    e_acc = inp.exponent + conv.weight_exponent
    assert conv.shift == conv.exponent - e_acc >= 0
    bq = np.round(b * 2.0 ** -e_acc).astype(np.int64) + (1 << conv.shift - 1 if conv.shift else 0)
    xp = np.pad(xq, ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((1, 8, 8, 8), np.int64)
    for i in range(3):
        for j in range(3):
            acc += np.einsum("nchw,oc->nohw", xp[:, :, i:i + 8, j:j + 8], wq[:, :, i, j])
    y = np.clip((acc + bq.reshape(1, -1, 1, 1)) >> conv.shift, 0, 127)
    y = y.reshape(1, 8, 4, 2, 4, 2).max(axis=(3, 5)).reshape(1, -1)
    assert qm.nodes[2].exponent == qm.nodes[3].exponent == conv.exponent  # pool/reshape keep scale
    fw = model.fc.weight.detach().double().numpy()
    fb = model.fc.bias.detach().double().numpy()
    fwq = np.clip(np.round(fw * 2.0 ** -lin.weight_exponent), -128, 127).astype(np.int64)
    e_acc = conv.exponent + lin.weight_exponent
    fbq = np.round(fb * 2.0 ** -e_acc).astype(np.int64) + (1 << lin.shift - 1 if lin.shift else 0)
    z = np.clip((y @ fwq.T + fbq) >> lin.shift, -128, 127) * 2.0 ** lin.exponent
    np.testing.assert_array_equal(_run_llvm(qm.mod, x.astype(np.float32)), z.astype(np.float32))


def test_tiny_deterministic(tiny):
    model, qm, cal = tiny
    again = quantize_torch(model, cal)
    tvm.ir.assert_structural_equal(again.mod, qm.mod, map_free_vars=True)
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(_run_llvm(qm.mod, x), _run_llvm(again.mod, x))


# ------------------------------------------------------------------------- scale rules
class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(8, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.dead = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = torch.relu(self.c2(y) + x)
        return torch.relu(self.dead(y)), y.mean((2, 3), keepdim=True)


def test_residual_scales_and_no_negative_shift():
    torch.manual_seed(1)
    model = Residual().eval()
    with torch.no_grad():
        model.c2.weight.mul_(8.0)  # branch range far above the shortcut's
        model.dead.bias.fill_(-100.0)  # ReLU output identically zero: calibrated range 0
    cal = np.random.default_rng(0).standard_normal((1, 8, 8, 8)).astype(np.float32)
    qm = quantize_torch(model, cal)
    assert canonical_violations(qm.mod)[0] == []
    nodes = qm.nodes
    add = next(n for n in nodes if n.kind == "add")
    a, b = (nodes[i] for i in add.inputs)
    assert a.exponent == b.exponent  # one scale for both operands of the residual add
    assert max(a.max_abs, b.max_abs) / 2.0 ** a.exponent <= 127
    for n in nodes:
        assert 0 <= n.shift <= 31
    dead = next(n for n in nodes if n.kind == "conv" and n.max_abs == 0.0)
    assert dead.shift == 0 and dead.exponent == nodes[dead.inputs[0]].exponent + dead.weight_exponent
    pool = next(n for n in nodes if n.kind == "avgpool")
    assert pool.exponent >= nodes[pool.inputs[0]].exponent
    outs = _run_llvm_all(qm.mod, cal)
    refs = [t.detach().numpy() for t in model(torch.from_numpy(cal))]
    assert not outs[0].any()
    assert _cos(outs[1], refs[1]) > 0.99


def _run_llvm_all(mod, x):
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    return [t.numpy() for t in vm["main"](tvm.runtime.tensor(x))]


def test_unknown_operator_stays_float_on_the_cpu():
    """Partial quantisation: the sigmoid runs in float32 between two int8 convolutions."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.Sigmoid(), nn.Conv2d(16, 8, 1)).eval()
    cal = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    qm = quantize_torch(model, cal)
    assert [n.kind for n in qm.nodes] == ["input", "conv", "float", "quant", "conv"]
    (op,) = qm.cpu_float_ops
    assert (op.op, op.layer, op.source_op) == ("relax.sigmoid", "1", "aten.sigmoid")
    assert "lookup-table" in op.reason
    bound = {b.var.name: b.value for blk in qm.mod["main"].body.blocks for b in blk.bindings}
    assert _op(bound[op.var]) == "relax.sigmoid" and _dtype(bound[op.var].args[0]) == "float32"
    assert "1 (aten.sigmoid)" in qm.cpu_float_table()
    convs = [v for v in bound.values() if _op(v) == "relax.nn.conv2d"]
    assert [_dtype(c.args[0]) for c in convs] == ["int8", "int8"]
    assert qm.layers[next(k for k, v in bound.items() if _op(v) == "relax.nn.conv2d")] == \
        "0 (aten.convolution)"
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert _cos(_run_llvm(qm.mod, x), model(torch.from_numpy(x)).detach().numpy()) > 0.999


def test_real_errors_name_the_layer():
    """A calibration input of zeros leaves no int32 range for the bias: the error says where."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Sigmoid()).eval()
    with pytest.raises(QuantizationError, match=r"conv at 0 \(aten.convolution\).*bias"):
        quantize_torch(model, np.zeros((1, 3, 8, 8), np.float32))


def test_equalisation_is_exact_in_float():
    model = make_model("mobilenet_v1", size=32, blocks=((16, 1), (32, 2)), num_classes=10)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    folded = fold_batchnorm(model)
    before = folded(x)

    def imbalance():  # per-channel range ratio of block 1's depthwise and pointwise convs
        dw = folded.get_submodule("features.3")  # depthwise conv of block 1 (BN folded into it)
        pw = folded.get_submodule("features.6")
        r1 = dw.weight.abs().reshape(dw.out_channels, -1).amax(1)
        r2 = pw.weight.abs().amax(dim=(0, 2, 3))
        return float((torch.log(r1 / r2)).abs().max())

    assert imbalance() > 0.3
    assert equalize_cross_layer(folded) == 4  # stem->dw, dw->pw, pw->dw, dw->pw
    torch.testing.assert_close(folded(x), before, rtol=1e-4, atol=1e-4)
    assert imbalance() < 0.05  # measured 0.012 after the 8 sweeps over the chain of pairs


# ------------------------------------------------------------------------ whole networks
@pytest.mark.parametrize("name, cos_bar, rel_bar", [
    ("resnet18", 0.95, 0.35),
    pytest.param("mobilenet_v1", 0.75, 0.85, marks=pytest.mark.slow),
])
def test_network_quantisation(name, cos_bar, rel_bar):
    model, qm, cal, data = quantized_example(name, 32)
    problems, counts = canonical_violations(qm.mod)
    assert problems == []
    n_conv = 20 if name == "resnet18" else 27
    assert counts["relax.nn.conv2d"] == n_conv and counts["relax.matmul"] == 1
    if name == "mobilenet_v1":
        groups = [int(b.value.attrs.groups) for blk in qm.mod["main"].body.blocks
                  for b in blk.bindings if _op(b.value) == "relax.nn.conv2d"]
        assert sum(g > 1 for g in groups) == 13  # the depthwise convs
    else:
        assert counts["relax.add"] == 20 + 1 + 8  # 20 conv biases, the fc bias, 8 residual adds
    vm = relax.VirtualMachine(relax.build(qm.mod, target="llvm"), tvm.cpu())
    with torch.no_grad():
        ref = model(torch.from_numpy(data)).numpy()
        other = model(torch.from_numpy(cal)).numpy()
    out = vm["main"](tvm.runtime.tensor(data))[0].numpy()
    assert _cos(out, ref) > cos_bar
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref - other) < rel_bar
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(data))[0].numpy(), out)


def test_op_macs():
    _, qm, _, _ = quantized_example("resnet18", 32)
    macs = op_macs(qm.mod)
    assert len(macs) == 21
    # the stem: 64 x 16 x 16 outputs, 3 x 7 x 7 taps each; the classifier: 512 x 1000
    assert next(iter(macs.values())) == ("relax.nn.conv2d", 64 * 16 * 16 * 3 * 49)
    assert [m for op, m in macs.values() if op == "relax.matmul"] == [512 * 1000]


# ------------------------------------------------------------------ the operators of issue 11
def _bindings(mod):
    return {b.var.name: b.value for blk in mod["main"].body.blocks for b in blk.bindings}


def test_hardswish_integer_arithmetic_matches_numpy():
    """Hardswish of the quantised input: recomputed in numpy from the documented formula and the
    node's constants, bit for bit; within 1.5 output LSB of the float function."""
    model = nn.Hardswish().eval()
    rng = np.random.default_rng(0)
    cal = (rng.standard_normal((1, 4, 8, 8)) * 3).astype(np.float32)
    qm = quantize_torch(model, cal)
    inp, hs = qm.nodes
    assert (inp.kind, hs.kind) == ("input", "hswish") and qm.cpu_float_ops == []
    p = hs.params
    assert 128 * p["t_max"] * p["multiplier"] + (1 << p["shift"] - 1) < 2 ** 31  # no overflow
    x = (rng.standard_normal((1, 4, 8, 8)) * 3).astype(np.float32)
    xq = np.clip(np.round(x.astype(np.float64) / inp.scale), -128, 127).astype(np.int64)
    t = np.clip(xq + p["three"], 0, p["t_max"])
    y = np.clip((xq * t * p["multiplier"] + (1 << p["shift"] - 1)) >> p["shift"], -128, 127)
    np.testing.assert_array_equal(_run_llvm(qm.mod, x), (y * hs.scale).astype(np.float32))
    ref = model(torch.from_numpy(x)).numpy()
    assert np.abs(_run_llvm(qm.mod, x) - ref).max() <= 1.5 * hs.scale + inp.scale


def test_relu6_is_the_requantisation_clip():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU6()).eval()
    with torch.no_grad():
        model[0].weight.mul_(20)  # most outputs above 6: the clip matters
    cal = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    qm = quantize_torch(model, cal)
    conv = qm.nodes[1]
    assert (conv.lo, conv.hi) == (0.0, 6.0) and qm.cpu_float_ops == []
    clips = [v for v in _bindings(qm.mod).values() if _op(v) == "relax.clip"
             and _dtype(v) == "int32"]
    bounds = [(int(c.args[1].value), int(c.args[2].value)) for c in clips]
    assert bounds == [(0, int(round(6 / conv.scale)))] and bounds[0][1] <= 127
    out = _run_llvm(qm.mod, cal)
    assert out.max() == 6.0 and out.min() == 0.0


def test_concat_split_and_shuffle_are_int8_layout():
    """Concat shares one scale (the producers' shifts absorb it); split and channel shuffle move
    int8 values without arithmetic: the output is the quantised input, permuted."""
    class Shuffle(nn.Module):
        def forward(self, x):
            x = nn.functional.max_pool2d(x, 1)  # an int8 operator first: layout follows it
            a, b = x.chunk(2, dim=1)
            y = torch.cat([b, a, x], 1)
            n, c, h, w = y.shape
            return y.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)

    x = np.random.default_rng(0).standard_normal((1, 8, 4, 4)).astype(np.float32)
    qm = quantize_torch(Shuffle().eval(), x)
    assert [n.kind for n in qm.nodes] == ["input", "maxpool", "split", "layout", "layout",
                                          "concat", "layout", "layout", "layout"]
    assert len({n.exponent for n in qm.nodes}) == 1
    s = qm.nodes[0].scale
    xq = np.clip(np.round(x / s), -128, 127) * s
    expected = Shuffle()(torch.from_numpy(xq.astype(np.float32))).numpy()
    np.testing.assert_array_equal(_run_llvm(qm.mod, x), expected)


def test_concat_of_differently_scaled_convs_shares_one_scale():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(3, 8, 1)

        def forward(self, x):
            return torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x))], 1)

    torch.manual_seed(0)
    model = Two().eval()
    with torch.no_grad():
        model.b.weight.mul_(16)
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
    qm = quantize_torch(model, x)
    a, b, cat = (n for n in qm.nodes if n.kind in ("conv", "concat"))
    assert a.exponent == b.exponent == cat.exponent and a.shift > b.shift
    assert _cos(_run_llvm(qm.mod, x), model(torch.from_numpy(x)).detach().numpy()) > 0.99


@pytest.mark.parametrize("pool, kernel", [
    (nn.AdaptiveAvgPool2d(2), (4, 4)),  # 8x8 -> 2x2: avg_pool2d with kernel = stride = 4
    (nn.AvgPool2d(3, 1, 1), (3, 3)),    # non-global, padded
])
def test_average_pools_are_int8(pool, kernel):
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), pool).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    qm = quantize_torch(model, x)
    assert [n.kind for n in qm.nodes] == ["input", "conv", "avgpool"]
    (call,) = [v for v in _bindings(qm.mod).values() if _op(v) == "relax.nn.avg_pool2d"]
    assert tuple(int(k) for k in call.attrs.pool_size) == kernel
    assert _cos(_run_llvm(qm.mod, x), model(torch.from_numpy(x)).detach().numpy()) > 0.99


def test_mean_without_keepdims_and_an_adaptive_pool_that_does_not_divide():
    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)
            self.odd = nn.AdaptiveAvgPool2d(3)  # 8 -> 3: windows of unequal size

        def forward(self, x):
            y = torch.relu(self.conv(x))
            return y.mean([2, 3]), self.odd(y)

    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    torch.manual_seed(0)
    model = Heads().eval()
    qm = quantize_torch(model, x)
    assert [n.kind for n in qm.nodes] == ["input", "conv", "avgpool", "float"]
    assert qm.nodes[2].params["squeeze"]
    (op,) = qm.cpu_float_ops
    assert op.layer == "odd" and "does not divide" in op.reason
    outs = _run_llvm_all(qm.mod, x)
    refs = [t.detach().numpy() for t in model(torch.from_numpy(x))]
    assert outs[0].shape == (1, 16) and _cos(outs[0], refs[0]) > 0.99
    np.testing.assert_allclose(outs[1], refs[1], atol=2 * qm.nodes[1].scale)


def test_adaptive_pool_to_its_own_size_is_the_identity():
    """VGG/AlexNet at 224x224: AdaptiveAvgPool2d(7) of a 7x7 map is an alias, no operator."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(8),
                          nn.Flatten(), nn.Linear(512, 4)).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    qm = quantize_torch(model, x)
    assert [n.kind for n in qm.nodes] == ["input", "conv", "layout", "layout", "linear"]
    assert not any(_op(v) == "relax.nn.avg_pool2d" for v in _bindings(qm.mod).values())
    assert _cos(_run_llvm(qm.mod, x), model(torch.from_numpy(x)).detach().numpy()) > 0.99
