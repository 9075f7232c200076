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
  the layers' weights and bias are bound as constants, as a quantised network binds them
  (``--bind params``: function parameters, runtime data);
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

``--networks [NETWORK ...]``: the 15 networks (or those named) at issue 32's sizes (ResNet-18,
MobileNetV2, ResNeXt-50 and RegNetX-1.6GF at 224, the others at 112; ``--size`` overrides) on
``default``, ``pipelined`` and ``pynq``, stock and csp-relaxed, each VTA operator of the build
report put in one kind (:func:`operator_kind`: GEMM conv, pointwise, depthwise, grouped, pools,
element-wise): per kind the cycles, floor, floor / cycles, share of the network's cycles and the
loss (cycles - floor), the largest-loss kind per network, the operators refused to the CPU
(:func:`network_breakdown`). Writes ``--out``/efficiency_networks.csv (appended as it comes;
``--resume``) and .png (stacked bars), prints the Markdown tables and puts them in ``--doc``
(docs/efficiency.md, section "Networks: floor ÷ cycles by operator kind"). ``--rtl`` also runs
ResNet-18 at 56 and MobileNetV2 at 112 on the RTL of the ``pynq`` design (vta-hw's
``libvta_rtl.so``) and adds the RTL cycles per kind and the model's error.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/efficiency.py --layers resnet mobilenet
    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/efficiency.py --layers deepbench --resume
    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/efficiency.py --networks --rtl --resume
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
    (``"constants"`` or ``"params"``) says how a layer's weights and bias enter its module
    (:func:`tune_figures.layer_module`, :func:`tune_figures.deepbench_module`)."""
    import tune_figures as tf

    constants = bind == "constants"
    if "resnet" in sets:
        for i in range(1, 12):
            name = f"C{i}"
            wl = tf.C1_REAL[1] if name == "C1" else None
            yield "resnet", name, "bias-shift-clip", (
                lambda n=name, w=wl: tf.layer_module(n, w, constants=constants))
    if "mobilenet" in sets:
        for i in range(1, 10):
            yield "mobilenet", f"D{i}", "bias-shift-clip", (
                lambda n=f"D{i}": tf.layer_module(n, constants=constants))
    if "deepbench" in sets:
        from deepbench import read_layers

        for epilogue in tf.DEEPBENCH_EPILOGUES:
            for row in read_layers():
                yield ("deepbench", f"DB{row['id']}", epilogue,
                       (lambda r=row, e=epilogue: tf.deepbench_module(
                           r, e, constants=constants)))
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


def case_lanes(set_name: str, case: str) -> Tuple[int, int]:
    """``(output channels, input channels per group x kernel taps)`` of a layer case (the
    ``resnet``, ``mobilenet`` and ``deepbench`` sets)."""
    import tune_figures as tf

    if set_name == "deepbench":
        from deepbench import read_layers

        r = next(r for r in read_layers() if f"DB{r['id']}" == case)
        return r["k"], r["c"] * r["filter_h"] * r["filter_w"]
    v = tf.C1_REAL[1] if case == "C1" else tf.LAYERS[case][1]
    return (v["out_channels"],
            v["in_channels"] // v.get("groups", 1) * v["kernel_h"] * v["kernel_w"])


def lane_filling(rows: List[Dict], block_in: int = 16, block_out: int = 16) -> str:
    """Issue 32's lane-filling layers: the layer cases with the bias + shift + clip epilogue whose
    output channels are at least ``block_out`` and whose input channels per group x taps are at
    least ``block_in``; per configuration and strategy geomean / min / count below :data:`LOW`,
    and the cases below it."""
    groups: Dict[Tuple[str, str], List[Tuple[float, str]]] = {}
    for r in rows:
        if (r.get("set") not in ("resnet", "mobilenet", "deepbench")
                or r.get("epilogue") != "bias-shift-clip" or r.get("efficiency") in (None, "")):
            continue
        out_ch, reduction = case_lanes(r["set"], r["case"])
        if out_ch >= block_out and reduction >= block_in:
            groups.setdefault((r["config"], r["strategy"]), []).append(
                (float(r["efficiency"]), r["case"]))
    lines = ["| config | strategy | lane-filling layers | geomean floor/cycles | min | below 0.6 |",
             "|---|---|---|---|---|---|"]
    for (config, strategy), values in sorted(groups.items()):
        effs = [v for v, _ in values]
        low = ", ".join(c for v, c in sorted(values) if v < LOW)
        lines.append(f"| {config} | {strategy} | {len(values)} | {geomean(effs):.3f} | "
                     f"{min(effs):.3f} | {sum(v < LOW for v in effs)}{': ' + low if low else ''} |")
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


# ------------------------------------------------------------------------------ networks by kind
#: the operator kinds of a network's breakdown (:func:`operator_kind`), in table order
KINDS = ("gemm_conv", "pointwise", "depthwise", "grouped", "pools", "elementwise")
KIND_LABELS = {"gemm_conv": "GEMM conv", "pointwise": "pointwise", "depthwise": "depthwise",
               "grouped": "grouped", "pools": "pools", "elementwise": "element-wise"}
#: ``--networks``: the input size of each network (issue 32): the four large ones at 224
NETWORK_SIZES = {"resnet18": 224, "mobilenet_v2": 224, "resnext50_32x4d": 224,
                 "regnet_x_1_6gf": 224}
NETWORK_DEFAULT_SIZE = 112
NETWORK_CONFIGS = ("default", "pipelined", "pynq")
NETWORK_STRATEGIES = ("stock", "csp-relaxed")
#: ``--rtl``: the networks also run on the RTL of the ``pynq`` design, and their input sizes
RTL_NETWORKS = {"resnet18": 56, "mobilenet_v2": 112}
RTL_CONFIG = "pynq"
NETWORK_FIELDS = ["network", "size", "config", "strategy", "kind", "ops", "cycles", "floor",
                  "efficiency", "structural", "share", "loss", "padded_ops", "padding_cycles", "worst_padding",
                  "largest_loss", "cpu_refused", "cpu_other", "rtl_cycles", "build_s"]


def operator_kind(report, p) -> str:
    """The kind (:data:`KINDS`) of VTA placement ``p`` of ``report``.

    From the template's kind and its compiled key's workload: a conv2d whose groups each read one
    input channel (MACs = output elements x taps) is ``depthwise``; other grouped convs
    ``grouped``; a conv with groups 1 and more than one tap (and conv1d, dilated conv2d)
    ``gemm_conv``; a 1x1 conv, dense and batched matmul ``pointwise``; max / average pooling
    ``pools``; add, clip and hardswish ``elementwise``.
    """
    import json

    kind = p.kind
    if kind in ("max_pool2d", "avg_pool2d"):
        return "pools"
    if kind in ("add", "clip", "hswish"):
        return "elementwise"
    if kind == "depthwise_conv2d":
        return "depthwise"
    if kind in ("dense", "batch_matmul"):
        return "pointwise"
    if kind in ("conv1d", "dilated_conv2d"):
        return "gemm_conv"
    if kind not in ("conv2d", "group_conv2d"):
        raise ValueError(f"operator_kind: no kind for VTA operator {kind!r} ({p.op})")
    wl = json.loads(report.key_of(p))["workload"]
    if "params" in wl and not wl.get("stock"):
        params = dict(wl["params"])
        taps, groups = params["kh"] * params["kw"], params.get("g", 1)
    else:
        stock = dict(wl.get("stock") or wl)
        taps, groups = stock["kernel_h"] * stock["kernel_w"], stock.get("groups", 1)
    if groups > 1:
        return "depthwise" if p.macs == p.elements * taps else "grouped"
    return "gemm_conv" if taps > 1 else "pointwise"


#: CPU operators of the kinds above (their Relax operators, as ``OpPlacement.short_op``)
KIND_OPS = ("conv2d", "conv1d", "matmul", "dense", "max_pool2d", "avg_pool2d",
            "adaptive_avg_pool2d", "add", "clip", "hardswish")


def _refused(p) -> bool:
    """Whether CPU placement ``p`` is an operator of one of :data:`KINDS` that VTA refused (not a
    layout transform, not an operator without a template)."""
    from vta_ext.report import LAYOUT_REASON

    return (p.short_op in KIND_OPS and p.reason != LAYOUT_REASON
            and not p.reason.startswith("no VTA template"))


def _counts(ops) -> str:
    from collections import Counter

    return ", ".join(f"{n}x {op}" for op, n in sorted(Counter(ops).items()))


def network_breakdown(report, rtl_cycles: Dict[str, int] = None) -> List[Dict]:
    """The VTA cycles and floors of ``report`` by operator kind: one row per kind present, then
    a ``total`` row (all VTA operators, the largest-loss kind, the CPU operators).

    Each row: ``ops``, ``cycles`` (the report's :meth:`~vta_ext.BuildReport.cycles`), ``floor``
    (:meth:`~vta_ext.BuildReport.floor`'s total), ``efficiency`` (floor / cycles), ``share`` (of
    the network's VTA cycles), ``loss`` (cycles - floor), ``padded_ops`` (operators whose packed
    layouts pad: :attr:`~vta_ext.report.OpPlacement.padding`), ``padding_cycles`` (the floor's
    compute times the report's padding overhead, :meth:`~vta_ext.BuildReport.padding_overhead`;
    of a depthwise conv, whose floor already counts its unit's work, the floor's compute times
    the padded output elements' share: the cycles the padded lanes cost at the least), ``worst_padding`` (the padding of the kind's
    largest padding overhead); ``rtl_cycles`` per kind if given (kind -> device cycles).
    """
    groups: Dict[str, Dict] = {}
    for p in report.on_vta:
        if p.call is None:
            continue
        kind = operator_kind(report, p)
        g = groups.setdefault(kind, dict(kind=kind, ops=0, cycles=0, floor=0.0, structural=0.0,
                                         padded_ops=0, padding_cycles=0.0, worst=(0.0, "")))
        floor = report.floor(p)
        g["ops"] += 1
        g["cycles"] += report.cycles(p)
        g["floor"] += floor.total
        g["structural"] += floor.structural
        if p.padding:
            g["padded_ops"] += 1
            if kind == "depthwise" and p.elements and p.packed_elements:
                # the floor has the better unit's work already (the GEMM block-diagonal one: its
                # MACs 16x the depthwise MACs), so only the padded channels count
                fraction, unit = p.packed_elements / p.elements - 1, "elements"
                part = floor.compute
            else:
                fraction, unit = report.padding_overhead(p)
                part = floor.compute_gemm if unit == "MACs" else floor.compute_alu
            if fraction:
                g["padding_cycles"] += part * fraction
                if fraction > g["worst"][0]:
                    g["worst"] = (fraction, f"{p.padding} (+{100 * fraction:.0f}% {unit})")
    total_cycles = sum(g["cycles"] for g in groups.values())
    rows = []
    for kind in KINDS:
        if kind not in groups:
            continue
        g = groups[kind]
        rows.append(dict(kind=kind, ops=g["ops"], cycles=g["cycles"], floor=round(g["floor"], 1),
                         efficiency=round(g["floor"] / g["cycles"], 4),
                         structural=round(g["structural"], 1),
                         share=round(g["cycles"] / total_cycles, 4),
                         loss=round(g["cycles"] - g["floor"], 1), padded_ops=g["padded_ops"],
                         padding_cycles=round(g["padding_cycles"], 1),
                         worst_padding=g["worst"][1],
                         rtl_cycles=(rtl_cycles or {}).get(kind, "")))
    from vta_ext.report import LAYOUT_REASON

    cpu = [p for p in report.on_cpu if _refused(p)]
    other = [p for p in report.on_cpu if not _refused(p) and p.reason != LAYOUT_REASON]
    if rows:
        floor = sum(r["floor"] for r in rows)
        largest = max(rows, key=lambda r: r["loss"])
        rows.append(dict(kind="total", ops=sum(r["ops"] for r in rows), cycles=total_cycles,
                         floor=round(floor, 1), efficiency=round(floor / total_cycles, 4),
                         structural=round(sum(r["structural"] for r in rows), 1),
                         share=1.0, loss=round(total_cycles - floor, 1),
                         padded_ops=sum(r["padded_ops"] for r in rows),
                         padding_cycles=round(sum(r["padding_cycles"] for r in rows), 1),
                         worst_padding="", largest_loss=largest["kind"],
                         cpu_refused=_counts(p.short_op for p in cpu),
                         cpu_other=_counts(p.short_op for p in other),
                         rtl_cycles=(sum(rtl_cycles.values()) if rtl_cycles else "")))
    return rows


def network_size(name: str, size: str) -> str:
    """``--networks``' input size of ``name``: ``size`` if given, else issue 32's (224 for
    :data:`NETWORK_SIZES`, 112 for the others)."""
    return size if size != "issue32" else str(NETWORK_SIZES.get(name, NETWORK_DEFAULT_SIZE))


def build_network(name: str, size: str, config: str, strategy: str):
    """Build network ``name`` at ``size`` for ``config`` with ``strategy``; ``(executable,
    report, seconds)``."""
    import tvm
    import vta_ext

    mod = network_module(name, size)
    start = time.perf_counter()
    with vta_ext.build_options(strategy=strategy):
        executable = tvm.relax.build(mod, target=vta_ext.vta_target(config))
    return executable, vta_ext.last_build_report(), time.perf_counter() - start


def rtl_kind_cycles(executable, report, name: str, size: str) -> Dict[str, int]:
    """Run ``executable`` (network ``name`` at ``size``) once with its VTA calls on the RTL of
    vta-hw; the RTL cycles per kind (:func:`operator_kind` of the call's placement)."""
    import json

    import tvm
    import vta_ext
    from vta_ext.device import open_device, vta_hw_library
    import models

    pixels, kwargs = (models.SMALL[name] if size == "small" else (int(size), {}))
    data = models.quantized_example(name, pixels, **kwargs)[3]
    kind_of_key = {report.key_of(p): operator_kind(report, p)
                   for p in report.on_vta if p.call is not None}
    dev = open_device(vta_hw_library("rtl"))
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    vta_ext.clear_run_log()
    with vta_ext.run_on(dev):
        vm["main"](tvm.runtime.tensor(data))
    runs = vta_ext.run_log()
    if len(runs) != len(report.vta_keys):
        raise RuntimeError(f"{name} {size}: {len(runs)} VTA runs on the RTL for "
                           f"{len(report.vta_keys)} VTA calls of the build")
    out: Dict[str, int] = {}
    for r in runs:
        kind = kind_of_key[r.key]
        out[kind] = out.get(kind, 0) + r.device_cycles
    return out


def _fmt_int(v) -> str:
    return f"{float(v):,.0f}"


def network_tables(rows: List[Dict]) -> str:
    """The markdown of ``--networks``: per configuration and strategy, one line per network:
    floor / cycles of the network and of each kind (with its share of the cycles), the
    largest-loss kind, the CPU operators; then the RTL table if there are RTL rows."""
    by_case: Dict[Tuple[str, ...], Dict[str, Dict]] = {}
    for r in rows:
        if r.get("rtl_cycles") not in (None, ""):
            continue  # the RTL runs have a table of their own
        by_case.setdefault((r["config"], r["strategy"], r["network"], r["size"]), {})[
            r["kind"]] = r
    order = {n: i for i, n in enumerate(__import__("models").ISSUE11_MODELS)}
    out = []
    for config in NETWORK_CONFIGS:
        for strategy in NETWORK_STRATEGIES:
            cases = sorted(((k, v) for k, v in by_case.items() if k[:2] == (config, strategy)),
                           key=lambda kv: (order.get(kv[0][2], 99), int(kv[0][3])
                                           if str(kv[0][3]).isdigit() else 0))
            if not cases:
                continue
            out.append(f"\n### `{config}`, {strategy}\n")
            out.append("Each kind: floor ÷ cycles (share of the network's VTA cycles). Largest "
                       "loss: the kind with the most cycles above its floor, its loss as a share "
                       "of the network's cycles, and the part the padded lanes cost at the least. "
                       "Structural: the floor with the compute module's serial work (ALU "
                       "operators' input loads, GEMM operators' accumulator initialisation, "
                       "whole micro-ops and leading bias; "
                       "`Floor.structural`) ÷ cycles.\n")
            out.append("| network | size | VTA cycles | floor ÷ cycles | structural | "
                       + " | ".join(KIND_LABELS[k] for k in KINDS)
                       + " | largest loss | refused, on the CPU |")
            out.append("|---" * (7 + len(KINDS)) + "|")
            for (_, _, network, size), kinds in cases:
                total = kinds.get("total")
                if total is None:
                    continue
                cells = []
                for k in KINDS:
                    r = kinds.get(k)
                    cells.append("–" if r is None else
                                 f"{float(r['efficiency']):.2f} ({100 * float(r['share']):.0f}%)")
                big = kinds[total["largest_loss"]]
                lost = float(big["loss"]) / float(total["cycles"])
                pad = float(big["padding_cycles"] or 0) / float(total["cycles"])
                note = f"{KIND_LABELS[big['kind']]} {100 * lost:.0f}%"
                if pad >= 0.005:
                    note += f" (padding ≥ {100 * pad:.0f}%: {big['worst_padding']})"
                structural = (f"{float(total['structural']) / float(total['cycles']):.3f}"
                              if total.get("structural") not in (None, "") else "–")
                out.append(f"| {network} | {size} | {_fmt_int(total['cycles'])} | "
                           f"**{float(total['efficiency']):.3f}** | {structural} | "
                           + " | ".join(cells)
                           + f" | {note} | {total['cpu_refused'] or '–'} |")
    rtl = [r for r in rows if r.get("rtl_cycles") not in (None, "")]
    if rtl:
        out.append(f"\n### `{RTL_CONFIG}` on the RTL\n")
        out.append("Cycle model (the build report's cycles) against the RTL of the Pynq design "
                   "(`libvta_rtl.so`, memory latency 0, as the `pynq` preset models), per kind; "
                   "error = model ÷ RTL − 1; floor ÷ cycles on both.\n")
        out.append("| network | size | strategy | kind | ops | floor | model cycles | RTL cycles "
                   "| model ÷ RTL − 1 | floor ÷ model | floor ÷ RTL |")
        out.append("|---" * 11 + "|")
        for r in rtl:
            label = "**total**" if r["kind"] == "total" else KIND_LABELS[r["kind"]]
            model, dev = float(r["cycles"]), float(r["rtl_cycles"])
            out.append(f"| {r['network']} | {r['size']} | {r['strategy']} | {label} | {r['ops']} "
                       f"| {_fmt_int(r['floor'])} | {_fmt_int(model)} | {_fmt_int(dev)} | "
                       f"{100 * (model / dev - 1):+.1f}% | {float(r['floor']) / model:.3f} | "
                       f"{float(r['floor']) / dev:.3f} |")
    return "\n".join(out)


def plot_networks(rows: List[Dict], path: Path) -> None:
    """A grid (configuration x strategy) of stacked bars, one per network: each kind's floor
    (dark) and its loss (light) as shares of the network's VTA cycles; the dark parts add up to
    the network's floor / cycles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import models

    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(len(NETWORK_CONFIGS), len(NETWORK_STRATEGIES),
                             figsize=(7 * len(NETWORK_STRATEGIES), 3.6 * len(NETWORK_CONFIGS)),
                             squeeze=False, sharey=True)
    for i, config in enumerate(NETWORK_CONFIGS):
        for j, strategy in enumerate(NETWORK_STRATEGIES):
            ax = axes[i][j]
            cases: Dict[str, Dict[str, Dict]] = {}
            for r in rows:
                if r["config"] == config and r["strategy"] == strategy:
                    cases.setdefault(f"{r['network']} {r['size']}", {})[r["kind"]] = r
            names = [n for m in models.ISSUE11_MODELS for n in sorted(cases)
                     if n.split()[0] == m and "total" in cases[n]]
            bottom = [0.0] * len(names)
            for c, kind in enumerate(KINDS):
                fl, lo = [], []
                for n in names:
                    r = cases[n].get(kind)
                    cyc = float(cases[n]["total"]["cycles"])
                    fl.append(float(r["floor"]) / cyc if r else 0.0)
                    lo.append(float(r["loss"]) / cyc if r else 0.0)
                x = range(len(names))
                ax.bar(x, fl, bottom=bottom, color=cmap(c), label=f"{KIND_LABELS[kind]} floor")
                bottom = [b + f for b, f in zip(bottom, fl)]
                ax.bar(x, lo, bottom=bottom, color=cmap(c), alpha=0.3, hatch="//",
                       label=f"{KIND_LABELS[kind]} loss")
                bottom = [b + v for b, v in zip(bottom, lo)]
            for k, n in enumerate(names):
                ax.text(k, 1.01, f"{float(cases[n]['total']['efficiency']):.2f}",
                        ha="center", fontsize=6)
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=60, ha="right", fontsize=6)
            ax.set_ylim(0, 1.08)
            ax.set_title(f"{config}, {strategy}", fontsize=9)
            ax.set_ylabel("share of VTA cycles")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=6, fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


SECTION = "## Networks: floor ÷ cycles by operator kind"


def write_doc_section(doc: Path, body: str) -> None:
    """Put ``body`` under :data:`SECTION` of ``doc`` (replacing that section, else appended)."""
    text = doc.read_text() if doc.is_file() else ""
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + SECTION + "\n" + body.rstrip("\n") + "\n"
    else:
        end = text.find("\n## ", start + len(SECTION))
        tail = text[end:] if end >= 0 else "\n"
        text = text[:start] + SECTION + "\n" + body.rstrip("\n") + "\n" + tail
    doc.write_text(text)


def run_networks(args, names: List[str]) -> int:
    """``--networks``: every network x configuration x strategy built, broken down by kind,
    appended to ``efficiency_networks.csv`` as it comes (``--resume`` skips the cases there)."""
    import vta_ext
    from tqdm import tqdm

    csv_path = args.out / "efficiency_networks.csv"
    png_path = args.out / "efficiency_networks.png"
    rows: List[Dict] = []
    if args.resume and csv_path.is_file():
        with open(csv_path) as f:
            rows = list(csv.DictReader(f))
    done = {(r["network"], r["size"], r["config"], r["strategy"], r["rtl_cycles"] != "")
            for r in rows if r["kind"] == "total"}
    todo = [(n, network_size(n, args.size), c, s, False) for n in names for c in args.configs
            for s in args.strategies]
    if args.rtl:
        todo += [(n, args.size if args.size != "issue32" else str(px), RTL_CONFIG, s, True)
                 for n, px in RTL_NETWORKS.items() if n in names for s in args.strategies]
    todo = [t for t in todo if t not in done]
    new_file = not (args.resume and csv_path.is_file())
    with open(csv_path, "w" if new_file else "a", newline="") as f:
        writer = csv.DictWriter(f, NETWORK_FIELDS)
        if new_file:
            writer.writeheader()
        bar = tqdm(todo, desc="networks", unit="build")
        for name, size, config, strategy, rtl in bar:
            bar.set_postfix_str(f"{name} {size} {config} {strategy}{' rtl' if rtl else ''}")
            executable, report, build_s = build_network(name, size, config, strategy)
            per_kind = rtl_kind_cycles(executable, report, name, size) if rtl else None
            for r in network_breakdown(report, per_kind):
                row = dict(network=name, size=size, config=config, strategy=strategy,
                           build_s=round(build_s, 2), **r)
                rows.append(row)
                writer.writerow(row)
            f.flush()
            del executable, report
    rows = [{k: ("" if v is None else v) for k, v in r.items()} for r in rows]
    model_rows = [r for r in rows if r.get("rtl_cycles") in (None, "")]
    plot_networks(model_rows, png_path)
    command = "OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/efficiency.py --networks" + (
        " --rtl" if args.rtl else "") + (f" --size {args.size}" if args.size != "issue32" else "")
    sizes = (" (ResNet-18, MobileNetV2, ResNeXt-50 and RegNetX-1.6GF at 224, the others at 112)"
             if args.size == "issue32" else f" (input size {args.size})")
    body = (f"\n`{command}` ({time.strftime('%Y-%m-%d')}; `docs/figures/efficiency_networks.csv` "
            f"and `.png`). The 15 networks of `relay_examples/models.py`, quantised, built with "
            f"`relax.build` at each strategy's default options{sizes}. Every VTA operator of the build "
            f"report is put in one kind: GEMM conv (groups 1, more than one tap), pointwise (1x1 "
            f"conv, dense), depthwise (one input channel per group), grouped (other groups), "
            f"pools, element-wise (add, clip, hardswish). Per kind: the report's cycles "
            f"(`BuildReport.cycles`) and floors (`BuildReport.floor`), summed; the kind sums add "
            f"up to the report's `vta_cycles` and `vta_floor` (`tests/test_efficiency_networks.py`). "
            f"Padding: the floor's compute times the report's padding overhead "
            f"(`BuildReport.padding_overhead`; of a depthwise conv, whose floor counts its unit's "
            f"work, the padded output channels' share), the cycles the padded lanes cost at the "
            f"least. "
            f"'Refused' lists the operators VTA has a template for that stay on the CPU.\n"
            + network_tables(rows))
    if args.doc:
        write_doc_section(args.doc, body)
    print(body)
    print(f"\nwrote {csv_path}, {png_path}" + (f" and {args.doc}" if args.doc else ""))
    return 0


def _key(row: Dict) -> Tuple[str, ...]:
    return (row["set"], row["case"], row["epilogue"], row["config"], row["strategy"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", nargs="+", choices=SETS, default=list(SETS),
                        help="the sets of cases (default: all)")
    parser.add_argument("--configs", nargs="+", default=None,
                        help=f"default: {' '.join(CONFIGS)}; with --networks "
                             f"{' '.join(NETWORK_CONFIGS)}")
    parser.add_argument("--bind", choices=("constants", "params"), default="constants",
                        help="layers (ResNet, MobileNet, DeepBench): weights and bias as Relax "
                             "constants, as a quantised network binds them (default), or as "
                             "function parameters")
    parser.add_argument("--strategies", nargs="+", default=None,
                        help=f"default: {' '.join(STRATEGIES)}; with --networks "
                             f"{' '.join(NETWORK_STRATEGIES)}")
    parser.add_argument("--size", default=None,
                        help="networks' input: 'small' (models.SMALL) or a size such as 224 "
                             "(default: small; with --networks issue 32's: 224 for ResNet-18, "
                             "MobileNetV2, ResNeXt-50, RegNetX-1.6GF, 112 for the others)")
    parser.add_argument("--networks", nargs="*", metavar="NETWORK", default=None,
                        help="the 15 networks (or those named) broken down by operator kind: "
                             "efficiency_networks.csv / .png and a table in --doc")
    parser.add_argument("--rtl", action="store_true",
                        help=f"--networks: also run {', '.join(f'{n} at {s}' for n, s in RTL_NETWORKS.items())} "
                             f"on the RTL of the {RTL_CONFIG} design (with --size: at that size)")
    parser.add_argument("--doc", type=Path, default=None,
                        help="--networks: the Markdown file whose section "
                             f"'{SECTION[3:]}' gets the table (default docs/efficiency.md)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures",
                        help="directory of efficiency.csv / .png")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows of an existing efficiency.csv and skip their cases")
    args = parser.parse_args(argv)
    networks = args.networks is not None
    args.configs = args.configs or list(NETWORK_CONFIGS if networks else CONFIGS)
    args.strategies = args.strategies or list(NETWORK_STRATEGIES if networks else STRATEGIES)
    args.size = args.size or ("issue32" if networks else "small")
    if args.size not in ("small", "issue32") and not args.size.isdigit():
        parser.error(f"--size {args.size!r}: give 'small' or an input size such as 224")
    if args.rtl and not networks:
        parser.error("--rtl goes with --networks")
    if networks:
        import models

        for name in args.networks:
            if name not in models.ISSUE11_MODELS:
                parser.error(f"--networks {name!r}: choose from {', '.join(models.ISSUE11_MODELS)}")
        if args.doc is None:
            args.doc = ROOT / "docs" / "efficiency.md"

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
    if networks:
        import models

        return run_networks(args, list(args.networks or models.ISSUE11_MODELS))
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
    print("\nLane-filling layers (issue 32):\n")
    print(lane_filling(rows))
    print(f"\nwrote {csv_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
