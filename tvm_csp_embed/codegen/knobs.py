"""The knob space over the loops an embedding leaves free, its cost model, and TPS.

Knobs of a packed GEMM (:class:`~.plan.PackedGemm`), as a plain dict (what records hold):

* ``tile_<loop>`` for every free spatial loop of the output and every tile loop of a dim walked by
  the reduction axis z: the inner factor of its split (a divisor of its extent). The output tile
  computed per store point is the product of the spatial tiles; the reduction tiles say how many
  z-blocks one load step brings in;
* ``vt_<loop>`` in {1, 2}: virtual threads over the outer tiles of the first output-channel loop
  and of the first image-row loop (the original's ``oc_nthread`` / ``h_nthread``);
* ``order`` in {0, ..., 5}: the loop order of the output tiles and which operand stays resident
  (:func:`~.loops.loop_orders`): 0 the stock rule (both caches loaded at every load step; the
  default, also when a record has no ``order``), 1 weight-resident (output-channel tiles outer,
  the weight tile loaded once per output-channel tile and reused by every spatial tile below),
  2 data-resident (output-channel tiles innermost, the data tile loaded once per spatial tile and
  reused by every output-channel tile). A resident tile holds the whole reduction of its tile.
  3, 4, 5 (relaxed embeddings with a plain loop and a z tile loop, :func:`_has_batch_inner`):
  0, 1, 2 with the plain loops inside the load point (:func:`~.loops.batch_inner`).

A point is **pruned** when the schedule cannot realise it (a thread count that does not
divide the outer loop, an order with no loop to hold its operand) or when it does not fit: the
tiles of all virtual threads (a resident tile counted at its hoisted size) overflow the
``inp``/``wgt``/``acc`` scratchpad (:func:`vta_ext.memory.scratchpad`), the GEMM micro-op kernel
exceeds half the micro-op buffer, or a folded GEMM loop exceeds the 14-bit loop field
(:data:`vta_ext.layout.MAX_LOOP_EXTENT`).

:func:`evaluate` models a point: scratchpad entries as the stock model counts them (as the lowering
allocates them, except that a batch tile counts whole even where the lowering allocates one batch
block), GEMM micro-ops,
and the DRAM bytes the schedule loads and stores, per simulator counter. For the stock family the
model is the stock template's (``vta_ext.templates.tiling.dram_bytes``) count, derived here from the
packed operands' index expressions. :func:`tps_point` is the Tiling Parameter Search: the valid
point with the fewest modelled DRAM bytes (ties: fewer estimated instructions, two threads before one
before four, then the knob values).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from vta_ext.templates.epilogue import GEMM_BIAS_STAGE

from .loops import BATCH_INNER, ORDERS, batch_inner, loop_orders, tiled_loops, vt_loops
from .plan import AXIS_PREFIX, PackedGemm
from .schedule import acc_init_of

__all__ = ["KnobPoint", "Pruned", "KnobGrid", "knob_names", "knob_domain", "knob_defaults",
           "check_point", "evaluate", "enumerate_points", "knob_grid", "cached_grid", "search",
           "tps_point", "cycle_point", "seed_tps_point", "reused_operands", "reuse_pays",
           "fallback_point", "compute_work", "BYTE_COUNTERS", "ORDER_KNOB"]

#: the loop-order knob (values: :data:`~.loops.ORDERS`)
ORDER_KNOB = "order"

#: the simulator counters the DRAM model predicts
BYTE_COUNTERS = ("inp_load_nbytes", "wgt_load_nbytes", "acc_load_nbytes", "out_store_nbytes")


@dataclass(frozen=True)
class KnobPoint:
    """A valid point with its model.

    Attributes
    ----------
    knobs : dict
    bytes : dict
        Modelled DRAM bytes per counter (:data:`BYTE_COUNTERS`).
    sram : dict
        Scratchpad entries (``inp``, ``wgt``, ``acc``), all virtual threads (batch-like tiles
        counted whole, as the stock model does).
    uops : int
        Micro-ops of the GEMM kernel of one load step.
    insns : int
        Estimated instruction count (tie-breaker only).
    cycles : int
        Estimated cycles of the program (:func:`_load_busy`, :func:`_module_busy`,
        :func:`_pipeline`): the cycle model's instruction durations summed per module and combined
        by the schedule's overlap.
    """

    knobs: Dict[str, int]
    bytes: Dict[str, int]
    sram: Dict[str, int]
    uops: int
    insns: int
    cycles: int = 0

    @property
    def total_bytes(self) -> int:
        """Sum of the modelled load and store bytes."""
        return sum(self.bytes.values())


@dataclass(frozen=True)
class Pruned:
    """A point of the domain that is not valid, and why."""

    knobs: Dict[str, int]
    reason: str


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def knob_names(pg: PackedGemm) -> Tuple[str, ...]:
    """The knob names of ``pg`` (module docstring)."""
    return (tuple(f"tile_{n}" for n in tiled_loops(pg)) + tuple(f"vt_{n}" for n in vt_loops(pg))
            + (ORDER_KNOB,))


def knob_domain(pg: PackedGemm) -> Dict[str, Tuple[int, ...]]:
    """Values of every knob: divisors of the loop extent for tiles, {1, 2} for threads."""
    ext = {lp.name: lp.extent for lp in pg.loops}
    dom = {f"tile_{n}": tuple(_divisors(ext[n])) for n in tiled_loops(pg)}
    dom.update({f"vt_{n}": (1, 2) for n in vt_loops(pg)})
    dom[ORDER_KNOB] = tuple(ORDERS) if _has_batch_inner(pg) else tuple(range(BATCH_INNER))
    return dom


def _has_batch_inner(pg: PackedGemm) -> bool:
    """Whether ``pg`` has the batch-inner orders (:func:`~.loops.batch_inner`): a relaxed
    embedding (``csp-strict`` keeps the stock template's program, so its loop orders), a plain
    loop of more than one iteration and a z tile loop of more than one (without one the caches
    sit at the store point, below the plain loops, in every order: :func:`_inside`)."""
    loops = [lp for lp in pg.loops if lp.extent > 1]
    return (pg.embedding.mode != "strict"
            and any(pg.roles[lp.name] == "plain" for lp in loops)
            and any(pg.roles[lp.name] == "ztile" for lp in loops))


def knob_defaults(pg: PackedGemm) -> Dict[str, int]:
    """The value of every knob a point leaves out: 1 (tile 1, one thread), ``order`` 0 (the stock
    loop order). All defaults together are the original stack's fallback tiling."""
    return {n: (0 if n == ORDER_KNOB else 1) for n in knob_domain(pg)}


def check_point(pg: PackedGemm, knobs: Mapping[str, Any]) -> Dict[str, int]:
    """Validate explicit knobs (missing knobs take :func:`knob_defaults`); return the full point
    (without ``order`` if ``knobs`` has none: that is the stock order, ``order`` 0).

    Raises
    ------
    vta_ext.templates.errors.KnobError
        Naming the knob and its valid values, or why the point cannot be realised.
    """
    from vta_ext.templates.errors import KnobError

    dom = knob_domain(pg)
    unknown = sorted(set(knobs) - set(dom))
    if unknown:
        raise KnobError(f"unknown knob(s) {', '.join(unknown)} for this embedding; valid knobs: "
                        f"{', '.join(dom)}")
    point = {}
    defaults = knob_defaults(pg)
    for name, values in dom.items():
        if name == ORDER_KNOB and name not in knobs:
            continue  # the stock order; the point keeps the caller's keys (records made before
            # the knob existed keep their knobs and their keys)
        v = knobs.get(name, defaults[name])
        if isinstance(v, bool) or not isinstance(v, int) or v not in values:
            raise KnobError(f"knob {name}={v!r}; valid {name}: {', '.join(map(str, values))}")
        point[name] = int(v)
    reason = _structural_reason(pg, point)
    if reason:
        raise KnobError(f"knobs {point}: {reason}")
    return point


def _structural_reason(pg: PackedGemm, k: Mapping[str, int]) -> Optional[str]:
    for violated, why in _structural_checks(pg, k, k.get(ORDER_KNOB, 0)):
        if violated:
            return why(_scalar)
    return None


def _structural_checks(pg: PackedGemm, k: Mapping[str, Any], order: int,
                       threads: Optional[List[tuple]] = None) -> List[tuple]:
    """``(violated, why)`` of the structural conditions of a point (or of a grid of points, with
    numpy arrays as knob values): ``violated`` is a bool or a bool array, ``why(at)`` the reason
    with the values ``at`` extracts. ``threads``: :func:`_thread_checks` of ``pg`` and ``k`` if
    the caller has them (no order changes them)."""
    out = list(_thread_checks(pg, k) if threads is None else threads)
    orders = loop_orders(pg, order)
    if orders.resident is not None and orders.resident_at is None:
        out.append((True, lambda at: f"order={order} ({ORDERS[order]}) needs an outer loop above the "
                                     f"other operand's tiles to hold the resident tile, and this "
                                     f"embedding has none"))
    return out


def _thread_checks(pg: PackedGemm, k: Mapping[str, Any]) -> List[tuple]:
    """The conditions of :func:`_structural_checks` on the virtual threads: a thread count divides
    its loop's outer tiles."""
    ext = {lp.name: lp.extent for lp in pg.loops}
    out = []
    for n in vt_loops(pg):
        t, tile = k[f"vt_{n}"], k[f"tile_{n}"]
        outer = ext[n] // tile
        out.append((outer % t != 0, lambda at, n=n, t=t, outer=outer:
                    f"vt_{n}={at(t)} must divide {n}'s outer tiles ({ext[n]}/tile_{n} = {at(outer)})"))
    return out


def _scalar(v) -> int:
    return int(v)


# ------------------------------------------------------------------------------------ the model
# Every function of the model takes knob values that are ints (one point) or numpy integer arrays
# that broadcast against each other (a grid of points, :func:`search`); the arithmetic is the same.
def _anchored(pg: PackedGemm) -> bool:
    """Whether the input caches of ``pg`` sit at the load point of a z tile loop (one of more
    than one iteration), below the store point, rather than at the store point."""
    return any(lp.extent > 1 for lp in pg.loops if pg.roles[lp.name] == "ztile")


def _inside(pg: PackedGemm, k: Mapping[str, Any], inner: bool = False) -> Dict[str, Tuple[Any, Any]]:
    """Loop -> ``(outer count, inner extent)`` relative to the load point of the input caches;
    ``inner``: the plain loops sit inside it (:func:`~.loops.batch_inner`)."""
    anchored = _anchored(pg)
    out = {}
    for lp in pg.loops:
        role, e = pg.roles[lp.name], lp.extent
        if role == "reduce":
            out[lp.name] = (1, e)
        elif (role == "shared" or (role == "plain" and not inner)) and anchored:
            out[lp.name] = (e, 1)
        else:
            t = k[f"tile_{lp.name}"]
            out[lp.name] = (e // t, t)
    for ax, size in pg.axes.items():
        out[AXIS_PREFIX + ax] = (1, size)
    return out


def _inside_resident(pg: PackedGemm, k: Mapping[str, Any], outer: Sequence[str], at: str
                     ) -> Dict[str, Tuple[Any, Any]]:
    """Loop -> ``(outer count, inner extent)`` relative to a resident cache computed at the outer
    loop ``at``: the output loops down to ``at`` keep their tiles, every loop below it is whole
    (its virtual threads, split outermost, still count as outer iterations; the resident operand
    does not see those loops), the reductions are whole."""
    vts = set(vt_loops(pg))
    above = set(outer[:list(outer).index(at) + 1])
    out = {}
    for lp in pg.loops:
        n, e = lp.name, lp.extent
        if n in above:
            out[n] = (e // k[f"tile_{n}"], k[f"tile_{n}"])
        else:
            t = k[f"vt_{n}"] if n in vts else 1
            out[n] = (t, e // t)
    for ax, size in pg.axes.items():
        out[AXIS_PREFIX + ax] = (1, size)
    return out


@functools.lru_cache(maxsize=1 << 16)
def _clipped_sum(dim, outers: Tuple[Tuple[int, int], ...]) -> int:
    """Entries of a DMA-padded dim loaded over all outer iterations, clipped to the stored range;
    ``outers`` is ``(outer count, inner extent)`` of each term's loop."""
    ext = sum(c * (inner - 1) for (_, inner), (_, c) in zip(outers, dim.terms)) + 1
    lo, hi = dim.stored_lo, dim.stored_lo + dim.stored_extent
    total = 0
    for vals in itertools.product(*[range(o) for o, _ in outers]):
        start = dim.const + sum(c * v * inner for v, (_, inner), (_, c) in zip(vals, outers, dim.terms))
        total += max(0, min(start + ext, hi) - max(start, lo))
    return total


def _prod(factors):
    """The product of integer factors (ints or numpy integer arrays): :func:`math.prod`'s value
    without multiplying in its start 1 or a factor that is the int 1 (each of those would be one
    more numpy call on an array)."""
    out = 1
    for x in factors:
        if type(x) is int and x == 1:
            continue
        out = x if type(out) is int and out == 1 else out * x
    return out


def _dim_sum(dim, inside, region=None):
    """Entries of one packed dim loaded over all outer iterations of its loops (clipped to the
    stored range when the DMA pads it); ``region``: :func:`_region` of ``dim`` at ``inside`` if the
    caller has it."""
    if not dim.padded:
        return (_prod(inside[v][0] for v, _ in dim.terms)
                * (_region(dim, inside) if region is None else region))
    pairs = [inside[v] for v, _ in dim.terms]
    flat = [x for pair in pairs for x in pair]
    if not any(isinstance(x, np.ndarray) for x in flat):
        return _clipped_sum(dim, tuple((int(o), int(i)) for o, i in pairs))
    grid = np.broadcast(*flat)       # the loops of this dim only: a few points
    return np.array([_clipped_sum(dim, tuple(zip(vals[::2], vals[1::2])))
                     for vals in (tuple(map(int, point)) for point in grid)],
                    dtype=np.int64).reshape(grid.shape)


def _region(dim, inside):
    """Entries of one packed dim one load brings in: ``1 + sum(c * (inner - 1))`` over its terms
    ``(loop, c)``, with the loops' inner extents in ``inside``. The int terms are summed first and
    the first array term is added as ``c * inner + (sum - c)``: no numpy call for a lone term with
    ``c == 1`` (most dims), at most two per array term (integers: the order changes no value)."""
    span = 1
    for v, c in dim.terms:
        x = inside[v][1]
        if isinstance(span, int):
            step = x if c == 1 else c * x
            span = step if span == c else step + (span - c)
        else:
            span = span + c * (x - 1)
    return span


def _free_dims(op):
    return [d for d in op.dims if not d.terms[0][0].startswith(AXIS_PREFIX)]


def _kernel_extents(pg: PackedGemm, k: Mapping[str, Any], inner: bool = False) -> list:
    ext = {lp.name: lp.extent for lp in pg.loops}
    return [ext[n] if pg.roles[n] == "reduce" else k[f"tile_{n}"]
            for n in loop_orders(pg, BATCH_INNER if inner else 0).kernel]


def _kernel(pg: PackedGemm, k: Mapping[str, Any], inner: bool = False):
    """``(micro-ops, largest folded loop)`` of one load step's GEMM kernel: its first two non-unit
    loops fold into the GEMM instruction's loop fields, the rest are unrolled into micro-ops;
    ``inner``: the batch-inner orders' kernel (:func:`~.loops.batch_inner`)."""
    uops, folded, seen = 1, 0, 0
    for e in _kernel_extents(pg, k, inner):
        big = e > 1
        if big is False:            # a unit loop (an int extent): neither folds nor unrolls
            continue
        uops = uops * np.where(big & (seen >= 2), e, 1)
        folded = np.where(big & (seen < 2), np.maximum(folded, e), folded)
        seen = seen + big
    return uops, folded


def _measure(cfg, pg: PackedGemm, ep: Tuple[tuple, ...], k: Mapping[str, Any], order: int,
             common: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The modelled figures of the points ``k`` under loop order ``order`` (a structurally valid
    order): ``sram`` (entries per scratchpad), ``uops``, ``folded``, ``bytes`` (per counter),
    ``insns``, ``busy``, ``released`` (:func:`_released`, where the late fill does not apply),
    ``late`` (:func:`_late_fill`) and ``cycles``.

    ``common`` is :func:`_order_free` of the same ``pg``, ``ep`` and ``k`` (computed here when
    None): :func:`knob_grid` measures every order of one grid and computes it once.
    """
    c = _order_free(cfg, pg, ep, k, batch_inner(order)) if common is None else common
    orders = loop_orders(pg, order)
    res = orders.resident
    loads, sram, nbytes, insns = c["loads"], c["sram"], c["bytes"], c["insns"]
    if res is not None:
        # the resident operand's cache sits at its outer loop (the other one stays at the load
        # point): its tile, bytes and loads there replace the load point's
        at_res = _inside_resident(pg, k, orders.outer, orders.resident_at)
        mem, counter = ("inp", "inp_load_nbytes") if res == "A" else ("wgt", "wgt_load_nbytes")
        loads = {**loads, res: _operand_loads(cfg, pg, res, at_res, at_res)}
        sram = {**sram, mem: loads[res]["entries"] * c["threads"]}
        nbytes = {**nbytes, counter: loads[res]["nbytes"]}
        # the resident operand's loads leave the load steps: one per iteration of its loop
        a_free = c["a_free"]
        moved = c["a_loads"] if res == "A" else 1
        res_insns = (_prod(_region(d, at_res) for d in a_free[:-2]) if res == "A"
                     and len(a_free) > 2 else 1)
        iters = _prod(at_res[n][0] for n in orders.outer[:orders.outer.index(orders.resident_at) + 1])
        insns = insns + (iters * res_insns - c["stores"] * c["batch"] * c["steps"] * moved)
        # the threads of the loops below the resident operand's also split the store points
        below = [n for n in vt_loops(pg) if n not in orders.outer[:orders.outer.index(orders.resident_at) + 1]]
        runs = iters * _prod(k[f"vt_{n}"] for n in below)
    else:
        runs = c["threads"]
    loads = {role: _shared_once(pg, k, role, c["threads"], loads[role]) for role in "AB"}
    late = _late_fill(pg, k, c)
    plain = _priced(pg, k, order, c, loads, nbytes, res, runs, late)
    # (a tile the threads share already counts once: _shared_once)
    shared = {r: v & ~_loaded_once(pg, k, r, c["threads"], loads[r])
              for r, v in reused_operands(pg, k).items()}
    reuse = False
    if np.any(shared["A"] | shared["B"]):
        twice = _priced(pg, k, order, c, _reused_loads(loads, shared), nbytes, res, runs, late)
        reuse = (shared["A"] | shared["B"]) & (twice["cycles"] <= REUSE_GAIN * plain["cycles"])
        plain = {key: (_where(reuse, twice[key], v) if key != "busy" else
                       {n: np.where(reuse, twice[key][n], x) for n, x in v.items()})
                 for key, v in plain.items()}
    extra = c["bias_gemm"]
    if extra is not None:       # the bias GEMM's operands, loaded at the store point
        sram = {n: v + extra["sram"].get(n, 0) for n, v in sram.items()}
        insns = insns + extra["insns"]
    return {"sram": sram, "uops": c["uops"], "folded": c["folded"], "bytes": plain["bytes"],
            "insns": insns,
            # (the late fill's plan releases the loads itself: release_after_gemm then finds no
            # tile loop that starts with a fill)
            "busy": plain["busy"], "released": _released(c, runs) & ~late, "late": late,
            "reuse": reuse, "cycles": plain["cycles"] + c["fetch"]}


#: reuse-aware double buffering is taken where the estimate prices it at most this share of the
#: cycles without it: it moves a load step after its own thread's GEMM (:func:`_reuse_chain`),
#: which the estimate prices within a few per cent, and on compute-bound points, whose estimate
#: is off by as much, the halved loads changed which point the search took (SqueezeNet 1.1's
#: 1x16x27x27 * 64x16 3x3 on ``pipelined``: 40,353 -> 44,202 cycles when every gain counted)
REUSE_GAIN = 0.95


def _where(cond, a, b):
    if isinstance(a, dict):
        return {n: _where(cond, a[n], b[n]) for n in a}
    return np.where(cond, a, b)


def _priced(pg: PackedGemm, k: Mapping[str, Any], order: int, c: Mapping[str, Any],
            loads: Mapping[str, Mapping[str, Any]], nbytes: Mapping[str, Any], res: Optional[str],
            runs, late) -> Dict[str, Any]:
    """``bytes``, ``busy`` and ``cycles`` (without the fetch) of :func:`_measure`'s points with
    the operands' ``loads`` (:func:`_operand_loads` per operand, the resident one's at its loop;
    a reused operand's halved, :func:`_reused_loads`)."""
    reused = {r: loads[r].get("reused", False) for r in "AB"}
    # each thread's own loads at the load steps (not the resident operand's, not a reused one's)
    own = sum(np.where(reused[r], 0, loads[r]["busy"]) for r in "AB" if r != res)
    nbytes = {**nbytes, "inp_load_nbytes": loads["A"]["nbytes"],
              "wgt_load_nbytes": loads["B"]["nbytes"]}
    load, resident, res_loads = _load_busy(loads, res)
    extra = c["bias_gemm"]
    if extra is not None:       # the bias GEMM's operands, loaded at the store point
        nbytes = {n: v + extra["bytes"].get(n, 0) for n, v in nbytes.items()}
        load = load + extra["busy"]
    busy = {"load": load, "resident": resident, **c["busy"]}
    # (with a bias GEMM its loads and GEMM form a second [loads] [GEMMs] pair per store point,
    # which the late pipeline does not model: the early-release estimate prices it, whose
    # release the late fill's plan also makes)
    priced_late = late if extra is None else False
    cycles = _pipeline(busy, c["pipeline"], res_loads, _streams_weights(pg, k, res, order),
                       _released(c, runs) & ~priced_late, runs, priced_late)
    either = reused["A"] | reused["B"]
    if np.any(either):
        cycles = np.where(either, np.maximum(cycles, _reuse_chain(busy, c["pipeline"], own,
                                                                  priced_late)), cycles)
    return {"bytes": nbytes, "busy": busy, "cycles": cycles}


def reused_operands(pg: PackedGemm, k: Mapping[str, Any]) -> Dict[str, Any]:
    """Per operand (``"A"``, ``"B"``), whether the build loads its tiles once for both threads
    (reuse-aware double buffering, ``build_gemm``'s ``reuse``; a bool, or a bool array over a
    grid): the point has exactly two virtual threads and the operand sees none of the loops that
    carry them (its loads then move the same data in both threads,
    :func:`vta_ext.lower.alloc.shared_buffers`)."""
    vts = vt_loops(pg)
    two = np.asarray(_prod(k[f"vt_{n}"] for n in vts)) == 2
    out = {}
    for role in "AB":
        _, unused = _operand_dims(pg, role)
        seen = [n for n in vts if n not in unused]
        out[role] = two & ~np.asarray(_prod([1] + [k[f"vt_{n}"] for n in seen]) > 1)
    return out


def _reused_loads(loads: Mapping[str, Mapping[str, Any]], reused: Mapping[str, Any]):
    """``loads`` (:func:`_operand_loads` per operand) with a reused operand's
    (:func:`reused_operands`) loads, bytes and busy cycles halved, and ``reused`` set where it is:
    thread 0 loads each of its tiles once for both threads."""
    out = dict(loads)
    for role, shared in reused.items():
        if not np.any(shared):
            continue
        one = loads[role]
        out[role] = {**one, "reused": shared,
                     "nbytes": np.where(shared, one["nbytes"] // 2, one["nbytes"]),
                     "loads": np.where(shared, one["loads"] // 2, one["loads"]),
                     "busy": np.where(shared, one["busy"] / 2, one["busy"])}
    return out


def _reuse_chain(busy, p: Mapping[str, Any], own, late: Any = False):
    """A lower bound on the cycles of a point whose build loads an operand once for both threads
    (:func:`reused_operands`); ``own``: the busy cycles of the loads each thread makes for itself
    at the load steps (all threads). Thread 0 loads the shared tile with its own, and each of its
    load steps still waits for its own GEMM of the step before (the thread's tokens), so thread
    0's loads of a step and its GEMM step run in sequence (the other thread's loads run under that
    GEMM). A group of store points (one per thread) takes ``steps - 1`` of those pairs and then the
    longer of: the last pair, or the last two GEMM steps, the ``t`` epilogues, a store and the
    next fill (the next group's first GEMM waits for them; its first loads run under them). Under
    the late fill (``late``, :func:`_late_fill`) a thread's fill waits for its own store only,
    which runs under the other thread's compute: the last pair alone (the compute module's own
    bound is :func:`_pipeline`'s). Before the first group: the resident operand's loads and one
    load step; after the last, a store."""
    L = p["t"] * busy["load"] / p["per"]      # a load step of both threads
    pair = L - own / p["per"] + p["g"]         # thread 0's loads of a step, then its GEMM step
    last = np.where(late, pair, np.maximum(pair, 2 * p["g"] + p["te"] + p["s"] + p["r"]))
    return busy["resident"] + L + p["st"] * ((p["steps"] - 1) * pair + last) + p["s"]


def _late_fill(pg: PackedGemm, k: Mapping[str, Any], c: Mapping[str, Any]):
    """Whether the lowering re-plans the points' tile loop with each thread's fill after its loads
    (:func:`vta_ext.lower.latefill.late_fill`: a bool, or a bool array over a grid): two or more
    virtual threads, one load step per store point (one z step and no batch loop below the store
    point: the body is ``[fill] [loads] [GEMMs]``, or ``[loads] [fill, GEMMs]`` without a z loop)
    and one tile loop (of more than one iteration per thread) that holds the store points: a tile
    loop inside another keeps the stage-based tokens. Where this is False the lowering may still
    re-plan a loop (the estimate then keeps the stage-based pipeline, which times it slower)."""
    ext = {lp.name: lp.extent for lp in pg.loops}
    vts = set(vt_loops(pg))
    loops = sum(np.asarray(ext[n] // k[f"tile_{n}"] // (k[f"vt_{n}"] if n in vts else 1)) > 1
                for n in pg.c_loops())
    return (np.asarray(c["threads"]) >= 2) & (np.asarray(c["batch"] * c["steps"]) == 1) & (loops == 1)


def _released(c: Mapping[str, Any], runs):
    """Whether :func:`vta_ext.lower.sync.release_after_gemm` moves a token in the program of the
    points (a bool, or a bool array over a grid): the accumulator starts with a fill
    (``c["early"]``, :func:`_releases_early`) and the innermost tile loop, the one whose body
    starts with that fill, has more than one iteration (a loop of one is no loop). Its iterations
    are the store points over the ``runs`` of the loops above it: the virtual threads (split
    outermost) and, with a resident operand, the iterations of the resident operand's loops
    (its load sits before that loop)."""
    if c["early"] is False:
        return False
    return c["early"] & (c["stores"] > runs)


def _streams_weights(pg: PackedGemm, k: Mapping[str, Any], res: Optional[str], order: int):
    """Whether a point streams only the weights between its two threads: the operator's data
    tensor resident (``order`` 2, not the batch-inner 5) and the two threads over the output
    channels (a bool, or a bool array over a grid of points; :func:`_pipeline`)."""
    if res is None or pg.embedding.binding[res] != "data" or batch_inner(order):
        return False
    weight = [n for n in vt_loops(pg) if pg.roles[n] == "weight"]
    if not weight:
        return False
    threads = _prod(k[f"vt_{n}"] for n in vt_loops(pg))
    return (np.asarray(k[f"vt_{weight[0]}"]) == 2) & (np.asarray(threads) == 2)


def _order_free(cfg, pg: PackedGemm, ep: Tuple[tuple, ...], k: Mapping[str, Any],
                inner: bool = False) -> Dict[str, Any]:
    """The figures of the points ``k`` that no loop order changes, with both operands' caches at
    the load point (the stock order; :func:`_measure` replaces the resident operand's figures):
    ``loads`` (:func:`_operand_loads` per operand), ``sram``, ``uops``, ``folded``, ``bytes``,
    ``insns``, ``busy`` (the parts :func:`_module_busy` models), ``pipeline``
    (:func:`_pipeline_terms`), and the counts they come from (``threads``, ``stores``, ``batch``,
    ``steps``, ``a_free``, ``a_loads``)."""
    from vta_ext.sim.cycles import timing
    from vta_ext.templates.epilogue import alu_count, has_bias, simplify_epilogue

    ep = simplify_epilogue(ep)      # the ALU passes the build runs (build_gemm)
    inside = _inside(pg, k, inner)
    # scratchpad entries as the stock model counts them: a batch-like loop's whole tile, also when
    # the caches sit below it (the lowering then allocates less; counting the tile keeps TPS the
    # stock template's policy on the stock family)
    tiled = {**inside, **{n: (1, k[f"tile_{n}"]) for n in pg.c_loops() if pg.roles[n] in ("plain", "shared")}}
    threads = _prod(k[f"vt_{n}"] for n in vt_loops(pg))
    loads = {role: _operand_loads(cfg, pg, role, inside, tiled) for role in "AB"}
    sram = {"inp": loads["A"]["entries"] * threads, "wgt": loads["B"]["entries"] * threads}
    A, C = pg.operands["A"], pg.operands["C"]
    c_loops = pg.c_loops()
    ext = {lp.name: lp.extent for lp in pg.loops}
    ctile = _prod(k[f"tile_{n}"] for n in c_loops)
    bias_tile = _prod(k[f"tile_{n}"] for n in c_loops if n in pg.channel_loops)
    with_bias = has_bias(ep)
    sram["acc"] = (ctile + (bias_tile if with_bias else 0)) * threads
    uops, folded = _kernel(pg, k, inner)
    nbytes = {"inp_load_nbytes": loads["A"]["nbytes"], "wgt_load_nbytes": loads["B"]["nbytes"]}
    stores = _prod(ext[n] // k[f"tile_{n}"] for n in c_loops)
    nbytes["acc_load_nbytes"] = stores * bias_tile * cfg.acc_elem_bytes if with_bias else 0
    nbytes["out_store_nbytes"] = math.prod(d.extent for d in _free_dims(C)) * cfg.out_elem_bytes
    # instructions: per store point and batch step, the load steps (loads + GEMM), reset, ALU, stores
    steps = _prod(inside[lp.name][0] for lp in pg.loops if pg.roles[lp.name] == "ztile")
    batch = _prod(inside[n][0] // (ext[n] // k[f"tile_{n}"]) for n in c_loops
                  if pg.roles[n] in ("plain", "shared"))
    a_free = _free_dims(A)
    a_loads = _prod(_region(d, inside) for d in a_free[:-2]) if len(a_free) > 2 else 1
    c_free = _free_dims(C)
    per_tile_stores = _prod(k[f"tile_{n}"] for n in c_loops[:-2]) if len(c_free) > 2 else 1
    insns = stores * (batch * steps * (a_loads + 2) + 2 + alu_count(cfg, ep) + per_tile_stores)
    busy = _module_busy(cfg, pg, ep, k, nbytes, stores, batch * steps)
    bias_gemm = (_gemm_bias_loads(cfg, stores, bias_tile, threads,
                                  _shared_bias_loads(pg, k, stores, threads))
                 if GEMM_BIAS_STAGE in ep else None)
    t = timing(cfg)
    return {"loads": loads, "sram": sram, "uops": uops, "folded": folded, "bytes": nbytes,
            "insns": insns, "busy": busy,
            "bias_gemm": bias_gemm,
            "pipeline": _pipeline_terms(busy, stores, batch * steps, threads,
                                        0 if bias_gemm is None else bias_gemm["busy"]),
            "threads": threads,
            "early": _releases_early(pg),
            "stores": stores, "batch": batch, "steps": steps, "a_free": a_free, "a_loads": a_loads,
            # the instruction fetch before the modules start (the FINISH instruction, the same
            # on every point and every plan, is left out)
            "fetch": t.fetch}


def _releases_early(pg: PackedGemm) -> bool:
    """Whether a build of ``pg`` releases a store point's first load at the previous one's last
    GEMM where its tile loop allows (:func:`_released`): the builds take
    :func:`vta_ext.lower.sync.release_after_gemm` where the accumulator starts with a fill
    (:func:`~.schedule.acc_init_of`, ``build_gemm``'s ``early_release`` None), and it moves the
    token of a tile loop whose body starts with that fill: the caches sit below it, at the load
    point of a z tile loop (:func:`_inside`; without one they are loaded before the fill)."""
    return acc_init_of(pg) == "fill" and _anchored(pg)


def _gemm_bias_loads(cfg, stores, bias_tile, threads, shared=(False, False)) -> Dict[str, Any]:
    """The loads of a program that adds its bias by a GEMM (:mod:`.biasfold`), per store point:
    the constant row (one ``INP`` entry) and the tile's digit tiles (``bias_tile`` ``WGT``
    entries, one per output channel block), each one LOAD of one row; ``shared`` (the row's,
    the digits', :func:`_shared_bias_loads`): loaded once for all threads instead. ``sram``
    (entries, all threads), ``bytes`` (per counter), ``insns`` (the instructions it adds) and
    ``busy`` (the load module's cycles, :meth:`vta_ext.sim.cycles.DmaCost.cycles`)."""
    from vta_ext.sim.cycles import timing

    t = timing(cfg)
    rows, tiles = (np.where(s, 1, stores) if s is not False else stores for s in shared)
    row, digits = rows * cfg.inp_elem_bytes, tiles * bias_tile * cfg.wgt_elem_bytes
    return {"sram": {"inp": threads, "wgt": bias_tile * threads},
            "bytes": {"inp_load_nbytes": row, "wgt_load_nbytes": digits},
            # the GEMM and the two LOADs in place of the bias's ACC LOAD
            "insns": stores * 2,
            "busy": t.dma("INP").cycles(rows, 1, row) + t.dma("WGT").cycles(tiles, 1, digits)}


def _shared_bias_loads(pg: PackedGemm, k: Mapping[str, Any], stores, threads) -> Tuple[Any, Any]:
    """Whether the build loads the bias GEMM's constant row, and its digit tiles, once for all
    threads (:func:`_shared_once`'s rule; bools or bool arrays over a grid): two or more threads
    of one store point each (the loads sit outside every tile loop); the row is the same for
    every thread, the digit tiles where no thread is on an output-channel loop."""
    once = (np.asarray(threads) >= 2) & (np.asarray(stores) == np.asarray(threads))
    if not once.any():
        return False, False
    split = [k[f"vt_{n}"] for n in vt_loops(pg) if n in pg.channel_loops]
    apart = np.asarray(_prod(split) > 1 if split else False)
    return once, once & ~apart


def _operand_loads(cfg, pg: PackedGemm, role: str, ins: Mapping[str, Tuple[Any, Any]],
                   tiled: Mapping[str, Tuple[Any, Any]]) -> Dict[str, Any]:
    """The loads of operand ``role`` (``"A"``, ``inp``; ``"B"``, ``wgt``) with its cache computed
    at ``ins`` (:func:`_inside` or :func:`_inside_resident`): ``entries`` (scratchpad entries of
    one thread's tile, over the loops as ``tiled`` counts them), ``nbytes`` (DRAM bytes),
    ``loads`` (load instructions issued) and ``busy``, their busy cycles: the cycle model's
    durations of those LOADs (:meth:`vta_ext.sim.cycles.DmaCost.cycles` of the operand's memory
    kind, ``INP`` or ``WGT``: the bytes at its bandwidth, its fixed cycles per instruction and per
    row, :func:`_dma_rows` rows per instruction, its cycles per padding element)."""
    from vta_ext.sim.cycles import timing

    elem = cfg.inp_elem_bytes if role == "A" else cfg.wgt_elem_bytes
    dma = timing(cfg).dma("INP" if role == "A" else "WGT")
    free, unused = _operand_dims(pg, role)
    regions = [_region(d, ins) for d in free]
    repeat = _prod(ins[n][0] for n in unused)
    sums = [_dim_sum(d, ins, r) for d, r in zip(free, regions)]
    nbytes = repeat * _prod(sums) * elem
    loads = _prod(ins[lp.name][0] for lp in pg.loops)
    box = loads * _prod(regions)      # entries incl. DMA padding
    # ``tiled`` differs from ``ins`` on a few loops only: the other dims keep their region
    entries = _prod(r if all(tiled[v] is ins[v] for v, _ in d.terms) else _region(d, tiled)
                    for d, r in zip(free, regions))
    insns, rows = _dma_shape(free, regions, sums, ins, loads)
    return {"entries": entries, "nbytes": nbytes, "loads": loads,
            "busy": dma.cycles(insns, rows, nbytes, box - nbytes // elem)}


def _shared_once(pg: PackedGemm, k: Mapping[str, Any], role: str, threads,
                 loads: Mapping[str, Any]) -> Dict[str, Any]:
    """Operand ``role``'s :func:`_operand_loads` ``loads`` as the build issues them: a tile that
    every one of two or more ``threads`` loads once, with the same data, is loaded once, by
    thread 0, for all (:func:`vta_ext.lower.alloc.resident_buffers`, ``build_gemm``'s
    ``share_resident``): each thread loads once (the operand's load steps over all threads are
    ``threads``: a resident tile whose loops have one tile each, or a load point with one store
    point and one z step per thread) and no thread is on a loop the operand sees. Its bytes and
    busy cycles then count once instead of once per thread; ``loads`` (the load steps, which
    :func:`_pipeline` spreads over the groups) and the tile's entries (each thread keeps its
    copy allocated) do not change."""
    shared = _loaded_once(pg, k, role, threads, loads)
    if not shared.any():
        return loads
    n = np.where(shared, threads, 1)
    if n.ndim == 0:
        return {**loads, "nbytes": loads["nbytes"] // int(n), "busy": loads["busy"] / int(n)}
    return {**loads, "nbytes": loads["nbytes"] // n, "busy": loads["busy"] / n}


def _loaded_once(pg: PackedGemm, k: Mapping[str, Any], role: str, threads,
                 loads: Mapping[str, Any]):
    """Where :func:`_shared_once` counts operand ``role``'s tile once for all ``threads`` (a bool
    array): two or more threads, each loading it once, none on a loop the operand sees."""
    seen = {v for d in pg.operands[role].dims for v, _ in d.terms}
    split = [k[f"vt_{n}"] for n in vt_loops(pg) if n in seen]
    apart = _prod(split) > 1 if split else False
    return ((np.asarray(threads) >= 2) & (np.asarray(loads["loads"]) == np.asarray(threads))
            & ~np.asarray(apart))


def _dma_shape(free, regions, sums, ins, loads):
    """``(instructions, DRAM rows per instruction)`` of ``loads`` loads of the ``regions`` of the
    free dims ``free`` (outer to inner) with their cache at ``ins``. A load whose dims the DMA
    pads (a dim with ``padded``) is one 2-D DMA per index of the dims outside the last two, each
    of the last-but-one dim's rows clipped to its stored range (``sums``: :func:`_dim_sum` of
    each dim, over the outer iterations of its loops); else one DMA of :func:`_dma_rows` rows."""
    if len(free) < 2 or not any(d.padded for d in free):
        return loads, _dma_rows(free, regions)
    split = _prod(regions[:-2])
    row_dim = free[-2]
    rows = sums[-2] / _prod(ins[v][0] for v, _ in row_dim.terms)
    return loads * split, rows


def _operand_dims(pg: PackedGemm, role: str) -> Tuple[list, Tuple[str, ...]]:
    """``(free dims, unused loops)`` of operand ``role``: its packed dims that are not instruction
    axes (:func:`_free_dims`) and the free loops none of its dims sees (its loads repeat over
    them); once per program."""
    def make():
        op = pg.operands[role]
        used = {v for d in op.dims for v, _ in d.terms}
        return _free_dims(op), tuple(lp.name for lp in pg.loops if lp.name not in used)
    return pg.memo(("knobs.operand_dims", role), make)


def _dma_rows(dims, regions):
    """DRAM rows (the ``y_size`` of the 2-D DMAs, summed over the instructions) of one load of the
    ``regions`` (:func:`_region`) of ``dims`` (outer to inner): the innermost dims the region
    covers whole form one contiguous row with the first dim it does not; every dim outside that
    run multiplies the rows."""
    rows, inner_whole = 1, True
    for d, r in zip(reversed(dims), reversed(regions)):
        # (the int cases without numpy calls: ``rows * 1`` while the run of whole dims lasts for
        # every point, ``rows * r`` once it has ended for every point)
        if inner_whole is False:
            rows = _prod((rows, r))
            continue
        if inner_whole is not True:
            rows = rows * np.where(inner_whole, 1, r)
        whole = r == d.extent
        inner_whole = whole if inner_whole is True else inner_whole & whole
    return rows


def compute_work(cfg, pg: PackedGemm, ep) -> Dict[str, int]:
    """The compute module's micro-op cycles of any program of ``pg`` with the (simplified)
    epilogue ``ep``, whatever its knobs: ``gemm`` (every GEMM call of the embedding, one micro-op
    each, at ``GEMM_CYCLES_PER_UOP``), ``init`` (every accumulator entry initialised once: a reset
    micro-op, or ``PAD_ELEM_CYCLES`` per padding element of a fill LOAD,
    :func:`~.schedule.acc_init_of`), ``alu`` (every accumulator entry through every ALU pass
    of ``ep``, :func:`~vta_ext.templates.epilogue.alu_cycles`) and ``bias`` (with a
    ``("bias_gemm",)`` stage, every accumulator entry through the bias GEMM's micro-op at
    ``GEMM_CYCLES_PER_UOP``, :mod:`.biasfold`; else 0). The instructions' fixed cycles
    and the bias loads, which depend on the knobs, are not in it, so the sum is a lower bound on
    the compute module's busy cycles (:func:`_module_busy` adds them)."""
    from vta_ext.templates.epilogue import alu_cycles

    blocks = math.prod(d.extent for d in _free_dims(pg.operands["C"]))   # accumulator entries
    return {"gemm": pg.embedding.instruction_count * cfg.GEMM_CYCLES_PER_UOP,
            "init": blocks * (cfg.GEMM_CYCLES_PER_UOP if acc_init_of(pg) == "reset"
                              else cfg.PAD_ELEM_CYCLES),
            "alu": blocks * alu_cycles(cfg, ep),
            "bias": blocks * cfg.GEMM_CYCLES_PER_UOP if GEMM_BIAS_STAGE in ep else 0}


def _load_busy(loads: Mapping[str, Mapping[str, Any]], res: Optional[str]):
    """``(load, resident, resident loads)``: the busy cycles of the input and weight loads of the
    load steps, the same for the resident operand's loads (0 without one), as the cycle model's
    instruction durations (:func:`vta_ext.sim.cycles.insn_cycles`) sum over the schedule, and the
    load instructions of the resident operand (0 without one); ``loads`` is
    :func:`_operand_loads` per operand (``"A"``, ``"B"``), ``res`` the resident one or None."""
    part = {"load": 0, "resident": 0}
    res_loads = 0
    for role in "AB":
        name = "resident" if role == res else "load"
        # (an operand's busy cycles are one sum; with a power-of-two bandwidth every term is exact
        # in binary, so the order of the additions changes no value)
        part[name] = part[name] + loads[role]["busy"]
        if role == res:
            res_loads = loads[role]["loads"]
    return part["load"], part["resident"], res_loads


def _module_busy(cfg, pg: PackedGemm, ep, k, nbytes, stores, steps) -> Dict[str, Any]:
    """The busy cycles of the program's parts other than the operands' loads (:func:`_load_busy`),
    as the cycle model's instruction durations (:func:`vta_ext.sim.cycles.insn_cycles`) sum over
    the schedule; no loop order changes them. Parts: ``gemm`` (every GEMM micro-op execution, an
    issue per load step), ``reset`` (one micro-op per accumulator entry), ``epilogue`` (the ALU
    passes of :func:`~vta_ext.templates.epilogue.alu_cycles` per accumulator entry and the bias
    loads, both on the compute module, or the bias GEMM's micro-ops and one GEMM instruction per
    store point) and ``store``. Every instruction adds its kind's fixed
    cycles (:func:`vta_ext.sim.cycles.timing`): a GEMM per load step, a reset GEMM or an
    accumulator fill LOAD per store point (:func:`~.schedule.acc_init_of`), the ALU passes, a bias
    LOAD of one row, and the STOREs at the ``OUT`` kind's cost."""
    from vta_ext.sim.cycles import timing
    from vta_ext.templates.epilogue import alu_count, has_bias

    t = timing(cfg)
    work = compute_work(cfg, pg, ep)
    init = t.gemm_fixed if acc_init_of(pg) == "reset" else t.dma("ACC").fixed
    ext = {lp.name: lp.extent for lp in pg.loops}
    ctile = {n: (ext[n] // k[f"tile_{n}"], k[f"tile_{n}"]) for n in pg.c_loops()}
    c_free = _free_dims(pg.operands["C"])
    store_rows = _dma_rows(c_free, [_region(d, ctile) for d in c_free])
    return {"gemm": work["gemm"] + stores * steps * t.gemm_fixed,
            "reset": work["init"] + stores * init,
            "epilogue": (work["alu"] + stores * alu_count(cfg, ep) * t.alu_fixed
                         + (work["bias"] + stores * t.gemm_fixed if work["bias"] else 0)
                         + (t.dma("ACC").cycles(stores, 1, nbytes["acc_load_nbytes"])
                            if has_bias(ep) else 0)),
            "store": t.dma("OUT").cycles(stores, store_rows, nbytes["out_store_nbytes"])}


def _pipeline_terms(busy, stores, steps, threads, bias_loads=0) -> Dict[str, Any]:
    """The terms of :func:`_pipeline` that the operands' loads do not change (so no loop order
    does): from the busy cycles of :func:`_module_busy`, the store points ``stores``, the load
    steps per store point ``steps``, the virtual threads and the busy cycles of the bias GEMM's
    loads ``bias_loads`` (:func:`_gemm_bias_loads`; 0 without one), which ``busy["load"]``
    includes."""
    t = threads
    per = stores * steps
    g = busy["gemm"] / per
    r, e, s = busy["reset"] / stores, busy["epilogue"] / stores, busy["store"] / stores
    ts = t * steps
    # the last fill waits for the last thread's store of the group before; the first load of a
    # thread waits for its fill
    return {"t": t, "stores": stores, "per": per, "one_step": np.asarray(steps) == 1, "g": g,
            "r": r, "s": s, "fills": np.maximum(t * r, r + s), "ts": ts, "ts1": ts - t + 1,
            "tsg": ts * g, "te": t * e, "tss": t * s, "st": stores / t,
            "single": np.asarray(t) == 1, "ers": e + r + s, "te_g": t * e + (t - 1) * g,
            "steps": steps, "bl": bias_loads if type(bias_loads) is int else bias_loads / stores}


def _pipeline(busy, p: Mapping[str, Any], res_loads=0, streams_weights: Any = False,
              early: Any = False, runs=1, late: Any = False):
    """Estimated cycles of the program from the busy cycles of its parts (:func:`_load_busy`,
    :func:`_module_busy`), the resident operand's load instructions ``res_loads`` (all threads;
    0 without one), whether the point streams only the weights between two output-channel
    threads (:func:`_streams_weights`) and the order-free terms ``p`` (:func:`_pipeline_terms`).

    One thread runs every instruction after the other (a load waits for the GEMM that frees its
    buffer, the next fill for the store): the sum, less the loads the early release hides
    (``early``, :func:`_released`, with ``runs`` the iterations of the loops above the released
    tile loop: :func:`_hidden_loads`). With ``t`` virtual threads the store points go in
    groups of ``t``, one per thread, as the lowering interleaves them: the ``t`` fills, the
    ``t * steps`` load steps, the ``t`` epilogues, all on the compute module, then the stores. A
    load waits for the compute instruction before it: the first load of a thread for its fill, so
    no load of a group runs under the epilogues of the group before; a fill waits for the store of
    its thread's previous store point. So a group takes the slower of the load stream (every load,
    back to back from the first fill, the last thread's first load not before the last fill, then
    the last GEMM) and the compute stream (the fills, every GEMM, then its ``t`` epilogues); the
    store module bounds it by ``t`` stores, and the last store ends the program. With the data
    resident and two threads over the output channels, the next group's weight loads run under
    this group's last GEMM and its epilogues, so a group's period is the slower stream alone and
    the last GEMM, one epilogue and the last store are paid once, at the end (charged per group,
    they made the 1x1
    384->384 convolutions of regnet_x_400mf at 4x4 on ``pipelined`` estimate 23,463 cycles at
    the chosen point, timed 21,964, and rank the point timed 20,611 at 24,695; now 20,732; with
    no resident operand, that overlap took slower points: the 32->32 1x1 at 56x56, 41,792 ->
    46,134 cycles; with four threads and the weights resident, the C4 layer of
    tests/test_cycle_estimate.py on ``pynq`` estimated 93,906 and timed 115,576, and with the
    weights resident, bound to A, or under the batch-inner ``order`` 5, the 3->32 3x3 stems took
    slower points: 48,519 -> 67,076 cycles on the fused-crs y=k16 embedding; with the threads
    over the image rows, MobileNetV2's 1x32x112x112 * 16x32 1x1 on ``pipelined`` took 120,420
    cycles against 84,164). A resident operand
    (``order`` 1 or 2) is loaded once per iteration of its loop, for every thread, ahead of the
    load steps below it: those loads stall the first GEMM of the group that loads them (with one
    load step and one resident tile per store point they are load steps like the others). Under
    the early release a thread's first load of a group waits for its last GEMM of the group
    before instead of its fill, so every group but the first starts its load stream under the
    last GEMMs and epilogues of the one before (``group_of``'s ``released``; not on top of the
    data-resident overlap above, which already runs those loads there)."""
    serial = sum(busy.values())
    if isinstance(early, np.ndarray) and not early.any():
        early = False               # (no point of the grid releases: the formulas without it)
    if early is not False:
        serial = serial - np.where(early, _hidden_loads(busy, p, runs), 0)
    r, g, fills = p["r"], p["g"], p["fills"]

    def group_of(first, overlap=False, released=False):
        # a group whose load stream starts with ``first`` resident loads (None: none; ``r + 0``
        # would round to ``r``, so that case skips the additions); ``overlap``: the next group's
        # loads run under its last GEMM and epilogues (bool or a bool array); ``released``: the
        # early release (bool or a bool array), each thread's first load waits for its last GEMM
        # of the group before, not its fill: the load stream starts at the first thread's last
        # GEMM there, under that group's last ``t - 1`` GEMMs and ``t`` epilogues (``te`` and
        # ``(t - 1) * g`` before this group's first fill), but a thread's next load
        # still waits for its GEMM of this group (the first after the fills), and the first
        # GEMM waits for the fills only
        rf, ff = (r, fills) if first is None else (r + first, fills + first)
        loads = np.maximum(rf + tl, ff + t1l)
        compute = np.maximum(fills, rf + l) + p["tsg"]
        if released is not False:
            # (the bias GEMM's loads, ``bl`` per store point, follow a thread's last load step:
            # they wait for no GEMM of the group, and the bias GEMM, an epilogue, for them)
            ls = l - p["bl"] / p["steps"]
            tls = p["ts"] * ls
            early = tls - p["te_g"] if first is None else first + tls - p["te_g"]
            early = np.maximum(early, fills + g + tls - p["t"] * ls)
            if not (type(p["bl"]) is int and p["bl"] == 0):
                early = early + np.maximum(p["t"] * p["bl"] - g, 0)
            loads = np.where(released, early, loads)
            compute = np.where(released, (fills if first is None else np.maximum(
                fills, first + l - p["te_g"])) + p["tsg"], compute)
        serial_tail = np.maximum(np.maximum(loads + g, compute) + p["te"], p["tss"])
        if released is not False:
            # (the load module still runs the group's loads one after the other: with more
            # than two threads the stream above may start before the last group's ends)
            serial_tail = np.where(released, np.maximum(
                serial_tail, tl if first is None else first + tl), serial_tail)
        if overlap is False:
            return serial_tail
        # (overlapped, a group's first loads ran under the group before: its first GEMM waits
        # for the fills only, unless resident loads come first)
        ahead = fills + p["tsg"] if first is None else compute
        return np.where(overlap, np.maximum(np.maximum(loads, ahead + p["te"]), p["tss"]),
                        serial_tail)

    if isinstance(res_loads, int) and res_loads == 0:
        # no resident operand: nothing is exposed and every group is the same (the general
        # formula below adds zeros, which leave these floats as they are)
        l = busy["load"] / p["per"]
        tl, t1l = p["ts"] * l, p["ts1"] * l     # the load stream of every thread's steps
        # (the first group's loads wait for its fills: nothing is released before it)
        head = group_of(None)
        group = head if early is False else group_of(None, False, early)
        piped = (p["st"] - 1) * group + head + p["s"]
    else:
        # one load step per store point and a resident tile per store point: the resident loads
        # are load steps like the others
        folded = p["one_step"] & (np.asarray(res_loads) >= p["stores"])
        exposed = np.where(folded, 0, busy["resident"])
        l = (busy["load"] + busy["resident"] - exposed) / p["per"]
        tl, t1l = p["ts"] * l, p["ts1"] * l     # (the same in both groups)
        overlap = streams_weights
        if early is not False and overlap is not False:
            # (the overlap rule already runs the next group's loads under these epilogues)
            early = np.asarray(early) & ~np.asarray(overlap)
        group = group_of(None, overlap, early)
        first = group_of(p["t"] * exposed / np.maximum(res_loads, 1), overlap, early)
        # the last GEMM, epilogue and store (the serial groups have their GEMM and epilogues)
        tail = p["s"] + np.where(overlap, g + p["te"] / p["t"], 0)
        if early is not False:      # the first group: nothing released before it
            head = group_of(p["t"] * exposed / np.maximum(res_loads, 1), overlap)
            tail = tail + np.where(early, head - first, 0)
        piped = p["st"] * group + np.asarray(res_loads) / p["t"] * (first - group) + tail
    if np.any(late):
        piped = np.where(late, _late_pipeline(busy, p), piped)
    return np.where(p["single"], serial, piped)


def _late_pipeline(busy, p: Mapping[str, Any]):
    """Estimated cycles of a program of two or more threads whose tile loop runs the late fill
    (:func:`_late_fill`: one load step per store point; each thread's fill waits for its own
    previous store and runs under the other threads' GEMMs, its loads wait only for its previous
    last GEMM). A group of ``t`` store points (one per thread) takes the slowest of: the compute
    module's instructions (``t`` fills, ``t`` GEMM steps and ``t`` epilogues), the load module's
    (``t`` load steps), the store module's (``t`` stores) and one thread's chain from its last
    GEMM to its next one (its next load step, or its epilogue, store and next fill, whichever is
    longer, then the GEMM step). Before the first group: the resident operand's loads (all of
    them, not hidden) and the first load step; after the last: its store."""
    t, r, g, s = p["t"], p["r"], p["g"], p["s"]
    e = p["te"] / t
    l = busy["load"] / p["per"]
    period = np.maximum(np.maximum(t * (r + e) + p["tsg"], p["ts"] * l),
                        np.maximum(p["tss"], np.maximum(l, e + s + r) + g))
    return busy["resident"] + l + p["st"] * period + s


def _hidden_loads(busy, p: Mapping[str, Any], runs):
    """One thread, the early release (:func:`_released`): the load cycles that run under the
    compute and store modules. Each store point but the first waits for nothing but the previous
    one's last GEMM to load its first load step (``busy["load"] / p["per"]``, and the resident
    tile's loads first where the point starts one of the ``runs``, the resident operand's
    iterations), while the compute and store modules run the previous epilogue, its store and
    this point's fill (``p["ers"]``, one after the other): the shorter of the two is hidden."""
    step = busy["load"] / p["per"]
    stores = p["stores"]
    first = step + busy["resident"] / runs
    return ((stores - runs) * np.minimum(step, p["ers"])
            + (runs - 1) * np.minimum(first, p["ers"]))


def _fit_checks(cfg, m: Mapping[str, Any]) -> List[tuple]:
    """``(violated, why)`` of the limits a structurally valid point must fit (the model ``m`` of
    :func:`_measure`), in the order :func:`evaluate` reports them."""
    from vta_ext.isa import MemType
    from vta_ext.layout import MAX_LOOP_EXTENT
    from vta_ext.memory import gemm_kernel_uop_budget, scratchpad

    out = []
    for name in ("inp", "wgt", "acc"):
        depth = scratchpad(cfg, MemType[name.upper()]).depth
        used = m["sram"][name]
        out.append((used > depth, lambda at, name=name, used=used, depth=depth:
                    f"the {name} tiles need {at(used)} entries (all virtual threads), more than the "
                    f"{name} scratchpad's {depth}"))
    budget = gemm_kernel_uop_budget(cfg)
    out.append((m["uops"] > budget, lambda at: f"the GEMM kernel of {at(m['uops'])} micro-ops exceeds "
                f"half the micro-op buffer ({budget}; the reset and GEMM kernels must fit together)"))
    out.append((m["folded"] > MAX_LOOP_EXTENT, lambda at: f"a folded GEMM loop of {at(m['folded'])} "
                f"iterations exceeds the 14-bit loop field (max {MAX_LOOP_EXTENT})"))
    return out


def evaluate(cfg, pg: PackedGemm, epilogue: Sequence[tuple], knobs: Mapping[str, int]):
    """The model of one (full, structurally valid) point: a :class:`KnobPoint` or a
    :class:`Pruned` with the reason it does not fit. This is the reference :func:`search` is
    checked against (one point at a time, in Python)."""
    from vta_ext.templates.epilogue import normalize_epilogue

    k = dict(knobs)
    reason = _structural_reason(pg, k)
    if reason:
        return Pruned(k, reason)
    m = _measure(cfg, pg, normalize_epilogue(epilogue), k, k.get(ORDER_KNOB, 0))
    for violated, why in _fit_checks(cfg, m):
        if violated:
            return Pruned(k, why(_scalar))
    return KnobPoint(k, {c: int(v) for c, v in m["bytes"].items()},
                     {n: int(v) for n, v in m["sram"].items()}, int(m["uops"]), int(m["insns"]),
                     _cycles_int(m["cycles"]))


def reuse_pays(cfg, pg: PackedGemm, epilogue: Sequence[tuple], knobs: Mapping[str, int]) -> bool:
    """Whether the estimate of the (full, structurally valid) point ``knobs`` takes reuse-aware
    double buffering (:func:`reused_operands`, :data:`REUSE_GAIN`): what ``build_gemm`` builds
    by default.

    Parameters
    ----------
    cfg : VTAConfig
    pg : PackedGemm
    epilogue : sequence of tuple
    knobs : mapping
        A full point (:func:`check_point`).

    Returns
    -------
    bool
    """
    from vta_ext.templates.epilogue import normalize_epilogue

    k = dict(knobs)
    m = _measure(cfg, pg, normalize_epilogue(epilogue), k, k.get(ORDER_KNOB, 0))
    return bool(np.any(m["reuse"]))


def enumerate_points(cfg, pg: PackedGemm, epilogue: Sequence[tuple]
                     ) -> Iterator[Tuple[Dict[str, int], Any]]:
    """Every point of the domain, in a deterministic order, with its :func:`evaluate` result (the
    exhaustive reference; :func:`search` gives the same answers without a Python loop)."""
    dom = knob_domain(pg)
    names = list(dom)
    for values in itertools.product(*[dom[n] for n in names]):
        point = dict(zip(names, values))
        yield point, evaluate(cfg, pg, epilogue, point)


def _cycles_int(c):
    """Estimated cycles as integers (the rank compares these)."""
    return np.rint(c).astype(np.int64) if isinstance(c, np.ndarray) else int(round(float(c)))


def _rank(p: KnobPoint, objective: str = "bytes") -> Tuple:
    """The exhaustive search's order of valid points (smallest first) under ``objective``:
    ``"bytes"`` (TPS) fewest modelled DRAM bytes, then fewest estimated instructions, two threads
    before one before four, then the enumeration order; ``"cycles"`` fewest estimated cycles first,
    then the same."""
    threads = math.prod(v for n, v in p.knobs.items() if n.startswith("vt_"))
    rank = (p.total_bytes, p.insns, {2: 0, 1: 1}.get(threads, 2), tuple(p.knobs.values()))
    return rank if objective == "bytes" else (p.cycles,) + rank


#: what a knob search minimises (:func:`search`)
OBJECTIVES = ("bytes", "cycles")


# ------------------------------------------------------------------------------------ the search
@dataclass(frozen=True)
class KnobGrid:
    """The model of every point of a knob domain at once (:func:`search`).

    The domain is the product of the knob values in :func:`knob_domain` order (``order`` last),
    restricted to the ``fixed`` knobs; a point's flat index (C order) is its position in
    :func:`enumerate_points`. Arrays are flat, one entry per point.

    Attributes
    ----------
    names : tuple of str
        Knob names, in domain order.
    values : tuple of tuple of int
        The values each knob ranges over (a fixed knob: its one value).
    valid : numpy.ndarray
        Bool: the point is structurally valid and fits.
    reason : numpy.ndarray
        Index into ``checks`` of the first violated condition (-1 if valid).
    total_bytes, insns, threads, cycles : numpy.ndarray
        Modelled DRAM bytes (all counters), estimated instructions, virtual threads, estimated
        cycles.
    """

    names: Tuple[str, ...]
    values: Tuple[Tuple[int, ...], ...]
    valid: Any
    reason: Any
    total_bytes: Any
    insns: Any
    threads: Any
    cycles: Any = None
    checks: Tuple[Any, ...] = dataclasses.field(repr=False, default=())

    def __len__(self) -> int:
        return int(self.valid.size)

    def points(self, indices) -> List[Dict[str, int]]:
        """The knobs of the points at the flat ``indices``."""
        idx = np.unravel_index(np.asarray(indices, dtype=np.int64), tuple(len(v) for v in self.values))
        cols = [np.asarray(v, dtype=np.int64)[i].tolist() for v, i in zip(self.values, idx)]
        return [dict(zip(self.names, row)) for row in zip(*cols)]

    def point(self, index: int) -> Dict[str, int]:
        """The knobs of the point at flat ``index``."""
        return self.points([index])[0]

    def why(self, index: int) -> str:
        """Why the point at flat ``index`` is pruned (the reason :func:`evaluate` gives)."""
        _, _, why = self.checks[int(self.reason[index])]
        shape = tuple(len(v) for v in self.values[:-1])
        local = np.unravel_index(int(index) // len(self.values[-1]), shape)

        def at(v) -> int:
            return int(np.broadcast_to(v, shape)[local]) if isinstance(v, np.ndarray) else int(v)
        return why(at)


def knob_grid(cfg, pg: PackedGemm, epilogue: Sequence[tuple],
              fixed: Optional[Mapping[str, int]] = None) -> KnobGrid:
    """The model of every point of the domain of ``pg`` (restricted to ``fixed`` before anything is
    evaluated), computed with numpy over the whole grid: the same figures as :func:`evaluate` per
    point, with no Python loop over the points."""
    from vta_ext.templates.errors import KnobError
    from vta_ext.templates.epilogue import normalize_epilogue

    ep = normalize_epilogue(epilogue)
    dom = knob_domain(pg)
    fixed = dict(fixed or {})
    for n, v in fixed.items():
        if n not in dom or v not in dom[n]:
            raise KnobError(f"fixed knob {n}={v!r} is not in the domain; valid knobs: {', '.join(dom)}")
        dom[n] = (v,)
    names = list(dom)
    free = names[:-1]                     # ``order`` is last: one grid per loop order
    shape = tuple(len(dom[n]) for n in free)
    # the model runs over the grid with its axes sorted by their number of values (``inner``):
    # every figure is elementwise, so the axis order changes no value, and numpy's broadcasting
    # loops pay their overhead per innermost run: a long tile axis there, not a virtual-thread
    # axis of 2 values (the whole model about a third faster)
    inner = sorted(free, key=lambda n: len(dom[n]))
    to_domain = tuple(inner.index(n) for n in free)
    k = {n: np.asarray(dom[n], dtype=np.int64).reshape([-1 if m == n else 1 for m in inner])
         for n in inner}
    # ``order`` as the last (fastest) axis: the flat index is the enumeration order; each order
    # writes its column (through a view in the model's axis order), which broadcasts the figures
    # that depend on a few knobs only
    cols = {key: np.zeros(shape + (len(dom[ORDER_KNOB]),),
                          dtype=np.float64 if key == "cycles" else np.int64)
            for key in ("reason", "bytes", "insns", "cycles", "threads")}
    axes = [free.index(n) for n in inner] + [len(free)]
    view = {key: col.transpose(axes) for key, col in cols.items()}
    view["threads"][...] = np.expand_dims(_prod(k[f"vt_{n}"] for n in vt_loops(pg)), -1)
    checks = []
    thread_checks = _thread_checks(pg, k)      # what no order changes, computed once
    commons = {}                                # per batch_inner(order)
    for j, order in enumerate(dom[ORDER_KNOB]):
        conds = _structural_checks(pg, k, order, thread_checks)
        m = None
        if not any(c is True for c, _ in conds):
            inner = batch_inner(order)
            if inner not in commons:
                commons[inner] = _order_free(cfg, pg, ep, k, inner)
            m = _measure(cfg, pg, ep, k, order, commons[inner])
            conds += _fit_checks(cfg, m)
        # the first violated condition of each point: the conditions from last to first, each
        # overriding the ones after it
        reason = -1
        for i in reversed(range(len(conds))):
            violated = conds[i][0]
            if violated is False:       # (an int figure within its limit)
                continue
            reason = np.where(violated, len(checks) + i, reason)
        view["reason"][..., j] = reason
        checks += [(order, violated, _why_in_domain(why, to_domain)) for violated, why in conds]
        if m is not None:
            view["bytes"][..., j] = sum(np.asarray(v, dtype=np.int64) for v in m["bytes"].values())
            view["insns"][..., j] = np.asarray(m["insns"], dtype=np.int64)
            view["cycles"][..., j] = m["cycles"]     # (rounded for all orders at once)
    reason = cols["reason"].reshape(-1)
    return KnobGrid(tuple(names), tuple(tuple(dom[n]) for n in names), reason < 0, reason,
                    cols["bytes"].reshape(-1), cols["insns"].reshape(-1),
                    cols["threads"].reshape(-1), _cycles_int(cols["cycles"]).reshape(-1), tuple(checks))


def _domain_view(v, to_domain: Tuple[int, ...]):
    """A figure of :func:`knob_grid`'s model grid (axes sorted by size) as a view with the axes in
    knob domain order (``to_domain``: the model axis of each domain axis); scalars as they are."""
    return np.transpose(v, to_domain) if isinstance(v, np.ndarray) and v.ndim == len(to_domain) else v


def _why_in_domain(why, to_domain: Tuple[int, ...]):
    """``why`` of a check over :func:`knob_grid`'s model grid, reading its values at a point of the
    domain order (what :meth:`KnobGrid.why` indexes)."""
    return lambda at: why(lambda v: at(_domain_view(v, to_domain)))


def search(cfg, pg: PackedGemm, epilogue: Sequence[tuple],
           fixed: Optional[Mapping[str, int]] = None, objective: str = "bytes") -> Optional[KnobPoint]:
    """The best valid point by :func:`_rank` under ``objective`` (``"bytes"``: the TPS point,
    fewest modelled DRAM bytes; ``"cycles"``: fewest estimated cycles, ties by bytes) from
    :func:`knob_grid`, or None if no point fits; equal to the best of :func:`enumerate_points`."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown knob search objective {objective!r}; use one of {OBJECTIVES}")
    dom = knob_domain(pg)
    if any(n not in dom or v not in dom[n] for n, v in (fixed or {}).items()):
        return None                 # no point of the domain has these values
    # one grid serves both objectives (a build asks for the TPS point to rank its candidates and
    # for the cycle point to build the chosen one)
    grid = cached_grid(cfg, pg, epilogue, fixed)
    idx = np.flatnonzero(grid.valid)
    if not idx.size:
        return None
    thr = np.where(grid.threads[idx] == 2, 0, np.where(grid.threads[idx] == 1, 1, 2))
    keys = (idx, thr, grid.insns[idx], grid.total_bytes[idx])
    if objective == "cycles":
        keys += (grid.cycles[idx],)
    best = idx[np.lexsort(keys)[0]]
    res = evaluate(cfg, pg, epilogue, grid.point(best))
    assert isinstance(res, KnobPoint), res       # the grid and the point model are one model
    return res


def cached_grid(cfg, pg: PackedGemm, epilogue: Sequence[tuple],
                fixed: Optional[Mapping[str, int]] = None) -> KnobGrid:
    """:func:`knob_grid`, computed once per (program, configuration value, epilogue, fixed knobs)
    and kept with ``pg`` (:meth:`~.plan.PackedGemm.memo`): the searches of both objectives and the
    tuner's knob space read the same grid."""
    fixed = dict(fixed or {})
    return pg.memo(_tps_key(cfg, epilogue, fixed, "grid"), lambda: knob_grid(cfg, pg, epilogue, fixed))


def _tps_key(cfg, epilogue: Sequence[tuple], fixed: Mapping[str, int], objective: str = "bytes"
             ) -> tuple:
    """The memo key of a knob search: it is deterministic in (program, configuration value,
    epilogue, fixed knobs, objective). The epilogue enters as its shape
    (:func:`~vta_ext.templates.epilogue.epilogue_shape`): the model of every point counts the
    epilogue's ALU passes, not its immediates, so the operators of a network's repeated blocks
    (the same program, other shifts and clips) share one search."""
    from vta_ext.executor import config_digest
    from vta_ext.templates.epilogue import epilogue_shape

    return ("tps" if objective == "bytes" else objective, config_digest(cfg),
            repr(epilogue_shape(cfg, epilogue)), tuple(sorted(fixed.items())))


def tps_point(cfg, pg: PackedGemm, epilogue: Sequence[tuple],
              fixed: Optional[Mapping[str, int]] = None) -> Optional[KnobPoint]:
    """The Tiling Parameter Search point (fewest modelled DRAM bytes that fit), or None if no
    point fits. ``fixed`` restricts the search to the points with these knob values (e.g.
    ``{"order": 0}``: the stock loop order only); it is applied before any point is evaluated."""

    return _searched(cfg, pg, epilogue, fixed, "bytes")


def cycle_point(cfg, pg: PackedGemm, epilogue: Sequence[tuple],
                fixed: Optional[Mapping[str, int]] = None) -> Optional[KnobPoint]:
    """The point of fewest estimated cycles that fits (ties: fewer modelled DRAM bytes, then the
    TPS order), or None if no point fits; ``fixed`` as for :func:`tps_point`."""
    return _searched(cfg, pg, epilogue, fixed, "cycles")


def _searched(cfg, pg: PackedGemm, epilogue, fixed, objective: str) -> Optional[KnobPoint]:
    from vta_ext.timing import phase

    fixed = dict(fixed or {})

    # searched once per key, as the chooser, the build and the tuner's knob space each ask for it
    def timed():
        with phase("knob search"):
            return search(cfg, pg, epilogue, fixed, objective)
    best = pg.memo(_tps_key(cfg, epilogue, fixed, objective), timed)
    return None if best is None else dataclasses.replace(best, knobs=dict(best.knobs))


def seed_tps_point(cfg, pg: PackedGemm, epilogue: Sequence[tuple], knobs: Mapping[str, int],
                   objective: str = "bytes") -> bool:
    """Record ``knobs`` (a point found earlier, e.g. kept in the plan cache) as the search result
    of ``pg`` under ``objective`` (``"bytes"``: :func:`tps_point`, ``"cycles"``:
    :func:`cycle_point`), so that it does not search. The point is validated and modelled again;
    False (nothing recorded) if it is not a valid point of this program."""
    from vta_ext.templates.errors import KnobError

    try:
        point = check_point(pg, dict(knobs))
    except KnobError:
        return False
    res = evaluate(cfg, pg, epilogue, point)
    if not isinstance(res, KnobPoint):
        return False
    pg.memo(_tps_key(cfg, epilogue, {}, objective), lambda: res)
    return True


def fallback_point(cfg, pg: PackedGemm, epilogue: Sequence[tuple]):
    """Every tile 1, one thread, the stock loop order (the original stack's fallback): its model,
    or the :class:`Pruned` reason it does not fit."""
    return evaluate(cfg, pg, epilogue, knob_defaults(pg))
