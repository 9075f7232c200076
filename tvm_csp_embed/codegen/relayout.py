"""Host relayout of VTA operands: concrete steps, emitted as Relax ops or applied to numpy constants.

An embedding's :class:`~tvm_csp_embed.embedding.TensorRelayout` says, per tensor, which dims to
pad, which to stencil-unroll, split, transpose and fuse. :class:`HostLayout` is the concrete form
of such a plan on the operator's own tensor (NCHW activations, OIHW weights, ``(N, K)`` matrices):
a tuple of positional steps with every shape known,

* ``("permute", perm)`` -- ``relax.op.permute_dims``;
* ``("pad", ((lo, hi), ...))`` -- zero padding per axis (``relax.op.nn.pad``);
* ``("unroll", axis, extents, coefs, const[, redirect])`` -- stencil unrolling of one axis into
  ``len(extents)`` axes, ``new[..., i_1, ..., i_k, ...] = old[..., const + sum(c_j * i_j), ...]``:
  one ``relax.op.take`` along the axis with a constant index tensor of shape ``extents`` (one
  host kernel for TVM to lower and LLVM to compile; the strided slices and stack this replaced
  made one kernel per slice, about 0.9 s of CPU time per build for a 7x7 stem). The optional
  ``redirect`` is a tuple of ``(pattern, index)``: the loop points that ``pattern`` (one value or
  None, meaning every value, per loop) selects read source ``index`` instead (the folded bias's
  lane constants, appended to the source by a ``concat`` step; the same ``take``);
* ``("concat", axis, values, dtype)`` -- appending ``values`` along ``axis``, the same at every
  position of the other axes (``relax.op.concat`` with a constant; with leading zeros it stands
  in for a ``pad`` of that axis's end); ``("concat", axis, block, dtype, n)`` appends ``n``
  entries whose values differ over the other axes too: ``block`` is the appended constant in
  row-major order (the tensor's shape with ``n`` at ``axis``);
* ``("reshape", shape)`` -- split and fuse;
* ``("slice", ((begin, end), ...))`` -- cropping;
* ``("broadcast", shape)`` -- repeating size-1 axes (the per-channel bias over the lanes);
* ``("set", shape, index, values, dtype)`` -- writing constants: the positions ``index`` (tuples
  into ``shape``, which broadcasts to the tensor's) take ``values``, every other element is kept
  (``relax.op.where`` with a constant mask; the folded bias of :mod:`.biasfold` where its lane
  constants cannot come with a ``concat`` and a gather).

The same steps have two backends: :meth:`HostLayout.pack` emits Relax ops through the offload
pass's packer (``packer.emit(expr, name)``, ``packer.operand(expr)``) and :meth:`HostLayout.pack_numpy`
applies them to a numpy array (constant weights are relayouted at build time and enter the module
as a ``relax.const``). Layouts without unrolling are invertible: :meth:`HostLayout.unpack` emits the
inverse (the output of a VTA operator back to the operator's layout).

A chain with two or more steps that copy is emitted as ONE host kernel (:func:`emission`): the
steps from the first copying one to the last, composed into a single ``te.compute`` whose every
output element reads its source element (or a pad zero, a concatenated or set constant) directly,
called with ``relax.call_tir`` (:mod:`.fusedcopy`). ``relax.build``'s default pipeline for
``ext_vta`` has no FuseOps/FuseTIR: each ``permute_dims``, ``nn.pad``, ``strided_slice``, ``take``
or ``concat`` is a PrimFunc of its own that writes its whole output, so a chain of them made one
pass over memory per step (DB0's padded-twin plan: six, 10.7 MB for a 113 KB input). The price
(:attr:`HostLayout.copied`, :attr:`HostLayout.unpack_copied`) counts what is emitted: a lone
copying step writes its output, a fused chain its final output once, a view nothing.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Sequence, Tuple

import numpy as np

from .steps import (Step, _concat_block, _concat_count, _redirect, _set_arrays, _unroll_indices,
                    step_shape)

__all__ = ["Step", "HostLayout", "step_shape", "emission"]


def _unroll_plan(extents: Sequence[int], coefs: Sequence[int], const: int):
    """``(sliced loop, other loops, [(begin, values of the others)...])`` of an unroll step: the loop
    of largest extent is the strided slice, the others are enumerated row-major."""
    j = max(range(len(extents)), key=lambda i: (extents[i], -i))
    others = [i for i in range(len(extents)) if i != j]
    starts = []
    for vals in itertools.product(*[range(extents[i]) for i in others]):
        starts.append(const + sum(coefs[i] * v for i, v in zip(others, vals)))
    return j, others, starts


@dataclass(frozen=True)
class HostLayout:
    """A packed layout of one operand: concrete steps from the operator's own tensor.

    Attributes
    ----------
    src_shape : tuple of int
        Shape of the tensor in the operator's own layout.
    steps : tuple of Step
        The steps (module docstring), applied in order.
    name : str
        Base name of the bound Relax variables (``vta_pack_<name>...``).
    """

    src_shape: Tuple[int, ...]
    steps: Tuple[Step, ...]
    name: str = "data"

    @functools.cached_property
    def shapes(self) -> Tuple[Tuple[int, ...], ...]:
        """The shape before every step and after the last (computed once per layout)."""
        out = [tuple(self.src_shape)]
        for st in self.steps:
            out.append(step_shape(out[-1], st))
        return tuple(out)

    @property
    def shape(self) -> Tuple[int, ...]:
        """The packed shape."""
        return self.shapes[-1]

    @functools.cached_property
    def copied(self) -> int:
        """Elements the host writes to pack one tensor: the output of every Relax op the packing
        emits that copies (:func:`emission`: a lone pad, transpose, slice, broadcast, concat,
        where or stencil-unroll ``take`` writes its output; a chain of two or more of them is one
        fused kernel that writes its final output once; a reshape is a view)
        (:func:`vta_ext.host.layout_traffic`)."""
        return _chain_copies(self._chain(self.steps, self.shapes))

    @functools.cached_property
    def unpack_copied(self) -> int:
        """Elements the host writes to unpack one tensor (:meth:`unpack`'s ops, priced as
        :attr:`copied` prices the packing's).

        Raises
        ------
        ValueError
            If the layout unrolls (it has no inverse)."""
        return _chain_copies(self._chain(*self._inverse_steps()))

    def _inverse_steps(self) -> Tuple[Tuple[Step, ...], Tuple[Tuple[int, ...], ...]]:
        """The unpacking's steps and the shape before each and after the last."""
        inverse = tuple(_inverse(st, before) for st, before in
                        zip(reversed(self.steps), reversed(self.shapes[:-1])))
        shapes = [self.shape]
        for st in inverse:
            shapes.append(step_shape(shapes[-1], st))
        return inverse, tuple(shapes)

    @staticmethod
    def _chain(steps, shapes) -> Tuple[Tuple[Step, Tuple[int, ...]], ...]:
        """``(step, shape before it)`` of the steps that are not identities (the ones emitted),
        and a last ``(None, final shape)``."""
        kept = tuple((st, shapes[i]) for i, st in enumerate(steps) if not _is_identity(st, shapes[i]))
        return kept + ((None, tuple(shapes[-1])),)

    @property
    def unrolled(self) -> bool:
        """Whether a step replicates elements (then the layout has no inverse)."""
        return any(st[0] == "unroll" for st in self.steps)

    @property
    def nbytes_factor(self) -> float:
        """Packed elements over source elements."""
        return math.prod(self.shape) / max(1, math.prod(self.src_shape))

    # ------------------------------------------------------------------ numpy backend
    def pack_numpy(self, array: np.ndarray) -> np.ndarray:
        """Apply the steps to ``array`` (C-contiguous result)."""
        x = np.asarray(array)
        if tuple(x.shape) != tuple(self.src_shape):
            raise ValueError(f"{self.name}: expected shape {self.src_shape}, got {x.shape}")
        for st in self.steps:
            x = _numpy_step(x, st)
        return np.ascontiguousarray(x)

    def unpack_numpy(self, array: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`pack_numpy` (padding cropped)."""
        x = np.asarray(array)
        for st, before in zip(reversed(self.steps), reversed(self.shapes[:-1])):
            x = _numpy_step(x, _inverse(st, before))
        return np.ascontiguousarray(x)

    # ------------------------------------------------------------------ Relax backend
    def pack(self, packer, expr):
        """Emit the steps as Relax ops on the host; returns the packed expression (bound).

        A ``relax.Constant`` operand is relayouted now, with numpy, and enters as a constant.
        """
        import tvm
        from tvm import relax

        x = packer.operand(expr)
        if isinstance(x, tvm.ir.expr.Constant):
            packed = self.pack_numpy(x.value.numpy())
            return relax.const(packed, str(x.ty.dtype))
        chain = self._chain(self.steps, self.shapes)
        return _emit_chain(packer, packer.emit, x, chain, self.name, last_bound=True)

    def unpack(self, packer, expr):
        """Emit the inverse steps (packed -> operator layout); the last op is returned unbound."""
        chain = self._chain(*self._inverse_steps())
        return _emit_chain(packer, packer.emit_unpack, expr, chain, "", last_bound=False)

    def __repr__(self) -> str:
        return f"HostLayout({self.name}: {self.src_shape} -> {self.shape}, {len(self.steps)} steps)"


def _is_identity(st: Step, shape) -> bool:
    kind = st[0]
    if kind == "permute":
        return tuple(st[1]) == tuple(range(len(st[1])))
    if kind == "pad":
        return not any(lo or hi for lo, hi in st[1])
    if kind == "reshape":
        return tuple(st[1]) == tuple(shape)
    if kind == "slice":
        return all(b == 0 and e == s for (b, e), s in zip(st[1], shape))
    if kind == "broadcast":
        return tuple(st[1]) == tuple(shape)
    return False


def _moves_unit_axes_only(st: Step, shape: Sequence[int]) -> bool:
    """Whether ``st`` is a permutation that keeps the order of the axes longer than 1: it moves
    no element in memory, so it is emitted as a reshape (a view)."""
    if st[0] != "permute":
        return False
    moved = [p for p in st[1] if shape[p] != 1]
    return moved == sorted(moved)


def _is_view(st: Step, shape: Sequence[int]) -> bool:
    """Whether the Relax op of ``st`` on ``shape`` copies nothing: a reshape, a permutation of
    unit axes (:func:`_moves_unit_axes_only`) or an identity step."""
    return st[0] == "reshape" or _moves_unit_axes_only(st, shape) or _is_identity(st, shape)


def _inverse(st: Step, before: Sequence[int]) -> Step:
    kind = st[0]
    if kind == "permute":
        inv = [0] * len(st[1])
        for i, p in enumerate(st[1]):
            inv[p] = i
        return ("permute", tuple(inv))
    if kind == "pad":
        return ("slice", tuple((lo, lo + s) for (lo, _), s in zip(st[1], before)))
    if kind == "reshape":
        return ("reshape", tuple(before))
    raise ValueError(f"a {kind!r} step has no inverse; this layout cannot be unpacked")


def _numpy_step(x: np.ndarray, st: Step) -> np.ndarray:
    kind = st[0]
    if kind == "permute":
        return np.transpose(x, st[1])
    if kind == "pad":
        return np.pad(x, st[1]) if any(lo or hi for lo, hi in st[1]) else x
    if kind == "reshape":
        return np.ascontiguousarray(x).reshape(st[1])
    if kind == "slice":
        return x[tuple(slice(b, e) for b, e in st[1])]
    if kind == "broadcast":
        return np.broadcast_to(x, st[1])
    if kind == "set":
        mask, values = _set_arrays(st, x.dtype)
        return np.where(mask, values, x)
    if kind == "concat":
        return np.concatenate([x, _concat_block(x.shape, st)], axis=st[1])
    if kind == "unroll" and _redirect(st):
        return np.take(x, _unroll_indices(st), axis=st[1])
    if kind == "unroll":
        _, axis, extents, coefs, const = st
        j, others, starts = _unroll_plan(extents, coefs, const)
        pre = (slice(None),) * axis
        span = coefs[j] * (extents[j] - 1) + 1
        parts = [x[pre + (slice(b, b + span, coefs[j]),)] for b in starts]
        y = np.stack(parts, axis=axis + 1)
        lead, tail, order, perm = _unroll_layout(x.shape, axis, extents, j, others)
        return np.transpose(y.reshape(lead + [extents[i] for i in order] + tail), perm)
    raise ValueError(f"unknown relayout step {kind!r}")


def _step_copies(st: Step, before: Sequence[int], after: Sequence[int]) -> int:
    """Elements the Relax op of one (non-view) step writes (:func:`_relax_step`): its output (for
    a stencil unroll, the output of its one ``take``)."""
    return math.prod(after)


#: step kinds that stay a Relax op of their own, never inside a fused kernel: a ``set`` (the
#: folded bias's ``where``), so that :mod:`.biasfold`'s choice between that pass and the lane
#: subset a gather writes weighs the same costs as before the fusion
UNFUSED_KINDS = ("set",)


def emission(chain) -> Tuple[Tuple[int, int], ...]:
    """How a chain of steps (``(step, shape before)`` pairs, identities left out) is emitted:
    ``(i, j)`` per Relax op, steps ``i..j-1``. Between the steps of :data:`UNFUSED_KINDS`, two or
    more steps that copy make one fused kernel from the first copying step to the last
    (:mod:`.fusedcopy`; the views between them are inside it); every other step is an op of its
    own. The one definition that :meth:`HostLayout.pack`, :meth:`HostLayout.unpack` and their
    prices follow."""
    ops, start = [], 0
    for end in [i for i, (st, _) in enumerate(chain) if st[0] in UNFUSED_KINDS] + [len(chain)]:
        ops += _fused_run(chain, start, end)
        if end < len(chain):
            ops.append((end, end + 1))
        start = end + 1
    return tuple(ops)


def _fused_run(chain, start: int, end: int):
    """The ops of :func:`emission` for ``chain[start:end]`` (no unfused step among them)."""
    copying = [i for i in range(start, end) if not _is_view(*chain[i])]
    if len(copying) < 2:
        return [(i, i + 1) for i in range(start, end)]
    a, b = copying[0], copying[-1] + 1
    return ([(i, i + 1) for i in range(start, a)] + [(a, b)]
            + [(i, i + 1) for i in range(b, end)])


def _chain_copies(chain) -> int:
    """Elements the ops of :func:`emission` write for ``chain`` (its last entry is
    ``(None, final shape)``): a fused kernel its output, a lone copying step its output
    (:func:`_step_copies`), a view nothing."""
    steps, total = chain[:-1], 0
    for i, j in emission(steps):
        after = chain[j][1]
        if j - i > 1:
            total += math.prod(after)
        elif not _is_view(steps[i][0], steps[i][1]):
            total += _step_copies(steps[i][0], steps[i][1], after)
    return total


def _emit_chain(packer, emit, x, chain, name: str, last_bound: bool):
    """Emit ``chain`` (:meth:`HostLayout._chain`) on ``x`` as :func:`emission` says, binding each
    op with ``emit``; the last op is bound as ``name`` (``last_bound``) or returned unbound."""
    from .fusedcopy import relax_fused_copy

    steps = chain[:-1]
    ops = emission(steps)
    for n, (i, j) in enumerate(ops):
        last = n == len(ops) - 1
        bind = None if (last and not last_bound) else emit
        label = name if (last and last_bound) else f"{steps[i][0][0]}{i}" + (f"_{name}" if name else "")
        if j - i > 1:
            label = label if (last and last_bound) else f"fused{i}" + (f"_{name}" if name else "")
            x = relax_fused_copy(packer, bind, x, steps[i:j], chain[j][1], label)
        else:
            x = _relax_step(bind, x, steps[i][0], steps[i][1], label)
    return x


def _unroll_layout(before, axis, extents, j, others):
    """``(lead, tail, loop order after stacking, permutation back to the loops' order)``."""
    lead, tail = list(before[:axis]), list(before[axis + 1:])
    order = [j] + list(others)
    perm = list(range(axis)) + [axis + order.index(i) for i in range(len(extents))] + \
        [axis + len(extents) + t for t in range(len(tail))]
    return lead, tail, order, perm


def _relax_step(emit, x, st: Step, before: Sequence[int], name: str):
    """One step as Relax ops; bound with ``emit`` (None: the result is returned unbound)."""
    from tvm import relax

    bind = (lambda e, n: e) if emit is None else emit
    kind = st[0]
    if kind == "permute":
        if _moves_unit_axes_only(st, before):
            return bind(relax.op.reshape(x, tuple(before[p] for p in st[1])), name)
        return bind(relax.op.permute_dims(x, list(st[1])), name)
    if kind == "pad":
        widths = [v for pair in st[1] for v in pair]
        return bind(relax.op.nn.pad(x, widths), name)
    if kind == "reshape":
        return bind(relax.op.reshape(x, tuple(st[1])), name)
    if kind == "slice":
        axes = [i for i, ((b, e), s) in enumerate(zip(st[1], before)) if (b, e) != (0, s)]
        return bind(relax.op.strided_slice(x, axes=axes, begin=[st[1][a][0] for a in axes],
                                           end=[st[1][a][1] for a in axes]), name)
    if kind == "broadcast":
        return bind(relax.op.broadcast_to(x, tuple(st[1])), name)
    if kind == "set":
        mask, values = _set_arrays(st, np.dtype(st[4]))
        return bind(relax.op.where(relax.const(mask), relax.const(values, st[4]), x), name)
    if kind == "concat":
        block = relax.const(_concat_block(before, st), st[3])
        return bind(relax.op.concat([x, block], axis=st[1]), name)
    if kind == "unroll":
        return bind(relax.op.take(x, relax.const(_unroll_indices(st)), axis=st[1], mode="clip"),
                    name)
    raise ValueError(f"unknown relayout step {kind!r}")
