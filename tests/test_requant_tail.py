"""The fixed-point requantisation tail on VTA: ``core -> bias -> >> s1 -> * M -> + 2**(k-1) -> >> k
-> clip -> int8`` with ``M`` a scalar (MUL immediate) or one per output channel (MUL vector from
the accumulator), the int32 overflow proof, and the rounding add split around the shift.

References: numpy in Python / int64 integers with the int32 wrap applied per stage (the ALU's
semantics, written out here independently of the templates), hand-computed intervals, and the
llvm build of the same Relax module. Network placement is asserted from the build report.
"""
from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from conftest import conv2d_nchw, pack_matrix, pack_nchw, unpack_matrix, unpack_nchw, vta_and_llvm
from vta_ext.config import load_config
from vta_ext.isa import AluOp, Opcode
from vta_ext.templates.epilogue import (alu_ops, epilogue_range, fit_immediates,
                                        normalize_epilogue)
from vta_ext.templates.errors import EpilogueRefusal

I32 = 2 ** 31


def wrap32(x):
    return (np.asarray(x, np.int64) + I32) % (2 * I32) - I32


def ref_epilogue(acc, epilogue, vectors):
    """Each stage in int64, wrapped to int32 after it (the ALU's wrapping arithmetic); then the
    truncating int8 store. ``vectors``: {"bias": b, "mulv": m} broadcastable to ``acc``."""
    x = wrap32(acc)
    for st in epilogue:
        if st[0] == "bias":
            x = x + vectors["bias"]
        elif st[0] == "mulv":
            x = x * vectors["mulv"]
        elif st[0] == "mul":
            x = x * st[1]
        elif st[0] == "add":
            x = x + st[1]
        elif st[0] == "shr":
            x = x >> st[1]
        elif st[0] == "clip":
            x = np.clip(x, st[1], st[2])
        else:
            raise ValueError(st)
        x = wrap32(x)
    return x.astype(np.int8)


# ------------------------------------------------------------------ the epilogue grammar
def test_mul_stages_and_their_alu_form():
    cfg = load_config("default")
    ep = normalize_epilogue([("bias",), ("shr", 3), "mulv", ("mul", 1234), ("add", 7)])
    assert ep == (("bias",), ("shr", 3), ("mulv",), ("mul", 1234), ("add", 7))
    assert alu_ops(cfg, ("mul", 1234)) == [(AluOp.MUL, 1234)]
    with pytest.raises(EpilogueRefusal, match="16-bit"):
        normalize_epilogue([("mul", 40000)])
    with pytest.raises(EpilogueRefusal, match="at most one \\('mulv',\\)"):
        normalize_epilogue(["mulv", "mulv"])


@pytest.mark.parametrize("k", [1, 5, 15, 16, 20, 24, 31])
def test_fit_immediates_splits_the_rounding_add_exactly(k):
    ep = (("add", 1 << (k - 1)), ("shr", k), ("clip", -128, 127))
    fitted = fit_immediates(ep)
    normalize_epilogue(fitted)  # every immediate fits now
    if (1 << (k - 1)) <= 32767:
        assert fitted == ep
    else:
        a = k - 15
        assert fitted[:3] == (("shr", a), ("add", 1 << 14), ("shr", 15)) and fitted[3] == ep[2]
    rng = np.random.default_rng(k)
    top = I32 - 1 - (1 << (k - 1))  # the largest x whose rounding add does not overflow
    ties = (np.arange(-4, 4)[:, None] * (1 << (k - 1)) + np.arange(-1, 2)).ravel()
    x = np.concatenate([rng.integers(-I32, top + 1, 20000), [-I32, -1, 0, 1, top],
                        ties[(ties >= -I32) & (ties <= top)]]).astype(np.int64)
    expected = np.clip((x + (1 << (k - 1))) >> k, -128, 127)  # exact, in int64
    np.testing.assert_array_equal(ref_epilogue(x, fitted, {}), expected.astype(np.int8))


def test_fit_immediates_leaves_what_it_cannot_split():
    assert fit_immediates((("add", 40001), ("shr", 20))) == (("add", 40001), ("shr", 20))  # odd
    assert fit_immediates((("add", 1 << 20),)) == (("add", 1 << 20),)  # no shift follows


