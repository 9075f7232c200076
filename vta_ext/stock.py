"""The ``stock`` strategy: the fixed operator templates of the original VTA stack.

One :class:`~vta_ext.strategy.OpTemplate` per operator kind. Each plans the blocked layouts of
:mod:`vta_ext.packing` (batch padded to ``BATCH``, channels to the GEMM blocks) and builds with the
template of :mod:`vta_ext.templates`. The registry entries at the bottom are the whole wiring.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Sequence

from tvm import relax

from .errors import TemplateRefusal
from .packing import (BlockedActivation, BlockedMatrix, FlatActivation, ceil_to,
                      pack_channel_bias, pack_conv_weight, pack_depthwise_weight, padding_text)
from .strategy import (GridPoints, KnobSpace, MatchedOp, OpPlan, OpTemplate, PrunedPoints,
                       register_template)

__all__ = ["StockConv2d", "StockGroupConv2d", "StockDepthwiseConv2d", "StockDense", "StockPool",
           "StockAdd", "StockHswish", "StockUnary"]


def _shape(expr) -> tuple:
    return tuple(int(d) for d in expr.ty.shape)


def _pair(values) -> tuple:
    return tuple(int(v) for v in values)


def _symmetric_padding(op: MatchedOp) -> tuple:
    """``(pad_h, pad_w)`` of a conv/pool with symmetric padding, else a refusal."""
    top, left, bottom, right = _pair(op.core.attrs.padding)
    if (top, left) != (bottom, right):
        raise TemplateRefusal(f"asymmetric padding {(top, left, bottom, right)} is not supported "
                              "by the stock templates")
    return top, left


class _Stock(OpTemplate):
    """Shared part: ``build`` calls the template module's ``build_<op>``."""

    strategy = "stock"
    report_text = "stock template"
    module = ""
    builder = ""

    def build(self, config, workload, epilogue: Sequence[tuple], knobs) -> Any:
        import importlib

        module = importlib.import_module(f"vta_ext.templates.{self.module}")
        return getattr(module, self.builder)(config, workload, tuple(epilogue), knobs)


def _gemm_knob_space(config, workload, epilogue: Sequence[tuple]) -> KnobSpace:
    """The knob space of a GEMM template (conv2d, group conv2d, dense), from the templates' model
    of the whole domain (:func:`vta_ext.templates.tiling.tiling_grid`): its valid and pruned
    points without reuse-aware double buffering, then the two-thread points with it (the points
    the reuse space adds), its TPS and fallback points."""
    import numpy as np

    from .templates import tiling

    points, pruned = [], []   # (grid, flat indices): the dicts and reasons are built when read
    for reuse in (False, True):
        grid = tiling.tiling_grid(config, workload, epilogue, reuse=reuse)
        # with reuse, the points without it are those of the space without reuse
        flat = np.flatnonzero(grid.reused) if reuse else np.arange(len(grid))
        valid = grid.reason[flat] < 0
        points.append((grid, flat[valid]))
        pruned.append((grid, flat[~valid]))
    tps = dataclasses.asdict(tiling.tps_knobs(config, workload, epilogue).knobs)
    fallback = dataclasses.asdict(tiling.fallback_knobs(config, workload, epilogue).knobs)
    return KnobSpace(tuple(tps), GridPoints(points), PrunedPoints(pruned), tps, fallback)


