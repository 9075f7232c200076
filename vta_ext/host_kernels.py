"""Shape-generic host kernels: one LLVM function per kind of host copy, not per tensor shape.

TVM legalizes every ``permute_dims``, ``pad``, ``strided_slice``, ``take`` and ``where`` of a
Relax module into a PrimFunc of its own static shapes, and ``relax.build`` lowers and
LLVM-compiles each one. The host relayouts around VTA operators are mostly such copies, of tensors
that differ only in their extents: DenseNet-121 at 112 under ``csp-relaxed`` made 52 transposes
of 7 permutations, RegNetX-1.6GF at 224 30 transposes of 13 permutations, 12 pads of 9 widths,
12 slices, 8 takes and 5 wheres (53 PrimFuncs), and a warm build spent most of its TVM time in
LLVM on them (``docs/host-kernels.md``).

:func:`shape_generic_host_kernels` first writes each such copy in its *canonical form*: axes of
extent 1 dropped and neighbouring axes merged where the copy moves them together (a row-major
reshape on each side, which the VM makes a view, no copy):

* ``permute_dims``: input axes that stay neighbours in the output merge; what is left is the
  shortest permutation that moves the same bytes (:func:`canonical_permutation`; RegNetX's 13
  permutations are 4 canonical ones and identities). A permutation whose canonical form is the
  identity becomes a ``reshape``.
* constant ``pad`` and unit-stride ``strided_slice`` (a crop): an axis that is neither padded nor
  cropped merges into the axis before it, its offset and widths scaled by its extent
  (:func:`canonical_window`). The offsets are arguments of the function, not part of it.
* ``take`` along one axis: the tensor as (outer, axis, inner) and the indices as a vector
  (constant indices clipped now); a take along the last axis has no inner axis.
* ``where``: axes merged where the three inputs broadcast alike.

It then makes each copy whose canonical kind (operator, permutation, pad value, which inputs
broadcast, dtypes) the module has on at least :data:`SHARED_SHAPES` distinct canonical shapes a
``call_tir`` of one PrimFunc of that kind with symbolic extents (bound from the arguments when
called). Pads, crops and wheres of lower rank take their kind's function with unit axes in front,
so a module has one of each. Every output element is the same input element (or pad value) as
the legalized operator's, so results are unchanged, and the report's host layout counts, made by
the offload pass before this one, are unchanged too.

``concat`` is left as it is: a shape-generic concat (an ``if_then_else`` per input on symbolic
offsets) costs LLVM more than the static ones it replaces, and the concats of a network rarely
share an arity (DenseNet-121: 16 concats of 2 to 17 inputs; its CPU build time grew by 1 s).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tvm
from tvm import relax, te

__all__ = ["shape_generic_host_kernels", "canonical_permutation", "canonical_window",
           "SHARED_SHAPES"]

Shape = Tuple[int, ...]


def _static(ty) -> bool:
    return (isinstance(ty, relax.TensorType) and ty.shape is not None
            and all(isinstance(s, tvm.tirx.IntImm) for s in ty.shape.values))


def _shape(expr) -> Shape:
    return tuple(int(v) for v in expr.ty.shape.values)


def canonical_permutation(shape: Sequence[int],
                          axes: Sequence[int]) -> Tuple[Shape, Tuple[int, ...]]:
    """The shortest ``(shape, axes)`` whose ``permute_dims`` moves the bytes of
    ``permute_dims(x, axes)`` for ``x`` of ``shape``, both sides read row-major: axes of extent 1
    dropped, input axes that are neighbours in the output too merged into one.

    Examples
    --------
    >>> canonical_permutation((1, 5, 16, 1, 56, 56), (0, 1, 4, 5, 3, 2))
    ((5, 16, 3136), (0, 2, 1))
    >>> canonical_permutation((1, 63, 1, 16), (0, 1, 3, 2))   # an identity
    ((1008,), (0,))
    """
    kept = {d: i for i, d in enumerate(d for d in range(len(shape)) if shape[d] != 1)}
    runs: List[List[int]] = []                  # runs of input axes kept next to each other
    for a in axes:
        if a not in kept:
            continue
        if runs and kept[runs[-1][-1]] + 1 == kept[a]:
            runs[-1].append(a)
        else:
            runs.append([a])
    order = sorted(range(len(runs)), key=lambda r: runs[r][0])
    rank = {r: i for i, r in enumerate(order)}
    merged = tuple(int(np.prod([shape[a] for a in runs[r]], dtype=np.int64)) for r in order)
    return merged, tuple(rank[r] for r in range(len(runs)))


def canonical_window(shape: Sequence[int], lo: Sequence[int],
                     out: Sequence[int]) -> Tuple[Shape, Shape, Shape]:
    """``(shape, lo, out)`` of a pad (``lo`` before, ``out`` extents) or a crop (offset ``lo``,
    ``out`` extents) with every axis that keeps its extent and offset 0 merged into the axis
    before it (row-major: its offset scales by its extent) and axes of extent 1 dropped.

    Examples
    --------
    >>> canonical_window((1, 72, 56, 56), (0, 0, 0, 0), (1, 80, 56, 56))   # channel pad 72 -> 80
    ((225792,), (0,), (250880,))
    """
    groups: List[List[int]] = []                    # [in extent, lo, out extent]
    for n, l, m in zip(shape, lo, out):
        if l == 0 and m == n and groups:
            g = groups[-1]
            groups[-1] = [g[0] * n, g[1] * n, g[2] * n]
        else:
            groups.append([n, l, m])
    groups = [g for g in groups if g != [1, 0, 1]]
    return tuple(g[0] for g in groups), tuple(g[1] for g in groups), tuple(g[2] for g in groups)


def _symbols(prefix: str, ndim: int) -> List[tvm.tirx.Var]:
    return [tvm.tirx.Var(f"{prefix}{i}", "int64") for i in range(ndim)]


def _func(name: str, args: Sequence, out: te.Tensor) -> tvm.tirx.PrimFunc:
    return te.create_prim_func(list(args) + [out]).with_attr("global_symbol", name)


def _transpose(ndim: int, axes: Tuple[int, ...], dtype: str) -> tvm.tirx.PrimFunc:
    """``b = permute_dims(a, axes)`` for every shape of rank ``ndim``."""
    shape = _symbols("n", ndim)
    a = te.placeholder(shape, dtype, name="a")
    where = [axes.index(d) for d in range(ndim)]     # output axis of each input axis
    b = te.compute([shape[x] for x in axes],
                   lambda *i: a[tuple(i[where[d]] for d in range(ndim))], name="b")
    return _func(f"vta_host_transpose_{'_'.join(map(str, axes))}_{dtype}", [a], b)


def _pad(ndim: int, value: float, dtype: str) -> tvm.tirx.PrimFunc:
    """``b`` (extents ``m``) = ``a`` (extents ``n``) placed at offsets ``lo`` (arguments), the
    rest ``value``: a constant pad of any shape and widths of rank ``ndim``."""
    n, m, lo = _symbols("n", ndim), _symbols("m", ndim), _symbols("lo", ndim)
    a = te.placeholder(n, dtype, name="a")

    def element(*i):
        # lo <= i < lo + n as one unsigned comparison per axis
        inside = tvm.tirx.all(*[(i[d] - lo[d]).astype("uint64") < n[d].astype("uint64")
                                for d in range(ndim)])
        fill = tvm.tirx.const(value if "float" in dtype else int(value), dtype)
        return te.if_then_else(inside, a[tuple(i[d] - lo[d] for d in range(ndim))], fill)

    b = te.compute(m, element, name="b")
    return _func(f"vta_host_pad{ndim}_v{value:g}_{dtype}".replace("-", "m").replace(".", "p"),
                 [a] + lo, b)


def _crop(ndim: int, dtype: str) -> tvm.tirx.PrimFunc:
    """``b`` (extents ``m``) = the window of ``a`` at offsets ``lo`` (arguments): a unit-stride
    ``strided_slice`` of any shape of rank ``ndim``."""
    n, m, lo = _symbols("n", ndim), _symbols("m", ndim), _symbols("lo", ndim)
    a = te.placeholder(n, dtype, name="a")
    b = te.compute(m, lambda *i: a[tuple(i[d] + lo[d] for d in range(ndim))], name="b")
    return _func(f"vta_host_crop{ndim}_{dtype}", [a] + lo, b)


def _where(ndim: int, full: Tuple[bool, bool, bool], cond_dtype: str,
           dtype: str) -> tvm.tirx.PrimFunc:
    """``b = where(c, t, f)`` for every shape of rank ``ndim`` and every broadcast of ``c``,
    ``t`` and ``f`` to ``b`` (an axis of extent 1 is read at 0); an input ``full`` has the
    output's shape (indexed as it, which LLVM makes faster code of)."""
    m = _symbols("m", ndim)
    c, t, f = (te.placeholder(m if whole else _symbols(p, ndim), dt, name=p)
               for p, dt, whole in zip("ctf", (cond_dtype, dtype, dtype), full))

    def at(x, whole, i):  # i, or 0 on an axis of extent 1 (a factor 0 or 1 for the whole loop)
        return x[i if whole else tuple(i[d] * tvm.tirx.min(x.shape[d] - 1, 1)
                                       for d in range(ndim))]

    b = te.compute(m, lambda *i: tvm.tirx.Select(at(c, full[0], i).astype("bool"),
                                                 at(t, full[1], i), at(f, full[2], i)), name="b")
    tag = "".join("ctf"[k] for k in range(3) if full[k])
    return _func(f"vta_host_where{ndim}_{tag}_{cond_dtype}_{dtype}", [c, t, f], b)


