"""Does the knob estimate rank knob points the way the (calibrated) cycle model of the built
programs does, on ``pynq``?

For every layer (ResNet-18 C1-C11 at 224, facts §7.2, and the 12 thin DeepBench layers, as in
``scripts/model_vs_rtl.py``), the first ``csp-relaxed`` embedding in NCHW (the solver's best;
fixed, so that every run compares the same knob space) with the networks' epilogue (``>> 8``,
clip [0, 127]) is taken, and:

* the **chosen** point: the knob search's fewest estimated cycles
  (:func:`tvm_csp_embed.codegen.knobs.cycle_point`, what the build's default ``knobs="cycles"``
  builds);
* a **sample** of ``--sample`` valid points of the knob grid (seeded, the same in every run: the
  grid's validity does not depend on the timing constants), built
  (:func:`~tvm_csp_embed.codegen.build.build_gemm`) and timed on the cycle model;
* the ratio **chosen / best**: the model cycles of the chosen point over the fewest of the sample
  and the chosen point (1 = the estimate picks the best point found);
* the **Spearman** rank correlation of the estimate and the model over the sample.

A sampled point whose program cannot be timed (a build error, a program the cycle model finds
deadlocked) is printed, counted in ``failed`` and left out of the sample.

Run it once per code state with ``--label`` (``before`` with ``--src`` a checkout of the code
before the change, ``after`` on this tree); the model cycles of a point do not depend on the
estimate, so they are kept in ``knob_ranking_points.json`` and not rebuilt. ``--report`` writes
the table and the PNG from the CSV of both labels. ``--rtl LAYER...`` also runs, for those layers,
the chosen point and the best sampled point on the RTL (``vta_ext.device``, ``libvta_rtl.so``);
``--rtl-compare LAYER...`` runs the ``before`` and ``after`` chosen points of those layers (from
the CSVs) on the cycle model and on the RTL (``knob_ranking_rtl.csv``).

    python scripts/knob_ranking.py --label after [--sample 24] [--layers C2 DB6] [--rtl C11 DB6]
    python scripts/knob_ranking.py --label before --src /tmp/knobs-main
    python scripts/knob_ranking.py --rtl-compare C4 C7 C10
    python scripts/knob_ranking.py --report
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _paths(src: Path) -> None:
    """Import the code of ``src`` (this tree's scripts, and this tree last: ``model_vs_rtl``
    puts its tree first unless it is on the path already)."""
    for p in (REPO / "scripts", src):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))


OUT = REPO / "docs" / "figures"
FIELDS = ["label", "layer", "sample", "failed", "chosen_knobs", "chosen_estimate", "chosen_model",
          "best_model", "ratio", "spearman", "rtl_chosen", "rtl_best", "rtl_ratio", "note"]


def layer_names():
    import model_vs_rtl as M

    return [n for n, _ in M.layers("resnet224")] + [n for n, _ in M.layers("thin")]


def spearman(a, b) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    import numpy as np

    def ranks(x):
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):          # ties: their average rank
            at = x == v
            r[at] = r[at].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def program_space(m, cfg):
    """(packed program, epilogue) of the first csp-relaxed NCHW embedding of ``m``."""
    from tvm_csp_embed.candidates import candidates, program_epilogue
    from tvm_csp_embed.strategy import CspWorkload

    x, w = m.operands
    n, c, h, wd = (int(d) for d in x.ty.shape)
    k, _, r, s = (int(d) for d in w.ty.shape)
    attrs = m.core.attrs
    pad, st = [int(v) for v in attrs.padding], [int(v) for v in attrs.strides]
    base = CspWorkload("conv2d", (("n", n), ("c", c), ("h", h), ("w", wd), ("k", k), ("kh", r),
                                  ("kw", s), ("pt", pad[0]), ("pl", pad[1]), ("pb", pad[2]),
                                  ("pr", pad[3]), ("sh", st[0]), ("sw", st[1])))
    cands, notes = candidates(cfg, base, "relaxed", ["NCHW"], m.epilogue)
    cands = [c for c in cands if not c.refused]
    if not cands:
        raise RuntimeError(f"{m}: no embedding ({notes})")
    cand = cands[0]
    return cand.packed, program_epilogue(cand.workload, m.epilogue), cand.label


def run(label: str, names, sample: int, out: Path, rtl=()) -> list:
    import numpy as np

    import model_vs_rtl as M
    from tvm_csp_embed.codegen import knobs as K
    from tvm_csp_embed.codegen.build import build_gemm
    from vta_ext.config import load_config
    from vta_ext.sim.cycles import CycleModel

    cfg = load_config("pynq")
    model = CycleModel(cfg)
    out.mkdir(parents=True, exist_ok=True)
    cache_path = out / "knob_ranking_points.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    ops = dict(M.layers("resnet224") + M.layers("thin"))
    device = None
    if rtl:
        from vta_ext.device import open_device, vta_hw_library

        device = open_device(vta_hw_library("rtl"))
    # the rows of the layers not run now are kept
    csv_path, points_path = out / f"knob_ranking_{label}.csv", out / f"knob_ranking_{label}_points.csv"
    rows = [r for r in read(csv_path) if r["layer"] not in names] if csv_path.exists() else []
    points = ([r for r in read(points_path) if r["layer"] not in names]
              if points_path.exists() else [])
    for i, name in enumerate(names):
        t0 = time.perf_counter()
        pg, ep, what = program_space(ops[name], cfg)
        grid = K.knob_grid(cfg, pg, ep)
        valid = np.flatnonzero(grid.valid)
        rng = np.random.default_rng(0)
        picked = sorted(rng.choice(valid, size=min(sample, len(valid)), replace=False).tolist())
        chosen = K.cycle_point(cfg, pg, ep)
        chosen_idx = grid.points(valid).index(chosen.knobs) if chosen else None
        by_layer = cache.setdefault(name, {})

        def timed(idx):
            """The model cycles of the point's program, or the text of why it has none (a
            build error, a program that deadlocks)."""
            key = json.dumps(grid.point(idx), sort_keys=True)
            if key not in by_layer:
                try:
                    by_layer[key] = model.run_program(build_gemm(cfg, pg, ep, grid.point(idx)
                                                                 ).program).total_cycles
                except Exception as err:  # noqa: BLE001 -- recorded, and the point left out
                    by_layer[key] = f"{type(err).__name__}: {str(err)[:300]}"
            return by_layer[key]
        failed = [(j, timed(j)) for j in picked if isinstance(timed(j), str)]
        for j, why in failed:
            print(f"  {name} {grid.point(j)}: no model cycles ({why})", flush=True)
        picked = [j for j in picked if not isinstance(timed(j), str)]
        est = [int(grid.cycles[j]) for j in picked]
        mod = [timed(j) for j in picked]
        c_idx = int(valid[chosen_idx])
        c_model = timed(c_idx)
        best_i = int(np.argmin(mod))
        row = {"label": label, "layer": name, "sample": len(picked), "failed": len(failed),
               "chosen_knobs": json.dumps(chosen.knobs, sort_keys=True),
               "chosen_estimate": chosen.cycles, "spearman": round(spearman(est, mod), 4)}
        if isinstance(c_model, str):    # the chosen point's program cannot run: no ratio
            print(f"  {name} chosen {chosen.knobs}: no model cycles ({c_model})", flush=True)
            row.update(chosen_model="", best_model=min(mod), ratio="inf", note=c_model[:120])
        else:
            best = min(min(mod), c_model)
            row.update(chosen_model=c_model, best_model=best, ratio=round(c_model / best, 4))
        if device is not None and name in rtl and not isinstance(c_model, str):
            best_idx = picked[best_i] if mod[best_i] <= c_model else c_idx
            r_c = device.run_program(build_gemm(cfg, pg, ep, grid.point(c_idx)).program).cycles
            r_b = device.run_program(build_gemm(cfg, pg, ep, grid.point(best_idx)).program).cycles
            row.update(rtl_chosen=r_c, rtl_best=r_b, rtl_ratio=round(r_c / r_b, 4))
        rows.append(row)
        cache_path.write_text(json.dumps(cache, indent=0, sort_keys=True))
        points += [{"layer": name, "knobs": json.dumps(grid.point(j), sort_keys=True),
                    "estimate": e, "model": mc} for j, e, mc in zip(picked, est, mod)]
        with open(points_path, "w", newline="") as f:
            w = csv.DictWriter(f, ["layer", "knobs", "estimate", "model"])
            w.writeheader()
            w.writerows(points)
        print(f"{label} {name} ({what}): chosen/best {float(row['ratio']):.3f}, spearman "
              f"{row['spearman']:.3f}" + (f", RTL chosen/best {row['rtl_ratio']:.3f}"
                                           if "rtl_ratio" in row else "")
              + f" [{time.perf_counter() - t0:.0f} s]", flush=True)
        order = layer_names()
        rows.sort(key=lambda r: order.index(r["layer"]) if r["layer"] in order else len(order))
        write(rows, csv_path)
    if device is not None:
        device.close()
    return rows


RTL_FIELDS = ["layer", "label", "knobs", "model", "rtl", "model_vs_before", "rtl_vs_before"]


def rtl_compare(names, out: Path) -> list:
    """The chosen points of ``before`` and ``after`` (from their CSVs) of each layer of ``names``
    built and run on the cycle model and on the RTL: ``knob_ranking_rtl.csv``."""
    import model_vs_rtl as M
    from tvm_csp_embed.codegen.build import build_gemm
    from vta_ext.config import load_config
    from vta_ext.device import open_device, vta_hw_library
    from vta_ext.sim.cycles import CycleModel

    cfg = load_config("pynq")
    ops = dict(M.layers("resnet224") + M.layers("thin"))
    chosen = {lb: {r["layer"]: r for r in read(out / f"knob_ranking_{lb}.csv")}
              for lb in ("before", "after")}
    device = open_device(vta_hw_library("rtl"))
    path = out / "knob_ranking_rtl.csv"
    rows = [r for r in read(path) if r["layer"] not in names] if path.exists() else []
    for name in names:
        pg, ep, _ = program_space(ops[name], cfg)
        got = {}
        for lb in ("before", "after"):
            knobs = json.loads(chosen[lb][name]["chosen_knobs"])
            program = build_gemm(cfg, pg, ep, knobs).program
            got[lb] = (knobs, CycleModel(cfg).run_program(program).total_cycles,
                       device.run_program(program).cycles)
        for lb, (knobs, model, rtl) in got.items():
            rows.append({"layer": name, "label": lb, "knobs": json.dumps(knobs, sort_keys=True),
                         "model": model, "rtl": rtl,
                         "model_vs_before": round(model / got["before"][1], 4),
                         "rtl_vs_before": round(rtl / got["before"][2], 4)})
        print(f"{name}: after/before model {rows[-1]['model_vs_before']:.3f}, RTL "
              f"{rows[-1]['rtl_vs_before']:.3f}", flush=True)
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, RTL_FIELDS)
            w.writeheader()
            w.writerows(rows)
    device.close()
    return rows


def write(rows, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in FIELDS})


def read(path: Path) -> list:
    with open(path) as f:
        return list(csv.DictReader(f))


def geomean(xs) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def report(out: Path, labels=("before", "after")) -> str:
    data = {lb: {r["layer"]: r for r in read(out / f"knob_ranking_{lb}.csv")} for lb in labels
            if (out / f"knob_ranking_{lb}.csv").exists()}
    layers = [n for n in next(iter(data.values()))]
    lines = ["| layer | " + " | ".join(f"chosen/best {lb} | Spearman {lb}" for lb in data) + " |",
             "|---|" + "---|---|" * len(data)]
    for n in layers:
        cells = []
        for lb in data:
            r = data[lb].get(n)
            ratio = "deadlock" if r and r["ratio"] == "inf" else r and f"{float(r['ratio']):.3f}"
            cells += [ratio, f"{float(r['spearman']):.3f}"] if r else ["", ""]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    summ = []
    for lb, rows in data.items():
        ratios = [float(r["ratio"]) for r in rows.values() if r["ratio"] != "inf"]
        stuck = sum(r["ratio"] == "inf" for r in rows.values())
        rho = [float(r["spearman"]) for r in rows.values() if r["spearman"] not in ("", "nan")]
        summ += [f"{geomean(ratios):.3f} (max {max(ratios):.3f})"
                 + (f", {stuck} chosen point(s) deadlock" if stuck else ""),
                 f"{sum(rho) / len(rho):.3f}"]
    lines.append("| **geomean (max) / mean** | " + " | ".join(summ) + " |")
    rtl = [(lb, r) for lb, rows in data.items() for r in rows.values() if r.get("rtl_ratio")]
    if rtl:
        lines += ["", "| layer | label | chosen: model | chosen: RTL | best sampled: model | "
                      "best sampled: RTL | chosen/best on the RTL |", "|---|---|---|---|---|---|---|"]
        for lb, r in rtl:
            lines.append(f"| {r['layer']} | {lb} | {int(r['chosen_model']):,} | "
                         f"{int(r['rtl_chosen']):,} | {int(r['best_model']):,} | "
                         f"{int(r['rtl_best']):,} | {float(r['rtl_ratio']):.3f} |")
    if (out / "knob_ranking_rtl.csv").exists():
        lines += ["", "| layer | chosen before: model | RTL | chosen after: model | RTL | "
                      "after/before: model | RTL |", "|---|---|---|---|---|---|---|"]
        by = {}
        for r in read(out / "knob_ranking_rtl.csv"):
            by.setdefault(r["layer"], {})[r["label"]] = r
        for n, r in by.items():
            b, a = r["before"], r["after"]
            lines.append(f"| {n} | {int(b['model']):,} | {int(b['rtl']):,} | {int(a['model']):,} | "
                         f"{int(a['rtl']):,} | {float(a['model_vs_before']):.3f} | "
                         f"{float(a['rtl_vs_before']):.3f} |")
    plot(data, out)
    return "\n".join(lines)


def plot(data, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    layers = list(next(iter(data.values())))
    xs = range(len(layers))
    width = 0.8 / max(len(data), 1)
    for j, (lb, rows) in enumerate(data.items()):
        axes[0].bar([x + j * width for x in xs],
                    [float(rows[n]["ratio"]) if rows[n]["ratio"] != "inf" else 0 for n in layers],
                    width, label=lb)
        for x, n in zip(xs, layers):
            if rows[n]["ratio"] == "inf":    # the chosen point's program deadlocks
                axes[0].text(x + j * width, 1.0, f"{lb}: deadlock", rotation=90, fontsize=6,
                             ha="center", va="bottom", color="tab:red")
        axes[1].bar([x + j * width for x in xs],
                    [float(rows[n]["spearman"]) if rows[n]["spearman"] != "nan" else 0
                     for n in layers], width, label=lb)
    for ax, title in zip(axes, ("model cycles: chosen point / best sampled point",
                                "Spearman: estimate vs model over the sample")):
        ax.set_xticks([x + 0.4 - width / 2 for x in xs], layers, rotation=70, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    axes[0].axhline(1, color="gray", lw=0.8)
    axes[0].set_yscale("log")
    fig.suptitle("pynq: the knob estimate's choice against the cycle model of the built programs",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "knob_ranking.png", dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="after")
    ap.add_argument("--src", type=Path, default=REPO, help="the source tree whose estimate to use")
    ap.add_argument("--sample", type=int, default=24)
    ap.add_argument("--layers", nargs="*")
    ap.add_argument("--rtl", nargs="*", default=(), help="layers to also run on the RTL")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report", action="store_true", help="the table and PNG of the CSVs")
    ap.add_argument("--rtl-compare", nargs="*", metavar="LAYER",
                    help="run the before and after chosen points of these layers on the RTL")
    args = ap.parse_args(argv)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _paths(args.src.resolve())
    if args.report:
        print(report(args.out))
        return 0
    if args.rtl_compare:
        rtl_compare(args.rtl_compare, args.out)
        return 0
    names = args.layers or layer_names()
    run(args.label, names, args.sample, args.out, args.rtl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
