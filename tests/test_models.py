"""The 15 networks of issue 11: quantised, built for ext_vta and llvm, equal bits, and the exact
placement of every operator.

The expected placement is computed from the quantised module's structure and the documented
offload coverage (README "Offloaded patterns", docs/templates-api.md, the stock templates'
refusals), never from the build report itself:

* a *VTA candidate* is ``core -> tail -> astype int8`` with ``core`` an int8 conv2d (any groups),
  ``matmul(int8, permute_dims(int8))``, ``avg_pool2d(astype(int8 -> int32))`` or
  ``add(astype(int8), astype(int8))`` of 4-D tensors, and ``tail`` a bias add / right shift /
  clip (each at most once, any order); or a ``max_pool2d`` of int8;
* the stock templates take it unless: dilation != 1 or asymmetric padding; a group conv whose
  channels per group are not multiples of the 16x16 GEMM block; a pool with ``ceil_mode`` or
  padding not smaller than its window; an average pool whose window size has no exact
  multiply-shift reciprocal within int32 (global pools over more than about 2,000 pixels);
* a candidate on VTA becomes one report entry (its core operator); the bindings it consumes (the
  tail, the int8 -> int32 casts of pool/add inputs, the weight transpose of a dense layer) vanish;
  every other binding is one CPU entry, in program order.

Fast: the first four blocks of MobileNetV3-small at 32x32 (Hardswish, hard-sigmoid
squeeze-excitation folded into its conv, float32 CPU operators, depthwise convs, a residual add).
All fifteen networks at 32x32 (64 for VGG11, 96 for AlexNet) and at 224x224 are marked slow (``-m slow``; the MAC shares are printed with ``-s``). Concat, split and
shuffle are covered at unit level in tests/test_quantize.py.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import vta_ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "relay_examples"))
from models import ISSUE11_MODELS, SMALL, mac_placement, make_model  # noqa: E402
from vta_ext.quantize import op_macs, quantize_torch  # noqa: E402

BLOCK = 16  # BLOCK_IN = BLOCK_OUT of the default configuration
FAST = ("mobilenet_v3_small",)


def _op(expr) -> Optional[str]:
    return expr.op.name if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) else None


def _shape(expr) -> Tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _pool_ok(call) -> bool:
    """Symmetric padding below the window, no dilation; ceil mode only for max pools or where it
    does not change the output size (a ceil-mode max pool's extra windows see -128 padding)."""
    a = call.attrs
    top, left, bottom, right = (int(p) for p in a.padding)
    _, _, h, w = _shape(call.args[0])
    floor_size = ((h + 2 * top - int(a.pool_size[0])) // int(a.strides[0]) + 1,
                  (w + 2 * left - int(a.pool_size[1])) // int(a.strides[1]) + 1)
    ceil_ok = _op(call) == "relax.nn.max_pool2d" or floor_size == _shape(call)[2:]
    return (ceil_ok and (top, left) == (bottom, right)
            and all(int(d) == 1 for d in a.dilation)
            and top < int(a.pool_size[0]) and left < int(a.pool_size[1]))


def _exact_reciprocal(d: int) -> bool:
    """Whether the avg_pool2d template's division by ``d`` exists (vta_ext/templates/pool.py):
    some shift ``k`` and ``m = ceil(2**k / d)`` give ``(x * m) >> k == x // d`` for every window
    sum ``0 <= x <= 128 d``, with ``128 d m < 2**31``."""
    xs = np.arange(128 * d + 1, dtype=np.int64)
    for k in range(31):
        m = -(-(1 << k) // d)
        if 128 * d * m >= 1 << 31:
            return False
        if np.array_equal((xs * m) >> k, xs // d):
            return True
    return False


def _avg_ok(call) -> bool:
    a = call.attrs
    _, _, h, w = _shape(call.args[0])
    _, _, oh, ow = _shape(call)
    top, left = int(a.padding[0]), int(a.padding[1])
    ph, pw, sh, sw = (int(v) for v in (*a.pool_size, *a.strides))
    if bool(a.count_include_pad) or (top, left) == (0, 0):
        divisors = {ph * pw}
    else:
        count = lambda n, s, p, k, size: np.minimum(np.arange(n) * s - p + k, size) - np.maximum(
            np.arange(n) * s - p, 0)  # noqa: E731
        divisors = set(np.outer(count(oh, sh, top, ph, h), count(ow, sw, left, pw, w)).ravel())
    return _pool_ok(call) and all(_exact_reciprocal(int(d)) for d in divisors)


def _conv_ok(call) -> bool:
    a = call.attrs
    top, left, bottom, right = (int(p) for p in a.padding)
    if (top, left) != (bottom, right) or any(int(d) != 1 for d in a.dilation):
        return False
    groups, c, o = int(a.groups), _shape(call.args[0])[1], _shape(call.args[1])[0]
    if groups == 1 or groups == c == o:
        return True
    return (c // groups) % BLOCK == 0 and (o // groups) % BLOCK == 0


def expected_placement(mod) -> Tuple[List[str], List[str]]:
    """(VTA operators, CPU operators), each in program order, from the module's structure."""
    bindings = [b for blk in mod["main"].body.blocks for b in blk.bindings]
    value = {b.var.name: b.value for b in bindings}
    users: Dict[str, List[str]] = {}
    for b in bindings:
        relax.analysis.post_order_visit(b.value, lambda e, n=b.var.name: users.setdefault(
            e.name, []).append(n) if isinstance(e, relax.Var) else None)

    def producer(expr):
        return value.get(expr.name) if isinstance(expr, relax.Var) else None

    def cast_of(expr):
        """``expr`` if it is bound to astype(int8 -> int32) used only here, else None."""
        p = producer(expr)
        if _op(p) == "relax.astype" and _dtype(p.args[0]) == "int8" \
                and _dtype(expr) == "int32":
            return expr.name
        return None

    def hswish_of(expr):
        """(x cast, add, clip) names if ``expr`` is ``x * clip(x + c, lo, hi)``, x an int8 cast."""
        p = producer(expr)
        if _op(p) != "relax.multiply":
            return None
        x, t = p.args
        clip = producer(t)
        if cast_of(x) and _op(clip) == "relax.clip" and _op(producer(clip.args[0])) == "relax.add" \
                and producer(clip.args[0]).args[0].same_as(x):
            return [x.name, clip.args[0].name, t.name]
        return None

    consumed: Dict[str, str] = {}  # binding -> the core binding of its VTA operator
    vta: List[Tuple[str, str]] = []
    for b in bindings:
        v = b.value
        if _op(v) == "relax.nn.max_pool2d" and _dtype(v.args[0]) == "int8" and _pool_ok(v):
            vta.append((b.var.name, "relax.nn.max_pool2d"))
            continue
        if _op(v) == "relax.clip" and _dtype(v.args[0]) == "int8" and len(_shape(b.var)) in (2, 4):
            vta.append((b.var.name, "relax.clip"))  # a standalone int8 clip (ReLU6)
            continue
        if not (_op(v) == "relax.astype" and str(v.attrs.dtype) == "int8"
                and _dtype(v.args[0]) == "int32"):
            continue
        chain, expr, seen = [b.var.name], v.args[0], set()
        while True:  # the tail, backwards: clips, shifts, scalar adds / multiplies, one bias
            p, op = producer(expr), _op(producer(expr))
            scalar = op in ("relax.add", "relax.multiply") and isinstance(
                p.args[1], tvm.ir.expr.Constant) and int(np.prod(_shape(p.args[1]))) == 1
            if op in ("relax.clip", "relax.right_shift") or scalar:
                pass
            elif op == "relax.astype" and _dtype(p.args[0]) == "int32":
                pass  # the no-op cast after avg_pool2d
            elif op == "relax.add" and "bias" not in seen and isinstance(p.args[1], tvm.ir.expr.Constant):
                seen.add("bias")
            elif op == "relax.multiply" and hswish_of(expr) is None and "mulv" not in seen \
                    and isinstance(p.args[1], tvm.ir.expr.Constant):
                seen.add("mulv")
            else:
                break
            chain.append(expr.name)
            expr = p.args[0]
        core, op = producer(expr), _op(producer(expr))
        extra: List[str] = []
        if op == "relax.multiply" and hswish_of(expr):
            if len(_shape(expr)) not in (2, 4):  # the ALU templates: NCHW or (N, C)
                continue
            extra = hswish_of(expr)
        elif op == "relax.nn.conv2d" and _dtype(core.args[0]) == "int8" and _conv_ok(core):
            pass
        elif op == "relax.matmul" and _op(producer(core.args[1])) == "relax.permute_dims" \
                and _dtype(core.args[0]) == "int8":
            extra = [core.args[1].name]
        elif op == "relax.nn.avg_pool2d" and cast_of(core.args[0]) and _avg_ok(core) \
                and "bias" not in seen:
            extra = [cast_of(core.args[0])]
        elif op == "relax.add" and "bias" not in seen and all(cast_of(a) for a in core.args) \
                and len(_shape(expr)) == 4:
            extra = [cast_of(a) for a in core.args]
        else:
            continue
        # a cast or weight transpose disappears with the VTA operator if nothing else uses it
        inside = set(chain + extra + [expr.name])
        extra = [e for e in extra if users.get(e) and set(users[e]) <= inside]
        for name in chain + extra:
            consumed[name] = expr.name
        vta.append((expr.name, op))
    gone = consumed.keys() | {name for name, _ in vta}
    cpu = [_op(b.value) for b in bindings if b.var.name not in gone and _op(b.value)]
    return [op for _, op in vta], cpu


@functools.lru_cache(maxsize=2)
def _quantised(name: str, size: int, kwargs: tuple):
    model = make_model(name, size=size, **dict(kwargs))
    rng = np.random.default_rng(0)
    calibration = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    data = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    return model, quantize_torch(model, calibration), data


def check_model(name: str, size: int, kwargs: dict) -> dict:
    """Quantise, build for ext_vta and llvm, compare bits and placement; return MAC figures."""
    _, qm, data = _quantised(name, size, tuple(sorted(kwargs.items())))
    executable = relax.build(qm.mod, target="ext_vta")
    report = vta_ext.last_build_report()
    out = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(data))[0].numpy()
    ref = relax.VirtualMachine(relax.build(qm.mod, target="llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(data))[0].numpy()
    np.testing.assert_array_equal(out, ref)
    assert np.abs(ref).max() > 0
    placement = report.placement()
    vta, cpu = expected_placement(qm.mod)
    assert [op for op, dev in placement if dev == "vta"] == vta
    assert [op for op, dev in placement if dev == "cpu"] == cpu
    # the placement accounts for every Conv2d / Linear module of the torch model (plus the
    # 1x1 depthwise convs the quantiser makes of BatchNorms that follow no convolution)
    model = _quantised(name, size, tuple(sorted(kwargs.items())))[0]
    affine = sum(1 for n in qm.nodes if n.params.get("affine"))
    assert sum(op == "relax.nn.conv2d" for op, _ in placement) == affine + sum(
        isinstance(m, torch.nn.Conv2d) for m in model.modules())
    assert sum(op == "relax.matmul" for op, _ in placement) == sum(
        isinstance(m, torch.nn.Linear) for m in model.modules())
    # every operator the quantiser left in float32 is on the CPU under its own name, with the
    # quantiser's reason and its torch layer; every VTA operator names its torch layer
    on_cpu = {p.name: p for p in report.on_cpu}
    for o in qm.cpu_float_ops:
        assert on_cpu[o.var].reason == o.reason and on_cpu[o.var].layer.startswith(o.layer)
    assert all(p.layer for p in report.on_vta)
    placed = mac_placement(op_macs(qm.mod), report)
    assert placed["consistent"], placed
    print(f"{name} {size}x{size}: bit-exact, {100 * placed['vta'] / placed['total']:.1f} % of "
          f"{placed['total'] / 1e6:.1f} M MACs on VTA, {len(qm.cpu_float_ops)} float32 CPU ops")
    return placed


@pytest.mark.slow
def test_mobilenet_v3_small_reduced():
    """The first four blocks of MobileNetV3-small (ReLU and Hardswish blocks, with and without
    squeeze-excitation, a residual add), its head, 10 classes: the fast run."""
    from models import MobileNetV3Small

    kwargs = dict(settings=MobileNetV3Small.SETTINGS[:4], num_classes=10)
    placed = check_model("mobilenet_v3_small", 32, kwargs)
    assert placed["vta"] == placed["total"]


@pytest.mark.slow
@pytest.mark.parametrize("name", FAST)
def test_small_model(name):
    size, kwargs = SMALL[name]
    placed = check_model(name, size, kwargs)
    assert placed["vta"] == placed["total"]  # no thin group convs


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ISSUE11_MODELS if n not in FAST])
def test_small_model_slow(name):
    size, kwargs = SMALL[name]
    check_model(name, size, kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("name", ISSUE11_MODELS)
def test_full_size_model(name):
    check_model(name, 224, {})


def test_expected_placement_rules():
    """The placement rules on a hand-built module: a thin group conv stays on the CPU with its
    whole tail; a conv with groups=1 collapses to one VTA entry."""
    x = relax.Var("x", relax.TensorType((1, 32, 8, 8), "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for groups in (1, 4):
                w = relax.const(np.ones((32, 32 // groups, 3, 3), np.int8))
                acc = bb.emit(relax.op.nn.conv2d(y, w, padding=1, groups=groups, out_dtype="int32"))
                acc = bb.emit(relax.op.right_shift(acc, relax.const(4, "int32")))
                acc = bb.emit(relax.op.clip(acc, -128, 127))
                y = bb.emit(relax.op.astype(acc, "int8"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    vta, cpu = expected_placement(bb.get())
    assert vta == ["relax.nn.conv2d"]
    assert cpu == ["relax.nn.conv2d", "relax.right_shift", "relax.clip", "relax.astype"]
