"""Evaluating one configuration: the offload pass's own plans, timed by the cycle model.

:func:`evaluate_config` runs the ``ext_vta`` offload pass (:func:`vta_ext.offload.OffloadToVTA`) on
the module for one configuration under one strategy, which plans and compiles every matched
operator exactly as ``relax.build(mod, target=vta_ext.vta_target(config))`` would, and reads its
build report: the cycle model's cycles of every VTA call (repeated layers share one compiled
program and one timing: :func:`vta_ext.executor.compiled_op`, :func:`~vta_ext.executor.cycle_report`;
the CSP strategy's embeddings and choices are cached on disk per workload and configuration
value), DRAM bytes, and the operators left on the CPU with their MACs. The rest of ``relax.build``
(legalisation, host code generation) is skipped: it does not change the VTA programs.

It is a module-level function of picklable arguments (the module travels as a file written once,
read once per worker process), so :class:`~tvm_csp_embed.tune.LocalRunner` workers and Dask
workers run it. It never raises: a failure is an evaluation with ``error`` set.

The caller's build options (``vta_ext.build_options(knobs=..., layout=..., objective=..., host=...,
records=tune.apply_history_best(...))`` around the search) travel with each evaluation as plain
data (:func:`options_payload`): a worker process, or a Dask worker thread, does not see the caller's
context, so each evaluation re-enters them around the offload pass.

:class:`Records` is the append-only JSON-lines store of evaluations, keyed by the module's
digest, the strategy, the build options (:func:`options_digest`) and the configuration's value: a
resumed search, or another search over the same module, strategy and options, evaluates a
configuration only once.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import traceback
from pathlib import Path
from dataclasses import asdict
from typing import Any, Dict, Iterator, Optional, Tuple, Union

from vta_ext.config import VTAConfig
from vta_ext.executor import config_digest

__all__ = ["Evaluation", "evaluate_config", "module_digest", "options_payload", "options_digest",
           "Records", "save_module"]

Evaluation = Dict[str, Any]
#: the build options of an evaluation as plain data (:func:`options_payload`)
Options = Dict[str, Any]

_MODULES: Dict[str, Any] = {}
_TUNED: Dict[Tuple[str, ...], Any] = {}
_LOCK = threading.Lock()


def module_digest(text: str) -> str:
    """The key of a module in the records: a hash of its serialised text (structure and
    constants)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def save_module(mod, directory: Union[str, Path]) -> Tuple[Path, str]:
    """Write ``mod`` once to ``directory`` as ``module-<digest>.json`` (what workers load);
    returns ``(path, digest)``."""
    import tvm

    text = tvm.ir.save_json(mod)
    digest = module_digest(text)
    path = Path(directory) / f"module-{digest}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(path)
    return path, digest


def _module(path: str):
    with _LOCK:
        if path not in _MODULES:
            import tvm

            _MODULES[path] = tvm.ir.load_json(Path(path).read_text())
        return _MODULES[path]


def options_payload(options=None) -> Options:
    """The build options an evaluation runs under, as plain (picklable, JSON) data.

    Parameters
    ----------
    options : vta_ext.BuildOptions, optional
        Default: the options in effect (:func:`vta_ext.options.current_options`). Their strategy is
        not part of it: each search names its own.

    Raises
    ------
    ValueError
        If the options carry tuned records other than ``tune.apply_history_best(...)`` (whose
        files each worker reads again).
    """
    from vta_ext.options import current_options

    from ..tune.records import ApplyHistoryBest

    opts = current_options() if options is None else options
    records = None
    if opts.records is not None:
        if not isinstance(opts.records, ApplyHistoryBest):
            raise ValueError(f"codesign: build_options(records={opts.records!r}) cannot travel to "
                             "the evaluations' workers; give tune.apply_history_best(paths)")
        records = [str(Path(p).resolve()) for p in opts.records.paths]
    return {"knobs": opts.knobs if isinstance(opts.knobs, str) else dict(opts.knobs),
            "layout": opts.layout, "objective": opts.objective, "host": asdict(opts.host),
            "records": records}


def options_digest(options: Options) -> str:
    """The key of build options in the records: a hash of :func:`options_payload`'s data and of
    the contents of its tuned-records files (edited records are other options)."""
    h = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode())
    for path in options.get("records") or ():
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


def _build_options(strategy: str, options: Optional[Options]):
    """``vta_ext.build_options`` of ``strategy`` and the payload ``options`` (None: defaults)."""
    import vta_ext

    if options is None:
        return vta_ext.build_options(strategy=strategy)
    records = None
    if options.get("records"):
        paths = tuple(options["records"])
        with _LOCK:
            if paths not in _TUNED:
                from ..tune.records import apply_history_best

                _TUNED[paths] = apply_history_best(list(paths))
            records = _TUNED[paths]
    return vta_ext.build_options(strategy=strategy, knobs=options["knobs"], records=records,
                                 layout=options["layout"], objective=options["objective"],
                                 host=dict(options["host"]))


