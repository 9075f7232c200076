"""Usage: local.py RECORDS RADIUS ROUNDS "TASK NAME" ...

Grid search over a pruned subset (tune.NeighbourhoodTuner): the valid points within Hamming
distance RADIUS of a task's best measured point (hill-climbing: repeated from the new best while it
improves, at most ROUNDS neighbourhoods). Tasks rebuilt from the records; measured points resumed;
the best verified and recorded. One LOCAL line per neighbourhood ("after": the best at its end)."""
import os, sys, time
sys.path[:0] = [".", os.path.dirname(os.path.abspath(__file__))]  # run from the repository root
from tvm_csp_embed import tune
from _records import tasks_from_records
path, radius, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
names = sys.argv[4:]
tasks = tasks_from_records(path)


def line(tuner, rnd, after, knobs, seconds):
    h = tuner.history[rnd]
    print("LOCAL", tuner.task.name, "round", rnd, "neighbours", h.neighbours, "new", h.new,
          "before", h.best_before, "after", after, knobs, f"{seconds:.0f}s", flush=True)


def rounds_printer():
    """Print each finished neighbourhood as soon as the next one starts measuring."""
    printed = [0]

    def callback(tuner, inputs, results):
        while printed[0] < len(tuner.history) - 1:
            rnd, nxt = printed[0], tuner.history[printed[0] + 1]
            line(tuner, rnd, tuner.results[nxt.centre].cycles, tuner.space.points[nxt.centre],
                 nxt.started - tuner.history[rnd].started)
            printed[0] += 1
    return callback


option = tune.measure_option(runner=tune.LocalRunner(0))
log = tune.callback.log_to_file(path)
for name in names:
    task = tasks[name]
    tuner = tune.NeighbourhoodTuner(task, radius=radius, rounds=max(0, rounds - 1))
    best = tuner.tune(len(task.knob_space), option, callbacks=[log, rounds_printer()])
    if tuner.history:
        line(tuner, len(tuner.history) - 1, best.cycles if best else None,
             best.knobs if best else None, time.time() - tuner.history[-1].started)
option.runner.close()
