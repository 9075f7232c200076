"""The loop structure of a packed GEMM's schedule, derived from the loop roles alone.

* :func:`tiled_loops`: the loops a ``tile_`` knob splits;
* :func:`vt_loops`: the loops that may carry two virtual threads;
* :func:`loop_orders`: the loop orders of the schedule for each value of the ``order`` knob
  (:data:`ORDERS`), with the operand a resident order hoists;
* :func:`thread_padding`: the padding that gives an odd thread loop (output channels, or a plain
  loop of a stencil-unrolled layout) an even extent, so that it can carry two virtual threads
  (:func:`thread_paddings`: also the one to a multiple of four).

The knob space and its model (:mod:`.knobs`) and the schedule (:mod:`.schedule`) both read these;
neither imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from .plan import PackedGemm

__all__ = ["LoopOrders", "ORDERS", "BATCH_INNER", "batch_inner", "loop_orders", "vt_loops",
           "row_thread_loop", "tiled_loops", "thread_padding",
           "thread_paddings"]


def vt_loops(pg: PackedGemm) -> List[str]:
    """Loops that may carry two virtual threads: the first output-channel (``weight``) loop and the
    first image-row (``stencil``) loop that is not the last one, in that order of nesting; where
    there is no such image-row loop, a ``plain`` loop the instruction walks or one padded for the
    threads (:func:`row_thread_loop`, :func:`thread_padding`)."""

    def make():
        c = pg.c_loops()
        weight = [n for n in c if pg.roles[n] == "weight"]
        row = row_thread_loop(pg)
        if row is not None and pg.roles[row] == "plain" and not _plain_threads(pg, row):
            row = None
        return tuple(weight[:1] + ([row] if row is not None else []))
    return list(pg.memo("vt_loops", make))


def row_thread_loop(pg: PackedGemm) -> Optional[str]:
    """The spatial loop that may carry the second kind of virtual thread (the original's
    ``h_nthread``), or None: the first image-row (``stencil``) loop that is not the last one, else
    the first ``plain`` loop of more than one iteration.

    In a stencil-unrolled layout (``fused-rs``, ``fused-crs``, or a z over the filter columns)
    the output columns (or rows) are ``plain`` loops (the data's subscript of them holds no
    reduction dim), and the last image row is the store point's loop. Without the plain loop the
    only thread split left is the output channels', whose threads each load the same input tile:
    DeepBench layer 0 on ``pipelined`` (``fused-rs``, 2 output-channel blocks) loads its
    stencil-unrolled input twice and is load-bound (759,352 cycles); split over the output
    columns, it loads it once (678,715).

    A plain loop carries threads where the instruction walks it (y over the output pixels) and,
    for a full loop, only in the twin padded for them (:func:`thread_padding`), which the choice
    times next to the embedding's own program: the knob model's estimate of a full plain loop's
    threads is not always right (offered on every embedding, it took slower points than before
    on the fused-crs stems of DeepBench on ``default``, layer 15: 3,917,171 -> 4,726,245 cycles)."""
    c = pg.c_loops()
    stencil = [n for n in c if pg.roles[n] == "stencil"][:-1]
    if stencil:
        return stencil[0]
    ext = {lp.name: lp.extent for lp in pg.loops}
    plain = [n for n in c if pg.roles[n] == "plain" and ext[n] > 1]
    return plain[0] if plain else None


def _plain_threads(pg: PackedGemm, name: str) -> bool:
    """Whether the plain loop ``name`` may carry threads: the tile loop of a dim the instruction
    walks (y over the output pixels, the weights bound to A), or a full loop (its dim not walked)
    whose dim the embedding pads, which only :func:`thread_padding` does (the solver pads the dims
    it walks)."""
    lp = pg.loop[name]
    return lp.kind == "tile" or (lp.kind == "full" and pg.embedding.padding.get(lp.dim, 0) > 0)


def thread_padding(pg: PackedGemm) -> Optional[Tuple[str, int]]:
    """``(workload dim, elements)``: the padding of one more tile that makes a thread loop of
    ``pg`` (:func:`vt_loops`) even, or None when it needs none: the first output-channel
    (``weight``) loop's, else that of a full ``plain`` or image-row (``stencil``) thread loop
    (:func:`row_thread_loop`).

    A virtual-thread count must divide its loop's outer tiles (:mod:`.knobs`), so an odd weight
    loop (1000 output channels: 63 blocks) never carries two threads: its weight loads cannot
    overlap its GEMMs under the weight-streaming orders. One more block of zero weights (the
    embedding's padding of that dim, as the solver pads it) makes the loop even. Likewise an odd
    plain loop (DeepBench layer 0's 341 output columns) takes one more column of zero input, whose
    output is computed and dropped by the unpack, and so does an odd image-row loop (squeezenet's
    27 x 27 squeeze convs, one output block: 27 rows in 9 or 27 tiles, never two threads) one
    more row. Where the input's padded dim is one the DMA pads (a whole inner dim,
    ``codegen.plan``), the zero input rows are the DMA's and the input is the producer's layout;
    the padded output holds the stock blocked layout as its first elements, which the consumers
    read in place (``vta_ext.packing.blocked_prefix``), so neither side costs a host pass. None
    when the loop is even, has one tile, or is the tile loop of a dim walked with a stride (its
    padding would not be one tile)."""
    paddings = thread_paddings(pg)
    return paddings[0] if paddings else None


def thread_paddings(pg: PackedGemm) -> List[Tuple[str, int]]:
    """The paddings that let the odd thread loop of :func:`thread_padding` carry two threads,
    fewest tiles first: one more tile (an even loop) and, where that is not already one, the
    fewest more tiles that make the loop a multiple of four.

    An even loop of ``2 p`` tiles with ``p`` prime splits only into ``p`` tiles per outer step
    (two outer tiles, one per thread) or into 2 (``p`` outer tiles, odd): where ``p`` tiles of
    two threads do not fit the accumulator, neither carries threads. RegNetX-1.6GF's 912 output
    channels (57 blocks) on 7x7 pixels: 58 blocks are 2 x 29, and 2 x 29 x 49 accumulator rows
    exceed the 2,048 of ``pipelined``; 60 blocks split as 6 outer tiles of 10 for two threads,
    whose weight loads overlap the GEMMs. Empty when the loop needs no padding."""
    weight = [lp for lp in pg.loops if pg.roles[lp.name] == "weight"][:1]
    if weight and weight[0].name in vt_loops(pg):
        extra = _more_tiles(pg, weight[0])
        if extra:
            return extra
    row = row_thread_loop(pg)
    if row is not None and pg.roles[row] in ("plain", "stencil") and pg.loop[row].kind == "full":
        return _more_tiles(pg, pg.loop[row])
    return []


def _more_tiles(pg: PackedGemm, lp) -> List[Tuple[str, int]]:
    """``(dim, elements)`` of one more tile of the odd loop ``lp`` and, where that does not make
    a multiple of four, of the three more that do (a full loop's tile: one element; a walked
    dim's: its factor); empty when ``lp`` is even, has one tile, or has a strided factor."""
    if lp.extent % 2 == 0 or lp.extent == 1 or lp.kind == "sub":
        return []
    if lp.kind == "full":
        size = 1
    else:
        factor = pg.embedding.walked[lp.dim]
        if factor.stride != 1:
            return []
        size = factor.size
    tiles = [1] if (lp.extent + 1) % 4 == 0 else [1, 3]
    return [(lp.dim, n * size) for n in tiles]


def tiled_loops(pg: PackedGemm) -> List[str]:
    """Loops with a tile knob: the output's free loops (output order), then the z tile loops."""
    return pg.c_loops() + [lp.name for lp in pg.loops if pg.roles[lp.name] == "ztile"]


@dataclass(frozen=True)
class LoopOrders:
    """Loop orders of the schedule (free loop names).

    Attributes
    ----------
    outer : tuple of str
        Outer output loops, outermost first; the last one is the store point.
    batch : tuple of str
        GEMM-stage loops above the load point (their inner tiles).
    ztile : tuple of str
        Tile loops of the dims z walks (split: outer parts above, inner parts below the load point).
    kernel : tuple of str
        Loops of one load step's GEMM kernel, outermost first (the z-tile inner parts first).
    vthreads : tuple of str
        Loops that may carry virtual threads, in the order their splits are made.
    resident : str or None
        The operand (``"A"`` or ``"B"``) whose cache is hoisted out of the inner output tiles
        (``order`` 1: the operator's weight tensor, 2: its data tensor), or None (``order`` 0).
    resident_at : str or None
        The outer loop the resident operand's cache is computed at (its load is issued once per
        iteration of that loop and reused by every output tile below it).
    """

    outer: Tuple[str, ...]
    batch: Tuple[str, ...]
    ztile: Tuple[str, ...]
    kernel: Tuple[str, ...]
    vthreads: Tuple[str, ...]
    resident: Optional[str] = None
    resident_at: Optional[str] = None


#: values of the ``order`` knob (:func:`loop_orders`); ``order + BATCH_INNER`` is ``order`` with the
#: plain (data-only, non-stencil) output loops inside the load point (:func:`batch_inner`)
ORDERS = {0: "stock", 1: "weight-resident", 2: "data-resident",
          3: "stock, batch inner", 4: "weight-resident, batch inner", 5: "data-resident, batch inner"}
#: the offset of the batch-inner orders in :data:`ORDERS`
BATCH_INNER = 3


def batch_inner(order: int) -> bool:
    """Whether loop order ``order`` puts the plain output loops inside the load point.

    The stock rule loads the data and runs the GEMM kernel once per batch step (a plain loop's
    iteration: an image). In a stencil-unrolled layout (fused-rs, fused-crs) an output column is a
    plain loop too, so the stock rule issues one input LOAD and one GEMM instruction per output
    pixel (one issue cycle per few micro-ops); inside the load point one LOAD brings the tile's
    pixels and one GEMM instruction walks them."""
    return order >= BATCH_INNER


def loop_orders(pg: PackedGemm, order: int = 0) -> LoopOrders:
    """The loop orders of the schedule of ``pg`` (module docstring), from the loop roles.

    ``order`` (the knob of that name): 0 is the stock rule (batch, image rows but the last,
    output channels, the last row; both caches at the load point); 1 (weight-resident) puts the
    loops the weight tensor sees outermost (shared, then output channels), then the batch and the
    image rows, and hoists the weight tensor's cache to the innermost of the weight loops; 2
    (data-resident) puts the output-channel loops innermost (shared, batch, rows, output channels)
    and hoists the data tensor's cache to the innermost loop above them. The hoisted cache holds the
    whole reduction of its tile; the other operand stays at the load point. ``order`` 3, 4, 5 are
    0, 1, 2 with the plain loops in the GEMM kernel below the load point (:func:`batch_inner`).
    """
    return pg.memo(("loop_orders", order), lambda: _loop_orders(pg, order))


def _loop_orders(pg: PackedGemm, order: int) -> LoopOrders:
    c = pg.c_loops()
    role = pg.roles
    shared = [n for n in c if role[n] == "shared"]
    plain = [n for n in c if role[n] == "plain"]
    batch = [n for n in c if role[n] in ("shared", "plain")]
    stencil = [n for n in c if role[n] == "stencil"]
    weight = [n for n in c if role[n] == "weight"]
    last = stencil[-1:]
    if order not in ORDERS:
        raise ValueError(f"order={order!r}; valid orders: {', '.join(map(str, ORDERS))}")
    inner = batch_inner(order)
    order = order - BATCH_INNER if inner else order
    resident = resident_at = None
    if order == 0:
        outer = batch + stencil[:-1] + weight + last
    elif order == 1:
        outer = shared + weight + plain + stencil
        above = shared + weight
        resident = "A" if pg.embedding.binding["A"] == pg.embedding.workload.inputs[1].name else "B"
        resident_at = above[-1] if above else None
    elif order == 2:
        outer = shared + plain + stencil + weight
        above = shared + plain + stencil
        resident = "A" if pg.embedding.binding["A"] == pg.embedding.workload.inputs[0].name else "B"
        resident_at = above[-1] if above else None
    ztile = [lp.name for lp in pg.loops if role[lp.name] == "ztile"]
    reduce_ = [lp.name for lp in pg.loops if role[lp.name] == "reduce"]
    if inner:
        # the plain loops leave the GEMM stage's loops above the load point for the kernel, after
        # the last image row (so the first two non-unit loops, which fold into the instruction's
        # loop fields, are the z tile and the image columns of the tile)
        batch = shared
        kernel = ztile + last + plain + reduce_[::-1] + weight + stencil[:-1]
    else:
        kernel = ztile + last + reduce_[::-1] + weight + stencil[:-1]
    vts = vt_loops(pg)
    # the first-row split is made first, then the output-channel one (the original's order)
    vts = [n for n in vts if role[n] != "weight"] + [n for n in vts if role[n] == "weight"]
    return LoopOrders(tuple(outer), tuple(batch), tuple(ztile), tuple(kernel), tuple(vts),
                      resident, resident_at)
