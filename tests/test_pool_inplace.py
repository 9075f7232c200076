"""The in-place max-pool schedule (vta_ext.templates.pool, schedule="inplace") and its choice
under csp-relaxed (tvm_csp_embed.pool); its bit-exactness on the separable schedule's cases is
test_pool_separable.test_separable_max_pool_is_bit_exact. The lean average pool (the
power-of-two division, the int8 clip dropped).

References: a window-by-window numpy max pool (test_template_pool.ref_pool), the llvm build, the
functional simulator's refusal of a program that breaks the hazard contract, and pass / STORE
counts computed here by hand from the schedule's definition (height in place per output row and
input column with data, then the width in place: ``pool_w - 1`` MAX per output; a STORE per
output, or per output row with stride 1), read back from the emitted program.
"""
import dataclasses

import numpy as np
import pytest

import tvm_csp_embed  # noqa: F401 -- registers csp-relaxed's max-pool template
import vta_ext
from conftest import pack_activation as pack, unpack_nchw as unpack
from test_ceil_pool import _pool_module
from test_pool_separable import _on, alu_iterations, fills
from test_template_pool import ref_pool
from vta_ext.config import load_config
from vta_ext.floor import OperatorSize, operator_floor
from vta_ext.isa import MemInsn, Opcode
from vta_ext.sim.cycles import CycleModel
from vta_ext.templates.errors import AluTemplateRefusal
from vta_ext.templates.pool import PoolWorkload, build_avg_pool2d, build_max_pool2d


def stores(program):
    """``x_size * y_size`` of each STORE."""
    return [i.x_size * i.y_size for i in program.insns
            if isinstance(i, MemInsn) and i.opcode == Opcode.STORE and i.x_size]


@pytest.mark.parametrize("knobs", [None, dict(tile_h=2), dict(tile_h=1, slots=1)])
def test_pass_and_store_counts_by_hand(knobs):
    """1x16x9x9 3x3 s2 p1: 5x5 outputs of one channel block. The height, 2 MAX per (output row,
    data column) = 2*5*9 = 90; the width, 2 MAX per output = 50: 140 vector micro-op iterations
    (the separable schedule's 165 less one per output), no fill, and 25 STOREs of one output
    (stride 2: the outputs are two accumulator rows apart), whatever the tiling."""
    cfg = load_config("default")
    wl = PoolWorkload(1, 16, 9, 9, 3, 3, 2, 2, 1, 1)
    op = build_max_pool2d(cfg, wl, (), knobs, schedule="inplace")
    assert alu_iterations(op.program) == {("MAX", False): 140}
    assert op.info["vector_passes"] == 140
    assert fills(op.program) == []
    assert stores(op.program) == [1] * 25


def test_stride_one_stores_whole_rows():
    """googlenet's 3x3 s1 p1 on 1x32x6x6: per channel block 2*6*6 = 72 along the height and
    2*36 = 72 along the width (288 in all); the outputs of a row are adjacent: 12 STOREs of 6."""
    cfg = load_config("default")
    wl = PoolWorkload(1, 32, 6, 6, 3, 3, 1, 1, 1, 1)
    op = build_max_pool2d(cfg, wl, (), None, schedule="inplace")
    assert alu_iterations(op.program) == {("MAX", False): 288}
    assert stores(op.program) == [6] * 12


def test_squeezenet_pool_meets_the_floor_compute():
    """squeezenet1_1's first pool at 112, 1x64x55x55 3x3 s2 p0 (27x27 outputs, 55 columns read):
    4 blocks x (2*27*55 + 2*27*27) = 17,712 vector passes, 2 cycles each on ``pipelined``: the
    floor's ALU term (35,424); the program is faster than the separable one on the cycle model."""
    cfg = load_config("pipelined")
    wl = PoolWorkload(1, 64, 55, 55, 3, 3, 2, 2, 0, 0)
    op = build_max_pool2d(cfg, wl, (), None, schedule="inplace")
    assert op.info["vector_passes"] == 4 * (2 * 27 * 55 + 2 * 27 * 27) == 17712
    size = OperatorSize("max_pool2d", 0, 64 * 27 * 27, 64 * 55 * 55, channels=64, taps=9,
                        window=(3, 3, 27, 27, 55))
    assert operator_floor(cfg, size).compute_alu == 17712 * 2
    sep = build_max_pool2d(cfg, wl, (), None, schedule="separable")
    model = CycleModel(cfg)
    assert (model.run_program(op.program).total_cycles
            < model.run_program(sep.program).total_cycles)


