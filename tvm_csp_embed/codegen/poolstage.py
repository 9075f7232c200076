"""A max pool fused into the GEMM program (a conv) that produces its input (issue 32).

Run alone, a max pool's input must enter the accumulator again through the compute module (LOAD
ACC_8BIT or an identity GEMM) before its MAX passes, and the conv before it stores four times the
bytes the pool stores. Fused, the conv keeps each output tile in the accumulator after its
epilogue, the pool's MAX passes run there, and only the pooled tile is stored.

The fused compute (:func:`domain_shape`, :func:`conv_env` and :func:`pool_stage`, used by
:func:`.schedule.gemm_compute`) states the conv
on a *tiled row domain*: the conv's output rows ``oh`` become ``(t, rr)`` with ``oh = t * S +
rr``, ``S = rows * stride_h`` the conv rows one tile of ``rows`` pooled rows advances by, and
``rr < R = (rows - 1) * stride_h + pool_h`` the conv rows its windows read. Where the windows
overlap (``stride_h < pool_h``) and a tile holds fewer than all the pooled rows, consecutive
tiles recompute ``pool_h - stride_h`` conv rows (the halo); the domain itself does not overlap
(a ``compute_at`` of the conv's own rows at overlapping tiles fails the GEMM's tensorization).
Only the conv columns a window reads are computed (``(OW' - 1) * stride_w + pool_w``).

In the offload pass through the conv's template (``build_options(fuse_pool=True)``,
:class:`tvm_csp_embed.fusion.PoolSupport`): the pool rides in the compiled operator's key as a last
epilogue stage (:func:`pool_epilogue`, :func:`split_pool`). The figures: ``docs/csp-strategy.md``.

The pool is one TE reduction over the window on the last epilogue stage, its initial value the
lower bound the epilogue ends in (:func:`vta_ext.templates.epilogue.int8_bounds`: the max of
values that are all at least ``lo`` starts from ``lo`` exactly), so it lowers to one ALU constant
pass and one vector MAX per window element (:mod:`vta_ext.lower.patterns`). Bit-exact: the
pooled value is the max over the window of the very int32 values the conv alone would have
truncated to int8 and stored (the epilogue ends in a bound inside int8, so the truncation is the
identity).

A :class:`PoolStage` has no padding and floors its output size (a padded or ceil-mode pool is
not one). What is refused (:func:`pool_refusal`, one line): pooled rows that the tile's ``rows``
do not divide, an embedding whose output rows and columns are not the plain ``oh`` and ``ow``
loops (the columns right after the rows), an epilogue that does not end in an int8 bound or that
has a residual stage.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from vta_ext.templates.epilogue import POOL_EPILOGUE, split_pool_stage
from vta_ext.templates.workload import out_size

from .plan import PackedGemm

__all__ = ["PoolStage", "pool_refusal", "pooled_shape", "row_domain", "domain_shape", "conv_env",
           "pool_stage", "spatial_dims", "POOL_STAGE", "pool_epilogue", "split_pool"]

#: the TE name of the pool stage
POOL_STAGE = "pool"


@dataclass(frozen=True)
class PoolStage:
    """A max pool on a conv's output: window, strides, and the pooled rows one accumulator tile
    holds (None: all of them, one tile per output-channel block)."""

    pool_h: int
    pool_w: int
    stride_h: int
    stride_w: int
    rows: Optional[int] = None

    def pooled(self, height: int, width: int) -> Tuple[int, int]:
        """The pooled rows and columns of a ``height`` x ``width`` conv output (no padding,
        floor mode: :func:`vta_ext.templates.workload.out_size`)."""
        return (out_size(height, self.pool_h, 0, self.stride_h),
                out_size(width, self.pool_w, 0, self.stride_w))


def spatial_dims(pg: PackedGemm) -> Tuple[int, int]:
    """The indices of the ``oh`` and ``ow`` dims of the packed output of ``pg``."""
    names = [d.terms[0][0] for d in pg.operands["C"].dims]
    return names.index("oh"), names.index("ow")


def pool_refusal(pg: PackedGemm, epilogue: Any, pool: PoolStage) -> Optional[str]:
    """Why ``pool`` cannot be fused into the program of ``pg`` with ``epilogue`` (one line), or
    None (module docstring)."""
    from vta_ext.templates.epilogue import has_residual, int8_bounds, normalize_epilogue

    C = pg.operands["C"]
    names = [d.terms[0][0] for d in C.dims]
    if any(len(d.terms) != 1 for d in C.dims) or not {"oh", "ow"} <= set(names) \
            or tuple(C.stored_shape) != tuple(C.shape):
        return ("the embedding's output rows and columns are not the plain oh and ow loops of a "
                "conv stored as computed")
    if min(pool.pool_h, pool.pool_w, pool.stride_h, pool.stride_w) < 1:
        return f"the pool {pool} has an empty window or stride"
    ih, iw = spatial_dims(pg)
    if iw != ih + 1:
        return "the embedding's output columns do not follow its rows"
    oh, ow = pool.pooled(C.shape[ih], C.shape[iw])
    if oh < 1 or ow < 1:
        return f"the pool's window {pool.pool_h}x{pool.pool_w} exceeds the conv's output"
    rows = oh if pool.rows is None else pool.rows
    if rows < 1 or oh % rows:
        return f"{rows} pooled rows a tile do not divide the {oh} pooled rows"
    ep = normalize_epilogue(epilogue)
    if has_residual(ep):
        return "a program with a residual stage takes no pool stage"
    if int8_bounds(ep) is None:
        return ("the conv's epilogue does not end in a clip inside int8, so its accumulator is "
                "not the int8 the pool would read")
    return None


def pooled_shape(pg: PackedGemm, pool: PoolStage) -> Tuple[int, ...]:
    """The packed output of the fused program: the conv's, with the pooled rows and columns."""
    C = pg.operands["C"]
    ih, iw = spatial_dims(pg)
    shape = list(C.shape)
    shape[ih], shape[iw] = pool.pooled(C.shape[ih], C.shape[iw])
    return tuple(shape)


