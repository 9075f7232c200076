"""Grouped convs of narrow groups (channels per group < BLOCK_IN) under csp-relaxed
(tvm_csp_embed.grouped): the CSP plan or the GEMM block-diagonal program per layer, bit-exact
against an independent numpy grouped convolution and the llvm build, on default, pipelined and
pynq (and the RTL for pynq)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_csp_embed  # noqa: F401 -- registers the CSP strategies
import vta_ext
from conftest import conv2d_nchw, conv_layer_shapes, conv_module, requantize, run_one_call_on
from tvm_csp_embed.depthwise import diagonal_weight
from tvm_csp_embed.strategy import CspGemmTemplate
from vta_ext.errors import TemplateRefusal

PRESETS = ("default", "pipelined", "pynq")
#: the preset sweeps of the bit-exact checks: default in the default run, the others slow
PRESET_PARAMS = [PRESETS[0], *(pytest.param(p, marks=pytest.mark.slow) for p in PRESETS[1:])]
SHIFT, CLIP = 8, (-128, 127)


# ------------------------------------------------------------------------------ references
def numpy_grouped(x, w, groups, stride, pad):
    """Direct int64 grouped convolution (:func:`conftest.conv2d_nchw`)."""
    return conv2d_nchw(x, w, stride, pad, groups=groups)


def module(c, hw, groups, k, stride, pad, weight=None, bias=None):
    """``main(x[, w, b])``: grouped conv2d + bias, >> SHIFT, clip, int8. Constant weight and bias
    when given (a quantised model's), else parameters."""
    return conv_module(1, c, c, hw, k, stride=stride, padding=pad, shift=SHIFT, clip=CLIP,
                       groups=groups, constants=None if weight is None else (weight, bias))


def case(c, hw, groups, stride, k=3, pad=1, seed=0, constant=True):
    """(module, arrays, numpy reference) of one grouped layer with random int8 data."""
    rng = np.random.default_rng(seed + c + hw + groups + stride)
    x = rng.integers(-128, 128, (1, c, hw, hw)).astype(np.int8)
    w = rng.integers(-128, 128, (c, c // groups, k, k)).astype(np.int8)
    b = rng.integers(-5000, 5000, (1, c, 1, 1)).astype(np.int32)
    ref = requantize(numpy_grouped(x, w, groups, stride, pad), b, SHIFT, CLIP)
    if constant:
        return module(c, hw, groups, k, stride, pad, w, b), [x], ref
    return module(c, hw, groups, k, stride, pad), [x, w, b], ref


def run(mod, target, arrays):
    vm = relax.VirtualMachine(relax.build(mod, target=target), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def vta_build(mod, arrays, config, objective="cycles", host=None):
    """Output and build report of ``mod`` under csp-relaxed on ``config`` (``host``: the host
    model, :func:`vta_ext.build_options`)."""
    with vta_ext.build_options(strategy="csp-relaxed", objective=objective, host=host):
        out = run(mod, vta_ext.vta_target(config), arrays)
    return out, vta_ext.last_build_report()


def conv_placement(report):
    (p,) = [p for p in report.placements if p.op == "relax.nn.conv2d"]
    return p


@pytest.fixture
def diagonal_only(monkeypatch):
    """The CSP plan withheld: the block-diagonal unit runs wherever it builds (its program on
    every preset, whichever unit the cycle model prefers there)."""
    def refuse(self, op, config):
        raise TemplateRefusal("the CSP plan withheld by the test")

    monkeypatch.setattr(CspGemmTemplate, "_plan", refuse)


# ------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("c,groups", [(32, 8), (40, 5), (24, 6)])
def test_diagonal_weight_computes_the_grouped_conv(c, groups):
    """The block-diagonal grouped conv of 16-channel groups (numpy, per tile) equals the grouped
    conv of narrow groups; the padded channels' weights are zero."""
    rng = np.random.default_rng(c)
    block, width = 16, c // groups
    padded = -(-c // block) * block
    x = np.zeros((1, padded, 5, 5), np.int8)
    x[:, :c] = rng.integers(-128, 128, (1, c, 5, 5))
    w = rng.integers(-128, 128, (c, width, 3, 3)).astype(np.int8)
    oihw = diagonal_weight(w, padded, block, width)
    assert not oihw[c:].any()
    tiled = numpy_grouped(x, oihw, padded // block, 1, 1)
    np.testing.assert_array_equal(tiled[:, :c], numpy_grouped(x[:, :c], w, groups, 1, 1))


#: ResNeXt-50 32x4d's narrow grouped layers (3x3, 32 groups of 4 and 8 channels, stride 1 and 2)
#: at a small image size, channels that are not whole blocks, and groups of 2
SMALL = [(128, 6, 32, 1), (256, 7, 32, 2), (256, 5, 32, 1), (40, 6, 5, 1), (24, 7, 6, 2), (32, 6, 16, 1)]


def _id(s):
    return "c{}_hw{}_g{}_s{}".format(*s)


#: the default run takes groups of 4 (stride 1), 8 (stride 2) and 2; the others run with -m slow
SMALL = [s if s in ((128, 6, 32, 1), (256, 7, 32, 2), (32, 6, 16, 1)) else
         pytest.param(s, marks=pytest.mark.slow, id=_id(s)) for s in SMALL]


@pytest.mark.parametrize("config", PRESET_PARAMS)
@pytest.mark.parametrize("shape", SMALL, ids=_id)
def test_bit_exact_small_chosen(config, shape):
    """Whichever unit the choice takes is bit-exact; its report line names it and why."""
    mod, arrays, ref = case(*shape)
    out, report = vta_build(mod, arrays, config)
    np.testing.assert_array_equal(out, ref)
    p = conv_placement(report)
    assert p.device == "vta", str(report)
    assert "chosen by csp-relaxed over the other unit" in p.detail
    if config == "default":
        np.testing.assert_array_equal(run(mod, "llvm", arrays), ref)


@pytest.mark.parametrize("config", PRESET_PARAMS)
@pytest.mark.parametrize("shape", SMALL, ids=_id)
def test_bit_exact_small_diagonal(config, shape, diagonal_only):
    mod, arrays, ref = case(*shape)
    out, report = vta_build(mod, arrays, config)
    np.testing.assert_array_equal(out, ref)
    p = conv_placement(report)
    assert p.plan == f"csp-relaxed GEMM block-diagonal w{shape[0] // shape[2]}", str(report)
    assert "the only unit that runs it" in p.detail and "withheld by the test" in p.detail


def test_weights_given_at_run_time(diagonal_only):
    """A non-constant weight is expanded to the diagonal tiles by Relax code on the host."""
    mod, arrays, ref = case(40, 6, 5, 1, constant=False)
    for config in ("default", "pynq"):
        out, report = vta_build(mod, arrays, config)
        np.testing.assert_array_equal(out, ref)
        assert conv_placement(report).plan == "csp-relaxed GEMM block-diagonal w8"


def _unit_cycles(mod, arrays, ref, config, monkeypatch):
    """Modelled cycles of the CSP plan alone and of the block-diagonal unit alone, each built
    separately (bit-exact both)."""
    from tvm_csp_embed import grouped

    out = {}
    # each unit alone: the other's planner withheld
    for unit, (owner, planner) in {"csp": (grouped, "_diagonal_plan"),
                                   "diagonal": (CspGemmTemplate, "_plan")}.items():
        with monkeypatch.context() as m:
            m.setattr(owner, planner, lambda *a: (_ for _ in ()).throw(TemplateRefusal("withheld")))
            res, report = vta_build(mod, arrays, config)
            np.testing.assert_array_equal(res, ref)
            out[unit] = report.cycles(conv_placement(report))
    return out


@pytest.mark.parametrize("config", ["default", "pipelined"])
def test_choice_is_the_fewer_modelled_cycles(config, monkeypatch):
    """The plan chosen is the one whose program the cycle model times faster (each unit built on
    its own); ResNeXt-50's 128-channel, 4-wide layer at 28x28 takes the CSP plan on default and
    the block-diagonal program on pipelined."""
    mod, arrays, ref = case(128, 28, 32, 1)
    cycles = _unit_cycles(mod, arrays, ref, config, monkeypatch)
    out, report = vta_build(mod, arrays, config)
    np.testing.assert_array_equal(out, ref)
    p = conv_placement(report)
    winner = min(cycles, key=cycles.get)
    assert report.cycles(p) == cycles[winner]
    assert winner == ("csp" if config == "default" else "diagonal")
    assert ("GEMM block-diagonal" in p.plan) == (winner == "diagonal")
    assert "fewest cycles on the cycle model" in p.detail
    assert f"{cycles[winner]:,} cycles against {max(cycles.values()):,} cycles" in p.detail
    assert report.floor(p).total <= report.cycles(p)


def test_refused_widths_weigh_the_csp_plan_and_block_sparse():
    """6 channels per group do not divide the 16-lane block: the block-diagonal unit is refused
    with the reason, and the CSP plan and the block-sparse program (tvm_csp_embed.blocksparse)
    are weighed against each other."""
    mod, arrays, ref = case(48, 6, 8, 1)
    out, report = vta_build(mod, arrays, "pipelined")
    np.testing.assert_array_equal(out, ref)
    p = conv_placement(report)
    assert p.device == "vta" and "block-diagonal" not in p.plan
    assert "do not divide the 16-channel block" in p.detail
    assert "fewest cycles on the cycle model" in p.detail
    assert "the CSP plan" in p.detail and "GEMM block-sparse" in p.detail


def test_footprint_keeps_the_csp_plan():
    mod, arrays, ref = case(128, 6, 32, 1)
    out, report = vta_build(mod, arrays, "pipelined", objective="footprint")
    np.testing.assert_array_equal(out, ref)
    p = conv_placement(report)
    assert "block-diagonal" not in p.plan and "not compared by footprint" in p.detail


def test_end_to_end_prices_the_host_and_the_cpu():
    """Under end-to-end the two units and the CPU compete with their host layout traffic; the
    report line gives each figure."""
    mod, arrays, ref = case(128, 14, 32, 1)
    out, report = vta_build(mod, arrays, "pipelined", objective="end-to-end")
    np.testing.assert_array_equal(out, ref)
    p = conv_placement(report)
    if p.device == "vta":
        assert "cycles end to end" in p.detail and "B host layout" in p.detail
    else:
        assert "end to end cheaper on the CPU" in p.detail


@pytest.mark.slow
def test_combined_prices_the_measured_host_relayout():
    """(slow: the CSP choice measures the host relayout of each of its candidates, ~17 s)"""
    mod, arrays, ref = case(128, 6, 32, 1)
    out, report = vta_build(mod, arrays, "pipelined", objective="combined")
    np.testing.assert_array_equal(out, ref)
    p = conv_placement(report)
    assert "fastest combined" in p.detail and p.detail.count(" ms (cycles ") >= 2


def test_stride_pad_geometry_on_the_diagonal_unit(diagonal_only):
    """A 1x1 grouped conv of stride 2 and a 5x5 one with padding 2, 8-wide groups."""
    for c, hw, g, s, k, pad in ((64, 7, 8, 2, 1, 0), (32, 6, 4, 1, 5, 2)):
        mod, arrays, ref = case(c, hw, g, s, k, pad)
        out, report = vta_build(mod, arrays, "pipelined")
        np.testing.assert_array_equal(out, ref)
        assert "block-diagonal" in conv_placement(report).plan


def _on_rtl(rtl, shape, unit=None):
    mod, arrays, ref = case(*shape)
    with vta_ext.build_options(strategy="csp-relaxed", objective="cycles"):
        vm = relax.VirtualMachine(relax.build(mod, target=vta_ext.vta_target("pynq")), tvm.cpu())
    p = conv_placement(vta_ext.last_build_report())
    assert p.device == "vta"
    if unit is not None:
        assert ("block-diagonal" in p.plan) == (unit == "diagonal"), p.plan
    np.testing.assert_array_equal(run_one_call_on(rtl, vm, arrays), ref)


@pytest.mark.parametrize("shape", [(128, 6, 32, 1), (256, 7, 32, 2)], ids=_id)
def test_pynq_rtl_bit_exact(rtl, shape, diagonal_only):
    _on_rtl(rtl, shape, "diagonal")


# ------------------------------------------------------------------------------ networks (slow)
def resnext_narrow_shapes(size=224):
    """The distinct narrow grouped layers ``(C, H, groups, stride)`` of ResNeXt-50 32x4d at
    ``size`` (3x3, padding 1), read from the torch module with forward hooks."""
    def shape_of(m, x):
        assert m.kernel_size == (3, 3) and m.padding == (1, 1)
        return m.in_channels, int(x.shape[-1]), m.groups, m.stride[0]

    return conv_layer_shapes(
        ["resnext50_32x4d"], size,
        lambda m: 1 < m.groups < m.in_channels and m.in_channels // m.groups < 16, shape_of)


@pytest.mark.slow
@pytest.mark.parametrize("config", PRESETS)
@pytest.mark.parametrize("unit", ["chosen", "diagonal"])
def test_resnext_narrow_layers_bit_exact(config, unit, request):
    """Every narrow grouped layer of ResNeXt-50 32x4d at 224 (full size), against numpy and
    llvm, with the unit the choice takes and with the block-diagonal unit alone."""
    if unit == "diagonal":
        request.getfixturevalue("diagonal_only")
    shapes = resnext_narrow_shapes()
    assert shapes == [(128, 56, 32, 1), (256, 28, 32, 1), (256, 56, 32, 2)]
    for shape in shapes:
        mod, arrays, ref = case(*shape)
        out, report = vta_build(mod, arrays, config)
        assert conv_placement(report).device == "vta", (shape, str(report))
        np.testing.assert_array_equal(out, ref, err_msg=str(shape))
        if config == "default" and unit == "chosen":
            np.testing.assert_array_equal(run(mod, "llvm", arrays), ref, err_msg=str(shape))


def test_the_diagonal_unit_tunes_and_verifies(tmp_path, monkeypatch):
    """The block-diagonal program is a tuning task under csp-relaxed (the conv2d knobs); its best
    point is verified against the grouped-conv numpy reference of its tiles."""
    from tvm_csp_embed import tune

    mod, arrays, ref = case(64, 6, 8, 1)
    monkeypatch.setattr(CspGemmTemplate, "_plan",
                        lambda *a: (_ for _ in ()).throw(TemplateRefusal("withheld")))
    with vta_ext.build_options(objective="cycles"):
        (task,) = tune.extract_tasks(mod, strategy="csp-relaxed")
    assert task.kind == "group_conv2d" and len(task.knob_space) > 1
    assert dataclasses.asdict(task.workload)["group_width"] == 8
    best = tune.RandomTuner(task, seed=0).tune(
        4, tune.measure_option(runner=tune.LocalRunner(0)),
        callbacks=[tune.callback.log_to_file(tmp_path / "g.json")])
    assert best.verified


def _program_bytes(report) -> bytes:
    """The DRAM image (instructions, micro-ops and the data of its last run) of the grouped
    layer's program."""
    from vta_ext.executor import compiled_op

    return bytes(compiled_op(report.key_of(conv_placement(report))).program.dram)


def cold_start_counting_scores(monkeypatch):
    """Forget the compiled operators and cycle reports in memory (a warm build then reads only
    the disk caches) and count the units :class:`~tvm_csp_embed.grouped.NarrowGroupTemplate`
    builds and scores from now on: the list of their arguments."""
    from tvm_csp_embed import grouped
    from vta_ext import executor

    executor._COMPILED.clear()
    executor._CYCLES.clear()
    scored = []
    score = grouped.NarrowGroupTemplate._score

    def counted(self, *args):
        scored.append(args)
        return score(self, *args)

    monkeypatch.setattr(grouped.NarrowGroupTemplate, "_score", counted)
    return scored


@pytest.mark.parametrize("config,objective,shape,chosen", [
    ("default", "cycles", (128, 28, 32, 1), "csp"),
    pytest.param("pipelined", "cycles", (128, 28, 32, 1), "diagonal", marks=pytest.mark.slow),
    ("default", "end-to-end", (256, 28, 32, 1), "diagonal only")])
def test_warm_build_times_no_unit(config, objective, shape, chosen, tmp_path, monkeypatch):
    """The unit chosen for a narrow grouped layer is kept on disk (``units/``): a warm build
    (nothing in memory) builds and times no unit, places the same plan with the same program
    bytes and stays bit-exact against numpy; a changed key (other code) misses and decides again.
    The CSP plan wins on default, the block-diagonal program on pipelined; end to end on default
    the CSP plan is refused (the CPU is cheaper than it: a decision its own plan cache keeps) and
    the block-diagonal program is weighed against the CPU alone. That case runs on a host that
    moves 4 layout bytes per VTA cycle: at the Zynq's 6.5, since the CSP plan's host relayout
    chains are one fused kernel each, its 2.95 MB of layout cost less than the CPU's MACs."""
    from tvm_csp_embed import grouped

    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    host = {"layout_bytes_per_cycle": 4.0} if chosen == "diagonal only" else None
    mod, arrays, ref = case(*shape)
    cold_out, cold = vta_build(mod, arrays, config, objective, host)
    p = conv_placement(cold)
    assert ("GEMM block-diagonal" in p.plan) == (chosen != "csp")
    assert ("the CSP plan refused" in p.detail) == (chosen == "diagonal only"), p.detail
    cold_bytes = _program_bytes(cold)
    assert len(list((tmp_path / "units").glob("*.json"))) == 1
    scored = cold_start_counting_scores(monkeypatch)
    warm_out, warm = vta_build(mod, arrays, config, objective, host)
    assert not scored, "a warm build must not build and time the units again"
    np.testing.assert_array_equal(cold_out, ref)
    np.testing.assert_array_equal(warm_out, ref)
    assert conv_placement(warm) == p
    assert _program_bytes(warm) == cold_bytes
    monkeypatch.setattr(grouped, "source_digest", lambda: "other code")
    missed_out, missed = vta_build(mod, arrays, config, objective, host)
    # the units, and the block-diagonal program's twin that adds the (constant) bias by a GEMM
    assert len(scored) == (2 if chosen == "diagonal only" else 3), "a changed key must decide again"
    np.testing.assert_array_equal(missed_out, ref)
    assert conv_placement(missed) == p
    assert len(list((tmp_path / "units").glob("*.json"))) == 2
