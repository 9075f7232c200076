"""Shape-generic host kernels: one LLVM function per kind of host copy, not per tensor shape.

TVM legalizes every ``permute_dims`` and constant ``pad`` of a Relax module into a PrimFunc of
its own static shapes, and ``relax.build`` lowers and LLVM-compiles each one. The host relayouts
around VTA operators are mostly such copies, of tensors that differ only in their extents:
DenseNet-121 at 112 under ``csp-relaxed`` made 52 transposes of 7 permutations, and a warm build
spent most of its time in LLVM on them.

``concat`` is left as it is: a shape-generic concat (an ``if_then_else`` per input on symbolic
offsets) costs LLVM more than the static ones it replaces, and the concats of a network rarely
share an arity (DenseNet-121: 16 concats of 2 to 17 inputs; its CPU build time grew by 1 s).

:func:`shape_generic_host_kernels` rewrites each such call on statically shaped tensors into a
``call_tir`` of one PrimFunc per (operator, rank, attributes, dtype) whose extents are symbolic
(bound from the arguments when called), where the module has that kind of copy on at least
:data:`SHARED_SHAPES` shapes. Every output element is the same input element (or pad
value) as the legalized operator's, so results are unchanged, and the report's host layout
counts, made by the offload pass before this one, are unchanged too.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import tvm
from tvm import relax, te

__all__ = ["shape_generic_host_kernels", "SHARED_SHAPES"]


def _static(ty) -> bool:
    return (isinstance(ty, relax.TensorType) and ty.shape is not None
            and all(isinstance(s, tvm.tirx.IntImm) for s in ty.shape.values))


def _symbols(prefix: str, ndim: int) -> List[tvm.tirx.Var]:
    return [tvm.tirx.Var(f"{prefix}{i}", "int64") for i in range(ndim)]


def _func(name: str, args: Sequence[te.Tensor], out: te.Tensor) -> tvm.tirx.PrimFunc:
    return te.create_prim_func(list(args) + [out]).with_attr("global_symbol", name)


def _transpose(ndim: int, axes: Tuple[int, ...], dtype: str) -> tvm.tirx.PrimFunc:
    """``b = permute_dims(a, axes)`` for every shape of rank ``ndim``."""
    shape = _symbols("n", ndim)
    a = te.placeholder(shape, dtype, name="a")
    where = [axes.index(d) for d in range(ndim)]     # output axis of each input axis
    b = te.compute([shape[x] for x in axes],
                   lambda *i: a[tuple(i[where[d]] for d in range(ndim))], name="b")
    return _func(f"vta_host_transpose_{'_'.join(map(str, axes))}_{dtype}", [a], b)


def _pad(ndim: int, widths: Tuple[int, ...], value: float, dtype: str) -> tvm.tirx.PrimFunc:
    """Constant ``pad`` by ``widths`` (before and after, per axis) of any shape of rank ``ndim``."""
    shape = _symbols("n", ndim)
    a = te.placeholder(shape, dtype, name="a")
    lo, hi = widths[0::2], widths[1::2]

    def element(*i):
        inside = tvm.tirx.const(True, "bool")
        idx = []
        for d in range(ndim):
            if lo[d] or hi[d]:
                inside = tvm.tirx.all(inside, i[d] >= lo[d], i[d] < shape[d] + lo[d])
            idx.append(i[d] - lo[d])
        fill = tvm.tirx.const(value if "float" in dtype else int(value), dtype)
        return te.if_then_else(inside, a[tuple(idx)], fill)

    out = te.compute([shape[d] + lo[d] + hi[d] for d in range(ndim)], element, name="b")
    tag = "_".join(str(w) for w in widths)
    return _func(f"vta_host_pad_{tag}_v{value:g}_{dtype}".replace("-", "m").replace(".", "p"),
                 [a], out)


def _transpose_key(call) -> Optional[tuple]:
    ty = call.args[0].ty
    if not _static(ty):
        return None
    ndim = ty.ndim
    axes = (tuple(reversed(range(ndim))) if call.attrs.axes is None
            else tuple(int(a) for a in call.attrs.axes))
    return ("transpose", ndim, axes, str(ty.dtype)), [call.args[0]]


def _pad_key(call) -> Optional[tuple]:
    ty = call.args[0].ty
    if not _static(ty) or str(call.attrs.pad_mode) != "constant" or len(call.args) != 1:
        return None
    widths = tuple(int(w) for w in call.attrs.pad_width)
    if len(widths) != 2 * ty.ndim or min(widths) < 0:
        return None
    return ("pad", ty.ndim, widths, float(call.attrs.pad_value), str(ty.dtype)), [call.args[0]]


#: Relax operator -> (the key and arguments of a call, or None to leave it; the PrimFunc maker)
_KERNELS: Dict[str, Tuple[Callable, Callable]] = {
    "relax.permute_dims": (_transpose_key, _transpose),
    "relax.nn.pad": (_pad_key, _pad),
}


#: a kind of copy gets a shape-generic function only when the module has it on at least this
#: many distinct shapes: a generic function costs LLVM about twice a static one (symbolic index
#: arithmetic), so sharing one among two shapes saves nothing. RegNetX-1.6GF at 224 has only
#: permutations of one shape each; rewriting them all made its warm build 0.5 s slower.
SHARED_SHAPES = 3


@tvm.transform.module_pass(opt_level=0, name="VTAShapeGenericHostKernels")
def shape_generic_host_kernels(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Make every ``permute_dims`` and constant ``pad`` of statically shaped tensors a
    ``call_tir`` of one shape-generic PrimFunc per (operator, rank, attributes, dtype), for the
    kinds the module has on at least :data:`SHARED_SHAPES` distinct shapes."""
    ops = {tvm.ir.Op.get(name): entry for name, entry in _KERNELS.items()}

    def kind_of(call):
        entry = ops.get(call.op) if isinstance(call.op, tvm.ir.Op) else None
        if entry is None or not _static(call.ty):
            return None, None
        found = entry[0](call)
        return (entry, found) if found is not None else (None, None)

    @relax.expr_functor.visitor
    class _Counter(relax.PyExprVisitor):
        def __init__(self):
            super().__init__()
            self.shapes: Dict[tuple, set] = {}

        def visit_call_(self, call):
            super().visit_call_(call)
            _, found = kind_of(call)
            if found is not None:
                key, args = found
                self.shapes.setdefault(key, set()).add(
                    tuple(tuple(int(v) for v in a.ty.shape.values) for a in args))

    counter = _Counter()
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            counter.visit_expr(func)
    shared = {key for key, shapes in counter.shapes.items() if len(shapes) >= SHARED_SHAPES}
    if not shared:
        return mod

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def __init__(self, module):
            super().__init__(module)
            self.funcs: Dict[tuple, tvm.ir.GlobalVar] = {}

        def visit_call_(self, call):
            call = super().visit_call_(call)
            entry, found = kind_of(call)
            if found is None or found[0] not in shared:
                return call
            key, args = found
            gv = self.funcs.get(key)
            if gv is None:
                func = entry[1](*key[1:])
                gv = self.funcs[key] = self.builder_.add_func(func, str(func.attrs["global_symbol"]))
            return relax.call_tir(gv, args, out_ty=call.ty)

    rewriter = _Rewriter(mod)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()