def test_without_ext_pad_min_an_unpadded_pool_runs_in_place():
    """apache has no EXT_PAD_MIN: the separable schedule refuses, the in-place one runs an
    unpadded pool (bit-exact) in 2*4*9 + 2*16 = 104 passes against the direct 8*16 = 128."""
    cfg = load_config("apache")
    wl = PoolWorkload(1, 16, 9, 9, 3, 3, 2, 2, 0, 0)
    x = np.random.default_rng(5).integers(-128, 128, (1, 16, 9, 9)).astype(np.int8)
    with pytest.raises(AluTemplateRefusal, match="EXT_PAD_MIN"):
        build_max_pool2d(cfg, wl, (), None, schedule="separable")
    op = build_max_pool2d(cfg, wl, (), None, schedule="inplace")
    np.testing.assert_array_equal(unpack(op.run(pack(x, cfg))[0]), ref_pool(x, wl, "max"))
    assert alu_iterations(op.program) == {("MAX", False): 104}


def test_the_in_place_passes_keep_their_order_under_a_hazard_distance():
    """An ALU hazard distance of 3 (the Pynq design's): the runtime's cure must not reorder the
    in-place passes (their sources are rows they write); the simulator refuses any program that
    breaks the contract, and the output is still the numpy max pool."""
    cfg = dataclasses.replace(load_config("default"), ACC_DEP_DISTANCE_ALU=3)
    for stride in (1, 2):
        wl = PoolWorkload(1, 16, 9, 9, 3, 3, stride, stride, 1, 1)
        x = np.random.default_rng(stride).integers(-128, 128, (1, 16, 9, 9)).astype(np.int8)
        op = build_max_pool2d(cfg, wl, (), None, schedule="inplace")
        np.testing.assert_array_equal(unpack(op.run(pack(x, cfg))[0]), ref_pool(x, wl, "max"))


def test_refusals():
    wl = PoolWorkload(1, 16, 8, 8, 3, 3, 2, 2, 0, 0)
    with pytest.raises(AluTemplateRefusal, match="epilogue runs on dense rows"):
        build_max_pool2d("default", wl, (("shr", 1),), None, schedule="inplace")
    from vta_ext.templates.pool import _build_pool
    with pytest.raises(AluTemplateRefusal, match="average pool keeps the direct"):
        _build_pool(load_config("default"), wl, (), None, "avg", "inplace")


@pytest.mark.parametrize("preset", ["default", "pipelined"])
def test_csp_relaxed_runs_squeezenets_pool_in_place(preset):
    """relax.build under csp-relaxed: squeezenet's ceil-mode 3x3 s2 pool of a 27x27 input (13x13
    outputs) runs the variant the cycle model times fastest, here the in-place one (timed below
    against every other variant), bit-exact against llvm and numpy."""
    cfg = load_config(preset)
    wl = PoolWorkload(1, 32, 27, 27, 3, 3, 2, 2, 0, 0)
    model = CycleModel(cfg)
    timed = {(s, p): model.run_program(build_max_pool2d(cfg, wl, (), "cycles", schedule=s,
                                                        input_path=p, lean=True)
                                       .program).total_cycles
             for s in ("direct", "separable", "inplace") for p in ("acc8", "gemm")}
    assert min(timed, key=timed.get) == ("inplace", "acc8"), timed
    x = np.random.default_rng(13).integers(-128, 128, (1, 32, 27, 27)).astype(np.int8)
    with vta_ext.build_options(strategy="csp-relaxed"):
        got, ref, report = _on(preset, _pool_module(x.shape, 3, 2, 0, True), x)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got, ref_pool(x, wl, "max"))
    (op,) = report.on_vta
    assert op.plan == "csp-relaxed in-place max pool", (op.plan, op.detail)
    assert f"fewest cycles on the cycle model: {timed['inplace', 'acc8']:,} cycles" in op.detail
    assert report.cycles(op) >= report.floor(op).structural


# ------------------------------------------------------------ average pools: power-of-two divisors
def _alu_kinds(program):
    return alu_iterations(program)


@pytest.mark.parametrize("preset", ["default", "pipelined"])
@pytest.mark.parametrize("c,h,pool,stride,pad,cip,epilogue", [
    (32, 8, 2, 2, 0, False, (("clip", -128, 127),)),   # DenseNet's transition pool
    (16, 9, 4, 4, 0, False, (("shr", 1),)),             # d = 16, an epilogue after it
    (16, 8, 2, 2, 1, True, ()),                         # padding counted: d = 4 everywhere
])
@pytest.mark.parametrize("path", ["acc8", "gemm"])
def test_power_of_two_average_is_bit_exact(preset, c, h, pool, stride, pad, cip, epilogue, path):
    """The truncating division by 2**k as ``(s + (d-1)*[s<0]) >> k`` against numpy (the sums
    of -128s and of 127s included: the extremes of the bias)."""
    cfg = load_config(preset)
    wl = PoolWorkload(1, c, h, h, pool, pool, stride, stride, pad, pad, cip)
    x = np.random.default_rng(c + h).integers(-128, 128, (1, c, h, h)).astype(np.int8)
    x[0, 0], x[0, 1] = -128, 127
    x[0, 2, ::2] = -1                                  # sums just below zero: -1 / d truncates to 0
    op = build_avg_pool2d(cfg, wl, epilogue, None, input_path=path, lean=True)
    np.testing.assert_array_equal(unpack(op.run(pack(x, cfg))[0]), ref_pool(x, wl, "avg", epilogue))
    assert op.info["division"]["pow2"] == pool * pool


