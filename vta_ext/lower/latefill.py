"""Sink a tile's accumulator fill below the tile's input loads (an option of
:func:`vta_ext.lower.codegen.lower_to_runtime`).

The schedule emits a tile as ``[fill] [loads] [GEMMs] [epilogue] [store]``. The fill (a
padding-only LOAD of the accumulator, run by the compute module) and the loads (INP or WGT, run by
the load module) touch different buffers on different modules, so their program order carries no
data dependency. But it decides the compute module's regions (:mod:`.sync`): with the fill first,
it is a region of its own, and a virtual-thread loop emits it for every thread before any thread's
GEMMs (``fill A, fill B, loads, GEMMs A, GEMMs B``): the second thread's fill waits for that
thread's previous store while the compute module has nothing else to do. Below the loads the fill
joins the GEMM region (``loads, fill A, GEMMs A, fill B, GEMMs B``), so one thread's fill waits
for its store under the other thread's GEMMs. The token planner runs after this pass and plans
the new order, in which a tile's loads follow the previous tile's store: the planner routes that
stage change as a store -> load token, so the next tile's loads wait for the store, which
serialises the three modules. :func:`late_fill` therefore re-plans the tokens of a tile loop whose
planned body is exactly ``[loads] [fill, GEMMs, epilogue] [store]``: the loads wait for the
compute region before them (the GEMMs that read the buffers they overwrite), the compute region
for the loads and for the thread's previous store (the accumulator the fill overwrites), the store
for the compute region; the loads are released right after the tile's last GEMM. Where any sunk
loop has another shape the sunk order is dropped and the
stage-based plan is kept (the note says why).
"""
from __future__ import annotations

from typing import List, Tuple

from ..isa import MemType, Stage
from .alloc import count_threads
from .ir import Dep, Dma, GemmKernel, Loop, Region
from .sync import insert_dependencies

__all__ = ["sink_fills", "late_fill", "SUNK", "ONE_THREAD"]

_L, _C, _S = Stage.LOAD, Stage.COMPUTE, Stage.STORE

#: how :func:`sink_fills`'s note starts where it moved a fill
SUNK = "accumulator fills after the tile's loads"
#: :func:`late_fill`'s note where ``threads_only`` keeps the fills of a one-thread program
ONE_THREAD = ("accumulator fills kept before the loads: one virtual thread (no thread's fill waits "
              "ahead of another thread's GEMMs)")


def _is_fill(node) -> bool:
    """Whether ``node`` is an accumulator fill (a padding-only LOAD of the accumulator)."""
    return isinstance(node, Dma) and node.fill and node.mem == MemType.ACC


def _is_load(node) -> bool:
    """Whether ``node`` is a DMA of the load module (it writes the input or weight buffer)."""
    return isinstance(node, Dma) and node.stage == Stage.LOAD


def _sink(body: list, moved: List[str], var: str) -> list:
    """``body`` with each run ``[fills] [loads] GEMM`` rewritten ``[loads] [fills] GEMM``."""
    out = list(body)
    i = 0
    while i < len(out):
        j = i
        while j < len(out) and _is_fill(out[j]):
            j += 1
        k = j
        while k < len(out) and _is_load(out[k]):
            k += 1
        if j > i and k > j and k < len(out) and isinstance(out[k], GemmKernel):
            out[i:k] = out[j:k] + out[i:j]
            moved.append(var)
            i = k
        else:
            i = max(i + 1, j)
    return out


def _walk(items: list, moved: List[str], var: str = "") -> list:
    out = []
    for it in items:
        if isinstance(it, Loop):
            body = _sink(_walk(it.body, moved, it.var), moved, it.var)
            out.append(Loop(it.var, it.extent, body, it.vthread))
        else:
            out.append(it)
    return out


def sink_fills(items: list) -> Tuple[list, str]:
    """Move every accumulator fill that precedes a tile's loads to just after them.

    Parameters
    ----------
    items : list
        The lowered items before :func:`~.sync.insert_dependencies` (not changed).

    Returns
    -------
    tuple
        ``(items, note)``: the new items and one line saying in which loops the fill moved, or
        that no loop has a fill followed by loads and a GEMM.
    """
    moved: List[str] = []
    out = _sink(_walk(items, moved), moved, "")
    if moved:
        return out, f"{SUNK} (loop(s) {', '.join(sorted(set(v or 'top' for v in moved)))})"
    return out, "accumulator fills kept before the loads: no fill is followed by loads and a GEMM"


def _deps(node, kind: str) -> list:
    return [(d.frm, d.to) for d in (node.before if kind == "before" else node.after)]


