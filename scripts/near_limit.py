#!/usr/bin/env python
"""Issue 18's goals in one run, as ratios: how near the default plans are to the floor.

Rows (default build options, no tuned records; cycles from the cycle model; floors from
:mod:`vta_ext.floor`):

1. floor / cycles of csp-relaxed, geomean over the GEMM layers of ResNet-18 (C1-C11), MobileNet
   (D1-D9) and DeepBench (the 108 layers with the bias + shift + clip epilogue), on ``default``
   and on ``pipelined``; with the minimum and the layers below 0.6;
2. the 12 thin-channel DeepBench layers (1 or 3 input channels), csp-relaxed against stock,
   operator cycles at the same (default) knob option, geomean, on ``default``; the aim is the
   zero-padding bound;
3. ResNet-18 at 224, csp-relaxed on ``pipelined`` against stock on ``default`` (network VTA
   cycles);
4. ResNet-18 at 224 on ``default``, csp-relaxed against stock; the aim is the floor's ratio
   (stock cycles / the sum of the floors).

Layer rows come from ``scripts/efficiency.py``'s CSV when ``--efficiency-csv`` names one (its
rows for the cases and strategies needed), otherwise they are measured here with the same code
(:func:`efficiency.measure`). Writes ``--csv`` (one row per goal) and ``--png`` (measured
against bar and aim) and prints the table.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/near_limit.py \\
        --efficiency-csv docs/figures/efficiency.csv --csv docs/figures/near_limit.csv
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "relay_examples", ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

#: (goal, bar, aim) of issue 18's table; the aims marked None are computed (the floor's ratio)
GOALS = {
    "efficiency default": (0.85, 0.9),
    "efficiency pipelined": (0.85, 0.9),
    "thin deepbench csp-relaxed / stock": (8.0, 10.1),
    "resnet18 224 pipelined csp-relaxed / default stock": (4.7, 4.9),
    "resnet18 224 default csp-relaxed / stock": (1.35, None),
}
LOW = 0.6
FIELDS = ["goal", "measured", "bar", "aim", "met", "detail"]


def thin_layers() -> List[Dict]:
    """The CSV rows of the thin-channel DeepBench layers of goal row 2: fewer input channels
    than one ``BLOCK_IN`` of any configuration (1 or 3)."""
    from deepbench import read_layers

    return [r for r in read_layers() if int(r["c"]) < 16]


def _geomean(values: List[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def layer_rows(csv_path: Optional[str], configs, strategies, bind: str = "constants") -> List[Dict]:
    """The GEMM layer rows (ResNet, MobileNet, DeepBench with the epilogue) for ``configs`` x
    ``strategies``: from ``csv_path`` (efficiency.py's CSV) or measured now, the DeepBench layers
    with their weights and bias bound as ``bind`` says (``efficiency.cases``)."""
    import efficiency as eff

    wanted = [(s, c, e, f) for s, c, e, f in eff.cases(("resnet", "mobilenet", "deepbench"), "small", bind)
              if e != "none"]
    have: Dict[Tuple[str, str, str, str], Dict] = {}
    if csv_path:
        with open(csv_path) as f:
            for row in csv.DictReader(f):
                have[(row["case"], row["epilogue"], row["config"], row["strategy"])] = row
    rows = []
    from tqdm import tqdm

    todo = [(s, c, e, f, cfg, st) for s, c, e, f in wanted for cfg in configs for st in strategies]
    for s, case, ep, factory, cfg, st in tqdm(todo, desc="layers", unit="case"):
        row = have.get((case, ep, cfg, st))
        if row is None:
            row = {"set": s, "case": case, "epilogue": ep, "config": cfg, "strategy": st,
                   **eff.measure(factory(), cfg, st)}
        rows.append(row)
    return rows


def network(config: str, strategy: str) -> Dict[str, float]:
    """ResNet-18 at 224 built at default options: VTA cycles and the sum of its floors."""
    import efficiency as eff

    return eff.measure(eff.network_module("resnet18", "224"), config, strategy)


def goals(rows: List[Dict], nets: Dict[Tuple[str, str], Dict]) -> List[Dict]:
    out = []
    for cfg in ("default", "pipelined"):
        eff = [float(r["efficiency"]) for r in rows
               if r["config"] == cfg and r["strategy"] == "csp-relaxed" and r.get("efficiency")]
        low = sum(v < LOW for v in eff)
        out.append({"goal": f"efficiency {cfg}", "measured": round(_geomean(eff), 3),
                    "detail": f"{len(eff)} layers, min {min(eff):.3f}, {low} below {LOW}",
                    "extra_ok": low == 0})
    thin = {f"DB{r['id']}" for r in thin_layers()}
    by = {(r["case"], r["config"], r["strategy"]): float(r["cycles"]) for r in rows}
    ratios = [by[(c, "default", "stock")] / by[(c, "default", "csp-relaxed")] for c in sorted(thin)]
    out.append({"goal": "thin deepbench csp-relaxed / stock", "measured": round(_geomean(ratios), 2),
                "detail": f"{len(ratios)} layers, default, x{min(ratios):.2f}..x{max(ratios):.2f}"})
    stock = nets[("default", "stock")]
    pipe, dflt = nets[("pipelined", "csp-relaxed")], nets[("default", "csp-relaxed")]
    out.append({"goal": "resnet18 224 pipelined csp-relaxed / default stock",
                "measured": round(stock["cycles"] / pipe["cycles"], 3),
                "detail": f"{stock['cycles']:,} / {pipe['cycles']:,} cycles"})
    out.append({"goal": "resnet18 224 default csp-relaxed / stock",
                "measured": round(stock["cycles"] / dflt["cycles"], 3),
                "detail": f"{stock['cycles']:,} / {dflt['cycles']:,} cycles; floor sum "
                          f"{float(stock['floor']):,.0f}", "aim": round(stock["cycles"] / float(stock["floor"]), 2)})
    for g in out:
        bar, aim = GOALS[g["goal"]]
        g["bar"] = bar
        g["aim"] = g.get("aim", aim)
        g["met"] = "yes" if g["measured"] >= bar and g.pop("extra_ok", True) else "no"
        g.pop("extra_ok", None)
    return out


def plot(results: List[Dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(3.0 * len(results), 3.4))
    for ax, g in zip(axes, results):
        ax.bar([0], [g["measured"]], color="tab:green" if g["met"] == "yes" else "tab:red")
        ax.axhline(g["bar"], color="black", linestyle="--", label="bar")
        ax.axhline(g["aim"], color="gray", linestyle=":", label="aim")
        ax.set_xticks([])
        ax.set_title(g["goal"].replace(" csp", "\ncsp").replace(" / ", " /\n"), fontsize=7)
    axes[0].legend(fontsize=7)
    fig.suptitle("Issue 18 goals at default build options (measured against bar and aim)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--efficiency-csv", default=None,
                    help="take the layer rows from this efficiency.py CSV where it has them")
    ap.add_argument("--csv", default=str(ROOT / "docs" / "figures" / "near_limit.csv"))
    ap.add_argument("--bind", choices=("constants", "params"), default="constants",
                    help="DeepBench layers: weights and bias as Relax constants, as a quantised "
                         "network binds them (default), or as function parameters")
    ap.add_argument("--png", default=None, help="default: the CSV's name with .png")
    args = ap.parse_args(argv)
    import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)

    rows = layer_rows(args.efficiency_csv, ("default", "pipelined"), ("stock", "csp-relaxed"),
                      args.bind)
    nets = {(c, s): network(c, s) for c, s in (("default", "stock"), ("default", "csp-relaxed"),
                                               ("pipelined", "csp-relaxed"))}
    results = goals(rows, nets)
    path = Path(args.csv)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for g in results:
            w.writerow({k: g.get(k, "") for k in FIELDS})
    plot(results, Path(args.png) if args.png else path.with_suffix(".png"))
    print(f"\n| goal | measured | bar | aim | met | detail |\n|---|---|---|---|---|---|")
    for g in results:
        print(f"| {g['goal']} | {g['measured']} | {g['bar']} | {g['aim']} | {g['met']} | {g['detail']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