def _take(mode: str, rows: bool, dtype: str, index_dtype: str) -> tvm.tirx.PrimFunc:
    """``b[o, j, i] = a[o, idx[j], i]`` (``idx`` clipped to the axis for ``mode="clip"``): a
    ``take`` along one axis, the tensor as (outer, axis, inner) and the indices as a vector;
    without ``rows``, the take is along the last axis: ``b[o, j] = a[o, idx[j]]``."""
    o, n, i, k = _symbols("o", 1) + _symbols("n", 1) + _symbols("i", 1) + _symbols("k", 1)
    a = te.placeholder([o, n, i] if rows else [o, n], dtype, name="a")
    idx = te.placeholder([k], index_dtype, name="idx")

    def element(x, j, *y):
        at = idx[j].astype("int64")
        if mode == "clip":
            at = tvm.tirx.max(tvm.tirx.min(at, n - 1), tvm.tirx.const(0, "int64"))
        return a[(x, at) + y]

    b = te.compute([o, k, i] if rows else [o, k], element, name="b")
    return _func(f"vta_host_take_{mode}{'_rows' if rows else ''}_{dtype}_{index_dtype}",
                 [a, idx], b)


@dataclasses.dataclass(frozen=True)
class _Copy:
    """One host copy in canonical form: its kind (the PrimFunc's key), the canonical shapes of its
    tensors (reshaped to them), its scalar arguments and its canonical output shape."""

    key: tuple
    tensors: Tuple[Tuple[relax.Expr, Shape], ...]
    scalars: Tuple[int, ...]
    out: Shape
    #: the kind's function takes any lower rank too, with unit axes in front (pad, crop, where:
    #: the key leaves the rank out, and the module's copies of the kind share the highest one)
    any_rank: bool = False

    @property
    def signature(self) -> tuple:
        return tuple(s for _, s in self.tensors), self.scalars

    def at_rank(self, rank: int) -> "_Copy":
        """The same copy with unit axes (offset 0) in front, to rank ``rank``."""
        k = rank - len(self.out)
        if not self.any_rank or k <= 0:
            return self
        ones = (1,) * k
        return dataclasses.replace(
            self, tensors=tuple((e, ones + s) for e, s in self.tensors),
            scalars=((0,) * k if self.scalars else ()) + self.scalars, out=ones + self.out)


