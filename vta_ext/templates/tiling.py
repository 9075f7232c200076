"""The knob space of the GEMM templates, its cost model, and the Tiling Parameter Search (TPS).

The GEMM templates (``conv2d_packed``, ``group_conv2d_packed``, ``dense_packed``) share one knob
space, that of the original AutoTVM templates: the inner split factors ``tile_b, tile_h, tile_w,
tile_ci, tile_co`` over the divisors of the batch blocks, output rows, output columns,
input-channel blocks (per group) and output-channel blocks (the full axis, also for a group conv2d,
as in the original ``group_conv2d_packed``), and the virtual threads ``oc_nthread, h_nthread`` in
{1, 2}; plus ``reuse`` (reuse-aware double buffering of a two-thread point). A dense layer is the
1x1 conv2d of :func:`~vta_ext.templates.workload.dense_as_conv2d` with knobs
:class:`~vta_ext.templates.knobs.DenseKnobs`.

Public API (a tuner enumerates the space, a strategy picks a default point):

* :func:`knob_space` -- the valid points, each a :class:`TilingChoice` with its modelled cost;
* :func:`pruned_points` -- the points of the space that were pruned, each with the reason;
* :func:`tps_knobs` -- TPS: the valid point with the fewest modelled DRAM bytes;
* :func:`tiling_grid` -- the model of every point at once (numpy arrays over the whole domain,
  memoised), which the three above read;
* :func:`fallback_knobs` -- the original's fallback (every inner tile 1, one thread);
* :func:`check_knobs` -- validate explicit knobs (a :class:`~vta_ext.templates.errors.KnobError`
  naming the knob and its valid values);
* :func:`resolve_knobs` -- the ``knobs`` argument of a ``build_<op>`` to explicit knobs.

The model has one definition: each formula takes knobs whose fields are ints (one point,
:func:`evaluate`, :func:`dram_bytes`, ...) or numpy arrays broadcast over the domain
(:func:`tiling_grid`); a pruned point's reason text is made only when asked for.

A point is **pruned** (with a reason) when the template cannot realise it -- a virtual-thread count
that does not divide its axis, ``reuse`` without exactly two threads, a group conv2d output-channel
tile that is neither whole groups nor inside one group -- or when it does not fit: its tiles
overflow the ``inp``/``wgt``/``acc`` scratchpad (all virtual-thread copies, :func:`sram_usage`),
its GEMM micro-op kernel exceeds half the micro-op buffer (so that the reset and GEMM kernels fit
together), or a folded GEMM loop exceeds the 14-bit loop field. Explicit knobs are only checked for
realisability; whether their tiles fit is decided by the lowering, whose error names the buffer.

The DRAM model (:func:`dram_bytes`) is an exact count of what the schedule of :mod:`.conv2d` loads
and stores (and what the simulator's counters report):

* input: every output tile (``tile_h x tile_w`` outputs, ``tile_co`` channel blocks) and every
  batch block loads, per reduction step, the input-channel blocks of its window clipped to the image
  (padding is produced by the DMA and not read): ``tile_ci`` blocks, or -- for a group conv2d tile
  spanning ``s > 1`` groups -- the ``(s - 1) * (C/g)/ci + tile_ci`` blocks from the first group's
  to the last group's; ``R``/``C_`` below are the sums over the row/column tiles of the clipped
  window sizes;
* weight: every output tile and batch block loads its ``tile_co x (C/g)/ci x KH x KW`` kernel
  elements (once per output tile for all ``tile_b`` batch blocks when ``(C/g)/ci == 1``: the
  caches then sit at the store point);
* accumulator (bias): ``tile_b x tile_co`` elements per output tile;
* output: every output element once.

With reuse-aware double buffering the tile that both virtual threads load identically is loaded
once: the input with ``oc_nthread = 2`` (unless the two threads' output-channel tiles lie in
different groups), the weights with ``h_nthread = 2``.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from ..config import VTAConfig, load_config
from ..isa import MemType
from ..layout import MAX_LOOP_EXTENT
from ..memory import gemm_kernel_uop_budget, scratchpad
from .epilogue import alu_count, normalize_epilogue, vector_stages
from .errors import Conv2dRefusal, KnobError
from .knobs import (Conv2dKnobs, DenseKnobs, check_int_knob, conv2d_knobs_as_dense,
                    dense_knobs_as_conv2d, knobs_from)
from .workload import (Conv2dWorkload, DenseWorkload, check_conv2d_workload, check_dense_workload,
                       dense_as_conv2d, groups_of, window_size)

__all__ = ["TilingChoice", "PrunedPoint", "BYTE_COUNTERS", "knob_domain", "knob_space",
           "pruned_points", "tps_knobs", "TilingGrid", "tiling_grid", "fallback_knobs",
           "check_knobs", "resolve_knobs", "evaluate", "dram_bytes", "sram_usage", "gemm_uops",
           "estimate_insns", "group_span", "total_gemm_uops", "output_blocks", "tile_dma_floor"]

#: the simulator counters the DRAM model predicts
BYTE_COUNTERS = ("inp_load_nbytes", "wgt_load_nbytes", "acc_load_nbytes", "out_store_nbytes")

GemmWorkload = Union[Conv2dWorkload, DenseWorkload]
GemmKnobs = Union[Conv2dKnobs, DenseKnobs]

#: the split knobs and the workload axis each one divides
_SPLITS = ("tile_b", "tile_h", "tile_w", "tile_ci", "tile_co")
_THREADS = (1, 2)


@dataclass(frozen=True)
class TilingChoice:
    """A valid point of the knob space with its modelled cost.

    Attributes
    ----------
    knobs : Conv2dKnobs or DenseKnobs
        The schedule knobs.
    bytes : dict
        Modelled DRAM bytes per counter (keys :data:`BYTE_COUNTERS`).
    insns : int
        Estimated instruction count (tie-breaker only).
    sram : dict
        On-chip entries per scratchpad (``inp``, ``wgt``, ``acc``), all virtual threads.
    uops : int
        Micro-ops of the GEMM kernel.
    candidates : int
        For :func:`tps_knobs`: the number of valid points it chose from (0 otherwise).
    """

    knobs: GemmKnobs
    bytes: Dict[str, int]
    insns: int
    sram: Dict[str, int]
    uops: int
    candidates: int = 0

    @property
    def total_bytes(self) -> int:
        """Sum of the modelled load and store bytes."""
        return sum(self.bytes.values())


@dataclass(frozen=True)
class PrunedPoint:
    """A point of the knob space that is not valid, and why."""

    knobs: GemmKnobs
    reason: str


class _Geometry(NamedTuple):
    """Block counts of a conv2d workload on a configuration."""

    nb: int     # batch blocks
    ob: int     # output-channel blocks
    cbg: int    # input-channel blocks per group
    opg: int    # output-channel blocks per group
    groups: int
    oh: int
    ow: int


def _geometry(cfg: VTAConfig, wl: Conv2dWorkload) -> _Geometry:
    g = groups_of(wl)
    ob = wl.out_channels // cfg.BLOCK_OUT
    return _Geometry(wl.batch // cfg.BATCH, ob, wl.in_channels // g // cfg.BLOCK_IN, ob // g, g,
                     wl.out_height, wl.out_width)


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _as_conv2d(cfg: VTAConfig, wl: GemmWorkload) -> Conv2dWorkload:
    """The conv2d form of a GEMM workload, after the template's refusal checks."""
    if isinstance(wl, DenseWorkload):
        check_dense_workload(cfg, wl)
        return dense_as_conv2d(wl)
    check_conv2d_workload(cfg, wl)
    return wl


