"""Packed layouts of VTA operands, and the Relax code that packs and unpacks them on the host.

VTA's GEMM reads ``BATCH x BLOCK_IN`` input and ``BLOCK_OUT x BLOCK_IN`` weight blocks, so tensors
cross into VTA blocked, with the block axes innermost and the blocked axes padded to whole blocks:

* :class:`BlockedActivation`: NCHW ``(N, C, H, W)`` <-> ``(N/b, C/k, H, W, b, k)``;
* :class:`BlockedMatrix`: ``(R, C)`` <-> ``(R/r, C/c, r, c)`` (dense data, weight and output);
* :func:`pack_conv_weight`: OIHW -> ``(O/co, I/ci, KH, KW, co, ci)``;
* :func:`pack_depthwise_weight`: ``(C, 1, KH, KW)`` -> ``(C/co, KH, KW, b, co)``, replicated over
  the batch lanes;
* :func:`pack_channel_bias`: a per-channel int32 bias broadcast to the packed accumulator.

The code is emitted through a *packer* (the offload pass): ``packer.emit(expr, name)`` binds a
host-side layout step, ``packer.operand(expr)`` is the (rewritten) operand, and
``packer.handover(expr, layout)`` returns the packed output of a previous VTA operator when ``expr``
is that operator's result in a layout of the same arrangement (:func:`same_arrangement`: the
classes may differ, e.g. a CSP embedding's layout that blocks like the stock one); then no
unpack/pack pair is emitted. Padded lanes
of a handed-over tensor may hold any value: they meet zero-padded weights or are cut off. A packed
tensor may also hand over its first elements (:func:`blocked_prefix`, :func:`hands_over`): an
output padded for two virtual threads holds the stock blocked tensor there, read in place.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import tvm
from tvm import relax

__all__ = ["BlockedActivation", "BlockedMatrix", "FlatActivation", "pack_conv_weight", "pack_depthwise_weight",
           "pack_channel_bias", "ceil_to", "padding_text", "same_arrangement", "as_blocked",
           "channel_shuffle_map", "apply_steps_numpy", "blocked_arrangement", "blocked_prefix",
           "prefix_axis", "hands_over"]


def ceil_to(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple


def padding_text(*dims: Tuple[str, int, int]) -> str:
    """``"in channels 3->16, batch 1->2"`` for the ``(what, size, padded)`` that differ."""
    return ", ".join(f"{what} {size}->{padded}" for what, size, padded in dims if padded != size)


#: one host layout step: ``(kind, argument, binding name)``, kind ``pad`` (Relax pad widths),
#: ``reshape`` (shape), ``permute`` (axes) or ``broadcast`` (shape)
Step = Tuple[str, Sequence[int], str]


def apply_steps_numpy(a: np.ndarray, steps: Sequence[Step]) -> np.ndarray:
    """``steps`` applied to a numpy array (zero padding; C-contiguous result)."""
    for kind, arg, _ in steps:
        if kind == "pad":
            a = np.pad(a, list(zip(arg[::2], arg[1::2])))
        elif kind == "reshape":
            a = a.reshape(arg)
        elif kind == "permute":
            a = a.transpose(arg)
        else:
            a = np.broadcast_to(a, arg)
    return np.ascontiguousarray(a)


def _relayout(packer, expr, steps: Sequence[Step]):
    """Apply ``steps`` to ``expr``. A constant operand (weights, biases, multipliers) is relayouted
    now with numpy and enters the program as a constant; any other operand gets the steps as Relax
    ops on the host (the last one named by its step, each through ``packer.emit``)."""
    x = packer.operand(expr)
    if isinstance(x, tvm.ir.expr.Constant):
        return relax.const(apply_steps_numpy(x.value.numpy(), steps), str(x.ty.dtype))
    for kind, arg, name in steps:
        if kind == "pad":
            if any(arg):
                x = packer.emit(relax.op.nn.pad(x, list(arg)), name)
        elif kind == "reshape":
            x = packer.emit(relax.op.reshape(x, tuple(arg)), name)
        elif kind == "permute":
            x = packer.emit(relax.op.permute_dims(x, list(arg)), name)
        else:
            x = packer.emit(relax.op.broadcast_to(x, tuple(arg)), name)
    return x


def _pack_numpy(layout, array: np.ndarray) -> np.ndarray:
    """``layout``'s packing steps applied to a numpy array of its source shape."""
    x = np.asarray(array)
    if tuple(x.shape) != tuple(layout.src_shape):
        raise ValueError(f"{type(layout).__name__}: expected shape {layout.src_shape}, got {x.shape}")
    return apply_steps_numpy(x, layout.steps())


