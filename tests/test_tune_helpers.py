"""Test-only strategies for the tuner tests (no tests here): templates that fail on purpose.

Registered on import (the tests and the measurement workers import this module):

* strategy ``tune-test``: the stock dense template, except that points with ``tile_ci == 1`` raise
  in ``build`` and the point :data:`WRONG` is compiled without its ``("shr", s)`` stage (fewer ALU
  cycles, wrong output: the tuner must not record it as best);
* strategy ``tune-kill``: the stock dense template, except that building a point with
  ``tile_co == 4`` inside a worker process (a ``LocalRunner``'s or a Dask worker) kills that
  process (``os._exit``), once per marker file named by the ``TUNE_KILL_MARKER`` environment
  variable (always, if unset).
"""
from __future__ import annotations

import multiprocessing
import os

from vta_ext.stock import StockDense
from vta_ext.strategy import Strategy, register_strategy, register_template

from tvm_csp_embed.tune.features import estimator_for, register_estimator
from tvm_csp_embed.tune.reference import reference_for, register_reference
from tvm_csp_embed.tune.runner import in_worker

#: the dense workload of these tests: 28 valid points, 8 pruned
DENSE = dict(batch=1, in_features=128, out_features=64)
EPILOGUE = (("bias",), ("shr", 8), ("clip", 0, 127))
#: the fastest point of DENSE on ``default`` (1,226 cycles, measured), built wrongly by tune-test
WRONG = {"tile_b": 1, "tile_ci": 8, "tile_co": 2, "oc_nthread": 2, "reuse": True}


class FaultyDense(StockDense):
    """Stock dense with injected failures (module docstring)."""

    strategy = "tune-test"

    def build(self, config, workload, epilogue, knobs):
        if isinstance(knobs, dict) and knobs.get("tile_ci") == 1:
            raise RuntimeError("injected build failure for tile_ci=1")
        if isinstance(knobs, dict) and knobs == WRONG:
            epilogue = tuple(s for s in epilogue if s[0] != "shr")
        return super().build(config, workload, epilogue, knobs)


class KillingDense(StockDense):
    """Stock dense whose ``tile_co == 4`` points kill the worker process building them."""

    strategy = "tune-kill"

    def build(self, config, workload, epilogue, knobs):
        if isinstance(knobs, dict) and knobs.get("tile_co") == 4 \
                and (in_worker() or multiprocessing.parent_process() is not None):
            marker = os.environ.get("TUNE_KILL_MARKER")
            if marker is None or not os.path.exists(marker):
                if marker is not None:
                    open(marker, "w").close()
                os._exit(3)
        return super().build(config, workload, epilogue, knobs)


for _strategy, _template in (("tune-test", FaultyDense()), ("tune-kill", KillingDense())):
    register_strategy(Strategy(_strategy, "test strategy of tests/test_tune*.py"))
    register_template("dense", _strategy, _template)
    register_reference("dense", _strategy, reference_for("dense", "stock"))
    register_estimator("dense", _strategy, estimator_for("dense", "stock"))
