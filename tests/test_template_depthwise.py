"""Depthwise conv2d template (vta_ext.templates.depthwise) against a numpy reference."""
import numpy as np
import pytest

from conftest import pack_activation as pack, unpack_nchw as unpack
from vta_ext.config import load_config
from vta_ext.isa import AluOp, Opcode
from vta_ext.errors import TemplateRefusal
from vta_ext.templates.depthwise import DepthwiseConv2dWorkload, build_depthwise_conv2d
from vta_ext.templates.errors import AluTemplateError, AluTemplateRefusal, KnobError


def pack_kernel(k, cfg):
    """(C, KH, KW) -> (C/co, KH, KW, b, co), replicated over the batch lanes."""
    c, kh, kw = k.shape
    co = cfg.BLOCK_OUT
    k = k.reshape(c // co, co, kh, kw).transpose(0, 2, 3, 1)[:, :, :, None, :]
    return np.ascontiguousarray(np.broadcast_to(k, (c // co, kh, kw, cfg.BATCH, co)))


def pack_bias(bias, cfg):
    co = cfg.BLOCK_OUT
    b = bias.reshape(1, -1, 1, 1, 1, co)
    return np.ascontiguousarray(np.broadcast_to(b, b.shape[:4] + (cfg.BATCH, co)))


def ref_depthwise(x, k, bias, stride, pad, epilogue):
    """Direct int64 depthwise conv, int32 wrap, epilogue, int8 wrap."""
    n, c, h, w = x.shape
    _, kh, kw = k.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
    acc = np.zeros((n, c, oh, ow), np.int64)
    for y in range(oh):
        for z in range(ow):
            win = xp[:, :, y * stride:y * stride + kh, z * stride:z * stride + kw]
            acc[:, :, y, z] = (win * k[None].astype(np.int64)).sum(axis=(2, 3))
    for st in epilogue:
        if st[0] == "bias":
            acc = acc + bias.astype(np.int64)[None, :, None, None]
        elif st[0] == "shr":
            acc = acc >> st[1]
        elif st[0] == "clip":
            acc = np.clip(acc, st[1], st[2])
        acc = (acc + 2 ** 31) % 2 ** 32 - 2 ** 31
    return acc.astype(np.int8)


EPILOGUE = (("bias",), ("shr", 6), ("clip", -128, 127))


@pytest.mark.parametrize("preset", ["default", "apache", "pipelined", "2x16x16"])
@pytest.mark.parametrize("n,c,hw,kern,stride,pad,knobs,epilogue", [
    (1, 32, 8, 3, 1, 1, None, EPILOGUE),
    (1, 32, 9, 3, 2, 1, dict(tile_h=2), EPILOGUE),                  # stride 2, several tiles
    (2, 16, 7, 3, 1, 0, dict(tile_h=1, slots=1), (("shr", 4),)),    # no bias, no clip
    (1, 48, 6, 5, 1, 2, dict(tile_h=3, tile_c=2), EPILOGUE),        # 5x5, channel groups
    (1, 16, 5, 3, 1, 3, None, (("bias",), ("clip", 0, 127))),       # windows all padding
])
def test_depthwise(preset, n, c, hw, kern, stride, pad, knobs, epilogue):
    cfg = load_config(preset)
    n = max(n, cfg.BATCH)
    rng = np.random.default_rng(c + hw + kern)
    x = rng.integers(-128, 128, (n, c, hw, hw)).astype(np.int8)
    k = rng.integers(-128, 128, (c, kern, kern)).astype(np.int8)
    bias = rng.integers(-5000, 5000, c).astype(np.int32)
    wl = DepthwiseConv2dWorkload(n, c, hw, hw, kern, kern, pad, pad, stride, stride)
    op = build_depthwise_conv2d(cfg, wl, epilogue, knobs)
    args = [pack(x, cfg), pack_kernel(k, cfg)]
    if any(st[0] == "bias" for st in epilogue):
        args.append(pack_bias(bias, cfg))
    got, _ = op.run(*args)
    again, _ = op.run(*args)
    np.testing.assert_array_equal(got, again)
    np.testing.assert_array_equal(unpack(got), ref_depthwise(x, k, bias, stride, pad, epilogue))
    if knobs:
        assert op.info["tiles"] >= 3
    alu_ops = [i.alu_opcode for i in op.program.insns if i.opcode == Opcode.ALU]
    if any(st[0] == "clip" for st in epilogue):
        assert (AluOp.CLIP in alu_ops) == cfg.EXT_CLIP


def test_boundary_values():
    """-128 x -128 taps summed over 3x3: 147456, shifted and clipped / wrapped."""
    cfg = load_config("default")
    x = np.full((1, 16, 5, 5), -128, np.int8)
    x[0, 1] = 127
    k = np.full((16, 3, 3), -128, np.int8)
    k[2] = 127
    bias = np.arange(16, dtype=np.int32) * 1000 - 8000
    wl = DepthwiseConv2dWorkload(1, 16, 5, 5, 3, 3, 1, 1, 1, 1)
    for ep in (EPILOGUE, (("bias",),), ()):
        op = build_depthwise_conv2d(cfg, wl, ep)
        args = [pack(x, cfg), pack_kernel(k, cfg)] + ([pack_bias(bias, cfg)] if ep and ep[0][0] == "bias" else [])
        got, _ = op.run(*args)
        np.testing.assert_array_equal(unpack(got), ref_depthwise(x, k, bias, 1, 1, ep))


def test_errors():
    """Workloads the template does not implement are refusals; bad knobs are knob errors; a wrong
    number of packed inputs is a usage error."""
    for wl, match in ((DepthwiseConv2dWorkload(1, 24, 8, 8, 3, 3, 1, 1, 1, 1), "BLOCK_OUT"),
                      (DepthwiseConv2dWorkload(1, 16, 8, 1000, 3, 3, 1, 1, 1, 1), "accumulator"),
                      (DepthwiseConv2dWorkload(1, 16, 8, 8, 3, 3, 16, 16, 1, 1), "pad")):
        with pytest.raises(AluTemplateRefusal, match=match) as err:
            build_depthwise_conv2d("default", wl)
        assert isinstance(err.value, TemplateRefusal)
    wl = DepthwiseConv2dWorkload(1, 16, 8, 8, 3, 3, 1, 1, 1, 1)
    for knobs, match in ((dict(slots=0), "slots=0; valid values: 1, 2"), ("auto", "valid names: fallback, tps"),
                         (dict(tile_h=0), "tile_h=0 must be None")):
        with pytest.raises(KnobError, match=match):
            build_depthwise_conv2d("default", wl, (), knobs)
    op = build_depthwise_conv2d("default", DepthwiseConv2dWorkload(1, 16, 8, 8, 3, 3, 1, 1, 1, 1),
                                EPILOGUE)
    with pytest.raises(AluTemplateError, match="expected 3"):
        op.run(np.zeros((1, 1, 8, 8, 1, 16), np.int8), np.zeros((1, 3, 3, 1, 16), np.int8))