@functools.lru_cache(maxsize=1024)
def _same_arrangement(a, b) -> bool:
    size = math.prod(a.src_shape)
    # the narrowest integer that numbers every element distinctly (padding stays 0)
    dtype = np.int32 if size < np.iinfo(np.int32).max else np.int64
    probe = np.arange(1, size + 1, dtype=dtype).reshape(a.src_shape)
    return bool(np.array_equal(a.pack_numpy(probe), b.pack_numpy(probe)))


def same_arrangement(a, b) -> bool:
    """Whether packed layouts ``a`` and ``b`` of one source tensor are the same arrangement.

    Layouts of different classes (the stock :class:`BlockedActivation`, a CSP embedding's
    ``HostLayout``) describe the same packed tensor when they have the same source shape and packed
    shape and put every source element, and every padded lane, at the same position. That is
    checked on a probe (the source tensor numbered 1, 2, ...; padding stays 0) with the layouts'
    own ``pack_numpy``. Layouts without a ``pack_numpy`` are equal only if ``a == b``.

    >>> a = BlockedActivation(1, 32, 4, 4, 1, 16)
    >>> same_arrangement(a, BlockedActivation(1, 32, 4, 4, 1, 16)), same_arrangement(
    ...     a, BlockedActivation(1, 32, 4, 4, 1, 32))
    (True, False)
    """
    if a == b:
        return True
    if not all(hasattr(x, "pack_numpy") and hasattr(x, "src_shape") for x in (a, b)):
        return False
    if tuple(a.src_shape) != tuple(b.src_shape) or tuple(a.shape) != tuple(b.shape):
        return False
    try:
        return _same_arrangement(a, b)
    except TypeError:  # an unhashable layout: compare without the cache
        return _same_arrangement.__wrapped__(a, b)


def as_blocked(layout) -> Optional["BlockedActivation"]:
    """``layout`` as the stock :class:`BlockedActivation` when it is that arrangement, else None.

    A CSP embedding's ``HostLayout`` of an NCHW tensor whose packed shape is
    ``(N/b, C/k, H, W, b, k)`` may place every element where the blocked layout does; then the
    packed tensor can take part in the work done on blocked tensors (channel concats, splits,
    shuffles). Decided by :func:`same_arrangement`, never by the layout's class alone.

    >>> as_blocked(BlockedActivation(1, 32, 4, 4, 1, 16))
    BlockedActivation(n=1, c=32, h=4, w=4, batch_block=1, channel_block=16)
    """
    if isinstance(layout, BlockedActivation):
        return layout
    src, shape = getattr(layout, "src_shape", None), getattr(layout, "shape", None)
    if src is None or shape is None or len(src) != 4 or len(shape) != 6:
        return None
    n, c, h, w = (int(v) for v in src)
    blocked = BlockedActivation(n, c, h, w, int(shape[4]), int(shape[5]))
    return blocked if same_arrangement(layout, blocked) else None


