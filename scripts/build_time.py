#!/usr/bin/env python
"""Build time per network, strategy and cache state, with where it goes.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/build_time.py resnet18 mobilenet_v2 \\
        [--size 224] [--config default] [--strategies stock csp-relaxed] [--repeat 3] \\
        [--check] [--csv docs/figures/build_time.csv] [--png docs/figures/build_time.png]

Each model of ``relay_examples/models.py`` is quantised once (power-of-two quantiser, seed 0) and
saved as Relax JSON. Every build then runs in a new process that loads the module and times
``tvm.relax.build(mod, target=ext_vta)`` alone (imports and loading are not timed):

* ``stock``: the stock templates (no persistent cache; every build is the same);
* a CSP strategy ``cold``: a fresh, empty ``TVM_CSP_EMBED_CACHE`` per build (nothing solved,
  planned or chosen before);
* a CSP strategy ``warm``: a new process on the cache the cold build of its round filled.

The builds run in ``--repeat`` rounds, each round every (strategy, state) once, so that a drift
of the machine's speed shifts them alike. Wall time is min and median over the rounds; CPU time
(the build process's, all threads, and its solver processes') is the median
over the rounds, with its ratio to stock's: a figure that other load on the machine moves less
than the wall time (a build waiting for the cores still counts its wall time, not its CPU). It
includes the solver worker and the MiniZinc runs it finished (:mod:`tvm_csp_embed.solve_worker`),
not the solves still running in the background when the build returns. The breakdown is the median build's
``BuildReport.timings`` (:mod:`vta_ext.timing`, exclusive seconds): solve, plan, choice (timing
candidates on the cycle model), knob search, code generation, the offload pass's own work, and TVM
(everything outside the offload pass: TVM's passes, LLVM code generation of the host functions,
linking). Each row also carries the build's end-to-end estimate (``BuildReport``: VTA cycles of
the cycle model, host layout bytes and CPU MACs priced by the default host model,
:mod:`vta_ext.host`) and its ratio to stock's. ``--extract-tasks`` times ``tvm_csp_embed.tune.extract_tasks(mod)`` (the tuner's task
extraction) in place of the build, with the same protocol. ``--check`` runs the last build of each (model, strategy, state) on the functional
simulator against the llvm build and records whether it is bit-exact. The ratio columns are over
the stock build's median.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "relay_examples")]

PHASES = ("solve", "plan", "choice", "knob search", "codegen", "offload", "tvm")
FIELDS = (["model", "size", "config", "strategy", "cache", "repeat", "min_s", "median_s", "vs_stock",
           "cpu_s", "cpu_vs_stock", "ops_on_vta", "bit_exact"] + [f"{p.replace(' ', '_')}_s" for p in PHASES]
          + ["vta_cycles", "host_relayouts", "layout_bytes", "cpu_macs", "end_to_end_cycles",
             "e2e_vs_stock"])

_CHILD = r"""
import json, os, resource, sys, time
sys.path[:0] = [{repo!r}, {examples!r}]
import numpy as np, tvm
from tvm import relax
import tvm_csp_embed, vta_ext
mod = tvm.ir.load_json(open({module!r}).read())
def cpu():
    # CPU seconds of this process, its reaped children and the solver worker with the MiniZinc
    # runs it reaped (/proc: the worker lives on, so RUSAGE_CHILDREN does not hold it yet)
    from tvm_csp_embed import solve_worker
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker = 0.0
    if solve_worker._WORKER is not None:
        try:
            with open(f"/proc/{{solve_worker._WORKER.proc.pid}}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            worker = sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return time.process_time() + children.ru_utime + children.ru_stime + worker
t, c = time.perf_counter(), cpu()
if {extract!r}:
    from tvm_csp_embed import tune
    tasks = tune.extract_tasks(mod, target=vta_ext.vta_target({config!r}), strategy={strategy!r})
    ex = None
else:
    with vta_ext.build_options(strategy={strategy!r}):
        ex = relax.build(mod, target=vta_ext.vta_target({config!r}))
seconds, cpu_seconds = time.perf_counter() - t, cpu() - c
report = vta_ext.last_build_report()
out = {{"seconds": seconds, "cpu_seconds": cpu_seconds, "timings": report.timings, "vta": len(report.on_vta),
       "vta_cycles": report.vta_cycles, "host_relayouts": report.host_relayouts,
       "layout_bytes": report.layout_bytes, "cpu_macs": report.cpu_macs,
       "end_to_end_cycles": round(report.end_to_end_cycles)}}
if {check!r} and ex is not None:
    data = np.load({data!r})
    def first(o):
        return o if hasattr(o, "numpy") else o[0]
    got = first(relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data))).numpy()
    ref = np.load({ref!r})
    out["bit_exact"] = bool(np.array_equal(got, ref))