def _tile_shape(body: list) -> bool:
    """Whether a planned loop ``body`` is ``[loads] [fill, ...] [store]`` with the stage-based
    tokens of that order (store -> load on the back edge)."""
    if len(body) != 3 or not all(isinstance(n, Region) for n in body):
        return False
    load, comp, store = body
    return ((load.stage, comp.stage, store.stage) == (_L, _C, _S) and bool(comp.items)
            and _is_fill(comp.items[0]) and all(_is_load(x) for x in load.items)
            and _deps(load, "before") == [(_S, _L)] and _deps(load, "after") == [(_L, _C)]
            and _deps(comp, "before") == [(_L, _C)] and _deps(comp, "after") == [(_C, _S)]
            and _deps(store, "before") == [(_C, _S)] and _deps(store, "after") == [(_S, _L)])


def _token(node, kind: str, pair) -> bool:
    return (isinstance(node, Region) and node.stage is None and len(node.items) == 1
            and node.items[0].kind == kind and (node.items[0].frm, node.items[0].to) == pair)


def _replan(items: list, notes: List[str], nested: bool = False) -> Tuple[list, int]:
    """The planned ``items`` with every sunk tile loop's tokens re-planned (module docstring):
    the number of loops re-planned, and in ``notes`` why a sunk loop was not. ``nested``: inside
    a loop that is not a virtual-thread loop, whose own back-edge tokens were planned for the
    stage-based order (not re-planned here)."""
    out, done, skip = [], 0, False
    for it in items:
        if skip:
            skip = False
            if _token(it, "pop", (_S, _L)):     # the stage-based plan's drain of the loop
                continue
        if not isinstance(it, Loop):
            out.append(it)
            continue
        body, n = _replan(it.body, notes, nested or not it.vthread)
        done += n
        loop = Loop(it.var, it.extent, body, it.vthread)
        sunk = [x for x in body if isinstance(x, Region) and x.stage == _C and x.items
                and _is_fill(x.items[0])]
        if it.vthread or not sunk:
            out.append(loop)
            continue
        if nested:
            notes.append(f"loop {it.var} is inside another tile loop")
            out.append(loop)
            continue
        if not (_tile_shape(body) and out and _token(out[-1], "push", (_S, _L))):
            notes.append(f"loop {it.var} is not [loads] [fill, GEMMs, epilogue] [store]")
            out.append(loop)
            continue
        load, comp, store = body
        load.before = [Dep("pop", _C, _L)]
        comp.before = [Dep("pop", _L, _C), Dep("pop", _S, _C)]
        comp.after = [Dep("push", _C, _S)]
        last = max(i for i, x in enumerate(comp.items) if isinstance(x, GemmKernel))
        comp.items.insert(last + 1, Dep("push", _C, _L))   # the loads wait for the last GEMM only
        store.after = [Dep("push", _S, _C)]
        out[-1:] = [Region(None, [Dep("push", _C, _L)]), Region(None, [Dep("push", _S, _C)])]
        out += [loop, Region(None, [Dep("pop", _C, _L)]), Region(None, [Dep("pop", _S, _C)])]
        done += 1
        skip = True
    return out, done


def late_fill(items: list, threads_only: bool = False) -> Tuple[list, str]:
    """The token-planned items with each tile's accumulator fill after its loads, or the
    stage-based plan where that does not apply.

    Parameters
    ----------
    items : list
        The lowered items before :func:`~.sync.insert_dependencies`.
    threads_only : bool
        Only where the program has two or more virtual threads. In the stage-based order every
        thread's fill runs before the first thread's GEMMs, so a later thread's fill, which waits
        for that thread's previous store, holds the compute module; the late fill runs it under
        the other thread's GEMMs. With one thread the fill delays only its own GEMMs in either
        order, and below the loads it also waits for them (it ran under them before): the
        stage-based plan is kept (:data:`ONE_THREAD`).

    Returns
    -------
    tuple
        ``(planned items, note)``: the note says where the fills moved or why they did not.
    """
    if threads_only and count_threads(items) < 2:
        return insert_dependencies(items), ONE_THREAD
    sunk, note = sink_fills(items)
    if not note.startswith(SUNK):
        return insert_dependencies(items), note
    notes: List[str] = []
    planned, done = _replan(insert_dependencies(sunk), notes)
    if notes or not done:
        why = "; ".join(sorted(set(notes))) or "no tile loop to re-plan"
        return insert_dependencies(items), f"accumulator fills kept before the loads: {why}"
    return planned, note
