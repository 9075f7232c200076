"""TIR conversion: the body of a lowered PrimFunc -> loops and recognised statements.

Input: a PrimFunc after :func:`vta_ext.lower.passes.lower_schedule` (flat buffers, affine indices,
tensorized GEMMs as ``VTAUopGemm``/``VTAUopReset`` extern markers). :class:`TirConverter` walks it
once: it names every loop variable, records the on-chip allocations (:class:`SramBuf`, with the
lanes per element of their scratchpad) and the global buffers, turns index expressions into
:class:`Aff`, and classifies every perfect loop nest ending in a buffer store and every GEMM marker
(see :class:`TirConverter`). It is the only module of the lowering that reads TVM objects.
"""
from __future__ import annotations

import itertools
import re
from typing import Dict, List, Optional, Tuple

from ..config import VTAConfig
from ..memory import ACC_SCOPE, SCOPES, scratchpad_of_scope
from .affine import Aff
from .intrin import ACC_ALIAS_PRAGMA, ACC_FILL_PRAGMA, GEMM_EXTERN, RESET_EXTERN
from .ir import Loop, LoweringError, SramBuf

__all__ = ["TirConverter"]


class TirConverter:
    """Converts the body of a lowered PrimFunc into :class:`Loop` nodes and statement tuples.

    Parameters
    ----------
    cfg : VTAConfig
        The target configuration (lanes per element of each scope).

    Attributes
    ----------
    bufs : dict
        On-chip buffers by name (:class:`SramBuf`).
    globals : dict
        Global (DRAM) buffer name -> dtype.

    Notes
    -----
    :meth:`stmts` returns a list of :class:`Loop` nodes and tuples, one per recognised statement:
    ``("load", inner, sram, sram_idx, global, global_idx, conds, pad_min)``,
    ``("store", inner, sram, sram_idx, global, global_idx)``, ``("alu", inner, sram, idx, value)``,
    ``("gemm", acc, acc_idx, inp, inp_idx, wgt, wgt_idx)``, ``("reset", acc, acc_idx)`` and
    ``("fill", inner, sram, sram_idx)`` (a zero initialisation under :data:`ACC_FILL_PRAGMA`), where
    ``inner`` lists the ``(variable, extent)`` of the perfect loop nest around the statement and
    indices are :class:`Aff` in scalars. :mod:`.patterns` analyses them.
    """

    def __init__(self, cfg: VTAConfig) -> None:
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
        self.pads = {scope: scratchpad_of_scope(cfg, scope) for scope in SCOPES}
        # the pad-with-minimum value of each signed lane type of the scratchpads
        self.lane_min = {sp.dtype: sp.pad_min_value for sp in self.pads.values()}

    # ---------------------------------------------------------------- expressions
    def aff(self, e) -> Aff:
        """The :class:`Aff` of a TIR integer expression (raises if it is not affine)."""
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
        """Convert statement ``s`` (see the class notes for the result)."""
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
            sb = SramBuf(b.name, scope, n, self.pads[scope].lanes, vthread=self.vthread_depth > 0)
            self.bufs[b.name] = sb
            self.data_vars[str(b.data)] = sb
            return []
        if isinstance(s, t.For):
            if int(s.min) != 0:
                raise LoweringError(f"loop {s.loop_var} does not start at 0")
            if ACC_FILL_PRAGMA in s.annotations:
                return [self._fill(s)]
            if ACC_ALIAS_PRAGMA in s.annotations:
                return self._alias(s)
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

    def _plain_nest(self, s, pragma: str):
        """``(loops, body)`` of the perfect loop nest ``s`` under ``pragma``: plain loops from 0."""
        loops, body = [], s
        while isinstance(body, self.tirx.For):
            if int(body.min) != 0 or "vta_vthread" in body.annotations:
                raise LoweringError(f"{pragma} loop nest: loop {body.loop_var} must be a plain "
                                    "loop from 0")
            loops.append(body)
            body = body.body
        return loops, body

    def _fill(self, s):
        """``("fill", inner, sram, idx)`` of a loop nest under :data:`ACC_FILL_PRAGMA`: a perfect
        nest storing 0 into an on-chip buffer."""
        t = self.tirx
        loops, body = self._plain_nest(s, ACC_FILL_PRAGMA)
        if not (isinstance(body, t.BufferStore) and body.buffer.name in self.bufs
                and isinstance(body.value, t.IntImm) and int(body.value.value) == 0):
            raise LoweringError(f"{ACC_FILL_PRAGMA} loop nest must store 0 into an on-chip buffer, "
                                f"got {body}")
        inner = [(self._uid(lp), int(lp.extent)) for lp in loops]
        return ("fill", inner, self.bufs[body.buffer.name], self.aff(body.indices[0]))

    def _alias(self, s) -> list:
        """A loop nest under :data:`ACC_ALIAS_PRAGMA`: a perfect nest copying one accumulator
        buffer into another of the same size at the same index. No statement: the destination
        becomes an alias of the source (it shares its storage, as an in-place ALU stage's)."""
        t = self.tirx
        loops, body = self._plain_nest(s, ACC_ALIAS_PRAGMA)
        for lp in loops:
            self._uid(lp)
        src = self.load_of(body.value) if isinstance(body, t.BufferStore) else None
        dst = self.bufs.get(body.buffer.name) if src is not None else None
        sbuf = self.bufs.get(src[0]) if src is not None else None
        index = self.aff(body.indices[0]) if dst is not None else None
        if dst is None or sbuf is None or (index.c, index.k) != (src[1].c, src[1].k) \
                or {dst.scope, sbuf.scope} != {ACC_SCOPE} or dst.nscalars != sbuf.nscalars:
            raise LoweringError(f"{ACC_ALIAS_PRAGMA} loop nest must copy an accumulator buffer into "
                                f"another of its size at the same index, got {body}")
        dst.alias = sbuf
        return []

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

    def load_of(self, e) -> Optional[Tuple[str, Aff]]:
        """``(buffer name, index)`` if ``e`` is a (possibly cast) buffer load, else None."""
        t = self.tvm
        if isinstance(e, t.ir.TensorLoad):
            return e.source.name, self.aff(e.indices[0])
        if isinstance(e, self.tirx.Cast):
            return self.load_of(e.value)
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
            src = self.load_of(v)
            if src is None or src[0] not in self.bufs:
                raise LoweringError(f"store to {dst} is not a copy from an on-chip buffer: {v}")
            return ("store", inner, self.bufs[src[0]], src[1], dst, didx)
        # on-chip destination: DMA load (maybe padded) or ALU
        cond = None
        pad_min = False
        if isinstance(v, self.tvm.ir.Call) and getattr(v.op, "name", "").endswith("if_then_else"):
            cond, v, other = v.args
            odt = str(getattr(other, "ty", getattr(other, "dtype", "")))
            if isinstance(other, t.IntImm) and int(other.value) == self.lane_min.get(odt):
                pad_min = True          # LOAD pad-min extension (max pooling)
            elif not (isinstance(other, t.IntImm) and int(other.value) == 0):
                raise LoweringError(f"padding value of {dst} must be 0 or the minimum of "
                                    f"{odt}, got {other}")
        src = self.load_of(v)
        if src is not None and src[0] not in self.bufs:
            return ("load", inner, dst_sram, didx, src[0], src[1],
                    None if cond is None else self.conds(cond), pad_min)
        if cond is not None:
            raise LoweringError(f"conditional store into {dst} that is not a padded load")
        return ("alu", inner, dst_sram, didx, v)
