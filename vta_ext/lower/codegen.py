"""Emission of the lowering: lowered TIR -> a compiled Python generator of runtime calls.

:func:`lower_to_runtime` runs the lowering's steps, each in its own module and each mirroring a
pass of the original VTA compiler (``vta/python/vta/transform.py``,
``tir/transforms/coproc_sync.cc``):

1. :mod:`.convert` -- TIR conversion: loops, on-chip buffers, recognised statements
   (:class:`~.convert.TirConverter`), indices as :mod:`.affine` expressions;
2. :mod:`.patterns` -- DMA/ALU pattern analysis (InjectDMAIntrin, InjectALUIntrin);
3. :mod:`.uops` -- micro-op folding (FoldUopLoop);
4. :mod:`.alloc` -- the scratchpad allocator (per-virtual-thread copies, overflow check);
5. :mod:`.sync` -- the dependency-token planner (CoProcInstDepDetector);
6. this module -- emission: virtual threads are expanded like ``InjectVirtualThread`` for a
   ``cthread`` axis (every region with its tokens is replicated per thread, loops stay shared, so
   loads of one thread overlap with compute of the other), and the program is written as Python
   source and compiled. Generating the instruction stream then costs one Python call per
   instruction and no TVM call at all.

The generated code names its hardware constants: pipeline stages (``LOAD``, ``COMPUTE``,
``STORE``), memory types (``INP``, ``WGT``, ``ACC``, ``ACC_8BIT``, ``OUT``) and ``MAX_DMA_PAD``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..config import VTAConfig
from ..isa import MemType, Stage
from ..layout import MAX_DMA_PAD
from .affine import Aff
from .alloc import SramOverflowError, allocate, count_threads, resident_buffers, shared_buffers
from .convert import TirConverter
from .ir import Alu, Dep, Dma, GemmKernel, Loop, LoweringError, Region, SramBuf
from .patterns import analyse
from .earlystart import (DECLINED, EarlyStart, chunk_kernel, early_start_saving,
                         plan_early_start)
from .latefill import late_fill as _late_fill
from .sync import insert_dependencies, release_after_gemm
from .uops import alu_kernel, form_kernels, gemm_kernel, make_kernel

__all__ = ["LoweringError", "SramOverflowError", "lower_to_runtime", "GeneratedProgram"]


class _Emitter:
    """Writes the Python source of the generated program, line by line (see the module notes)."""

    def __init__(self, cfg: VTAConfig, reuse: Optional[Dict[str, str]] = None,
                 once: Sequence[str] = ()):
        self.cfg = cfg
        # the first GEMM started on the resident tile's first chunk (:mod:`.earlystart`)
        self.early: Optional[EarlyStart] = None
        # resident tiles loaded once, by thread 0, for every thread (root buffer names)
        self.once = frozenset(once)
        # reuse-aware double buffering: root buffer name -> Python variable holding the buffer half
        # (0/1) the shared tile was last loaded into
        self.reuse: Dict[str, str] = dict(reuse or {})
        self.lines: List[str] = []
        self.consts: Dict[str, object] = {}         # kernels and kernel factories by name
        self.static_kernels: Dict[tuple, str] = {}  # (spec, offsets) -> name of the kernel
        self._factories = itertools.count()
        self._tmp = itertools.count()

    def line(self, ind, s):
        self.lines.append("    " * ind + s)

    def tmp(self, p="t"):
        return f"_{p}{next(self._tmp)}"

    # ---------------------------------------------------------------- structure
    def items(self, items, ind, threads):
        """Emit ``items``; ``threads`` lists the (substitutions, thread id) of the virtual threads
        in scope: loops are shared by all threads, regions are replicated per thread."""
        for it in items:
            if isinstance(it, Loop):
                if it.vthread:
                    threads2 = [({**env, it.var: t}, tid * it.extent + t)
                                for env, tid in threads for t in range(it.extent)]
                    self.items(it.body, ind, threads2)
                    continue
                self.line(ind, f"for {it.var} in range({it.extent}):")
                n0 = len(self.lines)
                self.items(it.body, ind + 1, threads)
                if len(self.lines) == n0:
                    self.line(ind + 1, "pass")
            elif isinstance(it, Region):
                shared = sorted({b for b in map(self._reused_root, _region_dmas(it.items)) if b})
                for env, tid in threads:
                    for d in it.before:
                        self.dep(d, ind)
                    if tid == 0:
                        for b in shared:   # a new shared tile goes into the other buffer half
                            self.line(ind, f"{self.reuse[b]} ^= 1")
                    for x in it.items:
                        if tid != 0 and self._skip(x):
                            continue
                        self.leaf(x, ind, env, tid)
                    for d in it.after:
                        self.dep(d, ind)
                    if tid == 0 and self.early is not None and it is self.early.load:
                        self.early_loads(ind, env)
            else:
                raise LoweringError(f"internal: unexpected {type(it).__name__}")

    def early_loads(self, ind, env):
        """After thread 0's first load step of the first tile: the resident tile's chunks but
        the first, each signalling the compute module (:mod:`.earlystart`)."""
        es = self.early
        d = es.dma
        soff = d.sram_off.subst(env) + self.sram_base(d.sram, 0)
        goff = d.dram_off.subst(env)
        self.line(ind, f"if {es.condition}:")
        for r in range(1, es.chunks):
            at = r * es.size
            self.line(ind + 1, f"load_2d(B_{d.dram}, {(goff + at).py()}, {es.size}, 1, {es.size}, "
                               f"0, 0, 0, 0, {(soff + at).py()}, {MemType(d.mem).name})")
            self.line(ind + 1, "dep_push(LOAD, COMPUTE)")

    def dep(self, d: Dep, ind):
        f, t = Stage(d.frm).name, Stage(d.to).name
        hops = abs(d.frm - d.to)
        if hops == 1:
            self.line(ind, f"{'dep_push' if d.kind == 'push' else 'dep_pop'}({f}, {t})")
        elif hops == 2:
            # route store <-> load tokens through a compute-stage NOP
            if d.kind == "push":
                self.line(ind, f"dep_push({f}, COMPUTE)")
                self.line(ind, f"dep_pop({f}, COMPUTE)")
                self.line(ind, f"dep_push(COMPUTE, {t})")
            else:
                self.line(ind, f"dep_pop(COMPUTE, {t})")
        else:
            raise LoweringError(f"internal: dependency {d}")

    def leaf(self, x, ind, env, tid):
        if isinstance(x, Dep):
            self.dep(x, ind)
        elif isinstance(x, Loop):
            self.line(ind, f"for {x.var} in range({x.extent}):")
            for y in x.body:
                self.leaf(y, ind + 1, env, tid)
        elif isinstance(x, Dma):
            self.dma(x, ind, env, tid)
        elif isinstance(x, Alu):
            self.alu(x, ind, env, tid)
        elif isinstance(x, GemmKernel):
            self.gemm(x, ind, env, tid)
        else:
            raise LoweringError(f"internal: unexpected leaf {type(x).__name__}")

    def _reused_root(self, d: "Dma") -> Optional[str]:
        name = d.sram.root.name
        return name if d.kind == "load" and name in self.reuse else None

    def _skip(self, x) -> bool:
        """Thread > 0 does not reload a shared or resident tile (thread 0 loaded the identical
        data)."""
        if isinstance(x, Dma):
            return self._reused_root(x) is not None or (x.kind == "load"
                                                        and x.sram.root.name in self.once)
        if isinstance(x, Loop):
            return all(self._skip(y) for y in x.body)
        return False

    def sram_base(self, buf: SramBuf, tid: int):
        """Element index of ``buf``'s copy for thread ``tid`` (an :class:`Aff` for shared tiles,
        whose half alternates at run time, else an int)."""
        var = self.reuse.get(buf.root.name)
        if var is not None:
            return Aff({var: buf.stride}, buf.base)
        if buf.root.name in self.once:
            return buf.base
        return buf.base + (tid * buf.stride if buf.root.vthread else 0)

    # ---------------------------------------------------------------- DMA
    def dma(self, d: Dma, ind, env, tid):
        base = self.sram_base(d.sram, tid)
        soff = d.sram_off.subst(env) + base
        goff = d.dram_off.subst(env)
        if tid != 0 and self._skip(d):
            return
        for var, ext, ss, gs in d.cpu:
            self.line(ind, f"for {var.rstrip('*')}_c in range({ext}):")
            ind += 1
            soff = soff + Aff({var.rstrip('*') + "_c": ss})
            goff = goff + Aff({var.rstrip('*') + "_c": gs})
        gbuf = f"B_{d.dram}"
        X = d.x[1] if d.x else 1
        if self.early is not None and d is self.early.dma:
            # the resident tile's first chunk; the others follow the first load step
            X = self.early.size
            self.line(ind, f"load_2d({gbuf}, {goff.py()}, {X}, 1, {X}, 0, 0, 0, 0, {soff.py()}, "
                           f"{MemType(d.mem).name})")
            return
        Y = d.y[1] if d.y else 1
        # DRAM row stride (a y loop with a simplified-away stride has a single valid row)
        ystride = d.y[3] if d.y and d.y[3] else X
        if d.fill:
            # one padding row of X elements: zeros on chip, y_size 0 reads nothing from DRAM
            self.line(ind, f"load_2d({gbuf}, 0, {X}, 0, {X}, 0, 1, 0, 0, {soff.py()}, "
                           f"{MemType(d.mem).name})")
            return
        if d.kind == "store":
            self.line(ind, f"store_2d({soff.py()}, OUT, {gbuf}, {goff.py()}, {X}, {Y}, {ystride})")
            return
        padded = [(dim, lp) for dim, lp in (("x", d.x), ("y", d.y)) if lp and lp[0] in d.pads]
        if not padded and not d.guards:
            self.line(ind, f"load_2d({gbuf}, {goff.py()}, {X}, {Y}, {ystride}, 0, 0, 0, 0, "
                           f"{soff.py()}, {MemType(d.mem).name})")
            return
        pm = ", True" if d.pad_min else ""
        vals = {}
        for dim, lp in (("x", d.x), ("y", d.y)):
            ext = lp[1] if lp else 1
            if not lp or lp[0] not in d.pads:
                vals[dim] = ("0", str(ext))
                continue
            los, his = d.pads[lp[0]]
            lo_terms = ["0"] + [a.subst(env).py() for a in los]
            hi_terms = [str(ext)] + [(a.subst(env) + 1).py() for a in his]
            lo, hi = self.tmp(dim + "lo"), self.tmp(dim + "hi")
            self.line(ind, f"{lo} = max({', '.join(lo_terms)})" if len(lo_terms) > 1 else f"{lo} = 0")
            self.line(ind, f"{hi} = min({', '.join(hi_terms)})" if len(hi_terms) > 1 else f"{hi} = {ext}")
            vals[dim] = (lo, hi)
        if d.guards:
            # a guard on outer variables only: when it fails, the whole tile is padding
            ok = " and ".join(f"{g.subst(env).py()} >= 0" for g in d.guards)
            hi = self.tmp("xhi")
            self.line(ind, f"{hi} = {vals['x'][1]} if {ok} else {vals['x'][0]}")
            vals["x"] = (vals["x"][0], hi)
        (xlo, xhi), (ylo, yhi) = vals["x"], vals["y"]
        ys = d.y[3] if d.y else 0
        xs = d.x[3] if d.x else 0
        gexpr = f"{goff.py()} + {ys}*{ylo} + {xs}*{xlo}"
        self.line(ind, f"load_padded({gbuf}, {gexpr}, {xlo}, {xhi}, {ylo}, {yhi}, {X}, {Y}, "
                       f"{ystride}, {soff.py()}, {MemType(d.mem).name}{pm})")

    # ---------------------------------------------------------------- GEMM / ALU kernels
    def alu(self, a: Alu, ind, env, tid):
        spec, dparts = alu_kernel(a, lambda buf: self.sram_base(buf, tid), env)
        self.kernel_call(spec, dparts, ind, "push_alu")

    def gemm(self, g: GemmKernel, ind, env, tid):
        es = self.early
        if es is not None and g is es.gemm and tid == 0:
            # the first tile's GEMM chunk by chunk, each after its chunk's token
            self.line(ind, f"if {es.condition}:")
            for r in range(es.chunks):
                if r:
                    self.line(ind + 1, "dep_pop(LOAD, COMPUTE)")
                spec, dparts = gemm_kernel(self.cfg, chunk_kernel(es, r),
                                           lambda buf: self.sram_base(buf, tid), env)
                self.kernel_call(spec, dparts, ind + 1, "push_gemm")
            self.line(ind, "else:")
            ind += 1
        spec, dparts = gemm_kernel(self.cfg, g, lambda buf: self.sram_base(buf, tid), env)
        self.kernel_call(spec, dparts, ind, "push_gemm")

    def kernel_call(self, spec, dparts, ind, push):
        """Emit ``push(kernel)``: a constant kernel built now if every offset is static, else a
        call of a memoising factory taking the dynamic offsets."""
        if all(p.is_const for p in dparts):
            key = (spec, tuple(p.k for p in dparts))
            name = self.static_kernels.get(key)
            if name is None:
                k = make_kernel(self.cfg, spec, [p.k for p in dparts])
                name = self.static_kernels[key] = f"K{len(self.static_kernels)}"
                self.consts[name] = k
            self.line(ind, f"{push}({name})")
            return
        name = f"KF{next(self._factories)}"
        cache = {}

        def factory(*offs, spec=spec, cache=cache, cfg=self.cfg):
            k = cache.get(offs)
            if k is None:
                k = cache[offs] = make_kernel(cfg, spec, offs)
            return k
        self.consts[name] = factory
        args = ", ".join(p.py() for p in dparts)
        self.line(ind, f"{push}({name}({args}))")


#: names the generated code uses for hardware constants (bound as locals of ``_generated``)
_CONSTANTS = {**{s.name: s for s in Stage}, **{m.name: m for m in MemType},
              "MAX_DMA_PAD": MAX_DMA_PAD}

_PRELUDE = '''
def _generated(q, buffers):
    dep_push, dep_pop = q.dep_push, q.dep_pop
    load_2d, store_2d = q.load_2d, q.store_2d
    push_gemm, push_alu = q.push_gemm, q.push_alu
    ''' + "\n    ".join(f"{name} = _CONSTANTS[{name!r}]" for name in _CONSTANTS) + '''
    def load_padded(buf, goff, xlo, xhi, ylo, yhi, X, Y, ystride, soff, mem, pad_min=False):
        if xhi <= xlo or yhi <= ylo:
            # the tile lies entirely in the padding: zero-fill it with rows of y padding
            # (y_size 0: nothing is read from DRAM, as in fsim's SRAM::Load)
            row = 0
            while row < Y:
                n0 = min(MAX_DMA_PAD, Y - row)
                n1 = min(MAX_DMA_PAD, Y - row - n0)
                load_2d(buf, 0, X, 0, X, 0, n0, 0, n1, soff + row * X, mem, pad_min)
                row += n0 + n1
            return
        xpa, ypa = X - xhi, Y - yhi
        if max(xlo, ylo, xpa, ypa) > MAX_DMA_PAD:
            raise _LoweringError(f"DMA padding ({ylo},{xlo},{ypa},{xpa}) exceeds the "
                                 f"{MAX_DMA_PAD} rows or elements the 4-bit pad fields hold")
        load_2d(buf, goff, xhi - xlo, yhi - ylo, ystride, xlo, ylo, xpa, ypa, soff, mem, pad_min)
'''


@dataclass
class GeneratedProgram:
    """The compiled generator of a lowered function."""

    source: str
    fn: object
    globals_used: List[str]
    sram_used: Dict[str, int]
    nthreads: int
    reused: List[str] = field(default_factory=list)
    release: str = ""

    def emit(self, q, buffers: Dict[str, object]) -> None:
        """Append the function's instructions to the :class:`CommandQueue` ``q``.

        ``buffers`` maps each global buffer name (e.g. ``"data"``) to its :class:`DramBuffer`.
        """
        missing = [g for g in self.globals_used if g not in buffers]
        if missing:
            raise LoweringError(f"no DRAM buffer given for {missing}")
        self.fn(q, buffers)


def lower_to_runtime(cfg: VTAConfig, func, reuse: Optional[bool] = False,
                     early_release: bool = False, late_fill: Optional[bool] = False,
                     share_resident: bool = False, early_start: Optional[bool] = False,
                     chunks: Optional[int] = None) -> GeneratedProgram:
    """Lower a PrimFunc (after :func:`lower_schedule`) to a :class:`GeneratedProgram`.

    Parameters
    ----------
    cfg : VTAConfig
        The target configuration.
    func : tvm.tirx.PrimFunc
        The function after :func:`vta_ext.lower.passes.lower_schedule`.
    reuse : bool or None
        Reuse-aware double buffering (paper §IV.D). Needs exactly two virtual threads (None:
        where the program has two and a tile both would load, else off; the program's
        ``release`` ends with a note saying which tiles, or why none). Every
        per-thread INP/WGT buffer whose loads do not depend on the virtual thread (both threads
        would load the same DRAM data) is loaded once, by thread 0, alternately into its two
        halves; the GEMMs of both threads read the half loaded last. The token protocol is
        unchanged: thread 0's next load into a half waits for the compute that follows the
        compute of the other thread, so both threads' GEMMs on that half are done.
    early_release : bool
        The first load of a tile waits for the previous tile's last GEMM instead of the tile's
        accumulator fill (:func:`~.sync.release_after_gemm`); the program's ``release`` says
        where it applied or why not. Off: the stage-based plan of the original compiler.
    late_fill : bool or None
        Each tile's accumulator fill after its loads, with its tokens re-planned
        (:func:`~.latefill.late_fill`); None: only with two or more virtual threads
        (``threads_only``). Its note starts the program's ``release``.
    share_resident : bool
        A per-thread INP/WGT tile loaded once per program with the same data in every virtual
        thread (:func:`~.alloc.resident_buffers`: a resident operand hoisted above the tile loops
        whose threads split the other operand) is loaded by thread 0 only, and every thread's
        GEMMs read that copy: nothing writes it again, and each thread's first GEMM already waits
        for the load tokens that follow it. The other threads' copies stay allocated (the SRAM
        fit does not change). With two or more threads (and without reuse-aware double
        buffering) the program's ``release`` ends with a note saying which tiles, or why none.
    """
    conv = TirConverter(cfg)
    items = analyse(conv, conv.stmts(func.body))
    items = form_kernels(items)
    nthreads = count_threads(items)
    used = allocate(cfg, conv.bufs, nthreads)
    shared: Dict[str, str] = {}
    reuse_note = ""
    if reuse is None:
        reuse, reuse_note = _reuse_applies(items, nthreads)
    if reuse:
        if nthreads != 2:
            raise LoweringError(f"reuse-aware double buffering needs exactly 2 virtual threads, the "
                                f"schedule has {nthreads}")
        shared = {name: f"_half{i}" for i, name in enumerate(shared_buffers(items))}
    once: List[str] = []
    share_note = ""
    if share_resident and not reuse and nthreads > 1:
        once = resident_buffers(items)
        share_note = (f"resident tile(s) {', '.join(once)} loaded once for {nthreads} virtual threads"
                      if once else f"no resident tile shared by the {nthreads} virtual threads: "
                      f"every tile loads inside a tile loop or differs by thread")
    fill_note = ""
    if late_fill is not False:
        items, fill_note = _late_fill(items, threads_only=late_fill is None)
    else:
        items = insert_dependencies(items)
    release = ""
    if early_release:
        items, release = release_after_gemm(items)
    em = _Emitter(cfg, shared, once)
    early_note = ""
    if early_start is not False:
        em.early, early_note = plan_early_start(cfg, items, once, nthreads,
                                                lambda buf: em.sram_base(buf, 0), chunks)
        if em.early is not None:
            saving = early_start_saving(cfg, em.early)
            early_note += f", estimated {saving:,.0f} cycles earlier"
            if early_start is None and saving <= 0:
                em.early, early_note = None, (f"{DECLINED} it {-saving:,.0f} cycles slower "
                                              f"({early_note})")
    # (the resident share's and the reuse's notes end it, as documented above)
    release = "; ".join(x for x in (fill_note, release, early_note, share_note, reuse_note) if x)
    for var in shared.values():
        em.line(1, f"{var} = 1")
    em.items(items, 1, [({}, 0)])
    src = _PRELUDE + "    " + "\n    ".join(
        f"B_{g} = buffers[{g!r}]" for g in sorted(conv.globals)) + "\n" + "\n".join(em.lines) + "\n"
    ns = dict(em.consts)
    ns["_LoweringError"] = LoweringError
    ns["_CONSTANTS"] = _CONSTANTS
    exec(compile(src, "<vta_lowered>", "exec"), ns)
    return GeneratedProgram(src, ns["_generated"], sorted(conv.globals), used, nthreads,
                            sorted(shared), release)


#: how :func:`lower_to_runtime`'s note starts where ``reuse=None`` double-buffers a tile
REUSED = "reuse-aware double buffering of"


def _reuse_applies(items: list, nthreads: int) -> Tuple[bool, str]:
    """``(applies, note)`` of ``reuse=None``: reuse-aware double buffering applies where the
    program has exactly two virtual threads and a per-thread tile both would load with the same
    data (:func:`~.alloc.shared_buffers`)."""
    if nthreads != 2:
        return False, ""
    tiles = shared_buffers(items)
    if not tiles:
        return False, "no reuse-aware double buffering: each thread loads its own data"
    return True, f"{REUSED} {', '.join(tiles)} (loaded once for both threads, halves alternate)"


def _region_dmas(items) -> list:
    """The DMAs of ``items``, loops included."""
    out = []
    for x in items:
        if isinstance(x, Dma):
            out.append(x)
        elif isinstance(x, Loop):
            out += _region_dmas(x.body)
    return out
