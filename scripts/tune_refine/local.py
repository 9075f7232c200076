"""Usage: local.py RECORDS RADIUS ROUNDS "TASK NAME" ...

Grid search over a pruned subset: the valid points within Hamming distance R of a task's best
measured point (hill-climbing: repeated from the new best while it improves, at most ROUNDS).
Tasks rebuilt from the records; measured points resumed; the best verified and recorded."""
import os, sys, time
sys.path[:0] = [".", os.path.dirname(os.path.abspath(__file__))]  # run from the repository root
from tvm_csp_embed import tune
from tvm_csp_embed.tune.tuner import GridSearchTuner
from _records import tasks_from_records
path, radius, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
names = sys.argv[4:]
tasks = tasks_from_records(path)

class Near(GridSearchTuner):
    allowed = set()
    def next_batch(self, size):
        return [i for i in sorted(self.allowed) if i not in self.visited][:size]
    def has_next(self):
        return any(i not in self.visited for i in self.allowed)

option = tune.measure_option(runner=tune.LocalRunner(0))
log = tune.callback.log_to_file(path)
for name in names:
    task = tasks[name]
    for rnd in range(rounds):
        probe = Near(task)
        probe.allowed = set()
        probe._resume([log])
        before = probe.best_cycles
        centre = probe.space.points[probe.best_index]
        near = {i for i, p in enumerate(probe.space.points)
                if sum(p[k] != centre[k] for k in centre) <= radius}
        tuner = Near(task)
        tuner.allowed = near
        start = time.time()
        n = len(probe.visited) + len(near - set(probe.visited))
        best = tuner.tune(n, option, callbacks=[log])
        print("LOCAL", name, "round", rnd, "neighbours", len(near), "new", len(near - set(probe.visited)),
              "before", before, "after", best.cycles if best else None, best.knobs if best else None,
              f"{time.time() - start:.0f}s", flush=True)
        if best is None or best.cycles >= before:
            break
option.runner.close()
