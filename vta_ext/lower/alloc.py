"""The scratchpad allocator: place every on-chip buffer of the lowered function in its scratchpad.

Allocation is a bump allocation per scope in the order of the TIR allocations. A buffer allocated
inside a virtual-thread loop gets one copy per thread (``stride`` elements apart). In-place ALU
stages alias their operand and share its storage. The sum must fit the scratchpad's depth
(:class:`vta_ext.memory.Scratchpad`), else :class:`SramOverflowError` names the buffers.
:func:`shared_buffers` finds the per-thread tiles that reuse-aware double buffering may load once
for both threads; :func:`resident_buffers` those loaded once per program (a resident operand), which
every thread may read from thread 0's copy.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..config import VTAConfig
from ..memory import INP_SCOPE, SCOPES, WGT_SCOPE, scratchpad_of_scope
from .ir import Dma, Loop, LoweringError, SramBuf

__all__ = ["SramOverflowError", "allocate", "count_threads", "shared_buffers", "resident_buffers"]


class SramOverflowError(LoweringError):
    """The on-chip tiles do not fit a scratchpad (message names the buffer(s))."""


def count_threads(items: list) -> int:
    """Number of virtual threads: the largest product of nested virtual-thread loop extents."""
    n = 1
    for it in items:
        if isinstance(it, Loop):
            inner = count_threads(it.body)
            n = max(n, inner * (it.extent if it.vthread else 1))
    return n


def allocate(cfg: VTAConfig, bufs: Dict[str, SramBuf], nthreads: int) -> Dict[str, int]:
    """Set ``base`` and ``stride`` of every buffer of ``bufs``; return the elements used per scope.

    Raises
    ------
    SramOverflowError
        If the buffers of a scope need more elements than its scratchpad has.
    """
    used = {s: 0 for s in SCOPES}
    roots = [b for b in bufs.values() if b.alias is None]
    for b in roots:
        n = b.nelems
        copies = nthreads if b.vthread else 1
        b.base = used[b.scope]
        b.stride = n
        used[b.scope] += n * copies
    for b in bufs.values():
        if b.alias is not None:
            r = b.root
            b.base, b.stride = r.base, r.stride
    over = []
    for scope, n in used.items():
        depth = scratchpad_of_scope(cfg, scope).depth
        if n > depth:
            detail = ", ".join(f"{b.name}: {b.nelems} elements"
                               + (f" x {nthreads} virtual threads" if b.vthread and nthreads > 1
                                  else "")
                               for b in roots if b.scope == scope)
            over.append(f"{scope} needs {n} elements but has {depth} ({detail})")
    if over:
        raise SramOverflowError("the tiles do not fit the on-chip buffers: " + "; ".join(over))
    return used


def _thread_loads(items: list) -> Tuple[set, List[Tuple[Dma, bool]]]:
    """The virtual-thread variables of ``items`` and every DMA of them, each with whether it runs
    inside a loop that is not a virtual-thread loop (so more than once per thread)."""
    vvars, dmas = set(), []

    def walk(nodes, looped):
        for n in nodes:
            if isinstance(n, Loop):
                if n.vthread:
                    vvars.add(n.var)
                walk(n.body, looped or not n.vthread)
            elif isinstance(n, Dma):
                dmas.append((n, looped))
    walk(items, False)
    return vvars, dmas


def _thread_independent(d: Dma, vvars: set) -> bool:
    """Whether DMA ``d`` moves the same data to the same place in every virtual thread."""
    affs = [d.dram_off, d.sram_off, *d.guards]
    for los, his in d.pads.values():
        affs += list(los) + list(his)
    return all(a.coef(v) == 0 for a in affs for v in vvars)


def _per_thread_loads(items: list, once: bool) -> List[str]:
    """Per-thread INP/WGT buffers (by root name, sorted) whose every load is independent of the
    virtual-thread variables and, with ``once``, outside every loop but the virtual-thread ones."""
    vvars, dmas = _thread_loads(items)
    ok: Dict[str, bool] = {}
    for d, looped in dmas:
        root = d.sram.root
        if d.kind != "load" or root.scope not in (INP_SCOPE, WGT_SCOPE) or not root.vthread:
            continue
        ok[root.name] = ok.get(root.name, True) and _thread_independent(d, vvars) and not (
            once and looped)
    return sorted(n for n, v in ok.items() if v)


def shared_buffers(items: list) -> List[str]:
    """Per-thread INP/WGT buffers whose every load is independent of the virtual-thread variables
    (both threads would load the same DRAM data), by root buffer name, sorted."""
    return _per_thread_loads(items, once=False)


def resident_buffers(items: list) -> List[str]:
    """Per-thread INP/WGT buffers loaded once per program with the same data in every virtual
    thread: every load is independent of the virtual-thread variables and outside every loop
    but the virtual-thread ones (a resident operand hoisted above the tile loops), by root
    buffer name, sorted. Nothing else writes these buffers, so after that load every thread
    may read thread 0's copy (:func:`~.codegen.lower_to_runtime` ``share_resident``)."""
    if count_threads(items) < 2:
        return []
    return _per_thread_loads(items, once=True)
