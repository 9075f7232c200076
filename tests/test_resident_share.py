"""A resident tile that every virtual thread would load with the same data is loaded once, by
thread 0, and read by every thread (:func:`vta_ext.lower.alloc.resident_buffers`, the
``share_resident`` option of :func:`vta_ext.lower.codegen.lower_to_runtime` and of
:func:`tvm_csp_embed.codegen.build.build_gemm`, on by default there: the knob estimate charges
such a tile once, ``knobs._shared_once``).

On the NCHW embedding of :mod:`test_early_release` (a 32 -> 64 channel 3x3 conv on 14x14), at a
weight-resident point (``order`` 1) whose two virtual threads split the output rows (both read the
same weights) and at a data-resident one (``order`` 2) whose threads split the output channels
over one tile of output pixels (both read the same data), built with and without the sharing:

* both programs are bit-exact against the numpy reference on the functional simulator, and the
  shared one on the pynq RTL (``../shared/vta-hw``);
* the race checker (happens-before from the tokens) finds no race and no token left;
* by hand: the shared program loads each element of the resident operand once (the tensor's
  stored bytes), the other once per thread, and the cycle model times it faster;
* where the tiles load inside the tile loop (the stock order) nothing changes, and the program
  says why;
* the knob model's DRAM bytes per counter are the simulator's on two-thread points of both
  orders where the build shares a tile and where it does not.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
from tvm_csp_embed.codegen import knobs as K
from tvm_csp_embed.codegen.build import build_gemm
from tvm_csp_embed.reference import reference_for
from vta_ext.isa import MemInsn, MemType, Opcode, encode_stream
from vta_ext.lower.racecheck import check_races
from vta_ext.sim.cycles import CycleModel

sys.path.insert(0, str(Path(__file__).parent))
from conftest import rtl_device  # noqa: E402
from test_early_release import EPILOGUE, _case, _run  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")

#: (order, the knob of the two virtual threads, the resident operand they share): weight-resident
#: with the threads on the output rows; data-resident with the threads on the output channels and
#: one tile of output pixels (the data tile loads once)
CASES = [(1, "vt_oh", "weight"), (2, "vt_k", "data")]


def _point(cfg, pg, order: int, threads: str, whole: Optional[str] = None):
    """The point of fewest estimated cycles with ``order``, two virtual threads on ``threads``
    and one on the others; with ``whole`` (``"data"`` or ``"weight"``), that operand in one tile:
    for the data one tile of output pixels (``tile_oh`` and ``tile_ow`` the full extents), for
    the weights one tile of output channels (``tile_k`` the full extent), so that the resident
    operand loads above every tile loop whatever the estimate prefers."""
    grid = K.knob_grid(cfg, pg, EPILOGUE)
    ext = {lp.name: lp.extent for lp in pg.loops}
    pinned = {"data": ("oh", "ow"), "weight": ("k",), None: ()}[whole]
    best = None
    for i in np.flatnonzero(grid.valid):
        p = grid.point(int(i))
        vts = {n: v for n, v in p.items() if n.startswith("vt_")}
        if p["order"] != order or vts != {n: (2 if n == threads else 1) for n in vts}:
            continue
        if any(p[f"tile_{n}"] != ext[n] for n in pinned):
            continue
        if best is None or grid.cycles[i] < best[0]:
            best = (float(grid.cycles[i]), p)
    assert best is not None, (order, threads)
    return best[1]


def _bytes_loaded(prog, mem: MemType) -> int:
    """Bytes the program's loads of ``mem`` (WGT or INP) bring on chip from DRAM (padding
    excluded: it reads nothing)."""
    cfg = prog.config
    per = (cfg.BLOCK_OUT * cfg.BLOCK_IN if mem == MemType.WGT else cfg.BATCH * cfg.BLOCK_IN)
    return sum(i.x_size * i.y_size * per for i in prog.insns if isinstance(i, MemInsn)
               and i.opcode == Opcode.LOAD and i.memory_type == mem)


@pytest.mark.parametrize("order, threads, operand", CASES)
def test_a_resident_tile_is_loaded_once_for_both_threads(order, threads, operand):
    cfg, cand = _case("default", "NCHW")
    pg = cand.packed
    knobs = _point(cfg, pg, order, threads, whole=operand)
    shared = build_gemm(cfg, pg, EPILOGUE, knobs, late_fill=False, share_resident=True, reuse=False)
    apart = build_gemm(cfg, pg, EPILOGUE, knobs, late_fill=False, share_resident=False, reuse=False)
    assert "loaded once for 2 virtual threads" in shared.generated.release
    assert "resident tile" not in apart.generated.release
    for compiled in (shared, apart):
        got, expected = _run(cfg, cand, compiled)
        np.testing.assert_array_equal(got, expected)
        report = check_races(compiled.program)
        assert all(not any(q.values()) for q in report.leftover_tokens), report
    # by hand: the resident operand's tile (the whole stored tensor here) once, or once per thread
    tensor = next(pg.operands[r] for r in "AB" if pg.operands[r].tensor == operand)
    stored = math.prod(tensor.stored_shape)
    mem = MemType.WGT if operand == "weight" else MemType.INP
    assert _bytes_loaded(shared.program, mem) == stored
    assert _bytes_loaded(apart.program, mem) == 2 * stored
    t_shared = CycleModel(cfg).run_program(shared.program).total_cycles
    t_apart = CycleModel(cfg).run_program(apart.program).total_cycles
    assert t_shared < t_apart, (t_shared, t_apart)
    # the default build shares (the knob estimate charges the tile once; reuse-aware double
    # buffering, which may load it once too, left out)
    default = build_gemm(cfg, pg, EPILOGUE, knobs, late_fill=False, reuse=False)
    assert encode_stream(cfg, default.program.insns) == encode_stream(cfg, shared.program.insns)


@pytest.mark.parametrize("order", [1, 2])
def test_the_knob_model_counts_the_bytes_the_shared_programs_load(order):
    """The knob model (:func:`tvm_csp_embed.codegen.knobs.evaluate`) charges a resident tile the
    build shares once and one it does not once per thread: on the first valid two-thread point
    of ``order`` per thread knob whose default build shares a tile and the first whose build does
    not (both kinds occur), its DRAM bytes per counter are the functional simulator's counters."""
    cfg, cand = _case("default", "NCHW")
    pg = cand.packed
    grid = K.knob_grid(cfg, pg, EPILOGUE)
    inputs, _, _ = reference_for("conv2d", "csp-relaxed")(cfg, cand.workload, EPILOGUE,
                                                          np.random.default_rng(7))
    seen = set()
    for i in np.flatnonzero(grid.valid):
        p = grid.point(int(i))
        vts = sorted(n for n, v in p.items() if n.startswith("vt_") and v == 2)
        if p["order"] != order or len(vts) != 1 or math.prod(
                v for n, v in p.items() if n.startswith("vt_")) != 2:
            continue
        compiled = build_gemm(cfg, pg, EPILOGUE, p)
        shares = "loaded once" in compiled.generated.release
        if (vts[0], shares) in seen:
            continue
        seen.add((vts[0], shares))
        _, stats = compiled.run(*inputs)
        counted = {c: getattr(stats, c) for c in K.BYTE_COUNTERS}
        assert K.evaluate(cfg, pg, EPILOGUE, p).bytes == counted, (p, shares)
    assert {s for _, s in seen} == {True, False}, seen


