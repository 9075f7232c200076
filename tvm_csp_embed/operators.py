"""Operators without a stock template, through the CSP generator: batched matmul, conv1d and
dilated conv2d.

The stock VTA templates cover conv2d, dense and a few element-wise programs. The operator kinds
here (matched by :mod:`vta_ext.offload`) have no stock template at all; under ``csp-strict`` /
``csp-relaxed`` they take the same path as conv2d and dense (:class:`~tvm_csp_embed.strategy.
CspGemmTemplate`: solve, one packed-GEMM generator, choice by the cycle model), and this module
only says what their workload is:

* ``batch_matmul``: ``R.matmul(int8 [B,N,K], int8 [B,K,M])`` or with
  ``R.permute_dims(int8 [B,M,K], [0, 2, 1])`` as B (``A @ B^T``, e.g. attention's ``Q @ K^T``);
  the transposed B is relayouted from its own ``[B,M,K]`` layout (a ``permute`` source step);
* ``conv1d``: ``R.nn.conv1d`` NCW/OIW, groups 1, any stride, padding and dilation;
* ``dilated_conv2d``: ``R.nn.conv2d`` NCHW/OIHW, groups 1, dilation > 1.

**Where the workload comes from.** Each workload is the operator's own legalized PrimFunc
(:func:`legalized_workload`: a one-op Relax module legalized by ``relax.transform.LegalizeOps``,
read by :func:`~tvm_csp_embed.workload.from_primfunc`), so that these kinds need no hand-written
loop nest. The legalized convolutions are not conformable as they come: TOPI writes a separate
``pad_temp`` block before the compute block. That stage is stripped: the one-op module is
legalized with padding 0 on the already padded input shape, where ``pad_temp`` is an identity copy,
and ``compute_inline`` folds it into the compute block (one block, affine subscripts such as
``data[n, c, oh + d*r, ...]``). The operator's zero padding then enters
:func:`~tvm_csp_embed.codegen.plan.packed_gemm` as the input ``pads``, exactly as for the conv2d
workloads (the input DMA or the host produces it). The loop dims and tensors of the PrimFunc are
only renamed (``data``, ``weight``, ``out``; conv dims ``n k oh ow c r s`` as in
:func:`~tvm_csp_embed.workload.conv2d`) so that reports and knob names read like those of the
other operators.

The free dims keep the operator's own layout (no NHWC variant): ``build_options(layout=...)``
does not apply to these kinds.

**Tuning.** The tasks of these kinds (``tvm_csp_embed.tune.extract_tasks``) tune like conv2d's;
their numpy reference, against which the tuner verifies its best point, is
:func:`tvm_csp_embed.csp_reference.new_op_reference` (registered for both CSP strategies).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Sequence, Tuple

from vta_ext.errors import TemplateRefusal

from .reference import conv_reference  # noqa: F401  (the definition the tests and references use)
from .workload import Workload, from_primfunc

__all__ = ["OPERATOR_KINDS", "LAYOUTS", "operator_params", "operator_workload",
           "legalized_workload", "mapping_extents", "operator_text", "conv_reference"]

#: the operator kinds of this module (the offload pass's ``MatchedOp.kind``)
OPERATOR_KINDS = ("batch_matmul", "conv1d", "dilated_conv2d")
#: the layout tag of each kind: its own layout (the free dims are not permuted)
LAYOUTS = {"batch_matmul": "BNM", "conv1d": "NCW", "dilated_conv2d": "NCHW"}
#: names given to the legalized PrimFunc's loop dims, in loop order
DIMS = {"batch_matmul": ("b", "rows", "cols", "inner"),
        "conv1d": ("n", "k", "ow", "c", "s"),
        "dilated_conv2d": ("n", "k", "oh", "ow", "c", "r", "s")}

Params = Tuple[Tuple[str, int], ...]


def _shape(expr) -> Tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


def operator_params(kind: str, op) -> Params:
    """The :class:`~tvm_csp_embed.strategy.CspWorkload` parameters of a matched operator.

    Parameters
    ----------
    kind : str
        One of :data:`OPERATOR_KINDS`.
    op : vta_ext.strategy.MatchedOp
        The matched operator (operands in the operator's own layout).

    Returns
    -------
    tuple of (str, int)
        ``batch_matmul``: ``b n k m t`` (``t`` 1 when B is given as ``[B,M,K]``);
        ``conv1d``: ``n c w k kw pl pr sw dw``; ``dilated_conv2d``: ``n c h w k kh kw pt pl pb pr
        sh sw dh dw``.

    Raises
    ------
    TemplateRefusal
        For a kind this module does not know.
    """
    if kind == "batch_matmul":
        b, n, k = _shape(op.operands[0])
        m = _shape(op.core)[2]
        return (("b", b), ("n", n), ("k", k), ("m", m), ("t", int(bool(op.params.get("transpose_b")))))
    a = op.core.attrs
    if kind == "conv1d":
        n, c, w = _shape(op.operands[0])
        k, _, kw = _shape(op.operands[1])
        pl, pr = (int(v) for v in a.padding)
        return (("n", n), ("c", c), ("w", w), ("k", k), ("kw", kw), ("pl", pl), ("pr", pr),
                ("sw", int(a.strides[0])), ("dw", int(a.dilation[0])))
    if kind == "dilated_conv2d":
        n, c, h, w = _shape(op.operands[0])
        k, _, kh, kw = _shape(op.operands[1])
        pt, pl, pb, pr = (int(v) for v in a.padding)
        return (("n", n), ("c", c), ("h", h), ("w", w), ("k", k), ("kh", kh), ("kw", kw),
                ("pt", pt), ("pl", pl), ("pb", pb), ("pr", pr), ("sh", int(a.strides[0])),
                ("sw", int(a.strides[1])), ("dh", int(a.dilation[0])), ("dw", int(a.dilation[1])))
    raise TemplateRefusal(f"no CSP operator workload for {kind!r}; known: {', '.join(OPERATOR_KINDS)}")


def _one_op_module(kind: str, p: Dict[str, int]):
    """The one-op Relax module of ``kind`` whose legalization is the workload: no padding, on the
    padded input (the caller passes the operator's padding as input pads)."""
    from tvm import relax

    if kind == "batch_matmul":
        shapes = ((p["b"], p["n"], p["k"]), (p["b"], p["k"], p["m"]))

        def make(x, w):
            return relax.op.matmul(x, w, out_dtype="int32")
    elif kind == "conv1d":
        shapes = ((p["n"], p["c"], p["w"] + p["pl"] + p["pr"]), (p["k"], p["c"], p["kw"]))

        def make(x, w):
            return relax.op.nn.conv1d(x, w, strides=p["sw"], padding=0, dilation=p["dw"],
                                      out_dtype="int32")
    elif kind == "dilated_conv2d":
        shapes = ((p["n"], p["c"], p["h"] + p["pt"] + p["pb"], p["w"] + p["pl"] + p["pr"]),
                  (p["k"], p["c"], p["kh"], p["kw"]))

        def make(x, w):
            return relax.op.nn.conv2d(x, w, strides=(p["sh"], p["sw"]), padding=0,
                                      dilation=(p["dh"], p["dw"]), out_dtype="int32")
    else:
        raise ValueError(f"no one-op module for {kind!r}; known: {', '.join(OPERATOR_KINDS)}")
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(s, "int8")) for name, s in zip(("data", "weight"), shapes)]
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(make(*args)))
        bb.emit_func_output(out)
    return bb.get()