def test_epilogue_range_hand_computed():
    lo, hi = epilogue_range((("bias",), ("shr", 2), ("mulv",), ("add", 8), ("shr", 4)),
                            np.array([-100, -1000]), np.array([100, 1000]),
                            bias=np.array([3, -5]), multiplier=np.array([7, -2]))
    # ch0: [-97, 103] >> 2 = [-25, 25]; * 7 = [-175, 175]; + 8 = [-167, 183]; >> 4 = [-11, 11]
    # ch1: [-1005, 995] >> 2 = [-252, 248]; * -2 = [-496, 504]; + 8 = [-488, 512]; >> 4 = [-31, 32]
    assert lo.tolist() == [-11, -31] and hi.tolist() == [11, 32]
    with pytest.raises(EpilogueRefusal, match=r"\('mul', 2\).*outside int32.*wraps"):
        epilogue_range((("mul", 2),), -(1 << 30), 1 << 30)
    # the exact bound is accepted: 2**30 - 1 times 2 is INT32_MAX - 1
    assert epilogue_range((("mul", 2),), -(1 << 30), (1 << 30) - 1)[1] == 2 ** 31 - 2


# ------------------------------------------------------------------ templates
def _conv_case(cfg, ep, seed=0, c=32, o=32, hw=6, mult_hi=20000):
    from vta_ext.templates.conv2d import build_conv2d
    from vta_ext.templates.workload import Conv2dWorkload

    rng = np.random.default_rng(seed)
    B, BI, BO = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    x = rng.integers(-128, 128, (B, c, hw, hw)).astype(np.int8)
    w = rng.integers(-128, 128, (o, c, 3, 3)).astype(np.int8)
    b = rng.integers(-5000, 5000, (1, o, 1, 1)).astype(np.int32)
    m = rng.integers(1, mult_hi, (1, o, 1, 1)).astype(np.int32)
    conv = build_conv2d(cfg, Conv2dWorkload(B, hw, hw, c, o, 3, 3, 1, 1, 1, 1), ep)
    kp = np.ascontiguousarray(w.reshape(o // BO, BO, c // BI, BI, 3, 3).transpose(0, 2, 4, 5, 1, 3))
    vec = {"bias": pack_nchw(np.broadcast_to(b, (B, o, 1, 1)), B, BO),
           "mulv": pack_nchw(np.broadcast_to(m, (B, o, 1, 1)), B, BO)}
    args = [vec[k] for k in ("bias", "mulv") if any(st[0] == k for st in ep)]
    out, _ = conv.run(pack_nchw(x, B, BI), kp, *args)
    acc = conv2d_nchw(x, w, 1, 1)
    return conv, unpack_nchw(out), ref_epilogue(acc, ep, {"bias": b, "mulv": m})


PT2E_CHANNEL = (("bias",), ("shr", 2), ("mulv",), ("shr", 8), ("add", 1 << 14), ("shr", 15),
                ("clip", -128, 127))


@pytest.mark.parametrize("preset", ["default", "apache"])
def test_conv2d_per_channel_multiplier(preset):
    cfg = load_config(preset)
    conv, got, ref = _conv_case(cfg, PT2E_CHANNEL)
    np.testing.assert_array_equal(got, ref)
    assert len(np.unique(ref)) > 60  # the data spans the int8 range, not a saturated constant
    alu = [(i.alu_opcode, bool(i.use_imm)) for i in conv.program.insns if i.opcode == Opcode.ALU]
    assert (AluOp.MUL, False) in alu  # the per-channel multiply is a vector MUL
    assert set(conv.shapes) >= {"bias", "mult"}


def test_conv2d_multiplier_without_bias_and_wrapping():
    """Only a multiplier (the third run argument), and products that do wrap: the template
    executes the ALU's modulo-2**32 arithmetic (the offload pass refuses such epilogues; the
    template itself is the ALU)."""
    cfg = load_config("default")
    ep = (("mulv",), ("shr", 20), ("clip", -128, 127))
    _, got, ref = _conv_case(cfg, ep, seed=3, mult_hi=30000)
    np.testing.assert_array_equal(got, ref)
    _, got, ref = _conv_case(cfg, (("mul", 32767), ("shr", 16)), seed=4)
    np.testing.assert_array_equal(got, ref)


def test_dense_per_channel_multiplier():
    from vta_ext.templates.dense import DenseWorkload, build_dense

    cfg = load_config("default")
    B, BI, BO = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    rng = np.random.default_rng(5)
    n, k, mo = B, 64, 32
    x = rng.integers(-128, 128, (n, k)).astype(np.int8)
    w = rng.integers(-128, 128, (mo, k)).astype(np.int8)
    b = rng.integers(-3000, 3000, mo).astype(np.int32)
    m = rng.integers(1, 30000, mo).astype(np.int32)
    dense = build_dense(cfg, DenseWorkload(n, k, mo), PT2E_CHANNEL)
    vec = lambda v: pack_matrix(np.broadcast_to(v, (B, mo)).astype(np.int32), B, BO)[:1]  # noqa
    out, _ = dense.run(pack_matrix(x, B, BI), pack_matrix(w, BO, BI), vec(b), vec(m))
    acc = x.astype(np.int64) @ w.astype(np.int64).T
    np.testing.assert_array_equal(unpack_matrix(out), ref_epilogue(acc, PT2E_CHANNEL,
                                                                   {"bias": b, "mulv": m}))


def test_depthwise_per_channel_multiplier():
    from conftest import pack_activation
    from vta_ext.templates.depthwise import DepthwiseConv2dWorkload, build_depthwise_conv2d

    cfg = load_config("default")
    B, BO = cfg.BATCH, cfg.BLOCK_OUT
    rng = np.random.default_rng(6)
    c, hw = 32, 7
    x = rng.integers(-128, 128, (B, c, hw, hw)).astype(np.int8)
    k = rng.integers(-128, 128, (c, 3, 3)).astype(np.int8)
    b = rng.integers(-3000, 3000, c).astype(np.int32)
    m = rng.integers(1, 30000, c).astype(np.int32)
    op = build_depthwise_conv2d(cfg, DepthwiseConv2dWorkload(B, c, hw, hw, 3, 3, 1, 1, 1, 1),
                                PT2E_CHANNEL, dict(tile_h=3, tile_c=1))
    kp = np.ascontiguousarray(np.broadcast_to(
        k.reshape(c // BO, BO, 3, 3).transpose(0, 2, 3, 1)[:, :, :, None, :], (c // BO, 3, 3, B, BO)))
    vec = lambda v: np.ascontiguousarray(np.broadcast_to(  # noqa: E731
        v.reshape(1, -1, 1, 1, 1, BO), (1, c // BO, 1, 1, B, BO)))
    out, _ = op.run(pack_activation(x, cfg), kp, vec(b), vec(m))
    acc = conv2d_nchw(x, k[:, None], 1, 1, groups=c)
    ref = ref_epilogue(acc, PT2E_CHANNEL, {"bias": b.reshape(1, -1, 1, 1),
                                           "mulv": m.reshape(1, -1, 1, 1)})
    np.testing.assert_array_equal(unpack_nchw(out), ref)
    assert op.info["tiles"] >= 3


# ------------------------------------------------------------------ the offload pass
def _tail_module(x_shape, weight, bias, mult, s1, k, pool=False):
    """conv2d (or avg_pool2d) -> [+ bias] -> [+ 2**(s1-1), >> s1] -> * mult -> + 2**(k-1) -> >> k
    -> clip -> int8, as the quantiser emits a PT2E / QDQ layer."""
    x = relax.Var("x", relax.TensorType(x_shape, "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if pool:
                x32 = bb.emit(relax.op.astype(x, "int32"))
                acc = bb.emit(relax.op.nn.avg_pool2d(x32, pool_size=2, strides=2))
                acc = bb.emit(relax.op.astype(acc, "int32"))  # TVM's int64 legalisation
            else:
                acc = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), padding=1,
                                                 out_dtype="int32"), name_hint="conv")
            if bias is not None:
                acc = bb.emit(relax.op.add(acc, relax.const(bias)))
            if s1:
                acc = bb.emit(relax.op.add(acc, relax.const(1 << (s1 - 1), "int32")))
                acc = bb.emit(relax.op.right_shift(acc, relax.const(s1, "int32")))
            m = relax.const(mult) if np.ndim(mult) else relax.const(int(mult), "int32")
            acc = bb.emit(relax.op.multiply(acc, m))
            acc = bb.emit(relax.op.add(acc, relax.const(1 << (k - 1), "int32")))
            acc = bb.emit(relax.op.right_shift(acc, relax.const(k, "int32")))
            acc = bb.emit(relax.op.clip(acc, -128, 127))
            out = bb.emit_output(relax.op.astype(acc, "int8"))
        bb.emit_func_output(out)
    return bb.get()


def _bound_case(per_channel, slack):
    """All weights 127 over 16 channels x 3x3: |acc| <= 128 * 127 * 144 = 2,340,864; after
    ``+ bias`` and ``>> 4`` the largest magnitude is V; M = floor((2**31 - 1 - 2**(k-1)) / V)
    + slack is the largest multiplier that cannot overflow (slack 0) or the smallest that can."""
    c, o, k = 16, 32, 20
    w = np.full((o, c, 3, 3), 127, np.int8)
    w[1::2] = -127
    bias = (np.arange(o, dtype=np.int32) - o // 2) * 3
    s1 = 4
    lo = -128 * 127 * 9 * c + bias.astype(np.int64)
    hi = 127 * 127 * 9 * c + bias.astype(np.int64)
    neg = w[:, 0, 0, 0] < 0  # a negative weight maps x = -128 to the largest sum
    lo, hi = np.where(neg, -127 * 127 * 9 * c, lo - bias) + bias, \
        np.where(neg, 128 * 127 * 9 * c, hi - bias) + bias
    v = np.maximum(np.abs((lo + 8) >> s1), np.abs((hi + 8) >> s1))
    m_max = (2 ** 31 - 1 - (1 << (k - 1))) // v  # per channel
    if per_channel:
        mult = (m_max + slack).astype(np.int32).reshape(1, o, 1, 1)
    else:
        mult = np.int32(m_max.min() + slack)
    return w, bias.reshape(1, o, 1, 1), mult, s1, k, c


@pytest.mark.parametrize("per_channel", [False, True])
def test_offload_pt2e_tail_at_the_int32_bound(per_channel):
    """The largest multipliers the overflow proof admits: on VTA, and bit-exact against llvm and
    against int64 numpy at the inputs that reach the bound (x = 127 and x = -128 everywhere)."""
    w, bias, mult, s1, k, c = _bound_case(per_channel, 0)
    mod = _tail_module((1, c, 5, 5), w, bias, mult, s1, k)
    for fill in (127, -128, None):
        x = (np.full((1, c, 5, 5), fill, np.int8) if fill is not None else
             np.random.default_rng(1).integers(-128, 128, (1, c, 5, 5)).astype(np.int8))
        got, ref, report = vta_and_llvm(mod, [x])
        np.testing.assert_array_equal(got, ref)
        acc = conv2d_nchw(x, w, 1, 1) + bias
        exact = np.clip(((((acc + 8) >> s1) * np.asarray(mult, np.int64)) + (1 << k - 1)) >> k,
                        -128, 127)
        np.testing.assert_array_equal(got, exact)
        assert report.devices("relax.nn.conv2d") == ["vta"]
        (p,) = report.on_vta
        assert ("mulv" if per_channel else "+mul+") in p.detail
    assert len(np.unique(got)) > 10


@pytest.mark.parametrize("per_channel", [False, True])
def test_offload_refuses_a_multiplier_that_could_overflow(per_channel):
    w, bias, mult, s1, k, c = _bound_case(per_channel, 1)
    mod = _tail_module((1, c, 5, 5), w, bias, mult, s1, k)
    x = np.random.default_rng(2).integers(-128, 128, (1, c, 5, 5)).astype(np.int8)
    got, ref, report = vta_and_llvm(mod, [x])
    np.testing.assert_array_equal(got, ref)
    assert report.devices("relax.nn.conv2d") == ["cpu"] and not report.on_vta
    (p,) = [p for p in report.on_cpu if p.op == "relax.nn.conv2d"]
    assert "outside int32" in p.reason and "wraps" in p.reason and "mul" in p.reason


def test_offload_large_scalar_multiplier_becomes_a_vector():
    """A per-tensor M beyond the 16-bit immediate is multiplied as a per-channel vector."""
    rng = np.random.default_rng(3)
    w = rng.integers(-1, 2, (16, 16, 3, 3)).astype(np.int8)  # |acc| <= 128 * 144: no overflow
    mod = _tail_module((1, 16, 6, 6), w, None, np.int32(70001), 0, 24)
    x = rng.integers(-128, 128, (1, 16, 6, 6)).astype(np.int8)
    got, ref, report = vta_and_llvm(mod, [x])
    np.testing.assert_array_equal(got, ref)
    assert len(np.unique(got)) > 10
    (p,) = report.on_vta
    assert "epilogue mulv+shr+add+shr+clip" in p.detail


def test_offload_avg_pool_with_int32_cast_and_multiplier():
    mod = _tail_module((1, 16, 8, 8), None, None, np.int32(23456), 0, 15, pool=True)
    x = np.random.default_rng(4).integers(-128, 128, (1, 16, 8, 8)).astype(np.int8)
    got, ref, report = vta_and_llvm(mod, [x])
    np.testing.assert_array_equal(got, ref)
    assert report.devices("relax.nn.avg_pool2d") == ["vta"]
    assert len(np.unique(got)) > 10
