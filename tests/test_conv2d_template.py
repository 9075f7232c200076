"""End-to-end tests of the conv2d_packed template: TE compute -> s_tir schedule -> lowering ->
runtime program -> functional simulator, against an independent numpy reference (NCHW, int64)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import apply_epilogue, conv2d_nchw, pack_nchw, unpack_nchw, unpack_oihw
from vta_ext.config import CONFIG_DIR, load_config

pytest.importorskip("tvm")

from vta_ext.errors import TemplateRefusal  # noqa: E402
from vta_ext.isa import MemType, Opcode  # noqa: E402
from vta_ext.templates.conv2d import build_conv2d  # noqa: E402
from vta_ext.templates.epilogue import EPILOGUE_ORIGINAL, EPILOGUE_PIPELINE  # noqa: E402
from vta_ext.templates.errors import (Conv2dError, Conv2dRefusal, EpilogueError,  # noqa: E402
                                      KnobError)
from vta_ext.templates.knobs import Conv2dKnobs  # noqa: E402
from vta_ext.templates.tiling import tps_knobs  # noqa: E402
from vta_ext.templates.workload import Conv2dWorkload  # noqa: E402

SEED = 0xDEADB


# ------------------------------------------------------------------------------------------------
# independent reference: unpack to NCHW / OIHW, direct convolution with einsum in int64
# ------------------------------------------------------------------------------------------------
def reference(wl, epilogue, data, kernel, bias):
    res = conv2d_nchw(unpack_nchw(data), unpack_oihw(kernel), (wl.stride_h, wl.stride_w),
                      (wl.pad_h, wl.pad_w))
    b = None if bias is None else unpack_nchw(bias)  # (N or 1, O, 1, 1)
    return apply_epilogue(res, epilogue, b)


def make_inputs(cfg, wl, with_bias, rng):
    B, BI, BO = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    data = rng.integers(-128, 128, (wl.batch, wl.in_channels, wl.height, wl.width)).astype(np.int8)
    kernel = rng.integers(-128, 128, (wl.out_channels, wl.in_channels, wl.kernel_h, wl.kernel_w)
                          ).astype(np.int8)
    data_p = np.ascontiguousarray(pack_nchw(data, B, BI))
    kernel_p = np.ascontiguousarray(kernel.reshape(wl.out_channels // BO, BO, wl.in_channels // BI, BI,
                                                   wl.kernel_h, wl.kernel_w).transpose(0, 2, 4, 5, 1, 3))
    bias_p = None
    if with_bias:
        bias = rng.integers(-16384, 16384, (wl.batch, wl.out_channels, 1, 1)).astype(np.int32)
        bias_p = np.ascontiguousarray(pack_nchw(bias, B, BO))
    return data_p, kernel_p, bias_p


def check(cfg, wl, epilogue, knobs=None, seed=SEED):
    rng = np.random.default_rng(seed)
    conv = build_conv2d(cfg, wl, epilogue, knobs)
    with_bias = any(st[0] == "bias" for st in epilogue)
    data, kernel, bias = make_inputs(cfg, wl, with_bias, rng)
    out, stats = conv.run(data, kernel, bias)
    ref = pack_nchw(reference(wl, epilogue, data, kernel, bias), cfg.BATCH, cfg.BLOCK_OUT)
    assert out.shape == ref.shape
    bad = int((out != ref).sum())
    assert bad == 0, f"{bad} of {out.size} outputs differ"
    return conv, stats


def wl_blocks(cfg, h, w, ci_blocks, co_blocks, k, pad, stride, batch_blocks=1):
    return Conv2dWorkload(batch_blocks * cfg.BATCH, h, w, ci_blocks * cfg.BLOCK_IN,
                          co_blocks * cfg.BLOCK_OUT, k, k, pad, pad, stride, stride)


NO_BIAS = (("shr", 8), ("clip", 0, 127))
SMALL_CASES = [
    # (h, w, ci blocks, co blocks, kernel, pad, stride, epilogue, knobs)
    (6, 6, 2, 2, 3, 1, 1, EPILOGUE_ORIGINAL, Conv2dKnobs()),
    (7, 5, 1, 1, 3, 1, 2, EPILOGUE_PIPELINE, Conv2dKnobs()),
    (6, 6, 3, 2, 1, 0, 1, NO_BIAS, Conv2dKnobs()),
    (8, 8, 2, 4, 1, 0, 2, EPILOGUE_ORIGINAL, Conv2dKnobs()),
    (5, 7, 4, 1, 3, 0, 1, EPILOGUE_PIPELINE, Conv2dKnobs()),
    (8, 8, 2, 4, 3, 1, 1, EPILOGUE_ORIGINAL, Conv2dKnobs(tile_h=4, tile_w=8, tile_ci=2, tile_co=2)),
    (8, 6, 4, 2, 3, 1, 2, EPILOGUE_PIPELINE, Conv2dKnobs(tile_h=2, tile_w=3, tile_ci=2, tile_co=2)),
    (6, 6, 1, 1, 3, 1, 1, (), Conv2dKnobs()),
    (6, 6, 2, 2, 3, 1, 1, NO_BIAS, Conv2dKnobs(tile_h=3, tile_w=2)),
]


@pytest.mark.parametrize("case", range(len(SMALL_CASES)))
def test_small_default_config(case):
    h, w, cib, cob, k, pad, stride, ep, knobs = SMALL_CASES[case]
    cfg = load_config("default")
    check(cfg, wl_blocks(cfg, h, w, cib, cob, k, pad, stride), ep, knobs)


VTHREAD_CASES = [
    (dict(oc_nthread=2), 2),
    (dict(h_nthread=2), 1),
    (dict(oc_nthread=2, h_nthread=2, tile_w=3), 2),
    (dict(oc_nthread=2, tile_co=2, tile_ci=2, tile_h=2), 4),
]


@pytest.mark.parametrize("knobs,co_blocks", VTHREAD_CASES)
@pytest.mark.parametrize("epilogue", [EPILOGUE_ORIGINAL, EPILOGUE_PIPELINE], ids=["orig", "pipe"])
def test_virtual_threads(knobs, co_blocks, epilogue):
    cfg = load_config("default")
    wl = wl_blocks(cfg, 6, 6, 2, co_blocks, 3, 1, 1)
    conv, _ = check(cfg, wl, epilogue, Conv2dKnobs(**knobs))
    threads = knobs.get("oc_nthread", 1) * knobs.get("h_nthread", 1)
    assert conv.generated.nthreads == threads
    # the threads' input tiles go to different SRAM regions (the lowering duplicated the tiles),
    # and loads wait for the compute module to release a region (double buffering)
    loads = [i for i in conv.program.insns if i.opcode == Opcode.LOAD and i.x_size
             and i.memory_type == MemType.INP]
    assert len({i.sram_base for i in loads}) >= threads
    assert any(i.pop_next_dep for i in loads)


@pytest.mark.skipif(not (CONFIG_DIR / "2x16x16.json").exists(), reason="no 2x16x16 preset")
@pytest.mark.parametrize("case", [
    (6, 6, 2, 2, 3, 1, 1, EPILOGUE_ORIGINAL, Conv2dKnobs(), 1),
    (7, 7, 1, 2, 3, 1, 2, EPILOGUE_PIPELINE, Conv2dKnobs(tile_h=2, tile_co=2), 2),
    (6, 6, 2, 2, 1, 0, 1, NO_BIAS, Conv2dKnobs(tile_b=2, tile_w=3), 2),
    (6, 6, 2, 4, 3, 1, 1, EPILOGUE_ORIGINAL, Conv2dKnobs(oc_nthread=2, h_nthread=2), 2),
], ids=["fallback", "tiled-stride2", "tile_b", "vthreads"])
def test_batch2_config(case):
    h, w, cib, cob, k, pad, stride, ep, knobs, nbb = case
    cfg = load_config("2x16x16")
    assert cfg.BATCH == 2
    check(cfg, wl_blocks(cfg, h, w, cib, cob, k, pad, stride, batch_blocks=nbb), ep, knobs)


@pytest.mark.skipif(not (CONFIG_DIR / "1x32x32.json").exists(), reason="no 1x32x32 preset")
def test_block32_config():
    cfg = load_config("1x32x32")
    check(cfg, wl_blocks(cfg, 6, 6, 2, 2, 3, 1, 1), EPILOGUE_ORIGINAL, Conv2dKnobs(tile_h=2, tile_ci=2))


def test_per_channel_bias_broadcast():
    """A (1, O/co, 1, 1, b, co) bias is broadcast over the batch blocks."""
    cfg = load_config("default")
    wl = Conv2dWorkload(2, 4, 4, 16, 32, 3, 3, 1, 1, 1, 1)
    conv = build_conv2d(cfg, wl, EPILOGUE_PIPELINE)
    rng = np.random.default_rng(1)
    data, kernel, _ = make_inputs(cfg, wl, False, rng)
    bias1 = rng.integers(-1000, 1000, (1, 2, 1, 1, 1, 16)).astype(np.int32)
    out, _ = conv.run(data, kernel, bias1)
    ref = reference(wl, EPILOGUE_PIPELINE, data, kernel, np.broadcast_to(bias1, (2, 2, 1, 1, 1, 16)))
    np.testing.assert_array_equal(out, pack_nchw(ref, 1, 16))


def test_default_knobs_tile_the_layer():
    """The default (TPS) knobs tile the layer: bit-exact, and far fewer instructions than the
    fallback's one instruction group per output pixel."""
    cfg = load_config("default")
    wl = Conv2dWorkload(1, 14, 14, 64, 64, 3, 3, 1, 1, 1, 1)
    fallback = build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, "fallback")
    conv, _ = check(cfg, wl, EPILOGUE_ORIGINAL)
    assert fallback.knobs == Conv2dKnobs() != conv.knobs
    assert conv.program.insn_count * 10 < fallback.program.insn_count


