"""Grouped convolutions whose groups are not whole blocks, on the GEMM core with only the nonzero
weight tiles: the block-sparse program.

In the stock blocked layout ``(N/b, C/BLOCK, H, W, b, BLOCK)`` (channels padded only at the end)
the weight of a grouped conv2d of ``w`` channels per group, seen as a dense ``C x C`` matrix per
tap, is block-diagonal with ``w x w`` blocks; cut into ``BLOCK x BLOCK`` tiles, most tiles are
zero. Output block ``o`` needs the input blocks of the groups its channels belong to
(:func:`tile_grid`); for ``w = 24`` and ``BLOCK = 16`` two groups are exactly three blocks, and
the pair's nonzero tiles are ``(out, in)`` ``(0,0) (0,1) (1,0) (1,1) (1,2) (2,1) (2,2)``: 7 GEMM
micro-ops per tap and pixel for three output blocks, and no padding inside the channels.

* **Program** (:func:`build_block_sparse`, written with the runtime like the ALU templates,
  :mod:`vta_ext.templates.alu_program`): the output blocks are cut into *units*, runs of output
  blocks whose input-block ranges overlap (a pair of 24-channel groups; a last odd group alone).
  Per tile (batch block, unit, ``tile_h`` output rows, all columns): the input window of the
  unit's input blocks (zero padding by the DMA), the unit's nonzero tiles (reloaded only when the
  unit changes), the accumulator zeroed (a padding-only LOAD where the cycle model times it
  below a GEMM reset, :func:`zero_by_fill`; else the reset), then one GEMM instruction per
  nonzero tile whose two loops walk the taps
  (``KH``, ``KW``) and whose micro-ops are the tile's output pixels (so the micro-ops writing one
  accumulator row are a tile's pixels apart: the hazard contract of ``pynq`` holds without a cure
  for tiles of more than 3 pixels); then the epilogue on the ALU (the bias and the multiplier
  vector ADD / MUL from rows loaded into the accumulator) and the STORE. Input and weight tiles
  rotate through two SRAM halves (load / compute tokens), the outputs through two accumulator
  regions (compute / store tokens, :class:`~vta_ext.templates.alu_program.StorePipeline`).
* **Weights**: only the nonzero tiles, packed ``(T, KH, KW, BLOCK, BLOCK)`` in the order the
  program reads them (:func:`block_sparse_weight`); a constant weight (every quantised model's) is packed at
  build time, any other is refused (the other units run it).
* **Which layers**: groups with as many output as input channels, square blocks, no dilation,
  and a unit's window, tiles and outputs fitting the scratchpads at one output row. Groups of
  exactly one block (``w = BLOCK``) are one tile per output block and tap, each group a unit.

:mod:`.grouped` builds it next to the CSP plan and the block-diagonal unit and keeps the one the
objective scores best.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from vta_ext.config import VTAConfig, load_config
from vta_ext.isa import AluOp, MemType
from vta_ext.layout import MAX_DMA_PAD, MAX_LOOP_EXTENT, MEMOP_SIZE_BITS
from vta_ext.memory import gemm_kernel_uop_budget
from vta_ext.runtime import CommandQueue, UopKernel
from vta_ext.sim.cycles import timing
from vta_ext.templates.alu_program import CompiledAluOp, LoadPipeline, StorePipeline, alu
from vta_ext.templates.epilogue import (GEMM_BIAS_STAGE, emit_epilogue, has_bias,
                                        has_multiplier, normalize_epilogue)
from vta_ext.templates.errors import AluTemplateRefusal, KnobError
from vta_ext.templates.workload import GroupConv2dWorkload, window_size

__all__ = ["BlockSparseWorkload", "BlockSparseKnobs", "CompiledBlockSparse", "tile_grid", "units",
           "block_sparse_weight", "build_block_sparse", "tile_count"]


@dataclass(frozen=True)
class BlockSparseWorkload(GroupConv2dWorkload):
    """A grouped conv2d of ``groups`` groups of ``group_width`` channels run by the block-sparse
    program; ``in_channels == out_channels`` are the operator's own channels (not padded), which
    fix the tile grid (:func:`tile_grid`); ``batch`` is padded to ``BATCH``."""

    group_width: int = 1
    #: the program adds the bias by one GEMM of a constant block per output block
    #: (:func:`~.depthwise.diagonal_bias_gemm` decides whether it can)
    bias_gemm: bool = False
    #: tells this workload from the block-diagonal one in a record
    #: (:meth:`~.grouped.NarrowGroupTemplate.workload_from_dict`)
    sparse: bool = True


@dataclass(frozen=True)
class BlockSparseKnobs:
    """Output rows per tile (None: as many as the scratchpads hold). The program has one schedule
    rule: the presets ``"tps"``, ``"cycles"`` and ``"fallback"`` are all the default."""

    tile_h: Optional[int] = None


class CompiledBlockSparse(CompiledAluOp):
    """A compiled block-sparse grouped conv2d (``.program``, ``.run(data, kernel[, bias][,
    mult])``, see :class:`~vta_ext.templates.alu_program.CompiledAluOp`). With the bias by a
    GEMM, :meth:`run` takes the packed int32 bias and writes the GEMM's constant row and digit
    tiles (:func:`~.codegen.biasfold.gemm_bias_operands`) in its place."""

    def run(self, *packed_inputs, simulator=None):
        names = [n for n, _, _ in self.inputs]
        if "bias_row" not in names:
            return super().run(*packed_inputs, simulator=simulator)
        from .codegen.biasfold import gemm_bias_operands

        args = list(packed_inputs)
        at = names.index("bias_row")
        bias = np.asarray(args.pop(at))
        args[at:at] = gemm_bias_operands(bias[:1], self.config.BLOCK_IN)
        return super().run(*args, simulator=simulator)


# ------------------------------------------------------------------------------ tile structure
def tile_grid(channels: int, width: int, block: int) -> List[Tuple[int, ...]]:
    """Per output block, the input blocks of its nonzero weight tiles.

    Output block ``o`` holds channels ``o*block .. min((o+1)*block, channels) - 1``; each needs
    the input channels of its group (``width`` per group), and the input blocks those fall in are
    the nonzero tiles of row ``o`` (the padded channels need none).

    >>> tile_grid(48, 24, 16)
    [(0, 1), (0, 1, 2), (1, 2)]
    >>> tile_grid(72, 24, 16)[3:]
    [(3, 4), (3, 4)]
    """
    if channels % width:
        raise ValueError(f"tile_grid: {channels} channels are not whole groups of {width}")
    grid = []
    for o in range(-(-channels // block)):
        first, last = o * block, min((o + 1) * block, channels) - 1
        lo = first // width * width
        hi = (last // width + 1) * width - 1
        grid.append(tuple(range(lo // block, hi // block + 1)))
    return grid


def tile_count(channels: int, width: int, block: int) -> int:
    """Nonzero weight tiles per tap (:func:`tile_grid`): GEMM micro-ops per tap and pixel."""
    return sum(len(row) for row in tile_grid(channels, width, block))


def units(grid: Sequence[Tuple[int, ...]]) -> List[Tuple[int, int, int, int]]:
    """The units of a tile grid: maximal runs of output blocks whose input-block ranges overlap,
    as ``(first output block, output blocks, first input block, input blocks)``.

    >>> units(tile_grid(72, 24, 16))
    [(0, 3, 0, 3), (3, 2, 3, 2)]
    """
    out: List[List[int]] = []
    for o, row in enumerate(grid):
        if out and row[0] <= out[-1][3]:
            out[-1][1] += 1
            out[-1][3] = max(out[-1][3], row[-1])
        else:
            out.append([o, 1, row[0], row[-1]])
    return [(o0, n, i0, hi - i0 + 1) for o0, n, i0, hi in out]


def block_sparse_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """Grouped weights ``(C, w, KH, KW)`` -> the nonzero tiles ``(T, KH, KW, block, block)``
    (output lane, input lane) in :func:`tile_grid` order (output block, then input block): the
    dense block-diagonal matrix's tiles, zero where a lane is outside the channel's group or the
    channels."""
    c, w, kh, kw = weight.shape
    cp = -(-c // block) * block
    dense = np.zeros((cp, cp, kh, kw), weight.dtype)
    for g in range(c // w):
        dense[g * w:(g + 1) * w, g * w:(g + 1) * w] = weight[g * w:(g + 1) * w]
    tiles = [dense[o * block:(o + 1) * block, i * block:(i + 1) * block]
             for o, row in enumerate(tile_grid(c, w, block)) for i in row]
    return np.ascontiguousarray(np.stack(tiles).transpose(0, 3, 4, 1, 2))


# ------------------------------------------------------------------------------ program
def _refuse(what: str, why: str) -> None:
    raise AluTemplateRefusal(f"{what}: {why}")


def _check(cfg: VTAConfig, wl: BlockSparseWorkload, what: str) -> None:
    if cfg.BLOCK_IN != cfg.BLOCK_OUT:
        _refuse(what, f"needs square blocks (BLOCK_IN == BLOCK_OUT); {cfg.name} has "
                      f"{cfg.BLOCK_IN}x{cfg.BLOCK_OUT}")
    if wl.in_channels != wl.out_channels or wl.in_channels != wl.groups * wl.group_width:
        _refuse(what, "needs groups of as many output as input channels")
    if wl.batch % cfg.BATCH:
        _refuse(what, f"batch {wl.batch} is not a multiple of BATCH={cfg.BATCH}")
    if max(wl.pad_h, wl.pad_w) > MAX_DMA_PAD:
        _refuse(what, f"padding over the {MAX_DMA_PAD} the DMA pad fields hold")
    if wl.pad_h >= wl.kernel_h:
        _refuse(what, "a window of padding rows only (pad_h >= kernel_h)")
    if wl.out_height < 1 or wl.out_width < 1:
        _refuse(what, f"empty output {wl.out_height}x{wl.out_width}")


def build_block_sparse(cfg, workload: BlockSparseWorkload, epilogue=(),
                       knobs=None) -> CompiledBlockSparse:
    """Compile the block-sparse grouped conv2d + epilogue (module docstring) for ``cfg``.

    Layouts (``b = BATCH``, ``B = BLOCK``, ``CB = ceil(C / B)``, ``T`` nonzero tiles)::

        data    (N/b, CB, H, W, b, B)      int8
        kernel  (T, KH, KW, B, B)          int8   (:func:`block_sparse_weight`)
        bias    (1, CB, 1, 1, b, B)        int32  (with a ("bias",) stage)
        mult    (1, CB, 1, 1, b, B)        int32  (with a ("mulv",) stage)
        out     (N/b, CB, OH, OW, b, B)    int8

    Raises
    ------
    AluTemplateRefusal
        For a workload the program does not run (the reason says which), or when one output row
        of the largest unit does not fit the scratchpads.
    KnobError
        For knobs that are not :class:`BlockSparseKnobs` or whose tile does not fit.
    """
    t0 = time.perf_counter()
    cfg = load_config(cfg)
    wl = workload
    what = f"block-sparse group_conv2d {wl}"
    _check(cfg, wl, what)
    knobs = _knobs(knobs)
    epilogue = normalize_epilogue(epilogue)
    gemm_bias = GEMM_BIAS_STAGE in epilogue
    alu_epilogue = tuple(st for st in epilogue if st != GEMM_BIAS_STAGE)
    with_bias, with_mult = has_bias(alu_epilogue), has_multiplier(alu_epilogue)
    nvec = int(with_bias) + int(with_mult)
    B, blk = cfg.BATCH, cfg.BLOCK_IN
    grid = tile_grid(wl.in_channels, wl.group_width, blk)
    parts = units(grid)
    first_tile = np.cumsum([0] + [len(r) for r in grid]).tolist()
    NB, CB, T = wl.batch // B, len(grid), first_tile[-1]
    H, W, OH, OW = wl.height, wl.width, wl.out_height, wl.out_width
    KH, KW, PH, PW, SH, SW = wl.kernel_h, wl.kernel_w, wl.pad_h, wl.pad_w, wl.stride_h, wl.stride_w
    KK = KH * KW
    # the window row: the padded columns the outputs read (a stride may leave the last unread)
    Wp = window_size(OW, KW, SW)
    xs = min(W, Wp - PW)                     # real columns loaded, after PW of padding
    n_out = max(p[1] for p in parts)
    n_in = max(p[3] for p in parts)
    n_tiles = max(first_tile[o0 + n] - first_tile[o0] for o0, n, _, _ in parts)
    # per weight half: the unit's tiles, then (bias by GEMM) its output blocks' digit tiles
    wslot = n_tiles * KK + (n_out if gemm_bias else 0)

    def fits(th: int, slots: int) -> Optional[str]:
        """None if a tile of ``th`` output rows fits with ``slots`` SRAM halves, else the
        buffers it overflows."""
        need = {"input (inp)": (slots * n_in * window_size(th, KH, SH) * Wp + int(gemm_bias),
                                cfg.inp_depth),
                "weight (wgt)": (slots * wslot, cfg.wgt_depth),
                "accumulator (acc)": (slots * n_out * th * OW + nvec * n_out, cfg.acc_depth),
                "micro-op (uop)": (th * OW, min(gemm_kernel_uop_budget(cfg), MAX_LOOP_EXTENT))}
        over = [f"{name} {used} > {depth}" for name, (used, depth) in need.items() if used > depth]
        return "; ".join(over) or None

    # double buffering where one output row fits twice, else one copy of each buffer
    slots = 2 if not fits(1, 2) else 1
    if knobs.tile_h is not None:
        th = min(knobs.tile_h, OH)
        if fits(th, slots):
            raise KnobError(f"{what}: tile_h={th} does not fit: {fits(th, slots)}")
    else:
        if fits(1, slots):
            _refuse(what, f"one output row of a unit of {n_out} output and {n_in} input blocks "
                          f"does not fit: {fits(1, slots)}")
        th = max(t for t in range(1, OH + 1) if not fits(t, slots))

    win_rows = window_size(th, KH, SH)
    win_stride = win_rows * Wp
    out_size = n_out * th * OW
    INP = [s * n_in * win_stride for s in range(slots)]
    WGT = [s * wslot for s in range(slots)]
    ROW = slots * n_in * win_stride          # the bias GEMM's constant row
    BREG = 0
    MREG = BREG + (n_out if with_bias else 0)
    OUT0 = MREG + (n_out if with_mult else 0)

    q = CommandQueue(cfg)
    data_shape = (NB, CB, H, W, B, blk)
    kernel_shape = (T, KH, KW, blk, blk)
    vec_shape = (1, CB, 1, 1, B, blk)
    out_shape = (NB, CB, OH, OW, B, blk)
    data = q.alloc(int(np.prod(data_shape)), "data")
    kernel = q.alloc(int(np.prod(kernel_shape)), "kernel")
    bias_buf = q.alloc(int(np.prod(vec_shape)) * 4, "bias") if with_bias else None
    mult_buf = q.alloc(int(np.prod(vec_shape)) * 4, "mult") if with_mult else None
    row_shape, digit_shape = (B, blk), (1, CB, 1, 1, blk, blk)
    row_buf = q.alloc(int(np.prod(row_shape)), "bias_row") if gemm_bias else None
    digit_buf = q.alloc(int(np.prod(digit_shape)), "bias_digits") if gemm_bias else None
    out = q.alloc(int(np.prod(out_shape)), "out")
    loads, stores = LoadPipeline(q, slots), StorePipeline(q, slots)
    weights_in = [None] * slots        # the unit whose tiles each weight half holds
    vectors_in = None                  # the unit whose bias / multiplier rows the acc holds
    count = 0
    for n in range(NB):
        for o0, no, i0, ni in parts:
            tiles = [(o - o0, i - i0) for o in range(o0, o0 + no) for i in grid[o]]
            for oh0 in range(0, OH, th):
                thh = min(th, OH - oh0)
                px = thh * OW
                # ---- LOAD: the input window of the unit's input blocks, its weight tiles
                slot = loads.begin_load()
                r0 = oh0 * SH - PH
                nrows = window_size(thh, KH, SH)
                lo, hi = max(r0, 0), min(r0 + nrows, H)
                for k in range(ni):
                    q.load_2d(data, ((n * CB + i0 + k) * H + lo) * W, xs, hi - lo, W, PW, lo - r0,
                              Wp - PW - xs, r0 + nrows - hi, INP[slot] + k * win_stride,
                              MemType.INP)
                if gemm_bias and count == 0:
                    q.load_2d(row_buf, 0, 1, 1, 1, 0, 0, 0, 0, ROW, MemType.INP)
                if weights_in[slot] != o0:
                    q.load_2d(kernel, first_tile[o0] * KK, len(tiles) * KK, 1, len(tiles) * KK,
                              0, 0, 0, 0, WGT[slot], MemType.WGT)
                    if gemm_bias:
                        q.load_2d(digit_buf, o0, no, 1, no, 0, 0, 0, 0, WGT[slot] + n_tiles * KK,
                                  MemType.WGT)
                    weights_in[slot] = o0
                loads.end_load()
                # ---- COMPUTE: reset, one GEMM per nonzero tile, epilogue
                loads.begin_compute()
                OUT = OUT0 + stores.begin_tile() * out_size
                if (with_bias or with_mult) and vectors_in != (n, o0):
                    for buf, reg in ((bias_buf, BREG), (mult_buf, MREG)):
                        if buf is not None:
                            q.load_2d(buf, o0, no, 1, no, 0, 0, 0, 0, reg, MemType.ACC)
                    vectors_in = (n, o0)
                _zero(q, cfg, data, OUT, no * thh, OW)
                for t, (ol, il) in enumerate(tiles):
                    k = UopKernel("gemm")
                    k.loop_begin(KH, 0, Wp, KW)
                    k.loop_begin(KW, 0, 1, 1)
                    acc = OUT + ol * px
                    inp = INP[slot] + il * win_stride
                    for y in range(thh):
                        for x in range(OW):
                            k.push(acc + y * OW + x, inp + y * SH * Wp + x * SW,
                                   WGT[slot] + t * KK)
                    k.loop_end()
                    k.loop_end()
                    q.push_gemm(k)
                if gemm_bias:      # acc += the constant row x the digit tile of each output block
                    for ol in range(no):
                        k = UopKernel("gemm")
                        k.loop_begin(px, 1, 0, 0)
                        k.push(OUT + ol * px, ROW, WGT[slot] + n_tiles * KK + ol)
                        k.loop_end()
                        q.push_gemm(k)

                def vector(q_, op, reg, OUT=OUT, no=no, px=px):
                    alu(q_, op, [(OUT + o * px, reg + o) for o in range(no)], [(px, 1, 0)])

                emit_epilogue(q, cfg, alu_epilogue, OUT, no * px,
                              bias=(lambda q_: vector(q_, AluOp.ADD, BREG)) if with_bias else None,
                              mult=(lambda q_: vector(q_, AluOp.MUL, MREG)) if with_mult else None)
                loads.end_compute()
                stores.end_compute()
                # ---- STORE
                stores.begin_store()
                q.store_2d(OUT, MemType.OUT, out, ((n * CB + o0) * OH + oh0) * OW, px, no, OH * OW)
                stores.end_store()
                count += 1
    loads.finish()
    stores.finish()
    prog = q.synchronize()
    inputs = [("data", data_shape, np.int8), ("kernel", kernel_shape, np.int8)]
    if gemm_bias:
        inputs += [("bias_row", row_shape, np.int8), ("bias_digits", digit_shape, np.int8)]
    if with_bias:
        inputs.append(("bias", vec_shape, np.int32))
    if with_mult:
        inputs.append(("mult", vec_shape, np.int32))
    info = dict(tile_h=th, slots=slots, tiles=count, units=len(parts), weight_tiles=T,
                acc_init="fill" if zero_by_fill(cfg, n_out * th * OW) else "reset")
    return CompiledBlockSparse(cfg, wl, epilogue, prog, inputs, out_shape,
                               {"build": time.perf_counter() - t0}, info)


def zero_by_fill(cfg: VTAConfig, entries: int) -> bool:
    """Whether ``entries`` accumulator entries are zeroed sooner by one LOAD made only of
    padding (``y_size`` 0, one padding row of ``entries`` elements: no DRAM byte read, the
    ``"fill"`` of :mod:`.codegen.schedule`) than by a GEMM reset of ``entries`` micro-ops, by the
    cycle model's own durations (:func:`vta_ext.sim.cycles.timing`); a tie keeps the reset."""
    t = timing(cfg)
    fill = t.dma("ACC").cycles(1, 0, 0, entries)
    return fill < t.gemm_fixed + entries * t.gemm and entries < 1 << MEMOP_SIZE_BITS


