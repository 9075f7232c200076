"""The bias folded into the spare reduction lanes of csp-relaxed embeddings (issue 18, item 3).

``tvm_csp_embed.codegen.biasfold``: a constant per-channel bias is written as int8 digits into the
padding lanes of the weights, against lane constants ``(1, -128, ...)`` in the data, so the GEMM
adds it and the epilogue's vector ADD pass is gone. Checked here: the digit decomposition against
hand-computed values; whole builds bit-exact against the llvm build of the same module (3-channel
stem-like convolutions, a 1-channel DeepBench-like layer, biases at and just over the edge of the
range); the report's sentence; the instruction counts before and after on one layer; the tuner's
numpy reference of a folded workload.
"""
from __future__ import annotations

import json

import re

import numpy as np
import pytest
from conftest import bind_constants, conv_chain, conv_module, emitted_packing, run_module

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
import vta_ext
from tvm_csp_embed.codegen.biasfold import fold_digits, fold_range

pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")


# ------------------------------------------------------------------------------ digits
def test_fold_range_by_hand():
    # 1 lane: one int8 digit times 1; 7 lanes: 127 (or -128) plus 6 lanes of -128 * int8
    assert fold_range(1) == (-128, 127)
    assert fold_range(7) == (-128 - 6 * 127 * 128, 127 + 6 * 128 * 128) == (-97_664, 98_431)
    with pytest.raises(ValueError, match="at least one spare lane"):
        fold_range(0)


def test_fold_digits_by_hand():
    # 1000 = 104 + (-128) * (-7); -1000 = 24 + (-128) * 8
    assert fold_digits([1000, -1000, 127, -128], 3).tolist() == [
        [104, -7, 0], [24, 8, 0], [127, 0, 0], [0, 1, 0]]
    # the edges of 7 lanes: 127 + 6 * (-128 * -128) and -128 + 6 * (-128 * 127)
    assert fold_digits([98_431, -97_664], 7).tolist() == [[127] + [-128] * 6, [-128] + [127] * 6]
    assert fold_digits([5, -5], 1).tolist() == [[5], [-5]]
    for bad in (98_432, -97_665):
        with pytest.raises(ValueError, match="outside -97,664..98,431"):
            fold_digits([0, bad], 7)


def test_fold_digits_sum_to_every_bias_of_the_range():
    a = np.array([1, -128, -128, -128], dtype=np.int64)     # the lane constants, by hand
    lo, hi = -128 - 3 * 127 * 128, 127 + 3 * 128 * 128
    b = np.concatenate([np.arange(lo, lo + 300), np.arange(-300, 300), np.arange(hi - 300, hi + 1),
                        np.random.default_rng(0).integers(lo, hi + 1, 2000)])
    digits = fold_digits(b, 4)
    assert digits.dtype == np.int8
    np.testing.assert_array_equal(digits.astype(np.int64) @ a, b)


# ------------------------------------------------------------------------------ builds
def _conv(c, hw, k, *, stride=1, padding=None, bias, seed=0, o=16, shift=8):
    """A constant-weight conv + bias + shr + clip module; bias None: a runtime bias parameter."""
    rng = np.random.default_rng(seed)
    mod = conv_module(1, c, o, hw, k, stride=stride, padding=k // 2 if padding is None else padding,
                      shift=shift, clip=(-128, 127))
    w = rng.integers(-128, 128, (o, c, k, k)).astype(np.int8)
    x = rng.integers(-128, 128, (1, c, hw, hw)).astype(np.int8)
    if bias is None:
        return bind_constants(mod, w=w), [x, rng.integers(-5000, 5000, (1, o, 1, 1)).astype(np.int32)]
    return bind_constants(mod, w=w, b=np.asarray(bias, np.int32).reshape(1, o, 1, 1)), [x]


def _build_and_compare(mod, arrays, **options):
    """VTA output == llvm output; returns the one VTA placement of the report."""
    with vta_ext.build_options(**options):
        got = run_module(mod, "ext_vta", arrays)
    report = vta_ext.last_build_report()
    np.testing.assert_array_equal(got, run_module(mod, "llvm", arrays))
    (p,) = [p for p in report.on_vta if p.call is not None]
    return p, report


def _lanes(p) -> int:
    """The lanes the report row says the bias is folded into (0: kept)."""
    words = p.detail.split("bias folded into ")
    return int(words[1].split()[0]) if len(words) > 1 else 0


