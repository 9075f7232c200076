"""Each tile's accumulator fill after its loads (:func:`vta_ext.lower.latefill.late_fill`, the
``late_fill`` option of :func:`tvm_csp_embed.codegen.build.build_gemm`).

On the cases of :mod:`test_early_release` (a 1-channel 5x5 conv in ``fused-rs`` at a batch-inner
and a per-pixel point, a 32-channel 3x3 conv in NCHW, two virtual threads), built with the late
fill, and with the stage-based order:

* both programs are bit-exact against the numpy reference on the functional simulator;
* the race checker (happens-before from the tokens) finds no race and no token left;
* by hand: where the fill moved, every accumulator fill comes after an input LOAD in program order
  and pops the thread's previous store's token, and the next compute instruction that is not a
  fill pops the loads' (a fill touches no buffer a load writes);
* the default build moves the fills of these two-thread programs (a static choice, one build); at
  a one-thread point it keeps the stage-based order and says why, while ``late_fill=True`` still
  moves them.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
from tvm_csp_embed.codegen import knobs as K
from tvm_csp_embed.codegen.build import build_gemm
from vta_ext.isa import Stage, encode_stream, insn_stage
from vta_ext.lower.latefill import ONE_THREAD, SUNK
from vta_ext.lower.racecheck import check_races
from vta_ext.sim.cycles import CycleModel

sys.path.insert(0, str(Path(__file__).parent))
from test_early_release import (CASES, EPILOGUE, _case, _is_fill, _is_input_load,  # noqa: E402
                                _point, _run)

pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")


@pytest.mark.parametrize("layout, order", CASES)
def test_late_fill_is_bit_exact_race_free_and_the_default_keeps_the_faster(layout, order):
    cfg, cand = _case("default", layout)
    pg = cand.packed
    knobs = _point(cfg, pg, order)
    late = build_gemm(cfg, pg, EPILOGUE, knobs, late_fill=True)
    base = build_gemm(cfg, pg, EPILOGUE, knobs, late_fill=False)
    for compiled in (late, base):
        got, expected = _run(cfg, cand, compiled)
        np.testing.assert_array_equal(got, expected)
        report = check_races(compiled.program)
        assert all(not any(q.values()) for q in report.leftover_tokens), report
    moved = late.generated.release.startswith(SUNK)
    insns = late.program.insns
    fills = [i for i, x in enumerate(insns) if _is_fill(x)]
    assert len(fills) == sum(map(_is_fill, base.program.insns)) > 2
    if moved:
        # every fill after an input LOAD, waiting for the thread's previous store; the next
        # compute instruction (the GEMM) waits for the loads
        first_load = min(i for i, x in enumerate(insns) if _is_input_load(x))
        assert first_load < fills[0]
        assert all(insns[i].pop_next_dep and not insns[i].pop_prev_dep for i in fills)
        for i in fills:       # the thread's next compute instruction waits for its loads
            nxt = next(x for x in insns[i + 1:] if insn_stage(x) == Stage.COMPUTE
                       and not _is_fill(x))
            assert nxt.pop_prev_dep, nxt
    else:
        assert encode_stream(cfg, insns) == encode_stream(cfg, base.program.insns)
    assert late.generated.nthreads == 2
    default = build_gemm(cfg, pg, EPILOGUE, knobs)
    assert encode_stream(cfg, default.program.insns) == encode_stream(cfg, late.program.insns)
    assert default.generated.release == late.generated.release


def test_one_thread_keeps_the_fills_before_the_loads_by_default():
    """With one virtual thread the fill delays only its own GEMMs in either order (and below the
    loads it waits for them): the default keeps the stage-based order and says so; asked for,
    the fills still move, bit-exact and race-free."""
    cfg, cand = _case("default", "fused-rs")
    pg = cand.packed
    grid = K.knob_grid(cfg, pg, EPILOGUE)
    late = knobs = None
    for i in sorted(np.flatnonzero(grid.valid), key=lambda i: grid.cycles[i]):
        knobs = grid.point(int(i))      # the best estimated one-thread point whose fills move
        if knobs.get("vt_k", 1) != 1:
            continue
        late = build_gemm(cfg, pg, EPILOGUE, knobs, late_fill=True)
        if late.generated.release.startswith(SUNK):
            break
    assert late.generated.release.startswith(SUNK), late.generated.release
    default = build_gemm(cfg, pg, EPILOGUE, knobs)
    base = build_gemm(cfg, pg, EPILOGUE, knobs, late_fill=False)
    assert default.generated.nthreads == 1
    assert default.generated.release.startswith(ONE_THREAD)
    assert encode_stream(cfg, default.program.insns) == encode_stream(cfg, base.program.insns)
    got, expected = _run(cfg, cand, late)
    np.testing.assert_array_equal(got, expected)
    report = check_races(late.program)
    assert all(not any(q.values()) for q in report.leftover_tokens), report


def test_the_fused_rs_batch_inner_point_is_faster_with_the_late_fill():
    """The batch-inner fused-rs point (two threads over the output channels of one tile row): the
    second thread's fill no longer waits for its store with nothing else on the compute module.
    The point is written by hand (not the estimate's choice): all 24 output rows in one tile and
    three tiles of 8 columns, so that the tile loop that starts with the fill is the only one (a
    tile loop inside another keeps the stage-based order), both reduction steps per tile."""
    cfg, cand = _case("default", "fused-rs")
    pg = cand.packed
    ext = {lp.name: lp.extent for lp in pg.loops}
    knobs = dict(tile_n=1, tile_k=1, tile_oh=ext["oh"], tile_ow=8, tile_rs=ext["rs"], vt_k=2,
                 order=4)
    assert [ext[n] // knobs[f"tile_{n}"] for n in ("n", "oh", "ow")] == [1, 1, 3]
    assert ext["k"] == knobs["vt_k"] * knobs["tile_k"]      # one output-channel tile per thread
    late = build_gemm(cfg, pg, EPILOGUE, knobs, late_fill=True)
    base = build_gemm(cfg, pg, EPILOGUE, knobs, late_fill=False)
    assert late.generated.release.startswith(SUNK)
    t_late = CycleModel(cfg).run_program(late.program).total_cycles
    t_base = CycleModel(cfg).run_program(base.program).total_cycles
    assert t_late < t_base, (t_late, t_base)
