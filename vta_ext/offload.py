"""Relax pass that offloads canonical quantised int8 patterns to VTA.

Matched patterns (NCHW activations, int8 in, int32 accumulation; see ``docs/templates-api.md``)::

    core -> tail -> R.astype(., "int8")

    tail = any sequence of R.add(., bias int32 per channel) (at most one),
           R.multiply(., multiplier int32 per channel) (at most one), R.right_shift(., constant),
           R.add / R.multiply(., int32 scalar constant), R.clip(., lo, hi), no-op int32 casts
           (e.g. the fixed-point requantisation of PT2E / QDQ graphs:
            bias, >> s1, * M, + 2**(k-1), >> k, clip; M a scalar or one per output channel)

    core = R.nn.conv2d(int8 NCHW, int8 OIHW, out_dtype="int32")         conv2d / group / depthwise
                                                                          (dilated_conv2d: groups 1,
                                                                          dilation > 1)
         | R.nn.conv1d(int8 NCW, int8 OIW, out_dtype="int32")           conv1d (groups 1)
         | R.matmul(int8 [N,K], R.permute_dims(int8 [M,K]), "int32")     dense
         | R.matmul(int8 [B,N,K], int8 [B,K,M], "int32")                   batch_matmul
         | R.matmul(int8 [B,N,K], R.permute_dims(int8 [B,M,K], [0, 2, 1]), "int32")
         | R.nn.avg_pool2d(R.astype(int8, "int32"))                       average pooling
         | R.add(R.astype(int8, "int32"), R.astype(int8, "int32"))        residual add
         | R.multiply(x, R.clip(R.add(x, c), lo, hi)), x = R.astype(int8, "int32")
                                                                          hardswish

    R.nn.max_pool2d(int8 NCHW)                                            max pooling
    R.clip(int8 NCHW, lo, hi)                                             int8 clip (ReLU6)

The pass only *matches*; what each match becomes is up to the strategy in effect
(:func:`vta_ext.build_options`, :mod:`vta_ext.strategy`). Its template plans the packed layouts;
the pass emits their packing on the CPU, one ``call_dps_packed("vta_ext.run", ...)`` that executes
the prebuilt VTA program, and the unpacking. Consecutive VTA operators whose layouts agree hand
over the packed tensor directly; block-aligned channel concats, splits and channel shuffles of
packed tensors are made on the packed tensors, and a concat (or split piece) of one batch block
that a VTA operator takes is passed as its parts (``vta_ext.run_placed``), which the runtime
places in the operator's DRAM buffer: no host copy. Instruction streams are built here, at build time
(:mod:`vta_ext.executor`).

Only a :class:`~vta_ext.errors.TemplateRefusal` keeps a matched operator on the CPU; any other
error fails the build with a :class:`~vta_ext.errors.VTABuildError` naming the operator and its
shapes. The :class:`~vta_ext.report.BuildReport` lists every placement and why.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List, Optional, Tuple

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .config import VTAConfig
from .errors import TemplateRefusal, VTABuildError
from .executor import compiled_op, op_key
from .options import current_options
from .quantize import op_macs
from .report import (CPU, CPU_REASONS_ATTR, LAYERS_ATTR, LAYOUT_REASON, VTA, BuildReport, config_label,
                     publish)
from .packing import channel_shuffle_map, same_arrangement
from .layout import IMM_MAX, IMM_MIN
from .strategy import MatchedOp, get_template
from .timing import phase, timed_build
from .host import VIEW_OPS
from .templates.epilogue import epilogue_range, fit_immediates, has_multiply
from .templates.errors import EpilogueRefusal

__all__ = ["OffloadToVTA", "RUN_FUNC", "LAYERS_ATTR", "CPU_REASONS_ATTR"]

logger = logging.getLogger("vta_ext")

RUN_FUNC = "vta_ext.run"
RUN_PLACED_FUNC = "vta_ext.run_placed"
PACK_PREFIX = "vta_pack"
UNPACK_PREFIX = "vta_unpack"


def _op_name(call) -> Optional[str]:
    return call.op.name if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) else None


def _shape(expr) -> Tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


@mutator
class _Offloader(PyExprMutator):
    """Rewrites matched patterns; remembers why unmatched candidates stay on the CPU."""

    def __init__(self, mod: tvm.IRModule, config: VTAConfig, match_only: bool = False) -> None:
        super().__init__(mod)
        self.config = config
        # match_only: record every matched operator in ``matched`` and rewrite nothing
        self.match_only = match_only
        self.matched: List[MatchedOp] = []
        self.op_keys: List[str] = []  # the compiled-operator key of every VTA call, in order
        self.rejected: Dict[str, str] = {}  # var name of a candidate core op -> reason
        # (relax op, what, detail, var, further OpPlacement fields), one per entry of op_keys
        self.offloaded: List[Tuple[str, str, str, str, dict]] = []
        self.unpack_vars: set = set()  # variables now bound to the last unpacking step
        # NCHW result var of a concat / split / channel shuffle made in the packed layout ->
        # (relax op, what its packed version is, name of the bound packed tensor)
        self.packed_ops: Dict[str, Tuple[str, str, str]] = {}
        # packed concat var name -> (the bound packed concat, its parts) when the parts can be
        # placed side by side in a consumer's DRAM buffer (one batch block)
        self._concat_parts: Dict[str, tuple] = {}
        self.placed_concats: Dict[str, List[str]] = {}  # packed concat var -> consumers placing it
        self._split_pieces: Dict[str, tuple] = {}  # NCHW split var -> (packed, layout, bounds)
        # bound packed slice var name -> (it, its packed source, first block, end block) when the
        # source has one batch block (the slice is a contiguous byte range)
        self._slices: Dict[str, tuple] = {}
        self._rewritten_binding = False
        # unpacked result variable name -> (variable, packed tensor, its packed layout)
        self._packed: Dict[str, tuple] = {}
        self._last_packed = None
        self._current_binding = ""
        self._kept = False
        self._source_tails: Dict[str, tuple] = {}  # core var -> its tail as in the module

    # ---------------------------------------------------------------- helpers
    def _producer(self, expr):
        if isinstance(expr, relax.Var):
            return self.lookup_binding(expr)
        return None

    def _emit(self, expr, name: str):
        return self.builder_.emit(expr, name_hint=name)

    def _cast_source(self, expr, src: str, dst: str):
        """If ``expr`` is ``astype(x: src, dst)`` return ``x``."""
        call = self._producer(expr)
        if _op_name(call) == "relax.astype" and str(call.attrs.dtype) == dst \
                and _dtype(call.args[0]) == src:
            return call.args[0]
        return None

    # ---------------------------------------------------------------- matching
    def _conv_kind(self, call: relax.Call) -> Tuple[Optional[str], Optional[str]]:
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
            kind, reason = self._conv_kind(call)
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

    _CHAIN_OPS = ("relax.nn.conv2d", "relax.nn.conv1d", "relax.matmul", "relax.nn.avg_pool2d", "relax.add",
                  "relax.right_shift", "relax.clip", "relax.multiply", "relax.astype")
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
        self._source_tails[core.name] = tuple(tail)  # what the CPU build computes
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

    def _core_range(self, m: MatchedOp):
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

    def check_overflow(self, m: MatchedOp) -> None:
        """Refuse (:class:`EpilogueRefusal`) an epilogue with a multiply whose int32 values could
        leave int32 for the core's accumulator range (:func:`epilogue_range`): VTA's ALU wraps,
        the CPU build does not promise to, and the results must not differ. The check runs on the
        tail as the module computes it (before :func:`fit_immediates` moves a rounding add behind
        a shift, where it could no longer overflow on VTA though it does on the CPU)."""
        source = self._source_tails.get(m.name, m.epilogue)
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
        lo, hi = self._core_range(m)
        epilogue_range(source, lo, hi, what=f"{m.kind} {m.name!r}", **tensors)

    # ---------------------------------------------------------------- packer (vta_ext.packing)
    def emit(self, expr, name: str):
        """Bind a packing step on the host."""
        return self._emit(expr, f"{PACK_PREFIX}_{name}")

    def emit_unpack(self, expr, name: str):
        """Bind an unpacking step on the host."""
        return self._emit(expr, f"{UNPACK_PREFIX}_{name}")

    def operand(self, expr):
        """The rewritten operand ``expr``."""
        return self.visit_expr(expr)

    def producer_layout(self, expr):
        """The packed layout ``expr`` is available in as a previous VTA operator's output, or
        None (then it lives on the host in its own layout)."""
        producer = self._packed.get(expr.name) if isinstance(expr, relax.Var) else None
        return producer[2] if producer is not None and producer[0].same_as(expr) else None

    def handover(self, expr, layout):
        """The packed output of a previous VTA operator if ``expr`` is its result in a layout of
        the same arrangement as ``layout`` (:func:`~vta_ext.packing.same_arrangement`)."""
        held = self.producer_layout(expr)
        if held is not None and same_arrangement(held, layout):
            return self._packed[expr.name][1]
        return None

    def note_kept(self, kept: bool) -> None:
        """Record whether the activation input was handed over in the packed layout."""
        self._kept = kept

    # ---------------------------------------------------------------- rewriting
    def rewrite(self, m: MatchedOp) -> Optional[relax.Expr]:
        """Replace ``m`` by packing + VTA call + unpacking, or return None if the strategy's
        template refuses it (the reason is recorded for the report)."""
        if self.match_only:
            self.matched.append(m)
            return None
        options = current_options()
        strategy = options.strategy_name
        try:
            template = get_template(m.kind, strategy)
            self.check_overflow(m)
            if m.operands:
                m = dataclasses.replace(m, input_layout=self.producer_layout(m.operands[0]))
            with phase("plan"):
                plan = template.plan(m, self.config)
            knobs, origin = options.knobs_for(m.kind, template.strategy, plan.workload, self.config)
            key = op_key(m.kind, template.strategy, self.config, plan.workload, m.epilogue, knobs)
            with phase("codegen"):
                compiled = compiled_op(key, config=self.config)  # the instruction stream, built now
        except TemplateRefusal as err:
            logger.info("%s %r (%s) stays on the CPU: %s", m.kind, m.name, m.shapes, err)
            self.rejected[m.name] = str(err)
            return None
        except Exception as err:
            raise VTABuildError(
                f"building {m.kind} {m.name!r} ({m.shapes}, epilogue {list(m.epilogue)}) for VTA "
                f"with strategy {strategy!r} on config {self.config.name!r} failed: "
                f"{type(err).__name__}: {err}") from err
        self._kept = False
        args, parts = self._place_concats(plan.inputs(self), m.name)
        func, extra = (RUN_FUNC, []) if parts is None else (
            RUN_PLACED_FUNC, [tvm.ir.StringImm(parts)])
        out_packed = self._emit(relax.call_dps_packed(
            func, args + extra + [tvm.ir.StringImm(key)],
            relax.TensorType(plan.out_layout.shape, "int8")), f"vta_{m.kind}")
        out = plan.out_layout.unpack(self, out_packed)
        self._rewritten_binding = True
        self._last_packed = (out_packed, plan.out_layout)
        detail = (f"{plan.description}, epilogue {'+'.join(s[0] for s in m.epilogue) or 'none'}, "
                  f"{compiled.program.insn_count} insns, {origin}{_tiling_text(compiled)}")
        if self._kept:
            detail += "; input kept in the packed layout of the previous VTA operator"
        if parts is not None and "+" in parts:
            count = 1 + max(p.count("+") for p in parts.split(","))
            detail += (f"; input concatenated in DRAM from {count} packed parts (placed by "
                       "vta_ext.run_placed, no host copy)")
        if parts is not None and ":" in parts:
            detail += ("; split piece read in place from its source's channel blocks "
                       "(vta_ext.run_placed, no host slice)")
        if plan.padding:
            detail += f"; PADDED {plan.padding}"
            # the build logs one WARNING line for all padded operators (report.publish)
            logger.info("%s %s: %s pads %s", m.kind, plan.description, template.report_text,
                        plan.padding)
        try:
            summary = template.plan_summary(plan, self.config)
        except Exception as err:  # noqa: BLE001 -- the report's words must not fail a build
            logger.warning("no short plan text for %s %r: %s: %s", m.kind, m.name,
                           type(err).__name__, err)
            summary = template.strategy
        fields = dict(kind=m.kind, plan=summary, padding=plan.padding, macs=_core_macs(m.core),
                      elements=_size(_shape(m.core)), packed_elements=_size(plan.out_layout.shape),
                      call=len(self.op_keys))
        self.offloaded.append((_op_name(m.core), f"{m.kind} ({template.report_text})", detail,
                               m.name, fields))
        self.op_keys.append(key)
        return out

    def _place_concats(self, args: list, consumer: str) -> Tuple[list, Optional[str]]:
        """``args`` with each packed concat that can be placed (:meth:`_packed_concat`) replaced by
        its parts and each channel-block slice of a one-batch-block tensor (:meth:`_packed_piece`)
        by its source, and the ``vta_ext.run_placed`` spec saying how the tensors form the
        operands (None if nothing was replaced). The host concats and slices then have no use
        left unless another consumer needs them."""
        out, spec = [], []
        for arg in args:
            entry = self._concat_parts.get(arg.name) if isinstance(arg, relax.Var) else None
            if entry is not None and entry[0].same_as(arg):
                parts = entry[1]
                self.placed_concats.setdefault(arg.name, []).append(consumer)
            else:
                parts = [arg]
            texts = []
            for part in parts:
                piece = self._slices.get(part.name) if isinstance(part, relax.Var) else None
                if piece is not None and piece[0].same_as(part):
                    out.append(piece[1])
                    texts.append(f"{piece[2]}:{piece[3]}")
                else:
                    out.append(part)
                    texts.append("*")
            spec.append("+".join(texts))
        return out, (None if all(t == "*" for t in spec) else ",".join(spec))

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        name = _op_name(call)
        match, reason = None, None
        if name == "relax.astype" and str(call.attrs.dtype) == "int8":
            match, reason = self.match_tail(call)
        elif name == "relax.nn.max_pool2d" and _dtype(call.args[0]) == "int8":
            match = MatchedOp("max_pool2d", call, [call.args[0]], name=self._current_binding)
        elif name == "relax.clip" and _dtype(call.args[0]) == "int8" and _dtype(call) == "int8" \
                and len(_shape(call)) in (2, 4):
            match = MatchedOp("clip", call, [call.args[0]], name=self._current_binding,
                              epilogue=(("clip", int(call.args[1].value),
                                         int(call.args[2].value)),))
        if match is not None:
            out = self.rewrite(match)
            if out is not None:
                return out
        elif reason:
            core = self._find_core(call)
            if core:
                self.rejected.setdefault(core, reason)
        return super().visit_call_(call)

    def _find_core(self, call) -> Optional[str]:
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

    def visit_var_binding_(self, binding) -> None:
        value = binding.value
        self._current_binding = binding.var.name
        if _op_name(value) in ("relax.nn.conv2d", "relax.nn.conv1d"):
            _, reason = self._conv_kind(value)
            if reason:
                self.rejected[binding.var.name] = reason
        self._rewritten_binding = False
        super().visit_var_binding_(binding)
        if self._rewritten_binding:
            self.unpack_vars.add(binding.var.name)
            if self._last_packed is not None:
                self._packed[binding.var.name] = (binding.var,) + self._last_packed
        elif _op_name(value) == "relax.concat":
            self._packed_concat(binding)
        elif _op_name(value) == "relax.split":
            self._packed_split(binding)
        elif isinstance(value, relax.TupleGetItem):
            self._packed_piece(binding)
        elif _op_name(value) == "relax.reshape":
            self._packed_shuffle(binding)

    def _packed_blocked(self, expr):
        """``(packed tensor, BlockedActivation)`` if ``expr`` is held in the stock blocked packed
        layout (a VTA output, or a concat / split / shuffle made in it), else None."""
        entry = self._packed.get(expr.name) if isinstance(expr, relax.Var) else None
        if entry is None or not entry[0].same_as(expr) \
                or type(entry[2]).__name__ != "BlockedActivation":
            return None
        return entry[1], entry[2]

    def _packed_concat(self, binding) -> None:
        """A channel concat of VTA outputs that share a packed layout (batch, height, width and
        blocks; every part but the last a whole number of channel blocks) is also made in the
        packed layout: the packed tensors side by side along the channel-block axis, one host
        copy instead of unpack, concat and pack. A VTA consumer takes it over (:meth:`handover`);
        the NCHW concat stays only if a CPU operator uses it."""
        value = binding.value
        parts = value.args[0]
        if not isinstance(parts, relax.Tuple) or int(value.attrs.axis) % 4 != 1 \
                or len(_shape(binding.var)) != 4:
            return
        layouts, packed = [], []
        for part in parts.fields:
            held = self._packed_blocked(part)
            if held is None:
                return
            packed.append(held[0])
            layouts.append(held[1])
        first = layouts[0]
        if any((lay.n, lay.h, lay.w, lay.batch_block, lay.channel_block) !=
               (first.n, first.h, first.w, first.batch_block, first.channel_block)
               for lay in layouts):
            return
        if any(lay.c % lay.channel_block for lay in layouts[:-1]):
            self.rejected[binding.var.name] = (
                f"channel concat of VTA outputs with {'+'.join(str(lay.c) for lay in layouts)} "
                f"channels: a part before the last is not a whole number of {first.channel_block}-"
                "channel blocks, so the concat is made in NCHW (unpack, concat, pack on the host)")
            return
        layout = dataclasses.replace(first, c=sum(lay.c for lay in layouts))
        concat = self._emit(relax.op.concat(packed, axis=1),
                            f"{PACK_PREFIX}_concat_{binding.var.name}")
        self._packed[binding.var.name] = (binding.var, concat, layout)
        if layout.shape[0] == 1:  # one batch block: the concat is byte concatenation
            self._concat_parts[concat.name] = (concat, packed)
        self.packed_ops[binding.var.name] = (
            "relax.concat", f"channel concat of {len(packed)} VTA outputs made in their packed "
            f"layout ({'+'.join(str(lay.c) for lay in layouts)} channels, block-aligned",
            concat.name)

    def _packed_split(self, binding) -> None:
        """A channel split of a tensor held packed (:meth:`_packed_blocked`) whose split points are
        whole channel blocks: remember it; each piece taken from it (:meth:`_packed_piece`) is a
        slice of the packed tensor along the channel-block axis, no unpack/pack."""
        value = binding.value
        held = self._packed_blocked(value.args[0])
        if held is None or int(value.attrs.axis) % 4 != 1:
            return
        packed, layout = held
        sections = value.attrs.indices_or_sections
        if not hasattr(sections, "__len__"):  # a number of equal sections (an IntImm)
            count = int(sections)
            if layout.c % count:
                return
            points = [layout.c // count * i for i in range(1, count)]
        else:
            points = [int(v) for v in sections]
        bounds = list(zip([0] + points, points + [layout.c]))
        k = layout.channel_block
        if any(begin % k for begin, _ in bounds):
            self.rejected[binding.var.name] = (
                f"channel split of a VTA output into {'+'.join(str(e - b) for b, e in bounds)} "
                f"channels: a split point is not a whole number of {k}-channel blocks, so the "
                "split is made in NCHW (unpack on the host)")
            return
        self._split_pieces[binding.var.name] = (binding.var, packed, layout, bounds)

    def _packed_piece(self, binding) -> None:
        """``split[i]`` of a split remembered by :meth:`_packed_split`: bind the slice of the
        packed tensor (channel blocks ``begin/k .. ceil(end/k)``) and hold it as packed."""
        value = binding.value
        entry = self._split_pieces.get(getattr(value.tuple_value, "name", None))
        if entry is None or not entry[0].same_as(value.tuple_value):
            return
        split_var, packed, layout, bounds = entry
        begin, end = bounds[int(value.index)]
        k = layout.channel_block
        blocks = (begin // k, -(-end // k))
        piece = self._emit(relax.op.strided_slice(packed, axes=[1], begin=[blocks[0]],
                                                  end=[blocks[1]]),
                           f"{PACK_PREFIX}_split_{binding.var.name}")
        if layout.shape[0] == 1:
            self._slices[piece.name] = (piece, packed) + blocks
        self._packed[binding.var.name] = (binding.var, piece,
                                          dataclasses.replace(layout, c=end - begin))
        self.packed_ops[split_var.name] = (
            "relax.split", f"channel split of a VTA output into "
            f"{'+'.join(str(e - b) for b, e in bounds)} channels made in its packed layout "
            "(block-aligned: a slice of the channel-block axis per piece", "")

    def _packed_shuffle(self, binding) -> None:
        """A channel shuffle ``reshape (N, g, C/g, H, W) -> permute_dims (0, 2, 1, 3, 4) ->
        reshape (N, C, H, W)`` of a tensor held packed is made on the packed tensor
        (:func:`~vta_ext.packing.channel_shuffle_map`) when the channel block is a multiple of
        ``g`` and ``C/g`` a multiple of the channel block."""
        permute = self._producer(binding.value.args[0])
        if _op_name(permute) != "relax.permute_dims" or permute.attrs.axes is None \
                or [int(a) for a in permute.attrs.axes] != [0, 2, 1, 3, 4]:
            return
        split = self._producer(permute.args[0])
        if _op_name(split) != "relax.reshape":
            return
        source = split.args[0]
        held = self._packed_blocked(source)
        if held is None or len(_shape(source)) != 4 or _shape(binding.var) != _shape(source):
            return
        packed, layout = held
        n, groups, per_group, h, w = _shape(permute.args[0])
        if (n, groups * per_group, h, w) != _shape(source):
            return
        try:
            index_map = channel_shuffle_map(layout, groups)
        except ValueError as err:
            self.rejected[binding.var.name] = (f"channel shuffle of a VTA output made in NCHW "
                                               f"(unpack on the host): {err}")
            return
        shuffled = self.emit(relax.op.layout_transform(packed, index_map=index_map),
                             f"shuffle_{binding.var.name}")
        self._packed[binding.var.name] = (binding.var, shuffled, layout)
        text = (f"channel shuffle ({groups} groups of {per_group} channels) of a VTA output made "
                "in its packed layout (one layout_transform of the packed tensor")
        # the three NCHW steps of the shuffle are all accounted for by the packed one
        for var, op in ((permute.args[0], "relax.reshape"), (binding.value.args[0],
                                                             "relax.permute_dims")):
            if isinstance(var, relax.Var):
                self.packed_ops[var.name] = (op, text, shuffled.name)
        self.packed_ops[binding.var.name] = ("relax.reshape", text, shuffled.name)


def _size(shape) -> int:
    return int(np.prod([int(d) for d in shape], dtype=np.int64))


def _core_macs(core) -> int:
    """Multiply-accumulates of a conv2d / conv1d / matmul core call as written (output elements
    times the reduction; :func:`vta_ext.quantize.op_macs` counts conv2d and matmul the same way),
    0 for other operators."""
    name = _op_name(core)
    if name in ("relax.nn.conv2d", "relax.nn.conv1d"):
        return _size(_shape(core)) * _size(_shape(core.args[1])[1:])
    if name == "relax.matmul":
        return _size(_shape(core.args[0])) * _shape(core.args[1])[-1]
    return 0


def _tiling_text(compiled) -> str:
    """", tiling tile_h=7 oc_nthread=2" for a compiled GEMM operator (knobs that are not 1)."""
    knobs = getattr(compiled, "knobs", None)
    if knobs is None or not hasattr(knobs, "__dataclass_fields__"):
        return ""
    chosen = [f"{name}={getattr(knobs, name)}" for name in knobs.__dataclass_fields__
              if getattr(knobs, name) not in (1, False)]
    return ", tiling " + (" ".join(chosen) if chosen else "all inner tiles 1")


_CANDIDATES = {"relax.nn.conv2d": "not followed by the int8 requantisation tail (astype int8)",
               "relax.nn.conv1d": "not followed by the int8 requantisation tail (astype int8)",
               "relax.matmul": "not int8 x permute_dims(int8) (dense) or a rank-3 int8 x int8 "
                               "(batched matmul) followed by the int8 requantisation tail",
               "relax.nn.avg_pool2d": "not astype(int8->int32) followed by the int8 requantisation tail",
               "relax.nn.max_pool2d": "input is not int8"}


def _binding_bytes(func: relax.Function) -> Dict[str, int]:
    """Var name -> bytes of its tensor value, for the bindings of ``func`` with a static shape."""
    out: Dict[str, int] = {}
    for block in getattr(func.body, "blocks", []):
        for binding in block.bindings:
            ty = getattr(binding.var, "ty", None)
            try:
                dims = [int(d) for d in ty.shape]
                bits = tvm.runtime.DataType(str(ty.dtype)).bits
            except (AttributeError, TypeError, ValueError):
                continue
            out[binding.var.name] = int(np.prod(dims, dtype=np.int64)) * max(1, bits // 8)
    return out


def _cpu_macs(mod: tvm.IRModule, report: BuildReport) -> int:
    """MACs of the conv2d / matmul operators of ``mod`` that the report leaves on the CPU."""
    try:
        macs = op_macs(mod)
    except Exception:  # noqa: BLE001 -- a module without a plain ``main``: nothing to attribute
        return 0
    return sum(macs[p.name][1] for p in report.on_cpu
               if p.reason != LAYOUT_REASON and p.name in macs and p.op == macs[p.name][0])


def _cpu_ops(func: relax.Function) -> List[Tuple[str, str]]:
    """(op, var name) of every operator call left in ``func``."""
    found: List[Tuple[str, str]] = []

    def visit(expr):
        if isinstance(expr, relax.SeqExpr):
            for block in expr.blocks:
                for binding in block.bindings:
                    name = _op_name(binding.value)
                    if name is not None:
                        found.append((name, binding.var.name))
                    visit(binding.value)
            visit(expr.body)
        elif isinstance(expr, relax.If):
            visit(expr.true_branch)
            visit(expr.false_branch)

    visit(func.body)
    return found


def _source_notes(mod: tvm.IRModule) -> Tuple[Dict[str, str], Dict[str, str]]:
    """The :data:`LAYERS_ATTR` and :data:`CPU_REASONS_ATTR` maps of every Relax function."""
    layers: Dict[str, str] = {}
    reasons: Dict[str, str] = {}
    for func in mod.functions.values():
        attrs = func.attrs if isinstance(func, relax.Function) and func.attrs else {}
        for name, target in ((LAYERS_ATTR, layers), (CPU_REASONS_ATTR, reasons)):
            if name in attrs:
                target.update({str(k): str(v) for k, v in attrs[name].items()})
    return layers, reasons


def _prefetch(mod: tvm.IRModule, config: VTAConfig) -> None:
    """Give each template all of the module's operators it will plan (``OpTemplate.prefetch``),
    before they are planned one at a time."""
    matcher = _Offloader(mod, config, match_only=True)
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            matcher.visit_expr(func)
    strategy = current_options().strategy_name
    groups: Dict[int, Tuple[object, List[MatchedOp]]] = {}
    for m in matcher.matched:
        try:
            template = get_template(m.kind, strategy)
        except TemplateRefusal:
            continue
        groups.setdefault(id(template), (template, []))[1].append(m)
    for template, ops in groups.values():
        template.prefetch(ops, config)


def OffloadToVTA(config: VTAConfig) -> tvm.transform.Pass:  # noqa: N802 (TVM pass naming)
    """The offload pass for ``config``; publishes a :class:`BuildReport` when it runs."""

    @tvm.transform.module_pass(opt_level=0, name="VTAOffload")
    def offload(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with timed_build() as timer:
            with phase("solve"):
                _prefetch(mod, config)
            rewriter = _Offloader(mod, config)
            for gvar, func in list(mod.functions.items()):
                if isinstance(func, relax.Function):
                    rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
            new_mod = relax.transform.DeadCodeElimination()(rewriter.builder_.get())
            layers, frontend_reasons = _source_notes(mod)
            report = BuildReport(config_label(config), current_options().strategy_name,
                                 host=current_options().host, vta_keys=list(rewriter.op_keys))
            for op, what, detail, var, fields in rewriter.offloaded:
                report.add(op, VTA, what, detail, var, layers.get(var, ""), **fields)
            remaining = {var for func in new_mod.functions.values() if isinstance(func, relax.Function)
                         for _, var in _cpu_ops(func)}
            # the packed concat / split / shuffle entries go where their source stood in the input
            order = {var: i for func in mod.functions.values() if isinstance(func, relax.Function)
                     for i, (_, var) in enumerate(_cpu_ops(func))}
            packed_entries = []
            for source, (op, text, packed) in rewriter.packed_ops.items():
                if source in remaining:
                    continue  # the NCHW version runs on the CPU too and is reported as such
                if op == "relax.concat":
                    placed = rewriter.placed_concats.get(packed, [])
                    if packed in remaining:
                        why = ("a CPU operator uses the packed concat" if packed in
                               rewriter._concat_parts else "more than one batch block: the parts are "
                               "not contiguous in the concat, so they cannot be placed")
                        text += f": one host copy of the packed tensors ({why}), no unpack/pack)"
                    else:
                        text += (f": placed in DRAM by its consumer {', '.join(placed)} "
                                 "(vta_ext.run_placed writes each part where it starts in the "
                                 "operand), no copy, no unpack/pack)")
                else:
                    text += ", no unpack/pack)"
                packed_entries.append((order.get(source, len(order)), op, text, source))
            packed_entries.sort(key=lambda e: e[0])
            sizes = {var: n for func in new_mod.functions.values() if isinstance(func, relax.Function)
                     for var, n in _binding_bytes(func).items()}

            def add_packed(before: int) -> None:
                while packed_entries and packed_entries[0][0] < before:
                    _, op, text, source = packed_entries.pop(0)
                    report.add(op, CPU, text, source, source, layers.get(source, ""))

            for func in new_mod.functions.values():
                if not isinstance(func, relax.Function):
                    continue
                for op, var in _cpu_ops(func):
                    if op == "relax.call_dps_packed":
                        continue
                    if var in order:
                        add_packed(order[var])
                    if var.startswith((PACK_PREFIX, UNPACK_PREFIX)) or var in rewriter.unpack_vars:
                        reason = LAYOUT_REASON
                        if op not in VIEW_OPS:
                            report.layout_bytes += sizes.get(var, 0)
                    elif var in rewriter.rejected:
                        reason = rewriter.rejected[var]
                    elif var in frontend_reasons:
                        reason = frontend_reasons[var]
                    elif op in _CANDIDATES:
                        reason = _CANDIDATES[op]
                    else:
                        reason = "no VTA template for this operator"
                    report.add(op, CPU, reason, var, var, layers.get(var, ""))
            add_packed(len(order) + 1)
            report.cpu_macs = _cpu_macs(mod, report)
        report.timings = dict(timer.seconds)
        publish(report)
        return new_mod

    return offload
