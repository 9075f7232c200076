"""The ``conv2d_packed`` template: TE compute, s_tir schedule, lowering to a VTA program.

Layouts (as in the original ``vta/top/vta_conv2d.py``)::

    data    (N/b, C/ci, H, W, b, ci)        int8
    kernel  (O/co, C/ci, KH, KW, co, ci)    int8
    bias    (N/b or 1, O/co, 1, 1, b, co)   int32   (optional, loaded into the accumulator by DMA)
    out     (N/b, O/co, OH, OW, b, co)      int8    (the int32 accumulator truncated by STORE)

with ``b = BATCH``, ``ci = BLOCK_IN``, ``co = BLOCK_OUT`` of the configuration. Padding is a
``data_pad`` stage realised by the input DMA (zero padding); the accumulator then runs an epilogue of
element-wise ALU stages (see :data:`Epilogue`).

Entry point: :func:`build_conv2d` → :class:`CompiledConv2d` (``.program``, ``.run(...)``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Tuple, Union

import numpy as np

from ..config import VTAConfig, load_config

__all__ = ["Conv2dWorkload", "Conv2dKnobs", "resolve_knobs", "estimate_sram_usage", "suggest_knobs", "Epilogue", "EPILOGUE_ORIGINAL", "EPILOGUE_PIPELINE",
           "normalize_epilogue", "conv2d_compute", "schedule_conv2d", "build_conv2d",
           "build_conv2d_cached", "CompiledConv2d", "Conv2dError", "reference_conv2d"]


class Conv2dError(ValueError):
    """A workload / knob combination the template cannot compile (message says what to change)."""


@dataclass(frozen=True)
class Conv2dWorkload:
    """A conv2d in NCHW terms. Channels must be multiples of BLOCK_IN / BLOCK_OUT and the batch a
    multiple of BATCH (the caller pads)."""

    batch: int
    height: int
    width: int
    in_channels: int
    out_channels: int
    kernel_h: int
    kernel_w: int
    pad_h: int
    pad_w: int
    stride_h: int
    stride_w: int

    @property
    def out_height(self) -> int:
        return (self.height + 2 * self.pad_h - self.kernel_h) // self.stride_h + 1

    @property
    def out_width(self) -> int:
        return (self.width + 2 * self.pad_w - self.kernel_w) // self.stride_w + 1


@dataclass(frozen=True)
class Conv2dKnobs:
    """Schedule knobs of the original template (inner tile sizes; defaults = the autotvm fallback).

    ``tile_b``/``tile_h``/``tile_w``/``tile_co`` are the inner factors of the splits of the batch
    blocks, output rows, output columns and output-channel blocks (the output tile computed per store
    point); ``tile_ci`` the inner factor of the input-channel-block reduction (blocks loaded per DMA
    step). ``oc_nthread``/``h_nthread`` (1 or 2) add virtual threads over output-channel / row tiles.
    ``reuse`` (reuse-aware double buffering, needs exactly two virtual threads): a tile that both
    threads would load identically (the input tile with ``oc_nthread=2``, the weight tile with
    ``h_nthread=2``) is loaded once, alternating between the two buffer halves, and read by the GEMMs
    of both threads -- the order ``(I1,W1),(I1,W2),(I2,W1),(I2,W2)`` of the paper's §IV.D.
    """

    tile_b: int = 1
    tile_h: int = 1
    tile_w: int = 1
    tile_ci: int = 1
    tile_co: int = 1
    oc_nthread: int = 1
    h_nthread: int = 1
    reuse: bool = False


#: ``(conv >> 8) + bias``, clip [0, 127]: the original integration tests
EPILOGUE_ORIGINAL = (("shr", 8), ("bias",), ("clip", 0, 127))
#: ``(conv + bias) >> s``, clip: the Relax pipeline's requantisation (shift 8 shown)
EPILOGUE_PIPELINE = (("bias",), ("shr", 8), ("clip", 0, 127))

#: An epilogue is a sequence of stages applied to the int32 accumulator, in order:
#:   ("shr", s)          x >> s (arithmetic; ALU SHR with immediate; 0 <= s <= 31)
#:   ("bias",)           x + bias (int32 bias tensor DMA-loaded into the accumulator; ALU ADD)
#:   ("clip", lo, hi)    max(min(x, hi), lo): ALU CLIP if cfg.EXT_CLIP and int8 bounds, else
#:                       ALU MIN imm hi then ALU MAX imm lo (as the original)
#:   ("min", c) / ("max", c) / ("add", c)    a single ALU op with an immediate
#: followed implicitly by the truncating cast to int8 of the STORE.
Epilogue = Tuple[tuple, ...]


def normalize_epilogue(epilogue) -> Epilogue:
    """Validate an epilogue description and return it as a tuple of tuples."""
    if epilogue is None:
        return ()
    out = []
    n_bias = 0
    for st in epilogue:
        if isinstance(st, str):
            st = (st,)
        st = tuple(st)
        if not st:
            raise Conv2dError("empty epilogue stage")
        kind = st[0]
        if kind == "shr":
            if len(st) != 2 or not 0 <= int(st[1]) <= 31:
                raise Conv2dError(f"epilogue stage {st!r}: expected ('shr', s) with 0 <= s <= 31")
            out.append(("shr", int(st[1])))
        elif kind == "bias":
            if len(st) != 1:
                raise Conv2dError(f"epilogue stage {st!r}: expected ('bias',)")
            n_bias += 1
            out.append(("bias",))
        elif kind == "clip":
            if len(st) != 3 or int(st[1]) > int(st[2]):
                raise Conv2dError(f"epilogue stage {st!r}: expected ('clip', lo, hi) with lo <= hi")
            out.append(("clip", int(st[1]), int(st[2])))
        elif kind in ("min", "max", "add"):
            if len(st) != 2:
                raise Conv2dError(f"epilogue stage {st!r}: expected ({kind!r}, c)")
            out.append((kind, int(st[1])))
        else:
            raise Conv2dError(f"unknown epilogue stage {st!r}; known: shr, bias, clip, min, max, add")
        for v in out[-1][1:]:
            if not -(1 << 15) <= v < (1 << 15):
                raise Conv2dError(f"epilogue stage {st!r}: immediate {v} does not fit int16")
    if n_bias > 1:
        raise Conv2dError("at most one ('bias',) stage is supported")
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# numpy reference (used by tests and for self-checks)
# ---------------------------------------------------------------------------------------------
def reference_conv2d(cfg: VTAConfig, wl: Conv2dWorkload, epilogue, data_packed, kernel_packed,
                     bias_packed=None) -> np.ndarray:
    """Packed-layout reference: int64 conv, the epilogue, int8 wrap (independent of TVM)."""
    epilogue = normalize_epilogue(epilogue)
    d = np.asarray(data_packed).astype(np.int64)
    k = np.asarray(kernel_packed).astype(np.int64)
    nb, cb, H, W, b, ci = d.shape
    d = np.pad(d, ((0, 0), (0, 0), (wl.pad_h,) * 2, (wl.pad_w,) * 2, (0, 0), (0, 0)))
    OH, OW = wl.out_height, wl.out_width
    acc = np.zeros((nb, k.shape[0], OH, OW, b, k.shape[4]), np.int64)
    for di in range(wl.kernel_h):
        for dj in range(wl.kernel_w):
            win = d[:, :, di:di + wl.stride_h * (OH - 1) + 1:wl.stride_h,
                    dj:dj + wl.stride_w * (OW - 1) + 1:wl.stride_w]
            acc += np.einsum("ncyxbi,ocji->noyxbj", win, k[:, :, di, dj])
    acc = ((acc + (1 << 31)) % (1 << 32)) - (1 << 31)  # int32 wrap
    for st in epilogue:
        if st[0] == "shr":
            acc = acc >> st[1]
        elif st[0] == "bias":
            acc = acc + np.asarray(bias_packed).astype(np.int64)
        elif st[0] == "clip":
            acc = np.clip(acc, st[1], st[2])
        elif st[0] == "min":
            acc = np.minimum(acc, st[1])
        elif st[0] == "max":
            acc = np.maximum(acc, st[1])
        elif st[0] == "add":
            acc = acc + st[1]
        acc = ((acc + (1 << 31)) % (1 << 32)) - (1 << 31)
    return acc.astype(np.int8)


# ---------------------------------------------------------------------------------------------
# TE compute
# ---------------------------------------------------------------------------------------------
def _groups(wl) -> int:
    """Number of channel groups of a workload (1 for a plain :class:`Conv2dWorkload`)."""
    return int(getattr(wl, "groups", 1))


def _shapes(cfg: VTAConfig, wl: Conv2dWorkload, bias_batched: bool = True):
    B, BI, BO = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    g = _groups(wl)
    data = (wl.batch // B, wl.in_channels // BI, wl.height, wl.width, B, BI)
    kernel = (wl.out_channels // BO, wl.in_channels // g // BI, wl.kernel_h, wl.kernel_w, BO, BI)
    out = (wl.batch // B, wl.out_channels // BO, wl.out_height, wl.out_width, B, BO)
    bias = ((wl.batch // B) if bias_batched else 1, wl.out_channels // BO, 1, 1, B, BO)
    return data, kernel, bias, out


def check_workload(cfg: VTAConfig, wl: Conv2dWorkload) -> None:
    B, BI, BO = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    if wl.in_channels % BI:
        raise Conv2dError(f"in_channels={wl.in_channels} is not a multiple of BLOCK_IN={BI}; pad the "
                          "input channels (and the kernel) to a multiple of the block")
    if wl.out_channels % BO:
        raise Conv2dError(f"out_channels={wl.out_channels} is not a multiple of BLOCK_OUT={BO}; pad "
                          "the output channels (kernel and bias) to a multiple of the block")
    if wl.batch % B:
        raise Conv2dError(f"batch={wl.batch} is not a multiple of BATCH={B}; pad the batch")
    for name in ("batch", "height", "width", "in_channels", "out_channels", "kernel_h", "kernel_w",
                 "stride_h", "stride_w"):
        if getattr(wl, name) < 1:
            raise Conv2dError(f"{name}={getattr(wl, name)} must be >= 1")
    if wl.pad_h < 0 or wl.pad_w < 0:
        raise Conv2dError("padding must be >= 0")
    if wl.out_height < 1 or wl.out_width < 1:
        raise Conv2dError(f"empty output ({wl.out_height}x{wl.out_width})")
    if wl.pad_h >= 16 or wl.pad_w >= 16:
        raise Conv2dError(f"padding {wl.pad_h}x{wl.pad_w} exceeds the 4-bit DMA pad fields (max 15)")
    g = _groups(wl)
    if g != 1:
        if g < 1 or wl.in_channels % g or wl.out_channels % g:
            raise Conv2dError(f"groups={g} must be >= 1 and divide in_channels={wl.in_channels} "
                              f"and out_channels={wl.out_channels}")
        if (wl.in_channels // g) % BI or (wl.out_channels // g) % BO:
            raise Conv2dError(f"groups={g}: the channels per group ({wl.in_channels // g} in, "
                              f"{wl.out_channels // g} out) must be multiples of BLOCK_IN={BI} / "
                              f"BLOCK_OUT={BO}; use depthwise_conv2d for one channel per group")


def conv2d_compute(cfg: VTAConfig, wl: Conv2dWorkload, epilogue, bias_batched: bool = True):
    """The TE tensors of the packed conv2d + epilogue: (inputs, output)."""
    from tvm import te, tirx

    epilogue = normalize_epilogue(epilogue)
    dshape, kshape, bshape, oshape = _shapes(cfg, wl, bias_batched)
    P, Q, S, T_ = wl.pad_h, wl.pad_w, wl.stride_h, wl.stride_w
    data = te.placeholder(dshape, "int8", name="data")
    kernel = te.placeholder(kshape, "int8", name="kernel")
    if P or Q:
        H, W = wl.height, wl.width
        pshape = (dshape[0], dshape[1], H + 2 * P, W + 2 * Q, dshape[4], dshape[5])

        def _pad(n, c, y, x, b, i):
            conds = []
            if P:
                conds += [y >= P, y < H + P]
            if Q:
                conds += [x >= Q, x < W + Q]
            return tirx.if_then_else(tirx.all(*conds), data[n, c, y - P, x - Q, b, i],
                                     tirx.const(0, "int8"))
        data_pad = te.compute(pshape, _pad, name="data_pad")
    else:
        data_pad = data
    groups = _groups(wl)
    cbg = kshape[1]                                  # input-channel blocks per group
    opg = kshape[0] // groups                        # output-channel blocks per group
    ko = te.reduce_axis((0, cbg), "k_o")
    di = te.reduce_axis((0, wl.kernel_h), "d_i")
    dj = te.reduce_axis((0, wl.kernel_w), "d_j")
    ki = te.reduce_axis((0, cfg.BLOCK_IN), "k_i")
    res = te.compute(
        oshape,
        lambda n, o, y, x, b, j: te.sum(
            data_pad[n, (ko if groups == 1 else tirx.floordiv(o, opg) * cbg + ko),
                     y * S + di, x * T_ + dj, b, ki].astype("int32")
            * kernel[o, ko, di, dj, j, ki].astype("int32"), axis=[ko, di, dj, ki]),
        name="conv")
    inputs = [data, kernel]
    bias = None
    stage_names = []
    def _ew(prev, fn, name):
        return te.compute(oshape, lambda *i: fn(prev(*i)), name=name)

    for idx, st in enumerate(epilogue):
        prev = res
        name = f"ep{idx}_{st[0]}"
        if st[0] == "shr":
            res = _ew(prev, lambda v, s=st[1]: v >> tirx.const(s, "int32"), name)
        elif st[0] == "bias":
            bias = te.placeholder(bshape, "int32", name="bias")
            if bias_batched:
                res = te.compute(oshape, lambda n, o, y, x, b, j:
                                 prev(n, o, y, x, b, j) + bias[n, o, 0, 0, b, j], name=name)
            else:
                res = te.compute(oshape, lambda n, o, y, x, b, j:
                                 prev(n, o, y, x, b, j) + bias[0, o, 0, 0, b, j], name=name)
        elif st[0] == "clip":
            # one stage max(min(x, hi), lo): the lowering emits ALU CLIP when the configuration has
            # the EXT_CLIP extension (and int8 bounds), else ALU MIN hi then ALU MAX lo
            lo, hi = st[1], st[2]
            res = _ew(prev, lambda v: te.max(te.min(v, tirx.const(hi, "int32")),
                                             tirx.const(lo, "int32")), name)
        elif st[0] == "min":
            res = _ew(prev, lambda v, c=st[1]: te.min(v, tirx.const(c, "int32")), name)
        elif st[0] == "max":
            res = _ew(prev, lambda v, c=st[1]: te.max(v, tirx.const(c, "int32")), name)
        elif st[0] == "add":
            res = _ew(prev, lambda v, c=st[1]: v + tirx.const(c, "int32"), name)
        stage_names.append(res.op.name)
    final = res
    out = te.compute(oshape, lambda *i: final(*i).astype("int8"), name="out")
    if bias is not None:
        inputs.append(bias)
    return inputs, out, stage_names, data_pad is not data


# ---------------------------------------------------------------------------------------------
# s_tir schedule
# ---------------------------------------------------------------------------------------------
def _split_pair(sch, loop, inner: int, extent: int, what: str):
    if extent % inner:
        raise Conv2dError(f"knob {what}={inner} does not divide the axis length {extent}")
    return sch.split(loop, [extent // inner, inner])


def schedule_conv2d(cfg: VTAConfig, wl: Conv2dWorkload, epilogue, knobs: Conv2dKnobs,
                    bias_batched: bool = True):
    """Build the TE compute, schedule it (facts §5.10) and return ``(sch, info)``."""
    from tvm import te
    from tvm.s_tir import Schedule
    from ..lower.intrin import ACC_SCOPE, INP_SCOPE, WGT_SCOPE, register_gemm_intrin

    check_workload(cfg, wl)
    for name in ("oc_nthread", "h_nthread"):
        if getattr(knobs, name) not in (1, 2):
            raise Conv2dError(f"knob {name}={getattr(knobs, name)} must be 1 or 2")
    inputs, out, stage_names, padded = conv2d_compute(cfg, wl, epilogue, bias_batched)
    func = te.create_prim_func(inputs + [out]).with_attr("global_symbol", "conv2d_packed")
    gemm_name, reset_name = register_gemm_intrin(cfg)
    sch = Schedule(func)
    B, BI, BO = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    nb, ob, OH, OW = wl.batch // B, wl.out_channels // BO, wl.out_height, wl.out_width
    groups = _groups(wl)
    cb = wl.in_channels // BI // groups          # input-channel blocks reduced per output block
    if knobs.reuse and knobs.oc_nthread * knobs.h_nthread != 2:
        raise Conv2dError("knob reuse=True (reuse-aware double buffering) needs exactly two virtual "
                          f"threads (oc_nthread * h_nthread == 2), got oc_nthread={knobs.oc_nthread}, "
                          f"h_nthread={knobs.h_nthread}")

    # ---- output stage: (b0, h0, co0, w0, b1, co1, h1, w1, b_i, c_i); store point w0
    out_blk = sch.get_sblock("out")
    x_b, x_co, x_h, x_w, x_bi, x_ci = sch.get_loops(out_blk)
    b0, b1 = _split_pair(sch, x_b, knobs.tile_b, nb, "tile_b")
    h0, h1 = _split_pair(sch, x_h, knobs.tile_h, OH, "tile_h")
    w0, w1 = _split_pair(sch, x_w, knobs.tile_w, OW, "tile_w")
    if groups > 1:
        # output-channel blocks as (group, block within the group): the input-channel block index
        # o // opg * cb + k_o then simplifies to an affine g * cb + k_o
        xg, x_co = sch.split(x_co, [groups, ob // groups])
        co0, co1 = _split_pair(sch, x_co, knobs.tile_co, ob // groups, "tile_co")
    else:
        co0, co1 = _split_pair(sch, x_co, knobs.tile_co, ob, "tile_co")
    vthreads = []
    if knobs.h_nthread > 1:
        if (OH // knobs.tile_h) % knobs.h_nthread:
            raise Conv2dError(f"h_nthread={knobs.h_nthread} must divide OH/tile_h = {OH // knobs.tile_h}")
        h0, hv = sch.split(h0, [None, knobs.h_nthread])
        vthreads.append(hv)
    if knobs.oc_nthread > 1:
        if (ob // groups // knobs.tile_co) % knobs.oc_nthread:
            raise Conv2dError(f"oc_nthread={knobs.oc_nthread} must divide (O/BLOCK_OUT/groups)/tile_co"
                              f" = {ob // groups // knobs.tile_co}")
        co0, cv = sch.split(co0, [None, knobs.oc_nthread])
        vthreads.append(cv)
    # virtual-thread axes go outermost (the original moves them before b_o and binds to cthread)
    outer = [b0, h0, xg, co0, w0] if groups > 1 else [b0, h0, co0, w0]
    sch.reorder(*vthreads[::-1], *outer, b1, co1, h1, w1, x_bi, x_ci)
    for v in vthreads:
        sch.annotate(v, "vta_vthread", 1)

    # ---- epilogue stages and the conv stage live in the accumulator, computed at w0
    for name in reversed(["conv"] + stage_names):
        blk = sch.get_sblock(name)
        sch.set_scope(blk, 0, ACC_SCOPE)
        sch.compute_at(blk, w0)
    bias_ep = [n for n in stage_names if n.endswith("_bias")]
    if bias_ep:
        bblk = sch.cache_read(sch.get_sblock(bias_ep[0]), 1, ACC_SCOPE)
        sch.compute_at(bblk, w0)

    # ---- conv stage: (b, k_o0, w, d_j, d_i, co, h, k_o1, b_i, c_i, k_i)
    conv = sch.get_sblock("conv")
    names = ["n", "o", "y", "x", "b", "j", "k_o", "d_i", "d_j", "k_i"]
    extents = [knobs.tile_b, knobs.tile_co, knobs.tile_h, knobs.tile_w, B, BO, cb, wl.kernel_h,
               wl.kernel_w, BI]
    loops = sch.get_loops(conv)
    n_outer = len(loops) - sum(1 for e in extents if e > 1)
    inner = loops[n_outer:]
    lmap = {}
    it = iter(inner)
    for nm, e in zip(names, extents):
        lmap[nm] = next(it) if e > 1 else None
    if cb % knobs.tile_ci:
        raise Conv2dError(f"knob tile_ci={knobs.tile_ci} does not divide C/BLOCK_IN = {cb}")
    if lmap["k_o"] is not None:
        lmap["k_o0"], lmap["k_o1"] = sch.split(lmap["k_o"], [cb // knobs.tile_ci, knobs.tile_ci])
    else:
        lmap["k_o0"] = lmap["k_o1"] = None
    order = [lmap[k] for k in ("n", "k_o0", "x", "d_j", "d_i", "o", "y", "k_o1", "b", "j", "k_i")
             if lmap[k] is not None]
    sch.reorder(*order)
    anchor = lmap["k_o0"] if lmap["k_o0"] is not None else w0
    # input (padded by the DMA) and weight caches at the outer reduction loop
    if padded:
        pblk = sch.get_sblock("data_pad")
        sch.set_scope(pblk, 0, INP_SCOPE)
        sch.compute_at(pblk, anchor)
    else:
        iblk = sch.cache_read(conv, 0, INP_SCOPE)
        sch.compute_at(iblk, anchor)
    wblk = sch.cache_read(conv, 1, WGT_SCOPE)
    sch.compute_at(wblk, anchor)
    # reset (init) at the outermost reduction loop
    tens = lmap["b"] if B > 1 else lmap["j"]
    red_first = next((lmap[k] for k in ("k_o0", "d_j", "d_i", "k_o1") if lmap[k] is not None), tens)
    init = sch.decompose_reduction(conv, red_first)
    sch.tensorize(tens, gemm_name)
    iloops = sch.get_loops(init)
    sch.tensorize(iloops[-2] if B > 1 else iloops[-1], reset_name)
    info = dict(stage_names=stage_names, padded=padded, inputs=[t.op.name for t in inputs],
                vthreads=len(vthreads), reuse=bool(knobs.reuse))
    return sch, info


# ---------------------------------------------------------------------------------------------
# knob selection
# ---------------------------------------------------------------------------------------------
def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def estimate_sram_usage(cfg: VTAConfig, wl: Conv2dWorkload, knobs: Conv2dKnobs,
                        with_bias: bool = True) -> Dict[str, int]:
    """On-chip elements the schedule allocates (all virtual threads), per scope, as the lowering
    will (``inp``, ``wgt``, ``acc``)."""
    k = knobs
    T_ = k.oc_nthread * k.h_nthread
    win_h = (k.tile_h - 1) * wl.stride_h + wl.kernel_h
    win_w = (k.tile_w - 1) * wl.stride_w + wl.kernel_w
    inp = k.tile_b * k.tile_ci * win_h * win_w
    wgt = k.tile_co * k.tile_ci * wl.kernel_h * wl.kernel_w
    acc = k.tile_b * k.tile_co * (k.tile_h * k.tile_w + (1 if with_bias else 0))
    return {"inp": inp * T_, "wgt": wgt * T_, "acc": acc * T_}


def suggest_knobs(cfg: VTAConfig, wl: Conv2dWorkload, epilogue=EPILOGUE_ORIGINAL,
                  max_uops: int = 512) -> Conv2dKnobs:
    """A reasonable schedule: the knobs minimising an estimate of DRAM traffic plus instruction
    count among those whose tiles fit the scratchpads; two virtual threads are preferred when they
    fit (load/compute overlap). Deterministic; not a tuner."""
    cfg = load_config(cfg)
    check_workload(cfg, wl)
    with_bias = any(st[0] == "bias" for st in normalize_epilogue(epilogue))
    B = cfg.BATCH
    nb, cb = wl.batch // B, wl.in_channels // cfg.BLOCK_IN
    ob, OH, OW = wl.out_channels // cfg.BLOCK_OUT, wl.out_height, wl.out_width
    K2 = wl.kernel_h * wl.kernel_w
    limits = {"inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "acc": cfg.acc_depth}
    best, best_cost = Conv2dKnobs(), None
    for tb in _divisors(nb):
        for th in _divisors(OH):
            for tw in _divisors(OW):
                for tco in _divisors(ob):
                    for tci in _divisors(cb):
                        for ocn in (1, 2):
                            if (ob // tco) % ocn:
                                continue
                            for hn in (1, 2):
                                if (OH // th) % hn:
                                    continue
                                kn = Conv2dKnobs(tb, th, tw, tci, tco, ocn, hn)
                                use = estimate_sram_usage(cfg, wl, kn, with_bias)
                                if any(use[m] > limits[m] for m in use):
                                    continue
                                # GEMM micro-ops: loops below the two folded ones are unrolled
                                inner = [e for e in (tw, wl.kernel_w, wl.kernel_h, tco, th, tci, tb)
                                         if e > 1]
                                uops = 1
                                for e in inner[2:]:
                                    uops *= e
                                if uops > max_uops:
                                    continue
                                tiles = (nb // tb) * (ob // tco) * (OH // th) * (OW // tw)
                                win = ((th - 1) * wl.stride_h + wl.kernel_h) * \
                                      ((tw - 1) * wl.stride_w + wl.kernel_w)
                                inp_b = tiles * tb * cb * win * cfg.inp_elem_bytes
                                wgt_b = tiles * tco * cb * K2 * cfg.wgt_elem_bytes
                                insns = tiles * ((cb // tci) * (2 + 3 * tci) + 8)
                                cost = (inp_b + wgt_b + 64 * insns) * (0.75 if ocn * hn > 1 else 1.0)
                                if best_cost is None or cost < best_cost:
                                    best, best_cost = kn, cost
    return best


# ---------------------------------------------------------------------------------------------
# build: schedule -> lowered TIR -> runtime calls -> Program
# ---------------------------------------------------------------------------------------------
@dataclass
class CompiledConv2d:
    """A conv2d compiled into one VTA :class:`~vta_ext.runtime.Program` (instruction stream, micro-ops
    and DRAM image, built once). :meth:`run` only copies the inputs into the DRAM image, executes and
    reads the output back."""

    config: VTAConfig
    workload: Conv2dWorkload
    epilogue: Epilogue
    knobs: Conv2dKnobs
    program: object
    shapes: Dict[str, tuple]
    timings: Dict[str, float]
    generated: object = field(repr=False, default=None)

    @property
    def has_bias(self) -> bool:
        return "bias" in self.shapes

    def _check(self, name, arr, dtype):
        arr = np.asarray(arr)
        shape = self.shapes[name]
        if name == "bias" and arr.shape != shape and arr.ndim == 6 and arr.shape[0] == 1 \
                and arr.shape[1:] == shape[1:]:
            arr = np.broadcast_to(arr, shape)          # per-channel bias for every batch block
        if arr.shape != shape:
            raise Conv2dError(f"{name}: expected shape {shape}, got {arr.shape}")
        if arr.dtype != np.dtype(dtype):
            raise Conv2dError(f"{name}: expected dtype {dtype}, got {arr.dtype}")
        return np.ascontiguousarray(arr)

    def run(self, data_packed, kernel_packed, bias_packed=None, simulator=None):
        """Execute on the functional simulator; returns ``(out_packed_int8, SimStats)``."""
        prog = self.program
        prog.write("data", self._check("data", data_packed, np.int8))
        prog.write("kernel", self._check("kernel", kernel_packed, np.int8))
        if self.has_bias:
            if bias_packed is None:
                raise Conv2dError("this conv2d has a bias stage: pass bias_packed")
            prog.write("bias", self._check("bias", bias_packed, np.int32))
        elif bias_packed is not None:
            raise Conv2dError("bias_packed given but the epilogue has no ('bias',) stage")
        t = time.perf_counter()
        stats = prog.run(simulator)
        self.timings["last_run"] = time.perf_counter() - t
        out = prog.read("out", np.int8, self.shapes["out"])
        return out, stats


def resolve_knobs(cfg: VTAConfig, workload: Conv2dWorkload, epilogue,
                  knobs: Union[Conv2dKnobs, str, None]) -> Conv2dKnobs:
    """Map the ``knobs`` argument of :func:`build_conv2d` to explicit :class:`Conv2dKnobs`.

    ``None`` or ``"tps"``: the Tiling Parameter Search (:func:`vta_ext.templates.tiling.tps_knobs`);
    ``"tps-reuse"``: TPS with reuse-aware double buffering allowed; ``"fallback"``: the original's
    fallback (all inner tiles 1); ``"auto"``: :func:`suggest_knobs`.
    """
    if isinstance(knobs, Conv2dKnobs):
        return knobs
    if knobs is None or knobs in ("tps", "tps-reuse"):
        from .tiling import tps_knobs
        return tps_knobs(cfg, workload, epilogue, reuse=knobs == "tps-reuse").knobs
    if knobs == "fallback":
        return Conv2dKnobs()
    if knobs == "auto":
        return suggest_knobs(cfg, workload, epilogue)
    raise Conv2dError(f"knobs must be Conv2dKnobs, None, 'tps', 'tps-reuse', 'fallback' or 'auto', "
                      f"got {knobs!r}")


def build_conv2d(cfg: Union[VTAConfig, str], workload: Conv2dWorkload, epilogue=(),
                 knobs: Union[Conv2dKnobs, str, None] = None) -> CompiledConv2d:
    """Compile a packed conv2d + epilogue for ``cfg`` into a :class:`CompiledConv2d`.

    ``knobs``: None (or ``"tps"``) = the Tiling Parameter Search of :mod:`.tiling` (the tiling
    minimising modelled DRAM bytes among those fitting the scratchpads); ``"tps-reuse"`` = TPS with
    reuse-aware double buffering; ``"fallback"`` (or ``Conv2dKnobs()``) = the original's fallback
    schedule (inner tiles 1, no virtual threads; exactly the original stack's instruction mix);
    ``"auto"`` = :func:`suggest_knobs`; or explicit :class:`Conv2dKnobs`.

    Raises :class:`Conv2dError` for workloads/knobs the template cannot handle and
    :class:`vta_ext.lower.codegen.LoweringError` (a ``ValueError``) if the tiles do not fit the
    on-chip buffers (the message names the buffer and the knobs to reduce).
    """
    from ..lower.codegen import SramOverflowError, lower_to_runtime
    from ..lower.passes import lower_schedule
    from ..runtime import CommandQueue

    cfg = load_config(cfg)
    epilogue = normalize_epilogue(epilogue)
    knobs = resolve_knobs(cfg, workload, epilogue, knobs)
    timings = {}
    t0 = time.perf_counter()
    sch, info = schedule_conv2d(cfg, workload, epilogue, knobs)
    t1 = time.perf_counter()
    lowered = lower_schedule(sch.mod)
    func = lowered["main"] if "main" in [g.name_hint for g in lowered.functions] else \
        list(lowered.functions.values())[0]
    try:
        gen = lower_to_runtime(cfg, func, reuse=knobs.reuse)
    except SramOverflowError as err:
        raise Conv2dError(f"{workload} with {knobs} on {cfg.name!r}: {err}. Reduce the tile knobs "
                          "(tile_h, tile_w, tile_co for the accumulator; tile_ci, tile_h, tile_w for "
                          "the input buffer; tile_ci, tile_co for the weight buffer) or the virtual "
                          "threads (oc_nthread, h_nthread double the tiles)") from None
    t2 = time.perf_counter()
    dshape, kshape, bshape, oshape = _shapes(cfg, workload)
    shapes = {"data": dshape, "kernel": kshape, "out": oshape}
    if any(st[0] == "bias" for st in epilogue):
        shapes["bias"] = bshape
    q = CommandQueue(cfg)
    bufs = {}
    for name, shape in shapes.items():
        itemsize = 4 if name == "bias" else 1
        bufs[name] = q.alloc(int(np.prod(shape)) * itemsize, name)
    gen.emit(q, bufs)
    prog = q.synchronize()
    t3 = time.perf_counter()
    timings.update(schedule=t1 - t0, lower=t2 - t1, generate=t3 - t2)
    return CompiledConv2d(cfg, workload, epilogue, knobs, prog, shapes, timings, gen)


_CACHE: Dict[tuple, CompiledConv2d] = {}


def build_conv2d_cached(cfg: Union[VTAConfig, str], workload: Conv2dWorkload,
                        epilogue=(), knobs: Union[Conv2dKnobs, str, None] = None,
                        max_entries: int = 64) -> CompiledConv2d:
    """:func:`build_conv2d` memoised on (config, workload, epilogue, knobs). The returned object is
    shared: its :meth:`~CompiledConv2d.run` rewrites the same DRAM image, so do not run it from
    several threads at once."""
    cfg = load_config(cfg)
    knobs = resolve_knobs(cfg, workload, normalize_epilogue(epilogue), knobs)
    key = (cfg, workload, normalize_epilogue(epilogue), knobs)
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= max_entries:
            _CACHE.pop(next(iter(_CACHE)))
        hit = _CACHE[key] = build_conv2d(cfg, workload, epilogue, knobs)
    return hit
