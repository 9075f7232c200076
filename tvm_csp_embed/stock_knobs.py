"""The knob point ``csp-relaxed`` builds the stock templates' GEMM programs at.

The ``stock`` strategy builds every template at its TPS point (fewest modelled DRAM bytes that
fit, :func:`vta_ext.templates.tiling.tps_knobs`): the original stack's point, and the baseline. It
is often one virtual thread, so loads and compute do not overlap. ``csp-relaxed`` plays AutoTVM's
part of tuning the free loops, and builds the stock-template programs it keeps (the stock plan of
a conv2d, group conv2d or dense chosen against the embeddings or fallen back to, and the
block-diagonal GEMM program of a depthwise conv2d, :mod:`.depthwise`) at a searched point:

* the points: the TPS point and its two-thread variants (:func:`neighbourhood`): the thread
  knobs of one of :data:`THREAD_SETS` (``h_nthread``, ``oc_nthread`` or both) set to 2, with up to
  one inner tile halved per thread knob set (reuse-aware double buffering as TPS has it); only those the
  template's model says fit (:func:`vta_ext.templates.tiling.evaluate`);
* the search (:func:`searched_point`): TPS is built and timed on the cycle model, then, of each
  thread set, the first :data:`SEARCHED` points in the TPS order (fewest DRAM bytes first; each
  costs a build); a point whose lower bound (:func:`~.choice.stock_cycles_bound`) is not below
  the best timed is not built. The fewest
  cycles win, TPS on a tie, so the point is never slower on the cycle model than TPS. Those
  points are decided before any is built and timed lowest bound first, with a bound that sees
  the tiling (:func:`tiled_bound`: within 1 % of the cycles of MobileNetV2's block-diagonal
  points), and one that cannot beat the best timed is not built: the same point wins;
* the descent (:func:`_descend`): when the best point has at most :data:`FEW_TILES` output tiles
  per virtual thread, its loads, compute and stores hardly overlap (the first tile's loads and the
  last tile's store are exposed: DenseNet-121's 1x992x7x7 per-channel conv has two tiles at TPS),
  so the search tries, with each thread set, the next smaller output-channel tile that divides the
  blocks, and goes on while the cycles go down (one build a step).

The result (knobs, its cycles and TPS's) is kept in memory and on disk (``stock_points/`` in the
cache directory, keyed by the configuration's value, the stock workload, the epilogue's shape,
:func:`~vta_ext.templates.epilogue.epilogue_shape`, and the code, :func:`~.cache.source_digest`), so a warm build neither builds nor times the
points again. Under any other knobs option (``tps``, ``fallback``, explicit knobs, tuned records)
nothing is searched.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from vta_ext.errors import TemplateRefusal
from vta_ext.templates.errors import KnobError

from .cache import _write, cache_dir, source_digest
from .choice import STOCK_COMPARED, stock_cycles_bound

__all__ = ["SEARCHED", "SEARCH_VERSION", "THREAD_SETS", "FEW_TILES", "tiles_per_thread", "SearchedPoint", "StockSearch",
           "neighbourhood", "thread_set", "searched_point", "lowest_bound", "tiled_bound", "searches"]

#: points built and timed beyond TPS, at most, of each thread set: the first variant (fewest DRAM
#: bytes) was within 0.4 % of the best of the first five on ResNet-18 C2-C11, MobileNet D1-D9 and
#: every fourth DeepBench row, on default and pipelined, and each point costs a build
SEARCHED = 1
#: the search's format: bump it when the neighbourhood or the rule changes (it keys the caches)
SEARCH_VERSION = 5
#: a point with at most this many output tiles per virtual thread is refined by :func:`_descend`
FEW_TILES = 2
#: the sets of thread knobs a variant sets to 2 (both at once: loads overlap compute along both
#: the rows and the output channels; DenseNet-121's 1x1 depthwise convs on ``pipelined`` run 8 %
#: faster there than at either alone), and the inner tiles it may halve
THREAD_SETS = (("h_nthread",), ("oc_nthread",), ("h_nthread", "oc_nthread"))
TILES = ("tile_h", "tile_w", "tile_co", "tile_ci")

_MEMO: Dict[str, "SearchedPoint"] = {}
#: :func:`neighbourhood`'s points and :func:`lowest_bound`'s bound by :func:`_memo_key`
_NEIGHBOURHOODS: Dict[tuple, List[Dict[str, Any]]] = {}
_BOUNDS: Dict[tuple, Optional[float]] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class SearchedPoint:
    """The point a stock template's program is built at under ``csp-relaxed``."""

    #: the knobs, as ``(name, value)`` pairs of the template's knob dataclass
    knobs: Tuple[Tuple[str, Any], ...]
    #: its cycles on the cycle model, and the TPS point's
    cycles: int
    tps_cycles: int
    #: points built and timed, and points in the neighbourhood (with those the descent timed)
    timed: int
    points: int
    #: why the points were timed in TPS order, one after the other ("" when they were not)
    note: str = ""

    def text(self, strategy: str) -> str:
        """The build report's words for the knobs' origin."""
        changed = " ".join(f"{k}={v}" for k, v in self.knobs if v not in (1, False)) or "all 1"
        gain = (f"{self.cycles:,} cycles against {self.tps_cycles:,} at TPS"
                if self.cycles < self.tps_cycles else f"TPS kept, {self.cycles:,} cycles")
        return (f"knobs searched by {strategy} ({changed}): {gain}; {self.timed} of "
                f"{self.points} points around TPS timed on the cycle model"
                + (f" ({self.note})" if self.note else ""))