def _permute(call) -> Optional[_Copy]:
    x = call.args[0]
    shape = _shape(x)
    axes = (tuple(reversed(range(len(shape)))) if call.attrs.axes is None
            else tuple(int(a) % len(shape) for a in call.attrs.axes))
    merged, perm = canonical_permutation(shape, axes)
    if perm == tuple(range(len(perm))):
        return _Copy(("identity",), ((x, merged),), (), merged)
    return _Copy(("transpose", len(perm), perm, str(x.ty.dtype)), ((x, merged),), (),
                 tuple(merged[p] for p in perm))


def _pad_copy(call) -> Optional[_Copy]:
    x = call.args[0]
    shape = _shape(x)
    if str(call.attrs.pad_mode) != "constant" or len(call.args) != 1:
        return None
    widths = [int(w) for w in call.attrs.pad_width]
    if len(widths) != 2 * len(shape) or min(widths) < 0:
        return None
    n, lo, m = canonical_window(shape, widths[0::2], _shape(call))
    if not n:
        return None
    return _Copy(("pad", float(call.attrs.pad_value), str(x.ty.dtype)), ((x, n),), lo, m,
                 any_rank=True)


def _slice_copy(call) -> Optional[_Copy]:
    x = call.args[0]
    shape, out = _shape(x), _shape(call)
    if not all(isinstance(getattr(v, "value", None), (int, tvm.tirx.IntImm))
               for a in call.args[1:] for v in getattr(a, "fields", [None])):
        return None                                   # offsets known only at run time
    fields = [[int(v.value) for v in a.fields] for a in call.args[1:]]
    axes, begin = fields[0], fields[1]
    if len(fields) > 3 and any(s != 1 for s in fields[3]):
        return None
    lo = [0] * len(shape)
    for a, b in zip(axes, begin):
        a %= len(shape)
        if b < 0:
            b += shape[a]
        lo[a] = min(max(b, 0), shape[a])
    if any(l + m > n for l, m, n in zip(lo, out, shape)):
        return None
    n, lo, m = canonical_window(shape, lo, out)
    if not n:
        return None
    return _Copy(("crop", str(x.ty.dtype)), ((x, n),), lo, m, any_rank=True)


