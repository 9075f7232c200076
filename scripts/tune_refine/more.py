"""Usage: more.py RECORDS "TASK NAME=TRIALS" ... (a grid search when TRIALS covers the space).

More XGB trials on chosen ResNet-18 csp-relaxed tasks, tasks rebuilt from the records
(no model extraction); the records file resumes (measured points are skipped)."""
import os, sys, time
sys.path[:0] = [".", os.path.dirname(os.path.abspath(__file__))]  # run from the repository root
from tvm_csp_embed import tune
from _records import tasks_from_records
path = sys.argv[1]
plan = [(a.rsplit("=", 1)[0], int(a.rsplit("=", 1)[1])) for a in sys.argv[2:]]
option = tune.measure_option(runner=tune.LocalRunner(0))
tasks = tasks_from_records(path)
for name, n in plan:
    task = tasks[name]
    start = time.time()
    tuner = tune.GridSearchTuner(task) if n >= len(task.knob_space) else tune.XGBTuner(task, seed=0)
    best = tuner.tune(n, option, callbacks=[tune.callback.log_to_file(path)])
    print("MORE", task.name, n, best.cycles, best.knobs, f"{time.time()-start:.0f}s", flush=True)
option.runner.close()
