"""vta_ext: the VTA accelerator re-created in Python, as a TVM 0.27 target.

Importing this package registers the ``ext_vta`` target tag and makes
``tvm.relax.build(mod, target="ext_vta")`` offload the supported quantised operators to VTA
(executed on the functional simulator); see :mod:`vta_ext.target`. Per-build choices (strategy,
knobs, tuned records) are made with :func:`build_options`::

    with vta_ext.build_options(strategy="stock", knobs="fallback"):
        executable = tvm.relax.build(mod, target="ext_vta")
    print(vta_ext.last_build_report())
"""
from .config import ConfigError, VTAConfig, available_configs, load_config
from .errors import TemplateRefusal, VTABuildError
from .isa import AluOp, MemType, Opcode, Stage, disassemble
from .runtime import CommandQueue, MissingExtensionError, Program, UopKernel
from .sim import FunctionalSimulator, SimStats
from .report import BuildReport, last_build_report
from .strategy import (KnobSpace, OpTemplate, Strategy, register_strategy, register_template,
                       registered_strategies)
from .options import build_options
from .host import PYNQ_Z1, HostModel
from .plugins import available_strategies
from .target import TARGET_TAG, install_pipeline_hook, register_target, vta_target
from .quantize import QuantizationError, quantize_relax, quantize_torch
from .device import DeviceError, open_device, run_on
from . import executor as _executor  # registers the "vta_ext.run" packed function
from .trace import export_trace
from . import stock as _stock  # registers the stock strategy's templates  # noqa: F401

register_target()
install_pipeline_hook()

run_log = _executor.run_log
clear_run_log = _executor.clear_run_log

__all__ = [
    # configuration and target
    "VTAConfig", "ConfigError", "load_config", "available_configs", "TARGET_TAG", "vta_target",
    # building for VTA
    "build_options", "HostModel", "PYNQ_Z1", "last_build_report", "BuildReport", "TemplateRefusal", "VTABuildError",
    "Strategy", "OpTemplate", "KnobSpace", "register_strategy", "register_template", "registered_strategies",
    "available_strategies",
    # quantisation
    "quantize_torch", "quantize_relax", "QuantizationError",
    # running
    "run_log", "clear_run_log", "export_trace", "FunctionalSimulator", "SimStats",
    # devices with the original driver ABI (vta_ext.device)
    "open_device", "run_on", "DeviceError",
    # the accelerator itself
    "CommandQueue", "UopKernel", "Program", "MissingExtensionError",
    "Opcode", "MemType", "AluOp", "Stage", "disassemble",
]
