"""Emission and timing stay byte-identical: fixed programs' instruction words, DRAM images and
cycle reports against fingerprints taken from the code before the cheaper emission.

The expected values below were produced by running this module's builders (``python
tests/test_emission_identity.py``) on main at 1cea7b4, before ``vta_ext/runtime.py`` and
``vta_ext/sim/cycles.py`` were made cheaper per instruction (docs/choice-speed.md, "Cheaper
emission"), and are the same at c7eb244: they come from the unchanged code, so they are an
independent reference for the new code, not a copy of its output. The programs are operators
of ResNet-18 and MobileNetV2 224 as a cold csp-relaxed build makes them (stock templates and the
stock contenders of the csp strategy, no solver needed), and a synthetic stream that exercises the
micro-op cache (hits, misses, evictions, wrap-around), padded loads, ALU kernels and dependency
NOPs. A change to any instruction field, micro-op, DRAM layout, or to the cycle model's totals,
per-module busy/stall/idle or DRAM bytes fails here.
"""
import hashlib
import json

import numpy as np
import pytest

import tvm_csp_embed  # noqa: F401  (registers the csp-relaxed strategy)
from vta_ext import executor
from vta_ext.config import load_config
from vta_ext.isa import AluOp, MemType, Stage, encode_stream
from vta_ext.runtime import CommandQueue, UopKernel
from vta_ext.sim.cycles import CycleModel

CFG = load_config("default")

#: operator keys (``executor.op_key`` without the configuration value) from cold ResNet-18 and
#: MobileNetV2 224 csp-relaxed builds
SPECS = {
    "add_160x7x7": {"config": "default", "epilogue": [["clip", -128, 127]], "knobs": "cycles", "op": "add", "strategy": "stock", "workload": {"batch": 1, "channels": 160, "height": 7, "width": 7}},  # noqa: E501
    "conv1x1_576_160": {"config": "default", "epilogue": [["bias"], ["shr", 8], ["clip", -128, 127]], "knobs": "cycles", "op": "conv2d", "strategy": "csp-relaxed", "workload": {"bias_lanes": 0, "binding": 1, "bit_dims": [], "bit_steps": [], "layout": "NCHW", "mode": "relaxed", "op": "conv2d", "pad": [], "params": [], "stock": [["batch", 1], ["height", 7], ["width", 7], ["in_channels", 576], ["out_channels", 160], ["kernel_h", 1], ["kernel_w", 1], ["pad_h", 0], ["pad_w", 0], ["stride_h", 1], ["stride_w", 1]]}},  # noqa: E501
    "dense_512_1008": {"config": "default", "epilogue": [["bias"], ["shr", 8], ["clip", -128, 127]], "knobs": "cycles", "op": "dense", "strategy": "csp-relaxed", "workload": {"bias_lanes": 0, "binding": 1, "bit_dims": [], "bit_steps": [], "layout": "NCHW", "mode": "relaxed", "op": "dense", "pad": [], "params": [], "stock": [["batch", 1], ["in_features", 512], ["out_features", 1008]]}},  # noqa: E501
    "conv3x3_s2_256_512": {"config": "default", "epilogue": [["bias"], ["shr", 10], ["clip", 0, 127]], "knobs": "cycles", "op": "conv2d", "strategy": "csp-relaxed", "workload": {"bias_lanes": 0, "binding": 1, "bit_dims": [], "bit_steps": [], "layout": "NCHW", "mode": "relaxed", "op": "conv2d", "pad": [], "params": [], "stock": [["batch", 1], ["height", 14], ["width", 14], ["in_channels", 256], ["out_channels", 512], ["kernel_h", 3], ["kernel_w", 3], ["pad_h", 1], ["pad_w", 1], ["stride_h", 2], ["stride_w", 2]]}},  # noqa: E501
    "avg_pool_7x7": {"config": "default", "epilogue": [["clip", -128, 127]], "knobs": "cycles", "op": "avg_pool2d", "strategy": "stock", "workload": {"batch": 1, "channels": 512, "count_include_pad": False, "height": 7, "pad_h": 0, "pad_w": 0, "pool_h": 7, "pool_w": 7, "stride_h": 1, "stride_w": 1, "width": 7}},  # noqa: E501
    "max_pool_3x3_s2": {"config": "default", "epilogue": [], "knobs": "cycles", "op": "max_pool2d", "strategy": "stock", "workload": {"batch": 1, "channels": 64, "count_include_pad": False, "height": 112, "pad_h": 1, "pad_w": 1, "pool_h": 3, "pool_w": 3, "stride_h": 2, "stride_w": 2, "width": 112}},  # noqa: E501
    "depthwise_576_s2": {"config": "default", "epilogue": [["bias"], ["shr", 5], ["clip", 0, 96]], "knobs": "cycles", "op": "depthwise_conv2d", "strategy": "stock", "workload": {"batch": 1, "channels": 576, "height": 14, "kernel_h": 3, "kernel_w": 3, "pad_h": 1, "pad_w": 1, "stride_h": 2, "stride_w": 2, "width": 14}},  # noqa: E501
    "depthwise_32_112": {"config": "default", "epilogue": [["bias"], ["shr", 6], ["clip", 0, 96]], "knobs": "cycles", "op": "depthwise_conv2d", "strategy": "stock", "workload": {"batch": 1, "channels": 32, "height": 112, "kernel_h": 3, "kernel_w": 3, "pad_h": 1, "pad_w": 1, "stride_h": 1, "stride_w": 1, "width": 112}},  # noqa: E501
}


