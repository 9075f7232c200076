"""Max and average pooling on the VTA ALU: hand-scheduled runtime templates.

These are **not** TE / s_tir schedules: the programs are written directly with the runtime
(:class:`vta_ext.runtime.CommandQueue`), once per workload. Entry points (``docs/templates-api.md``):
:func:`build_max_pool2d` and :func:`build_avg_pool2d` → :class:`CompiledPool` (``.program``,
``.run(data_packed, simulator=None) -> (out_packed_int8, SimStats)``).

Layouts (``b = BATCH``, ``co = BLOCK_OUT``)::

    data  (N/b, C/co, H, W, b, co)     int8
    out   (N/b, C/co, OH, OW, b, co)   int8

One activation element (fixed batch block, channel block, row, column) is one accumulator row of
``b x co`` int32 lanes, so pooling is pure element-row arithmetic on the ALU.

Algorithm, per tile (``tile_c`` channel blocks x ``tile_h`` output rows x all OW columns of one
batch block; the last tiles along C and H may be smaller):

1. LOAD ACC_8BIT (compute module, sign-extending) of the input window rows of each channel block,
   ``(tile_h-1)*stride_h + pool_h`` rows of ``W + 2*pad_w`` elements, the padding made by the DMA:
   the lane minimum INT32_MIN for max pooling (``pad_min``, extension ``EXT_PAD_MIN``; it never
   wins a MAX), zero for average pooling.
2. The first window element of every output is copied into the output rows (ALU MUL by 0, then ADD
   vector), then one ALU instruction folds the remaining ``pool_h*pool_w - 1`` window elements in
   (MAX or ADD vector-vector): two affine loops over the output rows (dst factor OW, src factor
   stride_h*(W+2*pad_w)) and columns (1, stride_w), one micro-op per (channel block, window offset).
3. Average pooling only: the exact division truncating toward zero (below).
4. The epilogue stages (:mod:`vta_ext.templates.epilogue`: shr / clip / min / max / add), then
   STORE, which truncates the int32 lanes to int8.

Max pooling has a second schedule, ``schedule="separable"`` (:data:`MAX_POOL_SCHEDULES`; the
default ``"direct"`` is step 2 above, the stock strategy's program). Step 2 becomes three
instructions per tile:

a. **height**, in place: ``x[oh*stride_h, c] = max_i x[oh*stride_h + i, c]`` for ``i = 1 ..
   pool_h-1``, over the tile's output rows and the input columns that hold data and that a
   window reads (the DMA's padding columns are already the lane minimum): one ALU MAX with the
   micro-ops ``(channel block, i)`` innermost, so output row ``oh`` reads the rows
   ``oh*stride_h + i`` before the iteration ``oh + 1`` overwrites row ``(oh+1)*stride_h``
   (overlapping windows, ``stride_h < pool_h``, share those rows);
b. **fill**: one padding-only LOAD (``y_size`` 0, ``pad_min``) writes the lane minimum into the
   tile's output rows (``PAD_ELEM_CYCLES`` a row, against the MUL imm + ADD copy);
c. **width**: ``out[oh, ow] = max_j x[oh*stride_h, ow*stride_w + j]`` for ``j = 0 ..
   pool_w-1``: one ALU MAX into the output rows.

A column shared by two windows (``stride_w < pool_w``) is reduced along the height once, per
output row: per channel block the schedule runs :func:`separable_passes` vector passes,
``pool_h-1`` per (output row, input column) and ``pool_w`` per output, against
``pool_h*pool_w`` (and the MUL imm) of the direct one. Reducing the height first costs the same
in every tile (the rows two tiles share are loaded twice but reduced per output row). ResNet-18's
3x3 stride-2 pool: 2*2 + 3 = 7 passes per output against 10; 3x3 stride 1: 2 + 3. It needs ``EXT_PAD_MIN`` (the fill) and no scratch beyond the direct schedule's, and
refuses average pooling (:class:`AluTemplateRefusal`). On a configuration with an accumulator
hazard distance (``pynq``, which has no ACC_8BIT loads for pools anyway) the runtime's cure
(:func:`vta_ext.hazard.cure`) keeps the in-place width pass in its order: its sources are
written by the kernel, so it is split, never reordered.

The third schedule, ``schedule="inplace"``, keeps step a and does the width in place too:
``x[oh*stride_h, ow*stride_w] = max_j x[oh*stride_h, ow*stride_w + j]`` for ``j = 1 ..
pool_w-1`` (the micro-ops innermost, so iteration ``ow`` reads column ``(ow+1)*stride_w`` before
iteration ``ow + 1`` overwrites it; no iteration reads a column an earlier one wrote). Every
output starts from its first window element, so it needs no fill and one vector pass fewer per
output than the separable schedule (:func:`inplace_passes`: the floor's count,
:func:`vta_ext.floor.max_pool_passes`). The outputs stay in the window rows, ``stride_w`` apart,
and a STORE reads adjacent accumulator rows: one STORE per output row of a channel block with
``stride_w`` 1, else one per output, on the store module, which a pool leaves mostly idle
(squeezenet1_1's 1x64x55x55 3x3 s2 on ``pipelined``: 70,422 cycles separable, 62,526 in place).
The windows are the output slots (below): a tile's window region is reloaded only after its
STOREs. It takes no epilogue (the epilogue runs on dense rows; a pool with one keeps the other
schedules) and, unlike the separable schedule, no ``EXT_PAD_MIN`` beyond what padding needs.

Output rows rotate through ``slots`` (default 2) accumulator regions so the store of one tile
overlaps the next tile's work; the compute→store and store→compute tokens are managed by
:class:`~vta_ext.templates.alu_program.StorePipeline` (all loads are compute-module loads, so they
need no tokens). Tiles are chosen as large as the accumulator allows (``acc_depth`` rows: input
window + ``slots`` output regions + division scratch); a single output row of one channel block that
does not fit raises :class:`~vta_ext.templates.errors.AluTemplateRefusal` naming the accumulator
buffer (the operator stays on the CPU).

Input path (``input_path``, :data:`~.alu_program.INPUT_PATHS`). The default ``"acc8"`` is step 1
above. ``"gemm"`` (:class:`~.alu_program.IdentityInput`) LOADs the window rows INP on the *load*
module, zero-padded by the DMA, into one of two input-buffer regions (the next tile's loads overlap
this tile's compute), then: a max pool's window enters the accumulator by a reset GEMM and an
identity GEMM (a micro-op per channel block over the rows), and the direct schedule's first
element by a reset of the outputs and an identity GEMM instead of the MUL-by-0 and ADD copy; an
average pool keeps no window in the accumulator: the outputs are reset and each window element is
a GEMM micro-op from the input buffer into them (``GEMM_CYCLES_PER_UOP`` a tap against a vector
ADD). A max pool with padding is refused (the zero padding could win a MAX; it keeps ``acc8``
with pad_min). The tile also fits two window regions into the input buffer (``inp_depth``).
Where a tile has fewer outputs than window elements (a global pool), the sums loop over the
window instead, one micro-op per (channel block, output) (:func:`_tap_sums`): squeezenet1_1's
1x1000x6x6 global pool loads 344 bytes of micro-ops instead of 9,164.

With ``lean=True`` (the stock program keeps one 2-D LOAD per channel block) both paths load a
window's rows as few DMA rows as the data allow (:func:`window_loads`): each DMA row costs
``DMA_OVERHEAD_CYCLES`` besides its bytes, so an unpadded window is one row per channel block,
and whole planes one row for the tile's channel blocks (squeezenet1_1 112 on
``pipelined``: the max pools 62,526 / 30,402 / 14,631 -> 61,662 / 29,570 / 13,798 cycles, the
global average pool 7,976 -> 5,974). On the identity-GEMM path with whole planes a tile, the
``"cycles"`` knob policy times the largest tile and its ``tile_c`` halvings
(:func:`timed_channel_tile`; the global pool 5,974 -> 4,858, the 1x256x13x13 max pool now takes
this path: 13,798 -> 13,451).

Division (average pooling). VTA has no divide. A window with divisor ``d`` sums at most ``d``
int8 values (the non-padded ones; with ``count_include_pad`` the divisor is the window size, which
bounds the count), so ``|s| <= X_d = 128*d``. Take ``m = ceil(2^k / d)``, so ``m*d = 2^k + e`` with
``0 <= e < d``. For ``0 <= x <= X_d`` write ``x = q*d + r``; then
``x*m / 2^k = x/d + x*e/(d*2^k)`` and ``floor(x*m / 2^k) = q`` iff ``r + x*e/2^k < d``, which
holds for every such x when ``X_d*e < 2^k``. The template picks the smallest ``k`` (one ``k`` for all
the divisors of the workload) for which the identity holds for *every* ``x`` in ``[0, X_d]`` and
every divisor — verified exhaustively at build time (:func:`choose_reciprocal`) — with
``X_d*m < 2^31`` (no int32 overflow); if none exists the template refuses the workload. Truncation toward zero is
``trunc(s/d) = sign(s) * floor(|s|/d)``, built from ALU ops on a scratch copy ``t`` of the sums::

    t = s                       (MUL imm 0, ADD vector)
    t = t >> 31                 (SHR imm: 0 for s >= 0, -1 for s < 0)
    t = t*2 + 1                 (MUL imm 2, ADD imm 1: the sign +1 / -1)
    s = s*t                     (MUL vector: |s|)
    s = s*m                     (MUL imm m, or MUL vector by the per-position multipliers)
    s = s >> k                  (SHR imm: floor(|s|/d))
    s = s*t                     (MUL vector: apply the sign)

With ``lean=True`` (``csp-relaxed``'s programs; the stock strategy keeps the original program)
a uniform divisor ``d = 2**k`` (a 2x2 or 4x4 window) divides in five instructions instead
(:func:`_pow2_division`): ``t = s`` (MUL imm 0, ADD vector), ``t = t >> 31``, ``t = t*(1-d)``
(0, or ``d-1`` for a negative sum), ``s = s + t``, ``s = s >> k``: floor of ``(s+d-1)/d`` is the
ceiling of ``s/d`` for ``s < 0``, so this truncates toward zero (no overflow: ``|s| <= 128*d``).
DenseNet-121's transition pools (1x128x28x28 2x2 s2 on ``pipelined``: 30,548 -> 22,646 cycles).

With ``lean=True`` too, a leading ``clip`` stage of the epilogue whose bounds hold every int8 value (``clip(-128, 127)``,
which the quantized graphs put after a pool) is dropped (``info["dropped_stages"]``): a max or a
truncated average of int8 inputs lies between the window's least and greatest element.

Per-position divisors (``count_include_pad=False`` with padding: the border windows count fewer
elements) use one common ``k`` and a per-output-position multiplier tensor ``(OH, OW, b, co)``
int32, computed at build time, stored in the DRAM image (buffer ``avg_multiplier``) and LOADed
(ACC) with the tile; the multiply is then a vector MUL with source factor 0 over the channel blocks.
A uniform divisor whose ``m`` fits the 16-bit immediate uses MUL imm. ``count_include_pad=True``
divides by ``pool_h*pool_w`` everywhere; windows are never entirely padding (``pad < pool`` is
required), so every divisor is at least 1. ResNet's global 7x7 pool: ``d = 49``, ``k = 17``,
``m = 2675`` (MUL imm), 9 ALU instructions after the window sum. Divisors 1..225 (15x15 windows at
borders) share ``k = 23``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import numpy as np

from ..config import VTAConfig, load_config
from ..isa import AluOp, MemType
from ..layout import IMM_MAX, IMM_MIN, MAX_DMA_PAD, MAX_DMA_STRIDE
from ..hazard import distance_of
from ..runtime import CommandQueue
from .alu_program import (MAX_KERNEL_UOPS, CompiledAluOp, IdentityInput, StorePipeline, alu,
                          alu_range, check_input_path, check_non_negative, check_positive,
                          check_slots, choose_row_tiles, copy_rows, require_multiple)
from .epilogue import emit_epilogue, has_bias, normalize_epilogue
from .errors import AluTemplateError, AluTemplateRefusal, KnobError
from .knobs import knobs_from
from .workload import out_size, window_size

__all__ = ["PoolWorkload", "PoolKnobs", "CompiledPool", "build_max_pool2d", "build_avg_pool2d",
           "choose_reciprocal", "avg_divisors", "AluTemplateError", "AluTemplateRefusal",
           "MAX_POOL_SCHEDULES", "separable_passes", "inplace_passes", "division_plan"]

#: the schedules of :func:`build_max_pool2d`: ``"direct"`` (the stock program: copy the first
#: window element, then one MAX per other element), ``"separable"`` and ``"inplace"`` (module
#: docstring)
MAX_POOL_SCHEDULES = ("direct", "separable", "inplace")


def separable_passes(pool_h: int, pool_w: int, cols: float, out_rows: int, out_cols: int) -> float:
    """Vector MAX passes (micro-op iterations) of the separable max pool on one channel block.

    Parameters
    ----------
    pool_h, pool_w : int
        The window.
    cols : float
        The input columns reduced along the height (the columns the windows read that hold
        data).
    out_rows, out_cols : int
        The output rows and columns.

    Returns
    -------
    float
        ``(pool_h - 1) * out_rows * cols`` along the height plus ``pool_w * out_rows * out_cols``
        along the width (into output rows that start from the lane minimum).
    """
    return (pool_h - 1) * out_rows * cols + pool_w * out_rows * out_cols


def inplace_passes(pool_h: int, pool_w: int, cols: float, out_rows: int, out_cols: int) -> float:
    """Vector MAX passes of the in-place max pool on one channel block: the separable schedule's
    (:func:`separable_passes`, same parameters) less one per output, whose first window element
    is the value it starts from (no lane-minimum fill)."""
    return separable_passes(pool_h, pool_w, cols, out_rows, out_cols) - out_rows * out_cols



@dataclass(frozen=True)
class PoolWorkload:
    """A 2-D pooling in NCHW terms (batch a multiple of BATCH, channels of BLOCK_OUT; symmetric
    padding; ``count_include_pad`` matters for average pooling only)."""

    batch: int
    channels: int
    height: int
    width: int
    pool_h: int
    pool_w: int
    stride_h: int
    stride_w: int
    pad_h: int
    pad_w: int
    count_include_pad: bool = False

    @property
    def out_height(self) -> int:
        """Output rows (:func:`~vta_ext.templates.workload.out_size`)."""
        return out_size(self.height, self.pool_h, self.pad_h, self.stride_h)

    @property
    def out_width(self) -> int:
        """Output columns (:func:`~vta_ext.templates.workload.out_size`)."""
        return out_size(self.width, self.pool_w, self.pad_w, self.stride_w)


@dataclass(frozen=True)
class PoolKnobs:
    """Tile sizes (None = as large as the accumulator allows) and the number of output slots
    (2 = double buffering of the output rows against the STORE module).

    The template has one schedule rule, so the presets ``"tps"`` and ``"fallback"`` are both the
    default ``PoolKnobs()``.
    """

    tile_h: Optional[int] = None
    tile_c: Optional[int] = None
    slots: int = 2


class CompiledPool(CompiledAluOp):
    """A compiled max/avg pooling (see :class:`~vta_ext.templates.alu_program.CompiledAluOp`)."""


def _check(cfg: VTAConfig, wl: PoolWorkload, what: str) -> None:
    """Refuse (:class:`AluTemplateRefusal`) a pooling the template does not implement."""
    check_positive(wl, ("batch", "channels", "height", "width", "pool_h", "pool_w", "stride_h",
                        "stride_w"), what)
    require_multiple(wl.batch, cfg.BATCH, "batch", "BATCH", what)
    require_multiple(wl.channels, cfg.BLOCK_OUT, "channels", "BLOCK_OUT", what)
    check_non_negative(wl, ("pad_h", "pad_w"), what, MAX_DMA_PAD, "the 4-bit DMA pad field")
    if wl.pad_h >= wl.pool_h or wl.pad_w >= wl.pool_w:
        raise AluTemplateRefusal(f"{what}: padding {wl.pad_h}x{wl.pad_w} must be smaller than the "
                                 f"pool window {wl.pool_h}x{wl.pool_w} (windows made only of padding "
                                 "are not supported)")
    if wl.out_height < 1 or wl.out_width < 1:
        raise AluTemplateRefusal(f"{what}: empty output {wl.out_height}x{wl.out_width}")


def avg_divisors(wl: PoolWorkload) -> np.ndarray:
    """(OH, OW) divisors of TVM's avg_pool2d: the window size, or the count of non-padded
    elements when ``count_include_pad`` is false."""
    def counts(n_out, stride, pool, pad, size):
        start = np.arange(n_out) * stride - pad
        return np.minimum(start + pool, size) - np.maximum(start, 0)

    if wl.count_include_pad:
        return np.full((wl.out_height, wl.out_width), wl.pool_h * wl.pool_w, np.int64)
    ch = counts(wl.out_height, wl.stride_h, wl.pool_h, wl.pad_h, wl.height)
    cw = counts(wl.out_width, wl.stride_w, wl.pool_w, wl.pad_w, wl.width)
    return np.outer(ch, cw)


def choose_reciprocal(divisors, max_abs_per_element: int = 128,
                      max_multiplier: int = (1 << 31) - 1):
    """Smallest shift ``k`` and multipliers ``{d: ceil(2^k/d)}`` such that, for every divisor d,
    ``(x*m) >> k == x // d`` for every ``0 <= x <= X_d = max_abs_per_element*d`` (checked
    exhaustively), ``X_d*m < 2^31`` and ``m <= max_multiplier``. Raises if none exists.

    ``X_d`` bounds the window sum: a window with divisor d sums d int8 values (the non-padded
    ones; with ``count_include_pad`` d is the window size, an upper bound of the count)."""
    ds = sorted({int(d) for d in np.asarray(list(divisors) if not isinstance(divisors, np.ndarray)
                                            else divisors).ravel()})
    if not ds or ds[0] < 1:
        raise AluTemplateRefusal(f"avg_pool2d divisors must be >= 1, got {ds}")
    xs = {d: np.arange(max_abs_per_element * d + 1, dtype=np.int64) for d in ds}
    for k in range(0, 31):
        ms = {d: -(-(1 << k) // d) for d in ds}
        if max(ms.values()) > max_multiplier or \
                any(max_abs_per_element * d * m >= (1 << 31) for d, m in ms.items()):
            break
        if all(np.array_equal((xs[d] * m) >> k, xs[d] // d) for d, m in ms.items()):
            return k, ms
    raise AluTemplateRefusal(f"no exact multiply-shift reciprocal with one shift for the avg_pool2d "
                             f"divisors {ds} (window sums up to {max_abs_per_element}*d) within "
                             "int32")


def division_plan(wl: PoolWorkload, pow2: bool = False) -> Optional[dict]:
    """How an average pool of ``wl`` divides its window sums: None when every divisor is 1, else
    ``k`` (the shift) and one of: ``pow2`` (only when asked for by ``pow2``: one divisor ``2**k``,
    :func:`_pow2_division`), one immediate multiplier ``imm`` (one divisor whose multiplier fits
    the ALU immediate) or a per-output int32 vector ``mult``; raises
    :class:`AluTemplateRefusal` when no exact multiply-shift reciprocal exists
    (:func:`choose_reciprocal`)."""
    divisors = avg_divisors(wl)
    if divisors.max() <= 1:
        return None
    d, uniform = int(divisors.flat[0]), divisors.min() == divisors.max()
    if pow2 and uniform and d & (d - 1) == 0 and IMM_MIN <= 1 - d:
        return dict(k=d.bit_length() - 1, pow2=d, vector=False)
    if uniform:
        try:
            k, ms = choose_reciprocal(divisors, 128, IMM_MAX)
            return dict(k=k, imm=ms[d], vector=False)
        except AluTemplateRefusal:
            pass
    k, ms = choose_reciprocal(divisors, 128)
    mult = np.vectorize(lambda d: ms[int(d)])(divisors).astype(np.int32)
    return dict(k=k, vector=True, mult=mult, multipliers={int(d): int(m) for d, m in ms.items()})


def _check_schedule(cfg: VTAConfig, schedule: str, is_max: bool, epilogue, what: str) -> str:
    """``schedule``, refused (:class:`AluTemplateRefusal`) where it cannot run."""
    if schedule not in MAX_POOL_SCHEDULES:
        raise AluTemplateError(f"{what}: schedule {schedule!r}; one of "
                               f"{', '.join(MAX_POOL_SCHEDULES)}")
    if schedule == "direct":
        return schedule
    if not is_max:
        raise AluTemplateRefusal(f"{what}: the {schedule} schedule is a max pool's (an average "
                                 "pool keeps the direct window sum)")
    if schedule == "separable" and not cfg.EXT_PAD_MIN:
        raise AluTemplateRefusal(
            f"{what}: the separable schedule starts the output rows from the lane minimum (a "
            "padding-only LOAD with pad_min): "
            + cfg.missing_extension("EXT_PAD_MIN", "LOAD ACC_8BIT with pad_min=True"))
    if schedule == "inplace" and epilogue:
        raise AluTemplateRefusal(
            f"{what}: the in-place schedule leaves its outputs spread over the window rows, and "
            "the epilogue runs on dense rows: a max pool with an epilogue keeps another schedule")
    return schedule


def separable_columns(wl: PoolWorkload) -> Tuple[int, int]:
    """``(first, count)``: the columns of the padded input rows that the separable schedule
    reduces along the height: those that hold data (input or ceil-mode padding) and that a
    window reads."""
    last = min(wl.pad_w + wl.width, (wl.out_width - 1) * wl.stride_w + wl.pool_w)
    return wl.pad_w, max(0, last - wl.pad_w)


def _separable_reduce(q: CommandQueue, wl: PoolWorkload, fill_src, windows, dst, out_rows: int,
                      row_len: int) -> None:
    """Steps a-c of the separable schedule (module docstring) for one tile.

    ``windows``: the accumulator row of each channel block's input window; ``dst``: of its
    output rows; ``row_len``: accumulator rows per input row (the padded width); ``fill_src``: a
    DRAM buffer the padding-only LOAD names (it reads nothing).
    """
    first, count = separable_columns(wl)
    sh, sw, out_cols = wl.stride_h * row_len, wl.stride_w, wl.out_width
    if wl.pool_h > 1 and count:
        alu(q, AluOp.MAX, [(w + first, w + first + i * row_len) for w in windows
                           for i in range(1, wl.pool_h)], [(out_rows, sh, sh), (count, 1, 1)])
    size = len(dst) * out_rows * out_cols
    q.load_2d(fill_src, 0, size, 0, size, 0, 1, 0, 0, dst[0], MemType.ACC_8BIT, pad_min=True)
    alu(q, AluOp.MAX, [(d, w + j) for d, w in zip(dst, windows) for j in range(wl.pool_w)],
        [(out_rows, out_cols, sh), (out_cols, 1, sw)])


def _inplace_reduce(q: CommandQueue, wl: PoolWorkload, windows, out_rows: int,
                    row_len: int) -> None:
    """The in-place schedule (module docstring) for one tile: the height in place as the
    separable schedule's step a, then the width in place into each window's first column.

    ``windows``: the accumulator row of each channel block's input window; ``row_len``:
    accumulator rows per input row (the padded width). Output ``(oh, ow)`` of a window is left in
    its row ``oh*stride_h*row_len + ow*stride_w``.
    """
    first, count = separable_columns(wl)
    sh, sw = wl.stride_h * row_len, wl.stride_w
    if wl.pool_h > 1 and count:
        alu(q, AluOp.MAX, [(w + first, w + first + i * row_len) for w in windows
                           for i in range(1, wl.pool_h)], [(out_rows, sh, sh), (count, 1, 1)])
    if wl.pool_w > 1:
        alu(q, AluOp.MAX, [(w, w + j) for w in windows for j in range(1, wl.pool_w)],
            [(out_rows, sh, sh), (wl.out_width, sw, sw)])


def _store_inplace(q: CommandQueue, wl: PoolWorkload, windows, out, first_out: int,
                   out_rows: int, row_len: int) -> None:
    """STORE the in-place schedule's outputs of one tile from their window rows: a STORE per
    output row of a channel block when the outputs of a row are adjacent (``stride_w`` 1), else
    a STORE per output (a STORE reads adjacent accumulator rows). ``first_out``: the DRAM element
    of the tile's first output of its first channel block."""
    OH, OW = wl.out_height, wl.out_width
    sh, sw = wl.stride_h * row_len, wl.stride_w
    for c, w in enumerate(windows):
        for oh in range(out_rows):
            dst = first_out + c * OH * OW + oh * OW
            if sw == 1:
                q.store_2d(w + oh * sh, MemType.OUT, out, dst, OW, 1, OW)
                continue
            for ow in range(OW):
                q.store_2d(w + oh * sh + ow * sw, MemType.OUT, out, dst + ow, 1, 1, 1)


