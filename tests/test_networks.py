"""Whole networks (ResNet-18, MobileNet-1.0) quantised and built for ext_vta and llvm: equal bits.

The fast tests use 32x32 inputs (full depth); the 224x224 runs are marked slow. The ext_vta output
must equal the llvm build of the same int8 module to the bit; since the CPU path is exact too, the
tests also assert where every operator ran, from the build report, against the model's structure.
"""
from __future__ import annotations

import os
import sys

from collections import Counter
from typing import Optional

import numpy as np
import pytest
import torch.nn as nn
import tvm
from tvm import relax

import vta_ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "relay_examples"))
from models import BasicBlock, mac_placement, quantized_example  # noqa: E402
from vta_ext.quantize import op_macs  # noqa: E402


#: where each module of the example models runs (the documented offload coverage, docs/templates-api.md)
ON_VTA = {nn.Conv2d: "relax.nn.conv2d", nn.Linear: "relax.matmul", nn.MaxPool2d: "relax.nn.max_pool2d",
          nn.AdaptiveAvgPool2d: "relax.nn.avg_pool2d", BasicBlock: "relax.add"}
#: what stays on the CPU: quantising the float input, flattening, dequantising the logits
ON_CPU = ["relax.multiply", "relax.round", "relax.clip", "relax.astype", "relax.reshape",
          "relax.astype", "relax.multiply"]


def _expected_vta_ops(model) -> Counter:
    """Relax operators the model's torch modules become on VTA, counted from the model itself."""
    return Counter(op for m in model.modules() for cls, op in ON_VTA.items() if isinstance(m, cls))


def _check_bit_exact(name: str, size: int, config: str = "default",
                     strategy: Optional[str] = None, plans: Optional[list] = None):
    model, qm, _, data = quantized_example(name, size)
    outputs = {}
    for target in (vta_ext.vta_target(config), "llvm"):
        with vta_ext.build_options(strategy=strategy):
            vm = relax.VirtualMachine(relax.build(qm.mod, target=target), tvm.cpu())
        if target != "llvm":
            report = vta_ext.last_build_report()
            vta_ext.clear_run_log()
        outputs[str(target)] = vm["main"](tvm.runtime.tensor(data))[0].numpy()
        if target != "llvm":
            runs = vta_ext.run_log()
    vta_out, llvm_out = outputs.values()
    np.testing.assert_array_equal(vta_out, llvm_out)
    assert np.abs(llvm_out).max() > 0  # not a degenerate all-zero output
    # placement, operator by operator: every conv, linear, pool and residual add on VTA, ...
    placement = report.placement()
    vta = [op for op, device in placement if device == "vta"]
    # a residual add fused into its conv (vta_ext.offload.fusion) runs in the conv's VTA call
    fused = ["relax.add" for p in report.on_vta if p.reason.startswith("conv2d + add")]
    assert Counter(vta + fused) == _expected_vta_ops(model)
    # ... and on the CPU exactly the input quantisation, the flatten and the output dequantisation
    assert [op for op, device in placement if device == "cpu"] == ON_CPU
    assert all(p.reason == "no VTA template for this operator" for p in report.on_cpu
               if p.reason != "layout transform around a VTA operator")
    assert placement[:len(vta)] == [(op, "vta") for op in vta]
    # one simulator run per VTA operator, each with a cycle report
    assert [r.op for r in runs] == [p.reason.split(" ")[0] for p in report.on_vta]
    assert all(r.cycles.total_cycles > 0 for r in runs)
    if plans is not None:
        plans.extend(report.on_vta)
    return mac_placement(op_macs(qm.mod), report)


def test_resnet18_small_bit_exact():
    import tvm_csp_embed  # noqa: F401  (registers csp-relaxed)

    plans = []
    placed = _check_bit_exact("resnet18", 32, strategy="csp-relaxed", plans=plans)
    assert placed["vta"] == placed["total"]
    # every conv an embedding or the stock template (csp-relaxed's choice), at least one embedded,
    # no stock fallback knobs anywhere
    convs = [p for p in plans if p.op == "relax.nn.conv2d"]
    assert convs and all("embedding" in p.reason or "stock" in p.reason for p in convs)
    assert any(p.reason == "conv2d (csp-relaxed embedding)" for p in convs)
    assert all("STOCK FALLBACK" not in p.detail for p in plans)


