#!/usr/bin/env python
"""ResNet-18 cycles on VTA (original vs pipelined timing), TPS DRAM traffic, and a configuration sweep.

Three measurements, all from the cycle model (:class:`vta_ext.sim.cycles.CycleModel`) applied to
the instruction streams the ``ext_vta`` build generates; nothing here is synthesised hardware.

1. **Network cycles.** The quantised ResNet-18 (224x224, :func:`models.quantized_example`, every
   conv2d / dense / pool / add on VTA) is built with ``relax.build(mod, vta_ext.vta_target(name))``
   for each preset in ``--configs`` and run once on the functional simulator; the output is
   compared bit for bit with the ``llvm`` build. The executor's run log gives the VTA calls in
   execution order; each call's program is timed by the cycle model (cycles are static per
   program). Writes ``docs/figures/resnet_cycles.csv`` (one row per call and config plus a
   ``TOTAL`` row), ``resnet_cycles.png`` (per-layer bars and the original/pipelined ratio),
   ``resnet_timeline_<layer>_<config>.png`` (activity timeline of one representative conv layer)
   and ``resnet_roofline_<config>.png`` (whole network).
2. **DRAM bytes, TPS vs fallback (C2-C11) and reuse-aware double buffering.** Calls
   ``scripts/tps_vs_fallback.py`` (its ``main``), which writes ``docs/figures/resnet_tps_dram.csv``
   / ``.png`` here; its table is reprinted in the summary.
3. **Configuration sweep.** GEMM shape (1x16x16, 2x16x16, 1x32x32: the operator specs of the
   shape's preset build) x memory bandwidth (8/16/32/64 B/cycle, ``LOG_BUS_WIDTH`` set to match,
   as the wide presets do; the validation does not require it) x scratchpad (0.5x, 1x, 2x the
   preset's INP/WGT/ACC buffers; configurations whose instruction fields overflow are skipped and
   listed) x timing (original / pipelined). Every VTA operator of the whole network is rebuilt
   per structural configuration (``vta_ext.executor.build_spec``, the builder the offload pass uses,
   with TPS tiling) and timed for both timings. Total cycles are plotted against an area proxy
   (:func:`area_proxy`, *not* synthesis) with the Pareto front marked:
   ``docs/figures/config_sweep.csv`` / ``.png``.

Usage: ``OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/resnet_cycles.py [--quick]``
(``--quick``: presets default/pipelined only, TPS table on ``default`` only, sweep reduced to
8/32 B/cycle and 1x scratchpads).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "relay_examples", ROOT / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

FIG = ROOT / "docs" / "figures"
#: pipelined preset -> its original-timing counterpart (same shape, same programs)
ORIGINAL_OF = {"pipelined": "default", "1x32x32_pipelined": "1x32x32"}
#: sweep GEMM shape -> preset supplying the shape, the buffers and the operator specs
SHAPE_PRESETS = {"1x16x16": "default", "2x16x16": "2x16x16", "1x32x32": "1x32x32"}
#: timing constants: (GEMM, ALU imm, ALU vec) cycles per micro-op, from docs/isa.md
TIMINGS = {"original": (4, 5, 6), "pipelined": (1, 1, 2)}
#: area proxy weights (see area_proxy)
W_MAC, W_SRAM_BYTE, W_BUS_BIT, PIPELINE_MAC_OVERHEAD = 1.0, 1.0 / 256, 0.5, 0.10
MODULES = ("load", "compute", "store")


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------
def layer_name(op: str, wl: dict) -> str:
    """``C2``..``C11`` for the ResNet-18 benchmark layers, otherwise a short description."""
    from tps_vs_fallback import RESNET18

    if op == "conv2d":
        for name, ref in RESNET18.items():
            d = dataclasses.asdict(ref)
            if all(wl.get(k) == v for k, v in d.items() if k != "batch"):
                return name
        return f"conv{wl['kernel_h']}x{wl['kernel_w']} {wl['in_channels']}->{wl['out_channels']}"
    if op == "dense":
        return f"dense {wl['in_features']}->{wl['out_features']}"
    if op in ("max_pool2d", "avg_pool2d"):
        return f"{op.split('_')[0]}pool {wl['height']}x{wl['width']}"
    if op == "add":
        return f"add {wl['channels']}x{wl['height']}"
    return op


def cycle_report(cfg, program, timeline: bool = False):
    from vta_ext.sim.cycles import CycleModel

    return CycleModel(cfg, record_timeline=timeline).run_program(program)


def area_proxy(cfg, timing: str) -> Dict[str, float]:
    """Area proxy (arbitrary units), NOT a synthesis result.

    ``W_MAC`` per int8 MAC of the GEMM core (BATCH*BLOCK_IN*BLOCK_OUT), ``W_SRAM_BYTE`` per byte of
    on-chip SRAM (INP + WGT + ACC + UOP buffers; 1/256: one MAC with its 32-bit accumulator taken
    as roughly the area of 256 bytes = 2 Kbit of SRAM), ``W_BUS_BIT`` per bit of the memory bus
    (DMA datapath and buffering), and ``PIPELINE_MAC_OVERHEAD`` extra on the MAC term for the
    pipelined timing (pipeline registers; a guess, the paper reports a small area increase).
    """
    macs = cfg.BATCH * cfg.BLOCK_IN * cfg.BLOCK_OUT
    sram = cfg.INP_BUFF_SIZE + cfg.WGT_BUFF_SIZE + cfg.ACC_BUFF_SIZE + cfg.UOP_BUFF_SIZE
    mac_term = W_MAC * macs * (1 + (PIPELINE_MAC_OVERHEAD if timing == "pipelined" else 0))
    sram_term = W_SRAM_BYTE * sram
    bus_term = W_BUS_BIT * cfg.BUS_WIDTH
    return {"macs": macs, "sram_bytes": sram, "bus_bits": cfg.BUS_WIDTH, "mac_term": mac_term,
            "sram_term": sram_term, "bus_term": bus_term, "area": mac_term + sram_term + bus_term}


def pareto(points: List[Tuple[float, float]]) -> List[int]:
    """Indices of the points not dominated in (minimise x, minimise y)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((x2 <= x and y2 <= y) and (x2 < x or y2 < y) for x2, y2 in points):
            front.append(i)
    return front


