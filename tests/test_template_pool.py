"""Max / average pooling templates (vta_ext.templates.pool) against numpy references."""
import numpy as np
import pytest

from conftest import pack_activation as pack, unpack_nchw as unpack
from vta_ext.config import load_config
from vta_ext.isa import AluOp, Opcode
from vta_ext.errors import TemplateRefusal
from vta_ext.templates.errors import AluTemplateRefusal, EpilogueRefusal, KnobError
from vta_ext.templates.pool import (PoolKnobs, PoolWorkload, build_avg_pool2d, build_max_pool2d,
                                    choose_reciprocal)


def ref_pool(x, wl, mode, epilogue=()):
    """Window by window in int64: max, or the sum divided truncating toward zero."""
    x = x.astype(np.int64)
    n, c, h, w = x.shape
    oh = (h + 2 * wl.pad_h - wl.pool_h) // wl.stride_h + 1
    ow = (w + 2 * wl.pad_w - wl.pool_w) // wl.stride_w + 1
    out = np.zeros((n, c, oh, ow), np.int64)
    for y in range(oh):
        for z in range(ow):
            y0, z0 = y * wl.stride_h - wl.pad_h, z * wl.stride_w - wl.pad_w
            win = x[:, :, max(y0, 0):min(y0 + wl.pool_h, h), max(z0, 0):min(z0 + wl.pool_w, w)]
            if mode == "max":
                out[:, :, y, z] = win.max(axis=(2, 3))
            else:
                s = win.sum(axis=(2, 3))
                d = wl.pool_h * wl.pool_w if wl.count_include_pad else win.shape[2] * win.shape[3]
                out[:, :, y, z] = np.sign(s) * (np.abs(s) // d)
    for st in epilogue:
        if st[0] == "shr":
            out = out >> st[1]
        elif st[0] == "clip":
            out = np.clip(out, st[1], st[2])
        elif st[0] == "add":
            out = out + st[1]
    return out.astype(np.int8)


def run(build, cfg, wl, x, epilogue=(), knobs=None):
    op = build(cfg, wl, epilogue, knobs)
    got, _ = op.run(pack(x, cfg))
    again, _ = op.run(pack(x, cfg))         # the program is reusable (tokens balanced)
    np.testing.assert_array_equal(got, again)
    return unpack(got), op


SHAPES = [  # n, c, hw, pool, stride, pad, knobs
    (1, 32, 9, 3, 2, 1, None),
    (1, 32, 9, 3, 2, 1, dict(tile_h=1)),                 # many tiles, double-buffered
    (1, 48, 8, 2, 2, 0, dict(tile_h=2, tile_c=2, slots=1)),
    (2, 16, 7, 7, 1, 0, None),                           # global pool
    (1, 16, 6, 3, 1, 1, dict(tile_h=2)),
    (1, 16, 7, 2, 3, 1, None),                           # stride > pool
]


@pytest.mark.parametrize("preset", ["default", "apache", "pipelined", "2x16x16"])
@pytest.mark.parametrize("n,c,hw,pool,stride,pad,knobs", SHAPES)
def test_max_pool(preset, n, c, hw, pool, stride, pad, knobs):
    cfg = load_config(preset)
    n = max(n, cfg.BATCH)
    wl = PoolWorkload(n, c, hw, hw, pool, pool, stride, stride, pad, pad)
    x = np.random.default_rng(hw * c + pad).integers(-128, 128, (n, c, hw, hw)).astype(np.int8)
    if pad and not cfg.EXT_PAD_MIN:
        with pytest.raises(AluTemplateRefusal, match="EXT_PAD_MIN"):
            build_max_pool2d(cfg, wl, (), knobs)
        return
    got, op = run(build_max_pool2d, cfg, wl, x, knobs=knobs)
    np.testing.assert_array_equal(got, ref_pool(x, wl, "max"))
    if knobs and knobs.get("tile_h") == 1:
        assert op.info["tiles"] >= 3


@pytest.mark.parametrize("preset", ["default", "apache", "pipelined", "2x16x16"])
@pytest.mark.parametrize("n,c,hw,pool,stride,pad,knobs", SHAPES)
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_avg_pool(preset, n, c, hw, pool, stride, pad, knobs, count_include_pad):
    cfg = load_config(preset)
    n = max(n, cfg.BATCH)
    wl = PoolWorkload(n, c, hw, hw, pool, pool, stride, stride, pad, pad, count_include_pad)
    x = np.random.default_rng(hw * c + pad).integers(-128, 128, (n, c, hw, hw)).astype(np.int8)
    ep = (("clip", -128, 127),)
    got, _ = run(build_avg_pool2d, cfg, wl, x, ep, knobs)
    np.testing.assert_array_equal(got, ref_pool(x, wl, "avg", ep))


@pytest.mark.parametrize("value", [-128, 127, -1, 1])
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_boundary_values(value, count_include_pad):
    cfg = load_config("default")
    x = np.full((1, 16, 6, 6), value, np.int8)
    x[0, 3, 2, 2] = -value if value != -128 else 127
    for pool, pad in ((3, 1), (6, 0), (2, 1)):
        wl = PoolWorkload(1, 16, 6, 6, pool, pool, 1, 1, pad, pad, count_include_pad)
        got, _ = run(build_max_pool2d, cfg, wl, x)
        np.testing.assert_array_equal(got, ref_pool(x, wl, "max"))
        got, _ = run(build_avg_pool2d, cfg, wl, x)     # no clip: the truncating store
        np.testing.assert_array_equal(got, ref_pool(x, wl, "avg"))


def test_avg_truncates_toward_zero():
    """-1 everywhere, 3x3 windows with zero padding counted: the corner sum -4 / 9 is 0 (floor
    division would give -1), the interior -9 / 9 is -1."""
    cfg = load_config("default")
    wl = PoolWorkload(1, 16, 5, 5, 3, 3, 1, 1, 1, 1, True)
    got, _ = run(build_avg_pool2d, cfg, wl, np.full((1, 16, 5, 5), -1, np.int8))
    assert got[0, 0, 0, 0] == 0 and got[0, 0, 2, 2] == -1 and got[0, 0, 0, 2] == 0
    x = np.random.default_rng(5).integers(-128, 0, (1, 16, 5, 5)).astype(np.int8)
    got, _ = run(build_avg_pool2d, cfg, wl, x)
    np.testing.assert_array_equal(got, ref_pool(x, wl, "avg"))


@pytest.mark.parametrize("preset", ["default", "apache"])
def test_clip_epilogue_instructions(preset):
    cfg = load_config(preset)
    wl = PoolWorkload(1, 16, 7, 7, 7, 7, 1, 1, 0, 0)
    x = np.random.default_rng(0).integers(-128, 128, (1, 16, 7, 7)).astype(np.int8)
    ep = (("shr", 1), ("clip", -20, 30), ("add", 3))
    got, op = run(build_avg_pool2d, cfg, wl, x, ep)
    np.testing.assert_array_equal(got, ref_pool(x, wl, "avg", ep))
    alu_ops = [i.alu_opcode for i in op.program.insns if i.opcode == Opcode.ALU]
    assert (AluOp.CLIP in alu_ops) == cfg.EXT_CLIP


def test_global_pool_uses_one_tile_for_many_channels():
    cfg = load_config("default")
    wl = PoolWorkload(1, 512, 7, 7, 7, 7, 1, 1, 0, 0)
    x = np.random.default_rng(1).integers(-128, 128, (1, 512, 7, 7)).astype(np.int8)
    got, op = run(build_avg_pool2d, cfg, wl, x, (("clip", -128, 127),))
    np.testing.assert_array_equal(got, ref_pool(x, wl, "avg", (("clip", -128, 127),)))
    assert op.info["tile_c"] > 1 and op.info["division"]["vector"] is False


def test_reciprocal_is_exact():
    """Independent exhaustive check of the multiply-shift division over |sum| <= 128*d."""
    for d in range(1, 50):
        k, ms = choose_reciprocal([d], 128, (1 << 15) - 1)
        xs = np.arange(128 * d + 1)
        np.testing.assert_array_equal((xs * ms[d]) >> k, xs // d)
    assert choose_reciprocal([49], 128, (1 << 15) - 1) == (17, {49: 2675})
    k, ms = choose_reciprocal(np.arange(1, 226), 128)
    for d, m in ms.items():
        xs = np.arange(128 * d + 1)
        assert 128 * d * m < 2 ** 31
        np.testing.assert_array_equal((xs * m) >> k, xs // d)


def test_errors():
    """Workloads the template does not implement are refusals; bad knobs are knob errors."""
    cfg = load_config("default")
    refusals = [
        (build_max_pool2d, cfg, PoolWorkload(1, 20, 8, 8, 2, 2, 2, 2, 0, 0), (), "BLOCK_OUT"),
        # one window row of 1500 columns > the 2048-entry accumulator with the output rows
        (build_max_pool2d, cfg, PoolWorkload(1, 16, 4, 1500, 2, 2, 2, 2, 0, 0), (), "accumulator"),
        (build_avg_pool2d, cfg, PoolWorkload(1, 16, 8, 8, 2, 2, 2, 2, 2, 2), (), "padding"),
        (build_avg_pool2d, cfg, PoolWorkload(1, 16, 8, 8, 2, 2, 2, 2, 0, 0), (("bias",),), "bias"),
        (build_max_pool2d, "apache", PoolWorkload(1, 16, 8, 8, 3, 3, 2, 2, 1, 1), (), "EXT_PAD_MIN"),
    ]
    for build, config, wl, ep, match in refusals:
        with pytest.raises(AluTemplateRefusal, match=match) as err:
            build(config, wl, ep)
        assert isinstance(err.value, TemplateRefusal)
    with pytest.raises(EpilogueRefusal, match="does not fit the 16-bit ALU immediate"):
        build_max_pool2d(cfg, PoolWorkload(1, 16, 8, 8, 2, 2, 2, 2, 0, 0), (("add", 40000),))
    wl = PoolWorkload(1, 16, 40, 40, 2, 2, 2, 2, 0, 0)
    for knobs, match in ((dict(tile_h=20, tile_c=1), "accumulator"), (dict(slots=3), "slots=3; valid values: 1, 2"),
                         ("best", "valid names: fallback, tps"), (dict(rows=2), "valid fields: tile_h, tile_c, slots")):
        with pytest.raises(KnobError, match=match) as err:
            build_max_pool2d(cfg, wl, (), knobs)
        assert not isinstance(err.value, TemplateRefusal)


def test_knob_presets():
    """"tps", "fallback", None, the dataclass and a dict all build; the presets are the default."""
    wl = PoolWorkload(1, 32, 8, 8, 2, 2, 2, 2, 0, 0)
    default = build_max_pool2d("default", wl).program.insn_count
    for knobs in ("tps", "fallback", PoolKnobs(), {"slots": 2}):
        assert build_max_pool2d("default", wl, (), knobs).program.insn_count == default
    assert build_max_pool2d("default", wl, (), {"tile_h": 1}).info["tile_h"] == 1
    build_max_pool2d("apache", PoolWorkload(1, 16, 8, 8, 3, 3, 2, 2, 0, 0))   # no padding: fine
