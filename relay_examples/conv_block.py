"""A small int8 conv network on VTA, checked bit for bit against the CPU build.

Two quantised conv blocks (conv2d -> + bias -> >> shift -> clip -> int8), the first with 24 output
channels (not a multiple of the 16-wide GEMM block) and stride 1, the second with stride 2, then a
max pool that stays on the CPU. The model is built with plain ``tvm.relax.build`` for ``ext_vta``
twice, with the ``stock`` strategy and with ``csp-relaxed`` (the default once ``tvm_csp_embed`` is
imported), and for ``llvm``; the script prints what ran where, the simulator counters of every VTA
call of the ``csp-relaxed`` build, total cycles of both strategies side by side and the wall times,
and exits non-zero if an output differs from llvm's.

Run: ``.venv/bin/python relay_examples/conv_block.py [--config default]``
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np
import tvm
from tvm import relax

import tvm_csp_embed  # noqa: F401  (registers csp-strict / csp-relaxed)
import vta_ext

STRATEGIES = ("stock", "csp-relaxed")


def conv_block(bb: relax.BlockBuilder, x, weight, bias, stride: int, shift: int):
    conv = bb.emit(relax.op.nn.conv2d(x, weight, strides=stride, padding=1, out_dtype="int32"))
    acc = bb.emit(relax.op.add(conv, bias))
    acc = bb.emit(relax.op.right_shift(acc, relax.const(shift, "int32")))
    acc = bb.emit(relax.op.clip(acc, 0, 127))
    return bb.emit(relax.op.astype(acc, "int8"))


def build_model(in_channels: int = 8, mid_channels: int = 24, out_channels: int = 32, size: int = 16):
    """The Relax module and its parameter shapes (data, w1, b1, w2, b2)."""
    shapes = {
        "data": ((1, in_channels, size, size), "int8"),
        "w1": ((mid_channels, in_channels, 3, 3), "int8"),
        "b1": ((1, mid_channels, 1, 1), "int32"),
        "w2": ((out_channels, mid_channels, 3, 3), "int8"),
        "b2": ((1, out_channels, 1, 1), "int32"),
    }
    bb = relax.BlockBuilder()
    params = [relax.Var(name, relax.TensorType(shape, dtype)) for name, (shape, dtype) in shapes.items()]
    data, w1, b1, w2, b2 = params
    with bb.function("main", params):
        with bb.dataflow():
            y = conv_block(bb, data, w1, b1, stride=1, shift=6)
            y = conv_block(bb, y, w2, b2, stride=2, shift=8)
            y = bb.emit_output(relax.op.nn.max_pool2d(y, pool_size=2, strides=2))
        bb.emit_func_output(y)
    return bb.get(), shapes


def random_inputs(shapes, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for name, (shape, dtype) in shapes.items():
        if dtype == "int8":
            out.append(rng.integers(-128, 128, shape).astype(np.int8))
        else:
            out.append(rng.integers(-(1 << 12), 1 << 12, shape).astype(np.int32))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="default", help="VTA configuration preset")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    mod, shapes = build_model()
    inputs = [tvm.runtime.tensor(a) for a in random_inputs(shapes)]
    outputs, timings, reports, all_runs = {}, {}, {}, {}
    builds = [(f"ext_vta/{s}", vta_ext.vta_target(args.config), s) for s in STRATEGIES]
    for name, target, strategy in builds + [("llvm", "llvm", "stock")]:
        start = time.perf_counter()
        with vta_ext.build_options(strategy=strategy):
            executable = relax.build(mod, target=target)
        build_s = time.perf_counter() - start
        vm = relax.VirtualMachine(executable, tvm.cpu())
        vta_ext.clear_run_log()
        start = time.perf_counter()
        outputs[name] = vm["main"](*inputs).numpy()
        timings[name] = (build_s, time.perf_counter() - start)
        if name != "llvm":
            reports[name], all_runs[name] = vta_ext.last_build_report(), vta_ext.run_log()

    for name in reports:
        print(f"\n== Build report ({name})")
        print(reports[name])
    runs = all_runs["ext_vta/csp-relaxed"]
    print("\n== VTA calls of ext_vta/csp-relaxed: functional simulator counters and cycle model")
    total_cycles = 0
    for i, run in enumerate(runs):
        cycles = run.cycles
        total_cycles += cycles.total_cycles
        shape = ", ".join(f"{k}={v}" for k, v in run.workload.items())
        print(f"  [{i}] {run.op} ({shape}): simulated in {run.seconds * 1e3:.1f} ms wall time")
        for key, value in run.stats.as_dict().items():
            print(f"        {key:<18} {value:>12,}")
        print("        " + cycles.summary().replace("\n", "\n        "))
    print(f"  total: {total_cycles:,} cycles = {total_cycles / (1e3 * runs[0].cycles.config.CLOCK_MHZ):.3f} ms "
          f"at {runs[0].cycles.config.CLOCK_MHZ} MHz (cycle model, config {args.config!r})")
    print(f"\n== Total VTA cycles per strategy (cycle model, config {args.config!r})")
    print(strategy_table(all_runs, outputs, reports))
    print("\n== Wall time (this machine)")
    for name, (build_s, run_s) in timings.items():
        print(f"  {name:<20} build {build_s:6.2f} s   run {run_s * 1e3:8.1f} ms")
    equal = all(np.array_equal(outputs[name], outputs["llvm"]) for name in reports)
    for name in reports:
        print(f"\n== Correctness: {name} output {outputs[name].shape} "
              f"{'EQUALS' if np.array_equal(outputs[name], outputs['llvm']) else 'DIFFERS FROM'} "
              f"the llvm output bit for bit ({int((outputs['llvm'] != 0).sum())} non-zero values)")
    return 0 if equal else 1


def strategy_table(all_runs, outputs, reports=None) -> str:
    """Total cycles of each ``ext_vta/<strategy>`` build side by side, with the build report's
    end-to-end estimate (VTA cycles plus host work by the host model) when ``reports`` is given,
    and bit-exactness vs llvm."""
    stock = sum(r.cycles.total_cycles for r in all_runs.get("ext_vta/stock", []))
    e2e = {name: r.end_to_end_cycles for name, r in (reports or {}).items()}
    lines = ["  | strategy | VTA calls | total cycles | vs stock | end to end (host model) "
             "| equal to llvm |", "  |---|---|---|---|---|---|"]
    for name, runs in all_runs.items():
        total = sum(r.cycles.total_cycles for r in runs)
        lines.append(f"  | {name.split('/', 1)[1]} | {len(runs)} | {total:,} | "
                     f"{f'x{stock / total:.2f}' if stock and total else '-'} | "
                     f"{f'{e2e[name]:,.0f}' if name in e2e else '-'} | "
                     f"{'yes' if np.array_equal(outputs[name], outputs['llvm']) else 'NO'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
