"""The pynq cycle model against the RTL of the Pynq HLS design (the judge).

* a handful of ``scripts/calibrate_rtl.py`` micro-benchmarks (a few seconds): model within ±5 %
  of the RTL's exact cycles, at memory latency 0 and 40;
* slow: a small part of ``scripts/model_vs_rtl.py``'s validation set (ResNet-18 layers at a 56x56
  input, stock and csp-relaxed, and the dense layer): every program within ±5 %.

Skipped, with the reason, when the RTL library cannot be built here
(:func:`vta_ext.device.vta_hw_library` raises).
"""
import importlib.util
import math
from pathlib import Path

import pytest

from vta_ext.config import VTAConfig, load_config
from vta_ext.sim.cycles import CycleModel

REPO = Path(__file__).resolve().parents[1]
#: benchmarks of every group: loads of the three types (one padded), a store, GEMM and ALU with
#: two loop levels, micro-op loads, a token ping-pong, a miniature double-buffered operator
BENCHMARKS = ("inp n1 x8 y8", "wgt n3 x4 y5", "acc x4 y4 pads (2, 2, 2, 2)", "store n1 x8 y8",
              "gemm n1 u8 o4 i4", "alu n1 u8 o4 i4", "uop+gemm n4 u32 distinct",
              "pingpong COMPUTE-STORE n5", "tiles n4 x4 u4 double alu1",
              "tiles n8 x16 u16 double alu1")


def _script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rtl_path():
    from vta_ext.device import DeviceError, vta_hw_library

    try:
        return vta_hw_library("rtl")
    except DeviceError as err:
        pytest.skip(f"the RTL library is not available here: {err}")


def _at(cfg, latency):
    return VTAConfig.from_dict({**cfg.to_dict(), "MEM_LATENCY_CYCLES": latency}, name=cfg.name)


@pytest.mark.parametrize("latency", [0, 40])
def test_pynq_model_within_5_percent_of_the_rtl_on_micro_benchmarks(rtl_path, latency):
    from vta_ext.device import open_device

    cal = _script("calibrate_rtl")
    cfg = load_config("pynq")
    builders = {name: build for name, _, build in cal.benchmarks(cfg)}
    model = CycleModel(_at(cfg, latency))
    dev = open_device(rtl_path, mem_latency=latency)
    try:
        errors = {}
        for name in BENCHMARKS:
            program = builders[name]()
            rtl = dev.run_program(program).cycles
            errors[name] = model.run_program(program).total_cycles / rtl - 1
    finally:
        dev.close()
    bad = {k: f"{100 * v:+.2f} %" for k, v in errors.items() if abs(v) > 0.05}
    assert not bad, f"model / RTL - 1 beyond ±5 % at latency {latency}: {bad}"


def test_tokens_in_flight_across_segments_on_the_rtl(rtl_path):
    """The RTL keeps a token pushed before a segment's FINISH for the next segment (the cycle
    model carries it; it used to report a deadlock): the split program runs, stores what the
    simulator stores, and the model is within ±5 % of its cycles."""
    import numpy as np

    from test_cycles import split_tile
    from vta_ext.device import open_device
    from vta_ext.sim.fsim import FunctionalSimulator

    cfg = load_config("pynq")
    expected = split_tile(cfg)
    expected.run(FunctionalSimulator(cfg))
    program = split_tile(cfg)
    dev = open_device(rtl_path)
    try:
        rtl = dev.run_program(program).cycles
    finally:
        dev.close()
    np.testing.assert_array_equal(program.read("out", np.int8, (1, 16)),
                                  expected.read("out", np.int8, (1, 16)))
    assert abs(CycleModel(cfg).run_program(program).total_cycles / rtl - 1) <= 0.05


@pytest.mark.slow
def test_pynq_model_within_5_percent_of_the_rtl_on_compiled_layers(rtl_path, tmp_path):
    mvr = _script("model_vs_rtl")
    rows = mvr.run(["resnet56", "other"], ["stock", "csp-relaxed"], [0, 40],
                   only={"C2", "C5", "C8", "C11", "dense512x1000"}, out=tmp_path, progress=False)
    measured = [r for r in rows if r.get("rtl_cycles")]
    assert len(measured) >= 16
    bad = [(r["layer"], r["strategy"], r["latency"], r["error"]) for r in measured
           if abs(r["error"]) > 0.05]
    assert not bad
    geo = math.exp(sum(math.log(max(abs(r["error"]), 1e-6)) for r in measured) / len(measured))
    assert geo <= 0.02
