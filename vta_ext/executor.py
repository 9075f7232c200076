"""Prebuilt VTA operators and the packed function that runs them from the Relax VM.

Operators are identified by a JSON key (operator, configuration, workload, epilogue). The offload
pass builds each one at build time with :func:`compiled_op`; ``relax.call_dps_packed("vta_ext.run",
inputs..., key, out)`` then only copies the inputs into the program's DRAM image, executes the
instruction stream on the functional simulator and copies the output back. A process that loads a
built module without having built it rebuilds the stream on first use and logs that it did.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import tvm_ffi

from .config import VTAConfig, load_config

__all__ = ["TemplateUnavailable", "TEMPLATES", "compiled_op", "OpRun", "run_log", "clear_run_log", "simulator_for", "cycle_report"]

logger = logging.getLogger("vta_ext")

_COMPILED: Dict[str, object] = {}
_CYCLES: Dict[str, object] = {}
_SIMULATORS: Dict[str, object] = {}


@dataclass(frozen=True)
class OpRun:
    """One execution of a VTA operator: its key, simulator counters and wall time."""

    op: str
    workload: dict
    stats: object
    seconds: float
    key: str = ""

    @property
    def cycles(self):
        """The cycle-model report of this operator's program (static: data does not matter)."""
        return cycle_report(self.key)

    def __repr__(self) -> str:
        return f"OpRun({self.op}, {self.seconds * 1e3:.1f} ms, {self.stats})"


_RUN_LOG: List[OpRun] = []


def run_log() -> List[OpRun]:
    """Executions of VTA operators in this process since the last :func:`clear_run_log`."""
    return list(_RUN_LOG)


def clear_run_log() -> None:
    _RUN_LOG.clear()


def simulator_for(config: VTAConfig):
    """The process-wide functional simulator of ``config`` (SRAMs persist, like a device)."""
    from .sim import FunctionalSimulator

    if config.name not in _SIMULATORS:
        _SIMULATORS[config.name] = FunctionalSimulator(config)
    return _SIMULATORS[config.name]


class TemplateUnavailable(LookupError):
    """No template implements this operator (yet); the operator stays on the CPU."""


#: operator kind -> (template module, build function, workload class); see docs/templates-api.md
TEMPLATES = {
    "conv2d": ("conv2d", "build_conv2d", "Conv2dWorkload"),
    "group_conv2d": ("group_conv2d", "build_group_conv2d", "GroupConv2dWorkload"),
    "depthwise_conv2d": ("depthwise", "build_depthwise_conv2d", "DepthwiseConv2dWorkload"),
    "dense": ("dense", "build_dense", "DenseWorkload"),
    "max_pool2d": ("pool", "build_max_pool2d", "PoolWorkload"),
    "avg_pool2d": ("pool", "build_avg_pool2d", "PoolWorkload"),
    "add": ("eltwise", "build_add", "EltwiseWorkload"),
}


def _template(kind: str):
    import importlib

    if kind not in TEMPLATES:
        raise TemplateUnavailable(f"unknown VTA operator kind {kind!r}")
    module_name, build_name, workload_name = TEMPLATES[kind]
    try:
        module = importlib.import_module(f"vta_ext.templates.{module_name}")
        return getattr(module, build_name), getattr(module, workload_name)
    except (ImportError, AttributeError):
        raise TemplateUnavailable(f"no VTA template for {kind} yet (vta_ext.templates."
                                  f"{module_name}.{build_name})") from None


def _build(spec: dict, config: VTAConfig):
    build, workload_cls = _template(spec["op"])
    epilogue = tuple(tuple(stage) for stage in spec["epilogue"])
    return build(config, workload_cls(**spec["workload"]), epilogue)


def compiled_op(key: str, config: Optional[VTAConfig] = None):
    """The compiled operator for ``key``, built (and cached in this process) on first request."""
    op = _COMPILED.get(key)
    if op is None:
        spec = json.loads(key)
        cfg = config if config is not None and config.name == spec["config"] \
            else load_config(spec["config"])
        start = time.perf_counter()
        op = _build(spec, cfg)
        _COMPILED[key] = op
        logger.info("built VTA %s %s: %d instructions in %.2f s", spec["op"], spec["workload"],
                    op.program.insn_count, time.perf_counter() - start)
    return op


@tvm_ffi.register_global_func("vta_ext.run")
def _run(*args) -> None:
    """DPS entry: ``inputs..., key, out``; runs the prebuilt program on the simulator."""
    key, out = str(args[-2]), args[-1]
    op = compiled_op(key)
    spec = json.loads(key)
    inputs = [np.from_dlpack(t) for t in args[:-2]]
    start = time.perf_counter()
    result, stats = op.run(*inputs, simulator=simulator_for(op.program.config))
    np.from_dlpack(out)[...] = result
    _RUN_LOG.append(OpRun(spec["op"], spec["workload"], stats, time.perf_counter() - start, key))


def cycle_report(key: str):
    """Cycle-model timing of the compiled operator ``key`` (computed once, then cached)."""
    if key not in _CYCLES:
        from .sim.cycles import CycleModel

        op = compiled_op(key)
        _CYCLES[key] = CycleModel(op.program.config).run_program(op.program)
    return _CYCLES[key]