def blocked_prefix(layout) -> Optional["BlockedActivation"]:
    """The stock blocked arrangement of ``layout``'s NCHW source when its packed tensor is the
    first elements of ``layout``'s, which has more of them; else None.

    An embedding padded so that an odd thread loop carries two virtual threads
    (``tvm_csp_embed.codegen.loops.thread_paddings``) writes an output larger than the stock
    arrangement along one packed axis: 1000 channels in 64 blocks where the stock has 63 (the
    channel-block axis), or 28 output rows where the image has 27 (the row axis). When every
    packed axis before that one has extent 1 (one batch block; one channel block for rows), the
    stock tensor is the padded one's first elements, a contiguous range that a consumer reads in
    place (``vta_ext.run_placed``'s ``b:e`` view, :func:`prefix_axis`), no host pass. Decided on
    a probe as :func:`same_arrangement` is: the source numbered 1, 2, ... packed by ``layout`` and
    cut to the stock extent equals the blocked packing, and the rest holds no source element.

    >>> blocked_prefix(BlockedActivation(1, 32, 4, 4, 1, 16)) is None   # already blocked
    True
    """
    if isinstance(layout, BlockedActivation):
        return None
    src, shape = getattr(layout, "src_shape", None), getattr(layout, "shape", None)
    if src is None or shape is None or len(src) != 4 or len(shape) != 6 \
            or not hasattr(layout, "pack_numpy"):
        return None
    n, c, h, w = (int(v) for v in src)
    blocked = BlockedActivation(n, c, h, w, int(shape[4]), int(shape[5]))
    if prefix_axis(tuple(int(v) for v in shape), blocked.shape) is None:
        return None
    try:
        return blocked if _prefix_arrangement(layout, blocked) else None
    except TypeError:  # an unhashable layout: compare without the cache
        return blocked if _prefix_arrangement.__wrapped__(layout, blocked) else None


def prefix_axis(shape: Sequence[int], prefix: Sequence[int]) -> Optional[int]:
    """The axis along which a C-order tensor of ``prefix`` shape is the first elements of one of
    ``shape``: the one axis where ``prefix`` is shorter, every axis before it of extent 1 in
    both; None when there is no such axis.

    >>> prefix_axis((1, 64, 6, 6, 1, 16), (1, 63, 6, 6, 1, 16)), prefix_axis(
    ...     (1, 1, 28, 27, 1, 16), (1, 1, 27, 27, 1, 16)), prefix_axis((1, 2, 28, 27), (1, 2, 27, 27))
    (1, 2, None)
    """
    if len(shape) != len(prefix):
        return None
    differ = [i for i, (a, b) in enumerate(zip(shape, prefix)) if a != b]
    if len(differ) != 1 or prefix[differ[0]] > shape[differ[0]]:
        return None
    axis = differ[0]
    return axis if all(v == 1 for v in shape[:axis]) else None


@functools.lru_cache(maxsize=256)
def _prefix_arrangement(layout, blocked: "BlockedActivation") -> bool:
    size = math.prod(blocked.src_shape)
    dtype = np.int32 if size < np.iinfo(np.int32).max else np.int64
    probe = np.arange(1, size + 1, dtype=dtype).reshape(blocked.src_shape)
    packed = np.asarray(layout.pack_numpy(probe)).reshape(-1)
    first = math.prod(blocked.shape)
    return bool(np.array_equal(packed[:first], blocked.pack_numpy(probe).reshape(-1))
                and not packed[first:].any())


def hands_over(layout, taken) -> bool:
    """Whether a consumer that takes its input in ``taken`` reads it from a packed tensor in
    ``layout`` with no host pass: the same arrangement (:func:`same_arrangement`), or ``taken``
    is the stock blocked arrangement that is the first elements of ``layout``
    (:func:`blocked_prefix`, read in place). The one test the offload pass
    (``vta_ext.offload.handover``) and the CSP choice's host layout pricing share."""
    if layout is None or taken is None:
        return False
    if same_arrangement(layout, taken):
        return True
    prefix = blocked_prefix(layout)
    return prefix is not None and same_arrangement(prefix, taken)


