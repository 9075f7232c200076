"""dense_packed template: bit-exact against an independent numpy matmul (unpacked, int64)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import apply_epilogue, pack_matrix as pack2, unpack_matrix as unpack2
from vta_ext.config import CONFIG_DIR, load_config

pytest.importorskip("tvm")

from vta_ext.errors import TemplateRefusal  # noqa: E402
from vta_ext.templates.dense import (DenseKnobs, DenseWorkload, build_dense, dense_as_conv2d,  # noqa: E402
                                     dense_knobs_as_conv2d)
from vta_ext.templates.epilogue import EPILOGUE_ORIGINAL, EPILOGUE_PIPELINE  # noqa: E402
from vta_ext.templates.errors import Conv2dError, Conv2dRefusal, KnobError  # noqa: E402
from vta_ext.templates.tiling import dram_bytes, knob_space, pruned_points  # noqa: E402

PRESETS = [c for c in ("default", "2x16x16", "1x32x32") if (CONFIG_DIR / f"{c}.json").exists()]


def reference(epilogue, data, weight, bias):
    """data (N, K), weight (M, K), bias (M,) -> int8 (N, M)."""
    res = data.astype(np.int64) @ weight.astype(np.int64).T
    return apply_epilogue(res, epilogue, bias.astype(np.int64)[None, :])


def check(cfg, wl, epilogue, knobs=None, seed=3):
    rng = np.random.default_rng(seed)
    B, BI, BO = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    data = rng.integers(-128, 128, (wl.batch, wl.in_features)).astype(np.int8)
    weight = rng.integers(-128, 128, (wl.out_features, wl.in_features)).astype(np.int8)
    bias = rng.integers(-16384, 16384, wl.out_features).astype(np.int32)
    has_bias = any(st[0] == "bias" for st in epilogue)
    bias_p = pack2(np.broadcast_to(bias, (B, wl.out_features)).copy(), B, BO) if has_bias else None
    dense = build_dense(cfg, wl, epilogue, knobs)
    out, stats = dense.run(pack2(data, B, BI), pack2(weight, BO, BI), bias_p)
    ref = reference(epilogue, data, weight, bias)
    assert out.shape == (wl.batch // B, wl.out_features // BO, B, BO)
    bad = int((unpack2(out) != ref).sum())
    assert bad == 0, f"{bad} of {out.size} outputs differ"
    return dense, stats


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("knobs", ["fallback", None, DenseKnobs(tile_ci=2, tile_co=2),
                                   DenseKnobs(tile_ci=4, oc_nthread=2),
                                   DenseKnobs(tile_co=2, oc_nthread=2, reuse=True)],
                         ids=["fallback", "tps", "tiled", "vthread", "reuse"])
def test_dense_presets(preset, knobs):
    cfg = load_config(preset)
    wl = DenseWorkload(2 * cfg.BATCH, 4 * cfg.BLOCK_IN, 4 * cfg.BLOCK_OUT)
    dense, stats = check(cfg, wl, EPILOGUE_ORIGINAL, knobs)
    # the modelled DRAM bytes are what the simulator moved
    ck = dense_knobs_as_conv2d(dense.knobs)
    model = dram_bytes(cfg, dense_as_conv2d(wl), ck, with_bias=True)
    assert {k: stats.as_dict()[k] for k in model} == model
    assert stats.gemm_counter == (wl.batch // cfg.BATCH) * (wl.in_features // cfg.BLOCK_IN) * \
        (wl.out_features // cfg.BLOCK_OUT)


@pytest.mark.parametrize("epilogue", [(), EPILOGUE_PIPELINE, (("shr", 4), ("min", 30), ("add", -7)),
                                      (("bias",), ("clip", -20, 20))],
                         ids=["none", "pipeline", "shr-min-add", "bias-clip"])
def test_dense_epilogues(epilogue):
    cfg = load_config("default")
    check(cfg, DenseWorkload(1, 48, 32), epilogue, DenseKnobs(tile_ci=3))


def test_dense_batch_tiles_2x16x16():
    if "2x16x16" not in PRESETS:
        pytest.skip("no 2x16x16 preset")
    cfg = load_config("2x16x16")
    check(cfg, DenseWorkload(8, 64, 64), EPILOGUE_ORIGINAL, DenseKnobs(tile_b=2, tile_co=2))


def test_dense_tps_beats_fallback():
    """The default (TPS) knobs load the 512 x 256 int8 weight once (131072 B, its compulsory
    traffic), move fewer bytes in total than the fallback and need fewer instructions."""
    cfg = load_config("default")
    wl = DenseWorkload(1, 512, 256)
    fb, sfb = check(cfg, wl, EPILOGUE_ORIGINAL, "fallback")
    tp, stp = check(cfg, wl, EPILOGUE_ORIGINAL)
    assert fb.knobs == DenseKnobs() != tp.knobs
    assert stp.wgt_load_nbytes == 512 * 256
    total = lambda s: s.inp_load_nbytes + s.wgt_load_nbytes + s.acc_load_nbytes  # noqa: E731
    assert total(stp) < total(sfb)
    assert tp.program.insn_count < fb.program.insn_count


def test_dense_knob_space_in_dense_terms():
    """The dense knob space is in DenseKnobs: tile_ci and tile_co over the divisors of 4, oc_nthread
    1 or 2 -- 3 x 3 x 2 = 18 points, of which the 3 with tile_co=4 and oc_nthread=2 are pruned (two
    threads cannot split one output-channel tile)."""
    cfg = load_config("default")
    wl = DenseWorkload(1, 64, 64)
    space = knob_space(cfg, wl, EPILOGUE_ORIGINAL)
    pruned = pruned_points(cfg, wl, EPILOGUE_ORIGINAL)
    assert all(isinstance(c.knobs, DenseKnobs) for c in space)
    assert len(space) == 15
    assert sorted((p.knobs.tile_ci, p.knobs.tile_co, p.knobs.oc_nthread) for p in pruned) == \
        [(1, 4, 2), (2, 4, 2), (4, 4, 2)]


def test_dense_errors():
    cfg = load_config("default")
    with pytest.raises(Conv2dRefusal, match="in_features=40 is not a multiple of BLOCK_IN=16") as err:
        build_dense(cfg, DenseWorkload(1, 40, 32))
    assert isinstance(err.value, TemplateRefusal)
    with pytest.raises(KnobError, match="tile_ci=3 does not divide C/BLOCK_IN = 4; valid tile_ci: 1, 2, 4"):
        build_dense(cfg, DenseWorkload(1, 64, 32), (), DenseKnobs(tile_ci=3))
    with pytest.raises(KnobError, match="unknown DenseKnobs field"):
        build_dense(cfg, DenseWorkload(1, 64, 32), (), {"tile_h": 2})
    assert build_dense(cfg, DenseWorkload(1, 64, 32), (), {"tile_ci": 2}).knobs == DenseKnobs(tile_ci=2)
    dense = build_dense(cfg, DenseWorkload(1, 32, 32), EPILOGUE_ORIGINAL, "fallback")
    with pytest.raises(Conv2dError, match="expected shape"):
        dense.run(np.zeros((1, 1, 1, 16), np.int8), np.zeros((2, 2, 16, 16), np.int8))
