#!/usr/bin/env python
"""DRAM traffic of ResNet-18 C2-C11 (batch 1): fallback schedule vs Tiling Parameter Search, and
double buffering with vs without reuse-aware load ordering.

For every layer and configuration the programs are generated (not simulated) and the DRAM bytes are
counted from their LOAD/STORE instructions (``x_size * y_size * element bytes``, the simulator's
rule); the analytical model of :mod:`vta_ext.templates.tiling` is reported next to it (they must
agree). Cycles of the TPS programs come from :class:`vta_ext.sim.cycles.CycleModel`.

Outputs ``docs/figures/tps_vs_fallback.csv`` and ``.png`` and prints a summary table.

Usage: ``python scripts/tps_vs_fallback.py [--configs default 1x32x32] [--layers C2 C5]``
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path
from typing import Dict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vta_ext.config import load_config  # noqa: E402
from vta_ext.isa import Opcode  # noqa: E402
from vta_ext.templates.conv2d import build_conv2d  # noqa: E402
from vta_ext.templates.epilogue import EPILOGUE_ORIGINAL  # noqa: E402
from vta_ext.templates.knobs import Conv2dKnobs  # noqa: E402
from vta_ext.templates.tiling import dram_bytes, knob_space, tps_knobs  # noqa: E402
from vta_ext.templates.workload import Conv2dWorkload  # noqa: E402

RESNET18 = {  # facts §7.2
    "C2": Conv2dWorkload(1, 56, 56, 64, 64, 3, 3, 1, 1, 1, 1),
    "C3": Conv2dWorkload(1, 56, 56, 64, 128, 3, 3, 1, 1, 2, 2),
    "C4": Conv2dWorkload(1, 56, 56, 64, 128, 1, 1, 0, 0, 2, 2),
    "C5": Conv2dWorkload(1, 28, 28, 128, 128, 3, 3, 1, 1, 1, 1),
    "C6": Conv2dWorkload(1, 28, 28, 128, 256, 3, 3, 1, 1, 2, 2),
    "C7": Conv2dWorkload(1, 28, 28, 128, 256, 1, 1, 0, 0, 2, 2),
    "C8": Conv2dWorkload(1, 14, 14, 256, 256, 3, 3, 1, 1, 1, 1),
    "C9": Conv2dWorkload(1, 14, 14, 256, 512, 3, 3, 1, 1, 2, 2),
    "C10": Conv2dWorkload(1, 14, 14, 256, 512, 1, 1, 0, 0, 2, 2),
    "C11": Conv2dWorkload(1, 7, 7, 512, 512, 3, 3, 1, 1, 1, 1),
}
KEYS = {"inp": "inp_load_nbytes", "wgt": "wgt_load_nbytes", "acc": "acc_load_nbytes",
        "out": "out_store_nbytes"}


def program_bytes(cfg, program) -> Dict[str, int]:
    """DRAM bytes per memory (inp/wgt/acc/uop/out) moved by the program's LOAD/STORE instructions."""
    names = {0: "uop", 1: "wgt", 2: "inp", 3: "acc", 4: "out", 5: "acc"}
    out = {k: 0 for k in ("inp", "wgt", "acc", "uop", "out")}
    for insn in program.insns:
        if insn.opcode in (Opcode.LOAD, Opcode.STORE) and insn.x_size:
            key = "out" if insn.opcode == Opcode.STORE else names[int(insn.memory_type)]
            out[key] += insn.x_size * insn.y_size * cfg.elem_bytes(insn.memory_type)
    return out


def data_bytes(b: Dict[str, int]) -> int:
    """inp + wgt + acc loads + out stores (the counters the TPS model covers; micro-ops excluded)."""
    return b["inp"] + b["wgt"] + b["acc"] + b["out"]


def knob_str(k: Conv2dKnobs) -> str:
    s = f"b{k.tile_b}h{k.tile_h}w{k.tile_w}ci{k.tile_ci}co{k.tile_co}"
    if k.oc_nthread > 1:
        s += " oc2"
    if k.h_nthread > 1:
        s += " h2"
    return s + (" reuse" if k.reuse else "")