print("RESULT " + json.dumps(out))
"""


def _child(module: Path, data: Path, ref: Path, strategy: str, config: str, cache: Path,
           check: bool, extract: bool = False) -> dict:
    code = _CHILD.format(repo=str(REPO), examples=str(REPO / "relay_examples"), module=str(module),
                         strategy=strategy, config=config, check=check, data=str(data), ref=str(ref),
                         extract=extract)
    env = dict(os.environ, TVM_CSP_EMBED_CACHE=str(cache), OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"build_time: the {strategy} build of {module.stem} failed:\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def _prepare(name: str, size: int, work: Path):
    """Quantise ``name`` once; save the module, an input and the llvm output."""
    import numpy as np
    import tvm
    from models import quantized_example
    from tvm import relax

    _, qmodel, _, data = quantized_example(name, size, 0)
    module = work / f"{name}_{size}.json"
    module.write_text(tvm.ir.save_json(qmodel.mod))
    out = relax.VirtualMachine(relax.build(qmodel.mod, target="llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(data))
    out = out if hasattr(out, "numpy") else out[0]
    np.save(work / f"{name}_{size}_in.npy", data)
    np.save(work / f"{name}_{size}_ref.npy", out.numpy())
    return module, work / f"{name}_{size}_in.npy", work / f"{name}_{size}_ref.npy"


def _row(name, size, config, strategy, state, runs, check, stock_median, stock_e2e=None,
         stock_cpu=None):
    times = [r["seconds"] for r in runs]
    med = statistics.median(times)
    cpu = statistics.median(r["cpu_seconds"] for r in runs)
    mid = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    row = {"model": name, "size": size, "config": config, "strategy": strategy, "cache": state,
           "repeat": len(runs), "min_s": round(min(times), 3), "median_s": round(med, 3),
           "vs_stock": round(med / stock_median, 2) if stock_median else 1.0,
           "cpu_s": round(cpu, 3), "cpu_vs_stock": round(cpu / stock_cpu, 2) if stock_cpu else 1.0,
           "ops_on_vta": runs[-1]["vta"],
           "bit_exact": runs[-1].get("bit_exact", "") if check else ""}
    for key in ("vta_cycles", "host_relayouts", "layout_bytes", "cpu_macs", "end_to_end_cycles"):
        row[key] = runs[-1][key]
    row["e2e_vs_stock"] = round(row["end_to_end_cycles"] / stock_e2e, 4) if stock_e2e else 1.0
    timings = dict(mid["timings"])
    timings["tvm"] = max(0.0, mid["seconds"] - sum(timings.values()))
    for p in PHASES:
        row[f"{p.replace(' ', '_')}_s"] = round(timings.get(p, 0.0), 3)
    return row


def _plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']}\n{r['strategy']} {r['cache']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 4.5))
    bottom = [0.0] * len(rows)
    for p in PHASES:
        vals = [r[f"{p.replace(' ', '_')}_s"] for r in rows]
        ax.bar(range(len(rows)), vals, bottom=bottom, label=p)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set_ylabel("build seconds (median build)")
    ax.set_title("relax.build for ext_vta: where the time goes")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--config", default="default")
    ap.add_argument("--strategies", nargs="+", default=["stock", "csp-relaxed"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="compare each build's output with llvm")
    ap.add_argument("--extract-tasks", action="store_true",
                    help="time tvm_csp_embed.tune.extract_tasks instead of relax.build")
    ap.add_argument("--csv", default="", help="append the rows to this CSV file")
    ap.add_argument("--png", default="", help="plot the breakdown to this PNG file")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    rows = []
    head = (f"{'model':<20} {'strategy':<12} {'cache':<5} {'min s':>7} {'median s':>8} {'x stock':>7} "
            f"{'cpu s':>7} {'x stock':>7} "
            + " ".join(f"{p:>8}" for p in PHASES) + f" {'e2e cycles':>12} {'x stock':>7}  bit-exact")
    print(head)
    with tempfile.TemporaryDirectory(prefix="build_time_") as tmp:
        work = Path(tmp)
        for name in args.models:
            module, data, ref = _prepare(name, args.size, work)
            stock_median = stock_e2e = stock_cpu = None
            cells = [(strategy, state) for strategy in args.strategies
                     for state in (["-"] if strategy == "stock" else ["cold", "warm"])]
            runs = {cell: [] for cell in cells}
            # rounds: every (strategy, state) once per round, so that a machine that drifts
            # (other load, frequency) shifts all of them alike and the ratios stay fair; round
            # i's warm build runs on the cache its cold build filled
            for i in range(args.repeat):
                last = i == args.repeat - 1
                for strategy, state in cells:
                    cache = work / f"cache_{name}_{strategy}_{i}"
                    runs[strategy, state].append(_child(module, data, ref, strategy, args.config,
                                                        cache, args.check and last,
                                                        args.extract_tasks))
            for strategy, state in cells:
                row = _row(name, args.size, args.config, strategy, state, runs[strategy, state],
                           args.check, stock_median, stock_e2e, stock_cpu)
                if strategy == "stock":
                    stock_median, stock_e2e = row["median_s"], row["end_to_end_cycles"]
                    stock_cpu = row["cpu_s"]
                    row["vs_stock"] = row["e2e_vs_stock"] = row["cpu_vs_stock"] = 1.0
                rows.append(row)
                print(f"{name:<20} {strategy:<12} {state:<5} {row['min_s']:>7.2f} "
                      f"{row['median_s']:>8.2f} {row['vs_stock']:>7.2f} "
                      f"{row['cpu_s']:>7.2f} {row['cpu_vs_stock']:>7.2f} "
                      + " ".join(f"{row[p.replace(' ', '_') + '_s']:>8.2f}" for p in PHASES)
                      + f" {row['end_to_end_cycles']:>12,} {row['e2e_vs_stock']:>7.4f}"
                      + f"  {row['bit_exact']}", flush=True)
    if args.csv:
        path = Path(args.csv)
        new = not path.exists()
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            if new:
                w.writeheader()
            w.writerows(rows)
    if args.png:
        _plot(rows, Path(args.png))
    bad = [r for r in rows if r["bit_exact"] is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
