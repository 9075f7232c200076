"""Whole networks (ResNet-18, MobileNet-1.0) quantised and built for ext_vta and llvm: equal bits.

The fast tests use 32x32 inputs (full depth); the 224x224 runs are marked slow. Whatever operators
the offload pass sends to VTA (today conv2d, pools, residual adds; more as templates land), the
ext_vta output must equal the llvm build of the same int8 module to the bit, because every VTA
operator and every CPU fallback is exact integer arithmetic.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

import vta_ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "relay_examples"))
from models import mac_placement, quantized_example  # noqa: E402
from vta_ext.quantize import op_macs  # noqa: E402


def _check_bit_exact(name: str, size: int, config: str = "default"):
    _, qm, _, data = quantized_example(name, size)
    outputs = {}
    for target in (vta_ext.vta_target(config), "llvm"):
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
    # every conv2d with groups=1 is offloadable today: it must have run on VTA
    placed = mac_placement(op_macs(qm.mod), report)
    assert placed["consistent"], placed
    dense_convs = sum(p.op == "relax.nn.conv2d" for p in report.on_vta)
    assert dense_convs >= (20 if name == "resnet18" else 14)
    assert len(runs) >= dense_convs
    assert all(r.cycles.total_cycles > 0 for r in runs)
    return placed


def test_resnet18_small_bit_exact():
    placed = _check_bit_exact("resnet18", 32)
    assert placed["vta"] / placed["total"] > 0.98  # all convs; only the 512x1000 classifier may stay


def test_mobilenet_v1_small_bit_exact():
    placed = _check_bit_exact("mobilenet_v1", 32)
    assert placed["vta"] / placed["total"] > 0.9  # pointwise convs carry ~95 % of the MACs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v1"])
def test_full_size_bit_exact(name):
    _check_bit_exact(name, 224)
