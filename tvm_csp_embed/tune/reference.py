"""Independent numpy references of the tunable operators, in their strategy's packed layouts.

A reference ``fn(config, workload, epilogue, rng) -> (packed inputs, expected output[, unpack])``
draws random inputs (int8 full range, int32 bias in ``[-2**14, 2**14)``) and computes the output
from the operator's definition in int64: an NCHW convolution (groups included, also under the
CSP strategies) or a matrix
product, then the epilogue stages in order with int32 wrapping, then the int8 truncation of the
store. The stages are those of :mod:`vta_ext.templates.epilogue` (its table is the definition); the
per-channel tensors of its vector stages (``("bias",)``, ``("mulv",)``: int32 multiplier in
``[-2**7, 2**7)``, in the bias's layout) follow the operator's inputs in that module's
``VECTOR_STAGES`` order. For the stock templates the packed layouts are those of ``docs/templates-api.md`` (nothing
of the templates is used) and the expected output is packed. For the CSP strategies the inputs are
packed, and the simulator's output unpacked, by the embedding's own host layouts
(``HostLayout.pack_numpy`` / ``unpack_numpy``, which the build uses too), and the output is
compared in the operator's layout: the optional third element ``unpack`` maps the packed output
to the expected one's layout. Other strategies register theirs with :func:`register_reference`.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

__all__ = ["register_reference", "reference_for", "apply_epilogue"]

Reference = Callable[..., Tuple[List[np.ndarray], np.ndarray]]
_REFERENCES: Dict[Tuple[str, str], Reference] = {}


def register_reference(kind: str, strategy: str, fn: Reference) -> None:
    """Register the numpy reference of operator ``kind`` in the layouts of ``strategy``."""
    _REFERENCES[(kind, strategy)] = fn


def reference_for(kind: str, strategy: str) -> Reference:
    """The reference of ``(kind, strategy)``; a ``LookupError`` naming what is registered."""
    try:
        return _REFERENCES[(kind, strategy)]
    except KeyError:
        raise LookupError(f"no numpy reference registered for {kind} under strategy {strategy!r} "
                          f"(registered: {sorted(_REFERENCES)}); the tuner cannot verify its best "
                          "point without one (tvm_csp_embed.tune.reference.register_reference)"
                          ) from None


def _wrap32(x: np.ndarray) -> np.ndarray:
    return ((x + (1 << 31)) % (1 << 32)) - (1 << 31)


def apply_epilogue(acc: np.ndarray, epilogue: Sequence[tuple], bias, multiplier=None
                   ) -> np.ndarray:
    """The int32 accumulator through the epilogue stages in order, then the int8 truncation.

    The stages as the table of :mod:`vta_ext.templates.epilogue` defines them; ``bias`` and
    ``multiplier`` are the per-channel tensors of the ``("bias",)`` / ``("mulv",)`` stages,
    broadcastable against ``acc``."""
    acc = _wrap32(acc.astype(np.int64))
    vectors = {"bias": bias, "mulv": multiplier}
    for stage in epilogue:
        kind = stage[0]
        if kind in vectors and vectors[kind] is None:
            raise ValueError(f"epilogue stage {stage!r} needs its per-channel tensor")
        if kind == "bias":
            acc = acc + bias
        elif kind == "mulv":
            acc = acc * np.asarray(multiplier, np.int64)
        elif kind == "shr":
            acc = acc >> int(stage[1])
        elif kind == "clip":
            acc = np.clip(acc, int(stage[1]), int(stage[2]))
        elif kind == "min":
            acc = np.minimum(acc, int(stage[1]))
        elif kind == "max":
            acc = np.maximum(acc, int(stage[1]))
        elif kind == "add":
            acc = acc + int(stage[1])
        elif kind == "mul":
            acc = acc * int(stage[1])
        else:
            raise ValueError(f"unknown epilogue stage {stage!r}")
        acc = _wrap32(acc)
    return acc.astype(np.int8)  # keeps the low byte, as the STORE does


def _vectors(epilogue, rng, draw):
    """The per-channel int32 tensors of the epilogue's vector stages, in ``VECTOR_STAGES`` order:
    ``{kind: draw(lo, hi)}`` (bias in ``[-2**14, 2**14)``, multiplier in ``[-2**7, 2**7)``)."""
    from vta_ext.templates.epilogue import VECTOR_STAGES

    ranges = {"bias": (-(1 << 14), 1 << 14), "mulv": (-(1 << 7), 1 << 7)}
    kinds = {s[0] for s in epilogue}
    return {kind: draw(*ranges[kind]) for kind in VECTOR_STAGES if kind in kinds}


def _int8(rng, shape) -> np.ndarray:
    return rng.integers(-128, 128, shape).astype(np.int8)


def _conv2d(config, wl, epilogue, rng) -> Tuple[List[np.ndarray], np.ndarray]:
    b, ci, co = config.BATCH, config.BLOCK_IN, config.BLOCK_OUT
    g = int(getattr(wl, "groups", 1))
    n, c, o, h, w = wl.batch, wl.in_channels, wl.out_channels, wl.height, wl.width
    kh, kw, cg, og = wl.kernel_h, wl.kernel_w, c // g, o // g
    x = _int8(rng, (n, c, h, w))
    k = _int8(rng, (o, cg, kh, kw))
    oh = (h + 2 * wl.pad_h - kh) // wl.stride_h + 1
    ow = (w + 2 * wl.pad_w - kw) // wl.stride_w + 1
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (wl.pad_h,) * 2, (wl.pad_w,) * 2))
    acc = np.zeros((n, o, oh, ow), np.int64)
    for gi in range(g):
        xs, ks = xp[:, gi * cg:(gi + 1) * cg], k[gi * og:(gi + 1) * og].astype(np.int64)
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i:i + wl.stride_h * (oh - 1) + 1:wl.stride_h,
                           j:j + wl.stride_w * (ow - 1) + 1:wl.stride_w]
                acc[:, gi * og:(gi + 1) * og] += np.einsum("nchw,oc->nohw", patch, ks[:, :, i, j])
    inputs = [x.reshape(n // b, b, c // ci, ci, h, w).transpose(0, 2, 4, 5, 1, 3),
              k.reshape(o // co, co, cg // ci, ci, kh, kw).transpose(0, 2, 4, 5, 1, 3)]
    vec = _vectors(epilogue, rng, lambda lo, hi: rng.integers(lo, hi, o).astype(np.int32))
    for per_channel in vec.values():
        inputs.append(np.broadcast_to(per_channel.reshape(1, o // co, 1, 1, 1, co),
                                      (1, o // co, 1, 1, b, co)))
    vec = {k: v.astype(np.int64).reshape(1, o, 1, 1) for k, v in vec.items()}
    out = apply_epilogue(acc, epilogue, vec.get("bias"), vec.get("mulv"))
    packed = out.reshape(n // b, b, o // co, co, oh, ow).transpose(0, 2, 4, 5, 1, 3)
    return [np.ascontiguousarray(a) for a in inputs], np.ascontiguousarray(packed)


def _dense(config, wl, epilogue, rng) -> Tuple[List[np.ndarray], np.ndarray]:
    b, ci, co = config.BATCH, config.BLOCK_IN, config.BLOCK_OUT
    n, k, m = wl.batch, wl.in_features, wl.out_features
    x, wt = _int8(rng, (n, k)), _int8(rng, (m, k))
    acc = x.astype(np.int64) @ wt.astype(np.int64).T
    inputs = [x.reshape(n // b, b, k // ci, ci).transpose(0, 2, 1, 3),
              wt.reshape(m // co, co, k // ci, ci).transpose(0, 2, 1, 3)]
    vec = _vectors(epilogue, rng, lambda lo, hi: rng.integers(lo, hi, m).astype(np.int32))
    for per_feature in vec.values():
        inputs.append(np.broadcast_to(per_feature.reshape(1, m // co, 1, co), (1, m // co, b, co)))
    vec = {k: v.astype(np.int64).reshape(1, m) for k, v in vec.items()}
    out = apply_epilogue(acc, epilogue, vec.get("bias"), vec.get("mulv"))
    packed = out.reshape(n // b, b, m // co, co).transpose(0, 2, 1, 3)
    return [np.ascontiguousarray(a) for a in inputs], np.ascontiguousarray(packed)


def _conv2d_nchw(x, w, pads, strides) -> np.ndarray:
    """int64 NCHW x OIHW convolution, padding ``(top, left, bottom, right)``."""
    pt, pl, pb, pr = pads
    sh, sw = strides
    k, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh, ow = (xp.shape[2] - kh) // sh + 1, (xp.shape[3] - kw) // sw + 1
    acc = np.zeros((x.shape[0], k, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
            acc += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j].astype(np.int64))
    return acc


def _csp_gemm(config, wl, epilogue, rng):
    """A CSP operator: random operator tensors packed by the embedding's host layouts; the
    expected output in the operator's own layout."""
    from ..strategy import get_template, operator_workload, packed_of

    if wl.stock:  # the operator fell back to the stock template: its workload and layouts
        stock = get_template(wl.op, "stock")
        return reference_for(wl.op, "stock")(config, stock.workload_from_dict(dict(wl.stock)),
                                             epilogue, rng)
    pg = packed_of(wl, config)
    p = wl.p
    data_name, weight_name = (t.name for t in operator_workload(wl)[0].inputs)
    if wl.op in ("conv2d", "group_conv2d"):
        g = int(p.get("g", 1))
        x = _int8(rng, (p["n"], p["c"], p["h"], p["w"]))
        w = _int8(rng, (p["k"], p["c"] // g, p["kh"], p["kw"]))
        cg, kg = p["c"] // g, p["k"] // g
        acc = np.concatenate([_conv2d_nchw(x[:, i * cg:(i + 1) * cg], w[i * kg:(i + 1) * kg],
                                           (p["pt"], p["pl"], p["pb"], p["pr"]), (p["sh"], p["sw"]))
                              for i in range(g)], axis=1)
        bias_shape = (1, p["k"], 1, 1)
    else:
        x, w = _int8(rng, (p["n"], p["k"])), _int8(rng, (p["m"], p["k"]))
        acc = x.astype(np.int64) @ w.astype(np.int64).T
        bias_shape = (p["m"],)
    tensors = {data_name: x, weight_name: w}
    inputs = [pg.operands[role].host.pack_numpy(tensors[pg.operands[role].tensor])
              for role in "AB"]
    vec = _vectors(epilogue, rng, lambda lo, hi: rng.integers(lo, hi, bias_shape).astype(np.int32))
    for v in vec.values():
        inputs.append(pg.bias_layout(bias_shape).pack_numpy(v))
    vec = {k: v.astype(np.int64) if wl.op != "dense" else v.astype(np.int64).reshape(1, -1)
           for k, v in vec.items()}
    return (inputs, apply_epilogue(acc, epilogue, vec.get("bias"), vec.get("mulv")),
            pg.operands["C"].host.unpack_numpy)


for _kind, _fn in (("conv2d", _conv2d), ("group_conv2d", _conv2d), ("dense", _dense)):
    register_reference(_kind, "stock", _fn)
for _strategy in ("csp-strict", "csp-relaxed"):
    for _kind in ("conv2d", "group_conv2d", "dense"):
        register_reference(_kind, _strategy, _csp_gemm)
