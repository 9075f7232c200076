#!/usr/bin/env python
"""The default strategy against stock, per layer, measured on the RTL of the original Pynq design.

Every VTA call of a network (or of one DeepBench layer) is built with a plain ``relax.build`` for
the ``pynq`` preset, once under ``stock`` (its default knobs) and once under the default strategy
(``csp-relaxed`` once ``tvm_csp_embed`` is imported, default options), and run through the
original driver ABI on ``libvta_rtl.so`` (``vta_ext.run_on``). Each call's RTL cycles
(``VTARtlLastCycles``) stand beside the cycle model's. Outputs are checked bit for bit against the
``llvm`` build.

Writes ``<out>.csv`` (one row per call and strategy), ``<out>.png`` (stock / default per layer, RTL
and model) and prints a Markdown table. Usage::

    .venv/bin/python scripts/rtl_compare.py --networks resnet18 --size 56
    .venv/bin/python scripts/rtl_compare.py --thin                      # the 12 thin DeepBench layers
    .venv/bin/python scripts/rtl_compare.py --networks resnet18 mobilenet_v2 --size 224 --thin

The RTL runs about 165,000 cycles per second: ResNet-18 at 224 takes several minutes per strategy.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "relay_examples"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_csp_embed  # noqa: E402,F401  (registers the CSP strategies; csp-relaxed the default)
import vta_ext  # noqa: E402
from vta_ext.device import open_device, vta_hw_library  # noqa: E402
from vta_ext.executor import clear_run_log, run_log  # noqa: E402

#: the 12 thin DeepBench layers (fewer than 16 input channels) of the CSP paper
THIN = (0, 1, 2, 6, 10, 15, 21, 27, 34, 59, 67, 107)
STRATEGIES = ("stock", "default")


def deepbench_module(layer: int):
    """DeepBench layer ``layer`` (``data/deepbench_conv_inference.csv``) as a Relax conv with a
    requantising tail (>> 8, clip to int8), and its input shapes."""
    path = ROOT / "data" / "deepbench_conv_inference.csv"
    rows = list(csv.DictReader(line for line in open(path) if not line.startswith("#")))
    r = {k: int(v) for k, v in next(r for r in rows if int(r["id"]) == layer).items()
         if k != "set"}
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((r["n"], r["c"], r["h"], r["w"]), "int8"))
    w = relax.Var("w", relax.TensorType((r["k"], r["c"], r["filter_h"], r["filter_w"]), "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=(r["hstride"], r["wstride"]),
                                           padding=(r["pad_h"], r["pad_w"]), out_dtype="int32"))
            y = bb.emit(relax.op.right_shift(y, relax.const(8, "int32")))
            y = bb.emit(relax.op.clip(y, -128, 127))
            out = bb.emit_output(bb.emit(relax.op.astype(y, "int8")))
        bb.emit_func_output(out)
    mod = bb.get()
    rng = np.random.default_rng(layer)
    inputs = [rng.integers(-128, 128, tuple(int(d) for d in p.ty.shape)).astype(np.int8)
              for p in mod["main"].params]
    return mod, inputs


def network_module(name: str, size: int):
    """The quantised network of ``relay_examples/models.py`` and one input."""
    from models import quantized_example

    _, qm, _, data = quantized_example(name, size)
    return qm.mod, [data]


def _numpy(out) -> list:
    """The VM's output(s) as a list of numpy arrays."""
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _run(mod, inputs, config: str, strategy: str, device) -> tuple:
    """Build ``mod`` for ``config`` under ``strategy`` and run it on ``device``: (output, calls)."""
    options = {} if strategy == "default" else {"strategy": strategy}
    with vta_ext.build_options(**options):
        executable = relax.build(mod, target=vta_ext.vta_target(config))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    clear_run_log()
    with vta_ext.run_on(device):
        out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs])
    calls = run_log()
    return _numpy(out), calls


