"""Hardswish and the standalone int8 clip on the VTA ALU.

The integer hardswish of the quantiser (``vta_ext/quantize/emit.py``) is
``clip((x * clip(x + t3, 0, t_max) * M + 2**(k-1)) >> k, -128, 127)``; on VTA it is one ALU
program (ADD imm, CLIP or MIN/MAX, MUL vector, then the epilogue). References: numpy in int64
over every int8 input value, and the llvm build of the same Relax module; placement from the
build report.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from tvm import relax

from conftest import pack_activation, unpack_nchw, vta_and_llvm
from vta_ext.config import load_config
from vta_ext.isa import AluOp, Opcode
from vta_ext.templates.eltwise import EltwiseWorkload, HswishWorkload, build_hswish, build_unary
from vta_ext.templates.errors import EpilogueRefusal

ALL_INT8 = np.arange(-128, 128, dtype=np.int8).reshape(1, 16, 4, 4)  # every value once


def ref_hswish(x, three, t_max, m, k):
    x = x.astype(np.int64)
    y = (x * np.clip(x + three, 0, t_max) * m + (1 << (k - 1))) >> k
    return np.clip(y, -128, 127).astype(np.int8)


# (three, t_max, M, k): power-of-two input scales (t_max = 2 * three, above int8: MIN + MAX) and
# the t_max = 127 + three case of a coarse scale, as _hswish_constants makes them
CASES = [(192, 319, 21845, 23), (384, 511, 21845, 24), (24, 48, 21845, 17), (96, 192, 10923, 20)]


@pytest.mark.parametrize("preset", ["default", "apache"])
@pytest.mark.parametrize("three,t_max,m,k", CASES)
def test_hswish_template_every_int8_value(preset, three, t_max, m, k):
    cfg = load_config(preset)
    x = np.concatenate([ALL_INT8] * cfg.BATCH)
    ep = (("mul", m), ("shr", k - 15), ("add", 1 << 14), ("shr", 15), ("clip", -128, 127))
    op = build_hswish(cfg, HswishWorkload(cfg.BATCH, 16, 4, 4, three, 0, t_max), ep)
    got, _ = op.run(pack_activation(x, cfg))
    ref = ref_hswish(x, three, t_max, m, k)
    np.testing.assert_array_equal(unpack_nchw(got), ref)
    assert len(np.unique(ref)) > 20
    alu = [i.alu_opcode for i in op.program.insns if i.opcode == Opcode.ALU]
    assert AluOp.MUL in alu and (AluOp.MIN in alu) == (t_max > 127 or not cfg.EXT_CLIP)


def test_hswish_template_refuses_immediates_beyond_int16():
    with pytest.raises(EpilogueRefusal, match="16-bit"):
        build_hswish("default", HswishWorkload(1, 16, 2, 2, 40000, 0, 80000), ())


def _hswish_module(shape, three, t_max, m, k):
    x = relax.Var("x", relax.TensorType(shape, "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            x32 = bb.emit(relax.op.astype(x, "int32"))
            t = bb.emit(relax.op.add(x32, relax.const(three, "int32")))
            t = bb.emit(relax.op.clip(t, 0, t_max))
            p = bb.emit(relax.op.multiply(x32, t), name_hint="prod")
            p = bb.emit(relax.op.multiply(p, relax.const(m, "int32")))
            p = bb.emit(relax.op.add(p, relax.const(1 << (k - 1), "int32")))
            p = bb.emit(relax.op.right_shift(p, relax.const(k, "int32")))
            p = bb.emit(relax.op.clip(p, -128, 127))
            out = bb.emit_output(relax.op.astype(p, "int8"))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("three,t_max,m,k", CASES[:2])
def test_hswish_offload_every_int8_value(three, t_max, m, k):
    got, ref, report = vta_and_llvm(_hswish_module(ALL_INT8.shape, three, t_max, m, k), [ALL_INT8])
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got, ref_hswish(ALL_INT8, three, t_max, m, k))
    assert report.placement() == [("relax.multiply", "vta")]
    (p,) = report.on_vta
    assert p.reason.startswith("hswish") and f"x*clip(x+{three}, 0, {t_max})" in p.detail


def test_hswish_offload_refuses_a_product_that_could_overflow():
    """x * t <= 127 * 511 (t = clip(x + 384, 0, 511) >= 256 for every int8 x, so the negative
    side is -128 * 511 * M >= -2**31), and 127 * 511 * 32767 + 2**26 > 2**31 - 1: the rounding
    add can overflow, the CPU build may differ from VTA's wrapping ALU, so the operator stays on
    the CPU and the report says why. With 2**23 instead (k = 24) it fits: on VTA."""
    got, ref, report = vta_and_llvm(_hswish_module(ALL_INT8.shape, 384, 511, 32767, 27), [ALL_INT8])
    np.testing.assert_array_equal(got, ref)
    assert not report.on_vta
    (p,) = [p for p in report.on_cpu if p.name == "prod"]
    assert "outside int32" in p.reason and "('add', 67108864)" in p.reason
    got, ref, report = vta_and_llvm(_hswish_module(ALL_INT8.shape, 384, 511, 32767, 24), [ALL_INT8])
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got, ref_hswish(ALL_INT8, 384, 511, 32767, 24))
    assert report.placement() == [("relax.multiply", "vta")]


def test_hswish_of_a_quantised_torch_model_on_vta():
    from vta_ext.quantize import quantize_torch

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.Hardswish(),
                          nn.Conv2d(16, 16, 3, padding=1), nn.Hardswish()).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    qm = quantize_torch(model, x)
    (got, *_), (ref, *_), report = vta_and_llvm(qm.mod, [x])
    np.testing.assert_array_equal(got, ref)
    assert len(np.unique(got)) > 20
    assert [p.op for p in report.on_vta] == ["relax.nn.conv2d", "relax.multiply"] * 2
    assert [p.layer.split(" ")[0] for p in report.on_vta] == ["0", "1", "2", "3"]
    # the hardswish hands its packed output straight to the next conv
    assert "input kept in the packed layout" in report.on_vta[2].detail


# ------------------------------------------------------------------ standalone int8 clip
def test_unary_clip_template():
    cfg = load_config("default")
    op = build_unary(cfg, EltwiseWorkload(1, 16, 4, 4), (("clip", 0, 96),))
    got, _ = op.run(pack_activation(ALL_INT8, cfg))
    np.testing.assert_array_equal(unpack_nchw(got), np.clip(ALL_INT8, 0, 96))


@pytest.mark.parametrize("data", [ALL_INT8, ALL_INT8.reshape(1, 256)[:, 100:140].copy()],
                         ids=["nchw", "vector"])
def test_int8_clip_after_a_cpu_operator_on_vta(data):
    """ReLU6 (an int8 clip) whose producer stays on the CPU (an int8 subtract), on an NCHW
    activation and on (N, C) features (seen as (N, C, 1, 1) by the ALU template)."""
    x = relax.Var("x", relax.TensorType(data.shape, "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.subtract(x, relax.const(np.int8(3))))
            out = bb.emit_output(relax.op.clip(y, 0, 96))
        bb.emit_func_output(out)
    got, ref, report = vta_and_llvm(bb.get(), [data])
    np.testing.assert_array_equal(got, ref)
    expected = np.clip((data.astype(np.int16) - 3 + 128) % 256 - 128, 0, 96)  # int8 wraps
    np.testing.assert_array_equal(got, expected)
    assert report.placement() == [("relax.clip", "vta"), ("relax.subtract", "cpu")]


# ------------------------------------------------------------------ (N, C) activations
def test_flat_activation_pack_numpy_element_by_element():
    from vta_ext.packing import FlatActivation

    lay = FlatActivation(n=1, c=20, batch_block=1, channel_block=16)
    x = np.arange(1, 21).reshape(1, 20)
    packed = lay.pack_numpy(x)
    assert packed.shape == lay.shape == (1, 2, 1, 1, 1, 16)
    assert [packed[0, j // 16, 0, 0, 0, j % 16] for j in range(32)] == list(range(1, 21)) + [0] * 12


@pytest.mark.parametrize("three,t_max,m,k", CASES[:1])
def test_hswish_of_a_classifier_vector_on_vta(three, t_max, m, k):
    """MobileNetV3's classifier hardswish acts on (N, C) features: the ALU template sees them as
    (N, C, 1, 1). Every int8 value, 256 features (16 blocks), plus a 20-feature tail block."""
    for shape in [(1, 256), (1, 20)]:
        x = ALL_INT8.reshape(1, 256)[:, :shape[1]].copy()
        got, ref, report = vta_and_llvm(_hswish_module(shape, three, t_max, m, k), [x])
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(got, ref_hswish(x, three, t_max, m, k))
        assert report.placement() == [("relax.multiply", "vta")]
        assert f"1x{shape[1]}x1x1 x*clip(x+{three}" in report.on_vta[0].detail


def test_rank_3_hswish_stays_on_the_cpu_with_the_reason():
    x = np.zeros((1, 16, 4), np.int8)
    got, ref, report = vta_and_llvm(_hswish_module((1, 16, 4), 192, 319, 21845, 23), [x])
    np.testing.assert_array_equal(got, ref)
    assert not report.on_vta
    assert any("rank-3" in p.reason and "(N, C) matrices" in p.reason for p in report.on_cpu)