@pytest.mark.parametrize("k, stride, hw", [(3, 1, 12), pytest.param(7, 2, 24, marks=pytest.mark.slow)])
def test_stem_like_three_channels_folded_bit_exact(k, stride, hw):
    bias = np.random.default_rng(1).integers(-12_000, 12_000, 16)
    mod, arrays = _conv(3, hw, k, stride=stride, bias=bias)
    p, _ = _build_and_compare(mod, arrays, objective="cycles")
    assert _lanes(p) > 0, p.detail
    assert "bias kept" not in p.detail and f"bias in {_lanes(p)} lanes" in p.plan


@pytest.mark.parametrize("bias_range", [12_000, 60_000])
def test_end_to_end_weighs_the_fold_against_its_host_pass(monkeypatch, bias_range):
    """Under the default objective (end-to-end) a folded embedding competes with its twins that
    keep the bias off the lanes (on the ALU or by a GEMM). On this stem-like layer (3 channels
    padded to 4, a row unroll), a bias within +-32,640 folds into the 3 lanes whose constants the
    unroll's gather reads from a column appended to the input (a small ``concat`` before the
    pad), and that fold wins end to end; a bias of +-60,000 needs all 11 lanes, whose constants
    take a ``where`` pass over the packed input, which the host model prices above the cycles
    saved: the bias is kept and the report says why. Bit-exact either way; with every considered
    candidate timed (no pruning by bound) the choice is the same; ranked by VTA cycles alone, a
    folded plan wins with no more VTA cycles than the end-to-end choice. NCHW free dims only:
    since the host relayout chain is one fused kernel, the full im2col (``fused-crs``, 13 lanes
    by a concat, no ``where``) wins this layer end to end under ``auto``."""
    import shutil

    from tvm_csp_embed import choice
    from tvm_csp_embed.cache import cache_dir

    bias = np.random.default_rng(1).integers(-bias_range, bias_range, 16)
    mod, arrays = _conv(3, 24, 7, stride=2, bias=bias)
    p, _ = _build_and_compare(mod, arrays, layout="NCHW")
    if bias_range < 32_640:
        assert _lanes(p) == 3 and "lanes whose constants the stencil gather reads" in p.detail, p.detail
    else:
        assert _lanes(p) == 0
        # the bias kept off the lanes: on the ALU, or by a GEMM (the twin of the kept bias); the
        # report says why not folded either way
        assert re.search(r"(bias kept on the ALU|not folded): the objective prefers it to the "
                         r"fold into \d+ lanes", p.detail), p.detail
        assert "not the 3 lanes the gather writes" in p.detail, p.detail
    for sub in ("choices", "plans"):
        shutil.rmtree(cache_dir() / sub, ignore_errors=True)
    monkeypatch.setattr(choice, "PRUNE_BY_BOUND", False)
    full, _ = _build_and_compare(mod, arrays, layout="NCHW")
    assert full.plan == p.plan
    number = lambda pattern, text: int(re.search(pattern, text).group(1).replace(",", ""))  # noqa: E731
    runner_up = full.detail.split("; next ")[1]
    end_to_end = r"([\d,]+) cycles end to end"
    assert number(end_to_end, runner_up) > number(end_to_end, full.detail)
    folded, _ = _build_and_compare(mod, arrays, objective="cycles", layout="NCHW")
    assert _lanes(folded) > 0, folded.detail
    assert (number(r"chosen for fewest cycles: ([\d,]+) cycles", folded.detail)
            <= number(r"\(([\d,]+) VTA", full.detail))


def test_thin_one_channel_deepbench_like_folded_bit_exact():
    # a DeepBench-like 1-channel 5x5 layer (DB59-like shape, smaller image)
    bias = np.random.default_rng(2).integers(-8192, 8192, 16)
    mod, arrays = _conv(1, 20, 5, bias=bias)
    p, _ = _build_and_compare(mod, arrays, objective="cycles")
    assert _lanes(p) > 0, p.detail


