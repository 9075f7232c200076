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
planned body is ``[loads] [fill, GEMMs, epilogue] [store]`` (or with more ``[loads] [GEMMs]``
pairs before the store): the loads wait for the compute region before them (the GEMMs that read
the buffers they overwrite), the fill for the thread's previous store (the accumulator it
overwrites), the first GEMM after it for the loads, the store for the compute region; the first
loads are released right after the tile's last GEMM. A tile loop whose fill already followed its
loads (one reduction step) is re-planned the same way where it has two or more virtual threads
(:data:`OWN_STORE`). Where any sunk loop has another shape the sunk order is dropped and the
stage-based plan is kept (the note says why).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..isa import Stage
from .alloc import count_threads
from .ir import Dep, Dma, GemmKernel, Loop, Region
from .sync import insert_dependencies

__all__ = ["sink_fills", "late_fill", "SUNK", "ONE_THREAD", "OWN_STORE"]

_L, _C, _S = Stage.LOAD, Stage.COMPUTE, Stage.STORE

#: how :func:`sink_fills`'s note starts where it moved a fill
SUNK = "accumulator fills after the tile's loads"
#: how :func:`late_fill`'s note names the tile loops whose fill already followed the loads and
#: whose tokens it re-planned
OWN_STORE = "each thread's fill waits for its own store, loads released by the tile's last GEMM"
#: :func:`late_fill`'s note where ``threads_only`` keeps the fills of a one-thread program
ONE_THREAD = ("accumulator fills kept before the loads: one virtual thread (no thread's fill waits "
              "ahead of another thread's GEMMs)")


def _is_fill(node) -> bool:
    """Whether ``node`` is an accumulator fill (a padding-only LOAD of the accumulator)."""
    return isinstance(node, Dma) and node.acc_fill


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
    out, moved = _sink_all(items)
    return out, (_sunk_note(moved) if moved else _NOTHING_SUNK)


_NOTHING_SUNK = "accumulator fills kept before the loads: no fill is followed by loads and a GEMM"


def _sink_all(items: list) -> Tuple[list, List[str]]:
    """:func:`sink_fills`' items and the variables of the loops whose fills moved."""
    moved: List[str] = []
    return _sink(_walk(items, moved), moved, ""), moved


def _sunk_note(moved: List[str]) -> str:
    return f"{SUNK} (loop(s) {', '.join(sorted(set(v or 'top' for v in moved)))})"


def _deps(node, kind: str) -> list:
    return [(d.frm, d.to) for d in (node.before if kind == "before" else node.after)]


def _tile_shape(body: list) -> bool:
    """Whether a planned loop ``body`` is ``[loads] [fill, ...]`` then zero or more
    ``[loads] [compute]`` pairs, then ``[store]``, with the stage-based tokens of that order
    (store -> load on the back edge)."""
    if len(body) < 3 or len(body) % 2 == 0 or not all(isinstance(n, Region) for n in body):
        return False
    loads, comps, store = body[0:-1:2], body[1:-1:2], body[-1]
    if (any(n.stage != _L or not all(_is_load(x) for x in n.items) for n in loads)
            or any(n.stage != _C for n in comps) or store.stage != _S
            or not comps[0].items or not _is_fill(comps[0].items[0])):
        return False
    last = len(comps) - 1
    return (all(_deps(n, "before") == [(_S, _L) if k == 0 else (_C, _L)]
                and _deps(n, "after") == [(_L, _C)] for k, n in enumerate(loads))
            and all(_deps(n, "before") == [(_L, _C)]
                    and _deps(n, "after") == [(_C, _S) if k == last else (_C, _L)]
                    for k, n in enumerate(comps))
            and _deps(store, "before") == [(_C, _S)] and _deps(store, "after") == [(_S, _L)])


def _release_last(comp: Region) -> None:
    """Push ``comp``'s compute -> load token right after its last GEMM (the last instruction that
    reads the input and weight buffers), or at its end if it holds none."""
    gemms = [i for i, x in enumerate(comp.items) if isinstance(x, GemmKernel)]
    comp.items.insert(gemms[-1] + 1 if gemms else len(comp.items), Dep("push", _C, _L))


def _token(node, kind: str, pair) -> bool:
    return (isinstance(node, Region) and node.stage is None and len(node.items) == 1
            and node.items[0].kind == kind and (node.items[0].frm, node.items[0].to) == pair)


def _fill_tile(loop: Loop) -> bool:
    """Whether ``loop`` is a tile loop whose planned body holds a compute region that starts with
    an accumulator fill."""
    return not loop.vthread and any(isinstance(x, Region) and x.stage == _C and x.items
                                    and _is_fill(x.items[0]) for x in loop.body)


