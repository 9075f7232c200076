#!/usr/bin/env python
"""TVM compile time of the host relayout around one VTA convolution, warm.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/relayout_compile_time.py \\
        [--conv 3,64,224,7,2,3] [--conv ...] [--repeat 5] [--strategies stock csp-relaxed] \\
        [--csv docs/figures/relayout_compile_time.csv] [--png docs/figures/relayout_compile_time.png]

Each ``--conv C,K,HW,R,STRIDE,PAD`` is a one-conv module (``1 x C x HW x HW`` int8 input, constant
``K x C x R x R`` weights and bias, shift 8, clip [0, 127]; the default is ResNet-18's stem). Per
strategy it is built once to fill the caches (solve, plan, instruction streams), then ``--repeat``
more times in the same process; each build's CPU time (``time.process_time``, robust on a shared
machine) and wall time are recorded, min and median. The row also carries the build's host layout
operations (count, bytes) from the build report, and whether the output equals numpy. Built alone
for ``llvm``, the same operator has no host relayout: the ``tvm`` share of a warm VTA build is
mostly the LLVM compilation of its relayout kernels.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

FIELDS = ["conv", "strategy", "repeat", "cpu_min_s", "cpu_median_s", "wall_min_s", "wall_median_s",
          "plan", "host_relayouts", "layout_bytes", "bit_exact"]


def _module(c, k, hw, r, stride, pad):
    import numpy as np
    from conftest import conv_chain
    from tvm import relax

    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (k, c, r, r)).astype(np.int8)
    b = rng.integers(-1000, 1000, (1, k, 1, 1)).astype(np.int32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, hw, hw), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(conv_chain(bb, x, relax.const(w), relax.const(b), stride=stride,
                                            padding=pad, shift=8, clip=(0, 127)))
        bb.emit_func_output(out)
    return bb.get(), w, b


def measure(conv, strategy: str, repeat: int) -> dict:
    """One row: ``repeat`` warm builds of the conv ``conv`` under ``strategy``."""
    import numpy as np
    import tvm
    from conftest import conv2d_nchw, requantize
    from tvm import relax

    import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
    import vta_ext

    c, k, hw, r, stride, pad = conv
    mod, w, b = _module(*conv)
    target = vta_ext.vta_target("default")
    cpu, wall = [], []
    for i in range(repeat + 1):
        t, p = time.perf_counter(), time.process_time()
        with vta_ext.build_options(strategy=strategy):
            ex = relax.build(mod, target=target)
        if i:                                   # the first build fills the caches
            cpu.append(time.process_time() - p)
            wall.append(time.perf_counter() - t)
    report = vta_ext.last_build_report()
    x = np.random.default_rng(1).integers(-128, 128, (1, c, hw, hw)).astype(np.int8)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    ref = requantize(conv2d_nchw(x, w, stride=stride, padding=pad), b, 8, (0, 127))
    return {"conv": "x".join(map(str, conv)), "strategy": strategy, "repeat": repeat,
            "cpu_min_s": round(min(cpu), 3), "cpu_median_s": round(statistics.median(cpu), 3),
            "wall_min_s": round(min(wall), 3), "wall_median_s": round(statistics.median(wall), 3),
            "plan": report.on_vta[0].plan if report.on_vta else "cpu",
            "host_relayouts": report.host_relayouts, "layout_bytes": report.layout_bytes,
            "bit_exact": bool(np.array_equal(got, ref))}


def _plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(rows)), 3.5))
    labels = [f"{r['conv']}\n{r['strategy']}" for r in rows]
    ax.bar(labels, [r["cpu_median_s"] for r in rows], color="tab:blue")
    ax.set_ylabel("warm build, CPU s (median)")
    ax.set_title("relax.build of one conv for ext_vta")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conv", action="append", default=[],
                    help="C,K,HW,R,STRIDE,PAD (repeatable; default ResNet-18's stem 3,64,224,7,2,3)")
    ap.add_argument("--strategies", nargs="+", default=["stock", "csp-relaxed"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--csv", default="", help="write the rows to this CSV file")
    ap.add_argument("--png", default="", help="plot the CPU medians to this PNG file")
    args = ap.parse_args(argv)
    convs = []
    for text in args.conv or ["3,64,224,7,2,3"]:
        try:
            convs.append(tuple(int(v) for v in text.split(",")))
        except ValueError:
            ap.error(f"--conv {text!r}: expected six integers C,K,HW,R,STRIDE,PAD")
        if len(convs[-1]) != 6:
            ap.error(f"--conv {text!r}: expected six integers C,K,HW,R,STRIDE,PAD")
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: must be at least 1")
    rows = [measure(conv, s, args.repeat) for conv in convs for s in args.strategies]
    print(f"{'conv':<18} {'strategy':<12} {'cpu min':>8} {'cpu med':>8} {'wall med':>8} "
          f"{'x stock':>7} {'relayouts':>9} {'layout B':>11}  bit-exact  plan")
    stock = {r["conv"]: r["cpu_median_s"] for r in rows if r["strategy"] == "stock"}
    for r in rows:
        ratio = r["cpu_median_s"] / stock[r["conv"]] if stock.get(r["conv"]) else float("nan")
        print(f"{r['conv']:<18} {r['strategy']:<12} {r['cpu_min_s']:>8.3f} {r['cpu_median_s']:>8.3f} "
              f"{r['wall_median_s']:>8.3f} {ratio:>7.2f} {r['host_relayouts']:>9} "
              f"{r['layout_bytes']:>11,}  {str(r['bit_exact']):<9}  {r['plan']}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
    if args.png:
        _plot(rows, Path(args.png))
    return 0 if all(r["bit_exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
