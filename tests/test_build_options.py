"""The build seam: strategies, build_options, cache keys by config value, refusals vs failures,
thread-safe runs."""
from __future__ import annotations

import dataclasses
import re
import threading

import numpy as np
import pytest
import tvm
from tvm import relax

import vta_ext
from conftest import conv2d_nchw, conv_module, random_inputs, requantize, run_module
from vta_ext import executor, strategy
from vta_ext.errors import TemplateRefusal, VTABuildError
from vta_ext.stock import StockConv2d

#: ResNet-18 C2, one call on the original stack (TVM v0.18 + apache fsim), fallback schedule,
#: compute conv >> 8 + bias, clip [0, 127] (the original integration test)
ORIGINAL_C2 = {"inp_load_nbytes": 7_054_336, "wgt_load_nbytes": 115_605_504,
               "acc_load_nbytes": 802_816, "out_store_nbytes": 200_704,
               "gemm_counter": 451_584, "alu_counter": 50_176}


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown VTA strategy 'nope'.*'stock'"):
        vta_ext.build_options(strategy="nope")
    with pytest.raises(ValueError, match=r"unknown knob policy 'fast'.*\['cycles', 'tps', 'fallback'\]"):
        vta_ext.build_options(knobs="fast")
    with pytest.raises(ValueError, match="knobs must be one of"):
        vta_ext.build_options(knobs=3)
    with pytest.raises(ValueError, match="best_knobs"):
        vta_ext.build_options(records="net.json")
    with pytest.raises(ValueError, match=r"unknown layout 'NWHC'; use one of \['auto', 'NCHW', 'NHWC'\]"):
        vta_ext.build_options(layout="NWHC")
    with pytest.raises(ValueError, match=r"unknown objective 'speed'.*'footprint'"):
        vta_ext.build_options(objective="speed")


def test_options_nest_and_restore():
    from vta_ext.options import current_options

    assert current_options().knobs == "cycles"
    with vta_ext.build_options(strategy="stock", knobs="fallback") as outer:
        assert current_options() is outer
        with vta_ext.build_options(knobs={"tile_h": 2}):
            assert current_options().knobs == {"tile_h": 2}
        assert current_options() is outer
    assert current_options().knobs == "cycles"
    assert repr(outer) == "build_options(strategy='stock', knobs='fallback')"


@pytest.mark.slow  # the counters: test_conv2d_template.py::test_dropin_fidelity_resnet18_c2_fallback
def test_resnet18_c2_fallback_through_relax_build_gives_the_original_counters():
    mod = conv_module(1, 64, 64, 56, 3, stride=1, padding=1, bias=True, shift=8, clip=(0, 127),
                      order=("shr", "bias", "clip"))
    arrays = random_inputs(mod, seed=2)
    vta_ext.clear_run_log()
    with vta_ext.build_options(strategy="stock", knobs="fallback"):
        got = run_module(mod, vta_ext.vta_target("apache"), arrays)
    report = vta_ext.last_build_report()
    assert report.placement() == [("relax.nn.conv2d", "vta")]
    assert report.on_vta[0].reason == "conv2d (stock template)"
    assert "fallback knobs" in report.on_vta[0].detail
    (run,) = vta_ext.run_log()
    assert run.strategy == "stock"
    counters = run.stats.as_dict()
    assert {k: counters[k] for k in ORIGINAL_C2} == ORIGINAL_C2
    x, w, b = arrays
    ref = requantize(conv2d_nchw(x, w, 1, 1), b, 8, (0, 127), order=("shr", "bias", "clip"))
    np.testing.assert_array_equal(got, ref)


def test_knob_policies_change_the_program():
    mod = conv_module(1, 32, 32, 14, 3)
    keys = {}
    for knobs in ("fallback", "tps"):
        with vta_ext.build_options(strategy="stock", knobs=knobs):
            relax.build(mod, target="ext_vta")
        detail = vta_ext.last_build_report().on_vta[0].detail
        assert f"{knobs} knobs" in detail
        keys[knobs] = detail
    # fallback = every inner tile 1; TPS picks larger tiles for this small layer
    assert "all inner tiles 1" in keys["fallback"] and "all inner tiles 1" not in keys["tps"]


def test_configs_that_share_a_name_share_nothing():
    """Two configurations named "default" that differ in value (GEMM cycles per uop 4 vs 1)."""
    from vta_ext.templates.conv2d import Conv2dWorkload

    slow = vta_ext.load_config("default")
    fast = dataclasses.replace(slow, GEMM_CYCLES_PER_UOP=1)
    assert slow.name == fast.name
    wl = Conv2dWorkload(1, 8, 8, 16, 16, 3, 3, 1, 1, 1, 1)
    keys = [executor.op_key("conv2d", "stock", cfg, wl, (("shr", 4),), "tps")
            for cfg in (slow, fast)]
    assert keys[0] != keys[1]
    ops = [executor.compiled_op(k) for k in keys]
    assert ops[0] is not ops[1]
    assert executor.simulator_for(slow) is not executor.simulator_for(fast)
    cycles = [executor.cycle_report(k) for k in keys]
    assert cycles[0].config.GEMM_CYCLES_PER_UOP == 4 and cycles[1].config.GEMM_CYCLES_PER_UOP == 1
    # the same instructions, but a 4x slower GEMM must cost more cycles
    assert ops[0].program.insn_count == ops[1].program.insn_count
    assert cycles[0].total_cycles > cycles[1].total_cycles