def _replan(items: list, sunk: frozenset, notes: List[str], native: Optional[List[str]] = None,
            kept: Optional[List[str]] = None, nested: bool = False) -> Tuple[list, int]:
    """The planned ``items`` with every sunk tile loop's tokens re-planned (module docstring):
    the number of sunk loops re-planned, and in ``notes`` why a sunk loop (its variable in
    ``sunk``) was not. With ``native`` (a list), a tile loop whose loads already come before its
    fill is re-planned too where it has the shape: its variable is added to ``native``, else why
    not to ``kept``. ``nested``: inside a loop that is not a virtual-thread loop, whose own
    back-edge tokens were planned for the stage-based order (not re-planned here)."""
    out, done, skip = [], 0, False
    for it in items:
        if skip:
            skip = False
            if _token(it, "pop", (_S, _L)):     # the stage-based plan's drain of the loop
                continue
        if not isinstance(it, Loop):
            out.append(it)
            continue
        body, n = _replan(it.body, sunk, notes, native, kept, nested or not it.vthread)
        done += n
        loop = Loop(it.var, it.extent, body, it.vthread)
        if not _fill_tile(loop):
            out.append(loop)
            continue
        moved = it.var in sunk
        if not moved and (native is None or not _is_load_region(body[0])):
            out.append(loop)
            continue
        why = None
        if nested:
            why = f"loop {it.var} is inside another tile loop"
        elif not (_tile_shape(body) and out and _token(out[-1], "push", (_S, _L))):
            why = f"loop {it.var} is not [loads] [fill, GEMMs] ([loads] [GEMMs])... [store]"
        if why is not None:
            (notes if moved else kept).append(why)
            out.append(loop)
            continue
        first, last, store = body[1], body[-2], body[-1]
        body[0].before = [Dep("pop", _C, _L)]
        first.before = [Dep("pop", _S, _C)]
        _wait_loads_after_fills(first)
        _release_last(last)      # the first loads wait for the tile's last GEMM only
        last.after = [Dep("push", _C, _S)]
        store.after = [Dep("push", _S, _C)]
        out[-1:] = [Region(None, [Dep("push", _C, _L)]), Region(None, [Dep("push", _S, _C)])]
        out += [loop, Region(None, [Dep("pop", _C, _L)]), Region(None, [Dep("pop", _S, _C)])]
        if moved:
            done += 1
        else:
            native.append(it.var)
        skip = True
    return out, done


def _wait_loads_after_fills(comp: Region) -> None:
    """Make the first instruction after ``comp``'s leading accumulator fills, not the first fill,
    wait for the loads: a fill writes only the accumulator, which no load touches, so it may run
    under the thread's loads."""
    k = next((i for i, x in enumerate(comp.items) if not _is_fill(x)), len(comp.items))
    comp.items.insert(k, Dep("pop", _L, _C))


def _is_load_region(node) -> bool:
    return isinstance(node, Region) and node.stage == _L


def _with_native(note: str, native: List[str], kept: List[str]) -> str:
    """``note`` followed by where the tiles whose loads already came first were re-planned
    (:data:`OWN_STORE`) and why not elsewhere."""
    parts = [note]
    if native:
        parts.append(f"{OWN_STORE} (loop(s) {', '.join(native)})")
    if kept:
        parts.append(f"stage-based tokens kept: {'; '.join(sorted(set(kept)))}")
    return "; ".join(parts)


def late_fill(items: list, threads_only: bool = False) -> Tuple[list, str]:
    """The token-planned items with each tile's accumulator fill after its loads, or the
    stage-based plan where that does not apply.

    With two or more virtual threads, a tile loop whose fill already follows its loads
    (``[loads] [fill, GEMMs] ([loads] [GEMMs, epilogue])... [store]``, e.g. one reduction step) is
    re-planned the same way (:data:`OWN_STORE`): in the stage-based plan its store -> next loads
    token runs through the compute module after every thread's store, so a thread's next fill
    waited behind the other threads' stores; now each thread's fill waits for its own store.

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
    threads = count_threads(items)
    if threads_only and threads < 2:
        return insert_dependencies(items), ONE_THREAD
    native: Optional[List[str]] = [] if threads >= 2 else None
    kept: List[str] = []
    sunk, moved = _sink_all(items)
    if moved:
        notes: List[str] = []
        planned, done = _replan(insert_dependencies(sunk), frozenset(moved), notes, native, kept)
        if not notes and done:
            return planned, _with_native(_sunk_note(moved), native or [], kept)
        why = "; ".join(sorted(set(notes))) or "no tile loop to re-plan"
        note = f"accumulator fills kept before the loads: {why}"
        native, kept = ([] if native is not None else None), []
    else:
        note = _NOTHING_SUNK
    planned, _ = _replan(insert_dependencies(items), frozenset(), [], native, kept)
    return planned, _with_native(note, native or [], kept)
