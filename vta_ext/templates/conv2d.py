"""The ``conv2d_packed`` template: TE compute, s_tir schedule, lowering to a VTA program.

Layouts (as in the original ``vta/top/vta_conv2d.py``)::

    data    (N/b, C/ci, H, W, b, ci)        int8
    kernel  (O/co, C/ci, KH, KW, co, ci)    int8
    bias    (N/b or 1, O/co, 1, 1, b, co)   int32   (optional, loaded into the accumulator by DMA)
    mult    (N/b or 1, O/co, 1, 1, b, co)   int32   (optional per-channel multiplier, as the bias)
    out     (N/b, O/co, OH, OW, b, co)      int8    (the int32 accumulator truncated by STORE)

with ``b = BATCH``, ``ci = BLOCK_IN``, ``co = BLOCK_OUT`` of the configuration. Padding is a
``data_pad`` stage realised by the input DMA (zero padding); the accumulator then runs the epilogue
(:mod:`vta_ext.templates.epilogue`). A workload with ``groups`` (:mod:`.group_conv2d`) reduces
output-channel block ``o`` over the input-channel blocks of its group.

The schedule is that of the original (facts §5.10), knobs :class:`~.knobs.Conv2dKnobs`:

* output ``(b0, h0, co0, w0 | b1, co1, h1, w1, b_i, c_i)``, store point ``w0``; the virtual-thread
  splits of ``co0`` / ``h0`` outermost; the epilogue stages and the bias load at ``w0``;
* conv stage ``(n, k_o0, k_o1, w, d_j, d_i, co, h, b_i, c_i, k_i)`` with ``k_o`` split by
  ``tile_ci``; the input and weight caches at ``k_o0`` (at ``w0`` with one input-channel block);
* the reset (the reduction's init) before the first loop of the tile, as TE places it before the
  first reduction axis: one reset and one GEMM instruction per reduction step, never one per output
  column; the GEMM micro-op kernel folds the two outermost loops of the step.

``lean=True`` (csp-relaxed's block-diagonal programs, :mod:`tvm_csp_embed.depthwise`; the stock
strategy keeps the original program): the accumulator of each tile is zeroed by padding-only LOADs
at the tile's start (:data:`~vta_ext.lower.intrin.ACC_FILL_PRAGMA`; before its input and weight
loads, one cycle per row instead of a reset micro-op), and the tile's first loads wait for the
previous tile's last GEMM instead of its store (:func:`vta_ext.lower.sync.release_after_gemm`;
``generated.release`` says where it applied or why not): the next round's loads run under the
epilogue of the round before.

Entry point: :func:`build_conv2d` → :class:`CompiledConv2d` (``.program``, ``.run(...)``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Union

import numpy as np

from ..config import VTAConfig, load_config
from ..memory import ACC_SCOPE, INP_SCOPE, WGT_SCOPE
from .epilogue import (EPILOGUE_ORIGINAL, EPILOGUE_PIPELINE, GEMM_BIAS_STAGE, Epilogue,
                       normalize_epilogue, te_stage, vector_stages)
from .errors import Conv2dError, Conv2dRefusal, KnobError
from .knobs import Conv2dKnobs
from .tiling import check_knobs, group_span, resolve_knobs
from .workload import Conv2dWorkload, check_conv2d_workload, groups_of

__all__ = ["Conv2dWorkload", "Conv2dKnobs", "EPILOGUE_ORIGINAL", "EPILOGUE_PIPELINE",
           "conv2d_compute", "schedule_conv2d", "build_conv2d", "compile_conv2d", "CompiledConv2d",
           "Conv2dError"]


# ---------------------------------------------------------------------------------------------
# TE compute
# ---------------------------------------------------------------------------------------------
def _shapes(cfg: VTAConfig, wl: Conv2dWorkload, bias_batched: bool = True):
    B, BI, BO = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    g = groups_of(wl)
    data = (wl.batch // B, wl.in_channels // BI, wl.height, wl.width, B, BI)
    kernel = (wl.out_channels // BO, wl.in_channels // g // BI, wl.kernel_h, wl.kernel_w, BO, BI)
    out = (wl.batch // B, wl.out_channels // BO, wl.out_height, wl.out_width, B, BO)
    bias = ((wl.batch // B) if bias_batched else 1, wl.out_channels // BO, 1, 1, B, BO)
    return data, kernel, bias, out


def conv2d_compute(cfg: VTAConfig, wl: Conv2dWorkload, epilogue, bias_batched: bool = True):
    """The TE tensors of the packed conv2d + epilogue.

    Returns
    -------
    tuple
        ``(inputs, out, stage_names, padded)``: the placeholders (data, kernel[, bias]), the int8
        output tensor, the names of the epilogue stages and whether a padding stage exists.
    """
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
    groups = groups_of(wl)
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
    # the per-channel tensors of the vector stages (bias, multiplier), in VECTOR_STAGES order
    vectors = {kind: te.placeholder(bshape, "int32", name=_VECTOR_NAMES[kind])
               for kind in vector_stages(epilogue)}
    stage_names, bias_gemm = [], []
    for idx, st in enumerate(epilogue):
        if st == GEMM_BIAS_STAGE:
            res, bias_gemm = _bias_gemm_stage(cfg, wl, res, f"ep{idx}_{st[0]}")
        else:
            res = te.compute(oshape, _stage_fn(st, res, vectors.get(st[0]), bias_batched),
                             name=f"ep{idx}_{st[0]}")
        stage_names.append(res.op.name)
    final = res
    out = te.compute(oshape, lambda *i: final(*i).astype("int8"), name="out")
    inputs += bias_gemm + list(vectors.values())
    return inputs, out, stage_names, data_pad is not data


#: vector stage -> the name of its packed tensor (program buffer, ``shapes`` key)
_VECTOR_NAMES = {"bias": "bias", "mulv": "mult"}


def bias_gemm_shapes(cfg: VTAConfig, wl: Conv2dWorkload) -> Dict[str, tuple]:
    """The DRAM tensors of a ``("bias_gemm",)`` stage (:data:`~.epilogue.GEMM_BIAS_STAGE`):
    ``bias_row``, the constant input row (``BATCH`` by ``BLOCK_IN`` lanes, int8), and
    ``bias_digits``, one weight tile per output channel block (the per-channel bias's shape
    ``(1, O/co, 1, 1)``, then ``BLOCK_OUT`` by ``BLOCK_IN``, int8): the operands
    ``tvm_csp_embed.codegen.biasfold.gemm_bias_operands`` makes of a packed bias."""
    bshape = _shapes(cfg, wl, bias_batched=False)[2]
    return {"bias_row": (cfg.BATCH, cfg.BLOCK_IN),
            "bias_digits": bshape[:-2] + (cfg.BLOCK_OUT, cfg.BLOCK_IN)}


def _bias_gemm_stage(cfg: VTAConfig, wl: Conv2dWorkload, prev, name: str):
    """The bias GEMM as a TE stage: a reduction over the ``BLOCK_IN`` lanes of the constant row
    times the digit tile of each output's channel block, starting from ``prev`` (the
    accumulator); and its two placeholders (:func:`bias_gemm_shapes`)."""
    from tvm import te

    shapes = bias_gemm_shapes(cfg, wl)
    row = te.placeholder(shapes["bias_row"], "int8", name="bias_row")
    digits = te.placeholder(shapes["bias_digits"], "int8", name="bias_digits")
    zb = te.reduce_axis((0, cfg.BLOCK_IN), "z_b")
    res = te.compute(prev.shape, lambda n, o, y, x, b, j: te.sum(
        row[b, zb].astype("int32") * digits[0, o, 0, 0, j, zb].astype("int32"), axis=zb,
        init=prev(n, o, y, x, b, j)), name=name)
    return res, [row, digits]


def _stage_fn(stage, prev, bias, bias_batched: bool):
    """The TE ``fcompute`` of one epilogue stage over the 6-D output (a clip is one stage
    ``max(min(x, hi), lo)``, which the lowering emits as :func:`~.epilogue.alu_ops` does); a
    vector stage reads its per-channel tensor ``bias`` (the bias or the multiplier)."""
    if bias is not None:
        return lambda n, o, y, x, b, j: te_stage(stage, prev(n, o, y, x, b, j),
                                                 bias[n if bias_batched else 0, o, 0, 0, b, j])
    return lambda *i: te_stage(stage, prev(*i))


# ---------------------------------------------------------------------------------------------
# s_tir schedule
# ---------------------------------------------------------------------------------------------
def schedule_conv2d(cfg: VTAConfig, wl: Conv2dWorkload, epilogue, knobs: Conv2dKnobs,
                    bias_batched: bool = True, lean: bool = False):
    """Build the TE compute, schedule it (module docstring) and return ``(sch, info)``;
    ``lean``: the accumulator filled at the tile's start instead of reset (module docstring).

    Raises
    ------
    Conv2dRefusal
        For a workload the template does not implement.
    KnobError
        For knobs that are not a realisable point of the knob space.
    """
    from tvm import te
    from ..lower.schedule import continued_reduction, schedule_bias_gemm, unchecked_schedule

    from ..lower.intrin import register_gemm_intrin

    check_conv2d_workload(cfg, wl)
    k = check_knobs(cfg, wl, knobs)
    inputs, out, stage_names, padded = conv2d_compute(cfg, wl, epilogue, bias_batched)
    func = te.create_prim_func(inputs + [out]).with_attr("global_symbol", "conv2d_packed")
    gemm_name, reset_name = register_gemm_intrin(cfg)
    sch = unchecked_schedule(func)
    bias_gemm = [n for n in stage_names if n.endswith("_" + GEMM_BIAS_STAGE[0])]
    for prev, name in zip(["conv"] + stage_names, stage_names):
        if name in bias_gemm:      # it continues the accumulator of the stage before
            sch = unchecked_schedule(continued_reduction(sch, name, prev))
    B, BI, BO = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    nb, ob, OH, OW = wl.batch // B, wl.out_channels // BO, wl.out_height, wl.out_width
    groups = groups_of(wl)
    cb = wl.in_channels // BI // groups          # input-channel blocks reduced per output block
    opg = ob // groups                           # output-channel blocks per group

    # ---- output stage: (vthreads, b0, h0, co0, w0, b1, co1, h1, w1, b_i, c_i); store point w0
    out_blk = sch.get_sblock("out")
    x_b, x_co, x_h, x_w, x_bi, x_ci = sch.get_loops(out_blk)
    b0, b1 = sch.split(x_b, [nb // k.tile_b, k.tile_b])
    h0, h1 = sch.split(x_h, [OH // k.tile_h, k.tile_h])
    w0, w1 = sch.split(x_w, [OW // k.tile_w, k.tile_w])
    co0, co1 = sch.split(x_co, [ob // k.tile_co, k.tile_co])   # the full axis, as the original
    vthreads = []
    if k.h_nthread > 1:
        h0, hv = sch.split(h0, [None, k.h_nthread])
        vthreads.append(hv)
    if k.oc_nthread > 1:
        co0, cv = sch.split(co0, [None, k.oc_nthread])
        vthreads.append(cv)
    co_outer = [co0]
    if groups > 1 and k.tile_co < opg:
        # several tiles per group: (group, tile of the group) keeps the input-channel block
        # o // opg * cb + k_o affine (check_knobs made the thread split stay inside a group)
        co_outer = list(sch.split(co0, [groups, opg // k.tile_co // k.oc_nthread]))
    # virtual-thread axes go outermost (the original moves them before b_o and binds to cthread)
    sch.reorder(*vthreads[::-1], b0, h0, *co_outer, w0, b1, co1, h1, w1, x_bi, x_ci)
    for v in vthreads:
        sch.annotate(v, "vta_vthread", 1)

    # ---- epilogue stages and the conv stage live in the accumulator, computed at w0
    for name in reversed(["conv"] + stage_names):
        blk = sch.get_sblock(name)
        sch.set_scope(blk, 0, ACC_SCOPE)
        sch.compute_at(blk, w0)
    for kind in ("bias", "mulv"):  # the vector stages' tensors, loaded into the accumulator
        vec_ep = [n for n in stage_names if n.endswith(f"_{kind}")]
        if vec_ep:
            bblk = sch.cache_read(sch.get_sblock(vec_ep[0]), 1, ACC_SCOPE)
            sch.compute_at(bblk, w0)

    # ---- conv stage: (n, k_o0, k_o1, w, d_j, d_i, co, h, b_i, c_i, k_i)
    conv = sch.get_sblock("conv")
    names = ["n", "o", "y", "x", "b", "j", "k_o", "d_i", "d_j", "k_i"]
    extents = [k.tile_b, k.tile_co, k.tile_h, k.tile_w, B, BO, cb, wl.kernel_h, wl.kernel_w, BI]
    loops = sch.get_loops(conv)
    inner = iter(loops[len(loops) - sum(1 for e in extents if e > 1):])
    lmap = {nm: (next(inner) if e > 1 else None) for nm, e in zip(names, extents)}
    lmap["k_o0"] = lmap["k_o1"] = None
    if lmap["k_o"] is not None:
        lmap["k_o0"], lmap["k_o1"] = sch.split(lmap["k_o"], [cb // k.tile_ci, k.tile_ci])
    lmap["o_i"] = None
    span = group_span(cfg, wl, k)
    if span > 1 and opg > 1:
        # a tile of `span` whole groups: o as (group, block of the group) keeps o // opg affine
        lmap["o"], lmap["o_i"] = sch.split(lmap["o"], [span, opg])
    order = [lmap[nm] for nm in ("n", "k_o0", "k_o1", "x", "d_j", "d_i", "o", "o_i", "y", "b", "j",
                                 "k_i") if lmap[nm] is not None]
    sch.reorder(*order)
    anchor = lmap["k_o0"] if lmap["k_o0"] is not None else w0
    tens = lmap["b"] if B > 1 else lmap["j"]
    if lean:    # the fill first, so that the caches computed at w0 go after it
        _fill_accumulator(sch, conv, order[0] if order else tens)
    # input (padded by the DMA) and weight caches at the outer reduction loop
    if padded:
        pblk = sch.get_sblock("data_pad")
        sch.set_scope(pblk, 0, INP_SCOPE)
        sch.compute_at(pblk, anchor)
    else:
        iblk = sch.cache_read(conv, _read_index(sch, conv, "data"), INP_SCOPE)
        sch.compute_at(iblk, anchor)
    wblk = sch.cache_read(conv, _read_index(sch, conv, "kernel"), WGT_SCOPE)
    sch.compute_at(wblk, anchor)
    # the reset before the first loop of the tile's reduction nest (TE puts the init before the
    # first reduction axis, k_o0, which is present even with extent 1): one reset per tile and
    # batch block, covering all its output columns, channels and rows
    body = [lp for lp in order if lp is not lmap["n"]]
    if lean:
        sch.tensorize(tens, gemm_name)
    else:
        init = sch.decompose_reduction(conv, body[0] if body else tens)
        sch.tensorize(tens, gemm_name)
        iloops = sch.get_loops(init)
        sch.tensorize(iloops[-2] if B > 1 else iloops[-1], reset_name)
    for name in bias_gemm:
        schedule_bias_gemm(sch, name, w0, gemm_name, batched=B > 1)
    info = dict(stage_names=stage_names, padded=padded, inputs=[t.op.name for t in inputs],
                vthreads=len(vthreads), reuse=bool(k.reuse))
    return sch, info


def _read_index(sch, blk, name: str) -> int:
    """The index of buffer ``name`` among the reads of block ``blk`` (after the lean path's
    decomposition the update block also reads the accumulator)."""
    return [r.source.name for r in sch.get(blk).reads].index(name)


def _fill_accumulator(sch, conv, at) -> None:
    """The lean path's zero initialisation: the conv stage's init decomposed above ``at`` (the
    outermost loop of the tile's GEMM nest) and emitted as padding-only LOADs of the accumulator
    (:data:`vta_ext.lower.intrin.ACC_FILL_PRAGMA`)."""
    from ..lower.intrin import ACC_FILL_PRAGMA

    parents = next(i for i, lp in enumerate(sch.get_loops(conv)) if sch.get(lp).same_as(sch.get(at)))
    init = sch.decompose_reduction(conv, at)
    sch.annotate(sch.get_loops(init)[parents], ACC_FILL_PRAGMA, 1)


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
    program: Any
    shapes: Dict[str, tuple]
    timings: Dict[str, float]
    generated: Any = field(repr=False, default=None)
    #: for a ``("bias_gemm",)`` stage: packed int32 bias -> ``{"bias_row": ..., "bias_digits":
    #: ...}`` (:func:`bias_gemm_shapes`), set by whoever builds such a program
    bias_operands: Optional[Callable[[np.ndarray], Dict[str, np.ndarray]]] = field(
        repr=False, default=None)

    @property
    def gemm_bias(self) -> bool:
        """Whether the program adds the bias by a GEMM (a ``("bias_gemm",)`` stage): :meth:`run`
        turns the packed bias into the constant row and digit tiles (:attr:`bias_operands`)."""
        return "bias_digits" in self.shapes

    @property
    def has_bias(self) -> bool:
        """Whether the epilogue adds a bias tensor (a third :meth:`run` argument)."""
        return "bias" in self.shapes or self.gemm_bias

    @property
    def vector_names(self):
        """The names of the per-channel int32 tensors :meth:`run` takes after data and kernel:
        ``bias`` and / or ``mult`` (the per-channel multiplier), in that order."""
        return [n for n in ("bias", "mult") if n in self.shapes or (n == "bias" and self.gemm_bias)]

    def _write_gemm_bias(self, arr) -> None:
        """Write the bias GEMM's operands of the packed int32 bias ``arr``."""
        if self.bias_operands is None:
            raise Conv2dError("this program adds its bias by a GEMM: it needs bias_operands "
                              "(the constant row and digit tiles of a packed bias)")
        arr = np.asarray(arr)
        shape = _shapes(self.config, self.workload, bias_batched=False)[2]
        if arr.dtype != np.int32 or arr.shape[1:] != shape[1:] or (arr != arr[:1]).any():
            raise Conv2dError(f"bias: expected a per-channel int32 bias of shape {shape}, got "
                              f"{arr.shape} {arr.dtype}")
        for name, value in self.bias_operands(arr[:1]).items():
            self.program.write(name, self._check(name, value, np.int8))

    def _check(self, name, arr, dtype):
        arr = np.asarray(arr)
        shape = self.shapes[name]
        if name in ("bias", "mult") and arr.shape != shape and arr.ndim == 6 and arr.shape[0] == 1 \
                and arr.shape[1:] == shape[1:]:
            arr = np.broadcast_to(arr, shape)          # per-channel bias for every batch block
        if arr.shape != shape:
            raise Conv2dError(f"{name}: expected shape {shape}, got {arr.shape}")
        if arr.dtype != np.dtype(dtype):
            raise Conv2dError(f"{name}: expected dtype {dtype}, got {arr.dtype}")
        return np.ascontiguousarray(arr)

    def run(self, data_packed, kernel_packed, bias_packed=None, mult_packed=None, simulator=None):
        """Execute on the functional simulator; returns ``(out_packed_int8, SimStats)``.

        The per-channel tensors follow data and kernel in :attr:`vector_names` order: the bias
        (if the epilogue has a ``("bias",)`` stage), then the multiplier (``("mulv",)``); an
        epilogue with only a multiplier takes it as the third argument."""
        prog = self.program
        prog.write("data", self._check("data", data_packed, np.int8))
        prog.write("kernel", self._check("kernel", kernel_packed, np.int8))
        given = [v for v in (bias_packed, mult_packed) if v is not None]
        names = self.vector_names
        if len(given) < len(names):
            raise Conv2dError(f"this conv2d has a {' and a '.join(names)} stage: pass "
                              f"{' and '.join(n + '_packed' for n in names)}")
        if len(given) > len(names):
            extra = ("bias_packed", "('bias',)") if not names else ("mult_packed", "('mulv',)")
            raise Conv2dError(f"{extra[0]} given but the epilogue has no {extra[1]} stage")
        for name, arr in zip(names, given):
            if name == "bias" and self.gemm_bias:
                self._write_gemm_bias(arr)
                continue
            prog.write(name, self._check(name, arr, np.int32))
        t = time.perf_counter()
        stats = prog.run(simulator)
        self.timings["last_run"] = time.perf_counter() - t
        out = prog.read("out", np.int8, self.shapes["out"])
        return out, stats


def build_conv2d(cfg: Union[VTAConfig, str], workload: Conv2dWorkload, epilogue=(),
                 knobs=None, lean: bool = False) -> CompiledConv2d:
    """Compile a packed conv2d + epilogue for ``cfg`` into a :class:`CompiledConv2d`.

    Parameters
    ----------
    cfg : VTAConfig or str
        Configuration (or preset name).
    workload : Conv2dWorkload
        The layer (a :class:`~.workload.GroupConv2dWorkload` for a group conv2d).
    epilogue : sequence of tuples
        Requantisation stages (:mod:`vta_ext.templates.epilogue`).
    knobs : None, str, Conv2dKnobs or dict
        None or ``"tps"``: the Tiling Parameter Search (:func:`~.tiling.tps_knobs`);
        ``"tps-reuse"``: TPS with reuse-aware double buffering; ``"fallback"``: the original's
        fallback (every inner tile 1, one thread: exactly the original stack's instruction mix);
        explicit :class:`Conv2dKnobs` or a dict of its fields.
    lean : bool
        The accumulator filled at each tile's start and the tile's loads released by the previous
        tile's last GEMM (module docstring); False: the original program.

    Raises
    ------
    Conv2dRefusal
        For a workload the template does not implement, or when no tiling fits (a preset).
    KnobError
        For explicit knobs outside the knob space, or whose tiles do not fit the scratchpads (the
        message names the buffer and the knobs to reduce).
    """
    cfg = load_config(cfg)
    check_conv2d_workload(cfg, workload)
    epilogue = normalize_epilogue(epilogue)
    knobs, explicit = resolve_knobs(cfg, workload, epilogue, knobs)
    return compile_conv2d(cfg, workload, epilogue, knobs, explicit, lean)


def compile_conv2d(cfg: VTAConfig, workload: Conv2dWorkload, epilogue: Epilogue,
                   knobs: Conv2dKnobs, explicit: bool, lean: bool = False) -> CompiledConv2d:
    """:func:`build_conv2d` with resolved knobs and a normalised epilogue.

    ``explicit`` says whether the knobs were given by the caller (tiles that overflow a scratchpad
    then raise :class:`KnobError`) or chosen by a preset (then :class:`Conv2dRefusal`); ``lean``
    as :func:`build_conv2d`.
    """
    from ..lower.codegen import SramOverflowError, lower_to_runtime
    from ..lower.passes import lower_schedule
    from ..runtime import CommandQueue

    timings = {}
    t0 = time.perf_counter()
    sch, _ = schedule_conv2d(cfg, workload, epilogue, knobs, lean=lean)
    t1 = time.perf_counter()
    lowered = lower_schedule(sch.mod)
    func = lowered["main"] if "main" in [g.name_hint for g in lowered.functions] else \
        list(lowered.functions.values())[0]
    try:
        gen = lower_to_runtime(cfg, func, reuse=knobs.reuse, early_release=lean)
    except SramOverflowError as err:
        message = (f"{workload} with {knobs} on {cfg.name!r}: {err}. Reduce the tile knobs "
                   "(tile_h, tile_w, tile_co for the accumulator; tile_ci, tile_h, tile_w for the "
                   "input buffer; tile_ci, tile_co for the weight buffer) or the virtual threads "
                   "(oc_nthread, h_nthread double the tiles)")
        raise (KnobError if explicit else Conv2dRefusal)(message) from None
    t2 = time.perf_counter()
    dshape, kshape, bshape, oshape = _shapes(cfg, workload)
    shapes = {"data": dshape, "kernel": kshape, "out": oshape}
    for kind in vector_stages(epilogue):
        shapes[_VECTOR_NAMES[kind]] = bshape
    if GEMM_BIAS_STAGE in epilogue:
        shapes.update(bias_gemm_shapes(cfg, workload))
    q = CommandQueue(cfg)
    bufs = {}
    for name, shape in shapes.items():
        dtype = np.int32 if name in _VECTOR_NAMES.values() else np.int8
        bufs[name] = q.alloc(int(np.prod(shape)) * np.dtype(dtype).itemsize, name)
    gen.emit(q, bufs)
    prog = q.synchronize()
    t3 = time.perf_counter()
    timings.update(schedule=t1 - t0, lower=t2 - t1, generate=t3 - t2)
    return CompiledConv2d(cfg, workload, epilogue, knobs, prog, shapes, timings, gen)
