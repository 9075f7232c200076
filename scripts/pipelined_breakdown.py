#!/usr/bin/env python
"""Where the cycles above the floor go, per GEMM layer (issue 18, goal row 1).

For each layer of the sets (ResNet-18 C1-C11, MobileNet D1-D9, the 108 DeepBench layers, all with
the bias + shift + clip epilogue) built with csp-relaxed at the default build options on
``--config``: the chosen plan (the stock template or an embedding, its knobs and virtual threads),
the cycles, the floor and its parts (:mod:`vta_ext.floor`), the cycle model's busy / stall / idle
cycles per module (:class:`vta_ext.sim.cycles.CycleReport`), and what the cycles above the floor go
to, each instruction timed by :func:`vta_ext.sim.cycles.insn_cycles`:

* on the compute module (the total is its busy + stall + idle cycles): ``gemm_over`` the GEMM
  micro-ops and issue cycles above the floor's unpadded GEMM work (padding, issue), ``reset`` GEMM
  reset micro-ops, ``alu_over`` the ALU passes above the floor's (the bias ADD, which the floor
  counts free, and the issue cycles), ``acc_load`` the accumulator LOADs (padding-only fills and
  bias tiles), ``uop_load`` the micro-op LOADs, ``not_overlapped`` the compute module's stall and
  idle cycles (waiting for loads or stores it could not overlap);
* on the load module: ``load_bytes`` the input and weight bytes at the bus width, ``bytes_ratio``
  every DRAM byte moved (micro-ops aside) over the floor's memory bytes (each tensor once),
  ``load_dma`` the issue and per-row DMA overheads, ``load_pad`` the padding elements written.

``--below`` keeps the layers under that efficiency in the printed table (all rows go to the CSV).
Writes ``--csv`` (one row per layer), a PNG next to it (the cycles of each kept layer by part,
over its floor) and prints a markdown table with the largest part of each row.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/pipelined_breakdown.py --config pipelined \\
        --csv docs/figures/pipelined_breakdown.csv
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "relay_examples", ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

#: the parts of the compute module's cycles above the floor, in the table's order
OVER = ("gemm_over", "reset", "alu_over", "acc_load", "uop_load", "not_overlapped")
LOAD_PARTS = ("load_bytes", "bytes_ratio", "load_dma", "load_pad")
MODULES = ("load", "compute", "store")
FIELDS = (["set", "case", "plan", "knobs", "threads", "cycles", "floor", "efficiency", "bound",
           "floor_gemm", "floor_alu", "floor_memory"]
          + [f"{m}_{t}" for m in MODULES for t in ("busy", "stall", "idle")]
          + ["gemm", "alu"] + list(OVER) + list(LOAD_PARTS) + ["largest"])


def instruction_parts(program) -> Dict[str, float]:
    """Busy cycles of ``program``'s instructions by kind: the compute module's parts of
    ``thin_breakdown.compute_parts`` (``gemm``, ``gemm_reset``, ``alu_vec``, ``alu_imm``,
    ``acc_load``, ``uop_load``, ``other``) and, on the load module, ``load_bytes`` (input and weight
    bytes at the bus width), ``load_dma`` (issue and per-row DMA overhead), ``load_pad`` (padding
    elements)."""
    from thin_breakdown import compute_parts
    from vta_ext.isa import MemInsn, Stage, insn_stage
    from vta_ext.sim.cycles import insn_cycles

    cfg = program.config
    parts: Counter = Counter(compute_parts(program))
    for insn in program.insns:
        if insn_stage(insn) == Stage.LOAD and isinstance(insn, MemInsn) and insn.x_size:
            nbytes = insn.x_size * insn.y_size * cfg.elem_bytes(insn.memory_type)
            data = math.ceil(nbytes / cfg.MEM_BYTES_PER_CYCLE)
            pad = ((insn.x_pad_0 + insn.x_size + insn.x_pad_1)
                   * (insn.y_pad_0 + insn.y_size + insn.y_pad_1) - insn.x_size * insn.y_size)
            parts["load_bytes"] += data
            parts["load_pad"] += pad
            parts["load_dma"] += insn_cycles(cfg, insn) - data - pad
    return dict(parts)


def measure(set_name: str, case: str, module, config: str) -> Dict:
    """The figures of one layer (module docstring)."""
    import vta_ext
    from efficiency import measure as build_measure
    from vta_ext.executor import compiled_op, cycle_report

    m = build_measure(module, config, "csp-relaxed")
    report = vta_ext.last_build_report()
    (p,) = [p for p in report.on_vta if p.call is not None]
    key = report.key_of(p)
    spec = json.loads(key)
    text, threads = knobs_of(p.detail)
    stock = bool(spec["workload"].get("stock")) or spec["strategy"] == "stock"
    program = compiled_op(key).program
    cyc = cycle_report(key)
    parts = instruction_parts(program)
    floor = report.floor(p)
    cfg = program.config
    out = {"set": set_name, "case": case,
           "plan": "stock" if stock else p.plan.replace("csp-relaxed ", ""),
           "knobs": text, "threads": threads, "cycles": cyc.total_cycles,
           "floor": round(floor.total), "efficiency": round(floor.total / cyc.total_cycles, 4),
           "bound": floor.bound, "floor_gemm": round(floor.compute_gemm),
           "floor_alu": round(floor.compute_alu), "floor_memory": round(floor.memory)}
    for mod in MODULES:
        t = cyc.modules[mod]
        out.update({f"{mod}_busy": t.busy, f"{mod}_stall": t.stall, f"{mod}_idle": t.idle})
    out["gemm"] = parts.get("gemm", 0)
    out["alu"] = parts.get("alu_vec", 0) + parts.get("alu_imm", 0)
    out["gemm_over"] = out["gemm"] - out["floor_gemm"]
    out["reset"] = parts.get("gemm_reset", 0)
    out["alu_over"] = out["alu"] - out["floor_alu"]
    out["acc_load"] = parts.get("acc_load", 0)
    out["uop_load"] = parts.get("uop_load", 0) + parts.get("other", 0)
    out["not_overlapped"] = out["compute_stall"] + out["compute_idle"]
    out["load_bytes"] = parts.get("load_bytes", 0)
    # every DRAM byte the program moves (micro-ops aside) over the floor's bytes (each once)
    moved = sum(v for k, v in cyc.dram_bytes.items() if k != "uop")
    out["bytes_ratio"] = round(moved / (floor.memory * cfg.MEM_BYTES_PER_CYCLE), 3)
    out["load_dma"] = parts.get("load_dma", 0)
    out["load_pad"] = parts.get("load_pad", 0)
    out["largest"] = max(OVER, key=lambda k: out[k])
    return out


def knobs_of(detail: str):
    """``(knobs text, virtual threads)`` from a build report line's ``tiling ...`` words."""
    words = detail.split("tiling ", 1)[1].split(";")[0].split(",")[0].split() if "tiling " in detail else []
    knobs = dict(w.split("=", 1) for w in words if "=" in w)
    threads = math.prod(int(v) for n, v in knobs.items()
                        if n.startswith("vt_") or n.endswith("nthread"))
    return " ".join(words), threads


