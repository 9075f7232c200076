"""Packed tensors handed from one VTA operator to the next, and the layout work made on them.

A VTA operator's output is held in its packed layout (:meth:`PackedHandover.hold`); the next VTA
operator takes it over when its input layout is the same arrangement
(:func:`~vta_ext.packing.same_arrangement`). Block-aligned channel concats, splits and channel
shuffles of packed tensors are made on the packed tensors (:meth:`PackedHandover.track`), and a
concat (or split piece) of one batch block that a VTA operator takes is passed as its parts
(:meth:`PackedHandover.place`, the ``vta_ext.run_placed`` spec): the runtime places them in the
operator's DRAM buffer, no host copy. A VTA output whose packed tensor holds the stock blocked
arrangement as its first elements (an embedding padded for two virtual threads: zero-weight
channel blocks, or an output row; :func:`~vta_ext.packing.blocked_prefix`) is held as that
prefix, a slice placed the same way: its consumers read it in place. Where that is not possible the reason is
recorded for the report.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Tuple

from tvm import relax

from ..packing import (as_blocked, blocked_prefix, channel_shuffle_map, prefix_axis,
                       same_arrangement)
from ..quantize.common import op_name as _op_name, shape_of as _shape
from .names import PACK_PREFIX

__all__ = ["PackedHandover"]


class PackedHandover:
    """The packed tensors of one pass run.

    Parameters
    ----------
    emit : callable
        ``emit(expr, name) -> var``: bind ``expr`` on the host under ``name``.
    producer : callable
        The expression bound to a variable (the mutator's ``lookup_binding``), else None.
    rejected : dict
        Variable name -> why it stays on the CPU, shared with the pass (written here for concats,
        splits and shuffles that must be made in NCHW).
    """

    def __init__(self, emit: Callable, producer: Callable, rejected: Dict[str, str]) -> None:
        self._emit = emit
        self._producer = producer
        self.rejected = rejected
        # unpacked result variable name -> (variable, packed tensor, its packed layout)
        self._packed: Dict[str, tuple] = {}
        # NCHW result var of a concat / split / channel shuffle made in the packed layout ->
        # (relax op, what its packed version is, name of the bound packed tensor)
        self.packed_ops: Dict[str, Tuple[str, str, str]] = {}
        # packed concat var name -> (the bound packed concat, its parts) when the parts can be
        # placed side by side in a consumer's DRAM buffer (one batch block)
        self.concat_parts: Dict[str, tuple] = {}
        self.placed_concats: Dict[str, List[str]] = {}  # packed concat var -> consumers placing it
        self._split_pieces: Dict[str, tuple] = {}  # NCHW split var -> (packed, layout, bounds)
        # bound packed slice var name -> (it, its packed source, first, end, axis) when the source
        # has extent 1 before the axis (the slice is a contiguous byte range): channel blocks
        # (axis 1), or the rows of a padded output's prefix (axis 2, :meth:`hold`)
        self._slices: Dict[str, tuple] = {}
        # bound packed slice var names that are the blocked prefix of a padded VTA output (:meth:`hold`)
        self.prefix_slices: set = set()
        # (first, end, axis) of each such prefix the last :meth:`place` read in place
        self.placed_prefixes: List[Tuple[int, int, int]] = []
        # unpacked result variable name -> the constants its packed tensor's padded channels hold
        # (``OpPlan.out_lanes`` of the VTA operator that made it)
        self._lanes: Dict[str, Tuple[int, ...]] = {}

    def __repr__(self) -> str:
        return (f"PackedHandover({len(self._packed)} packed tensors, {len(self.packed_ops)} "
                "layout operations on them)")

    def hold(self, var: relax.Var, packed, layout, lanes: Optional[Tuple[int, ...]] = None
             ) -> None:
        """``var`` (an unpacked result) is also held as ``packed`` in ``layout``, whose padded
        channels hold the constants ``lanes`` when they are known. A ``layout`` whose first
        elements are the stock blocked arrangement (:func:`~vta_ext.packing.blocked_prefix`)
        is held as that arrangement: a slice of those elements (a contiguous range: channel
        blocks, or the rows of one channel block), which :meth:`place` replaces by ``packed``
        read in place."""
        prefix = blocked_prefix(layout)
        if prefix is not None:
            axis = prefix_axis(layout.shape, prefix.shape)
            end = prefix.shape[axis]
            piece = self._emit(relax.op.strided_slice(packed, axes=[axis], begin=[0], end=[end]),
                               f"{PACK_PREFIX}_prefix_{var.name}")
            self._slices[piece.name] = (piece, packed, 0, end, axis)
            self.prefix_slices.add(piece.name)
            # the constants of the padded channels were stated for ``layout``, not the prefix
            packed, layout, lanes = piece, prefix, None
        self._packed[var.name] = (var, packed, layout)
        self._lanes.pop(var.name, None)
        if lanes is not None:
            self._lanes[var.name] = tuple(int(v) for v in lanes)

    def lanes_of(self, expr) -> Optional[Tuple[int, ...]]:
        """The constants the padded channels of the packed tensor held for ``expr`` hold (a VTA
        operator's output whose plan stated them, :attr:`~vta_ext.strategy.OpPlan.out_lanes`),
        or None (not held, not known, or made by a concat / split / shuffle)."""
        held = self.producer_layout(expr)
        if held is None or as_blocked(held) is None:
            return None
        return self._lanes.get(expr.name)

    def producer_layout(self, expr):
        """The packed layout ``expr`` is available in as a previous VTA operator's output, or
        None (then it lives on the host in its own layout)."""
        producer = self._packed.get(expr.name) if isinstance(expr, relax.Var) else None
        return producer[2] if producer is not None and producer[0].same_as(expr) else None

    def handover(self, expr, layout):
        """The packed output of a previous VTA operator if ``expr`` is its result in a layout of
        the same arrangement as ``layout`` (:func:`~vta_ext.packing.same_arrangement`)."""
        held = self.producer_layout(expr)
        if held is not None and same_arrangement(held, layout):
            return self._packed[expr.name][1]
        return None

    def track(self, binding) -> None:
        """A binding no VTA operator replaced: make a concat, split piece or channel shuffle of
        packed tensors in the packed layout too, where it can be."""
        value = binding.value
        if _op_name(value) == "relax.concat":
            self._concat(binding)
        elif _op_name(value) == "relax.split":
            self._split(binding)
        elif isinstance(value, relax.TupleGetItem):
            self._piece(binding)
        elif _op_name(value) == "relax.reshape":
            self._shuffle(binding)

    def place(self, args: list, consumer: str) -> Tuple[list, Optional[str]]:
        """``args`` with each packed concat that can be placed (:meth:`_concat`) replaced by
        its parts and each channel-block slice of a one-batch-block tensor (:meth:`_piece`)
        by its source (the blocked prefix of a padded output too, noted in
        :attr:`placed_prefixes`), and the ``vta_ext.run_placed`` spec saying how the tensors form the
        operands (None if nothing was replaced). The host concats and slices then have no use
        left unless another consumer needs them."""
        out, spec = [], []
        self.placed_prefixes = []
        for arg in args:
            entry = self.concat_parts.get(arg.name) if isinstance(arg, relax.Var) else None
            if entry is not None and entry[0].same_as(arg):
                parts = entry[1]
                self.placed_concats.setdefault(arg.name, []).append(consumer)
            else:
                parts = [arg]
            texts = []
            for part in parts:
                piece = self._slices.get(part.name) if isinstance(part, relax.Var) else None
                if piece is not None and piece[0].same_as(part):
                    if part.name in self.prefix_slices:
                        self.placed_prefixes.append(piece[2:])
                    out.append(piece[1])
                    texts.append(f"{piece[2]}:{piece[3]}" + (f"@{piece[4]}" if piece[4] != 1 else ""))
                else:
                    out.append(part)
                    texts.append("*")
            spec.append("+".join(texts))
        return out, (None if all(t == "*" for t in spec) else ",".join(spec))

    def blocked(self, expr):
        """``(packed tensor, BlockedActivation)`` if ``expr`` is held in the stock blocked packed
        layout (a VTA output, or a concat / split / shuffle made in it), else None."""
        entry = self._packed.get(expr.name) if isinstance(expr, relax.Var) else None
        if entry is None or not entry[0].same_as(expr):
            return None
        layout = as_blocked(entry[2])
        return None if layout is None else (entry[1], layout)

    def _concat(self, binding) -> None:
        """A channel concat of VTA outputs that share a packed layout (batch, height, width and
        blocks; every part but the last a whole number of channel blocks) is also made in the
        packed layout: the packed tensors side by side along the channel-block axis, one host
        copy instead of unpack, concat and pack. A VTA consumer takes it over (:meth:`handover`);
        the NCHW concat stays only if a CPU operator uses it."""
        value = binding.value
        parts = value.args[0]
        if not isinstance(parts, relax.Tuple) or int(value.attrs.axis) % 4 != 1 \
                or len(_shape(binding.var)) != 4:
            return
        layouts, packed = [], []
        for part in parts.fields:
            held = self.blocked(part)
            if held is None:
                return
            packed.append(held[0])
            layouts.append(held[1])
        first = layouts[0]
        if any((lay.n, lay.h, lay.w, lay.batch_block, lay.channel_block) !=
               (first.n, first.h, first.w, first.batch_block, first.channel_block)
               for lay in layouts):
            return
        if any(lay.c % lay.channel_block for lay in layouts[:-1]):
            self.rejected[binding.var.name] = (
                f"channel concat of VTA outputs with {'+'.join(str(lay.c) for lay in layouts)} "
                f"channels: a part before the last is not a whole number of {first.channel_block}-"
                "channel blocks, so the concat is made in NCHW (unpack, concat, pack on the host)")
            return
        layout = dataclasses.replace(first, c=sum(lay.c for lay in layouts))
        concat = self._emit(relax.op.concat(packed, axis=1),
                            f"{PACK_PREFIX}_concat_{binding.var.name}")
        self._packed[binding.var.name] = (binding.var, concat, layout)
        if layout.shape[0] == 1:  # one batch block: the concat is byte concatenation
            self.concat_parts[concat.name] = (concat, packed)
        self.packed_ops[binding.var.name] = (
            "relax.concat", f"channel concat of {len(packed)} VTA outputs made in their packed "
            f"layout ({'+'.join(str(lay.c) for lay in layouts)} channels, block-aligned",
            concat.name)

    def _split(self, binding) -> None:
        """A channel split of a tensor held packed (:meth:`blocked`) whose split points are
        whole channel blocks: remember it; each piece taken from it (:meth:`_piece`) is a
        slice of the packed tensor along the channel-block axis, no unpack/pack."""
        value = binding.value
        held = self.blocked(value.args[0])
        if held is None or int(value.attrs.axis) % 4 != 1:
            return
        packed, layout = held
        sections = value.attrs.indices_or_sections
        if not hasattr(sections, "__len__"):  # a number of equal sections (an IntImm)
            count = int(sections)
            if layout.c % count:
                return
            points = [layout.c // count * i for i in range(1, count)]
        else:
            points = [int(v) for v in sections]
        bounds = list(zip([0] + points, points + [layout.c]))
        k = layout.channel_block
        if any(begin % k for begin, _ in bounds):
            self.rejected[binding.var.name] = (
                f"channel split of a VTA output into {'+'.join(str(e - b) for b, e in bounds)} "
                f"channels: a split point is not a whole number of {k}-channel blocks, so the "
                "split is made in NCHW (unpack on the host)")
            return
        self._split_pieces[binding.var.name] = (binding.var, packed, layout, bounds)

    def _piece(self, binding) -> None:
        """``split[i]`` of a split remembered by :meth:`_split`: bind the slice of the
        packed tensor (channel blocks ``begin/k .. ceil(end/k)``) and hold it as packed."""
        value = binding.value
        entry = self._split_pieces.get(getattr(value.tuple_value, "name", None))
        if entry is None or not entry[0].same_as(value.tuple_value):
            return
        split_var, packed, layout, bounds = entry
        begin, end = bounds[int(value.index)]
        k = layout.channel_block
        blocks = (begin // k, -(-end // k))
        piece = self._emit(relax.op.strided_slice(packed, axes=[1], begin=[blocks[0]],
                                                  end=[blocks[1]]),
                           f"{PACK_PREFIX}_split_{binding.var.name}")
        if layout.shape[0] == 1:
            # a piece of a padded output's blocked prefix is the same blocks of the padded tensor
            prefix = self._slices.get(packed.name) if packed.name in self.prefix_slices else None
            # its source's channel blocks when the prefix is some of them, else the prefix's
            source = prefix[1] if prefix is not None and prefix[4] == 1 else packed
            self._slices[piece.name] = (piece, source) + blocks + (1,)
        self._packed[binding.var.name] = (binding.var, piece,
                                          dataclasses.replace(layout, c=end - begin))
        self.packed_ops[split_var.name] = (
            "relax.split", f"channel split of a VTA output into "
            f"{'+'.join(str(e - b) for b, e in bounds)} channels made in its packed layout "
            "(block-aligned: a slice of the channel-block axis per piece", "")

    def _shuffle(self, binding) -> None:
        """A channel shuffle ``reshape (N, g, C/g, H, W) -> permute_dims (0, 2, 1, 3, 4) ->
        reshape (N, C, H, W)`` of a tensor held packed is made on the packed tensor
        (:func:`~vta_ext.packing.channel_shuffle_map`) when the channel block is a multiple of
        ``g`` and ``C/g`` a multiple of the channel block."""
        permute = self._producer(binding.value.args[0])
        if _op_name(permute) != "relax.permute_dims" or permute.attrs.axes is None \
                or [int(a) for a in permute.attrs.axes] != [0, 2, 1, 3, 4]:
            return
        split = self._producer(permute.args[0])
        if _op_name(split) != "relax.reshape":
            return
        source = split.args[0]
        held = self.blocked(source)
        if held is None or len(_shape(source)) != 4 or _shape(binding.var) != _shape(source):
            return
        packed, layout = held
        n, groups, per_group, h, w = _shape(permute.args[0])
        if (n, groups * per_group, h, w) != _shape(source):
            return
        try:
            index_map = channel_shuffle_map(layout, groups)
        except ValueError as err:
            self.rejected[binding.var.name] = (f"channel shuffle of a VTA output made in NCHW "
                                               f"(unpack on the host): {err}")
            return
        shuffled = self._emit(relax.op.layout_transform(packed, index_map=index_map),
                              f"{PACK_PREFIX}_shuffle_{binding.var.name}")
        self._packed[binding.var.name] = (binding.var, shuffled, layout)
        text = (f"channel shuffle ({groups} groups of {per_group} channels) of a VTA output made "
                "in its packed layout (one layout_transform of the packed tensor")
        # the three NCHW steps of the shuffle are all accounted for by the packed one
        for var, op in ((permute.args[0], "relax.reshape"), (binding.value.args[0],
                                                             "relax.permute_dims")):
            if isinstance(var, relax.Var):
                self.packed_ops[var.name] = (op, text, shuffled.name)
        self.packed_ops[binding.var.name] = ("relax.reshape", text, shuffled.name)
