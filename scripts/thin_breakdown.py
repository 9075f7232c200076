#!/usr/bin/env python
"""Where the cycles of the thin-channel DeepBench layers go (issue 18, goal row 2).

For each of the 12 DeepBench layers with 1 or 3 input channels (``near_limit.thin_layers``), with
the bias + shift + clip epilogue, at the default build options on ``--config``: the operator
cycles of ``stock`` and ``csp-relaxed`` (cycle model), the floor (:mod:`vta_ext.floor`) and, for
csp-relaxed, the busy cycles of the compute module split by instruction kind (GEMM micro-ops and
their issue, GEMM resets, vector ALU passes (the bias ADD), immediate ALU passes (shift, clip),
accumulator LOADs (the padding-only fills and the bias tiles), micro-op LOADs), its stall, and
the busy cycles of the load and store modules. Also printed: the geomean of stock / floor, the
best ratio any plan can reach against this stock under the floor's definition.

``--objective cycles`` ranks csp-relaxed's embeddings by VTA cycles alone instead of the default
end-to-end estimate (which adds the host layout traffic).

``--bind constants`` (the default) binds each layer's weights and bias as Relax constants (seeded
int8 weights, an int32 bias in ``tune_figures.DEEPBENCH_BIAS_RANGE``), as a frontend binds a
quantised network's parameters, for both strategies; ``--bind params`` passes them as function
parameters (runtime data: no build-time relayout of the weights, no bias fold).

Writes ``--csv`` (one row per layer), a PNG next to it (the compute module's parts per layer,
against the floor) and prints a markdown table.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/thin_breakdown.py \\
        --csv docs/figures/thin_breakdown.csv
"""
from __future__ import annotations

import argparse
import csv
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

#: the compute module's parts, in the table's order
PARTS = ("gemm", "gemm_reset", "alu_vec", "alu_imm", "acc_load", "uop_load", "other")
FIELDS = (["case", "embedding", "stock", "csp_relaxed", "ratio", "floor", "efficiency"]
          + [f"compute_{p}" for p in PARTS]
          + ["compute_busy", "compute_stall", "load_busy", "store_busy"])


def compute_parts(program) -> Dict[str, int]:
    """Busy cycles of the compute module's instructions of ``program`` by kind (:data:`PARTS`),
    each instruction timed by :func:`vta_ext.sim.cycles.insn_cycles`."""
    from vta_ext.isa import AluInsn, GemmInsn, MemInsn, MemType, Stage, insn_stage
    from vta_ext.sim.cycles import insn_cycles

    parts: Counter = Counter()
    cfg = program.config
    for insn in program.insns:
        if insn_stage(insn) != Stage.COMPUTE:
            continue
        if isinstance(insn, GemmInsn):
            kind = "gemm_reset" if insn.reset_reg else "gemm"
        elif isinstance(insn, AluInsn):
            kind = "alu_imm" if insn.use_imm else "alu_vec"
        elif isinstance(insn, MemInsn) and insn.x_size:
            kind = "uop_load" if insn.memory_type == MemType.UOP else "acc_load"
        else:
            kind = "other"
        parts[kind] += insn_cycles(cfg, insn)
    return {p: parts.get(p, 0) for p in PARTS}


