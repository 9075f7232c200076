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
* :func:`fallback_knobs` -- the original's fallback (every inner tile 1, one thread);
* :func:`check_knobs` -- validate explicit knobs (a :class:`~vta_ext.templates.errors.KnobError`
  naming the knob and its valid values);
* :func:`resolve_knobs` -- the ``knobs`` argument of a ``build_<op>`` to explicit knobs.

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

import itertools
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple, Union

from ..config import VTAConfig, load_config
from ..isa import MemType
from ..layout import MAX_LOOP_EXTENT
from ..memory import scratchpad
from .epilogue import alu_count, normalize_epilogue, vector_stages
from .errors import Conv2dRefusal, KnobError
from .knobs import (Conv2dKnobs, DenseKnobs, check_int_knob, conv2d_knobs_as_dense,
                    dense_knobs_as_conv2d, knobs_from)
from .workload import (Conv2dWorkload, DenseWorkload, check_conv2d_workload, check_dense_workload,
                       dense_as_conv2d, groups_of, window_size)

__all__ = ["TilingChoice", "PrunedPoint", "BYTE_COUNTERS", "knob_domain", "knob_space",
           "pruned_points", "tps_knobs", "fallback_knobs", "check_knobs", "resolve_knobs",
           "evaluate", "dram_bytes", "sram_usage", "gemm_uops", "estimate_insns", "group_span"]

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
# the model of one point
# ------------------------------------------------------------------------------------------------
def _group_span(geo: _Geometry, k: Conv2dKnobs) -> int:
    return max(1, k.tile_co // geo.opg) if geo.groups > 1 else 1


def group_span(cfg: VTAConfig, wl: Conv2dWorkload, knobs: Conv2dKnobs) -> int:
    """Groups one output-channel tile of ``knobs`` spans (1 for a plain conv2d, or a tile inside
    one group)."""
    return _group_span(_geometry(cfg, wl), knobs)


def _inp_blocks_per_step(geo: _Geometry, k: Conv2dKnobs) -> int:
    """Input-channel blocks one reduction step loads: the interval from the first group's to the
    last group's ``tile_ci`` blocks of the output-channel tile."""
    return (_group_span(geo, k) - 1) * geo.cbg + k.tile_ci


def _inp_shared(geo: _Geometry, k: Conv2dKnobs) -> bool:
    """Whether the two ``oc_nthread`` threads load the same input tile (same group)."""
    return geo.groups == 1 or k.tile_co < geo.opg


def _reused(geo: _Geometry, k: Conv2dKnobs) -> Tuple[bool, bool]:
    """``(input, weight)``: which tile reuse-aware double buffering loads once."""
    if not (k.reuse and k.oc_nthread * k.h_nthread == 2):
        return False, False
    return k.oc_nthread == 2 and _inp_shared(geo, k), k.h_nthread == 2


def _clipped_sum(n_out: int, tile: int, stride: int, kernel: int, pad: int, size: int) -> int:
    """Sum over the ``n_out / tile`` tiles of the input rows (or columns) a tile's window reads
    inside the image ``[0, size)``."""
    win = window_size(tile, kernel, stride)
    total = 0
    for t in range(n_out // tile):
        lo = t * tile * stride - pad
        total += max(0, min(lo + win, size) - max(lo, 0))
    return total


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
    geo = _geometry(cfg, wl)
    k = knobs
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
    return {"inp_load_nbytes": inp // 2 if inp_once else inp,
            "wgt_load_nbytes": wgt // 2 if wgt_once else wgt,
            "acc_load_nbytes": acc, "out_store_nbytes": out}


def sram_usage(cfg: VTAConfig, wl: Conv2dWorkload, knobs: Conv2dKnobs,
               with_bias: bool = True) -> Dict[str, int]:
    """On-chip entries the schedule allocates (all virtual threads), per scratchpad (``inp``,
    ``wgt``, ``acc``), as the lowering allocates them."""
    geo = _geometry(cfg, wl)
    k = knobs
    threads = k.oc_nthread * k.h_nthread
    win = window_size(k.tile_h, wl.kernel_h, wl.stride_h) * \
        window_size(k.tile_w, wl.kernel_w, wl.stride_w)
    inp = k.tile_b * _inp_blocks_per_step(geo, k) * win
    wgt = k.tile_co * k.tile_ci * wl.kernel_h * wl.kernel_w
    acc = k.tile_b * k.tile_co * (k.tile_h * k.tile_w + int(with_bias))
    return {"inp": inp * threads, "wgt": wgt * threads, "acc": acc * threads}


def _gemm_loops(geo: _Geometry, wl: Conv2dWorkload, k: Conv2dKnobs) -> List[int]:
    """Extents of the non-unit loops of one reduction step's GEMM kernel, outermost first."""
    span = _group_span(geo, k)
    co = [span, geo.opg] if span > 1 else [k.tile_co]
    loops = [k.tile_ci, k.tile_w, wl.kernel_w, wl.kernel_h, *co, k.tile_h]
    return [e for e in loops if e > 1]


def gemm_uops(cfg: VTAConfig, wl: Conv2dWorkload, knobs: Conv2dKnobs) -> int:
    """Micro-ops of the GEMM kernel of one reduction step: of its non-unit loops ``(tile_ci,
    tile_w, KW, KH, tile_co, tile_h)`` (``tile_co`` as groups x blocks per group when a group conv2d
    tile spans several groups) the two outermost are folded into the instruction, the others
    unrolled."""
    n = 1
    for e in _gemm_loops(_geometry(load_config(cfg), wl), wl, knobs)[2:]:
        n *= e
    return n


def estimate_insns(cfg: VTAConfig, wl: Conv2dWorkload, knobs: Conv2dKnobs, n_alu: int = 3) -> int:
    """A rough instruction count (tie-breaker): per output tile and batch block, per reduction step
    the input loads, a weight load and a GEMM; per tile a reset, a bias load, the ALU stages and
    ``tile_b * tile_co`` stores."""
    geo = _geometry(cfg, wl)
    k = knobs
    tiles = (geo.nb // k.tile_b) * (geo.ob // k.tile_co) * (geo.oh // k.tile_h) * \
        (geo.ow // k.tile_w)
    inp_loads = _inp_blocks_per_step(geo, k) // (2 if _reused(geo, k)[0] else 1)
    return tiles * (k.tile_b * (geo.cbg // k.tile_ci) * (inp_loads + 2) + 2 + n_alu +
                    k.tile_b * k.tile_co)


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


def _structural_reason(geo: _Geometry, k: Conv2dKnobs) -> Optional[str]:
    """Why the template cannot realise the point ``k`` of the domain (None if it can)."""
    if (geo.ob // k.tile_co) % k.oc_nthread:
        return (f"oc_nthread={k.oc_nthread} must divide (O/BLOCK_OUT)/tile_co = "
                f"{geo.ob // k.tile_co}")
    if (geo.oh // k.tile_h) % k.h_nthread:
        return f"h_nthread={k.h_nthread} must divide OH/tile_h = {geo.oh // k.tile_h}"
    if k.reuse and k.oc_nthread * k.h_nthread != 2:
        return ("reuse=True (reuse-aware double buffering) needs exactly two virtual threads "
                f"(oc_nthread * h_nthread == 2), got oc_nthread={k.oc_nthread}, "
                f"h_nthread={k.h_nthread}")
    if geo.groups > 1:
        if k.tile_co % geo.opg and geo.opg % k.tile_co:
            return (f"tile_co={k.tile_co} with {geo.opg} output-channel blocks per group: an "
                    f"output-channel tile must hold whole groups (tile_co a multiple of {geo.opg}) "
                    f"or lie inside one group (tile_co a divisor of {geo.opg})")
        per_group = geo.opg // k.tile_co
        if k.tile_co < geo.opg and per_group % k.oc_nthread:
            return (f"oc_nthread={k.oc_nthread} with tile_co={k.tile_co}: the {per_group} "
                    "output-channel tiles of a group must split evenly over the threads (a "
                    "thread's tiles must stay inside one group)")
    return None


def _fit_reason(cfg: VTAConfig, geo: _Geometry, wl: Conv2dWorkload, k: Conv2dKnobs,
                use: Dict[str, int], uops: int) -> Optional[str]:
    """Why the point ``k`` does not fit the scratchpads, the micro-op budget or the loop fields."""
    for name in ("inp", "wgt", "acc"):
        depth = scratchpad(cfg, MemType[name.upper()]).depth
        if use[name] > depth:
            return (f"the {name} tiles need {use[name]} entries (all virtual threads), more than "
                    f"the {name} scratchpad's {depth}")
    budget = cfg.uop_depth // 2
    if uops > budget:
        return (f"the GEMM kernel of {uops} micro-ops exceeds half the micro-op buffer ({budget}; "
                "the reset and GEMM kernels must fit together)")
    folded = _gemm_loops(geo, wl, k)[:2]
    if any(e > MAX_LOOP_EXTENT for e in folded):
        return (f"a folded GEMM loop of {max(folded)} iterations exceeds the 14-bit loop field "
                f"(max {MAX_LOOP_EXTENT})")
    return None


def _points(cfg: VTAConfig, wl: Conv2dWorkload, reuse: bool, dense: bool
            ) -> Iterator[Conv2dKnobs]:
    """The domain's points in conv2d terms (a dense layer's have ``h_nthread = 1``)."""
    geo = _geometry(cfg, wl)
    for tb, th, tw, tco, tci, ocn, hn in itertools.product(
            _divisors(geo.nb), _divisors(geo.oh), _divisors(geo.ow), _divisors(geo.ob),
            _divisors(geo.cbg), _THREADS, (1,) if dense else _THREADS):
        yield Conv2dKnobs(tb, th, tw, tci, tco, ocn, hn, reuse=bool(reuse and ocn * hn == 2))


def _classify(cfg: VTAConfig, wl: GemmWorkload, epilogue, reuse: bool
              ) -> Iterator[Tuple[Conv2dKnobs, Optional[TilingChoice], Optional[str]]]:
    """Every point of the space as ``(knobs, choice, None)`` or ``(knobs, None, reason)``."""
    cwl = _as_conv2d(cfg, wl)
    ep = normalize_epilogue(epilogue)
    with_bias = len(vector_stages(ep))
    n_alu = alu_count(cfg, ep)
    geo = _geometry(cfg, cwl)
    for k in _points(cfg, cwl, reuse, isinstance(wl, DenseWorkload)):
        reason = _structural_reason(geo, k)
        if reason is None:
            use = sram_usage(cfg, cwl, k, with_bias)
            uops = gemm_uops(cfg, cwl, k)
            reason = _fit_reason(cfg, geo, cwl, k, use, uops)
        if reason is not None:
            yield k, None, reason
            continue
        yield k, TilingChoice(_knobs_for(wl, k), dram_bytes(cfg, cwl, k, with_bias),
                              estimate_insns(cfg, cwl, k, n_alu), use, uops), None


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
    cfg = load_config(cfg)
    return [c for _, c, _ in _classify(cfg, wl, epilogue, reuse) if c is not None]


def pruned_points(cfg: Union[VTAConfig, str], wl: GemmWorkload, epilogue=(),
                  reuse: bool = False) -> List[PrunedPoint]:
    """The points of the knob space that :func:`knob_space` leaves out, each with the reason."""
    cfg = load_config(cfg)
    return [PrunedPoint(_knobs_for(wl, k), r) for k, _, r in _classify(cfg, wl, epilogue, reuse)
            if r is not None]


def _rank(c: TilingChoice) -> Tuple:
    """TPS order: fewest modelled bytes, then fewest estimated instructions, then two virtual
    threads (load/compute overlap) before one before four, then the knob tuple."""
    k = _knobs_as_conv2d(c.knobs)
    threads = k.oc_nthread * k.h_nthread
    return (c.total_bytes, c.insns, {2: 0, 1: 1}.get(threads, 2),
            (k.tile_b, k.tile_h, k.tile_w, k.tile_ci, k.tile_co, k.oc_nthread, k.h_nthread))


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
    cfg = load_config(cfg)
    space = knob_space(cfg, wl, epilogue, reuse)
    if not space:
        fallback_knobs(cfg, wl, epilogue)      # raises the refusal with the reason
    best = min(space, key=_rank)
    return TilingChoice(best.knobs, best.bytes, best.insns, best.sram, best.uops, len(space))


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
        use = sram_usage(cfg, cwl, k, len(vector_stages(ep)))
        uops = gemm_uops(cfg, cwl, k)
        reason = _fit_reason(cfg, geo, cwl, k, use, uops)
    if reason is not None:
        return PrunedPoint(_knobs_for(wl, k), reason)
    return TilingChoice(_knobs_for(wl, k), dram_bytes(cfg, cwl, k, len(vector_stages(ep))),
                        estimate_insns(cfg, cwl, k, alu_count(cfg, ep)), use, uops)


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