def test_knobs_as_dict():
    """A plain dict of Conv2dKnobs fields (a tuner's or a JSON record's form) is explicit knobs."""
    cfg = load_config("default")
    wl = wl_blocks(cfg, 6, 6, 2, 2, 3, 1, 1)
    conv, _ = check(cfg, wl, EPILOGUE_ORIGINAL, {"tile_h": 3, "tile_co": 2, "oc_nthread": 1})
    assert conv.knobs == Conv2dKnobs(tile_h=3, tile_co=2)


def test_program_reused_across_runs():
    cfg = load_config("default")
    wl = wl_blocks(cfg, 5, 5, 1, 2, 3, 1, 1)
    conv = build_conv2d(cfg, wl, EPILOGUE_ORIGINAL)
    n_insns = conv.program.insn_count
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        data, kernel, bias = make_inputs(cfg, wl, True, rng)
        out, _ = conv.run(data, kernel, bias)
        ref = pack_nchw(reference(wl, EPILOGUE_ORIGINAL, data, kernel, bias), 1, 16)
        np.testing.assert_array_equal(out, ref)
    assert conv.program.insn_count == n_insns


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("wl,match", [
    (Conv2dWorkload(1, 8, 8, 24, 32, 3, 3, 1, 1, 1, 1), "in_channels=24 is not a multiple of BLOCK_IN=16"),
    (Conv2dWorkload(1, 8, 8, 32, 40, 3, 3, 1, 1, 1, 1), "out_channels=40 is not a multiple of BLOCK_OUT=16"),
    (Conv2dWorkload(1, 40, 40, 16, 16, 3, 3, 16, 16, 1, 1), "padding 16x16 exceeds the 4-bit DMA pad"),
], ids=["in-channels", "out-channels", "pad"])
def test_unsupported_workloads_are_refusals(wl, match):
    """A workload the template does not implement is a TemplateRefusal (the operator stays on the
    CPU), whatever the knobs."""
    cfg = load_config("default")
    for knobs in (None, "fallback", Conv2dKnobs()):
        with pytest.raises(Conv2dRefusal, match=match) as err:
            build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, knobs)
        assert isinstance(err.value, TemplateRefusal)


