#!/usr/bin/env python
"""Tune every VTA task of a model, then build it with the records and compare with TPS.

Steps (every number is the cycle model's, every tuned point verified bit for bit):

1. The model: ``resnet18`` / ``mobilenet_v1`` from ``relay_examples/models.py`` (quantised,
   :func:`models.quantized_example`), or ``path/to/file.py`` defining ``mod`` (a Relax module) or
   ``get_module()`` / ``build_model()`` (random inputs then).
2. ``tune.extract_tasks`` on the chosen configuration and strategy; each task is tuned with the
   chosen tuner for ``--trials`` measurements in ``--parallel`` worker processes, with a progress
   bar, appending to ``--records`` (a restarted run skips what is measured, so a second run with
   more ``--trials`` tunes on). A task whose whole space fits in ``--trials`` is searched
   exhaustively (grid search).
3. ``--refine N``: each task is then refined by ``tune.NeighbourhoodTuner``: a grid search over the
   valid points within Hamming distance ``--radius`` of the best measured point, re-centred on
   each new best, at most ``N`` neighbourhoods (one line per neighbourhood).
4. ``--embeddings`` (CSP strategies): the operators the strategy kept on the stock plan (its
   embeddings were not faster at their TPS points) get their CSP embeddings tuned too, each
   usable candidate the strategy would time (``CYCLE_RANKED`` best static estimates within
   ``RANK_FACTOR``) as a task of its own, for ``--trials`` (and ``--refine``); the build's choice
   then times every embedding and the stock plan with their tuned knobs.
5. A table per task: trials, best cycles, TPS cycles, fallback cycles (``--no-fallback`` skips
   these slow builds) and the speedups.
6. The model is built with ``relax.build`` twice, with TPS and with ``tune.apply_history_best``
   (``--baseline-config`` adds a TPS build on another preset), run once on the functional
   simulator (outputs compared), and the total cycles are reported (sum over the VTA calls).

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/tune_network.py --model resnet18 \
        --config pipelined --trials 64 --parallel 1 --records resnet18_pipelined.json \
        --baseline-config default --csv docs/figures/tune_resnet18_pipelined.csv
    # the CSP strategy, XGB then two neighbourhoods per task, the stock-plan operators' embeddings
    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/tune_network.py --model resnet18 \
        --config pipelined --strategy csp-relaxed --trials 96 --refine 2 --embeddings \
        --records resnet18_csp.json --no-fallback --baseline-config default \
        --baseline-strategy stock csp-relaxed
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "relay_examples"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

TUNERS = ("xgb", "random", "grid")


def load_model(name: str, size: int, seed: int):
    """``(Relax module, input array or None)`` of a model name or a module path."""
    import numpy as np

    if name.endswith(".py"):
        spec = importlib.util.spec_from_file_location("user_model", name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name in ("get_module", "build_model"):
            if hasattr(module, name):
                mod = getattr(module, name)()
                return (mod[0] if isinstance(mod, tuple) else mod), None
        return module.mod, None
    from models import quantized_example

    _, qmodel, _, data = quantized_example(name, size, seed)
    return qmodel.mod, np.asarray(data)


def make_tuner(kind: str, task, seed: int, objective: str = "cycles", trials: int = 0):
    """The tuner ``kind`` of ``task``; a grid search when ``trials`` cover the whole space."""
    from tvm_csp_embed import tune

    if trials >= len(task.knob_space):
        kind = "grid"
    return {"xgb": tune.XGBTuner, "random": tune.RandomTuner,
            "grid": tune.GridSearchTuner}[kind](task, seed=seed, objective=objective)


def refine(task, args, option, prefix: str):
    """``--refine`` neighbourhoods of ``task`` around its best recorded point; one line each.

    Returns the verified best (None if nothing was measured)."""
    from tvm_csp_embed import tune

    tuner = tune.NeighbourhoodTuner(task, radius=args.radius, rounds=args.refine - 1,
                                    objective=args.objective)
    best = tuner.tune(len(task.knob_space), option,
                      callbacks=[tune.callback.log_to_file(args.records)])
    for i, r in enumerate(tuner.history):
        end = (tuner.results[tuner.history[i + 1].centre].cycles if i + 1 < len(tuner.history)
               else (best.cycles if best else None))
        print(f"  {prefix} refine {i + 1}/{args.refine}: {r.neighbours} points within radius "
              f"{args.radius}, {r.new} new; best {r.best_before:,} -> {end:,} cycles"
              if r.best_before is not None and end is not None else
              f"  {prefix} refine {i + 1}/{args.refine}: {r.neighbours} points, {r.new} new")
    print(f"  {prefix} refined: {tuner.stop_reason or 'trials spent'}")
    return best


def embedding_tasks(mod, tasks, args) -> List:
    """The CSP embeddings of the operators the strategy kept on the stock plan, as tasks: each
    usable candidate the strategy times (the best :data:`CYCLE_RANKED` static estimates within
    :data:`RANK_FACTOR` of the best), with the stock-plan task's epilogue."""
    import vta_ext
    from tvm_csp_embed import tune
    from tvm_csp_embed.strategy import (CYCLE_RANKED, MODES, RANK_FACTOR, CspWorkload,
                                        candidates, fused_variants)

    strategy = args.strategy or vta_ext.strategy.default_strategy()
    if strategy not in MODES:
        raise SystemExit(f"--embeddings: strategy {strategy!r} has no CSP embeddings; give "
                         f"--strategy {' or '.join(MODES)}")
    kept = [t for t in tasks if getattr(t.workload, "stock", ())]
    if not kept:
        return []
    target = vta_ext.vta_target(args.config)
    # the footprint objective plans every operator on an embedding: its operator parameters
    with vta_ext.build_options(objective="footprint"):
        planned = tune.extract_tasks(mod, target=target, strategy=strategy)
    # the depthwise and narrow grouped block-diagonal units' workloads are not CSP workloads
    embedded = [t for t in tasks if isinstance(t.workload, CspWorkload)]
    on_embeddings = {(t.kind, t.workload.params) for t in embedded if not t.workload.stock}
    config, mode, out = kept[0].config, MODES[strategy], []
    for t in planned:
        if (not isinstance(t.workload, CspWorkload) or t.workload.stock
                or (t.kind, t.workload.params) in on_embeddings):
            continue
        base = CspWorkload(t.kind, t.workload.params)
        layouts = (["NCHW"] if t.kind == "dense" else
                   ["NCHW", "NHWC"] + (fused_variants(base, config) if mode == "relaxed" else []))
        cands, _ = candidates(config, base, mode, layouts, t.epilogue)
        usable = sorted((c for c in cands if not c.refused), key=lambda c: c.estimate)
        for c in usable[:CYCLE_RANKED]:
            if c.estimate > RANK_FACTOR * usable[0].estimate:
                break
            out.append(tune.Task(t.kind, c.workload, t.epilogue, strategy, config, t.count))
    return out


