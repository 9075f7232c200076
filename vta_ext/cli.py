"""The ``vta-ext`` command line (``python -m vta_ext``), in the role tvmc had for the original
stack.

Subcommands (each with ``--help``)::

    vta-ext compile MODEL -o OUT.so [--config NAME|PATH.json] [--strategy S] [--records FILE]
                                    [--calibration X.npy] [--report REPORT.json]
    vta-ext run OUT.so --inputs X.npy [...] [--output Y.npy] [--repeat N] [--trace T.json]
                       [--device LIB.so [--mem-latency N]]
    vta-ext tune MODEL --records FILE [--trials N] [--parallel K] [--config ...] [--strategy S]
                                      [--device LIB.so]
    vta-ext report OUT.so|REPORT.json

``MODEL`` is a float or QDQ ``.onnx`` file, or a ``.pt2`` archive of ``torch.export.save`` (a
float model, or one converted by PT2E). Everything here is the Python API, called as the README
shows: :func:`vta_ext.quantize.quantize_onnx` / :func:`~vta_ext.quantize.quantize_pt2e` /
:func:`~vta_ext.quantize.quantize_relax`, ``tvm.relax.build(mod, target=vta_ext.vta_target(...))``
inside :func:`vta_ext.build_options`, ``executable.export_library``, ``relax.VirtualMachine``, and
the tuner plugin's API (:func:`vta_ext.plugins.tuner_plugin`, e.g. :mod:`tvm_csp_embed.tune`). The
installed strategy plugins are loaded (:func:`vta_ext.plugins.load_strategy_plugins`), so with
``tvm_csp_embed`` installed the default strategy is the Python API's after ``import tvm_csp_embed``
(``csp-relaxed``).

An error ends the command with exit status 1 and one line on stderr naming the file, input,
preset or option at fault and what to do; ``--debug`` shows the traceback instead. See
``docs/cli.md``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import statistics
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["main", "build_parser", "CliError", "ModelFile", "read_model", "read_calibration",
           "load_calibration", "report_to_json", "report_path_for"]

PROG = "vta-ext"
#: version of the report file written by ``compile`` (the ``vta_ext_report`` key)
REPORT_FORMAT = 1
#: seed of the random calibration input used when ``--calibration`` is not given
RANDOM_CALIBRATION_SEED = 0


class CliError(Exception):
    """A user error: the message names the thing at fault and what to do, on one line."""


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


# ------------------------------------------------------------------------------ files
def _existing_file(path: str, what: str, hint: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise CliError(f"{what} {path}: no such file; {hint}")
    return p


def _load_npy(path: str, what: str, hint: str) -> np.ndarray:
    """A ``.npy`` array (no pickles)."""
    p = _existing_file(path, what, hint)
    try:
        array = np.load(p, allow_pickle=False)
    except Exception as err:  # noqa: BLE001 - numpy raises several types for a bad file
        raise CliError(f"{what} {path}: not a .npy array ({type(err).__name__}: "
                       f"{_first_line(err)}); save it with numpy.save") from err
    if not isinstance(array, np.ndarray):
        raise CliError(f"{what} {path}: an .npz archive, not a .npy array; save one array per "
                       "file with numpy.save")
    return array


@dataclasses.dataclass
class ModelFile:
    """A model file read by :func:`read_model`, before quantisation.

    Attributes
    ----------
    path : Path
        The file.
    format : str
        ``"onnx"`` or ``"pt2"``.
    quantized : bool
        Whether the graph is already quantised (ONNX QDQ, or a PT2E ``convert_pt2e`` export).
    input_name : str
        Name of its one input.
    input_shape : tuple
        Input shape; ``None`` for a dynamic dimension.
    model : object
        The ``onnx.ModelProto`` or the ``torch.export.ExportedProgram``.
    """

    path: Path
    format: str
    quantized: bool
    input_name: str
    input_shape: Tuple[Optional[int], ...]
    model: Any

    @property
    def kind(self) -> str:
        """What the model is, in words (for messages)."""
        if self.format == "onnx":
            return "ONNX QDQ model" if self.quantized else "float ONNX model"
        return "PT2E-quantised .pt2" if self.quantized else "float .pt2"

    def shape_text(self) -> str:
        return "(" + ", ".join("?" if d is None else str(d) for d in self.input_shape) + ")"

    def fits(self, shape: Sequence[int]) -> bool:
        """Whether an input of ``shape`` fits the model's input shape."""
        return len(shape) == len(self.input_shape) and all(
            d is None or d == s for d, s in zip(self.input_shape, shape))

    def quantize(self, calibration: List[np.ndarray]):
        """The :class:`vta_ext.quantize.QuantizedModel`, through the Python API's functions."""
        from .quantize import (import_exported_program, quantize_onnx, quantize_pt2e,
                               quantize_relax)

        if self.format == "onnx":
            return quantize_onnx(self.model, calibration)
        if self.quantized:
            return quantize_pt2e(self.model.module(), calibration)
        # a float ExportedProgram has no nn.Module left to fold BatchNorm in (quantize_torch);
        # quantize_relax folds it in Relax
        return quantize_relax(import_exported_program(self.model), calibration)