def cases(sets):
    """``(set, case, module factory)`` of the GEMM layers of ``sets`` with bias + shift + clip."""
    import efficiency as eff

    for s, case, ep, make in eff.cases(sets, "small"):
        if ep != "none":
            yield s, case, make


def plot(rows: List[Dict], path: Path, config: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(rows)), 4))
    names = [r["case"] for r in rows]
    bottom = [float(r["floor_gemm"]) / float(r["floor"]) for r in rows]
    ax.bar(names, bottom, color="lightgray", label="floor GEMM")
    alu = [float(r["floor_alu"]) / float(r["floor"]) for r in rows]
    ax.bar(names, alu, bottom=bottom, color="darkgray", label="floor ALU")
    bottom = [b + a for b, a in zip(bottom, alu)]
    for part in OVER:
        vals = [max(0.0, float(r[part])) / float(r["floor"]) for r in rows]
        if any(vals):
            ax.bar(names, vals, bottom=bottom, label=part)
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8, label="floor")
    ax.axhline(1 / 0.6, color="tab:red", linestyle=":", linewidth=0.8, label="efficiency 0.6")
    ax.set_ylabel("compute module cycles / floor")
    ax.set_title(f"{config}, csp-relaxed at default options: compute module cycles by part",
                 fontsize=9)
    ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="pipelined")
    ap.add_argument("--layers", nargs="+", default=["resnet", "mobilenet", "deepbench"],
                    choices=("resnet", "mobilenet", "deepbench"))
    ap.add_argument("--below", type=float, default=0.6,
                    help="print the layers under this efficiency (default 0.6; 2 prints all)")
    ap.add_argument("--csv", default=str(ROOT / "docs" / "figures" / "pipelined_breakdown.csv"))
    args = ap.parse_args(argv)
    import logging

    import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
    from tqdm import tqdm

    logging.getLogger("vta_ext").setLevel(logging.ERROR)
    todo = list(cases(args.layers))
    rows = []
    for s, case, make in tqdm(todo, desc=f"layers on {args.config}", unit="layer"):
        rows.append(measure(s, case, make(), args.config))
    path = Path(args.csv)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    low = [r for r in rows if r["efficiency"] < args.below]
    plot(low, path.with_suffix(".png"), args.config)
    from near_limit import _geomean as geo

    print(f"\n{args.config}, csp-relaxed at default options: {len(rows)} layers, geomean "
          f"{geo([r['efficiency'] for r in rows]):.3f}, {len(low)} below {args.below}\n")
    print("| layer | plan | knobs | threads | cycles | floor (GEMM + ALU / memory) | eff | "
          "load busy/stall/idle | compute busy/stall/idle | GEMM over | reset | ALU over | "
          "ACC loads | UOP loads | not overlapped | load: bytes / DMA / pad cycles | DRAM bytes / floor's | largest |")
    print("|" + "---|" * 18)
    for r in low:
        print(f"| {r['case']} | {r['plan']} | {r['knobs']} | {r['threads']} | {r['cycles']:,} | "
              f"{r['floor']:,} ({r['floor_gemm']:,} + {r['floor_alu']:,} / {r['floor_memory']:,}) | "
              f"{r['efficiency']:.3f} | {r['load_busy']:,}/{r['load_stall']:,}/{r['load_idle']:,} | "
              f"{r['compute_busy']:,}/{r['compute_stall']:,}/{r['compute_idle']:,} | "
              f"{r['gemm_over']:,} | {r['reset']:,} | {r['alu_over']:,} | {r['acc_load']:,} | "
              f"{r['uop_load']:,} | {r['not_overlapped']:,} | {r['load_bytes']:,} / "
              f"{r['load_dma']:,} / {r['load_pad']:,} | x{r['bytes_ratio']:.2f} | {r['largest']} |")
    totals = {k: sum(r[k] for r in low) for k in OVER}
    above = sum(r["cycles"] - r["floor"] for r in low)
    print(f"\nover the {len(low)} layers: cycles above the floor {above:,}; compute-module parts "
          + ", ".join(f"{k} {v:,}" for k, v in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
