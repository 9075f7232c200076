"""Calibration and power-of-two scale selection."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
import tvm
from tvm import relax

from .common import (INT32_MAX, MAX_SHIFT, QMAX, QuantizationError, exponent_for,
                     fixed_point_multiplier)
from .graph import QNode, TENSOR_KINDS

__all__ = ["calibrate", "choose_scales", "acc_scale", "accumulator_bound", "weight_q", "bias_q"]

#: kinds whose output shares one scale with all their inputs (no arithmetic on the values)
SAME_SCALE_KINDS = ("maxpool", "layout", "split", "concat", "clip")


def calibrate(float_mod: tvm.IRModule, names: Sequence[str],
              inputs: Sequence[np.ndarray]) -> Dict[str, float]:
    """``max |x|`` of the named float tensors of ``main``, over the calibration ``inputs``.

    The function is rebuilt (on llvm) to return every named tensor, then run on each input.
    """
    func = relax.transform.ToNonDataflow()(float_mod)["main"]
    bindings = {b.var.name: b.var for block in func.body.blocks for b in block.bindings}
    param = func.params[0]
    outs = [param if n == param.name else bindings[n] for n in names]
    body = relax.BlockBuilder().normalize(relax.SeqExpr(func.body.blocks, relax.Tuple(outs)))
    probe = tvm.IRModule({"main": relax.Function(func.params, body)})
    vm = relax.VirtualMachine(relax.build(probe, target="llvm"), tvm.cpu())
    ranges = {n: 0.0 for n in names}
    for x in inputs:
        results = vm["main"](tvm.runtime.tensor(np.ascontiguousarray(x, dtype=np.float32)))
        for n, r in zip(names, results):
            ranges[n] = max(ranges[n], float(np.abs(r.numpy()).max(initial=0.0)))
    return ranges


def _acc_exponent(n: QNode, nodes: List[QNode], e: Dict[int, int]) -> Optional[int]:
    if n.kind in ("conv", "linear"):
        return e[n.inputs[0]] + n.weight_exponent
    if n.kind in ("add", "avgpool"):
        return e[n.inputs[0]]
    return None


def _is_pow2(n: QNode, nodes: List[QNode]) -> bool:
    """Whether a requantising node and its input have calibrated power-of-two scales (a plain
    right shift requantises it)."""
    return (n.qscale is None and nodes[n.inputs[0]].qscale is None
            and "qweight" not in n.params)


def choose_scales(nodes: List[QNode]) -> None:
    """Set ``exponent``, ``weight_exponent``, ``shift`` (power-of-two nodes) or the fixed-point
    requantisation ``params["requant"]`` (nodes with a source graph's scales) of every node, and
    the hardswish constants (module docstring, *Scales*)."""
    parent = list(range(len(nodes)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        parent[find(i)] = find(j)

    tensors = [i for i, n in enumerate(nodes) if n.kind in TENSOR_KINDS or n.kind == "split"]
    for i in tensors:
        n = nodes[i]
        if n.kind in SAME_SCALE_KINDS:
            for j in n.inputs:
                union(i, j)
        elif n.kind == "add":
            union(n.inputs[0], n.inputs[1])
        if n.kind in ("conv", "linear") and "qweight" not in n.params:
            n.weight_exponent = exponent_for(float(np.abs(n.weight).max()))
    # a scale given by the source graph holds for its whole group
    fixed: Dict[int, float] = {}
    for i in tensors:
        if nodes[i].qscale is not None:
            g = find(i)
            if g in fixed and not np.isclose(fixed[g], nodes[i].qscale, rtol=1e-6, atol=0):
                n = nodes[i]
                raise QuantizationError(
                    f"{n.kind} at {n.layer or n.name}: the source graph quantises tensors that "
                    f"must share one scale (max pool, reshape, concat, add operands) with "
                    f"different scales ({fixed[g]:.6g} and {n.qscale:.6g}); export with shared "
                    "scales (SharedQuantizationSpec in PT2E)")
            fixed.setdefault(g, nodes[i].qscale)
    for i in tensors:
        if find(i) in fixed:
            nodes[i].qscale = fixed[find(i)]
    group_e: Dict[int, int] = {}
    for i in tensors:
        e = exponent_for(nodes[i].max_abs) if nodes[i].kind != "split" else -30
        group_e[find(i)] = max(group_e.get(find(i), e), e)

    def exps() -> Dict[int, int]:
        return {i: group_e[find(i)] for i in tensors}

    for _ in range(4 * len(nodes) + 4):
        changed = False
        e = exps()
        for i in tensors:
            n = nodes[i]
            if n.inputs and n.kind in ("conv", "linear", "add", "avgpool") and _is_pow2(n, nodes):
                acc = _acc_exponent(n, nodes, e)
                if group_e[find(i)] < acc:  # no negative shifts: raise the output
                    group_e[find(i)] = acc
                    changed = True
        if not changed:
            break
    else:
        raise QuantizationError("scale selection did not converge: a residual group feeds itself "
                                "through a weight with scale > 1")
    e = exps()
    for i in tensors:
        n = nodes[i]
        n.exponent = e[i]
        if n.kind in ("conv", "linear", "add", "avgpool"):
            if _is_pow2(n, nodes):
                n.shift = n.exponent - _acc_exponent(n, nodes, e)
                if not 0 <= n.shift <= MAX_SHIFT:
                    raise QuantizationError(
                        f"{n.kind} at {n.layer or n.name}: requantisation right shift {n.shift} "
                        f"outside 0..{MAX_SHIFT} (weights or activations span too many octaves); "
                        "check the layer's weights for outliers")
            else:
                n.params["requant"] = _fixed_point_requant(n, nodes)
        if n.kind == "hswish":
            _hswish_constants(n, nodes[n.inputs[0]].scale)


def acc_scale(n: QNode, nodes: List[QNode]) -> np.ndarray:
    """Scale of the int32 accumulator of a requantising node (per output channel)."""
    src = nodes[n.inputs[0]].scale
    if n.kind in ("conv", "linear"):
        if "qweight" in n.params:
            return src * n.params["qweight"][1]
        return np.full(n.weight.shape[0], src * 2.0 ** n.weight_exponent)
    return np.array([src])


def accumulator_bound(n: QNode, nodes: List[QNode], bias_q: Optional[np.ndarray] = None) -> np.ndarray:
    """A proven bound of ``|acc + bias|`` per output channel: int8 inputs are at most 128 in
    magnitude, so a conv/linear accumulator is at most ``128 * sum |w_q|`` over its reduction;
    an add of two int8 tensors at most 256; an average at most 128."""
    if n.kind in ("conv", "linear"):
        w_q = weight_q(n)
        bound = 128 * np.abs(w_q.reshape(w_q.shape[0], -1)).sum(1)
        return bound + (0 if bias_q is None else np.abs(bias_q))
    return np.array([256 if n.kind == "add" else 128])


def weight_q(n: QNode) -> np.ndarray:
    """The int8 weight of a conv/linear node: the source graph's, or ``round(W / 2**e_w)``."""
    if "qweight" in n.params:
        return np.asarray(n.params["qweight"][0], np.int64)
    return np.clip(np.round(n.weight * 2.0 ** -n.weight_exponent), -128, 127).astype(np.int64)


def bias_q(n: QNode, nodes: List[QNode]) -> np.ndarray:
    """The int32 bias of a conv/linear node at its accumulator scale (before rounding terms)."""
    bias = np.zeros(n.weight.shape[0]) if n.bias is None else n.bias
    b = np.round(bias / acc_scale(n, nodes))
    if np.abs(b).max(initial=0) > INT32_MAX // 2:
        raise QuantizationError(f"{n.kind} at {n.layer or n.name}: the int32 bias overflows "
                                f"(bias up to {np.abs(bias).max():.3g} at accumulator scale "
                                f"{acc_scale(n, nodes).min():.3g}); check the layer's bias and "
                                "the calibration input")
    return b.astype(np.int64)


def _fixed_point_requant(n: QNode, nodes: List[QNode]) -> dict:
    """``y = ((((acc + b + r1) >> s1) * M + 2**(k-1)) >> k)`` for a non-power-of-two ratio
    ``acc_scale / out_scale`` (TFLite / TVM QNN style), M per output channel.

    Overflow proof: ``|acc + b + r1| <= A`` (:func:`accumulator_bound`), so after the pre-shift
    ``|v| <= ceil(A / 2**s1)``, and ``k`` is chosen per :func:`fixed_point_multiplier` such that
    ``ceil(A / 2**s1) * M + 2**(k-1) <= 2**31 - 1`` for every channel: no int32 product
    overflows. ``s1`` minimises the worst-case error in output LSB, ``(2**s1 - 1) / 2 * ratio``
    (the pre-shift's rounding) plus ``64 / M`` (M's rounding, for outputs up to 128); the result
    differs from exact rounding by at most one LSB.
    """
    ratio = acc_scale(n, nodes) / n.scale
    b = bias_q(n, nodes) if n.kind in ("conv", "linear") else None
    bound = np.broadcast_to(accumulator_bound(n, nodes, b), ratio.shape).astype(np.float64)
    what = f"requantisation of {n.kind} at {n.layer or n.name}"
    best = None
    for s1 in range(0, MAX_SHIFT + 1):
        pre_bound = np.ceil((bound + (1 << s1 >> 1)) / 2.0 ** s1).astype(np.int64)
        try:
            k = min(fixed_point_multiplier(float(r * 2.0 ** s1), int(a), what=what)[1]
                    for r, a in zip(ratio, pre_bound))
        except QuantizationError:
            continue
        m = np.floor(ratio * 2.0 ** (s1 + k) + 0.5).astype(np.int64)
        if m.min() < 1:
            continue
        # worst-case error in output LSB: the pre-shift's rounding plus M's relative error
        error = float(((1 << s1) - 1) / 2 * ratio.max() + 64.0 / m.min())
        if best is None or error < best["error"]:
            best = dict(pre_shift=s1, multiplier=m, shift=k, bound=int(pre_bound.max()),
                        error=error)
    if best is None or best["multiplier"].min() < 1:
        raise QuantizationError(f"{what}: no fixed-point multiplier fits int32 for the ratios "
                                f"{ratio.min():.3g}..{ratio.max():.3g}; check the source graph's "
                                "scales")
    return best


def _hswish_constants(n: QNode, s_in: float) -> None:
    """Integer hardswish ``y = x * clip(x + 3, 0, 6) / 6`` for ``x = xq * s_in``:
    ``yq = round(xq * clip(xq + t3, 0, t6) * s_in**2 / (6 s_out))`` with ``t3 = 3 / s_in``
    rounded, ``t6 = 2 * t3`` (so the clip is exact for power-of-two scales) and the ratio as a
    fixed-point multiplier ``M / 2**k``; ``|xq * t| <= 128 * t_max`` bounds the int32 product."""
    three = int(np.floor(3.0 / s_in + 0.5))
    six = 2 * three
    t_max = min(six, QMAX + three)  # xq <= 127, so xq + t3 never exceeds this: same result
    ratio = s_in * s_in / 6.0 / n.scale
    m, k = fixed_point_multiplier(ratio, 128 * t_max, what=f"hardswish at {n.layer or n.name}")
    n.params.update(three=three, t_max=t_max, multiplier=m, shift=k)