@pytest.mark.slow  # the small network of the default run is ResNet-18 (above)
def test_mobilenet_v1_small_bit_exact():
    placed = _check_bit_exact("mobilenet_v1", 32)
    assert placed["vta"] == placed["total"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v1"])
def test_full_size_bit_exact(name):
    _check_bit_exact(name, 224)


def _csp_relaxed_bit_exact(name: str, size: int, config: str, **options):
    """Build the quantised example ``name`` at ``size`` under csp-relaxed (and ``options`` of
    :func:`vta_ext.build_options`) for ``config`` and for llvm, check the outputs equal to the bit
    (and not all zero); the ext_vta build report."""
    import tvm_csp_embed  # noqa: F401  (registers csp-relaxed)

    _, qm, _, data = quantized_example(name, size)
    outputs = []
    for target in (vta_ext.vta_target(config), "llvm"):
        with vta_ext.build_options(strategy="csp-relaxed", **options):
            vm = relax.VirtualMachine(relax.build(qm.mod, target=target), tvm.cpu())
        if target != "llvm":
            report = vta_ext.last_build_report()
        outputs.append(vm["main"](tvm.runtime.tensor(data))[0].numpy())
    np.testing.assert_array_equal(*outputs)
    assert np.abs(outputs[1]).max() > 0
    return report


@pytest.mark.slow
def test_regnet_x_400mf_112_fused_adds_bit_exact():
    """regnet_x_400mf 112 on ``pipelined`` with ``fuse_residual=True``: residual adds fused into
    their convs where the cycle model prefers it (``vta_ext.offload.fusion``), the output equal to llvm's to the bit, the
    fused operators' floors below their cycles."""
    report = _csp_relaxed_bit_exact("regnet_x_400mf", 112, "pipelined", fuse_residual=True)
    fused = [p for p in report.on_vta if p.reason.startswith("conv2d + add")]
    assert fused
    assert all(report.floor(p).total <= report.cycles(p) for p in fused)


@pytest.mark.slow   # 20-30 s each cold; the fast check: tests/test_pool_offload.py
@pytest.mark.parametrize("name,size", [("squeezenet1_1", 32), ("squeezenet1_1", 112),
                                       ("vgg11", 32), ("alexnet", 64)])
def test_fused_pools_bit_exact(name, size):
    """``name`` at ``size`` on ``pipelined`` with ``fuse_pool=True``: its unpadded max pools (a
    squeezenet fire module's of a channel concat split into one pool per part:
    ``vta_ext.offload.poolsplit``) fused into their convs where the cycle model prefers it, the
    output equal to llvm's to the bit; each fused operator names its pool, each pool left alone
    says why, the fused floors below their cycles."""
    report = _csp_relaxed_bit_exact(name, size, "pipelined", fuse_pool=True)
    fused = [p for p in report.on_vta if p.reason.startswith("conv2d + max pool")]
    assert fused and all("; max pool maxpool_" in p.detail and "decided by the cycle model"
                         in p.detail for p in fused)
    alone = [p for p in report.on_vta if p.op == "relax.nn.max_pool2d"]
    assert all("not fused into its conv: " in p.detail for p in alone)
    assert all(report.floor(p).total <= report.cycles(p) for p in fused)


@pytest.mark.slow  # the handover of lane constants: test_lane_handover.py, in the default run
@pytest.mark.parametrize("name", ["regnet_x_1_6gf"])
def test_regnet_lane_constants_bit_exact(name):
    """RegNetX's 72/168/408 channels pad 8 channels of every packed activation: the grouped
    convs and residual adds hand over lane constants their 1x1 consumers fold their biases into
    (``tvm_csp_embed.lanes``). The ext_vta output equals the llvm build to the bit, and the build
    report shows both the producers writing and the consumers folding with no host pass."""
    report = _csp_relaxed_bit_exact(name, 32, "default")
    details = [p.detail for p in report.on_vta]
    writers = [d for d in details if "writes lane constants (1, 127 x7)" in d]
    folders = [d for d in details if "written by the producer into its padded channels" in d]
    assert writers and folders
    # every folding consumer takes its input over from the producer (no host pass)
    assert all("input kept in the packed layout of the previous VTA operator" in d for d in folders)
