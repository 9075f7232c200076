"""DMA and ALU pattern analysis: recognised statements -> 2-D DMAs, ALU stages and GEMM calls.

The original compiler's ``InjectDMAIntrin`` and ``InjectALUIntrin`` (``vta/python/vta/transform.py``):

* ``sram[...] = global[...]`` (optionally ``if_then_else(cond, global[...], 0 or minimum)``) is a
  DMA load; the loops forming one element (the lanes) must be contiguous on both sides, the
  innermost element loops become the x and y dimensions, the rest CPU loops, and the pad condition
  gives per-instruction pad counts (:class:`Dma`);
* ``global[...] = cast(acc[...])`` is a DMA store;
* ``acc[...] = op(acc[...], imm | acc[...])`` is an ALU stage, done in place: the destination
  buffer is aliased to the accumulator operand; ``max(min(x, hi), lo)`` is one CLIP (extension
  ``EXT_CLIP``) or MIN then MAX, a constant is CLIP [c, c] or MIN c then MAX c, a left shift is SHR
  by a negative amount, a copy is SHR 0 (:class:`Alu`);
* a GEMM marker is a :class:`GemmCall`; :mod:`.uops` folds them into kernels.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from ..isa import AluOp, FieldRangeError, MemType, clip_alu_ops
from ..layout import CLIP_MIN, IMM_MAX, IMM_MIN, MAX_DMA_STRIDE
from ..memory import ACC_SCOPE, INP_SCOPE, WGT_SCOPE
from .affine import Aff
from .convert import TirConverter
from .ir import Alu, Dma, GemmCall, Loop, LoweringError, SramBuf

__all__ = ["analyse"]


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
        var, _, _, dram_stride = rest[-1]
        # a row stride over the 16-bit x_stride field: the rows become a CPU loop instead, one
        # DMA per row (a padded loop cannot: its padding needs the DMA's own y dimension)
        if dram_stride <= MAX_DMA_STRIDE or var in free:
            y = rest.pop()
        elif var in pads:
            raise LoweringError(f"{what}: padded loop {var} strides {dram_stride} elements in "
                                f"DRAM, more than the {MAX_DMA_STRIDE} of the 16-bit x_stride "
                                "field; choose a tiling that keeps this loop out of the DMA")
    for lp in rest:
        if lp[0] in pads:
            raise LoweringError(f"{what}: padded loop {lp[0]} is not one of the two DMA dimensions")
    for v in pads:
        if v.endswith("*"):
            raise LoweringError(f"{what}: internal error, padded loop merged")
    return Dma(kind, mem, sbuf, gname, s_out.div(elem), g_out.div(elem), x, y, rest, pads, guards)


def _alu_operand(conv: TirConverter, e):
    t = conv.tirx
    if isinstance(e, int):
        return ("imm", e)
    if isinstance(e, t.IntImm):
        return ("imm", int(e.value))
    ld = conv.load_of(e)
    if ld is not None and ld[0] in conv.bufs:
        return ("buf", conv.bufs[ld[0]], ld[1])
    raise LoweringError(f"ALU operand {e} is neither an immediate nor an accumulator load")


def _analyse_alu(conv: TirConverter, inner, dbuf: SramBuf, didx: Aff, value, producers: set):
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
        ld = conv.load_of(value)
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
        if not IMM_MIN <= B[1] <= IMM_MAX:
            raise LoweringError(f"{what}: immediate {B[1]} does not fit the 16-bit ALU immediate "
                                f"({IMM_MIN}..{IMM_MAX})")
        other, use_imm, imm, sbuf = didx, True, B[1], dbuf
    else:
        other, use_imm, imm, sbuf = B[2], False, 0, B[1]
        if sbuf.scope != ACC_SCOPE:
            raise LoweringError(f"{what}: operand {sbuf.name} is not in {ACC_SCOPE}")
    d_out, s_out, merged = _alu_loops(inner, didx, other, elem, what)
    if op == "CLIP":
        return [Alu(int(alu_op), True, value, dbuf, sbuf, d_out, s_out, merged)
                for alu_op, value in _clip_ops(conv, clip[1], clip[2], what)]
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


def _analyse_fill(conv: TirConverter, inner, sbuf: SramBuf, sidx: Aff) -> Dma:
    """A zero initialisation of accumulator elements as LOADs made only of padding: the innermost
    contiguous run of elements is one padding row (``x_size`` elements, ``y_size`` 0, ``y_pad_0``
    1), the other element loops are replayed. No DRAM byte is read; the DRAM buffer named is only
    the base address the instruction must carry (the function's first global buffer)."""
    what = f"zero fill of {sbuf.name}"
    if sbuf.scope != ACC_SCOPE:
        raise LoweringError(f"{what}: only {ACC_SCOPE} is zero-filled by a LOAD, not {sbuf.scope}")
    if not conv.globals:
        raise LoweringError(f"{what}: the function has no DRAM buffer to address")
    d_out, _, loops = _alu_loops(inner, sidx, sidx, sbuf.elem, what)
    x = None
    if loops and loops[-1][2] == 1:
        var, ext, _, _ = loops.pop()
        x = (var, ext, 1, 0)
    cpu = [(var, ext, ds, 0) for var, ext, ds, _ in loops]
    return Dma("load", MemType.ACC, sbuf, sorted(conv.globals)[0], d_out, Aff(), x, None, cpu,
               fill=True)


def _alu_const(conv, inner, dbuf: SramBuf, didx: Aff, c: int, what: str):
    """``acc[...] = c``: VTA has no move-immediate; MIN c then MAX c (or CLIP [c, c]) sets any value
    to c (e.g. the initial value of a max-pooling reduction)."""
    if dbuf.scope != ACC_SCOPE:
        raise LoweringError(f"{what}: constants can only be written into {ACC_SCOPE}")
    if not IMM_MIN <= c <= IMM_MAX:
        raise LoweringError(f"{what}: the constant {c} does not fit a 16-bit ALU immediate "
                            f"({IMM_MIN}..{IMM_MAX}); initialise with a value of the data's range "
                            f"(e.g. {CLIP_MIN} for int8)")
    d_out, s_out, merged = _alu_loops(inner, didx, didx, dbuf.elem, what)
    return [Alu(int(alu_op), True, value, dbuf, dbuf, d_out, s_out, merged)
            for alu_op, value in _clip_ops(conv, c, c, what)]


def _clip_ops(conv, lo: int, hi: int, what: str):
    """:func:`vta_ext.isa.clip_alu_ops` for this configuration, as a lowering error."""
    try:
        return clip_alu_ops(conv.cfg.EXT_CLIP, lo, hi)
    except FieldRangeError as err:
        raise LoweringError(f"{what}: {err}") from None


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


def analyse(conv: TirConverter, items: list, producers: Optional[Set[str]] = None,
            heads: Optional[Dict[str, SramBuf]] = None) -> list:
    """Turn the output of :meth:`TirConverter.stmts` into :class:`Dma`, :class:`Alu` and
    :class:`GemmCall` nodes (loops are kept).

    Parameters
    ----------
    conv : TirConverter
        The converter that produced ``items``.
    items : list
        Its output (loops and statement tuples).
    producers, heads
        Internal state of the recursion: buffers written by GEMM/ALU, and the newest buffer of
        each in-place alias group.

    Raises
    ------
    LoweringError
        For a statement that maps onto no VTA instruction; the message says which and why.
    """
    out = []
    producers = set() if producers is None else producers
    heads = {} if heads is None else heads
    for it in items:
        if isinstance(it, Loop):
            out.append(Loop(it.var, it.extent, analyse(conv, it.body, producers, heads), it.vthread))
            continue
        kind = it[0]
        if kind == "load":
            _, inner, a, aidx, b, bidx, conds, pad_min = it
            if a.scope != ACC_SCOPE:
                mem = conv.pads[a.scope].mem
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
        elif kind == "fill":
            _, inner, sbuf, sidx = it
            heads.pop(sbuf.root.name, None)
            producers.add(sbuf.name)
            out.append(_analyse_fill(conv, inner, sbuf, sidx))
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