class _Raising(StockConv2d):
    strategy = "probe"

    def build(self, config, workload, epilogue, knobs):
        raise IndexError("template bug")


class _Refusing(StockConv2d):
    strategy = "probe"

    def plan(self, op, config):
        raise TemplateRefusal("this test's template refuses every conv2d")


@pytest.fixture
def injected():
    """Register templates of a throw-away strategy "probe"; remove them afterwards."""
    strategy.register_strategy(strategy.Strategy("probe", "test templates", fallback="stock"))
    yield lambda template: strategy.register_template("conv2d", "probe", template)
    strategy._TEMPLATES.pop(("conv2d", "probe"), None)
    strategy._STRATEGIES.pop("probe", None)


def _conv_pool_module():
    from conftest import conv_chain

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "int8"))
    w = relax.Var("w", relax.TensorType((16, 16, 3, 3), "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = conv_chain(bb, x, w, None, padding=1, shift=6, clip=(-128, 127))
            y = bb.emit(relax.op.nn.max_pool2d(y, pool_size=2, strides=2))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def test_a_template_that_raises_fails_the_build(injected):
    injected(_Raising())
    with vta_ext.build_options(strategy="probe"):
        with pytest.raises(VTABuildError, match=r"building conv2d 'lv' \(1x16x8x8, 16x16x3x3.*"
                                                r"strategy 'probe'.*IndexError: template bug"):
            relax.build(_conv_pool_module(), target="ext_vta")


def test_a_refusing_template_keeps_only_that_operator_on_the_cpu(injected):
    injected(_Refusing())
    mod = _conv_pool_module()
    arrays = random_inputs(mod, 5)
    with vta_ext.build_options(strategy="probe"):
        got = run_module(mod, "ext_vta", arrays)
    report = vta_ext.last_build_report()
    assert report.strategy == "probe"
    # the pool falls back to the stock template; the conv stays on the CPU with the reason
    assert report.placement() == [("relax.nn.max_pool2d", "vta"), ("relax.nn.conv2d", "cpu"),
                                  ("relax.right_shift", "cpu"), ("relax.clip", "cpu"),
                                  ("relax.astype", "cpu")]
    conv = [p for p in report.on_cpu if p.op == "relax.nn.conv2d"][0]
    assert conv.reason == "this test's template refuses every conv2d"
    np.testing.assert_array_equal(got, run_module(mod, "llvm", arrays))


def test_a_missing_template_module_is_reported_not_swallowed(injected):
    injected("vta_ext.templates.no_such_module:Template")
    with vta_ext.build_options(strategy="probe"):
        with pytest.raises(VTABuildError, match="'vta_ext.templates.no_such_module' cannot be "
                                                "imported"):
            relax.build(_conv_pool_module(), target="ext_vta")


def test_pipeline_hook_refuses_a_tvm_without_the_pipelines():
    from vta_ext.target import install_pipeline_hook

    with pytest.raises(RuntimeError, match=r"no Relax pipeline\(s\) \['default_build'\]"):
        install_pipeline_hook({"default": object(), "zero": object()})


def test_runs_from_four_threads_are_bit_exact():
    mod = conv_module(1, 16, 32, 8, 3, stride=1, padding=1, shift=6, clip=(-100, 100))
    executable = relax.build(mod, target="ext_vta")
    inputs = [random_inputs(mod, seed) for seed in range(4)]
    serial = [run_module(mod, "llvm", arrays) for arrays in inputs]
    results = {i: [] for i in range(4)}
    errors = []

    def worker(i):
        try:
            vm = relax.VirtualMachine(executable, tvm.cpu())
            args = [tvm.runtime.tensor(a) for a in inputs[i]]
            for _ in range(20):
                results[i].append(vm["main"](*args).numpy())
        except Exception as err:  # reported below with the thread number
            errors.append((i, repr(err)))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for i in range(4):
        assert len(results[i]) == 20
        for out in results[i]:
            np.testing.assert_array_equal(out, serial[i])


def test_explicit_knobs_reach_the_template_and_bad_ones_fail_the_build():
    mod = conv_module(1, 32, 32, 8, 3, shift=6)
    arrays = random_inputs(mod, 7)
    x, w, b = arrays
    ref = requantize(conv2d_nchw(x, w, 1, 1), b, 6, (0, 127))
    for knobs in ({"tile_h": 4, "tile_w": 8, "tile_ci": 2},
                  {"conv2d": {"tile_h": 4, "tile_w": 8, "tile_ci": 2}, "dense": {"tile_ci": 1}}):
        with vta_ext.build_options(strategy="stock", knobs=knobs):
            got = run_module(mod, "ext_vta", arrays)
        detail = vta_ext.last_build_report().on_vta[0].detail
        assert "explicit knobs, tiling tile_h=4 tile_w=8 tile_ci=2" in detail
        np.testing.assert_array_equal(got, ref)
    # 8 output rows cannot be split by 3, and "tile_q" is no knob: the build fails, naming them
    with vta_ext.build_options(strategy="stock", knobs={"tile_h": 3}):
        with pytest.raises(VTABuildError, match=r"building conv2d .*KnobError.*tile_h"):
            relax.build(mod, target="ext_vta")
    with vta_ext.build_options(strategy="stock", knobs={"tile_q": 2}):
        with pytest.raises(VTABuildError, match=r"KnobError: unknown Conv2dKnobs field\(s\) tile_q"):
            relax.build(mod, target="ext_vta")


def test_frontend_notes_name_the_source_layer_and_the_cpu_reason():
    """A frontend (the quantiser) may annotate variables with their source layer and why they stay
    on the CPU; the report carries both."""
    from vta_ext.offload import CPU_REASONS_ATTR, LAYERS_ATTR

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "int8"))
    w = relax.Var("w", relax.TensorType((16, 16, 3, 3), "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            from conftest import conv_chain
            y = conv_chain(bb, x, w, None, padding=1, shift=6, clip=(-128, 127))
            z = bb.emit(relax.op.sigmoid(relax.op.astype(y, "float32")))
            out = bb.emit_output(z)
        bb.emit_func_output(out)
    mod = bb.get()
    conv_var = [b.var.name for b in mod["main"].body.blocks[0].bindings][0]
    sig_var = [b.var.name for b in mod["main"].body.blocks[0].bindings
               if isinstance(b.value, relax.Call) and b.value.op.name == "relax.sigmoid"][0]
    mod["main"] = mod["main"].with_attr(LAYERS_ATTR, {conv_var: "features.0.conv",
                                                       sig_var: "features.1.act"}) \
                             .with_attr(CPU_REASONS_ATTR, {sig_var: "sigmoid: no LUT instruction"})
    relax.build(mod, target="ext_vta")
    report = vta_ext.last_build_report()
    conv, = report.on_vta
    assert (conv.name, conv.layer) == (conv_var, "features.0.conv")
    sig, = [p for p in report.on_cpu if p.op == "relax.sigmoid"]
    assert (sig.layer, sig.reason) == ("features.1.act", "sigmoid: no LUT instruction")
    # the report's line of the sigmoid: device, operator, source layer, why it stays on the CPU
    assert re.search(r"\n +\d+  CPU  sigmoid +features\.1\.act +sigmoid: no LUT instruction\n",
                     str(report)), str(report)
    assert re.search(r"\n +0  VTA  conv2d +features\.0\.conv +stock ", str(report)), str(report)


def test_keys_build_in_parallel_and_each_once(monkeypatch):
    """``compiled_op`` holds one lock per key, not one for every build: two keys build at the
    same time (each build waits at a two-party barrier, which a build serialised behind another
    would never pass), and four threads asking for one key build it once and get that program."""
    import threading
    from types import SimpleNamespace

    from vta_ext import executor

    cfg = vta_ext.load_config("default")
    keys = [executor.op_key("test_op", "test", cfg, {"n": n}, (), None) for n in range(3)]
    barrier = threading.Barrier(2, timeout=10)
    builds = []

    def fake_build(spec, config):
        builds.append(spec["workload"]["n"])
        if spec["workload"]["n"] < 2:
            barrier.wait()           # the other key's build must be running too
        return SimpleNamespace(program=SimpleNamespace(insn_count=spec["workload"]["n"]))
    monkeypatch.setattr(executor, "build_spec", fake_build)
    got, errors = {}, []

    def ask(key, slot):
        try:
            got[slot] = executor.compiled_op(key)
        except Exception as err:  # noqa: BLE001 -- reported below
            errors.append(err)
    try:
        threads = [threading.Thread(target=ask, args=(keys[i], i)) for i in range(2)]
        threads += [threading.Thread(target=ask, args=(keys[2], 2 + i)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert sorted(builds) == [0, 1, 2]
        assert {got[i].program.insn_count for i in range(2)} == {0, 1}
        assert len({id(got[i]) for i in range(2, 6)}) == 1
        assert executor._KEY_LOCKS._locks == {}       # no lock left behind
    finally:
        for key in keys:
            executor._COMPILED.pop(key, None)