def measure(row, config: str, objective: str, constants: bool = True) -> Dict:
    """The figures of one DeepBench layer (its CSV row) on ``config``: see the module docstring;
    csp-relaxed ranks its embeddings by ``objective`` (``vta_ext.build_options``); ``constants``
    binds the weights and the bias as constants (``tune_figures.deepbench_module``)."""
    import tune_figures as tf
    import vta_ext
    from efficiency import measure as build_measure
    from vta_ext.executor import compiled_op, cycle_report

    out = {"case": f"DB{row['id']}"}
    for strategy in ("stock", "csp-relaxed"):
        options = {"objective": objective} if strategy == "csp-relaxed" else {}
        m = build_measure(tf.deepbench_module(row, "bias-shift-clip", constants), config, strategy, **options)
        out[strategy.replace("-", "_")] = m["cycles"]
        if strategy == "csp-relaxed":
            report = vta_ext.last_build_report()
            (p,) = [p for p in report.on_vta if p.call is not None]
            key = report.key_of(p)
            out["embedding"] = p.plan
            out["floor"] = m["floor"]
            out["efficiency"] = m["efficiency"]
            out.update({f"compute_{k}": v for k, v in compute_parts(compiled_op(key).program).items()})
            modules = cycle_report(key).modules
            out.update(compute_busy=modules["compute"].busy, compute_stall=modules["compute"].stall,
                       load_busy=modules["load"].busy, store_busy=modules["store"].busy)
    out["ratio"] = round(out["stock"] / out["csp_relaxed"], 3)
    return out


def plot(rows: List[Dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.6))
    names = [r["case"] for r in rows]
    bottom = [0.0] * len(rows)
    for part in PARTS + ("stall",):
        col = "compute_stall" if part == "stall" else f"compute_{part}"
        vals = [float(r[col]) / float(r["floor"]) for r in rows]
        if any(vals):
            ax.bar(names, vals, bottom=bottom, label=part)
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8, label="floor")
    ax.set_ylabel("compute module cycles / floor")
    ax.set_title("Thin DeepBench layers, csp-relaxed: compute module by instruction kind")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="default")
    ap.add_argument("--csv", default=str(ROOT / "docs" / "figures" / "thin_breakdown.csv"))
    ap.add_argument("--objective", default="end-to-end",
                    help="csp-relaxed's embedding ranking (vta_ext.build_options; default the "
                         "default build option, end-to-end; 'cycles' ranks by VTA cycles only)")
    ap.add_argument("--bind", choices=("constants", "params"), default="constants",
                    help="weights and bias bound as Relax constants (default, as a quantised network "
                         "binds them) or passed as function parameters (runtime data)")
    ap.add_argument("--only", nargs="*", type=int, default=None, help="DeepBench ids (default: all 12)")
    args = ap.parse_args(argv)
    import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
    from near_limit import thin_layers
    from tqdm import tqdm

    layers = [r for r in thin_layers() if not args.only or int(r["id"]) in args.only]
    rows = [measure(r, args.config, args.objective, args.bind == "constants") for r in tqdm(layers, desc="thin layers", unit="layer")]
    path = Path(args.csv)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    plot(rows, path.with_suffix(".png"))
    from near_limit import _geomean as geo
    print("\n| layer | csp-relaxed embedding | stock | csp-relaxed | stock / csp | floor | efficiency |"
          " compute: GEMM | bias ADD (ALU vec) | shift+clip (ALU imm) | ACC LOADs | UOP LOADs |"
          " compute stall | load busy | store busy |\n|" + "---|" * 15)
    for r in rows:
        print(f"| {r['case']} | {r['embedding']} | {r['stock']:,} | {r['csp_relaxed']:,} | "
              f"x{r['ratio']:.2f} | {r['floor']:,.0f} | {r['efficiency']:.2f} | "
              f"{r['compute_gemm'] + r['compute_gemm_reset']:,} | {r['compute_alu_vec']:,} | "
              f"{r['compute_alu_imm']:,} | {r['compute_acc_load']:,} | {r['compute_uop_load']:,} | "
              f"{r['compute_stall']:,} | {r['load_busy']:,} | {r['store_busy']:,} |")
    print(f"\ngeomean stock / csp-relaxed x{geo([r['ratio'] for r in rows]):.2f}; geomean stock / "
          f"floor (the best any plan reaches) x{geo([r['stock'] / r['floor'] for r in rows]):.2f}; "
          f"efficiency {min(r['efficiency'] for r in rows):.2f}..{max(r['efficiency'] for r in rows):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