@dataclass(frozen=True)
class StockSearch:
    """The point search of one operator's stock program, as the plan and the choice use it."""

    config: Any
    #: the stock template's workload, and the operator's epilogue
    workload: Any
    epilogue: Tuple[tuple, ...]
    #: ``place(knobs)``: the workload the plan builds at ``knobs`` (``(name, value)`` pairs)
    place: Callable[[Tuple[Tuple[str, Any], ...]], Any]
    #: ``cycles_of(workload)``: the cycle model's count of that workload's program, built under
    #: the key the plan builds it with
    cycles_of: Callable[[Any], int]

    @property
    def key(self) -> list:
        """What the caches key a contender's search by: the search's format and size."""
        return ["searched", SEARCH_VERSION, SEARCHED]

    def point(self) -> SearchedPoint:
        """The searched point (:func:`searched_point`)."""
        return searched_point(self.config, self.workload, self.epilogue,
                              lambda knobs: self.cycles_of(self.place(tuple(sorted(knobs.items())))))

    def placed(self) -> Any:
        """The workload the plan builds: at the searched point."""
        return self.place(self.point().knobs)

    def bound(self) -> Optional[float]:
        """A lower bound on the program's cycles at the searched point (:func:`lowest_bound`)."""
        return lowest_bound(self.config, self.workload, self.epilogue)


def _memo_key(config, workload, epilogue: Sequence[tuple]) -> tuple:
    """What :func:`neighbourhood` and :func:`lowest_bound` depend on: the configuration's value,
    the workload and the epilogue."""
    from vta_ext.executor import config_digest

    return config_digest(config), workload, tuple(tuple(stage) for stage in epilogue)


def neighbourhood(config, workload, epilogue: Sequence[tuple]) -> List[Dict[str, Any]]:
    """The TPS point of the stock GEMM ``workload`` and its two-thread variants that fit, TPS
    first, the variants in the TPS order (fewest modelled DRAM bytes, then fewest instructions).

    Each fitting point is evaluated by the template's model once per process (kept in
    :data:`_NEIGHBOURHOODS`; the choice's bound and the search both ask for it); the caller gets
    its own copies.

    Raises
    ------
    TemplateRefusal
        When no point fits (the template's own refusal; not kept).
    """
    key = _memo_key(config, workload, epilogue)
    points = _NEIGHBOURHOODS.get(key)
    if points is None:
        points = _NEIGHBOURHOODS[key] = _neighbourhood(config, workload, epilogue)
    return [dict(k) for k in points]


