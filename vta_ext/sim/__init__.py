"""Simulators of the VTA accelerator.

* :class:`FunctionalSimulator` executes binary instruction streams with the semantics of the apache
  functional simulator (fsim), vectorised with numpy; :func:`run_binary` is a one-shot helper.
* :class:`SimStats` holds the seven fsim profiler counters.
"""
from .fsim import FunctionalSimulator, SimulationError, run_binary
from .stats import COUNTER_NAMES, SimStats

__all__ = ["FunctionalSimulator", "SimulationError", "SimStats", "COUNTER_NAMES", "run_binary"]
