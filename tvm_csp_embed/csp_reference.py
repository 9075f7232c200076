"""The numpy references of the CSP strategies' operators, in the layouts of their embeddings.

The inputs are random operator tensors packed by the embedding's own host layouts
(``HostLayout.pack_numpy``, which the build uses too); the expected output comes from the
operator's definition (:mod:`tvm_csp_embed.reference`) through the epilogue, in the operator's
layout, and the third element ``unpack`` (``HostLayout.unpack_numpy`` of the output) maps the
simulator's packed output to it. An operator for which the strategy chose the stock template takes
the stock reference. Importing the module registers them for ``csp-strict`` and ``csp-relaxed``
(``import tvm_csp_embed`` does); the tuner verifies its best point against them.

The module sits above :mod:`tvm_csp_embed.candidates` (it needs the candidates' packed programs);
neither the candidates nor the strategy import it.
"""
from __future__ import annotations

import numpy as np

from vta_ext.strategy import get_template

from .candidates import STRATEGY_NAMES, operator_workload, packed_of
from .codegen.biasfold import fold_layouts, fold_range
from .operators import OPERATOR_KINDS
from .reference import (apply_epilogue, conv_reference, int8_tensor, reference_for, register_reference,
                        vector_tensors)

__all__ = ["gemm_reference", "new_op_reference"]


def _packed_inputs(cw, pg, tensors, epilogue, rng, bias_shape):
    """``(packed inputs of the program, {vector stage: operator tensor})``: the data and weight
    tensors in the embedding's host layouts, then the epilogue's vector tensors in the bias
    layout; a folded bias (``cw.bias_lanes``) is drawn within the range its lanes hold and written
    into the data and weight layouts instead (:func:`~.codegen.biasfold.fold_layouts`); a bias
    added by a GEMM (``cw.bias_gemm``) within the range of the ``z`` lanes of its constant block."""
    def draw(lo, hi):
        if cw.bias_lanes or cw.bias_gemm:
            flo, fhi = fold_range(cw.bias_lanes or pg.axes["z"])
            lo, hi = max(lo, flo), min(hi, fhi + 1)
        return rng.integers(lo, hi, bias_shape).astype(np.int32)
    vec = vector_tensors(epilogue, rng, draw)
    layouts = ({pg.operands[r].tensor: pg.operands[r].host for r in "AB"} if not cw.bias_lanes
               else fold_layouts(pg, vec["bias"], cw.bias_lanes))
    inputs = [layouts[pg.operands[r].tensor].pack_numpy(tensors[pg.operands[r].tensor]) for r in "AB"]
    inputs += [pg.bias_layout(bias_shape).pack_numpy(v) for kind, v in vec.items()
               if not (cw.bias_lanes and kind == "bias")]
    return inputs, vec


def gemm_reference(config, wl, epilogue, rng):
    """A CSP operator: random operator tensors packed by the embedding's host layouts; the
    expected output in the operator's own layout."""
    if wl.stock:  # the operator fell back to the stock template: its workload and layouts
        stock = get_template(wl.op, "stock")
        return reference_for(wl.op, "stock")(config, stock.workload_from_dict(dict(wl.stock)),
                                             epilogue, rng)
    pg = packed_of(wl, config)
    p = wl.p
    data_name, weight_name = (t.name for t in operator_workload(wl)[0].inputs)
    if wl.op in ("conv2d", "group_conv2d"):
        g = int(p.get("g", 1))
        x = int8_tensor(rng, (p["n"], p["c"], p["h"], p["w"]))
        w = int8_tensor(rng, (p["k"], p["c"] // g, p["kh"], p["kw"]))
        cg, kg = p["c"] // g, p["k"] // g
        acc = np.concatenate([conv_reference(x[:, i * cg:(i + 1) * cg], w[i * kg:(i + 1) * kg],
                                             ((p["pt"], p["pb"]), (p["pl"], p["pr"])),
                                             (p["sh"], p["sw"]), (1, 1))
                              for i in range(g)], axis=1)
        bias_shape = (1, p["k"], 1, 1)
    else:
        x, w = int8_tensor(rng, (p["n"], p["k"])), int8_tensor(rng, (p["m"], p["k"]))
        acc = x.astype(np.int64) @ w.astype(np.int64).T
        bias_shape = (p["m"],)
    inputs, vec = _packed_inputs(wl, pg, {data_name: x, weight_name: w}, epilogue, rng, bias_shape)
    vec = {k: v.astype(np.int64) if wl.op != "dense" else v.astype(np.int64).reshape(1, -1)
           for k, v in vec.items()}
    return (inputs, apply_epilogue(acc, epilogue, vec.get("bias"), vec.get("mulv")),
            pg.operands["C"].host.unpack_numpy)


def new_op_reference(config, cw, epilogue, rng):
    """The numpy reference of a kind of :data:`~tvm_csp_embed.operators.OPERATOR_KINDS`: random
    operator tensors packed by the embedding's host layouts (the build's own), the expected output
    from the operator's definition (a batched matrix product,
    :func:`~tvm_csp_embed.reference.conv_reference`) through the epilogue, in the operator's
    layout."""
    pg = packed_of(cw, config)
    p = cw.p
    if cw.op == "batch_matmul":
        x = int8_tensor(rng, (p["b"], p["n"], p["k"]))
        w = int8_tensor(rng, (p["b"], p["m"], p["k"]) if p["t"] else (p["b"], p["k"], p["m"]))
        acc = np.matmul(x.astype(np.int64), (w.transpose(0, 2, 1) if p["t"] else w).astype(np.int64))
        bias_shape = (p["b"], 1, p["m"])
    elif cw.op == "conv1d":
        x, w = int8_tensor(rng, (p["n"], p["c"], p["w"])), int8_tensor(rng, (p["k"], p["c"], p["kw"]))
        acc = conv_reference(x, w, ((p["pl"], p["pr"]),), (p["sw"],), (p["dw"],))
        bias_shape = (1, p["k"], 1)
    else:
        x = int8_tensor(rng, (p["n"], p["c"], p["h"], p["w"]))
        w = int8_tensor(rng, (p["k"], p["c"], p["kh"], p["kw"]))
        acc = conv_reference(x, w, ((p["pt"], p["pb"]), (p["pl"], p["pr"])), (p["sh"], p["sw"]),
                             (p["dh"], p["dw"]))
        bias_shape = (1, p["k"], 1, 1)
    inputs, vec = _packed_inputs(cw, pg, {"data": x, "weight": w}, epilogue, rng, bias_shape)
    vec = {k: v.astype(np.int64) for k, v in vec.items()}
    return (inputs, apply_epilogue(acc, epilogue, vec.get("bias"), vec.get("mulv")),
            pg.operands["C"].host.unpack_numpy)


for _strategy in STRATEGY_NAMES:
    for _kind in ("conv2d", "group_conv2d", "dense"):
        register_reference(_kind, _strategy, gemm_reference)
    for _kind in OPERATOR_KINDS:
        register_reference(_kind, _strategy, new_op_reference)