# ------------------------------------------------------------------------------------------
# 1. network cycles
# ------------------------------------------------------------------------------------------
def build_and_run(qmod, config: str, data, reference):
    """Build ``qmod`` for preset ``config``, run once; return (calls, equal, build_s, run_s).

    ``calls``: list of (op, workload, key) in execution order, from the executor's run log.
    """
    import numpy as np
    import tvm
    from tvm import relax

    import vta_ext

    start = time.perf_counter()
    executable = relax.build(qmod, target=vta_ext.vta_target(config))
    build_s = time.perf_counter() - start
    vm = relax.VirtualMachine(executable, tvm.cpu())
    vta_ext.clear_run_log()
    start = time.perf_counter()
    out = vm["main"](tvm.runtime.tensor(data))[0].numpy()
    run_s = time.perf_counter() - start
    calls = [(r.op, r.workload, r.key) for r in vta_ext.run_log()]
    return calls, bool(np.array_equal(out, reference)), build_s, run_s


def network_rows(config: str, calls) -> Tuple[List[dict], object]:
    """One CSV row per VTA call (cycle model of its program) and the summed CycleReport."""
    from vta_ext.executor import compiled_op

    rows, total, cache = [], None, {}
    for i, (op, wl, key) in enumerate(calls):
        if key not in cache:
            prog = compiled_op(key).program
            rep = cycle_report(prog.config, prog, timeline=True)
            kinds = {k: 0 for k in ("gemm", "alu", "acc", "uop")}
            for module, a, b, kind in rep.timeline:
                if module == "compute" and kind in kinds:
                    kinds[kind] += b - a
            rep.timeline = []
            cache[key] = (rep, prog.insn_count, kinds)
        rep, insns, kinds = cache[key]
        total = rep if total is None else total + rep
        row = {"config": config, "index": i, "layer": layer_name(op, wl), "op": op,
               "cycles": rep.total_cycles, "insns": insns}
        for m in MODULES:
            row[f"{m}_busy"] = rep.modules[m].busy
            row[f"{m}_stall"] = rep.modules[m].stall
        row["compute_gemm"], row["compute_alu"] = kinds["gemm"], kinds["alu"]
        row["compute_acc_uop_load"] = kinds["acc"] + kinds["uop"]
        row["dram_bytes"] = sum(rep.dram_bytes.values())
        row["macs"] = rep.macs
        row["bound"] = max(MODULES, key=lambda m: rep.modules[m].busy)
        rows.append(row)
    trow = {"config": config, "index": "", "layer": "TOTAL", "op": "", "cycles": total.total_cycles,
            "insns": sum(r["insns"] for r in rows)}
    for m in MODULES:
        trow[f"{m}_busy"] = sum(r[f"{m}_busy"] for r in rows)
        trow[f"{m}_stall"] = sum(r[f"{m}_stall"] for r in rows)
    for k in ("compute_gemm", "compute_alu", "compute_acc_uop_load"):
        trow[k] = sum(r[k] for r in rows)
    trow["dram_bytes"] = sum(r["dram_bytes"] for r in rows)
    trow["macs"] = total.macs
    trow["bound"] = max(MODULES, key=lambda m: trow[f"{m}_busy"])
    rows.append(trow)
    return rows, total


