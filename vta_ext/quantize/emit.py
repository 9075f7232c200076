"""Rewrite of the analysed nodes into the canonical int8 Relax module."""
from __future__ import annotations

from typing import Dict, List, Union

import numpy as np
import tvm
from tvm import relax

from .common import QMAX, QMIN, QuantizationError, clip_bounds, shape_of, substitute
from .graph import CpuFloatOp, QNode
from .scales import bias_q, weight_q

__all__ = ["emit_module"]


class _Emitter:
    """Binds expressions with unique, readable names and remembers each one's source layer."""

    def __init__(self, bb: relax.BlockBuilder) -> None:
        self.bb = bb
        self.used: set = set()
        self.layer = ""
        self.layers: Dict[str, str] = {}

    def __call__(self, expr, name: str):
        base, k = name, 1
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        var = self.bb.emit(expr, name_hint=name)
        if self.layer:
            self.layers[name] = self.layer
        return var

    def requant(self, acc, shift, lo: int, hi: int, name: str):
        """``[right_shift] -> clip(lo, hi) -> astype int8``: the canonical tail."""
        if shift is not None:
            acc = self(relax.op.right_shift(acc, relax.const(shift, "int32")), f"{name}_shr")
        acc = self(relax.op.clip(acc, lo, hi), f"{name}_clip")
        return self(relax.op.astype(acc, "int8"), f"{name}_q")


def _conv_or_linear(emit: _Emitter, n: QNode, nodes: List[QNode], x, tag: str):
    """The core operator and its bias add (with the rounding of the following shift folded in)."""
    w_q = weight_q(n).astype(np.int8)
    b_q = bias_q(n, nodes)
    rq = n.params.get("requant")
    if rq is None and n.shift > 0:
        b_q = b_q + (1 << (n.shift - 1))  # round half up instead of the shift's floor
    elif rq is not None and rq["pre_shift"] > 0:
        b_q = b_q + (1 << (rq["pre_shift"] - 1))
    b_q = b_q.astype(np.int32)
    if n.kind == "conv":
        p = n.params
        acc = emit(relax.op.nn.conv2d(
            x, relax.const(w_q), strides=p["strides"], padding=p["padding"],
            dilation=p["dilation"], groups=p["groups"], data_layout="NCHW",
            kernel_layout="OIHW", out_dtype="int32"), f"conv_{tag}")
        bias_c = relax.const(b_q.reshape(1, -1, 1, 1))
    else:
        wt = emit(relax.op.permute_dims(relax.const(w_q), [1, 0]), f"wt_{tag}")
        acc = emit(relax.op.matmul(x, wt, out_dtype="int32"), f"matmul_{tag}")
        bias_c = relax.const(b_q)
    return emit(relax.op.add(acc, bias_c), f"{tag}_bias")


def _requant(emit: _Emitter, n: QNode, acc, tag: str, rounded: bool):
    """The requantisation tail of ``n``: a right shift (power-of-two scales) or the fixed-point
    multiplier ``(((acc >> s1) * M + 2**(k-1)) >> k)``; then clip and int8. ``rounded``: the
    pre-shift's rounding term is already in the bias."""
    lo, hi = clip_bounds(n.lo, n.hi, n.scale)
    rq = n.params.get("requant")
    if rq is None:
        shift = n.shift if n.kind in ("conv", "linear") else (n.shift or None)
        return emit.requant(acc, shift, lo, hi, tag)
    if rq["pre_shift"]:
        if not rounded:
            acc = emit(relax.op.add(acc, relax.const(1 << (rq["pre_shift"] - 1), "int32")),
                       f"{tag}_round1")
        acc = emit(relax.op.right_shift(acc, relax.const(rq["pre_shift"], "int32")), f"{tag}_shr1")
    m = np.asarray(rq["multiplier"], np.int32)
    if m.size == 1 or np.all(m == m[0]):
        mc = relax.const(int(m[0]), "int32")
    else:
        mc = relax.const(m.reshape((1, -1, 1, 1) if n.kind == "conv" else (-1,)))
    acc = emit(relax.op.multiply(acc, mc), f"{tag}_mul")
    if rq["shift"]:
        acc = emit(relax.op.add(acc, relax.const(1 << (rq["shift"] - 1), "int32")), f"{tag}_round")
    return emit.requant(acc, rq["shift"], lo, hi, tag)


