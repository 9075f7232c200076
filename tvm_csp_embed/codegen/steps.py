"""The steps of a host relayout (:mod:`.relayout`) as data: their shapes and the constants some of
them carry (an unroll's index table, a ``set``'s mask and values, a ``concat``'s block).

:mod:`.relayout` emits and prices the steps; :mod:`.fusedcopy` composes a chain of them into one
kernel. Both read the steps through this module.
"""
from __future__ import annotations

import math
from typing import Any, Sequence, Tuple

import numpy as np

__all__ = ["Step", "step_shape"]

Step = Tuple[Any, ...]


def step_shape(shape: Sequence[int], step: Step) -> Tuple[int, ...]:
    """The shape after ``step`` of a tensor of ``shape``.

    Raises
    ------
    ValueError
        If the step does not apply to the shape (a reshape that changes the size, an unroll that
        reads beyond the axis).
    """
    shape = tuple(int(s) for s in shape)
    kind = step[0]
    if kind == "permute":
        return tuple(shape[p] for p in step[1])
    if kind == "pad":
        return tuple(s + lo + hi for s, (lo, hi) in zip(shape, step[1]))
    if kind == "unroll":
        _, axis, extents, coefs, const = step[:5]
        last = max([const + sum(c * (e - 1) for c, e in zip(coefs, extents))]
                   + [i for _, i in _redirect(step)])
        if const < 0 or last >= shape[axis]:
            raise ValueError(f"unroll of axis {axis} (size {shape[axis]}) reads index {last}")
        return shape[:axis] + tuple(extents) + shape[axis + 1:]
    if kind == "concat":
        axis = step[1]
        return shape[:axis] + (shape[axis] + _concat_count(step),) + shape[axis + 1:]
    if kind == "reshape":
        if math.prod(step[1]) != math.prod(shape):
            raise ValueError(f"reshape {shape} -> {tuple(step[1])} changes the size")
        return tuple(step[1])
    if kind == "slice":
        return tuple(e - b for b, e in step[1])
    if kind == "set":
        if len(step[1]) != len(shape) or any(s not in (1, t) for s, t in zip(step[1], shape)):
            raise ValueError(f"a set step of shape {tuple(step[1])} does not broadcast to {shape}")
        return shape
    if kind == "broadcast":
        if any(s not in (1, t) for s, t in zip(shape, step[1])) or len(shape) != len(step[1]):
            raise ValueError(f"cannot broadcast {shape} to {tuple(step[1])}")
        return tuple(step[1])
    raise ValueError(f"unknown relayout step {kind!r}")


def _redirect(step: Step) -> Tuple[Tuple[Tuple[Any, ...], int], ...]:
    """The ``(pattern, index)`` redirections of an unroll step (none when it has no sixth field)."""
    return tuple(step[5]) if len(step) > 5 else ()


def _unroll_indices(step: Step) -> np.ndarray:
    """The source index of every point of an unroll step's loops: an int32 array of shape
    ``extents``, ``const + sum(coefs[j] * i_j)``, or the redirected index at the points a
    redirection selects (the index tensor of the step's ``take``)."""
    _, _, extents, coefs, const = step[:5]
    grid = np.indices(tuple(int(e) for e in extents), dtype=np.int64)
    idx = int(const) + np.tensordot(np.asarray(coefs, dtype=np.int64), grid, axes=1)
    for pattern, index in _redirect(step):
        idx[tuple(slice(None) if v is None else v for v in pattern)] = index
    return idx.astype(np.int32)


def _set_arrays(st: Step, dtype) -> Tuple[np.ndarray, np.ndarray]:
    """The mask and the values of a ``("set", shape, index, values, dtype)`` step."""
    _, shape, index, values, _ = st
    mask = np.zeros(shape, dtype=bool)
    out = np.zeros(shape, dtype=dtype)
    if index:
        at = tuple(np.asarray(index, dtype=np.int64).T)
        mask[at] = True
        out[at] = np.asarray(values, dtype=np.int64).astype(dtype)
    return mask, out


def _concat_count(st: Step) -> int:
    """How many entries a ``concat`` step appends along its axis."""
    return int(st[4]) if len(st) > 4 else len(st[2])


def _concat_block(shape: Sequence[int], st: Step) -> np.ndarray:
    """The constant a ``("concat", axis, values, dtype[, n])`` step appends to a tensor of
    ``shape``: ``values`` along the axis, repeated over the others, or the whole block."""
    axis, values, dtype = st[1], st[2], st[3]
    along = [1] * len(shape)
    along[axis] = _concat_count(st)
    full = list(shape)
    full[axis] = _concat_count(st)
    if len(st) > 4:
        along = full
    block = np.asarray(values, dtype=np.int64).astype(dtype).reshape(along)
    return np.ascontiguousarray(np.broadcast_to(block, full))
