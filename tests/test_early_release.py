"""The loads of a tile released by the previous tile's last GEMM, not by its accumulator fill
(:func:`vta_ext.lower.sync.release_after_gemm`, the CSP builds' ``early_release``).

The stage-based token plan makes the first input LOAD of a tile wait for the tile's accumulator
fill, which waits for the thread's previous STORE. With the early release that LOAD waits only for
the GEMMs that read its buffer. Checked on a 1-channel 5x5 conv (fused-rs) at a batch-inner point
(one z step: the release moves into the GEMM region) and at a per-pixel point (a GEMM loop: its
last release carries over), both with two virtual threads, built both ways:

* the program with the early release is bit-exact against the numpy reference on the functional
  simulator, and against the pynq RTL (``../shared/vta-hw``);
* the race checker (happens-before from the tokens) finds no race and no token left;
* by hand: every accumulator fill pushed a compute -> load token, now none does; in the cycle model's timeline, the first input LOAD of every tile after the
  first starts before that tile's first fill (it waited for the fill before), and the run is
  shorter at the batch-inner point (its whole-tile first load was on the compute module's path)
  and no longer at the per-pixel one;
* without a fill (``acc_init="reset"``) nothing changes and the program says why.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
from tvm_csp_embed.codegen import knobs as K
from tvm_csp_embed.codegen.build import build_gemm
from vta_ext.config import load_config
from vta_ext.isa import GemmInsn, MemInsn, MemType, Opcode, encode_stream
from vta_ext.lower.racecheck import check_races
from vta_ext.sim.cycles import CycleModel

sys.path.insert(0, str(Path(__file__).parent))
from conftest import rtl_device  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")

EPILOGUE = (("bias",), ("shr", 9), ("clip", -128, 127))


#: (layout, order): fused-rs at a batch-inner point (one z step: the release moves into the GEMM
#: region) and at a per-pixel one (a GEMM loop: its last release carries over); NCHW at a
#: weight-resident point (the weight tiles load in the loop around the tile loop, whose release
#: and pop then move out of it)
CASES = [("fused-rs", 4), ("fused-rs", 1), ("NCHW", 1)]
#: the workload of each layout: a 1 -> 32 channel 5x5 conv on 24x24 (pad 2), a 32 -> 64 channel
#: 3x3 conv on 14x14 (pad 1)
SHAPES = {"fused-rs": (1, 24, 32, 5), "NCHW": (32, 14, 64, 3)}


def _case(config: str, layout: str):
    """The ``layout`` embedding (y on the output channels) of the conv of :data:`SHAPES`."""
    from tvm_csp_embed.candidates import CspWorkload, candidates, fused_variants

    cfg = load_config(config)
    c, hw, k, f = SHAPES[layout]
    p = f // 2
    wl = CspWorkload("conv2d", (("n", 1), ("c", c), ("h", hw), ("w", hw), ("k", k), ("kh", f),
                                ("kw", f), ("pt", p), ("pl", p), ("pb", p), ("pr", p), ("sh", 1),
                                ("sw", 1)))
    cands, _ = candidates(cfg, wl, "relaxed", ["NCHW"] + fused_variants(wl, cfg), EPILOGUE)
    return cfg, next(c for c in cands if not c.refused and c.label.startswith(layout)
                     and "y=k16" in c.label)


def _point(cfg, pg, order: int):
    """The point of fewest estimated cycles with ``order``, two threads on the output channels,
    several column tiles (so that there is a next tile to load), two z steps where the input has
    two channel blocks (so that the fill starts the tile loop) and, where the output channels have
    more than two blocks, two output-channel tiles per thread (a next weight tile)."""
    grid = K.knob_grid(cfg, pg, EPILOGUE)
    ext = {lp.name: lp.extent for lp in pg.loops}
    best = None
    for i in np.flatnonzero(grid.valid):
        p = grid.point(int(i))
        per_thread = ext["k"] // p["tile_k"] // p.get("vt_k", 1)
        if (p["order"] != order or p.get("vt_k", 1) != 2 or p["tile_ow"] > 8
                or per_thread < (2 if ext["k"] > 2 else 1) or p.get("tile_c", 1) != 1):
            continue
        if best is None or grid.cycles[i] < best[0]:
            best = (float(grid.cycles[i]), p)
    assert best is not None, order
    return best[1]


def _run(cfg, cand, compiled, device=None):
    from tvm_csp_embed.reference import reference_for

    inputs, expected, unpack = reference_for("conv2d", "csp-relaxed")(
        cfg, cand.workload, EPILOGUE, np.random.default_rng(7))
    if device is None:
        out, _ = compiled.run(*inputs)
    else:
        sim = device.simulator(cfg)
        sim.take_cycles()
        out, _ = compiled.run(*inputs, simulator=sim)
        assert sum(sim.take_cycles()) > 0      # the device ran it
    return unpack(out), expected


def _is_fill(insn) -> bool:
    return (isinstance(insn, MemInsn) and insn.opcode == Opcode.LOAD and insn.y_size == 0
            and insn.memory_type == MemType.ACC and insn.x_size > 0)


def _is_input_load(insn) -> bool:
    return (isinstance(insn, MemInsn) and insn.opcode == Opcode.LOAD and insn.y_size > 0
            and insn.memory_type == MemType.INP)


@pytest.mark.parametrize("layout, order", CASES)
def test_early_release_is_bit_exact_race_free_and_faster(layout, order):
    cfg, cand = _case("default", layout)
    pg = cand.packed
    knobs = _point(cfg, pg, order)
    old = build_gemm(cfg, pg, EPILOGUE, knobs, early_release=False, late_fill=False,
                     share_resident=False, reuse=False, early_start=False)
    new = build_gemm(cfg, pg, EPILOGUE, knobs, early_release=True, late_fill=False,
                     share_resident=False, reuse=False, early_start=False)
    assert new.generated.release.startswith("loads released by the previous tile's last GEMM")
    assert old.generated.release == ""
    for compiled in (old, new):
        got, expected = _run(cfg, cand, compiled)
        np.testing.assert_array_equal(got, expected)
        report = check_races(compiled.program)
        assert all(not any(q.values()) for q in report.leftover_tokens), report

    # by hand: the fills pushed the compute -> load tokens; now none does, and as many LOADs pop
    def fills_pushing(prog):
        return sum(_is_fill(i) and i.push_prev_dep for i in prog.insns)

    fills = sum(map(_is_fill, old.program.insns))
    assert fills > 2 and fills_pushing(old.program) == fills
    assert fills_pushing(new.program) == 0

    # the timeline: the first input LOAD of each tile after the first now starts before the
    # tile's first fill starts; with the stage-based plan it waited for it to end
    def first_loads_and_fills(prog):
        rep = CycleModel(cfg, record_timeline=True).run_program(prog)
        span = {idx: (start, end) for (_, start, end, _), idx in zip(rep.timeline, rep.timeline_index)}
        fills, loads, seen_gemm = [], [], True
        for i, insn in enumerate(prog.insns):      # program order
            if _is_fill(insn) and seen_gemm:       # a tile's first fill
                fills.append(span[i])
                loads.append(None)
                seen_gemm = False
            elif _is_input_load(insn) and loads and loads[-1] is None:
                loads[-1] = span[i][0]
            elif isinstance(insn, GemmInsn):
                seen_gemm = True
        return rep.total_cycles, fills, loads
    t_old, f_old, l_old = first_loads_and_fills(old.program)
    t_new, f_new, l_new = first_loads_and_fills(new.program)
    assert len(f_old) == len(f_new) > 2
    assert all(load >= end for (_, end), load in zip(f_old, l_old))
    assert all(load < start for (start, _), load in list(zip(f_new, l_new))[1:])
    # a whole-tile first load was on the compute module's path; a one-pixel load hides anyway
    assert t_new < t_old if order == 4 else t_new <= t_old, (t_new, t_old)
    assert len(new.program.insns) <= len(old.program.insns) + 4   # (the first and last tokens)
    # the default is the early release wherever a tile loop starts with a fill (without the late
    # fill, :mod:`vta_ext.lower.latefill`, which moves the fill after the loads)
    default = build_gemm(cfg, pg, EPILOGUE, knobs, late_fill=False, share_resident=False, reuse=False,
                         early_start=False)
    assert default.generated.release.startswith("loads released by")
    assert encode_stream(cfg, default.program.insns) == encode_stream(cfg, new.program.insns)


def test_without_a_fill_nothing_moves():
    cfg, cand = _case("default", "fused-rs")
    pg = cand.packed
    knobs = _point(cfg, pg, 4)
    old = build_gemm(cfg, pg, EPILOGUE, knobs, acc_init="reset", early_release=False,
                     late_fill=False, share_resident=False, reuse=False, early_start=False)
    new = build_gemm(cfg, pg, EPILOGUE, knobs, acc_init="reset", early_release=True,
                     late_fill=False, share_resident=False, reuse=False, early_start=False)
    assert new.generated.release == ("loads released after the accumulator fill: no tile loop "
                                     "starts with one")
    assert (encode_stream(cfg, new.program.insns)
            == encode_stream(cfg, old.program.insns))


@pytest.mark.parametrize("layout, order", CASES)
def test_early_release_is_bit_exact_on_the_pynq_rtl(layout, order):
    from vta_ext.hazard import program_violations

    device = rtl_device()
    cfg, cand = _case("pynq", layout)
    pg = cand.packed
    compiled = build_gemm(cfg, pg, EPILOGUE, _point(cfg, pg, order), early_release=True,
                          late_fill=False)
    assert compiled.generated.release.startswith("loads released by the previous tile's last GEMM")
    assert program_violations(compiled.program, (3, 3)) == []
    got, expected = _run(cfg, cand, compiled, device)
    np.testing.assert_array_equal(got, expected)
