"""The ``pynq`` cycle model against the RTL of the Pynq HLS design, on the programs the compiler emits.

For every operator of the validation set and every strategy (``stock``, ``csp-strict``,
``csp-relaxed``), the operator is planned and built for the ``pynq`` preset exactly as the offload
pass does (``template.plan``, the options' knobs, :func:`vta_ext.executor.op_key`,
:func:`~vta_ext.executor.compiled_op`), its program is run on the RTL (``libvta_rtl.so`` through
:mod:`vta_ext.device`; RTL cycles do not depend on the data, so the DRAM image runs as built) at
each memory latency, and the model is evaluated on the same program with ``MEM_LATENCY_CYCLES``
set to that latency. The bar: model / RTL within ±5 % for every program, geomean |error| <= 2 %.

Sets (``--sets``):

* ``resnet224`` / ``resnet56``: the ResNet-18 conv layers C1-C11 (facts §7.2) at a 224x224 input,
  and at 56x56 (every feature map a quarter: C1 at 56, C2 at 14, ...);
* ``thin``: the 12 thin-channel DeepBench layers (input channels < 16, ``scripts/deepbench.py``);
* ``mobilenet``: MobileNetV2's stem conv and 1x1 convs (its depthwise convs need ALU MUL on the
  stock template, which pynq lacks; under ``csp-relaxed`` they run on the GEMM core,
  ``tests/test_depthwise_gemm.py`` checks them on the RTL);
* ``other``: a dense layer (ResNet-18's classifier) and pooling layers (a max pool and ResNet's
  global average pool; a layer ``pynq`` refuses is listed as refused).

Writes ``docs/figures/model_vs_rtl.csv`` and ``.png`` and prints a table per set and latency.

    python scripts/model_vs_rtl.py [--sets resnet56 thin] [--strategies stock] [--latencies 0 40]
        [--layers C2 C11] [--max-cycles 2e6] [--out DIR]
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO, REPO / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from tvm import relax  # noqa: E402

import tvm_csp_embed  # noqa: E402,F401  (registers the CSP strategies)
from vta_ext.config import VTAConfig, load_config  # noqa: E402
from vta_ext.executor import compiled_op, op_key  # noqa: E402
from vta_ext.options import build_options, current_options  # noqa: E402
from vta_ext.sim.cycles import CycleModel  # noqa: E402
from vta_ext.strategy import MatchedOp, TemplateRefusal, get_template  # noqa: E402

FIG = REPO / "docs" / "figures"
SETS = ("resnet224", "resnet56", "thin", "mobilenet", "other")
STRATEGIES = ("stock", "csp-strict", "csp-relaxed")
#: requantisation and ReLU, as the networks' convs end (``>> 8``, clip [0, 127])
EPILOGUE = (("shr", 8), ("clip", 0, 127))
#: ResNet-18 (H=W, in, out, kernel, pad, stride), facts §7.2 (C1 with its 3 input channels)
RESNET18 = {"C1": (224, 3, 64, 7, 3, 2), "C2": (56, 64, 64, 3, 1, 1),
            "C3": (56, 64, 128, 3, 1, 2), "C4": (56, 64, 128, 1, 0, 2),
            "C5": (28, 128, 128, 3, 1, 1), "C6": (28, 128, 256, 3, 1, 2),
            "C7": (28, 128, 256, 1, 0, 2), "C8": (14, 256, 256, 3, 1, 1),
            "C9": (14, 256, 512, 3, 1, 2), "C10": (14, 256, 512, 1, 0, 2),
            "C11": (7, 512, 512, 3, 1, 1)}
#: MobileNetV2 (t, c, n, s) bottleneck settings, width 1.0, 224x224
MBV2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
        (6, 160, 3, 2), (6, 320, 1, 1))


def _conv(name, n, c, h, w, k, r, s, pad, stride) -> MatchedOp:
    x = relax.Var("x", relax.TensorType((n, c, h, w), "int8"))
    wt = relax.Var("w", relax.TensorType((k, c, r, s), "int8"))
    bb = relax.BlockBuilder()
    core = bb.normalize(relax.op.nn.conv2d(x, wt, strides=stride, padding=pad, out_dtype="int32"))
    return MatchedOp("conv2d", core, [x, wt], None, EPILOGUE, name)


def _dense(name, n, k, m) -> MatchedOp:
    x = relax.Var("x", relax.TensorType((n, k), "int8"))
    wt = relax.Var("w", relax.TensorType((m, k), "int8"))
    # the core's own operand is the transposed weight (a leaf here: normalised without a scope)
    wt_t = relax.Var("w_t", relax.TensorType((k, m), "int8"))
    bb = relax.BlockBuilder()
    core = bb.normalize(relax.op.matmul(x, wt_t, out_dtype="int32"))
    return MatchedOp("dense", core, [x, wt], None, EPILOGUE, name)


def _max_pool(name, c, hw, size, stride, pad) -> MatchedOp:
    x = relax.Var("x", relax.TensorType((1, c, hw, hw), "int8"))
    bb = relax.BlockBuilder()
    core = bb.normalize(relax.op.nn.max_pool2d(x, size, stride, pad))
    return MatchedOp("max_pool2d", core, [x], None, (), name)


def _avg_pool(name, c, hw) -> MatchedOp:
    x = relax.Var("x", relax.TensorType((1, c, hw, hw), "int8"))
    x32 = relax.Var("x32", relax.TensorType((1, c, hw, hw), "int32"))   # astype(x, int32)
    bb = relax.BlockBuilder()
    core = bb.normalize(relax.op.nn.avg_pool2d(x32, hw, 1, 0))
    return MatchedOp("avg_pool2d", core, [x], None, (("shr", 6),), name)


def layers(which: str) -> List[Tuple[str, MatchedOp]]:
    """(layer name, matched operator) of one set."""
    out = []
    if which in ("resnet224", "resnet56"):
        for name, (hw, cin, cout, k, pad, st) in RESNET18.items():
            hw = hw if which == "resnet224" else -(-hw // 4)
            out.append((name, _conv(name, 1, cin, hw, hw, cout, k, k, pad, st)))
    elif which == "thin":
        import deepbench

        for r in deepbench.read_layers():
            if r["c"] < 16:
                out.append((f"DB{r['id']}", _conv(
                    f"DB{r['id']}", r["n"], r["c"], r["h"], r["w"], r["k"], r["filter_h"],
                    r["filter_w"], (r["pad_h"], r["pad_w"]), (r["hstride"], r["wstride"]))))
    elif which == "mobilenet":
        seen = set()
        hw, cin = 112, 32
        out.append(("stem", _conv("stem", 1, 3, 224, 224, 32, 3, 3, 1, 2)))
        for t, c, n, s in MBV2:
            for i in range(n):
                stride = s if i == 0 else 1
                hidden = cin * t
                if t != 1 and (hw, cin, hidden) not in seen:
                    seen.add((hw, cin, hidden))
                    name = f"expand{hw}_{cin}_{hidden}"
                    out.append((name, _conv(name, 1, cin, hw, hw, hidden, 1, 1, 0, 1)))
                hw = -(-hw // stride)
                if (hw, hidden, c) not in seen:
                    seen.add((hw, hidden, c))
                    name = f"project{hw}_{hidden}_{c}"
                    out.append((name, _conv(name, 1, hidden, hw, hw, c, 1, 1, 0, 1)))
                cin = c
        out.append(("head", _conv("head", 1, 320, 7, 7, 1280, 1, 1, 0, 1)))
    elif which == "other":
        out.append(("dense512x1000", _dense("dense512x1000", 1, 512, 1000)))
        out.append(("maxpool64x112", _max_pool("maxpool64x112", 64, 112, 3, 2, 1)))
        out.append(("maxpool64x112nopad", _max_pool("maxpool64x112nopad", 64, 112, 2, 2, 0)))
        out.append(("avgpool512x7", _avg_pool("avgpool512x7", 512, 7)))
    else:
        raise ValueError(f"unknown set {which!r}; sets are {SETS}")
    return out


def program_of(m: MatchedOp, strategy: str, cfg: VTAConfig):
    """The program the offload pass builds for ``m`` under ``strategy``, or the refusal text."""
    with build_options(strategy=strategy):
        try:
            template = get_template(m.kind, strategy)
            plan = template.plan(m, cfg)
            knobs, _ = current_options().knobs_for(m.kind, template.strategy, plan.workload, cfg)
            key = op_key(m.kind, template.strategy, cfg, plan.workload, m.epilogue, knobs)
            return compiled_op(key, config=cfg).program
        except TemplateRefusal as err:
            return f"refused: {err}"


def at_latency(cfg: VTAConfig, latency: int) -> VTAConfig:
    return VTAConfig.from_dict({**cfg.to_dict(), "MEM_LATENCY_CYCLES": latency}, name=cfg.name)


def run(sets, strategies, latencies, only=None, max_cycles=None, out=FIG, progress=True):
    """Rows of the validation: one per (set, layer, strategy, latency)."""
    from tqdm import tqdm

    from vta_ext.device import open_device, vta_hw_library

    cfg = load_config("pynq")
    devices = {lat: open_device(vta_hw_library("rtl"), mem_latency=lat) for lat in latencies}
    models = {lat: CycleModel(at_latency(cfg, lat)) for lat in latencies}
    jobs = [(s, name, m, strat) for s in sets for name, m in layers(s)
            if not only or name in only for strat in strategies]
    rows = []
    bar = tqdm(jobs, disable=not progress, desc="model vs RTL")
    for s, name, m, strat in bar:
        bar.set_postfix_str(f"{s} {name} {strat}")
        t0 = time.perf_counter()
        program = program_of(m, strat, cfg)
        build_s = time.perf_counter() - t0
        if isinstance(program, str):
            rows.append({"set": s, "layer": name, "strategy": strat, "latency": "",
                         "note": program[:200]})
            continue
        for lat in latencies:
            model = models[lat].run_program(program).total_cycles
            row = {"set": s, "layer": name, "strategy": strat, "latency": lat,
                   "insns": program.insn_count, "model_cycles": model,
                   "build_s": round(build_s, 2)}
            if max_cycles and model > max_cycles:
                row["note"] = f"skipped: model {model:,} cycles > --max-cycles"
            else:
                t0 = time.perf_counter()
                rtl = devices[lat].run_program(program).cycles
                row.update(rtl_cycles=rtl, error=round(model / rtl - 1, 5),
                           rtl_s=round(time.perf_counter() - t0, 2))
            rows.append(row)
        write_csv(rows, out)
    for dev in devices.values():
        dev.close()
    return rows


FIELDS = ["set", "layer", "strategy", "latency", "insns", "rtl_cycles", "model_cycles", "error",
          "build_s", "rtl_s", "note"]


def write_csv(rows, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "model_vs_rtl.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow(r)


def table(rows) -> str:
    measured = [r for r in rows if r.get("rtl_cycles")]
    lines = ["| set | latency | programs | max abs error | geomean abs error | worst |",
             "|---|---|---|---|---|---|"]
    keys = sorted({(r["set"], r["latency"]) for r in measured}, key=lambda k: (k[1], k[0]))
    for lat in sorted({r["latency"] for r in measured}):
        keys.append(("all", lat))
    for s, lat in keys:
        sel = [r for r in measured if r["latency"] == lat and (s == "all" or r["set"] == s)]
        errs = [abs(r["error"]) for r in sel]
        geo = math.exp(sum(math.log(max(e, 1e-6)) for e in errs) / len(errs))
        worst = max(sel, key=lambda r: abs(r["error"]))
        lines.append(f"| {s} | {lat} | {len(sel)} | {100 * max(errs):.2f} % | {100 * geo:.2f} % | "
                     f"{worst['layer']} {worst['strategy']} ({100 * worst['error']:+.2f} %) |")
    return "\n".join(lines)


def plot(rows, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r.get("rtl_cycles")]
    fig, ax = plt.subplots(figsize=(9, 5))
    markers = dict(zip(SETS, "os^Dv"))
    for s in SETS:
        for lat, color in zip(sorted({r["latency"] for r in measured}), ("tab:blue", "tab:red")):
            sel = [r for r in measured if r["set"] == s and r["latency"] == lat]
            if sel:
                ax.scatter([r["rtl_cycles"] for r in sel], [100 * r["error"] for r in sel],
                           marker=markers[s], color=color, s=22, alpha=0.75,
                           label=f"{s}, latency {lat}")
    ax.axhline(5, color="gray", ls="--", lw=0.8)
    ax.axhline(-5, color="gray", ls="--", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("RTL cycles")
    ax.set_ylabel("model / RTL - 1 (%)")
    ax.set_title("pynq cycle model vs the RTL of the Pynq HLS design")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "model_vs_rtl.png", dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    ap.add_argument("--latencies", type=int, nargs="+", default=[0, 40])
    ap.add_argument("--layers", nargs="+", help="only these layer names")
    ap.add_argument("--max-cycles", type=float, help="skip programs the model puts above this")
    ap.add_argument("--out", type=Path, default=FIG)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    rows = run(args.sets, args.strategies, args.latencies, args.layers, args.max_cycles, args.out,
               not args.no_progress)
    write_csv(rows, args.out)
    plot(rows, args.out)
    for r in rows:
        if r.get("note"):
            print(f"{r['set']} {r['layer']} {r['strategy']}: {r['note']}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
