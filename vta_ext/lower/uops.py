"""Micro-op folding: GEMM calls and ALU stages -> micro-op kernels (``UopKernel``).

A VTA GEMM or ALU instruction runs a list of micro-ops inside two affine loop levels
(``iter_out``/``iter_in`` with per-operand factors). :func:`form_kernels` groups the tensorized GEMM
calls into :class:`GemmKernel` nodes (the original ``FoldUopLoop``); :func:`gemm_kernel` and
:func:`alu_kernel` fold the outer loops into the loop fields, unroll the rest into micro-ops and
split each operand offset into a static part (in the micro-ops) and a dynamic part that depends on
the CPU loops around the kernel; :func:`make_kernel` builds the :class:`~vta_ext.runtime.UopKernel`
for given dynamic offsets.

A kernel *spec* is a hashable tuple: ``("gemm", reset, folded, uops)`` with ``folded`` the
``(extent, acc, inp, wgt)`` factors of each folded loop and ``uops`` the static
``(acc, inp, wgt)`` indices; or ``("alu", op, use_imm, imm, folded, uops)`` with
``(extent, dst, src)`` factors and ``(dst, src)`` indices.
"""
from __future__ import annotations

import itertools
from typing import Callable, Dict, List, Sequence, Tuple, Union

from ..config import VTAConfig
from ..isa import MemType
from ..memory import scratchpads
from ..runtime import UopKernel
from .affine import Aff
from .ir import Alu, GemmCall, GemmKernel, Loop, LoweringError, SramBuf

__all__ = ["form_kernels", "gemm_kernel", "alu_kernel", "make_kernel", "KernelSpec", "BaseOf"]

#: a hashable description of a micro-op kernel (see the module docstring)
KernelSpec = tuple
#: the SRAM element index of a buffer's copy for the current virtual thread (an :class:`Aff` when
#: it alternates at run time)
BaseOf = Callable[[SramBuf], Union[int, Aff]]


def _only_gemm(node, reset) -> bool:
    if isinstance(node, GemmCall):
        return node.reset == reset
    if isinstance(node, Loop) and not node.vthread:
        return bool(node.body) and all(_only_gemm(b, reset) for b in node.body)
    return False


def form_kernels(items: list) -> list:
    """Group GEMM calls into :class:`GemmKernel` nodes (the original ``FoldUopLoop``).

    A loop nest holding only GEMM calls (or only resets) becomes one kernel: its two outermost
    loops (of a single loop chain) are folded into the instruction's loop fields, the rest is
    unrolled into micro-ops by :func:`gemm_kernel`. Consecutive loop-free calls share a kernel.
    """
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
            while len(loops) < UopKernel.MAX_LOOPS and len(body) == 1 and isinstance(body[0], Loop):
                loops.append((body[0].var, body[0].extent))
                body = body[0].body
            out.append(GemmKernel(reset, loops, list(body)))
        elif isinstance(it, Loop):
            out.append(Loop(it.var, it.extent, form_kernels(it.body), it.vthread))
        else:
            out.append(it)
    return out


def alu_kernel(a: Alu, base_of: BaseOf, env: Dict[str, int]) -> Tuple[KernelSpec, List[Aff]]:
    """The kernel spec of ALU stage ``a`` and its dynamic ``[dst, src]`` offsets.

    Parameters
    ----------
    a : Alu
        The stage.
    base_of : callable
        SRAM base of a buffer for the current virtual thread.
    env : dict
        Values of the virtual-thread variables.
    """
    doff = a.dst_off.subst(env) + base_of(a.dst)
    soff = a.src_off.subst(env) + base_of(a.src)
    folded = a.loops[:UopKernel.MAX_LOOPS]
    unrolled = a.loops[UopKernel.MAX_LOOPS:]
    uops = []
    for vals in itertools.product(*[range(lp[1]) for lp in unrolled]):
        dd = sum(v * lp[2] for v, lp in zip(vals, unrolled))
        ss = sum(v * lp[3] for v, lp in zip(vals, unrolled))
        uops.append((dd, ss))
    spec = ("alu", a.op, a.use_imm, a.imm, tuple((lp[1], lp[2], lp[3]) for lp in folded),
            tuple(uops))
    return spec, [doff, soff]