@functools.lru_cache(maxsize=128)
def legalized_workload(kind: str, params: Params, name: str) -> Workload:
    """The workload of ``kind`` from its own legalized PrimFunc (see the module docstring).

    The one-op module (:func:`_one_op_module`) is legalized by ``relax.transform.LegalizeOps``;
    an identity ``pad_temp`` block (a convolution legalized with padding 0) is inlined into the
    compute block, and :func:`~tvm_csp_embed.workload.from_primfunc` reads the one block left.
    Loop dims are renamed by position (:data:`DIMS`), tensors to ``data``, ``weight``, ``out``.

    Raises
    ------
    tvm_csp_embed.workload.ConformabilityError
        If the legalized PrimFunc is not one conformable compute block.
    """
    import tvm
    from tvm import relax

    mod = relax.transform.LegalizeOps()(_one_op_module(kind, dict(params)))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    sch = tvm.s_tir.Schedule(func)
    try:
        pad = sch.get_sblock("pad_temp")
    except tvm.s_tir.schedule.ScheduleError:
        pad = None  # no pad stage (the matmul)
    if pad is not None:
        sch.compute_inline(pad)
    wl = from_primfunc(sch.mod["main"], name=name)
    dims = DIMS[kind]
    if len(dims) != len(wl.dims):
        raise ValueError(f"{kind}: the legalized PrimFunc has loop dims {wl.dims}, expected "
                         f"{len(dims)} ({', '.join(dims)})")
    names = ("data", "weight", "out")
    data, weight, out = (dataclasses.replace(t, name=nm) for t, nm in zip(wl.tensors, names))
    return dataclasses.replace(wl, dims=dims, inputs=(data, weight), output=out, layout=LAYOUTS[kind])