@pytest.mark.parametrize("c, o, groups", [pytest.param(8, 16, 4, marks=pytest.mark.slow), (6, 32, 2)])
def test_group_conv_with_thin_groups_folded_bit_exact(c, o, groups):
    """Group convolutions with 2 and 3 input channels per group: the bias of every group's
    output channels goes into the spare lanes (the weights' first dim is the output channel)."""
    rng = np.random.default_rng(5)
    mod = conv_module(1, c, o, 8, 3, padding=1, groups=groups, shift=8, clip=(-128, 127))
    mod = bind_constants(mod, w=rng.integers(-128, 128, (o, c // groups, 3, 3)).astype(np.int8),
                         b=rng.integers(-9000, 9000, (1, o, 1, 1)).astype(np.int32))
    p, _ = _build_and_compare(mod, [rng.integers(-128, 128, (1, c, 8, 8)).astype(np.int8)],
                              objective="cycles")
    assert p.kind == "group_conv2d" and _lanes(p) > 0, p.detail


def test_bias_at_the_edges_folds_and_just_over_keeps_the_add():
    rng = np.random.default_rng(3)
    bias = rng.integers(-3000, 3000, 16)
    mod, arrays = _conv(1, 12, 3, bias=bias, shift=10)
    p, _ = _build_and_compare(mod, arrays, objective="cycles")
    lanes = _lanes(p)
    assert lanes > 0, p.detail
    lo, hi = fold_range(lanes)
    edge = bias.copy()
    edge[0], edge[5] = hi, lo
    mod, arrays = _conv(1, 12, 3, bias=edge, shift=10)
    p, _ = _build_and_compare(mod, arrays, objective="cycles")
    assert _lanes(p) == lanes, p.detail
    # one over the range: not folded into those lanes; the plan keeps the add, or (when an
    # embedding with more spare lanes is faster, as the knob estimate may rank them) folds into
    # more lanes whose range holds it
    over = edge.copy()
    over[0] = hi + 1
    mod, arrays = _conv(1, 12, 3, bias=over, shift=10)
    p, _ = _build_and_compare(mod, arrays, objective="cycles")
    _kept_or_wider(p, lanes, over, f"bias kept on the ALU: bias {lo:,}..{hi + 1:,} outside the "
                   f"{lo:,}..{hi:,} that the {lanes} spare lane(s) hold")
    under = edge.copy()
    under[5] = lo - 1
    mod, arrays = _conv(1, 12, 3, bias=under, shift=10)
    p, _ = _build_and_compare(mod, arrays, objective="cycles")
    _kept_or_wider(p, lanes, under, "bias kept on the ALU: bias")
    # beyond what every embedding's spare lanes hold: the add is kept, and the report says why
    huge = edge.copy()
    huge[3] = 10_000_000
    mod, arrays = _conv(1, 12, 3, bias=huge, shift=10)
    p, _ = _build_and_compare(mod, arrays, objective="cycles")
    assert _lanes(p) == 0 and re.search(r"bias kept on the ALU: bias -?[\d,]+\.\.10,000,000 "
                                        r"outside the -?[\d,]+\.\.[\d,]+ that the \d+ spare "
                                        r"lane\(s\) hold", p.detail), p.detail


def _kept_or_wider(p, lanes, bias, kept):
    """``p`` did not fold ``bias`` (outside the range of ``lanes`` lanes) into ``lanes`` lanes:
    it keeps the add and says ``kept``, or folds into more lanes whose range holds ``bias``."""
    got = _lanes(p)
    if got == 0:
        assert kept in p.detail, p.detail
    else:
        lo, hi = fold_range(got)
        assert got > lanes and lo <= bias.min() and bias.max() <= hi, p.detail


def test_runtime_bias_and_strict_keep_the_add_and_say_why():
    mod, arrays = _conv(1, 12, 3, bias=None)
    p, _ = _build_and_compare(mod, arrays)
    assert "bias kept on the ALU: bias is runtime data" in p.detail
    mod, arrays = _conv(1, 12, 3, bias=np.arange(16) * 100)
    p, _ = _build_and_compare(mod, arrays, strategy="csp-strict")
    assert "bias kept on the ALU: csp-strict keeps the stock template's program" in p.detail


# ------------------------------------------------------------------------------ gathered constants
def _rect_conv(c, h, w, kh, kw, *, stride, padding, bias, seed=0, o=16):
    """A constant-weight, constant-bias conv + bias + shr + clip of one ``(1, c, h, w)`` input and
    ``(o, c, kh, kw)`` filters (DeepBench's thin layers have rectangular filters)."""
    from tvm import relax

    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, h, w), "int8"))
    wt = relax.const(rng.integers(-128, 128, (o, c, kh, kw)).astype(np.int8))
    b = relax.const(np.asarray(bias, np.int32).reshape(1, o, 1, 1))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(conv_chain(bb, x, wt, b, stride=stride, padding=padding, shift=9,
                                            clip=(-128, 127)))
        bb.emit_func_output(out)
    return bb.get(), [rng.integers(-128, 128, (1, c, h, w)).astype(np.int8)]