def plot_layers(rows: List[dict], configs: List[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = {c: [r for r in rows if r["config"] == c and r["layer"] != "TOTAL"] for c in configs}
    labels = [r["layer"] for r in per[configs[0]]]
    n = len(labels)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(14, 7.5), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 2]})
    width = 0.8 / len(configs)
    for i, c in enumerate(configs):
        ax.bar([j + i * width for j in range(n)], [r["cycles"] / 1e6 for r in per[c]], width,
               label=f"{c} ({sum(r['cycles'] for r in per[c]) / 1e6:.1f} M total)")
    ax.set_ylabel("cycles (millions)")
    ax.set_title("ResNet-18 224x224 on VTA, cycle model, per VTA call (execution order)")
    ax.legend()
    pairs = [(p, o) for p, o in ORIGINAL_OF.items() if p in configs and o in configs]
    for k, (p, o) in enumerate(pairs):
        ratio = [a["cycles"] / b["cycles"] for a, b in zip(per[o], per[p])]
        ax2.bar([j + k * 0.8 / len(pairs) for j in range(n)], ratio, 0.8 / len(pairs),
                label=f"{o} / {p}")
    ax2.axhline(1, color="k", lw=0.5)
    ax2.set_ylabel("cycles original / pipelined")
    ax2.legend()
    ax2.set_xticks([j + 0.4 - width / 2 for j in range(n)])
    ax2.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------
# 3. configuration sweep
# ------------------------------------------------------------------------------------------
def sweep_configs(quick: bool):
    """(shape, scratchpad label, bandwidth, structural VTAConfig) plus skipped combinations."""
    from vta_ext.config import ConfigError, load_config

    bandwidths = (8, 32) if quick else (8, 16, 32, 64)
    scratch = {"1x": 0} if quick else {"0.5x": -1, "1x": 0, "2x": 1}
    out, skipped = [], []
    for shape, preset in SHAPE_PRESETS.items():
        base = load_config(preset)
        for sp, d in scratch.items():
            for bw in bandwidths:
                name = f"sw_{shape}_{sp}_{bw}B"
                try:
                    cfg = dataclasses.replace(
                        base, name=name, LOG_INP_BUFF_SIZE=base.LOG_INP_BUFF_SIZE + d,
                        LOG_WGT_BUFF_SIZE=base.LOG_WGT_BUFF_SIZE + d,
                        LOG_ACC_BUFF_SIZE=base.LOG_ACC_BUFF_SIZE + d,
                        LOG_BUS_WIDTH=int(math.log2(bw * 8)), MEM_BYTES_PER_CYCLE=bw)
                except ConfigError as err:
                    skipped.append((shape, sp, bw, str(err).split(": ", 1)[-1][:90]))
                    continue
                out.append((shape, sp, bw, cfg))
    return out, skipped