def measure(cfg, wl, knobs):
    from vta_ext.sim.cycles import CycleModel
    t = time.perf_counter()
    conv = build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, knobs)
    gen = time.perf_counter() - t
    b = program_bytes(cfg, conv.program)
    model = dram_bytes(cfg, wl, knobs, with_bias=True)
    if any(model[KEYS[k]] != b[k] for k in KEYS):
        raise AssertionError(f"model {model} != program {b} for {wl} {knobs}")
    cycles = None
    if conv.program.insn_count < 50_000:
        cycles = CycleModel(cfg).run_program(conv.program).total_cycles
    return b, conv.program.insn_count, gen, cycles


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", nargs="+", default=["default", "1x32x32"])
    ap.add_argument("--layers", nargs="+", default=list(RESNET18))
    ap.add_argument("--out", default=str(ROOT / "docs" / "figures" / "tps_vs_fallback"))
    args = ap.parse_args(argv)
    rows = []
    t0 = time.perf_counter()
    for cname in args.configs:
        cfg = load_config(cname)
        for name in args.layers:
            wl = RESNET18[name]
            fb, fb_n, fb_t, _ = measure(cfg, wl, Conv2dKnobs())
            tps = tps_knobs(cfg, wl, EPILOGUE_ORIGINAL)
            tb, tn, _, tcyc = measure(cfg, wl, tps.knobs)
            # double buffering: the best two-thread tiling, without and with reuse-aware loads
            db = min((c for c in knob_space(cfg, wl, EPILOGUE_ORIGINAL)
                      if c.knobs.oc_nthread * c.knobs.h_nthread == 2),
                     key=lambda c: (c.total_bytes, c.insns, str(c.knobs)))
            db_b, _, _, db_cyc = measure(cfg, wl, db.knobs)
            rk = Conv2dKnobs(**{**db.knobs.__dict__, "reuse": True})
            rb, _, _, r_cyc = measure(cfg, wl, rk)
            tr = tps_knobs(cfg, wl, EPILOGUE_ORIGINAL, reuse=True)
            row = dict(config=cname, layer=name, fallback_knobs=knob_str(Conv2dKnobs()),
                       fallback_bytes=data_bytes(fb), fallback_insns=fb_n,
                       fallback_gen_s=round(fb_t, 2),
                       tps_knobs=knob_str(tps.knobs), tps_bytes=data_bytes(tb), tps_insns=tn,
                       tps_cycles=tcyc, ratio_fallback_over_tps=round(data_bytes(fb) / data_bytes(tb), 2),
                       db_knobs=knob_str(db.knobs), db_loaded_bytes=db_b["inp"] + db_b["wgt"],
                       db_bytes=data_bytes(db_b), db_cycles=db_cyc,
                       reuse_loaded_bytes=rb["inp"] + rb["wgt"], reuse_bytes=data_bytes(rb),
                       reuse_cycles=r_cyc,
                       reuse_saving_loaded=round(1 - (rb["inp"] + rb["wgt"]) / (db_b["inp"] + db_b["wgt"]), 3),
                       tps_reuse_knobs=knob_str(tr.knobs), tps_reuse_bytes=tr.total_bytes)
            rows.append(row)
            print(f"[{time.perf_counter() - t0:6.1f}s] {cname} {name}: fallback {row['fallback_bytes']:,} "
                  f"TPS {row['tps_bytes']:,} ({row['ratio_fallback_over_tps']}x)  double-buffered "
                  f"loads {row['db_loaded_bytes']:,} -> reuse {row['reuse_loaded_bytes']:,} "
                  f"(-{100 * row['reuse_saving_loaded']:.0f}%)", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        width = 0.8 / len(args.configs)
        for i, cname in enumerate(args.configs):
            rs = [r for r in rows if r["config"] == cname]
            xs = [j + i * width for j in range(len(rs))]
            axes[0].bar(xs, [r["ratio_fallback_over_tps"] for r in rs], width, label=cname)
            axes[1].bar(xs, [100 * r["reuse_saving_loaded"] for r in rs], width, label=cname)
        labels = [r["layer"] for r in rows if r["config"] == args.configs[0]]
        for ax in axes:
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))])
            ax.set_xticklabels(labels)
            ax.legend()
        axes[0].set_yscale("log")
        axes[0].set_ylabel("DRAM bytes fallback / TPS")
        axes[0].set_title("ResNet-18: fallback vs Tiling Parameter Search")
        axes[1].set_ylabel("% fewer inp+wgt bytes loaded")
        axes[1].set_title("double buffering: reuse-aware vs plain (same tiling)")
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=110)
    except ImportError:
        print("matplotlib not available: no PNG")
    print(f"\n{'config':9s} {'layer':5s} {'fallback B':>13s} {'TPS B':>11s} {'ratio':>8s} "
          f"{'TPS knobs':28s} {'DB loads':>10s} {'reuse':>10s} {'saved':>6s}")
    for r in rows:
        print(f"{r['config']:9s} {r['layer']:5s} {r['fallback_bytes']:13,d} {r['tps_bytes']:11,d} "
              f"{r['ratio_fallback_over_tps']:8.1f} {r['tps_knobs']:28s} {r['db_loaded_bytes']:10,d} "
              f"{r['reuse_loaded_bytes']:10,d} {100 * r['reuse_saving_loaded']:5.1f}%")
    print(f"wrote {out.with_suffix('.csv')} (+ .png); {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