def emit_module(nodes: List[QNode], outputs: List[Union[int, str]], param: relax.Var):
    """The int8 module, the CPU float operators and the source layer of every binding."""
    x = relax.Var(param.name, relax.TensorType(shape_of(param), "float32"))
    bb = relax.BlockBuilder()
    emit = _Emitter(bb)
    floats: Dict[str, relax.Expr] = {param.name: x}  # float var -> emitted float expression
    q: Dict[int, relax.Expr] = {}  # node index -> emitted int8 expression
    deq: Dict[int, relax.Expr] = {}
    q_of = {n.name: i for i, n in enumerate(nodes) if n.kind != "float"}
    cpu_float: List[CpuFloatOp] = []

    def dequant(i: int):
        if i not in deq:
            f = emit(relax.op.astype(q[i], "float32"), f"{nodes[i].name}_deq")
            deq[i] = emit(relax.op.multiply(f, relax.const(nodes[i].scale, "float32")),
                          f"{nodes[i].name}_f32")
        return deq[i]

    def float_of(var: relax.Var):
        if var.name in floats:
            return floats[var.name]
        if var.name in q_of:
            return dequant(q_of[var.name])
        raise QuantizationError(f"internal: no float value for {var.name}")

    def int8_of(var: relax.Var):
        return q[q_of[var.name]]

    with bb.function("main", [x]):
        with bb.dataflow():
            for i, n in enumerate(nodes):
                tag = n.name
                emit.layer = n.layer
                if n.kind in ("input", "quant"):
                    lo, hi = clip_bounds(n.lo, n.hi, n.scale)
                    if n.qscale is None:
                        t = emit(relax.op.multiply(floats[n.name],
                                                   relax.const(2.0 ** -n.exponent, "float32")),
                                 f"{tag}_scaled")
                    else:  # as the source graph's quantize: x / s
                        t = emit(relax.op.divide(floats[n.name], relax.const(n.qscale, "float32")),
                                 f"{tag}_scaled")
                    t = emit(relax.op.round(t), f"{tag}_round")
                    t = emit(relax.op.clip(t, lo, hi), f"{tag}_clip")
                    q[i] = emit(relax.op.astype(t, "int8"), f"{tag}_q")
                elif n.kind in ("conv", "linear"):
                    acc = _conv_or_linear(emit, n, nodes, q[n.inputs[0]], tag)
                    q[i] = _requant(emit, n, acc, tag, rounded=True)
                elif n.kind == "add":
                    a32 = emit(relax.op.astype(q[n.inputs[0]], "int32"), f"{tag}_lhs")
                    b32 = emit(relax.op.astype(q[n.inputs[1]], "int32"), f"{tag}_rhs")
                    acc = emit(relax.op.add(a32, b32), f"add_{tag}")
                    q[i] = _requant(emit, n, acc, tag, rounded=False)
                elif n.kind == "avgpool":
                    p = n.params
                    x32 = emit(relax.op.astype(q[n.inputs[0]], "int32"), f"{tag}_i32")
                    acc = emit(relax.op.nn.avg_pool2d(
                        x32, pool_size=p["pool_size"], strides=p["strides"], padding=p["padding"],
                        ceil_mode=p["ceil_mode"], count_include_pad=p["count_include_pad"]),
                        f"avgpool_{tag}")
                    if n.shift or "requant" in n.params:
                        # TVM 0.27 legalises an int32 avg_pool2d to an int64 result, which a
                        # following int32 right_shift rejects; the cast is a no-op before that
                        acc = emit(relax.op.astype(acc, "int32"), f"{tag}_acc")
                    out = _requant(emit, n, acc, tag, rounded=False)
                    if p["squeeze"]:
                        out = emit(relax.op.reshape(out, shape_of(out)[:2]), f"squeeze_{tag}")
                    q[i] = out
                elif n.kind == "maxpool":
                    a = n.call.attrs
                    q[i] = emit(relax.op.nn.max_pool2d(
                        q[n.inputs[0]], pool_size=a.pool_size, strides=a.strides,
                        padding=a.padding, dilation=a.dilation, ceil_mode=n.params["ceil_mode"],
                        layout="NCHW"), f"maxpool_{tag}")
                elif n.kind in ("layout", "split", "concat"):
                    q[i] = emit(substitute(n.call, int8_of), f"{n.kind}_{tag}")
                elif n.kind == "clip":
                    lo, hi = clip_bounds(n.lo, n.hi, n.scale)
                    q[i] = emit(relax.op.clip(q[n.inputs[0]], lo, hi), f"clip_{tag}")
                elif n.kind == "hswish":
                    q[i] = _hswish(emit, n, q[n.inputs[0]], tag)
                elif n.kind == "float":
                    var = emit(substitute(n.call, float_of), tag)
                    floats[n.name] = var
                    src = n.layer.rsplit(" (", 1) if n.layer else ["", ""]
                    cpu_float.append(CpuFloatOp(var.name, n.call.op.name if isinstance(
                        n.call, relax.Call) and isinstance(n.call.op, tvm.ir.Op)
                        else type(n.call).__name__, src[0], src[1].rstrip(")"), n.reason))
                else:  # pragma: no cover - the analyser only creates the kinds above
                    raise QuantizationError(f"unknown node kind {n.kind}")
            emit.layer = ""
            results = []
            for k, out in enumerate(outputs):
                if isinstance(out, str):
                    results.append(floats[out])
                    continue
                f = emit(relax.op.astype(q[out], "float32"), f"out{k}_f32")
                results.append(emit(relax.op.multiply(
                    f, relax.const(nodes[out].scale, "float32")), f"out{k}"))
            ret = bb.emit_output(relax.Tuple(results))
        bb.emit_func_output(ret)
    return bb.get(), cpu_float, emit.layers


def _hswish(emit: _Emitter, n: QNode, xq, tag: str):
    """``x * clip(x + 3, 0, 6) / 6`` in int32: ADD, CLIP, MUL, MUL by M, ADD half, SHR, CLIP."""
    p = n.params
    x32 = emit(relax.op.astype(xq, "int32"), f"{tag}_i32")
    t = emit(relax.op.add(x32, relax.const(p["three"], "int32")), f"{tag}_plus3")
    t = emit(relax.op.clip(t, 0, p["t_max"]), f"{tag}_relu6")
    prod = emit(relax.op.multiply(x32, t), f"{tag}_prod")
    prod = emit(relax.op.multiply(prod, relax.const(p["multiplier"], "int32")), f"{tag}_mul")
    if p["shift"] > 0:
        prod = emit(relax.op.add(prod, relax.const(1 << (p["shift"] - 1), "int32")),
                    f"{tag}_round")
    return emit.requant(prod, p["shift"], QMIN, QMAX, f"hswish_{tag}")
