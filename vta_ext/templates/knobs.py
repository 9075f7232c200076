"""Knob types of the GEMM templates and the ``knobs`` argument every ``build_<op>`` accepts.

Every template's ``build_<op>(cfg, workload, epilogue=(), knobs=None)`` takes ``knobs`` as

* ``None`` or ``"tps"`` -- the template's default point (for the GEMM templates the Tiling
  Parameter Search, :func:`vta_ext.templates.tiling.tps_knobs`);
* ``"cycles"`` -- the default knob policy of a build (:mod:`vta_ext.options`): a template with a
  cycle estimate of its knob points (the CSP templates) builds its point of fewest estimated
  cycles; the stock templates have none and build their ``"tps"`` point, as the original stack
  does (the baseline stays the original's; ``csp-relaxed`` passes the point it searched for the
  stock programs it keeps explicitly, :mod:`tvm_csp_embed.stock_knobs`);
* ``"fallback"`` -- the original stack's schedule without tuned records (GEMM templates: every
  inner tile 1, one thread, :func:`vta_ext.templates.tiling.fallback_knobs`);
* the template's knob dataclass (:class:`Conv2dKnobs`, :class:`DenseKnobs`, ``PoolKnobs``, ...);
* a plain ``dict`` of that dataclass's fields (what a tuner and the JSON records hold).

:func:`knobs_from` maps the argument to the dataclass; what a value means and which values are
valid is the template's business (:func:`vta_ext.templates.tiling.check_knobs` for the GEMM
templates). Every problem is a :class:`~vta_ext.templates.errors.KnobError`, never a refusal.
"""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Type, TypeVar

from .errors import KnobError

__all__ = ["Conv2dKnobs", "DenseKnobs", "dense_knobs_as_conv2d", "conv2d_knobs_as_dense",
           "knobs_from", "check_int_knob"]

K = TypeVar("K")


@dataclass(frozen=True)
class Conv2dKnobs:
    """Schedule knobs of ``conv2d_packed`` / ``group_conv2d_packed`` (defaults = the autotvm fallback).

    ``tile_b``/``tile_h``/``tile_w``/``tile_co`` are the inner factors of the splits of the batch
    blocks, output rows, output columns and output-channel blocks (the output tile computed per store
    point; ``tile_co`` splits the full output-channel axis, also for a group conv2d); ``tile_ci`` the
    inner factor of the input-channel-block reduction (blocks loaded per DMA step).
    ``oc_nthread``/``h_nthread`` (1 or 2) add virtual threads over output-channel / row tiles.
    ``reuse`` (reuse-aware double buffering, needs exactly two virtual threads): a tile that both
    threads would load identically (the input tile with ``oc_nthread=2``, the weight tile with
    ``h_nthread=2``) is loaded once, alternating between the two buffer halves, and read by the GEMMs
    of both threads -- the order ``(I1,W1),(I1,W2),(I2,W1),(I2,W2)`` of the paper's §IV.D.
    """

    tile_b: int = 1
    tile_h: int = 1
    tile_w: int = 1
    tile_ci: int = 1
    tile_co: int = 1
    oc_nthread: int = 1
    h_nthread: int = 1
    reuse: bool = False


@dataclass(frozen=True)
class DenseKnobs:
    """The original ``dense_packed`` knobs (inner split factors; defaults = the autotvm fallback)."""

    tile_b: int = 1
    tile_ci: int = 1
    tile_co: int = 1
    oc_nthread: int = 1
    reuse: bool = False


def dense_knobs_as_conv2d(knobs: DenseKnobs) -> Conv2dKnobs:
    """The conv2d knobs realising the dense knobs (``tile_h = tile_w = 1``, ``h_nthread = 1``)."""
    return Conv2dKnobs(tile_b=knobs.tile_b, tile_ci=knobs.tile_ci, tile_co=knobs.tile_co,
                       oc_nthread=knobs.oc_nthread, reuse=knobs.reuse)


def conv2d_knobs_as_dense(knobs: Conv2dKnobs) -> DenseKnobs:
    """The dense knobs of conv2d knobs on the 1x1 form of a dense layer.

    Raises
    ------
    KnobError
        If ``tile_h``, ``tile_w`` or ``h_nthread`` is not 1 (a dense layer has no rows or columns).
    """
    for name in ("tile_h", "tile_w", "h_nthread"):
        if getattr(knobs, name) != 1:
            raise KnobError(f"dense knobs: {name}={getattr(knobs, name)}; a dense layer has no image "
                            "rows or columns, valid values: 1")
    return DenseKnobs(knobs.tile_b, knobs.tile_ci, knobs.tile_co, knobs.oc_nthread, knobs.reuse)


def check_int_knob(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum``; a :class:`KnobError` naming the knob otherwise."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise KnobError(f"knob {name}={value!r} must be an integer >= {minimum}")
    return int(value)


def knobs_from(knobs: Any, knob_type: Type[K], presets: Mapping[str, Callable[[], K]]) -> K:
    """The knob dataclass an argument ``knobs`` of a ``build_<op>`` stands for.

    Parameters
    ----------
    knobs : None, str, knob_type or mapping
        ``None`` (= ``"tps"``), a preset name, the dataclass itself, or a dict of its fields.
    knob_type : type
        The template's knob dataclass.
    presets : mapping of str to callable
        The preset names the template accepts (at least ``"tps"`` and ``"fallback"``), each a
        function returning the knobs.

    Raises
    ------
    KnobError
        For an unknown preset name (the message lists the valid ones), a dict with fields the
        dataclass does not have (the message lists its fields), or any other type.
    """
    if knobs is None or (knobs == "cycles" and "cycles" not in presets):
        knobs = "tps"
    if isinstance(knobs, knob_type):
        return knobs
    if isinstance(knobs, str):
        if knobs not in presets:
            raise KnobError(f"unknown knobs {knobs!r}; valid names: {', '.join(sorted(presets))} "
                            f"(or a {knob_type.__name__} / dict of its fields)")
        return presets[knobs]()
    if isinstance(knobs, Mapping):
        fields = [f.name for f in dataclasses.fields(knob_type)]
        unknown = sorted(set(knobs) - set(fields))
        if unknown:
            raise KnobError(f"unknown {knob_type.__name__} field(s) {', '.join(unknown)}; valid "
                            f"fields: {', '.join(fields)}")
        return knob_type(**knobs)
    raise KnobError(f"knobs must be None, one of {', '.join(sorted(presets))}, a "
                    f"{knob_type.__name__} or a dict of its fields, got {type(knobs).__name__} "
                    f"{knobs!r}")
