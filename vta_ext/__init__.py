"""vta_ext: the VTA accelerator re-created in Python, as a TVM 0.27 target.

Importing this package registers the ``ext_vta`` target tag and makes
``tvm.relax.build(mod, target="ext_vta")`` offload the supported quantised operators to VTA
(executed on the functional simulator); see :mod:`vta_ext.target`.
"""
from .config import ConfigError, VTAConfig, available_configs, load_config
from .isa import AluOp, MemType, Opcode, Stage, disassemble
from .runtime import CommandQueue, MissingExtensionError, Program, UopKernel
from .report import BuildReport, last_build_report
from .target import TARGET_TAG, install_pipeline_hook, register_target, vta_target
from . import executor as _executor  # registers the "vta_ext.run" packed function

register_target()
install_pipeline_hook()

run_log = _executor.run_log
clear_run_log = _executor.clear_run_log

__all__ = [
    "VTAConfig", "ConfigError", "load_config", "available_configs",
    "Opcode", "MemType", "AluOp", "Stage", "disassemble",
    "CommandQueue", "UopKernel", "Program", "MissingExtensionError",
    "BuildReport", "last_build_report", "run_log", "clear_run_log",
    "TARGET_TAG", "register_target", "vta_target",
]