def random_arguments(mod, seed: int = 0) -> list:
    """Seeded random arguments for ``mod["main"]``: int8 full range, int32 in +-4096, floats
    standard normal."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for param in mod["main"].params:
        shape, dtype = tuple(int(d) for d in param.ty.shape), str(param.ty.dtype)
        if dtype == "int8":
            out.append(rng.integers(-128, 128, shape).astype(np.int8))
        elif dtype.startswith("int"):
            out.append(rng.integers(-4096, 4096, shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def run_model(mod, config: str, data, records=None, strategy: Optional[str] = None):
    """Build for ``config`` with ``strategy`` (and ``records`` if given), run once; ``(total
    cycles, output, report, calls)``."""
    import numpy as np
    import tvm
    from tvm import relax

    import vta_ext
    from vta_ext.executor import cycle_report
    from tvm_csp_embed import tune

    def build():
        return relax.build(mod, target=vta_ext.vta_target(config))

    with vta_ext.build_options(strategy=strategy):
        if records is not None:
            with tune.apply_history_best(records):
                executable = build()
        else:
            executable = build()
    report = vta_ext.last_build_report()
    args = [data] if data is not None else random_arguments(mod)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    vta_ext.clear_run_log()
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    out = out[0] if not hasattr(out, "numpy") else out
    calls = vta_ext.run_log()
    total = sum(cycle_report(r.key).total_cycles for r in calls)
    run_model.compute_busy = sum(cycle_report(r.key).modules["compute"].busy for r in calls)
    return total, np.asarray(out.numpy()), report, calls


def tune_tasks(tasks, args) -> List[Dict]:
    """Tune every task; one table row each."""
    from tvm_csp_embed import tune
    from tvm_csp_embed.tune.measure import measure_point
    from tvm_csp_embed.tune.records import measured_points

    runner = tune.LocalRunner(args.parallel)
    option = tune.measure_option(runner=runner)
    rows = []
    try:
        for i, task in enumerate(tasks):
            space = task.knob_space
            tuner = make_tuner(args.tuner, task, args.seed, args.objective, args.trials)
            start = time.perf_counter()
            prefix = f"[{i + 1}/{len(tasks)}] {task.name}"
            best = tuner.tune(args.trials, option, callbacks=[
                tune.callback.progress_bar(args.trials, prefix=prefix),
                tune.callback.log_to_file(args.records)])
            trials = len(tuner.visited)
            if args.refine:
                refined = refine(task, args, option, prefix)
                if refined is not None and (best is None or refined.cycles < best.cycles):
                    best = refined
                trials = len({json.dumps(r.knobs, sort_keys=True)
                              for r in measured_points(args.records, task)})
            seconds = time.perf_counter() - start
            tps_index = space.index(space.tps)
            tps = tuner.results.get(tps_index) if tps_index is not None else None
            if tps is None or not tps.ok:
                tps = measure_point(task.spec(), space.tps)
            fallback = None
            if not args.no_fallback:
                fb = measure_point(task.spec(), space.fallback)
                fallback = fb.cycles if fb.ok else None
            rows.append({"task": task.name, "count": task.count, "space": len(space),
                         "pruned": len(space.pruned), "trials": trials,
                         "errors": sum(not r.ok for r in tuner.results.values()),
                         "best_cycles": best.cycles if best else None,
                         "tps_cycles": tps.cycles, "fallback_cycles": fallback,
                         "speedup_vs_tps": (tps.cycles / best.cycles) if best else None,
                         "speedup_vs_fallback": (fallback / best.cycles) if best and fallback else None,
                         "best_knobs": best.knobs if best else None, "tps_knobs": space.tps,
                         "best_dram_bytes": best.dram_bytes if best else None,
                         "tps_dram_bytes": tps.dram_bytes, "seconds": round(seconds, 1)})
    finally:
        runner.close()
    return rows


def print_table(rows: List[Dict]) -> None:
    fmt = lambda v: "-" if v is None else (f"{v:,}" if isinstance(v, int) else f"{v:.2f}")
    print(f"\n{'task':<44} {'n':>2} {'space':>5} {'trials':>6} {'best':>12} {'TPS':>12} "
          f"{'fallback':>13} {'xTPS':>6} {'xfallb':>7}")
    for r in rows:
        print(f"{r['task'][:44]:<44} {r['count']:>2} {r['space']:>5} {r['trials']:>6} "
              f"{fmt(r['best_cycles']):>12} {fmt(r['tps_cycles']):>12} "
              f"{fmt(r['fallback_cycles']):>13} {fmt(r['speedup_vs_tps']):>6} "
              f"{fmt(r['speedup_vs_fallback']):>7}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18",
                        help="resnet18, mobilenet_v1, or a .py file defining mod, get_module() or "
                             "build_model()")
    parser.add_argument("--size", type=int, default=224, help="input size of the example models")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and of the tuner")
    parser.add_argument("--config", default="default", help="VTA configuration preset")
    parser.add_argument("--strategy", default=None, help="strategy (default: the registered one)")
    parser.add_argument("--tuner", choices=TUNERS, default="xgb")
    parser.add_argument("--trials", type=int, default=64, help="measurements per task")
    parser.add_argument("--objective", choices=("cycles", "dram_bytes"), default="cycles",
                        help="what the tuner minimises (the best point per task); records are "
                             "applied by fewest cycles, so give a dram_bytes run its own records")
    parser.add_argument("--refine", type=int, default=0, metavar="N",
                        help="after the tuner, at most N neighbourhoods of NeighbourhoodTuner "
                             "per task (0: none)")
    parser.add_argument("--radius", type=int, default=2,
                        help="Hamming radius of the --refine neighbourhoods")
    parser.add_argument("--embeddings", action="store_true",
                        help="CSP strategies: also tune the embeddings of the operators kept on "
                             "the stock plan (the build then chooses with tuned knobs)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="measurement worker processes (0: in this process)")
    parser.add_argument("--records", default="tune_records.json", help="records file (appended)")
    parser.add_argument("--no-fallback", action="store_true",
                        help="do not measure the fallback point of every task (slow builds)")
    parser.add_argument("--baseline-config", default=None,
                        help="also build the model with TPS on this preset (e.g. default)")
    parser.add_argument("--baseline-strategy", nargs="+", default=None,
                        help="strategy (or strategies, one baseline build each) of the baseline "
                             "build (default: --strategy)")
    parser.add_argument("--csv", default=None, help="write the per-task table here (and the "
                        "whole-model totals to <name>_totals.csv)")
    args = parser.parse_args(argv)
    if args.refine < 0 or args.radius < 0:
        parser.error(f"--refine {args.refine} --radius {args.radius}: give numbers >= 0")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    import numpy as np

    import vta_ext
    from tvm_csp_embed import tune

    start = time.perf_counter()
    mod, data = load_model(args.model, args.size, args.seed)
    tasks = tune.extract_tasks(mod, target=vta_ext.vta_target(args.config), strategy=args.strategy)
    print(f"== {args.model} on {args.config!r}: {len(tasks)} task(s) "
          f"({time.perf_counter() - start:.1f} s)")
    for task in tasks:
        print(f"  {task!r}: {task.knob_space!r}")
    if not tasks:
        print("nothing to tune: the model has no VTA operator with tunable knobs")
        return 1
    if args.embeddings:
        extra = embedding_tasks(mod, tasks, args)
        print(f"== {len(extra)} CSP embedding task(s) of the operators on the stock plan")
        for task in extra:
            print(f"  {task!r}: {task.knob_space!r}")
        tasks = tasks + extra
    rows = tune_tasks(tasks, args)
    print_table(rows)
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.csv}")

    print("\n== whole model (cycle model, one inference)")
    totals = []
    tps_total, tps_out, _, _ = run_model(mod, args.config, data, strategy=args.strategy)
    tuned_total, tuned_out, report, calls = run_model(mod, args.config, data, args.records,
                                                      args.strategy)
    tuned_ops = sum("tuned record" in p.detail for p in report.on_vta)
    name = args.strategy or vta_ext.strategy.default_strategy()
    totals += [{"config": args.config, "variant": "TPS", "cycles": tps_total, "strategy": name},
               {"config": args.config, "variant": "tuned", "cycles": tuned_total, "strategy": name}]
    print(f"  {args.config} tuned: the compute module is busy {run_model.compute_busy:,} cycles "
          "(GEMM + ALU + its loads, serial): no overlap of loads and stores can go below that")
    print(f"  {args.config} TPS:   {tps_total:>13,} cycles")
    print(f"  {args.config} tuned: {tuned_total:>13,} cycles ({tuned_ops} operators from records; "
          f"x{tps_total / tuned_total:.2f} fewer than TPS); outputs "
          f"{'equal' if np.array_equal(tps_out, tuned_out) else 'DIFFER'}")
    for pos, base_strategy in enumerate(args.baseline_strategy or [args.strategy]
                                        if args.baseline_config else []):
        base_total, base_out, _, _ = run_model(mod, args.baseline_config, data,
                                               strategy=base_strategy)
        totals.insert(pos, {"config": args.baseline_config, "variant": "TPS", "cycles": base_total,
                            "strategy": base_strategy or name})
        print(f"  {args.baseline_config} TPS ({base_strategy or name}): {base_total:>13,} cycles -> "
              f"{args.config} tuned is x{base_total / tuned_total:.2f} fewer (TPS on {args.config}: "
              f"x{base_total / tps_total:.2f}); outputs "
              f"{'equal' if np.array_equal(base_out, tuned_out) else 'DIFFER'}")
    if args.csv:
        path = Path(args.csv).with_name(Path(args.csv).stem + "_totals.csv")
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["config", "strategy", "variant", "cycles"])
            writer.writeheader()
            writer.writerows(totals)
        print(f"wrote {path}")
    return 0 if np.array_equal(tps_out, tuned_out) else 1


if __name__ == "__main__":
    sys.exit(main())