def _pow2_division(q: CommandQueue, sums: int, scratch: int, size: int, d: int, k: int) -> None:
    """Divide the ``size`` rows from ``sums`` by ``d = 2**k`` truncating toward zero (module
    docstring): ``(s + (d - 1) * [s < 0]) >> k``, the bias from a copy in ``scratch``: ``s >> 31``
    (0 or -1) times ``1 - d``. Five ALU instructions against the general sequence's nine."""
    alu_range(q, AluOp.MUL, scratch, size, 0)
    alu(q, AluOp.ADD, [(scratch, sums)], [(size, 1, 1)])
    alu_range(q, AluOp.SHR, scratch, size, 31)
    alu_range(q, AluOp.MUL, scratch, size, 1 - d)
    alu(q, AluOp.ADD, [(sums, scratch)], [(size, 1, 1)])
    alu_range(q, AluOp.SHR, sums, size, k)


def _int8_clips_dropped(cfg: VTAConfig, epilogue) -> Tuple[tuple, tuple]:
    """``(kept, dropped)``: the leading ``clip`` stages of ``epilogue`` whose bounds hold every
    int8 value are dropped: a max or average pool of int8 inputs (the truncated average lies
    between the window's least and greatest element) cannot leave that range, so they change
    nothing."""
    lo, hi = -(1 << (cfg.INP_WIDTH - 1)), (1 << (cfg.INP_WIDTH - 1)) - 1
    n = 0
    while n < len(epilogue) and epilogue[n][0] == "clip" and epilogue[n][1] <= lo \
            and epilogue[n][2] >= hi:
        n += 1
    return tuple(epilogue[n:]), tuple(epilogue[:n])