def test_nothing_fits_is_a_refusal_but_explicit_knobs_fail():
    """A 48x48 kernel needs 2304 weight entries even with every inner tile 1: the presets refuse
    (no tiling fits), explicit knobs fail with the lowering's message naming the buffer."""
    cfg = load_config("default")
    assert cfg.wgt_depth == 1024
    wl = Conv2dWorkload(1, 48, 48, 16, 16, 48, 48, 0, 0, 1, 1)
    for preset in ("tps", "fallback"):
        with pytest.raises(Conv2dRefusal, match="no tiling"):
            build_conv2d(cfg, wl, (), preset)
    with pytest.raises(KnobError, match=r"local\.wgt_buffer needs 2304 elements but has 1024") as err:
        build_conv2d(cfg, wl, (), Conv2dKnobs())
    assert not isinstance(err.value, TemplateRefusal)


def test_error_scratchpad_overflow_names_buffer():
    """Explicit knobs whose tiles overflow a scratchpad fail the build (never a refusal); the
    lowering's message names the buffer: acc (4 x (56 x 56 + 1 bias)) and inp (4 x 30 x 58)."""
    cfg = load_config("default")
    wl = Conv2dWorkload(1, 56, 56, 64, 64, 3, 3, 1, 1, 1, 1)
    with pytest.raises(KnobError, match=r"local\.acc_buffer needs 12548 elements but has 2048"):
        build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, Conv2dKnobs(tile_h=56, tile_w=56, tile_co=4))
    with pytest.raises(KnobError, match=r"local\.inp_buffer needs 6960 elements but has 2048 \(data_pad"):
        build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, {"tile_h": 28, "tile_w": 56, "tile_ci": 4})