def gemm_kernel(cfg: VTAConfig, g: GemmKernel, base_of: BaseOf,
                env: Dict[str, int]) -> Tuple[KernelSpec, List[Aff]]:
    """The kernel spec of ``g`` and its dynamic ``[acc, inp, wgt]`` offsets (in elements).

    Raises
    ------
    LoweringError
        If the calls' offsets are not whole elements or do not share one affine form.
    """
    pads = scratchpads(cfg)
    ea, ei, ew = (pads[m].lanes for m in (MemType.ACC, MemType.INP, MemType.WGT))
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
    nodes = list({id(n): n for n, _ in calls}.values())   # each call node once, in call order
    for var, ext in g.loops:
        fa = fi = fw = 0
        for n in nodes:
            fa = n.acc[1].coef(var)
            fi = n.inp[1].coef(var) if n.inp else 0
            fw = n.wgt[1].coef(var) if n.wgt else 0
            break
        for n in nodes:  # one consistent coefficient per argument
            if (n.acc[1].coef(var), n.inp[1].coef(var) if n.inp else 0,
                    n.wgt[1].coef(var) if n.wgt else 0) != (fa, fi, fw):
                raise LoweringError("GEMM micro-ops with inconsistent loop coefficients")
        if fa % ea or fi % ei or fw % ew:
            raise LoweringError("GEMM loop strides are not whole elements")
        folded.append((ext, fa // ea, fi // ei, fw // ew))
    fold_vars = {v for v, _ in g.loops}
    # uop offsets: static part (inner loops) + dynamic part (outer vars, shared by all uops).
    # index.without(folded).subst(lenv).subst(env) + base, per call and operand: the variables
    # an unrolled loop binds (lenv) are the same at every call of one node, so per node and
    # operand the rest is prepared once (:func:`_operand_form`); per call only the unrolled
    # loop values are added.
    prepared: Dict[tuple, list] = {}
    dyn = None
    uops = []
    for n, lenv in calls:
        node = (id(n), tuple(lenv))
        forms = prepared.get(node)
        first = forms is None
        if first:
            forms = prepared[node] = [
                None if opnd is None else _operand_form(opnd, e, base_of, fold_vars, lenv, env)
                for opnd, e in ((n.acc, ea), (n.inp, ei), (n.wgt, ew))]
        st = []
        for f, e in zip(forms, (ea, ei, ew)):
            if f is None:
                st.append(0)
                continue
            k = f[1]
            for v, x in f[0]:
                k += x * lenv[v]
            if k % e:
                raise LoweringError("GEMM operand offset is not element aligned")
            st.append(k // e)
        if first:       # the dynamic part is the node's: checked at its first call
            key = tuple(None if f is None else f[2] for f in forms)
            if dyn is None:
                dyn = (key, [None if f is None else f[3] for f in forms])
            elif dyn[0] != key:
                raise LoweringError("GEMM micro-ops depend differently on CPU loop variables")
        uops.append(tuple(st))
    dparts = [Aff() if p is None else Aff(p, 0).div(e) for p, e in zip(dyn[1], (ea, ei, ew))]
    return ("gemm", g.reset, tuple(folded), tuple(uops)), dparts


def _operand_form(opnd, e: int, base_of: BaseOf, fold_vars, lenv: Dict[str, int],
                  env: Dict[str, int]) -> tuple:
    """What a GEMM micro-op's offset of operand ``opnd`` (``(buffer, index)``, ``e`` lanes per
    element) is made of at a call whose unrolled loops bind ``lenv``'s variables: ``(unrolled
    terms, constant, dynamic key, dynamic terms)``. The offset of a call is the constant plus
    each unrolled term's coefficient times its loop value; the dynamic terms (the CPU loop
    variables, without the folded loops ``fold_vars``) must be whole elements."""
    buf, idx = opnd
    base = base_of(buf)
    term = base.scale(e) if isinstance(base, Aff) else Aff(None, base * e)
    unrolled, k, c = [], idx.k, {}
    for v, x in idx.without(fold_vars).c.items():
        if v in lenv:
            unrolled.append((v, x))
        elif v in env:
            k += x * env[v]
        else:
            c[v] = x
    for v, x in term.c.items():
        c[v] = c.get(v, 0) + x
    k += term.k
    c = {v: x for v, x in c.items() if x}
    if any(x % e for x in c.values()):
        raise LoweringError("GEMM operand offset is not element aligned")
    return tuple(unrolled), k, tuple(sorted(c.items())), c


def make_kernel(cfg: VTAConfig, spec: KernelSpec, offs: Sequence[int]) -> UopKernel:
    """The micro-op kernel of ``spec`` with dynamic offsets ``offs`` added to its micro-ops.

    Raises
    ------
    LoweringError
        If the kernel has more micro-ops than the micro-op buffer holds.
    """
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
    depth = scratchpads(cfg)[MemType.UOP].depth
    if k.size > depth:
        raise LoweringError(f"a micro-op kernel of {k.size} uops exceeds the micro-op buffer "
                            f"({depth}); reduce the tile knobs")
    return k
