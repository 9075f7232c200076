"""Calibration and power-of-two scale selection."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
import tvm
from tvm import relax

from .common import MAX_SHIFT, QMAX, QuantizationError, exponent_for, fixed_point_multiplier
from .graph import QNode, TENSOR_KINDS

__all__ = ["calibrate", "choose_scales"]

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


def choose_scales(nodes: List[QNode]) -> None:
    """Set ``exponent``, ``weight_exponent`` and ``shift`` of every node (module docstring,
    *Scales*), and the multiplier of hardswish nodes."""
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
        if n.kind in ("conv", "linear"):
            n.weight_exponent = exponent_for(float(np.abs(n.weight).max()))
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
            acc = _acc_exponent(nodes[i], nodes, e)
            if acc is not None and group_e[find(i)] < acc:  # no negative shifts: raise the output
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
        acc = _acc_exponent(n, nodes, e)
        if acc is not None:
            n.shift = n.exponent - acc
            if not 0 <= n.shift <= MAX_SHIFT:
                raise QuantizationError(
                    f"{n.kind} at {n.layer or n.name}: requantisation right shift {n.shift} "
                    f"outside 0..{MAX_SHIFT} (weights or activations span too many octaves); "
                    "check the layer's weights for outliers")
        if n.kind == "hswish":
            _hswish_constants(n, e[n.inputs[0]])


def _hswish_constants(n: QNode, e_in: int) -> None:
    """Integer hardswish ``y = x * clip(x + 3, 0, 6) / 6`` for ``x = xq * 2**e_in``:
    ``yq = round(xq * clip(xq + t3, 0, t6) * 2**(2 e_in - e_out) / 6)`` with ``t3 = 3 / 2**e_in``
    rounded, ``t6 = 2 * t3`` (so the clip is exact) and the ratio as a fixed-point multiplier
    ``M / 2**k``; ``|xq * t| <= 128 * t_max`` bounds the int32 product."""
    three = int(np.floor(3.0 * 2.0 ** -e_in + 0.5))
    six = 2 * three
    t_max = min(six, QMAX + three)  # xq <= 127, so xq + t3 never exceeds this: same result
    ratio = 2.0 ** (2 * e_in - n.exponent) / 6.0
    m, k = fixed_point_multiplier(ratio, 128 * t_max, what=f"hardswish at {n.layer or n.name}")
    n.params.update(three=three, t_max=t_max, multiplier=m, shift=k)
