"""Folding a constant per-channel bias into the spare reduction lanes of a packed GEMM.

An embedding that pads the reduction (a thin layer: 25 -> 32 filter taps, 3 -> 4 input channels)
multiplies padding lanes anyway: the weight operand is zero there, the data operand holds zeros or
(after a stencil unroll) a neighbour's data. Writing constants ``a_j`` into ``L`` such lanes of the
data operand and int8 digits ``w_j[k]`` into the same lanes of the weight operand, at one reduction
point each, makes the GEMM add ``sum_j a_j * w_j[k]`` to every output of channel ``k``; with
``bias[k] = sum_j a_j * w_j[k]`` the epilogue's bias stage (one vector ALU pass per accumulator
entry) is gone and costs no micro-op. The accumulator still starts from its zero fill; int32
wrapping is the same as that of the ALU add.

* :func:`fold_range`, :func:`fold_constants`, :func:`fold_digits`: the digit decomposition, the
  one definition of the range a number of lanes holds and of the digits;
* :func:`fold_lanes`: which lanes of a :class:`~.plan.PackedGemm` can carry the bias
  (:class:`FoldLanes`), or why none can;
* :func:`fold_decision`: the per-operator decision and the sentence the build report prints;
* :func:`fold_layouts`: the data and weight host layouts with the constants and the digits written
  in (the data's constants by the copies its layout already makes where it can, a ``concat``
  onto a stencil gather's source or in place of the reduction pad, else a ``("set", ...)`` step
  of :class:`~.relayout.HostLayout`; the weights' digits by a ``set`` at build time);
* :func:`fold_epilogue`: the epilogue the folded program runs (the bias stage dropped).

A program without spare lanes (a reduction of whole ``BLOCK_IN`` blocks: ResNet's 64-channel
3x3 convs) can still add the bias by a GEMM instead of the vector ALU ADD: a *constant block*, one
input-buffer row holding :func:`fold_constants` ``(BLOCK_IN)`` in its ``BLOCK_IN`` lanes, times one
weight tile per output channel block holding the bias's :func:`fold_digits` ``(bias, BLOCK_IN)``,
one GEMM instruction per output tile whose loops run over the tile's output rows with input and
weight factors 0 (:func:`~.schedule.schedule_gemm`): ``GEMM_CYCLES_PER_UOP`` per accumulator
entry instead of ``ALU_CYCLES_PER_UOP_VEC``, the weight tiles and the constant row loaded instead
of the int32 bias rows:

* :func:`gemm_bias_decision`: whether an operator's program can add its bias so, or why not
  (:func:`gemm_bias_lanes_decision`: the part that needs only the lanes, which the
  block-diagonal programs of :mod:`tvm_csp_embed.depthwise` use too);
* :func:`gemm_bias_epilogue`: the epilogue that program runs (``("bias_gemm",)`` first,
  :data:`~vta_ext.templates.epilogue.GEMM_BIAS_STAGE`);
* :func:`gemm_bias_operands`: the constant row and the digit tiles of a packed bias.

A lane here is a *class* of packed data positions: the values of the packed data dims that only
reduction loops index. A class can carry the bias when every reduction point that reads it is a
padding point (one whose reduction index is beyond an operator dim's extent, so that the weight
operand is zero there); the digits sit at one such point per class (the first in reduction
order whose reads the input DMA never pads), zero at the others.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np

from .plan import AXIS_PREFIX, PackedGemm
from .relayout import HostLayout, _is_identity

__all__ = ["FIRST_LANE_CONSTANT", "LANE_CONSTANT", "POSITIVE_LANE_CONSTANT", "lane_biases", "producer_lane_bias", "handed_lane_constant", "fold_range", "fold_constants", "fold_digits",
           "FoldLanes", "fold_lanes", "fold_decision", "fold_fits", "fold_copied_bound", "fold_forms", "fold_form_note", "fold_layouts", "fold_data_layout", "fold_epilogue",
           "FOLD_KINDS", "gemm_bias_decision", "gemm_bias_lanes_decision", "gemm_bias_epilogue", "gemm_bias_operands"]

#: the data constant of the first spare lane (it carries the residue of the bias modulo 128)
FIRST_LANE_CONSTANT = 1
#: the data constant of every other spare lane (the int8 of largest magnitude: each of these lanes
#: adds a multiple of 128 in ``[-127 * 128, 128 * 128]``)
LANE_CONSTANT = -128
#: the other spare lanes' constant a producer writes into its padded output channels when its
#: epilogue clips at 0 (a ReLU: -128 does not survive it; :func:`producer_lane_bias`)
POSITIVE_LANE_CONSTANT = 127
#: operator kinds whose weight tensor has the output channel as its first dim, the channel of a
#: per-channel bias (a batched matmul's bias is per batch and column)
FOLD_KINDS = ("conv2d", "group_conv2d", "dense", "conv1d", "dilated_conv2d")

_I8_MIN, _I8_MAX = -128, 127


def _lane_constant(lane_constant: int) -> int:
    """``lane_constant`` validated: an int8 other than -1, 0 and 1 (the other lanes' constant)."""
    c = int(lane_constant)
    if not _I8_MIN <= c <= _I8_MAX or abs(c) < 2:
        raise ValueError(f"lane constant {lane_constant}: expected an int8 of magnitude 2..128")
    return c


def fold_range(lanes: int, lane_constant: int = LANE_CONSTANT) -> Tuple[int, int]:
    """The biases ``lanes`` spare lanes hold: every integer in ``[lo, hi]``.

    With the constants ``(1, A, A, ...)`` (:func:`fold_constants`, ``A = lane_constant``, by
    default :data:`LANE_CONSTANT` = -128) and int8 digits, the first lane adds a residue ``w_0``
    of the bias modulo ``|A|`` (in ``0..|A|-1``, or that minus ``|A|``) and the other lanes
    ``A * S`` with ``S`` their digits' sum, in ``[-128 (L - 1), 127 (L - 1)]``. For ``A < 0``:
    ``lo = -|A| - |A| * 127 (L - 1)`` and ``hi = |A| - 1 + |A| * 128 (L - 1)`` (``A = -128``,
    ``L = 7``: ``-97,664 .. 98,431``); for ``A > 0`` the two factors swap. Every integer between
    is reached (:func:`fold_digits`).

    Raises
    ------
    ValueError
        If ``lanes < 1`` or ``lane_constant`` is not an int8 of magnitude 2..128.

    >>> fold_range(1), fold_range(7), fold_range(8, POSITIVE_LANE_CONSTANT)
    ((-128, 127), (-97664, 98431), (-113919, 113029))
    """
    if lanes < 1:
        raise ValueError(f"lanes={lanes}: the bias needs at least one spare lane")
    a = _lane_constant(lane_constant)
    m, lo_sum, hi_sum = abs(a), _I8_MIN * (lanes - 1), _I8_MAX * (lanes - 1)
    if a < 0:
        return -m - m * hi_sum, m - 1 - m * lo_sum
    return -m + m * lo_sum, m - 1 + m * hi_sum


def fold_constants(lanes: int, lane_constant: int = LANE_CONSTANT) -> np.ndarray:
    """The data constants ``a_j`` of ``lanes`` spare lanes: ``(1, A, A, ...)`` (int8; ``A =
    lane_constant``, by default :data:`LANE_CONSTANT`)."""
    fold_range(lanes, lane_constant)  # validates lanes and the constant
    return np.array([FIRST_LANE_CONSTANT] + [lane_constant] * (lanes - 1), dtype=np.int8)


def fold_digits(bias, lanes: int, lane_constant: int = LANE_CONSTANT) -> np.ndarray:
    """The int8 digits ``w[k, j]`` with ``bias[k] = sum_j a_j * w[k, j]`` (``a`` of
    :func:`fold_constants` ``(lanes, lane_constant)``), for every value of ``bias`` (flattened).

    The first digit is the residue of ``bias[k]`` modulo ``|A|`` (in ``0..|A|-1``, or that minus
    ``|A|`` where the rest would not fit), the others split ``(bias[k] - w[k, 0]) / A`` greedily
    into int8 values, largest magnitude first (the unused lanes get 0).

    Raises
    ------
    ValueError
        If a value is outside :func:`fold_range` ``(lanes, lane_constant)``.

    >>> fold_digits([1000, -1000, 127], 3).tolist()
    [[104, -7, 0], [24, 8, 0], [127, 0, 0]]
    >>> fold_digits([1000, -1000], 3, POSITIVE_LANE_CONSTANT).tolist()
    [[111, 7, 0], [16, -8, 0]]
    """
    lo, hi = fold_range(lanes, lane_constant)
    a = _lane_constant(lane_constant)
    m, sign = abs(a), (1 if a > 0 else -1)
    b = np.asarray(bias, dtype=np.int64).ravel()
    if b.size and (b.min() < lo or b.max() > hi):
        raise ValueError(f"bias {int(b.min()):,}..{int(b.max()):,} is outside {lo:,}..{hi:,}, "
                         f"what {lanes} spare lane(s) hold; keep the bias on the ALU")
    residue = np.mod(b, m)
    rest = (b - residue) // a                    # sum of the other digits (each times a)
    # out of the other lanes' reach on the side a borrow of |a| from the residue fixes
    borrow = (rest > _I8_MAX * (lanes - 1)) if a < 0 else (rest < _I8_MIN * (lanes - 1))
    residue = np.where(borrow, residue - m, residue)
    rest = np.where(borrow, rest + sign, rest)
    digits = np.zeros((b.size, lanes), dtype=np.int64)
    digits[:, 0] = residue
    for j in range(1, lanes):
        digits[:, j] = np.clip(rest, _I8_MIN, _I8_MAX)
        rest = rest - digits[:, j]
    assert not rest.any(), "fold_digits: the range check let through a bias it cannot split"
    return digits.astype(np.int8)


# ------------------------------------------------------------------------------ producer
def lane_biases(epilogue: Sequence[tuple], constants) -> Tuple[Optional[np.ndarray], str]:
    """The int32 biases a producer puts into its padded output channels (all-zero weights, so
    its accumulator there is the bias alone) for its epilogue to leave the int8 ``constants``
    (one per channel) in them.

    The epilogue must be ``("bias",)`` followed by ``shr`` and ``clip`` stages only; the bias of
    constant ``c`` is ``c << s`` (``s`` the shifts' sum), kept only if the epilogue's definition
    (:func:`~tvm_csp_embed.reference.apply_epilogue`) gives ``c`` back.

    Returns
    -------
    tuple
        ``(biases, "")`` (int64 array, one per constant), or ``(None, why)``.
    """
    from vta_ext.templates.epilogue import normalize_epilogue

    from ..reference import apply_epilogue

    epilogue = normalize_epilogue(epilogue)
    if not epilogue or epilogue[0] != ("bias",):
        return None, "the producer's epilogue does not start with its bias"
    rest = epilogue[1:]
    if any(st[0] not in ("shr", "clip") for st in rest):
        return None, (f"the producer's epilogue {'+'.join(st[0] for st in epilogue)} is not "
                      "bias, shifts and clips")
    c = np.asarray(constants, dtype=np.int64).ravel()
    shift = sum(st[1] for st in rest if st[0] == "shr")
    biases = c << shift
    if c.size and np.abs(biases).max() >= 2 ** 31:
        return None, f"the shift {shift} overflows int32"
    kept = apply_epilogue(np.zeros(c.size, np.int64), epilogue, biases)
    if not np.array_equal(kept.astype(np.int64), c):
        return None, (f"the producer's epilogue {'+'.join(st[0] for st in epilogue)} does not "
                      f"keep {', '.join(str(int(v)) for v in np.unique(c[kept != c]))}")
    return biases, ""


def producer_lane_bias(epilogue: Sequence[tuple], lanes: int) -> Tuple[Optional[np.ndarray], int, str]:
    """The int32 biases a producer puts into ``lanes`` padded output channels
    (:func:`lane_biases`) for its epilogue to leave the lane constants :func:`fold_constants`
    ``(lanes, A)`` in them: the constants a consumer that folds its bias into those channels
    (its spare reduction lanes) reads, with no host pass writing them. ``A`` is
    :data:`LANE_CONSTANT` where the epilogue keeps -128, else :data:`POSITIVE_LANE_CONSTANT`
    where it keeps 127 (a ReLU's clip at 0).

    Returns
    -------
    tuple
        ``(biases, A, "")`` (int64 array of ``lanes`` values), or ``(None, 0, why)``.
    """
    whys = []
    for a in (LANE_CONSTANT, POSITIVE_LANE_CONSTANT):
        biases, why = lane_biases(epilogue, fold_constants(lanes, a))
        if biases is not None:
            return biases, a, ""
        whys.append(why)
    if whys[0] == whys[1] and "keep" not in whys[0]:
        return None, 0, whys[0]
    return None, 0, (f"the producer's epilogue stages keep neither {LANE_CONSTANT} nor "
                     f"{POSITIVE_LANE_CONSTANT} ({whys[0]}; {whys[1]})")


def handed_lane_constant(pg: PackedGemm, layout, constants: Sequence[int]
                         ) -> Tuple[Optional[int], str]:
    """The other lanes' constant ``A`` when the packed data a producer hands over holds
    :func:`fold_constants` ``(L, A)`` at every spare lane of ``pg`` (:func:`fold_lanes`): the
    tensor in ``layout`` (a channel-padded activation of the stock blocked arrangement,
    :class:`vta_ext.packing.BlockedActivation`, which ``pg``'s data layout must equal) with
    ``constants`` in its padded channels (one each, in channel order). Then the bias folds into
    those lanes with no host pass (:func:`fold_layouts` with ``handed=A``).

    Checked on the packed tensor itself: the producer's padded channels packed by the blocked
    layout of the padded width, read at every position of every lane.

    Returns
    -------
    tuple
        ``(A, "")``, or ``(None, why)`` (a phrase for the build report).
    """
    import dataclasses as _dc

    from vta_ext.packing import as_blocked, same_arrangement

    lanes = fold_lanes(pg)
    if isinstance(lanes, str):
        return None, lanes
    dop = pg.operands[lanes.data]
    blocked = as_blocked(layout)
    if blocked is None or not same_arrangement(blocked, dop.host):
        return None, "its data layout is not the producer's packed one"
    n, c, h, w = blocked.src_shape
    cp = blocked.padded[1]
    consts = np.asarray(constants, dtype=np.int64)
    if consts.size != cp - c:
        return None, f"{consts.size} lane constants for {cp - c} padded channels"
    probe = np.zeros((n, cp, h, w), dtype=np.int8)
    probe[:, c:] = consts.astype(np.int8)[None, :, None, None]
    packed = _dc.replace(blocked, c=cp).pack_numpy(probe).ravel()
    held = [np.unique(packed[_lane_flat(dop.host.shape, lanes, j)]) for j in range(lanes.lanes)]
    want_first = held[0].tolist() == [FIRST_LANE_CONSTANT]
    others = {int(v) for vals in held[1:] for v in vals}
    a = next(iter(others)) if len(others) == 1 else LANE_CONSTANT
    if not want_first or len(others) > 1 or (others and not 2 <= abs(a) <= 128):
        text = ", ".join("/".join(str(int(v)) for v in vals) for vals in held)
        return None, (f"its {lanes.lanes} spare lanes hold {text} of the producer's lane "
                      f"constants, not ({FIRST_LANE_CONSTANT}, A, A, ...)")
    return a, ""


# ------------------------------------------------------------------------------------ lanes
@dataclass(frozen=True)
class FoldLanes:
    """The spare lanes of a packed GEMM that can carry a folded bias (:func:`fold_lanes`).

    Attributes
    ----------
    data, weight : str
        The operand roles (``"A"``/``"B"``) of the data tensor (gets the constants) and of the
        weight tensor (gets the digits).
    data_shape : tuple of int
        The shape of the data constants: the extent of every packed data dim that only reduction
        loops index, 1 elsewhere (broadcast over the rest).
    data_index : tuple of tuple of int
        Per lane, the position of its constant in ``data_shape``.
    weight_dims : tuple of int
        The packed weight dims that reduction loops index (the others see no reduction loop).
    weight_index : tuple of tuple of int
        Per lane, the values of ``weight_dims`` at its digit's reduction point.
    weight_real : tuple of int
        The values of ``weight_dims`` at the first reduction point (a real one): where the
        channel of each weight position is read.
    """

    data: str
    weight: str
    data_shape: Tuple[int, ...]
    data_index: Tuple[Tuple[int, ...], ...]
    weight_dims: Tuple[int, ...]
    weight_index: Tuple[Tuple[int, ...], ...]
    weight_real: Tuple[int, ...]

    @property
    def lanes(self) -> int:
        """How many spare lanes carry the bias."""
        return len(self.data_index)

    def __repr__(self) -> str:
        lo, hi = fold_range(self.lanes)
        return f"FoldLanes({self.lanes} lanes, data {self.data}, bias {lo:,}..{hi:,})"


def fold_lanes(pg: PackedGemm) -> Union[FoldLanes, str]:
    """The spare lanes of ``pg`` that can carry a folded bias, or why there are none (a phrase
    for the build report). Computed once per program (``pg.memo``)."""
    return pg.memo("fold_lanes", lambda: _fold_lanes(pg))


def _dim_kind(dim, reduction: set) -> str:
    """``"red"`` (only reduction loops index the dim), ``"free"`` (none does) or ``"mixed"``."""
    names = {v for v, _ in dim.terms}
    if names and names <= reduction:
        return "red"
    return "mixed" if names & reduction else "free"


def _dim_values(dim, values: Dict[str, np.ndarray]) -> np.ndarray:
    """The index of a packed dim that only reduction loops index, at every reduction point."""
    out = np.full(next(iter(values.values())).shape, dim.const, dtype=np.int64)
    for v, c in dim.terms:
        out = out + c * values[v]
    return out


def _fold_lanes(pg: PackedGemm) -> Union[FoldLanes, str]:
    found = _lane_classes(pg)
    if isinstance(found, str):
        return found
    cl = found
    chosen = [(points[0], c) for c, points in cl["candidates"] if points]
    if not chosen:
        if cl["dops"].device_padded and not cl["real_reads"].all():
            return "the input DMA pads every read of the spare input lanes"
        return "the input's spare lanes are shared with real ones"
    return _lanes_at(cl, sorted(chosen))


def _lanes_at(cl: dict, chosen: Sequence[Tuple[int, int]]) -> FoldLanes:
    """The :class:`FoldLanes` of the ``(digit point, class)`` pairs ``chosen`` (in lane order)."""
    dops, ddims, dkinds, classes = cl["dops"], cl["ddims"], cl["dkinds"], cl["classes"]
    shape = tuple(dops.dims[i].extent if k == "red" else 1 for i, k in enumerate(dkinds))
    data_index = []
    for _, c in chosen:
        pos = [0] * len(dops.dims)
        for i, v in zip(ddims, classes[c]):
            pos[i] = int(v)
        data_index.append(tuple(pos))
    wvals = cl["wvals"]
    return FoldLanes(cl["data"], cl["weight"], shape, tuple(data_index), cl["wdims"],
                     tuple(tuple(int(v) for v in wvals[p]) for p, _ in chosen),
                     tuple(int(v) for v in wvals[0]))


def _lane_classes(pg: PackedGemm) -> Union[dict, str]:
    """The spare classes of ``pg``'s data operand and, per class (in order of its first
    reduction point), every reduction point of it whose reads the input DMA never pads (the
    places its digit can sit), with what :func:`_lanes_at` and :func:`_gathered_lanes` need; or
    why no class can carry the bias. Computed once per program (``pg.memo``)."""
    return pg.memo("fold_lane_classes", lambda: _find_lane_classes(pg))


def _find_lane_classes(pg: PackedGemm) -> Union[dict, str]:
    emb = pg.embedding
    wl = emb.workload
    if not any(wl.reduction[wl.dims.index(d)] for d in emb.padding):
        return "no spare reduction lanes (the reduction is not padded)"
    roles = {pg.operands[r].tensor: r for r in "AB"}
    data, weight = roles[wl.inputs[0].name], roles[wl.inputs[1].name]
    red_loops = [lp for lp in pg.loops if lp.reduction]
    names = [lp.name for lp in red_loops] + [AXIS_PREFIX + "z"]
    extents = [lp.extent for lp in red_loops] + [pg.axes["z"]]
    grid = np.indices(extents).reshape(len(extents), -1)
    values = dict(zip(names, grid.astype(np.int64)))
    # the operator's reduction index of every reduction point; spare where one is beyond its extent
    zfac = emb.axis("z").factors
    spare = np.zeros(grid.shape[1], dtype=bool)
    for d, ext, red in zip(wl.dims, wl.extents, wl.reduction):
        if not red:
            continue
        f = emb.walked.get(d)
        if f is None:
            index = values[d]
        else:
            i = next(i for i, g in enumerate(zfac) if g.dim == d)
            inner = math.prod(g.size for g in zfac[i + 1:])
            digit = (values[AXIS_PREFIX + "z"] // inner) % f.size
            index = values[d] * f.size * f.stride + digit * f.stride
            if f.stride > 1:
                index = index + values[f"{d}_sub"]
        spare |= index >= ext
    if not spare.any():
        return "no spare reduction lanes"
    reduction = set(names)
    # the weight operand: every packed position of a reduction point belongs to it alone
    wops = pg.operands[weight]
    wkinds = [_dim_kind(d, reduction) for d in wops.dims]
    if "mixed" in wkinds:
        return "the weights' packed dims mix reduction and output loops"
    wdims = tuple(i for i, k in enumerate(wkinds) if k == "red")
    wvals = (np.stack([_dim_values(wops.dims[i], values) for i in wdims], axis=1) if wdims
             else np.zeros((grid.shape[1], 0), dtype=np.int64))
    if len(np.unique(wvals, axis=0)) != grid.shape[1]:
        return "reduction points share packed weight positions"
    # the data operand: classes of positions by the dims only reduction loops index
    dops = pg.operands[data]
    dkinds = [_dim_kind(d, reduction) for d in dops.dims]
    ddims = [i for i, k in enumerate(dkinds) if k == "red"]
    if not ddims:
        return "no packed input dim is indexed by the reduction alone"
    dvals = np.stack([_dim_values(dops.dims[i], values) for i in ddims], axis=1)
    classes, first, inverse = np.unique(dvals, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    real_reads = np.bincount(inverse[~spare], minlength=len(classes))
    free_ranges = _free_ranges(pg, reduction)
    candidates = []
    for c in np.argsort(first, kind="stable"):
        if real_reads[c]:
            continue                       # a real point reads this class too
        candidates.append((int(c), [int(p) for p in np.flatnonzero(inverse == c)
                                    if _stored_at(dops, p, values, free_ranges)]))
    return dict(data=data, weight=weight, dops=dops, ddims=ddims, dkinds=dkinds, classes=classes,
                wdims=wdims, wvals=wvals, values=values, free=free_ranges, real_reads=real_reads,
                candidates=candidates)


def _free_ranges(pg: PackedGemm, reduction: set) -> Dict[str, int]:
    """The extent of every loop variable that is not a reduction loop (free loops and the x and
    y axes)."""
    out = {lp.name: lp.extent for lp in pg.loops if lp.name not in reduction}
    out.update({AXIS_PREFIX + a: n for a, n in pg.axes.items() if AXIS_PREFIX + a not in reduction})
    return out


def _stored_at(op, p: int, values: Dict[str, np.ndarray], free: Dict[str, int]) -> bool:
    """Whether every read of operand ``op`` at reduction point ``p`` lies in the stored (DRAM)
    part of the dims the input DMA pads (else the DMA reads zeros, not the lane constant)."""
    for d in op.dims:
        if not d.padded:
            continue
        lo = hi = d.const
        for v, c in d.terms:
            if v in values:
                lo += c * int(values[v][p])
                hi += c * int(values[v][p])
            else:
                span = c * (free[v] - 1)
                lo, hi = lo + min(0, span), hi + max(0, span)
        if lo < d.stored_lo or hi >= d.stored_lo + d.stored_extent:
            return False
    return True


# ------------------------------------------------------------------------------------ decision
def fold_epilogue(epilogue: Sequence[tuple]) -> Tuple[tuple, ...]:
    """The epilogue a folded program runs: ``epilogue`` without its leading ``("bias",)`` stage.

    Raises
    ------
    ValueError
        If the epilogue does not start with the bias.
    """
    from vta_ext.templates.epilogue import normalize_epilogue

    epilogue = normalize_epilogue(epilogue)
    if not epilogue or epilogue[0] != ("bias",):
        raise ValueError(f"epilogue {list(epilogue)}: only a leading ('bias',) stage can be folded")
    return epilogue[1:]


def fold_decision(pg: PackedGemm, kind: str, epilogue: Sequence[tuple], bias: Optional[np.ndarray],
                  weight_constant: bool, strict: bool = False,
                  handed: Optional[int] = None) -> Tuple[int, str]:
    """Whether the bias of an operator folds into ``pg``'s spare lanes: ``(lanes, sentence)``.

    Parameters
    ----------
    pg : PackedGemm
    kind : str
        The operator kind (only :data:`FOLD_KINDS` fold).
    epilogue : sequence of tuple
        The operator's epilogue; without a ``("bias",)`` stage the answer is ``(0, "")``.
    bias : numpy.ndarray or None
        The bias values when they are a build-time constant, else None (runtime data).
    weight_constant : bool
        Whether the weights are a build-time constant (the digits are written at build time).
    strict : bool
        ``csp-strict``: never fold (its programs equal the stock template's).
    handed : int or None
        The other lanes' constant ``A`` when the producer hands the data over with the lane
        constants in every spare lane (:func:`handed_lane_constant`): the fold takes every
        spare lane and no host pass writes them.

    Returns
    -------
    tuple
        ``(lanes, "bias folded into N spare reduction lanes (...)")`` or
        ``(0, "bias kept on the ALU: <why>")``.
    """
    lanes, why = fold_fits(pg, kind, epilogue, bias, weight_constant, strict, handed)
    if not lanes:
        return 0, why
    if handed is not None:
        lo, hi = fold_range(lanes, handed)
        return lanes, (f"bias folded into {lanes} spare reduction lane(s) (holds {lo:,}..{hi:,}), "
                       f"their constants ({FIRST_LANE_CONSTANT}, {handed} x{lanes - 1}) written "
                       "by the producer into its padded channels: no host pass")
    fits = [(f, d) for f, d in fold_forms(pg) if _outside(bias, f.lanes, "") is None]
    f, d = min(fits, key=lambda fd: fd[1].copied)
    lo, hi = fold_range(f.lanes)
    note = fold_form_note(pg, f.lanes)
    return f.lanes, (f"bias folded into {f.lanes} spare reduction lane(s) "
                     f"(holds {lo:,}..{hi:,})" + (f", {note}" if note else ""))


def fold_fits(pg: PackedGemm, kind: str, epilogue: Sequence[tuple], bias: Optional[np.ndarray],
              weight_constant: bool, strict: bool = False,
              handed: Optional[int] = None) -> Tuple[int, str]:
    """Whether the bias of an operator folds into ``pg``'s spare lanes at all, without choosing
    the form (:func:`fold_forms`) that :func:`fold_decision` takes: ``(lanes, "")`` with the
    number of every spare lane (:func:`fold_lanes`), or :func:`fold_decision`'s own
    ``(0, "bias kept on the ALU: <why>")`` (or ``(0, "")`` without a bias stage).

    It needs no lane subset (:func:`_gathered_lanes`): every form's lanes are some of the spare
    lanes, and :func:`fold_range` grows with the number of lanes, so a bias fits some form
    exactly when it fits every spare lane (the first form). Parameters as
    :func:`fold_decision`.
    """
    from vta_ext.templates.epilogue import has_bias, normalize_epilogue

    epilogue = normalize_epilogue(epilogue)
    if not has_bias(epilogue):
        return 0, ""
    why = _not_a_constant_leading_bias(kind, epilogue, bias, strict)
    if why is None and not weight_constant:
        why = "the weights are runtime data"
    elif why is None:
        lanes = fold_lanes(pg)
        k = pg.operands[lanes.weight].host.src_shape[0] if isinstance(lanes, FoldLanes) else None
        if isinstance(lanes, str):
            why = lanes
        elif np.asarray(bias).size != k and isinstance(
                _digit_layout(pg.operands[lanes.weight].host, np.asarray(bias).size), str):
            why = _digit_layout(pg.operands[lanes.weight].host, np.asarray(bias).size)
        else:
            why = _outside(bias, lanes.lanes, f"the {lanes.lanes} spare lane(s) hold",
                           LANE_CONSTANT if handed is None else handed)
            if why is None:
                return lanes.lanes, ""
    return 0, f"bias kept on the ALU: {why}"


def fold_form_note(pg: PackedGemm, lanes: int) -> str:
    """The build report's words on the lanes a fold into ``lanes`` lanes takes: the subset the
    gather writes, or why not that subset (a bias it does not hold), or why the lane constants
    take a ``where`` pass (:func:`_gathered_lanes` found no subset); "" when the layout's own
    copies write every lane."""
    forms = fold_forms(pg)
    full = forms[0][0]
    if len(forms) == 1:
        why = pg.memo("fold_gather_why", lambda: "")
        return f"its lane constants take a where pass over the packed input: {why}" if why else ""
    if lanes != full.lanes:
        return (f"the {lanes} of {full.lanes} lanes whose constants the stencil gather reads "
                f"from a column appended to its source")
    sub = forms[1][0]
    lo, hi = fold_range(sub.lanes)
    return f"not the {sub.lanes} lanes the gather writes: they hold {lo:,}..{hi:,} only"


def fold_forms(pg: PackedGemm) -> Tuple[Tuple[FoldLanes, HostLayout], ...]:
    """The ways the lane constants of ``pg``'s fold can be written, each ``(lanes, data layout)``:
    every spare lane (:func:`fold_lanes`, written by :func:`_gathered` or a ``set`` step, or by
    :func:`_gathered_lanes` when it reaches them all with fewer host bytes), then, when the gather
    writes a subset of them with fewer host bytes (:func:`_gathered_lanes`), that subset. Their lane counts differ, so a workload's ``bias_lanes`` names one. Computed once per
    program (``pg.memo``).

    Raises
    ------
    ValueError
        If ``pg`` has no lane for the bias (:func:`fold_lanes`).
    """
    return pg.memo("fold_forms", lambda: _fold_forms(pg))


#: the most input channels (a conv2d's data, NCHW) on which :func:`_fold_forms` looks for the lane
#: subset a stencil gather can write (:func:`_gathered_lanes`): the stems and thin layers it is for
#: have few; on wide layers (ResNeXt-50's 128-channel grouped convs: 0.3-0.9 s a candidate) its
#: check costs seconds of a cold build
GATHER_CHECK_CHANNELS = 16


def _full_form(pg: PackedGemm) -> Tuple[FoldLanes, HostLayout]:
    """The first form of :func:`fold_forms` before the lane subset is looked for: every spare
    lane, written by :func:`_fold_data_layout`. Computed once per program (``pg.memo``)."""
    return pg.memo("fold_full_form", lambda: (fold_lanes(pg), _fold_data_layout(pg)))


def _gather_check_skipped(pg: PackedGemm) -> bool:
    """Whether :func:`_fold_forms` does not look for the lane subset on ``pg``'s data: more than
    :data:`GATHER_CHECK_CHANNELS` input channels."""
    src = pg.operands[fold_lanes(pg).data].host.src_shape
    return len(src) == 4 and src[1] > GATHER_CHECK_CHANNELS


def _fold_forms(pg: PackedGemm):
    forms = [_full_form(pg)]
    full = forms[0][0]
    if all(st[0] != "set" for st in forms[0][1].steps):
        return tuple(forms)          # the copies the layout makes write every lane already
    src = pg.operands[full.data].host.src_shape
    sub = (f"the lane subset is looked for only on inputs of at most {GATHER_CHECK_CHANNELS} "
           f"channels (stems, thin layers; this one has {src[1]}): the check follows every lane "
           "position, seconds on wide layers" if _gather_check_skipped(pg)
           else _gathered_lanes(pg, full))
    if isinstance(sub, str):
        why = sub
    elif sub[1].copied >= forms[0][1].copied:
        why = f"the gather's {sub[0].lanes} lanes copy no fewer bytes"
    else:
        why = ""
        if sub[0].lanes == full.lanes:
            forms[0] = sub           # the gather writes every lane: the where pass is not needed
        else:
            forms.append(sub)
    pg.memo("fold_gather_why", lambda: why)
    return tuple(forms)


def _form(pg: PackedGemm, lanes: Optional[int]) -> Tuple[FoldLanes, HostLayout]:
    """The form of :func:`fold_forms` with ``lanes`` lanes (None: every spare lane)."""
    forms = fold_forms(pg)
    if lanes is None:
        return forms[0]
    for f in forms:
        if f[0].lanes == lanes:
            return f
    raise ValueError(f"{pg.embedding.mapping_str()}: no fold into {lanes} lanes (it has "
                     f"{', '.join(str(f.lanes) for f, _ in forms)})")


def _not_a_constant_leading_bias(kind: str, epilogue, bias, strict: bool) -> Optional[str]:
    """Why the bias of an operator of ``kind`` with the (normalised) ``epilogue`` cannot become
    part of the GEMM (folded or by a GEMM of its own), or None: it must be a constant
    per-output-channel bias in the first stage, outside ``csp-strict``."""
    if strict:
        return "csp-strict keeps the stock template's program"
    if kind not in FOLD_KINDS:
        return f"a {kind}'s bias is not per output channel of the weights"
    if epilogue[0] != ("bias",):
        return "the bias is not the epilogue's first stage"
    if bias is None:
        return "bias is runtime data"
    return None


def _outside(bias, lanes: int, holder: str, lane_constant: int = LANE_CONSTANT) -> Optional[str]:
    """Why ``bias`` does not fit :func:`fold_range` ``(lanes, lane_constant)`` (``holder`` names
    what holds the range), or None."""
    lo, hi = fold_range(lanes, lane_constant)
    b = np.asarray(bias, dtype=np.int64)
    bmin, bmax = int(b.min()), int(b.max())
    if bmin < lo or bmax > hi:
        return f"bias {bmin:,}..{bmax:,} outside the {lo:,}..{hi:,} that {holder}"
    return None


def fold_layouts(pg: PackedGemm, bias, lanes: Optional[int] = None,
                 handed: Optional[int] = None) -> Dict[str, HostLayout]:
    """Tensor name -> host layout of the data and weight operands with the bias folded in: the
    operands' own layouts plus a ``("set", ...)`` step that writes the lane constants into the
    data and the digits of ``bias`` (one value per output channel) into the weights.

    ``lanes`` (a workload's ``bias_lanes``) picks the form of :func:`fold_forms`; None: every
    spare lane. ``handed``: the producer writes the lane constants ``(1, handed, ...)``
    (:func:`handed_lane_constant`): the data keeps its own layout and the digits are those of
    that constant. Computed once per program, lanes, constant and bias values (``pg.memo``).

    Raises
    ------
    ValueError
        If ``pg`` has no lane for the bias (:func:`fold_lanes`), no form of ``lanes`` lanes, or
        a value is out of range.
    """
    b = np.ascontiguousarray(np.asarray(bias, dtype=np.int64).ravel())
    return pg.memo(("fold_layouts", lanes, handed, b.tobytes()),
                   lambda: _fold_layouts(pg, b, lanes, handed))


def fold_data_layout(pg: PackedGemm, lanes: Optional[int] = None) -> HostLayout:
    """The host layout of the data operand with the bias folded in (it does not depend on the bias
    values): its own steps with the lane constants written by the copies they already make
    (:func:`_gathered`), or followed by a ``("set", ...)`` step, whichever writes fewer elements
    (:attr:`~.relayout.HostLayout.copied`); with ``lanes`` (a workload's ``bias_lanes``), the
    layout of the form of :func:`fold_forms` with that many lanes.

    Raises
    ------
    ValueError
        If ``pg`` has no lane for the bias (:func:`fold_lanes`) or no form of ``lanes`` lanes.
    """
    return _form(pg, lanes)[1]


def _fold_data_layout(pg: PackedGemm) -> HostLayout:
    """Every spare lane's data layout: :func:`_gathered` or a ``set`` step, fewer copies first.

    Raises
    ------
    ValueError
        If ``pg`` has no lane for the bias (:func:`fold_lanes`).
    """
    lanes = fold_lanes(pg)
    if isinstance(lanes, str):
        raise ValueError(f"cannot fold the bias into {pg.embedding.mapping_str()}: {lanes}")
    dop = pg.operands[lanes.data]
    consts = tuple(int(v) for v in fold_constants(lanes.lanes))
    forms = [dop.host.steps + (("set", lanes.data_shape, lanes.data_index, consts, "int8"),)]
    gathered = _gathered(dop.host, lanes, consts)
    if gathered is not None:
        forms.insert(0, gathered)
    layouts = [HostLayout(dop.host.src_shape, f, dop.host.name) for f in forms]
    return min(layouts, key=lambda h: h.copied)


def _strides(shape: Sequence[int]) -> np.ndarray:
    """The row-major element strides of ``shape``."""
    return np.cumprod((1,) + tuple(shape[:0:-1]), dtype=np.int64)[::-1]


def _lane_flat(shape: Sequence[int], lanes: FoldLanes, j: int) -> np.ndarray:
    """Every packed data position of lane ``j`` (its class, at every value of the other dims) as
    row-major flat indices into ``shape``: an ``(n,)`` int64 array."""
    flat = np.zeros((), np.int64)
    for v, e, s, stride in zip(lanes.data_index[j], lanes.data_shape, shape, _strides(shape)):
        axis = np.arange(v, v + 1) if e > 1 or s == 1 else np.arange(s)
        flat = np.add.outer(flat, axis.astype(np.int64) * stride)
    return flat.ravel()


def _coordinate(flat: np.ndarray, shape: Sequence[int], axis: int) -> np.ndarray:
    """Coordinate ``axis`` of the row-major flat indices ``flat`` into ``shape``."""
    return flat // int(_strides(shape)[axis]) % shape[axis]


def _back(flat: np.ndarray, step, before, after) -> np.ndarray:
    """Flat indices of a step's output mapped to its input, for a bijective view or transpose:
    a reshape keeps them; a transpose (``after[i] = before[perm[i]]``) moves coordinate ``i`` to
    ``perm[i]``."""
    if step[0] == "reshape":
        return flat
    strides = _strides(before)
    out = np.zeros_like(flat)
    for i, p in enumerate(step[1]):
        if after[i] > 1:
            out += _coordinate(flat, after, i) * strides[p]
    return out


def _gathered(host: HostLayout, lanes: FoldLanes, consts: Tuple[int, ...]):
    """The steps of ``host`` with the lane constants written by the copies it already makes, or
    None when they cannot be (then a ``set`` step writes them).

    From the packed end the lane positions are followed back through reshapes and transposes (one
    to one) to the last step that creates data:

    * a ``pad`` of one axis's end whose padding holds every position of a lane at one index of
      that axis (fused-crs: the reduction pad of 147 -> 160): it becomes a ``concat`` of the lane
      constants and zeros, writing exactly what the pad wrote;
    * a stencil ``unroll`` whose loops place every position of a lane at the loop points of one
      pattern (fused-rs: the taps beyond 5 x 20 of the row unroll): the ``take`` reads the two
      constants (:func:`fold_constants`'s two values) from a ``concat`` onto its source, which
      stands in for a pad of that axis's end just before it, or is a step of its own (a pass over
      the source, which the host model charges).
    """
    shapes, steps = host.shapes, host.steps
    t = _creating_step(host)
    if t < 0:
        return None
    st, before, after = steps[t], shapes[t], shapes[t + 1]
    # the forms below need one of these steps; decide before following the (many) lane points
    if st[0] == "pad":
        padded = [a for a, w in enumerate(st[1]) if any(w)]
        if len(padded) != 1 or st[1][padded[0]][0]:
            return None
    elif st[0] != "unroll" or len(st) > 5:
        return None
    pts = _lane_points(host, lanes, t)
    if st[0] == "pad":
        a = padded[0]
        values = [0] * st[1][a][1]
        rest = math.prod(after) // after[a]
        for p, c in zip(pts, consts):
            at = np.unique(_coordinate(p, after, a))
            if len(at) != 1 or at[0] < before[a] or len(p) != rest:
                return None
            values[int(at[0]) - before[a]] = c
        return steps[:t] + (("concat", a, tuple(values), "int8"),) + steps[t + 1:]
    axis, k = st[1], len(st[2])
    rest = math.prod(after) // math.prod(st[2])
    distinct = tuple(dict.fromkeys(consts))
    redirect = []
    for p, c in zip(pts, consts):
        pattern = []
        for i, e in enumerate(st[2]):
            vals = np.unique(_coordinate(p, after, axis + i))
            if len(vals) == 1:
                pattern.append(int(vals[0]))
            elif len(vals) == e:
                pattern.append(None)
            else:
                return None
        if len(p) != rest * math.prod(e for v, e in zip(pattern, st[2]) if v is None):
            return None
        redirect.append((tuple(pattern), distinct.index(c)))
    # the constants onto the take's source (in place of a pad of its end just before it)
    prev = steps[t - 1] if t else None
    gather = st + (tuple((pat, before[axis] + v) for pat, v in redirect),)
    if prev is not None and prev[0] == "pad" and all(
            not any(w) for a, w in enumerate(prev[1]) if a != axis) and not prev[1][axis][0]:
        pad = ("concat", axis, (0,) * prev[1][axis][1] + distinct, "int8")
        forms = [steps[:t - 1] + (pad, gather) + steps[t + 1:]]
    else:
        forms = [steps[:t] + (("concat", axis, distinct, "int8"), gather) + steps[t + 1:]]
    # or as whole rows of an earlier, smaller tensor whose axis the reshape before the take fuses
    # into the take's (outermost): the take reads the first element of each row
    rows = _rows_before(host, t, axis, distinct)
    if rows is not None:
        prefix, inner = rows
        gather = st + (tuple((pat, before[axis] + v * inner) for pat, v in redirect),)
        forms.append(prefix + (gather,) + steps[t + 1:])
    return min(forms, key=lambda f: HostLayout(host.src_shape, f).copied)


def _creating_step(host: HostLayout) -> int:
    """The index of the last step of ``host`` that creates data (not a reshape, a transpose or
    an identity), -1 if none."""
    shapes, steps = host.shapes, host.steps
    t = len(steps) - 1
    while t >= 0 and (steps[t][0] in ("reshape", "permute") or _is_identity(steps[t], shapes[t])):
        t -= 1
    return t


def _lane_points(host: HostLayout, lanes: FoldLanes, t: int):
    """Each lane's points at step ``t``'s output (flat indices), one lane at a time, so that a
    layout that fails on its first lane costs one lane's points (they are millions on large
    layers)."""
    shapes, steps = host.shapes, host.steps
    for j in range(lanes.lanes):
        p = _lane_flat(host.shape, lanes, j)
        for u in range(len(steps) - 1, t, -1):
            if not _is_identity(steps[u], shapes[u]):
                p = _back(p, steps[u], shapes[u], shapes[u + 1])
        yield p


#: the values of the two probe sources :func:`_gathered_lanes` packs, and the first of the
#: markers it writes in place of the lane constants (one per lane; all distinct int8 values)
_PROBES, _MARK = (0, 7), 10


def _gathered_lanes(pg: PackedGemm, lanes: FoldLanes) -> Union[Tuple[FoldLanes, HostLayout], str]:
    """The lanes of ``lanes`` that a stencil unroll's ``take`` can read from a constant block
    appended to its source, and the data layout that writes them; or why there are none.

    Where :func:`_gathered` needs every lane to cover all positions of the axes the unroll does
    not touch (a 3-channel stem padded to 4 channels has lanes that are one channel's taps, and
    the spare channel), here a lane may sit at some positions of the other axes only (one input
    channel): per pattern of unroll loop values, one column appended to the unroll axis holds each
    lane's constant at that lane's positions of the other axes. The column is appended by a
    ``concat`` of the *unpadded* source when a ``pad`` comes just before the take (the pad's zeros
    at that axis's end then come with the column, so the pad writes one column more), else of the
    take's source. A lane whose positions lie in a padded part of the other axes (the spare
    channel, the padded border rows) is dropped, unless its digit can sit at a reduction point
    whose reads avoid them.

    It is checked on the layout itself, not derived: the layout, with a distinct marker per lane,
    packs two constant probe sources (:data:`_PROBES`); a lane is kept at the first reduction
    point of its class (:func:`_lane_classes`) at whose every read both packings hold its marker;
    and every packed position where they differ from the packings of the data's own layout must
    belong to a spare class (no real reduction point reads it). The kept lanes (in lane order)
    get :func:`fold_constants`, dropped ones 0."""
    cl = _lane_classes(pg)
    host = pg.operands[lanes.data].host
    shapes, steps = host.shapes, host.steps
    t = _creating_step(host)
    if t < 0 or steps[t][0] != "unroll" or len(steps[t]) > 5:
        return "its layout has no stencil unroll whose take could read them"
    if lanes.lanes > 127 - _MARK:
        return f"{lanes.lanes} lanes, more than the probe's markers"
    st, before, after = steps[t], shapes[t], shapes[t + 1]
    axis, ext = st[1], st[2]
    other = [i for i in range(len(after)) if not axis <= i < axis + len(ext)]
    found: Dict[tuple, list] = {}
    for j, p in enumerate(_lane_points(host, lanes, t)):
        pattern = []
        for i, e in enumerate(ext):
            seen = np.flatnonzero(np.bincount(_coordinate(p, after, axis + i), minlength=e))
            pattern.append(int(seen[0]) if len(seen) == 1 else None if len(seen) == e else False)
        if False not in pattern:
            found.setdefault(tuple(pattern), []).append((j, p))
    # a pattern's redirection reaches every position of the other axes at its loop points: only
    # one whose lanes fill that region can leave every real position alone (checked below)
    region = math.prod(after[i] for i in other)
    groups = {pattern: [(j, np.stack([_coordinate(p, after, i) for i in other], axis=1))
                        for j, p in members]
              for pattern, members in found.items()
              if sum(len(p) for _, p in members) == region * math.prod(
                  e for v, e in zip(pattern, ext) if v is None)}
    if not groups:
        return "no lane is one pattern of the unroll's loops over the whole of the other axes"
    prev = steps[t - 1] if t else None
    padded = prev is not None and prev[0] == "pad"
    src = shapes[t - 1] if padded else before
    lo = np.array([prev[1][i][0] if padded else 0 for i in range(len(before)) if i != axis])
    zeros = prev[1][axis][1] if padded else 0
    limit = np.array([s for i, s in enumerate(src) if i != axis])
    probes = [np.full(host.src_shape, v, dtype=np.int8) for v in _PROBES]

    def marked(patterns, whole: bool = False):
        """The layout that redirects ``patterns`` to the appended columns, a marker per lane
        (``whole``: a marker per column, in all of it): ``(block, layout of a block)``."""
        n = zeros + len(patterns)
        block = np.zeros(src[:axis] + (n,) + src[axis + 1:], dtype=np.int64)
        for g, pattern in enumerate(patterns):
            col = np.moveaxis(block, axis, 0)[zeros + g]
            if whole:
                col[...] = _MARK + g
                continue
            for j, coords in groups[pattern]:
                c = coords - lo
                inside = ((c >= 0) & (c < limit)).all(axis=1)
                col[tuple(c[inside].T)] = _MARK + j
        gather = st + (tuple((pat, before[axis] + g) for g, pat in enumerate(patterns)),)

        def layout(values: np.ndarray) -> HostLayout:
            return _column_layout(host, t, n, tuple(values.ravel().tolist()), gather)

        return block, layout

    # a pattern whose redirection changes a position some real reduction point reads is out:
    # with a marker per column (none of them a probe value), the positions it reaches hold it
    if len(groups) > 127 - _MARK:
        return f"{len(groups)} unroll patterns, more than the probe's markers"
    block, layout = marked(list(groups), whole=True)
    reached = layout(block).pack_numpy(probes[1]).ravel()
    at = np.flatnonzero(reached >= _MARK)
    real = np.bincount(reached[at] - _MARK, weights=~_spare_positions(cl, at),
                       minlength=len(groups))
    usable = [pattern for g, pattern in enumerate(groups) if not real[g]]
    if not usable:
        return "every pattern's column would reach positions real reduction points read"
    block, layout = marked(usable)
    got = [layout(block).pack_numpy(x).ravel() for x in probes]
    chosen = sorted(((points[0], c) for c, points in cl["candidates"] if points))
    points = dict(cl["candidates"])
    kept, reads = [], _point_reads(cl)
    for j, (_, c) in enumerate(chosen[:lanes.lanes]):
        at = next((p for p in points[c] if all((g[reads(p)] == _MARK + j).all() for g in got)),
                  None)
        if at is not None:
            kept.append((j, at, c))
    if not kept:
        return "no digit's reads see only the appended column"
    consts = fold_constants(len(kept))
    values = np.zeros_like(block)
    for (j, _, _), v in zip(kept, consts):
        values[block == _MARK + j] = v
    return _lanes_at(cl, [(p, c) for _, p, c in kept]), layout(values)


def _column_layout(host: HostLayout, t: int, n: int, values: tuple, gather) -> HostLayout:
    """The layout of :func:`_gathered_lanes`: ``host`` with a block of ``n`` columns (``values``,
    the whole block) appended to the unroll axis of its stencil unroll (step ``t``) before the
    unroll's ``take``, replaced by ``gather`` (the unroll with its redirections): to the unpadded
    source when a ``pad`` comes just before (the pad then leaves that axis's end alone: the block
    holds its zeros first), else to the take's source."""
    steps = host.steps
    prev = steps[t - 1] if t else None
    axis = steps[t][1]
    concat = ("concat", axis, values, "int8", n)
    if prev is not None and prev[0] == "pad":
        widths = tuple((w[0], 0) if i == axis else w for i, w in enumerate(prev[1]))
        head = steps[:t - 1] + (concat, ("pad", widths))
    else:
        head = steps[:t] + (concat,)
    return HostLayout(host.src_shape, head + (gather,) + steps[t + 1:], host.name)


def fold_copied_bound(pg: PackedGemm) -> int:
    """A lower bound on the elements the data layout of ``pg``'s fold writes
    (:attr:`~.relayout.HostLayout.copied`), whichever form of :func:`fold_forms` the fold takes,
    without looking for the lane subset (:func:`_gathered_lanes`, which follows every lane
    position).

    The first form (every spare lane) is known (:func:`_full_form`). Without a ``set`` step it is
    the only one. With one, the subset's layout, if there is one, is :func:`_column_layout` of
    some ``n >= z + 1`` columns (``z``: the zeros of the axis end a pad just before the unroll
    wrote, at least one pattern's column) with the unroll's own output: its copies grow with
    ``n`` (the concat's and the pad's outputs do, the steps after the unroll do not change), so
    the layout of ``n = z + 1`` bounds it; the bound is the smaller of the two.

    Raises
    ------
    ValueError
        If ``pg`` has no lane for the bias (:func:`fold_lanes`).
    """
    full = _full_form(pg)[1]
    if all(st[0] != "set" for st in full.steps) or _gather_check_skipped(pg):
        return full.copied
    host = pg.operands[fold_lanes(pg).data].host
    t = _creating_step(host)
    if t < 0 or host.steps[t][0] != "unroll" or len(host.steps[t]) > 5:
        return full.copied               # _gathered_lanes finds no subset there
    prev = host.steps[t - 1] if t else None
    zeros = prev[1][host.steps[t][1]][1] if prev is not None and prev[0] == "pad" else 0
    return min(full.copied, _column_layout(host, t, zeros + 1, (), host.steps[t]).copied)


def _reads(cl: dict, p: int) -> np.ndarray:
    """The flat indices into the stored data operand that reduction point ``p`` reads (at every
    value of the free loops and axes)."""
    return _point_reads(cl)(p)


def _point_reads(cl: dict):
    """:func:`_reads` of ``cl`` as a function of the reduction point: the part of the flat
    indices the free loops and axes give is computed once, each point adds its own offset (the
    indices are affine in the loop variables)."""
    dops, values, free = cl["dops"], cl["values"], cl["free"]
    names = sorted({v for d in dops.dims for v, _ in d.terms if v not in values})
    grid = np.indices([free[v] for v in names]).reshape(len(names), -1)
    at = dict(zip(names, grid.astype(np.int64)))
    base = np.zeros(grid.shape[1], dtype=np.int64)
    offset = []                     # per reduction variable, its coefficient in the flat index
    for d, stride in zip(dops.dims, _strides(dops.stored_shape)):
        base = base + (d.const - d.stored_lo) * int(stride)
        for v, c in d.terms:
            if v in values:
                offset.append((v, c * int(stride)))
            else:
                base = base + c * at[v] * int(stride)

    def reads(p: int) -> np.ndarray:
        return base + sum(k * int(values[v][p]) for v, k in offset)

    return reads


def _spare_positions(cl: dict, flat: np.ndarray) -> np.ndarray:
    """Per stored data position of ``flat``, whether it belongs to a spare class (no real
    reduction point reads it)."""
    dops, ddims, classes = cl["dops"], cl["ddims"], cl["classes"]
    extents = [dops.dims[i].extent for i in ddims]
    spare = np.zeros(math.prod(extents), dtype=bool)
    spare[np.ravel_multi_index(tuple(classes[[c for c, _ in cl["candidates"]]].T), extents)] = True
    shape = dops.stored_shape
    code = np.ravel_multi_index(tuple(_coordinate(flat, shape, i) + dops.dims[i].stored_lo
                                      for i in ddims), extents)
    return spare[code]


def _rows_before(host: HostLayout, t: int, axis: int, values: Tuple[int, ...]):
    """``(steps before step t, inner)``: the steps of ``host`` before step ``t`` with one row per
    value of ``values`` appended (after the last pad) to the axis that one reshape fuses as the
    outermost part of the source axis ``axis`` of step ``t`` (followed through transposes and the
    lead axes of a stencil unroll), so that the source axis gains blocks of ``inner`` elements at
    its end, the i-th block holding ``values[i]``; None when the axis cannot be followed."""
    shapes, steps = host.shapes, host.steps
    a, i, fused = axis, t - 1, None
    while i >= 0:
        st, before, after = steps[i], shapes[i], shapes[i + 1]
        if st[0] == "pad" or _is_identity(st, before):
            break
        if st[0] == "reshape" and fused is None:
            lead = math.prod(after[:a])
            j = next((j for j in range(len(before)) if math.prod(before[:j]) == lead), None)
            if j is None or after[a] % before[j] or math.prod(before[:j + 1]) > lead * after[a]:
                return None
            fused, a = (i, a, before[j]), j
        elif st[0] == "permute":
            a = st[1][a]
        elif st[0] == "unroll" and len(st) == 5 and not st[1] <= a < st[1] + len(st[2]):
            a = a if a < st[1] else a - len(st[2]) + 1
        else:
            return None
        i -= 1
    if fused is None:
        return None
    at, fused_axis, outer = fused
    out = list(steps[:i + 1]) + [("concat", a, tuple(values), "int8")]
    for j in range(i + 1, t):
        if j == at:
            shape = list(shapes[j + 1])
            shape[fused_axis] = shape[fused_axis] // outer * (outer + len(values))
            out.append(("reshape", tuple(shape)))
        else:
            out.append(steps[j])
    return tuple(out), shapes[t][axis] // outer


def _fold_layouts(pg: PackedGemm, bias: np.ndarray, n: Optional[int],
                  handed: Optional[int] = None) -> Dict[str, HostLayout]:
    if handed is None:
        lanes, data = _form(pg, n)
    else:                                  # the producer's padded channels carry the constants
        lanes = fold_lanes(pg)
        if isinstance(lanes, str) or lanes.lanes != (n or lanes.lanes):
            raise ValueError(f"{pg.embedding.mapping_str()}: no fold into {n} handed-over lanes")
        data = pg.operands[lanes.data].host
    dop, wop = pg.operands[lanes.data], pg.operands[lanes.weight]
    digits = fold_digits(bias, lanes.lanes, LANE_CONSTANT if handed is None else handed)
    # the output channel of every packed weight position: the weights' own layout (widened over
    # the padded output channels that get a bias too) of a probe numbered by the first (output
    # channel) dim, 0 on padding
    numbered = _digit_layout(wop.host, bias.size)
    if isinstance(numbered, str):
        raise ValueError(f"{pg.embedding.mapping_str()}: {numbered}")
    src = tuple(numbered.src_shape)
    probe = np.broadcast_to(np.arange(1, src[0] + 1, dtype=np.int32).reshape((-1,) + (1,) * (len(src) - 1)),
                            src)
    packed = numbered.pack_numpy(probe)
    at = [slice(None)] * packed.ndim
    for i, v in zip(lanes.weight_dims, lanes.weight_real):
        at[i] = v
    channel = packed[tuple(at)]                     # over the dims no reduction loop indexes
    free = [i for i in range(packed.ndim) if i not in lanes.weight_dims]
    where = np.nonzero(channel)
    index, vals = [], []
    for j, lane in enumerate(lanes.weight_index):
        for pos, ch in zip(zip(*where), channel[where]):
            full = [0] * packed.ndim
            for i, v in zip(free, pos):
                full[i] = int(v)
            for i, v in zip(lanes.weight_dims, lane):
                full[i] = v
            index.append(tuple(full))
            vals.append(int(digits[ch - 1, j]))
    weight = HostLayout(wop.host.src_shape, wop.host.steps + (
        ("set", tuple(packed.shape), tuple(index), tuple(vals), "int8"),), wop.host.name)
    return {dop.tensor: data, wop.tensor: weight}


def _digit_layout(host: HostLayout, channels: int) -> Union[HostLayout, str]:
    """The weights' layout ``host`` as a layout of ``channels`` output channels: itself, or, for
    more channels than its source has (biases of padded output channels, which write lane
    constants there: :func:`producer_lane_bias`), the same steps on a source that many channels
    wide whose leading ``pad`` pads the output channel that much less; or why it cannot be."""
    src = tuple(host.src_shape)
    extra = channels - src[0]
    if extra == 0:
        return host
    first = host.steps[0] if host.steps else ("",)
    if extra < 0 or first[0] != "pad" or first[1][0][1] < extra:
        return (f"{channels} bias values for {src[0]} output channels (the weights' layout does not "
                f"pad {extra} more output channels first)")
    pads = ((first[1][0][0], first[1][0][1] - extra),) + tuple(first[1][1:])
    return HostLayout((channels,) + src[1:], ((first[0], pads) + tuple(first[2:]),)
                      + tuple(host.steps[1:]), host.name)


# ------------------------------------------------------------------------------------ bias by GEMM
def gemm_bias_decision(pg: PackedGemm, kind: str, epilogue: Sequence[tuple],
                       bias: Optional[np.ndarray], strict: bool = False) -> Tuple[bool, str]:
    """Whether ``pg``'s program can add the operator's bias by one GEMM of a constant block
    (see the module notes): ``(True, sentence)`` or ``(False, "not by a GEMM: <why>")``.

    Parameters
    ----------
    pg : PackedGemm
    kind : str
        The operator kind (only :data:`FOLD_KINDS`: a per-output-channel bias).
    epilogue : sequence of tuple
        The operator's epilogue; without a ``("bias",)`` stage the answer is ``(False, "")``.
    bias : numpy.ndarray or None
        The bias values when they are a build-time constant, else None (runtime data: its
        range is unknown when the program is built).
    strict : bool
        ``csp-strict``: never (its programs equal the stock template's).
    """
    from vta_ext.templates.epilogue import has_bias, normalize_epilogue

    epilogue = normalize_epilogue(epilogue)
    if has_bias(epilogue) and pg.operands["B"].tensor != pg.embedding.workload.inputs[1].name:
        why = (_not_a_constant_leading_bias(kind, epilogue, bias, strict)
               or "the weights are not the GEMM's weight operand (the channel is not on its y axis)")
        return False, f"not by a GEMM: {why}"
    return gemm_bias_lanes_decision(kind, epilogue, bias, pg.axes["z"], strict)


def gemm_bias_lanes_decision(kind: str, epilogue: Sequence[tuple], bias: Optional[np.ndarray],
                             lanes: int, strict: bool = False) -> Tuple[bool, str]:
    """Whether a program whose GEMM has ``lanes`` reduction lanes and the output channel on its
    weight operand's ``y`` axis (a CSP plan's, :func:`gemm_bias_decision`, or a block-diagonal
    grouped conv2d's, :mod:`tvm_csp_embed.depthwise`) can add the operator's bias by one GEMM of
    a constant block: ``(True, sentence)``, ``(False, "not by a GEMM: <why>")``, or
    ``(False, "")`` without a ``("bias",)`` stage. Parameters as :func:`gemm_bias_decision`."""
    from vta_ext.templates.epilogue import has_bias, normalize_epilogue

    epilogue = normalize_epilogue(epilogue)
    if not has_bias(epilogue):
        return False, ""
    why = _not_a_constant_leading_bias(kind, epilogue, bias, strict)
    if why is None:
        why = _outside(bias, lanes, f"{lanes} lanes hold")
        if why is None:
            lo, hi = fold_range(lanes)
            return True, (f"bias added by one GEMM per output tile (a constant block of {lanes} "
                          f"lanes, holds {lo:,}..{hi:,})")
    return False, f"not by a GEMM: {why}"


def gemm_bias_epilogue(epilogue: Sequence[tuple]) -> Tuple[tuple, ...]:
    """The epilogue of a program that adds the bias by a GEMM: ``epilogue`` with its leading
    ``("bias",)`` stage replaced by :data:`~vta_ext.templates.epilogue.GEMM_BIAS_STAGE`.

    Raises
    ------
    ValueError
        If the epilogue does not start with the bias.
    """
    from vta_ext.templates.epilogue import GEMM_BIAS_STAGE

    return (GEMM_BIAS_STAGE,) + fold_epilogue(epilogue)


def gemm_bias_operands(bias_packed: np.ndarray, lanes: int) -> Tuple[np.ndarray, np.ndarray]:
    """The two operands of the bias GEMM from the packed bias (:meth:`~.plan.PackedGemm.bias_layout`,
    its last two dims the ``x`` and ``y`` lanes): ``(row, digits)``, the constant row
    (``(x, lanes)`` int8, :func:`fold_constants` on every ``x`` lane) and the digit tiles
    (the packed bias's shape without the ``x`` lanes, then ``lanes``; int8, :func:`fold_digits`).

    Raises
    ------
    ValueError
        If the bias differs between ``x`` lanes or a value is out of :func:`fold_range`.
    """
    b = np.asarray(bias_packed)
    first = b[..., :1, :]
    if not (b == first).all():
        raise ValueError("the packed bias differs between x lanes: not a per-output-channel bias")
    values = first[..., 0, :]
    row = np.ascontiguousarray(np.broadcast_to(fold_constants(lanes), (b.shape[-2], lanes)))
    digits = fold_digits(values, lanes).reshape(values.shape + (lanes,))
    return row, digits
