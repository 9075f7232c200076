"""A chain of host relayout steps as one copy: a single ``te.compute`` called with ``call_tir``.

``relax.build``'s default pipeline (the one ``ext_vta`` wraps, :mod:`vta_ext.target`) legalizes
every Relax op into a PrimFunc of its own and fuses nothing (no FuseOps/FuseTIR), so the steps of
a :class:`~.relayout.HostLayout` emitted one Relax op each make one pass over memory per copying
step. :func:`fused_copy_func` composes the index maps of the steps (``permute``, ``pad``,
``slice``, ``reshape``, ``broadcast``, ``unroll``, ``concat``, ``set``; the step kinds of
:mod:`.relayout`) into one output-to-source map: each element of the chain's output is read from
its source element, or is a pad zero or one of the constants a ``concat``/``set`` step writes, and
written once. The constants (an unroll's redirected index table, a concat's block, a set's mask
and values) are inputs of the kernel; an unroll without redirection is affine and needs none.
"""
from __future__ import annotations

import math
from typing import Callable, List, Sequence, Tuple

import numpy as np

__all__ = ["fused_copy_func", "relax_fused_copy"]

Getter = Callable[[List], object]


def fused_copy_func(steps: Sequence[Tuple[tuple, Tuple[int, ...]]], out_shape: Sequence[int],
                    dtype: str):
    """One PrimFunc that applies ``steps`` to its first argument.

    Parameters
    ----------
    steps : sequence of (step, shape before)
        The steps (:mod:`.relayout`'s tuples) and the shape each applies to, in order.
    out_shape : sequence of int
        The shape after the last step.
    dtype : str
        The tensor's element type.

    Returns
    -------
    (tvm.tirx.PrimFunc, list of numpy.ndarray)
        The function ``(src, *constants, out)`` and the constants to pass after ``src``.
    """
    from tvm import te

    src = te.placeholder(tuple(int(d) for d in steps[0][1]), dtype, "src")
    inputs: List[Tuple[object, np.ndarray]] = []

    def read(idx):
        return src[tuple(idx)]

    get: Getter = read
    for st, before in steps:
        get = _compose(get, st, tuple(int(d) for d in before), dtype, inputs)
    out_shape = tuple(int(d) for d in out_shape)
    out = te.compute(out_shape, lambda *i: get(list(i)), name="relayout")
    wide = max(math.prod(out_shape), math.prod(steps[0][1])) >= 2 ** 31
    func = te.create_prim_func([src] + [p for p, _ in inputs] + [out],
                               index_dtype_override="int64" if wide else None)
    # private: the module's name for it is the GlobalVar's, not create_prim_func's "main"
    return func.without_attr("global_symbol"), [a for _, a in inputs]


def relax_fused_copy(packer, bind, x, steps, out_shape, name: str):
    """``call_tir`` of :func:`fused_copy_func` on ``x``, bound with ``bind(expr, name)`` (None:
    returned unbound); the PrimFunc enters the module through ``packer.add_func(func, name)``
    (the offload pass's builder adds it, structurally equal kernels once)."""
    from tvm import relax

    if not hasattr(packer, "add_func"):
        raise TypeError(f"{type(packer).__name__} cannot emit a fused host relayout: the packer "
                        "protocol needs add_func(prim_func, name) -> GlobalVar")
    dtype = str(x.ty.dtype)
    func, consts = fused_copy_func(steps, out_shape, dtype)
    gv = packer.add_func(func, "vta_host_relayout")
    call = relax.call_tir(gv, [x] + [relax.const(c) for c in consts],
                          relax.TensorType(tuple(int(d) for d in out_shape), dtype))
    return call if bind is None else bind(call, name)


def _compose(get: Getter, st: tuple, before: Tuple[int, ...], dtype: str, inputs) -> Getter:
    """The getter of the tensor after ``st``, from the getter of the tensor before it."""
    from tvm import te
    from tvm import tirx as tir

    from .steps import _concat_block, _redirect, _set_arrays, _unroll_indices, step_shape

    after = step_shape(before, st)
    kind = st[0]

    def constant(array: np.ndarray, label: str):
        p = te.placeholder(array.shape, str(array.dtype), f"{label}{len(inputs)}")
        inputs.append((p, np.ascontiguousarray(array)))
        return p

    if kind == "permute":
        perm = st[1]

        def g(i):
            j = [None] * len(perm)
            for k, p in enumerate(perm):
                j[p] = i[k]
            return get(j)
        return g
    if kind == "pad":
        widths = st[1]
        zero = tir.const(0, dtype)

        def g(i):
            conds = [tir.all(ik >= lo, ik < lo + s)
                     for ik, (lo, hi), s in zip(i, widths, before) if lo or hi]
            inner = get([ik - lo for ik, (lo, _) in zip(i, widths)])
            return tir.if_then_else(tir.all(*conds), inner, zero) if conds else inner
        return g
    if kind == "slice":
        return lambda i: get([ik + b for ik, (b, _) in zip(i, st[1])])
    if kind == "reshape":
        return lambda i: get(_unravel(_ravel(i, after), before))
    if kind == "broadcast":
        return lambda i: get([0 if b == 1 and a != 1 else ik for ik, b, a in zip(i, before, after)])
    if kind == "unroll":
        axis, extents, coefs, const = st[1], st[2], st[3], st[4]
        k = len(extents)
        table = constant(_unroll_indices(st), "index") if _redirect(st) else None

        def g(i):
            loops = i[axis:axis + k]
            idx = table[tuple(loops)] if table is not None else \
                const + sum(c * v for c, v in zip(coefs, loops))
            return get(list(i[:axis]) + [idx] + list(i[axis + k:]))
        return g
    if kind == "concat":
        axis, size = st[1], before[st[1]]
        block = constant(_concat_block(before, st).astype(dtype), "block")

        def g(i):
            tail = list(i)
            tail[axis] = i[axis] - size
            return tir.if_then_else(i[axis] < size, get(i), block[tuple(tail)])
        return g
    if kind == "set":
        mask, values = _set_arrays(st, np.dtype(st[4]))
        m = constant(mask.astype(np.uint8), "mask")
        v = constant(values.astype(dtype), "values")
        shape = st[1]

        def g(i):
            bi = tuple(0 if s == 1 else ik for ik, s in zip(i, shape))
            return tir.if_then_else(m[bi] != 0, v[bi], get(i))
        return g
    raise ValueError(f"unknown relayout step {kind!r}")


def _ravel(i, shape: Sequence[int]):
    """Row-major flat index of ``i`` in ``shape``."""
    flat = 0
    for ik, s in zip(i, shape):
        flat = flat * s + ik
    return flat


def _unravel(flat, shape: Sequence[int]) -> list:
    """Row-major index in ``shape`` of the flat index ``flat``."""
    from tvm import tirx as tir

    out, stride = [], math.prod(shape)
    for k, s in enumerate(shape):
        stride //= s
        q = flat if stride == 1 else tir.floordiv(flat, stride)
        out.append(q if k == 0 else tir.floormod(q, s))
    return out
