"""The programs a cold csp-relaxed build of narrow grouped convs builds (tvm_csp_embed.grouped):
each unit contender is built and timed once per (workload, knobs, epilogue shape), the repeated
layers of a network (the same conv, another shift) reuse its count, and the units are timed while
the build waits for a solve (``NarrowGroupTemplate.prefetch``); the plans, report lines and
programs stay those of building every contender, and the output bit-exact against numpy."""
from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_csp_embed  # noqa: F401 -- registers the CSP strategies
import vta_ext
from conftest import conv2d_nchw, conv_chain, requantize

#: two grouped convs of one shape (32 channels, groups of 4: the block-diagonal unit on a 16-lane
#: block), the second shifted by one less; the same weight and bias
C, HW, GROUPS, SHIFTS, CLIP = 32, 14, 8, (8, 7), (-128, 127)


def two_layers():
    """``main(x)``: the grouped conv + bias, >> 8, clip, then the same conv of its output + bias,
    >> 7, clip; with the input and the numpy reference."""
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (1, C, HW, HW)).astype(np.int8)
    w = rng.integers(-128, 128, (C, C // GROUPS, 3, 3)).astype(np.int8)
    b = rng.integers(-5000, 5000, (1, C, 1, 1)).astype(np.int32)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType((1, C, HW, HW), "int8"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = xv
            for s in SHIFTS:
                y = conv_chain(bb, y, relax.const(w), relax.const(b), padding=1, shift=s,
                               clip=CLIP, groups=GROUPS)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    ref = x
    for s in SHIFTS:
        ref = requantize(conv2d_nchw(ref, w, 1, 1, groups=GROUPS), b, s, CLIP)
    return bb.get(), x, ref


def fresh_process(monkeypatch, tmp_path):
    """An empty cache directory and nothing built, timed or refused in memory; returns the list
    the executor's builds of unit programs (block-diagonal or block-sparse) append their
    ``(workload, epilogue)`` to."""
    from tvm_csp_embed import depthwise, shape_cycles
    from vta_ext import executor

    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    monkeypatch.setattr(executor, "_COMPILED", {})
    monkeypatch.setattr(executor, "_CYCLES", {})
    monkeypatch.setattr(shape_cycles, "_COUNTS", {})
    monkeypatch.setattr(depthwise, "_REFUSED", {})
    built = []
    build_spec = executor.build_spec

    def counted(spec, config):
        if "group_width" in spec["workload"]:
            built.append((json.dumps(spec["workload"], sort_keys=True), spec["epilogue"]))
        return build_spec(spec, config)
    monkeypatch.setattr(executor, "build_spec", counted)
    return built


def build(mod, x):
    with vta_ext.build_options(strategy="csp-relaxed", objective="cycles"):
        ex = relax.build(mod, target=vta_ext.vta_target("default"))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    return out, vta_ext.last_build_report()


def grouped(report):
    return [p for p in report.placements if p.op == "relax.nn.conv2d"]


def test_a_repeated_layer_times_no_unit_again(tmp_path, monkeypatch):
    """Counted at the executor: the first layer's block-diagonal program and its twin that adds
    the bias by a GEMM (the two contenders of its unit, by hand: groups of 4 divide the block, so
    the block-sparse program refuses), and of the second layer (same workloads, another shift)
    only the program the build runs, when a unit is chosen: 2 + the chosen unit programs of the
    second layer. Both layers' report lines give the same unit cycles (the same instruction
    streams but the immediates), and each VTA program's cycle count, built from its own key,
    is the one its line reports."""
    from vta_ext.executor import cycle_report

    mod, x, ref = two_layers()
    built = fresh_process(monkeypatch, tmp_path)
    out, report = build(mod, x)
    np.testing.assert_array_equal(out, ref)
    first, second = grouped(report)
    assert first.device == second.device == "vta", (first.reason, second.reason)
    second_unit = "block-diagonal" in second.plan
    assert len(built) == 2 + second_unit, built
    assert len({wl for wl, _ in built[:2]}) == 2       # the ALU ADD and the GEMM bias
    cut = lambda p: p.detail.split(" chosen by ")[1].split(", epilogue")[0]  # noqa: E731
    assert cut(first) == cut(second)
    for p in (first, second):
        cycles = cycle_report(report.key_of(p)).total_cycles
        assert f"{cycles:,}" in p.detail, (cycles, p.detail)


def test_prefetched_units_are_the_ones_planned(tmp_path, monkeypatch):
    """The idle work the template queues (``prefetch``) times each narrow grouped conv's unit
    contenders before its plan: run to exhaustion before the build, the build itself then builds
    no unit program but the ones it runs with another shift (the second layer's), and its plans
    and report lines are those of a build without the idle work (a fresh process each)."""
    from tvm_csp_embed import cache
    from tvm_csp_embed.grouped import NarrowGroupTemplate

    mod, x, ref = two_layers()
    built = fresh_process(monkeypatch, tmp_path / "plain")
    monkeypatch.setattr(NarrowGroupTemplate, "prefetch", NarrowGroupTemplate.__mro__[1].prefetch)
    _, plain = build(mod, x)
    monkeypatch.undo()

    built = fresh_process(monkeypatch, tmp_path / "idle")
    drained = []
    prefetch = NarrowGroupTemplate.prefetch

    def prefetch_then_idle(self, ops, config):
        prefetch(self, ops, config)
        step = self._units_idle
        while step in cache._IDLE and step():
            drained.append(len(built))
    monkeypatch.setattr(NarrowGroupTemplate, "prefetch", prefetch_then_idle)
    out, report = build(mod, x)
    np.testing.assert_array_equal(out, ref)
    assert drained == [2, 2], drained       # both layers stepped; the second timed nothing new
    assert len(built) == 2 + ("block-diagonal" in grouped(report)[1].plan)
    assert [p.detail for p in grouped(report)] == [p.detail for p in grouped(plain)]
    assert [p.plan for p in grouped(report)] == [p.plan for p in grouped(plain)]
