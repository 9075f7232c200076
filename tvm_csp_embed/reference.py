"""Independent numpy references of the tunable operators: their definitions in int64, the epilogue,
and the stock templates' packed layouts.

A reference ``fn(config, workload, epilogue, rng) -> (packed inputs, expected output[, unpack])``
draws random inputs (int8 full range, int32 bias in ``[-2**14, 2**14)``) and computes the output
from the operator's definition in int64: an NCHW convolution (groups included) or a matrix
product, then the epilogue stages in order with int32 wrapping, then the int8 truncation of the
store. The stages are those of :mod:`vta_ext.templates.epilogue` (its table is the definition); the
per-channel tensors of its vector stages (``("bias",)``, ``("mulv",)``: int32 multiplier in
``[-2**7, 2**7)``, in the bias's layout) follow the operator's inputs in that module's
``VECTOR_STAGES`` order. For the stock templates (registered here) the packed layouts are those of
``docs/templates-api.md`` (nothing of the templates is used) and the expected output is packed.
The CSP strategies pack by their embeddings' own host layouts; their references are in
:mod:`tvm_csp_embed.csp_reference`, above the strategy, and use the definitions here. Other
strategies register theirs with :func:`register_reference`; the tuner looks them up with
:func:`reference_for`.

This module sits below the strategies and the tuner: it imports neither.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

from vta_ext.templates.epilogue import VECTOR_STAGES

__all__ = ["register_reference", "reference_for", "apply_epilogue", "conv_reference", "int8_tensor",
           "vector_tensors"]

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
                          "point without one (tvm_csp_embed.reference.register_reference)"
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


def vector_tensors(epilogue, rng, draw):
    """The per-channel int32 tensors of the epilogue's vector stages, in ``VECTOR_STAGES`` order:
    ``{kind: draw(lo, hi)}`` (bias in ``[-2**14, 2**14)``, multiplier in ``[-2**7, 2**7)``)."""
    ranges = {"bias": (-(1 << 14), 1 << 14), "mulv": (-(1 << 7), 1 << 7)}
    kinds = {s[0] for s in epilogue}
    return {kind: draw(*ranges[kind]) for kind in VECTOR_STAGES if kind in kinds}


def int8_tensor(rng, shape) -> np.ndarray:
    """Random int8 values of the full range."""
    return rng.integers(-128, 128, shape).astype(np.int8)


def _conv2d(config, wl, epilogue, rng) -> Tuple[List[np.ndarray], np.ndarray]:
    b, ci, co = config.BATCH, config.BLOCK_IN, config.BLOCK_OUT
    g = int(getattr(wl, "groups", 1))
    n, c, o, h, w = wl.batch, wl.in_channels, wl.out_channels, wl.height, wl.width
    kh, kw, cg, og = wl.kernel_h, wl.kernel_w, c // g, o // g
    x = int8_tensor(rng, (n, c, h, w))
    k = int8_tensor(rng, (o, cg, kh, kw))
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
    vec = vector_tensors(epilogue, rng, lambda lo, hi: rng.integers(lo, hi, o).astype(np.int32))
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
    x, wt = int8_tensor(rng, (n, k)), int8_tensor(rng, (m, k))
    acc = x.astype(np.int64) @ wt.astype(np.int64).T
    inputs = [x.reshape(n // b, b, k // ci, ci).transpose(0, 2, 1, 3),
              wt.reshape(m // co, co, k // ci, ci).transpose(0, 2, 1, 3)]
    vec = vector_tensors(epilogue, rng, lambda lo, hi: rng.integers(lo, hi, m).astype(np.int32))
    for per_feature in vec.values():
        inputs.append(np.broadcast_to(per_feature.reshape(1, m // co, 1, co), (1, m // co, b, co)))
    vec = {k: v.astype(np.int64).reshape(1, m) for k, v in vec.items()}
    out = apply_epilogue(acc, epilogue, vec.get("bias"), vec.get("mulv"))
    packed = out.reshape(n // b, b, m // co, co).transpose(0, 2, 1, 3)
    return [np.ascontiguousarray(a) for a in inputs], np.ascontiguousarray(packed)


def conv_reference(x, w, pads: Sequence[Tuple[int, int]], strides: Sequence[int],
                   dilations: Sequence[int]):
    """Direct 1-D or 2-D convolution (``N C spatial...`` x ``O C taps...``) in int64, the
    definition: zero padding ``pads`` (lo, hi) per spatial dim, then per filter tap the strided,
    dilated input window times the tap's weights."""
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0)) + tuple(tuple(p) for p in pads))
    taps = w.shape[2:]
    out = [(xp.shape[2 + i] - d * (t - 1) - 1) // s + 1
           for i, (t, s, d) in enumerate(zip(taps, strides, dilations))]
    acc = np.zeros((x.shape[0], w.shape[0], *out), np.int64)
    for tap in np.ndindex(*taps):
        window = tuple(slice(j * d, j * d + s * (o - 1) + 1, s)
                       for j, s, d, o in zip(tap, strides, dilations, out))
        acc += np.einsum("nc...,oc->no...", xp[(slice(None), slice(None)) + window],
                         w[(slice(None), slice(None)) + tap].astype(np.int64))
    return acc


for _kind, _fn in (("conv2d", _conv2d), ("group_conv2d", _conv2d), ("dense", _dense)):
    register_reference(_kind, "stock", _fn)