def _knobs_as_conv2d(knobs: GemmKnobs) -> Conv2dKnobs:
    return dense_knobs_as_conv2d(knobs) if isinstance(knobs, DenseKnobs) else knobs


def _knobs_for(wl: GemmWorkload, knobs: Conv2dKnobs) -> GemmKnobs:
    """The knobs in the workload's own terms (:class:`DenseKnobs` for a dense layer)."""
    return conv2d_knobs_as_dense(knobs) if isinstance(wl, DenseWorkload) else knobs


# ------------------------------------------------------------------------------------------------
# the model: one definition, evaluated on one point (ints) or on the whole domain (numpy arrays)
# ------------------------------------------------------------------------------------------------
# Every formula below takes knobs whose fields are ints (one point, a Conv2dKnobs) or numpy arrays
# broadcast over the knob domain (a _KnobArrays, :func:`tiling_grid`); a conditional is _where.
class _KnobArrays(NamedTuple):
    """The fields of :class:`Conv2dKnobs` as numpy arrays broadcast over a knob domain."""

    tile_b: Any
    tile_h: Any
    tile_w: Any
    tile_ci: Any
    tile_co: Any
    oc_nthread: Any
    h_nthread: Any
    reuse: Any


def _where(cond, a, b):
    """``a if cond else b``, element-wise when ``cond`` is an array."""
    return np.where(cond, a, b) if isinstance(cond, np.ndarray) else (a if cond else b)