MODEL_HINT = "give a float or QDQ .onnx file, or a .pt2 file from torch.export.save"


def _register_pt2e_operators() -> None:
    """Register PyTorch's ``quantized_decomposed`` operators, which a PT2E ``.pt2`` holds."""
    try:
        import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers the operators
    except ImportError:
        import torchao.quantization.pt2e  # noqa: F401 - the same operators, from torchao


def read_model(path: str) -> ModelFile:
    """Open a ``.onnx`` or ``.pt2`` model file and find its input.

    Parameters
    ----------
    path : str
        The model file.

    Returns
    -------
    ModelFile

    Raises
    ------
    CliError
        For a missing or unreadable file, an unknown format, or a model with other than one
        float32 input.
    """
    p = _existing_file(path, "model", MODEL_HINT)
    suffix = p.suffix.lower()
    if suffix == ".onnx":
        return _read_onnx(p)
    if suffix == ".pt2":
        return _read_pt2(p)
    raise CliError(f"model {path}: unknown format {p.suffix or '(no suffix)'!r}; {MODEL_HINT}")


def _read_onnx(p: Path) -> ModelFile:
    try:
        import onnx
    except ImportError as err:
        raise CliError(f"model {p}: reading ONNX needs the onnx package; install the project "
                       "with its onnx extra (pip install -e '.[onnx]')") from err
    try:
        model = onnx.load(str(p))
    except Exception as err:  # noqa: BLE001 - protobuf raises DecodeError and others
        raise CliError(f"model {p}: not a readable ONNX model ({type(err).__name__}: "
                       f"{_first_line(err)}); {MODEL_HINT}") from err
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise CliError(f"model {p}: {len(inputs)} inputs ({[i.name for i in inputs]}); vta-ext "
                       "compiles models with one input tensor")
    tensor = inputs[0].type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type) if tensor.elem_type else None
    if dtype != np.float32:
        raise CliError(f"model {p}: input {inputs[0].name!r} is {dtype}, not float32; export the "
                       "model with a float32 input (quantised models take float32 too)")
    shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
    quantized = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    return ModelFile(p, "onnx", quantized, inputs[0].name, shape, model)


