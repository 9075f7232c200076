"""The knob space over the loops an embedding leaves free, its cost model, and TPS.

Knobs of a packed GEMM (:class:`~.plan.PackedGemm`), as a plain dict (what records hold):

* ``tile_<loop>`` for every free spatial loop of the output and every tile loop of a dim walked by
  the reduction axis z: the inner factor of its split (a divisor of its extent). The output tile
  computed per store point is the product of the spatial tiles; the reduction tiles say how many
  z-blocks one load step brings in;
* ``vt_<loop>`` in {1, 2}: virtual threads over the outer tiles of the first output-channel loop
  and of the first image-row loop (the original's ``oc_nthread`` / ``h_nthread``);
* ``order`` in {0, 1, 2}: the loop order of the output tiles and which operand stays resident
  (:func:`~.schedule.loop_orders`): 0 the stock rule (both caches loaded at every load step; the
  default, also when a record has no ``order``), 1 weight-resident (output-channel tiles outer,
  the weight tile loaded once per output-channel tile and reused by every spatial tile below),
  2 data-resident (output-channel tiles innermost, the data tile loaded once per spatial tile and
  reused by every output-channel tile). A resident tile holds the whole reduction of its tile.

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
import itertools
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from .plan import AXIS_PREFIX, PackedGemm

__all__ = ["KnobPoint", "Pruned", "knob_names", "knob_domain", "knob_defaults", "check_point",
           "evaluate", "enumerate_points", "tps_point", "fallback_point", "BYTE_COUNTERS", "ORDER_KNOB"]

#: the loop-order knob (values: :data:`~.schedule.ORDERS`)
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
    """

    knobs: Dict[str, int]
    bytes: Dict[str, int]
    sram: Dict[str, int]
    uops: int
    insns: int

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


def vt_loops(pg: PackedGemm) -> List[str]:
    """Loops that may carry two virtual threads: the first output-channel (``weight``) loop and the
    first image-row (``stencil``) loop that is not the last one, in that order of nesting."""

    def make():
        c = pg.c_loops()
        weight = [n for n in c if pg.roles[n] == "weight"]
        stencil = [n for n in c if pg.roles[n] == "stencil"][:-1]
        return tuple(weight[:1] + stencil[:1])
    return list(pg.memo("vt_loops", make))


def tiled_loops(pg: PackedGemm) -> List[str]:
    """Loops with a tile knob: the output's free loops (output order), then the z tile loops."""
    return pg.c_loops() + [lp.name for lp in pg.loops if pg.roles[lp.name] == "ztile"]


def knob_names(pg: PackedGemm) -> Tuple[str, ...]:
    """The knob names of ``pg`` (module docstring)."""
    return (tuple(f"tile_{n}" for n in tiled_loops(pg)) + tuple(f"vt_{n}" for n in vt_loops(pg))
            + (ORDER_KNOB,))


def knob_domain(pg: PackedGemm) -> Dict[str, Tuple[int, ...]]:
    """Values of every knob: divisors of the loop extent for tiles, {1, 2} for threads."""
    ext = {lp.name: lp.extent for lp in pg.loops}
    dom = {f"tile_{n}": tuple(_divisors(ext[n])) for n in tiled_loops(pg)}
    dom.update({f"vt_{n}": (1, 2) for n in vt_loops(pg)})
    dom[ORDER_KNOB] = (0, 1, 2)
    return dom


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
    ext = {lp.name: lp.extent for lp in pg.loops}
    for n in vt_loops(pg):
        t = k[f"vt_{n}"]
        outer = ext[n] // k[f"tile_{n}"]
        if outer % t:
            return f"vt_{n}={t} must divide {n}'s outer tiles ({ext[n]}/tile_{n} = {outer})"
    order = k.get(ORDER_KNOB, 0)
    if order:
        from .schedule import ORDERS, loop_orders

        if loop_orders(pg, order).resident_at is None:
            return (f"order={order} ({ORDERS[order]}) needs an outer loop above the other operand's "
                    f"tiles to hold the resident tile, and this embedding has none")
    return None


