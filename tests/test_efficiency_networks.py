"""``scripts/efficiency.py --networks``: the breakdown of a network's VTA cycles and floor by
operator kind.

On MobileNetV2 at 32x32 (full depth; stem, 1x1, depthwise convs, residual adds, average pool and
the classifier all on VTA): the kinds' cycles and floors add up to the build report's own totals
(``vta_cycles`` sums the cycle reports of the build's keys, ``vta_floor`` the placements' floors),
and every VTA placement lands in exactly one kind, the kind of the torch module it came from
(its source layer) classified from the module's own attributes, not from the compiled key.
"""
from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch.nn as nn
import tvm

import vta_ext
import tvm_csp_embed  # noqa: F401 -- registers the CSP strategies

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "relay_examples"))
from models import quantized_example  # noqa: E402

_spec = importlib.util.spec_from_file_location("efficiency_script", REPO / "scripts" / "efficiency.py")
efficiency = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(efficiency)


def _torch_kind(module) -> str:
    """The kind of a torch module by its own attributes (the reference)."""
    if isinstance(module, nn.Conv2d):
        if module.groups == 1:
            return "gemm_conv" if module.kernel_size[0] * module.kernel_size[1] > 1 else "pointwise"
        return "depthwise" if module.groups == module.in_channels else "grouped"
    if isinstance(module, nn.Linear):
        return "pointwise"
    if isinstance(module, (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d)):
        return "pools"
    raise AssertionError(f"no reference kind for {type(module).__name__}")


@pytest.fixture(scope="module", params=[
    ("default", "stock"), pytest.param(("pynq", "csp-relaxed"), marks=pytest.mark.slow)])
def built(request):
    config, strategy = request.param
    model, qmodel, _, _ = quantized_example("mobilenet_v2", 32)
    with vta_ext.build_options(strategy=strategy):
        tvm.relax.build(qmodel.mod, target=vta_ext.vta_target(config))
    return model, vta_ext.last_build_report()


def test_kinds_add_up_to_the_report_totals(built):
    _, report = built
    rows = {r["kind"]: r for r in efficiency.network_breakdown(report)}
    kinds = [r for k, r in rows.items() if k != "total"]
    assert sum(r["ops"] for r in kinds) == len(report.vta_keys) == rows["total"]["ops"]
    assert sum(r["cycles"] for r in kinds) == report.vta_cycles == rows["total"]["cycles"]
    assert sum(r["floor"] for r in kinds) == pytest.approx(report.vta_floor, rel=1e-6)
    assert rows["total"]["floor"] == pytest.approx(report.vta_floor, rel=1e-6)
    assert sum(r["share"] for r in kinds) == pytest.approx(1, abs=1e-3)
    for r in kinds:
        assert r["loss"] == pytest.approx(r["cycles"] - r["floor"], abs=0.1)
        assert 0 < r["efficiency"] <= 1
    largest = max(kinds, key=lambda r: r["loss"])
    assert rows["total"]["largest_loss"] == largest["kind"]


def test_each_placement_has_the_kind_of_its_torch_module(built):
    model, report = built
    seen = Counter()
    for p in report.on_vta:
        kind = efficiency.operator_kind(report, p)
        assert kind in efficiency.KINDS
        if p.op == "relax.add":
            assert kind == "elementwise", p
        else:
            assert p.layer, f"{p.op} {p.name}: no source layer in the report"
            layer = p.layer.split(" (aten")[0]  # "features.0.0 (aten::conv2d)"
            if layer == "(top level) mean":  # MobileNetV2's x.mean((2, 3)): a global pool
                assert kind == "pools", p
            else:
                assert kind == _torch_kind(model.get_submodule(layer)), (p.layer, p.reason)
        seen[kind] += 1
    # MobileNetV2: 1 stem conv, 17 depthwise (on pynq only under csp-relaxed: GEMM unit), 34 1x1
    # convs + classifier; the 10 residual adds and the (1x1 at this size) pool on VTA: by LOAD
    # ACC_8BIT, or on pynq, which has none, under csp-relaxed by LOAD INP and identity GEMMs
    assert seen["gemm_conv"] == 1 and seen["depthwise"] == 17 and seen["pointwise"] == 35
    assert seen["elementwise"] == 10 and seen["pools"] == 1
    total = {r["kind"]: r for r in efficiency.network_breakdown(report)}["total"]
    assert total["cpu_refused"] in ("", "–"), total["cpu_refused"]


def test_lane_filling_layers_by_their_shapes():
    """C1 (3 -> 64, 7x7: 147 reduction lanes), D1 (16 channels a group, 3x3: 144), DB0 (1 -> 32,
    5x20: 100) fill the lanes. Only the cases with the bias + shift + clip epilogue count."""
    assert efficiency.case_lanes("resnet", "C1") == (64, 3 * 7 * 7)
    assert efficiency.case_lanes("mobilenet", "D1") == (32, 16 * 3 * 3)
    assert efficiency.case_lanes("deepbench", "DB0") == (32, 1 * 5 * 20)
    rows = [dict(set="resnet", case="C1", epilogue="bias-shift-clip", config="default",
                 strategy="csp-relaxed", efficiency="0.5"),
            dict(set="mobilenet", case="D1", epilogue="bias-shift-clip", config="default",
                 strategy="csp-relaxed", efficiency="0.8"),
            dict(set="deepbench", case="DB0", epilogue="none", config="default",
                 strategy="csp-relaxed", efficiency="0.1")]
    text = efficiency.lane_filling(rows)
    # geomean of 0.5 and 0.8 is 0.632; the DB0 row without the epilogue is left out
    assert "| default | csp-relaxed | 2 | 0.632 | 0.500 | 1: C1 |" in text
