"""Usage: more.py RECORDS "TASK NAME=TRIALS" ... (a grid search when TRIALS covers the space).

More XGB trials on chosen ResNet-18 csp-relaxed tasks, tasks rebuilt from the records
(no model extraction); the records file resumes (measured points are skipped)."""
import json, sys, time
sys.path.insert(0, ".")  # run from the repository root
from tvm_csp_embed import tune
from vta_ext.config import load_config
path = sys.argv[1]
plan = [(a.rsplit("=", 1)[0], int(a.rsplit("=", 1)[1])) for a in sys.argv[2:]]
seen = {}
for line in open(path):
    try:
        r = json.loads(line)
    except Exception:
        continue
    seen.setdefault(json.dumps(r["workload"], sort_keys=True), r)
cfg = load_config("pipelined")
option = tune.measure_option(runner=tune.LocalRunner(0))
tasks = {}
for key, r in seen.items():
    task = tune.Task.from_spec({"kind": r["kind"], "strategy": r["strategy"], "config": "pipelined",
                                "config_value": cfg.to_dict(), "workload": r["workload"],
                                "epilogue": r["epilogue"]})
    tasks[task.name] = task
for name, n in plan:
    task = tasks[name]
    start = time.time()
    tuner = tune.GridSearchTuner(task) if n >= len(task.knob_space) else tune.XGBTuner(task, seed=0)
    best = tuner.tune(n, option, callbacks=[tune.callback.log_to_file(path)])
    print("MORE", task.name, n, best.cycles, best.knobs, f"{time.time()-start:.0f}s", flush=True)
option.runner.close()
