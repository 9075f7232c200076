"""From an :class:`~tvm_csp_embed.embedding.Embedding` to the packed GEMM program it implies.

:func:`packed_gemm` reads an embedding of the VTA GEMM (``C[x,y] += A[x,z] * B[y,z]``) into an
operator and derives, with no knowledge of the operator kind or of the mapping family:

* the **free loops** (:class:`FreeLoop`): one per loop dim the instruction does not walk, and for
  a walked dim its tile loop (and, for a strided factor, its sub-offset loop);
* the **packed operands** (:class:`PackedOperand`): for A, B and C the packed shape, the index of
  every packed dim as an affine expression of free loops and instruction axes (the axes
  innermost), and the host relayout (:class:`~.relayout.HostLayout`) from the operator's own
  tensor;
* whether the zero padding an operator adds to its input (a convolution's) is produced by the
  input DMA (device padding, as the stock templates do) or on the host;
* the **role** of every free loop, which the schedule uses to order loops (:func:`loop_roles`).

The stock ``conv2d_packed`` is the special case x = batch, y = output channels, z = input
channels: its packed layouts and its loop nest come out of the same derivation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import (Any, Callable, Collection, Dict, FrozenSet, List, Mapping, Optional, Sequence,
                    Tuple)

from ..embedding import Embedding, TensorRelayout
from ..workload import TensorAccess, Workload
from .relayout import HostLayout, Step, step_shape

__all__ = ["FreeLoop", "PackedDim", "PackedOperand", "PackedGemm", "packed_gemm", "loop_roles",
           "AXIS_PREFIX", "ROLES"]

#: prefix of the instruction-axis variables in index terms (``"@x"``, ``"@y"``, ``"@z"``)
AXIS_PREFIX = "@"
#: roles of free loops (see :func:`loop_roles`)
ROLES = ("shared", "plain", "stencil", "weight", "ztile", "reduce")


@dataclass(frozen=True)
class FreeLoop:
    """A loop the embedding leaves to the schedule.

    Attributes
    ----------
    name : str
        Loop name: the workload dim for an unwalked dim and for the tile loop of a walked one,
        ``<dim>_sub`` for the sub-offset loop of a strided factor.
    dim : str
        The workload loop dim it iterates.
    extent : int
    reduction : bool
    kind : str
        ``"full"`` (dim not walked), ``"tile"`` (tile loop of a walked dim) or ``"sub"``.
    """

    name: str
    dim: str
    extent: int
    reduction: bool
    kind: str


@dataclass(frozen=True)
class PackedDim:
    """One dim of a packed operand: ``index = const + sum(coef * var)`` over ``terms``.

    ``extent`` is the extent of the dim as the compute reads it. With device padding only
    ``[stored_lo, stored_lo + stored)`` is stored in DRAM; the rest reads as zero.
    """

    extent: int
    terms: Tuple[Tuple[str, int], ...]
    const: int = 0
    stored_lo: int = 0
    stored: Optional[int] = None

    @property
    def stored_extent(self) -> int:
        """Extent of the dim in the DRAM tensor."""
        return self.extent if self.stored is None else self.stored

    @property
    def padded(self) -> bool:
        """Whether the input DMA pads this dim."""
        return self.stored is not None and self.stored != self.extent


@dataclass(frozen=True)
class PackedOperand:
    """One operand of the packed GEMM.

    Attributes
    ----------
    role : str
        ``"A"``, ``"B"`` or ``"C"``.
    tensor : str
        The workload tensor bound to it.
    dims : tuple of PackedDim
        Packed dims, free dims first, then the operand's instruction axes.
    labels : tuple
        The embedding's label of every packed dim (``("t", e)``, ``("i", d)``, ``("tile", d)``,
        ``("sub", d)``, ``("axis", name)``).
    host : HostLayout
        Relayout from the operator's own tensor to the packed tensor (stored extents).
    """

    role: str
    tensor: str
    dims: Tuple[PackedDim, ...]
    labels: Tuple[Tuple[str, object], ...]
    host: HostLayout

    @property
    def shape(self) -> Tuple[int, ...]:
        """Extents the compute reads (padding included)."""
        return tuple(d.extent for d in self.dims)

    @property
    def stored_shape(self) -> Tuple[int, ...]:
        """Shape of the DRAM tensor."""
        return tuple(d.stored_extent for d in self.dims)

    @property
    def device_padded(self) -> bool:
        """Whether the input DMA produces some of this operand's zero padding."""
        return any(d.padded for d in self.dims)


