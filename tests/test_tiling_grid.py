"""The stock GEMM templates' knob space evaluated over the whole domain at once
(:func:`vta_ext.templates.tiling.tiling_grid`) against the per-point enumeration kept here as the
reference: every point of the domain in the original enumeration order, each through the scalar
model (:func:`~vta_ext.templates.tiling.evaluate`), ranked by the TPS order written out below.

The grid's valid points (in order, with each point's bytes, instructions, scratchpad entries and
micro-ops), its pruned points with their reasons, its TPS point and the stock template's
``KnobSpace`` are exactly the reference's, on ResNet-18 C1-C11, MobileNet D1-D9, group conv2d
(ResNeXt-50 and RegNet-like shapes), dense and the 108 DeepBench layers, on the ``default``,
``pipelined`` and ``1x32x32`` configurations, without and with a bias epilogue, without and with
reuse. The default run takes a sample; ``pytest -m slow`` runs the whole sweep."""
from __future__ import annotations

import dataclasses
import itertools

import pytest

from vta_ext.config import load_config
from vta_ext.templates import tiling
from vta_ext.templates.epilogue import EPILOGUE_ORIGINAL
from vta_ext.templates.errors import Conv2dRefusal
from vta_ext.templates.knobs import Conv2dKnobs, conv2d_knobs_as_dense
from vta_ext.templates.tiling import (PrunedPoint, TilingChoice, evaluate, knob_domain, knob_space,
                                      pruned_points, tiling_grid, tps_knobs)
from vta_ext.templates.workload import Conv2dWorkload, DenseWorkload, GroupConv2dWorkload

pytest.importorskip("tvm")

from test_csp_correctness import DEEPBENCH, MOBILENET, RESNET_C1  # noqa: E402
from test_resnet_layers import RESNET18  # noqa: E402

CONFIGS = ("default", "pipelined", "1x32x32")
#: the epilogue with a bias (one per-channel tensor, three ALU stages), and a two-tensor one
EPILOGUES = {"none": (), "bias": EPILOGUE_ORIGINAL,
             "bias-mulv": (("bias",), ("mulv",), ("shr", 8), ("clip", -128, 127))}
#: group conv2d (H=W, in, out, groups, stride): ResNeXt-50 32x4d stages 3-4 (16 and 32 channels
#: per group), RegNet-like group width 48 (3 blocks: tiles that neither hold whole groups nor
#: divide them)
GROUPS = {"X3": (14, 512, 512, 32, 1), "X3s2": (28, 512, 512, 32, 2), "X4": (7, 1024, 1024, 32, 1),
          "R48": (14, 384, 384, 8, 1), "R48s2": (28, 192, 384, 4, 2)}
#: dense (batch, in, out)
DENSE = {"FC1000": (1, 512, 1000), "FC-b4": (4, 2048, 1000), "FC-b16": (16, 64, 64)}