def run_sweep(specs_by_shape: Dict[str, List[dict]], quick: bool):
    from tqdm import tqdm

    from vta_ext.executor import build_spec

    points, skipped = sweep_configs(quick)
    rows = []
    for shape, sp, bw, cfg in tqdm(points, desc="sweep (structural configs)", unit="cfg"):
        specs = specs_by_shape[shape]  # (spec, number of calls)
        try:
            progs = [(build_spec(spec, cfg).program, n) for spec, n in specs]
        except Exception as err:  # a tiling that cannot fit the smaller scratchpads
            skipped.append((shape, sp, bw, f"build failed: {str(err)[:90]}"))
            continue
        for timing, (g, ai, av) in TIMINGS.items():
            tcfg = dataclasses.replace(cfg, name=f"{cfg.name}_{timing}", GEMM_CYCLES_PER_UOP=g,
                                       ALU_CYCLES_PER_UOP_IMM=ai, ALU_CYCLES_PER_UOP_VEC=av)
            cycles, busy = 0, {m: 0 for m in MODULES}
            for prog, n in progs:
                rep = cycle_report(tcfg, prog)
                cycles += n * rep.total_cycles
                for m in MODULES:
                    busy[m] += n * rep.modules[m].busy
            area = area_proxy(tcfg, timing)
            rows.append({"shape": shape, "scratchpad": sp, "bytes_per_cycle": bw,
                         "LOG_BUS_WIDTH": cfg.LOG_BUS_WIDTH, "timing": timing,
                         "LOG_INP_WGT_ACC_BUFF": f"{cfg.LOG_INP_BUFF_SIZE}/{cfg.LOG_WGT_BUFF_SIZE}/"
                                                 f"{cfg.LOG_ACC_BUFF_SIZE}",
                         "total_cycles": cycles, "ms_at_100MHz": round(cycles / 1e5, 3),
                         **{f"{m}_busy": busy[m] for m in MODULES},
                         **{k: round(v, 1) if isinstance(v, float) else v for k, v in area.items()}})
    ref = next((r["area"] for r in rows if (r["shape"], r["scratchpad"], r["bytes_per_cycle"],
                                             r["timing"]) == ("1x16x16", "1x", 8, "original")), None)
    front = set(pareto([(r["area"], r["total_cycles"]) for r in rows]))
    for i, r in enumerate(rows):
        r["area_rel_default"] = round(r["area"] / ref, 3) if ref else ""
        r["pareto"] = i in front
    return rows, skipped


