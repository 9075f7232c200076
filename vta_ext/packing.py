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
is that operator's result in exactly ``layout`` (then no unpack/pack pair is emitted). Padded lanes
of a handed-over tensor may hold any value: they meet zero-padded weights or are cut off.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from tvm import relax

__all__ = ["BlockedActivation", "BlockedMatrix", "pack_conv_weight", "pack_depthwise_weight",
           "pack_channel_bias", "ceil_to", "padding_text"]


def ceil_to(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple


def padding_text(*dims: Tuple[str, int, int]) -> str:
    """``"in channels 3->16, batch 1->2"`` for the ``(what, size, padded)`` that differ."""
    return ", ".join(f"{what} {size}->{padded}" for what, size, padded in dims if padded != size)


def _pad(packer, expr, widths: List[int], name: str):
    if any(widths):
        expr = packer.emit(relax.op.nn.pad(expr, widths), f"pad_{name}")
    return expr


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

    def pack(self, packer, expr, name: str = "data"):
        """Relax code NCHW -> packed (or the handed-over packed tensor). Returns ``(expr, kept)``."""
        kept = packer.handover(expr, self)
        if kept is not None:
            return kept, True
        (np_, cp), b, k = self.padded, self.batch_block, self.channel_block
        data = _pad(packer, packer.operand(expr), [0, np_ - self.n, 0, cp - self.c, 0, 0, 0, 0], name)
        data = packer.emit(relax.op.reshape(data, (np_ // b, b, cp // k, k, self.h, self.w)),
                           f"reshape_{name}")
        return packer.emit(relax.op.permute_dims(data, [0, 2, 4, 5, 1, 3]), name), False

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

    def pack(self, packer, expr, name: str):
        """Relax code ``(rows, cols)`` -> packed."""
        (rp, cp), r, c = self.padded, self.row_block, self.col_block
        data = _pad(packer, packer.operand(expr), [0, rp - self.rows, 0, cp - self.cols], name)
        data = packer.emit(relax.op.reshape(data, (rp // r, r, cp // c, c)), f"reshape_{name}")
        return packer.emit(relax.op.permute_dims(data, [0, 2, 1, 3]), name)

    def unpack(self, packer, expr):
        """Relax code packed -> ``(rows, cols)``; the last step is returned unbound."""
        rp, cp = self.padded
        out = packer.emit_unpack(relax.op.permute_dims(expr, [0, 2, 1, 3]), "transpose")
        out = relax.op.reshape(out, (rp, cp))
        if (rp, cp) != (self.rows, self.cols):
            out = relax.op.strided_slice(packer.emit_unpack(out, "reshape"), axes=[0, 1],
                                         begin=[0, 0], end=[self.rows, self.cols])
        return out


def pack_conv_weight(packer, weight, shape: Tuple[int, int, int, int], o_p: int, i_p: int,
                     block_out: int, block_in: int, name: str = "weight"):
    """OIHW ``shape`` -> ``(O/co, I/ci, KH, KW, co, ci)``, O and I zero-padded to ``o_p``, ``i_p``."""
    o, i, kh, kw = shape
    w = _pad(packer, packer.operand(weight), [0, o_p - o, 0, i_p - i, 0, 0, 0, 0], name)
    w = packer.emit(relax.op.reshape(w, (o_p // block_out, block_out, i_p // block_in, block_in,
                                         kh, kw)), f"reshape_{name}")
    return packer.emit(relax.op.permute_dims(w, [0, 2, 4, 5, 1, 3]), name)


def pack_depthwise_weight(packer, weight, channels: int, c_p: int, kh: int, kw: int,
                          batch: int, block: int):
    """``(C, 1, KH, KW)`` -> ``(C/co, KH, KW, b, co)``: C zero-padded, replicated over the b lanes."""
    wt = packer.emit(relax.op.reshape(packer.operand(weight), (channels, kh, kw)), "flat_weight")
    wt = _pad(packer, wt, [0, c_p - channels, 0, 0, 0, 0], "weight")
    wt = packer.emit(relax.op.reshape(wt, (c_p // block, block, kh, kw)), "reshape_weight")
    wt = packer.emit(relax.op.permute_dims(wt, [0, 2, 3, 1]), "transpose_weight")
    wt = packer.emit(relax.op.reshape(wt, (c_p // block, kh, kw, 1, block)), "expand_weight")
    return packer.emit(relax.op.broadcast_to(wt, (c_p // block, kh, kw, batch, block)), "weight")


def pack_channel_bias(packer, bias, channels: int, c_p: int, batch: int, block: int,
                      spatial: bool = True):
    """A per-channel int32 bias -> ``(1, C/co, 1, 1, b, co)`` (``spatial``) or ``(1, C/co, b, co)``."""
    flat = packer.emit(relax.op.reshape(packer.operand(bias), (channels,)), "flat_bias")
    flat = _pad(packer, flat, [0, c_p - channels], "bias")
    lead = (1, c_p // block, 1, 1) if spatial else (1, c_p // block)
    flat = packer.emit(relax.op.reshape(flat, lead + (1, block)), "reshape_bias")
    return packer.emit(relax.op.broadcast_to(flat, lead + (batch, block)), "bias")
