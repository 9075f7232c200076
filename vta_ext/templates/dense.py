"""The ``dense_packed`` template (original ``vta/top/vta_dense.py``).

Layouts (``b = BATCH``, ``ci = BLOCK_IN``, ``co = BLOCK_OUT``)::

    data    (N/b, K/ci, b, ci)      int8
    weight  (M/co, K/ci, co, ci)    int8
    bias    (1 or N/b, M/co, b, co) int32   (optional)
    mult    (1 or N/b, M/co, b, co) int32   (optional per-channel multiplier, ``("mulv",)``)
    out     (N/b, M/co, b, co)      int8

``out[n, m] = epilogue(sum_k data[n, k] * weight[m, k])``.

The packed dense layouts are, byte for byte, those of a packed conv2d with a 1x1 image and a 1x1
kernel (``(N/b, K/ci, 1, 1, b, ci)`` etc.), and the original ``dense_packed`` schedule -- output loop
order ``(b_o, co_o, b_i, co_i)`` with the store at ``co_o``, dense stage ``(b_o, k_o, co)`` with
``k_o`` split by ``tile_ci`` and the input/weight caches at the outer ``k_o``, tensorized at
``b_i`` -- is the conv2d schedule of :mod:`.conv2d` with ``tile_h = tile_w = 1`` on that shape. So
this template builds the TE compute and s_tir schedule of :mod:`.conv2d` for the 1x1 workload
(:func:`dense_as_conv2d`) and exposes the dense shapes. Knobs: ``tile_b``, ``tile_ci``, ``tile_co``,
``oc_nthread`` (fallback: all inner factors 1, one thread).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Union

import numpy as np

from ..config import VTAConfig, load_config
from .conv2d import CompiledConv2d, compile_conv2d
from .epilogue import normalize_epilogue
from .errors import Conv2dError
from .knobs import DenseKnobs, conv2d_knobs_as_dense, dense_knobs_as_conv2d
from .tiling import resolve_knobs
from .workload import DenseWorkload, check_dense_workload, dense_as_conv2d

__all__ = ["DenseWorkload", "DenseKnobs", "CompiledDense", "build_dense", "dense_as_conv2d",
           "dense_knobs_as_conv2d"]


@dataclass
class CompiledDense:
    """A dense layer compiled into one VTA program (wraps the 1x1 :class:`CompiledConv2d`)."""

    config: VTAConfig
    workload: DenseWorkload
    knobs: DenseKnobs
    conv: CompiledConv2d

    @property
    def program(self):
        return self.conv.program

    @property
    def epilogue(self):
        return self.conv.epilogue

    @property
    def timings(self) -> Dict[str, float]:
        return self.conv.timings

    @property
    def shapes(self) -> Dict[str, tuple]:
        cfg, wl = self.config, self.workload
        B, BI, BO = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
        s = {"data": (wl.batch // B, wl.in_features // BI, B, BI),
             "weight": (wl.out_features // BO, wl.in_features // BI, BO, BI),
             "out": (wl.batch // B, wl.out_features // BO, B, BO)}
        for name in self.conv.vector_names:
            s[name] = (1, wl.out_features // BO, B, BO)
        return s

    def run(self, data_packed, weight_packed, bias_packed=None, mult_packed=None, simulator=None):
        """Execute on the functional simulator; returns ``(out_packed_int8, SimStats)``.

        ``bias_packed`` (and ``mult_packed``, the per-channel multiplier; the third argument if
        there is no bias) may be ``(1, M/co, b, co)`` (broadcast over the batch blocks) or
        ``(N/b, M/co, b, co)``.
        """
        shapes = self.shapes
        data = np.asarray(data_packed)
        weight = np.asarray(weight_packed)
        for name, arr in (("data", data), ("weight", weight)):
            if arr.shape != shapes[name]:
                raise Conv2dError(f"{name}: expected shape {shapes[name]}, got {arr.shape}")
        d6 = data.reshape(data.shape[0], data.shape[1], 1, 1, *data.shape[2:])
        w6 = weight.reshape(weight.shape[0], weight.shape[1], 1, 1, *weight.shape[2:])
        vec6 = []
        for name, packed in zip(self.conv.vector_names or ["bias"],
                                [v for v in (bias_packed, mult_packed) if v is not None]):
            vec = np.asarray(packed)
            if vec.ndim != 4 or vec.shape[1:] != shapes.get(name, shapes["out"])[1:] \
                    or vec.shape[0] not in (1, shapes["out"][0]):
                raise Conv2dError(f"{name}: expected shape {shapes.get(name)} (or with N/b "
                                  f"leading), got {vec.shape}")
            vec6.append(vec.reshape(vec.shape[0], vec.shape[1], 1, 1, *vec.shape[2:]))
        out, stats = self.conv.run(d6, w6, *vec6, simulator=simulator)
        return out.reshape(shapes["out"]), stats


def build_dense(cfg: Union[VTAConfig, str], workload: DenseWorkload, epilogue=(),
                knobs=None) -> CompiledDense:
    """Compile a packed dense + epilogue for ``cfg``.

    Parameters
    ----------
    cfg : VTAConfig or str
        Configuration (or preset name).
    workload : DenseWorkload
        The layer.
    epilogue : sequence of tuples
        Requantisation stages (:mod:`vta_ext.templates.epilogue`).
    knobs : None, str, DenseKnobs or dict
        None (or ``"tps"``) = Tiling Parameter Search, ``"tps-reuse"``, ``"fallback"`` (inner 1),
        explicit :class:`DenseKnobs` or a dict of its fields.

    Returns
    -------
    CompiledDense
        ``.program`` and ``.run(data, weight, bias=None, mult=None, simulator=None) -> (out,
        SimStats)``.

    Raises
    ------
    Conv2dRefusal
        For a workload the template does not implement or when no tiling fits.
    KnobError
        For knobs outside the knob space.
    """
    cfg = load_config(cfg)
    check_dense_workload(cfg, workload)
    epilogue = normalize_epilogue(epilogue)
    ck, explicit = resolve_knobs(cfg, workload, epilogue, knobs)
    conv = compile_conv2d(cfg, dense_as_conv2d(workload), epilogue, ck, explicit)
    return CompiledDense(cfg, workload, conv2d_knobs_as_dense(conv.knobs), conv)
