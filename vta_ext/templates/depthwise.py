"""Depthwise conv2d on the VTA ALU: a hand-scheduled runtime template.

This is **not** a TE / s_tir schedule: the program is written directly with the runtime
(:class:`vta_ext.runtime.CommandQueue`), once per workload. Entry point (``docs/templates-api.md``):
:func:`build_depthwise_conv2d` → :class:`CompiledDepthwiseConv2d` (``.program``,
``.run(data, kernel[, bias][, mult], simulator=None) -> (out_packed_int8, SimStats)``).

Layouts (``b = BATCH``, ``co = BLOCK_OUT``; groups = C = O, one filter per channel)::

    data    (N/b, C/co, H, W, b, co)      int8
    kernel  (C/co, KH, KW, b, co)         int8   (each channel's tap replicated over the b lanes)
    bias    (1, C/co, 1, 1, b, co)        int32  (only with a ("bias",) epilogue stage)
    mult    (1, C/co, 1, 1, b, co)        int32  (only with a ("mulv",) stage: per-channel multiplier)
    out     (N/b, C/co, OH, OW, b, co)    int8

A depthwise convolution has no reduction over channels, so the GEMM core (which reduces over
BLOCK_IN) does not apply; every channel lane is independent and the whole operator is lane-wise ALU
arithmetic on accumulator rows of ``b x co`` int32 lanes. Per tile (``tile_c`` channel blocks x
``tile_h`` output rows x all OW columns of one batch block):

1. LOAD ACC_8BIT (compute module, sign-extending) of the input window rows of each channel block,
   ``(tile_h-1)*stride_h + KH`` rows of ``W + 2*pad_w`` elements, zero-padded by the DMA; the
   kernel taps ``(KH*KW)`` and the bias of the tile's channel blocks (LOAD ACC_8BIT / ACC, reloaded
   only when the channel blocks change).
2. Tap (0, 0): ``out = window(0,0)`` (MUL imm 0 + ADD vector with the strided window: loops over the
   output rows, dst factor OW, src factor stride_h*(W+2*pad_w), and columns, 1 / stride_w), then
   ``out *= k[0,0]`` (MUL vector, source factor 0: the tap row broadcast over all positions).
   Every other tap (i, j): ``tmp = window(i,j)``, ``tmp *= k[i,j]``, ``out += tmp`` (4 ALU
   instructions per tap, each covering the whole tile). int32 arithmetic wraps like the GEMM's.
3. The epilogue (:mod:`vta_ext.templates.epilogue`; ``("bias",)`` is an ADD vector with source
   factor 0 from the bias row of each channel block, ``("mulv",)`` a MUL vector from the
   multiplier row, loaded like the bias), then STORE (truncating int32 to int8).

Output rows rotate through ``slots`` (default 2) accumulator regions synchronised with the store
module by :class:`~vta_ext.templates.alu_program.StorePipeline`; everything else is read and written
by the compute module only (in order), so it needs no tokens. Tiles are as large as the accumulator
(``acc_depth`` rows) allows; a single output row of one channel block that does not fit raises
:class:`~vta_ext.templates.errors.AluTemplateRefusal` naming the accumulator (the operator stays on
the CPU).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from ..config import EXTENSIONS, VTAConfig, load_config
from ..isa import AluOp, MemType
from ..layout import MAX_DMA_PAD
from ..runtime import CommandQueue
from .alu_program import (MAX_KERNEL_UOPS, CompiledAluOp, StorePipeline, alu, alu_range,
                          check_non_negative, check_positive, check_slots, choose_row_tiles,
                          copy_rows, require_multiple)
from .epilogue import emit_epilogue, has_bias, has_multiplier, normalize_epilogue
from .errors import AluTemplateError, AluTemplateRefusal
from .knobs import knobs_from
from .workload import ConvGeometry, window_size

__all__ = ["DepthwiseConv2dWorkload", "DepthwiseKnobs", "CompiledDepthwiseConv2d",
           "build_depthwise_conv2d", "AluTemplateError", "AluTemplateRefusal", "NEEDED_EXTENSIONS"]

#: the ISA features the template's program uses: the taps' products (ALU MUL) and the int8 input
#: windows and taps loaded into the accumulator (LOAD ACC_8BIT); a configuration without one is
#: refused up front, naming all that are missing
NEEDED_EXTENSIONS = ("ISA_ALU_MUL", "ISA_ACC_8BIT_LOAD")



@dataclass(frozen=True)
class DepthwiseConv2dWorkload(ConvGeometry):
    """A depthwise conv2d (groups = channels, one filter per channel) in NCHW terms."""

    batch: int
    channels: int
    height: int
    width: int
    kernel_h: int
    kernel_w: int
    pad_h: int
    pad_w: int
    stride_h: int
    stride_w: int


@dataclass(frozen=True)
class DepthwiseKnobs:
    """Output rows and channel blocks per tile (None = as large as the accumulator allows) and the
    output slots (2 = double buffering against the STORE module). The template has one schedule
    rule, so the presets ``"tps"`` and ``"fallback"`` are both the default ``DepthwiseKnobs()``."""

    tile_h: Optional[int] = None
    tile_c: Optional[int] = None
    slots: int = 2


class CompiledDepthwiseConv2d(CompiledAluOp):
    """A compiled depthwise conv2d (see :class:`~vta_ext.templates.alu_program.CompiledAluOp`)."""


def build_depthwise_conv2d(cfg: Union[VTAConfig, str], workload: DepthwiseConv2dWorkload,
                           epilogue=(), knobs=None) -> CompiledDepthwiseConv2d:
    """Compile a packed depthwise conv2d + epilogue for ``cfg``.

    ``knobs``: None / ``"tps"`` / ``"fallback"`` (all the default :class:`DepthwiseKnobs`), a
    :class:`DepthwiseKnobs` or a dict of its fields. Raises
    :class:`~vta_ext.templates.errors.AluTemplateRefusal` for workloads the template does not
    implement and :class:`~vta_ext.templates.errors.KnobError` for invalid knobs.
    """
    t0 = time.perf_counter()
    cfg = load_config(cfg)
    wl = workload
    if not isinstance(wl, DepthwiseConv2dWorkload):
        raise AluTemplateError(f"expected a DepthwiseConv2dWorkload, got {type(wl).__name__}")
    what = f"depthwise_conv2d {wl}"
    missing = [key for key in NEEDED_EXTENSIONS if not getattr(cfg, key)]
    if missing:
        raise AluTemplateRefusal(
            f"{what}: the ALU template needs {' and '.join(EXTENSIONS[k] for k in missing)}, "
            f"which configuration {cfg.name!r} does not have ({', '.join(missing)} false); enable "
            "them in the configuration, or build with strategy 'csp-relaxed', which runs "
            "depthwise convs on the GEMM core")
    check_positive(wl, ("batch", "channels", "height", "width", "kernel_h", "kernel_w", "stride_h",
                        "stride_w"), what)
    require_multiple(wl.batch, cfg.BATCH, "batch", "BATCH", what)
    require_multiple(wl.channels, cfg.BLOCK_OUT, "channels", "BLOCK_OUT", what)
    check_non_negative(wl, ("pad_h", "pad_w"), what, MAX_DMA_PAD, "the 4-bit DMA pad field")
    if wl.out_height < 1 or wl.out_width < 1:
        raise AluTemplateRefusal(f"{what}: empty output {wl.out_height}x{wl.out_width}")
    epilogue = normalize_epilogue(epilogue)
    with_bias = has_bias(epilogue)
    with_mult = has_multiplier(epilogue)
    nvec = int(with_bias) + int(with_mult)
    knobs = knobs_from(knobs, DepthwiseKnobs, {"tps": DepthwiseKnobs, "fallback": DepthwiseKnobs})
    slots = check_slots(knobs.slots, what)

    B, BO = cfg.BATCH, cfg.BLOCK_OUT
    NB, CB = wl.batch // B, wl.channels // BO
    H, W, OH, OW = wl.height, wl.width, wl.out_height, wl.out_width
    KH, KW, PH, PW, SH, SW = wl.kernel_h, wl.kernel_w, wl.pad_h, wl.pad_w, wl.stride_h, wl.stride_w
    KK = KH * KW
    Wp = W + 2 * PW

    def usage(th, tc, slots):
        win = tc * window_size(th, KH, SH) * Wp
        return win + tc * KK + tc * nvec + (1 + slots) * tc * th * OW

    th, tc, slots = choose_row_tiles(
        what, cfg, usage, OH, CB, slots, knobs.tile_h, knobs.tile_c, MAX_KERNEL_UOPS,
        f"{KH} input rows of {Wp} elements + taps + outputs")

    win_rows = window_size(th, KH, SH)
    win_stride = win_rows * Wp
    out_size = tc * th * OW
    IN = 0
    KREG = IN + tc * win_stride
    BREG = KREG + tc * KK
    MREG = BREG + (tc if with_bias else 0)
    TMP = MREG + (tc if with_mult else 0)
    OUT0 = TMP + out_size

    q = CommandQueue(cfg)
    data_shape = (NB, CB, H, W, B, BO)
    kernel_shape = (CB, KH, KW, B, BO)
    bias_shape = (1, CB, 1, 1, B, BO)
    out_shape = (NB, CB, OH, OW, B, BO)
    data = q.alloc(int(np.prod(data_shape)), "data")
    kernel = q.alloc(int(np.prod(kernel_shape)), "kernel")
    bias_buf = (q.alloc(int(np.prod(bias_shape)) * np.dtype(np.int32).itemsize, "bias")
                if with_bias else None)
    mult_buf = (q.alloc(int(np.prod(bias_shape)) * np.dtype(np.int32).itemsize, "mult")
                if with_mult else None)
    out = q.alloc(int(np.prod(out_shape)), "out")
    pipe = StorePipeline(q, slots)
    loaded_c0 = None
    n_tiles = 0
    for n in range(NB):
        for c0 in range(0, CB, tc):
            tcc = min(tc, CB - c0)
            for oh0 in range(0, OH, th):
                thh = min(th, OH - oh0)
                size = tcc * thh * OW
                slot = pipe.begin_tile()
                OUT = OUT0 + slot * out_size
                # 1. loads: input window (zero padding), taps and bias of the channel blocks
                r0 = oh0 * SH
                nrows = window_size(thh, KH, SH)
                lo, hi = max(r0, PH), min(r0 + nrows, PH + H)
                for c in range(tcc):
                    dst = IN + c * win_stride
                    if hi > lo:
                        q.load_2d(data, ((n * CB + c0 + c) * H + lo - PH) * W, W, hi - lo, W, PW,
                                  lo - r0, PW, r0 + nrows - hi, dst, MemType.ACC_8BIT)
                    else:  # the window rows are all padding
                        alu_range(q, AluOp.MUL, dst, nrows * Wp, 0)
                if loaded_c0 != (c0, tcc):
                    q.load_2d(kernel, c0 * KK, tcc * KK, 1, tcc * KK, 0, 0, 0, 0, KREG,
                              MemType.ACC_8BIT)
                    if with_bias:
                        q.load_2d(bias_buf, c0, tcc, 1, tcc, 0, 0, 0, 0, BREG, MemType.ACC)
                    if with_mult:
                        q.load_2d(mult_buf, c0, tcc, 1, tcc, 0, 0, 0, 0, MREG, MemType.ACC)
                    loaded_c0 = (c0, tcc)
                # 2. taps
                loops = [(thh, OW, SH * Wp), (OW, 1, SW)]
                bcast = [(thh * OW, 1, 0)]
                outs = [OUT + c * thh * OW for c in range(tcc)]
                tmps = [TMP + c * thh * OW for c in range(tcc)]
                for i in range(KH):
                    for j in range(KW):
                        first = i == 0 and j == 0
                        dst = outs if first else tmps
                        copy_rows(q, [(dst[c], IN + c * win_stride + i * Wp + j)
                                      for c in range(tcc)], loops)
                        alu(q, AluOp.MUL, [(dst[c], KREG + c * KK + i * KW + j)
                                           for c in range(tcc)], bcast)
                        if not first:
                            alu(q, AluOp.ADD, [(OUT, TMP)], [(size, 1, 1)])
                # 3. epilogue and store

                def add_bias(q_, outs=outs, tcc=tcc, thh=thh):
                    alu(q_, AluOp.ADD, [(outs[c], BREG + c) for c in range(tcc)], [(thh * OW, 1, 0)])

                def mul_mult(q_, outs=outs, tcc=tcc, thh=thh):
                    alu(q_, AluOp.MUL, [(outs[c], MREG + c) for c in range(tcc)], [(thh * OW, 1, 0)])

                emit_epilogue(q, cfg, epilogue, OUT, size, bias=add_bias if with_bias else None,
                              mult=mul_mult if with_mult else None)
                pipe.end_compute()
                pipe.begin_store()
                q.store_2d(OUT, MemType.OUT, out, ((n * CB + c0) * OH + oh0) * OW, thh * OW, tcc,
                           OH * OW)
                pipe.end_store()
                n_tiles += 1
    pipe.finish()
    prog = q.synchronize()
    inputs = [("data", data_shape, np.int8), ("kernel", kernel_shape, np.int8)]
    if with_bias:
        inputs.append(("bias", bias_shape, np.int32))
    if with_mult:
        inputs.append(("mult", bias_shape, np.int32))
    info = dict(tile_h=th, tile_c=tc, slots=slots, tiles=n_tiles, acc_used=usage(th, tc, slots))
    return CompiledDepthwiseConv2d(cfg, wl, epilogue, prog, inputs, out_shape,
                                   {"build": time.perf_counter() - t0}, info)
