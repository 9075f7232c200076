"""The stock mapping kept among csp-relaxed's candidates (tvm_csp_embed.candidates
``with_stock_mapping``, timed by tvm_csp_embed.choice wherever its static estimate ranks it): a
1x1 conv of 72 output channels whose pixel-lane embeddings pad nothing has the stock mapping
(``y=k16 z=c16``, data on A, 72 -> 80 channels) only as the solver's sixth structure, and it is
the one whose blocked layout the previous VTA conv hands over for free."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tvm import relax

import tvm_csp_embed  # noqa: F401 -- registers the CSP strategies
import tvm_csp_embed.candidates as CA
from conftest import conv2d_nchw, requantize
from test_grouped_gemm import vta_build
from tvm_csp_embed.cache import cached_embeddings
from vta_ext.config import load_config

#: RegNetX-1.6GF's first 1x1 conv (1x32x112x112 * 72x32x1x1)
POINTWISE = CA.CspWorkload("conv2d", (("n", 1), ("c", 32), ("h", 112), ("w", 112), ("k", 72),
                                      ("kh", 1), ("kw", 1), ("sh", 1), ("sw", 1), ("pt", 0),
                                      ("pb", 0), ("pl", 0), ("pr", 0)))


def _stock_like(mapping: str, binding) -> bool:
    """The stock template's mapping by its printed form (independent of ``is_stock_mapping``)."""
    return mapping == "x=1 y=k16 z=c16" and binding["A"] == "data"


def test_the_solver_ranks_the_stock_mapping_below_the_four_kept(fresh_embedding_cache):
    cfg = load_config("default")
    req = CA.solve_request(cfg, dataclasses.replace(POINTWISE, layout="NCHW", mode="relaxed"), 4)
    four = cached_embeddings(req.wl, req.instr, "relaxed", solutions=4, max_cost=req.max_cost,
                             cfg=cfg, use_cache=False)
    assert four.status == "ok" and len(four.embeddings) == 4
    assert not any(_stock_like(e.mapping_str(), e.binding) for e in four.embeddings)
    cands, notes = CA.candidates(cfg, POINTWISE, "relaxed", ["NCHW"], ())
    assert not notes
    got = [(c.embedding.mapping_str(), c.embedding.binding["A"]) for c in cands]
    # the solver's four first, in its order, then the stock mapping once
    assert got[:4] == [(e.mapping_str(), e.binding["A"]) for e in four.embeddings]
    assert [_stock_like(m, {"A": a}) for m, a in got[4:]] == [True]


def test_no_second_stock_mapping_where_the_solver_keeps_one(fresh_embedding_cache):
    cfg = load_config("default")
    base = dataclasses.replace(POINTWISE, params=tuple(
        (k, {"c": 72, "h": 28, "w": 28}.get(k, v)) for k, v in POINTWISE.params))
    cands, _ = CA.candidates(cfg, base, "relaxed", ["NCHW"], ())
    stock = [c for c in cands if _stock_like(c.embedding.mapping_str(), c.embedding.binding)
             and c.workload.pad == cands[0].workload.pad]
    assert len(cands) <= 4 + 1 and len(stock) <= 1


def _two_convs(hw: int, seed: int = 0):
    """A 3x3 conv 16 -> 32 then RegNet's 1x1 conv 32 -> 72, each requantised: module, inputs,
    numpy reference."""
    from conftest import conv_chain

    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (1, 16, hw, hw)).astype(np.int8)
    w1 = rng.integers(-64, 64, (32, 16, 3, 3)).astype(np.int8)
    b1 = rng.integers(-3000, 3000, (1, 32, 1, 1)).astype(np.int32)
    w2 = rng.integers(-64, 64, (72, 32, 1, 1)).astype(np.int8)
    b2 = rng.integers(-3000, 3000, (1, 72, 1, 1)).astype(np.int32)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "int8"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = conv_chain(bb, xv, relax.const(w1), relax.const(b1), padding=1, shift=8,
                           clip=(0, 127))
            y = conv_chain(bb, y, relax.const(w2), relax.const(b2), shift=8, clip=(0, 127))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mid = requantize(conv2d_nchw(x, w1, 1, 1), b1, 8, (0, 127))
    ref = requantize(conv2d_nchw(mid, w2, 1, 0), b2, 8, (0, 127))
    return bb.get(), [x], ref


@pytest.mark.parametrize("config", ["default", pytest.param("pipelined", marks=pytest.mark.slow)])
def test_the_stock_mapping_takes_the_handed_over_layout(config):
    """Behind a VTA conv, the 1x1 conv runs the stock mapping's CSP plan (bit-exact against
    numpy); without the kept stock mapping only pixel-lane embeddings and the stock template
    compete there."""
    mod, arrays, ref = _two_convs(32)
    out, report = vta_build(mod, arrays, config, "end-to-end")
    np.testing.assert_array_equal(out, ref)
    second = [p for p in report.placements if p.op == "relax.nn.conv2d"][1]
    # the CSP plan in the stock mapping, its bias by a GEMM (the stock template has no such twin)
    assert second.plan == "csp-relaxed NCHW x=1 y=k16 z=c16, bias by GEMM"
