"""group_conv2d_packed template: bit-exact against an independent numpy grouped convolution
(NCHW, per-group einsum in int64)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import apply_epilogue
from vta_ext.config import CONFIG_DIR, load_config

pytest.importorskip("tvm")

from vta_ext.errors import TemplateRefusal  # noqa: E402
from vta_ext.isa import Opcode  # noqa: E402
from vta_ext.lower.racecheck import check_races  # noqa: E402
from vta_ext.templates.epilogue import EPILOGUE_ORIGINAL, EPILOGUE_PIPELINE  # noqa: E402
from vta_ext.templates.errors import Conv2dRefusal, KnobError  # noqa: E402
from vta_ext.templates.group_conv2d import GroupConv2dWorkload, build_group_conv2d  # noqa: E402
from vta_ext.templates.knobs import Conv2dKnobs  # noqa: E402
from vta_ext.templates.tiling import check_knobs, dram_bytes, evaluate, TilingChoice  # noqa: E402

PRESETS = [c for c in ("default", "2x16x16", "1x32x32") if (CONFIG_DIR / f"{c}.json").exists()]


def pack_nchw(x, b, c):
    n, ch, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n // b, b, ch // c, c, h, w).transpose(0, 2, 4, 5, 1, 3))


def reference(wl, epilogue, data, kernel, bias):
    """data (N, C, H, W), kernel (O, C/groups, KH, KW), bias (O,) -> int8 (N, O, OH, OW)."""
    g = wl.groups
    cpg, opg = wl.in_channels // g, wl.out_channels // g
    d = np.pad(data.astype(np.int64), ((0, 0), (0, 0), (wl.pad_h,) * 2, (wl.pad_w,) * 2))
    k = kernel.astype(np.int64)
    oh, ow = wl.out_height, wl.out_width
    res = np.zeros((data.shape[0], wl.out_channels, oh, ow), np.int64)
    for gi in range(g):
        dg = d[:, gi * cpg:(gi + 1) * cpg]
        kg = k[gi * opg:(gi + 1) * opg]
        for i in range(wl.kernel_h):
            for j in range(wl.kernel_w):
                win = dg[:, :, i:i + wl.stride_h * (oh - 1) + 1:wl.stride_h,
                         j:j + wl.stride_w * (ow - 1) + 1:wl.stride_w]
                res[:, gi * opg:(gi + 1) * opg] += np.einsum("nchw,oc->nohw", win, kg[:, :, i, j])
    return apply_epilogue(res, epilogue, bias.astype(np.int64)[None, :, None, None])


def check(cfg, wl, epilogue, knobs=None, seed=11):
    rng = np.random.default_rng(seed)
    B, BI, BO = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    cpg = wl.in_channels // wl.groups
    data = rng.integers(-128, 128, (wl.batch, wl.in_channels, wl.height, wl.width)).astype(np.int8)
    kernel = rng.integers(-128, 128, (wl.out_channels, cpg, wl.kernel_h, wl.kernel_w)).astype(np.int8)
    bias = rng.integers(-16384, 16384, wl.out_channels).astype(np.int32)
    kernel_p = np.ascontiguousarray(kernel.reshape(wl.out_channels // BO, BO, cpg // BI, BI,
                                                   wl.kernel_h, wl.kernel_w).transpose(0, 2, 4, 5, 1, 3))
    has_bias = any(st[0] == "bias" for st in epilogue)
    bias_p = None
    if has_bias:
        bias_p = pack_nchw(np.broadcast_to(bias[None, :, None, None], (B, wl.out_channels, 1, 1))
                           .copy(), B, BO)
    conv = build_group_conv2d(cfg, wl, epilogue, knobs)
    out, stats = conv.run(pack_nchw(data, B, BI), kernel_p, bias_p)
    ref = pack_nchw(reference(wl, epilogue, data, kernel, bias), B, BO)
    assert out.shape == ref.shape
    bad = int((out != ref).sum())
    assert bad == 0, f"{bad} of {out.size} outputs differ"
    model = dram_bytes(cfg, wl, conv.knobs, with_bias=has_bias)
    assert {k: stats.as_dict()[k] for k in model} == model
    return conv, stats


def _wl(cfg, h, cin_blocks_per_group, cout_blocks_per_group, groups, k=3, pad=1, stride=1, nbb=1):
    return GroupConv2dWorkload(nbb * cfg.BATCH, h, h, cin_blocks_per_group * groups * cfg.BLOCK_IN,
                               cout_blocks_per_group * groups * cfg.BLOCK_OUT, k, k, pad, pad,
                               stride, stride, groups)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("groups,knobs", [
    (2, "fallback"), (2, None), (4, "fallback"), (4, None),
    (2, Conv2dKnobs(tile_h=2, tile_w=4, oc_nthread=2)),
    (4, Conv2dKnobs(tile_h=4, h_nthread=2, reuse=True)),
], ids=["g2-fallback", "g2-tps", "g4-fallback", "g4-tps", "g2-vthread", "g4-reuse"])
def test_group_conv2d_presets(preset, groups, knobs):
    """MobileNet-D1/D2-like (32->32 groups 2, 64->64 groups 4 on BLOCK 16), small images."""
    cfg = load_config(preset)
    cpg_blocks = 1
    opg_blocks = 2 if isinstance(knobs, Conv2dKnobs) and knobs.oc_nthread == 2 else 1
    wl = _wl(cfg, 8, cpg_blocks, opg_blocks, groups)
    conv, stats = check(cfg, wl, EPILOGUE_ORIGINAL, knobs)
    assert stats.gemm_counter == (wl.batch // cfg.BATCH) * (wl.out_channels // cfg.BLOCK_OUT) * \
        wl.out_height * wl.out_width * 9 * (wl.in_channels // groups // cfg.BLOCK_IN)
    check_races(conv.program)


@pytest.mark.parametrize("case", [
    # (cin blocks/group, cout blocks/group, groups, k, pad, stride, epilogue, knobs)
    (2, 1, 2, 3, 1, 2, EPILOGUE_PIPELINE, Conv2dKnobs(tile_ci=2)),
    (1, 2, 3, 1, 0, 1, (("shr", 6), ("clip", -50, 60)), Conv2dKnobs(tile_co=2, tile_w=7)),
    (2, 2, 2, 3, 1, 1, EPILOGUE_ORIGINAL, Conv2dKnobs(tile_ci=2, tile_co=2, tile_h=7)),
    (1, 2, 2, 3, 0, 1, (), Conv2dKnobs(oc_nthread=2, reuse=True)),
], ids=["stride2-tci", "1x1-g3", "tiled", "noepi-reuse"])
def test_group_conv2d_shapes(case):
    cib, cob, g, k, pad, s, ep, knobs = case
    cfg = load_config("default")
    check(cfg, _wl(cfg, 7, cib, cob, g, k, pad, s), ep, knobs)


def test_group_conv2d_batch_blocks():
    if "2x16x16" not in PRESETS:
        pytest.skip("no 2x16x16 preset")
    cfg = load_config("2x16x16")
    check(cfg, _wl(cfg, 5, 1, 1, 2, nbb=2), EPILOGUE_ORIGINAL, Conv2dKnobs(tile_b=2))


def test_group_conv2d_errors():
    """Unsupported group counts are refusals; knobs outside the space are knob errors."""
    cfg = load_config("default")
    for wl, match in ((GroupConv2dWorkload(1, 4, 4, 32, 32, 3, 3, 1, 1, 1, 1, 1), "1 < groups < in_channels"),
                      (GroupConv2dWorkload(1, 4, 4, 32, 32, 3, 3, 1, 1, 1, 1, 4), "multiples of BLOCK_IN=16")):
        with pytest.raises(Conv2dRefusal, match=match) as err:
            build_group_conv2d(cfg, wl)
        assert isinstance(err.value, TemplateRefusal)
    two = GroupConv2dWorkload(1, 4, 4, 32, 32, 3, 3, 1, 1, 1, 1, 2)
    with pytest.raises(KnobError, match=r"oc_nthread=2 must divide \(O/BLOCK_OUT\)/tile_co = 1"):
        build_group_conv2d(cfg, two, (), Conv2dKnobs(tile_co=2, oc_nthread=2))
    # 3 output-channel blocks per group: a tile of 2 blocks straddles a group boundary
    odd = GroupConv2dWorkload(1, 4, 4, 32, 96, 3, 3, 1, 1, 1, 1, 2)
    with pytest.raises(KnobError, match="must hold whole groups .* or lie inside one group"):
        build_group_conv2d(cfg, odd, (), Conv2dKnobs(tile_co=2))


def test_group_conv2d_default_knobs_groups4():
    """groups=4 with the default (TPS) knobs builds and is bit-exact; here the output-channel tile
    spans all four groups, so each reduction step loads the input blocks of all of them."""
    cfg = load_config("default")
    wl = _wl(cfg, 8, 1, 2, 4)
    conv, _ = check(cfg, wl, EPILOGUE_ORIGINAL)
    assert conv.knobs.tile_co > wl.out_channels // cfg.BLOCK_OUT // wl.groups


@pytest.mark.parametrize("case", [
    # (cin blocks/group, cout blocks/group, groups, knobs): tiles spanning groups, tiles inside a
    # group with the two threads in the same group, threads in different groups
    (2, 2, 2, Conv2dKnobs(tile_co=4, tile_ci=1, tile_h=7)),
    (2, 2, 3, Conv2dKnobs(tile_co=2, tile_ci=2)),
    (1, 4, 2, Conv2dKnobs(tile_co=2, oc_nthread=2, reuse=True)),
    (1, 1, 4, Conv2dKnobs(tile_co=1, oc_nthread=2, reuse=True, tile_w=7)),
    (2, 1, 4, Conv2dKnobs(tile_co=2, tile_ci=1, oc_nthread=2)),
], ids=["span2-tci1", "whole-group", "inside-group-reuse", "threads-cross-groups", "span2-threads"])
def test_group_conv2d_full_axis_tiles(case):
    """tile_co / oc_nthread over the full output-channel axis (as the original): bit-exact, and the
    DRAM model (checked in ``check``) counts the input blocks of every group a tile spans."""
    cib, cob, g, knobs = case
    cfg = load_config("default")
    conv, _ = check(cfg, _wl(cfg, 7, cib, cob, g), EPILOGUE_PIPELINE, knobs)
    check_races(conv.program)


#: MobileNet-G group conv2d layers (facts §7.2, D1-D9: 16 channels per group) and the knobs of their
#: published tuned records (TopHub ``vta_v0.10.log``, pynq_1x16: tile_h, tile_w, oc_nthread,
#: h_nthread; every other inner factor 1)
MOBILENET_RECORDS = {
    "D1": ((112, 32, 2, 1), (14, 56, 2, 1)), "D2": ((112, 64, 4, 2), (4, 56, 1, 2)),
    "D3": ((56, 128, 8, 1), (14, 56, 1, 2)), "D4": ((56, 128, 8, 2), (7, 28, 2, 1)),
    "D5": ((28, 256, 16, 1), (28, 28, 2, 1)), "D6": ((28, 256, 16, 2), (14, 14, 2, 1)),
    "D7": ((14, 512, 32, 1), (14, 14, 2, 1)), "D8": ((14, 512, 32, 2), (7, 7, 2, 1)),
    "D9": ((7, 1024, 64, 1), (7, 7, 2, 1)),
}


def _mobilenet(name):
    (hw, ch, groups, stride), (th, tw, ocn, hn) = MOBILENET_RECORDS[name]
    wl = GroupConv2dWorkload(1, hw, hw, ch, ch, 3, 3, 1, 1, stride, stride, groups)
    return wl, Conv2dKnobs(tile_h=th, tile_w=tw, oc_nthread=ocn, h_nthread=hn)


@pytest.mark.parametrize("name", sorted(MOBILENET_RECORDS))
def test_published_mobilenet_records_are_valid_points(name):
    """All nine published tuned records are points of the knob space that fit the ``apache``
    scratchpads (seven of them have oc_nthread=2 over one output block per group)."""
    wl, knobs = _mobilenet(name)
    cfg = load_config("apache")
    assert check_knobs(cfg, wl, knobs) == knobs
    assert isinstance(evaluate(cfg, wl, EPILOGUE_ORIGINAL, knobs), TilingChoice)


def test_mobilenet_d1_record_instruction_structure():
    """D1 with its tuned record, as the original schedules it: 2 output-channel tiles x 8 row tiles
    x 2 column tiles = 32 tiles, one input block per group, so per tile one reset and one GEMM
    instruction: 64. The GEMM folds the tile_w (56) and KW (3) loops and unrolls KH x tile_h =
    3 x 14 = 42 micro-ops; the reset folds tile_w and tile_h: 1 micro-op. Bit-exact."""
    cfg = load_config("apache")
    wl, knobs = _mobilenet("D1")
    conv, _ = check(cfg, wl, EPILOGUE_ORIGINAL, knobs)
    gemms = [i for i in conv.program.insns if i.opcode == Opcode.GEMM]
    assert len(gemms) == 64
    assert sorted({(int(i.reset_reg), i.uop_end - i.uop_bgn, i.iter_out, i.iter_in) for i in gemms}) == \
        [(0, 42, 56, 3), (1, 1, 56, 14)]
