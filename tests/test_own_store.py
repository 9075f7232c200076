"""Each virtual thread's accumulator fill waits for its own store (:data:`vta_ext.lower.latefill.
OWN_STORE`, the ``late_fill`` option of :func:`tvm_csp_embed.codegen.build.build_gemm`).

A 1x1 conv of 16 channels (one reduction step, NCHW): the tile loop already loads before it fills
the accumulator. Its stage-based plan routes the store -> next loads token through the compute
module after every thread's store, so thread 0's next fill waited for thread 1's store too. At a
two-thread point (the threads on the output channels, several row tiles):

* the program is bit-exact against numpy on the functional simulator, race-free with no token
  left, and the cycle model finishes it faster than the stage-based plan;
* by hand, on the instruction stream: every compute instruction that pops a store token is an
  accumulator fill (but the pops after the loop, which write nothing), and the store that pushed that token (counting the one credit per thread
  pushed before the loop) read the very region the fill writes; in the stage-based program some
  compute instruction waits for a store of another region before a write;
* on ``pynq`` it is bit-exact on the RTL (``../shared/vta-hw``) and keeps the hazard distance.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import numpy as np
import pytest

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
from tvm_csp_embed.codegen import knobs as K
from tvm_csp_embed.codegen.build import build_gemm
from vta_ext.config import load_config
from vta_ext.isa import MemInsn, Opcode, Stage, insn_stage
from vta_ext.lower.latefill import OWN_STORE
from vta_ext.lower.racecheck import check_races
from vta_ext.sim.cycles import CycleModel

sys.path.insert(0, str(Path(__file__).parent))
from conftest import rtl_device  # noqa: E402
from test_early_release import EPILOGUE, _is_fill, _run  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")

def _case(config: str):
    """The NCHW ``y=k16`` embedding of a 16 -> 64 channel 1x1 conv on 9x9."""
    from tvm_csp_embed.candidates import CspWorkload, candidates

    cfg = load_config(config)
    wl = CspWorkload("conv2d", (("n", 1), ("c", 16), ("h", 9), ("w", 9), ("k", 64), ("kh", 1),
                                ("kw", 1), ("pt", 0), ("pl", 0), ("pb", 0), ("pr", 0), ("sh", 1),
                                ("sw", 1)))
    cands, _ = candidates(cfg, wl, "relaxed", ["NCHW"], EPILOGUE)
    return cfg, next(c for c in cands if not c.refused and c.label.startswith("NCHW")
                     and "y=k16" in c.label)


def _point(cfg, pg):
    """The point of fewest estimated cycles with two threads on the output channels and one on
    the rows, and several row tiles (a next tile whose fill waits for a store)."""
    grid = K.knob_grid(cfg, pg, EPILOGUE)
    ext = {lp.name: lp.extent for lp in pg.loops}
    best = None
    for i in np.flatnonzero(grid.valid):
        p = grid.point(int(i))
        if p.get("vt_k", 1) != 2 or p.get("vt_oh", 1) != 1 or p["tile_oh"] * 2 > ext["oh"]:
            continue
        if best is None or grid.cycles[i] < best[0]:
            best = (float(grid.cycles[i]), p)
    assert best is not None
    return best[1]


def _store_waits(insns) -> List[tuple]:
    """For every compute instruction that pops a store token, in order: (the instruction, the
    SRAM base of the store that pushed the token, or None for a credit pushed before any
    store). The store module pushes its tokens in program order, so the n-th pop takes the n-th
    push."""
    pushes: List[Optional[int]] = []
    waits = []
    for insn in insns:
        stage = insn_stage(insn)
        if stage == Stage.STORE and insn.push_prev_dep:
            store = isinstance(insn, MemInsn) and insn.opcode == Opcode.STORE and insn.y_size > 0
            pushes.append(insn.sram_base if store else None)
        elif stage == Stage.COMPUTE and insn.pop_next_dep:
            waits.append(insn)
    assert len(waits) <= len(pushes) + 1     # every pop has its push (the program finished)
    return [(w, pushes[n]) for n, w in enumerate(waits)]


def test_each_thread_fill_waits_for_its_own_store():
    cfg, cand = _case("default")
    pg = cand.packed
    knobs = _point(cfg, pg)
    new = build_gemm(cfg, pg, EPILOGUE, knobs)
    base = build_gemm(cfg, pg, EPILOGUE, knobs, late_fill=False)
    assert new.generated.nthreads == 2
    assert OWN_STORE in new.generated.release, new.generated.release
    assert OWN_STORE not in base.generated.release
    for compiled in (new, base):
        got, expected = _run(cfg, cand, compiled)
        np.testing.assert_array_equal(got, expected)
        report = check_races(compiled.program)
        assert all(not any(q.values()) for q in report.leftover_tokens), report

    waits = _store_waits(new.program.insns)
    fills = [x for x in new.program.insns if _is_fill(x)]
    assert len(fills) > 2 and [w for w, _ in waits[:len(fills)]] == fills
    drains = waits[len(fills):]            # the pops after the loop (and the final sync): no write
    assert len(drains) >= 2 and all(isinstance(w, MemInsn) and w.x_size == 0 for w, _ in drains)
    regions = sorted({f.sram_base for f in fills})
    assert len(regions) == 2                 # one accumulator region per thread
    for fill, store in waits[:len(fills)]:
        assert store is None or store == fill.sram_base, (fill.sram_base, store)
    # the stage-based plan: a compute instruction waits for a store of the other region
    # before the next write of its own thread
    old = base.program.insns
    pos = {id(x): i for i, x in enumerate(old)}
    crossed = 0
    for wait, store in _store_waits(old):
        if store is None:
            continue
        nxt = next((x for x in old[pos[id(wait)]:] if _is_fill(x)), None)
        crossed += nxt is not None and nxt.sram_base != store
    assert crossed > 0

    t_new = CycleModel(cfg).run_program(new.program).total_cycles
    t_base = CycleModel(cfg).run_program(base.program).total_cycles
    assert t_new < t_base, (t_new, t_base)


def test_own_store_program_is_bit_exact_on_the_pynq_rtl():
    from vta_ext.hazard import program_violations

    device = rtl_device()
    cfg, cand = _case("pynq")
    pg = cand.packed
    compiled = build_gemm(cfg, pg, EPILOGUE, _point(cfg, pg))
    assert OWN_STORE in compiled.generated.release, compiled.generated.release
    assert program_violations(compiled.program, (3, 3)) == []
    got, expected = _run(cfg, cand, compiled, device)
    np.testing.assert_array_equal(got, expected)
