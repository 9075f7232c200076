"""Tuning over the free loops, in AutoTVM's role.

.. code-block:: python

    from tvm_csp_embed import tune

    tasks = tune.extract_tasks(mod, target="ext_vta")       # one task per distinct VTA workload
    for task in tasks:
        tuner = tune.XGBTuner(task)                           # also RandomTuner, GridSearchTuner,
                                                              # NeighbourhoodTuner
        tuner.tune(n_trial=200,
                   measure_option=tune.measure_option(runner=tune.LocalRunner(n_parallel=2)),
                   callbacks=[tune.callback.progress_bar(200), tune.callback.log_to_file("net.json")])
    with tune.apply_history_best("net.json"):
        ex = tvm.relax.build(mod, target="ext_vta")

A task's knob space comes from its strategy (:meth:`vta_ext.strategy.OpTemplate.knob_space`); a
measurement compiles one point and runs the cycle model; the best point is verified bit for bit on
the functional simulator. Records are JSON lines keyed by workload, strategy and the configuration's
value; AutoTVM v0.2 logs of the original VTA templates are read too (:data:`TOPHUB_LOG`).
"""
from pathlib import Path

from . import callback
from .measure import MeasureResult, measure_point, verify_point
from .records import ApplyHistoryBest, RecordWarning, apply_history_best, load_records
from .runner import DaskRunner, LocalRunner, measure_option
from .task import Task, extract_tasks
from .tuner import GridSearchTuner, NeighbourhoodTuner, RandomTuner, Tuner, XGBTuner

#: the original stack's public tuned records (TopHub ``vta_v0.10.log``, 1x16 VTA templates only)
TOPHUB_LOG = Path(__file__).resolve().parents[2] / "data" / "tophub_vta_v0.10.log"

__all__ = ["extract_tasks", "Task", "XGBTuner", "RandomTuner", "GridSearchTuner",
           "NeighbourhoodTuner", "Tuner",
           "measure_option", "LocalRunner", "DaskRunner", "callback", "apply_history_best",
           "ApplyHistoryBest", "load_records", "RecordWarning", "MeasureResult", "measure_point",
           "verify_point", "TOPHUB_LOG"]