def _take_copy(call) -> Optional[_Copy]:
    x, idx = call.args
    mode = str(call.attrs.mode)
    if mode not in ("clip", "fast") or not _static(idx.ty):
        return None
    shape = _shape(x)
    axis = int(call.attrs.axis) % len(shape) if call.attrs.axis is not None else None
    if axis is None:
        return None
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    k = int(np.prod(_shape(idx), dtype=np.int64))
    if isinstance(idx, tvm.ir.expr.GenericConst):
        # constant indices are clipped now, so the function does not ("fast" leaves an index
        # out of range undefined: clipping it is one of its results)
        idx = relax.const(np.clip(idx.value.numpy().reshape(k), 0, shape[axis] - 1),
                          str(idx.ty.dtype))
        mode = "fast"
    else:
        mode = "clip"
    rows = inner != 1
    a_shape = (outer, shape[axis], inner) if rows else (outer, shape[axis])
    return _Copy(("take", mode, rows, str(x.ty.dtype), str(idx.ty.dtype)),
                 ((x, a_shape), (idx, (k,))), (), (outer, k, inner) if rows else (outer, k))


def _where_copy(call) -> Optional[_Copy]:
    out = _shape(call)
    if any(not _static(a.ty) for a in call.args):
        return None
    shapes = [(1,) * (len(out) - len(_shape(a))) + _shape(a) for a in call.args]
    groups: List[list] = []                # [status, out extent, extent of each input]
    for d, m in enumerate(out):
        if m == 1:
            continue
        status = tuple(s[d] == m for s in shapes)
        if groups and groups[-1][0] == status:
            groups[-1][1] *= m
        else:
            groups.append([status, m])
    if not groups:
        return None
    ins = tuple(tuple(g[1] if g[0][i] else 1 for g in groups) for i in range(3))
    full = tuple(all(g[0][k] for g in groups) for k in range(3))
    return _Copy(("where", full, str(call.args[0].ty.dtype), str(call.ty.dtype)),
                 tuple(zip(call.args, ins)), (), tuple(g[1] for g in groups), any_rank=True)


#: Relax operator -> (its canonical form, or None to leave it)
_CANONICAL: Dict[str, Callable[[relax.Call], Optional[_Copy]]] = {
    "relax.permute_dims": _permute,
    "relax.nn.pad": _pad_copy,
    "relax.strided_slice": _slice_copy,
    "relax.take": _take_copy,
    "relax.where": _where_copy,
}

#: kind -> the PrimFunc maker, called with the kind's key after its name
_MAKERS: Dict[str, Callable[..., tvm.tirx.PrimFunc]] = {
    "transpose": _transpose, "pad": _pad, "crop": _crop, "take": _take, "where": _where,
}


