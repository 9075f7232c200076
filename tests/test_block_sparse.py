"""Grouped convs of groups that are not whole blocks (RegNetX: 24 channels a group) or exactly one
block (MobileNet's D1-D9: 16) on the GEMM block-sparse program (tvm_csp_embed.blocksparse): its tile grid against a hand count and a dense
block-diagonal mask, its program bit-exact against an independent numpy grouped convolution on
default, pipelined and pynq (fsim) and the pynq RTL, the Relax build against numpy and llvm, and
its micro-op count (7 per tap, pixel and pair of 24-channel groups)."""
from __future__ import annotations

import numpy as np
import pytest

import tvm_csp_embed  # noqa: F401 -- registers the CSP strategies
from conftest import conv2d_nchw, requantize, run_one_call_on
from test_grouped_gemm import PRESETS, case, conv_placement, run, vta_build
from tvm_csp_embed.blocksparse import (BlockSparseWorkload, block_sparse_weight,
                                       build_block_sparse, tile_grid, units)
from tvm_csp_embed.strategy import CspGemmTemplate
from vta_ext.config import load_config
from vta_ext.errors import TemplateRefusal
from vta_ext.isa import GemmInsn

EPILOGUE = (("bias",), ("shr", 8), ("clip", -128, 127))


def mask_tiles(channels, width, block):
    """Per output block, the input blocks where the dense block-diagonal mask of the groups
    (``width`` channels each, ``channels`` padded to whole blocks) has a nonzero entry."""
    cp = -(-channels // block) * block
    g = np.arange(cp) // width
    real = np.arange(cp) < channels
    mask = (g[:, None] == g[None, :]) & real[:, None] & real[None, :]
    tiles = mask.reshape(cp // block, block, cp // block, block).any(axis=(1, 3))
    return [tuple(np.flatnonzero(row)) for row in tiles]


@pytest.mark.parametrize("channels,width", [(48, 24), (72, 24), (168, 24), (912, 24), (120, 40),
                                            (36, 12), (60, 20)])
def test_tile_grid_is_the_mask_of_the_groups(channels, width):
    assert tile_grid(channels, width, 16) == mask_tiles(channels, width, 16)


def test_tile_grid_hand_count():
    """Two groups of 24 = 3 blocks: 7 nonzero tiles (all but (0,2) and (2,0)); a third group
    alone in blocks 3 and 4 (channels 48..71): 4 more; units are the pair and the odd group."""
    assert tile_grid(48, 24, 16) == [(0, 1), (0, 1, 2), (1, 2)]
    assert sum(map(len, tile_grid(72, 24, 16))) == 7 + 4
    assert units(tile_grid(72, 24, 16)) == [(0, 3, 0, 3), (3, 2, 3, 2)]


@pytest.mark.parametrize("channels,width", [(72, 24), (48, 24), (60, 20)])
def test_packed_tiles_compute_the_grouped_conv(channels, width):
    """The packed tiles put back at their grid places form a dense weight whose plain conv
    equals the grouped conv (numpy)."""
    rng = np.random.default_rng(channels)
    block = 16
    w = rng.integers(-128, 128, (channels, width, 3, 3)).astype(np.int8)
    x = rng.integers(-128, 128, (1, channels, 6, 6)).astype(np.int8)
    packed = block_sparse_weight(w, block)
    cp = -(-channels // block) * block
    dense = np.zeros((cp, cp, 3, 3), np.int64)
    t = 0
    for o, row in enumerate(tile_grid(channels, width, block)):
        for i in row:
            dense[o * block:(o + 1) * block, i * block:(i + 1) * block] = \
                packed[t].transpose(2, 3, 0, 1)
            t += 1
    assert t == len(packed)
    xp = np.zeros((1, cp, 6, 6), np.int8)
    xp[:, :channels] = x
    got = conv2d_nchw(xp, dense, 1, 1)[:, :channels]
    np.testing.assert_array_equal(got, conv2d_nchw(x, w, 1, 1, groups=channels // width))


def _direct(config, c, hw, stride, width=24, seed=0):
    """(compiled program, packed inputs, numpy reference, unpack) of one layer."""
    cfg = load_config(config)
    rng = np.random.default_rng(seed + c + hw + stride)
    x = rng.integers(-128, 128, (1, c, hw, hw)).astype(np.int8)
    w = rng.integers(-128, 128, (c, width, 3, 3)).astype(np.int8)
    b = rng.integers(-5000, 5000, (c,)).astype(np.int32)
    wl = BlockSparseWorkload(cfg.BATCH, hw, hw, c, c, 3, 3, 1, 1, stride, stride,
                             groups=c // width, group_width=width)
    compiled = build_block_sparse(cfg, wl, EPILOGUE)
    blk, nb = cfg.BLOCK_IN, cfg.BATCH
    cb = -(-c // blk)
    xp = np.zeros((nb, cb * blk, hw, hw), np.int8)
    xp[:1, :c] = x
    data = np.ascontiguousarray(xp.reshape(1, nb, cb, blk, hw, hw).transpose(0, 2, 4, 5, 1, 3))
    bp = np.zeros(cb * blk, np.int32)
    bp[:c] = b
    bias = np.ascontiguousarray(np.broadcast_to(bp.reshape(1, cb, 1, 1, 1, blk),
                                                (1, cb, 1, 1, nb, blk)))
    ref = requantize(conv2d_nchw(x, w, stride, 1, groups=c // width), b.reshape(1, c, 1, 1), 8,
                     (-128, 127))

    def unpack(out):
        oh = out.shape[2]
        return out.transpose(0, 4, 1, 5, 2, 3).reshape(nb, cb * blk, oh, oh)[:1, :c]
    return compiled, (data, block_sparse_weight(w, blk), bias), ref, unpack


#: 3 groups (a pair and the odd group alone at the end), 2 groups; stride 1 and 2
DIRECT = [(72, 8, 1), (72, 9, 2), (48, 7, 2), (48, 6, 1)]


@pytest.mark.parametrize("config", PRESETS)
@pytest.mark.parametrize("c,hw,stride", DIRECT)
def test_program_bit_exact(config, c, hw, stride):
    compiled, inputs, ref, unpack = _direct(config, c, hw, stride)
    out, _ = compiled.run(*inputs)
    np.testing.assert_array_equal(unpack(out), ref)


@pytest.mark.parametrize("c,pairs,odd", [(48, 1, 0), (72, 1, 1), (168, 3, 1)])
def test_micro_ops_per_tap_and_pair(c, pairs, odd):
    """The GEMM micro-ops the program executes (reset excluded) are, per output pixel and tap,
    7 per pair of 24-channel groups and 4 per odd group alone (hand count)."""
    compiled, _, _, _ = _direct("default", c, 8, 1)
    executed = sum((i.uop_end - i.uop_bgn) * i.iter_out * i.iter_in
                   for i in compiled.program.insns if isinstance(i, GemmInsn) and not i.reset_reg)
    assert executed == (7 * pairs + 4 * odd) * 8 * 8 * 9


# ------------------------------------------------------------------------------ Relax build
@pytest.fixture
def sparse_only(monkeypatch):
    """The CSP plan withheld: the block-sparse program runs wherever it builds."""
    def refuse(self, op, config):
        raise TemplateRefusal("the CSP plan withheld by the test")

    monkeypatch.setattr(CspGemmTemplate, "_plan", refuse)


#: (channels, image, groups, stride) of 24-channel groups
RELAX = [(72, 8, 3, 1), (48, 7, 2, 2), (72, 9, 3, 2)]


@pytest.mark.parametrize("config", [pytest.param(c, marks=pytest.mark.slow) if c == "pipelined" else c
                                    for c in PRESETS])
@pytest.mark.parametrize("shape", RELAX, ids=lambda s: "c{}_hw{}_g{}_s{}".format(*s))
def test_relax_bit_exact_block_sparse(config, shape, sparse_only):
    mod, arrays, ref = case(*shape)
    out, report = vta_build(mod, arrays, config)
    np.testing.assert_array_equal(out, ref)
    p = conv_placement(report)
    assert p.device == "vta" and "GEMM block-sparse" in p.plan, str(report)
    assert "GEMM block-sparse (groups of 24 channels" in p.detail
    assert "the CSP plan refused" in p.detail
    if config == "default":
        np.testing.assert_array_equal(run(mod, "llvm", arrays), ref)


def test_choice_names_every_unit():
    """Unwithheld, the choice weighs the CSP plan and the block-sparse program, and the report
    line names both and the refused block-diagonal unit; either way bit-exact."""
    mod, arrays, ref = case(72, 8, 3, 1)
    out, report = vta_build(mod, arrays, "default", "end-to-end")
    np.testing.assert_array_equal(out, ref)
    detail = conv_placement(report).detail
    assert "chosen by csp-relaxed" in detail
    assert "GEMM block-sparse" in detail and "the CSP plan" in detail
    assert "GEMM block-diagonal (groups of 24 channels per 16x16 weight tile) refused" in detail


@pytest.mark.parametrize("shape", [(72, 8, 3, 1), (48, 7, 2, 2)],
                         ids=lambda s: "c{}_hw{}_g{}_s{}".format(*s))
def test_pynq_rtl_bit_exact(rtl, shape, sparse_only):
    import tvm
    from tvm import relax

    import vta_ext

    mod, arrays, ref = case(*shape)
    with vta_ext.build_options(strategy="csp-relaxed", objective="cycles"):
        vm = relax.VirtualMachine(relax.build(mod, target=vta_ext.vta_target("pynq")), tvm.cpu())
    assert "GEMM block-sparse" in conv_placement(vta_ext.last_build_report()).plan
    np.testing.assert_array_equal(run_one_call_on(rtl, vm, arrays), ref)


@pytest.mark.parametrize("config", PRESETS)
def test_bias_by_gemm_bit_exact(config):
    """The program with the bias added by a GEMM of the constant row and the bias's digit tiles
    (the run takes the packed int32 bias) equals numpy, as the ALU ADD does."""
    from tvm_csp_embed.codegen.biasfold import gemm_bias_epilogue

    compiled, inputs, ref, unpack = _direct(config, 72, 8, 1)
    wl = compiled.workload
    twin = build_block_sparse(config, wl, gemm_bias_epilogue(EPILOGUE))
    assert "bias_digits" in twin.shapes and "bias" not in twin.shapes
    out, _ = twin.run(*inputs)
    np.testing.assert_array_equal(unpack(out), ref)


def test_relax_bias_gemm_chosen_where_faster(sparse_only):
    """Through the Relax build the block-sparse plan weighs its bias-by-GEMM twin; the report
    says how the bias is added, and the output is bit-exact either way."""
    mod, arrays, ref = case(72, 8, 3, 1)
    out, report = vta_build(mod, arrays, "default")
    np.testing.assert_array_equal(out, ref)
    detail = conv_placement(report).detail
    assert "bias added by one GEMM" in detail or "bias by the vector ALU ADD" in detail, detail


def test_warm_build_serves_the_block_sparse_choice(tmp_path, monkeypatch):
    """The block-sparse unit chosen (with how it adds the bias) is kept on disk: a warm build
    (nothing in memory) scores no unit and places the same plan, bit-exact."""
    from test_grouped_gemm import cold_start_counting_scores

    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    mod, arrays, ref = case(168, 8, 7, 1)
    cold_out, cold = vta_build(mod, arrays, "default", "end-to-end")
    p = conv_placement(cold)
    assert "GEMM block-sparse" in p.plan, p.detail
    scored = cold_start_counting_scores(monkeypatch)
    warm_out, warm = vta_build(mod, arrays, "default", "end-to-end")
    assert not scored, "a warm build must not build and time the units again"
    assert conv_placement(warm) == p
    np.testing.assert_array_equal(cold_out, ref)
    np.testing.assert_array_equal(warm_out, ref)


# ------------------------------------------------------------------------------ one-block groups
# Groups of exactly one 16-channel block (MobileNet's D1-D9, RegNetX-400MF): one nonzero tile
# per output block and tap, the stock grouped conv2d template's tiles, run by the block-sparse
# program as a contender of the CSP plan.
def test_one_block_groups_tile_grid_hand_count():
    """Four groups of 16 channels: output block ``o`` reads input block ``o`` only; each group is
    its own unit."""
    assert tile_grid(64, 16, 16) == [(0,), (1,), (2,), (3,)]
    assert units(tile_grid(64, 16, 16)) == [(0, 1, 0, 1), (1, 1, 1, 1), (2, 1, 2, 1),
                                            (3, 1, 3, 1)]


#: (channels, image, stride) of 16-channel groups
ONE_BLOCK = [(64, 7, 1), (48, 8, 2)]


@pytest.mark.parametrize("config", PRESETS)
@pytest.mark.parametrize("c,hw,stride", ONE_BLOCK)
def test_one_block_groups_program_bit_exact(config, c, hw, stride):
    compiled, inputs, ref, unpack = _direct(config, c, hw, stride, width=16)
    out, _ = compiled.run(*inputs)
    np.testing.assert_array_equal(unpack(out), ref)


def test_one_block_groups_micro_ops():
    """One GEMM micro-op per output pixel, tap and group (hand count: 4 groups, 7x7, 9 taps)."""
    compiled, _, _, _ = _direct("pipelined", 64, 7, 1, width=16)
    executed = sum((i.uop_end - i.uop_bgn) * i.iter_out * i.iter_in
                   for i in compiled.program.insns if isinstance(i, GemmInsn) and not i.reset_reg)
    assert executed == 4 * 7 * 7 * 9


@pytest.mark.parametrize("config", PRESETS)
def test_relax_one_block_groups_bit_exact(config, sparse_only):
    """Withheld the CSP plan, 16-channel groups run on the block-sparse program (the
    block-diagonal unit refused: it is the stock template), bit-exact against numpy and llvm."""
    mod, arrays, ref = case(64, 7, 4, 1)
    out, report = vta_build(mod, arrays, config)
    np.testing.assert_array_equal(out, ref)
    p = conv_placement(report)
    assert p.device == "vta" and "GEMM block-sparse" in p.plan, str(report)
    assert "groups of one 16-channel block" in p.detail
    if config == "default":
        np.testing.assert_array_equal(run(mod, "llvm", arrays), ref)


def test_pynq_rtl_one_block_groups_bit_exact(rtl, sparse_only):
    import tvm
    from tvm import relax

    import vta_ext

    mod, arrays, ref = case(64, 7, 4, 1)
    with vta_ext.build_options(strategy="csp-relaxed", objective="cycles"):
        vm = relax.VirtualMachine(relax.build(mod, target=vta_ext.vta_target("pynq")), tvm.cpu())
    assert "GEMM block-sparse" in conv_placement(vta_ext.last_build_report()).plan
    np.testing.assert_array_equal(run_one_call_on(rtl, vm, arrays), ref)


def _vta_cycles(report) -> int:
    (p,) = [q for q in report.on_vta if q.call is not None]
    return report.cycles(p)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["pipelined", "default"])
def test_d9_choice_never_slower_than_stock(config):
    """MobileNet's D9 (1024 channels in 64 groups at 7x7): csp-relaxed weighs the block-sparse
    program against the CSP plan by cycles; its choice takes no more cycles than the stock
    strategy's own build of the layer (an independent build), and on ``pipelined`` the
    block-sparse program wins (41,798 against 59,856 cycles when written), bit-exact."""
    import vta_ext

    mod, arrays, ref = case(1024, 7, 64, 1)
    out, report = vta_build(mod, arrays, config)
    np.testing.assert_array_equal(out, ref)
    with vta_ext.build_options(strategy="stock"):
        stock = run(mod, vta_ext.vta_target(config), arrays)
    np.testing.assert_array_equal(stock, ref)
    stock_cycles = _vta_cycles(vta_ext.last_build_report())
    assert _vta_cycles(report) <= stock_cycles
    if config == "pipelined":
        assert "GEMM block-sparse" in conv_placement(report).plan
        assert _vta_cycles(report) < 0.8 * stock_cycles


@pytest.mark.slow
def test_stock_chosen_csp_plan_priced_with_its_input_packing(monkeypatch):
    """MobileNet's D8 (512 channels in 32 groups, 14x14, stride 2) on ``pipelined``, end to end:
    the CSP plan is the stock template there; the grouped units' choice prices it with the host
    layout bytes the CSP choice itself gave the stock plan (its input packing included), so the
    block-sparse program, with the same blocked layouts, is weighed on equal host terms. The
    block-sparse unit is withheld so that the report line keeps both figures."""
    import re

    import tvm_csp_embed.grouped as grouped

    def refuse(op, config, width):
        raise TemplateRefusal("withheld by the test")

    monkeypatch.setattr(grouped, "_sparse_plan", refuse)
    mod, arrays, ref = case(512, 14, 32, 2)
    out, report = vta_build(mod, arrays, "pipelined", "end-to-end")
    np.testing.assert_array_equal(out, ref)
    detail = conv_placement(report).detail
    own = re.search(r"\(([\d,]+) VTA \+ ([\d,]+) B host layout\) with the stock template's own "
                    r"plan", detail)
    units = re.search(r"the only unit that runs it \([\d,]+ cycles end to end \(([\d,]+) VTA \+ "
                      r"([\d,]+) B host layout\)\)", detail)
    assert own is not None and units is not None, detail
    assert units.groups() == own.groups(), detail


# ------------------------------------------------------------------------------ accumulator zeroing
def _zeroing(compiled):
    """(reset GEMM micro-ops, accumulator rows written by padding-only LOADs) of a program."""
    from vta_ext.isa import MemInsn, MemType, Opcode

    insns = compiled.program.insns
    resets = sum((i.uop_end - i.uop_bgn) * i.iter_out * i.iter_in
                 for i in insns if isinstance(i, GemmInsn) and i.reset_reg)
    fills = sum(i.x_size * (i.y_pad_0 + i.y_pad_1) for i in insns
                if isinstance(i, MemInsn) and i.opcode == Opcode.LOAD
                and i.memory_type == MemType.ACC and i.y_size == 0)
    return resets, fills


#: how the program zeroes its accumulator per preset, by hand from the presets' JSON: a
#: padding-only LOAD costs ACC_INSN_CYCLES + 1 + PAD_ELEM_CYCLES (1) a row, a GEMM reset
#: GEMM_INSN_CYCLES + 1 + GEMM_CYCLES_PER_UOP a row. default: 1 + 320 < 1 + 4 * 320, the fill;
#: pipelined: 1 + 320 = 1 + 320, a tie, the reset stays; pynq: 11 + 320 < 20 + 320, the fill
#: (test_pynq_rtl_bit_exact runs it on the RTL)
ZEROING = {"default": "fill", "pipelined": "reset", "pynq": "fill"}


@pytest.mark.parametrize("config", PRESETS)
def test_accumulator_zeroed_once_by_the_cheaper_way(config):
    """Every output accumulator row (5 blocks of 8x8 pixels for 72 channels) is zeroed once, by
    padding-only LOADs where those are cheaper, else by GEMM reset micro-ops."""
    compiled, inputs, ref, unpack = _direct(config, 72, 8, 1)
    resets, fills = _zeroing(compiled)
    rows = 5 * 8 * 8
    assert (resets, fills) == ((0, rows) if ZEROING[config] == "fill" else (rows, 0))
    assert compiled.info["acc_init"] == ZEROING[config]
    np.testing.assert_array_equal(unpack(compiled.run(*inputs)[0]), ref)


def test_fill_saves_cycles_on_default(monkeypatch):
    """On default the padding-only fill takes 3 cycles a row fewer than the reset (4 - 1): the
    cycle model of the same layer with the reset forced is slower by at least that much."""
    from vta_ext.sim.cycles import CycleModel

    import tvm_csp_embed.blocksparse as bs

    def cycles():
        compiled, inputs, ref, unpack = _direct("default", 72, 16, 1)
        np.testing.assert_array_equal(unpack(compiled.run(*inputs)[0]), ref)
        return CycleModel(load_config("default")).run_program(compiled.program).total_cycles

    fill = cycles()
    monkeypatch.setattr(bs, "zero_by_fill", lambda cfg, entries: False)
    reset = cycles()
    rows = 5 * 16 * 16
    assert reset - fill >= 3 * rows