def _read_pt2(p: Path) -> ModelFile:
    import torch

    if not zipfile.is_zipfile(p):
        raise CliError(f"model {p}: not a .pt2 archive (torch.export.save writes a zip archive); "
                       f"{MODEL_HINT}")
    _register_pt2e_operators()
    # torch.export.load logs the real error (with a traceback) and raises a generic one: keep
    # the log's last line for the message instead of printing it
    log = logging.getLogger("torch.export")
    captured: List[BaseException] = []
    handler = logging.Handler()
    handler.emit = lambda record: captured.extend([record.exc_info[1]] if record.exc_info else [])
    saved = log.handlers[:], log.propagate
    log.handlers[:], log.propagate = [handler], False
    try:
        program = torch.export.load(str(p))
    except Exception as err:  # noqa: BLE001 - torch raises several types for a bad archive
        cause = captured[-1] if captured else err
        raise CliError(f"model {p}: torch.export.load cannot read it ({type(cause).__name__}: "
                       f"{_first_line(cause)}); save the model with "
                       "torch.export.save(torch.export.export(model, (x,)), path)") from err
    finally:
        log.handlers[:], log.propagate = saved
    names = list(program.graph_signature.user_inputs)
    if len(names) != 1:
        raise CliError(f"model {p}: {len(names)} inputs ({names}); vta-ext compiles models with "
                       "one input tensor")
    node = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == names[0])
    value = node.meta.get("val")
    if value is None or not hasattr(value, "shape"):
        raise CliError(f"model {p}: input {names[0]!r} is not a tensor; vta-ext compiles models "
                       "with one tensor input")
    if value.dtype != torch.float32:
        raise CliError(f"model {p}: input {names[0]!r} is {value.dtype}, not float32; export "
                       "the model with a float32 input")
    shape = tuple(d if isinstance(d, int) else None for d in value.shape)
    quantized = any(n.op == "call_function" and str(n.target).startswith("quantized_decomposed.")
                    for n in program.graph.nodes)
    return ModelFile(p, "pt2", quantized, names[0], shape, program)


CALIBRATION_HINT = ("give a .npy of real inputs (numpy.save), or leave out --calibration to "
                    "calibrate on a random input")


def read_calibration(path: Optional[str]) -> Optional[np.ndarray]:
    """The array of a ``--calibration`` file (None without one).

    Raises
    ------
    CliError
        For a missing file or one that is not a ``.npy`` array.
    """
    return None if path is None else _load_npy(path, "calibration file", CALIBRATION_HINT)


def load_calibration(model: ModelFile, path: Optional[str],
                     array: Optional[np.ndarray] = None) -> List[np.ndarray]:
    """The calibration inputs of ``model``: from the ``.npy`` file ``path``, or one random input.

    The file holds one input of the model's input shape, or a stack of them (``(K, *shape)``, or
    ``(K, C, H, W)`` for a batch-1 model). Without a file, one standard-normal input (seed 0) is
    used, with a warning: scales calibrated on it will not fit real data.

    Parameters
    ----------
    model : ModelFile
        The model (:func:`read_model`).
    path : str, optional
        The ``.npy`` file; None for a random input.
    array : numpy.ndarray, optional
        The file's array if already read (:func:`read_calibration`).

    Raises
    ------
    CliError
        For a missing or unreadable file, an array that does not fit the input shape, or a
        dynamic input shape without a calibration file.
    """
    if path is None:
        if any(d is None for d in model.input_shape):
            raise CliError(f"model {model.path}: input {model.input_name!r} has a dynamic shape "
                           f"{model.shape_text()}; give --calibration X.npy with inputs of the "
                           "shape to compile for")
        if model.quantized:
            _warn(f"no --calibration: the {model.kind} keeps its own scales; a random input of "
                  f"shape {model.shape_text()} calibrates only the tensors the graph left "
                  "unquantised (if any)")
        else:
            _warn(f"no --calibration: the {model.kind} is calibrated on one random "
                  f"standard-normal input of shape {model.shape_text()}, so its scales will not "
                  "fit real data; give --calibration X.npy with real inputs")
        rng = np.random.default_rng(RANDOM_CALIBRATION_SEED)
        return [rng.standard_normal(model.input_shape).astype(np.float32)]
    if array is None:
        array = read_calibration(path)
    if not np.issubdtype(array.dtype, np.floating):
        raise CliError(f"calibration file {path}: dtype {array.dtype}; the model's input is "
                       "float32: save float inputs")
    array = array.astype(np.float32)
    shape = model.input_shape
    if model.fits(array.shape):
        return [array]
    if array.ndim == len(shape) + 1 and model.fits(array.shape[1:]):
        return list(array)
    if shape and shape[0] == 1 and array.ndim == len(shape) and model.fits((1,) + array.shape[1:]):
        return [array[i:i + 1] for i in range(array.shape[0])]
    raise CliError(f"calibration file {path}: shape {tuple(array.shape)} does not fit input "
                   f"{model.input_name!r} of shape {model.shape_text()}; give one input of that "
                   "shape or a stack of them (K, *shape)")


