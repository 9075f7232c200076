"""The dependency-token planner: a port of the original ``CoProcInstDepDetector``.

Consecutive items of one pipeline stage (:class:`vta_ext.isa.Stage`) form a :class:`Region`; a
dependency push/pop pair is inserted at every change of stage, including loop back edges
(``tir/transforms/coproc_sync.cc``). A virtual-thread loop is transparent: its body is planned as if
the loop were not there, and :mod:`.codegen` replicates each region with its tokens per thread.
:func:`insert_dependencies` is the entry point; the emitter routes the non-adjacent store <-> load
tokens through a compute-stage NOP.

:func:`release_after_gemm` (an option of :func:`vta_ext.lower.codegen.lower_to_runtime`, which the
CSP builds take) then moves one token of the stage-based plan: in a tile loop that starts with an
accumulator fill, the first input load of a tile no longer waits for that fill (which waits for the
tile's previous store) but only for the previous tile's last GEMM, the last instruction that reads
what the load overwrites.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..isa import Stage
from .ir import Alu, Dep, Dma, GemmKernel, Loop, LoweringError, Region

__all__ = ["insert_dependencies", "release_after_gemm", "RELEASED"]

#: how :func:`release_after_gemm`'s note starts where it moved a token
RELEASED = "loads released by the previous tile's last GEMM"


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


#: the compute -> load token: the compute module releases the input and weight buffers it has read
_RELEASE = (Stage.COMPUTE, Stage.LOAD)


def _is_release(d, kind: str) -> bool:
    return isinstance(d, Dep) and d.kind == kind and (d.frm, d.to) == _RELEASE


def _token_only(node, kind: Optional[str] = None) -> bool:
    """Whether ``node`` is a token-only region (of one compute -> load ``kind`` token if given)."""
    if not (isinstance(node, Region) and node.stage is None):
        return False
    return kind is None or (len(node.items) == 1 and _is_release(node.items[0], kind))


def _leaves(node):
    """The leaves (DMAs, ALU stages, GEMM kernels, tokens) of a planned node, loops walked."""
    if isinstance(node, Region):
        for x in node.items:
            yield from _leaves(x)
    elif isinstance(node, Loop):
        for x in node.body:
            yield from _leaves(x)
    else:
        yield node


def _reads_loaded(node) -> bool:
    """Whether ``node`` holds a GEMM: the only compute instruction that reads the input and weight
    buffers the load module writes."""
    return any(isinstance(x, GemmKernel) for x in _leaves(node))


def _loads(node) -> bool:
    """Whether ``node`` holds an instruction of the load module."""
    return any(isinstance(x, Dma) and x.stage == Stage.LOAD for x in _leaves(node))


def _is_fill(node) -> bool:
    """Whether ``node`` is a compute region made only of accumulator fills (padding-only LOADs:
    they write the accumulator and read nothing the load module writes)."""
    return (isinstance(node, Region) and node.stage == Stage.COMPUTE and bool(node.items)
            and all(isinstance(x, Dma) and x.acc_fill for x in node.items))


def _release_tile(body: list) -> Optional[str]:
    """Move the release token of one tile loop's ``body`` (planned) from after its accumulator fill
    to after its last GEMM, which the next iteration's first load then pops; None when done (the
    caller adds one token before the loop, for the first iteration, and pops one after it), else
    why not."""
    fill = body[0]
    pushes = [d for d in fill.after if _is_release(d, "push")]
    if len(pushes) != 1:
        return "the accumulator fill is not followed by a load"
    last = max((i for i, n in enumerate(body) if _reads_loaded(n)), default=None)
    if last is None:
        return "the tile loop holds no GEMM"
    if any(_loads(n) for n in body[last + 1:]):
        return "a load follows the tile's last GEMM"
    fill.after.remove(pushes[0])
    node = body[last]
    if isinstance(node, Region):
        k = max(i for i, x in enumerate(node.items) if _reads_loaded(x))
        node.items.insert(k + 1, Dep("push", *_RELEASE))
        return None
    drain = _drain_after(body, last)
    if drain is not None:
        # the GEMM loop's last release was popped after it; the next tile's first load pops it now
        del body[drain]
    else:
        body.insert(last + 1, Region(None, [Dep("push", *_RELEASE)]))
    return None


def _drain_after(body: list, i: int) -> Optional[int]:
    """The index of the token-only region that pops the release of ``body[i]``'s last GEMM (only
    token-only regions of other tokens between), or None."""
    for j in range(i + 1, len(body)):
        n = body[j]
        if not _token_only(n):
            return None
        if _token_only(n, "pop"):
            return j
        if any(_is_release(d, k) for d in n.items for k in ("push", "pop")):
            return None
    return None


class _Credit(Region):
    """The release token added before a loop for its first iteration (:func:`_release`)."""


class _Drain(Region):
    """The pop added after a loop of its last iteration's release (:func:`_release`)."""


