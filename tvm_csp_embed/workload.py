"""Operator workloads: loop dims, affine tensor accesses and their polyhedral model.

A :class:`Workload` is a perfectly nested multiply-accumulate loop nest

    out[acc_out(i)] += in0[acc_0(i)] * in1[acc_1(i)]      for i in the box prod(extents)

with affine subscripts.  It is built from a TVM TE compute (:func:`from_te`), from a
PrimFunc with a single compute block (:func:`from_primfunc`), or directly with the
builders :func:`matmul`, :func:`dense`, :func:`conv2d` and :func:`depthwise_conv2d`.
:meth:`Workload.polyhedral` gives the islpy description (instance set with a statement
dimension ordering multiply and add, tensor index sets, access relations, dataflow
relations).  Operators that break the conformability rules (Chatarasi et al., MARVEL,
sec. 3) raise :class:`ConformabilityError` naming the rule and the offending expression.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Dict, Mapping, Optional, Sequence, Tuple

__all__ = ["ConformabilityError", "TensorAccess", "Workload", "PolyhedralModel", "matmul",
           "dense", "conv2d", "group_conv2d", "depthwise_conv2d", "from_te", "from_primfunc",
           "CONV_LAYOUTS", "GROUP_CONV_LAYOUTS", "FUSED_CONV_VARIANTS", "conv2d_fused"]

#: statement index of the multiply and of the add in the instance set
STMT_MUL, STMT_ADD = 0, 1


class ConformabilityError(ValueError):
    """The operator is not a conformable loop nest.

    Attributes
    ----------
    rule : str
        The violated rule ("perfect nest", "affine subscripts", "no conditionals",
        "multiply-accumulate body", ...).
    expr : str
        The offending expression or statement, printed.
    """

    def __init__(self, rule: str, expr: str, hint: str = ""):
        self.rule, self.expr = rule, expr
        msg = f"operator is not conformable (rule: {rule}): offending expression `{expr}`"
        super().__init__(msg + (f"; {hint}" if hint else ""))


@dataclass(frozen=True)
class TensorAccess:
    """One tensor and its affine access ``tensor[e] = const[e] + sum_d coef[e][d] * i_d``.

    Attributes
    ----------
    name : str
        Tensor name.
    dim_names : tuple of str
        Names of the tensor dims (e.g. ``("n", "c", "h", "w")``).
    shape : tuple of int
        Tensor shape.
    coef : tuple of tuple of int
        ``coef[e][d]``: coefficient of loop dim ``d`` in subscript ``e``.
    const : tuple of int
        Constant offset of each subscript.
    """

    name: str
    dim_names: Tuple[str, ...]
    shape: Tuple[int, ...]
    coef: Tuple[Tuple[int, ...], ...]
    const: Tuple[int, ...]

    @property
    def rank(self) -> int:
        """Number of tensor dims."""
        return len(self.shape)

    def loop_dims_of(self, e: int) -> Tuple[int, ...]:
        """Loop dims occurring in subscript ``e``."""
        return tuple(d for d, c in enumerate(self.coef[e]) if c != 0)

    def visible(self) -> Tuple[int, ...]:
        """Loop dims the tensor depends on."""
        return tuple(sorted({d for e in range(self.rank) for d in self.loop_dims_of(e)}))

    def is_linear(self, d: int) -> bool:
        """True if loop dim ``d`` only occurs in subscripts ``i_d`` (one iterator, coefficient 1)."""
        return all(self.coef[e][d] == 0 or (self.loop_dims_of(e) == (d,) and self.coef[e][d] == 1)
                   for e in range(self.rank))

    def subscript_str(self, e: int, dims: Sequence[str]) -> str:
        """Subscript ``e`` printed with loop dim names."""
        terms = [(f"{c}*" if c != 1 else "") + dims[d] for d, c in enumerate(self.coef[e]) if c]
        if self.const[e] or not terms:
            terms.append(str(self.const[e]))
        return " + ".join(terms)


@dataclass(frozen=True)
class Workload:
    """A conformable multiply-accumulate loop nest.

    Attributes
    ----------
    name : str
        Operator name.
    dims : tuple of str
        Loop dim names, in instance-set order.
    extents : tuple of int
        Loop extents.
    reduction : tuple of bool
        True for reduction dims.
    inputs : tuple of TensorAccess
        The two multiplied tensors (``in0`` is the data tensor, ``in1`` the weights).
    output : TensorAccess
        The accumulated tensor.
    layout : str
        Informative layout tag (e.g. ``"NCHW"``).
    """

    name: str
    dims: Tuple[str, ...]
    extents: Tuple[int, ...]
    reduction: Tuple[bool, ...]
    inputs: Tuple[TensorAccess, TensorAccess]
    output: TensorAccess
    layout: str = ""

    def __post_init__(self):
        D = len(self.dims)
        if len(self.extents) != D or len(self.reduction) != D:
            raise ValueError("dims, extents and reduction must have the same length")
        for t in self.tensors:
            if any(len(row) != D for row in t.coef):
                raise ValueError(f"tensor {t.name}: access rows must have {D} coefficients")
        for d in range(D):
            if self.reduction[d] and any(self.output.coef[e][d] for e in range(self.output.rank)):
                raise ConformabilityError("reduction dims absent from the output",
                                          f"{self.output.name}[...{self.dims[d]}...]")

    @property
    def tensors(self) -> Tuple[TensorAccess, TensorAccess, TensorAccess]:
        """``(in0, in1, out)``."""
        return (self.inputs[0], self.inputs[1], self.output)

    @property
    def num_points(self) -> int:
        """Number of loop iterations (multiplies)."""
        n = 1
        for e in self.extents:
            n *= e
        return n

    def dim_index(self, name: str) -> int:
        """Index of loop dim ``name``."""
        return self.dims.index(name)

    def permuted(self, order: Sequence[int]) -> "Workload":
        """The same operator with the loop dims (instance-set order) permuted.

        ``order[i]`` is the old index of the new dim ``i``.
        """
        order = list(order)

        def perm_t(t: TensorAccess) -> TensorAccess:
            return replace(t, coef=tuple(tuple(row[o] for o in order) for row in t.coef))

        return replace(self, dims=tuple(self.dims[o] for o in order),
                       extents=tuple(self.extents[o] for o in order),
                       reduction=tuple(self.reduction[o] for o in order),
                       inputs=(perm_t(self.inputs[0]), perm_t(self.inputs[1])),
                       output=perm_t(self.output))

    def permutation_of(self, other: "Workload") -> Optional[Tuple[int, ...]]:
        """The loop dim order under which ``other`` is this operator, or None.

        Returns ``order`` (``order[i]``: the index in ``other.dims`` of this workload's dim
        ``i``) when ``other.permuted(order)`` has this workload's dims, extents and reduction
        flags and each of its three tensors equals this workload's up to the order of the tensor
        dims (the same subscripts, constants and extents, as a multiset). Such workloads differ
        only in the order of their loop dims and tensor dims (an NCHW and an NHWC convolution):
        the same scalar dataflow, so the same embeddings (:func:`~tvm_csp_embed.solve.
        permuted_solution`). Names and layout tags are not compared.

        >>> conv2d(1, 8, 6, 6, 16, 3, 3, layout="NHWC").permutation_of(conv2d(1, 8, 6, 6, 16, 3, 3))
        (0, 2, 3, 1, 5, 6, 4)
        >>> conv2d(1, 8, 6, 6, 16, 3, 3).permutation_of(conv2d(1, 8, 6, 6, 32, 3, 3)) is None
        True
        """
        if sorted(self.dims) != sorted(other.dims) or len(set(self.dims)) != len(self.dims):
            return None
        order = tuple(other.dims.index(d) for d in self.dims)
        moved = other.permuted(order)
        if moved.extents != self.extents or moved.reduction != self.reduction:
            return None

        def rows(t: TensorAccess):
            return sorted(zip(t.coef, t.const, t.shape))
        if any(rows(a) != rows(b) for a, b in zip(self.tensors, moved.tensors)):
            return None
        return order

    def padded(self, pad: Mapping[str, int]) -> "Workload":
        """The operator on zero-padded loop extents (tensors grow to cover the new box)."""
        ext = tuple(e + int(pad.get(d, 0)) for d, e in zip(self.dims, self.extents))

        def grow(t: TensorAccess) -> TensorAccess:
            shape = tuple(max(s, t.const[e] + sum(c * (x - 1) for c, x in zip(t.coef[e], ext) if c > 0) + 1)
                          for e, s in enumerate(t.shape))
            return replace(t, shape=shape)

        return replace(self, extents=ext, inputs=(grow(self.inputs[0]), grow(self.inputs[1])),
                       output=grow(self.output))

    def describe(self) -> str:
        """One-line loop-nest form, e.g. ``out[i,j] += A[i,k] * B[j,k]  for i<4, j<6, k<8``."""
        def acc(t):
            return f"{t.name}[" + ", ".join(t.subscript_str(e, self.dims) for e in range(t.rank)) + "]"
        loops = ", ".join(f"{d}<{x}" + ("(r)" if r else "") for d, x, r in
                          zip(self.dims, self.extents, self.reduction))
        return f"{acc(self.output)} += {acc(self.inputs[0])} * {acc(self.inputs[1])}  for {loops}"

    def __repr__(self) -> str:
        return f"Workload({self.name!r}: {self.describe()})"

    def check_conformable(self) -> None:
        """Re-check rules on the built workload: subscripts in range, coefficients non-negative.

        Raises
        ------
        ConformabilityError
            If an access leaves its tensor or has a negative coefficient.
        """
        for t in self.tensors:
            for e in range(t.rank):
                if any(c < 0 for c in t.coef[e]) or t.const[e] < 0:
                    raise ConformabilityError("affine subscripts with non-negative coefficients",
                                              f"{t.name}[{t.subscript_str(e, self.dims)}]")
                hi = t.const[e] + sum(c * (x - 1) for c, x in zip(t.coef[e], self.extents))
                if hi >= t.shape[e]:
                    raise ConformabilityError("subscripts within the tensor bounds",
                                              f"{t.name}[{t.subscript_str(e, self.dims)}] reaches {hi} "
                                              f">= {t.shape[e]}")

    @cached_property
    def polyhedral(self) -> "PolyhedralModel":
        """The islpy description (built on first use)."""
        return PolyhedralModel(self)

    # ------------------------------------------------------------------ numpy semantics
    def reference(self, in0, in1):
        """Directly computed operator (numpy, int64): the definition, point by point, vectorised.

        Parameters
        ----------
        in0, in1 : numpy.ndarray
            Input tensors of the shapes of ``inputs[0]`` / ``inputs[1]``.
        """
        import numpy as np
        grids = np.meshgrid(*[np.arange(x) for x in self.extents], indexing="ij")
        grids = [g.ravel() for g in grids]

        def idx(t):
            return tuple(t.const[e] + sum(c * grids[d] for d, c in enumerate(t.coef[e]) if c)
                         + np.zeros_like(grids[0]) for e in range(t.rank))
        out = np.zeros(self.output.shape, dtype=np.int64)
        prod = in0.astype(np.int64)[idx(self.inputs[0])] * in1.astype(np.int64)[idx(self.inputs[1])]
        np.add.at(out, idx(self.output), prod)
        return out


class PolyhedralModel:
    """islpy sets and relations of a :class:`Workload` (Rieber et al., sec. 3.2).

    Attributes
    ----------
    instance_set : islpy.Set
        ``{ S[i_0..i_{D-1}, t] }`` with ``t = 0`` the multiply and ``t = 1`` the add.
    tensor_sets : dict
        Tensor name -> index set.
    access : dict
        Tensor name -> relation from the reading (multiply) or writing (add) instance to the
        tensor element.
    mul_to_add : islpy.Map
        Dataflow from a multiply to the add of the same iteration.
    reduction_chain : islpy.Map
        Dataflow of the add chain: an add to the add of the lexicographically next reduction
        point of the same output element.
    reduction_pairs : islpy.Map
        The commutative form: two adds of the same output element (any order).
    spatial : islpy.Map
        Spatial relation: two instances of the same statement computing different outputs.
    """

    def __init__(self, wl: Workload):
        import islpy as isl
        self.workload = wl
        D = len(wl.dims)
        it = [f"i{d}" for d in range(D)]
        it2 = [f"j{d}" for d in range(D)]
        bounds = " and ".join(f"0 <= {v} < {x}" for v, x in zip(it, wl.extents))
        bounds2 = " and ".join(f"0 <= {v} < {x}" for v, x in zip(it2, wl.extents))
        S = f"S[{', '.join(it)}, t]"
        S2 = f"S[{', '.join(it2)}, t2]"
        self.instance_set = isl.Set(f"{{ {S} : {bounds} and 0 <= t <= 1 }}")
        self.tensor_sets: Dict[str, "isl.Set"] = {}
        self.access: Dict[str, "isl.Map"] = {}
        for k, t in enumerate(wl.tensors):
            ev = [f"e{e}" for e in range(t.rank)]
            self.tensor_sets[t.name] = isl.Set(
                f"{{ {t.name}[{', '.join(ev)}] : " +
                " and ".join(f"0 <= {v} < {s}" for v, s in zip(ev, t.shape)) + " }")
            subs = ", ".join(t.subscript_str(e, it) for e in range(t.rank))
            stmt = STMT_ADD if k == 2 else STMT_MUL
            self.access[t.name] = isl.Map(
                f"{{ {S} -> {t.name}[{subs}] : {bounds} and t = {stmt} }}")
        same = " and ".join(f"{a} = {b}" for a, b in zip(it, it2))
        self.mul_to_add = isl.Map(
            f"{{ {S} -> {S2} : {bounds} and {same} and t = {STMT_MUL} and t2 = {STMT_ADD} }}")
        sp = [d for d in range(D) if not wl.reduction[d]]
        rd = [d for d in range(D) if wl.reduction[d]]
        same_sp = " and ".join([f"{it[d]} = {it2[d]}" for d in sp] or ["true"])
        pairs = isl.Map(f"{{ {S} -> {S2} : {bounds} and {bounds2} and t = {STMT_ADD} and "
                        f"t2 = {STMT_ADD} and {same_sp} }}")
        identity = isl.Map(f"{{ {S} -> {S2} : {same} and t = t2 }}")
        self.reduction_pairs = pairs.subtract(identity).coalesce()
        if rd:
            # lexicographic successor over the reduction dims, same spatial coordinates
            conds = []
            for k in range(len(rd)):
                eq = [f"{it[rd[m]]} = {it2[rd[m]]}" for m in range(k)]
                conds.append("(" + " and ".join(eq + [f"{it[rd[k]]} < {it2[rd[k]]}"]) + ")")
            gt = isl.Map(f"{{ {S} -> {S2} : {' or '.join(conds)} }}")
            self.reduction_chain = pairs.intersect(gt).lexmin().coalesce()
        else:
            self.reduction_chain = isl.Map(f"{{ {S} -> {S2} : false }}")
        same_stmt = isl.Map(f"{{ {S} -> {S2} : {bounds} and {bounds2} and t = t2 }}")
        same_out = isl.Map(f"{{ {S} -> {S2} : {same_sp} and t = t2 }}")
        self.spatial = same_stmt.subtract(same_out).coalesce()

    def __repr__(self) -> str:
        return (f"PolyhedralModel({self.workload.name}: S = {self.instance_set}; "
                f"{len(self.access)} access relations)")


# ---------------------------------------------------------------------- builders
def _acc(name: str, dim_names: Sequence[str], shape: Sequence[int], subs: Sequence[Mapping[str, int]],
         dims: Sequence[str], const: Optional[Sequence[int]] = None) -> TensorAccess:
    coef = tuple(tuple(int(s.get(d, 0)) for d in dims) for s in subs)
    return TensorAccess(name, tuple(dim_names), tuple(int(x) for x in shape), coef,
                        tuple(const) if const else (0,) * len(subs))


def matmul(M: int, N: int, K: int, transpose_b: bool = False, name: Optional[str] = None) -> Workload:
    """``C[i,j] += A[i,k] * B[k,j]`` (or ``B[j,k]`` with ``transpose_b``)."""
    dims = ("i", "j", "k")
    A = _acc("A", ("i", "k"), (M, K), [{"i": 1}, {"k": 1}], dims)
    if transpose_b:
        B = _acc("B", ("j", "k"), (N, K), [{"j": 1}, {"k": 1}], dims)
    else:
        B = _acc("B", ("k", "j"), (K, N), [{"k": 1}, {"j": 1}], dims)
    C = _acc("C", ("i", "j"), (M, N), [{"i": 1}, {"j": 1}], dims)
    return Workload(name or f"matmul_{M}x{N}x{K}" + ("_bT" if transpose_b else ""), dims, (M, N, K),
                    (False, False, True), (A, B), C)


def dense(batch: int, in_features: int, out_features: int, name: Optional[str] = None) -> Workload:
    """``out[b,o] += data[b,i] * weight[o,i]`` (TOPI dense)."""
    dims = ("b", "o", "i")
    X = _acc("data", ("b", "i"), (batch, in_features), [{"b": 1}, {"i": 1}], dims)
    W = _acc("weight", ("o", "i"), (out_features, in_features), [{"o": 1}, {"i": 1}], dims)
    Y = _acc("out", ("b", "o"), (batch, out_features), [{"b": 1}, {"o": 1}], dims)
    return Workload(name or f"dense_{batch}x{out_features}x{in_features}", dims,
                    (batch, out_features, in_features), (False, False, True), (X, W), Y)


#: supported conv2d layouts: (data layout, weight layout, output layout, loop dim order)
CONV_LAYOUTS = {
    "NCHW": ("nchw", "kcrs", "nkhw", ("n", "k", "oh", "ow", "c", "r", "s")),
    "NHWC": ("nhwc", "rsck", "nhwk", ("n", "oh", "ow", "k", "r", "s", "c")),
    "HWNC": ("hwnc", "rskc", "hwnk", ("oh", "ow", "n", "k", "r", "s", "c")),
}


def conv_out_size(size: int, kernel: int, pad: int, stride: int) -> int:
    """Output size of a convolution along one spatial dim."""
    return (size + 2 * pad - kernel) // stride + 1


def conv2d(n: int, c: int, h: int, w: int, k: int, r: int, s: int, pad: Tuple[int, int] = (0, 0),
           stride: Tuple[int, int] = (1, 1), layout: str = "NCHW", name: Optional[str] = None) -> Workload:
    """2-D convolution on the zero-padded input (padding is a separate, earlier stage).

    ``out[n,k,oh,ow] += data[n,c,oh*sh+r,ow*sw+s] * weight[k,c,r,s]`` with the tensors and
    the loop order of ``layout`` (see :data:`CONV_LAYOUTS`).

    Parameters
    ----------
    pad, stride : (int, int)
        (height, width) padding and stride.
    """
    nm = name or f"conv2d_{layout}_n{n}c{c}h{h}w{w}k{k}r{r}s{s}p{pad[0]}{pad[1]}s{stride[0]}{stride[1]}"
    return _conv("conv2d", CONV_LAYOUTS, n, c, h, w, k, r, s, 1, pad, stride, layout, nm)


def _conv(kind: str, layouts, n: int, c: int, h: int, w: int, k: int, r: int, s: int, groups: int,
          pad: Tuple[int, int], stride: Tuple[int, int], layout: str, name: str) -> Workload:
    """The (grouped) convolution workload of :func:`conv2d` / :func:`group_conv2d` (the group dim
    ``g`` only where the layouts name it)."""
    if layout not in layouts:
        raise ValueError(f"{kind} layout {layout!r} not supported; use one of {sorted(layouts)}")
    if c % groups or k % groups:
        raise ValueError(f"{kind}: {c} input / {k} output channels do not split into {groups} groups")
    dl, wl, ol, dims = layouts[layout]
    ph, pw = pad
    sh, sw = stride
    OH, OW = conv_out_size(h, r, ph, sh), conv_out_size(w, s, pw, sw)
    if OH <= 0 or OW <= 0:
        raise ValueError(f"{kind}: empty output ({OH}x{OW})")
    cg, kg = c // groups, k // groups
    ext = {"n": n, "g": groups, "k": kg, "oh": OH, "ow": OW, "c": cg, "r": r, "s": s}
    dsub = {"n": ({"n": 1}, n), "g": ({"g": 1}, groups), "c": ({"c": 1}, cg),
            "h": ({"oh": sh, "r": 1}, h + 2 * ph), "w": ({"ow": sw, "s": 1}, w + 2 * pw)}
    wsub = {"g": ({"g": 1}, groups), "k": ({"k": 1}, kg), "c": ({"c": 1}, cg), "r": ({"r": 1}, r),
            "s": ({"s": 1}, s)}
    osub = {"n": ({"n": 1}, n), "g": ({"g": 1}, groups), "k": ({"k": 1}, kg), "h": ({"oh": 1}, OH),
            "w": ({"ow": 1}, OW)}

    def mk(nm, lay, table):
        names = tuple(lay)
        return _acc(nm, names, [table[x][1] for x in names], [table[x][0] for x in names], dims)
    return Workload(name, dims, tuple(ext[d] for d in dims), tuple(d in ("c", "r", "s") for d in dims),
                    (mk("data", dl, dsub), mk("weight", wl, wsub)), mk("out", ol, osub), layout)


#: conv2d workloads whose reduction is one fused dim (see :func:`conv2d_fused`): variant name ->
#: (fused dim, the conv2d reduction dims it fuses)
FUSED_CONV_VARIANTS = {"fused-rs": ("rs", ("r", "s")), "fused-crs": ("crs", ("c", "r", "s"))}


def conv2d_fused(n: int, c: int, h: int, w: int, k: int, r: int, s: int,
                 stride: Tuple[int, int] = (1, 1), variant: str = "fused-rs",
                 name: Optional[str] = None) -> Workload:
    """A 2-D convolution (on the zero-padded ``h x w`` input) whose reduction is one fused dim.

    ``fused-rs``: the input unfolded along the columns, ``data[n, c, ow, h*s + j] =
    X[n, c, h, ow*sw + j]``, so that the filter rows and columns are one dim ``rs = r*S + j`` of
    extent ``R*S``: ``out[n,k,oh,ow] += data[n, c, ow, oh*(sh*S) + rs] * weight[k, c, rs]``.

    ``fused-crs``: the full im2col, ``data[n, oh, ow, crs]`` with ``crs = (c*R + r)*S + s``:
    ``out[n,k,oh,ow] += data[n, oh, ow, crs] * weight[k, crs]``.

    The weights are a reshape of the OIHW filter; the input relayout is the operator's
    (:func:`tvm_csp_embed.strategy.operator_workload`). Zero padding of the fused dim reads past
    the end of a row of ``data`` (``fused-rs``) and meets zero weights.

    Parameters
    ----------
    h, w : int
        The input's extents with the convolution's zero padding.
    variant : str
        A key of :data:`FUSED_CONV_VARIANTS`.
    """
    if variant not in FUSED_CONV_VARIANTS:
        raise ValueError(f"conv2d variant {variant!r} unknown; use one of {sorted(FUSED_CONV_VARIANTS)}")
    sh, sw = stride
    OH, OW = conv_out_size(h, r, 0, sh), conv_out_size(w, s, 0, sw)
    if OH <= 0 or OW <= 0:
        raise ValueError(f"conv2d {variant}: empty output ({OH}x{OW})")
    fused = FUSED_CONV_VARIANTS[variant][0]
    dims = ("n", "k", "oh", "ow") + (("c",) if variant == "fused-rs" else ()) + (fused,)
    red = tuple(d in ("c", fused) for d in dims)
    if variant == "fused-rs":
        data = _acc("data", ("n", "c", "w", "hs"), (n, c, OW, h * s),
                    [{"n": 1}, {"c": 1}, {"ow": 1}, {"oh": sh * s, fused: 1}], dims)
        weight = _acc("weight", ("k", "c", "rs"), (k, c, r * s), [{"k": 1}, {"c": 1}, {fused: 1}], dims)
        ext = (n, k, OH, OW, c, r * s)
    else:
        data = _acc("data", ("n", "h", "w", "crs"), (n, OH, OW, c * r * s),
                    [{"n": 1}, {"oh": 1}, {"ow": 1}, {fused: 1}], dims)
        weight = _acc("weight", ("k", "crs"), (k, c * r * s), [{"k": 1}, {fused: 1}], dims)
        ext = (n, k, OH, OW, c * r * s)
    out = _acc("out", ("n", "k", "h", "w"), (n, k, OH, OW),
               [{"n": 1}, {"k": 1}, {"oh": 1}, {"ow": 1}], dims)
    nm = name or f"conv2d_{variant}_n{n}c{c}h{h}w{w}k{k}r{r}s{s}s{sh}{sw}"
    return Workload(nm, dims, ext, red, (data, weight), out, variant)


#: grouped conv2d layouts: (data layout, weight layout, output layout, loop dim order); ``g`` is
#: the group, ``c``/``k`` the input/output channels within a group
GROUP_CONV_LAYOUTS = {
    "NCHW": ("ngchw", "gkcrs", "ngkhw", ("n", "g", "k", "oh", "ow", "c", "r", "s")),
    "NHWC": ("nhwgc", "rsgck", "nhwgk", ("n", "oh", "ow", "g", "k", "r", "s", "c")),
}


def group_conv2d(n: int, c: int, h: int, w: int, k: int, r: int, s: int, groups: int,
                 pad: Tuple[int, int] = (0, 0), stride: Tuple[int, int] = (1, 1), layout: str = "NCHW",
                 name: Optional[str] = None) -> Workload:
    """Grouped 2-D convolution on the zero-padded input, with the group as its own dim.

    ``out[n,g,k,oh,ow] += data[n,g,c,oh*sh+r,ow*sw+s] * weight[g,k,c,r,s]`` for ``c < C/groups``,
    ``k < K/groups`` (the NCHW operator's channel ``g * C/groups + c`` split in two dims, so every
    subscript stays a partition of the loop dims).

    Parameters
    ----------
    c, k : int
        All input and output channels (multiples of ``groups``).
    """
    nm = name or (f"group_conv2d_{layout}_n{n}c{c}h{h}w{w}k{k}r{r}s{s}g{groups}p{pad[0]}{pad[1]}"
                  f"s{stride[0]}{stride[1]}")
    return _conv("group_conv2d", GROUP_CONV_LAYOUTS, n, c, h, w, k, r, s, groups, pad, stride, layout, nm)


def depthwise_conv2d(n: int, c: int, h: int, w: int, r: int, s: int, pad: Tuple[int, int] = (0, 0),
                     stride: Tuple[int, int] = (1, 1), name: Optional[str] = None) -> Workload:
    """``out[n,c,oh,ow] += data[n,c,oh*sh+r,ow*sw+s] * weight[c,r,s]`` (NCHW, padded input)."""
    ph, pw = pad
    sh, sw = stride
    OH, OW = conv_out_size(h, r, ph, sh), conv_out_size(w, s, pw, sw)
    dims = ("n", "c", "oh", "ow", "r", "s")
    data = _acc("data", "nchw", (n, c, h + 2 * ph, w + 2 * pw),
                [{"n": 1}, {"c": 1}, {"oh": sh, "r": 1}, {"ow": sw, "s": 1}], dims)
    weight = _acc("weight", "crs", (c, r, s), [{"c": 1}, {"r": 1}, {"s": 1}], dims)
    out = _acc("out", "nchw", (n, c, OH, OW), [{"n": 1}, {"c": 1}, {"oh": 1}, {"ow": 1}], dims)
    return Workload(name or f"dwconv2d_n{n}c{c}h{h}w{w}r{r}s{s}p{ph}{pw}s{sh}{sw}", dims,
                    (n, c, OH, OW, r, s), (False, False, False, False, True, True), (data, weight), out,
                    "NCHW")


# ---------------------------------------------------------------------- from TVM
def _affine(expr, var_index: Mapping[str, int], D: int, where: str) -> Tuple[Tuple[int, ...], int]:
    """Affine form (coefficients over loop dims, constant) of a TIR index expression."""
    from tvm import tirx
    coef = [0] * D
    const = 0

    def walk(e, scale):
        nonlocal const
        if isinstance(e, tirx.IntImm):
            const += scale * int(e.value)
        elif isinstance(e, tirx.Var):
            if e.name not in var_index:
                raise ConformabilityError("affine subscripts", f"{where}: unknown variable {e.name}")
            coef[var_index[e.name]] += scale
        elif isinstance(e, tirx.Add):
            walk(e.a, scale)
            walk(e.b, scale)
        elif isinstance(e, tirx.Sub):
            walk(e.a, scale)
            walk(e.b, -scale)
        elif isinstance(e, tirx.Mul):
            if isinstance(e.a, tirx.IntImm):
                walk(e.b, scale * int(e.a.value))
            elif isinstance(e.b, tirx.IntImm):
                walk(e.a, scale * int(e.b.value))
            else:
                raise ConformabilityError("affine subscripts", f"{where}: {e}",
                                          "a product of two iterators is not affine")
        elif isinstance(e, tirx.Cast):
            walk(e.value, scale)
        else:
            raise ConformabilityError("affine subscripts", f"{where}: {e}",
                                      f"{type(e).__name__} is not affine")
    walk(expr, 1)
    return tuple(coef), const


def _strip_cast(e):
    from tvm import tirx
    while isinstance(e, tirx.Cast):
        e = e.value
    return e


def _shape(t) -> Tuple[int, ...]:
    return tuple(int(x) for x in t.shape)


def from_te(out, name: Optional[str] = None) -> Workload:
    """Workload of a TE compute ``out = te.compute(..., te.sum(a[...] * b[...], axis=...))``.

    The immediate inputs of the compute are the tensors (a padding stage before it is a
    separate operator).

    Raises
    ------
    ConformabilityError
        For conditionals, non-affine subscripts, or a body other than a sum of a product
        of two tensor loads.
    """
    import tvm
    from tvm import te, tirx
    op = out.op
    if not isinstance(op, te.ComputeOp):
        raise ConformabilityError("perfect nest", f"{op}", "expected a te.compute operation")
    if len(op.body) != 1:
        raise ConformabilityError("perfect nest", f"{op.name}: {len(op.body)} outputs")
    body = op.body[0]
    if not isinstance(body, tirx.Reduce):
        raise ConformabilityError("multiply-accumulate body", str(body), "expected te.sum(a * b, axis=...)")
    comb = str(body.combiner)
    if "x + y" not in comb:
        raise ConformabilityError("multiply-accumulate body", comb, "only sum reductions embed into GEMM/ALU")
    if not (isinstance(body.condition, tirx.IntImm) and int(body.condition.value) == 1):
        raise ConformabilityError("no conditionals", str(body.condition))
    src = _strip_cast(body.source[0])
    if isinstance(src, (tirx.Select,)) or (isinstance(src, tvm.ir.Call) and "if_then_else" in str(src.op)):
        raise ConformabilityError("no conditionals", str(src))
    if not isinstance(src, tirx.Mul):
        raise ConformabilityError("multiply-accumulate body", str(src), "expected a product of two tensor loads")
    sp = list(op.axis)
    rd = list(op.reduce_axis)
    dims = tuple(iv.var.name for iv in sp + rd)
    for iv in sp + rd:
        if int(iv.dom.min) != 0:
            raise ConformabilityError("normalised loops", f"{iv.var.name} starts at {iv.dom.min}")
    ext = tuple(int(iv.dom.extent) for iv in sp + rd)
    vidx = {d: i for i, d in enumerate(dims)}
    D = len(dims)

    def load(e, which):
        e = _strip_cast(e)
        if isinstance(e, (tirx.Select,)) or (isinstance(e, tvm.ir.Call) and "if_then_else" in str(e.op)):
            raise ConformabilityError("no conditionals", str(e))
        if not (isinstance(e, tvm.ir.Call) and str(e.op.name) == "te.tensor_load"):
            raise ConformabilityError("multiply-accumulate body", str(e), f"{which} operand must be a tensor load")
        t = e.args[0]
        tname = t.op.name
        subs = [_affine(ix, vidx, D, f"{tname}[...]") for ix in e.args[1:]]
        return TensorAccess(tname, tuple(f"{tname}{i}" for i in range(len(subs))), _shape(t),
                            tuple(s[0] for s in subs), tuple(s[1] for s in subs))
    a = load(src.a, "first")
    b = load(src.b, "second")
    o_coef = tuple(tuple(int(i == d) for i in range(D)) for d in range(len(sp)))
    outacc = TensorAccess(op.name, tuple(iv.var.name for iv in sp), _shape(out), o_coef, (0,) * len(sp))
    wl = Workload(name or op.name, dims, ext, tuple([False] * len(sp) + [True] * len(rd)), (a, b), outacc)
    wl.check_conformable()
    return wl


def from_primfunc(func, name: Optional[str] = None) -> Workload:
    """Workload of a PrimFunc whose body is a perfect loop nest around one compute block.

    The block must be ``C[...] = C[...] + A[...] * B[...]`` (with an optional init), its
    iteration vars bound one-to-one to the loops (``T.axis.remap``), with no predicate.

    Raises
    ------
    ConformabilityError
        Naming the rule (perfect nest, no conditionals, affine subscripts, body form).
    """
    import tvm
    from tvm import tirx
    _LOAD = tvm.ir.TensorLoad  # a buffer load in TVM 0.27 (``.source``, ``.indices``)
    stmt = func.body
    # unwrap the root block
    loops = []
    while True:
        tn = type(stmt).__name__
        if tn == "SBlockRealize":
            blk = stmt.block
            if blk.name_hint == "root" or (len(loops) == 0 and blk.iter_vars is not None and len(blk.iter_vars) == 0):
                if blk.init is not None:
                    raise ConformabilityError("perfect nest", str(blk.init))
                stmt = blk.body
                continue
            if not (isinstance(stmt.predicate, tirx.IntImm) and int(stmt.predicate.value) == 1):
                raise ConformabilityError("no conditionals", f"T.where({stmt.predicate})")
            break
        if isinstance(stmt, tirx.For):
            loops.append(stmt)
            stmt = stmt.body
            continue
        if isinstance(stmt, tirx.IfThenElse):
            raise ConformabilityError("no conditionals", f"if {stmt.condition}")
        if isinstance(stmt, tirx.SeqStmt):
            raise ConformabilityError("perfect nest", str(stmt)[:200],
                                      "statements between loops or several blocks; use one compute block")
        raise ConformabilityError("perfect nest", f"{tn}: {str(stmt)[:200]}")
    blk = stmt.block
    body = blk.body
    if isinstance(body, tirx.IfThenElse):
        raise ConformabilityError("no conditionals", f"if {body.condition}")
    if not isinstance(body, tirx.BufferStore):
        raise ConformabilityError("perfect nest", str(body)[:200], "the block must hold one buffer store")
    # block iter vars -> loop vars (one-to-one)
    loop_names = [lp.loop_var.name for lp in loops]
    for lp in loops:
        if int(lp.min) != 0:
            raise ConformabilityError("normalised loops", f"for {lp.loop_var.name} from {lp.min}")
    binding = {}
    for iv, val in zip(blk.iter_vars, stmt.iter_values):
        if not (isinstance(val, tirx.Var) and val.name in loop_names):
            raise ConformabilityError("affine subscripts", f"{iv.var.name} = {val}",
                                      "block vars must be bound one-to-one to loops")
        binding[iv.var.name] = (loop_names.index(val.name), iv.iter_type)
    dims = tuple(sorted(binding, key=lambda v: binding[v][0]))
    ext = tuple(int(loops[binding[v][0]].extent) for v in dims)
    red = tuple(int(binding[v][1]) == 2 for v in dims)  # IterVar.CommReduce == 2
    vidx = {d: i for i, d in enumerate(dims)}
    D = len(dims)
    val = body.value
    if isinstance(val, tirx.Select) or (isinstance(val, tvm.ir.Call) and "if_then_else" in str(val.op)):
        raise ConformabilityError("no conditionals", str(val))
    if not isinstance(val, tirx.Add):
        raise ConformabilityError("multiply-accumulate body", str(val), "expected C = C + A * B")

    def is_self(e):
        e = _strip_cast(e)
        return isinstance(e, _LOAD) and e.source.same_as(body.buffer)
    if is_self(val.a):
        prod = _strip_cast(val.b)
    elif is_self(val.b):
        prod = _strip_cast(val.a)
    else:
        raise ConformabilityError("multiply-accumulate body", str(val), "expected C = C + A * B")
    if isinstance(prod, tirx.Select) or (isinstance(prod, tvm.ir.Call) and "if_then_else" in str(prod.op)):
        raise ConformabilityError("no conditionals", str(prod))
    if not isinstance(prod, tirx.Mul):
        raise ConformabilityError("multiply-accumulate body", str(prod), "expected a product of two loads")

    def acc(e, role):
        e = _strip_cast(e)
        if isinstance(e, (tirx.Select,)) or (isinstance(e, tvm.ir.Call) and "if_then_else" in str(e.op)):
            raise ConformabilityError("no conditionals", str(e))
        if not isinstance(e, _LOAD):
            raise ConformabilityError("multiply-accumulate body", str(e), f"{role} must be a buffer load")
        buf = e.source
        subs = [_affine(ix, vidx, D, f"{buf.name}[...]") for ix in e.indices]
        return TensorAccess(buf.name, tuple(f"{buf.name}{i}" for i in range(len(subs))),
                            tuple(int(x) for x in buf.shape), tuple(s[0] for s in subs),
                            tuple(s[1] for s in subs))
    a, b = acc(prod.a, "first operand"), acc(prod.b, "second operand")
    subs = [_affine(ix, vidx, D, f"{body.buffer.name}[...]") for ix in body.indices]
    o = TensorAccess(body.buffer.name, tuple(f"{body.buffer.name}{i}" for i in range(len(subs))),
                     tuple(int(x) for x in body.buffer.shape), tuple(s[0] for s in subs),
                     tuple(s[1] for s in subs))
    fname = name or str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else (name or blk.name_hint)
    wl = Workload(fname, dims, ext, red, (a, b), o)
    wl.check_conformable()
    return wl
