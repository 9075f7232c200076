#!/usr/bin/env python
"""Depthwise convolutions on the GEMM core (block-diagonal) against the stock ALU template.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/depthwise_gemm.py [mobilenet_v2] \\
        [--size 224] [--configs default pipelined] [--out docs/figures/depthwise_gemm]

For each model of ``relay_examples/models.py`` (power-of-two quantiser, seed 0) and each
configuration, the network is built under ``csp-relaxed`` twice:

* **before**: depthwise convs on the stock ALU template, as before ``tvm_csp_embed.depthwise``
  (its template unregistered for the run, so the strategy falls back to ``stock`` for them);
* **after**: the default build, where each depthwise conv takes the ALU template or the GEMM
  block-diagonal program, whichever the cycle model times faster.

Both are run once on the functional simulator and checked bit-exact against the llvm build of the
same quantised module. VTA cycles are the cycle model's totals of the VTA calls
(``BuildReport.vta_cycles``). Per depthwise layer of the *after* build the CSV has the ALU
template's and the GEMM program's cycles (both built with the knobs of the build), the floor
(:func:`vta_ext.floor.depthwise_floor`: the smaller over the units) and the unit chosen.

Writes ``<out>.csv`` (one row per depthwise layer and configuration), ``<out>_totals.csv`` (one
row per model, configuration and build) and ``<out>.png``; prints a Markdown table.
"""
import argparse
import csv
import json
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
from tvm_csp_embed.depthwise import DepthwiseUnitWorkload  # noqa: E402
from vta_ext.strategy import get_template, register_template  # noqa: E402
from models import quantized_example  # noqa: E402

LAYER_FIELDS = ["model", "size", "config", "layer", "shape", "alu_cycles", "gemm_cycles", "floor",
                "chosen", "chosen_cycles", "efficiency"]
TOTAL_FIELDS = ["model", "size", "config", "build", "vta_cycles", "depthwise_cycles",
                "depthwise_share_pct", "vta_floor", "bit_exact", "build_s"]
KIND = "depthwise_conv2d"


def _first(out):
    return out if hasattr(out, "numpy") else out[0]


def build_and_run(mod, config, data, ref, before: bool):
    """Build ``mod`` for ``config`` under csp-relaxed (``before``: depthwise on the stock
    template), run it once; the report, the build seconds and bit-exactness against ``ref``."""
    ours = get_template(KIND, "csp-relaxed")
    if before:
        register_template(KIND, "csp-relaxed", get_template(KIND, "stock"))
    try:
        start = time.time()
        with vta_ext.build_options(strategy="csp-relaxed"):
            executable = relax.build(mod, target=vta_ext.vta_target(config))
        build_s = time.time() - start
    finally:
        register_template(KIND, "csp-relaxed", ours)
    report = vta_ext.last_build_report()
    out = _first(relax.VirtualMachine(executable, tvm.cpu())["main"](
        tvm.runtime.tensor(data))).numpy()
    return report, build_s, bool(np.array_equal(out, ref))


def layer_rows(report, model, size, config):
    """One row per depthwise conv of an *after* build: both units' cycles, floor, choice."""
    template = get_template(KIND, "csp-relaxed")
    rows = []
    for p in report.on_vta:
        if p.kind != KIND:
            continue
        key = report.key_of(p)
        wl = DepthwiseUnitWorkload(**json.loads(key)["workload"])
        cycles = {u: "" if c is None else c for u, c in template.unit_cycles(key).items()}
        floor = report.floor(p).total
        chosen = report.cycles(p)
        rows.append({"model": model, "size": size, "config": config, "layer": p.source,
                     "shape": (f"{wl.channels}x{wl.height}x{wl.width} k{wl.kernel_h} "
                               f"s{wl.stride_h}"),
                     "alu_cycles": cycles["alu"], "gemm_cycles": cycles["gemm"],
                     "floor": round(floor), "chosen": wl.unit, "chosen_cycles": chosen,
                     "efficiency": round(floor / chosen, 3)})
    return rows


def depthwise_cycles(report) -> int:
    return sum(report.cycles(p) for p in report.on_vta if p.kind == KIND)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = sorted({r["config"] for r in rows}, key=[r["config"] for r in rows].index)
    fig, axes = plt.subplots(len(configs), 1, figsize=(11, 3.4 * len(configs)), squeeze=False)
    for ax, config in zip(axes[:, 0], configs):
        sub = [r for r in rows if r["config"] == config]
        x = np.arange(len(sub))
        for i, (field, label) in enumerate((("alu_cycles", "ALU template"),
                                            ("gemm_cycles", "GEMM block-diagonal"),
                                            ("floor", "floor"))):
            values = [float(r[field]) if r[field] != "" else 0.0 for r in sub]
            ax.bar(x + (i - 1) * 0.28, values, 0.28, label=label)
        ax.set_yscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels([r["shape"] for r in sub], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("cycles (model)")
        ax.set_title(f"{sub[0]['model']} {sub[0]['size']}: depthwise convs on {config}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["mobilenet_v2"])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--configs", nargs="+", default=["default", "pipelined"])
    ap.add_argument("--out", default=str(REPO / "docs" / "figures" / "depthwise_gemm"))
    args = ap.parse_args(argv)
    layers, totals = [], []
    for name in args.models:
        _, qmodel, _, data = quantized_example(name, args.size, 0)
        mod = qmodel.mod
        ref = _first(relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())["main"](
            tvm.runtime.tensor(data))).numpy()
        for config in args.configs:
            for build in ("before", "after"):
                report, build_s, exact = build_and_run(mod, config, data, ref, build == "before")
                dw = depthwise_cycles(report)
                totals.append({"model": name, "size": args.size, "config": config, "build": build,
                               "vta_cycles": report.vta_cycles, "depthwise_cycles": dw,
                               "depthwise_share_pct": round(100 * dw / report.vta_cycles, 1),
                               "vta_floor": round(report.vta_floor), "bit_exact": exact,
                               "build_s": round(build_s, 1)})
                print(totals[-1], flush=True)
                if build == "after":
                    layers += layer_rows(report, name, args.size, config)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, fields, rows in ((out.with_suffix(".csv"), LAYER_FIELDS, layers),
                               (out.parent / f"{out.name}_totals.csv", TOTAL_FIELDS, totals)):
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
    plot(layers, out.with_suffix(".png"))
    print("\n| model | config | build | VTA cycles | depthwise cycles | depthwise share | bit-exact |")
    print("|---|---|---|---:|---:|---:|---|")
    for t in totals:
        print(f"| {t['model']} {t['size']} | {t['config']} | {t['build']} | {t['vta_cycles']:,} | "
              f"{t['depthwise_cycles']:,} | {t['depthwise_share_pct']} % | {t['bit_exact']} |")
    print("\n| config | layer | shape | ALU | GEMM | floor | chosen | efficiency |")
    print("|---|---|---|---:|---:|---:|---|---:|")
    for r in layers:
        fmt = lambda v: f"{v:,}" if v != "" else "refused"  # noqa: E731
        print(f"| {r['config']} | {r['layer']} | {r['shape']} | {fmt(r['alu_cycles'])} | "
              f"{fmt(r['gemm_cycles'])} | {r['floor']:,} | {r['chosen']} | {r['efficiency']} |")
    return 0 if all(t["bit_exact"] for t in totals) else 1


if __name__ == "__main__":
    sys.exit(main())