def _chosen_data_layout(report, p):
    """The host layout the build packed the chosen plan's activation with (lane constants in)."""
    from tvm_csp_embed.candidates import CspWorkload, packed_of
    from tvm_csp_embed.codegen.biasfold import fold_data_layout
    from vta_ext.config import load_config

    cw = CspWorkload(**json.loads(report.key_of(p))["workload"])
    return fold_data_layout(packed_of(cw, load_config("default")))


@pytest.mark.parametrize("shape, family, rows, objective", [
    pytest.param((1, 25, 100, 5, 20, 2, 0, 16), "fused-rs", False, "cycles",  # DB0-like: 5x20 / 2
                 marks=pytest.mark.slow),
    ((1, 40, 151, 5, 20, (2, 8), 8, 32), "fused-rs", True, "end-to-end"),  # DeepBench DB107
    ((3, 8, 8, 3, 3, 1, 1, 16), "fused-crs", False, "cycles"),             # 3 channels, 3x3
    pytest.param((3, 16, 16, 7, 7, 2, 3, 16), "fused-crs", False, "cycles",  # stem-like 7x7 / 2
                 marks=pytest.mark.slow),
])
def test_lane_constants_come_with_the_gather_bit_exact(shape, family, rows, objective):
    """The fused embeddings write the lane constants with copies the packing already makes (a
    ``concat`` in place of the reduction pad, or onto the source of the stencil unroll's ``take``,
    which reads them at the spare lanes; on DB107, whose row unroll has no pad before it, also as
    two rows appended to the padded input before the column unroll: since the host relayout is
    one fused kernel, both forms write the same packed input once and either may be taken): no
    ``where`` pass. Built with the fold, the output equals the llvm build's.""" 
    c, h, w, kh, kw, stride, pad, o = shape
    bias = np.random.default_rng(7).integers(-12_000, 12_000, o)
    mod, arrays = _rect_conv(c, h, w, kh, kw, stride=stride, padding=pad, bias=bias, o=o)
    p, report = _build_and_compare(mod, arrays, objective=objective)
    assert _lanes(p) > 0 and p.plan.startswith(f"csp-relaxed {family} "), (p.plan, p.detail)
    kinds = [st[0] for st in _chosen_data_layout(report, p).steps]
    assert "set" not in kinds and "concat" in kinds, kinds
    if not rows:
        assert kinds.index("concat") > kinds.index("unroll"), (p.plan, kinds)


def test_folded_fused_layouts_charge_what_their_relax_ops_write():
    """The host model charges a layout what its Relax ops write (``layout_traffic``). Hand count
    for 1x3x8x8 * 16x3x3x3 p1, fused-crs with the data as A: pad to 3x10x10, unroll rows to
    3x8x3x10, unroll columns to 3x8x3x8x3, transpose, the reduction 27 -> 32 (8x8x32 = 2,048)
    are one fused kernel that writes its output once; the lane transpose moves only a unit axis
    (a view, 0): 2,048 elements, the same with the fold (the concat is inside the kernel), where
    a ``where`` over the packed input would add 2,048. Fused-rs of 1x1x12x12 * 16x1x5x5 p2, data
    as A: pad, column unroll, transpose, padding after each column, the row unroll to 12x12x32
    (4,608), one kernel, and the lane transpose (a view): 4,608, the same with the fold's
    concat, where a ``where`` would add 4,608."""
    from tvm_csp_embed.candidates import CspWorkload, candidates
    from tvm_csp_embed.codegen.biasfold import fold_data_layout, fold_lanes
    from vta_ext.config import load_config
    from vta_ext.host import layout_traffic

    cfg = load_config("default")
    epilogue = (("bias",), ("shr", 9), ("clip", -128, 127))
    for c, hw, k, layout, plain, folded in ((3, 8, 3, "fused-crs", 2_048, 2_048),
                                            (1, 12, 5, "fused-rs", 4_608, 4_608)):
        p = k // 2
        base = CspWorkload("conv2d", (("n", 1), ("c", c), ("h", hw), ("w", hw), ("k", 16),
                                      ("kh", k), ("kw", k), ("pt", p), ("pl", p), ("pb", p),
                                      ("pr", p), ("sh", 1), ("sw", 1)))
        cands, _ = candidates(cfg, base, "relaxed", [layout], epilogue)
        cand = next(x for x in cands if x.label.startswith(f"{layout} x=1 y=k16 z=")
                    and "A<-data" in x.label and "*" not in x.label.split()[3])
        assert fold_lanes(cand.packed).data == "A"
        layout_of = fold_data_layout(cand.packed)
        assert layout_traffic(cand.packed.operands["A"].host) == plain
        assert layout_traffic(layout_of) == folded

        written, pack = emitted_packing(layout_of)
        ops = [op for op, _ in written]
        assert sum(n for _, n in written) == folded, (layout, written)
        # the concat is inside the one fused kernel; no where pass
        assert ops == ["relax.call_tir"], ops
        assert "concat" in [st[0] for st in layout_of.steps]
        # the compiled packing holds the lane constants: the GEMM of the packed data with a weight
        # vector that is 1 at the lanes' first reduction point only reads 1, of one at -128 reads
        # -128, at every output position (independent of the source values)
        got = pack(np.random.default_rng(0).integers(-128, 128, layout_of.src_shape).astype(np.int8))
        lanes = fold_lanes(cand.packed)
        first = got[tuple(slice(None) if e == 1 else v for v, e in
                                               zip(lanes.data_index[0], lanes.data_shape))]
        rest = got[tuple(slice(None) if e == 1 else v for v, e in
                         zip(lanes.data_index[-1], lanes.data_shape))]
        assert (first == 1).all() and (rest == -128).all()


