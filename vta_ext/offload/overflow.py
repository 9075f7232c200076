"""The int32 overflow proof of a requantisation tail with a multiply.

VTA's ALU wraps int32 and the CPU build does not promise to, so a tail with a multiply goes to VTA
only when interval arithmetic over the int8 inputs and the constant weights proves that no
intermediate value leaves int32 (:func:`~vta_ext.templates.epilogue.epilogue_range` does the
stages); otherwise :func:`check_overflow` refuses it, naming the stage.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np
import tvm

from ..quantize.common import shape_of as _shape
from ..strategy import MatchedOp
from ..templates.epilogue import epilogue_range, has_multiply
from ..templates.errors import EpilogueRefusal

__all__ = ["core_range", "check_overflow"]


def core_range(m: MatchedOp) -> Tuple[Any, Any]:
    """Bounds ``(lo, hi)`` of the int32 accumulator of the core, per output channel where the
    weights are constants: int8 inputs lie in -128..127, so a product sum is at most
    ``127 * sum(w > 0) + 128 * sum |w < 0|`` and at least the mirror; an average of int8 is
    int8; the residual add of two int8 lies in -256..254."""
    if m.kind == "avg_pool2d":
        return -128, 127
    if m.kind == "add":
        return -256, 254
    if m.kind == "hswish":  # x in -128..127 times t in [lo, hi] (and t - offset in int8)
        p = m.params
        t_lo, t_hi = max(p["lo"], -128 + p["offset"]), min(p["hi"], 127 + p["offset"])
        t_lo, t_hi = min(t_lo, t_hi), max(t_lo, t_hi)
        corners = [x * t for x in (-128, 127) for t in (t_lo, t_hi)]
        return min(corners), max(corners)
    weight = m.operands[1]
    shape = _shape(weight)
    # the weight as (output channel, reduction); a batched matmul's channel is (batch, column)
    batched = m.kind == "batch_matmul"
    reduction = _shape(m.operands[0])[-1] if batched else int(np.prod(shape[1:]))
    if isinstance(weight, tvm.ir.expr.Constant):
        w = weight.value.numpy().astype(np.int64)
        if batched and not m.params.get("transpose_b"):
            w = w.transpose(0, 2, 1)
        w = w.reshape(-1, reduction)
        pos, neg = np.where(w > 0, w, 0).sum(1), -np.where(w < 0, w, 0).sum(1)
        return -128 * pos - 127 * neg, 127 * pos + 128 * neg
    return -128 * 128 * reduction, 128 * 128 * reduction


def check_overflow(m: MatchedOp, source_tail: Optional[tuple] = None) -> None:
    """Refuse (:class:`EpilogueRefusal`) an epilogue with a multiply whose int32 values could
    leave int32 for the core's accumulator range (:func:`epilogue_range`): VTA's ALU wraps,
    the CPU build does not promise to, and the results must not differ. The check runs on the
    tail as the module computes it (``source_tail``; default ``m.epilogue``) (before :func:`fit_immediates` moves a rounding add behind
    a shift, where it could no longer overflow on VTA though it does on the CPU)."""
    source = m.epilogue if source_tail is None else source_tail
    if not has_multiply(source):
        return
    tensors = {}
    for kind, expr in (("bias", m.bias), ("multiplier", m.multiplier)):
        if expr is None:
            continue
        if not isinstance(expr, tvm.ir.expr.Constant):
            raise EpilogueRefusal(f"{m.kind} {m.name!r}: the {kind} of a requantisation tail "
                                  "with a multiply is not a constant, so no int32 bound of "
                                  "the product can be proven")
        tensors[kind] = expr.value.numpy().reshape(-1)
    lo, hi = core_range(m)
    epilogue_range(source, lo, hi, what=f"{m.kind} {m.name!r}", **tensors)