def row_domain(pg: PackedGemm, pool: PoolStage) -> Dict[str, int]:
    """The tiled row domain of the conv (module docstring): ``tiles`` (T), ``step`` (S),
    ``rows`` (R, the conv rows a tile computes), ``pooled_rows`` (a tile's), ``cols`` (the conv
    columns computed)."""
    C = pg.operands["C"]
    ih, iw = spatial_dims(pg)
    oh, ow = pool.pooled(C.shape[ih], C.shape[iw])
    rows = oh if pool.rows is None else pool.rows
    return dict(tiles=oh // rows, step=rows * pool.stride_h, pooled_rows=rows,
                rows=(rows - 1) * pool.stride_h + pool.pool_h,
                cols=(ow - 1) * pool.stride_w + pool.pool_w)


def domain_shape(pg: PackedGemm, pool: PoolStage) -> Tuple[int, ...]:
    """The shape of the conv's stages on the tiled row domain: the packed output's, its ``oh``
    dim replaced by ``(T, R)`` and its ``ow`` dim by the columns computed."""
    C = pg.operands["C"]
    ih, iw = spatial_dims(pg)
    dom = row_domain(pg, pool)
    shape = list(C.shape)
    shape[iw] = dom["cols"]
    return tuple(shape[:ih]) + (dom["tiles"], dom["rows"]) + tuple(shape[ih + 1:])


def conv_env(pg: PackedGemm, pool: PoolStage, ivs: Any) -> Dict[str, Any]:
    """Loop name -> index expression of the conv's free loops for the indices ``ivs`` of the
    tiled row domain (:func:`domain_shape`)."""
    C = pg.operands["C"]
    ih, _ = spatial_dims(pg)
    names = [d.terms[0][0] for d in C.dims]
    ivs = list(ivs)
    t, rr = ivs[ih], ivs[ih + 1]
    flat = ivs[:ih] + [t * row_domain(pg, pool)["step"] + rr] + ivs[ih + 2:]
    return dict(zip(names, flat))


def pool_stage(pg: PackedGemm, prev: Any, pool: PoolStage, floor: int) -> Any:
    """The pool as a TE stage on ``prev`` (a stage on the tiled row domain): the max over the
    window, starting from ``floor`` (the lower bound ``prev`` lies above)."""
    from tvm import te, tirx

    ih, iw = spatial_dims(pg)
    rows = row_domain(pg, pool)["pooled_rows"]
    ri = te.reduce_axis((0, pool.pool_h), "pool_i")
    rj = te.reduce_axis((0, pool.pool_w), "pool_j")
    reducer = te.comm_reducer(lambda x, y: tirx.max(x, y), lambda t: tirx.const(floor, t),
                              name="pool_max")

    def body(*i):
        idx = list(i)
        src = (idx[:ih] + [idx[ih] // rows, (idx[ih] % rows) * pool.stride_h + ri]
               + [idx[iw] * pool.stride_w + rj] + idx[iw + 1:])
        return reducer(prev[tuple(src)], axis=[ri, rj])
    return te.compute(pooled_shape(pg, pool), body, name=POOL_STAGE)


def pool_epilogue(epilogue: Any, pool: PoolStage) -> Tuple[Tuple[Any, ...], ...]:
    """``epilogue`` with the pool as its last stage ``(POOL_EPILOGUE, pool_h, pool_w, stride_h,
    stride_w)``: how a fused program is named in its key (:func:`vta_ext.executor.op_key`)."""
    return tuple(tuple(st) for st in epilogue) + (
        (POOL_EPILOGUE, pool.pool_h, pool.pool_w, pool.stride_h, pool.stride_w),)


def split_pool(epilogue: Any) -> Tuple[Tuple[Any, ...], Optional[PoolStage]]:
    """The epilogue without its pool stage and the :class:`PoolStage` (None: no pool stage;
    :func:`vta_ext.templates.epilogue.split_pool_stage`)."""
    epilogue, window = split_pool_stage(epilogue)
    return epilogue, (None if window is None else PoolStage(*window))