def synthetic_program():
    """A stream written through the runtime API: 300 rounds of padded INP/WGT loads, a GEMM or
    ALU kernel drawn from a pool whose sizes overflow the micro-op buffer (so kernels are evicted
    and reloaded and placement wraps around), and a store, with the usual token protocol."""
    rng = np.random.default_rng(7)
    q = CommandQueue(CFG)
    inp, wgt, out = (q.alloc(1 << 16, n) for n in ("inp", "wgt", "out"))
    pool = []
    for i in range(10):
        size, extent = int(rng.integers(1, 2500)), int(rng.integers(1, 5))
        if i % 3 == 2:
            k = UopKernel("alu", alu_opcode=AluOp.ADD if i % 2 else AluOp.SHR, use_imm=True,
                          imm=int(rng.integers(0, 8)))
            k.loop_begin(extent, 1, 1)
            for u in range(size):
                k.push(int(rng.integers(0, 1024)), int(rng.integers(0, 1024)))
        else:
            k = UopKernel("gemm", reset=i == 0)
            k.loop_begin(extent, 1, 1, 1)
            for u in range(size):
                k.push(u % 2048, (u * 3) % 2048, (u * 7) % 1024)
        k.loop_end()
        pool.append(k)
    for r in range(300):
        if r:
            q.dep_pop(Stage.COMPUTE, Stage.LOAD)
        pads = [int(v) for v in rng.integers(0, 3, 4)]
        q.load_2d(inp, int(rng.integers(0, 512)), 4, 3, 8, *pads, int(rng.integers(0, 1024)),
                  MemType.INP)
        q.load_2d(wgt, int(rng.integers(0, 64)), 2, 1, 2, 0, 0, 0, 0, int(rng.integers(0, 256)),
                  MemType.WGT)
        q.dep_push(Stage.LOAD, Stage.COMPUTE)
        q.dep_pop(Stage.LOAD, Stage.COMPUTE)
        if r:
            q.dep_pop(Stage.STORE, Stage.COMPUTE)
        k = pool[int(rng.integers(0, len(pool)))]
        (q.push_gemm if k.mode == "gemm" else q.push_alu)(k)
        q.dep_push(Stage.COMPUTE, Stage.LOAD)
        q.dep_push(Stage.COMPUTE, Stage.STORE)
        q.dep_pop(Stage.COMPUTE, Stage.STORE)
        q.store_2d(int(rng.integers(0, 1024)), MemType.OUT, out, int(rng.integers(0, 1024)),
                   4, 2, 4)
        q.dep_push(Stage.STORE, Stage.COMPUTE)
    return q.synchronize()


def build(name):
    """The program of case ``name`` (an operator of :data:`SPECS`, or ``"synthetic"``)."""
    if name == "synthetic":
        return synthetic_program()
    spec = dict(SPECS[name], config_value=CFG.to_dict())
    return executor.build_spec(json.loads(json.dumps(spec)), CFG).program


def fingerprint(program) -> dict:
    """What must not change: hashes of the encoded instructions and of the whole DRAM image
    (instructions, micro-ops, buffers) and the cycle report."""
    report = CycleModel(program.config).run_program(program)
    return {
        "insns": len(program.insns),
        "insn_sha": hashlib.sha256(encode_stream(program.config, program.insns)).hexdigest()[:24],
        "dram_sha": hashlib.sha256(program.dram.tobytes()).hexdigest()[:24],
        "cycles": report.total_cycles,
        "modules": [[t.busy, t.stall, t.idle, t.insns] for t in report.modules.values()],
        "dram_bytes": [[k, v] for k, v in report.dram_bytes.items()],
        "macs": report.macs,
        "alu_ops": report.alu_ops,
    }