def _up(x: int, m: int) -> int:
    return -(-x // m) * m


def stock_workload(cfg, name: str):
    """The stock template's workload of a named layer on ``cfg`` (channels and batch padded to the
    blocks, as the stock strategy pads them)."""
    b, ci, co = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    if name in ("C1", *RESNET18):
        hw, cin, cout, k, pad, st = RESNET_C1 if name == "C1" else RESNET18[name]
        return Conv2dWorkload(b, hw, hw, _up(cin, ci), _up(cout, co), k, k, pad, pad, st, st)
    if name in MOBILENET:
        hw, ch, g, k, pad, st = MOBILENET[name]
        return GroupConv2dWorkload(b, hw, hw, ch, ch, k, k, pad, pad, st, st, groups=g)
    if name in GROUPS:
        hw, cin, cout, g, st = GROUPS[name]
        return GroupConv2dWorkload(b, hw, hw, cin, cout, 3, 3, 1, 1, st, st, groups=g)
    if name in DENSE:
        n, i, o = DENSE[name]
        return DenseWorkload(_up(n, b), _up(i, ci), _up(o, co))
    r = DEEPBENCH[int(name[2:])]
    return Conv2dWorkload(_up(r["n"], b), r["h"], r["w"], _up(r["c"], ci), _up(r["k"], co),
                          r["filter_h"], r["filter_w"], r["pad_h"], r["pad_w"], r["hstride"],
                          r["wstride"])


def reference(cfg, wl, epilogue, reuse: bool):
    """The per-point enumeration: ``(valid, pruned)`` over the original order (batch, rows,
    columns, output-channel blocks, input-channel blocks, oc threads, h threads), ``reuse`` on the
    two-thread points, each point through the scalar model."""
    dom = knob_domain(cfg, wl)
    dense = isinstance(wl, DenseWorkload)
    valid, pruned = [], []
    for tb, th, tw, tco, tci, ocn, hn in itertools.product(
            dom["tile_b"], dom.get("tile_h", (1,)), dom.get("tile_w", (1,)), dom["tile_co"],
            dom["tile_ci"], dom["oc_nthread"], (1,) if dense else dom["h_nthread"]):
        k = Conv2dKnobs(tb, th, tw, tci, tco, ocn, hn, reuse=bool(reuse and ocn * hn == 2))
        res = evaluate(cfg, wl, epilogue, conv2d_knobs_as_dense(k) if dense else k)
        (valid if isinstance(res, TilingChoice) else pruned).append(res)
    return valid, pruned


def reference_rank(c: TilingChoice):
    """TPS order: fewest modelled bytes, fewest estimated instructions, two virtual threads before
    one before four, then the knob tuple (tile_b, tile_h, tile_w, tile_ci, tile_co, oc, h)."""
    k = c.knobs
    get = lambda n: getattr(k, n, 1)   # noqa: E731  (a dense point has no rows or h threads)
    threads = k.oc_nthread * get("h_nthread")
    return (c.total_bytes, c.insns, {2: 0, 1: 1}.get(threads, 2),
            tuple(get(n) for n in ("tile_b", "tile_h", "tile_w", "tile_ci", "tile_co",
                                   "oc_nthread", "h_nthread")))


def _row(c: TilingChoice):
    return c.knobs, c.bytes, c.insns, c.sram, c.uops


def check_layer(config: str, name: str, epilogue, reuse: bool) -> None:
    cfg = load_config(config)
    wl = stock_workload(cfg, name)
    try:
        valid, pruned = reference(cfg, wl, epilogue, reuse)
    except Conv2dRefusal as refusal:
        with pytest.raises(Conv2dRefusal) as got:
            tiling_grid(cfg, wl, epilogue, reuse)
        assert str(got.value) == str(refusal)
        return
    grid = tiling_grid(cfg, wl, epilogue, reuse)
    assert (len(grid), grid.count) == (len(valid) + len(pruned), len(valid))
    assert [_row(c) for c in knob_space(cfg, wl, epilogue, reuse)] == [_row(c) for c in valid]
    assert pruned_points(cfg, wl, epilogue, reuse) == pruned
    if not valid:
        with pytest.raises(Conv2dRefusal, match="no tiling"):
            tps_knobs(cfg, wl, epilogue, reuse)
        return
    best = min(valid, key=reference_rank)
    assert tps_knobs(cfg, wl, epilogue, reuse) == dataclasses.replace(best, candidates=len(valid))


def check_stock_space(config: str, name: str, epilogue) -> None:
    """The stock template's KnobSpace: the valid and pruned points without reuse, then the points
    reuse adds (the enumeration's dicts, deduplicated as the tuner records them)."""
    from vta_ext.stock import _gemm_knob_space

    cfg = load_config(config)
    wl = stock_workload(cfg, name)
    try:
        spaces = [reference(cfg, wl, epilogue, reuse) for reuse in (False, True)]
    except Conv2dRefusal as refusal:
        with pytest.raises(Conv2dRefusal) as got:
            _gemm_knob_space(cfg, wl, epilogue)
        assert str(got.value) == str(refusal)
        return
    points, pruned, seen = [], [], set()
    for valid, bad in spaces:
        for p, reason in [(c.knobs, None) for c in valid] + [(b.knobs, b.reason) for b in bad]:
            d = dataclasses.asdict(p)
            if tuple(d.items()) not in seen:
                seen.add(tuple(d.items()))
                (points.append(d) if reason is None else pruned.append((d, reason)))
    space = _gemm_knob_space(cfg, wl, epilogue)
    assert space.points == tuple(points)
    assert space.pruned == tuple(pruned)
    best = min(spaces[0][0], key=reference_rank)
    assert space.tps == dataclasses.asdict(best.knobs)
    assert space.names == tuple(space.tps)


RESNET_NAMES = ("C1", *RESNET18)
SAMPLE = [("default", "C2", "bias", False), ("default", "C7", "none", True),
          ("pipelined", "C11", "bias", True), ("1x32x32", "C5", "bias", False),
          ("default", "D1", "bias", True), ("1x32x32", "D9", "none", False),
          ("default", "R48", "bias", True), ("pipelined", "X4", "bias-mulv", False),
          ("default", "FC1000", "bias", True), ("1x32x32", "FC-b4", "none", False),
          ("default", "DB6", "bias", False)]


@pytest.mark.parametrize("config,name,epilogue,reuse", SAMPLE)
def test_grid_equals_enumeration_sample(config, name, epilogue, reuse):
    check_layer(config, name, EPILOGUES[epilogue], reuse)


@pytest.mark.parametrize("config,name", [("default", "R48"), ("pipelined", "FC-b4"),
                                         ("1x32x32", "D9")])
def test_stock_knob_space_equals_enumeration_sample(config, name):
    check_stock_space(config, name, EPILOGUE_ORIGINAL)


ALL_NAMES = [*RESNET_NAMES, *MOBILENET, *GROUPS, *DENSE, *(f"DB{i}" for i in sorted(DEEPBENCH))]


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("config", CONFIGS)
def test_grid_equals_enumeration(config, name):
    for epilogue, reuse in itertools.product(("none", "bias"), (False, True)):
        check_layer(config, name, EPILOGUES[epilogue], reuse)
    check_stock_space(config, name, EPILOGUE_ORIGINAL)


def test_grid_memoised_per_what_the_model_sees():
    """Layers that differ only in epilogue constants (or the configuration's name) share one grid;
    the count of per-channel tensors, the ALU stages and reuse each make another."""
    cfg = load_config("default")
    wl = stock_workload(cfg, "C5")
    grid = tiling_grid(cfg, wl, EPILOGUE_ORIGINAL)
    assert tiling_grid(cfg, wl, (("shr", 5), ("bias",), ("clip", -8, 8))) is grid
    renamed = dataclasses.replace(cfg, name="default-copy")
    assert tiling_grid(renamed, wl, EPILOGUE_ORIGINAL) is grid
    for other in [tiling_grid(cfg, wl, ()), tiling_grid(cfg, wl, (("shr", 8), ("clip", 0, 127))),
                  tiling_grid(cfg, wl, EPILOGUE_ORIGINAL, reuse=True),
                  tiling_grid(load_config("1x32x32"), stock_workload(load_config("1x32x32"), "C5"),
                              EPILOGUE_ORIGINAL)]:
        assert other is not grid


def test_grid_memo_is_bounded(monkeypatch):
    monkeypatch.setattr(tiling, "_GRIDS_SIZE", 3)
    tiling._grid_cache_clear()
    cfg = load_config("default")
    grids = [tiling_grid(cfg, DenseWorkload(1, 16 * i, 16)) for i in range(1, 6)]
    assert len(tiling._GRIDS) == 3
    assert tiling_grid(cfg, DenseWorkload(1, 16 * 5, 16)) is grids[-1]      # kept: recent
    assert tiling_grid(cfg, DenseWorkload(1, 16, 16)) is not grids[0]       # evicted: oldest
    tiling._grid_cache_clear()


def test_why_of_a_valid_point_is_an_error():
    cfg = load_config("default")
    grid = tiling_grid(cfg, stock_workload(cfg, "C11"), EPILOGUE_ORIGINAL)
    with pytest.raises(ValueError, match="is valid"):
        grid.why(int(grid.index[0]))
    assert "valid of" in repr(grid)
    assert isinstance(pruned_points(cfg, stock_workload(cfg, "C11"))[0], PrunedPoint)
