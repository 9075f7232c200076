"""Tuning records: JSON lines, appendable and resumable, and :func:`apply_history_best`.

One line per measurement (:func:`record_line`)::

    {"format": "tvm_csp_embed.tune/1", "kind": "conv2d", "strategy": "stock",
     "config": "pipelined", "config_hash": "3f1c...", "workload": {...}, "epilogue": [...],
     "knobs": {...}, "cycles": 612345, "error": null, "verified": false, "dram_bytes": ...,
     "insns": ..., "build_seconds": ..., "timestamp": ...}

A record is keyed by ``(kind, strategy, config_hash, workload)``: ``config_hash`` is
:func:`vta_ext.executor.config_digest`, the hash of the configuration's *value*, so records of one
configuration never apply to another (even of the same name). The tuner appends a second line
with ``"verified": true`` for the best point of a task once it ran bit-exact on the functional
simulator; only verified records are used as best.

:class:`ApplyHistoryBest` also reads AutoTVM v0.2 lines of the original VTA templates
(:mod:`.autotvm_log`). A line that is neither (corrupt JSON, a foreign record) gets a warning naming
the file and the line, and the rest is used; a record whose knobs are no longer a valid point of
the template's knob space is skipped with the reason.
"""
from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from vta_ext.config import VTAConfig
from vta_ext.executor import config_digest

from .autotvm_log import is_autotvm_line, model_string, parse_autotvm_line
from .task import Task, record_key

__all__ = ["FORMAT", "Record", "RecordWarning", "record_line", "load_records", "ApplyHistoryBest",
           "apply_history_best"]

logger = logging.getLogger("tvm_csp_embed.tune")

#: the ``format`` value of our record lines
FORMAT = "tvm_csp_embed.tune/1"

PathLike = Union[str, "os.PathLike[str]"]


class RecordWarning(UserWarning):
    """A line of a records file that is skipped (the message names the file and the line)."""


def record_line(task: Task, result) -> str:
    """The JSON line of ``result`` (a :class:`~.measure.MeasureResult`) of ``task``."""
    values = {"format": FORMAT, "kind": task.kind, "strategy": task.strategy,
              "config": task.config.name, "config_hash": config_digest(task.config),
              "workload": task.workload_dict, "epilogue": [list(s) for s in task.epilogue]}
    values.update(result.to_dict())
    return json.dumps(values, sort_keys=False)


@dataclass(frozen=True)
class Record:
    """One usable line of a records file.

    Attributes
    ----------
    key : tuple
        ``(kind, strategy, config_hash, workload JSON)``; for an AutoTVM line ``config_hash`` is
        ``"autotvm:" + model string``.
    knobs : dict
        The knob point.
    cost : float or None
        Cycles (our records) or mean seconds (AutoTVM lines); None for an error result.
    verified : bool
        Our records: the point ran bit-exact on the functional simulator. AutoTVM lines: True
        (they were measured on the hardware).
    source : str
        ``"net.json:12"``: file and line.
    epilogue : tuple
        The epilogue the point was measured with (empty for AutoTVM lines).
    autotvm : str
        The original template name for an AutoTVM line, else ``""``.
    dram_bytes, insns : int
        Our records: DRAM bytes and instructions of the measured program (0 otherwise).
    """

    key: Tuple[str, str, str, str]
    knobs: Dict[str, Any]
    cost: Optional[float]
    verified: bool
    source: str
    epilogue: Tuple[tuple, ...] = ()
    autotvm: str = ""
    dram_bytes: int = 0
    insns: int = 0

    @property
    def kind(self) -> str:
        return self.key[0]

    @property
    def workload(self) -> Dict[str, Any]:
        return json.loads(self.key[3])

    def __repr__(self) -> str:
        cost = "error" if self.cost is None else f"{self.cost:g}"
        return f"Record({self.kind} {self.key[3]} {self.knobs} cost {cost} from {self.source})"


def _warn(message: str) -> None:
    warnings.warn(message, RecordWarning, stacklevel=3)
    logger.warning(message)


