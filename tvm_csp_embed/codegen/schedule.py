"""The packed TE compute of a :class:`~.plan.PackedGemm` and its s_tir schedule.

Compute (instruction axes innermost)::

    C[c..., x, y] = sum over the free reduction loops and z of
                    int32(A[a(...), x, z]) * int32(B[b(...), y, z])

with every packed index an affine expression of the free loops (:class:`~.plan.PackedDim`). An
input padded by the DMA reads through a ``<tensor>_pad`` stage (``if_then_else`` on the padded
dims), as the stock conv2d's ``data_pad``. The epilogue stages run on the accumulator
(:func:`vta_ext.templates.epilogue.te_stage`), a bias is the per-channel tensor of
:meth:`~.plan.PackedGemm.bias_layout`; the ``out`` stage truncates to int8.

Schedule (the rule of the stock ``conv2d_packed``, stated on loop roles, :func:`~.loops.loop_orders`):

* output: every free loop split by its ``tile_`` knob; outer loops ordered batch, image rows
  but the last, output channels, the last image row (the store point); virtual-thread splits of
  the outer output-channel and first-row loops outermost; inner loops in packed order, then the
  lanes;
* the GEMM stage and the epilogue in the accumulator at the store point, the bias loaded there
  (or, for a ``("bias_gemm",)`` stage, its constant row and digit tiles, for one more GEMM
  instruction that continues the accumulator, :func:`_schedule_gemm_bias`);
* GEMM stage: batch | z-tile outer loops (the load point of the input and weight caches) | z-tile
  inner loops, last image row, the other reductions innermost-first, output channels, other image
  rows | lanes; the GEMM intrinsic tensorized at the lanes (the batch lane with ``BATCH > 1``, else
  the ``BLOCK_OUT`` lane); the accumulator zeroed (:data:`ACC_INITS`) either for the whole tile
  before the GEMM loops by padding-only LOADs (``"fill"``, marked with
  :data:`vta_ext.lower.intrin.ACC_FILL_PRAGMA`) or by the reset intrinsic before the first loop
  after the batch (``"reset"``, the stock rule).

The lowering is :mod:`vta_ext.lower` (``lower_schedule`` then ``lower_to_runtime``).
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from vta_ext.templates.epilogue import (GEMM_BIAS_STAGE, RESIDUAL_STAGE, RESIDUAL_TENSOR,
                                        int8_bounds)

#: the DRAM name of the residual GEMM's identity weight tile (:func:`_residual_stage`)
RESIDUAL_IDENTITY = "residual_identity"

from .loops import loop_orders
from .plan import AXIS_PREFIX, PackedDim, PackedGemm
from .poolstage import POOL_STAGE, PoolStage, conv_env, domain_shape, pool_stage, row_domain

__all__ = ["gemm_compute", "schedule_gemm", "bias_shape", "gemm_bias_shapes", "ACC_INITS",
           "acc_init_of"]

#: how the accumulator of each output tile starts from zero (:func:`schedule_gemm`): ``"fill"``,
#: LOADs of the accumulator made only of padding (one cycle per element written on the compute
#: module, no micro-op, no DRAM byte); ``"reset"``, GEMM reset micro-ops (the stock templates'
#: rule, ``GEMM_CYCLES_PER_UOP`` per element)
ACC_INITS = ("fill", "reset")


def acc_init_of(pg: PackedGemm) -> str:
    """The initialisation a build of ``pg`` uses by default: ``"reset"`` for a strict embedding
    (``csp-strict`` is the stock mapping family with the stock code: its programs equal the stock
    template's), else ``"fill"``."""
    return "reset" if pg.embedding.mode == "strict" else "fill"

#: the TIR name of an instruction-axis variable
_AXIS_NAMES = {"x": "x_i", "y": "y_i", "z": "z_i"}


def bias_shape(pg: PackedGemm) -> Tuple[int, ...]:
    """Shape of the packed bias: the output's, with 1 on the free dims the channel does not index."""
    out = []
    for d in pg.operands["C"].dims:
        v = d.terms[0][0]
        out.append(d.extent if v.startswith(AXIS_PREFIX) or v in pg.channel_loops else 1)
    return tuple(out)


def _index(dim: PackedDim, env: Mapping[str, object]):
    expr = None
    for v, c in dim.terms:
        term = env[v] if c == 1 else env[v] * c
        expr = term if expr is None else expr + term
    if dim.const or expr is None:
        expr = dim.const if expr is None else expr + dim.const
    return expr


def gemm_compute(cfg, pg: PackedGemm, epilogue, pool: Optional[PoolStage] = None):
    """The TE tensors of the packed GEMM + epilogue (+ the fused max pool ``pool``, a
    :class:`~.poolstage.PoolStage`: the conv's stages on its tiled row domain, then the pool
    stage, :mod:`.poolstage`).

    Returns
    -------
    tuple
        ``(inputs, out, stage_names, pad_stage)``: placeholders (A, B[, bias]), the int8 output,
        the epilogue stage names and the name of A's padding stage (None without device padding).
    """
    from tvm import te, tirx

    from vta_ext.templates.epilogue import normalize_epilogue

    epilogue = normalize_epilogue(epilogue)
    A, B, C = (pg.operands[r] for r in "ABC")
    if B.device_padded:
        raise ValueError("only operand A (the input buffer) can be padded by the DMA")
    a = te.placeholder(A.stored_shape, "int8", name=A.tensor)
    b = te.placeholder(B.stored_shape, "int8", name=B.tensor)
    a_src, pad_stage = a, None
    if A.device_padded:
        pad_stage = f"{A.tensor}_pad"

        def _pad(*idx):
            conds, src = [], []
            for i, d in zip(idx, A.dims):
                if d.padded:
                    if d.stored_lo:
                        conds.append(i >= d.stored_lo)
                    if d.stored_lo + d.stored_extent < d.extent:
                        conds.append(i < d.stored_lo + d.stored_extent)
                    src.append(i - d.stored_lo)
                else:
                    src.append(i)
            return tirx.if_then_else(tirx.all(*conds), a[tuple(src)], tirx.const(0, "int8"))
        a_src = te.compute(A.shape, _pad, name=pad_stage)
    red = {lp.name: te.reduce_axis((0, lp.extent), lp.name) for lp in pg.loops if lp.reduction}
    zax = te.reduce_axis((0, pg.axes["z"]), _AXIS_NAMES["z"])
    c_vars = [d.terms[0][0] for d in C.dims]
    shape = C.shape if pool is None else domain_shape(pg, pool)

    def body(*ivs):
        env = dict(zip(c_vars, ivs)) if pool is None else conv_env(pg, pool, ivs)
        env.update(red)
        env[AXIS_PREFIX + "z"] = zax
        ia = tuple(_index(d, env) for d in A.dims)
        ib = tuple(_index(d, env) for d in B.dims)
        return te.sum(a_src[ia].astype("int32") * b[ib].astype("int32"),
                      axis=list(red.values()) + [zax])
    res = te.compute(shape, body, name="gemm")
    inputs = [a, b]
    bias = None
    stage_names = []
    extra = []      # the residual operand, an input after the bias
    bshape = bias_shape(pg)
    for idx, st in enumerate(epilogue):
        if st == GEMM_BIAS_STAGE:
            res, operands = _gemm_bias_stage(pg, res, bshape, f"ep{idx}_{st[0]}", pool)
            inputs += operands
            stage_names.append(res.op.name)
            continue
        if st == RESIDUAL_STAGE:
            res, operands = _residual_stage(pg, res, f"ep{idx}_{st[0]}")
            extra += operands
            stage_names.append(res.op.name)
            continue
        if st[0] == "bias":
            bias = te.placeholder(bshape, "int32", name="bias")
        res = te.compute(shape, _stage_fn(st, res, bias, bshape, pg, pool),
                         name=f"ep{idx}_{st[0]}")
        stage_names.append(res.op.name)
    if pool is not None:
        res = pool_stage(pg, res, pool, int8_bounds(epilogue)[0])
        stage_names.append(res.op.name)
    final = res
    out = te.compute(final.shape, lambda *i: final(*i).astype("int8"), name="out")
    if bias is not None:
        inputs.append(bias)
    return inputs + extra, out, stage_names, pad_stage


def _residual_stage(pg: PackedGemm, prev, name: str):
    """The residual add (:data:`~vta_ext.templates.epilogue.RESIDUAL_STAGE`) as a TE stage: a
    GEMM continuing ``prev`` (the accumulator) with the int8 operand ``residual``, in the
    output's packed shape, as its input rows and the identity tile ``identity`` (``y`` by ``z``
    lanes) as its weight: ``acc += residual`` by one micro-op per accumulator row, its LOAD an
    INP on the load module (:mod:`.residual`). Returns ``(stage, [residual, identity])``."""
    from tvm import te

    C = pg.operands["C"]
    if tuple(C.stored_shape) != tuple(C.shape):
        raise ValueError(f"a residual stage needs the output stored as computed, not "
                         f"{C.stored_shape} of {C.shape}")
    if pg.axes["y"] != pg.axes["z"]:
        raise ValueError(f"a residual stage adds by an identity tile: y lanes {pg.axes['y']} "
                         f"!= z lanes {pg.axes['z']}")
    residual = te.placeholder(C.shape, "int8", name=RESIDUAL_TENSOR)
    identity = te.placeholder((pg.axes["y"], pg.axes["z"]), "int8", name=RESIDUAL_IDENTITY)
    zr = te.reduce_axis((0, pg.axes["z"]), "z_r")

    def body(*i):
        return te.sum(residual[i[:-1] + (zr,)].astype("int32")
                      * identity[i[-1], zr].astype("int32"), axis=zr, init=prev(*i))
    return te.compute(C.shape, body, name=name), [residual, identity]


def gemm_bias_shapes(pg: PackedGemm) -> Dict[str, Tuple[int, ...]]:
    """The DRAM tensors of the bias GEMM (:mod:`.biasfold`'s constant block): ``bias_row``, the
    constant input row (``x`` by ``z`` lanes), and ``bias_digits``, one weight tile per output
    channel block (the packed bias's shape, :func:`bias_shape`, without its ``x`` lanes, then the
    ``z`` lanes)."""
    bshape = bias_shape(pg)
    return {"bias_row": (pg.axes["x"], pg.axes["z"]),
            "bias_digits": bshape[:-2] + (pg.axes["y"], pg.axes["z"])}


def _gemm_bias_stage(pg: PackedGemm, prev, bshape, name: str, pool=None):
    """The bias GEMM as a TE stage: a reduction over the ``z`` lanes of the constant row times the
    digit tile of each output's channel block, starting from ``prev`` (the accumulator); and its
    two placeholders (:func:`gemm_bias_shapes`)."""
    from tvm import te

    shapes = gemm_bias_shapes(pg)
    row = te.placeholder(shapes["bias_row"], "int8", name="bias_row")
    digits = te.placeholder(shapes["bias_digits"], "int8", name="bias_digits")
    zb = te.reduce_axis((0, pg.axes["z"]), "z_b")

    def body(*i):
        channel = tuple(v if n > 1 else 0 for v, n in zip(_output_index(pg, pool, i)[:-2],
                                                          bshape[:-2]))
        return te.sum(row[i[-2], zb].astype("int32") * digits[channel + (i[-1], zb)].astype("int32"),
                      axis=zb, init=prev(*i))
    return te.compute(prev.shape, body, name=name), [row, digits]


def _output_index(pg: PackedGemm, pool, i) -> tuple:
    """An index of the conv's stages in the packed output's rank: on the tiled row domain of a
    fused pool (:mod:`.poolstage`) the row tile's index left out (a bias does not depend on the
    rows)."""
    if pool is None:
        return tuple(i)
    ih = [d.terms[0][0] for d in pg.operands["C"].dims].index("oh")
    return tuple(i[:ih]) + tuple(i[ih + 1:])


def _stage_fn(stage, prev, bias, bshape, pg: PackedGemm, pool=None):
    """The TE ``fcompute`` of one epilogue stage (the bias indexed by the channel dims only; on
    the tiled row domain of a fused pool, :mod:`.poolstage`, the row tile's index left out)."""
    from vta_ext.templates.epilogue import te_stage

    def channel(i):
        return [v if n > 1 else 0 for v, n in zip(_output_index(pg, pool, i), bshape)]
    if stage[0] == "bias":
        return lambda *i: te_stage(stage, prev(*i), bias(*channel(i)))
    return lambda *i: te_stage(stage, prev(*i))


def schedule_gemm(cfg, pg: PackedGemm, epilogue, knobs: Mapping[str, int], acc_init: str = "fill",
                  pool: Optional[PoolStage] = None):
    """Build the compute, schedule it with ``knobs`` (a full point, see
    :func:`~.knobs.check_point`) and return ``(sch, info)``; ``acc_init`` (:data:`ACC_INITS`) says
    how each output tile's accumulator is zeroed. With ``pool`` (a
    :class:`~.poolstage.PoolStage`, :mod:`.poolstage`) the output rows are tiled by the pool's
    ``rows`` (the conv's ``R`` rows of one row tile in the accumulator), the columns are not split,
    and the ``tile_oh``, ``tile_ow`` and ``vt_oh`` knobs are not used."""
    from tvm import te
    from vta_ext.lower.schedule import continued_reduction, unchecked_schedule

    from vta_ext.lower.intrin import ACC_FILL_PRAGMA, register_gemm_intrin

    if acc_init not in ACC_INITS:
        raise ValueError(f"unknown acc_init {acc_init!r}; use one of {list(ACC_INITS)}")
    from vta_ext.memory import ACC_SCOPE, INP_SCOPE, WGT_SCOPE

    inputs, out, stage_names, pad_stage = gemm_compute(cfg, pg, epilogue, pool)
    func = te.create_prim_func(inputs + [out]).with_attr("global_symbol", "csp_gemm")
    gemm_name, reset_name = register_gemm_intrin(cfg)
    sch = unchecked_schedule(func)
    for prev, name in zip(["gemm"] + stage_names, stage_names):
        if name.endswith(("_" + GEMM_BIAS_STAGE[0], "_" + RESIDUAL_STAGE[0])):
            sch = unchecked_schedule(continued_reduction(sch, name, prev))
    orders = loop_orders(pg, knobs.get("order", 0))
    ext = {lp.name: lp.extent for lp in pg.loops}
    C = pg.operands["C"]
    c_names = [d.terms[0][0] for d in C.dims]
    tile = {n: knobs[f"tile_{n}"] for n in pg.c_loops() + list(orders.ztile)}
    if pool is not None:    # the output tile: a row tile of the pooled output, whole rows
        dom = row_domain(pg, pool)
        out_ext = dict(zip(c_names, (int(e) for e in out.shape)))
        ext.update(oh=out_ext["oh"], ow=out_ext["ow"])
        tile.update(oh=dom["pooled_rows"], ow=out_ext["ow"])

    # ---- output stage: split every free loop; virtual threads outermost; store point last
    out_blk = sch.get_sblock("out")
    loops = dict(zip(c_names, sch.get_loops(out_blk)))
    outer, inner = {}, {}
    for n in pg.c_loops():
        outer[n], inner[n] = sch.split(loops[n], [ext[n] // tile[n], tile[n]])
    vthreads = []
    for n in orders.vthreads:
        t = knobs.get(f"vt_{n}", 1) if pool is None or n != "oh" else 1
        if t > 1:
            outer[n], v = sch.split(outer[n], [None, t])
            vthreads.append(v)
    lanes = [loops[AXIS_PREFIX + "x"], loops[AXIS_PREFIX + "y"]]
    sch.reorder(*vthreads[::-1], *[outer[n] for n in orders.outer], *[inner[n] for n in pg.c_loops()],
                *lanes)
    for v in vthreads:
        sch.annotate(v, "vta_vthread", 1)
    store = outer[orders.outer[-1]]

    # ---- epilogue stages and the GEMM stage in the accumulator, computed at the store point
    for name in reversed(["gemm"] + stage_names):
        blk = sch.get_sblock(name)
        sch.set_scope(blk, 0, ACC_SCOPE)
        sch.compute_at(blk, store)
    bias_ep = [n for n in stage_names if n.endswith("_bias")]
    if bias_ep:
        bblk = sch.get_sblock(bias_ep[0])
        sch.compute_at(sch.cache_read(bblk, 1, ACC_SCOPE), store)

    # ---- GEMM stage
    gemm = sch.get_sblock("gemm")
    names = c_names + [lp.name for lp in pg.loops if lp.reduction] + [AXIS_PREFIX + "z"]
    c_free = set(pg.c_loops())
    extents = [pg.axes[n[len(AXIS_PREFIX):]] if n.startswith(AXIS_PREFIX) else
               (tile[n] if n in c_free else ext[n]) for n in names]
    if pool is not None:    # one row tile of the conv: its R rows (the row tile's loop is 1)
        extents[names.index("oh")] = dom["rows"]
        extents[names.index("ow")] = dom["cols"]
    gl = sch.get_loops(gemm)
    it = iter(gl[len(gl) - sum(1 for e in extents if e > 1):])
    lmap = {n: (next(it) if e > 1 else None) for n, e in zip(names, extents)}
    zouter, zinner = [], []
    for n in orders.ztile:
        if lmap[n] is not None:
            o, i = sch.split(lmap[n], [ext[n] // tile[n], tile[n]])
            zouter.append(o)
            zinner.append((n, i))
    zin = dict(zinner)
    kernel = [zin[n] if n in zin else lmap[n] for n in orders.kernel]
    batch = [lmap[n] for n in orders.batch]
    lane_names = ([AXIS_PREFIX + "x"] if pg.axes["x"] > 1 else []) + [AXIS_PREFIX + "y",
                                                                        AXIS_PREFIX + "z"]
    order = [lp for lp in batch + zouter + kernel + [lmap[n] for n in lane_names] if lp is not None]
    sch.reorder(*order)
    anchor = zouter[-1] if zouter else store
    at = {"A": anchor, "B": anchor}
    if orders.resident is not None:
        # the resident operand's cache above the inner output tiles (one load, reused below)
        at[orders.resident] = outer[orders.resident_at]
    if pad_stage is not None:
        pblk = sch.get_sblock(pad_stage)
        sch.set_scope(pblk, 0, INP_SCOPE)
        sch.compute_at(pblk, at["A"])
    else:
        sch.compute_at(sch.cache_read(gemm, 0, INP_SCOPE), at["A"])
    sch.compute_at(sch.cache_read(gemm, 1, WGT_SCOPE), at["B"])
    tens = lmap[AXIS_PREFIX + "x"] if pg.axes["x"] > 1 else lmap[AXIS_PREFIX + "y"]
    body = [lp for lp in order if not any(lp is b for b in batch if b is not None)]
    # a reset zeroes the tile below the batch-like loops, one reset kernel per batch step (the
    # stock rule); a fill zeroes the whole tile at once, above them (contiguous: one LOAD)
    at = order[0] if acc_init == "fill" else (body[0] if body else tens)
    parents = next(i for i, lp in enumerate(sch.get_loops(gemm)) if sch.get(lp).same_as(sch.get(at)))
    init = sch.decompose_reduction(gemm, at)
    sch.tensorize(tens, gemm_name)
    iloops = sch.get_loops(init)
    if acc_init == "fill":
        sch.annotate(iloops[parents], ACC_FILL_PRAGMA, 1)
    else:
        sch.tensorize(iloops[-2] if pg.axes["x"] > 1 else iloops[-1], reset_name)
    if pool is not None:    # the pool's initial value per output tile, below the store point
        pblk = sch.get_sblock(POOL_STAGE)
        ploops = sch.get_loops(pblk)
        at_store = next(i for i, lp in enumerate(ploops) if sch.get(lp).same_as(sch.get(store)))
        sch.decompose_reduction(pblk, ploops[at_store + 1])
    for name in stage_names:
        if name.endswith("_" + GEMM_BIAS_STAGE[0]):
            _schedule_gemm_bias(sch, name, store, pg, gemm_name)
        elif name.endswith("_" + RESIDUAL_STAGE[0]):
            from vta_ext.lower.schedule import schedule_bias_gemm
            schedule_bias_gemm(sch, name, store, gemm_name, batched=pg.axes["x"] > 1,
                               operands=(RESIDUAL_TENSOR, RESIDUAL_IDENTITY))
    info = dict(stage_names=stage_names, pad_stage=pad_stage, inputs=[t.op.name for t in inputs],
                vthreads=len(vthreads))
    return sch, info


def _schedule_gemm_bias(sch, name: str, store, pg: PackedGemm, gemm_name: str) -> None:
    """Schedule the bias GEMM stage ``name`` (:func:`_gemm_bias_stage`), computed at the store
    point: its constant row and digit tiles loaded there, after the tile's GEMM loops (so that
    their loads do not wait for the previous tile's epilogue), its accumulator that of the stage
    before (:func:`vta_ext.lower.schedule.schedule_bias_gemm`)."""
    from vta_ext.lower.schedule import schedule_bias_gemm

    schedule_bias_gemm(sch, name, store, gemm_name, batched=pg.axes["x"] > 1)