def _stem_candidate(hw: int, pad: int, cfg):
    """The ``NCHW x=1 y=k16 z=c4*s4`` embedding (data as A) of 1x3xHWxHW * 16x3x3x3 s2."""
    from tvm_csp_embed.candidates import CspWorkload, candidates

    base = CspWorkload("conv2d", (("n", 1), ("c", 3), ("h", hw), ("w", hw), ("k", 16), ("kh", 3),
                                  ("kw", 3), ("pt", pad), ("pl", pad), ("pb", pad), ("pr", pad),
                                  ("sh", 2), ("sw", 2)))
    cands, _ = candidates(cfg, base, "relaxed", ["NCHW"], (("bias",), ("shr", 9), ("clip", -128, 127)))
    return next(x for x in cands if x.label.startswith("NCHW x=1 y=k16 z=c4*s4 (A<-data"))


def test_stem_lanes_written_by_a_column_the_gather_reads():
    """A 3-channel 3x3 stride-2 stem (DB10's shape, smaller), NCHW z = c4*s4: its 7 spare lanes
    are the 4th channel's 4 taps and the 4th tap of the 3 real channels. The taps of the 4th
    channel share their columns with real taps, so every lane's constant takes a ``where`` pass
    over the packed input; the 4th tap of the 3 real channels is one pattern of the column
    unroll, which can read a column appended to the input instead: 3 lanes (+-32,640).
    Hand count for 1x3x28x28 p1, elements written: the ``where`` form pads to 4x30x30, unrolls
    the columns to 4x30x14x4 and transposes in one fused kernel (6,720) and writes the
    constants (6,720): 13,440; the gathered form appends 2 columns (the pad's right zero column,
    then the lane column) to the 3x28x28 input, pads to 4x30x31, unrolls and transposes, all in
    one kernel: 6,720, no ``where``. The Relax ops the packing emits write that much, and the
    compiled packing holds 1, -128, -128 wherever the digits' reduction points read, whatever
    the input."""
    from tvm_csp_embed.codegen.biasfold import _lane_classes, _reads, fold_data_layout, fold_forms
    from vta_ext.config import load_config
    from vta_ext.host import layout_traffic

    cand = _stem_candidate(28, 1, load_config("default"))
    (full, _), (sub, _) = fold_forms(cand.packed)
    assert (full.lanes, sub.lanes) == (7, 3)
    assert layout_traffic(fold_data_layout(cand.packed, 7)) == 13_440
    layout = fold_data_layout(cand.packed, 3)
    assert layout_traffic(layout) == 6_720
    kinds = [st[0] for st in layout.steps]
    assert "set" not in kinds and kinds.index("concat") < kinds.index("pad") < kinds.index("unroll")

    written, pack = emitted_packing(layout)
    assert written == [("relax.call_tir", 6_720)], written
    cl = _lane_classes(cand.packed)
    points = {tuple(int(v) for v in cl["wvals"][p]): p for c, ps in cl["candidates"] for p in ps}
    for seed in range(2):
        src = np.random.default_rng(seed).integers(-128, 128, layout.src_shape).astype(np.int8)
        got = pack(src).ravel()
        for lane, value in zip(sub.weight_index, (1, -128, -128)):
            assert (got[_reads(cl, points[lane])] == value).all()