def test_error_bad_knobs_and_epilogue():
    """Knob errors name the knob and the valid values; they are not refusals."""
    cfg = load_config("default")
    wl = Conv2dWorkload(1, 8, 8, 32, 32, 3, 3, 1, 1, 1, 1)
    cases = [(Conv2dKnobs(tile_h=3), r"tile_h=3 does not divide OH = 8; valid tile_h: 1, 2, 4, 8"),
             (Conv2dKnobs(oc_nthread=3), r"oc_nthread=3; valid oc_nthread: 1, 2"),
             (Conv2dKnobs(tile_co=2, oc_nthread=2), r"oc_nthread=2 must divide \(O/BLOCK_OUT\)/tile_co = 1"),
             ({"tile_x": 2}, r"unknown Conv2dKnobs field\(s\) tile_x; valid fields: tile_b, tile_h"),
             ("best", r"unknown knobs 'best'; valid names: fallback, tps, tps-reuse")]
    for knobs, match in cases:
        with pytest.raises(KnobError, match=match) as err:
            build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, knobs)
        assert not isinstance(err.value, TemplateRefusal)
    with pytest.raises(EpilogueError, match="unknown epilogue stage"):
        build_conv2d(cfg, wl, (("relu",),))
    conv = build_conv2d(cfg, wl, EPILOGUE_ORIGINAL)
    rng = np.random.default_rng(0)
    data, kernel, bias = make_inputs(cfg, wl, True, rng)
    with pytest.raises(Conv2dError, match="pass bias_packed"):
        conv.run(data, kernel)
    with pytest.raises(Conv2dError, match="expected shape"):
        conv.run(data[:, :1], kernel, bias)


# ------------------------------------------------------------------------------------------------
# drop-in fidelity with the original stack (fallback schedule, ResNet-18 C2)
# ------------------------------------------------------------------------------------------------
RESNET18 = {
    "C2": Conv2dWorkload(1, 56, 56, 64, 64, 3, 3, 1, 1, 1, 1),
    "C3": Conv2dWorkload(1, 56, 56, 64, 128, 3, 3, 1, 1, 2, 2),
    "C4": Conv2dWorkload(1, 56, 56, 64, 128, 1, 1, 0, 0, 2, 2),
    "C5": Conv2dWorkload(1, 28, 28, 128, 128, 3, 3, 1, 1, 1, 1),
    "C6": Conv2dWorkload(1, 28, 28, 128, 256, 3, 3, 1, 1, 2, 2),
    "C7": Conv2dWorkload(1, 28, 28, 128, 256, 1, 1, 0, 0, 2, 2),
    "C8": Conv2dWorkload(1, 14, 14, 256, 256, 3, 3, 1, 1, 1, 1),
    "C9": Conv2dWorkload(1, 14, 14, 256, 512, 3, 3, 1, 1, 2, 2),
    "C10": Conv2dWorkload(1, 14, 14, 256, 512, 1, 1, 0, 0, 2, 2),
    "C11": Conv2dWorkload(1, 7, 7, 512, 512, 3, 3, 1, 1, 1, 1),
}

