"""Compile a packed GEMM (:class:`~.plan.PackedGemm`) with knobs into one VTA program.

:func:`build_gemm` resolves the knobs (``"cycles"``, ``"tps"``, ``"fallback"`` or an explicit dict, see
:mod:`.knobs`), schedules (:mod:`.schedule`), lowers with :mod:`vta_ext.lower` exactly as the stock
templates do, and emits the instruction stream into a :class:`vta_ext.runtime.CommandQueue` whose
DRAM buffers are allocated in the order A, B, output, bias (or the bias GEMM's constant row and
digit tiles, which :meth:`CompiledGemm.run` makes from the packed bias). The result,
:class:`CompiledGemm`, has the interface the executor expects of every compiled operator:
``.program``, ``.knobs`` and ``.run(*packed_inputs, simulator=None) -> (packed_output, SimStats)``.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np

from ..collector import gc_paused
from .biasfold import gemm_bias_operands
from .knobs import (REUSE_GAIN, KnobPoint, Pruned, check_point, cycle_point, fallback_point,
                    knob_names, reuse_pays, reused_operands, tps_point)
from .plan import PackedGemm
from .poolstage import PoolStage, pool_refusal, pooled_shape, spatial_dims
from .residual import knob_view, residual_overflow
from .schedule import (RESIDUAL_IDENTITY, acc_init_of, bias_shape, gemm_bias_shapes,
                       schedule_gemm)

__all__ = ["CompiledGemm", "resolve_knobs", "build_gemm", "knob_record", "residual_points",
           "pool_points"]


@functools.lru_cache(maxsize=None)
def _knob_type(names: Tuple[str, ...]):
    return dataclasses.make_dataclass("CspKnobs", [(n, int) for n in names], frozen=True)


def knob_record(point: Dict[str, int]):
    """The knobs as a frozen dataclass (what the build report prints)."""
    return _knob_type(tuple(point))(**point)


def resolve_knobs(cfg, pg: PackedGemm, epilogue, knobs: Any) -> Tuple[Dict[str, int], bool]:
    """The ``knobs`` argument as ``(full point, explicit)``.

    Raises
    ------
    vta_ext.templates.errors.Conv2dRefusal
        If a preset (``"cycles"``, ``"tps"``, ``"fallback"``) finds no point that fits.
    vta_ext.templates.errors.KnobError
        For an unknown preset or invalid explicit knobs.
    """
    from vta_ext.templates.errors import Conv2dRefusal, KnobError

    if knobs is None:
        knobs = "tps"
    if isinstance(knobs, str):
        if knobs in ("tps", "cycles"):
            best = (tps_point if knobs == "tps" else cycle_point)(cfg, pg, epilogue)
            if best is None:
                fb = fallback_point(cfg, pg, epilogue)
                raise Conv2dRefusal(f"no tiling of the embedding {pg.embedding.mapping_str()} fits "
                                    f"on {cfg.name!r}: even every tile 1 is out: "
                                    f"{fb.reason if isinstance(fb, Pruned) else fb}")
            return dict(best.knobs), False
        if knobs == "fallback":
            fb = fallback_point(cfg, pg, epilogue)
            if isinstance(fb, Pruned):
                raise Conv2dRefusal(f"the fallback tiling of {pg.embedding.mapping_str()} does not "
                                    f"fit on {cfg.name!r}: {fb.reason}")
            return dict(fb.knobs), False
        raise KnobError(f"unknown knobs {knobs!r}; valid names: cycles, fallback, tps (or a dict of "
                        f"{', '.join(knob_names(pg))})")
    if dataclasses.is_dataclass(knobs):
        knobs = dataclasses.asdict(knobs)
    if not isinstance(knobs, dict):
        raise KnobError(f"knobs must be 'cycles', 'tps', 'fallback' or a dict of {', '.join(knob_names(pg))}, "
                        f"got {type(knobs).__name__}")
    return check_point(pg, knobs), True


@dataclass
class CompiledGemm:
    """A packed GEMM compiled into one VTA program (built once; :meth:`run` copies data in and out)."""

    config: Any
    plan: PackedGemm
    epilogue: Tuple[tuple, ...]
    knobs: Any
    program: Any
    shapes: Dict[str, tuple]
    timings: Dict[str, float]
    generated: Any = field(repr=False, default=None)
    #: the fused max pool (:class:`~.poolstage.PoolStage`, with the row tile built), or None;
    #: its point's ``tile_oh``, ``tile_ow`` and ``vt_oh`` are not used
    #: (:func:`~.schedule.schedule_gemm`)
    pool: Any = None

    @property
    def gemm_bias(self) -> bool:
        """Whether the program adds the bias by a GEMM (:func:`~.biasfold.gemm_bias_epilogue`):
        :meth:`run` turns the packed bias into the constant row and the digit tiles."""
        return "bias_digits" in self.shapes

    @property
    def has_bias(self) -> bool:
        """Whether the epilogue adds a bias tensor (a third :meth:`run` argument)."""
        return "bias" in self.shapes or self.gemm_bias

    @property
    def has_residual(self) -> bool:
        """Whether the program adds a residual operand (:mod:`.residual`; a ``residual_packed``
        :meth:`run` argument in the output's packed shape)."""
        return "residual" in self.shapes

    def run(self, a_packed, b_packed, bias_packed=None, *more, simulator=None,
            residual_packed=None):
        """Execute on the functional simulator; returns ``(out_packed_int8, SimStats)``. The
        packed tensors after A and B come in the program's order: the bias (with a bias
        stage), then the residual (with a residual stage; or as ``residual_packed``)."""
        from vta_ext.templates.errors import Conv2dError

        given = [t for t in (bias_packed,) + more if t is not None]
        wanted = (["bias"] if self.has_bias else []) \
            + (["residual"] if self.has_residual and residual_packed is None else [])
        if len(given) > len(wanted):
            raise Conv2dError(f"{len(given)} packed tensors after A and B, but the program takes "
                              f"{' and '.join(wanted) or 'none'}")
        named = dict(zip(wanted, given))
        bias_packed = named.get("bias")
        if residual_packed is None:
            residual_packed = named.get("residual")
        prog = self.program
        names = [self.plan.operands["A"].tensor, self.plan.operands["B"].tensor]
        expected = dict(self.shapes, bias=bias_shape(self.plan))
        for name, arr, dtype in ((names[0], a_packed, np.int8), (names[1], b_packed, np.int8),
                                 ("bias", bias_packed, np.int32),
                                 ("residual", residual_packed, np.int8)):
            if name == "residual" and not self.has_residual:
                if arr is not None:
                    raise Conv2dError("residual_packed given but the epilogue has no "
                                      "('residual',) stage")
                continue
            if name == "bias" and not self.has_bias:
                continue
            if arr is None:
                raise Conv2dError(f"this GEMM needs its {name} input")
            arr = np.asarray(arr)
            if arr.shape != expected[name] or arr.dtype != np.dtype(dtype):
                raise Conv2dError(f"{name}: expected {expected[name]} {np.dtype(dtype)}, got "
                                  f"{arr.shape} {arr.dtype}")
            if name == "bias" and self.gemm_bias:
                row, digits = gemm_bias_operands(arr, self.plan.axes["z"])
                prog.write("bias_row", row)
                prog.write("bias_digits", np.ascontiguousarray(digits))
                continue
            prog.write(name, np.ascontiguousarray(arr))
        t = time.perf_counter()
        stats = prog.run(simulator)
        self.timings["last_run"] = time.perf_counter() - t
        return prog.read("out", np.int8, self.shapes["out"]), stats


def build_gemm(cfg, pg: PackedGemm, epilogue=(), knobs: Any = "tps",
               acc_init: Optional[str] = None, early_release: Optional[bool] = None,
               late_fill: Optional[bool] = None, share_resident: bool = True,
               reuse: Optional[bool] = None, early_start: Optional[bool] = None,
               pool: Optional[PoolStage] = None) -> CompiledGemm:
    """Compile ``pg`` + ``epilogue`` with ``knobs`` for ``cfg``; ``acc_init`` (``"fill"`` or
    ``"reset"``, :data:`~.schedule.ACC_INITS`; None: :func:`~.schedule.acc_init_of`) says how each
    output tile's accumulator is zeroed; ``early_release`` lets a tile's first load wait for the
    previous tile's last GEMM rather than its accumulator fill
    (:func:`vta_ext.lower.sync.release_after_gemm`; None: where :func:`~.schedule.acc_init_of` is
    ``"fill"``; the program's ``generated.release`` says where it applied or why not). It is
    never more than 3 cycles slower than the stage-based plan on the cycle model, where that plan's
    tokens are cheaper (259 CSP builds of MobileNetV2, ResNet-18 and ResNeXt-50 224 on
    ``default``, ``pipelined`` and ``pynq``: faster on 181, at most 3 cycles slower on the rest),
    so it is not built twice to compare. ``late_fill`` puts each tile's accumulator fill after
    its loads (:func:`vta_ext.lower.latefill.late_fill`): True where it applies, False never,
    None (default) where it applies and the program has two or more virtual threads (decided
    from the program's structure, one build; ``generated.release`` says where and why not).
    ``share_resident``: a resident tile that every virtual thread would load with the same data
    is loaded once, by thread 0, and read by all (``lower_to_runtime(share_resident=True)``);
    on by default (where no tile qualifies nothing changes and ``generated.release`` says why;
    the knob estimate charges such a tile once, :func:`.knobs._shared_resident`).
    ``reuse``: where the program has exactly two virtual threads and a tile both would load with
    the same data, that tile is loaded once, by thread 0, alternately into its two copies
    (reuse-aware double buffering, ``lower_to_runtime(reuse=None)``); None (default): where the
    knob estimate prices it faster (:func:`~.knobs.reuse_pays`), True: wherever it applies,
    False: never (``generated.release`` says where and why not).
    The epilogue runs in its fewest ALU passes
    (:func:`vta_ext.templates.epilogue.simplify_epilogue`).
    ``pool``: a :class:`~.poolstage.PoolStage`, a max pool fused after the epilogue
    (:mod:`.poolstage`; the output is the pooled tensor); under a preset the first point of
    :func:`pool_points` that fits is built.

    Raises
    ------
    vta_ext.templates.errors.Conv2dRefusal
        If a preset finds no tiling that fits.
    vta_ext.templates.errors.KnobError
        For invalid explicit knobs, or explicit knobs whose tiles overflow a scratchpad (the
        message names the buffer).

    Notes
    -----
    The cyclic garbage collector pauses meanwhile (:func:`~tvm_csp_embed.collector.gc_paused`): the
    emission allocates one long-lived record per instruction and no reference cycles, and a full
    collection it triggered would walk every object of the process (one of the two in a warm
    MobileNetV2 or ResNeXt-50 224 build, about 0.15 s each).
    """

    args = (acc_init, early_release, late_fill, share_resident, reuse, early_start)
    with gc_paused():
        from vta_ext.templates.epilogue import has_residual, normalize_epilogue

        if pool is not None:
            return _build_pooled(cfg, pg, epilogue, knobs, pool, args)
        if not (isinstance(knobs, str) and has_residual(normalize_epilogue(epilogue))):
            return _build_gemm(cfg, pg, epilogue, knobs, *args)
        from vta_ext.templates.errors import KnobError

        refused = None
        for point in residual_points(cfg, pg, epilogue, knobs):
            try:
                return _build_gemm(cfg, pg, epilogue, point, *args)
            except KnobError as err:    # no room for the residual tile: the next point
                refused = err
        raise refused


def _build_pooled(cfg, pg: PackedGemm, epilogue, knobs: Any, pool: PoolStage,
                  args: tuple) -> CompiledGemm:
    """:func:`build_gemm` with a fused pool: explicit knobs as given, a preset at the first point
    of :func:`pool_points` that fits the buffers."""
    from vta_ext.templates.errors import Conv2dRefusal, KnobError

    refused = pool_refusal(pg, epilogue, pool)
    if refused:
        raise Conv2dRefusal(f"no max pool fused into this conv: {refused}")
    if not isinstance(knobs, str):
        return _build_gemm(cfg, pg, epilogue, knobs, *args, pool=pool)
    last = None
    for point, stage in pool_points(cfg, pg, epilogue, knobs, pool):
        try:
            return _build_gemm(cfg, pg, epilogue, point, *args, pool=stage)
        except KnobError as err:    # the tiles do not fit the buffers: the next point
            last = err
    raise Conv2dRefusal(f"no point of the fused max pool fits the buffers: {last}")


def pool_points(cfg: Any, pg: PackedGemm, epilogue: Any, knobs: str,
                pool: PoolStage) -> Iterator[Tuple[Dict[str, int], PoolStage]]:
    """The knob points and row tiles a fused program of ``pool`` is built at under the preset
    ``knobs``, in the order tried (the first that fits the buffers is built): the preset's point
    for the conv alone, its output-channel tile halved down to one block, each with two virtual
    threads over the channel tiles where they divide them, then one; the pool's ``rows`` where
    given, else every divisor of the pooled rows, the most first (the fewest halo rows). Two
    threads first: a thread's GEMMs overlap the other's MAX passes and store (squeezenet1_1's
    1x16x27x27 -> 64 1x1 conv and its 3x3 s2 pool on ``pipelined``, the conv's first relaxed
    embedding: 31,629 cycles against 37,847 with one thread)."""
    point = resolve_knobs(cfg, pg, epilogue, knobs)[0]
    C = pg.operands["C"]
    ih, iw = spatial_dims(pg)
    pooled = pool.pooled(C.shape[ih], C.shape[iw])[0]
    rows = [pool.rows] if pool.rows is not None else \
        [r for r in range(pooled, 0, -1) if pooled % r == 0]
    k = {lp.name: lp.extent for lp in pg.loops}.get("k")
    tiles = []
    t = point.get("tile_k")
    while t is not None and t >= 1 and k is not None:
        if k % t == 0:
            tiles.append(t)
        t //= 2
    for vt in (2, 1):
        for r in rows:
            for tk in tiles or [None]:
                if tk is not None and (k // tk) % vt:
                    continue
                if tk is None and vt > 1:
                    continue
                p = dict(point, **({"vt_oh": 1} if "vt_oh" in point else {}))
                if tk is not None:
                    p.update(tile_k=tk, vt_k=vt)
                yield p, dataclasses.replace(pool, rows=r)


def residual_points(cfg, pg: PackedGemm, epilogue, knobs: str,
                    own: Optional[Dict[str, int]] = None) -> Iterator[Any]:
    """The knob points a program of ``epilogue`` with a residual stage (:mod:`.residual`) is built
    at under the preset ``knobs``, in the order tried, each computed only when the one before
    did not build (the one definition of that order: :func:`build_gemm` and the offload pass's
    fusion, :func:`tvm_csp_embed.fusion.fused_knob_choices`, take the first that builds):

    1. ``own``, the point the conv's own program was built at, where given;
    2. the point the preset gives the conv with the add's stages on the whole buffers (where the
       residual tile fits beside it, faster than the next: regnet's 1x1 convs on ``pipelined``,
       e.g. 175,688 against 199,112 cycles at 408 channels on 14x14);
    3. the preset's point on the halved buffers (:func:`~.residual.knob_view`), which leaves the
       residual tile room.

    A point whose residual tile does not fit (:func:`~.residual.residual_overflow`) is left
    out, not lowered, and none is given twice. Where the preset finds no point, the preset
    itself is given (its build says why)."""
    from vta_ext.errors import TemplateRefusal
    from vta_ext.templates.epilogue import normalize_epilogue, split_residual

    ep = normalize_epilogue(epilogue)
    conv_ep, add_ep = split_residual(ep)
    tried = []
    if own is not None and not residual_overflow(cfg, pg, ep, own):
        tried.append(own)
        yield own
    try:
        first = resolve_knobs(cfg, pg, conv_ep + add_ep, knobs)[0]
        if first not in tried and not residual_overflow(cfg, pg, ep, first):
            tried.append(first)
            yield first
        view_cfg, view_ep = knob_view(cfg, ep)
        halved = resolve_knobs(view_cfg, pg, view_ep, knobs)[0]
    except TemplateRefusal:     # no point of the preset: its build says why
        yield knobs
        return
    if halved not in tried:
        yield halved


def _emit(cfg, gen, shapes: Dict[str, tuple]):
    """The program of the generated code ``gen`` with DRAM buffers of ``shapes`` (in that order)."""
    from vta_ext.runtime import CommandQueue

    q = CommandQueue(cfg)
    bufs = {}
    for name, shape in shapes.items():
        dtype = np.int32 if name == "bias" else np.int8
        bufs[name] = q.alloc(int(np.prod(shape)) * np.dtype(dtype).itemsize, name)
    gen.emit(q, bufs)
    return q.synchronize()


#: the release note's clause where the estimate declines reuse-aware double buffering
_REUSE_DECLINED = (f"no reuse-aware double buffering: the estimate prices it above "
                   f"{REUSE_GAIN:.0%} of the cycles without it")


def _build_gemm(cfg, pg: PackedGemm, epilogue, knobs: Any, acc_init: Optional[str],
                early_release: Optional[bool], late_fill: Optional[bool] = None,
                share_resident: bool = True, reuse: Optional[bool] = None,
                early_start: Optional[bool] = None,
                pool: Optional[PoolStage] = None) -> CompiledGemm:
    """:func:`build_gemm`'s work."""
    from vta_ext.lower.codegen import SramOverflowError, lower_to_runtime
    from vta_ext.lower.passes import lower_schedule
    from vta_ext.templates.epilogue import (GEMM_BIAS_STAGE, RESIDUAL_TENSOR, has_bias,
                                            has_residual, normalize_epilogue, simplify_epilogue)
    from vta_ext.templates.errors import Conv2dRefusal, KnobError

    epilogue = normalize_epilogue(epilogue)
    knob_cfg, knob_ep = knob_view(cfg, epilogue)    # the residual stage's region kept free
    point, explicit = resolve_knobs(knob_cfg, pg, knob_ep, knobs)
    timings = {}
    t0 = time.perf_counter()
    acc_init = acc_init_of(pg) if acc_init is None else acc_init
    sch, _ = schedule_gemm(cfg, pg, simplify_epilogue(epilogue), point, acc_init, pool)
    t1 = time.perf_counter()
    lowered = lower_schedule(sch.mod)
    func = lowered["csp_gemm"] if "csp_gemm" in [g.name_hint for g in lowered.functions] else \
        list(lowered.functions.values())[0]
    declined = reuse is None and not reuse_pays(cfg, pg, epilogue, point)
    explicit = explicit or pool is not None   # a fused pool's point: the caller tries the next
    try:
        gen = lower_to_runtime(cfg, func, early_release=(
            acc_init == "fill" if early_release is None else early_release), late_fill=late_fill,
            share_resident=share_resident, reuse=False if declined or reuse is False else None,
            early_start=early_start)
    except SramOverflowError as err:
        message = (f"embedding {pg.embedding.mapping_str()} with knobs {point} on {cfg.name!r}: "
                   f"{err}. Reduce the tile knobs or the virtual threads")
        raise (KnobError if explicit else Conv2dRefusal)(message) from None
    if declined and any(np.any(v) for v in reused_operands(pg, point).values()):
        gen.release = "; ".join(x for x in (gen.release, _REUSE_DECLINED) if x)
    t2 = time.perf_counter()
    A, B, C = (pg.operands[r] for r in "ABC")
    shapes = {A.tensor: A.stored_shape, B.tensor: B.stored_shape,
              "out": C.stored_shape if pool is None else pooled_shape(pg, pool)}
    if has_bias(epilogue):
        shapes["bias"] = bias_shape(pg)
    if GEMM_BIAS_STAGE in epilogue:
        shapes.update(gemm_bias_shapes(pg))
    if has_residual(epilogue):
        shapes[RESIDUAL_TENSOR] = C.shape
        shapes[RESIDUAL_IDENTITY] = (pg.axes["y"], pg.axes["z"])
    prog = _emit(cfg, gen, shapes)
    if has_residual(epilogue):      # a constant of the program: written once, here
        prog.write(RESIDUAL_IDENTITY, np.eye(pg.axes["y"], pg.axes["z"], dtype=np.int8))
    t3 = time.perf_counter()
    timings.update(schedule=t1 - t0, lower=t2 - t1, generate=t3 - t2)
    return CompiledGemm(cfg, pg, epilogue, knob_record(point), prog, shapes, timings, gen, pool)
