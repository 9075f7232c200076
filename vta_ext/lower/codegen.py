"""Lowered TIR -> VTA runtime calls, in Python.

Input: a PrimFunc after :func:`vta_ext.lower.passes.lower_schedule` (flat buffers, affine indices,
tensorized GEMMs as ``VTAUopGemm``/``VTAUopReset`` extern markers). Output: a Python function,
generated once as source code and compiled, that replays the CPU loops and calls the
:class:`vta_ext.runtime.CommandQueue` -- so generating the instruction stream costs one Python call
per instruction and no TVM call at all.

Steps (each mirrors a pass of the original VTA compiler, ``vta/python/vta/transform.py`` and
``tir/transforms/coproc_sync.cc``):

1. *Recognise* every perfect loop nest ending in a buffer store, and every GEMM marker:

   * ``sram[...] = global[...]`` (optionally ``if_then_else(cond, global[...], 0)``): a DMA load
     (InjectDMAIntrin); the pad condition gives per-instruction pad counts;
   * ``global[...] = cast(acc[...])``: a DMA store;
   * ``acc[...] = op(acc[...], imm | acc[...])``: an ALU kernel (InjectALUIntrin); the stage is done
     in place -- the destination buffer is aliased to the accumulator operand;
   * loops containing only GEMM markers: a micro-op kernel, the two outermost loops folded into the
     GEMM instruction's loop fields, the rest unrolled into micro-ops (FoldUopLoop).
2. *Allocate* the on-chip buffers (per scope, bump allocation; per-virtual-thread copies) and check
   that they fit.
3. *Synchronise*: a port of ``CoProcInstDepDetector``: consecutive instructions of one stage form a
   region; a dependency push/pop pair is inserted at every change of stage, including loop back edges.
   Non-adjacent stage changes (store -> load) are routed through a compute-stage NOP.
4. *Virtual threads*: loops annotated ``vta_vthread`` are expanded like ``InjectVirtualThread`` for a
   ``cthread`` axis: every region (with its tokens) is replicated per thread, loops stay shared and
   on-chip buffers allocated inside get one copy per thread -- loads of one thread overlap with compute
   of the other.
5. *Emit* Python source and compile it.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..config import VTAConfig
from ..isa import AluOp, MemType, clip_imm
from .intrin import ACC_SCOPE, GEMM_EXTERN, INP_SCOPE, RESET_EXTERN, WGT_SCOPE

__all__ = ["LoweringError", "SramOverflowError", "lower_to_runtime", "GeneratedProgram"]

SCOPES = (INP_SCOPE, WGT_SCOPE, ACC_SCOPE)
LOAD, COMPUTE, STORE = 1, 2, 3


class LoweringError(ValueError):
    """The lowered TIR contains something this lowering cannot map onto VTA (message says what)."""


class SramOverflowError(LoweringError):
    """The on-chip tiles do not fit a scratchpad (message names the buffer(s))."""


# =================================================================================================
# affine expressions
# =================================================================================================
class Aff:
    """``sum(coef * var) + const`` over integer loop variables (identified by unique names)."""

    __slots__ = ("c", "k")

    def __init__(self, c=None, k=0):
        self.c = {v: x for v, x in (c or {}).items() if x}
        self.k = int(k)

    def __add__(self, o):
        if isinstance(o, int):
            return Aff(self.c, self.k + o)
        c = dict(self.c)
        for v, x in o.c.items():
            c[v] = c.get(v, 0) + x
        return Aff(c, self.k + o.k)

    def __sub__(self, o):
        return self + o.scale(-1) if isinstance(o, Aff) else self + (-o)

    def scale(self, s):
        return Aff({v: x * s for v, x in self.c.items()}, self.k * s)

    def coef(self, v):
        return self.c.get(v, 0)

    def without(self, vs):
        return Aff({v: x for v, x in self.c.items() if v not in vs}, self.k)

    def subst(self, env: Dict[str, int]):
        c, k = {}, self.k
        for v, x in self.c.items():
            if v in env:
                k += x * env[v]
            else:
                c[v] = x
        return Aff(c, k)

    def divisible(self, e):
        return self.k % e == 0 and all(x % e == 0 for x in self.c.values())

    def div(self, e):
        return Aff({v: x // e for v, x in self.c.items()}, self.k // e)

    @property
    def is_const(self):
        return not self.c

    def py(self) -> str:
        terms = []
        for v, x in sorted(self.c.items()):
            terms.append(v if x == 1 else f"{x}*{v}")
        if self.k or not terms:
            terms.append(str(self.k))
        return "(" + " + ".join(terms) + ")"

    def __repr__(self):
        return self.py()


# =================================================================================================
# IR of the lowering
# =================================================================================================
@dataclass
class SramBuf:
    name: str
    scope: str
    nscalars: int              # flat size in scalars (one thread)
    elem: int                  # scalars per SRAM element
    vthread: bool = False      # allocated inside a virtual-thread loop
    alias: Optional["SramBuf"] = None
    base: int = -1             # element index of thread 0
    stride: int = 0            # elements between per-thread copies

    @property
    def root(self) -> "SramBuf":
        b = self
        while b.alias is not None:
            b = b.alias
        return b

    @property
    def nelems(self) -> int:
        return -(-self.nscalars // self.elem)


@dataclass
class Loop:
    var: str
    extent: int
    body: list
    vthread: bool = False


@dataclass
class Dep:
    kind: str   # "push" | "pop"
    frm: int
    to: int


@dataclass
class Dma:
    """A 2-D DMA (analysed statically); ``cpu`` loops are replayed in Python."""

    kind: str                      # "load" | "store"
    mem: int                       # MemType
    sram: SramBuf
    dram: str                      # global buffer name
    sram_off: Aff                  # element units, outer vars
    dram_off: Aff                  # element units, outer vars
    x: Optional[Tuple[str, int, int, int]]  # (var, extent, sram stride, dram stride) or None
    y: Optional[Tuple[str, int, int, int]]
    cpu: List[Tuple[str, int, int, int]]    # further loops: (var, extent, sram stride, dram stride)
    pads: Dict[str, Tuple[List[Aff], List[Aff]]] = field(default_factory=dict)
    # pads[var] = (lower bounds u >= -aff, upper bounds u <= aff) as Affs in outer vars
    guards: List[Aff] = field(default_factory=list)
    # conditions (aff >= 0) on outer vars only: when one fails the whole tile is padding
    pad_min: bool = False          # pad with the minimum value (extension EXT_PAD_MIN)

    @property
    def stage(self):
        if self.kind == "store":
            return STORE
        return LOAD if self.mem in (MemType.INP, MemType.WGT) else COMPUTE


@dataclass
class Alu:
    op: int
    use_imm: bool
    imm: int
    dst: SramBuf
    src: Optional[SramBuf]
    dst_off: Aff                   # element units (outer vars)
    src_off: Aff
    loops: List[Tuple[str, int, int, int]]  # element loops (var, extent, dst stride, src stride)
    stage = COMPUTE


@dataclass
class GemmCall:
    reset: bool
    acc: Tuple[SramBuf, Aff]
    inp: Optional[Tuple[SramBuf, Aff]]
    wgt: Optional[Tuple[SramBuf, Aff]]
    stage = COMPUTE


@dataclass
class GemmKernel:
    reset: bool
    loops: List[Tuple[str, int]]     # folded loops (outer first), at most 2
    body: list                       # GemmCall / Loop of GemmCall (unrolled into micro-ops)
    stage = COMPUTE


@dataclass
class Region:
    stage: int
    items: list
    before: list = field(default_factory=list)
    after: list = field(default_factory=list)


# =================================================================================================
# 1. TIR -> IR
# =================================================================================================
class _Converter:
    def __init__(self, cfg: VTAConfig):
        import tvm
        from tvm import tirx
        self.tvm, self.tirx = tvm, tirx
        self.cfg = cfg
        self.vars: Dict[object, str] = {}
        self.bufs: Dict[str, SramBuf] = {}
        self.globals: Dict[str, str] = {}    # global buffer name -> dtype
        self.data_vars: Dict[object, SramBuf] = {}
        self._n = itertools.count()
        self.vthread_depth = 0
        self.elem = {INP_SCOPE: cfg.BATCH * cfg.BLOCK_IN, WGT_SCOPE: cfg.BLOCK_OUT * cfg.BLOCK_IN,
                     ACC_SCOPE: cfg.BATCH * cfg.BLOCK_OUT}

    # ---------------------------------------------------------------- expressions
    def aff(self, e) -> Aff:
        t = self.tirx
        if isinstance(e, t.IntImm):
            return Aff(k=int(e.value))
        if isinstance(e, t.Var):
            if e not in self.vars:
                raise LoweringError(f"free variable {e} in an index expression")
            return Aff({self.vars[e]: 1})
        if isinstance(e, t.Add):
            return self.aff(e.a) + self.aff(e.b)
        if isinstance(e, t.Sub):
            return self.aff(e.a) - self.aff(e.b)
        if isinstance(e, t.Mul):
            a, b = self.aff(e.a), self.aff(e.b)
            if a.is_const:
                return b.scale(a.k)
            if b.is_const:
                return a.scale(b.k)
        if isinstance(e, t.Cast):
            return self.aff(e.value)
        raise LoweringError(f"index expression {e} is not affine in the loop variables")

    def conds(self, e) -> List[Aff]:
        """A conjunction of comparisons as a list of ``aff >= 0``."""
        t = self.tirx
        if isinstance(e, t.And):
            return self.conds(e.a) + self.conds(e.b)
        if isinstance(e, t.LE):
            return [self.aff(e.b) - self.aff(e.a)]
        if isinstance(e, t.LT):
            return [self.aff(e.b) - self.aff(e.a) - 1]
        if isinstance(e, t.GE):
            return [self.aff(e.a) - self.aff(e.b)]
        if isinstance(e, t.GT):
            return [self.aff(e.a) - self.aff(e.b) - 1]
        if isinstance(e, t.EQ):
            d = self.aff(e.a) - self.aff(e.b)
            return [d, d.scale(-1)]
        raise LoweringError(f"unsupported padding condition {e}")

    # ---------------------------------------------------------------- statements
    def stmts(self, s) -> list:
        t = self.tirx
        if isinstance(s, t.SeqStmt):
            out = []
            for x in s.seq:
                out += self.stmts(x)
            return out
        if isinstance(s, t.DeclBuffer):
            self.globals[s.buffer.name] = str(s.buffer.dtype)
            return []
        if isinstance(s, t.AllocBuffer):
            b = s.buffer
            scope = b.scope()
            if scope not in SCOPES:
                raise LoweringError(f"buffer {b.name} in scope {scope!r}: only the VTA scopes "
                                    f"{SCOPES} can be allocated")
            n = 1
            for d in b.shape:
                n *= int(d)
            sb = SramBuf(b.name, scope, n, self.elem[scope], vthread=self.vthread_depth > 0)
            self.bufs[b.name] = sb
            self.data_vars[str(b.data)] = sb
            return []
        if isinstance(s, t.For):
            if int(s.min) != 0:
                raise LoweringError(f"loop {s.loop_var} does not start at 0")
            nest = self._perfect_nest(s)
            if nest is not None:
                return [nest]
            uid = self._uid(s)
            vth = "vta_vthread" in s.annotations
            self.vthread_depth += vth
            body = self.stmts(s.body)
            self.vthread_depth -= vth
            return [Loop(uid, int(s.extent), body, vthread=vth)]
        if isinstance(s, t.BufferStore):
            return [self._store([], s)]
        if isinstance(s, t.Evaluate):
            return [self._call(s.value)]
        if isinstance(s, t.AttrStmt):
            return self.stmts(s.body)
        raise LoweringError(f"unsupported statement {type(s).__name__}: {s}")

    def _uid(self, loop) -> str:
        """A unique Python identifier for the loop variable of ``loop``."""
        step = getattr(loop, "step", None)
        if step is not None and int(step) != 1:
            raise LoweringError(f"loop {loop.loop_var} has step {step}; only unit steps are supported")
        uid = f"v{next(self._n)}_{re.sub(r'[^0-9A-Za-z_]', '_', loop.loop_var.name)}"
        self.vars[loop.loop_var] = uid
        return uid

    def _perfect_nest(self, s):
        t = self.tirx
        loops, body = [], s
        while isinstance(body, t.For):
            loops.append(body)
            body = body.body
        if not isinstance(body, t.BufferStore):
            return None
        if any(("vta_vthread" in lp.annotations) or int(lp.min) != 0 for lp in loops):
            return None
        inner = []
        for lp in loops:
            inner.append((self._uid(lp), int(lp.extent)))
        return self._store(inner, body)

    def _call(self, c):
        name = str(c.args[0]).strip('"') if len(c.args) else ""
        if name == GEMM_EXTERN:
            a = c.args
            return ("gemm", self._buf_of(a[1]), self.aff(a[2]), self._buf_of(a[3]), self.aff(a[4]),
                    self._buf_of(a[5]), self.aff(a[6]))
        if name == RESET_EXTERN:
            return ("reset", self._buf_of(c.args[1]), self.aff(c.args[2]))
        raise LoweringError(f"unsupported call {c}")

    def _buf_of(self, v):
        name = str(v)
        if name not in self.data_vars:
            raise LoweringError(f"GEMM operand {v} is not an on-chip buffer")
        return self.data_vars[name]

    def _load_of(self, e):
        t = self.tvm
        if isinstance(e, t.ir.TensorLoad):
            return e.source.name, self.aff(e.indices[0])
        if isinstance(e, self.tirx.Cast):
            return self._load_of(e.value)
        return None

    def _store(self, inner, s):
        """Classify ``for inner: buf[idx] = value``."""
        t = self.tirx
        dst = s.buffer.name
        didx = self.aff(s.indices[0])
        v = s.value
        dst_sram = self.bufs.get(dst)
        if dst_sram is None:
            # global destination: DMA store from the accumulator
            src = self._load_of(v)
            if src is None or src[0] not in self.bufs:
                raise LoweringError(f"store to {dst} is not a copy from an on-chip buffer: {v}")
            return ("store", inner, self.bufs[src[0]], src[1], dst, didx)
        # on-chip destination: DMA load (maybe padded) or ALU
        cond = None
        pad_min = False
        if isinstance(v, self.tvm.ir.Call) and getattr(v.op, "name", "").endswith("if_then_else"):
            cond, v, other = v.args
            odt = str(getattr(other, "ty", getattr(other, "dtype", "")))
            dmin = {"int8": -(1 << 7), "int32": -(1 << 31)}.get(odt)
            if isinstance(other, t.IntImm) and int(other.value) == dmin:
                pad_min = True          # LOAD pad-min extension (max pooling)
            elif not (isinstance(other, t.IntImm) and int(other.value) == 0):
                raise LoweringError(f"padding value of {dst} must be 0 or the minimum of "
                                    f"{odt}, got {other}")
        src = self._load_of(v)
        if src is not None and src[0] not in self.bufs:
            return ("load", inner, dst_sram, didx, src[0], src[1],
                    None if cond is None else self.conds(cond), pad_min)
        if cond is not None:
            raise LoweringError(f"conditional store into {dst} that is not a padded load")
        return ("alu", inner, dst_sram, didx, v)


# =================================================================================================
# 2. analysis of the recognised statements
# =================================================================================================
def _split_lanes(inner, sram: Aff, other: Aff, elem: int, what: str, reduce_ok: bool = False):
    """Split copy loops into the loops forming one element (lanes) and element loops.

    ``reduce_ok``: element loops may leave the destination in place (ALU reductions)."""
    lanes, elems = [], []
    for var, ext in inner:
        ds, do = sram.coef(var), other.coef(var)
        if ext == 1:
            continue
        if 0 < ds < elem:
            lanes.append((var, ext, ds, do))
        else:
            elems.append((var, ext, ds, do))
    lanes.sort(key=lambda l: l[2])
    expect = 1
    for var, ext, ds, do in lanes:
        if ds != expect or do != ds:
            raise LoweringError(f"{what}: the {elem} scalars of an element are not contiguous "
                                f"on both sides (loop {var}: strides {ds}/{do})")
        expect *= ext
    if expect != elem:
        raise LoweringError(f"{what}: copies {expect} scalars per element, expected {elem}")
    out = []
    for var, ext, ds, do in elems:
        if ds % elem or do % elem or ds < 0 or (ds == 0 and not reduce_ok):
            raise LoweringError(f"{what}: loop {var} moves by {ds}/{do} scalars, not whole elements")
        out.append((var, ext, ds // elem, do // elem))
    return [l[0] for l in lanes], out


def _analyse_dma(kind, inner, sbuf: SramBuf, sidx: Aff, gname: str, gidx: Aff, conds, mem):
    elem = sbuf.elem
    what = f"DMA {kind} {gname} {'->' if kind == 'load' else '<-'} {sbuf.name}"
    lane_vars, eloops = _split_lanes(inner, sidx, gidx, elem, what)
    inner_vars = {v for v, _ in inner}
    s_out, g_out = sidx.without(inner_vars), gidx.without(inner_vars)
    if not s_out.divisible(elem) or not g_out.divisible(elem):
        raise LoweringError(f"{what}: tile offsets are not element aligned ({s_out}, {g_out})")
    # padding bounds per loop variable
    pads: Dict[str, Tuple[List[Aff], List[Aff]]] = {}
    guards: List[Aff] = []
    for c in conds or []:
        vs = [v for v in c.c if v in inner_vars]
        if not vs:
            guards.append(c)
            continue
        if len(vs) != 1 or vs[0] in lane_vars:
            raise LoweringError(f"{what}: padding condition {c} >= 0 must involve exactly one "
                                "spatial copy loop")
        v = vs[0]
        a = c.coef(v)
        rest = c.without({v})
        lo, hi = pads.setdefault(v, ([], []))
        if a == 1:            # v + rest >= 0  ->  v >= -rest
            lo.append(rest.scale(-1))
        elif a == -1:         # rest - v >= 0  ->  v <= rest
            hi.append(rest)
        else:
            raise LoweringError(f"{what}: padding condition with coefficient {a}")
    # a padded loop whose DRAM stride the simplifier removed (the condition leaves at most one valid
    # index) reads the element the index expression already points to: any DRAM stride will do
    free = {v for v, e, ds, do in eloops if do == 0 and v in pads}
    # order element loops outer -> inner by SRAM stride and merge contiguous ones
    eloops.sort(key=lambda l: -l[2])
    merged = []
    for lp in eloops:
        if merged:
            o = merged[-1]
            if (o[0] not in pads and lp[0] not in pads and o[2] == lp[1] * lp[2]
                    and o[3] == lp[1] * lp[3]):
                merged[-1] = (lp[0] + "*", o[1] * lp[1], lp[2], lp[3])
                continue
        merged.append(lp)
    x = y = None
    rest = list(merged)
    if rest and rest[-1][2] == 1 and (rest[-1][3] == 1 or rest[-1][0] in free):
        x = rest.pop()
    xs = x[1] if x else 1
    if rest and rest[-1][2] == xs:
        y = rest.pop()
    for lp in rest:
        if lp[0] in pads:
            raise LoweringError(f"{what}: padded loop {lp[0]} is not one of the two DMA dimensions")
    for v in pads:
        if v.endswith("*"):
            raise LoweringError(f"{what}: internal error, padded loop merged")
    return Dma(kind, mem, sbuf, gname, s_out.div(elem), g_out.div(elem), x, y, rest, pads, guards)


def _alu_operand(conv: _Converter, e):
    t = conv.tirx
    if isinstance(e, int):
        return ("imm", e)
    if isinstance(e, t.IntImm):
        return ("imm", int(e.value))
    ld = conv._load_of(e)
    if ld is not None and ld[0] in conv.bufs:
        return ("buf", conv.bufs[ld[0]], ld[1])
    raise LoweringError(f"ALU operand {e} is neither an immediate nor an accumulator load")


def _analyse_alu(conv: _Converter, inner, dbuf: SramBuf, didx: Aff, value, producers: set):
    t = conv.tirx
    what = f"ALU stage writing {dbuf.name}"
    if dbuf.scope != ACC_SCOPE:
        raise LoweringError(f"{what}: element-wise stages must run in {ACC_SCOPE}, not {dbuf.scope}")
    ops = {t.Add: AluOp.ADD, t.Min: AluOp.MIN, t.Max: AluOp.MAX, t.Mul: AluOp.MUL}
    if isinstance(value, t.IntImm):
        return _alu_const(conv, inner, dbuf, didx, int(value.value), what)
    clip = _clip_pattern(t, value)
    if clip is not None:
        op, ea, eb, commut = "CLIP", clip[0], None, False
    elif isinstance(value, t.RShift) or (isinstance(value, conv.tvm.ir.Call) and
                                       getattr(value.op, "name", "").endswith("shift_right")):
        a, b = (value.a, value.b) if isinstance(value, t.RShift) else value.args
        op, ea, eb, commut = AluOp.SHR, a, b, False
    elif isinstance(value, t.LShift):
        op, ea, eb, commut = "SHL", value.a, value.b, False
    elif isinstance(value, t.Sub):
        if not isinstance(value.b, t.IntImm):
            raise LoweringError(f"{what}: VTA has no vector subtraction ({value})")
        op, ea, eb, commut = AluOp.ADD, value.a, -int(value.b.value), False
    elif type(value) in ops:
        op, ea, eb, commut = ops[type(value)], value.a, value.b, True
    else:
        ld = conv._load_of(value)
        if ld is None:
            raise LoweringError(f"{what}: unsupported element-wise expression {value}")
        op, ea, eb, commut = AluOp.SHR, value, None, False   # a copy = SHR 0
    A = _alu_operand(conv, ea)
    B = ("imm", 0) if eb is None else _alu_operand(conv, eb)
    if A[0] == "imm" and commut:
        A, B = B, A
    if A[0] != "buf":
        raise LoweringError(f"{what}: the first operand must be an accumulator load")
    if op == "SHL":
        if B[0] != "imm":
            raise LoweringError(f"{what}: shift by a tensor is not supported")
        op, B = AluOp.SHR, ("imm", -B[1])
    if B[0] == "buf" and commut:
        # the in-place operand: prefer a buffer produced by GEMM/ALU, with the destination's index
        def score(o):
            return (o[2].c == didx.c, o[1].name in producers)
        if score(B) > score(A):
            A, B = B, A
    src_buf, src_idx = A[1], A[2]
    if src_idx.c != didx.c or src_buf.nscalars != dbuf.nscalars or src_idx.k != didx.k:
        raise LoweringError(f"{what}: the stage is not in place ({src_buf.name}{src_idx} -> "
                            f"{dbuf.name}{didx}); VTA ALU stages must keep the accumulator layout")
    if src_buf.scope != ACC_SCOPE:
        raise LoweringError(f"{what}: operand {src_buf.name} is not in {ACC_SCOPE}")
    if dbuf is not src_buf:
        dbuf.alias = src_buf
    elem = dbuf.elem
    if B[0] == "imm":
        if not -(1 << 15) <= B[1] < (1 << 15):
            raise LoweringError(f"{what}: immediate {B[1]} does not fit 16 bits")
        other, use_imm, imm, sbuf = didx, True, B[1], dbuf
    else:
        other, use_imm, imm, sbuf = B[2], False, 0, B[1]
        if sbuf.scope != ACC_SCOPE:
            raise LoweringError(f"{what}: operand {sbuf.name} is not in {ACC_SCOPE}")
    d_out, s_out, merged = _alu_loops(inner, didx, other, elem, what)
    if op == "CLIP":
        lo, hi = clip[1], clip[2]
        if conv.cfg.EXT_CLIP and -128 <= lo <= hi <= 127:
            return [Alu(int(AluOp.CLIP), True, clip_imm(lo, hi), dbuf, sbuf, d_out, s_out, merged)]
        for v in (lo, hi):
            if not -(1 << 15) <= v < (1 << 15):
                raise LoweringError(f"{what}: clip bound {v} does not fit 16 bits")
        return [Alu(int(AluOp.MIN), True, hi, dbuf, sbuf, d_out, s_out, merged),
                Alu(int(AluOp.MAX), True, lo, dbuf, sbuf, d_out, s_out, merged)]
    return [Alu(int(op), use_imm, imm, dbuf, sbuf, d_out, s_out, merged)]


def _alu_loops(inner, didx: Aff, other: Aff, elem: int, what: str):
    """Element loops of an ALU stage (outer first, contiguous ones merged) and the offsets."""
    _, eloops = _split_lanes(inner, didx, other, elem, what, reduce_ok=True)
    inner_vars = {v for v, _ in inner}
    d_out, s_out = didx.without(inner_vars), other.without(inner_vars)
    if not d_out.divisible(elem) or not s_out.divisible(elem):
        raise LoweringError(f"{what}: offsets are not element aligned")
    # reduction loops (destination stride 0) go innermost; MIN/MAX/ADD reductions do not depend on
    # the order
    eloops.sort(key=lambda l: -l[2])
    merged = []
    for lp in eloops:
        if merged and merged[-1][2] == lp[1] * lp[2] and merged[-1][3] == lp[1] * lp[3]:
            o = merged[-1]
            merged[-1] = (lp[0] + "*", o[1] * lp[1], lp[2], lp[3])
        else:
            merged.append(lp)
    return d_out.div(elem), s_out.div(elem), merged


def _alu_const(conv, inner, dbuf: SramBuf, didx: Aff, c: int, what: str):
    """``acc[...] = c``: VTA has no move-immediate; MIN c then MAX c (or CLIP [c, c]) sets any value
    to c (e.g. the initial value of a max-pooling reduction)."""
    if dbuf.scope != ACC_SCOPE:
        raise LoweringError(f"{what}: constants can only be written into {ACC_SCOPE}")
    if not -(1 << 15) <= c < (1 << 15):
        raise LoweringError(f"{what}: the constant {c} does not fit a 16-bit ALU immediate; "
                            "initialise with a value of the data's range (e.g. -128 for int8)")
    d_out, s_out, merged = _alu_loops(inner, didx, didx, dbuf.elem, what)
    if conv.cfg.EXT_CLIP and -128 <= c <= 127:
        return [Alu(int(AluOp.CLIP), True, clip_imm(c, c), dbuf, dbuf, d_out, s_out, merged)]
    return [Alu(int(AluOp.MIN), True, c, dbuf, dbuf, d_out, s_out, merged),
            Alu(int(AluOp.MAX), True, c, dbuf, dbuf, d_out, s_out, merged)]


def _clip_pattern(t, value):
    """``max(min(x, hi), lo)`` or ``min(max(x, lo), hi)`` with constant bounds -> (x, lo, hi)."""
    def split(e, kind):
        if isinstance(e, kind):
            if isinstance(e.b, t.IntImm):
                return e.a, int(e.b.value)
            if isinstance(e.a, t.IntImm):
                return e.b, int(e.a.value)
        return None
    outer = split(value, t.Max)
    if outer is not None:
        inner = split(outer[0], t.Min)
        if inner is not None and outer[1] <= inner[1]:
            return inner[0], outer[1], inner[1]
    outer = split(value, t.Min)
    if outer is not None:
        inner = split(outer[0], t.Max)
        if inner is not None and inner[1] <= outer[1]:
            return inner[0], inner[1], outer[1]
    return None


def _check_live(buf: SramBuf, heads: Dict[str, SramBuf], what: str) -> None:
    """In-place ALU stages overwrite their operand: only the newest value of an alias group may be
    read."""
    head = heads.get(buf.root.name)
    if head is not None and head is not buf:
        raise LoweringError(f"{what} reads {buf.name}, whose accumulator storage was already "
                            f"overwritten in place by {head.name}; element-wise stages must form a "
                            "chain")


def _to_ir(conv: _Converter, items: list, producers=None, heads=None) -> list:
    """Second pass over the converter output: analyse DMA/ALU, wrap GEMM markers."""
    out = []
    producers = set() if producers is None else producers
    heads = {} if heads is None else heads
    for it in items:
        if isinstance(it, Loop):
            out.append(Loop(it.var, it.extent, _to_ir(conv, it.body, producers, heads), it.vthread))
            continue
        kind = it[0]
        if kind == "load":
            _, inner, a, aidx, b, bidx, conds, pad_min = it
            if a.scope == INP_SCOPE:
                mem = MemType.INP
            elif a.scope == WGT_SCOPE:
                mem = MemType.WGT
            else:
                gdt = conv.globals.get(b, "int32")
                if gdt == "int32":
                    mem = MemType.ACC
                elif gdt == "int8":
                    mem = MemType.ACC_8BIT   # int8 lanes sign-extended into the accumulator
                else:
                    raise LoweringError(f"load of {b} ({gdt}) into the accumulator: only int32 and "
                                        f"int8 tensors can be loaded into {ACC_SCOPE}")
            heads.pop(a.root.name, None)
            dma = _analyse_dma("load", inner, a, aidx, b, bidx, conds, mem)
            dma.pad_min = pad_min
            out.append(dma)
        elif kind == "alu":
            _, inner, dbuf, didx, value = it
            alus = _analyse_alu(conv, inner, dbuf, didx, value, producers)
            if isinstance(value, conv.tirx.IntImm):
                heads.pop(dbuf.root.name, None)
            _check_live(dbuf.alias or dbuf, heads, f"ALU stage writing {dbuf.name}")
            if alus[0].src is not dbuf:
                _check_live(alus[0].src, heads, f"ALU stage writing {dbuf.name}")
            heads[dbuf.root.name] = dbuf
            producers.add(dbuf.name)
            out.extend(alus)
        elif kind == "gemm":
            _, ab, acc, ib, inp, wb, wgt = it
            for b, sc in ((ab, ACC_SCOPE), (ib, INP_SCOPE), (wb, WGT_SCOPE)):
                if b.scope != sc:
                    raise LoweringError(f"GEMM operand {b.name} is in {b.scope}, expected {sc}")
            producers.add(ab.name)
            heads.pop(ab.root.name, None)
            out.append(GemmCall(False, (ab, acc), (ib, inp), (wb, wgt)))
        elif kind == "reset":
            heads.pop(it[1].root.name, None)
            out.append(GemmCall(True, (it[1], it[2]), None, None))
        elif kind == "store":
            _, inner, sbuf, sidx, g, gidx = it
            _check_live(sbuf, heads, f"the store to {g}")
            out.append(_analyse_dma("store", inner, sbuf, sidx, g, gidx, None, MemType.OUT))
        else:
            raise LoweringError(f"internal: unknown item {kind}")
    return out


# =================================================================================================
# GEMM regions (FoldUopLoop)
# =================================================================================================
def _only_gemm(node, reset) -> bool:
    if isinstance(node, GemmCall):
        return node.reset == reset
    if isinstance(node, Loop) and not node.vthread:
        return bool(node.body) and all(_only_gemm(b, reset) for b in node.body)
    return False


def _form_kernels(items: list) -> list:
    out = []
    for it in items:
        if isinstance(it, (GemmCall, Loop)) and (_only_gemm(it, True) or _only_gemm(it, False)):
            reset = _only_gemm(it, True)
            if out and isinstance(out[-1], GemmKernel) and out[-1].reset == reset \
                    and not out[-1].loops:
                out[-1].body.append(it)
                continue
            # fold up to two outermost loops of a single loop chain
            loops, body = [], [it]
            while len(loops) < 2 and len(body) == 1 and isinstance(body[0], Loop):
                loops.append((body[0].var, body[0].extent))
                body = body[0].body
            out.append(GemmKernel(reset, loops, list(body)))
        elif isinstance(it, Loop):
            out.append(Loop(it.var, it.extent, _form_kernels(it.body), it.vthread))
        else:
            out.append(it)
    return out


# =================================================================================================
# 3. synchronisation (port of CoProcInstDepDetector)
# =================================================================================================
def _stage(node) -> Optional[int]:
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
        out += [Region(0, [d]) for d in before]
        out.append(Loop(it.var, it.extent, body, it.vthread))
        out += [Region(0, [d]) for d in after]
    return out


# =================================================================================================
# 2b. on-chip allocation
# =================================================================================================
def _allocate(cfg: VTAConfig, bufs: Dict[str, SramBuf], nthreads: int) -> Dict[str, int]:
    depth = {INP_SCOPE: cfg.inp_depth, WGT_SCOPE: cfg.wgt_depth, ACC_SCOPE: cfg.acc_depth}
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
        if n > depth[scope]:
            detail = ", ".join(f"{b.name}: {b.nelems} elements"
                               + (f" x {nthreads} virtual threads" if b.vthread and nthreads > 1
                                  else "")
                               for b in roots if b.scope == scope)
            over.append(f"{scope} needs {n} elements but has {depth[scope]} ({detail})")
    if over:
        raise SramOverflowError("the tiles do not fit the on-chip buffers: " + "; ".join(over))
    return used


# =================================================================================================
# 4./5. virtual-thread expansion and Python code emission
# =================================================================================================
class _Emitter:
    def __init__(self, cfg: VTAConfig, bufs, reuse: Optional[Dict[str, str]] = None):
        self.cfg = cfg
        # reuse-aware double buffering: root buffer name -> Python variable holding the buffer half
        # (0/1) the shared tile was last loaded into
        self.reuse: Dict[str, str] = dict(reuse or {})
        self.lines: List[str] = []
        self.consts: Dict[str, object] = {}
        self.kernels: List[object] = []
        self.kfactories: List[object] = []
        self.static_kernels: Dict[tuple, str] = {}
        self._tmp = itertools.count()
        self.bufs = bufs

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
            else:
                raise LoweringError(f"internal: unexpected {type(it).__name__}")

    def dep(self, d: Dep, ind):
        f, t = d.frm, d.to
        if abs(f - t) == 1:
            self.line(ind, f"{'dep_push' if d.kind == 'push' else 'dep_pop'}({f}, {t})")
        elif abs(f - t) == 2:
            # route store <-> load tokens through a compute-stage NOP
            if d.kind == "push":
                self.line(ind, f"dep_push({f}, 2)")
                self.line(ind, f"dep_pop({f}, 2)")
                self.line(ind, f"dep_push(2, {t})")
            else:
                self.line(ind, f"dep_pop(2, {t})")
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
        """Thread > 0 does not reload a shared tile (thread 0 loaded the identical data)."""
        if isinstance(x, Dma):
            return self._reused_root(x) is not None
        if isinstance(x, Loop):
            return all(self._skip(y) for y in x.body)
        return False

    def sram_base(self, buf: SramBuf, tid: int):
        """Element index of ``buf``'s copy for thread ``tid`` (an :class:`Aff` for shared tiles,
        whose half alternates at run time, else an int)."""
        var = self.reuse.get(buf.root.name)
        if var is not None:
            return Aff({var: buf.stride}, buf.base)
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
        Y = d.y[1] if d.y else 1
        # DRAM row stride (a y loop with a simplified-away stride has a single valid row)
        ystride = d.y[3] if d.y and d.y[3] else X
        if d.kind == "store":
            self.line(ind, f"store_2d({soff.py()}, 4, {gbuf}, {goff.py()}, {X}, {Y}, {ystride})")
            return
        padded = [(dim, lp) for dim, lp in (("x", d.x), ("y", d.y)) if lp and lp[0] in d.pads]
        if not padded and not d.guards:
            self.line(ind, f"load_2d({gbuf}, {goff.py()}, {X}, {Y}, {ystride}, 0, 0, 0, 0, "
                           f"{soff.py()}, {int(d.mem)})")
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
                       f"{ystride}, {soff.py()}, {int(d.mem)}{pm})")

    # ---------------------------------------------------------------- ALU
    def alu(self, a: Alu, ind, env, tid):
        dbase = self.sram_base(a.dst, tid)
        sbase = self.sram_base(a.src, tid)
        doff = a.dst_off.subst(env) + dbase
        soff = a.src_off.subst(env) + sbase
        folded = a.loops[:2]
        unrolled = a.loops[2:]
        uops = []
        for vals in itertools.product(*[range(l[1]) for l in unrolled]):
            dd = sum(v * l[2] for v, l in zip(vals, unrolled))
            ss = sum(v * l[3] for v, l in zip(vals, unrolled))
            uops.append((dd, ss))
        spec = ("alu", a.op, a.use_imm, a.imm, tuple((l[1], l[2], l[3]) for l in folded),
                tuple(uops))
        self.kernel_call(spec, [doff, soff], ind, "push_alu")

    # ---------------------------------------------------------------- GEMM
    def gemm(self, g: GemmKernel, ind, env, tid):
        cfg = self.cfg
        ea, ei, ew = cfg.BATCH * cfg.BLOCK_OUT, cfg.BATCH * cfg.BLOCK_IN, cfg.BLOCK_OUT * cfg.BLOCK_IN
        calls = []

        def walk(nodes, lenv):
            for n in nodes:
                if isinstance(n, Loop):
                    for i in range(n.extent):
                        walk(n.body, {**lenv, n.var: i})
                else:
                    calls.append((n, dict(lenv)))
        walk(g.body, {})
        folded = []
        for var, ext in g.loops:
            fa = fi = fw = 0
            for n, _ in calls:
                fa = n.acc[1].coef(var)
                fi = n.inp[1].coef(var) if n.inp else 0
                fw = n.wgt[1].coef(var) if n.wgt else 0
                break
            for n, _ in calls:  # one consistent coefficient per argument
                if (n.acc[1].coef(var), n.inp[1].coef(var) if n.inp else 0,
                        n.wgt[1].coef(var) if n.wgt else 0) != (fa, fi, fw):
                    raise LoweringError("GEMM micro-ops with inconsistent loop coefficients")
            if fa % ea or fi % ei or fw % ew:
                raise LoweringError("GEMM loop strides are not whole elements")
            folded.append((ext, fa // ea, fi // ei, fw // ew))
        fold_vars = {v for v, _ in g.loops}
        # uop offsets: static part (inner loops) + dynamic part (outer vars, shared by all uops)
        dyn = None
        uops = []
        for n, lenv in calls:
            parts = []
            for opnd, e in ((n.acc, ea), (n.inp, ei), (n.wgt, ew)):
                if opnd is None:
                    parts.append(None)
                    continue
                buf, idx = opnd
                base = self.sram_base(buf, tid)
                aff = idx.without(fold_vars).subst(lenv).subst(env) + (
                    base.scale(e) if isinstance(base, Aff) else base * e)
                parts.append(aff)
            dpart = tuple(None if p is None else Aff(p.c, 0) for p in parts)
            key = tuple(None if p is None else tuple(sorted(p.c.items())) for p in dpart)
            if dyn is None:
                dyn = (key, dpart)
            elif dyn[0] != key:
                raise LoweringError("GEMM micro-ops depend differently on CPU loop variables")
            st = []
            for p, e in zip(parts, (ea, ei, ew)):
                if p is None:
                    st.append(0)
                    continue
                if p.k % e or any(x % e for x in p.c.values()):
                    raise LoweringError("GEMM operand offset is not element aligned")
                st.append(p.k // e)
            uops.append(tuple(st))
        dparts = [Aff() if p is None else p.div(e) for p, e in zip(dyn[1], (ea, ei, ew))]
        spec = ("gemm", g.reset, tuple(folded), tuple(uops))
        self.kernel_call(spec, dparts, ind, "push_gemm")

    # ---------------------------------------------------------------- kernels
    def kernel_call(self, spec, dparts, ind, push):
        if all(p.is_const for p in dparts):
            key = (spec, tuple(p.k for p in dparts))
            name = self.static_kernels.get(key)
            if name is None:
                k = self._make_kernel(spec, [p.k for p in dparts])
                name = self.static_kernels[key] = f"K{len(self.kernels)}"
                self.kernels.append(k)
                self.consts[name] = k
            self.line(ind, f"{push}({name})")
            return
        fid = len(self.kfactories)
        self.kfactories.append(spec)
        name = f"KF{fid}"
        cache = {}

        def factory(*offs, spec=spec, cache=cache):
            k = cache.get(offs)
            if k is None:
                k = cache[offs] = self._make_kernel(spec, offs)
            return k
        self.consts[name] = factory
        args = ", ".join(p.py() for p in dparts)
        self.line(ind, f"{push}({name}({args}))")

    def _make_kernel(self, spec, offs):
        from ..runtime import UopKernel
        if spec[0] == "gemm":
            _, reset, folded, uops = spec
            k = UopKernel("gemm", reset=reset)
            for ext, fa, fi, fw in folded:
                k.loop_begin(ext, fa, fi, fw)
            da, di, dw = offs
            for a, i, w in uops:
                if reset:
                    k.push(a + da, 0, 0)
                else:
                    k.push(a + da, i + di, w + dw)
            for _ in folded:
                k.loop_end()
        else:
            _, op, use_imm, imm, folded, uops = spec
            k = UopKernel("alu", alu_opcode=op, use_imm=use_imm, imm=imm)
            for ext, fd, fs in folded:
                k.loop_begin(ext, fd, fs, 0)
            dd, ds = offs
            for a, b in uops:
                k.push(a + dd, b + ds)
            for _ in folded:
                k.loop_end()
        if k.size > self.cfg.uop_depth:
            raise LoweringError(f"a micro-op kernel of {k.size} uops exceeds the micro-op buffer "
                                f"({self.cfg.uop_depth}); reduce the tile knobs")
        return k


_PRELUDE = '''
def _generated(q, buffers):
    dep_push, dep_pop = q.dep_push, q.dep_pop
    load_2d, store_2d = q.load_2d, q.store_2d
    push_gemm, push_alu = q.push_gemm, q.push_alu
    def load_padded(buf, goff, xlo, xhi, ylo, yhi, X, Y, ystride, soff, mem, pad_min=False):
        if xhi <= xlo or yhi <= ylo:
            # the tile lies entirely in the padding: zero-fill it with rows of y padding
            # (y_size 0: nothing is read from DRAM, as in fsim's SRAM::Load)
            row = 0
            while row < Y:
                n0 = min(15, Y - row)
                n1 = min(15, Y - row - n0)
                load_2d(buf, 0, X, 0, X, 0, n0, 0, n1, soff + row * X, mem, pad_min)
                row += n0 + n1
            return
        xpa, ypa = X - xhi, Y - yhi
        if xlo > 15 or ylo > 15 or xpa > 15 or ypa > 15:
            raise _LoweringError(f"DMA padding ({ylo},{xlo},{ypa},{xpa}) exceeds the 4-bit pad "
                                 "fields")
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

    def emit(self, q, buffers: Dict[str, object]) -> None:
        """Append the function's instructions to the :class:`CommandQueue` ``q``.

        ``buffers`` maps each global buffer name (e.g. ``"data"``) to its :class:`DramBuffer`.
        """
        missing = [g for g in self.globals_used if g not in buffers]
        if missing:
            raise LoweringError(f"no DRAM buffer given for {missing}")
        self.fn(q, buffers)


def lower_to_runtime(cfg: VTAConfig, func, reuse: bool = False) -> GeneratedProgram:
    """Lower a PrimFunc (after :func:`lower_schedule`) to a :class:`GeneratedProgram`.

    Parameters
    ----------
    cfg : VTAConfig
        The target configuration.
    func : tvm.tirx.PrimFunc
        The function after :func:`vta_ext.lower.passes.lower_schedule`.
    reuse : bool
        Reuse-aware double buffering (paper §IV.D). Needs exactly two virtual threads. Every
        per-thread INP/WGT buffer whose loads do not depend on the virtual thread (both threads
        would load the same DRAM data) is loaded once, by thread 0, alternately into its two
        halves; the GEMMs of both threads read the half loaded last. The token protocol is
        unchanged: thread 0's next load into a half waits for the compute that follows the
        compute of the other thread, so both threads' GEMMs on that half are done.
    """
    conv = _Converter(cfg)
    raw = conv.stmts(func.body)
    items = _to_ir(conv, raw)
    items = _form_kernels(items)
    nthreads = _count_threads(items)
    used = _allocate(cfg, conv.bufs, nthreads)
    shared: Dict[str, str] = {}
    if reuse:
        if nthreads != 2:
            raise LoweringError(f"reuse-aware double buffering needs exactly 2 virtual threads, the "
                                f"schedule has {nthreads}")
        shared = {name: f"_half{i}" for i, name in enumerate(_shared_buffers(conv.bufs, items))}
    items = _regionize(items)
    planner = _SyncPlanner()
    planner.plan(items)
    items = _apply_sync(items, planner)
    em = _Emitter(cfg, conv.bufs, shared)
    for var in shared.values():
        em.line(1, f"{var} = 1")
    em.items(items, 1, [({}, 0)])
    src = _PRELUDE + "    " + "\n    ".join(
        f"B_{g} = buffers[{g!r}]" for g in sorted(conv.globals)) + "\n" + "\n".join(em.lines) + "\n"
    ns = dict(em.consts)
    ns["_LoweringError"] = LoweringError
    exec(compile(src, "<vta_lowered>", "exec"), ns)
    return GeneratedProgram(src, ns["_generated"], sorted(conv.globals), used, nthreads,
                            sorted(shared))


def _region_dmas(items) -> list:
    out = []
    for x in items:
        if isinstance(x, Dma):
            out.append(x)
        elif isinstance(x, Loop):
            out += _region_dmas(x.body)
    return out


def _shared_buffers(bufs: Dict[str, SramBuf], items) -> List[str]:
    """Per-thread INP/WGT buffers whose every load is independent of the virtual-thread variables
    (and which nothing but loads writes)."""
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


def _count_threads(items) -> int:
    n = 1
    for it in items:
        if isinstance(it, Loop):
            inner = _count_threads(it.body)
            n = max(n, inner * (it.extent if it.vthread else 1))
    return n
