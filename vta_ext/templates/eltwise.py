"""Residual add and hardswish on the VTA ALU: hand-scheduled runtime templates.

This is **not** a TE / s_tir schedule: the program is written directly with the runtime
(:class:`vta_ext.runtime.CommandQueue`), once per workload. Entry point (``docs/templates-api.md``):
:func:`build_add` → :class:`CompiledAdd` (``.program``,
``.run(a_packed, b_packed, simulator=None) -> (out_packed_int8, SimStats)``).

Layouts (``b = BATCH``, ``co = BLOCK_OUT``)::

    data, data1  (N/b, C/co, H, W, b, co)   int8
    out          (N/b, C/co, H, W, b, co)   int8

Semantics: ``int8(epilogue(int32(a) + int32(b)))``. The three tensors share one layout, so the
operator is a flat sequence of ``N/b * C/co * H * W`` accumulator rows (``b x co`` int32 lanes each),
cut into tiles of ``tile`` rows (the last one may be shorter). Per tile:

1. LOAD ACC_8BIT (compute module, sign-extending int8 into int32) of the tile's rows of ``a`` into
   the output slot and of ``b`` into a scratch region;
2. one ALU ADD vector-vector (a single loop over the rows);
3. the epilogue stages (:mod:`vta_ext.templates.epilogue`: shr / clip / min / max / add);
4. STORE (truncating int32 to int8).

The output slots (default 2: the store of one tile overlaps the next tile's loads and ALU work)
are synchronised with the store module by :class:`~vta_ext.templates.alu_program.StorePipeline`;
the default tile is the largest with ``slots + 1`` regions in the accumulator (``acc_depth`` rows).

The add has a second input path, ``input_path="gemm"`` (:data:`~.alu_program.INPUT_PATHS`; the
default ``"acc8"`` is the program above, the stock strategy's): the tile's rows of ``a`` and
``b`` are LOADed INP by the *load* module into one of two input-buffer regions (so the loads of
the next tile overlap this one's compute), and step 1-2 become a reset GEMM of the output slot
and one GEMM of one micro-op over (operand, row) loops through the identity weight tile (``acc
+= b`` over the tile's rows, then ``acc += a``: :class:`~.alu_program.IdentityInput`; no row is
written twice in a row, so it keeps a hazard distance of up to the tile's rows as it is, where
two micro-ops a row would need the runtime's cure to unroll them into a list of ``2 * tile``,
on ``pynq`` 1,041 cycles of micro-op loads a slot at 512 rows): ``3 * GEMM_CYCLES_PER_UOP``
compute cycles a row against two ACC_8BIT rows and a vector ADD. No scratch region: the tile is
the largest with ``slots`` regions in the accumulator and two ``(a, b)`` pairs in the input
buffer.
``input_path="split"`` loads ``a`` by LOAD ACC_8BIT into the output slot as the stock program
does (it overwrites: no reset) and only ``b`` by LOAD INP, added by one GEMM micro-op a row:
``2 + GEMM_CYCLES_PER_UOP`` compute cycles a row, and the load module's one INP row (2 cycles on
``pipelined``) overlaps them. On these two paths the ``"cycles"`` knob policy takes the tile the
cycle model times fastest among the largest that fits and its halvings (:func:`timed_tile`): a
smaller tile lets the loads, GEMMs and stores of successive tiles overlap.

**Hardswish** (:func:`build_hswish`, :class:`HswishWorkload`): one int8 tensor in that layout,
``int8(epilogue(x * clip(x + offset, lo, hi)))`` with ``x = int32(data)``: the integer hardswish
of a quantised graph (``x * relu6(x + 3) / 6`` with ``3``, ``6`` at the input's scale, the ``/ 6``
and the rescale being the epilogue's fixed-point multiply, rounding add, shift and clip). Per tile:
LOAD ACC_8BIT of ``x`` into the output slot and into the scratch region, ADD imm ``offset`` and the
clip (:func:`~vta_ext.templates.epilogue.alu_ops`) on the scratch, MUL vector, the epilogue, STORE.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Union

import numpy as np

from ..config import VTAConfig, load_config
from ..isa import AluOp, MemType
from ..layout import MAX_LOOP_EXTENT
from ..runtime import CommandQueue
from .alu_program import (CompiledAluOp, IdentityInput, StorePipeline, alu, alu_range,
                          check_input_path, check_positive, check_slots, require_multiple)
from .epilogue import alu_ops, emit_epilogue, normalize_epilogue, vector_stages
from .errors import AluTemplateError, AluTemplateRefusal, KnobError
from .knobs import check_int_knob, knobs_from

__all__ = ["EltwiseWorkload", "HswishWorkload", "EltwiseKnobs", "CompiledAdd", "CompiledHswish",
           "CompiledUnary", "build_add", "build_hswish", "build_unary", "AluTemplateError",
           "AluTemplateRefusal", "timed_tile", "tile_candidates", "fastest_build", "MIN_TIMED_TILE",
           "MAX_TIMED_TILES"]


@dataclass(frozen=True)
class EltwiseWorkload:
    """An element-wise operation on two NCHW int8 tensors of the same shape (batch a multiple of
    BATCH, channels a multiple of BLOCK_OUT)."""

    batch: int
    channels: int
    height: int
    width: int


@dataclass(frozen=True)
class HswishWorkload:
    """``x * clip(x + offset, lo, hi)`` on one NCHW int8 tensor (batch a multiple of BATCH,
    channels a multiple of BLOCK_OUT); ``offset``, ``lo``, ``hi`` fit the 16-bit ALU immediate."""

    batch: int
    channels: int
    height: int
    width: int
    offset: int
    lo: int
    hi: int


@dataclass(frozen=True)
class EltwiseKnobs:
    """``tile``: accumulator rows per tile (None = as large as fits); ``slots``: output regions
    (2 = double buffering against the STORE module). The template has one schedule rule, so the
    presets ``"tps"`` and ``"fallback"`` are both the default ``EltwiseKnobs()``."""

    tile: Optional[int] = None
    slots: int = 2


class CompiledAdd(CompiledAluOp):
    """A compiled residual add (see :class:`~vta_ext.templates.alu_program.CompiledAluOp`)."""


class CompiledHswish(CompiledAluOp):
    """A compiled hardswish (see :class:`~vta_ext.templates.alu_program.CompiledAluOp`)."""


class CompiledUnary(CompiledAluOp):
    """A compiled epilogue-only operator (see :class:`~vta_ext.templates.alu_program.CompiledAluOp`)."""


def build_add(cfg: Union[VTAConfig, str], workload: EltwiseWorkload, epilogue=(),
              knobs=None, input_path: str = "acc8") -> CompiledAdd:
    """Compile ``int8(epilogue(int32(a) + int32(b)))`` for ``cfg``.

    ``knobs``: None / ``"tps"`` / ``"fallback"`` (all the default :class:`EltwiseKnobs`), an
    :class:`EltwiseKnobs` or a dict of its fields; ``"cycles"`` is the default too on the acc8
    path, and on the identity-GEMM paths the tile the cycle model times fastest
    (:func:`timed_tile`). ``input_path``: one of
    :data:`~.alu_program.INPUT_PATHS` (module docstring). Raises
    :class:`~vta_ext.templates.errors.AluTemplateRefusal` for workloads the template does not
    implement and :class:`~vta_ext.templates.errors.KnobError` for invalid knobs.
    """
    if not isinstance(workload, EltwiseWorkload):
        raise AluTemplateError(f"expected an EltwiseWorkload, got {type(workload).__name__}")
    return _build(cfg, workload, epilogue, knobs, "add", input_path)


def build_hswish(cfg: Union[VTAConfig, str], workload: HswishWorkload, epilogue=(),
                 knobs=None) -> CompiledHswish:
    """Compile ``int8(epilogue(x * clip(x + offset, lo, hi)))``, ``x = int32(data)``, for ``cfg``.

    Knobs and errors as :func:`build_add`; an ``offset`` / ``lo`` / ``hi`` outside the 16-bit
    immediate is an :class:`~vta_ext.templates.errors.EpilogueRefusal`.
    """
    if not isinstance(workload, HswishWorkload):
        raise AluTemplateError(f"expected a HswishWorkload, got {type(workload).__name__}")
    return _build(cfg, workload, epilogue, knobs, "hswish")


def build_unary(cfg: Union[VTAConfig, str], workload: EltwiseWorkload, epilogue=(),
                knobs=None) -> CompiledUnary:
    """Compile ``int8(epilogue(int32(x)))`` for ``cfg``: an element-wise operator that is only
    an epilogue, e.g. the int8 clip of a ReLU6 whose producer is not a VTA operator. Knobs and
    errors as :func:`build_add`."""
    if not isinstance(workload, EltwiseWorkload):
        raise AluTemplateError(f"expected an EltwiseWorkload, got {type(workload).__name__}")
    return _build(cfg, workload, epilogue, knobs, "unary")


#: input-buffer regions of the identity-GEMM add (double buffering of the loads)
GEMM_INPUT_SLOTS = 2


def _add_tile(cfg: VTAConfig, tile: Optional[int], slots: int, gemm: bool, inputs: int,
              what: str) -> int:
    """The tile (accumulator rows) of an element-wise program: the ``tile`` knob checked against
    the buffers, or the largest that fits (the accumulator's ``slots`` output regions and, on
    the ``acc8`` path, the second operand's; on the GEMM paths, ``GEMM_INPUT_SLOTS`` regions of
    ``inputs`` operands in the input buffer)."""
    acc = cfg.acc_depth
    regions = slots if gemm else slots + 1
    fits = acc // regions
    if gemm:
        fits = min(fits, cfg.inp_depth // (inputs * GEMM_INPUT_SLOTS))
    if tile is None:
        return fits
    tile = check_int_knob("tile", tile)
    if tile > fits:
        second = "" if gemm else " + the second operand"
        raise KnobError(f"{what}: knob tile={tile} needs {regions * tile} accumulator (acc) "
                        f"entries ({slots} output slot(s){second})"
                        + (f" and {inputs * GEMM_INPUT_SLOTS * tile} input-buffer entries" if gemm
                           else "")
                        + f", more than the buffers hold; valid tile: 1..{fits}")
    return tile


#: the smallest tile (accumulator rows) :func:`timed_tile` tries
MIN_TIMED_TILE = 8
#: the most tiles a timed candidate smaller than the largest may make: an add of that many tiles
#: already overlaps its loads, GEMMs and stores, and timing programs of more would cost build
#: time (a 256x56x56 add down to 8-row tiles: about 0.8 s); with no such candidate the largest
#: tile is kept, untimed
MAX_TIMED_TILES = 64


def tile_candidates(cfg: VTAConfig, rows: int, inputs: int) -> list:
    """The tiles :func:`timed_tile` times for ``rows`` accumulator rows on an identity-GEMM path
    with ``inputs`` operands in the input buffer: the largest that fits (:func:`_add_tile` with
    the default slots), then halved while at least :data:`MIN_TIMED_TILE` rows and at most
    :data:`MAX_TIMED_TILES` tiles, each at most ``rows``, no tile twice."""
    fits = min(_add_tile(cfg, None, EltwiseKnobs.slots, True, inputs, "add"), rows,
               MAX_LOOP_EXTENT)
    out, tile = [fits], fits // 2
    while tile >= MIN_TIMED_TILE and -(-rows // tile) <= MAX_TIMED_TILES:
        out.append(tile)
        tile //= 2
    return out


def timed_tile(cfg: VTAConfig, workload: EltwiseWorkload, epilogue, op: str,
               input_path: str) -> int:
    """The tile of the ``"cycles"`` knob policy on an identity-GEMM input path (``"gemm"``,
    ``"split"``): the candidate (:func:`tile_candidates`) whose program the cycle model
    (:class:`vta_ext.sim.cycles.CycleModel`) times fastest, the larger tile on a tie.

    The largest tile that fits leaves a small add one or two tiles, whose loads, GEMMs and
    stores then barely overlap (a 1x384x4x4 add on ``pipelined``, one tile: 2,759 cycles; in
    tiles of 32 rows: 2,161). The acc8 path (the stock program) keeps its largest tile."""
    return _timed_build(cfg, workload, epilogue, op, input_path)[0]


def _timed_build(cfg: VTAConfig, workload: EltwiseWorkload, epilogue, op: str,
                 input_path: str) -> Tuple[int, Optional[Any]]:
    """:func:`timed_tile`'s tile and the compiled operator it timed for it (None when there was
    a single candidate: nothing was built), which :func:`_build` returns rather than build the
    same program again."""
    rows = (workload.batch // cfg.BATCH) * (workload.channels // cfg.BLOCK_OUT) \
        * workload.height * workload.width
    tiles = tile_candidates(cfg, rows, 1 if input_path == "split" else 2)
    if len(tiles) == 1:     # nothing to compare: no build, no timing
        return tiles[0], None
    return fastest_build(cfg, tiles, lambda tile: _build(cfg, workload, epilogue,
                                                         EltwiseKnobs(tile=tile), op, input_path))


def fastest_build(cfg: VTAConfig, tiles, build: Callable[[int], Any],
                  built: Optional[Dict[int, Any]] = None, knob: str = "tile") -> Tuple[int, Any]:
    """The tile of ``tiles`` whose compiled operator ``build(tile)`` the cycle model
    (:class:`vta_ext.sim.cycles.CycleModel`) times fastest, the larger tile on a tie, and that
    compiled operator (the caller returns it rather than build it again). ``built``: operators
    already compiled for some of the tiles, timed as they are. The winner's ``info["tiling"]``
    says which tiles were timed (:func:`timed_tiling_text`, ``knob`` naming the tile), for the
    build report."""
    from ..sim.cycles import CycleModel

    model = CycleModel(cfg)
    built = dict(built or {})
    timed = {}
    for tile in tiles:
        if tile not in built:
            built[tile] = build(tile)
        timed[tile] = model.run_program(built[tile].program).total_cycles
    best = min(timed, key=lambda t: (timed[t], -t))
    built[best].info["tiling"] = timed_tiling_text(knob, best, timed)
    return best, built[best]


def timed_tiling_text(knob: str, best: int, timed: Dict[int, int]) -> str:
    """The build report's words for a tile the cycle model picked, e.g. ``"tile_c=4, the
    fastest of 4 timed tiles (4,858 cycles; tile_c=28: 5,974, ...)"``: the winner first, then
    every other tile timed, largest first."""
    others = ", ".join(f"{knob}={t}: {c:,}" for t, c in sorted(timed.items(), reverse=True)
                       if t != best)
    return (f"{knob}={best}, the fastest of {len(timed)} timed tiles ({timed[best]:,} cycles"
            + (f"; {others})" if others else ")"))


def _build(cfg, workload, epilogue, knobs, op: str, input_path: str = "acc8"):
    t0 = time.perf_counter()
    cfg = load_config(cfg)
    wl = workload
    what = f"{op} {wl}"
    check_positive(wl, ("batch", "channels", "height", "width"), what)
    require_multiple(wl.batch, cfg.BATCH, "batch", "BATCH", what)
    require_multiple(wl.channels, cfg.BLOCK_OUT, "channels", "BLOCK_OUT", what)
    epilogue = normalize_epilogue(epilogue)
    if vector_stages(epilogue):
        raise AluTemplateRefusal(f"{what}: the {op} takes no per-channel epilogue stage "
                                 f"({', '.join(vector_stages(epilogue))})")
    pre = []
    if op == "hswish":  # x + offset, clipped: validated as epilogue stages (int16 immediates)
        pre = [alu for st in normalize_epilogue([("add", wl.offset), ("clip", wl.lo, wl.hi)])
               for alu in alu_ops(cfg, st)]
    gemm = check_input_path(cfg, input_path, what)
    tiling = None
    if knobs == "cycles" and gemm and op == "add":
        tile, timed = _timed_build(cfg, wl, epilogue, op, input_path)
        if timed is not None:       # the winner's program, built to be timed
            return timed
        knobs = EltwiseKnobs(tile=tile)
        tiling = (f"tile={tile}, the largest that fits, untimed: a halving would be under "
                  f"{MIN_TIMED_TILE} rows or make over {MAX_TIMED_TILES} tiles")
    knobs = knobs_from(knobs, EltwiseKnobs, {"tps": EltwiseKnobs, "fallback": EltwiseKnobs})
    slots = check_slots(knobs.slots, what)

    B, BO = cfg.BATCH, cfg.BLOCK_OUT
    shape = (wl.batch // B, wl.channels // BO, wl.height, wl.width, B, BO)
    total = int(np.prod(shape[:4]))
    tile = max(1, min(_add_tile(cfg, knobs.tile, slots, gemm, 1 if input_path == "split" else 2,
                                what), total, MAX_LOOP_EXTENT))
    B_REG = slots * tile

    q = CommandQueue(cfg)
    nbytes = total * B * BO
    a_buf = q.alloc(nbytes, "data")
    b_buf = q.alloc(nbytes, "data1") if op == "add" else a_buf
    regions = slots if op == "unary" or gemm else slots + 1  # no second operand region
    out = q.alloc(nbytes, "out")
    if gemm and op != "add":
        raise AluTemplateError(f"{what}: the identity-GEMM input paths are the add's only")
    split = input_path == "split"
    ident = IdentityInput(q, GEMM_INPUT_SLOTS, tile if split else 2 * tile, what) if gemm else None
    pipe = StorePipeline(q, slots)
    n_tiles = 0
    for e0 in range(0, total, tile):
        t = min(tile, total - e0)
        if ident is not None:
            _gemm_add_tile(ident, pipe, a_buf, b_buf, e0, t, tile, split)
            emit_epilogue(q, cfg, epilogue, (n_tiles % slots) * tile, t)
            pipe.end_compute()
            pipe.begin_store()
            q.store_2d((n_tiles % slots) * tile, MemType.OUT, out, e0, t, 1, t)
            pipe.end_store()
            n_tiles += 1
            continue
        slot = pipe.begin_tile()
        A = slot * tile
        q.load_2d(a_buf, e0, t, 1, t, 0, 0, 0, 0, A, MemType.ACC_8BIT)
        if op != "unary":
            q.load_2d(b_buf, e0, t, 1, t, 0, 0, 0, 0, B_REG, MemType.ACC_8BIT)
        if op == "add":
            alu(q, AluOp.ADD, [(A, B_REG)], [(t, 1, 1)])
        elif op == "hswish":
            for alu_op, imm in pre:
                alu_range(q, alu_op, B_REG, t, imm)
            alu(q, AluOp.MUL, [(A, B_REG)], [(t, 1, 1)])
        emit_epilogue(q, cfg, epilogue, A, t)
        pipe.end_compute()
        pipe.begin_store()
        q.store_2d(A, MemType.OUT, out, e0, t, 1, t)
        pipe.end_store()
        n_tiles += 1
    pipe.finish()
    if ident is not None:
        ident.finish()
    prog = q.synchronize()
    if ident is not None:
        IdentityInput.write_identity(prog)
    info = dict(tile=tile, slots=slots, tiles=n_tiles, acc_used=regions * tile,
                input_path=input_path)
    if tiling is not None:
        info["tiling"] = tiling
    inputs = [("data", shape, np.int8)] + ([("data1", shape, np.int8)] if op == "add" else [])
    compiled = {"add": CompiledAdd, "hswish": CompiledHswish, "unary": CompiledUnary}[op]
    return compiled(cfg, wl, epilogue, prog, inputs, shape, {"build": time.perf_counter() - t0},
                    info)


def _gemm_add_tile(ident: IdentityInput, pipe: StorePipeline, a_buf, b_buf, e0: int, t: int,
                   tile: int, split: bool) -> None:
    """One tile of the identity-GEMM add, rows ``e0 .. e0+t-1``: ``b`` (and, unless ``split``,
    ``a``) LOADed INP; then the output slot reset and ``acc += b``, ``acc += a`` by one GEMM
    micro-op over an operand loop and a row loop, or (``split``) ``a`` LOADed ACC_8BIT into the
    slot and ``acc += b``."""
    q = ident.q
    base = ident.begin_load()
    ident.load(b_buf, e0, t, 1, t, 0, 0, 0, base)
    if not split:
        ident.load(a_buf, e0, t, 1, t, 0, 0, 0, base + tile)
    ident.end_load()
    A = pipe.begin_tile() * tile
    if split:
        q.load_2d(a_buf, e0, t, 1, t, 0, 0, 0, 0, A, MemType.ACC_8BIT)
    ident.begin_compute()
    if not split:
        ident.reset(A, t)
    # one micro-op over (operand, row) loops: consecutive micro-ops write different rows, so
    # the kernel keeps a hazard distance up to ``t`` as it is (two micro-ops a row would write
    # each row twice in a row, which the runtime's cure unrolls into a 2*t micro-op list)
    ident.gemm([(A, base)], ([] if split else [(2, 0, tile)]) + [(t, 1, 1)])
    ident.end_compute()