@pytest.mark.parametrize("hw, pad", [(28, 1), (15, 0)])
def test_point_reads_equal_the_loop_nest_evaluated_point_by_point(hw, pad):
    """The reads of every spare reduction point of the stem (what :func:`_gathered_lanes` checks
    the lane markers at) equal each packed data dim's index expression evaluated with plain
    integers at every value of the free loops (row-major over the free loop names, sorted), made
    flat over the stored shape: the affine split (the free loops' part once, a per-point offset)
    changes no read."""
    import itertools

    from tvm_csp_embed.codegen.biasfold import _lane_classes, _point_reads
    from vta_ext.config import load_config

    cl = _lane_classes(_stem_candidate(hw, pad, load_config("default")).packed)
    dops, values, free = cl["dops"], cl["values"], cl["free"]
    names = sorted({v for d in dops.dims for v, _ in d.terms if v not in values})
    reads = _point_reads(cl)
    points = [p for _, ps in cl["candidates"] for p in ps]
    assert points
    for p in points:
        want = []
        for combo in itertools.product(*(range(free[v]) for v in names)):
            at = dict(zip(names, combo))
            at.update({v: int(values[v][p]) for v in values})
            index = [d.const - d.stored_lo + sum(c * at[v] for v, c in d.terms) for d in dops.dims]
            assert all(0 <= i < s for i, s in zip(index, dops.stored_shape))
            want.append(int(np.ravel_multi_index(index, dops.stored_shape)))
        assert reads(p).tolist() == want


def test_where_pass_stays_where_no_lane_is_a_column_and_the_report_says_why():
    """1x3x10x10 * 16x3x2x2, NCHW z = c4*r2*s2: the 4 spare lanes are the padded 4th channel's
    4 taps, which the unroll reads at the same columns as the real channels' taps: no unroll
    pattern holds lanes only, so the lane constants keep their ``where`` pass over the packed
    input (one form, with a ``set`` step), and the fold's sentence says so."""
    from tvm_csp_embed.candidates import CspWorkload, candidates
    from tvm_csp_embed.codegen.biasfold import fold_decision, fold_forms
    from vta_ext.config import load_config

    epilogue = (("bias",), ("shr", 9), ("clip", -128, 127))
    base = CspWorkload("conv2d", (("n", 1), ("c", 3), ("h", 10), ("w", 10), ("k", 16), ("kh", 2),
                                  ("kw", 2), ("pt", 0), ("pl", 0), ("pb", 0), ("pr", 0),
                                  ("sh", 1), ("sw", 1)))
    cands, _ = candidates(load_config("default"), base, "relaxed", ["NCHW"], epilogue)
    cand = next(x for x in cands if x.label.startswith("NCHW x=1 y=k16 z=c4*r2*s2 (A<-data"))
    (form, layout), = fold_forms(cand.packed)
    assert form.lanes == 4 and layout.steps[-1][0] == "set"
    lanes, note = fold_decision(cand.packed, "conv2d", epilogue, np.arange(-8, 8) * 1000, True)
    assert lanes == 4
    assert note.endswith("its lane constants take a where pass over the packed input: no lane is "
                         "one pattern of the unroll's loops over the whole of the other axes"), note


@pytest.mark.parametrize("hw, pad, bias_range, lanes", [
    (28, 1, 12_000, 3),      # DB10-like: the gather writes 3 lanes
    pytest.param(32, 0, 12_000, 3, marks=pytest.mark.slow),  # squeezenet1_1's stem, smaller
    (28, 1, 60_000, 7),      # a bias only all 7 lanes hold: the where form
])
def test_stem_folded_in_the_lanes_the_gather_writes_bit_exact(hw, pad, bias_range, lanes):
    """The stem embedding of :func:`test_stem_lanes_written_by_a_column_the_gather_reads` built
    folded (``bias_lanes`` = the lanes of the form whose range holds the bias) runs bit-exact
    against the numpy reference of the operator, on the simulator; and a whole build of the
    layer (default objective) is bit-exact against llvm, with the fold the objective takes, whose
    priced host bytes equal the relayout bytes the build emits."""
    import dataclasses

    from tvm_csp_embed.codegen.biasfold import fold_decision
    from tvm_csp_embed.reference import reference_for
    from vta_ext.config import load_config

    cfg = load_config("default")
    cand = _stem_candidate(hw, pad, cfg)
    rng = np.random.default_rng(hw + pad)
    bias = rng.integers(-bias_range, bias_range, 16)
    epilogue = (("bias",), ("shr", 9), ("clip", -128, 127))
    decided, note = fold_decision(cand.packed, "conv2d", epilogue, bias, True)
    assert decided == lanes, note
    cw = dataclasses.replace(cand.workload, bias_lanes=lanes)
    template = vta_ext.strategy.get_template("conv2d", "csp-relaxed")
    compiled = template.build(cfg, cw, epilogue, "cycles")
    inputs, expected, unpack = reference_for("conv2d", "csp-relaxed")(cfg, cw, epilogue, rng)
    out, _ = compiled.run(*inputs)
    np.testing.assert_array_equal(unpack(out), expected)
    mod, arrays = _conv(3, hw, 3, stride=2, padding=pad, bias=bias)
    p, report = _build_and_compare(mod, arrays)
    # the host bytes the objective priced the chosen plan at are those the built module's
    # relayouts write (counted by the build report on the offloaded module)
    priced = int(re.search(r"VTA \+ ([\d,]+) B host layout\)", p.detail).group(1).replace(",", ""))
    assert priced == report.layout_bytes, p.detail