def test_power_of_two_division_counts_by_hand():
    """1x16x8x8 2x2 s2 (16 outputs of one block), d = 4, LOAD ACC_8BIT inputs: per output the
    first window element's copy (MUL imm 0, ADD), 3 window ADDs, then the division: the copy
    into the scratch (MUL imm 0, ADD), SHR 31, MUL imm -3, ADD, SHR 2. MUL imm 3 x 16, ADD
    (1 + 3 + 1 + 1) x 16, SHR 2 x 16; the int8 clip is dropped (no CLIP / MIN / MAX)."""
    cfg = load_config("default")
    wl = PoolWorkload(1, 16, 8, 8, 2, 2, 2, 2, 0, 0)
    op = build_avg_pool2d(cfg, wl, (("clip", -128, 127),), None, lean=True)
    assert _alu_kinds(op.program) == {("MUL", True): 3 * 16, ("ADD", False): 6 * 16,
                                      ("SHR", True): 2 * 16}
    assert op.info["dropped_stages"] == [["clip", -128, 127]]


def test_a_narrower_clip_is_kept():
    """A clip inside the int8 range changes values: it stays, and the output is numpy's."""
    cfg = load_config("pipelined")
    wl = PoolWorkload(1, 16, 8, 8, 2, 2, 2, 2, 0, 0)
    x = np.random.default_rng(2).integers(-128, 128, (1, 16, 8, 8)).astype(np.int8)
    ep = (("clip", -128, 126), ("clip", -20, 20))
    op = build_avg_pool2d(cfg, wl, ep, None, lean=True)
    np.testing.assert_array_equal(unpack(op.run(pack(x, cfg))[0]), ref_pool(x, wl, "avg", ep))
    assert "dropped_stages" not in op.info
    mx = build_max_pool2d(cfg, wl, (("clip", -128, 127),), None, schedule="inplace", lean=True)
    assert mx.info["dropped_stages"] == [["clip", -128, 127]]   # the in-place schedule takes it
    np.testing.assert_array_equal(unpack(mx.run(pack(x, cfg))[0]), ref_pool(x, wl, "max"))


def test_the_stock_program_keeps_the_general_division_and_the_clip():
    """Without ``lean`` (the stock strategy's program) the 2x2 average divides by the general
    sequence (a MUL imm by the multiplier, SHR by k) and clips: the original program."""
    cfg = load_config("default")
    wl = PoolWorkload(1, 16, 8, 8, 2, 2, 2, 2, 0, 0)
    op = build_avg_pool2d(cfg, wl, (("clip", -128, 127),), None)
    assert "pow2" not in op.info["division"] and "dropped_stages" not in op.info
    assert ("CLIP", True) in alu_iterations(op.program)


@pytest.mark.parametrize("preset", ["default", "pipelined"])
def test_csp_relaxed_average_pool_is_lean_and_bit_exact(preset):
    """relax.build of DenseNet's 2x2 s2 transition pool (an int8 clip after it) under
    csp-relaxed: bit-exact against llvm and numpy, and its program divides by the power of two
    with the clip dropped; the stock strategy's program keeps both (same output)."""
    from vta_ext import executor
    from test_identity_input import _avg_module

    x = np.random.default_rng(21).integers(-128, 128, (1, 32, 14, 14)).astype(np.int8)
    wl = PoolWorkload(1, 32, 14, 14, 2, 2, 2, 2, 0, 0)
    infos = {}
    for strategy in ("csp-relaxed", "stock"):
        with vta_ext.build_options(strategy=strategy):
            got, ref, report = _on(preset, _avg_module(x.shape, 2, 2, 0), x)
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(got, ref_pool(x, wl, "avg"))
        (op,) = report.on_vta
        infos[strategy] = executor.compiled_op(report.key_of(op)).info
    assert infos["csp-relaxed"]["division"]["pow2"] == 4
    assert infos["csp-relaxed"]["dropped_stages"] == [["clip", -128, 127]]
    assert "pow2" not in infos["stock"]["division"] and "dropped_stages" not in infos["stock"]
