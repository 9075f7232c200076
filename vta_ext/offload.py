"""Relax pass that offloads canonical quantised int8 patterns to VTA.

Matched patterns (NCHW activations, int8 in, int32 accumulation; see ``docs/templates-api.md``)::

    core -> optional R.add(., bias int32) -> optional R.right_shift(., constant)
         -> optional R.clip(., lo, hi) -> R.astype(., "int8")

    core = R.nn.conv2d(int8 NCHW, int8 OIHW, out_dtype="int32")         conv2d / group / depthwise
         | R.matmul(int8 [N,K], R.permute_dims(int8 [M,K]), "int32")     dense
         | R.nn.avg_pool2d(R.astype(int8, "int32"))                       average pooling
         | R.add(R.astype(int8, "int32"), R.astype(int8, "int32"))        residual add

    R.nn.max_pool2d(int8 NCHW)                                            max pooling

Each match becomes: packing (pad to the GEMM blocks, reshape, transpose) on the CPU, one
``call_dps_packed("vta_ext.run", ...)`` that executes the prebuilt VTA program, and unpacking.
Consecutive VTA operators hand over the packed tensor directly. Instruction streams are built here,
at build time (:mod:`vta_ext.executor`). An operator whose template is missing or refuses the
workload stays on the CPU; the :class:`~vta_ext.report.BuildReport` says which and why.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .config import VTAConfig
from .report import CPU, LAYOUT_REASON, VTA, BuildReport, publish

__all__ = ["OffloadToVTA", "RUN_FUNC"]

logger = logging.getLogger("vta_ext")

RUN_FUNC = "vta_ext.run"
PACK_PREFIX = "vta_pack"
UNPACK_PREFIX = "vta_unpack"
MAX_DMA_PAD = 15  # 4-bit pad fields of LOAD


def _op_name(call) -> Optional[str]:
    return call.op.name if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) else None


def _shape(expr) -> Tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass
class Match:
    """A matched pattern: the operator kind, its Relax operands and its requantisation tail."""

    kind: str
    core: relax.Call
    operands: List[relax.Expr]
    core_var: str = ""
    bias: Optional[relax.Expr] = None
    epilogue: List[tuple] = field(default_factory=list)


@mutator
class _Offloader(PyExprMutator):
    """Rewrites matched patterns; remembers why unmatched candidates stay on the CPU."""

    def __init__(self, mod: tvm.IRModule, config: VTAConfig) -> None:
        super().__init__(mod)
        self.config = config
        self.rejected: Dict[str, str] = {}  # var name of a candidate core op -> reason
        self.offloaded: List[Tuple[str, str, str]] = []  # (relax op, template, detail)
        self.unpack_vars: set = set()  # variables now bound to the last unpacking step
        self._rewritten_binding = False
        # unpacked result variable name -> (variable, packed tensor, padded batch, padded channels)
        self._packed: Dict[str, tuple] = {}
        self._last_packed = None
        self._current_binding = ""
        self._kept = False

    # ---------------------------------------------------------------- helpers
    def _producer(self, expr):
        if isinstance(expr, relax.Var):
            return self.lookup_binding(expr)
        return None

    def _emit(self, expr, name: str):
        return self.builder_.emit(expr, name_hint=name)

    def _pack(self, expr, name: str):
        return self._emit(expr, f"{PACK_PREFIX}_{name}")

    def _cast_source(self, expr, src: str, dst: str):
        """If ``expr`` is ``astype(x: src, dst)`` return ``x``."""
        call = self._producer(expr)
        if _op_name(call) == "relax.astype" and str(call.attrs.dtype) == dst \
                and _dtype(call.args[0]) == src:
            return call.args[0]
        return None

    # ---------------------------------------------------------------- matching
    def _conv_kind(self, call: relax.Call) -> Tuple[Optional[str], Optional[str]]:
        a = call.attrs
        data, weight = call.args
        if (_dtype(data), _dtype(weight)) != ("int8", "int8"):
            return None, f"data/weight are {_dtype(data)}/{_dtype(weight)}, VTA needs int8/int8"
        if str(a.out_dtype) != "int32":
            return None, f"out_dtype {a.out_dtype}, VTA accumulates in int32"
        if (a.data_layout, a.kernel_layout) != ("NCHW", "OIHW"):
            return None, f"layout {a.data_layout}/{a.kernel_layout}; the templates need NCHW/OIHW"
        if any(int(d) != 1 for d in a.dilation):
            return None, f"dilation {tuple(int(d) for d in a.dilation)} is not supported"
        top, left, bottom, right = (int(p) for p in a.padding)
        if (top, left) != (bottom, right):
            return None, f"asymmetric padding {(top, left, bottom, right)} is not supported"
        if max(top, left) > MAX_DMA_PAD:
            return None, f"padding {max(top, left)} exceeds the 4-bit DMA pad field ({MAX_DMA_PAD})"
        groups, channels, out_channels = int(a.groups), _shape(data)[1], _shape(weight)[0]
        if groups == 1:
            return "conv2d", None
        if groups == channels == out_channels:
            return "depthwise_conv2d", None
        cfg = self.config
        if (channels // groups) % cfg.BLOCK_IN or (out_channels // groups) % cfg.BLOCK_OUT:
            return None, (f"groups={groups}: {channels // groups} input / {out_channels // groups} "
                          f"output channels per group are not multiples of the {cfg.BLOCK_IN}x"
                          f"{cfg.BLOCK_OUT} GEMM block")
        return "group_conv2d", None

    def _core(self, expr) -> Tuple[Optional[Match], Optional[str]]:
        """Match the core operator producing ``expr`` (int32)."""
        call = self._producer(expr)
        name = _op_name(call)
        if name == "relax.nn.conv2d":
            kind, reason = self._conv_kind(call)
            return (Match(kind, call, list(call.args), expr.name) if kind else None), reason
        if name == "relax.matmul":
            lhs, rhs = call.args
            transposed = self._producer(rhs)
            if _op_name(transposed) != "relax.permute_dims" or len(_shape(lhs)) != 2:
                return None, "matmul is not int8 [N,K] x permute_dims(int8 [M,K])"
            weight = transposed.args[0]
            if (_dtype(lhs), _dtype(weight), str(call.attrs.out_dtype)) != ("int8", "int8", "int32"):
                return None, "matmul is not int8 x int8 -> int32"
            return Match("dense", call, [lhs, weight], expr.name), None
        if name == "relax.nn.avg_pool2d":
            source = self._cast_source(call.args[0], "int8", "int32")
            if source is None:
                return None, "avg_pool2d input is not astype(int8 -> int32)"
            reason = self._pool_reason(call)
            return (Match("avg_pool2d", call, [source], expr.name) if reason is None else None), reason
        if name == "relax.add":
            a = self._cast_source(call.args[0], "int8", "int32")
            b = self._cast_source(call.args[1], "int8", "int32")
            if a is not None and b is not None and _shape(a) == _shape(b) and len(_shape(a)) == 4:
                return Match("add", call, [a, b], expr.name), None
        return None, None

    def _pool_reason(self, call: relax.Call) -> Optional[str]:
        a = call.attrs
        if str(a.layout) != "NCHW":
            return f"pool layout {a.layout}; the templates need NCHW"
        if bool(a.ceil_mode):
            return "ceil_mode pooling is not supported"
        if any(int(d) != 1 for d in a.dilation):
            return "dilated pooling is not supported"
        top, left, bottom, right = (int(p) for p in a.padding)
        if (top, left) != (bottom, right):
            return f"asymmetric pool padding {(top, left, bottom, right)} is not supported"
        if max(top, left) > MAX_DMA_PAD:
            return f"pool padding {max(top, left)} exceeds the 4-bit DMA pad field"
        return None

    _CHAIN_OPS = ("relax.nn.conv2d", "relax.matmul", "relax.nn.avg_pool2d", "relax.add",
                  "relax.right_shift", "relax.clip")

    def match_tail(self, astype_call: relax.Call) -> Tuple[Optional[Match], Optional[str]]:
        """Match ``core`` followed by bias add, right shift and clip in any order (each at most
        once), then ``astype int8``, ending at ``astype_call``."""
        tail: List[tuple] = []
        expr = astype_call.args[0]
        if _dtype(expr) != "int32":
            return None, None
        bias = None
        while True:
            call = self._producer(expr)
            name = _op_name(call)
            seen = {stage[0] for stage in tail}
            if name == "relax.clip" and "clip" not in seen:
                lo, hi = int(call.args[1].value), int(call.args[2].value)
                if not (-(1 << 15) <= lo <= hi < (1 << 15)):
                    return None, f"clip bounds [{lo}, {hi}] do not fit the 16-bit ALU immediate"
                tail.append(("clip", lo, hi))
            elif name == "relax.right_shift" and "shr" not in seen:
                amount = call.args[1]
                if not isinstance(amount, tvm.ir.expr.Constant):
                    return None, "right_shift by a non-constant amount"
                values = np.unique(amount.value.numpy())
                if values.size != 1 or not 0 <= int(values[0]) <= 31:
                    return None, f"right_shift amount {values.tolist()} is not one constant in 0..31"
                tail.append(("shr", int(values[0])))
            elif name == "relax.add" and "bias" not in seen and self._core(expr)[0] is None:
                chain = [_op_name(self._producer(arg)) in self._CHAIN_OPS for arg in call.args]
                if chain.count(True) != 1:
                    return None, "add of two computed tensors that is neither a bias nor a residual add"
                main = chain.index(True)
                bias = call.args[1 - main]
                tail.append(("bias",))
                expr = call.args[main]
                continue
            else:
                break
            expr = call.args[0]
        core, reason = self._core(expr)
        if core is None:
            return None, reason
        if bias is not None:
            bias_reason = self._bias_reason(core, bias)
            if bias_reason:
                return None, bias_reason
        core.bias = bias
        core.epilogue = tail[::-1]
        return core, None

    def _bias_reason(self, core: Match, bias) -> Optional[str]:
        if core.kind in ("conv2d", "group_conv2d", "depthwise_conv2d"):
            out = _shape(core.operands[1])[0]
            expected = [(1, out, 1, 1)]
        elif core.kind == "dense":
            out = _shape(core.operands[1])[0]
            expected = [(out,), (1, out)]
        else:
            return f"{core.kind} takes no bias"
        if _dtype(bias) != "int32" or _shape(bias) not in expected:
            return f"bias {_shape(bias)} {_dtype(bias)}; expected int32 of shape {expected[0]}"
        return None

    # ---------------------------------------------------------------- packing
    def _activation(self, expr, n: int, c: int, np_: int, cp: int, block: int, name: str):
        """Packed (N/b, C/block, H, W, b, block) form of an NCHW int8 activation."""
        b = self.config.BATCH
        producer = self._packed.get(expr.name) if isinstance(expr, relax.Var) else None
        if producer is not None and producer[0].same_as(expr) and producer[2:] == (np_, cp):
            # made by a VTA operator: reuse its packed output. Its padded channels (if any) meet
            # zero-padded weights or are cut off when unpacking, so their values never matter.
            return producer[1], True
        _, _, h, w = _shape(expr)
        data = self.visit_expr(expr)
        if (np_, cp) != (n, c):
            data = self._pack(relax.op.nn.pad(data, [0, np_ - n, 0, cp - c, 0, 0, 0, 0]), f"pad_{name}")
        data = self._pack(relax.op.reshape(data, (np_ // b, b, cp // block, block, h, w)), f"reshape_{name}")
        return self._pack(relax.op.permute_dims(data, [0, 2, 4, 5, 1, 3]), name), False

    def _channel_bias(self, bias, out: int, out_p: int, rank4: bool):
        b, co = self.config.BATCH, self.config.BLOCK_OUT
        flat = self._pack(relax.op.reshape(self.visit_expr(bias), (out,)), "flat_bias")
        if out_p != out:
            flat = self._pack(relax.op.nn.pad(flat, [0, out_p - out]), "pad_bias")
        shape = (1, out_p // co, 1, 1, 1, co) if rank4 else (1, out_p // co, 1, co)
        full = (1, out_p // co, 1, 1, b, co) if rank4 else (1, out_p // co, b, co)
        flat = self._pack(relax.op.reshape(flat, shape), "reshape_bias")
        return self._pack(relax.op.broadcast_to(flat, full), "bias")

    def _conv_weight(self, weight, o_p: int, i_p: int, name: str = "weight"):
        ci, co = self.config.BLOCK_IN, self.config.BLOCK_OUT
        o, i, kh, kw = _shape(weight)
        w = self.visit_expr(weight)
        if (o_p, i_p) != (o, i):
            w = self._pack(relax.op.nn.pad(w, [0, o_p - o, 0, i_p - i, 0, 0, 0, 0]), f"pad_{name}")
        w = self._pack(relax.op.reshape(w, (o_p // co, co, i_p // ci, ci, kh, kw)), f"reshape_{name}")
        return self._pack(relax.op.permute_dims(w, [0, 2, 4, 5, 1, 3]), name)

    # ---------------------------------------------------------------- per-kind plans
    def _plan(self, m: Match) -> Tuple[dict, Callable[[], list], tuple, Callable, str]:
        """(workload, emit-packed-inputs, packed out shape, unpack(out) -> expr, description)."""
        cfg = self.config
        b, ci, co = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
        if m.kind == "dense":
            x, weight = m.operands
            (n, k), (mo, _) = _shape(x), _shape(weight)
            np_, kp, mp = _ceil_to(n, b), _ceil_to(k, ci), _ceil_to(mo, co)
            workload = dict(batch=np_, in_features=kp, out_features=mp)

            def inputs():
                d = self.visit_expr(x)
                if (np_, kp) != (n, k):
                    d = self._pack(relax.op.nn.pad(d, [0, np_ - n, 0, kp - k]), "pad_data")
                d = self._pack(relax.op.reshape(d, (np_ // b, b, kp // ci, ci)), "reshape_data")
                d = self._pack(relax.op.permute_dims(d, [0, 2, 1, 3]), "data")
                w = self.visit_expr(weight)
                if (mp, kp) != (mo, k):
                    w = self._pack(relax.op.nn.pad(w, [0, mp - mo, 0, kp - k]), "pad_weight")
                w = self._pack(relax.op.reshape(w, (mp // co, co, kp // ci, ci)), "reshape_weight")
                args = [d, self._pack(relax.op.permute_dims(w, [0, 2, 1, 3]), "weight")]
                if m.bias is not None:
                    args.append(self._channel_bias(m.bias, mo, mp, rank4=False))
                return args

            def unpack(out):
                out = self._emit(relax.op.permute_dims(out, [0, 2, 1, 3]), f"{UNPACK_PREFIX}_transpose")
                out = relax.op.reshape(out, (np_, mp))
                if (np_, mp) != (n, mo):
                    out = relax.op.strided_slice(self._emit(out, f"{UNPACK_PREFIX}_reshape"),
                                                 axes=[0, 1], begin=[0, 0], end=[n, mo])
                return out, None

            pads = self._pads(("batch", n, np_), ("in features", k, kp), ("out features", mo, mp))
            return workload, inputs, (np_ // b, mp // co, b, co), unpack, \
                f"{n}x{k} * {mo}x{k}" + pads

        # NCHW activations below
        data = m.operands[0]
        n, c, h, w = _shape(data)
        np_ = _ceil_to(n, b)
        _, _, oh, ow = _shape(m.core)
        if m.kind in ("conv2d", "group_conv2d"):
            weight = m.operands[1]
            o, _, kh, kw = _shape(weight)
            a = m.core.attrs
            groups = int(a.groups)
            cp, op = (_ceil_to(c, ci), _ceil_to(o, co)) if groups == 1 else (c, o)
            workload = dict(batch=np_, height=h, width=w, in_channels=cp, out_channels=op,
                            kernel_h=kh, kernel_w=kw, pad_h=int(a.padding[0]), pad_w=int(a.padding[1]),
                            stride_h=int(a.strides[0]), stride_w=int(a.strides[1]))
            if groups > 1:
                workload["groups"] = groups
            out_c, out_p = o, op

            def inputs():
                d, kept = self._activation(data, n, c, np_, cp, ci, "data")
                self._kept = kept
                args = [d, self._conv_weight(weight, op, cp // groups)]
                if m.bias is not None:
                    args.append(self._channel_bias(m.bias, o, op, rank4=True))
                return args

            desc = (f"{n}x{c}x{h}x{w} * {o}x{c // groups}x{kh}x{kw}"
                    f"{f' g{groups}' if groups > 1 else ''} s{workload['stride_h']} p{workload['pad_h']}")
            pads = self._pads(("batch", n, np_), ("in channels", c, cp), ("out channels", o, op))
        elif m.kind == "depthwise_conv2d":
            weight = m.operands[1]
            _, _, kh, kw = _shape(weight)
            a = m.core.attrs
            cp = _ceil_to(c, co)
            workload = dict(batch=np_, channels=cp, height=h, width=w, kernel_h=kh, kernel_w=kw,
                            pad_h=int(a.padding[0]), pad_w=int(a.padding[1]),
                            stride_h=int(a.strides[0]), stride_w=int(a.strides[1]))
            out_c, out_p = c, cp

            def inputs():
                d, kept = self._activation(data, n, c, np_, cp, co, "data")
                self._kept = kept
                wt = self.visit_expr(weight)
                wt = self._pack(relax.op.reshape(wt, (c, kh, kw)), "flat_weight")
                if cp != c:
                    wt = self._pack(relax.op.nn.pad(wt, [0, cp - c, 0, 0, 0, 0]), "pad_weight")
                wt = self._pack(relax.op.reshape(wt, (cp // co, co, kh, kw)), "reshape_weight")
                wt = self._pack(relax.op.permute_dims(wt, [0, 2, 3, 1]), "transpose_weight")
                wt = self._pack(relax.op.reshape(wt, (cp // co, kh, kw, 1, co)), "expand_weight")
                args = [d, self._pack(relax.op.broadcast_to(wt, (cp // co, kh, kw, b, co)), "weight")]
                if m.bias is not None:
                    args.append(self._channel_bias(m.bias, c, cp, rank4=True))
                return args

            desc = f"{n}x{c}x{h}x{w} depthwise {kh}x{kw} s{workload['stride_h']} p{workload['pad_h']}"
            pads = self._pads(("batch", n, np_), ("channels", c, cp))
        else:  # pools and residual add: channel-blocked by BLOCK_OUT, one or two activations
            cp = _ceil_to(c, co)
            out_c, out_p = c, cp
            if m.kind == "add":
                workload = dict(batch=np_, channels=cp, height=h, width=w)
                desc = f"{n}x{c}x{h}x{w} + {n}x{c}x{h}x{w}"
            else:
                a = m.core.attrs
                workload = dict(batch=np_, channels=cp, height=h, width=w,
                                pool_h=int(a.pool_size[0]), pool_w=int(a.pool_size[1]),
                                stride_h=int(a.strides[0]), stride_w=int(a.strides[1]),
                                pad_h=int(a.padding[0]), pad_w=int(a.padding[1]))
                if m.kind == "avg_pool2d":
                    workload["count_include_pad"] = bool(a.count_include_pad)
                desc = (f"{n}x{c}x{h}x{w} pool {workload['pool_h']}x{workload['pool_w']} "
                        f"s{workload['stride_h']} p{workload['pad_h']}")

            def inputs():
                args, kept_all = [], True
                for i, operand in enumerate(m.operands):
                    d, kept = self._activation(operand, n, c, np_, cp, co, f"data{i}" if i else "data")
                    args.append(d)
                    kept_all = kept_all and kept
                self._kept = kept_all
                return args

            pads = self._pads(("batch", n, np_), ("channels", c, cp))

        def unpack(out):
            out = self._emit(relax.op.permute_dims(out, [0, 4, 1, 5, 2, 3]), f"{UNPACK_PREFIX}_transpose")
            out = relax.op.reshape(out, (np_, out_p, oh, ow))
            if (np_, out_p) != (n, out_c):
                out = relax.op.strided_slice(self._emit(out, f"{UNPACK_PREFIX}_reshape"), axes=[0, 1],
                                             begin=[0, 0], end=[n, out_c])
            return out, (np_, out_p)

        packed_out = (np_ // b, out_p // co, oh, ow, b, co)
        return workload, inputs, packed_out, unpack, desc + pads

    @staticmethod
    def _pads(*dims) -> str:
        padded = [f"{what} {size}->{padded}" for what, size, padded in dims if padded != size]
        return ("; PADDED " + ", ".join(padded)) if padded else ""

    # ---------------------------------------------------------------- rewriting
    def rewrite(self, m: Match) -> Optional[relax.Expr]:
        """Replace ``m`` by packing + VTA call + unpacking, or return None (reason recorded)."""
        from .executor import TemplateUnavailable, compiled_op

        workload, inputs, packed_out, unpack, desc = self._plan(m)
        key = json.dumps({"op": m.kind, "config": self.config.name, "workload": workload,
                          "epilogue": [list(s) for s in m.epilogue]}, sort_keys=True)
        core_var = m.core_var
        try:
            compiled = compiled_op(key, config=self.config)  # the instruction stream, built now
        except TemplateUnavailable as err:
            self.rejected[core_var] = str(err)
            return None
        except (ValueError, RuntimeError) as err:  # the template refused this workload
            logger.warning("%s %s stays on the CPU: %s", m.kind, desc, err)
            self.rejected[core_var] = f"{m.kind} template refused the workload: {err}"
            return None
        self._kept = False
        args = inputs()
        out_packed = self._emit(relax.call_dps_packed(
            RUN_FUNC, args + [tvm.ir.StringImm(key)], relax.TensorType(packed_out, "int8")),
            f"vta_{m.kind}")
        out, packed_dims = unpack(out_packed)
        self._rewritten_binding = True
        self._last_packed = (out_packed,) + packed_dims if packed_dims else None
        detail = (f"{desc.split(';')[0]}, epilogue {'+'.join(s[0] for s in m.epilogue) or 'none'}, "
                  f"{compiled.program.insn_count} insns{_tiling_text(compiled)}")
        if self._kept:
            detail += "; input kept in the packed layout of the previous VTA operator"
        if "PADDED" in desc:
            detail += ";" + desc.split(";", 1)[1]
            logger.warning("%s %s: template pads%s", m.kind, desc.split(";")[0], desc.split("PADDED")[1])
        self.offloaded.append((_op_name(m.core), m.kind, detail))
        return out

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        name = _op_name(call)
        match, reason = None, None
        if name == "relax.astype" and str(call.attrs.dtype) == "int8":
            match, reason = self.match_tail(call)
        elif name == "relax.nn.max_pool2d" and _dtype(call.args[0]) == "int8":
            reason = self._pool_reason(call)
            if reason is None:
                match = Match("max_pool2d", call, [call.args[0]], self._current_binding)
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
        if _op_name(call) == "relax.nn.max_pool2d":
            return self._current_binding
        expr = call.args[0] if call.args else None
        for _ in range(5):
            producer = self._producer(expr)
            if producer is None:
                return None
            if _op_name(producer) in ("relax.nn.conv2d", "relax.matmul", "relax.nn.avg_pool2d"):
                return expr.name
            expr = producer.args[0]
        return None

    def visit_var_binding_(self, binding) -> None:
        value = binding.value
        self._current_binding = binding.var.name
        if _op_name(value) == "relax.nn.conv2d":
            _, reason = self._conv_kind(value)
            if reason:
                self.rejected[binding.var.name] = reason
        self._rewritten_binding = False
        super().visit_var_binding_(binding)
        if self._rewritten_binding:
            self.unpack_vars.add(binding.var.name)
            if self._last_packed is not None:
                self._packed[binding.var.name] = (binding.var,) + self._last_packed


def _tiling_text(compiled) -> str:
    """", tiling tile_h=7 oc_nthread=2" for a compiled GEMM operator (knobs that are not 1)."""
    knobs = getattr(compiled, "knobs", None)
    if knobs is None or not hasattr(knobs, "__dataclass_fields__"):
        return ""
    chosen = [f"{name}={getattr(knobs, name)}" for name in knobs.__dataclass_fields__
              if getattr(knobs, name) not in (1, False)]
    return ", tiling " + (" ".join(chosen) if chosen else "all inner tiles 1")


_CANDIDATES = {"relax.nn.conv2d": "not followed by the int8 requantisation tail (astype int8)",
               "relax.matmul": "not int8 x permute_dims(int8) followed by the int8 requantisation tail",
               "relax.nn.avg_pool2d": "not astype(int8->int32) followed by the int8 requantisation tail",
               "relax.nn.max_pool2d": "input is not int8"}


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


def OffloadToVTA(config: VTAConfig) -> tvm.transform.Pass:  # noqa: N802 (TVM pass naming)
    """The offload pass for ``config``; publishes a :class:`BuildReport` when it runs."""

    @tvm.transform.module_pass(opt_level=0, name="VTAOffload")
    def offload(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        rewriter = _Offloader(mod, config)
        for gvar, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
        new_mod = relax.transform.DeadCodeElimination()(rewriter.builder_.get())
        report = BuildReport(config.name)
        for op, kind, detail in rewriter.offloaded:
            report.add(op, VTA, f"{kind} (stock template)", detail)
        for func in new_mod.functions.values():
            if not isinstance(func, relax.Function):
                continue
            for op, var in _cpu_ops(func):
                if op == "relax.call_dps_packed":
                    continue
                if var.startswith((PACK_PREFIX, UNPACK_PREFIX)) or var in rewriter.unpack_vars:
                    report.add(op, CPU, LAYOUT_REASON, var)
                elif var in rewriter.rejected:
                    report.add(op, CPU, rewriter.rejected[var], var)
                elif op in _CANDIDATES:
                    report.add(op, CPU, _CANDIDATES[op], var)
                else:
                    report.add(op, CPU, "no VTA template for this operator", var)
        publish(report)
        return new_mod

    return offload