def load_records(path: PathLike, warn: bool = True) -> List[Record]:
    """The usable lines of a records file (ours and AutoTVM v0.2 lines of the VTA templates).

    Parameters
    ----------
    path : str or path
        The file.
    warn : bool
        Warn (:class:`RecordWarning`, and the log) for each skipped line, naming file and line.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"records file {str(path)!r} does not exist (tune first with "
                                "tune.callback.log_to_file(...), or check the path)")
    out: List[Record] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            where = f"{path}:{number}"
            try:
                record = _parse(json.loads(text), where)
            except (ValueError, KeyError, TypeError, IndexError) as err:
                if warn:
                    _warn(f"{where}: skipped: {type(err).__name__}: {err}")
                continue
            out.append(record)
    return out


def _workload_json(kind: str, strategy: str, workload: Dict[str, Any]) -> str:
    """The record key's workload text: the workload as its template reads it back
    (``workload_from_dict``, then ``dataclasses.asdict``), so that a record written before a
    workload field with a default was added (e.g. ``bias_lanes``) keys like a new one; the dict as
    written when no template of ``kind`` and ``strategy`` is registered or it cannot read it."""
    import dataclasses

    from vta_ext.errors import TemplateRefusal
    from vta_ext.strategy import get_template

    try:
        read = get_template(kind, strategy).workload_from_dict(dict(workload))
    except (TemplateRefusal, KeyError, TypeError, ValueError):
        read = None
    values = dataclasses.asdict(read) if dataclasses.is_dataclass(read) else workload
    return json.dumps(values, sort_keys=True)


def _parse(obj: Any, where: str) -> Record:
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        cycles = obj["cycles"] if obj.get("error") is None else None
        return Record((obj["kind"], obj["strategy"], obj["config_hash"],
                       _workload_json(obj["kind"], obj["strategy"], obj["workload"])),
                      dict(obj["knobs"]),
                      None if cycles is None else float(cycles), bool(obj.get("verified")), where,
                      tuple(tuple(s) for s in obj.get("epilogue", ())), "",
                      int(obj.get("dram_bytes") or 0), int(obj.get("insns") or 0))
    if is_autotvm_line(obj):
        rec = parse_autotvm_line(obj)
        return Record((rec.kind, "stock", f"autotvm:{rec.model}",
                       json.dumps(rec.workload, sort_keys=True)), rec.knobs, rec.cost, True,
                      where, (), rec.template)
    raise ValueError("neither a tvm_csp_embed.tune record (no \"format\": "
                     f"\"{FORMAT}\") nor an AutoTVM log line")


def measured_points(path: PathLike, task: Task) -> List[Record]:
    """Our records of ``task`` in ``path`` (empty if the file does not exist): what a restarted
    tuning job skips."""
    if not Path(path).is_file():
        return []
    return [r for r in load_records(path) if r.key == task.key and not r.autotvm]


class ApplyHistoryBest:
    """The best tuned record per workload, for ``relax.build`` (AutoTVM's ``apply_history_best``).

    Use it as a context manager around ``relax.build``: entering it enters
    ``vta_ext.build_options(records=self)`` with the strategy and knobs already in effect, so each
    operator with a record gets its best knobs and the build report says ``"tuned record from
    <file>:<line>"``. Or ask :meth:`best_knobs` directly.

    Parameters
    ----------
    records : path or list of paths
        Records files: our JSON lines and/or AutoTVM v0.2 logs of the VTA templates.

    Notes
    -----
    Best = the verified record of fewest cycles (ties: the earliest line). Our records take
    precedence over AutoTVM lines for the same workload; among AutoTVM lines the lowest mean
    measured time wins, as in AutoTVM. A best record whose knobs are not (or no longer) a valid
    point of the template's knob space is skipped with a warning giving the reason, and the next
    best is used.
    """

    def __init__(self, records: Union[PathLike, Sequence[PathLike]]) -> None:
        paths = [records] if isinstance(records, (str, os.PathLike)) else list(records)
        self.paths = [Path(p) for p in paths]
        self.records: List[Record] = []
        for path in self.paths:
            self.records.extend(load_records(path))
        self._by_key: Dict[tuple, List[Record]] = {}
        self._unverified: Dict[tuple, int] = {}
        for rec in self.records:
            if rec.cost is None:
                continue
            if not rec.verified:
                self._unverified[rec.key] = self._unverified.get(rec.key, 0) + 1
                continue
            self._by_key.setdefault(rec.key, []).append(rec)
        for recs in self._by_key.values():
            recs.sort(key=lambda r: (bool(r.autotvm), r.cost))
        self._decided: Dict[tuple, Optional[Tuple[Dict[str, Any], str]]] = {}
        self._options = []
        self.skipped: List[Tuple[Record, str]] = []

    def candidates(self, kind: str, strategy: str, workload: Any, config: VTAConfig
                   ) -> List[Record]:
        """The verified records that apply, best first (ours, then AutoTVM lines)."""
        key = record_key(kind, strategy, config, workload)
        out = list(self._by_key.get(key, []))
        if strategy == "stock":
            foreign = (kind, strategy, f"autotvm:{model_string(config)}", key[3])
            out += self._by_key.get(foreign, [])
        return out

    def best_knobs(self, kind: str, strategy: str, workload: Any, config: VTAConfig
                   ) -> Optional[Tuple[Dict[str, Any], str]]:
        """``(knobs, "tuned record from <file>:<line>")`` of the best valid record, or None.

        Parameters
        ----------
        kind, strategy : str
            Operator kind and strategy of the operator being built.
        workload : object
            Its workload (dataclass or dict).
        config : VTAConfig
            The configuration (matched by value).
        """
        key = record_key(kind, strategy, config, workload)
        if key in self._decided:
            return self._decided[key]
        found = None
        for rec in self.candidates(kind, strategy, workload, config):
            reason = self._invalid(rec, kind, strategy, workload, config)
            if reason is not None:
                self.skipped.append((rec, reason))
                _warn(f"{rec.source}: {kind} record skipped: knobs {rec.knobs} {reason}")
                continue
            origin = f"tuned record from {rec.source}"
            if rec.autotvm:
                origin += f" (AutoTVM {rec.autotvm})"
            found = (dict(rec.knobs), origin)
            break
        if found is None and self._unverified.get(key):
            logger.warning("%d measured but unverified record(s) of %s %s; rerun the tuner to "
                           "verify its best point", self._unverified[key], kind, key[3])
        self._decided[key] = found
        return found

    @staticmethod
    def _invalid(rec: Record, kind: str, strategy: str, workload: Any, config: VTAConfig
                 ) -> Optional[str]:
        """Why ``rec``'s knobs are not a valid point of the knob space (None if they are)."""
        from vta_ext.strategy import get_template

        template = get_template(kind, strategy)
        if isinstance(workload, dict):
            workload = template.workload_from_dict(workload)
        try:
            space = template.knob_space(config, workload, rec.epilogue)
        except Exception as err:
            return f"cannot be checked: {type(err).__name__}: {err}"
        if rec.knobs in space:
            return None
        for point, reason in space.pruned:
            if point == rec.knobs:
                return f"are pruned: {reason}"
        unknown = sorted(set(rec.knobs) - set(space.names))
        if unknown:
            return f"name knobs the template does not have: {', '.join(unknown)}"
        return "are not a point of the template's knob space"

    def __enter__(self) -> "ApplyHistoryBest":
        import dataclasses

        import vta_ext

        # every option in effect (strategy, knobs, layout, ...) stays; only the records change
        options = dataclasses.replace(vta_ext.options.current_options(), records=self)
        options.__enter__()
        self._options.append(options)
        return self

    def __exit__(self, *exc) -> None:
        self._options.pop().__exit__(*exc)

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        files = ", ".join(str(p) for p in self.paths)
        return (f"ApplyHistoryBest({files}: {len(self.records)} records, {len(self._by_key)} "
                f"workloads with a verified record)")


def apply_history_best(records: Union[PathLike, Sequence[PathLike]]) -> ApplyHistoryBest:
    """Apply the best tuned record per workload to ``relax.build`` (see :class:`ApplyHistoryBest`).

    .. code-block:: python

        with tune.apply_history_best("net.json"):
            ex = tvm.relax.build(mod, target="ext_vta")

    Raises
    ------
    FileNotFoundError
        If a records file does not exist.
    """
    return ApplyHistoryBest(records)