@dataclass
class PackedGemm:
    """The packed GEMM program of one embedding (see the module docstring).

    Attributes
    ----------
    embedding : Embedding
    loops : tuple of FreeLoop
        In workload dim order.
    operands : dict
        ``"A"``, ``"B"``, ``"C"`` -> :class:`PackedOperand`.
    axes : dict
        Instruction axis -> size (``x``, ``y``, ``z``).
    roles : dict
        Loop name -> role (:func:`loop_roles`).
    channel_loops : tuple of str
        Spatial loops of the output that the weight tensor sees (a per-channel bias depends on them).
    out_shape : tuple of int
        The operator's output shape in its own layout.
    """

    embedding: Embedding
    loops: Tuple[FreeLoop, ...]
    operands: Dict[str, PackedOperand]
    axes: Dict[str, int]
    roles: Dict[str, str]
    channel_loops: Tuple[str, ...]
    out_shape: Tuple[int, ...]
    #: facts derived from the program and asked for repeatedly (loop lists, loop orders, TPS
    #: points, bias layouts), computed once per program: ``memo(key, make)``
    derived: Dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def memo(self, key, make: Callable[[], Any]) -> Any:
        """``make()`` computed once per ``key`` for this program (the program is not changed after
        :func:`packed_gemm` builds it, so what is derived from it stays valid)."""
        try:
            return self.derived[key]
        except KeyError:
            value = self.derived[key] = make()
            return value

    @property
    def loop(self) -> Dict[str, FreeLoop]:
        """Loop name -> :class:`FreeLoop`."""
        return {lp.name: lp for lp in self.loops}

    def c_loops(self) -> List[str]:
        """The free loops of the output, in packed-output order."""
        return list(self.memo("c_loops", lambda: tuple(
            t[0][0] for d in self.operands["C"].dims for t in [d.terms]
            if not t[0][0].startswith(AXIS_PREFIX))))

    def reduction_loops(self) -> List[str]:
        """The free reduction loops, in workload dim order."""
        return [lp.name for lp in self.loops if lp.reduction]

    def bias_layout(self, bias_shape: Sequence[int]) -> HostLayout:
        """Host layout of a per-channel bias (operator form ``bias_shape``, e.g. ``(1, K, 1, 1)`` or
        ``(K,)``) into the accumulator layout: the output's packed layout with extent 1 on the free
        dims that do not depend on the channel, and the per-channel value on every lane."""
        key = tuple(int(s) for s in bias_shape)
        return self.memo(("bias_layout", key), lambda: _bias_layout(self, key))

    def describe(self) -> str:
        """The packed compute as one line, e.g. ``out[n, k, oh, ow, @x, @y] += ...``."""
        def acc(op: PackedOperand) -> str:
            def one(d: PackedDim) -> str:
                parts = [(f"{c}*" if c != 1 else "") + v for v, c in d.terms]
                if d.const:
                    parts.append(str(d.const))
                return " + ".join(parts) or "0"
            return f"{op.tensor}[" + ", ".join(one(d) for d in op.dims) + "]"
        c, a, b = (self.operands[r] for r in "CAB")
        return f"{acc(c)} += {acc(a)} * {acc(b)}"


# ------------------------------------------------------------------------------------ roles
def loop_roles(wl: Workload, loops: Sequence[FreeLoop]) -> Dict[str, str]:
    """The role of every free loop, from which operator tensors see its dim.

    Spatial loops: ``"shared"`` (seen by the data and the weight tensor, e.g. a group), ``"weight"``
    (weight only: output channels), ``"stencil"`` (data only, in a subscript with a reduction dim:
    image rows and columns) or ``"plain"`` (data only, otherwise: the batch). Reduction loops:
    ``"ztile"`` (tile loop of a dim walked by the instruction's reduction axis) or ``"reduce"``.
    ``inputs[0]`` of the workload is the data tensor and ``inputs[1]`` the weights, whatever the
    operand binding.
    """
    data, weight = wl.inputs
    red = {d for d, r in enumerate(wl.reduction) if r}
    out = {}
    for lp in loops:
        d = wl.dims.index(lp.dim)
        if lp.reduction:
            out[lp.name] = "ztile" if lp.kind == "tile" else "reduce"
            continue
        in_data, in_weight = d in data.visible(), d in weight.visible()
        if in_data and in_weight:
            out[lp.name] = "shared"
        elif in_weight:
            out[lp.name] = "weight"
        elif any(d in data.loop_dims_of(e) and red & set(data.loop_dims_of(e))
                 for e in range(data.rank)):
            out[lp.name] = "stencil"
        else:
            out[lp.name] = "plain"
    return out