def _hoistable(body: list) -> bool:
    """Whether the release token and pop added around one loop of ``body`` can move out of the
    loop ``body`` belongs to: they are the only ones, and nothing else in ``body`` holds a GEMM (so
    the release the pop of one iteration takes is pushed after every GEMM that reads what the loads
    up to the next iteration's inner loop overwrite: those loads may take it instead)."""
    credits = [i for i, n in enumerate(body) if isinstance(n, _Credit)]
    drains = [i for i, n in enumerate(body) if isinstance(n, _Drain)]
    if len(credits) != 1 or len(drains) != 1 or credits[0] >= drains[0]:
        return False
    c, d = credits[0], drains[0]
    inner = [i for i in range(c + 1, d) if not _token_only(body[i])]
    if len(inner) != 1 or not isinstance(body[inner[0]], Loop):
        return False
    return not any(_reads_loaded(n) for i, n in enumerate(body) if i != inner[0])


def _release(items: list, notes: List[str], moved: List[str]) -> list:
    """:func:`release_after_gemm` on ``items``: the loops it changed named in ``moved``, why it
    changed none of a loop that starts with a fill in ``notes``."""
    out = []
    for it in items:
        if not isinstance(it, Loop):
            out.append(it)
            continue
        body = _release(it.body, notes, moved)
        loop = Loop(it.var, it.extent, body, it.vthread)
        carried = False
        if not it.vthread and body and _is_fill(body[0]):
            why = _release_tile(body)
            if why is None:
                carried = True
                moved.append(it.var)
            else:
                notes.append(why)
        elif not it.vthread and _hoistable(body):
            body[:] = [n for n in body if not isinstance(n, (_Credit, _Drain))]
            carried = True
        if carried:
            # the first tile's release ahead of the tokens planned before the loop: it then waits
            # for nothing they pop (e.g. the resident weights' loads)
            at = len(out)
            while at and _token_only(out[at - 1]) and not any(
                    _is_release(d, k) for d in out[at - 1].items for k in ("push", "pop")):
                at -= 1
            out.insert(at, _Credit(None, [Dep("push", *_RELEASE)]))
            out += [loop, _Drain(None, [Dep("pop", *_RELEASE)])]
        else:
            out.append(loop)
    return out


def release_after_gemm(items: list) -> Tuple[list, str]:
    """Let the first load of each tile run under the previous tile's epilogue and store.

    The stage-based plan of :func:`insert_dependencies` makes a tile loop that starts with an
    accumulator fill (``[fill] [loads] [GEMMs] [epilogue] [store]``) release the loads after the
    fill, and the fill waits for the thread's previous store: the tile's first load waits for the
    previous tile's store. The loads overwrite only input and weight buffers, which only GEMMs read,
    so here the tile's last GEMM releases them instead and the next tile's first load pops that
    token; one token before the loop stands for the first tile's release and one pop after it takes
    the last tile's (both moved out of enclosing loops that hold no other GEMM). Per thread, as every
    region. The number of tokens of each iteration is unchanged.

    Parameters
    ----------
    items : list
        The output of :func:`insert_dependencies` (changed in place and rebuilt).

    Returns
    -------
    tuple
        ``(items, note)``: the planned items and one line saying where the token moved or why it
        did not.
    """
    notes: List[str] = []
    moved: List[str] = []
    out = _release(items, notes, moved)
    why = "; ".join(sorted(set(notes)))
    if moved and notes:
        return out, f"{RELEASED} in loop(s) {', '.join(moved)}, after the accumulator fill " \
                    f"elsewhere ({why})"
    if moved:
        return out, f"{RELEASED} (loop(s) {', '.join(moved)})"
    return out, f"loads released after the accumulator fill: {why or 'no tile loop starts with one'}"
