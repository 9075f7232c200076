"""Relax pass that offloads the canonical quantised conv2d pattern to VTA.

Matched pattern (NCHW data, OIHW weights, int8 in, int32 accumulation)::

    R.nn.conv2d(data, weight, out_dtype="int32")
      -> optional R.add(., bias int32 (1, O, 1, 1))
      -> optional R.right_shift(., constant)
      -> optional R.clip(., lo, hi)
      -> R.astype(., "int8")

The chain becomes: packing (pad channels to the GEMM blocks, reshape, transpose) on the CPU, one
``call_dps_packed("vta_ext.run", ...)`` that executes the prebuilt VTA program, and unpacking.
Instruction streams are built here, at build time (:mod:`vta_ext.executor`). Every other operator
stays on the CPU; the :class:`~vta_ext.report.BuildReport` says which and why.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

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


def _op_name(call) -> Optional[str]:
    return call.op.name if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) else None


def _shape(expr) -> Tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


@dataclass
class ConvMatch:
    """A matched conv2d chain and its requantisation epilogue, in program order."""

    conv_var: relax.Var
    data: relax.Expr
    weight: relax.Expr
    attrs: object
    bias: Optional[relax.Expr] = None
    epilogue: List[tuple] = field(default_factory=list)


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@mutator
class _ConvOffloader(PyExprMutator):
    """Rewrites matched chains; remembers why unmatched conv2d calls stay on the CPU."""

    def __init__(self, mod: tvm.IRModule, config: VTAConfig) -> None:
        super().__init__(mod)
        self.config = config
        self.rejected: Dict[str, str] = {}  # conv2d var name -> reason
        self.offloaded: List[Tuple[str, str]] = []  # (op description, detail)
        self.keys: List[str] = []
        self.unpack_vars: set = set()  # variables now bound to the last unpacking step
        self._rewritten_binding = False
        # unpacked result variable name -> (variable, its packed tensor, padded batch, padded channels)
        self._packed: Dict[str, tuple] = {}
        self._last_packed = None

    # ---------------------------------------------------------------- matching
    def _producer(self, expr):
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            if bound is not None:
                return bound
        return None

    def conv_reject_reason(self, call: relax.Call) -> Optional[str]:
        a = call.attrs
        data, weight = call.args
        if (_dtype(data), _dtype(weight)) != ("int8", "int8"):
            return f"data/weight are {_dtype(data)}/{_dtype(weight)}, VTA needs int8/int8"
        if str(a.out_dtype) != "int32":
            return f"out_dtype {a.out_dtype}, VTA accumulates in int32"
        if (a.data_layout, a.kernel_layout) != ("NCHW", "OIHW"):
            return f"layout {a.data_layout}/{a.kernel_layout}; the stock template needs NCHW/OIHW"
        if int(a.groups) != 1:
            return f"groups={int(a.groups)}: grouped/depthwise conv2d has no VTA template yet"
        if any(int(d) != 1 for d in a.dilation):
            return f"dilation {tuple(int(d) for d in a.dilation)} is not supported by conv2d_packed"
        top, left, bottom, right = (int(p) for p in a.padding)
        if (top, left) != (bottom, right):
            return f"asymmetric padding {(top, left, bottom, right)} is not supported"
        if max(top, left) > 15:
            return f"padding {max(top, left)} exceeds the 4-bit DMA pad field (15)"
        return None

    def match(self, astype_call: relax.Call) -> Tuple[Optional[ConvMatch], Optional[str]]:
        """Match the chain ending at ``astype_call``; returns (match, None) or (None, reason)."""
        tail: List[tuple] = []
        expr = astype_call.args[0]
        bias = None
        call = self._producer(expr)
        if _op_name(call) == "relax.clip":
            lo, hi = int(call.args[1].value), int(call.args[2].value)
            if not (-(1 << 15) <= lo <= hi < (1 << 15)):
                return None, f"clip bounds [{lo}, {hi}] do not fit the 16-bit ALU immediate"
            tail.append(("clip", lo, hi))
            expr = call.args[0]
            call = self._producer(expr)
        if _op_name(call) == "relax.right_shift":
            amount = call.args[1]
            if not isinstance(amount, tvm.ir.expr.Constant):
                return None, "right_shift by a non-constant amount"
            values = np.unique(amount.value.numpy())
            if values.size != 1 or not 0 <= int(values[0]) <= 31:
                return None, f"right_shift amount {values.tolist()} is not one constant in 0..31"
            tail.append(("shr", int(values[0])))
            expr = call.args[0]
            call = self._producer(expr)
        if _op_name(call) == "relax.add":
            lhs, rhs = call.args
            conv_side, bias_side = (lhs, rhs) if _op_name(self._producer(lhs)) == "relax.nn.conv2d" \
                else (rhs, lhs)
            conv_call = self._producer(conv_side)
            if _op_name(conv_call) != "relax.nn.conv2d":
                return None, None
            out_channels = _shape(conv_call.args[1])[0]
            if _dtype(bias_side) != "int32" or _shape(bias_side) != (1, out_channels, 1, 1):
                return None, (f"bias of shape {_shape(bias_side)} {_dtype(bias_side)}; "
                              f"expected int32 (1, {out_channels}, 1, 1)")
            bias = bias_side
            tail.append(("bias",))
            expr = conv_side
            call = conv_call
        if _op_name(call) != "relax.nn.conv2d":
            return None, None
        reason = self.conv_reject_reason(call)
        if reason:
            return None, reason
        return ConvMatch(expr, call.args[0], call.args[1], call.attrs, bias, tail[::-1]), None

    # ---------------------------------------------------------------- rewriting
    def _emit(self, expr, name: str):
        return self.builder_.emit(expr, name_hint=name)

    def rewrite(self, m: ConvMatch) -> relax.Expr:
        cfg = self.config
        b, ci, co = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
        n, c, h, w = _shape(m.data)
        o, _, kh, kw = _shape(m.weight)
        np_, cp, op = _ceil_to(n, b), _ceil_to(c, ci), _ceil_to(o, co)
        a = m.attrs
        pad_h, pad_w = int(a.padding[0]), int(a.padding[1])
        stride_h, stride_w = int(a.strides[0]), int(a.strides[1])
        oh = (h + 2 * pad_h - kh) // stride_h + 1
        ow = (w + 2 * pad_w - kw) // stride_w + 1

        pack = lambda expr, name: self._emit(expr, f"{PACK_PREFIX}_{name}")
        producer = self._packed.get(m.data.name) if isinstance(m.data, relax.Var) else None
        kept_packed = (producer is not None and producer[0].same_as(m.data)
                       and (producer[2], producer[3]) == (np_, cp))
        if kept_packed:
            # the producer is a VTA operator: reuse its packed output. Its padded channels come from
            # zero weights and bias; they meet zero-padded weights here, so they contribute nothing.
            data = producer[1]
        else:
            data = self.visit_expr(m.data)
            if (np_, cp) != (n, c):
                data = pack(relax.op.nn.pad(data, [0, np_ - n, 0, cp - c, 0, 0, 0, 0]), "pad_data")
            data = pack(relax.op.reshape(data, (np_ // b, b, cp // ci, ci, h, w)), "reshape_data")
            data = pack(relax.op.permute_dims(data, [0, 2, 4, 5, 1, 3]), "data")
        weight = self.visit_expr(m.weight)
        if (op, cp) != (o, c):
            weight = pack(relax.op.nn.pad(weight, [0, op - o, 0, cp - c, 0, 0, 0, 0]), "pad_weight")
        weight = pack(relax.op.reshape(weight, (op // co, co, cp // ci, ci, kh, kw)), "reshape_weight")
        weight = pack(relax.op.permute_dims(weight, [0, 2, 4, 5, 1, 3]), "weight")
        args = [data, weight]
        if m.bias is not None:
            bias = pack(relax.op.reshape(self.visit_expr(m.bias), (o,)), "flat_bias")
            if op != o:
                bias = pack(relax.op.nn.pad(bias, [0, op - o]), "pad_bias")
            bias = pack(relax.op.reshape(bias, (1, op // co, 1, 1, 1, co)), "reshape_bias")
            args.append(pack(relax.op.broadcast_to(bias, (1, op // co, 1, 1, b, co)), "bias"))

        workload = dict(batch=np_, height=h, width=w, in_channels=cp, out_channels=op,
                        kernel_h=kh, kernel_w=kw, pad_h=pad_h, pad_w=pad_w, stride_h=stride_h,
                        stride_w=stride_w)
        key = json.dumps({"op": "conv2d", "config": cfg.name, "workload": workload,
                          "epilogue": [list(s) for s in m.epilogue]}, sort_keys=True)
        from .executor import compiled_op

        compiled = compiled_op(key, config=cfg)  # build the instruction stream now, at build time
        self.keys.append(key)
        out_packed = self._emit(relax.call_dps_packed(
            RUN_FUNC, args + [tvm.ir.StringImm(key)],
            relax.TensorType((np_ // b, op // co, oh, ow, b, co), "int8")), "vta_conv2d")
        out = self._emit(relax.op.permute_dims(out_packed, [0, 4, 1, 5, 2, 3]),
                         f"{UNPACK_PREFIX}_transpose")
        out = relax.op.reshape(out, (np_, op, oh, ow))
        if (np_, op) != (n, o):
            out = relax.op.strided_slice(self._emit(out, f"{UNPACK_PREFIX}_reshape"), axes=[0, 1],
                                         begin=[0, 0], end=[n, o])
        self._rewritten_binding = True
        self._last_packed = (out_packed, np_, op)
        padded = []
        if cp != c:
            padded.append(f"in channels {c}->{cp}")
        if op != o:
            padded.append(f"out channels {o}->{op}")
        if np_ != n:
            padded.append(f"batch {n}->{np_}")
        detail = (f"{n}x{c}x{h}x{w} * {o}x{c}x{kh}x{kw} s{stride_h} p{pad_h}, epilogue "
                  f"{'+'.join(s[0] for s in m.epilogue) or 'none'}, "
                  f"{compiled.program.insn_count} insns")
        if kept_packed:
            detail += "; input kept in the packed layout of the previous VTA operator"
        if padded:
            detail += "; PADDED " + ", ".join(padded)
            logger.warning("conv2d %s: stock template pads %s", detail.split(",")[0], ", ".join(padded))
        self.offloaded.append(("relax.nn.conv2d", detail))
        return out

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        name = _op_name(call)
        if name == "relax.astype" and str(call.attrs.dtype) == "int8":
            m, reason = self.match(call)
            if m is not None:
                return self.rewrite(m)
            if reason:
                conv = self._find_conv(call.args[0])
                if conv is not None:
                    self.rejected[conv] = reason
        return super().visit_call_(call)

    def _find_conv(self, expr) -> Optional[str]:
        for _ in range(4):
            call = self._producer(expr)
            if call is None:
                return None
            if _op_name(call) == "relax.nn.conv2d":
                return expr.name
            expr = call.args[0]
        return None

    def visit_var_binding_(self, binding) -> None:
        value = binding.value
        if _op_name(value) == "relax.nn.conv2d":
            reason = self.conv_reject_reason(value)
            if reason:
                self.rejected[binding.var.name] = reason
        self._rewritten_binding = False
        super().visit_var_binding_(binding)
        if self._rewritten_binding:
            self.unpack_vars.add(binding.var.name)
            self._packed[binding.var.name] = (binding.var,) + self._last_packed


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

    @tvm.transform.module_pass(opt_level=0, name="VTAOffloadConv2d")
    def offload(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        rewriter = _ConvOffloader(mod, config)
        for gvar, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
        new_mod = relax.transform.DeadCodeElimination()(rewriter.builder_.get())
        report = BuildReport(config.name)
        for op, detail in rewriter.offloaded:
            report.add(op, VTA, "conv2d_packed (stock template)", detail)
        for gvar, func in new_mod.functions.items():
            if not isinstance(func, relax.Function):
                continue
            for op, var in _cpu_ops(func):
                if op == "relax.call_dps_packed":
                    continue
                if var.startswith((PACK_PREFIX, UNPACK_PREFIX)) or var in rewriter.unpack_vars:
                    report.add(op, CPU, LAYOUT_REASON, var)
                elif op == "relax.nn.conv2d":
                    report.add(op, CPU, rewriter.rejected.get(
                        var, "not followed by the int8 requantisation tail (astype int8)"), var)
                else:
                    report.add(op, CPU, "no VTA template for this operator", var)
        publish(report)
        return new_mod

    return offload
