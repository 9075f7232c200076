"""The dependency-token planner: a port of the original ``CoProcInstDepDetector``.

Consecutive items of one pipeline stage (:class:`vta_ext.isa.Stage`) form a :class:`Region`; a
dependency push/pop pair is inserted at every change of stage, including loop back edges
(``tir/transforms/coproc_sync.cc``). A virtual-thread loop is transparent: its body is planned as if
the loop were not there, and :mod:`.codegen` replicates each region with its tokens per thread.
:func:`insert_dependencies` is the entry point; the emitter routes the non-adjacent store <-> load
tokens through a compute-stage NOP.
"""
from __future__ import annotations

from typing import Dict, Optional

from ..isa import Stage
from .ir import Alu, Dep, Dma, GemmKernel, Loop, LoweringError, Region

__all__ = ["insert_dependencies"]


def _stage(node) -> Optional[Stage]:
    """Stage of a leaf, or of a loop whose body is a single stage (None otherwise)."""
    if isinstance(node, (Dma, Alu, GemmKernel)):
        return node.stage
    if isinstance(node, Loop) and not node.vthread:
        st = {_stage(b) for b in node.body}
        if len(st) == 1 and None not in st:
            return st.pop()
    return None


def _regionize(items: list) -> list:
    out = []
    for it in items:
        st = _stage(it)
        if st is None:
            if isinstance(it, Loop):
                out.append(Loop(it.var, it.extent, _regionize(it.body), it.vthread))
            else:
                raise LoweringError(f"internal: no stage for {it}")
            continue
        if out and isinstance(out[-1], Region) and out[-1].stage == st:
            out[-1].items.append(it)
        else:
            out.append(Region(st, [it]))
    return out


class _SyncState:
    __slots__ = ("node", "enter_ctx", "exit_ctx", "enter_pop", "exit_push")

    def __init__(self):
        self.node = None
        self.enter_ctx, self.exit_ctx = set(), set()
        self.enter_pop, self.exit_push = [], []


class _SyncPlanner:
    """Decides the token pushes/pops before and after each region or loop (by node id)."""

    def __init__(self):
        self.before: Dict[int, list] = {}
        self.after: Dict[int, list] = {}
        self.first = _SyncState()
        self.last = _SyncState()

    def plan(self, items):
        self.visit(items)
        if self.last.node is not None:
            if self.first.enter_pop:
                self.before.setdefault(id(self.first.node), []).extend(
                    Dep("push", f, t) for f, t in self.first.enter_pop)
            if self.last.exit_push:
                self.after.setdefault(id(self.last.node), []).extend(
                    Dep("pop", f, t) for f, t in self.last.exit_push)

    def visit(self, items):
        for it in items:
            if isinstance(it, Region):
                cur = _SyncState()
                cur.node = it
                cur.enter_ctx, cur.exit_ctx = {it.stage}, {it.stage}
                self.update(cur)
            elif isinstance(it, Loop):
                if it.vthread:       # a virtual-thread scope is transparent (an attribute)
                    self.visit(it.body)
                    continue
                saved = (self.first, self.last)
                self.first, self.last = _SyncState(), _SyncState()
                self.visit(it.body)
                cur = _SyncState()
                if self.last.node is not None:
                    cur.node = it
                    self.inject(self.last, self.first, cur.exit_push, cur.enter_pop)
                    cur.enter_ctx = set(self.first.enter_ctx)
                    cur.exit_ctx = set(self.last.exit_ctx)
                self.first, self.last = saved
                if cur.node is not None:
                    self.update(cur)

    def update(self, cur):
        if self.last.node is not None:
            self.inject(self.last, cur, [], [])
            self.last = cur
        else:
            self.first = cur
            self.last = cur

    def inject(self, prev, nxt, prev_exit_push, next_enter_pop):
        del prev_exit_push[:]
        del next_enter_pop[:]
        if (not prev.exit_push and not nxt.enter_pop and len(prev.exit_ctx) == 1
                and len(nxt.enter_ctx) == 1):
            f, t = next(iter(prev.exit_ctx)), next(iter(nxt.enter_ctx))
            if f != t:
                self.after.setdefault(id(prev.node), []).append(Dep("push", f, t))
                self.before.setdefault(id(nxt.node), []).append(Dep("pop", f, t))
                prev_exit_push.append((f, t))
                next_enter_pop.append((f, t))
            return
        vpush, vpop = list(prev.exit_push), list(nxt.enter_pop)
        pending = [(f, t) for f in sorted(prev.exit_ctx) for t in sorted(nxt.enter_ctx) if f != t]
        prev_after, next_before = [], []
        for p in pending:
            if p not in prev.exit_push:
                vpush.append(p)
                prev_after.append(Dep("push", *p))
            if p not in nxt.enter_pop:
                vpop.append(p)
                next_before.append(Dep("pop", *p))
        for p in vpush:
            if p not in vpop:
                prev_after.append(Dep("pop", *p))
            else:
                prev_exit_push.append(p)
        for p in vpop:
            if p not in vpush:
                next_before.append(Dep("push", *p))
            else:
                next_enter_pop.append(p)
        if prev_after:
            self.after.setdefault(id(prev.node), []).extend(prev_after)
        if next_before:
            self.before.setdefault(id(nxt.node), []).extend(next_before)


def _apply_sync(items, planner: _SyncPlanner) -> list:
    out = []
    for it in items:
        before = planner.before.get(id(it), [])
        after = planner.after.get(id(it), [])
        if isinstance(it, Region):
            it.before, it.after = before, after
            out.append(it)
            continue
        body = _apply_sync(it.body, planner)
        out += [Region(None, [d]) for d in before]
        out.append(Loop(it.var, it.extent, body, it.vthread))
        out += [Region(None, [d]) for d in after]
    return out


def insert_dependencies(items: list) -> list:
    """Group ``items`` (after :func:`vta_ext.lower.uops.form_kernels`) into regions of one stage and
    attach the dependency tokens between them.

    Returns
    -------
    list
        :class:`Region` nodes (with ``before``/``after`` tokens) and :class:`Loop` nodes; tokens
        planned around a loop become token-only regions (stage None) before and after it.
    """
    items = _regionize(items)
    planner = _SyncPlanner()
    planner.plan(items)
    return _apply_sync(items, planner)