def operator_workload(cw) -> Tuple[Workload, Dict[str, tuple], Dict[str, Any], Dict[str, tuple]]:
    """``(workload, operator shapes, source steps, input pads)`` of ``cw`` (a
    :class:`~tvm_csp_embed.strategy.CspWorkload` of a kind in :data:`OPERATOR_KINDS`): the
    arguments of :func:`~tvm_csp_embed.codegen.plan.packed_gemm`."""
    p = cw.p
    name = f"{cw.op}_" + "_".join(f"{key}{v}" for key, v in cw.params)
    if cw.op == "batch_matmul":
        b, n, k, m = p["b"], p["n"], p["k"], p["m"]
        wl = legalized_workload(cw.op, cw.params, name)
        weight = (b, m, k) if p["t"] else (b, k, m)
        steps = {"weight": (0, 2, 1)} if p["t"] else {}
        return wl, {"data": (b, n, k), "weight": weight, "out": (b, n, m)}, steps, {}
    wl = legalized_workload(cw.op, cw.params, name)
    out = wl.output.shape
    if cw.op == "conv1d":
        shapes = {"data": (p["n"], p["c"], p["w"]), "weight": (p["k"], p["c"], p["kw"]), "out": out}
        return wl, shapes, {}, {"data": ((0, 0), (0, 0), (p["pl"], p["pr"]))}
    if cw.op == "dilated_conv2d":
        shapes = {"data": (p["n"], p["c"], p["h"], p["w"]),
                  "weight": (p["k"], p["c"], p["kh"], p["kw"]), "out": out}
        return wl, shapes, {}, {"data": ((0, 0), (0, 0), (p["pt"], p["pb"]), (p["pl"], p["pr"]))}
    raise ValueError(f"no CSP workload for operator {cw.op!r}")


def mapping_extents(cw) -> Tuple[int, int, int]:
    """The extents the stock-like mapping puts on the GEMM's x, y and z (x = batch or rows, y =
    output channels or columns, z = input channels or the inner dim): the solver's cost bound of
    :func:`~tvm_csp_embed.strategy.stock_mapping_cost` (there is no stock template to fall back
    to, but the bound keeps the solve as small as for the other operators)."""
    p = cw.p
    if cw.op == "batch_matmul":
        return p["n"], p["m"], p["k"]
    return p["n"], p["k"], p["c"]


def operator_text(cw) -> str:
    """The operator in the build report, e.g. ``12x64x64 @ 12x64x64^T`` or
    ``1x64x256 * 64x64x3 s1 p1 d2``."""
    p = cw.p
    if cw.op == "batch_matmul":
        b, n, k, m = p["b"], p["n"], p["k"], p["m"]
        return f"{b}x{n}x{k} @ {b}x{m}x{k}^T" if p["t"] else f"{b}x{n}x{k} @ {b}x{k}x{m}"
    if cw.op == "conv1d":
        return (f"{p['n']}x{p['c']}x{p['w']} * {p['k']}x{p['c']}x{p['kw']} s{p['sw']} "
                f"p{p['pl']} d{p['dw']}")
    return (f"{p['n']}x{p['c']}x{p['h']}x{p['w']} * {p['k']}x{p['c']}x{p['kh']}x{p['kw']} "
            f"s{p['sh']} p{p['pt']} d{p['dh']}x{p['dw']}")