C2_COUNTERS = dict(inp_load_nbytes=7_054_336, wgt_load_nbytes=115_605_504, acc_load_nbytes=802_816,
                   out_store_nbytes=200_704, gemm_counter=451_584, alu_counter=50_176)


def apache_config():
    """The original stack's configuration: default shape, no ISA extensions (so the clip is
    ALU MIN + MAX as in the original, not the CLIP extension)."""
    from vta_ext.config import VTAConfig
    if (CONFIG_DIR / "apache.json").exists():
        return load_config("apache")
    return VTAConfig.from_dict({**load_config("default").to_dict(), "EXT_CLIP": False,
                                "EXT_PAD_MIN": False}, name="apache")


def test_dropin_fidelity_resnet18_c2_fallback():
    """The fallback schedule reproduces the original stack's simulator counters exactly."""
    cfg = apache_config()
    assert (cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT) == (1, 16, 16) and not cfg.EXT_CLIP
    t0 = time.perf_counter()
    conv, stats = check(cfg, RESNET18["C2"], EPILOGUE_ORIGINAL, Conv2dKnobs())
    counters = stats.as_dict()
    counters.pop("uop_load_nbytes")
    assert counters == C2_COUNTERS
    print(f"C2 fallback: {conv.program.insn_count} instructions, generation "
          f"{conv.timings['generate']:.2f} s, simulation {conv.timings['last_run']:.2f} s, "
          f"total {time.perf_counter() - t0:.2f} s")


def _resnet_case(name, knobs):
    cfg = load_config("default")
    wl = RESNET18[name]
    _, stats = check(cfg, wl, EPILOGUE_ORIGINAL, knobs)
    oh, ow = wl.out_height, wl.out_width
    assert stats.out_store_nbytes == wl.batch * wl.out_channels * oh * ow
    assert stats.gemm_counter == (oh * ow * (wl.out_channels // 16) * (wl.in_channels // 16)
                                  * wl.kernel_h * wl.kernel_w)


@pytest.mark.parametrize("name", sorted(RESNET18, key=lambda n: int(n[1:])))
def test_resnet18_tps_knobs(name):
    """Every ResNet-18 layer with its TPS knobs (reuse-aware double buffering allowed, so many use
    two virtual threads): bit-exact, every output stored once, one GEMM per output pixel, input
    block and kernel tap."""
    _resnet_case(name, tps_knobs("default", RESNET18[name], EPILOGUE_ORIGINAL, reuse=True).knobs)


def test_resnet18_c1_instruction_structure():
    """ResNet-18 C1 (3 -> 64 channels, the input padded to one block; 224x224, 7x7, stride 2, pad 3)
    with tile_h=14, tile_w=28, tile_co=4, as the original schedules it: 112/14 x 112/28 x 1 = 32
    tiles and one input-channel block, so per tile one reset and one GEMM instruction: 64 (not one
    pair per output column). The GEMM folds tile_w (28) and KW (7) and unrolls
    KH x tile_co x tile_h = 7 x 4 x 14 = 392 micro-ops; the reset folds tile_w and tile_co and
    unrolls tile_h: 14. Bit-exact."""
    cfg = apache_config()
    wl = Conv2dWorkload(1, 224, 224, 16, 64, 7, 7, 3, 3, 2, 2)
    conv, _ = check(cfg, wl, EPILOGUE_ORIGINAL, Conv2dKnobs(tile_h=14, tile_w=28, tile_co=4))
    gemms = [i for i in conv.program.insns if i.opcode == Opcode.GEMM]
    assert len(gemms) == 64
    assert sorted({(int(i.reset_reg), i.uop_end - i.uop_bgn, i.iter_out, i.iter_in) for i in gemms}) \
        == [(0, 392, 28, 7), (1, 14, 28, 4)]


@pytest.mark.parametrize("name", ["C4", "C9", pytest.param("C11", marks=pytest.mark.slow)])
def test_resnet18_fallback(name):
    _resnet_case(name, Conv2dKnobs())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RESNET18, key=lambda n: int(n[1:])))