#: input-buffer regions of the identity-GEMM input path (double buffering of the loads)
GEMM_INPUT_SLOTS = 2


def _check_gemm_input(wl: PoolWorkload, is_max: bool, what: str) -> None:
    """Refuse the identity-GEMM input path where it is not exact: a max pool with padding (the
    INP DMA pads with 0, which can win a MAX; that pool keeps LOAD ACC_8BIT with pad_min)."""
    if is_max and (wl.pad_h or wl.pad_w):
        raise AluTemplateRefusal(
            f"{what}: the identity-GEMM input path pads with 0 (LOAD INP), which can win a MAX: a "
            f"max pool with padding {wl.pad_h}x{wl.pad_w} keeps LOAD ACC_8BIT with pad_min")


def window_loads(tcc: int, ny: int, W: int, pad_w: int, pad_rows: int, H: int,
                 win_stride: int) -> List[Tuple[int, int, int, int]]:
    """The LOADs of a tile's input windows: ``(first channel block, blocks, x_size, y_size)``.

    Each DMA row costs its own overhead (``DMA_OVERHEAD_CYCLES`` + the kind's row cycles), so
    rows that follow each other both in DRAM and in the on-chip window go as one row: with no
    padding (``pad_w`` columns, ``pad_rows`` rows above and below) a channel block's ``ny`` rows of
    ``W`` are one row of ``ny * W`` elements, and where the window is the whole plane (``ny ==
    H`` and ``win_stride == H * W``) consecutive channel blocks join too, up to the 16-bit size
    field (:data:`~vta_ext.layout.MAX_DMA_STRIDE`). Otherwise one 2-D LOAD per channel block.
    """
    if pad_w or pad_rows or ny * W > MAX_DMA_STRIDE:
        return [(c, 1, W, ny) for c in range(tcc)]
    if ny == H and win_stride == H * W:
        per = max(1, MAX_DMA_STRIDE // (H * W))
        return [(c, min(per, tcc - c), min(per, tcc - c) * H * W, 1) for c in range(0, tcc, per)]
    return [(c, 1, ny * W, 1) for c in range(tcc)]


def _tap_sums(dst, srcs, wl: PoolWorkload, thh: int, Wp: int, distance: int):
    """``(micro-ops, loops)`` of the GEMM that adds every window element of an average pool into
    the outputs ``dst`` (per channel block; ``srcs`` the blocks' windows in the input buffer): the
    fewer micro-ops of one per (block, window element) looping over the outputs, and one per
    (block, output) looping over the window (destination factor 0), which a global pool takes
    (one output, ``pool_h * pool_w`` elements: the micro-op loads shrink by that factor). The
    second form only with at least ``distance`` micro-ops (the hazard contract,
    :mod:`vta_ext.hazard`: each output is written once per pass over them)."""
    OW, SH, SW = wl.out_width, wl.stride_h, wl.stride_w
    outputs = [(r, x) for r in range(thh) for x in range(OW)]
    taps = [(i, j) for i in range(wl.pool_h) for j in range(wl.pool_w)]
    if len(outputs) < len(taps) and len(dst) * len(outputs) >= distance:
        return ([(d + r * OW + x, s + r * SH * Wp + x * SW) for d, s in zip(dst, srcs)
                 for r, x in outputs], [(wl.pool_h, 0, Wp), (wl.pool_w, 0, 1)])
    return ([(d, s + i * Wp + j) for d, s in zip(dst, srcs) for i, j in taps],
            [(thh, OW, SH * Wp), (OW, 1, SW)])


def _gemm_window(ident: IdentityInput, base: int, windows, nrows: int, row_len: int) -> None:
    """Write each channel block's input window (``nrows`` rows of ``row_len``, input-buffer rows
    from ``base`` at the windows' own offsets) into the accumulator: reset, then identity GEMM."""
    loops = [(nrows, row_len, row_len), (row_len, 1, 1)]
    ident.gemm([(w, 0) for w in windows], [(e, d, 0) for e, d, _ in loops], reset=True)
    ident.gemm([(w, base + w - windows[0]) for w in windows], loops)


def timed_channel_tile(cfg: VTAConfig, wl: PoolWorkload, epilogue, mode: str, schedule: str,
                       input_path: str, lean: bool) -> CompiledPool:
    """The pool the ``"cycles"`` knob policy builds on the identity-GEMM input path where a tile
    holds whole output planes: of the largest tile (``"tps"``) and its ``tile_c`` halvings (at
    most :data:`~.eltwise.MAX_TIMED_TILES` tiles), the one the cycle model times fastest, the
    larger on a tie (:func:`~.eltwise.fastest_build`); the largest tile, untimed, where the tile
    splits the planes or has one channel block. As :func:`~.eltwise.timed_tile` does for the add:
    in a few large tiles the loads, GEMMs and stores barely overlap (squeezenet1_1's 1x1000x6x6
    global pool on ``pipelined``: 3 tiles of up to 28 blocks 5,974 cycles, 16 of up to 4:
    4,894). A halving that wins is returned as it was timed; where the largest wins it is built
    once more with its tile as explicit knobs (the program the policy has always returned)."""
    from .eltwise import MAX_TIMED_TILES, fastest_build

    largest = _build_pool(cfg, wl, epilogue, "tps", mode, schedule, input_path, lean)
    th, tc = largest.info["tile_h"], largest.info["tile_c"]
    if th < wl.out_height or tc == 1:
        why = (f"a tile holds {th} of {wl.out_height} output rows" if th < wl.out_height
               else "a tile holds one channel block")
        largest.info["tiling"] = f"tile_h={th} tile_c={tc}, the largest tile, untimed: {why}"
        return largest
    blocks = (wl.batch // cfg.BATCH) * (wl.channels // cfg.BLOCK_OUT)
    tiles, tile = [tc], tc // 2
    while tile >= 1 and -(-blocks // tile) <= MAX_TIMED_TILES:
        tiles.append(tile)
        tile //= 2

    def build(t: int) -> CompiledPool:
        return _build_pool(cfg, wl, epilogue, PoolKnobs(tile_h=th, tile_c=t), mode, schedule,
                           input_path, lean)
    best, compiled = fastest_build(cfg, tiles, build, {tc: largest}, knob="tile_c")
    if best != tc:
        return compiled
    out = build(tc)
    out.info["tiling"] = compiled.info["tiling"]
    return out


def _build_pool(cfg, wl: PoolWorkload, epilogue, knobs, mode: str,
                schedule: str = "direct", input_path: str = "acc8",
                lean: bool = False) -> CompiledPool:
    if knobs == "cycles" and input_path == "gemm":
        return timed_channel_tile(cfg, wl, epilogue, mode, schedule, input_path, lean)
    t0 = time.perf_counter()
    what = f"{mode}_pool2d {wl}"
    cfg = load_config(cfg)
    epilogue = normalize_epilogue(epilogue)
    if has_bias(epilogue):
        raise AluTemplateRefusal(f"{what}: pooling takes no ('bias',) epilogue stage")
    if not isinstance(wl, PoolWorkload):
        raise AluTemplateError(f"expected a PoolWorkload, got {type(wl).__name__}")
    _check(cfg, wl, what)
    written = epilogue
    epilogue, dropped = _int8_clips_dropped(cfg, epilogue) if lean else (epilogue, ())
    kn = knobs_from(knobs, PoolKnobs, {"tps": PoolKnobs, "fallback": PoolKnobs})
    is_max = mode == "max"
    schedule = _check_schedule(cfg, schedule, is_max, epilogue, what)
    separable, inplace = schedule == "separable", schedule == "inplace"
    gemm = check_input_path(cfg, input_path, what)
    if input_path == "split":
        raise AluTemplateRefusal(f"{what}: the split input path is a two-operand template's (a "
                                 "pool has one input: 'acc8' or 'gemm')")
    if gemm:
        _check_gemm_input(wl, is_max, what)
    padded = wl.pad_h > 0 or wl.pad_w > 0
    if is_max and padded and not cfg.EXT_PAD_MIN:
        raise AluTemplateRefusal(
            f"{what}: max pooling with padding pads with the minimum value (LOAD pad_min): "
            + cfg.missing_extension("EXT_PAD_MIN", "LOAD ACC_8BIT with pad_min=True"))

    B, BO = cfg.BATCH, cfg.BLOCK_OUT
    NB, CB = wl.batch // B, wl.channels // BO
    H, W, OH, OW = wl.height, wl.width, wl.out_height, wl.out_width
    PH, PW, SH, SW = wl.pad_h, wl.pad_w, wl.stride_h, wl.stride_w
    P = wl.pool_h * wl.pool_w
    Wp = W + 2 * PW
    # micro-ops per channel block of the widest ALU kernel
    kernel_uops = (max(wl.pool_h - 1, wl.pool_w) if separable
                   else max(wl.pool_h - 1, wl.pool_w - 1, 1) if inplace else P)

    div = None if is_max else division_plan(wl, pow2=lean)

    # ---- tiling
    def inp_rows(th, tc):
        return GEMM_INPUT_SLOTS * tc * window_size(th, wl.pool_h, SH) * Wp

    def usage(th, tc, slots):
        # the identity-GEMM avg pool sums from the input buffer: no window in the accumulator
        win = 0 if gemm and not is_max else tc * window_size(th, wl.pool_h, SH) * Wp
        out = tc * th * OW
        if inplace:   # the outputs stay in the windows, which rotate through the slots
            win, out = 0, win
        extra = 0
        if div is not None:
            extra = out + (th * OW if div["vector"] else 0)
        if gemm and inp_rows(th, tc) > cfg.inp_depth:
            return cfg.acc_depth + 1   # does not fit the input buffer
        return win + slots * out + extra

    if gemm and inp_rows(1, 1) > cfg.inp_depth:
        raise AluTemplateRefusal(
            f"{what}: the identity-GEMM input path needs {inp_rows(1, 1)} input-buffer (inp) "
            f"entries for one output row ({GEMM_INPUT_SLOTS} regions of {wl.pool_h} rows of {Wp}), "
            f"more than the input buffer's {cfg.inp_depth}")

    slots = check_slots(kn.slots, what)
    uop_cap = min(MAX_KERNEL_UOPS, cfg.uop_depth // 4)
    th, tc, slots = choose_row_tiles(
        what, cfg, usage, OH, CB, slots, kn.tile_h, kn.tile_c, uop_cap // kernel_uops,
        f"{wl.pool_h} input rows of {Wp} elements + outputs")
    if tc * kernel_uops > max(uop_cap, kernel_uops):
        raise KnobError(f"{what}: knob tile_c={tc} needs {tc * kernel_uops} micro-ops per kernel "
                        f"(max {uop_cap}); valid tile_c: 1..{max(1, uop_cap // kernel_uops)}")

    win_rows = window_size(th, wl.pool_h, SH)
    win_stride = win_rows * Wp          # accumulator rows per channel block of the input window
    out_size = tc * th * OW
    IN = 0
    OUT0 = IN + (0 if gemm and not is_max or inplace else tc * win_stride)
    T = OUT0 + slots * out_size         # sign scratch (avg)
    M = T + out_size                    # per-position multipliers (avg, vector)

    q = CommandQueue(cfg)
    data_shape = (NB, CB, H, W, B, BO)
    out_shape = (NB, CB, OH, OW, B, BO)
    data = q.alloc(int(np.prod(data_shape)), "data")
    out = q.alloc(int(np.prod(out_shape)), "out")
    mult_buf = None
    if div is not None and div["vector"]:
        mult_buf = q.alloc(OH * OW * B * BO * np.dtype(np.int32).itemsize, "avg_multiplier")
    ident = IdentityInput(q, GEMM_INPUT_SLOTS, tc * win_stride, what) if gemm else None
    pipe = StorePipeline(q, slots)
    op = AluOp.MAX if is_max else AluOp.ADD
    loaded_rows = None
    n_tiles = 0
    passes = 0
    for n in range(NB):
        for c0 in range(0, CB, tc):
            tcc = min(tc, CB - c0)
            for oh0 in range(0, OH, th):
                thh = min(th, OH - oh0)
                # 1. input window rows, padded by the DMA
                r0 = oh0 * SH
                nrows = window_size(thh, wl.pool_h, SH)
                lo, hi = max(r0, PH), min(r0 + nrows, PH + H)
                ypb, ypa, ny = lo - r0, r0 + nrows - hi, hi - lo
                pad_min = is_max and bool(ypb or ypa or PW)
                loads = (window_loads(tcc, ny, W, PW, ypb + ypa, H, win_stride) if lean
                         else [(c, 1, W, ny) for c in range(tcc)])
                if ident is not None:   # LOAD INP on the load module
                    base = ident.begin_load()
                    for c, _, xs, ys in loads:
                        ident.load(data, ((n * CB + c0 + c) * H + lo - PH) * W, xs, ys,
                                   W if ys > 1 else xs, PW, ypb, ypa, base + c * win_stride)
                    ident.end_load()
                slot = pipe.begin_tile()
                OUT = OUT0 + slot * out_size
                if inplace:   # this slot's windows
                    OUT = IN + slot * tc * win_stride
                windows = [(OUT if inplace else IN) + c * win_stride for c in range(tcc)]
                if ident is None:
                    for c, _, xs, ys in loads:
                        q.load_2d(data, ((n * CB + c0 + c) * H + lo - PH) * W, xs, ys,
                                  W if ys > 1 else xs, PW, ypb, PW, ypa, windows[c],
                                  MemType.ACC_8BIT, pad_min=pad_min)
                # 2. window reduction into the output rows
                loops = [(thh, OW, SH * Wp), (OW, 1, SW)]
                dst = [OUT + c * thh * OW for c in range(tcc)]
                if ident is not None:
                    ident.begin_compute()
                    if is_max:
                        _gemm_window(ident, base, windows, nrows, Wp)
                    if not is_max or schedule == "direct":   # the first element (avg: each)
                        ident.reset(OUT, tcc * thh * OW)
                        srcs = [base + c * win_stride for c in range(tcc)]
                        if is_max:   # the first window element
                            ident.gemm(list(zip(dst, srcs)), loops)
                        else:
                            ident.gemm(*_tap_sums(dst, srcs, wl, thh, Wp,
                                                  distance_of(cfg, "gemm")))
                    ident.end_compute()
                if inplace:
                    _inplace_reduce(q, wl, windows, thh, Wp)
                    passes += tcc * inplace_passes(wl.pool_h, wl.pool_w,
                                                   separable_columns(wl)[1], thh, OW)
                elif separable:
                    _separable_reduce(q, wl, data, windows, dst, thh, Wp)
                    passes += tcc * separable_passes(wl.pool_h, wl.pool_w,
                                                     separable_columns(wl)[1], thh, OW)
                else:
                    if ident is None:
                        copy_rows(q, [(dst[c], windows[c]) for c in range(tcc)], loops)
                    rest = [(dst[c], windows[c] + i * Wp + j) for c in range(tcc)
                            for i in range(wl.pool_h) for j in range(wl.pool_w) if i or j]
                    if rest and (is_max or ident is None):   # the gemm avg pool has summed
                        alu(q, op, rest, loops)
                size = tcc * thh * OW
                # 3. exact truncating division (avg)
                if div is not None and "pow2" in div:
                    _pow2_division(q, OUT, T, size, div["pow2"], div["k"])
                elif div is not None:
                    alu_range(q, AluOp.MUL, T, size, 0)
                    alu(q, AluOp.ADD, [(T, OUT)], [(size, 1, 1)])
                    alu_range(q, AluOp.SHR, T, size, 31)
                    alu_range(q, AluOp.MUL, T, size, 2)
                    alu_range(q, AluOp.ADD, T, size, 1)
                    alu(q, AluOp.MUL, [(OUT, T)], [(size, 1, 1)])
                    if div["vector"]:
                        if loaded_rows != (oh0, thh):
                            q.load_2d(mult_buf, oh0 * OW, thh * OW, 1, thh * OW, 0, 0, 0, 0, M,
                                      MemType.ACC)
                            loaded_rows = (oh0, thh)
                        alu(q, AluOp.MUL, [(d, M) for d in dst], [(thh * OW, 1, 1)])
                    else:
                        alu_range(q, AluOp.MUL, OUT, size, div["imm"])
                    alu_range(q, AluOp.SHR, OUT, size, div["k"])
                    alu(q, AluOp.MUL, [(OUT, T)], [(size, 1, 1)])
                # 4. epilogue and store
                emit_epilogue(q, cfg, epilogue, OUT, size)
                pipe.end_compute()
                pipe.begin_store()
                if inplace:
                    _store_inplace(q, wl, windows, out, ((n * CB + c0) * OH + oh0) * OW, thh, Wp)
                else:
                    q.store_2d(OUT, MemType.OUT, out, ((n * CB + c0) * OH + oh0) * OW, thh * OW,
                               tcc, OH * OW)
                pipe.end_store()
                n_tiles += 1
    pipe.finish()
    if ident is not None:
        ident.finish()
    prog = q.synchronize()
    if ident is not None:
        IdentityInput.write_identity(prog)
    if mult_buf is not None:
        m = np.broadcast_to(div["mult"][:, :, None, None], (OH, OW, B, BO))
        prog.write("avg_multiplier", np.ascontiguousarray(m, dtype=np.int32))
    info = dict(tile_h=th, tile_c=tc, slots=slots, tiles=n_tiles, acc_used=usage(th, tc, slots),
                schedule=schedule, input_path=input_path)
    if separable or inplace:
        info["vector_passes"] = passes
    if div is not None:
        info["division"] = {k_: v for k_, v in div.items() if k_ != "mult"}
    if dropped:
        info["dropped_stages"] = [list(st) for st in dropped]
    return CompiledPool(cfg, wl, written, prog, [("data", data_shape, np.int8)], out_shape,
                        {"build": time.perf_counter() - t0}, info)


def build_max_pool2d(cfg: Union[VTAConfig, str], workload: PoolWorkload, epilogue=(),
                     knobs=None, schedule: str = "direct",
                     input_path: str = "acc8", lean: bool = False) -> CompiledPool:
    """Compile an int8 max pooling (+ epilogue) for ``cfg``. Padding needs ``cfg.EXT_PAD_MIN``;
    without it (e.g. the ``apache`` preset) an :class:`AluTemplateRefusal` names the extension.

    ``knobs``: None / ``"tps"`` / ``"fallback"`` (all the default :class:`PoolKnobs`), a
    :class:`PoolKnobs` or a dict of its fields. ``schedule``: one of :data:`MAX_POOL_SCHEDULES`
    (``"separable"`` needs ``EXT_PAD_MIN`` and records its vector passes in
    ``info["vector_passes"]``). ``input_path``: one of
    :data:`~.alu_program.INPUT_PATHS` (``"gemm"`` refuses a max pool with padding). ``lean``:
    drop a leading int8 clip of the epilogue (module docstring; the stock program keeps it)."""
    return _build_pool(cfg, workload, epilogue, knobs, "max", schedule, input_path, lean)


def build_avg_pool2d(cfg: Union[VTAConfig, str], workload: PoolWorkload, epilogue=(),
                     knobs=None, input_path: str = "acc8", lean: bool = False) -> CompiledPool:
    """Compile an average pooling with TVM's CPU semantics on the int32 cast of the int8 input
    (int32 window sum, division truncating toward zero, ``count_include_pad`` as given), then the
    epilogue and the truncating int8 store. ``input_path``: one of
    :data:`~.alu_program.INPUT_PATHS` (``"gemm"``: the window sum is GEMMs from the input
    buffer). ``lean``: the power-of-two division and no leading int8 clip (module docstring; the
    stock program keeps the general division and the clip)."""
    return _build_pool(cfg, workload, epilogue, knobs, "avg", "direct", input_path, lean)