# ------------------------------------------------------------------------------ reports
def report_path_for(library: Path) -> Path:
    """Where ``compile`` writes the report of ``library`` unless ``--report`` says otherwise:
    beside it, ``net.so`` -> ``net.report.json``."""
    return Path(library).with_suffix(".report.json")


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def report_to_json(report, **extra: Any) -> Dict[str, Any]:
    """A :class:`vta_ext.BuildReport` as a JSON-able dict: the report's own export
    (``build_report``: :meth:`~vta_ext.BuildReport.to_json`, every placement with device,
    operator, reason, detail, variable, source layer, cycles and padding, the summary figures and
    the timings), its summary line and text, and ``extra`` (what ``compile`` adds: model, library,
    configuration, input, ...)."""
    return {"vta_ext_report": REPORT_FORMAT, **_jsonable(extra),
            "build_report": json.loads(report.to_json()), "summary": report.summary(),
            "host_relayouts": report.host_relayouts, "text": str(report)}


# ------------------------------------------------------------------------------ commands
def _tuner():
    """The tuner API of the installed tuner plugin (:func:`vta_ext.plugins.tuner_plugin`)."""
    from .plugins import MissingPluginError, tuner_plugin

    try:
        return tuner_plugin()
    except MissingPluginError as err:
        raise CliError(str(err)) from err


def _setup(config: str, strategy: Optional[str]):
    """Load the strategy plugins (e.g. the CSP strategies, which make csp-relaxed the default, as
    in the Python API) and validate the configuration and the strategy before any slow work:
    ``(target, config)``."""
    from . import build_options
    from .plugins import load_strategy_plugins
    from .target import config_of_target, vta_target

    load_strategy_plugins()
    target = vta_target(config)
    build_options(strategy=strategy)  # an unknown strategy: the error lists the registered ones
    return target, config_of_target(target)


def cmd_compile(args) -> int:
    """``vta-ext compile``."""
    out = Path(args.output)
    if out.suffix != ".so":
        raise CliError(f"-o {args.output}: the library must be a .so file (e.g. -o net.so)")
    report_path = Path(args.report) if args.report else report_path_for(out)
    model = read_model(args.model)
    calibration_file = args.calibration
    calibration_array = read_calibration(calibration_file)
    if args.records is not None:
        _existing_file(args.records, "records file", "tune first with vta-ext tune MODEL "
                       "--records FILE, or check the path")
    target, config = _setup(args.config, args.strategy)
    import tvm

    from . import build_options, last_build_report

    records = _tuner().apply_history_best(args.records) if args.records else None
    calibration = load_calibration(model, calibration_file, calibration_array)
    start = time.perf_counter()
    qm = model.quantize(calibration)
    with build_options(strategy=args.strategy, records=records):
        executable = tvm.relax.build(qm.mod, target=target)
    seconds = time.perf_counter() - start
    report = last_build_report()
    out.parent.mkdir(parents=True, exist_ok=True)
    executable.export_library(str(out))
    data = report_to_json(
        report, model=str(model.path.resolve()), model_kind=model.kind, library=str(out.resolve()),
        input={"name": model.input_name, "shape": list(calibration[0].shape), "dtype": "float32"},
        config={"name": config.name, "value": config.to_dict()}, strategy=report.strategy,
        records=str(Path(args.records).resolve()) if args.records else None,
        calibration=(str(Path(calibration_file).resolve()) if calibration_file
                     else f"random (seed {RANDOM_CALIBRATION_SEED})"),
        cpu_float_ops=[str(op) for op in qm.cpu_float_ops], build_seconds=round(seconds, 2))
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(data, indent=1) + "\n")
    print(report)
    if qm.cpu_float_ops:
        print(qm.cpu_float_table())
    print(f"compiled {model.path} ({model.kind}, input {model.input_name} "
          f"{tuple(calibration[0].shape)}) for {config.name!r} in {seconds:.1f} s: wrote {out} "
          f"and {report_path}")
    return 0


