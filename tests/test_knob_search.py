"""The knob search over the whole grid (``codegen.knobs.search`` / ``knob_grid``) against the
exhaustive reference: :func:`~tvm_csp_embed.codegen.knobs.evaluate` called on every point of the
domain, one at a time, and the best taken by the TPS rank.

For every embedding the solver offers for a layer under ``csp-strict`` (whose NCHW embedding is
the stock template's mapping, ``x=1 y=k16 z=c16``) and ``csp-relaxed`` (every layout and fused
reduction), with and without a bias + shift + clip epilogue, with and without ``order`` fixed:

* the fast search returns exactly the exhaustive point (knobs, bytes per counter, scratchpad
  entries, micro-ops, instructions);
* (default run) the grid's valid points are the exhaustive valid points in the same order, each
  pruned point carries the reason :func:`evaluate` gives, and the grid's bytes and instruction
  estimates equal the per-point model.

The default run takes a sample of layers; ``pytest -m slow`` runs ResNet-18 C1-C11, MobileNet
D1-D9 and all 108 DeepBench layers.
"""
import numpy as np
import pytest
from test_csp_correctness import DEEPBENCH, MOBILENET, RESNET_C1
from test_resnet_layers import RESNET18

from tvm_csp_embed.codegen import knobs as K
from tvm_csp_embed.strategy import CspWorkload, candidates, fused_variants
from vta_ext.config import load_config
from vta_ext.templates.errors import KnobError

EPILOGUES = ((("bias",), ("shr", 8), ("clip", -128, 127)), ())


def _conv(n, c, h, w, k, r, s, pad, stride, groups=1) -> CspWorkload:
    p = (("n", n), ("c", c), ("h", h), ("w", w), ("k", k), ("kh", r), ("kw", s), ("pt", pad[0]),
         ("pl", pad[1]), ("pb", pad[0]), ("pr", pad[1]), ("sh", stride[0]), ("sw", stride[1]))
    return CspWorkload("group_conv2d" if groups > 1 else "conv2d",
                       p + ((("g", groups),) if groups > 1 else ()))


def _layers():
    out = {}
    for name, (hw, cin, cout, k, pad, st) in {"C1": RESNET_C1, **RESNET18}.items():
        out[name] = _conv(1, cin, hw, hw, cout, k, k, (pad, pad), (st, st))
    for name, (hw, ch, g, k, pad, st) in MOBILENET.items():
        out[name] = _conv(1, ch, hw, hw, ch, k, k, (pad, pad), (st, st), g)
    for i, r in DEEPBENCH.items():
        out[f"DB{i}"] = _conv(r["n"], r["c"], r["h"], r["w"], r["k"], r["filter_h"], r["filter_w"],
                              (r["pad_h"], r["pad_w"]), (r["hstride"], r["wstride"]))
    return out


LAYERS = _layers()
#: the default run: (configuration, layer)
#: the default run's sample (DB6 on default, 13 s, is in the slow every-layer test)
SAMPLE = (("default", "C11"), ("default", "D9"),
          pytest.param("pipelined", "C11", marks=pytest.mark.slow),
          pytest.param("pipelined", "DB28", marks=pytest.mark.slow))


def _programs(cfg, base: CspWorkload, mode: str):
    layouts = ["NCHW", "NHWC"] + (fused_variants(base, cfg) if mode == "relaxed" else [])
    cands, _ = candidates(cfg, base, mode, layouts, EPILOGUES[0])
    assert cands, f"no embedding of {base}"
    return [c.packed for c in cands]


FIXED = ({}, {"order": 0})


def _exhaustive_bests(cfg, pg, epilogue, fixed, also=()):
    """The best point of the per-point enumeration under each objective, for ``fixed`` (and for
    each knob restriction of ``also``, from the same single pass over the domain): a dict per
    objective, or a list of them when ``also`` is given."""
    wanted = (fixed, *also)
    best = [dict.fromkeys(K.OBJECTIVES) for _ in wanted]
    for point, res in K.enumerate_points(cfg, pg, epilogue):
        if not isinstance(res, K.KnobPoint):
            continue
        for f, bests in zip(wanted, best):
            if any(point[n] != v for n, v in f.items()):
                continue
            for objective, b in bests.items():
                if b is None or K._rank(res, objective) < K._rank(b, objective):
                    bests[objective] = res
    return best if also else best[0]


def _exhaustive_best(cfg, pg, epilogue, fixed, objective="bytes"):
    return _exhaustive_bests(cfg, pg, epilogue, fixed)[objective]


def _check_search(cfg, name):
    for mode in ("strict", "relaxed"):
        for pg in _programs(cfg, LAYERS[name], mode):
            for ep in EPILOGUES:
                per_fixed = _exhaustive_bests(cfg, pg, ep, FIXED[0], also=FIXED[1:])
                for fixed, bests in zip(FIXED, per_fixed):
                    for objective in K.OBJECTIVES:
                        got = K.search(cfg, pg, ep, fixed, objective)
                        assert got == bests[objective], \
                            (name, mode, pg.embedding.mapping_str(), ep, fixed, objective)


def _check_grid(cfg, pg, ep):
    grid = K.knob_grid(cfg, pg, ep)
    valid, pruned = [], []
    for point, res in K.enumerate_points(cfg, pg, ep):
        (valid.append((point, res)) if isinstance(res, K.KnobPoint) else pruned.append(res))
    vi, pi = np.flatnonzero(grid.valid), np.flatnonzero(~grid.valid)
    assert grid.points(vi) == [p for p, _ in valid]
    assert grid.points(pi) == [r.knobs for r in pruned]
    assert [grid.why(i) for i in pi] == [r.reason for r in pruned]
    assert grid.total_bytes[vi].tolist() == [r.total_bytes for _, r in valid]
    assert grid.insns[vi].tolist() == [r.insns for _, r in valid]
    assert grid.cycles[vi].tolist() == [r.cycles for _, r in valid]


@pytest.mark.parametrize("config,name", SAMPLE)
def test_fast_search_is_the_exhaustive_point(config, name):
    _check_search(load_config(config), name)


@pytest.mark.parametrize("name", [pytest.param("C11", marks=pytest.mark.slow), "D9"])
def test_grid_is_the_point_model_everywhere(name):
    cfg = load_config("default")
    for mode in ("strict", "relaxed"):
        for pg in _programs(cfg, LAYERS[name], mode):
            for ep in EPILOGUES:
                _check_grid(cfg, pg, ep)


def test_fixed_knobs_restrict_the_domain_before_evaluation():
    """A fixed knob leaves only its value in the grid (nothing else is evaluated); a value outside
    the domain is an error for the grid and no point for the search."""
    cfg = load_config("default")
    pg = _programs(cfg, LAYERS["C11"], "strict")[0]
    whole = K.knob_grid(cfg, pg, EPILOGUES[0])
    fixed = K.knob_grid(cfg, pg, EPILOGUES[0], {"order": 2, "vt_k": 2})
    assert len(fixed) * 3 * 2 == len(whole)
    assert {(p["order"], p["vt_k"]) for p in fixed.points(range(len(fixed)))} == {(2, 2)}
    with pytest.raises(KnobError, match="tile_k=3"):
        K.knob_grid(cfg, pg, EPILOGUES[0], {"tile_k": 3})
    assert K.search(cfg, pg, EPILOGUES[0], {"tile_k": 3}) is None


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYERS))
def test_fast_search_is_the_exhaustive_point_every_layer(name):
    _check_search(load_config("default"), name)