#: fingerprints from main at 1cea7b4, before the change (see the module docstring)
EXPECTED = {
    'add_160x7x7': {'insns': 12, 'insn_sha': 'a9053034f065be1ea726bb9f', 'dram_sha': 'ea993a8c2c40b4d3e6f52491', 'cycles': 8362, 'modules': [[1, 0, 8361, 1], [7377, 985, 0, 9], [986, 7374, 2, 2]], 'dram_bytes': [['acc_8bit', 15680], ['uop', 8], ['out', 7840]], 'macs': 0, 'alu_ops': 15680},  # noqa: E501
    'conv1x1_576_160': {'insns': 17, 'insn_sha': '9e7cb25542f0d15f490acde5', 'dram_sha': '590d92dc7ad652136e181173', 'cycles': 96562, 'modules': [[15059, 1970, 79533, 3], [80519, 16043, 0, 13], [985, 95575, 2, 1]], 'dram_bytes': [['uop', 320], ['inp', 28224], ['wgt', 92160], ['acc', 640], ['out', 7840]], 'macs': 4515840, 'alu_ops': 23520},  # noqa: E501
    'dense_512_1008': {'insns': 21, 'insn_sha': '7119d3571a338e5b7c089464', 'dram_sha': '84f39f3778412d0656ed4ebe', 'cycles': 75094, 'modules': [[65094, 8331, 1669, 6], [9871, 65223, 0, 14], [131, 74961, 2, 1]], 'dram_bytes': [['uop', 20], ['inp', 512], ['wgt', 516096], ['acc', 4032], ['out', 1008]], 'macs': 516096, 'alu_ops': 3024},  # noqa: E501
    'conv3x3_s2_256_512': {'insns': 47, 'insn_sha': '81a0bf8a02b110c09e7f8d18', 'dram_sha': '0d945214626ef9af30341fb5', 'cycles': 1095120, 'modules': [[156138, 910471, 28511, 26], [935843, 159277, 0, 20], [3141, 1091977, 2, 1]], 'dram_bytes': [['uop', 8104], ['inp', 50176], ['wgt', 1179648], ['acc', 2048], ['out', 25088]], 'macs': 57802752, 'alu_ops': 75264},  # noqa: E501
    'avg_pool_7x7': {'insns': 90, 'insn_sha': '9f9d3c998791dc29905bd347', 'dram_sha': '08b5e60d10bb38efff3e513b', 'cycles': 16368, 'modules': [[1, 0, 16367, 1], [16296, 72, 0, 86], [195, 16171, 2, 3]], 'dram_bytes': [['acc_8bit', 25088], ['uop', 6472], ['out', 512]], 'macs': 0, 'alu_ops': 30720},  # noqa: E501
    'max_pool_3x3_s2': {'insns': 255, 'insn_sha': '952e6f39c83d404644a604ea', 'dram_sha': '018d2333532a183c36b09eed', 'cycles': 854087, 'modules': [[1, 0, 854086, 1], [853971, 116, 0, 205], [25329, 828756, 2, 49]], 'dram_bytes': [['acc_8bit', 881664], ['uop', 120], ['out', 200704]], 'macs': 0, 'alu_ops': 2007040},  # noqa: E501
    'depthwise_576_s2': {'insns': 425, 'insn_sha': 'bf0907dcd0f91c8364530eaf', 'dram_sha': 'a85cba044dccd1304e6644d2', 'cycles': 402342, 'modules': [[1, 0, 402341, 1], [402240, 102, 0, 415], [3681, 398659, 2, 9]], 'dram_bytes': [['acc_8bit', 118080], ['acc', 2304], ['uop', 620], ['out', 28224]], 'macs': 0, 'alu_ops': 1072512},  # noqa: E501
    'depthwise_32_112': {'insns': 2281, 'insn_sha': 'd5d88c1076cba336a28b53cd', 'dram_sha': 'ab1a4df218c6b3ab8cf4e3fa', 'cycles': 5524258, 'modules': [[1, 0, 5524257, 1], [5523358, 900, 0, 2223], [50457, 5473799, 2, 57]], 'dram_bytes': [['acc_8bit', 595232], ['acc', 128], ['uop', 124], ['out', 401408]], 'macs': 0, 'alu_ops': 15253504},  # noqa: E501
    'synthetic': {'insns': 1367, 'insn_sha': '5d996e273750635245a1acbf', 'dram_sha': 'e2ac4610f10085218b86e959', 'cycles': 5996328, 'modules': [[37260, 5941921, 17147, 601], [5959044, 37284, 0, 465], [7501, 5988826, 1, 301]], 'dram_bytes': [['inp', 57600], ['wgt', 153600], ['uop', 998348], ['out', 38400]], 'macs': 207213824, 'alu_ops': 4767904},  # noqa: E501
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_program_matches_reference(name):
    assert fingerprint(build(name)) == EXPECTED[name]


def test_every_case_has_a_reference():
    assert sorted(EXPECTED) == sorted([*SPECS, "synthetic"])


if __name__ == "__main__":   # print the fingerprints of this tree (to take the reference)
    for case in [*SPECS, "synthetic"]:
        print(f"    {case!r}: {fingerprint(build(case))!r},")