def _zero(q: CommandQueue, cfg: VTAConfig, src, base: int, rows: int, cols: int) -> None:
    """Zero the accumulator rows ``[base, base + rows * cols)``: a padding-only LOAD where
    :func:`zero_by_fill` finds it faster (``src`` is only the DRAM base the LOAD names; it reads
    nothing), else the GEMM reset (:func:`_reset`)."""
    n = rows * cols
    if zero_by_fill(cfg, n):
        q.load_2d(src, 0, n, 0, n, 0, 1, 0, 0, base, MemType.ACC)
    else:
        _reset(q, base, rows, cols)


def _reset(q: CommandQueue, base: int, rows: int, cols: int) -> None:
    """Zero the accumulator rows ``[base, base + rows * cols)`` (a GEMM reset, two loops)."""
    k = UopKernel("gemm", reset=True)
    k.loop_begin(rows, cols, 0, 0)
    k.loop_begin(cols, 1, 0, 0)
    k.push(base)
    k.loop_end()
    k.loop_end()
    q.push_gemm(k)


def _knobs(knobs) -> BlockSparseKnobs:
    from vta_ext.templates.knobs import knobs_from

    return knobs_from(knobs, BlockSparseKnobs, {p: BlockSparseKnobs
                                                for p in ("tps", "cycles", "fallback")})
