#!/usr/bin/env python
"""Whole networks per strategy: share of conv/matmul MACs on VTA, total VTA cycles, host layout
transforms per inference, hand-overs between VTA operators, and bit-exactness vs llvm.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/mac_share.py regnet_x_1_6gf resnext50_32x4d \\
        [--size 32] [--config default] [--strategies stock csp-relaxed] [--csv out.csv]

Each model of ``relay_examples/models.py`` is quantised (power-of-two quantiser, seed 0), built
for llvm and for ``ext_vta`` under each strategy (``layout="auto"``, the default), and run once on
the functional simulator; MACs are attributed from the build report (``models.mac_placement``),
cycles are the cycle model's totals of the VTA calls (``vta_ext.run_log``), host layout transforms
are the packing/unpacking operations left per inference (``BuildReport.host_relayouts``), and
"kept" counts VTA operators whose input was the previous VTA operator's packed output.
"""
import argparse
import csv
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "relay_examples")]

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_csp_embed  # noqa: E402,F401  (registers the CSP strategies)
import vta_ext  # noqa: E402
from vta_ext.quantize import op_macs  # noqa: E402
from vta_ext.report import LAYOUT_REASON  # noqa: E402
from models import mac_placement, quantized_example  # noqa: E402

FIELDS = ["model", "size", "config", "strategy", "macs_on_vta_pct", "cpu_ops", "vta_calls",
          "cycles", "vs_stock", "host_relayouts", "kept", "bit_exact", "build_s"]


def _first(out):
    return out if hasattr(out, "numpy") else out[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["regnet_x_1_6gf", "resnext50_32x4d"])
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--config", default="default")
    ap.add_argument("--strategies", nargs="+", default=["stock", "csp-relaxed"])
    ap.add_argument("--csv", default="", help="write the rows to this CSV file")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'model':<20} {'strategy':<12} {'MACs on VTA':>11} {'CPU ops':>7} {'cycles':>13} "
          f"{'vs stock':>8} {'host relayouts':>14} {'kept':>4} {'bit-exact':>9} {'build':>6}")
    for name in args.models:
        _, qmodel, _, data = quantized_example(name, args.size, 0)
        mod = qmodel.mod
        macs = op_macs(mod)
        ref = _first(relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())["main"](
            tvm.runtime.tensor(data))).numpy()
        stock_cycles = None
        for strategy in args.strategies:
            start = time.time()
            with vta_ext.build_options(strategy=strategy):
                executable = relax.build(mod, target=vta_ext.vta_target(args.config))
            build_s = time.time() - start
            report = vta_ext.last_build_report()
            share = mac_placement(macs, report)
            vta_ext.clear_run_log()
            out = _first(relax.VirtualMachine(executable, tvm.cpu())["main"](
                tvm.runtime.tensor(data))).numpy()
            cycles = sum(r.cycles.total_cycles for r in vta_ext.run_log())
            if strategy == "stock":
                stock_cycles = cycles
            row = {"model": name, "size": args.size, "config": args.config, "strategy": strategy,
                   "macs_on_vta_pct": round(100 * share["vta"] / share["total"], 2),
                   "cpu_ops": len(share["cpu_ops"]), "vta_calls": len(report.on_vta),
                   "cycles": cycles,
                   "vs_stock": round(stock_cycles / cycles, 3) if stock_cycles and cycles else "",
                   "host_relayouts": sum(p.reason == LAYOUT_REASON for p in report.on_cpu),
                   "kept": sum("kept in the packed layout" in p.detail for p in report.on_vta),
                   "bit_exact": bool(np.array_equal(out, ref)), "build_s": round(build_s, 1)}
            rows.append(row)
            ratio = f"x{row['vs_stock']:.3f}" if row["vs_stock"] else "-"
            print(f"{name:<20} {strategy:<12} {row['macs_on_vta_pct']:>10.1f}% {row['cpu_ops']:>7} "
                  f"{cycles:>13,} {ratio:>8} {row['host_relayouts']:>14} {row['kept']:>4} "
                  f"{str(row['bit_exact']):>9} {build_s:>5.0f}s", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)
    return 0 if all(r["bit_exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