def _neighbourhood(config, workload, epilogue: Sequence[tuple]) -> List[Dict[str, Any]]:
    """:func:`neighbourhood`'s work."""
    from vta_ext.templates import tiling

    tps = tiling.tps_knobs(config, workload, epilogue).knobs
    base = dataclasses.asdict(tps)
    seen = {tuple(sorted(base.items()))}
    variants = []
    tiles = [t for t in TILES if t in base]
    for threads in (t for t in THREAD_SETS if all(name in base for name in t)):
        # up to one inner tile halved per thread knob set (a thread splits its loop in two)
        for halves in (h for n in range(len(threads) + 1) for h in itertools.combinations(tiles, n)):
            k = dict(base, **{name: 2 for name in threads})
            if any(base[t] % 2 for t in halves):
                continue
            k.update({t: base[t] // 2 for t in halves})
            key = tuple(sorted(k.items()))
            if key in seen:
                continue
            seen.add(key)
            try:
                res = tiling.evaluate(config, workload, epilogue, type(tps)(**k))
            except KnobError:
                continue
            if isinstance(res, tiling.TilingChoice):
                variants.append((res.total_bytes, res.insns, len(variants), k))
    return [base] + [k for *_, k in sorted(variants, key=lambda v: v[:3])]


def thread_set(knobs: Dict[str, Any]) -> Tuple[str, ...]:
    """The thread knobs ``knobs`` sets above 1 (an entry of :data:`THREAD_SETS`, or ``()``)."""
    return tuple(name for name in sorted({n for t in THREAD_SETS for n in t})
                 if knobs.get(name, 1) > 1)


def _bound(config, workload, epilogue, knobs) -> Optional[float]:
    """:func:`~.choice.stock_cycles_bound` of ``workload`` built with ``knobs``."""
    return stock_cycles_bound(config, "", SimpleNamespace(epilogue=tuple(epilogue)),
                              SimpleNamespace(workload=workload), knobs)


def tiled_bound(config, workload, epilogue, knobs: Dict[str, Any]) -> Optional[float]:
    """A lower bound on the cycles of the stock conv2d program of ``workload`` at ``knobs`` that
    sees its tiling, for a group conv2d of one input block a group (the block-diagonal depthwise
    programs) at a point of two or more virtual threads without reuse-aware double buffering;
    None otherwise. (The plain conv2d template may reset the accumulator before a tile's loads, so
    the resets can overlap them: DenseNet-121's 1x1 convs on ``pipelined`` run up to 0.27 % under
    this sum.)

    Such a program's loop runs, per iteration, the loads of each thread's tile, their computes,
    then their stores; the compute module pushes the tokens that free the input buffers for the
    next iteration only after the last thread's compute (``vta_ext.lower.sync``'s back edge,
    replicated per thread after the stores). So the first thread's loads of every iteration lie
    between two iterations' computes on the critical path, and the last tile's store after the
    last compute: the bound is the compute term of :func:`~.choice.stock_cycles_bound` (its
    FINISH replaced by the last store where that is longer) plus, per iteration
    (:func:`tiles_per_thread`), one tile's loads (:func:`vta_ext.templates.tiling.tile_dma_floor`)
    and the token latencies, and between iterations the NOP that pushes the token."""
    from vta_ext.sim.cycles import timing
    from vta_ext.templates import tiling
    from vta_ext.templates.workload import GroupConv2dWorkload

    iterations = tiles_per_thread(config, workload, knobs)
    threads = knobs.get("h_nthread", 1) * knobs.get("oc_nthread", 1)
    if (threads < 2 or iterations is None or not isinstance(workload, GroupConv2dWorkload)
            or workload.in_channels // workload.groups != config.BLOCK_IN):
        return None
    knob_type = type(tiling.tps_knobs(config, workload, epilogue).knobs)
    dma = tiling.tile_dma_floor(config, workload, knob_type(**knobs))
    compute = stock_cycles_bound(config, "", SimpleNamespace(epilogue=tuple(epilogue)),
                                 SimpleNamespace(workload=workload))
    if dma is None or compute is None:
        return None
    load, store = dma
    t = timing(config)
    return (compute - t.finish + iterations * (load + 2 * t.token) - t.token
            + (iterations - 1) * t.nop + max(t.finish, t.token + store))


def lowest_bound(config, workload, epilogue: Sequence[tuple]) -> Optional[float]:
    """A lower bound on the cycles of ``workload``'s program at any point of its
    :func:`neighbourhood` (the least of their bounds), so at the point :func:`searched_point`
    takes; None when the bound is not known. Kept per process (:data:`_BOUNDS`)."""
    key = _memo_key(config, workload, epilogue)
    if key not in _BOUNDS:
        try:
            points = neighbourhood(config, workload, epilogue)
        except TemplateRefusal:
            return None
        bounds = [_bound(config, workload, epilogue, k) for k in points]
        _BOUNDS[key] = None if any(b is None for b in bounds) else min(bounds)
    return _BOUNDS[key]


def _key(config, workload, epilogue) -> str:
    from vta_ext.executor import config_digest
    from vta_ext.templates.epilogue import epilogue_shape

    text = json.dumps({"v": SEARCH_VERSION, "searched": SEARCHED, "config": config_digest(config),
                       "workload": [type(workload).__name__, dataclasses.asdict(workload)],
                       "epilogue": epilogue_shape(config, epilogue), "code": source_digest()},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def searched_point(config, workload, epilogue: Sequence[tuple],
                   cycles: Callable[[Dict[str, Any]], int]) -> SearchedPoint:
    """The point the stock GEMM template's program of ``workload`` is built at (module
    docstring), from the caches or searched now.

    Parameters
    ----------
    config : VTAConfig
    workload : Conv2dWorkload, GroupConv2dWorkload or DenseWorkload
        The stock template's workload.
    epilogue : sequence of tuples
    cycles : callable
        ``cycles(knobs)``: the cycle model's count of the program built at the knob dict
        ``knobs`` (a :class:`KnobError` or :class:`TemplateRefusal` drops the point). The caller
        builds it under the key it will build the chosen point with, so that point is built once.

    Raises
    ------
    TemplateRefusal
        When the TPS point does not build (the template refuses the workload).
    """
    key = _key(config, workload, epilogue)
    with _LOCK:
        hit = _MEMO.get(key)
    if hit is not None:
        return hit
    path = cache_dir() / "stock_points" / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        hit = SearchedPoint(tuple((k, v) for k, v in data["knobs"]), int(data["cycles"]),
                            int(data["tps_cycles"]), int(data["timed"]), int(data["points"]),
                            str(data.get("note", "")))
    except (OSError, ValueError, KeyError, TypeError):
        hit = _search(config, workload, epilogue, cycles)
        _write(path, {"knobs": [list(kv) for kv in hit.knobs], "cycles": hit.cycles,
                      "tps_cycles": hit.tps_cycles, "timed": hit.timed, "points": hit.points,
                      "note": hit.note})
    with _LOCK:
        _MEMO[key] = hit
    return hit


def _search(config, workload, epilogue, cycles) -> SearchedPoint:
    """The module docstring's search. The points it times are decided before any is built
    (:func:`_members`); they are timed lowest lower bound (:func:`_lower`) first, and a point
    whose bound shows it cannot beat the best timed (fewer cycles, or as many and earlier in the
    TPS order) is not built. The point found is the one the rule in TPS order finds (the fewest
    cycles, the earliest on a tie); where the members cannot be decided before building, or a
    member does not build, the points are timed in TPS order (:func:`_search_in_order`) and the
    report says why."""
    points = neighbourhood(config, workload, epilogue)
    tps_cycles = cycles(points[0])   # refuses as the template does
    members = _members(config, workload, epilogue, points, tps_cycles)
    if isinstance(members, str):
        return _search_in_order(config, workload, epilogue, cycles, points, tps_cycles, members)
    best, best_cycles, timed = 0, tps_cycles, 1
    for bound, i in sorted((bound, i) for i, bound in members.items()):
        if bound > best_cycles or (bound == best_cycles and i > best):
            continue     # cannot win: not built
        try:
            c = cycles(points[i])
        except (KnobError, TemplateRefusal) as err:
            return _search_in_order(config, workload, epilogue, cycles, points, tps_cycles,
                                    f"timed in TPS order: {points[i]} does not build ({err})")
        timed += 1
        if (c, i) < (best_cycles, best):
            best, best_cycles = i, c
    return _described(config, workload, epilogue, cycles, points, points[best], best_cycles,
                      tps_cycles, timed)


def _lower(config, workload, epilogue, knobs: Dict[str, Any]) -> Optional[float]:
    """The greater of :func:`_bound` and :func:`tiled_bound` at ``knobs`` (None if neither is
    known)."""
    bounds = [b for b in (_bound(config, workload, epilogue, knobs),
                          tiled_bound(config, workload, epilogue, knobs)) if b is not None]
    return max(bounds) if bounds else None


def _members(config, workload, epilogue, points: List[Dict[str, Any]], tps_cycles: int):
    """The points beyond TPS the search in TPS order (:func:`_search_in_order`) times, by index,
    with their lower bounds (:func:`_lower`, -inf if unknown), decided without building them: a
    point is timed there unless its thread set already has :data:`SEARCHED` points or its
    :func:`_bound` is not below the best timed before it, which lies between TPS's cycles and the
    least bound of the points timed before it. A point not built is taken to build (it fits the
    template's model, :func:`neighbourhood`; one that is built and does not makes the search time
    the points in TPS order). A string says why it cannot be decided so."""
    members: Dict[int, float] = {}
    per_set: Dict[Tuple[str, ...], int] = {}
    floor = tps_cycles
    for i, k in enumerate(points[1:], 1):
        threads = thread_set(k)
        if per_set.get(threads, 0) >= SEARCHED:
            continue
        old = _bound(config, workload, epilogue, k)
        if old is not None and old >= tps_cycles:
            continue     # not below TPS's cycles, so not below the best timed
        if old is not None and old >= floor:
            return (f"timed in TPS order: whether {k} is timed depends on the cycles of the "
                    "points before it")
        lower = _lower(config, workload, epilogue, k)
        members[i] = float("-inf") if lower is None else lower
        per_set[threads] = per_set.get(threads, 0) + 1
        floor = min(floor, members[i])
    return members


def _search_in_order(config, workload, epilogue, cycles, points: List[Dict[str, Any]],
                     tps_cycles: int, note: str) -> SearchedPoint:
    """The search timing the points in TPS order (module docstring), ``note`` saying why."""
    best, best_cycles = points[0], tps_cycles
    timed = 1
    per_set: Dict[Tuple[str, ...], int] = {}
    for k in points[1:]:
        threads = thread_set(k)
        if per_set.get(threads, 0) >= SEARCHED:
            continue
        bound = _bound(config, workload, epilogue, k)
        if bound is not None and bound >= best_cycles:
            continue
        try:
            c = cycles(k)
        except (KnobError, TemplateRefusal):
            continue
        timed += 1
        per_set[threads] = per_set.get(threads, 0) + 1
        if c < best_cycles:
            best, best_cycles = k, c
    return _described(config, workload, epilogue, cycles, points, best, best_cycles, tps_cycles,
                      timed, note)


def _described(config, workload, epilogue, cycles, points, best: Dict[str, Any], best_cycles: int,
               tps_cycles: int, timed: int, note: str = "") -> SearchedPoint:
    """The :class:`SearchedPoint` of the best point after the descent (:func:`_descend`)."""
    best, best_cycles, steps = _descend(config, workload, epilogue, cycles, best, best_cycles)
    return SearchedPoint(tuple(sorted(best.items())), best_cycles, tps_cycles, timed + steps,
                         len(points) + steps, note)


def tiles_per_thread(config, workload, knobs: Dict[str, Any]) -> Optional[int]:
    """Output tiles each virtual thread of the conv2d program at ``knobs`` computes (None for a
    workload or knobs without an output-channel and a row tile, a dense program)."""
    if not all(k in knobs for k in ("tile_co", "tile_h", "tile_w")) or not hasattr(workload, "out_height"):
        return None
    ceil = lambda a, b: -(-a // b)  # noqa: E731
    tiles = (ceil(_channel_blocks(config, workload), knobs["tile_co"]) * ceil(workload.out_height, knobs["tile_h"])
             * ceil(workload.out_width, knobs["tile_w"]) * ceil(workload.batch, knobs.get("tile_b", 1)))
    return ceil(tiles, knobs.get("oc_nthread", 1) * knobs.get("h_nthread", 1))


def _channel_blocks(config, workload) -> int:
    """Output-channel blocks of ``workload`` (channels padded to ``BLOCK_OUT``)."""
    return -(-workload.out_channels // config.BLOCK_OUT)


def _descend(config, workload, epilogue, cycles, best: Dict[str, Any], best_cycles: int
             ) -> Tuple[Dict[str, Any], int, int]:
    """The module docstring's descent from ``best``: ``(point, its cycles, points timed)``."""
    from vta_ext.templates import tiling

    few = tiles_per_thread(config, workload, best)
    if few is None or few > FEW_TILES:
        return best, best_cycles, 0
    blocks = _channel_blocks(config, workload)
    start, timed = dict(best), 0
    for threads in THREAD_SETS:
        point = dict(start, **{name: 2 if name in threads else 1 for name in ("h_nthread", "oc_nthread")})
        last = best_cycles
        for tile in sorted((d for d in range(1, start["tile_co"]) if blocks % d == 0), reverse=True):
            k = dict(point, tile_co=tile)
            try:
                knobs, _ = tiling.resolve_knobs(config, workload, epilogue, k)
                if not isinstance(tiling.evaluate(config, workload, epilogue, knobs),
                                  tiling.TilingChoice):
                    continue
                c = cycles(k)
            except (KnobError, TemplateRefusal):
                continue
            timed += 1
            if c >= last:
                break
            last = c
            if c < best_cycles:
                best, best_cycles = k, c
    return best, best_cycles, timed


def searches(policy, mode: str) -> bool:
    """Whether an operator built with the knobs ``policy`` (:meth:`vta_ext.BuildOptions.knobs_for`:
    a tuned record, explicit knobs or a policy name) under the constraint set ``mode`` searches
    its stock program's point: under ``cycles`` (the default policy) and the constraint set that
    compares the stock template (:data:`~.choice.STOCK_COMPARED`, ``csp-relaxed``)."""
    return mode in STOCK_COMPARED and isinstance(policy, str) and policy == "cycles"