def test_tiles_loaded_in_the_tile_loop_keep_a_copy_per_thread():
    """At the stock order the threads' data tile (the same for both) loads in the tile loop, and
    each thread's weights differ: every thread keeps its copy."""
    cfg, cand = _case("default", "NCHW")
    pg = cand.packed
    knobs = _point(cfg, pg, 0, "vt_k")
    shared = build_gemm(cfg, pg, EPILOGUE, knobs, late_fill=False, share_resident=True, reuse=False)
    apart = build_gemm(cfg, pg, EPILOGUE, knobs, late_fill=False, share_resident=False, reuse=False)
    assert shared.generated.release.endswith("no resident tile shared by the 2 virtual threads: "
                                             "every tile loads inside a tile loop or differs by "
                                             "thread")
    assert encode_stream(cfg, shared.program.insns) == encode_stream(cfg, apart.program.insns)
    got, expected = _run(cfg, cand, shared)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("order, threads, operand", CASES)
def test_the_shared_resident_tile_is_bit_exact_on_the_pynq_rtl(order, threads, operand):
    from vta_ext.hazard import program_violations

    device = rtl_device()
    cfg, cand = _case("pynq", "NCHW")
    pg = cand.packed
    compiled = build_gemm(cfg, pg, EPILOGUE, _point(cfg, pg, order, threads, operand),
                          share_resident=True, reuse=False)
    assert "loaded once for 2 virtual threads" in compiled.generated.release
    assert program_violations(compiled.program, (3, 3)) == []
    got, expected = _run(cfg, cand, compiled, device)
    np.testing.assert_array_equal(got, expected)
