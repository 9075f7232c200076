"""Tiling Parameter Search: feasibility, the DRAM model against the simulator's counters (the
independent check), TPS vs the fallback, and the TPS default of build_conv2d."""
from __future__ import annotations

import numpy as np
import pytest

from vta_ext.config import CONFIG_DIR, load_config

pytest.importorskip("tvm")

from test_conv2d_template import RESNET18, check, wl_blocks  # noqa: E402
from vta_ext.templates.conv2d import (EPILOGUE_ORIGINAL, EPILOGUE_PIPELINE, Conv2dKnobs,  # noqa: E402
                                      build_conv2d, estimate_sram_usage)
from vta_ext.templates.tiling import (BYTE_COUNTERS, dram_bytes, enumerate_tilings,  # noqa: E402
                                      tps_knobs)

PRESETS = [c for c in ("default", "1x32x32") if (CONFIG_DIR / f"{c}.json").exists()]


def measured(stats):
    return {k: stats.as_dict()[k] for k in BYTE_COUNTERS}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", ["C5", "C7", "C11"])
def test_tps_model_equals_simulator(preset, name):
    """The TPS tiling fits, compiles, is bit-exact, and its modelled bytes are the measured ones."""
    cfg = load_config(preset)
    wl = RESNET18[name]
    choice = tps_knobs(cfg, wl, EPILOGUE_ORIGINAL)
    use = estimate_sram_usage(cfg, wl, choice.knobs)
    assert use["inp"] <= cfg.inp_depth and use["wgt"] <= cfg.wgt_depth and use["acc"] <= cfg.acc_depth
    conv, stats = check(cfg, wl, EPILOGUE_ORIGINAL, choice.knobs)
    assert measured(stats) == choice.bytes
    for scope, n in conv.generated.sram_used.items():    # the lowering's own allocation fits too
        depth = {"local.inp_buffer": cfg.inp_depth, "local.wgt_buffer": cfg.wgt_depth,
                 "local.acc_buffer": cfg.acc_depth}[scope]
        assert n <= depth


@pytest.mark.parametrize("knobs,preset,nbb", [
    (Conv2dKnobs(), "default", 1),
    (Conv2dKnobs(tile_h=2, tile_w=3, tile_ci=2, tile_co=2), "default", 1),
    (Conv2dKnobs(tile_b=2, tile_h=3, oc_nthread=2), "2x16x16", 2),
    (Conv2dKnobs(tile_w=2, h_nthread=2, reuse=True), "1x32x32", 1),
    (Conv2dKnobs(tile_co=2, oc_nthread=2, reuse=True, tile_ci=2), "default", 1),
], ids=["fallback", "tiled", "tile_b-vthread", "reuse-h", "reuse-oc"])
@pytest.mark.parametrize("geom", [(6, 3, 1, 1), (7, 3, 1, 2), (6, 1, 0, 2), (5, 5, 2, 1)],
                         ids=["k3", "k3s2", "k1s2", "k5p2"])
def test_model_equals_simulator_small(knobs, preset, nbb, geom):
    if not (CONFIG_DIR / f"{preset}.json").exists():
        pytest.skip(f"no {preset} preset")
    cfg = load_config(preset)
    h, k, pad, s = geom
    wl = wl_blocks(cfg, h, h, 2, 4, k, pad, s, batch_blocks=nbb)
    if (wl.out_height // knobs.tile_h) % knobs.h_nthread or wl.out_height % knobs.tile_h \
            or wl.out_width % knobs.tile_w:
        pytest.skip("knobs do not divide this geometry")
    for ep in (EPILOGUE_ORIGINAL, (("shr", 8),)):
        conv, stats = check(cfg, wl, ep, knobs)
        assert measured(stats) == dram_bytes(cfg, wl, knobs, with_bias=ep is EPILOGUE_ORIGINAL)


@pytest.mark.parametrize("preset", PRESETS)
def test_tps_no_worse_than_fallback_resnet18(preset):
    """Modelled TPS bytes <= fallback bytes for every ResNet-18 layer (the model itself is checked
    against the simulator above), and by a large factor on the big layers."""
    cfg = load_config(preset)
    for name, wl in RESNET18.items():
        fb = sum(dram_bytes(cfg, wl, Conv2dKnobs()).values())
        tps = tps_knobs(cfg, wl, EPILOGUE_ORIGINAL)
        assert tps.total_bytes <= fb, name
        reuse = tps_knobs(cfg, wl, EPILOGUE_ORIGINAL, reuse=True)
        assert reuse.total_bytes <= tps.total_bytes, name
    c2 = RESNET18["C2"]
    assert sum(dram_bytes(cfg, c2, Conv2dKnobs()).values()) > 20 * tps_knobs(cfg, c2).total_bytes


def test_tps_is_exhaustive_minimum_and_deterministic():
    cfg = load_config("default")
    wl = wl_blocks(cfg, 8, 8, 2, 4, 3, 1, 1)
    choice = tps_knobs(cfg, wl, EPILOGUE_PIPELINE)
    allc = list(enumerate_tilings(cfg, wl, EPILOGUE_PIPELINE))
    assert choice.candidates == len(allc) > 10
    assert choice.total_bytes == min(c.total_bytes for c in allc)
    assert all(c.insns >= choice.insns for c in allc if c.total_bytes == choice.total_bytes)
    assert tps_knobs(cfg, wl, EPILOGUE_PIPELINE) == choice


def test_build_default_is_tps_and_fallback_is_available():
    cfg = load_config("default")
    wl = wl_blocks(cfg, 8, 8, 2, 2, 3, 1, 1)
    tps = build_conv2d(cfg, wl, EPILOGUE_ORIGINAL)
    assert tps.knobs == tps_knobs(cfg, wl, EPILOGUE_ORIGINAL).knobs != Conv2dKnobs()
    assert build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, "fallback").knobs == Conv2dKnobs()
    assert build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, "tps-reuse").knobs.tile_h >= 1
    with pytest.raises(ValueError, match="knobs must be"):
        build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, "best")


def test_reuse_bit_exact_and_saves_bytes():
    """Reuse-aware double buffering: identical outputs, half the shared tile's loads, race-free."""
    from vta_ext.lower.racecheck import check_races
    cfg = load_config("default")
    for kn, cob in ((dict(oc_nthread=2, tile_co=2, tile_h=2), 4), (dict(h_nthread=2, tile_w=3), 2)):
        wl = wl_blocks(cfg, 6, 6, 2, cob, 3, 1, 1)
        plain, s0 = check(cfg, wl, EPILOGUE_ORIGINAL, Conv2dKnobs(**kn))
        reuse, s1 = check(cfg, wl, EPILOGUE_ORIGINAL, Conv2dKnobs(**kn, reuse=True))
        check_races(reuse.program)
        assert reuse.generated.reused
        if "oc_nthread" in kn:
            assert 2 * s1.inp_load_nbytes == s0.inp_load_nbytes
            assert s1.wgt_load_nbytes == s0.wgt_load_nbytes
        else:
            assert 2 * s1.wgt_load_nbytes == s0.wgt_load_nbytes
            assert s1.inp_load_nbytes == s0.inp_load_nbytes
        assert reuse.program.insn_count < plain.program.insn_count


def test_reuse_needs_two_threads():
    cfg = load_config("default")
    wl = wl_blocks(cfg, 6, 6, 2, 2, 3, 1, 1)
    with pytest.raises(ValueError, match="exactly two virtual threads"):
        build_conv2d(cfg, wl, (), Conv2dKnobs(reuse=True))