# ------------------------------------------------------------------------------ counts
def _uops(program, kind):
    """Executed micro-ops of the compute instructions ``kind`` selects."""
    return sum(i.iter_out * i.iter_in * (i.uop_end - i.uop_bgn) for i in program.insns if kind(i))


def test_instruction_counts_before_and_after_the_fold():
    """1x1x12x12 * 16x1x3x3 p1 on ``default``: every embedding pads the 9 filter taps to one
    reduction block of 16, so the GEMM runs 12*12 output positions x 1 channel block x 1
    reduction step = 144 micro-ops (no reset: the accumulators are filled), with or without the
    fold. The bias ADD is one vector ALU micro-op per accumulator entry (12*12*16 / 16 = 144)
    before and none after; shift and clip stay (2 x 144 immediate micro-ops)."""
    from vta_ext.executor import compiled_op
    from vta_ext.isa import AluInsn, AluOp, GemmInsn
    from vta_ext.strategy import get_template

    mod, arrays = _conv(1, 12, 3, bias=np.arange(16) * 37 - 300)
    p, report = _build_and_compare(mod, arrays, objective="cycles")
    key = report.key_of(p)
    spec = json.loads(key)
    assert spec["workload"]["bias_lanes"] > 0
    after = compiled_op(key).program
    template = get_template("conv2d", "csp-relaxed")
    wl = template.workload_from_dict(dict(spec["workload"], bias_lanes=0))
    knobs = dict(compiled_op(key).knobs.__dict__)
    before = template.build(after.config, wl, [tuple(s) for s in spec["epilogue"]], knobs).program
    gemm = lambda i: isinstance(i, GemmInsn) and not i.reset_reg  # noqa: E731
    vec_add = lambda i: isinstance(i, AluInsn) and not i.use_imm and i.alu_opcode == AluOp.ADD  # noqa: E731
    imm = lambda i: isinstance(i, AluInsn) and i.use_imm  # noqa: E731
    assert _uops(before, gemm) == _uops(after, gemm) == 144
    assert _uops(before, vec_add) == 144 and sum(map(vec_add, before.insns)) > 0
    assert _uops(after, vec_add) == 0 and not any(map(vec_add, after.insns))
    assert _uops(before, imm) == _uops(after, imm) == 2 * 144
    assert not any(isinstance(i, GemmInsn) and i.reset_reg for i in after.insns)


def test_tuner_reference_of_a_folded_workload():
    """The tuner's numpy reference (``csp_reference``) packs a folded workload's inputs with the
    lane constants and digits; the compiled program on the simulator equals it."""
    from tvm_csp_embed.reference import reference_for
    from vta_ext.executor import compiled_op

    mod, arrays = _conv(3, 10, 3, bias=np.arange(16) * 50)
    p, report = _build_and_compare(mod, arrays)
    spec = json.loads(report.key_of(p))
    compiled = compiled_op(report.key_of(p))
    template = vta_ext.strategy.get_template("conv2d", "csp-relaxed")
    cw = template.workload_from_dict(spec["workload"])
    assert cw.bias_lanes > 0
    epilogue = [tuple(s) for s in spec["epilogue"]]
    inputs, expected, unpack = reference_for("conv2d", "csp-relaxed")(
        compiled.program.config, cw, epilogue, np.random.default_rng(4))
    assert len(inputs) == 2                       # no bias tensor: it is in the layouts
    out, _ = compiled.run(*inputs)
    np.testing.assert_array_equal(unpack(out), expected)


@pytest.mark.parametrize("c, hw, k, stride, mode", [(3, 16, 7, 2, "relaxed"), (1, 12, 5, 1, "relaxed"),
                                                    (8, 8, 3, 1, "strict")])