def _max(a, b):
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def _group_span(geo: _Geometry, k) -> Any:
    return _max(1, k.tile_co // geo.opg) if geo.groups > 1 else 1


def group_span(cfg: VTAConfig, wl: Conv2dWorkload, knobs: Conv2dKnobs) -> int:
    """Groups one output-channel tile of ``knobs`` spans (1 for a plain conv2d, or a tile inside
    one group)."""
    return int(_group_span(_geometry(cfg, wl), knobs))


def _inp_blocks_per_step(geo: _Geometry, k) -> Any:
    """Input-channel blocks one reduction step loads: the interval from the first group's to the
    last group's ``tile_ci`` blocks of the output-channel tile."""
    return (_group_span(geo, k) - 1) * geo.cbg + k.tile_ci


def _inp_shared(geo: _Geometry, k) -> Any:
    """Whether the two ``oc_nthread`` threads load the same input tile (same group)."""
    return (geo.groups == 1) | (k.tile_co < geo.opg)


def _reused(geo: _Geometry, k) -> Tuple[Any, Any]:
    """``(input, weight)``: which tile reuse-aware double buffering loads once."""
    two = k.reuse & (k.oc_nthread * k.h_nthread == 2)
    return two & (k.oc_nthread == 2) & _inp_shared(geo, k), two & (k.h_nthread == 2)


def _clipped_sum(n_out: int, tile, stride: int, kernel: int, pad: int, size: int) -> Any:
    """Sum over the ``n_out / tile`` tiles of the input rows (or columns) a tile's window reads
    inside the image ``[0, size)``; for an array of tiles (divisors of ``n_out``), the sum of each,
    looked up per distinct divisor."""
    if isinstance(tile, np.ndarray):
        divisors, at = np.unique(tile, return_inverse=True)
        sums = np.array([_clipped_sum(n_out, int(t), stride, kernel, pad, size) for t in divisors],
                        dtype=np.int64)
        return sums[at].reshape(tile.shape)
    return sum(_clipped(n_out, tile, stride, kernel, pad, size))


def _clipped(n_out: int, tile: int, stride: int, kernel: int, pad: int, size: int) -> List[int]:
    """The input rows (or columns) each of the ``n_out / tile`` tiles' windows reads inside the
    image ``[0, size)``."""
    win = window_size(tile, kernel, stride)
    return [max(0, min(lo + win, size) - max(lo, 0))
            for lo in (t * tile * stride - pad for t in range(n_out // tile))]


def tile_dma_floor(cfg: VTAConfig, wl: Conv2dWorkload, knobs: Conv2dKnobs
                   ) -> Optional[Tuple[float, float]]:
    """Lower bounds on the cycles of one virtual thread's loads of one output tile and of one
    tile's store (:meth:`vta_ext.sim.cycles.DmaCost.cycles`), for a point whose reduction is one
    step (``(C/g)/ci == tile_ci``) without reuse-aware double buffering; None otherwise.

    Per the DRAM model (module docstring) the tile's loads move, per batch block, its input-channel
    blocks of the window clipped to the image (at least the least clipped window of any tile) and
    its ``tile_co x KH x KW`` kernel elements; its store moves ``tile_b x tile_co x tile_h x
    tile_w`` output elements. Each kind is counted as one DMA of the fewest rows it can have
    (:func:`_dma_rows`; the weights one), without padding.
    """
    from ..sim.cycles import timing

    geo = _geometry(cfg, wl)
    if knobs.reuse or geo.cbg != knobs.tile_ci:
        return None
    t = timing(cfg)
    rows = min(_clipped(geo.oh, knobs.tile_h, wl.stride_h, wl.kernel_h, wl.pad_h, wl.height))
    cols = min(_clipped(geo.ow, knobs.tile_w, wl.stride_w, wl.kernel_w, wl.pad_w, wl.width))
    blocks = knobs.tile_b * int(_inp_blocks_per_step(geo, knobs))
    wide = window_size(knobs.tile_w, wl.kernel_w, wl.stride_w) == wl.width
    whole = wide and window_size(knobs.tile_h, wl.kernel_h, wl.stride_h) == wl.height
    inp = t.dma("INP").cycles(1, _dma_rows(blocks, rows, wide, whole),
                              blocks * rows * cols * cfg.inp_elem_bytes)
    wgt = t.dma("WGT").cycles(1, 1, knobs.tile_co * knobs.tile_ci * wl.kernel_h * wl.kernel_w
                              * cfg.wgt_elem_bytes)
    out_blocks = knobs.tile_b * knobs.tile_co
    rows_out = _dma_rows(out_blocks, knobs.tile_h, knobs.tile_w == geo.ow,
                         (knobs.tile_w, knobs.tile_h) == (geo.ow, geo.oh))
    store = t.dma("OUT").cycles(1, rows_out, out_blocks * knobs.tile_h * knobs.tile_w
                                * cfg.out_elem_bytes)
    return inp + wgt, store


def _dma_rows(blocks: int, rows: int, wide: bool, whole: bool) -> int:
    """The fewest DMA rows that move ``rows`` rows of each of ``blocks`` blocks of a packed
    tensor: one if the tile is the whole image (the blocks lie one after the other), one per
    block if it is as wide as the image (its rows lie one after the other), else every row."""
    return 1 if whole else blocks if wide else blocks * rows


def _dram(cfg: VTAConfig, geo: _Geometry, wl: Conv2dWorkload, k, with_bias) -> Dict[str, Any]:
    """The DRAM model (:func:`dram_bytes`) of the points ``k``."""
    k2 = wl.kernel_h * wl.kernel_w
    rows = _clipped_sum(geo.oh, k.tile_h, wl.stride_h, wl.kernel_h, wl.pad_h, wl.height)
    cols = _clipped_sum(geo.ow, k.tile_w, wl.stride_w, wl.kernel_w, wl.pad_w, wl.width)
    steps = geo.cbg // k.tile_ci
    inp = geo.nb * (geo.ob // k.tile_co) * steps * _inp_blocks_per_step(geo, k) * rows * cols \
        * cfg.inp_elem_bytes
    # the caches sit at the outer reduction loop, inside the tile's batch loop (weights reloaded
    # per batch block) -- unless there is a single input-channel block: then they sit at the store
    # point and the tile_b batch blocks share the weight tile
    wgt_rounds = geo.nb // k.tile_b if geo.cbg == 1 else geo.nb
    tiles_hw = (geo.oh // k.tile_h) * (geo.ow // k.tile_w)
    wgt = wgt_rounds * tiles_hw * geo.ob * geo.cbg * k2 * cfg.wgt_elem_bytes
    acc = geo.nb * geo.ob * tiles_hw * cfg.acc_elem_bytes * int(with_bias)
    out = geo.nb * geo.ob * geo.oh * geo.ow * cfg.out_elem_bytes
    inp_once, wgt_once = _reused(geo, k)
    return {"inp_load_nbytes": _where(inp_once, inp // 2, inp),
            "wgt_load_nbytes": _where(wgt_once, wgt // 2, wgt),
            "acc_load_nbytes": acc, "out_store_nbytes": out}


def dram_bytes(cfg: VTAConfig, wl: Conv2dWorkload, knobs: Conv2dKnobs,
               with_bias: bool = True) -> Dict[str, int]:
    """Exact DRAM bytes the conv2d schedule with ``knobs`` loads and stores (module docstring).

    Parameters
    ----------
    cfg : VTAConfig
        Configuration.
    wl : Conv2dWorkload
        Layer (a ``groups`` attribute is honoured).
    knobs : Conv2dKnobs
        Schedule knobs (``reuse`` halves the shared tile's loads).
    with_bias : bool or int
        Whether the epilogue loads a bias into the accumulator; an int counts the per-channel
        tensors it loads (bias and multiplier, :func:`~.epilogue.vector_stages`).

    Returns
    -------
    dict
        Bytes per simulator counter (:data:`BYTE_COUNTERS`).
    """
    cfg = load_config(cfg)
    return {c: int(v) for c, v in _dram(cfg, _geometry(cfg, wl), wl, knobs, with_bias).items()}


def _sram(geo: _Geometry, wl: Conv2dWorkload, k, with_bias) -> Dict[str, Any]:
    threads = k.oc_nthread * k.h_nthread
    win = window_size(k.tile_h, wl.kernel_h, wl.stride_h) * \
        window_size(k.tile_w, wl.kernel_w, wl.stride_w)
    inp = k.tile_b * _inp_blocks_per_step(geo, k) * win
    wgt = k.tile_co * k.tile_ci * wl.kernel_h * wl.kernel_w
    acc = k.tile_b * k.tile_co * (k.tile_h * k.tile_w + int(with_bias))
    return {"inp": inp * threads, "wgt": wgt * threads, "acc": acc * threads}


def sram_usage(cfg: VTAConfig, wl: Conv2dWorkload, knobs: Conv2dKnobs,
               with_bias: bool = True) -> Dict[str, int]:
    """On-chip entries the schedule allocates (all virtual threads), per scratchpad (``inp``,
    ``wgt``, ``acc``), as the lowering allocates them."""
    return {n: int(v) for n, v in _sram(_geometry(cfg, wl), wl, knobs, with_bias).items()}


def _kernel(geo: _Geometry, wl: Conv2dWorkload, k) -> Tuple[Any, Any]:
    """``(micro-ops, largest folded loop)`` of one reduction step's GEMM kernel: of its non-unit
    loops ``(tile_ci, tile_w, KW, KH, tile_co, tile_h)``, outermost first (``tile_co`` as groups x
    blocks per group when a group conv2d tile spans several groups), the two outermost fold into
    the instruction, the others are unrolled (0: nothing folded)."""
    span = _group_span(geo, k)
    several = span > 1
    loops = [k.tile_ci, k.tile_w, wl.kernel_w, wl.kernel_h, _where(several, span, k.tile_co),
             _where(several, geo.opg, 1), k.tile_h]
    uops, folded, seen = 1, 0, 0
    for e in loops:
        big = e > 1
        uops = uops * _where(big & (seen >= 2), e, 1)
        folded = _where(big & (seen < 2), _max(folded, e), folded)
        seen = seen + big
    return uops, folded


def gemm_uops(cfg: VTAConfig, wl: Conv2dWorkload, knobs: Conv2dKnobs) -> int:
    """Micro-ops of the GEMM kernel of one reduction step: of its non-unit loops ``(tile_ci,
    tile_w, KW, KH, tile_co, tile_h)`` (``tile_co`` as groups x blocks per group when a group conv2d
    tile spans several groups) the two outermost are folded into the instruction, the others
    unrolled."""
    return int(_kernel(_geometry(load_config(cfg), wl), wl, knobs)[0])


def total_gemm_uops(cfg: VTAConfig, wl: Conv2dWorkload) -> int:
    """GEMM micro-ops a stock conv2d (or group conv2d) program of ``wl`` runs in all, whatever
    its tiling: every (batch block, output block, input block of its group, output pixel, filter
    tap) once."""
    geo = _geometry(cfg, wl)
    return geo.nb * geo.ob * geo.cbg * geo.oh * geo.ow * wl.kernel_h * wl.kernel_w


def output_blocks(cfg: VTAConfig, wl: Conv2dWorkload) -> int:
    """Accumulator entries a stock conv2d (or group conv2d) program of ``wl`` produces in all,
    whatever its tiling: every (batch block, output block, output pixel) once. Each is reset once
    (one reset per tile, before its reduction) and passes once through every ALU stage of the
    epilogue."""
    geo = _geometry(cfg, wl)
    return geo.nb * geo.ob * geo.oh * geo.ow


def _insns(geo: _Geometry, k, n_alu: int) -> Any:
    tiles = (geo.nb // k.tile_b) * (geo.ob // k.tile_co) * (geo.oh // k.tile_h) * \
        (geo.ow // k.tile_w)
    inp_loads = _inp_blocks_per_step(geo, k) // _where(_reused(geo, k)[0], 2, 1)
    return tiles * (k.tile_b * (geo.cbg // k.tile_ci) * (inp_loads + 2) + 2 + n_alu +
                    k.tile_b * k.tile_co)


def estimate_insns(cfg: VTAConfig, wl: Conv2dWorkload, knobs: Conv2dKnobs, n_alu: int = 3) -> int:
    """A rough instruction count (tie-breaker): per output tile and batch block, per reduction step
    the input loads, a weight load and a GEMM; per tile a reset, a bias load, the ALU stages and
    ``tile_b * tile_co`` stores."""
    return int(_insns(_geometry(cfg, wl), knobs, n_alu))


def _model(cfg: VTAConfig, geo: _Geometry, wl: Conv2dWorkload, k, with_bias, n_alu: int
           ) -> Dict[str, Any]:
    """Every modelled figure of the points ``k``: ``sram``, ``uops``, ``folded``, ``bytes``,
    ``insns``."""
    uops, folded = _kernel(geo, wl, k)
    return {"sram": _sram(geo, wl, k, with_bias), "uops": uops, "folded": folded,
            "bytes": _dram(cfg, geo, wl, k, with_bias), "insns": _insns(geo, k, n_alu)}


def _structural_checks(geo: _Geometry, k) -> List[Tuple[Any, Callable]]:
    """``(violated, why)`` of each condition the template needs to realise the points ``k``, in the
    order they are reported; ``why(at)`` is the reason text, ``at`` reading a value at the point."""
    co_tiles, h_tiles = geo.ob // k.tile_co, geo.oh // k.tile_h
    out = [(co_tiles % k.oc_nthread != 0, lambda at: (
                f"oc_nthread={at(k.oc_nthread)} must divide (O/BLOCK_OUT)/tile_co = "
                f"{at(co_tiles)}")),
           (h_tiles % k.h_nthread != 0, lambda at: (
               f"h_nthread={at(k.h_nthread)} must divide OH/tile_h = {at(h_tiles)}")),
           (k.reuse & (k.oc_nthread * k.h_nthread != 2), lambda at: (
               "reuse=True (reuse-aware double buffering) needs exactly two virtual threads "
               f"(oc_nthread * h_nthread == 2), got oc_nthread={at(k.oc_nthread)}, "
               f"h_nthread={at(k.h_nthread)}"))]
    if geo.groups > 1:
        per_group = geo.opg // k.tile_co
        out += [((k.tile_co % geo.opg != 0) & (geo.opg % k.tile_co != 0), lambda at: (
                    f"tile_co={at(k.tile_co)} with {geo.opg} output-channel blocks per group: an "
                    f"output-channel tile must hold whole groups (tile_co a multiple of {geo.opg}) "
                    f"or lie inside one group (tile_co a divisor of {geo.opg})")),
                ((k.tile_co < geo.opg) & (per_group % k.oc_nthread != 0), lambda at: (
                    f"oc_nthread={at(k.oc_nthread)} with tile_co={at(k.tile_co)}: the "
                    f"{at(per_group)} output-channel tiles of a group must split evenly over the "
                    "threads (a thread's tiles must stay inside one group)"))]
    return out


def _fit_checks(cfg: VTAConfig, m: Mapping[str, Any]) -> List[Tuple[Any, Callable]]:
    """``(violated, why)`` of the limits the points of the model ``m`` (:func:`_model`) must fit
    -- the scratchpads, the micro-op budget, the loop fields -- in the order they are reported."""
    out = []
    for name in ("inp", "wgt", "acc"):
        depth, used = scratchpad(cfg, MemType[name.upper()]).depth, m["sram"][name]
        out.append((used > depth, lambda at, name=name, used=used, depth=depth: (
            f"the {name} tiles need {at(used)} entries (all virtual threads), more than the {name} "
            f"scratchpad's {depth}")))
    budget = gemm_kernel_uop_budget(cfg)
    out.append((m["uops"] > budget, lambda at: (
        f"the GEMM kernel of {at(m['uops'])} micro-ops exceeds half the micro-op buffer ({budget}; "
        "the reset and GEMM kernels must fit together)")))
    out.append((m["folded"] > MAX_LOOP_EXTENT, lambda at: (
        f"a folded GEMM loop of {at(m['folded'])} iterations exceeds the 14-bit loop field "
        f"(max {MAX_LOOP_EXTENT})")))
    return out


def _first_reason(checks: Sequence[Tuple[Any, Callable]]) -> Optional[str]:
    """The reason of the first violated check of one point (None if none is)."""
    for violated, why in checks:
        if violated:
            return why(int)
    return None


def _structural_reason(geo: _Geometry, k: Conv2dKnobs) -> Optional[str]:
    """Why the template cannot realise the point ``k`` of the domain (None if it can)."""
    return _first_reason(_structural_checks(geo, k))


def _rank_key(total_bytes, insns, k) -> Tuple:
    """TPS order (smallest first): fewest modelled bytes, then fewest estimated instructions, then
    two virtual threads (load/compute overlap) before one before four, then the knob tuple."""
    threads = k.oc_nthread * k.h_nthread
    return (total_bytes, insns, _where(threads == 2, 0, _where(threads == 1, 1, 2)),
            k.tile_b, k.tile_h, k.tile_w, k.tile_ci, k.tile_co, k.oc_nthread, k.h_nthread)


def _rank(c: TilingChoice) -> Tuple:
    """The TPS order of one valid point (:func:`_rank_key`)."""
    return _rank_key(c.total_bytes, c.insns, _knobs_as_conv2d(c.knobs))


def _choice(wl: GemmWorkload, k: Conv2dKnobs, m: Mapping[str, Any], candidates: int = 0
            ) -> TilingChoice:
    return TilingChoice(_knobs_for(wl, k), {c: int(v) for c, v in m["bytes"].items()},
                        int(m["insns"]), {n: int(v) for n, v in m["sram"].items()}, int(m["uops"]),
                        candidates)


# ------------------------------------------------------------------------------------------------
# the space
# ------------------------------------------------------------------------------------------------
def knob_domain(cfg: Union[VTAConfig, str], wl: GemmWorkload) -> Dict[str, Tuple[Any, ...]]:
    """The values each knob ranges over (the original AutoTVM space), in its workload's terms.

    Split knobs range over the divisors of their axis, the thread knobs over {1, 2}, ``reuse``
    over {False, True}.
    """
    cfg = load_config(cfg)
    geo = _geometry(cfg, _as_conv2d(cfg, wl))
    dom = {"tile_b": tuple(_divisors(geo.nb)), "tile_h": tuple(_divisors(geo.oh)),
           "tile_w": tuple(_divisors(geo.ow)), "tile_ci": tuple(_divisors(geo.cbg)),
           "tile_co": tuple(_divisors(geo.ob)), "oc_nthread": _THREADS, "h_nthread": _THREADS,
           "reuse": (False, True)}
    if isinstance(wl, DenseWorkload):
        for name in ("tile_h", "tile_w", "h_nthread"):
            dom.pop(name)
    return dom


def _axis_text(geo: _Geometry, name: str) -> str:
    return {"tile_b": f"N/BATCH = {geo.nb}", "tile_h": f"OH = {geo.oh}", "tile_w": f"OW = {geo.ow}",
            "tile_ci": (f"(C/groups)/BLOCK_IN = {geo.cbg}" if geo.groups > 1 else
                        f"C/BLOCK_IN = {geo.cbg}"),
            "tile_co": f"O/BLOCK_OUT = {geo.ob}"}[name]


#: the axes of the grid, in enumeration order (the flat index is C order over them; ``tile_co``
#: before ``tile_ci``, the order of the original enumeration)
_GRID_AXES = ("tile_b", "tile_h", "tile_w", "tile_co", "tile_ci", "oc_nthread", "h_nthread")


@dataclass(frozen=True, eq=False)
class TilingGrid:
    """The model of every point of a GEMM template's knob space at once (:func:`tiling_grid`).

    The points are the product of the knob values over :data:`_GRID_AXES` (a dense layer's
    ``h_nthread`` only 1), ``reuse`` set on the two-thread points of a ``reuse`` space; a point's
    flat index (C order) is its position in the enumeration :func:`knob_space` and
    :func:`pruned_points` follow.

    Attributes
    ----------
    workload : Conv2dWorkload, GroupConv2dWorkload or DenseWorkload
        The layer (its knobs are given in its own terms).
    values : tuple of tuple of int
        The values of each axis of :data:`_GRID_AXES`.
    reuse : bool
        Whether the two-thread points have reuse-aware double buffering.
    reason : numpy.ndarray
        Per point, the index of the first violated check (-1: valid).
    index : numpy.ndarray
        The flat indices of the valid points, in enumeration order.
    bytes, sram : dict of numpy.ndarray
        Per valid point (aligned with ``index``): modelled DRAM bytes per counter, entries per
        scratchpad.
    total_bytes, insns, uops : numpy.ndarray
        Per valid point: all modelled bytes, estimated instructions, GEMM micro-ops.
    """

    workload: GemmWorkload
    values: Tuple[Tuple[int, ...], ...]
    reuse: bool
    reason: Any
    index: Any
    bytes: Dict[str, Any]
    sram: Dict[str, Any]
    total_bytes: Any
    insns: Any
    uops: Any
    checks: Tuple[Tuple[Any, Callable], ...] = field(repr=False, default=())

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(len(v) for v in self.values)

    def __len__(self) -> int:
        return int(self.reason.size)

    @property
    def count(self) -> int:
        """Number of valid points."""
        return int(self.index.size)

    def __repr__(self) -> str:
        return (f"TilingGrid({self.workload}, {self.count} valid of {len(self)} points"
                f"{', reuse' if self.reuse else ''})")

    @property
    def reused(self) -> Any:
        """Per point: whether it has reuse-aware double buffering (a two-thread point of a
        ``reuse`` space)."""
        oc, h = (np.asarray(v, dtype=np.int64) for v in self.values[-2:])
        return np.broadcast_to((oc[:, None] * h[None, :] == 2) & self.reuse, self.shape).reshape(-1)

    def _axis_values(self, indices) -> Dict[str, Any]:
        """The values of the points at the flat ``indices`` on each axis (arrays)."""
        at = np.unravel_index(np.asarray(indices, dtype=np.int64), self.shape)
        return {a: np.asarray(v, dtype=np.int64)[i] for a, v, i in zip(_GRID_AXES, self.values, at)}

    def _columns(self, indices) -> Dict[str, List]:
        """The knob values of the points at the flat ``indices``, per Conv2dKnobs field."""
        cols = self._axis_values(indices)
        reuse = (cols["oc_nthread"] * cols["h_nthread"] == 2) & self.reuse
        return {**{a: c.tolist() for a, c in cols.items()}, "reuse": reuse.tolist()}

    def points(self, indices) -> List[Dict[str, Any]]:
        """The knobs of the points at the flat ``indices`` as dicts of the workload's knob type's
        fields (what a tuner records)."""
        cols = self._columns(indices)
        names = [f.name for f in fields(_knob_type(self.workload))]
        return [dict(zip(names, row)) for row in zip(*[cols[n] for n in names])]

    def knobs(self, indices) -> List[GemmKnobs]:
        """The knobs of the points at the flat ``indices``, in the workload's own terms."""
        cols = self._columns(indices)
        knob_type = _knob_type(self.workload)
        return [knob_type(*row) for row in zip(*[cols[f.name] for f in fields(knob_type)])]

    def choices(self, valid=None, candidates: int = 0) -> List[TilingChoice]:
        """The valid points at the positions ``valid`` of :attr:`index` (all by default) with their
        modelled costs."""
        j = np.arange(self.count) if valid is None else np.asarray(valid, dtype=np.int64)
        nbytes = {c: v[j].tolist() for c, v in self.bytes.items()}
        sram = {n: v[j].tolist() for n, v in self.sram.items()}
        insns, uops = self.insns[j].tolist(), self.uops[j].tolist()
        return [TilingChoice(k, {c: v[i] for c, v in nbytes.items()}, insns[i],
                             {n: v[i] for n, v in sram.items()}, uops[i], candidates)
                for i, k in enumerate(self.knobs(self.index[j]))]

    def why(self, index: int) -> str:
        """Why the point at flat ``index`` is pruned (the reason :func:`evaluate` gives)."""
        check = int(self.reason[index])
        if check < 0:
            raise ValueError(f"point {index} of {self!r} is valid; it has no reason to be pruned")
        local = np.unravel_index(int(index), self.shape)

        def at(v) -> int:
            if not isinstance(v, np.ndarray):
                return int(v)
            return int(v[tuple(i if n > 1 else 0 for i, n in zip(local, v.shape))])
        return self.checks[check][1](at)

    def tps(self) -> Optional[int]:
        """The position in :attr:`index` of the TPS point (the first valid point in
        :func:`_rank_key` order), or None if no point is valid."""
        return self._tps

    @cached_property
    def _tps(self) -> Optional[int]:
        if not self.count:
            return None
        keys = _rank_key(self.total_bytes, self.insns,
                         _KnobArrays(**self._axis_values(self.index), reuse=None))
        return int(np.lexsort([np.broadcast_to(key, self.index.shape) for key in keys[::-1]])[0])


def _knob_type(wl: GemmWorkload) -> type:
    return DenseKnobs if isinstance(wl, DenseWorkload) else Conv2dKnobs


def _build_grid(cfg: VTAConfig, wl: GemmWorkload, with_bias: int, n_alu: int, reuse: bool
                ) -> TilingGrid:
    cwl = _as_conv2d(cfg, wl)
    geo = _geometry(cfg, cwl)
    dom = knob_domain(cfg, cwl)
    if isinstance(wl, DenseWorkload):
        dom["h_nthread"] = (1,)
    values = tuple(tuple(dom[a]) for a in _GRID_AXES)
    shape = tuple(len(v) for v in values)
    axes = {}
    for i, (a, v) in enumerate(zip(_GRID_AXES, values)):
        axes[a] = np.asarray(v, dtype=np.int64).reshape([-1 if j == i else 1
                                                         for j in range(len(shape))])
    k = _KnobArrays(**axes, reuse=bool(reuse) & (axes["oc_nthread"] * axes["h_nthread"] == 2))
    m = _model(cfg, geo, cwl, k, with_bias, n_alu)
    checks = _structural_checks(geo, k) + _fit_checks(cfg, m)
    reason = np.full(shape, -1, dtype=np.int8)
    for i, (violated, _) in enumerate(checks):     # the first violated check of each point
        reason[(reason < 0) & violated] = i
    reason = reason.reshape(-1)
    index = np.flatnonzero(reason < 0)

    def flat(v):
        return np.broadcast_to(np.asarray(v, dtype=np.int64), shape).reshape(-1)[index]
    nbytes = {c: flat(v) for c, v in m["bytes"].items()}
    return TilingGrid(wl, values, bool(reuse), reason, index, nbytes,
                      {n: flat(v) for n, v in m["sram"].items()}, sum(nbytes.values()),
                      flat(m["insns"]), flat(m["uops"]), tuple(checks))


#: the grids of the last workloads (:func:`tiling_grid`), least recently used first
_GRIDS: "OrderedDict[tuple, TilingGrid]" = OrderedDict()
_GRIDS_SIZE = 256
_GRIDS_LOCK = threading.Lock()


def tiling_grid(cfg: Union[VTAConfig, str], wl: GemmWorkload, epilogue=(), reuse: bool = False
                ) -> TilingGrid:
    """The model of every point of the knob space of ``wl`` on ``cfg``, computed with numpy over the
    whole domain (the figures :func:`evaluate` gives per point, with no Python loop over the
    points).

    Grids are memoised per configuration value, workload, the epilogue's per-channel tensor and
    ALU instruction counts (what the model sees of an epilogue), and ``reuse``; the least recently
    used are dropped beyond ``_GRIDS_SIZE`` keys. Parameters are those of :func:`knob_space`.

    Raises
    ------
    Conv2dRefusal
        If the template does not implement the workload.
    """
    cfg = load_config(cfg)
    ep = normalize_epilogue(epilogue)
    key = (tuple(cfg.to_dict().values()), wl, len(vector_stages(ep)), alu_count(cfg, ep),
           bool(reuse))
    with _GRIDS_LOCK:
        grid = _GRIDS.get(key)
        if grid is not None:
            _GRIDS.move_to_end(key)
            return grid
    grid = _build_grid(cfg, wl, key[2], key[3], key[4])
    with _GRIDS_LOCK:
        _GRIDS[key] = grid
        while len(_GRIDS) > _GRIDS_SIZE:
            _GRIDS.popitem(last=False)
    return grid


def _grid_cache_clear() -> None:
    """Forget every memoised grid (measurements of the grid's own cost)."""
    with _GRIDS_LOCK:
        _GRIDS.clear()


def knob_space(cfg: Union[VTAConfig, str], wl: GemmWorkload, epilogue=(),
               reuse: bool = False) -> List[TilingChoice]:
    """The valid points of the knob space of ``wl`` on ``cfg``, with their modelled costs.

    Parameters
    ----------
    cfg : VTAConfig or str
        Configuration.
    wl : Conv2dWorkload, GroupConv2dWorkload or DenseWorkload
        The layer.
    epilogue : sequence of tuples
        The epilogue (a bias stage adds accumulator traffic and footprint).
    reuse : bool
        Give the two-thread points reuse-aware double buffering.

    Returns
    -------
    list of TilingChoice
        In enumeration order (knobs in the workload's own terms).

    Raises
    ------
    Conv2dRefusal
        If the template does not implement the workload.
    """
    return tiling_grid(cfg, wl, epilogue, reuse).choices()


def pruned_points(cfg: Union[VTAConfig, str], wl: GemmWorkload, epilogue=(),
                  reuse: bool = False) -> List[PrunedPoint]:
    """The points of the knob space that :func:`knob_space` leaves out, each with the reason."""
    grid = tiling_grid(cfg, wl, epilogue, reuse)
    bad = np.flatnonzero(grid.reason >= 0)
    return [PrunedPoint(k, grid.why(i)) for k, i in zip(grid.knobs(bad), bad.tolist())]


def tps_knobs(cfg: Union[VTAConfig, str], wl: GemmWorkload, epilogue=(),
              reuse: bool = False) -> TilingChoice:
    """The Tiling Parameter Search point of ``wl``: the valid point of fewest modelled DRAM bytes.

    Ties are broken by fewer estimated instructions, then by two virtual threads before one before
    four, then by the knob tuple, so the choice is deterministic.

    Parameters are those of :func:`knob_space`.

    Returns
    -------
    TilingChoice
        The chosen knobs with their modelled cost (``candidates`` = size of the valid space).

    Raises
    ------
    Conv2dRefusal
        If no point fits (the workload is too large for the scratchpads) or the template does not
        implement the workload.
    """
    grid = tiling_grid(cfg, wl, epilogue, reuse)
    best = grid.tps()
    if best is None:
        fallback_knobs(cfg, wl, epilogue)      # raises the refusal with the reason
    return grid.choices([best], candidates=grid.count)[0]


def evaluate(cfg: Union[VTAConfig, str], wl: GemmWorkload, epilogue, knobs: GemmKnobs
             ) -> Union[TilingChoice, PrunedPoint]:
    """The model of one point: its :class:`TilingChoice`, or a :class:`PrunedPoint` with the reason.

    Raises
    ------
    KnobError
        If ``knobs`` is not in the domain (:func:`check_knobs`).
    """
    cfg = load_config(cfg)
    cwl = _as_conv2d(cfg, wl)
    k = check_knobs(cfg, wl, knobs, realisable=False)
    ep = normalize_epilogue(epilogue)
    geo = _geometry(cfg, cwl)
    reason = _structural_reason(geo, k)
    if reason is None:
        m = _model(cfg, geo, cwl, k, len(vector_stages(ep)), alu_count(cfg, ep))
        reason = _first_reason(_fit_checks(cfg, m))
    if reason is not None:
        return PrunedPoint(_knobs_for(wl, k), reason)
    return _choice(wl, k, m)


def fallback_knobs(cfg: Union[VTAConfig, str], wl: GemmWorkload, epilogue=()) -> TilingChoice:
    """The original's fallback point (no tuned record): every inner tile 1, one thread.

    Raises
    ------
    Conv2dRefusal
        If even that point does not fit (no tiling fits), or the template does not implement the
        workload.
    """
    point = evaluate(cfg, wl, epilogue, DenseKnobs() if isinstance(wl, DenseWorkload)
                     else Conv2dKnobs())
    if isinstance(point, PrunedPoint):
        raise Conv2dRefusal(f"no tiling of {wl} fits on {load_config(cfg).name!r}: even every "
                            f"inner tile 1 is out: {point.reason}")
    return point


def check_knobs(cfg: Union[VTAConfig, str], wl: GemmWorkload, knobs: GemmKnobs,
                realisable: bool = True) -> Conv2dKnobs:
    """Validate explicit knobs of ``wl`` and return them as :class:`Conv2dKnobs`.

    Checks that every knob is in its domain (:func:`knob_domain`) and, with ``realisable``, that
    the template can realise the point (thread counts, ``reuse``, group tiles). Whether the tiles
    fit the scratchpads is left to the lowering.

    Raises
    ------
    KnobError
        Naming the knob and its valid values (or why the combination cannot be realised).
    """
    cfg = load_config(cfg)
    cwl = _as_conv2d(cfg, wl)
    expected = DenseKnobs if isinstance(wl, DenseWorkload) else Conv2dKnobs
    if isinstance(wl, DenseWorkload) and isinstance(knobs, Conv2dKnobs):
        knobs = conv2d_knobs_as_dense(knobs)
    if not isinstance(knobs, expected):
        raise KnobError(f"expected {expected.__name__} for {type(wl).__name__}, got "
                        f"{type(knobs).__name__}")
    k = _knobs_as_conv2d(knobs)
    geo = _geometry(cfg, cwl)
    dom = knob_domain(cfg, cwl)
    for name in _SPLITS:
        value = check_int_knob(name, getattr(k, name))
        if value not in dom[name]:
            raise KnobError(f"knob {name}={value} does not divide {_axis_text(geo, name)}; valid "
                            f"{name}: {', '.join(map(str, dom[name]))}")
    for name in ("oc_nthread", "h_nthread"):
        value = getattr(k, name)
        if value not in _THREADS or isinstance(value, bool):
            raise KnobError(f"knob {name}={value!r}; valid {name}: 1, 2")
    if not isinstance(k.reuse, bool):
        raise KnobError(f"knob reuse={k.reuse!r}; valid reuse: False, True")
    if realisable:
        reason = _structural_reason(geo, k)
        if reason is not None:
            raise KnobError(f"knobs {knobs}: {reason}")
    return k


def resolve_knobs(cfg: Union[VTAConfig, str], wl: GemmWorkload, epilogue, knobs: Any
                  ) -> Tuple[Conv2dKnobs, bool]:
    """The ``knobs`` argument of a GEMM ``build_<op>`` as ``(Conv2dKnobs, explicit)``.

    ``None`` or ``"tps"``: :func:`tps_knobs`; ``"tps-reuse"``: TPS with reuse-aware double
    buffering; ``"fallback"``: :func:`fallback_knobs`; a knob dataclass or a dict of its fields:
    explicit knobs, validated by :func:`check_knobs` (``explicit`` is then True: if their tiles do
    not fit, the build fails with a :class:`KnobError` instead of refusing).

    Raises
    ------
    KnobError
        For an unknown preset name (the message lists the valid ones) or invalid explicit knobs.
    Conv2dRefusal
        If a preset finds no point that fits.
    """
    cfg = load_config(cfg)
    knob_type = DenseKnobs if isinstance(wl, DenseWorkload) else Conv2dKnobs
    if isinstance(wl, DenseWorkload) and isinstance(knobs, Conv2dKnobs):
        knobs = conv2d_knobs_as_dense(knobs)
    presets = {"tps": lambda: tps_knobs(cfg, wl, epilogue).knobs,
               "tps-reuse": lambda: tps_knobs(cfg, wl, epilogue, reuse=True).knobs,
               "fallback": lambda: fallback_knobs(cfg, wl, epilogue).knobs}
    explicit = knobs is not None and not isinstance(knobs, str)
    chosen = knobs_from(knobs, knob_type, presets)
    return check_knobs(cfg, wl, chosen, realisable=True), explicit