@dataclass(frozen=True)
class BlockedActivation:
    """An NCHW activation ``(n, c, h, w)`` packed as ``(N/b, C/k, H, W, b, k)``.

    ``batch_block`` is ``b`` (``BATCH``), ``channel_block`` is ``k`` (``BLOCK_IN`` for a GEMM
    input, ``BLOCK_OUT`` for outputs and ALU operands); N and C are zero-padded to whole blocks.
    """

    n: int
    c: int
    h: int
    w: int
    batch_block: int
    channel_block: int

    @property
    def padded(self) -> Tuple[int, int]:
        """``(N, C)`` padded to whole blocks."""
        return ceil_to(self.n, self.batch_block), ceil_to(self.c, self.channel_block)

    @property
    def shape(self) -> Tuple[int, ...]:
        """The packed shape."""
        (np_, cp), b, k = self.padded, self.batch_block, self.channel_block
        return (np_ // b, cp // k, self.h, self.w, b, k)

    def padding(self, channels: str = "channels") -> List[Tuple[str, int, int]]:
        """``(what, size, padded)`` of the batch and channel axes."""
        np_, cp = self.padded
        return [("batch", self.n, np_), (channels, self.c, cp)]

    @property
    def src_shape(self) -> Tuple[int, int, int, int]:
        """The NCHW shape this layout packs."""
        return (self.n, self.c, self.h, self.w)

    @property
    def copied(self) -> int:
        """Elements the host writes to pack (or unpack) one tensor: the transpose, and the zero
        padding when there is any (:func:`vta_ext.host.layout_traffic`)."""
        return math.prod(self.shape) * (2 if self.padded != self.src_shape[:2] else 1)

    def steps(self, name: str = "data") -> List[Step]:
        """The packing as host layout steps (zero-pad, block, transpose): its one definition."""
        (np_, cp), b, k = self.padded, self.batch_block, self.channel_block
        return [("pad", [0, np_ - self.n, 0, cp - self.c, 0, 0, 0, 0], f"pad_{name}"),
                ("reshape", (np_ // b, b, cp // k, k, self.h, self.w), f"reshape_{name}"),
                ("permute", (0, 2, 4, 5, 1, 3), name)]

    def pack_numpy(self, array: np.ndarray) -> np.ndarray:
        """The packing applied to a numpy NCHW array (zero padding)."""
        return _pack_numpy(self, array)

    def pack(self, packer, expr, name: str = "data"):
        """Relax code NCHW -> packed (or the handed-over packed tensor). Returns ``(expr, kept)``."""
        kept = packer.handover(expr, self)
        if kept is not None:
            return kept, True
        return _relayout(packer, expr, self.steps(name)), False

    def unpack(self, packer, expr):
        """Relax code packed -> NCHW ``(n, c, h, w)``; the last step is returned unbound."""
        np_, cp = self.padded
        out = packer.emit_unpack(relax.op.permute_dims(expr, [0, 4, 1, 5, 2, 3]), "transpose")
        out = relax.op.reshape(out, (np_, cp, self.h, self.w))
        if (np_, cp) != (self.n, self.c):
            out = relax.op.strided_slice(packer.emit_unpack(out, "reshape"), axes=[0, 1],
                                         begin=[0, 0], end=[self.n, self.c])
        return out


@dataclass(frozen=True)
class BlockedMatrix:
    """A matrix ``(rows, cols)`` packed as ``(R/r, C/c, r, c)``, zero-padded to whole blocks."""

    rows: int
    cols: int
    row_block: int
    col_block: int

    @property
    def padded(self) -> Tuple[int, int]:
        """``(rows, cols)`` padded to whole blocks."""
        return ceil_to(self.rows, self.row_block), ceil_to(self.cols, self.col_block)

    @property
    def shape(self) -> Tuple[int, ...]:
        """The packed shape."""
        (rp, cp), r, c = self.padded, self.row_block, self.col_block
        return (rp // r, cp // c, r, c)

    @property
    def src_shape(self) -> Tuple[int, int]:
        """The matrix shape this layout packs."""
        return (self.rows, self.cols)

    @property
    def copied(self) -> int:
        """Elements the host writes to pack (or unpack) one matrix: the transpose, and the zero
        padding when there is any (:func:`vta_ext.host.layout_traffic`)."""
        return math.prod(self.shape) * (2 if self.padded != self.src_shape else 1)

    def steps(self, name: str = "data") -> List[Step]:
        """The packing as host layout steps (zero-pad, block, transpose): its one definition."""
        (rp, cp), r, c = self.padded, self.row_block, self.col_block
        return [("pad", [0, rp - self.rows, 0, cp - self.cols], f"pad_{name}"),
                ("reshape", (rp // r, r, cp // c, c), f"reshape_{name}"),
                ("permute", (0, 2, 1, 3), name)]

    def pack_numpy(self, array: np.ndarray) -> np.ndarray:
        """The packing applied to a numpy matrix (zero padding)."""
        return _pack_numpy(self, array)

    def pack(self, packer, expr, name: str):
        """Relax code ``(rows, cols)`` -> packed."""
        return _relayout(packer, expr, self.steps(name))

    def unpack(self, packer, expr):
        """Relax code packed -> ``(rows, cols)``; the last step is returned unbound."""
        rp, cp = self.padded
        out = packer.emit_unpack(relax.op.permute_dims(expr, [0, 2, 1, 3]), "transpose")
        out = relax.op.reshape(out, (rp, cp))
        if (rp, cp) != (self.rows, self.cols):
            out = relax.op.strided_slice(packer.emit_unpack(out, "reshape"), axes=[0, 1],
                                         begin=[0, 0], end=[self.rows, self.cols])
        return out


def channel_shuffle_map(layout: BlockedActivation, groups: int) -> Callable[..., tuple]:
    """The channel shuffle of ``groups`` groups (NCHW: reshape ``(N, g, C/g, H, W)``, permute
    ``(0, 2, 1, 3, 4)``, reshape ``(N, C, H, W)``: output channel ``i*g + gi`` is input channel
    ``gi*C/g + i``) on the packed tensor of ``layout``, whose result is again in ``layout``: the
    index map from a packed input position to its packed output position.

    With channel block ``k``, ``m = C/(g k)`` blocks per group, input block ``cb = gi*m + im`` and
    lane ``kl = ih*(k/g) + iq`` (so ``i = im*k + kl``), the output channel is
    ``j = (im*g + ih)*k + iq*g + gi``: block ``(cb % m)*g + kl // (k/g)``, lane
    ``(kl % (k/g))*g + cb // m``. The map works on numpy index arrays and on TIR variables (for
    ``relax.op.layout_transform``: one host transpose of the packed tensor).

    Raises
    ------
    ValueError
        If ``k`` is not a multiple of ``groups`` or ``C/groups`` not a multiple of ``k`` (then
        the shuffle moves channels across block boundaries in no blockwise way: make it in NCHW).
    """
    k, c = layout.channel_block, layout.c
    if groups < 1 or c % groups or (c // groups) % k or k % groups:
        raise ValueError(f"a shuffle of {c} channels in {groups} groups is blockwise only if the "
                         f"{k}-channel block is a multiple of the groups and the "
                         f"{c // max(groups, 1)} channels per group a multiple of {k}")
    m, lanes = c // groups // k, k // groups

    def shuffle(nb, cb, h, w, bl, kl):
        return (nb, (cb % m) * groups + kl // lanes, h, w, bl, (kl % lanes) * groups + cb // m)

    return shuffle


@dataclass(frozen=True)
class FlatActivation:
    """An ``(N, C)`` activation (a classifier's features) seen by the NCHW ALU templates as
    ``(N, C, 1, 1)``: packed like :class:`BlockedMatrix` (``(N/b, C/k, b, k)``) with the unit H and
    W axes inserted, ``(N/b, C/k, 1, 1, b, k)``."""

    n: int
    c: int
    batch_block: int
    channel_block: int

    @property
    def matrix(self) -> BlockedMatrix:
        """The same packing as a matrix layout."""
        return BlockedMatrix(self.n, self.c, self.batch_block, self.channel_block)

    @property
    def padded(self) -> Tuple[int, int]:
        """``(N, C)`` padded to whole blocks."""
        return self.matrix.padded

    @property
    def shape(self) -> Tuple[int, ...]:
        """The packed shape."""
        nb, cb, b, k = self.matrix.shape
        return (nb, cb, 1, 1, b, k)

    @property
    def src_shape(self) -> Tuple[int, int]:
        """The matrix shape this layout packs."""
        return (self.n, self.c)

    def padding(self, channels: str = "channels") -> List[Tuple[str, int, int]]:
        """``(what, size, padded)`` of the batch and channel axes."""
        np_, cp = self.padded
        return [("batch", self.n, np_), (channels, self.c, cp)]

    @property
    def copied(self) -> int:
        """Elements the host writes to pack (or unpack) one activation: the matrix packing's (the
        unit axes are a reshape, a view; :func:`vta_ext.host.layout_traffic`)."""
        return self.matrix.copied

    def steps(self, name: str = "data") -> List[Step]:
        """The matrix packing, then the unit H and W axes."""
        return self.matrix.steps(f"matrix_{name}") + [("reshape", self.shape, name)]

    def pack_numpy(self, array: np.ndarray) -> np.ndarray:
        """The packing applied to a numpy ``(N, C)`` array (zero padding)."""
        return _pack_numpy(self, array)

    def pack(self, packer, expr, name: str = "data"):
        """Relax code ``(N, C)`` -> packed (or the handed-over packed tensor). Returns
        ``(expr, kept)``."""
        kept = packer.handover(expr, self)
        if kept is not None:
            return kept, True
        return _relayout(packer, expr, self.steps(name)), False

    def unpack(self, packer, expr):
        """Relax code packed -> ``(N, C)``; the last step is returned unbound."""
        flat = packer.emit_unpack(relax.op.reshape(expr, self.matrix.shape), "flatten")
        return self.matrix.unpack(packer, flat)


def pack_conv_weight(packer, weight, shape: Tuple[int, int, int, int], o_p: int, i_p: int,
                     block_out: int, block_in: int, name: str = "weight"):
    """OIHW ``shape`` -> ``(O/co, I/ci, KH, KW, co, ci)``, O and I zero-padded to ``o_p``, ``i_p``."""
    o, i, kh, kw = shape
    return _relayout(packer, weight, [
        ("pad", [0, o_p - o, 0, i_p - i, 0, 0, 0, 0], f"pad_{name}"),
        ("reshape", (o_p // block_out, block_out, i_p // block_in, block_in, kh, kw),
         f"reshape_{name}"),
        ("permute", (0, 2, 4, 5, 1, 3), name)])


def pack_depthwise_weight(packer, weight, channels: int, c_p: int, kh: int, kw: int,
                          batch: int, block: int):
    """``(C, 1, KH, KW)`` -> ``(C/co, KH, KW, b, co)``: C zero-padded, replicated over the b lanes."""
    return _relayout(packer, weight, [
        ("reshape", (channels, kh, kw), "flat_weight"),
        ("pad", [0, c_p - channels, 0, 0, 0, 0], "pad_weight"),
        ("reshape", (c_p // block, block, kh, kw), "reshape_weight"),
        ("permute", (0, 2, 3, 1), "transpose_weight"),
        ("reshape", (c_p // block, kh, kw, 1, block), "expand_weight"),
        ("broadcast", (c_p // block, kh, kw, batch, block), "weight")])


def pack_channel_bias(packer, bias, channels: int, c_p: int, batch: int, block: int,
                      spatial: bool = True):
    """A per-channel int32 bias -> ``(1, C/co, 1, 1, b, co)`` (``spatial``) or ``(1, C/co, b, co)``."""
    lead = (1, c_p // block, 1, 1) if spatial else (1, c_p // block)
    return _relayout(packer, bias, [("reshape", (channels,), "flat_bias"),
                                    ("pad", [0, c_p - channels], "pad_bias"),
                                    ("reshape", lead + (1, block), "reshape_bias"),
                                    ("broadcast", lead + (batch, block), "bias")])


def blocked_arrangement(shape, config):
    """The stock blocked arrangement of a tensor of ``shape`` on ``config`` (what neighbouring VTA
    operators hand over): a :class:`BlockedActivation` for a 4-D NCHW shape, a
    :class:`BlockedMatrix` for a 2-D one, else None."""
    shape = tuple(int(d) for d in shape)
    if len(shape) == 4:
        return BlockedActivation(*shape, config.BATCH, config.BLOCK_OUT)
    if len(shape) == 2:
        return BlockedMatrix(shape[0], shape[1], config.BATCH, config.BLOCK_OUT)
    return None
