"""The scratchpad allocator: place every on-chip buffer of the lowered function in its scratchpad.

Allocation is a bump allocation per scope in the order of the TIR allocations. A buffer allocated
inside a virtual-thread loop gets one copy per thread (``stride`` elements apart). In-place ALU
stages alias their operand and share its storage. The sum must fit the scratchpad's depth
(:class:`vta_ext.memory.Scratchpad`), else :class:`SramOverflowError` names the buffers.
:func:`shared_buffers` finds the per-thread tiles that reuse-aware double buffering may load once
for both threads.
"""
from __future__ import annotations

from typing import Dict, List

from ..config import VTAConfig
from ..memory import INP_SCOPE, SCOPES, WGT_SCOPE, scratchpad_of_scope
from .ir import Dma, Loop, LoweringError, SramBuf

__all__ = ["SramOverflowError", "allocate", "count_threads", "shared_buffers"]


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


def shared_buffers(items: list) -> List[str]:
    """Per-thread INP/WGT buffers whose every load is independent of the virtual-thread variables
    (both threads would load the same DRAM data), by root buffer name, sorted."""
    vvars, dmas = set(), []

    def walk(nodes):
        for n in nodes:
            if isinstance(n, Loop):
                if n.vthread:
                    vvars.add(n.var)
                walk(n.body)
            elif isinstance(n, Dma):
                dmas.append(n)
    walk(items)
    ok: Dict[str, bool] = {}
    for d in dmas:
        root = d.sram.root
        if d.kind != "load" or root.scope not in (INP_SCOPE, WGT_SCOPE) or not root.vthread:
            continue
        affs = [d.dram_off, d.sram_off, *d.guards]
        for los, his in d.pads.values():
            affs += list(los) + list(his)
        indep = all(a.coef(v) == 0 for a in affs for v in vvars)
        ok[root.name] = ok.get(root.name, True) and indep
    return sorted(n for n, v in ok.items() if v)