class StockConv2d(_Stock):
    """``conv2d_packed``: data ``(N/b, C/ci, H, W, b, ci)``, kernel ``(O/co, C/ci, KH, KW, co, ci)``."""

    kind, module, builder = "conv2d", "conv2d", "build_conv2d"

    @property
    def workload_type(self):
        from .templates.conv2d import Conv2dWorkload
        return Conv2dWorkload

    def _groups(self, op: MatchedOp) -> int:
        return 1

    def knob_space(self, config, workload, epilogue: Sequence[tuple]) -> KnobSpace:
        """The ``conv2d_packed`` / ``group_conv2d_packed`` knobs
        (:class:`~vta_ext.templates.knobs.Conv2dKnobs`)."""
        return _gemm_knob_space(config, workload, epilogue)

    def plan(self, op: MatchedOp, config) -> OpPlan:
        data, weight = op.operands
        a = op.core.attrs
        if any(int(d) != 1 for d in a.dilation):
            raise TemplateRefusal(f"dilation {_pair(a.dilation)} is not supported by the stock "
                                  "conv2d templates")
        pad_h, pad_w = _symmetric_padding(op)
        groups = self._groups(op)
        b, ci, co = config.BATCH, config.BLOCK_IN, config.BLOCK_OUT
        n, c, h, w = _shape(data)
        o, _, kh, kw = _shape(weight)
        act = BlockedActivation(n, c, h, w, b, ci)  # a group conv's channels are whole blocks
        np_, cp = act.padded
        op_ = ceil_to(o, co)
        _, _, oh, ow = _shape(op.core)
        workload = dict(batch=np_, height=h, width=w, in_channels=cp, out_channels=op_,
                        kernel_h=kh, kernel_w=kw, pad_h=pad_h, pad_w=pad_w,
                        stride_h=int(a.strides[0]), stride_w=int(a.strides[1]))
        if groups > 1:
            workload["groups"] = groups
        out = BlockedActivation(n, o, oh, ow, b, co)

        def inputs(packer):
            d, kept = act.pack(packer, data)
            packer.note_kept(kept)
            args = [d, pack_conv_weight(packer, weight, _shape(weight), op_, cp // groups, co, ci)]
            if op.bias is not None:
                args.append(pack_channel_bias(packer, op.bias, o, op_, b, co))
            if op.multiplier is not None:
                args.append(pack_channel_bias(packer, op.multiplier, o, op_, b, co))
            return args

        desc = (f"{n}x{c}x{h}x{w} * {o}x{c // groups}x{kh}x{kw}"
                f"{f' g{groups}' if groups > 1 else ''} s{workload['stride_h']} p{pad_h}")
        pads = padding_text(("batch", n, np_), ("in channels", c, cp), ("out channels", o, op_))
        return OpPlan(self.workload_from_dict(workload), inputs, out, desc, pads, in_layout=act)


class StockGroupConv2d(StockConv2d):
    """``group_conv2d_packed``: as conv2d, kernel ``(O/co, (C/groups)/ci, KH, KW, co, ci)``."""

    kind, module, builder = "group_conv2d", "group_conv2d", "build_group_conv2d"

    @property
    def workload_type(self):
        from .templates.group_conv2d import GroupConv2dWorkload
        return GroupConv2dWorkload

    def _groups(self, op: MatchedOp) -> int:
        return int(op.core.attrs.groups)

    def plan(self, op: MatchedOp, config) -> OpPlan:
        groups = self._groups(op)
        channels, out_channels = _shape(op.operands[0])[1], _shape(op.operands[1])[0]
        if (channels // groups) % config.BLOCK_IN or (out_channels // groups) % config.BLOCK_OUT:
            raise TemplateRefusal(
                f"groups={groups}: {channels // groups} input / {out_channels // groups} output "
                f"channels per group are not multiples of the {config.BLOCK_IN}x{config.BLOCK_OUT} "
                "GEMM block (the stock group_conv2d template cannot pad inside a group)")
        return super().plan(op, config)


class StockDepthwiseConv2d(_Stock):
    """Depthwise conv2d on the ALU: data ``(N/b, C/co, H, W, b, co)``, kernel ``(C/co, KH, KW, b, co)``."""

    kind, module, builder = "depthwise_conv2d", "depthwise", "build_depthwise_conv2d"

    @property
    def workload_type(self):
        from .templates.depthwise import DepthwiseConv2dWorkload
        return DepthwiseConv2dWorkload

    def plan(self, op: MatchedOp, config) -> OpPlan:
        data, weight = op.operands
        a = op.core.attrs
        if any(int(d) != 1 for d in a.dilation):
            raise TemplateRefusal(f"dilation {_pair(a.dilation)} is not supported by the stock "
                                  "depthwise template")
        pad_h, pad_w = _symmetric_padding(op)
        b, co = config.BATCH, config.BLOCK_OUT
        n, c, h, w = _shape(data)
        _, _, kh, kw = _shape(weight)
        _, _, oh, ow = _shape(op.core)
        act = BlockedActivation(n, c, h, w, b, co)
        np_, cp = act.padded
        workload = dict(batch=np_, channels=cp, height=h, width=w, kernel_h=kh, kernel_w=kw,
                        pad_h=pad_h, pad_w=pad_w, stride_h=int(a.strides[0]),
                        stride_w=int(a.strides[1]))

        def inputs(packer):
            d, kept = act.pack(packer, data)
            packer.note_kept(kept)
            args = [d, pack_depthwise_weight(packer, weight, c, cp, kh, kw, b, co)]
            if op.bias is not None:
                args.append(pack_channel_bias(packer, op.bias, c, cp, b, co))
            if op.multiplier is not None:
                args.append(pack_channel_bias(packer, op.multiplier, c, cp, b, co))
            return args

        desc = f"{n}x{c}x{h}x{w} depthwise {kh}x{kw} s{workload['stride_h']} p{pad_h}"
        return OpPlan(self.workload_from_dict(workload), inputs,
                      BlockedActivation(n, c, oh, ow, b, co), desc, padding_text(*act.padding()))


class StockDense(_Stock):
    """``dense_packed``: data ``(N/b, K/ci, b, ci)``, weight ``(M/co, K/ci, co, ci)``."""

    kind, module, builder = "dense", "dense", "build_dense"

    @property
    def workload_type(self):
        from .templates.dense import DenseWorkload
        return DenseWorkload

    def plan(self, op: MatchedOp, config) -> OpPlan:
        x, weight = op.operands
        b, ci, co = config.BATCH, config.BLOCK_IN, config.BLOCK_OUT
        (n, k), (m, _) = _shape(x), _shape(weight)
        data, wgt = BlockedMatrix(n, k, b, ci), BlockedMatrix(m, k, co, ci)
        (np_, kp), mp = data.padded, wgt.padded[0]
        workload = dict(batch=np_, in_features=kp, out_features=mp)

        def inputs(packer):
            args = [data.pack(packer, x, "data"), wgt.pack(packer, weight, "weight")]
            if op.bias is not None:
                args.append(pack_channel_bias(packer, op.bias, m, mp, b, co, spatial=False))
            if op.multiplier is not None:
                args.append(pack_channel_bias(packer, op.multiplier, m, mp, b, co,
                                              spatial=False))
            return args

        pads = padding_text(("batch", n, np_), ("in features", k, kp), ("out features", m, mp))
        return OpPlan(self.workload_from_dict(workload), inputs, BlockedMatrix(n, m, b, co),
                      f"{n}x{k} * {m}x{k}", pads, in_layout=data)

    def knob_space(self, config, workload, epilogue: Sequence[tuple]) -> KnobSpace:
        """The ``dense_packed`` knobs (:class:`~vta_ext.templates.knobs.DenseKnobs`)."""
        return _gemm_knob_space(config, workload, epilogue)


class StockPool(_Stock):
    """Max / average pooling on the ALU: data and output ``(N/b, C/co, H, W, b, co)``."""

    module = "pool"

    def __init__(self, kind: str = "max_pool2d") -> None:
        self.kind = kind
        self.builder = f"build_{kind}"

    @property
    def workload_type(self):
        from .templates.pool import PoolWorkload
        return PoolWorkload

    def refusal(self, op: MatchedOp, config) -> Optional[str]:
        """Why :meth:`plan` refuses ``op`` (a stock plan builds nothing), or, for an average pool,
        that its divisors have no exact multiply-shift reciprocal
        (:func:`~vta_ext.templates.pool.division_plan`); None if neither."""
        from .templates.pool import division_plan

        try:
            workload = self.plan(op, config).workload
            if self.kind == "avg_pool2d":
                division_plan(workload)
        except TemplateRefusal as err:
            return str(err)
        return None

    def plan(self, op: MatchedOp, config) -> OpPlan:
        a = op.core.attrs
        if str(a.layout) != "NCHW":
            raise TemplateRefusal(f"pool layout {a.layout}; the stock templates need NCHW")
        if any(int(d) != 1 for d in a.dilation):
            raise TemplateRefusal("dilated pooling is not supported by the stock templates")
        pad_h, pad_w = _symmetric_padding(op)
        (data,) = op.operands
        n, c, h, w = _shape(data)
        _, _, oh, ow = _shape(op.core)
        b, co = config.BATCH, config.BLOCK_OUT
        ph, pw, sh, sw = (int(v) for v in (*a.pool_size, *a.strides))
        # ceil mode: the windows past the bottom / right edge see the input padded there; for a
        # max pool that padding is -128 (never above a real int8 value; every window holds one),
        # added on the host to the packed input
        extra_h = max(0, (oh - 1) * sh + ph - 2 * pad_h - h)
        extra_w = max(0, (ow - 1) * sw + pw - 2 * pad_w - w)
        if bool(a.ceil_mode) and (extra_h or extra_w) and self.kind != "max_pool2d":
            raise TemplateRefusal("ceil_mode average pooling that changes the output size is not "
                                  "supported by the stock templates (the border divisors differ)")
        act = BlockedActivation(n, c, h, w, b, co)
        np_, cp = act.padded
        workload = dict(batch=np_, channels=cp, height=h + extra_h, width=w + extra_w,
                        pool_h=ph, pool_w=pw, stride_h=sh, stride_w=sw, pad_h=pad_h, pad_w=pad_w)
        if self.kind == "avg_pool2d":
            workload["count_include_pad"] = bool(a.count_include_pad)

        def inputs(packer):
            d, kept = act.pack(packer, data)
            packer.note_kept(kept)
            if extra_h or extra_w:
                d = packer.emit(relax.op.nn.pad(d, [0, 0, 0, 0, 0, extra_h, 0, extra_w, 0, 0, 0, 0],
                                                pad_value=-128), "ceil_pad")
            return [d]

        desc = (f"{n}x{c}x{h}x{w} pool {workload['pool_h']}x{workload['pool_w']} "
                f"s{workload['stride_h']} p{pad_h}")
        if extra_h or extra_w:
            desc += f" ceil mode (input padded by {extra_h}x{extra_w} of -128 on the host)"
        return OpPlan(self.workload_from_dict(workload), inputs,
                      BlockedActivation(n, c, oh, ow, b, co), desc, padding_text(*act.padding()))


class StockAdd(_Stock):
    """Residual add on the ALU: two int8 tensors ``(N/b, C/co, H, W, b, co)``."""

    kind, module, builder = "add", "eltwise", "build_add"

    @property
    def workload_type(self):
        from .templates.eltwise import EltwiseWorkload
        return EltwiseWorkload

    def plan(self, op: MatchedOp, config) -> OpPlan:
        n, c, h, w = _shape(op.operands[0])
        act = BlockedActivation(n, c, h, w, config.BATCH, config.BLOCK_OUT)
        np_, cp = act.padded
        workload: Dict[str, int] = dict(batch=np_, channels=cp, height=h, width=w)

        def inputs(packer):
            packed = [act.pack(packer, x, f"data{i}" if i else "data")
                      for i, x in enumerate(op.operands)]
            packer.note_kept(all(kept for _, kept in packed))
            return [d for d, _ in packed]

        return OpPlan(self.workload_from_dict(workload), inputs, act, f"{n}x{c}x{h}x{w} + {n}x{c}x{h}x{w}",
                      padding_text(*act.padding()))


class StockHswish(_Stock):
    """Hardswish on the ALU, ``x * clip(x + offset, lo, hi)``: one int8 tensor
    ``(N/b, C/co, H, W, b, co)``."""

    kind, module, builder = "hswish", "eltwise", "build_hswish"

    @property
    def workload_type(self):
        from .templates.eltwise import HswishWorkload
        return HswishWorkload

    def plan(self, op: MatchedOp, config) -> OpPlan:
        act, (n, c, h, w), inputs = _alu_operand(op, config, "hardswish")
        np_, cp = act.padded
        workload = dict(batch=np_, channels=cp, height=h, width=w, offset=op.params["offset"],
                        lo=op.params["lo"], hi=op.params["hi"])
        return OpPlan(self.workload_from_dict(workload), inputs, act,
                      f"{n}x{c}x{h}x{w} x*clip(x{op.params['offset']:+d}, {op.params['lo']}, "
                      f"{op.params['hi']})", padding_text(*act.padding()), in_layout=act)


class StockUnary(_Stock):
    """An epilogue-only operator on the ALU (the int8 clip of a ReLU6 whose producer is not on
    VTA): one int8 tensor ``(N/b, C/co, H, W, b, co)``."""

    kind, module, builder = "clip", "eltwise", "build_unary"

    @property
    def workload_type(self):
        from .templates.eltwise import EltwiseWorkload
        return EltwiseWorkload

    def plan(self, op: MatchedOp, config) -> OpPlan:
        act, (n, c, h, w), inputs = _alu_operand(op, config, "int8 clip")
        np_, cp = act.padded
        return OpPlan(self.workload_from_dict(dict(batch=np_, channels=cp, height=h, width=w)),
                      inputs, act, f"{n}x{c}x{h}x{w}", padding_text(*act.padding()),
                      in_layout=act)


def _alu_operand(op: MatchedOp, config, what: str):
    """``(layout, (n, c, h, w), inputs)`` of the one int8 operand of an elementwise ALU template:
    an NCHW activation, or an ``(N, C)`` one seen as ``(N, C, 1, 1)`` (:class:`FlatActivation`)."""
    shape = _shape(op.operands[0])
    b, co = config.BATCH, config.BLOCK_OUT
    if len(shape) == 4:
        act, dims = BlockedActivation(*shape, b, co), shape
    elif len(shape) == 2:
        act, dims = FlatActivation(*shape, b, co), (*shape, 1, 1)
    else:
        raise TemplateRefusal(f"{what} of a rank-{len(shape)} tensor; the stock template takes "
                              "NCHW activations or (N, C) matrices")

    def inputs(packer):
        d, kept = act.pack(packer, op.operands[0])
        packer.note_kept(kept)
        return [d]

    return act, dims, inputs


for _template in (StockConv2d(), StockGroupConv2d(), StockDepthwiseConv2d(), StockDense(),
                  StockPool("max_pool2d"), StockPool("avg_pool2d"), StockAdd(), StockHswish(),
                  StockUnary()):
    register_template(_template.kind, "stock", _template)
