#!/usr/bin/env python
"""Tune every VTA task of a model, then build it with the records and compare with TPS.

Steps (every number is the cycle model's, every tuned point verified bit for bit):

1. The model: ``resnet18`` / ``mobilenet_v1`` from ``relay_examples/models.py`` (quantised,
   :func:`models.quantized_example`), or ``path/to/file.py`` defining ``mod`` (a Relax module) or
   ``get_module()`` / ``build_model()`` (random inputs then).
2. ``tune.extract_tasks`` on the chosen configuration and strategy; each task is tuned with the
   chosen tuner for ``--trials`` measurements in ``--parallel`` worker processes, with a progress
   bar, appending to ``--records`` (a restarted run skips what is measured).
3. A table per task: trials, best cycles, TPS cycles, fallback cycles (``--no-fallback`` skips
   these slow builds) and the speedups.
4. The model is built with ``relax.build`` twice, with TPS and with ``tune.apply_history_best``
   (``--baseline-config`` adds a TPS build on another preset), run once on the functional
   simulator (outputs compared), and the total cycles are reported (sum over the VTA calls).

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/tune_network.py --model resnet18 \
        --config pipelined --trials 64 --parallel 1 --records resnet18_pipelined.json \
        --baseline-config default --csv docs/figures/tune_resnet18_pipelined.csv
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
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


def make_tuner(kind: str, task, seed: int, objective: str = "cycles"):
    from tvm_csp_embed import tune

    return {"xgb": tune.XGBTuner, "random": tune.RandomTuner,
            "grid": tune.GridSearchTuner}[kind](task, seed=seed, objective=objective)


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

    runner = tune.LocalRunner(args.parallel)
    option = tune.measure_option(runner=runner)
    rows = []
    try:
        for i, task in enumerate(tasks):
            space = task.knob_space
            tuner = make_tuner(args.tuner, task, args.seed, args.objective)
            start = time.perf_counter()
            best = tuner.tune(args.trials, option, callbacks=[
                tune.callback.progress_bar(args.trials, prefix=f"[{i + 1}/{len(tasks)}] {task.name}"),
                tune.callback.log_to_file(args.records)])
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
                         "pruned": len(space.pruned), "trials": len(tuner.visited),
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