# ------------------------------------------------------------------------------------ the model
def _inside(pg: PackedGemm, k: Mapping[str, int]) -> Dict[str, Tuple[int, int]]:
    """Loop -> ``(outer count, inner extent)`` relative to the load point of the input caches."""
    anchored = any(lp.extent > 1 for lp in pg.loops if pg.roles[lp.name] == "ztile")
    out = {}
    for lp in pg.loops:
        role, e = pg.roles[lp.name], lp.extent
        if role == "reduce":
            out[lp.name] = (1, e)
        elif role in ("plain", "shared") and anchored:
            out[lp.name] = (e, 1)
        else:
            t = k[f"tile_{lp.name}"]
            out[lp.name] = (e // t, t)
    for ax, size in pg.axes.items():
        out[AXIS_PREFIX + ax] = (1, size)
    return out


def _inside_resident(pg: PackedGemm, k: Mapping[str, int], outer: Sequence[str], at: str
                     ) -> Dict[str, Tuple[int, int]]:
    """Loop -> ``(outer count, inner extent)`` relative to a resident cache computed at the outer
    loop ``at``: the output loops down to ``at`` keep their tiles, every loop below it is whole
    (its virtual threads, split outermost, still count as outer iterations; the resident operand
    does not see those loops), the reductions are whole."""
    ext = {lp.name: lp.extent for lp in pg.loops}
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


def _dim_sum(dim, inside) -> int:
    """Entries of one packed dim loaded over all outer iterations of its loops (clipped to the
    stored range when the DMA pads it)."""
    ext = sum(c * (inside[v][1] - 1) for v, c in dim.terms) + 1
    outers = [(inside[v][0], inside[v][1], c) for v, c in dim.terms]
    count = math.prod(o for o, _, _ in outers)
    if not dim.padded:
        return count * ext
    lo, hi = dim.stored_lo, dim.stored_lo + dim.stored_extent
    total = 0
    for vals in itertools.product(*[range(o) for o, _, _ in outers]):
        start = dim.const + sum(c * v * inner for v, (_, inner, c) in zip(vals, outers))
        total += max(0, min(start + ext, hi) - max(start, lo))
    return total


def _region(dim, inside) -> int:
    return sum(c * (inside[v][1] - 1) for v, c in dim.terms) + 1


def _free_dims(op):
    return [d for d in op.dims if not d.terms[0][0].startswith(AXIS_PREFIX)]


def kernel_loops(pg: PackedGemm, k: Mapping[str, int]) -> List[int]:
    """Extents of the non-unit loops of one load step's GEMM kernel, outermost first."""
    from .schedule import loop_orders

    ext = {lp.name: lp.extent for lp in pg.loops}
    orders = loop_orders(pg)
    out = []
    for n in orders.kernel:
        role = pg.roles[n]
        e = ext[n] if role == "reduce" else k[f"tile_{n}"]
        if e > 1:
            out.append(e)
    return out


def evaluate(cfg, pg: PackedGemm, epilogue: Sequence[tuple], knobs: Mapping[str, int]):
    """The model of one (full, structurally valid) point: a :class:`KnobPoint` or a
    :class:`Pruned` with the reason it does not fit."""
    from vta_ext.isa import MemType
    from vta_ext.layout import MAX_LOOP_EXTENT
    from vta_ext.memory import scratchpad
    from vta_ext.templates.epilogue import alu_count, has_bias, normalize_epilogue

    ep = normalize_epilogue(epilogue)
    k = dict(knobs)
    reason = _structural_reason(pg, k)
    if reason:
        return Pruned(k, reason)
    from .schedule import loop_orders

    inside = _inside(pg, k)
    orders = loop_orders(pg, k.get(ORDER_KNOB, 0))
    res = orders.resident
    at_res = (_inside_resident(pg, k, orders.outer, orders.resident_at) if res is not None
              else None)
    # scratchpad entries as the stock model counts them: a batch-like loop's whole tile, also when
    # the caches sit below it (the lowering then allocates less; counting the tile keeps TPS the
    # stock template's policy on the stock family)
    tiled = {**inside, **{n: (1, k[f"tile_{n}"]) for n in pg.c_loops() if pg.roles[n] in ("plain", "shared")}}
    threads = math.prod(k[f"vt_{n}"] for n in vt_loops(pg))
    A, B, C = (pg.operands[r] for r in "ABC")
    sram = {"inp": math.prod(_region(d, at_res if res == "A" else tiled) for d in _free_dims(A))
            * threads,
            "wgt": math.prod(_region(d, at_res if res == "B" else tiled) for d in _free_dims(B))
            * threads}
    c_loops = pg.c_loops()
    ext = {lp.name: lp.extent for lp in pg.loops}
    ctile = math.prod(k[f"tile_{n}"] for n in c_loops)
    bias_tile = math.prod(k[f"tile_{n}"] for n in c_loops if n in pg.channel_loops)
    with_bias = has_bias(ep)
    sram["acc"] = (ctile + (bias_tile if with_bias else 0)) * threads
    for name in ("inp", "wgt", "acc"):
        depth = scratchpad(cfg, MemType[name.upper()]).depth
        if sram[name] > depth:
            return Pruned(k, f"the {name} tiles need {sram[name]} entries (all virtual threads), "
                             f"more than the {name} scratchpad's {depth}")
    kl = kernel_loops(pg, k)
    uops = math.prod(kl[2:])
    if uops > cfg.uop_depth // 2:
        return Pruned(k, f"the GEMM kernel of {uops} micro-ops exceeds half the micro-op buffer "
                         f"({cfg.uop_depth // 2}; the reset and GEMM kernels must fit together)")
    if any(e > MAX_LOOP_EXTENT for e in kl[:2]):
        return Pruned(k, f"a folded GEMM loop of {max(kl[:2])} iterations exceeds the 14-bit loop "
                         f"field (max {MAX_LOOP_EXTENT})")
    nbytes = {}
    for role, op, counter, elem in (("A", A, "inp_load_nbytes", cfg.inp_elem_bytes),
                                    ("B", B, "wgt_load_nbytes", cfg.wgt_elem_bytes)):
        ins = at_res if role == res else inside
        used = {v for d in op.dims for v, _ in d.terms}
        repeat = math.prod(ins[lp.name][0] for lp in pg.loops if lp.name not in used)
        nbytes[counter] = repeat * math.prod(_dim_sum(d, ins) for d in _free_dims(op)) * elem
    stores = math.prod(ext[n] // k[f"tile_{n}"] for n in c_loops)
    nbytes["acc_load_nbytes"] = stores * bias_tile * cfg.acc_elem_bytes if with_bias else 0
    nbytes["out_store_nbytes"] = math.prod(d.extent for d in _free_dims(C)) * cfg.out_elem_bytes
    # instructions: per store point and batch step, the load steps (loads + GEMM), reset, ALU, stores
    steps = math.prod(inside[lp.name][0] for lp in pg.loops if pg.roles[lp.name] == "ztile")
    batch = math.prod(inside[n][0] // (ext[n] // k[f"tile_{n}"]) for n in c_loops
                      if pg.roles[n] in ("plain", "shared"))
    a_free = _free_dims(A)
    a_loads = math.prod(_region(d, inside) for d in a_free[:-2]) if len(a_free) > 2 else 1
    c_free = _free_dims(C)
    per_tile_stores = math.prod(k[f"tile_{n}"] for n in c_loops[:-2]) if len(c_free) > 2 else 1
    insns = stores * (batch * steps * (a_loads + 2) + 2 + alu_count(cfg, ep) + per_tile_stores)
    if res is not None:
        # the resident operand's loads leave the load steps: one per iteration of its loop
        moved = a_loads if res == "A" else 1
        res_loads = (math.prod(_region(d, at_res) for d in a_free[:-2]) if res == "A"
                     and len(a_free) > 2 else 1)
        iters = math.prod(at_res[n][0] for n in orders.outer[:orders.outer.index(orders.resident_at) + 1])
        insns += iters * res_loads - stores * batch * steps * moved
    return KnobPoint(k, nbytes, sram, uops, insns)


def enumerate_points(cfg, pg: PackedGemm, epilogue: Sequence[tuple]
                     ) -> Iterator[Tuple[Dict[str, int], Any]]:
    """Every point of the domain, in a deterministic order, with its :func:`evaluate` result."""
    dom = knob_domain(pg)
    names = list(dom)
    for values in itertools.product(*[dom[n] for n in names]):
        point = dict(zip(names, values))
        yield point, evaluate(cfg, pg, epilogue, point)


def _rank(p: KnobPoint) -> Tuple:
    threads = math.prod(v for n, v in p.knobs.items() if n.startswith("vt_"))
    return (p.total_bytes, p.insns, {2: 0, 1: 1}.get(threads, 2), tuple(p.knobs.values()))


def tps_point(cfg, pg: PackedGemm, epilogue: Sequence[tuple],
              fixed: Optional[Mapping[str, int]] = None) -> Optional[KnobPoint]:
    """The Tiling Parameter Search point (fewest modelled DRAM bytes that fit), or None if no
    point fits. ``fixed`` restricts the search to the points with these knob values (e.g.
    ``{"order": 0}``: the stock loop order only)."""
    from vta_ext.executor import config_digest
    from vta_ext.templates.epilogue import normalize_epilogue

    fixed = dict(fixed or {})

    def search():
        best = None
        for point, res in enumerate_points(cfg, pg, epilogue):
            if any(point.get(n) != v for n, v in fixed.items()):
                continue
            if isinstance(res, KnobPoint) and (best is None or _rank(res) < _rank(best)):
                best = res
        return best
    # the search is deterministic in (program, configuration value, epilogue, fixed knobs): done
    # once, as the chooser, the build and the tuner's knob space each ask for it
    key = ("tps", config_digest(cfg), repr(normalize_epilogue(epilogue)), tuple(sorted(fixed.items())))
    best = pg.memo(key, search)
    return None if best is None else dataclasses.replace(best, knobs=dict(best.knobs))


def fallback_point(cfg, pg: PackedGemm, epilogue: Sequence[tuple]):
    """Every tile 1, one thread, the stock loop order (the original stack's fallback): its model,
    or the :class:`Pruned` reason it does not fit."""
    return evaluate(cfg, pg, epilogue, knob_defaults(pg))
