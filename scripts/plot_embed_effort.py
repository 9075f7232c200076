#!/usr/bin/env python
"""Search effort and time vs channel count (like Rieber et al., Fig. 8): CSV + PNG.

For conv2d layers with ``c = k = channels`` in the NCHW, NHWC and HWNC layouts, embed the
VTA GEMM in strict mode with each search order (``struct``: structure first, the default;
``nodes``: the paper's output-first order over the scalar nodes) and each option set:
plain, A (dimension-order portfolio, eq. 12), B (per-group domain bound, eq. 11), AB.

Example::

    .venv/bin/python scripts/plot_embed_effort.py --out-dir docs/figures
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tvm_csp_embed.instructions import gemm  # noqa: E402
from tvm_csp_embed.solve import solve  # noqa: E402
from tvm_csp_embed.workload import conv2d  # noqa: E402

COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red")
LINES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "x")
VARIANTS = {"-": {}, "A": {"portfolio": True}, "B": {"bound": True}, "AB": {"portfolio": True, "bound": True}}


def measure(channels, layouts, searches, variants, timeout, hw, jobs, mode="strict"):
    rows = []
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = lambda x, **k: x
    instr = gemm((1, 16, 16))
    grid = [(s, v, lay, ch) for s in searches for v in variants for lay in layouts for ch in channels]
    for search, var, layout, ch in tqdm(grid, desc="effort", unit="solve"):
        wl = conv2d(1, ch, hw, hw, ch, 3, 3, pad=(1, 1), layout=layout)
        r = solve(wl, instr, mode, timeout=timeout, search=search, jobs=jobs, **VARIANTS[var])
        rows.append({"mode": mode, "search": search, "variant": var, "layout": layout, "channels": ch, "status": r.status,
                     "nodes": r.stats.nodes, "failures": r.stats.failures,
                     "wall_seconds": round(r.stats.wall_seconds, 4),
                     "flatten_seconds": round(r.stats.flatten_seconds, 4),
                     "gecode_seconds": round(r.stats.solve_seconds, 4), "runs": r.stats.runs,
                     "asset": r.stats.asset,
                     "mapping": (" ".join(f"{d}" for d in r.solutions[0].bit_dims) if r.solutions else "")})
    return rows


def plot(rows, path: Path, searches, variants, layouts, mode="strict"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, len(searches), figsize=(6 * len(searches), 7), squeeze=False)
    for j, search in enumerate(searches):
        for var in variants:
            for lay in layouts:
                pts = sorted((r["channels"], r["nodes"], r["wall_seconds"]) for r in rows
                             if r["search"] == search and r["variant"] == var and r["layout"] == lay)
                if not pts:
                    continue
                x = [p[0] for p in pts]
                lab = f"{lay} {var}"
                style = dict(color=COLORS[layouts.index(lay) % len(COLORS)],
                             linestyle=LINES[variants.index(var) % len(LINES)],
                             marker=MARKERS[variants.index(var) % len(MARKERS)], label=lab)
                axes[0][j].plot(x, [max(p[1], 0.8) for p in pts], **style)
                axes[1][j].plot(x, [p[2] for p in pts], **style)
        axes[0][j].set_title(f"search effort, {search} order")
        axes[0][j].set_ylabel("Gecode nodes")
        axes[0][j].set_yscale("log")
        axes[1][j].set_ylabel("end-to-end seconds")
        for i in range(2):
            axes[i][j].set_xscale("log", base=2)
            axes[i][j].set_xlabel("channels (c = k)")
            axes[i][j].grid(alpha=0.3)
        axes[0][j].legend(fontsize=7, ncol=2)
    fig.suptitle(f"VTA GEMM 1x16x16 into conv2d 3x3 ({mode}); A = portfolio (eq. 12), B = domain bound (eq. 11)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=str(REPO / "docs" / "figures"))
    ap.add_argument("--channels", default="16,32,64,128,256")
    ap.add_argument("--layouts", default="NCHW,NHWC,HWNC")
    ap.add_argument("--searches", default="struct,nodes")
    ap.add_argument("--variants", default="-,A,B,AB")
    ap.add_argument("--hw", type=int, default=14, help="input height = width")
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--mode", choices=("strict", "relaxed"), default="strict")
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the existing CSV")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    chans = [int(x) for x in a.channels.split(",")]
    lays, searches, variants = a.layouts.split(","), a.searches.split(","), a.variants.split(",")
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = "embed_effort" if a.mode == "strict" else f"embed_effort_{a.mode}"
    if a.replot:
        rows = list(csv.DictReader(open(out / f"{stem}.csv")))
        for r in rows:
            r["channels"], r["nodes"] = int(r["channels"]), int(r["nodes"])
            r["wall_seconds"] = float(r["wall_seconds"])
    else:
        rows = measure(chans, lays, searches, variants, a.timeout, a.hw, a.jobs, a.mode)
        with open(out / f"{stem}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    plot(rows, out / f"{stem}.png", searches, variants, lays, a.mode)
    for s in searches:
        for v in variants:
            sel = [r for r in rows if r["search"] == s and r["variant"] == v]
            ok = sum(r["status"] == "ok" for r in sel)
            print(f"{s:6s} {v:2s}: {ok}/{len(sel)} ok, nodes max {max(r['nodes'] for r in sel)}, "
                  f"wall mean {sum(r['wall_seconds'] for r in sel) / len(sel):.3f} s, "
                  f"max {max(r['wall_seconds'] for r in sel):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