def evaluate_config(module_path: str, config_value: Dict[str, Any], name: str, strategy: str,
                    options: Optional[Options] = None) -> Evaluation:
    """Plan, compile and time the module of ``module_path`` for one configuration.

    Parameters
    ----------
    module_path : str
        A module file of :func:`save_module`.
    config_value : dict
        The configuration's keys (:meth:`VTAConfig.to_dict`).
    name : str
        Its name (reports only).
    strategy : str
        The strategy that plans the operators (``"stock"``, ``"csp-relaxed"``, ...).
    options : dict, optional
        The other build options (:func:`options_payload` of the caller's); None: the defaults.

    Returns
    -------
    dict
        ``cycles`` (VTA cycles plus the host model's cycles of the MACs left on the CPU),
        ``vta_cycles``, ``dram_bytes``, ``vta_ops``, ``cpu_ops`` (the matched operators the
        strategy left on the CPU, with why), ``cpu_macs``, ``seconds``, ``error`` (None, or why
        the evaluation failed; then the figures are absent).
    """
    import vta_ext
    import tvm_csp_embed  # noqa: F401  (registers the CSP strategies in a fresh worker)
    from vta_ext.executor import cycle_report, release
    from vta_ext.offload import OffloadToVTA
    from vta_ext.report import LAYOUT_REASON

    start = time.perf_counter()
    quiet = logging.getLogger("vta_ext")  # the build's per-build padding warning, once per config
    level = quiet.level
    quiet.setLevel(max(level, logging.ERROR))
    config = None
    try:
        config = VTAConfig.from_dict(config_value, name=name)
        mod = _module(module_path)
        with _build_options(strategy, options):
            OffloadToVTA(config)(mod)
            report = vta_ext.last_build_report()
            vta_cycles = int(report.vta_cycles)
            dram = int(sum(sum(cycle_report(k).dram_bytes.values()) for k in report.vta_keys))
            cpu_cycles = report.host_model.cpu_cycles(report.cpu_macs)
        matched = {p.name for p in report.on_vta}
        cpu_ops = [f"{p.name}: {p.reason}" for p in report.on_cpu
                   if p.name and p.name not in matched and p.reason != LAYOUT_REASON
                   and p.op in ("relax.nn.conv2d", "relax.matmul", "relax.nn.conv1d")]
    except Exception as err:  # noqa: BLE001 -- recorded as an error evaluation, never on a front
        return {"error": f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=2)}",
                "seconds": time.perf_counter() - start}
    finally:
        quiet.setLevel(level)
        # a configuration is evaluated once: its programs would only fill the worker's memory (a
        # worker kept every configuration's candidates alive, and a DeepBench-thin search swapped)
        if config is not None:
            release(config)
    return {"cycles": vta_cycles + cpu_cycles, "vta_cycles": vta_cycles, "dram_bytes": dram,
            "vta_ops": len(report.vta_keys), "cpu_ops": cpu_ops, "cpu_macs": int(report.cpu_macs),
            "seconds": time.perf_counter() - start, "error": None}


class Records:
    """The append-only store of evaluations (JSON lines), keyed by module, strategy, build options
    (:func:`options_digest`) and the configuration's value.

    Each line is written and flushed as its evaluation arrives, so a killed search keeps every
    evaluation it had received; a line cut off by the kill is skipped on reading.

    Parameters
    ----------
    path : str or Path
        The file (created on the first evaluation).
    """

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)
        self._seen: Dict[tuple, Evaluation] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                    key = (entry["module"], entry["strategy"], entry["options"], entry["config"])
                    self._seen[key] = entry["result"]
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut off by a killed run (or without options: older format)

    @staticmethod
    def key(module: str, strategy: str, options: str, config: VTAConfig) -> tuple:
        """``(module digest, strategy, options digest, configuration digest)``."""
        return (module, strategy, options, config_digest(config))

    def get(self, module: str, strategy: str, options: str, config: VTAConfig
            ) -> Optional[Evaluation]:
        """The stored evaluation, or None."""
        return self._seen.get(self.key(module, strategy, options, config))

    def add(self, module: str, strategy: str, options: str, config: VTAConfig,
            result: Evaluation, options_value: Optional[Options] = None) -> None:
        """Append one evaluation (errors are not stored: a later run tries again)."""
        if result.get("error"):
            return
        key = self.key(module, strategy, options, config)
        self._seen[key] = result
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"module": module, "strategy": strategy, "options": options,
                           "options_value": options_value, "config": key[3],
                           "name": config.name, "config_value": config.to_dict(),
                           "result": result}, sort_keys=True)
        with open(self.path, "ab+") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():  # after a line cut off by a killed run, start a new line
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write((line + "\n").encode())
            f.flush()
            os.fsync(f.fileno())

    def __len__(self) -> int:
        return len(self._seen)

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._seen)

    def __repr__(self) -> str:
        return f"Records({str(self.path)!r}, {len(self)} evaluations)"


def default_records_path(module: str) -> Path:
    """``<embedding cache>/codesign/<module digest>.jsonl``."""
    from ..cache import cache_dir

    return cache_dir() / "codesign" / f"{module}.jsonl"
