"""Start the first GEMM on the first chunk of a resident tile (an option of
:func:`vta_ext.lower.codegen.lower_to_runtime`).

A resident operand tile (the weights of a weight-resident order, loaded once above the tile
loops) is one LOAD at the start of the program, and the first tile's GEMM waits for all of it
and for the tile's first load step. Where that GEMM walks the resident tile along one of its
folded loops in contiguous slices (one filter row per iteration, say), the LOAD is split along
that loop into ``chunks`` LOADs: the first stays where the whole tile was loaded (with the
tokens the planner gave it), the others follow the first tile's first load step (thread 0's,
before any other thread's), one load -> compute token each; in the first tile the GEMM runs as ``chunks`` GEMMs, each waiting
for its slice's token. Every later tile runs as before. The first GEMM then starts once the
first slice and the first load step are in, and the rest of the tile loads under it.

:func:`plan_early_start` finds where this applies (or says in one line why not);
:func:`early_start_saving` prices it with the cycle model's durations of the instructions
involved (``lower_to_runtime(early_start=None)`` takes it where that is positive);
:mod:`.codegen` emits it (:class:`EarlyStart`). The token counts stay balanced: the load module
pushes ``chunks - 1`` more tokens, the compute module pops as many.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from ..config import VTAConfig
from ..isa import MemType, Stage
from .ir import Alu, Dep, Dma, GemmCall, GemmKernel, Loop, Region

__all__ = ["EarlyStart", "plan_early_start", "chunk_kernel", "early_start_saving", "EARLY",
           "DECLINED"]

_L, _C = Stage.LOAD, Stage.COMPUTE

#: how the program's note starts where the first GEMM starts on a chunk of the resident tile
EARLY = "first GEMM starts on the first chunk of the resident operand"
#: how the note starts where the split applies but its estimate does not pay
DECLINED = "no early start: the estimate prices"


@dataclass
class EarlyStart:
    """Where the resident tile's load is split and the first tile's GEMM chunked.

    Attributes
    ----------
    dma : Dma
        The resident tile's LOAD (emitted as its first chunk where it stood).
    load : Region
        The first tile's first load step: the other chunks follow thread 0's copy of it.
    gemm : GemmKernel
        The first GEMM on the resident tile, run chunk by chunk in the first tile.
    var : str
        The folded loop of ``gemm`` the chunks split.
    chunks : int
        How many chunks (a divisor of that loop's extent).
    size : int
        SRAM elements of one chunk (contiguous in SRAM and in DRAM).
    first : tuple of str
        The loop variables that are 0 in the first tile (the loops around ``gemm``).
    """

    dma: Dma
    load: Region
    gemm: GemmKernel
    var: str
    chunks: int
    size: int
    first: Tuple[str, ...]
    #: the virtual threads whose first GEMMs wait for the whole tile (all of them share it)
    threads: int = 1
    #: the compute region of ``gemm`` (its fill, the GEMM and the epilogue of the first tile)
    region: Optional[Region] = None

    @property
    def per_chunk(self) -> int:
        """Iterations of the split loop in one chunk."""
        return dict(self.gemm.loops)[self.var] // self.chunks

    @property
    def condition(self) -> str:
        """The Python condition of the first tile in the generated code (``"True"`` outside
        every loop)."""
        return " and ".join(f"{v} == 0" for v in self.first) or "True"


def chunk_kernel(es: EarlyStart, r: int) -> GemmKernel:
    """The GEMM of chunk ``r``: ``es.gemm`` with its split loop restricted to that chunk's
    iterations (every operand's offset shifted by the chunk's first iteration)."""
    m = es.per_chunk
    shift = r * m

    def moved(opnd):
        if opnd is None:
            return None
        buf, idx = opnd
        c = idx.coef(es.var)
        # (a chunk of one iteration drops the loop: its variable is that iteration's)
        return buf, (idx if m > 1 else idx.without({es.var})) + c * shift

    def walk(nodes):
        out = []
        for n in nodes:
            if isinstance(n, Loop):
                out.append(Loop(n.var, n.extent, walk(n.body), n.vthread))
            else:
                out.append(GemmCall(n.reset, moved(n.acc), moved(n.inp), moved(n.wgt)))
        return out
    loops = [(v, m if v == es.var else e) for v, e in es.gemm.loops if v != es.var or m > 1]
    return GemmKernel(es.gemm.reset, loops, walk(es.gemm.body))


def _top(items):
    """The top-level items, virtual-thread loops looked through."""
    for it in items:
        if isinstance(it, Loop) and it.vthread:
            yield from _top(it.body)
        else:
            yield it


def _walk(items, loops=()):
    """``(node, enclosing non-virtual-thread loop variables, region)`` of every region and every
    item of a region, in program order."""
    for it in items:
        if isinstance(it, Loop):
            yield from _walk(it.body, loops if it.vthread else loops + (it.var,))
        elif isinstance(it, Region):
            yield it, loops, None
            for x in it.items:
                yield x, loops, it


def _is_pop_lc(x) -> bool:
    return isinstance(x, Dep) and x.kind == "pop" and x.frm == _L and x.to == _C


def _is_push_lc(x) -> bool:
    return isinstance(x, Dep) and x.kind == "push" and x.frm == _L and x.to == _C


def _reads(g: GemmKernel, root) -> Optional[str]:
    """Which operand (``"inp"`` or ``"wgt"``) of ``g``'s calls is the buffer ``root``."""
    def calls(nodes):
        for n in nodes:
            if isinstance(n, Loop):
                yield from calls(n.body)
            else:
                yield n
    for c in calls(g.body):
        for role in ("inp", "wgt"):
            opnd = getattr(c, role)
            if opnd is not None and opnd[0].root is root:
                return role
    return None


def plan_early_start(cfg: VTAConfig, items: list, once: List[str], nthreads: int,
                     base_of: Callable, chunks: Optional[int] = None
                     ) -> Tuple[Optional[EarlyStart], str]:
    """Where the resident tile's load can be split for the first GEMM (module docstring), after
    the token planner: ``(plan, note)``, or ``(None, why not)``.

    Parameters
    ----------
    cfg : VTAConfig
    items : list
        The planned items (:mod:`.sync`'s regions).
    once : list of str
        The resident tiles loaded once by thread 0 (``share_resident``).
    nthreads : int
        Virtual threads of the program.
    base_of : callable
        SRAM element index of a buffer's thread-0 copy (the emitter's).
    chunks : int, optional
        How many chunks; None: one per iteration of the split loop.
    """
    from .uops import gemm_kernel

    top = list(_top(items))
    regions = [it for it in top if isinstance(it, Region) and it.stage is not None]
    if not regions or regions[0].stage != _L or len(regions[0].items) != 1 \
            or not isinstance(regions[0].items[0], Dma):
        return None, ("no early start: the program does not start with the resident operand's "
                      "load")
    dma = regions[0].items[0]
    root = dma.sram.root
    if dma.fill or dma.cpu or dma.pads or dma.guards or dma.pad_min or dma.x is None \
            or (dma.y is not None and dma.y[1] != 1) or dma.x[2] != 1 or dma.x[3] != 1 \
            or dma.sram_off.c or dma.dram_off.c:
        return None, ("no early start: the resident operand's load is not one contiguous, unpadded "
                      "transfer")
    if nthreads > 1 and root.name not in once:
        return None, ("no early start: every virtual thread loads its own copy of the resident "
                      "operand")
    load = gemm = None
    first: Tuple[str, ...] = ()
    for x, loops, region in _walk(items):
        if isinstance(x, Region):
            if x is regions[0] or x.stage is None:
                continue
            if load is None and x.stage != _L and not any(
                    isinstance(y, GemmKernel) or _is_pop_lc(y) for y in x.before + x.items):
                continue        # (an accumulator fill or bias load before the first load step)
            if load is None:
                if x.stage != _L or not loops or not any(_is_push_lc(d) for d in x.after):
                    return None, ("no early start: the first tile does not start with a load "
                                  "step that signals the compute module")
                load, first = x, loops
            elif x.stage == _L:
                return None, "no early start: another load step precedes the first GEMM"
            elif x.stage == _C and loops == first and _is_pop_lc(next(iter(x.before), None)) \
                    and x.items and isinstance(x.items[0], GemmKernel):
                gemm, at = x.items[0], x
                break
            continue
        if load is None or region is None or region.stage != _C:
            continue
        if isinstance(x, Dma) and (x.sram.root is root):
            break
        if _is_pop_lc(x):
            i = region.items.index(x)
            nxt = region.items[i + 1] if i + 1 < len(region.items) else None
            if isinstance(nxt, GemmKernel) and loops == first:
                gemm, at = nxt, region
            break
        if isinstance(x, GemmKernel):
            break
    if gemm is None:
        return None, "no early start: no GEMM waits for the first tile's load step"
    role = _reads(gemm, root)
    if role != {MemType.WGT: "wgt", MemType.INP: "inp"}.get(dma.mem):
        return None, "no early start: the first GEMM does not read the resident operand"
    spec, dparts = gemm_kernel(cfg, gemm, base_of, {v: 0 for v in first})
    k = ("acc", "inp", "wgt").index(role)
    if not dparts[k].is_const:
        return None, "no early start: the first GEMM's resident operand moves with the tile"
    folded, uops = spec[2], spec[3]
    lo = min(u[k] for u in uops) + dparts[k].k
    hi = max(u[k] for u in uops) + dparts[k].k
    start, total = base_of(dma.sram) + dma.sram_off.k, dma.x[1]
    best = None
    for j, (var, _) in enumerate(gemm.loops):
        ext, f = folded[j][0], folded[j][1 + k]
        rest = sum((e - 1) * fo[1 + k] for i, (e, *_) in enumerate(folded) if i != j
                   for fo in [folded[i]])
        if f <= 0 or ext < 2 or ext * f != total or lo < start or hi + rest >= start + f \
                or any(fo[1 + k] < 0 for fo in folded):
            continue
        best = (var, ext, f)
        break
    if best is None:
        return None, ("no early start: no folded loop of the first GEMM walks the resident "
                      "operand in contiguous slices")
    var, ext, f = best
    n = ext if chunks is None else chunks
    if n < 2 or ext % n:
        return None, f"no early start: {n} chunk(s) do not divide the loop of {ext} slices"
    es = EarlyStart(dma, load, gemm, var, n, f * (ext // n), first, nthreads, at)
    return es, (f"{EARLY} ({dma.sram.name} in {n} chunks of {es.size} element(s) along "
                f"{var}, the first GEMM in {n})")


def _calls(nodes) -> int:
    """Micro-ops of one pass of a kernel body (its unrolled loops)."""
    return sum(n.extent * _calls(n.body) if isinstance(n, Loop) else 1 for n in nodes)


def _dma_cycles(cfg: VTAConfig, d: Dma, x: Optional[int] = None) -> float:
    """The cycle model's duration of ``d``'s transfers (``x`` elements per row instead of its
    own), padding not counted."""
    from ..sim.cycles import timing

    kind = {MemType.WGT: "WGT", MemType.INP: "INP", MemType.UOP: "UOP"}.get(d.mem, "ACC")
    X = (d.x[1] if d.x else 1) if x is None else x
    Y = d.y[1] if d.y else 1
    n = 1
    for _, ext, _, _ in d.cpu:
        n *= ext
    if d.fill:          # padding only: the elements it writes, no DRAM byte
        return timing(cfg).dma(kind).cycles(n, 0, 0, X)
    return timing(cfg).dma(kind).cycles(n, Y, n * X * Y * cfg.elem_bytes(d.mem))


def early_start_saving(cfg: VTAConfig, es: EarlyStart) -> float:
    """Estimated cycles the split of ``es`` saves, from the cycle model's durations of the
    instructions involved (:func:`vta_ext.sim.cycles.timing`); negative where it costs.

    Without it the first GEMM (``g`` cycles after its micro-op load ``u``) ends at
    ``R + L + u + g`` (``R`` the resident tile's load, ``L`` the first load step). With it, the
    slices load one after the other (``R_c`` each, fixed costs included), the first before the
    load step and the others after it, and chunk ``r`` runs (``u``, then its share of ``g`` and
    one more instruction's fixed cost) once slice ``r`` and chunk ``r - 1`` are done. With one
    virtual thread that is the saving (the next load step waits for this GEMM either way). With
    ``t`` threads sharing the tile the next thread's first GEMM also waits for its own load step,
    queued after every slice: the saving is how much earlier that GEMM can start, the later of
    the first thread's GEMM plus the rest of its region (fill and epilogue) and the load module's
    ``R`` (or the slices) plus ``t`` load steps. Less one micro-op load of the whole GEMM,
    which the next tile then makes."""
    from ..sim.cycles import timing

    costs = timing(cfg)
    n = es.chunks
    R = _dma_cycles(cfg, es.dma)
    Rc = _dma_cycles(cfg, es.dma, es.size)
    L = sum(_dma_cycles(cfg, d) for d in es.load.items if isinstance(d, Dma))
    uops = _calls(es.gemm.body)
    steps = 1
    for _, ext in es.gemm.loops:
        steps *= ext
    u = costs.dma("UOP").cycles(1, 1, uops * cfg.elem_bytes(MemType.UOP))
    g = costs.gemm_fixed + uops * steps * costs.gemm
    before = R + L + u + g
    after = 0.0
    for r in range(n):
        after = max(after, Rc + L + r * Rc) + u + costs.gemm_fixed \
            + uops * (steps // n) * costs.gemm
    # (the first tile no longer loads the whole GEMM's micro-ops, so the next tile does: ``u``
    # more on the compute module, which a compute-bound program pays; DB91 without epilogue on
    # ``pipelined``: 30 cycles earlier for the second thread, 117 for that load, 87 slower)
    if es.threads == 1:
        return before - after - u
    rest = 0.0
    for x in (es.region.items if es.region is not None else []):
        if isinstance(x, Dma):
            rest += _dma_cycles(cfg, x)
        elif isinstance(x, Alu):
            count = 1
            for lp in x.loops:
                count *= lp[1]
            rest += costs.alu_fixed + count * (costs.alu_imm if x.use_imm else costs.alu_vec)
    loads = es.threads * L + u
    return max(before + rest, R + loads) - max(after + rest, n * Rc + loads) - u