# ------------------------------------------------------------------------------------ derivation
def _src_steps(steps) -> Tuple[Step, ...]:
    """Source steps (operator layout -> workload tensor) given as steps or as a permutation."""
    if not steps:
        return ()
    if all(isinstance(v, int) for v in steps):
        perm = tuple(int(v) for v in steps)
        return () if perm == tuple(range(len(perm))) else (("permute", perm),)
    return tuple(tuple(st) for st in steps)


def _free_loops(emb: Embedding) -> Tuple[FreeLoop, ...]:
    wl = emb.workload
    walked = emb.walked
    out = []
    for d, red in zip(wl.dims, wl.reduction):
        ext = emb.padded_extents[d]
        if d in walked:
            f = walked[d]
            out.append(FreeLoop(d, d, ext // (f.size * f.stride), red, "tile"))
            if f.stride > 1:
                out.append(FreeLoop(f"{d}_sub", d, f.stride, red, "sub"))
        else:
            out.append(FreeLoop(d, d, ext, red, "full"))
    return tuple(out)


def _label_terms(emb: Embedding, t: TensorAccess, label) -> Tuple[Tuple[Tuple[str, int], ...], int]:
    wl = emb.workload
    kind, v = label
    if kind == "t":
        return tuple((wl.dims[d], t.coef[v][d]) for d in t.loop_dims_of(v)), t.const[v]
    if kind in ("i", "tile"):
        return ((wl.dims[v], 1),), 0
    if kind == "sub":
        return ((f"{wl.dims[v]}_sub", 1),), 0
    if kind == "axis":
        return ((AXIS_PREFIX + v, 1),), 0
    raise ValueError(f"unknown packed label {label!r}")


def _device_pad_dims(emb: Embedding, plan: TensorRelayout, t: TensorAccess,
                     input_pad: Sequence[Tuple[int, int]], max_pad: int) -> FrozenSet[int]:
    """The dims of ``t`` whose padding the input DMA produces (operand A only; empty: the host
    pads them all).

    The operator's padding (``input_pad``) is the DMA's when every dim it pads is kept whole (not
    unrolled or split), is one of the two innermost free dims of the packed layout (the DMA's x
    and y), and no side exceeds the DMA pad field; else the host pads every dim. The embedding's
    padding past the end of such a dim (:func:`_embedding_extra`: the rows of zero input an
    output row padded for two virtual threads reads, ``codegen.loops.thread_paddings``) is the
    DMA's too where it fits the field, so that twin takes its input in the producer's layout;
    the embedding's padding of any other dim (the channels) stays the host's."""
    if plan.operand != "A":
        return frozenset()
    extra = _embedding_extra(plan, t)
    free = [lab for lab in plan.packed_labels if lab[0] != "axis"]
    inner = free[-2:]
    padded = [e for e, (lo, hi) in enumerate(input_pad) if lo or hi]
    if not all(("t", e) in inner and max(input_pad[e]) <= max_pad for e in padded):
        return frozenset()
    return frozenset(padded) | {e for e in range(t.rank)
                                if extra[e] and ("t", e) in inner and extra[e] <= max_pad}


def _embedding_extra(plan: TensorRelayout, t: TensorAccess) -> Tuple[int, ...]:
    """Elements the embedding pads past the end of each dim of ``t`` (its relayout's pad step)."""
    emb_pad = next((s.args["pad"] for s in plan.steps if s.kind == "pad"), ((0, 0),) * t.rank)
    return tuple(int(hi) for _, hi in emb_pad)


def _host_steps(emb: Embedding, plan: TensorRelayout, t: TensorAccess, src_shape: Sequence[int],
                src: Sequence[Step], input_pad: Sequence[Tuple[int, int]], device: Collection[int],
                broadcast: Optional[Sequence[int]] = None) -> Tuple[List[Step], Dict[int, int]]:
    """Concrete host steps of ``plan`` for ``t`` given in the operator's layout (``src_shape``).

    Returns the steps and, for device padding, the stored extent of every padded tensor dim.
    ``broadcast``: broadcast the tensor (after the permutation) to this shape first (the bias).
    """
    wl = emb.workload
    ext = [emb.padded_extents[d] for d in wl.dims]
    steps: List[Step] = list(src)
    if broadcast is not None:
        steps.append(("broadcast", tuple(broadcast)))
    shape = tuple(int(s) for s in src_shape)
    for st in steps:
        shape = step_shape(shape, st)
    extras = _embedding_extra(plan, t)
    stored: Dict[int, int] = {}
    pads = []
    for e in range(t.rank):
        lo, hi = input_pad[e]
        extra = extras[e]
        if e in device:
            stored[e] = shape[e]
            pads.append((0, 0))
        elif shape[e] == 1 and broadcast is not None and t.shape[e] != 1:
            pads.append((0, 0))       # a bias dim the channel does not depend on
        else:
            pads.append((lo, hi + extra))
    if any(lo or hi for lo, hi in pads):
        steps.append(("pad", tuple(pads)))
        shape = step_shape(shape, steps[-1])
    labels: List[Tuple[str, int]] = [("t", e) for e in range(t.rank)]
    for st in plan.steps:
        a = st.args
        if st.kind == "unroll":
            pos = labels.index(("t", a["dim"]))
            extents = tuple(ext[d] for d in a["loops"])
            steps.append(("unroll", pos, extents, tuple(a["coef"]), a["const"]))
            labels[pos:pos + 1] = [("i", d) for d in a["loops"]]
        elif st.kind == "split":
            d = wl.dims.index(a["dim"])
            if ("i", d) in labels:
                pos = labels.index(("i", d))
            else:
                pos = next(i for i, lab in enumerate(labels) if lab[0] == "t" and t.loop_dims_of(lab[1]) == (d,))
            steps.append(("split", pos, tuple(a["into"])))
            labels[pos:pos + 1] = [("tile", d), ("digit", d), ("sub", d)]
        elif st.kind == "transpose":
            steps.append(("permute", tuple(a["perm"])))
            labels = [labels[i] for i in a["perm"]]
        elif st.kind == "fuse":
            steps.append(("fuse",))
    # resolve split/fuse into reshapes with the current shapes
    out: List[Step] = []
    shape = tuple(int(s) for s in src_shape)
    nfree = sum(1 for lab in plan.packed_labels if lab[0] != "axis")
    tile_shape = tuple(emb.instruction.sizes[emb.instruction.axes.index(ax)]
                       for ax in emb.instruction.operand_axes[plan.operand])
    for st in steps:
        if st[0] == "split":
            _, pos, (_, size, stride) = st
            n = shape[pos]
            st = ("reshape", shape[:pos] + (n // (size * stride), size, stride) + shape[pos + 1:])
        elif st[0] == "fuse":
            st = ("reshape", shape[:nfree] + tile_shape)
        out.append(st)
        shape = step_shape(shape, st)
    return out, stored


def _packed_operand(emb: Embedding, role: str, t: TensorAccess, src_shape, src, input_pad,
                    max_pad: int) -> PackedOperand:
    plan = emb.relayout[t.name]
    device = _device_pad_dims(emb, plan, t, input_pad, max_pad)
    steps, stored = _host_steps(emb, plan, t, src_shape, src, input_pad, device)
    host = HostLayout(tuple(int(s) for s in src_shape), tuple(steps), t.name)
    dims = []
    for lab, n in zip(plan.packed_labels, host.shape):
        terms, const = _label_terms(emb, t, lab)
        if lab[0] == "t" and lab[1] in stored:
            e = lab[1]
            full = plan.packed_shape[plan.packed_labels.index(lab)]
            dims.append(PackedDim(full, terms, const, input_pad[e][0], stored[e]))
        else:
            dims.append(PackedDim(n, terms, const))
    return PackedOperand(role, t.name, tuple(dims), tuple(plan.packed_labels), host)


def _bias_layout(pg: PackedGemm, bias_shape: Tuple[int, ...]) -> HostLayout:
    emb = pg.embedding
    wl = emb.workload
    out = wl.output
    cplan = emb.relayout[out.name]
    channel_dims = {pg.loop[name].dim for name in pg.channel_loops}
    # the bias in the workload's output space: the channel dims, 1 elsewhere (the operator's bias
    # is per output channel, in the order of the output's channel dims)
    chan = [bool({wl.dims[d] for d in out.loop_dims_of(e)} & channel_dims) for e in range(out.rank)]
    src = tuple(out.shape[e] if c else 1 for e, c in enumerate(chan))
    if math.prod(bias_shape) != math.prod(src):
        raise ValueError(f"bias of shape {bias_shape} does not match the channel dim(s) of the output "
                         f"{out.name}{out.shape}")
    walked = emb.walked
    target = []
    for e in range(out.rank):
        dims = {wl.dims[d] for d in out.loop_dims_of(e)}
        target.append(out.shape[e] if dims & (channel_dims | set(walked)) else 1)
    steps: List[Step] = []
    if tuple(bias_shape) != src:
        steps.append(("reshape", src))
    more, _ = _host_steps(emb, cplan, out, src, (), ((0, 0),) * out.rank, (), broadcast=target)
    steps += more
    host = HostLayout(tuple(bias_shape), tuple(steps), "bias")
    # keep one copy of every free dim the channel does not index
    keep = []
    for lab, n in zip(cplan.packed_labels, host.shape):
        terms, _ = _label_terms(emb, out, lab)
        depends = any(v in pg.channel_loops for v, _ in terms)
        keep.append((0, n) if depends or lab[0] == "axis" else (0, 1))
    if any(hi != n for (_, hi), n in zip(keep, host.shape)):
        host = HostLayout(host.src_shape, host.steps + (("slice", tuple(keep)),), "bias")
    return host


def packed_gemm(emb: Embedding, src_shapes: Mapping[str, Sequence[int]],
                src_steps: Optional[Mapping[str, Sequence]] = None,
                input_pads: Optional[Mapping[str, Sequence[Tuple[int, int]]]] = None,
                max_dma_pad: Optional[int] = None) -> PackedGemm:
    """The packed GEMM program of ``emb``.

    Parameters
    ----------
    emb : Embedding
        An embedding of a GEMM instruction (axes ``x, y, z``).
    src_shapes : mapping
        Tensor name -> shape of the tensor in the operator's own layout (a padded input without
        its zero padding).
    src_steps : mapping, optional
        Tensor name -> the steps from the operator's layout to the workload tensor's dims: a
        permutation (``relax.op.permute_dims`` axes), or a sequence of relayout steps (e.g. a
        reshape splitting channels into groups); default none.
    input_pads : mapping, optional
        Tensor name -> ``(lo, hi)`` per workload tensor dim: the zero padding the operator adds to
        that input (a convolution's padding; the workload's tensor includes it).
    max_dma_pad : int, optional
        Largest pad one side of a DMA can produce (:data:`vta_ext.layout.MAX_DMA_PAD`); device
        padding is used only where it fits.

    Raises
    ------
    ValueError
        If the instruction is not a GEMM or a shape does not match the workload.
    """
    if max_dma_pad is None:
        from vta_ext.layout import MAX_DMA_PAD
        max_dma_pad = MAX_DMA_PAD
    instr = emb.instruction
    if instr.axes != ("x", "y", "z") or instr.kind != "gemm":
        raise ValueError(f"packed_gemm needs a GEMM instruction, got {instr!r}")
    wl = emb.workload
    src_steps = {k: _src_steps(v) for k, v in (src_steps or {}).items()}
    input_pads = dict(input_pads or {})
    loops = _free_loops(emb)
    operands = {}
    for role in "ABC":
        t = next(x for x in wl.tensors if x.name == emb.binding[role])
        steps = src_steps.get(t.name, ())
        pad = tuple(tuple(p) for p in input_pads.get(t.name, ((0, 0),) * t.rank))
        src = tuple(int(s) for s in src_shapes[t.name])
        got = src
        for st in steps:
            got = step_shape(got, st)
        expect = tuple(n - lo - hi for n, (lo, hi) in zip(t.shape, pad))
        if got != expect:
            raise ValueError(f"tensor {t.name}: operator shape {src} (after {list(steps)}: {got}) "
                             f"does not match the workload ({t.shape} with input padding {pad})")
        operands[role] = _packed_operand(emb, role, t, src, steps, pad, max_dma_pad)
    roles = loop_roles(wl, loops)
    weight = wl.inputs[1]
    out_t = wl.output
    channel = tuple(lp.name for lp in loops if not lp.reduction and
                    wl.dims.index(lp.dim) in weight.visible())
    return PackedGemm(emb, loops, operands, dict(zip(instr.axes, instr.sizes)), roles, channel,
                      tuple(int(v) for v in src_shapes[out_t.name]))
