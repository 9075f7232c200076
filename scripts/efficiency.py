#!/usr/bin/env python
"""How near the plans are to what VTA can do at all: floor / modelled cycles per layer.

The floor of an operator (:mod:`vta_ext.floor`) is ``max(compute, memory)`` of the operator as
written: the GEMM micro-ops of its unpadded MACs plus the ALU passes its epilogue needs, against
every tensor moved once. Efficiency is floor / cycles (cycle model); 1 is the best any plan can do.

Sets (``--layers``):

* ``resnet``: ResNet-18 C1-C11 (facts §7.2, C1 with its real 3 input channels), one-conv modules
  with the bias + shift + clip epilogue (``scripts/tune_figures.py``'s ``layer_module``);
* ``mobilenet``: MobileNet D1-D9 (the original suite's grouped convolutions, 16 channels a group);
* ``deepbench``: the 108 DeepBench inference convolutions (``data/deepbench_conv_inference.csv``),
  each with the bias + shift + clip epilogue and without one (``deepbench_module``);
* ``networks``: the 15 networks of ``relay_examples/models.py`` (quantised, ``--size``: ``small``
  is each network's small input of ``models.SMALL``, or an input size such as 224), one row per
  network: the sum of its VTA operators' floors over the sum of their cycles.

Every case is built with ``relax.build`` at the default build options of each strategy
(``--strategies``) on each configuration (``--configs``); the floors and cycles are the build
report's (:meth:`vta_ext.BuildReport.floor`, :meth:`~vta_ext.BuildReport.cycles`). Nothing is run:
the cycles of a program do not depend on the data.

Writes ``--out``/efficiency.csv (one row per case, configuration and strategy; rows are appended
as they come, and ``--resume`` skips the cases already in the file), efficiency.png (efficiency
per layer, sorted, one line per configuration and strategy, one panel per set) and prints a
table: geomean of floor / cycles, min, layers below 0.6, per set x configuration x strategy.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/efficiency.py --layers resnet mobilenet
    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/efficiency.py --layers deepbench --resume
"""
from __future__ import annotations

import argparse
import csv
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "relay_examples", ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

SETS = ("resnet", "mobilenet", "deepbench", "networks")
CONFIGS = ("default", "pipelined")
STRATEGIES = ("stock", "csp-strict", "csp-relaxed")
#: below this efficiency a layer counts as far from the floor (issue 18's bar)
LOW = 0.6
FIELDS = ["set", "case", "epilogue", "config", "strategy", "vta_ops", "floor", "cycles",
          "efficiency", "bound", "compute_gemm", "compute_alu", "memory", "vta_macs", "build_s"]


# ------------------------------------------------------------------------------ cases
def cases(sets, size: str, bind: str = "constants") -> Iterator[Tuple[str, str, str, Callable]]:
    """``(set, case, epilogue, module factory)`` of every case of ``sets``; ``bind``
    (``"constants"`` or ``"params"``) says how a DeepBench layer's weights and bias enter its
    module (:func:`tune_figures.deepbench_module`)."""
    import tune_figures as tf

    if "resnet" in sets:
        for i in range(1, 12):
            name = f"C{i}"
            wl = tf.C1_REAL[1] if name == "C1" else None
            yield "resnet", name, "bias-shift-clip", (lambda n=name, w=wl: tf.layer_module(n, w))
    if "mobilenet" in sets:
        for i in range(1, 10):
            yield "mobilenet", f"D{i}", "bias-shift-clip", (lambda n=f"D{i}": tf.layer_module(n))
    if "deepbench" in sets:
        from deepbench import read_layers

        for epilogue in tf.DEEPBENCH_EPILOGUES:
            for row in read_layers():
                yield ("deepbench", f"DB{row['id']}", epilogue,
                       (lambda r=row, e=epilogue: tf.deepbench_module(
                           r, e, constants=bind == "constants")))
    if "networks" in sets:
        import models

        for name in models.ISSUE11_MODELS:
            yield "networks", name, "network", (lambda n=name: network_module(n, size))


def network_module(name: str, size: str):
    """The quantised Relax module of network ``name`` at input ``size`` (``"small"``: its small
    variant of ``models.SMALL``)."""
    import models

    if size == "small":
        pixels, kwargs = models.SMALL[name]
    else:
        pixels, kwargs = int(size), {}
    return models.quantized_example(name, pixels, **kwargs)[1].mod


def measure(mod, config: str, strategy: str, **options) -> Dict:
    """Build ``mod`` for ``config`` with ``strategy`` (and further ``vta_ext.build_options``
    ``options``, default none); the floors and cycles of its VTA calls."""
    import tvm
    import vta_ext

    start = time.perf_counter()
    with vta_ext.build_options(strategy=strategy, **options):
        tvm.relax.build(mod, target=vta_ext.vta_target(config))
    build_s = time.perf_counter() - start
    report = vta_ext.last_build_report()
    ops = [p for p in report.on_vta if p.call is not None]
    if not ops:
        return dict(vta_ops=0, build_s=round(build_s, 2))
    floor = report.floor(ops[0])
    for p in ops[1:]:
        floor = floor + report.floor(p)
    total = report.vta_floor  # the sum of the operators' floors (each its own max)
    cycles = report.vta_cycles
    return dict(vta_ops=len(ops), floor=round(total, 1), cycles=cycles,
                efficiency=round(total / cycles, 4),
                bound=report.floor(ops[0]).bound if len(ops) == 1 else "",
                compute_gemm=round(floor.compute_gemm, 1), compute_alu=round(floor.compute_alu, 1),
                memory=round(floor.memory, 1), vta_macs=report.vta_macs, build_s=round(build_s, 2))


