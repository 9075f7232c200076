"""The batch-inner loop orders (``order`` 3-5, :func:`tvm_csp_embed.codegen.loops.batch_inner`).

In a stencil-unrolled layout (fused-rs, fused-crs) the output columns are a *plain* loop (the data
only, no reduction in their subscript), which the stock rule puts above the load point: one input
LOAD and one GEMM instruction per output pixel. The batch-inner orders put the plain loops inside
it. Checked here:

* every embedding the solver offers for two thin convs, built at a batch-inner point, is bit-exact
  against the numpy reference (``tvm_csp_embed.reference``) on the functional simulator;
* the GEMM instruction count by hand: one per store point, thread and z step (batch-inner) against
  that times the plain tile (the stock rule);
* the knob model's estimate of a batch-inner point follows the cycle model (as
  ``test_cycle_estimate`` checks for the other orders);
* csp-strict and embeddings without a plain loop keep the three original orders.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
import vta_ext
from tvm_csp_embed.codegen import knobs as K
from tvm_csp_embed.codegen.build import build_gemm
from tvm_csp_embed.codegen.loops import BATCH_INNER, ORDERS, batch_inner, vt_loops
from vta_ext.config import load_config
from vta_ext.isa import GemmInsn
from vta_ext.sim.cycles import CycleModel

pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")

EPILOGUE = (("bias",), ("shr", 9), ("clip", -128, 127))


def _workload(c, hw, k, stride, o=16):
    from tvm_csp_embed.candidates import CspWorkload

    p = k // 2
    return CspWorkload("conv2d", (("n", 1), ("c", c), ("h", hw), ("w", hw), ("k", o), ("kh", k),
                                  ("kw", k), ("pt", p), ("pl", p), ("pb", p), ("pr", p),
                                  ("sh", stride), ("sw", stride)))


def _candidates(cfg, base, mode="relaxed"):
    from tvm_csp_embed.candidates import candidates, fused_variants

    layouts = ["NCHW", "NHWC"] + (fused_variants(base, cfg) if mode == "relaxed" else [])
    cands, _ = candidates(cfg, base, mode, layouts, EPILOGUE)
    return [c for c in cands if not c.refused]


def _plain(pg):
    """The plain loops of ``pg`` above the load point under the stock rule (none without a z tile
    loop of more than one iteration: the caches then sit at the store point)."""
    loops = [lp for lp in pg.loops if lp.extent > 1]
    if not any(pg.roles[lp.name] == "ztile" for lp in loops):
        return []
    return [lp for lp in loops if pg.roles[lp.name] == "plain"]


def _best(cfg, pg, orders):
    """The valid point of fewest estimated cycles among ``orders``."""
    grid = K.knob_grid(cfg, pg, EPILOGUE)
    idx = [int(i) for i in np.flatnonzero(grid.valid)]
    pts = [(float(grid.cycles[i]), i) for i in idx if grid.point(i)["order"] in orders]
    return grid.point(min(pts)[1]) if pts else None


@pytest.mark.parametrize("c, hw, k, stride", [(1, 12, 5, 1), pytest.param(3, 16, 3, 2, marks=pytest.mark.slow)])
def test_batch_inner_points_bit_exact_and_one_gemm_per_step(c, hw, k, stride):
    from tvm_csp_embed.reference import reference_for

    cfg = load_config("default")
    template = vta_ext.strategy.get_template("conv2d", "csp-relaxed")
    built = 0
    for cand in _candidates(cfg, _workload(c, hw, k, stride)):
        pg = cand.packed
        if not _plain(pg):
            assert K.knob_domain(pg)["order"] == (0, 1, 2), cand.label
            continue
        assert K.knob_domain(pg)["order"] == tuple(ORDERS), cand.label
        inner = _best(cfg, pg, range(BATCH_INNER, len(ORDERS)))
        stock = dict(inner, order=inner["order"] - BATCH_INNER)
        counts = {}
        for knobs in (inner, stock):
            compiled = template.build(cfg, cand.workload, EPILOGUE, knobs)
            inputs, expected, unpack = reference_for("conv2d", "csp-relaxed")(
                cfg, cand.workload, EPILOGUE, np.random.default_rng(built))
            out, _ = compiled.run(*inputs)
            np.testing.assert_array_equal(unpack(out), expected, err_msg=f"{cand.label} {knobs}")
            counts[batch_inner(knobs["order"])] = sum(
                isinstance(i, GemmInsn) and not i.reset_reg for i in compiled.program.insns)
        # by hand: store points x threads x z steps; the stock rule also walks the plain tile
        ext = {lp.name: lp.extent for lp in pg.loops}
        stores = math.prod(ext[n] // inner[f"tile_{n}"] for n in pg.c_loops())
        steps = math.prod(ext[lp.name] // inner[f"tile_{lp.name}"] for lp in pg.loops
                          if pg.roles[lp.name] == "ztile")
        plain = math.prod(inner[f"tile_{lp.name}"] for lp in _plain(pg))
        assert counts[True] == stores * steps, (cand.label, inner, counts)
        assert counts[False] == stores * steps * plain, (cand.label, inner, counts)
        built += 1
    assert built >= 1


@pytest.mark.parametrize("config", ["default", pytest.param("pipelined", marks=pytest.mark.slow)])
def test_batch_inner_estimate_follows_the_cycle_model(config):
    """The estimate of the best batch-inner point of each fused embedding of a DeepBench-like
    1-channel 5x5 conv within the bound ``test_cycle_estimate`` allows for threaded points."""
    cfg = load_config(config)
    checked = 0
    for cand in _candidates(cfg, _workload(1, 24, 5, 2, o=32)):
        pg = cand.packed
        if not _plain(pg):
            continue
        knobs = _best(cfg, pg, range(BATCH_INNER, len(ORDERS)))
        point = K.evaluate(cfg, pg, EPILOGUE, knobs)
        actual = CycleModel(cfg).run_program(build_gemm(cfg, pg, EPILOGUE, knobs).program).total_cycles
        threads = math.prod(knobs[f"vt_{n}"] for n in vt_loops(pg))
        assert abs(point.cycles / actual - 1) <= (0.06 if threads == 1 else 0.20), (
            cand.label, knobs, point.cycles, actual)
        checked += 1
    assert checked >= 1


def test_strict_keeps_the_stock_orders():
    cfg = load_config("default")
    for cand in _candidates(cfg, _workload(8, 8, 3, 1), mode="strict"):
        assert K.knob_domain(cand.packed)["order"] == (0, 1, 2)


def test_stem_like_conv_takes_a_batch_inner_point_bit_exact_against_llvm(config="default"):
    """A DB10-like stem (3 channels, 3x3 / 2, 64 output channels) at the default build options on
    ``default``: the chosen plan is a fused layout at a batch-inner point (the choice's own pick:
    the knob search's estimate, then the cycle model), and its output equals the llvm build's.
    (On ``pipelined`` this small image takes an NCHW plan.)"""
    from conftest import bind_constants, conv_module, run_module

    from vta_ext.executor import compiled_op

    rng = np.random.default_rng(10)
    mod = conv_module(1, 3, 64, 36, 3, stride=2, padding=1, shift=8, clip=(-128, 127))
    w = rng.integers(-128, 128, (64, 3, 3, 3)).astype(np.int8)
    b = rng.integers(-8192, 8192, (1, 64, 1, 1)).astype(np.int32)
    x = rng.integers(-128, 128, (1, 3, 36, 36)).astype(np.int8)
    mod = bind_constants(mod, w=w, b=b)
    with vta_ext.build_options(strategy="csp-relaxed"):
        got = run_module(mod, vta_ext.vta_target(config), [x])
    report = vta_ext.last_build_report()
    np.testing.assert_array_equal(got, run_module(mod, "llvm", [x]))
    (p,) = [p for p in report.on_vta if p.call is not None]
    knobs = compiled_op(report.key_of(p)).knobs
    assert "fused" in p.plan and batch_inner(knobs.order), (p.plan, knobs)