def test_every_candidate_embedding_folds_bit_exact(c, hw, k, stride, mode):
    """Every embedding the solver offers for a thin conv (NCHW, NHWC, fused; operand-swapped
    ones) whose spare lanes can carry the bias: the folded program on the simulator equals the
    numpy reference (``csp_reference``: random operator tensors, the bias in the range of the
    embedding's lanes, packed by the folded layouts), in every lane form (:func:`fold_forms`: all
    spare lanes, and the subset whose constants the stencil gather reads). The strict (stock-family) embedding of an
    8-channel conv, z = c16, has its input padded by the DMA: the digits must sit at a filter tap
    whose reads the DMA never pads (csp-strict itself never folds; the program is built here
    directly)."""
    import dataclasses

    from tvm_csp_embed.candidates import CspWorkload, candidates, fused_variants
    from tvm_csp_embed.codegen.biasfold import FoldLanes, fold_forms, fold_lanes
    from tvm_csp_embed.reference import reference_for
    from vta_ext.config import load_config

    cfg = load_config("default")
    p = k // 2
    base = CspWorkload("conv2d", (("n", 1), ("c", c), ("h", hw), ("w", hw), ("k", 16), ("kh", k),
                                  ("kw", k), ("pt", p), ("pl", p), ("pb", p), ("pr", p),
                                  ("sh", stride), ("sw", stride)))
    epilogue = (("bias",), ("shr", 9), ("clip", -128, 127))
    layouts = ["NCHW", "NHWC"] + fused_variants(base, cfg) if mode == "relaxed" else ["NCHW"]
    cands, _ = candidates(cfg, base, mode, layouts, epilogue)
    folded = swapped = dma = subsets = 0
    template = vta_ext.strategy.get_template("conv2d", "csp-relaxed")
    for cand in cands:
        lanes = fold_lanes(cand.packed)
        if cand.refused or not isinstance(lanes, FoldLanes):
            continue
        for form, _ in fold_forms(cand.packed):     # every spare lane; a subset the gather writes
            cw = dataclasses.replace(cand.workload, bias_lanes=form.lanes)
            compiled = template.build(cfg, cw, epilogue, "cycles")
            inputs, expected, unpack = reference_for("conv2d", "csp-relaxed")(
                cfg, cw, epilogue, np.random.default_rng(folded))
            out, _ = compiled.run(*inputs)
            np.testing.assert_array_equal(unpack(out), expected, err_msg=f"{cand.label} {form}")
            subsets += form.lanes != lanes.lanes
        folded += 1
        swapped += lanes.data == "B"
        dma += cand.packed.operands[lanes.data].device_padded
    assert folded >= (3 if mode == "relaxed" else 1)
    assert mode == "relaxed" or dma == folded
    assert mode == "strict" or subsets >= 1
    print(f"{folded} embeddings folded ({swapped} operand-swapped, {dma} with DMA padding, "
          f"{subsets} also into the lanes the gather writes)")


def test_records_written_before_bias_lanes_still_apply():
    """``data/tuned`` records (written before ``CspWorkload.bias_lanes``) key like the workload a
    build asks with now (the field at its default)."""
    from pathlib import Path

    from tvm_csp_embed.candidates import CspWorkload
    from tvm_csp_embed.tune.records import load_records
    from tvm_csp_embed.tune.task import record_key
    from vta_ext.config import load_config

    path = Path(__file__).resolve().parent.parent / "data" / "tuned" / "resnet18_pipelined_csp-relaxed.json"
    first = json.loads(path.read_text().splitlines()[0])
    assert "bias_lanes" not in first["workload"]
    rec = load_records(path)[0]
    now = CspWorkload(**first["workload"])
    assert now.bias_lanes == 0
    assert rec.key == record_key(first["kind"], first["strategy"], load_config(first["config"]), now)


def test_with_bias_lanes_is_dataclasses_replace():
    """``CspWorkload.with_bias_lanes`` (the fold's cheap copy) equals ``dataclasses.replace``:
    same fields, equal and hashing alike, and the original is left as it was."""
    import dataclasses

    from tvm_csp_embed.candidates import CspWorkload

    cw = CspWorkload("conv2d", [["c", 3], ["k", 16]], "NCHW", "relaxed", [["A", "data"]],
                     [1, 1], [[0, 1]], [["crs", 13]])
    for lanes in (0, 13):
        new = cw.with_bias_lanes(lanes)
        ref = dataclasses.replace(cw, bias_lanes=lanes)
        assert new == ref and hash(new) == hash(ref) and dataclasses.asdict(new) == dataclasses.asdict(ref)
    assert cw.bias_lanes == 0 and cw.with_bias_lanes(13).with_bias_lanes(0) == cw
