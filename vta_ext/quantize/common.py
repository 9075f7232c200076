"""Shared facts and helpers of the quantiser: int8 range, power-of-two exponents, rounding,
fixed-point multipliers, Relax expression helpers."""
from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

import numpy as np
import tvm
from tvm import relax

from ..layout import IMM_MAX

QMIN, QMAX = -128, 127
INT32_MAX = (1 << 31) - 1
#: the largest right shift of the requantisation tail (VTA's SHR by an immediate)
MAX_SHIFT = 31
Constant = tvm.ir.expr.Constant


class QuantizationError(ValueError):
    """The float graph cannot be quantised (a real error: unrepresentable scales, malformed
    graph). Operators the quantiser cannot map stay in float on the CPU instead (see
    :attr:`vta_ext.quantize.QuantizedModel.cpu_float_ops`)."""


def op_name(expr) -> Optional[str]:
    """``"relax.nn.conv2d"`` for a call of a Relax operator, else None."""
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def shape_of(expr) -> Tuple[int, ...]:
    """The static shape of a tensor-typed Relax expression."""
    return tuple(int(d) for d in expr.ty.shape)


def dtype_of(expr) -> str:
    """The dtype of a tensor-typed Relax expression."""
    return str(expr.ty.dtype)


def prim_float(arg) -> float:
    """The value of a ``PrimValue`` / ``FloatImm`` / ``IntImm`` argument (clip bounds)."""
    value = getattr(arg, "value", arg)
    value = getattr(value, "value", value)
    return float(value)


def exponent_for(max_abs: float, qmax: int = QMAX) -> int:
    """Smallest ``e`` with ``max_abs / 2**e <= qmax`` (``max_abs == 0`` gives -30)."""
    if not np.isfinite(max_abs):
        raise QuantizationError(f"non-finite calibration range {max_abs}: the float model "
                                "overflows on the calibration input; check the model and input")
    if max_abs <= 0:
        return -30
    e = math.ceil(math.log2(max_abs / qmax))
    while max_abs / 2.0 ** e > qmax:  # guard against log2 rounding
        e += 1
    return e


def quantize_array(values: np.ndarray, e: int, dtype=np.int8) -> np.ndarray:
    """``clip(round_half_even(values / 2**e))`` in ``dtype``."""
    info = np.iinfo(dtype)
    return np.clip(np.round(values.astype(np.float64) * 2.0 ** -e), info.min, info.max).astype(dtype)


def round_half_up(x) -> np.ndarray:
    """``floor(x + 0.5)``: the rounding of a right shift preceded by adding half its divisor."""
    return np.floor(np.asarray(x, np.float64) + 0.5)


def clip_bounds(lo: float, hi: float, scale: float) -> Tuple[int, int]:
    """Integer bounds of a float clip ``[lo, hi]`` on a tensor of scale ``scale``, within int8.

    Rounding is monotone, so ``round(clip(y, lo, hi) / s) == clip(round(y / s), round(lo / s),
    round(hi / s))``: the clip moves after the requantisation exactly.
    """
    qlo = QMIN if lo == -np.inf else int(np.clip(round_half_up(lo / scale), QMIN, QMAX))
    qhi = QMAX if hi == np.inf else int(np.clip(round_half_up(hi / scale), QMIN, QMAX))
    return qlo, max(qlo, qhi)


def fixed_point_multiplier(ratio: float, bound: int, max_multiplier: int = IMM_MAX,
                           what: str = "requantisation") -> Tuple[int, int]:
    """``(M, k)`` with ``M / 2**k ~= ratio`` for ``y = (acc * M + 2**(k-1)) >> k``.

    The largest ``k`` in ``0..31`` is chosen such that ``1 <= M <= max_multiplier`` (by default
    VTA's 16-bit ALU immediate, so the multiply is one MUL by an immediate) and nothing overflows
    int32 for every ``|acc| <= bound``: ``bound * M + 2**(k-1) <= 2**31 - 1``. With ``M`` rounded
    to nearest, the relative error of the multiplier is at most ``2**-(bits of M)``.

    Raises
    ------
    QuantizationError
        If no ``(M, k)`` satisfies the bounds (ratio too large for the accumulator bound, or so
        small that the result is always 0).
    """
    if not ratio > 0 or not np.isfinite(ratio):
        raise QuantizationError(f"{what}: multiplier ratio {ratio} must be positive and finite")
    best = None
    for k in range(0, MAX_SHIFT + 1):
        m = int(round_half_up(ratio * 2.0 ** k))
        if m > max_multiplier or bound * m + (1 << k >> 1) > INT32_MAX:
            break
        if m >= 1:
            best = (m, k)
    if best is None:
        raise QuantizationError(
            f"{what}: no fixed-point multiplier for the ratio {ratio:.6g} with accumulators up to "
            f"{bound} (int32 would overflow, or the result always rounds to 0); use a wider "
            "output scale")
    return best


def substitute(expr, lookup: Callable[[relax.Var], relax.Expr]):
    """``expr`` with every variable ``v`` replaced by ``lookup(v)`` (calls, tuples, items)."""
    if isinstance(expr, relax.Var):
        return lookup(expr)
    if isinstance(expr, relax.Call):
        return relax.Call(expr.op, [substitute(a, lookup) for a in expr.args], expr.attrs,
                          expr.ty_args)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([substitute(f, lookup) for f in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(substitute(expr.tuple_value, lookup), expr.index)
    return expr


def used_vars(expr) -> list:
    """Names of the variables used in ``expr``."""
    names: list = []
    relax.analysis.post_order_visit(
        expr, lambda e: names.append(e.name) if isinstance(e, relax.Var) else None)
    return names