def plot_sweep(rows: List[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6.5))
    markers = {"1x16x16": "o", "2x16x16": "s", "1x32x32": "^"}
    colors = {8: "tab:blue", 16: "tab:green", 32: "tab:orange", 64: "tab:red"}
    for r in rows:
        ax.scatter(r["area_rel_default"], r["total_cycles"] / 1e6, marker=markers[r["shape"]],
                   facecolors=colors[r["bytes_per_cycle"]] if r["timing"] == "pipelined" else "none",
                   edgecolors=colors[r["bytes_per_cycle"]], s=20 + 25 * {"0.5x": 0, "1x": 1, "2x": 2}[r["scratchpad"]])
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: r["area"])
    ax.plot([r["area_rel_default"] for r in front], [r["total_cycles"] / 1e6 for r in front], "k--",
            lw=1, label="Pareto front")
    for r in front:
        ax.annotate(f"{r['shape']} {r['bytes_per_cycle']}B {r['scratchpad']} {r['timing'][:4]}",
                    (r["area_rel_default"], r["total_cycles"] / 1e6), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("area proxy, relative to default (MACs + SRAM bytes/256 + bus bits/2; NOT synthesis)")
    ax.set_ylabel("ResNet-18 cycles (millions, cycle model)")
    ax.set_title("VTA configuration sweep: ResNet-18 224x224 (all VTA operators)")
    h = [plt.Line2D([], [], ls="", marker=m, color="k", mfc="none", label=s) for s, m in markers.items()]
    h += [plt.Line2D([], [], ls="", marker="o", color=c, label=f"{b} B/cycle") for b, c in colors.items()]
    h += [plt.Line2D([], [], ls="", marker="o", color="k", mfc="none", label="original timing (hollow)"),
          plt.Line2D([], [], ls="", marker="o", color="k", label="pipelined (filled)"),
          plt.Line2D([], [], ls="--", color="k", label="Pareto front; size = scratchpad 0.5x/1x/2x")]
    ax.legend(handles=h, fontsize=8, loc="upper right")
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    ax.set_xticks([t for t in (0.5, 0.75, 1, 1.5, 2, 3, 4, 6) if x0 <= t <= x1])
    ax.set_yticks([t for t in (2, 3, 4, 6, 8, 10, 15, 20, 30, 40, 60) if y0 <= t <= y1])
    ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_csv(rows: List[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


# ------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="reduced run (see module docstring)")
    ap.add_argument("--configs", nargs="+", default=None,
                    help="presets for part 1 (default: default pipelined 1x32x32 1x32x32_pipelined)")
    ap.add_argument("--timeline-layer", default="C5", help="layer whose activity timeline is plotted")
    ap.add_argument("--no-tps", action="store_true", help="skip part 2")
    ap.add_argument("--no-sweep", action="store_true", help="skip part 3")
    args = ap.parse_args(argv)
    configs = args.configs or (["default", "pipelined"] if args.quick
                               else ["default", "pipelined", "1x32x32", "1x32x32_pipelined"])
    FIG.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    status = 0

    import tvm
    from tvm import relax

    from models import quantized_example

    print("== 1. ResNet-18 224x224 (quantised, every conv/dense/pool/add on VTA): cycle model")
    _, qmodel, _, data = quantized_example("resnet18", 224, 0)
    reference = relax.VirtualMachine(relax.build(qmodel.mod, target="llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(data))[0].numpy()
    print(f"[{time.perf_counter() - t0:6.1f}s] quantised, llvm reference computed", flush=True)

    calls_by_config, rows, totals = {}, [], {}
    needed = list(dict.fromkeys(configs + ([] if args.no_sweep else list(SHAPE_PRESETS.values()))))
    for config in needed:
        calls, equal, build_s, run_s = build_and_run(qmodel.mod, config, data, reference)
        calls_by_config[config] = calls
        print(f"[{time.perf_counter() - t0:6.1f}s] {config}: build {build_s:.1f} s, {len(calls)} VTA "
              f"calls, simulation run {run_s:.1f} s, output {'EQUALS' if equal else 'DIFFERS FROM'} "
              f"llvm bit for bit", flush=True)
        if not equal:
            status = 1
        if config in configs:
            r, total = network_rows(config, calls)
            rows += r
            totals[config] = total

    # ratio column: original-timing cycles / this config's cycles, per layer
    by = {(r["config"], r["index"]): r for r in rows}
    for r in rows:
        o = ORIGINAL_OF.get(r["config"])
        if o in configs:
            r["ratio_original_over_this"] = round(by[(o, r["index"])]["cycles"] / r["cycles"], 3)
        else:
            r["ratio_original_over_this"] = 1.0 if r["config"] in ORIGINAL_OF.values() else ""
    write_csv(rows, FIG / "resnet_cycles.csv")
    plot_layers(rows, configs, FIG / "resnet_cycles.png")

    # timeline of one representative conv layer, roofline of the whole network
    from vta_ext.executor import compiled_op

    for config in configs:
        key = next((k for op, wl, k in calls_by_config[config]
                    if layer_name(op, wl) == args.timeline_layer), None)
        if key is not None and config in ("default", "pipelined"):
            prog = compiled_op(key).program
            cycle_report(prog.config, prog, timeline=True).plot_timeline(
                str(FIG / f"resnet_timeline_{args.timeline_layer}_{config}.png"))
        if config in ("default", "pipelined"):
            totals[config].plot_roofline(str(FIG / f"resnet_roofline_{config}.png"))

    print(f"\n{'config':18s} {'cycles':>13s} {'ms@100MHz':>9s} {'load busy':>12s} {'compute busy':>13s} "
          f"{'store busy':>11s} {'DRAM bytes':>12s} {'GMAC':>6s} {'GEMM':>12s} {'ALU':>11s} "
          f"{'acc/uop ld':>10s}")
    for r in rows:
        if r["layer"] == "TOTAL":
            print(f"{r['config']:18s} {r['cycles']:13,d} {r['cycles'] / 1e5:9.2f} {r['load_busy']:12,d} "
                  f"{r['compute_busy']:13,d} {r['store_busy']:11,d} {r['dram_bytes']:12,d} "
                  f"{r['macs'] / 1e9:6.2f} {r['compute_gemm']:12,d} {r['compute_alu']:11,d} "
                  f"{r['compute_acc_uop_load']:10,d}")
    for p, o in ORIGINAL_OF.items():
        if p in totals and o in totals:
            print(f"ratio {o} / {p}: {totals[o].total_cycles / totals[p].total_cycles:.2f}x")
    first = configs[0]
    print(f"\nper layer ({', '.join(configs)}): cycles, bound module (largest busy), ratio")
    for r in rows:
        if r["config"] == first and r["layer"] != "TOTAL":
            cells = []
            for c in configs:
                rr = by[(c, r["index"])]
                ratio = rr.get("ratio_original_over_this")
                cells.append(f"{rr['cycles']:>11,d} {rr['bound'][:4]:4s}"
                             + (f" x{ratio:<5.2f}" if c in ORIGINAL_OF and ratio else ""))
            print(f"  {r['index']:>2} {r['layer']:18s} " + " | ".join(cells))

    # ---------------------------------------------------------------- 2. TPS vs fallback
    if not args.no_tps:
        import tps_vs_fallback

        print("\n== 2. DRAM bytes: fallback vs TPS (C2-C11), double buffering with vs without reuse "
              "(scripts/tps_vs_fallback.py)", flush=True)
        tcfgs = ["default"] if args.quick else ["default", "1x32x32"]
        tps_vs_fallback.main(["--configs", *tcfgs, "--out", str(FIG / "resnet_tps_dram")])
        with open(FIG / "resnet_tps_dram.csv") as f:
            trows = list(csv.DictReader(f))
        for c in tcfgs:
            rs = [r for r in trows if r["config"] == c]
            fb = sum(int(r["fallback_bytes"]) for r in rs)
            tb = sum(int(r["tps_bytes"]) for r in rs)
            db = sum(int(r["db_loaded_bytes"]) for r in rs)
            rb = sum(int(r["reuse_loaded_bytes"]) for r in rs)
            ratios = [float(r["ratio_fallback_over_tps"]) for r in rs]
            sav = [float(r["reuse_saving_loaded"]) for r in rs]
            print(f"{c}: C2-C11 fallback {fb:,} B vs TPS {tb:,} B = {fb / tb:.1f}x overall "
                  f"(per layer {min(ratios):.1f}x-{max(ratios):.1f}x); reuse-aware double buffering "
                  f"loads {rb:,} instead of {db:,} B inp+wgt (-{100 * (1 - rb / db):.1f}%, per layer "
                  f"{100 * min(sav):.0f}-{100 * max(sav):.0f}%)")

    # ---------------------------------------------------------------- 3. sweep
    if not args.no_sweep:
        print("\n== 3. configuration sweep (whole ResNet-18, every VTA operator rebuilt per config)",
              flush=True)
        specs_by_shape = {}
        for shape, preset in SHAPE_PRESETS.items():
            counts: Dict[str, int] = {}
            for _, _, key in calls_by_config[preset]:
                counts[key] = counts.get(key, 0) + 1
            specs_by_shape[shape] = [(json.loads(k), n) for k, n in counts.items()]
        srows, skipped = run_sweep(specs_by_shape, args.quick)
        write_csv(srows, FIG / "config_sweep.csv")
        plot_sweep(srows, FIG / "config_sweep.png")
        for shape, sp, bw, why in skipped:
            print(f"  skipped {shape} {sp} {bw} B/cycle: {why}")
        # consistency with part 1 (same programs, same timing => same totals)
        checks = {("1x16x16", "1x", 8, "original"): "default", ("1x16x16", "1x", 8, "pipelined"): "pipelined",
                  ("1x32x32", "1x", 32, "original"): "1x32x32",
                  ("1x32x32", "1x", 32, "pipelined"): "1x32x32_pipelined"}
        for r in srows:
            c = checks.get((r["shape"], r["scratchpad"], r["bytes_per_cycle"], r["timing"]))
            if c in totals:
                ok = r["total_cycles"] == totals[c].total_cycles
                print(f"  check: sweep point {c:18s} {r['total_cycles']:,} cycles "
                      f"{'==' if ok else '!='} part 1 {totals[c].total_cycles:,}")
                status = status or (0 if ok else 1)
        print(f"\n{'shape':8s} {'spad':5s} {'B/cyc':>5s} {'timing':9s} {'cycles':>13s} {'area':>6s} "
              f"{'load busy':>12s} {'compute busy':>13s}  pareto")
        for r in sorted(srows, key=lambda r: r["area"]):
            print(f"{r['shape']:8s} {r['scratchpad']:5s} {r['bytes_per_cycle']:5d} {r['timing']:9s} "
                  f"{r['total_cycles']:13,d} {r['area_rel_default']:6.2f} {r['load_busy']:12,d} "
                  f"{r['compute_busy']:13,d}  {'*' if r['pareto'] else ''}")
    print(f"\nwrote {FIG}/resnet_cycles.csv/.png, resnet_timeline_*.png, resnet_roofline_*.png"
          + ("" if args.no_tps else ", resnet_tps_dram.csv/.png")
          + ("" if args.no_sweep else ", config_sweep.csv/.png")
          + f"; {time.perf_counter() - t0:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