#: a kind of copy gets a shape-generic function only when the module has it on at least this
#: many distinct canonical shapes: a generic function costs LLVM about twice a static one
#: (symbolic index arithmetic), so sharing one among two shapes saves nothing.
SHARED_SHAPES = 3


def _canonical(call) -> Optional[_Copy]:
    if not isinstance(call.op, tvm.ir.Op) or not _static(call.ty):
        return None
    make = _CANONICAL.get(call.op.name)
    if make is None or not _static(call.args[0].ty):
        return None
    return make(call)


@tvm.transform.module_pass(opt_level=0, name="VTAShapeGenericHostKernels")
def shape_generic_host_kernels(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Make every ``permute_dims``, constant ``pad``, unit-stride ``strided_slice``, ``take``
    and ``where`` of statically shaped tensors whose canonical kind the module has on at least
    :data:`SHARED_SHAPES` distinct canonical shapes a ``call_tir`` of one shape-generic PrimFunc
    of that kind, between row-major reshapes to and from the canonical shapes; and every
    ``permute_dims`` that moves no byte a ``reshape``."""

    @relax.expr_functor.visitor
    class _Counter(relax.PyExprVisitor):
        def __init__(self):
            super().__init__()
            self.shapes: Dict[tuple, set] = {}
            self.ranks: Dict[tuple, int] = {}

        def visit_call_(self, call):
            super().visit_call_(call)
            copy = _canonical(call)
            if copy is not None:
                self.shapes.setdefault(copy.key, set()).add(copy.signature)
                self.ranks[copy.key] = max(self.ranks.get(copy.key, 0), len(copy.out))

    counter = _Counter()
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            counter.visit_expr(func)
    shared = {key for key, shapes in counter.shapes.items()
              if key == ("identity",) or len(shapes) >= SHARED_SHAPES}
    if not counter.shapes:
        return mod

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def __init__(self, module):
            super().__init__(module)
            self.funcs: Dict[tuple, tvm.ir.GlobalVar] = {}

        def _as(self, expr, shape: Shape):
            """``expr`` viewed in ``shape`` (row-major); a reshape of a reshape reads the
            first one's source, a constant is reshaped now."""
            if _shape(expr) == shape:
                return expr
            if isinstance(expr, tvm.ir.expr.GenericConst):
                return relax.const(expr.value.numpy().reshape(shape), str(expr.ty.dtype))
            source = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
            if (isinstance(source, relax.Call) and isinstance(source.op, tvm.ir.Op)
                    and source.op.name == "relax.reshape"):
                expr = source.args[0]
            return self.builder_.emit(relax.op.reshape(expr, shape), name_hint="vta_host_view")

        def visit_call_(self, call):
            call = super().visit_call_(call)
            copy = _canonical(call)
            if copy is None:
                return call
            out_shape = _shape(call)
            if copy.key == ("identity",):
                return relax.op.reshape(self._as(call.args[0], copy.out), out_shape)
            if copy.key not in shared:
                if copy.key[0] != "transpose" or len(copy.out) == len(out_shape):
                    return call
                # a permutation met on few shapes stays TVM's, in its canonical rank
                out = self.builder_.emit(relax.op.permute_dims(
                    self._as(call.args[0], copy.tensors[0][1]), list(copy.key[2])),
                    name_hint="vta_host_copy")
                return relax.op.reshape(out, out_shape)
            copy = copy.at_rank(counter.ranks[copy.key])
            gv = self.funcs.get(copy.key)
            if gv is None:
                args = (len(copy.out),) if copy.any_rank else ()
                func = _MAKERS[copy.key[0]](*(args + copy.key[1:]))
                gv = self.funcs[copy.key] = self.builder_.add_func(
                    func, str(func.attrs["global_symbol"]))
            args = [self._as(e, s) for e, s in copy.tensors]
            args += [relax.prim_value(tvm.tirx.IntImm("int64", v)) for v in copy.scalars]
            out_ty = relax.TensorType(copy.out, call.ty.dtype)
            if copy.out == out_shape:
                return relax.call_tir(gv, args, out_ty=out_ty)
            out = self.builder_.emit(relax.call_tir(gv, args, out_ty=out_ty),
                                     name_hint="vta_host_copy")
            return relax.op.reshape(out, out_shape)

    rewriter = _Rewriter(mod)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return relax.transform.DeadCodeElimination()(rewriter.builder_.get())