def test_resnet18_fallback_all(name):
    """All layers with the fallback schedule (the original's schedule without TopHub logs)."""
    _resnet_case(name, Conv2dKnobs())


# ------------------------------------------------------------------------------------------------
# randomised shapes/knobs/epilogues (deterministic), including degenerate images (H or W of 1-2,
# padding larger than the image, tiles entirely in the padding)
# ------------------------------------------------------------------------------------------------
def _random_cases(n, seed):
    import random
    rnd = random.Random(seed)
    divs = lambda m: [d for d in range(1, m + 1) if m % d == 0]  # noqa: E731
    eps = [EPILOGUE_ORIGINAL, EPILOGUE_PIPELINE, (), (("shr", 3),), (("clip", -10, 20),),
           (("bias",), ("min", 50), ("add", -3))]
    names = [c for c in ("default", "2x16x16", "1x32x32") if (CONFIG_DIR / f"{c}.json").exists()]
    cases = []
    while len(cases) < n:
        name = rnd.choice(names)
        cfg = load_config(name)
        k = rnd.choice([1, 1, 3, 3, 5])
        pad = rnd.choice([0, 0, 1, 2]) if k > 1 else rnd.choice([0, 0, 1])
        s = rnd.choice([1, 1, 2])
        h, w = rnd.randint(max(1, k - 2 * pad), 9), rnd.randint(max(1, k - 2 * pad), 9)
        nb, cb, ob = rnd.choice([1, 1, 2]), rnd.randint(1, 3), rnd.randint(1, 4)
        wl = Conv2dWorkload(nb * cfg.BATCH, h, w, cb * cfg.BLOCK_IN, ob * cfg.BLOCK_OUT, k, k, pad,
                            pad, s, s)
        if wl.out_height < 1 or wl.out_width < 1:
            continue
        kn = dict(tile_b=rnd.choice(divs(nb)), tile_h=rnd.choice(divs(wl.out_height)),
                  tile_w=rnd.choice(divs(wl.out_width)), tile_ci=rnd.choice(divs(cb)),
                  tile_co=rnd.choice(divs(ob)))
        if rnd.random() < 0.5 and (ob // kn["tile_co"]) % 2 == 0:
            kn["oc_nthread"] = 2
        if rnd.random() < 0.5 and (wl.out_height // kn["tile_h"]) % 2 == 0:
            kn["h_nthread"] = 2
        cases.append((name, wl, Conv2dKnobs(**kn), rnd.choice(eps)))
    return cases


@pytest.mark.parametrize("case", _random_cases(24, 7), ids=lambda c: f"{c[0]}-{c[1].height}x"
                         f"{c[1].width}k{c[1].kernel_h}p{c[1].pad_h}s{c[1].stride_h}")
def test_random_workloads(case):
    from vta_ext.lower.racecheck import check_races
    name, wl, knobs, epilogue = case
    cfg = load_config(name)
    conv, _ = check(cfg, wl, epilogue, knobs)
    check_races(conv.program)
    # the original's structure: per output tile and batch block one reset, and one GEMM per step of
    # the input-channel-block loop split by tile_ci
    tiles = (wl.batch // cfg.BATCH) * (wl.out_channels // cfg.BLOCK_OUT // knobs.tile_co) * \
        (wl.out_height // knobs.tile_h) * (wl.out_width // knobs.tile_w)
    steps = wl.in_channels // cfg.BLOCK_IN // knobs.tile_ci
    assert sum(i.opcode == Opcode.GEMM for i in conv.program.insns) == tiles * (1 + steps)


def test_dma_row_stride_over_the_16_bit_field_becomes_one_dma_per_row():
    """A tile that covers whole image rows (tile_w = W) loads channel block after channel block;
    the DRAM distance between them is H*W = 260*260 = 67,600 elements, over the 16-bit x_stride
    field (65,535). The lowering then issues one DMA per channel block (a CPU loop) instead of
    one 2-D DMA with that stride, whose encoding failed ("MEM.x_stride = 67600 ... does not fit");
    the result is exact against numpy and no LOAD/STORE carries a stride over the field."""
    cfg = load_config("default")
    wl = wl_blocks(cfg, 260, 260, 2, 1, 1, 0, 1)
    conv, _ = check(cfg, wl, NO_BIAS, Conv2dKnobs(tile_h=2, tile_w=260, tile_ci=2))
    strides = [i.x_stride for i in conv.program.insns if i.opcode in (Opcode.LOAD, Opcode.STORE)]
    assert strides and max(strides) <= 65535
    assert 260 * 260 not in strides



def test_the_unchecked_schedule_gives_the_checked_schedules_module(monkeypatch):
    """The stock schedule built on :func:`vta_ext.lower.schedule.unchecked_schedule` is the module
    that TVM's type-checked ``Schedule`` gives for the same knobs; a wrong argument still fails."""
    import tvm
    from tvm import te
    import vta_ext.lower.schedule as unchecked
    from vta_ext.templates.conv2d import schedule_conv2d

    cfg = load_config("default")
    wl, knobs = RESNET18["C5"], tps_knobs("default", RESNET18["C5"], EPILOGUE_ORIGINAL).knobs
    fast, _ = schedule_conv2d(cfg, wl, EPILOGUE_ORIGINAL, knobs)
    monkeypatch.setattr(unchecked, "unchecked_schedule", tvm.s_tir.Schedule)
    checked, _ = schedule_conv2d(cfg, wl, EPILOGUE_ORIGINAL, knobs)
    assert type(fast) is not type(checked)
    tvm.ir.assert_structural_equal(fast.mod, checked.mod)
    monkeypatch.undo()

    a = te.placeholder((16,), name="a")
    sch = unchecked.unchecked_schedule(te.create_prim_func([a, te.compute((16,), lambda i: a[i] + 1,
                                                                          name="b")]))
    (loop,) = sch.get_loops(sch.get_sblock("b"))
    with pytest.raises(Exception, match="16"):          # 2 * 3 does not cover the extent 16
        sch.split(loop, [2, 3])


def test_total_gemm_uops_is_the_original_stacks_gemm_counter():
    """ResNet-18 C2: the GEMM micro-ops any stock tiling runs are the original stack's counter."""
    from vta_ext.templates.tiling import total_gemm_uops

    assert total_gemm_uops(apache_config(), RESNET18["C2"]) == C2_COUNTERS["gemm_counter"]


@pytest.mark.parametrize("knobs", ["tps", Conv2dKnobs(tile_h=7, tile_w=14, tile_ci=2, tile_co=2,
                                                     oc_nthread=2)])
def test_output_blocks_are_the_stock_programs_resets(knobs):
    """ResNet-18 C2 (1x64x56x56 -> 64): whatever the tiling, the stock program resets every
    accumulator entry of the output once, 56 * 56 * 64 / 16 = 12,544 reset micro-ops, and passes
    each through every ALU stage once (the original epilogue ``>> 8``, ``+ bias``, clip: a SHR and
    the clip's MIN and MAX with an immediate, 5 cycles each, and the vector ADD, 6 cycles);
    :func:`~vta_ext.templates.tiling.output_blocks` is that count."""
    from vta_ext.isa import AluInsn, GemmInsn
    from vta_ext.templates.tiling import output_blocks

    cfg = apache_config()
    wl = RESNET18["C2"]
    program = build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, knobs).program
    uops = lambda i: i.iter_out * i.iter_in * (i.uop_end - i.uop_bgn)  # noqa: E731
    resets = sum(uops(i) for i in program.insns if isinstance(i, GemmInsn) and i.reset_reg)
    alu = sum(uops(i) * (cfg.ALU_CYCLES_PER_UOP_IMM if i.use_imm else cfg.ALU_CYCLES_PER_UOP_VEC)
              for i in program.insns if isinstance(i, AluInsn))
    assert resets == output_blocks(cfg, wl) == 56 * 56 * 64 // 16
    assert (cfg.ALU_CYCLES_PER_UOP_IMM, cfg.ALU_CYCLES_PER_UOP_VEC) == (5, 6)
    assert alu == 12_544 * (3 * 5 + 6)