# ------------------------------------------------------------------------------ output
def group_of(row: Dict) -> str:
    """The table's set: DeepBench split by epilogue."""
    if row["set"] == "deepbench":
        return f"deepbench ({'bias+shift+clip' if row['epilogue'] != 'none' else 'no epilogue'})"
    return row["set"]


def geomean(values: List[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def table(rows: List[Dict]) -> str:
    """The markdown table: per set x config x strategy, geomean / min / count below :data:`LOW`."""
    groups: Dict[Tuple[str, str, str], List[float]] = {}
    for r in rows:
        if r.get("efficiency") not in (None, ""):
            groups.setdefault((group_of(r), r["config"], r["strategy"]), []).append(
                float(r["efficiency"]))
    lines = ["| set | config | strategy | cases | geomean floor/cycles | min | below 0.6 |",
             "|---|---|---|---|---|---|---|"]
    order = {s: i for i, s in enumerate(STRATEGIES)}
    for (group, config, strategy), values in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], order.get(kv[0][2], 9))):
        lines.append(f"| {group} | {config} | {strategy} | {len(values)} | "
                     f"{geomean(values):.3f} | {min(values):.3f} | "
                     f"{sum(v < LOW for v in values)} |")
    return "\n".join(lines)


def plot(rows: List[Dict], path: Path) -> None:
    """Efficiency per case, sorted, one line per configuration and strategy, a panel per set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({group_of(r) for r in rows if r.get("efficiency") not in (None, "")})
    if not groups:
        return
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.6), squeeze=False)
    styles = {"default": "-", "pipelined": "--"}
    colors = {"stock": "tab:gray", "csp-strict": "tab:blue", "csp-relaxed": "tab:red"}
    for ax, group in zip(axes[0], groups):
        lines = {}
        for r in rows:
            if group_of(r) == group and r.get("efficiency") not in (None, ""):
                lines.setdefault((r["config"], r["strategy"]), []).append(float(r["efficiency"]))
        for (config, strategy), values in sorted(lines.items()):
            values.sort()
            ax.plot(range(1, len(values) + 1), values, styles.get(config, ":"),
                    color=colors.get(strategy, "black"), marker=".", markersize=3,
                    label=f"{config} {strategy}")
        ax.axhline(LOW, color="black", linewidth=0.5, linestyle=":")
        ax.set_ylim(0, 1.02)
        ax.set_title(group, fontsize=9)
        ax.set_xlabel("cases, sorted")
        ax.set_ylabel("floor / cycles")
        ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _key(row: Dict) -> Tuple[str, ...]:
    return (row["set"], row["case"], row["epilogue"], row["config"], row["strategy"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", nargs="+", choices=SETS, default=list(SETS),
                        help="the sets of cases (default: all)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--bind", choices=("constants", "params"), default="constants",
                        help="DeepBench layers: weights and bias as Relax constants, as a "
                             "quantised network binds them (default), or as function parameters")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--size", default="small",
                        help="networks' input: 'small' (models.SMALL) or a size such as 224")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures",
                        help="directory of efficiency.csv / .png")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows of an existing efficiency.csv and skip their cases")
    args = parser.parse_args(argv)
    if args.size != "small" and not args.size.isdigit():
        parser.error(f"--size {args.size!r}: give 'small' or an input size such as 224")

    import tvm_csp_embed  # noqa: F401 -- registers the CSP strategies
    import vta_ext
    from tqdm import tqdm

    for name in args.configs:
        vta_ext.load_config(name)  # a clear error for an unknown preset, before any build
    for name in args.strategies:
        if name not in vta_ext.registered_strategies():
            parser.error(f"--strategies {name!r}: registered: {vta_ext.registered_strategies()}")
    logging.getLogger("vta_ext").setLevel(logging.ERROR)
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = args.out / "efficiency.csv", args.out / "efficiency.png"
    rows: List[Dict] = []
    if args.resume and csv_path.is_file():
        with open(csv_path) as f:
            rows = list(csv.DictReader(f))
    done = {_key(r) for r in rows}
    todo = [(s, c, e, make, config, strategy) for s, c, e, make in cases(args.layers, args.size)
            for config in args.configs for strategy in args.strategies
            if (s, c, e, config, strategy) not in done]
    new_file = not (args.resume and csv_path.is_file())
    with open(csv_path, "w" if new_file else "a", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        if new_file:
            writer.writeheader()
        modules: Dict[Tuple[str, str, str], object] = {}
        bar = tqdm(todo, desc="efficiency", unit="build")
        for set_name, case, epilogue, make, config, strategy in bar:
            bar.set_postfix_str(f"{case} {config} {strategy}")
            key = (set_name, case, epilogue)
            if key not in modules:
                modules.clear()  # one case's module at a time
                modules[key] = make()
            row = dict(set=set_name, case=case, epilogue=epilogue, config=config,
                       strategy=strategy, **measure(modules[key], config, strategy))
            rows.append(row)
            writer.writerow(row)
            f.flush()
    plot(rows, png_path)
    print(f"\n## Efficiency: floor / modelled cycles (scripts/efficiency.py, "
          f"{time.strftime('%Y-%m-%d')})\n")
    print(table(rows))
    print(f"\nwrote {csv_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
