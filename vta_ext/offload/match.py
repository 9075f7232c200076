"""Pattern matching of the offload pass: which Relax calls form a VTA operator (a core, its
requantisation tail and the ``astype int8`` ending it; an int8 max pool; an int8 clip), and why a
candidate does not.

The patterns are listed in :mod:`vta_ext.offload`. A match is a :class:`~vta_ext.strategy.MatchedOp`
whose ``epilogue`` is the tail in VTA's ALU stages (:func:`~vta_ext.templates.epilogue.fit_immediates`);
the tail as the module computes it is kept in :attr:`PatternMatcher.source_tails` for the int32
overflow proof (:mod:`vta_ext.offload.overflow`).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import tvm
from tvm import relax

from ..layout import IMM_MAX, IMM_MIN
from ..quantize.common import dtype_of as _dtype, op_name as _op_name, shape_of as _shape
from ..strategy import MatchedOp
from ..templates.epilogue import fit_immediates

__all__ = ["PatternMatcher", "CANDIDATE_REASONS"]


class PatternMatcher:
    """Matches the offload patterns, finding each variable's producer with ``producer`` (the
    mutator's ``lookup_binding``)."""

    def __init__(self, producer: Callable[[relax.Expr], Optional[relax.Expr]]) -> None:
        self._producer = producer
        # core var -> its tail as in the module (before fit_immediates), for the overflow proof
        self.source_tails: Dict[str, tuple] = {}

    def _cast_source(self, expr, src: str, dst: str):
        """If ``expr`` is ``astype(x: src, dst)`` return ``x``."""
        call = self._producer(expr)
        if _op_name(call) == "relax.astype" and str(call.attrs.dtype) == dst \
                and _dtype(call.args[0]) == src:
            return call.args[0]
        return None

    # ---------------------------------------------------------------- cores
    def conv_kind(self, call: relax.Call) -> Tuple[Optional[str], Optional[str]]:
        """The kind of a ``conv2d`` / ``conv1d`` call, or None and why it is not matched."""
        a = call.attrs
        data, weight = call.args
        one_d = _op_name(call) == "relax.nn.conv1d"
        if (_dtype(data), _dtype(weight)) != ("int8", "int8"):
            return None, f"data/weight are {_dtype(data)}/{_dtype(weight)}, VTA needs int8/int8"
        if str(a.out_dtype) != "int32":
            return None, f"out_dtype {a.out_dtype}, VTA accumulates in int32"
        layouts = ("NCW", "OIW") if one_d else ("NCHW", "OIHW")
        if (a.data_layout, a.kernel_layout) != layouts:
            return None, (f"layout {a.data_layout}/{a.kernel_layout}; the templates need "
                          f"{layouts[0]}/{layouts[1]}")
        groups, channels, out_channels = int(a.groups), _shape(data)[1], _shape(weight)[0]
        if one_d:
            if groups != 1:
                return None, f"grouped conv1d (groups={groups}) has no VTA template; only groups=1"
            return "conv1d", None
        if groups == 1:
            dilated = any(int(d) != 1 for d in a.dilation)
            return ("dilated_conv2d" if dilated else "conv2d"), None
        if groups == channels == out_channels:
            return "depthwise_conv2d", None
        return "group_conv2d", None

    def _core(self, expr) -> Tuple[Optional[MatchedOp], Optional[str]]:
        """Match the core operator producing ``expr`` (int32)."""
        call = self._producer(expr)
        name = _op_name(call)
        if name in ("relax.nn.conv2d", "relax.nn.conv1d"):
            kind, reason = self.conv_kind(call)
            return (MatchedOp(kind, call, list(call.args), name=expr.name) if kind else None), reason
        if name == "relax.matmul":
            return self._matmul(call, expr.name)
        if name == "relax.nn.avg_pool2d":
            source = self._cast_source(call.args[0], "int8", "int32")
            if source is None:
                return None, "avg_pool2d input is not astype(int8 -> int32)"
            return MatchedOp("avg_pool2d", call, [source], name=expr.name), None
        if name == "relax.add":
            a = self._cast_source(call.args[0], "int8", "int32")
            b = self._cast_source(call.args[1], "int8", "int32")
            if a is not None and b is not None and _shape(a) == _shape(b) and len(_shape(a)) == 4:
                return MatchedOp("add", call, [a, b], name=expr.name), None
        if name == "relax.multiply":
            return self._hswish(call, expr.name)
        return None, None

    #: the matmul forms the pass matches, for refusals
    _MATMUL_FORMS = ("int8 [N,K] x permute_dims(int8 [M,K]) (dense) or int8 [B,N,K] x int8 "
                     "[B,K,M] / permute_dims(int8 [B,M,K], axes [0,2,1]) (batched matmul), "
                     "-> int32")

    def _matmul(self, call, name: str) -> Tuple[Optional[MatchedOp], Optional[str]]:
        """``R.matmul`` -> ``dense`` (rank 2, the weight transposed) or ``batch_matmul`` (rank 3,
        the same batch; ``params["transpose_b"]`` when B is ``permute_dims(., [0, 2, 1])``, whose
        source is then the operand)."""
        lhs, rhs = call.args
        transposed = self._producer(rhs)
        is_t = _op_name(transposed) == "relax.permute_dims"
        ranks = (len(_shape(lhs)), len(_shape(rhs)))
        if ranks == (2, 2) and is_t:
            kind, weight, params = "dense", transposed.args[0], {}
        elif ranks == (3, 3):
            axes = transposed.attrs.axes if is_t else None
            batched_t = axes is not None and [int(v) for v in axes] == [0, 2, 1]
            weight = transposed.args[0] if batched_t else rhs
            (b, _, k), (b2, k2, _) = _shape(lhs), _shape(rhs)
            if (b, k) != (b2, k2):
                return None, (f"batched matmul {_shape(lhs)} x {_shape(rhs)}: the batch and inner "
                              "extents must agree (no broadcasting)")
            kind, params = "batch_matmul", {"transpose_b": batched_t}
        else:
            return None, (f"matmul of rank {ranks[0]} x rank {ranks[1]}"
                          f"{' (B not transposed)' if ranks == (2, 2) else ''} is not "
                          f"{self._MATMUL_FORMS}")
        if (_dtype(lhs), _dtype(weight), str(call.attrs.out_dtype)) != ("int8", "int8", "int32"):
            return None, (f"matmul is {_dtype(lhs)} x {_dtype(weight)} -> {call.attrs.out_dtype}, "
                          "not int8 x int8 -> int32")
        return MatchedOp(kind, call, [lhs, weight], name=name, params=params), None

    def _hswish(self, call, name: str) -> Tuple[Optional[MatchedOp], Optional[str]]:
        """``x * clip(x + offset, lo, hi)`` with ``x = astype(int8 -> int32)`` of one tensor (the
        quantiser's integer hardswish) -> a ``hswish`` match."""
        for i in (0, 1):
            x = self._cast_source(call.args[i], "int8", "int32")
            clip = self._producer(call.args[1 - i])
            if x is None or _op_name(clip) != "relax.clip":
                continue
            add = self._producer(clip.args[0])
            if _op_name(add) != "relax.add":
                continue
            for j in (0, 1):
                offset = self._scalar(add.args[1 - j])
                if offset is not None and self._cast_source(add.args[j], "int8", "int32") \
                        is not None and self._cast_source(add.args[j], "int8", "int32").same_as(x):
                    return MatchedOp("hswish", call, [x], name=name, params=dict(
                        offset=offset, lo=int(clip.args[1].value),
                        hi=int(clip.args[2].value))), None
        return None, None

    # ---------------------------------------------------------------- tails
    _CHAIN_OPS = ("relax.nn.conv2d", "relax.nn.conv1d", "relax.matmul", "relax.nn.avg_pool2d", "relax.add",
                  "relax.right_shift", "relax.clip", "relax.multiply", "relax.astype")
    #: core kinds with an output-channel axis (the ones a per-channel tensor can follow)
    _CHANNEL_KINDS = ("conv2d", "group_conv2d", "depthwise_conv2d", "dense", "dilated_conv2d",
                      "conv1d", "batch_matmul")
    #: core kinds with an output-channel axis (the ones a per-channel tensor can follow)
    _CHANNEL_KINDS = ("conv2d", "group_conv2d", "depthwise_conv2d", "dense", "dilated_conv2d",
                      "conv1d", "batch_matmul")

    @staticmethod
    def _scalar(expr) -> Optional[int]:
        """The value of a one-element int32 constant, else None."""
        if isinstance(expr, tvm.ir.expr.Constant) and _dtype(expr) == "int32":
            value = expr.value.numpy()
            if value.size == 1:
                return int(value.reshape(-1)[0])
        return None

    def match_tail(self, astype_call: relax.Call) -> Tuple[Optional[MatchedOp], Optional[str]]:
        """Match ``core`` followed by the requantisation tail, ending at ``astype_call``
        (``astype int8``): any sequence of bias add (at most one), per-channel multiply (at most
        one), right shifts, adds and multiplies of a scalar constant, clips, and no-op int32 casts
        (TVM legalises an int32 ``avg_pool2d`` through int64, so the quantiser casts back)."""
        tail: List[tuple] = []
        vectors: Dict[str, relax.Expr] = {}
        expr = astype_call.args[0]
        if _dtype(expr) != "int32":
            return None, None
        while True:
            call = self._producer(expr)
            name = _op_name(call)
            if name == "relax.clip":
                # whether the ALU can hold the bounds is the template's call (epilogue refusal)
                tail.append(("clip", int(call.args[1].value), int(call.args[2].value)))
            elif name == "relax.right_shift":
                amount = call.args[1]
                if not isinstance(amount, tvm.ir.expr.Constant):
                    return None, "right_shift by a non-constant amount"
                values = np.unique(amount.value.numpy())
                if values.size != 1:
                    return None, f"right_shift amounts {values.tolist()} differ per element"
                tail.append(("shr", int(values[0])))
            elif name == "relax.astype" and str(call.attrs.dtype) == "int32" \
                    and _dtype(call.args[0]) == "int32":
                pass  # a no-op cast
            elif name in ("relax.add", "relax.multiply") and self._core(expr)[0] is None:
                imm = "add" if name == "relax.add" else "mul"
                lhs, rhs = call.args
                if self._scalar(rhs) is not None or self._scalar(lhs) is not None:
                    scalar_first = self._scalar(rhs) is None
                    tail.append((imm, self._scalar(lhs if scalar_first else rhs)))
                    expr = rhs if scalar_first else lhs
                    continue
                kind = "bias" if imm == "add" else "mulv"
                if kind in vectors:
                    second = "bias add" if kind == "bias" else "per-channel multiply"
                    return None, f"a second {second} in the requantisation tail"
                chain = [_op_name(self._producer(arg)) in self._CHAIN_OPS for arg in call.args]
                if chain.count(True) != 1:
                    return None, (f"{name.split('.')[-1]} of two computed tensors that is neither "
                                  "a bias, a per-channel multiplier nor a residual add")
                main = chain.index(True)
                vectors[kind] = call.args[1 - main]
                tail.append((kind,))
                expr = call.args[main]
                continue
            else:
                break
            expr = call.args[0]
        core, reason = self._core(expr)
        if core is None:
            return None, reason
        tail = tail[::-1]
        if core.kind in self._CHANNEL_KINDS and "mulv" not in vectors:
            # a scalar multiplier beyond the 16-bit immediate: a per-channel vector of it
            for i, st in enumerate(tail):
                if st[0] == "mul" and not IMM_MIN <= st[1] <= IMM_MAX:
                    shape = self._vector_shapes(core)[0]
                    vectors["mulv"] = relax.const(np.full(shape, st[1], np.int32))
                    tail[i] = ("mulv",)
                    break
        for kind, tensor in vectors.items():
            vector_reason = self._vector_reason(core, tensor, kind)
            if vector_reason:
                return None, vector_reason
            vectors[kind] = self._per_channel(core, tensor)
        core.bias = vectors.get("bias")
        core.multiplier = vectors.get("mulv")
        core.epilogue = fit_immediates(tail)
        self.source_tails[core.name] = tuple(tail)  # what the CPU build computes
        return core, None

    @staticmethod
    def _vector_shapes(core: MatchedOp) -> List[Tuple[int, ...]]:
        """The shapes of a per-output-channel tensor (bias, multiplier) of a core of a kind in
        :attr:`_CHANNEL_KINDS`, the canonical one first (a batched matmul's channel is a column
        of one batch: ``(B, 1, M)``)."""
        if core.kind == "batch_matmul":
            b, _, m = _shape(core.core)
            return [(b, 1, m), (1, 1, m), (m,)]
        out = _shape(core.operands[1])[0]
        if core.kind == "dense":
            return [(out,), (1, out)]
        if core.kind == "conv1d":
            return [(1, out, 1)]
        return [(1, out, 1, 1)]

    def _per_channel(self, core: MatchedOp, tensor):
        """``tensor`` (a checked per-channel vector) in the canonical shape of
        :meth:`_vector_shapes`: a batched matmul's constant vector shared by every batch,
        ``(1, 1, M)`` or ``(M,)``, broadcast to ``(B, 1, M)`` at build time (:meth:`_vector_reason`
        refuses a computed one)."""
        shape = self._vector_shapes(core)[0]
        if core.kind != "batch_matmul" or _shape(tensor) == shape:
            return tensor
        values = tensor.value.numpy().reshape(1, 1, -1)
        return relax.const(np.ascontiguousarray(np.broadcast_to(values, shape)))

    def _vector_reason(self, core: MatchedOp, tensor, kind: str = "bias") -> Optional[str]:
        what = "bias" if kind == "bias" else "per-channel multiplier"
        if core.kind not in self._CHANNEL_KINDS:
            return f"{core.kind} takes no {what}"
        expected = self._vector_shapes(core)
        if core.kind == "batch_matmul" and _shape(tensor) in expected[1:] \
                and not isinstance(tensor, tvm.ir.expr.Constant):
            return (f"{what} {_shape(tensor)} of a batched matmul is shared by every batch but not "
                    f"a constant; give it as {expected[0]} (one vector per batch) or as a constant")
        if _dtype(tensor) != "int32" or _shape(tensor) not in expected:
            return f"{what} {_shape(tensor)} {_dtype(tensor)}; expected int32 of shape {expected[0]}"
        return None

    # ---------------------------------------------------------------- calls
    def match_call(self, call: relax.Call, binding: str) -> Tuple[Optional[MatchedOp], Optional[str]]:
        """The operator ``call`` (bound to ``binding``) ends, or None and why a candidate is not
        one: an ``astype int8`` ending a core and its tail, an int8 ``max_pool2d`` or an int8
        ``clip``."""
        name = _op_name(call)
        match, reason = None, None
        if name == "relax.astype" and str(call.attrs.dtype) == "int8":
            match, reason = self.match_tail(call)
        elif name == "relax.nn.max_pool2d" and _dtype(call.args[0]) == "int8":
            match = MatchedOp("max_pool2d", call, [call.args[0]], name=binding)
        elif name == "relax.clip" and _dtype(call.args[0]) == "int8" and _dtype(call) == "int8" \
                and len(_shape(call)) in (2, 4):
            match = MatchedOp("clip", call, [call.args[0]], name=binding,
                              epilogue=(("clip", int(call.args[1].value),
                                         int(call.args[2].value)),))
        return match, reason

    def find_core(self, call) -> Optional[str]:
        """The variable of the core a rejected tail ending at ``call`` started from, if any."""
        expr = call.args[0] if call.args else None
        for _ in range(12):
            producer = self._producer(expr)
            if producer is None:
                return None
            if _op_name(producer) in ("relax.nn.conv2d", "relax.nn.conv1d", "relax.matmul",
                                      "relax.nn.avg_pool2d"):
                return expr.name
            expr = producer.args[0]
        return None


#: why a candidate core operator that matched no pattern stays on the CPU
CANDIDATE_REASONS = {"relax.nn.conv2d": "not followed by the int8 requantisation tail (astype int8)",
                     "relax.nn.conv1d": "not followed by the int8 requantisation tail (astype int8)",
                     "relax.matmul": "not int8 x permute_dims(int8) (dense) or a rank-3 int8 x int8 "
                                     "(batched matmul) followed by the int8 requantisation tail",
                     "relax.nn.avg_pool2d": "not astype(int8->int32) followed by the int8 requantisation tail",
                     "relax.nn.max_pool2d": "input is not int8"}
