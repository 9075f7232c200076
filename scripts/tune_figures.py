#!/usr/bin/env python
"""Figures of the tuner (docs/results.md, "Tuning"): layers, search efficiency, whole network.

Subcommands (all cycles from the cycle model; every tuned best verified bit for bit):

* ``layers`` -- ResNet-18 C1-C11 and MobileNet D1-D9 (facts §7.2; C1's 3 input channels padded
  to 16, as the stock template does) on ``--config``, for each strategy of ``--strategies``
  (the CSP strategies: one-operator modules, tasks by ``tune.extract_tasks``, C1 with its 3
  channels, no dense layer): XGB tuning (``--trials``, resuming from
  ``--records``), the TPS point, the fallback point and the original stack's tuned record (TopHub
  ``vta_v0.10.log``, where it has one), and TPS with reuse-aware double buffering allowed (the
  fewest modelled bytes): cycles and DRAM bytes of each; reuse-aware double
  buffering of the best two-thread point found (input + weight bytes with and without reuse).
  Writes ``docs/figures/tune_layers.{csv,png}``.
* ``search`` -- exhaustive measurement of small spaces (resuming from ``--records``), then the
  trials XGB / random / grid search need to come within 5 % of the exhaustive best, replayed on the
  measured table for ``--seeds`` seeds. Writes ``docs/figures/tune_search.{csv,png}``.
* ``deepbench`` -- the 12 thin-channel DeepBench layers (1 or 3 input channels) as one-conv Relax
  modules, for each strategy of ``--strategies``: tasks by ``tune.extract_tasks`` (so the strategy
  plans the layout), XGB tuning, the TPS point (the tuner's measurement of it, not a second
  compile) and the fallback point (``--fallback-for``, default stock only). Writes
  ``docs/figures/tune_deepbench.{csv,png}``.
* ``bytes`` -- DRAM bytes of the CSP strategies (``--strategies strategy[:layout]``) on C2-C11
  and D1-D9, with ``--deepbench-records`` also the 20 DeepBench layers the original records cover
  (one-operator Relax modules, tasks by ``tune.extract_tasks``): TPS over the whole knob
  space, TPS in the stock loop order, XGB tuned with ``objective="dram_bytes"`` (``--trials``), the
  original stack's record built with the stock template, and the compulsory bytes (every tensor
  once). Writes ``docs/figures/tune_bytes.{csv,png}``.
* ``network`` -- the bars of ``scripts/tune_network.py``'s totals CSV(s).
  Writes ``docs/figures/tune_network.png``.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/tune_figures.py layers --config pipelined \
        --trials 60 --records resnet18_pipelined.json
    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/tune_figures.py search --config pipelined \
        --records resnet18_pipelined.json --layers C9 C10 C11 D9
    .venv/bin/python scripts/tune_figures.py network docs/figures/tune_resnet18_pipelined_totals.csv
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
FIG = ROOT / "docs" / "figures"
EPILOGUE = (("bias",), ("shr", 8), ("clip", 0, 127))


def conv_wl(hw, cin, cout, k, pad, stride, groups=1):
    wl = dict(batch=1, height=hw, width=hw, in_channels=cin, out_channels=cout, kernel_h=k,
              kernel_w=k, pad_h=pad, pad_w=pad, stride_h=stride, stride_w=stride)
    if groups > 1:
        wl["groups"] = groups
    return wl


#: facts §7.2 (C1 with its input channels padded 3 -> 16)
LAYERS = {"C1": ("conv2d", conv_wl(224, 16, 64, 7, 3, 2)),
          "C2": ("conv2d", conv_wl(56, 64, 64, 3, 1, 1)),
          "C3": ("conv2d", conv_wl(56, 64, 128, 3, 1, 2)),
          "C4": ("conv2d", conv_wl(56, 64, 128, 1, 0, 2)),
          "C5": ("conv2d", conv_wl(28, 128, 128, 3, 1, 1)),
          "C6": ("conv2d", conv_wl(28, 128, 256, 3, 1, 2)),
          "C7": ("conv2d", conv_wl(28, 128, 256, 1, 0, 2)),
          "C8": ("conv2d", conv_wl(14, 256, 256, 3, 1, 1)),
          "C9": ("conv2d", conv_wl(14, 256, 512, 3, 1, 2)),
          "C10": ("conv2d", conv_wl(14, 256, 512, 1, 0, 2)),
          "C11": ("conv2d", conv_wl(7, 512, 512, 3, 1, 1))}
for _i, (_hw, _c, _g, _s) in enumerate([(112, 32, 2, 1), (112, 64, 4, 2), (56, 128, 8, 1),
                                         (56, 128, 8, 2), (28, 256, 16, 1), (28, 256, 16, 2),
                                         (14, 512, 32, 1), (14, 512, 32, 2), (7, 1024, 64, 1)], 1):
    LAYERS[f"D{_i}"] = ("group_conv2d", conv_wl(_hw, _c, _c, 3, 1, _s, _g))
LAYERS["dense"] = ("dense", dict(batch=1, in_features=512, out_features=1008))


def deepbench_record_layers() -> Dict[str, tuple]:
    """The DeepBench layers (``data/deepbench_conv_inference.csv``) that the original stack's
    tuned records (:data:`tvm_csp_embed.tune.TOPHUB_LOG`) cover: a row whose (n, c, h, w, k,
    filter, stride, pad) equals the workload of a ``conv2d_packed.vta`` record.

    Returns
    -------
    dict
        ``"DB<id>" -> ("conv2d", workload)`` in DeepBench order, workloads in the fields of the
        stock template (:func:`conv_wl`'s).
    """
    from tvm_csp_embed import tune
    from tvm_csp_embed.tune.autotvm_log import is_autotvm_line, parse_autotvm_line

    sys.path.insert(0, str(ROOT / "scripts"))
    from embed_deepbench import read_layers

    covered = []
    with open(tune.TOPHUB_LOG) as f:
        for line in f:
            if line.strip() and not line.startswith("#") and is_autotvm_line(json.loads(line)):
                rec = parse_autotvm_line(json.loads(line))
                if rec.kind == "conv2d":
                    covered.append(dict(rec.workload))
    out = {}
    for row in read_layers(ROOT / "data" / "deepbench_conv_inference.csv"):
        g = lambda k: int(row[k])
        wl = dict(batch=g("n"), height=g("h"), width=g("w"), in_channels=g("c"),
                  out_channels=g("k"), kernel_h=g("filter_h"), kernel_w=g("filter_w"),
                  pad_h=g("pad_h"), pad_w=g("pad_w"), stride_h=g("hstride"),
                  stride_w=g("wstride"))
        if wl in covered:
            out[f"DB{row['id']}"] = ("conv2d", wl)
    return out


def layer_group(name: str) -> str:
    """``"C"``, ``"D"``, ``"DB"`` or ``"dense"``: the letters of a layer name."""
    return name.rstrip("0123456789")


def task_of(name: str, config: str):
    from tvm_csp_embed import tune

    kind, wl = LAYERS[name]
    return tune.Task.create(kind, wl, EPILOGUE, config=config)


def inp_wgt(task, knobs) -> Optional[int]:
    """Modelled input + weight bytes of a point (the stock templates' DRAM model)."""
    from vta_ext.templates import tiling
    from tvm_csp_embed.tune.features import knobs_type

    choice = tiling.evaluate(task.config, task.workload, task.epilogue,
                             knobs_type(task.workload)(**knobs))
    if not isinstance(choice, tiling.TilingChoice):
        return None
    return choice.bytes["inp_load_nbytes"] + choice.bytes["wgt_load_nbytes"]


def write_csv(rows: List[Dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


def geomean(values) -> float:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


# ------------------------------------------------------------------------------------------------
#: ResNet-18 C1 as it is (3 input channels): the CSP strategies embed it without channel padding
C1_REAL = ("conv2d", conv_wl(224, 3, 64, 7, 3, 2))


def layers_csv(base: Path, strategy_layout: str) -> Path:
    """The CSV of ``layers`` for one strategy: ``base`` for ``stock``, else
    ``<stem>_<strategy>[_<layout>].csv`` next to it."""
    if strategy_layout == "stock":
        return base
    return base.with_name(f"{base.stem}_{strategy_layout.replace(':', '_')}{base.suffix}")


def cmd_layers(args) -> int:
    """Per layer and strategy: XGB-tuned, TPS, fallback and the original record's cycles."""
    import vta_ext
    from vta_ext.templates import tiling
    from tvm_csp_embed import tune
    from tvm_csp_embed.tune.measure import measure_point

    history = tune.apply_history_best(tune.TOPHUB_LOG)
    option = tune.measure_option(runner=tune.LocalRunner(args.parallel))
    for strategy_layout in args.strategies:
        strategy, _, layout = strategy_layout.partition(":")
        names = args.layers or [n for n in LAYERS if strategy == "stock" or n != "dense"]
        rows = []
        for name in names:
            start = time.perf_counter()
            stock_task = task_of(name, args.config)
            if strategy == "stock":
                task = stock_task
            else:
                if LAYERS[name][0] == "dense":
                    raise SystemExit(f"layers: {name} has no one-operator module for strategy "
                                     f"{strategy!r}; leave it out of --layers")
                module = layer_module(name, C1_REAL[1] if name == "C1" else None)
                with vta_ext.build_options(layout=layout or "auto"):
                    (task,) = tune.extract_tasks(module, target=vta_ext.vta_target(args.config),
                                                 strategy=strategy)
            space = task.knob_space
            tuner = tune.XGBTuner(task, seed=args.seed)
            best = tuner.tune(args.trials, option, callbacks=[
                tune.callback.progress_bar(args.trials, prefix=f"{strategy_layout} {name}"),
                tune.callback.log_to_file(args.records)])
            measured = {}

            def cycles_of(knobs, on=task, tuned=tuner):
                key = json.dumps(knobs, sort_keys=True)
                index = on.knob_space.index(knobs) if on is task else None
                if index is not None and index in tuned.results and tuned.results[index].ok:
                    measured[key] = tuned.results[index]
                if key not in measured:
                    measured[key] = measure_point(on.spec(), knobs)
                return measured[key]

            tps = cycles_of(space.tps)
            # the fallback point is measured last (its program can be very long: csp-relaxed's
            # im2col'd C1 with every tile 1), after a first row without it is written
            fallback = None
            original = history.best_knobs(stock_task.kind, "stock", stock_task.workload,
                                          stock_task.config)
            if task is stock_task:
                orig = cycles_of(original[0]) if original else None
            else:
                orig = measure_point(stock_task.spec(), original[0]) if original else None
            is_stock = task.kind in ("conv2d", "group_conv2d", "dense") and \
                task.strategy == "stock"
            tps_reuse = pair = None
            if is_stock:
                tps_reuse = cycles_of(dataclasses.asdict(
                    tiling.tps_knobs(task.config, task.workload, task.epilogue, reuse=True).knobs))
                two = [(r.cycles, i) for i, r in tuner.results.items() if r.ok and
                       space.points[i].get("oc_nthread", 1) * space.points[i].get("h_nthread", 1)
                       == 2]
                if two:
                    point = dict(space.points[min(two)[1]])
                    pair = (inp_wgt(task, dict(point, reuse=False)),
                            inp_wgt(task, dict(point, reuse=True)))
            rows.append({
                "layer": name, "strategy": strategy_layout, "kind": task.kind,
                "workload": task.name, "space": len(space), "trials": len(tuner.visited),
                "tuned_cycles": best.cycles if best else None,
                "tps_cycles": tps.cycles,
                "fallback_cycles": fallback.cycles if fallback else None,
                "original_cycles": orig.cycles if orig else None,
                "tuned_dram_bytes": best.dram_bytes if best else None,
                "tps_dram_bytes": tps.dram_bytes,
                "fallback_dram_bytes": fallback.dram_bytes if fallback else None,
                "tps_reuse_cycles": tps_reuse.cycles if tps_reuse else None,
                "tps_reuse_dram_bytes": tps_reuse.dram_bytes if tps_reuse else None,
                "original_dram_bytes": orig.dram_bytes if orig else None,
                "tuned_inp_wgt": inp_wgt(task, best.knobs) if best and is_stock else None,
                "original_inp_wgt": inp_wgt(stock_task, original[0]) if original else None,
                "tuned_knobs": json.dumps(best.knobs) if best else "",
                "original_knobs": json.dumps(original[0]) if original else "",
                "tuned_uses_reuse": bool(best and best.knobs.get("reuse")),
                "best_two_thread_inp_wgt_no_reuse": pair[0] if pair else None,
                "best_two_thread_inp_wgt_reuse": pair[1] if pair else None,
                "seconds": round(time.perf_counter() - start, 1)})
            r = rows[-1]
            write_csv(rows, layers_csv(Path(args.csv), strategy_layout))  # a cut run keeps these
            if space.fallback is not None and (args.fallback_for is None
                                               or strategy in args.fallback_for):
                fallback = cycles_of(space.fallback)
                r.update(fallback_cycles=fallback.cycles, fallback_dram_bytes=fallback.dram_bytes,
                         seconds=round(time.perf_counter() - start, 1))
                write_csv(rows, layers_csv(Path(args.csv), strategy_layout))
            print(f"{strategy_layout:>12} {name:>5} tuned {r['tuned_cycles'] or 0:>11,} TPS "
                  f"{r['tps_cycles']:>11,} fallback {r['fallback_cycles'] or 0:>12,} original "
                  f"{r['original_cycles'] or 0:>11,}  ({task.name})", flush=True)
        out = layers_csv(Path(args.csv), strategy_layout)
        plot_layers(rows, out.with_suffix(".png"), f"{args.config}, {strategy_layout}")
        print_layers_summary(rows)
    option.runner.close()
    return 0


def print_layers_summary(rows) -> None:
    """Geomeans per layer set of TPS / tuned, fallback / tuned and original record / tuned."""
    for label in ("C", "D", "dense"):
        sel = [r for r in rows if layer_group(r["layer"]) == label and r["tuned_cycles"]]
        if not sel:
            continue
        ratio = lambda key: geomean(r[key] / r["tuned_cycles"] for r in sel if r[key])
        with_orig = [r["layer"] for r in sel if r["original_cycles"]]
        print(f"{sel[0]['strategy']:>12} {label} ({len(sel)} layers): TPS / tuned "
              f"x{ratio('tps_cycles'):.3f}, fallback / tuned x{ratio('fallback_cycles'):.2f}, "
              f"original record / tuned x{ratio('original_cycles'):.3f} "
              f"({len(with_orig)} layers with a record)")


def plot_layers(rows, path: Path, config: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["layer"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    width = 0.2
    series = [("fallback", "fallback_cycles", "#bbbbbb"), ("original record", "original_cycles",
                                                            "#8c6d31"),
              ("TPS", "tps_cycles", "#1f77b4"), ("tuned", "tuned_cycles", "#d62728")]
    for j, (label, key, color) in enumerate(series):
        xs = [i + (j - 1.5) * width for i in range(len(rows))]
        ys = [r[key] or float("nan") for r in rows]
        ax1.bar(xs, ys, width, label=label, color=color)
    ax1.set_yscale("log")
    ax1.set_ylabel(f"cycles ({config})")
    ax1.legend(ncol=4, fontsize=8)
    ax1.set_title("Tuned vs TPS vs fallback vs the original stack's tuned record, per layer")
    for j, (label, key, color) in enumerate([("TPS / tuned", "tps_cycles", "#1f77b4"),
                                             ("original / tuned", "original_cycles", "#8c6d31")]):
        xs = [i + (j - 0.5) * 0.35 for i in range(len(rows))]
        ys = [(r[key] / r["tuned_cycles"]) if r[key] and r["tuned_cycles"] else float("nan")
              for r in rows]
        ax2.bar(xs, ys, 0.35, label=label, color=color)
    ax2.axhline(1.0, color="k", lw=0.8)
    ax2.set_ylabel("cycles / tuned cycles")
    ax2.legend(fontsize=8)
    ax2.set_xticks(range(len(rows)))
    ax2.set_xticklabels(names)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


# ------------------------------------------------------------------------------------------------
class TableRunner:
    """Replays measured cycles (a lookup, no compilation): for comparing search strategies."""

    n_parallel = 0

    def __init__(self, table: Dict[str, int]) -> None:
        self.table = table

    def run(self, spec, batch):
        from tvm_csp_embed.tune.measure import MeasureResult

        for i, knobs in enumerate(batch):
            yield i, MeasureResult(dict(knobs), self.table[json.dumps(knobs, sort_keys=True)])

    def close(self) -> None:
        pass


def trials_to_within(tuner_cls, task, table, target: float, seed: int) -> int:
    from tvm_csp_embed import tune

    tuner = tuner_cls(task, seed=seed)
    option = tune.measure_option(runner=TableRunner(table), verify=False)
    count = [0, None]

    def watch(t, inputs, results):
        for r in results:
            count[0] += 1
            if count[1] is None and r.cycles is not None and r.cycles <= target:
                count[1] = count[0]

    tuner.tune(len(task.knob_space), option, callbacks=[watch])
    return count[1]


def cmd_search(args) -> int:
    from tvm_csp_embed import tune

    rows = []
    for name in args.layers:
        task = task_of(name, args.config)
        space = task.knob_space
        grid = tune.GridSearchTuner(task)
        grid.tune(len(space), tune.measure_option(runner=tune.LocalRunner(args.parallel)),
                  callbacks=[tune.callback.progress_bar(len(space), prefix=f"{name} exhaustive"),
                             tune.callback.log_to_file(args.records)])
        table = {json.dumps(space.points[i], sort_keys=True): r.cycles
                 for i, r in grid.results.items() if r.ok}
        if len(table) < len(space):
            print(f"{name}: {len(space) - len(table)} point(s) failed; they count as never good")
            worst = max(table.values()) * 10
            for p in space.points:
                table.setdefault(json.dumps(p, sort_keys=True), worst)
        best = min(table.values())
        target = best * 1.05
        result = {"layer": name, "workload": task.name, "space": len(space), "best_cycles": best,
                  "tps_cycles": table[json.dumps(space.tps, sort_keys=True)]}
        for label, cls in (("xgb", tune.XGBTuner), ("random", tune.RandomTuner)):
            trials = [trials_to_within(cls, task, table, target, s) for s in range(args.seeds)]
            result[f"{label}_median"] = statistics.median(trials)
            result[f"{label}_max"] = max(trials)
            result[f"{label}_trials"] = " ".join(map(str, trials))
        result["grid"] = trials_to_within(tune.GridSearchTuner, task, table, target, 0)
        for label in ("xgb_median", "random_median", "grid"):
            result[f"{label}_fraction"] = round(result[label] / len(space), 4)
        rows.append(result)
        print(f"{name}: space {len(space)}, trials to within 5 % of the best: XGB median "
              f"{result['xgb_median']} (max {result['xgb_max']}), random median "
              f"{result['random_median']}, grid {result['grid']}")
    out = Path(args.csv)
    write_csv(rows, out)
    plot_search(rows, out.with_suffix(".png"))
    return 0


def plot_search(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.27
    for j, (label, key, color) in enumerate([("XGB (median of seeds)", "xgb_median_fraction",
                                              "#d62728"),
                                             ("random (median)", "random_median_fraction",
                                              "#7f7f7f"),
                                             ("grid", "grid_fraction", "#1f77b4")]):
        ax.bar([i + (j - 1) * width for i in range(len(rows))], [100 * r[key] for r in rows],
               width, label=label, color=color)
    ax.axhline(10, color="k", ls="--", lw=0.8, label="10 % of the space")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['layer']}\n({r['space']} pts)" for r in rows])
    ax.set_ylabel("trials to within 5 % of the best (% of space)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


# ------------------------------------------------------------------------------------------------
#: the DeepBench layers with 1 or 3 input channels (the CSP paper's thin-channel set)
THIN = (0, 1, 2, 6, 10, 15, 21, 27, 34, 59, 67, 107)


#: epilogues of ``deepbench_module``: bias + shift + clip, or none (the plain conv2d narrowed to
#: int8, as ``scripts/deepbench.py`` measures the operators: cycles of the convolution alone)
DEEPBENCH_EPILOGUES = ("bias-shift-clip", "none")


#: the range the bound bias of ``deepbench_module(..., constants=True)`` is drawn from: int32
#: values of the accumulator's scale (a 5x5 filter of int8 products reaches a few thousand)
DEEPBENCH_BIAS_RANGE = (-(1 << 13), 1 << 13)


def weight_and_bias(wshape, seed: Optional[int]):
    """A conv's int8 weights of ``wshape`` and its int32 bias ``(1, K, 1, 1)``: with a ``seed``,
    Relax constants drawn from it (the bias in :data:`DEEPBENCH_BIAS_RANGE`), as a frontend binds
    a quantised network's parameters; with ``None``, function parameters ``w`` and ``b``."""
    import numpy as np
    from tvm import relax

    bshape = (1, wshape[0], 1, 1)
    if seed is None:
        return (relax.Var("w", relax.TensorType(wshape, "int8")),
                relax.Var("b", relax.TensorType(bshape, "int32")))
    rng = np.random.default_rng(seed)
    return (relax.const(rng.integers(-128, 128, wshape, dtype=np.int8), "int8"),
            relax.const(rng.integers(*DEEPBENCH_BIAS_RANGE, bshape, dtype=np.int32), "int32"))


def deepbench_module(row, epilogue: str = "bias-shift-clip", constants: bool = False):
    """A one-conv Relax module of a DeepBench row: int8 conv2d + bias, >> 6, clip, int8; with
    ``epilogue="none"`` the int32 conv2d cast to int8.

    With ``constants=False`` the weights and the bias are function parameters (runtime data);
    with ``constants=True`` they are bound as ``relax.const`` (seeded by the row id: int8 weights,
    an int32 bias in :data:`DEEPBENCH_BIAS_RANGE`), as a frontend binds a quantised network's
    parameters, so that a strategy may relayout them (and fold the bias) at build time.
    """
    from tvm import relax

    if epilogue not in DEEPBENCH_EPILOGUES:
        raise ValueError(f"epilogue={epilogue!r}; valid: {', '.join(DEEPBENCH_EPILOGUES)}")
    g = lambda k: int(row[k])
    n, c, h, w, k = g("n"), g("c"), g("h"), g("w"), g("k")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, h, w), "int8"))
    wt, b = weight_and_bias((k, c, g("filter_h"), g("filter_w")), g("id") if constants else None)
    params = [x] if constants else [x, wt] + ([b] if epilogue != "none" else [])
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, wt, strides=(g("hstride"), g("wstride")),
                                           padding=(g("pad_h"), g("pad_w")), out_dtype="int32"))
            if epilogue != "none":
                y = bb.emit(relax.op.add(y, b))
                y = bb.emit(relax.op.right_shift(y, relax.const(6, "int32")))
                y = bb.emit(relax.op.clip(y, -128, 127))
            out = bb.emit_output(relax.op.astype(y, "int8"))
        bb.emit_func_output(out)
    return bb.get()


def measured_or_measure(task, tuner, knobs):
    """The tuner's measurement of ``knobs`` if it made one (no second compile), else a new one."""
    from tvm_csp_embed.tune.measure import measure_point

    index = task.knob_space.index(knobs)
    if index is not None and index in tuner.results and tuner.results[index].ok:
        return tuner.results[index]
    return measure_point(task.spec(), knobs)


def cmd_deepbench(args) -> int:
    import vta_ext
    from tvm_csp_embed import tune

    sys.path.insert(0, str(ROOT / "scripts"))
    from embed_deepbench import read_layers

    rows_in = {int(r["id"]): r for r in read_layers(ROOT / "data" / "deepbench_conv_inference.csv")}
    option = tune.measure_option(runner=tune.LocalRunner(args.parallel))
    rows = []
    for strategy in args.strategies:
        for lid in args.layers or THIN:
            start = time.perf_counter()
            (task,) = tune.extract_tasks(deepbench_module(rows_in[lid], args.epilogue),
                                         target=vta_ext.vta_target(args.config), strategy=strategy)
            space = task.knob_space
            tuner = tune.XGBTuner(task, seed=args.seed)
            best = tuner.tune(args.trials, option, callbacks=[
                tune.callback.progress_bar(args.trials, prefix=f"{strategy} {lid}"),
                tune.callback.log_to_file(args.records)])
            tps = measured_or_measure(task, tuner, space.tps)
            fallback = None if args.no_fallback or space.fallback is None or \
                strategy not in args.fallback_for else measured_or_measure(task, tuner,
                                                                           space.fallback)
            rows.append({"id": lid, "strategy": strategy, "task": task.name,
                         "epilogue": args.epilogue, "space": len(space),
                         "trials": len(tuner.visited),
                         "tuned_cycles": best.cycles if best else None, "tps_cycles": tps.cycles,
                         "fallback_cycles": fallback.cycles if fallback else None,
                         "tuned_knobs": json.dumps(best.knobs) if best else "",
                         "seconds": round(time.perf_counter() - start, 1)})
            r = rows[-1]
            print(f"{strategy:>12} {lid:>3} tuned {r['tuned_cycles']} TPS {r['tps_cycles']} "
                  f"fallback {r['fallback_cycles']}  ({r['task']})", flush=True)
            write_csv(rows, Path(args.csv))  # after each layer: a cut run keeps what it measured
    option.runner.close()
    out = Path(args.csv)
    write_csv(rows, out)
    plot_deepbench(rows, out.with_suffix(".png"), args.config)
    return 0


def plot_deepbench(rows, path: Path, config: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ids = sorted({r["id"] for r in rows})
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    series = [(s, key) for s in strategies for key in ("fallback_cycles", "tps_cycles",
                                                       "tuned_cycles")]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(series)
    for j, (strategy, key) in enumerate(series):
        by_id = {r["id"]: r for r in rows if r["strategy"] == strategy}
        ax.bar([i + (j - len(series) / 2 + 0.5) * width for i in range(len(ids))],
               [by_id[i][key] or float("nan") if i in by_id else float("nan") for i in ids],
               width, label=f"{strategy} {key.split('_')[0]}")
    ax.set_yscale("log")
    ax.set_xticks(range(len(ids)))
    ax.set_xticklabels([f"DB{i}" for i in ids])
    ax.set_ylabel(f"cycles ({config})")
    ax.set_title("Thin-channel DeepBench layers: fallback / TPS / tuned per strategy")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


# ------------------------------------------------------------------------------------------------
def layer_module(name: str, workload: Optional[Dict] = None, constants: bool = False):
    """A one-operator Relax module of a layer of :data:`LAYERS` (int8 conv2d / group conv2d + bias,
    >> 8, clip to [0, 127], int8), the epilogue of :data:`EPILOGUE`; ``workload`` replaces the
    layer's (e.g. :data:`C1_REAL`'s).

    With ``constants=False`` the weights and the bias are function parameters (runtime data); with
    ``constants=True`` they are bound as ``relax.const`` (seeded by the layer's name: int8 weights,
    an int32 bias in :data:`DEEPBENCH_BIAS_RANGE`), as a frontend binds a quantised network's
    parameters (see :func:`deepbench_module`)."""
    import zlib

    from tvm import relax

    v = workload or LAYERS[name][1]
    groups = v.get("groups", 1)
    bb = relax.BlockBuilder()
    n, c, k = v["batch"], v["in_channels"], v["out_channels"]
    x = relax.Var("x", relax.TensorType((n, c, v["height"], v["width"]), "int8"))
    wt, b = weight_and_bias((k, c // groups, v["kernel_h"], v["kernel_w"]),
                            zlib.crc32(name.encode()) if constants else None)
    params = [x] if constants else [x, wt, b]
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, wt, strides=(v["stride_h"], v["stride_w"]),
                                           padding=(v["pad_h"], v["pad_w"]), groups=groups,
                                           out_dtype="int32"))
            y = bb.emit(relax.op.add(y, b))
            y = bb.emit(relax.op.right_shift(y, relax.const(8, "int32")))
            y = bb.emit(relax.op.clip(y, 0, 127))
            out = bb.emit_output(relax.op.astype(y, "int8"))
        bb.emit_func_output(out)
    return bb.get()


def compulsory_bytes(name: str) -> int:
    """Each tensor moved once: the input rows and columns some window reads, the weights, the
    int32 bias, the output (no micro-ops): no schedule of any embedding that does not shrink the
    tensors moves fewer DRAM bytes."""
    _, v = LAYERS[name]
    g = v.get("groups", 1)
    n, c, k = v["batch"], v["in_channels"], v["out_channels"]
    read, out = [], []
    for size, kernel, s, pad in ((v["height"], v["kernel_h"], v["stride_h"], v["pad_h"]),
                                 (v["width"], v["kernel_w"], v["stride_w"], v["pad_w"])):
        o = (size + 2 * pad - kernel) // s + 1
        out.append(o)
        read.append(len({y * s + i - pad for y in range(o) for i in range(kernel)}
                        & set(range(size))))
    return (n * c * read[0] * read[1] + k * (c // g) * v["kernel_h"] * v["kernel_w"] + 4 * k
            + n * k * out[0] * out[1])


#: the layers the original stack's tuned records cover
ORIGINAL_LAYERS = [f"C{i}" for i in range(2, 12)] + [f"D{i}" for i in range(1, 10)]


def cmd_bytes(args) -> int:
    """DRAM bytes of the CSP strategies (TPS over the whole knob space, TPS with the stock loop
    order only, and tuned with ``objective="dram_bytes"``) vs the original stack's tuned records
    (built with the stock template), per layer. ``--plot-only`` redraws the PNG of ``--csv``."""
    if args.plot_only:
        with open(args.csv) as f:
            plot_bytes(list(csv.DictReader(f)), Path(args.csv).with_suffix(".png"))
        return 0
    import vta_ext
    from tvm_csp_embed import tune
    from tvm_csp_embed.codegen.knobs import tps_point
    from tvm_csp_embed.strategy import packed_of
    from tvm_csp_embed.tune.measure import measure_point

    deepbench = deepbench_record_layers()
    LAYERS.update(deepbench)
    names = list(args.layers or ORIGINAL_LAYERS)
    if args.deepbench_records:
        names += [n for n in deepbench if n not in names]
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        raise SystemExit(f"unknown layer(s) {unknown}: use {', '.join(LAYERS)}")
    history = tune.apply_history_best(tune.TOPHUB_LOG)
    option = tune.measure_option(runner=tune.LocalRunner(args.parallel))
    rows = []
    for strategy_layout in args.strategies:
        strategy, _, layout = strategy_layout.partition(":")
        for name in names:
            start = time.perf_counter()
            stock = task_of(name, args.config)
            original = history.best_knobs(stock.kind, "stock", stock.workload, stock.config)
            orig = measure_point(stock.spec(), original[0]) if original else None
            with vta_ext.build_options(layout=layout or "auto"):
                (task,) = tune.extract_tasks(layer_module(name), target=vta_ext.vta_target(args.config),
                                             strategy=strategy)
            space = task.knob_space
            tps = measure_point(task.spec(), space.tps)
            tps0 = None
            if not task.workload_dict.get("stock"):
                point = tps_point(task.config, packed_of(task.workload, task.config), task.epilogue,
                                  fixed={"order": 0})
                tps0 = measure_point(task.spec(), dict(point.knobs)) if point else None
            tuner = tune.XGBTuner(task, seed=args.seed, objective="dram_bytes")
            best = tuner.tune(args.trials, option, callbacks=[
                tune.callback.progress_bar(args.trials, prefix=f"{strategy_layout} {name}"),
                tune.callback.log_to_file(args.records)])
            ob = orig.dram_bytes if orig else None
            rows.append({
                "layer": name, "strategy": strategy_layout, "task": task.name, "space": len(space),
                "trials": len(tuner.visited), "original_dram_bytes": ob,
                "compulsory_bytes": compulsory_bytes(name),
                "compulsory_over_original": compulsory_bytes(name) / ob if ob else None,
                "tps_dram_bytes": tps.dram_bytes,
                "tps_stock_order_dram_bytes": tps0.dram_bytes if tps0 else None,
                "tuned_dram_bytes": best.dram_bytes if best else None,
                "tps_over_original": tps.dram_bytes / ob if ob else None,
                "tps_stock_order_over_original": tps0.dram_bytes / ob if ob and tps0 else None,
                "tuned_over_original": best.dram_bytes / ob if ob and best else None,
                "original_cycles": orig.cycles if orig else None, "tps_cycles": tps.cycles,
                "tuned_cycles": best.cycles if best else None,
                "tps_knobs": json.dumps(space.tps), "tuned_knobs": json.dumps(best.knobs) if best else "",
                "original_knobs": json.dumps(original[0]) if original else "",
                "seconds": round(time.perf_counter() - start, 1)})
            r = rows[-1]
            print(f"{strategy_layout:>16} {name:>4} original {ob or 0:>10,} TPS {r['tps_dram_bytes']:>10,} "
                  f"TPS(order 0) {r['tps_stock_order_dram_bytes'] or 0:>10,} tuned "
                  f"{r['tuned_dram_bytes'] or 0:>10,}  ({task.name})", flush=True)
            write_csv(rows, Path(args.csv))  # after each layer: a cut run keeps what it measured
    option.runner.close()
    print()
    for strategy_layout in args.strategies:
        sets = [(g, [r for r in rows if r["strategy"] == strategy_layout
                     and layer_group(r["layer"]) == g]) for g in ("C", "D", "DB")]
        sets.append(("all", [r for r in rows if r["strategy"] == strategy_layout]))
        for label, sel in sets:
            if sel:
                tuned = geomean(r["tuned_over_original"] for r in sel)
                print(f"{strategy_layout:>16} {label} ({len(sel)} layers): geomean / original: TPS "
                      f"{geomean(r['tps_over_original'] for r in sel):.3f}, TPS stock order "
                      f"{geomean(r['tps_stock_order_over_original'] for r in sel):.3f}, tuned "
                      f"{tuned:.3f}, every tensor once "
                      f"{geomean(r['compulsory_over_original'] for r in sel):.3f}; bar <= 0.7 "
                      f"{'met' if tuned <= 0.7 else 'NOT met'}")
    write_csv(rows, Path(args.csv))
    plot_bytes(rows, Path(args.csv).with_suffix(".png"))
    return 0


def plot_bytes(rows, path: Path) -> None:
    """Per layer and strategy: TPS, TPS in the stock order, tuned for bytes, and the compulsory
    bytes, each over the original record's bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    val = lambda v: float(v) if v not in (None, "") else float("nan")
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    series = [(s, k) for s in strategies for k in ("tps_stock_order_over_original",
                                                   "tuned_over_original")]
    fig, ax = plt.subplots(figsize=(max(12, 0.45 * len(layers)), 4.5))
    width = 0.8 / (len(series) + 1)
    for j, (strategy, key) in enumerate(series):
        by = {r["layer"]: r for r in rows if r["strategy"] == strategy}
        label = f"{strategy} {'TPS, stock order' if 'stock' in key else 'tuned (dram_bytes)'}"
        ax.bar([i + (j - len(series) / 2) * width for i in range(len(layers))],
               [val(by[n][key]) if n in by else float("nan") for n in layers], width, label=label)
    first = {r["layer"]: r for r in rows}
    ax.bar([i + (len(series) - len(series) / 2) * width for i in range(len(layers))],
           [val(first[n]["compulsory_over_original"]) for n in layers], width,
           label="every tensor once (floor)", color="#888888")
    ax.axhline(0.7, color="red", lw=0.8, ls="--", label="bar 0.7")
    ax.axhline(1.0, color="black", lw=0.5)
    ax.set_xticks(range(len(layers)))
    ax.set_xticklabels(layers, rotation=90 if len(layers) > 20 else 0, fontsize=8)
    ax.set_ylabel("DRAM bytes / original record's")
    ax.set_title("DRAM bytes vs the original stack's tuned records (TopHub vta_v0.10)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


# ------------------------------------------------------------------------------------------------
def cmd_network(args) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for path in args.totals:
        with open(path) as f:
            rows += list(csv.DictReader(f))
    labels = [f"{r['config']}\n{r.get('strategy', '')}\n{r['variant']}" for r in rows]
    cycles = [int(r["cycles"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(range(len(rows)), [c / 1e6 for c in cycles], color="#1f77b4")
    for i, c in enumerate(cycles):
        ax.text(i, c / 1e6, f"x{cycles[0] / c:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("cycles (millions), one inference")
    ax.set_title("ResNet-18: speedup over the first bar")
    fig.tight_layout()
    out = FIG / "tune_network.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(f"wrote {out}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("bytes")
    p.add_argument("--config", default="pipelined")
    p.add_argument("--strategies", nargs="+", default=["csp-strict:NCHW", "csp-relaxed"],
                   help="strategy[:layout] of each series")
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--records", required=True)
    p.add_argument("--layers", nargs="*")
    p.add_argument("--csv", default=str(FIG / "tune_bytes.csv"))
    p.add_argument("--deepbench-records", action="store_true",
                   help="add the DeepBench layers the original records cover (DB<id>)")
    p.add_argument("--plot-only", action="store_true")
    p = sub.add_parser("layers")
    p.add_argument("--config", default="pipelined")
    p.add_argument("--strategies", nargs="+", default=["stock"],
                   help="strategy[:layout] of each run; one CSV + PNG per strategy (stock: --csv, "
                   "others: <csv stem>_<strategy>.csv); the CSP strategies take C1 with its 3 "
                   "input channels and leave out the dense layer")
    p.add_argument("--trials", type=int, default=60)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fallback-for", nargs="*", default=None,
                   help="strategies whose fallback point is built and timed (default: every "
                   "strategy of the run; it is measured after the layer's row is written)")
    p.add_argument("--records", required=True)
    p.add_argument("--layers", nargs="*")
    p.add_argument("--csv", default=str(FIG / "tune_layers.csv"))
    p = sub.add_parser("search")
    p.add_argument("--config", default="pipelined")
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--records", required=True)
    p.add_argument("--layers", nargs="+", default=["C9", "C10", "C11", "D9", "dense"])
    p.add_argument("--csv", default=str(FIG / "tune_search.csv"))
    p = sub.add_parser("deepbench")
    p.add_argument("--config", default="pipelined")
    p.add_argument("--strategies", nargs="+", default=["stock", "csp-relaxed"])
    p.add_argument("--trials", type=int, default=24)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-fallback", action="store_true")
    p.add_argument("--fallback-for", nargs="*", default=["stock"],
                   help="strategies whose fallback point is built and timed (default stock: "
                   "building csp-relaxed's fallback point of layer 0 had not finished after 7 "
                   "minutes on the shared machine)")
    p.add_argument("--epilogue", choices=DEEPBENCH_EPILOGUES, default="bias-shift-clip",
                   help="the conv2d's epilogue (none: the operator alone, as scripts/deepbench.py "
                   "measures it)")
    p.add_argument("--records", required=True)
    p.add_argument("--layers", nargs="*", type=int)
    p.add_argument("--csv", default=str(FIG / "tune_deepbench.csv"))
    p = sub.add_parser("network")
    p.add_argument("totals", nargs="+")
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return {"layers": cmd_layers, "search": cmd_search, "deepbench": cmd_deepbench,
            "network": cmd_network, "bytes": cmd_bytes}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