_PARAM_CHECK = re.compile(r"ErrorContext\(fn=\w+, loc=param\[(\d+)\], param=(\w+), "
                          r"annotation=(.+?\))\)")


def _efficiency_text(library: Path, calls, cycles: int) -> str:
    """``"; floor 1,234 cycles, efficiency 0.81"`` for the VTA ``calls`` of a run of ``library``
    (the floors from the report beside it, :mod:`vta_ext.floor`), or why there is none."""
    if not calls:
        return ""
    path = report_path_for(library)
    try:
        build = json.loads(path.read_text())["build_report"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"; efficiency unknown: no report {path.name} beside the library (vta-ext compile " \
               "writes it)"
    floors = {build["vta_keys"][p["call"]]: p.get("floor") for p in build["placements"]
              if p.get("call") is not None}
    known = [floors.get(c.key) for c in calls]
    if any(f is None for f in known):
        return f"; efficiency unknown: {path.name} has no floor for every call (compile again)"
    floor = sum(known)
    return f"; floor {floor:,.0f} cycles, efficiency {floor / cycles:.2f}"


def _open_device(args):
    """The device of ``--device``/``--mem-latency`` (None: the built-in simulator)."""
    if args.device is None:
        if args.mem_latency is not None:
            raise CliError(f"--mem-latency {args.mem_latency}: give it with --device LIB (a "
                           "library that models memory latency, the vta-hw RTL)")
        return None
    from .device import open_device

    return open_device(_existing_file(args.device, "device library",
                                      "give a shared library with the VTA driver ABI (see "
                                      "docs/devices.md)"), mem_latency=args.mem_latency)


def _running_on(device):
    from contextlib import nullcontext

    from .device import run_on

    return nullcontext() if device is None else run_on(device)


def _print_device_cycles(device, calls) -> None:
    """Per call, the cycle model's cycles beside the device's; then the device's total."""
    if not device.reports_cycles:
        print(f"device {device.name}: {len(calls)} call(s) ran there; it reports no cycles")
        return
    print(f"{'call':>4}  {'operator':<10} {'model cycles':>12} {'device cycles':>13}")
    for i, call in enumerate(calls):
        print(f"{i:>4}  {call.op:<10} {call.cycles.total_cycles:>12,} {call.device_cycles:>13,}")
    total = sum(c.device_cycles for c in calls)
    print(f"device {device.name}: {total:,} cycles (the device's own count, one inference)")


def cmd_run(args) -> int:
    """``vta-ext run``."""
    library = _existing_file(args.library, "library", "build one with vta-ext compile MODEL "
                             "-o OUT.so")
    arrays = [_load_npy(p, "input file", "save each input with numpy.save") for p in args.inputs]
    if args.repeat < 1:
        raise CliError(f"--repeat {args.repeat}: give a number of runs >= 1")
    if args.output is not None and Path(args.output).suffix not in (".npy", ".npz"):
        raise CliError(f"--output {args.output}: give a .npy file (or .npz for several outputs)")
    if args.trace is not None and Path(args.trace).suffix != ".json":
        raise CliError(f"--trace {args.trace}: give a .json file (e.g. --trace trace.json)")
    import tvm
    from tvm import relax

    from . import clear_run_log, run_log
    from .plugins import load_strategy_plugins

    load_strategy_plugins()  # the templates of the library's operators (e.g. the CSP ones)

    try:
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())
    except Exception as err:  # noqa: BLE001 - TVM raises several types for a bad library
        raise CliError(f"library {library}: not a Relax library that TVM can load "
                       f"({type(err).__name__}: {_first_line(err)}); build one with vta-ext "
                       "compile MODEL -o OUT.so") from err
    arity = vm._get_function_arity("main")
    names = [vm._get_function_param_name("main", i) for i in range(arity)]
    if len(arrays) != arity:
        raise CliError(f"--inputs: {len(arrays)} file(s) given, but {library.name} takes {arity} "
                       f"input(s) ({', '.join(names)}); give one .npy per input, in that order")
    tensors = [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays]
    device = _open_device(args)
    times: List[float] = []
    calls = []
    for i in range(args.repeat):
        if i == 0:
            clear_run_log()
        start = time.perf_counter()
        try:
            with _running_on(device):
                result = vm["main"](*tensors)
        except Exception as err:  # noqa: BLE001 - the VM's own check of the arguments
            found = _PARAM_CHECK.search(str(err))
            if found is None:
                raise
            index = int(found.group(1))
            got = arrays[index]
            raise CliError(f"input file {args.inputs[index]}: shape {tuple(got.shape)} "
                           f"{got.dtype}, but input {found.group(2)!r} of {library.name} is "
                           f"{found.group(3)}; give an array of that shape and dtype") from err
        times.append(time.perf_counter() - start)
        if i == 0:
            calls = run_log()
            first = result
    outputs = _numpy_outputs(first)
    for i, out in enumerate(outputs):
        print(f"output {i}: shape {tuple(out.shape)} {out.dtype}")
    cycles = sum(c.cycles.total_cycles for c in calls)
    print(f"VTA: {len(calls)} operator call(s), {cycles:,} cycles (cycle model, one inference)"
          f"{_efficiency_text(library, calls, cycles)}")
    if device is not None:
        _print_device_cycles(device, calls)
    ms = [t * 1e3 for t in times]
    if len(ms) == 1:
        print(f"wall time: {ms[0]:.1f} ms (one run; the first run in a process also builds the "
              "VTA programs from the library: use --repeat N for steady-state times)")
    else:
        print(f"wall time over {len(ms)} runs: min {min(ms):.1f} ms, median "
              f"{statistics.median(ms):.1f} ms (first run {ms[0]:.1f} ms: it also builds the VTA "
              "programs from the library)")
    if args.output is not None:
        path = Path(args.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".npz":
            np.savez(path, *outputs)
        elif len(outputs) != 1:
            raise CliError(f"--output {args.output}: the model has {len(outputs)} outputs; give "
                           "a .npz file to save them all")
        else:
            np.save(path, outputs[0])
        print(f"wrote {path}")
    if args.trace is not None and calls:
        from .trace import export_trace

        print(f"wrote {export_trace(args.trace, calls)} (the first run's {len(calls)} VTA call(s); "
              "open it in https://ui.perfetto.dev or chrome://tracing)")
    elif args.trace is not None:
        _warn(f"--trace {args.trace}: not written, the model made no VTA call")
    return 0


def _numpy_outputs(result) -> List[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    outputs: List[np.ndarray] = []
    for item in result:
        outputs.extend(_numpy_outputs(item))
    return outputs


TUNERS = ("xgb", "random", "grid")


def cmd_tune(args) -> int:
    """``vta-ext tune``."""
    model = read_model(args.model)
    calibration_array = read_calibration(args.calibration)
    if args.trials < 1 or args.parallel < 0:
        raise CliError(f"--trials {args.trials} / --parallel {args.parallel}: give trials >= 1 "
                       "and parallel >= 0 (0: measure in this process)")
    target, config = _setup(args.config, args.strategy)
    tune = _tuner()

    calibration = load_calibration(model, args.calibration, calibration_array)
    qm = model.quantize(calibration)
    tasks = tune.extract_tasks(qm.mod, target=target, strategy=args.strategy)
    if not tasks:
        print(f"nothing to tune: {model.path} has no VTA operator with tunable knobs on "
              f"{config.name!r}")
        return 0
    print(f"{len(tasks)} task(s) of {model.path} on {config.name!r}, {args.trials} trial(s) "
          f"each, {args.parallel or 'no'} worker process(es); records -> {args.records}"
          f"{'' if args.device is None else f'; cycles measured on {args.device}'}")
    tuner_class = {"xgb": tune.XGBTuner, "random": tune.RandomTuner,
                   "grid": tune.GridSearchTuner}[args.tuner]
    runner = tune.LocalRunner(args.parallel, device=args.device)
    option = tune.measure_option(runner=runner)
    rows = []
    try:
        for i, task in enumerate(tasks):
            tuner = tuner_class(task, seed=args.seed)
            best = tuner.tune(args.trials, option, callbacks=[
                tune.callback.progress_bar(args.trials,
                                           prefix=f"[{i + 1}/{len(tasks)}] {task.name}"),
                tune.callback.log_to_file(args.records)])
            rows.append((task.name, len(tuner.visited), best))
    finally:
        runner.close()
    print(f"\n{'task':<56} {'trials':>6} {'best cycles':>12}  knobs")
    for name, trials, best in rows:
        cycles = f"{best.cycles:,}" if best is not None else "-"
        knobs = best.knobs if best is not None else "no verified point"
        print(f"{name[:56]:<56} {trials:>6} {cycles:>12}  {knobs}")
    config_arg = "" if args.config == "default" else f" --config {args.config}"
    strategy_arg = "" if args.strategy is None else f" --strategy {args.strategy}"
    calibration_arg = "" if args.calibration is None else f" --calibration {args.calibration}"
    print(f"\nbuild with the records: {PROG} compile {args.model} -o OUT.so --records "
          f"{args.records}{config_arg}{strategy_arg}{calibration_arg}")
    return 0


def cmd_report(args) -> int:
    """``vta-ext report``."""
    path = Path(args.path)
    if path.suffix == ".so":
        _existing_file(args.path, "library", "give a library built by vta-ext compile or its "
                       "REPORT.json")
        report = report_path_for(path)
        if not report.is_file():
            raise CliError(f"report of {path}: no {report.name} beside it; vta-ext compile "
                           "writes it there unless --report named another file: give that file")
        path = report
    path = _existing_file(str(path), "report", "give a library built by vta-ext compile or its "
                          "REPORT.json")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CliError(f"report {path}: not JSON ({_first_line(err)}); give the REPORT.json "
                       "that vta-ext compile wrote") from err
    if not isinstance(data, dict) or "vta_ext_report" not in data:
        raise CliError(f"report {path}: not a report of vta-ext compile (no 'vta_ext_report' "
                       "key); give the REPORT.json that vta-ext compile wrote")
    print(f"model {data.get('model')} ({data.get('model_kind')}), input "
          f"{data.get('input', {}).get('name')} {tuple(data.get('input', {}).get('shape', ()))}")
    print(f"library {data.get('library')}, configuration {data.get('config', {}).get('name')!r}, "
          f"strategy {data.get('strategy')}, records {data.get('records')}, calibration "
          f"{data.get('calibration')}")
    print(data["text"])
    for line in data.get("cpu_float_ops", []):
        print(f"  CPU float32: {line}")
    return 0


# ------------------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``vta-ext`` (one subparser per command)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Compile, run, tune and inspect models for the VTA accelerator "
        "(TVM 0.27, the ext_vta target; VTA runs on the functional simulator).",
        epilog="See docs/cli.md. Each command has --help.")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error instead of one line")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log at INFO level (vta_ext and its plugins)")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error instead of one line")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def build_choices(p):
        p.add_argument("--config", default="default", metavar="NAME|PATH.json",
                       help="VTA configuration: a preset (default, pipelined, 2x16x16, 1x32x32, "
                       "...) or a JSON file (default: %(default)s)")
        p.add_argument("--strategy", default=None, metavar="S",
                       help="strategy: stock, csp-strict or csp-relaxed (default: csp-relaxed, "
                       "as in the Python API)")
        p.add_argument("--calibration", default=None, metavar="X.npy",
                       help="calibration input(s) of a float model: one input, or a stack "
                       "(K, *shape) (default: one random input, with a warning)")

    p = sub.add_parser("compile", parents=[common], help="compile a model to a library",
                       description="Quantise MODEL (a float or QDQ .onnx, or a .pt2 from "
                       "torch.export.save, float or PT2E) to int8, build it for ext_vta and "
                       "export the library, with its build report beside it.")
    p.add_argument("model", metavar="MODEL", help="the .onnx or .pt2 file")
    p.add_argument("-o", "--output", required=True, metavar="OUT.so", help="the library to write")
    build_choices(p)
    p.add_argument("--records", default=None, metavar="FILE",
                   help="tuned records (vta-ext tune) to apply")
    p.add_argument("--report", default=None, metavar="REPORT.json",
                   help="where to write the build report (default: OUT.report.json beside OUT.so)")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", parents=[common], help="run a compiled library",
                       description="Run a library built by vta-ext compile on .npy inputs (VTA "
                       "operators on the functional simulator); print the output shapes, the "
                       "VTA cycles of one inference and the wall time.")
    p.add_argument("library", metavar="OUT.so", help="the library")
    p.add_argument("--inputs", nargs="+", required=True, metavar="X.npy",
                   help="one .npy per model input, in order")
    p.add_argument("--output", default=None, metavar="Y.npy",
                   help="save the output here (.npz for several outputs)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="runs to time; min and median are printed (default: %(default)s)")
    p.add_argument("--device", default=None, metavar="LIB.so",
                   help="run the VTA operators on this library with the VTA driver ABI (a "
                   "board's libvta.so, vta-hw's libvta_rtl.so or libvta_fsim.so) instead of the "
                   "built-in simulator; its cycles are printed beside the model's")
    p.add_argument("--mem-latency", type=int, default=None, metavar="N",
                   help="with --device: memory latency in cycles (the vta-hw RTL)")
    p.add_argument("--trace", default=None, metavar="T.json",
                   help="write the first run's VTA calls as a Chrome trace (cycle model; open in "
                   "ui.perfetto.dev or chrome://tracing)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("tune", parents=[common], help="tune a model's VTA operators",
                       description="Tune every VTA operator (task) of MODEL with tuned records "
                       "appended to FILE (a restarted run skips what is measured); build with "
                       "them by vta-ext compile --records FILE.")
    p.add_argument("model", metavar="MODEL", help="the .onnx or .pt2 file")
    p.add_argument("--records", required=True, metavar="FILE",
                   help="records file (JSON lines, appended)")
    p.add_argument("--trials", type=int, default=32, metavar="N",
                   help="measurements per task (default: %(default)s)")
    p.add_argument("--parallel", type=int, default=1, metavar="K",
                   help="measurement worker processes; 0: in this process (default: %(default)s)")
    p.add_argument("--tuner", choices=TUNERS, default="xgb", help="search (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the tuner (default: %(default)s)")
    p.add_argument("--device", default=None, metavar="LIB.so",
                   help="measure the cycles on this library (the vta-hw RTL) instead of the "
                   "cycle model, and verify the best point there; keep its records in their own "
                   "file")
    build_choices(p)
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("report", parents=[common], help="print the build report of a library",
                       description="Print the build report that vta-ext compile wrote: which "
                       "operators run on VTA and which on the CPU, and why.")
    p.add_argument("path", metavar="OUT.so|REPORT.json",
                   help="a library built by vta-ext compile (its OUT.report.json is read) or "
                   "a report file")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``vta-ext`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Returns
    -------
    int
        0 on success, 1 for an error (one line on stderr, or the traceback with ``--debug``),
        2 for a usage error, 130 when interrupted.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - every error becomes one line unless --debug
        if args.debug:
            raise
        if isinstance(err, CliError):
            message = str(err)
        else:
            message = (f"{type(err).__name__}: {_first_line(err)} (--debug shows the "
                       "traceback)")
        print(f"{PROG} {args.command}: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
