"""Tasks rebuilt from a records file (no model extraction), shared by the refinement scripts."""
from typing import Dict

from tvm_csp_embed import tune
from tvm_csp_embed.tune.records import load_records


def tasks_from_records(path: str, config: str = "pipelined") -> Dict[str, "tune.Task"]:
    """One task per workload of our records in ``path`` (kind, strategy and epilogue of its first
    record) on preset ``config``, by task name; AutoTVM lines are skipped."""
    tasks, seen = {}, set()
    for r in load_records(path, warn=False):
        if r.autotvm or r.key[3] in seen:
            continue
        seen.add(r.key[3])
        task = tune.Task.create(r.kind, r.workload, r.epilogue, r.key[1], config)
        tasks[task.name] = task
    return tasks