def measure(name: str, mod, inputs, config: str, device) -> List[Dict]:
    """Rows of every VTA call of ``mod`` under both strategies, checked against llvm."""
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    expected = _numpy(vm["main"](*[tvm.runtime.tensor(a) for a in inputs]))
    rows = []
    for strategy in STRATEGIES:
        start = time.perf_counter()
        got, calls = _run(mod, inputs, config, strategy, device)
        exact = all(np.array_equal(a, b) for a, b in zip(got, expected))
        for i, call in enumerate(calls):
            rows.append({"set": name, "call": i, "op": call.op,
                         "workload": _short(call.workload), "strategy": strategy,
                         "used": call.strategy, "model_cycles": call.cycles.total_cycles,
                         "rtl_cycles": call.device_cycles, "bit_exact": exact})
        print(f"  {name} {strategy}: {len(calls)} VTA calls, "
              f"{sum(c.device_cycles for c in calls):,} RTL cycles, bit-exact {exact}, "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    return rows


def _short(workload: dict) -> str:
    """``CxHxW->K kKsS`` of a conv workload (stock or CSP keys), else its values."""
    w = dict(workload.get("params", [])) or workload
    names = {"c": ("c", "in_channels"), "h": ("h", "height"), "w": ("w", "width"),
             "k": ("k", "out_channels"), "kh": ("kh", "kernel_h"), "sh": ("sh", "stride_h")}
    got = {short: next((w[n] for n in options if n in w), None) for short, options in names.items()}
    if None in got.values():
        return " ".join(str(v) for v in w.values() if isinstance(v, int))
    return f"{got['c']}x{got['h']}x{got['w']}->{got['k']} k{got['kh']}s{got['sh']}"


def _pairs(rows: List[Dict]) -> List[Dict]:
    """One row per layer: stock and default cycles side by side, and their ratios. The calls of
    the two builds are paired by operator and occurrence (the k-th conv2d of each), so a call
    that only one strategy places on VTA (a depthwise conv that stock leaves on the CPU on
    ``pynq``) has no pair and is left out."""
    by, seen = {}, {}
    for r in rows:
        nth = seen[(r["set"], r["strategy"], r["op"])] = \
            seen.get((r["set"], r["strategy"], r["op"]), -1) + 1
        by[(r["set"], r["op"], nth, r["strategy"])] = r
    out = []
    for (name, op, nth, strategy), r in by.items():
        if strategy != "stock" or (name, op, nth, "default") not in by:
            continue
        d = by[(name, op, nth, "default")]
        out.append({"set": name, "call": f"{op}#{nth}", "op": op, "workload": r["workload"],
                    "used": d["used"], "stock_rtl": int(r["rtl_cycles"]),
                    "default_rtl": int(d["rtl_cycles"]),
                    "speedup_rtl": int(r["rtl_cycles"]) / int(d["rtl_cycles"]),
                    "speedup_model": int(r["model_cycles"]) / int(d["model_cycles"]),
                    "model_err_default": int(d["model_cycles"]) / int(d["rtl_cycles"]) - 1})
    return out


def table(pairs: List[Dict]) -> str:
    lines = ["| set | call | op | workload | default used | stock RTL | default RTL | "
             "stock ÷ default, RTL | model | model ÷ RTL − 1 (default) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in pairs:
        lines.append(f"| {p['set']} | {p['call']} | {p['op']} | {p['workload']} | {p['used']} | "
                     f"{p['stock_rtl']:,} | {p['default_rtl']:,} | x{p['speedup_rtl']:.3f} | "
                     f"x{p['speedup_model']:.3f} | {p['model_err_default']:+.1%} |")
    for name in dict.fromkeys(p["set"] for p in pairs):
        group = [p for p in pairs if p["set"] == name]
        geo = math.exp(sum(math.log(p["speedup_rtl"]) for p in group) / len(group))
        worst = min(group, key=lambda p: p["speedup_rtl"])
        total = sum(p["stock_rtl"] for p in group) / sum(p["default_rtl"] for p in group)
        lines.append(f"| **{name}** | | | | | | | geomean x{geo:.3f}, total x{total:.3f}, "
                     f"worst x{worst['speedup_rtl']:.3f} (call {worst['call']}) | | |")
    return "\n".join(lines)


def plot(pairs: List[Dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 0.32 * len(pairs)), 3.6))
    xs = np.arange(len(pairs))
    ax.bar(xs - 0.2, [p["speedup_rtl"] for p in pairs], 0.4, label="RTL")
    ax.bar(xs + 0.2, [p["speedup_model"] for p in pairs], 0.4, label="model")
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xticks(xs, [f"{p['set'][:10]} {p['call']}" for p in pairs], rotation=90, fontsize=6)
    ax.set_ylabel("stock ÷ default cycles")
    ax.set_title("pynq: default strategy against stock, per VTA call")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--networks", nargs="*", default=[], help="e.g. resnet18 mobilenet_v2")
    ap.add_argument("--size", type=int, default=56, help="network input height and width")
    ap.add_argument("--thin", action="store_true", help="the 12 thin DeepBench layers")
    ap.add_argument("--layers", type=int, nargs="*", help="DeepBench layer ids instead of --thin")
    ap.add_argument("--config", default="pynq")
    ap.add_argument("--mem-latency", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "rtl_compare")
    ap.add_argument("--from-csv", type=Path, nargs="+",
                    help="table and plot the rows of earlier runs' CSVs instead of measuring")
    args = ap.parse_args(argv)
    if args.from_csv:
        rows = [r for path in args.from_csv for r in csv.DictReader(open(path))]
        pairs = _pairs(rows)
        plot(pairs, args.out.with_suffix(".png"))
        print(table(pairs))
        return 0
    device = open_device(vta_hw_library("rtl"), mem_latency=args.mem_latency)
    rows: List[Dict] = []
    for name in args.networks:
        mod, inputs = network_module(name, args.size)
        rows += measure(f"{name}-{args.size}", mod, inputs, args.config, device)
    for layer in (args.layers if args.layers is not None else (THIN if args.thin else ())):
        mod, inputs = deepbench_module(layer)
        rows += measure(f"deepbench{layer}", mod, inputs, args.config, device)
    if not rows:
        ap.error("nothing to measure: give --networks and/or --thin / --layers")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    pairs = _pairs(rows)
    plot(pairs, args.out.with_suffix(".png"))
    print(table(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
