"""The knob space of the GEMM templates and the Tiling Parameter Search: the scratchpad model
against the lowering's allocation, the DRAM model against the simulator's counters (the
independent checks), pruning against the lowering's overflow error, TPS vs the fallback and the
compulsory traffic, and the knobs argument of build_conv2d."""
from __future__ import annotations

import pytest

from vta_ext.config import CONFIG_DIR, load_config

pytest.importorskip("tvm")

from test_conv2d_template import RESNET18, check, wl_blocks  # noqa: E402
from vta_ext.templates.conv2d import build_conv2d  # noqa: E402
from vta_ext.templates.epilogue import EPILOGUE_ORIGINAL  # noqa: E402
from vta_ext.templates.errors import KnobError  # noqa: E402
from vta_ext.templates.knobs import Conv2dKnobs  # noqa: E402
from vta_ext.templates.tiling import (BYTE_COUNTERS, dram_bytes, evaluate, fallback_knobs,  # noqa: E402
                                      knob_space, pruned_points, tps_knobs)

PRESETS = [c for c in ("default", "1x32x32") if (CONFIG_DIR / f"{c}.json").exists()]


def measured(stats):
    return {k: stats.as_dict()[k] for k in BYTE_COUNTERS}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", ["C5", "C7", "C11"])
def test_tps_model_equals_simulator(preset, name):
    """The TPS tiling compiles and is bit-exact; its modelled bytes are the simulator's counters
    and its modelled scratchpad use is the lowering's allocation."""
    cfg = load_config(preset)
    wl = RESNET18[name]
    choice = tps_knobs(cfg, wl, EPILOGUE_ORIGINAL)
    conv, stats = check(cfg, wl, EPILOGUE_ORIGINAL, choice.knobs)
    assert measured(stats) == choice.bytes
    assert {f"local.{k}_buffer": v for k, v in choice.sram.items()} == conv.generated.sram_used


@pytest.mark.parametrize("name,bigger", [("C2", dict(tile_h=14)), ("C5", dict(tile_ci=8)),
                                         ("C11", dict(tile_ci=4))])
def test_pruned_one_step_bigger_overflows(name, bigger):
    """One step beyond the TPS point along one knob, the space prunes the point for a scratchpad,
    and building it explicitly overflows that scratchpad in the lowering."""
    from dataclasses import replace
    cfg = load_config("default")
    wl = RESNET18[name]
    knobs = replace(tps_knobs(cfg, wl, EPILOGUE_ORIGINAL).knobs, **bigger)
    point = evaluate(cfg, wl, EPILOGUE_ORIGINAL, knobs)
    scratchpad = point.reason.split()[1]
    assert point.reason.startswith(f"the {scratchpad} tiles need"), point.reason
    with pytest.raises(KnobError, match=rf"local\.{scratchpad}_buffer needs \d+ elements"):
        build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, knobs)


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
        _, stats = check(cfg, wl, ep, knobs)
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


def test_tps_reaches_compulsory_traffic_when_everything_fits():
    """When the whole layer fits on chip, TPS moves every byte once: a 4x4 image of 2 input blocks
    (2 x 16 px x 16 B = 512 B), 4 x 2 x 3 x 3 weight blocks of 256 B (18432 B), 4 output blocks of
    16 px x 16 B (1024 B) and no bias -- 19968 bytes, counted by the simulator."""
    cfg = load_config("default")
    wl = wl_blocks(cfg, 4, 4, 2, 4, 3, 1, 1)
    choice = tps_knobs(cfg, wl, (("shr", 8),))
    assert choice.candidates > 10
    _, stats = check(cfg, wl, (("shr", 8),), choice.knobs)
    assert measured(stats) == {"inp_load_nbytes": 512, "wgt_load_nbytes": 18432,
                               "acc_load_nbytes": 0, "out_store_nbytes": 1024}


def test_knob_space_and_pruned_points_partition_the_domain():
    """Valid and pruned points together are the whole original space: divisors of N/b=1, OH=OW=6,
    C/ci=2, O/co=4 and two thread knobs: 1 x 4 x 4 x 2 x 3 x 2 x 2 = 384 points."""
    cfg = load_config("default")
    wl = wl_blocks(cfg, 6, 6, 2, 4, 3, 1, 1)
    valid = knob_space(cfg, wl, EPILOGUE_ORIGINAL)
    pruned = pruned_points(cfg, wl, EPILOGUE_ORIGINAL)
    assert len(valid) + len(pruned) == 384
    assert {c.knobs for c in valid}.isdisjoint(p.knobs for p in pruned)
    # tile_co=4 leaves one output-channel tile: two oc threads cannot split it
    reasons = {p.knobs: p.reason for p in pruned}
    assert "oc_nthread=2 must divide (O/BLOCK_OUT)/tile_co = 1" in \
        reasons[Conv2dKnobs(tile_co=4, oc_nthread=2)]
    assert fallback_knobs(cfg, wl, EPILOGUE_ORIGINAL).knobs == Conv2dKnobs()


def test_build_default_is_tps_and_fallback_is_available():
    cfg = load_config("default")
    wl = wl_blocks(cfg, 8, 8, 2, 2, 3, 1, 1)
    tps = build_conv2d(cfg, wl, EPILOGUE_ORIGINAL)
    assert tps.knobs == tps_knobs(cfg, wl, EPILOGUE_ORIGINAL).knobs != Conv2dKnobs()
    assert build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, "fallback").knobs == Conv2dKnobs()
    assert build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, "tps-reuse").knobs.tile_h >= 1
    with pytest.raises(KnobError, match="valid names: fallback, tps, tps-reuse"):
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
    with pytest.raises(KnobError, match="exactly two virtual threads"):
        build_conv2d(cfg, wl, (), Conv2dKnobs(reuse=True))
