"""Tuning tasks: one per distinct VTA workload of a model, with the knob space of its strategy.

A :class:`Task` is ``(operator kind, workload, epilogue, strategy, configuration)``. Its knob space
comes from the strategy's template (:meth:`vta_ext.strategy.OpTemplate.knob_space`), so a new
strategy (the CSP strategies) is tuned the same way as ``stock``.

:func:`extract_tasks` runs the ``ext_vta`` offload pass on a Relax module, under the build options
in effect (or the strategy given), and reads the operator of every VTA call it emitted (the JSON
key of :func:`vta_ext.executor.op_key`): nothing is matched or planned a second time here.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

from vta_ext.config import VTAConfig, load_config
from vta_ext.executor import config_digest
from vta_ext.strategy import KnobSpace, OpTemplate, get_strategy, get_template

__all__ = ["Task", "extract_tasks", "workload_text"]

logger = logging.getLogger("tvm_csp_embed.tune")


def _workload_dict(workload: Any) -> Dict[str, Any]:
    return dataclasses.asdict(workload) if dataclasses.is_dataclass(workload) else dict(workload)


def workload_text(kind: str, values: Dict[str, Any]) -> str:
    """A short text of a workload: ``"1x64x56x56 -> 64 k3 s1 p1"``, ``"1x512 -> 1008"``."""
    v = values
    if v.get("stock"):  # a CSP workload that fell back to the stock template
        return workload_text(kind, dict(tuple(pair) for pair in v["stock"])) + " [stock fallback]"
    if "params" in v:  # a CSP workload: operator parameters and the embedding's layout / mode
        params = dict(tuple(pair) for pair in v["params"])
        if "kh" in params:
            p = params
            text = (f"{p['n']}x{p['c']}x{p['h']}x{p['w']} -> {p['k']} k{p['kh']}x{p['kw']} "
                    f"s{p['sh']} p{p['pt']}")
        else:
            text = " ".join(f"{k}{val}" for k, val in params.items())
        return f"{text} [{v.get('layout', '')} {v.get('mode', '')}]"
    if "in_features" in v:
        return f"{v['batch']}x{v['in_features']} -> {v['out_features']}"
    if "kernel_h" in v and "channels" in v:   # a depthwise conv2d (tvm_csp_embed.depthwise)
        unit = f" [{v['unit']}]" if "unit" in v else ""
        return (f"{v['batch']}x{v['channels']}x{v['height']}x{v['width']} depthwise "
                f"k{v['kernel_h']}x{v['kernel_w']} s{v['stride_h']} p{v['pad_h']}{unit}")
    if "kernel_h" in v:
        groups = f" g{v['groups']}" if v.get("groups", 1) > 1 else ""
        return (f"{v['batch']}x{v['in_channels']}x{v['height']}x{v['width']} -> "
                f"{v['out_channels']} k{v['kernel_h']}x{v['kernel_w']} s{v['stride_h']} "
                f"p{v['pad_h']}{groups}")
    return ", ".join(f"{k}={val}" for k, val in v.items())


@dataclass(frozen=True)
class Task:
    """One tuning task: an operator instance on a configuration under a strategy.

    Attributes
    ----------
    kind : str
        Operator kind (``"conv2d"``, ``"group_conv2d"``, ``"dense"``, ...).
    workload : object
        The template's workload (a frozen dataclass).
    epilogue : tuple of tuple
        The requantisation stages (``("bias",)``, ``("shr", 8)``, ``("clip", 0, 127)``).
    strategy : str
        The strategy whose template builds and whose knob space is searched.
    config : VTAConfig
        The configuration (records are keyed by its value, :func:`vta_ext.executor.config_digest`).
    count : int
        How many operators of the model share this task.
    """

    kind: str
    workload: Any
    epilogue: Tuple[tuple, ...]
    strategy: str
    config: VTAConfig
    count: int = 1
    _space: List[KnobSpace] = field(default_factory=list, repr=False, compare=False, hash=False)

    @property
    def template(self) -> OpTemplate:
        """The strategy's template of :attr:`kind`."""
        return get_template(self.kind, self.strategy)

    @property
    def knob_space(self) -> KnobSpace:
        """The knob space (computed once)."""
        if not self._space:
            self._space.append(self.template.knob_space(self.config, self.workload, self.epilogue))
        return self._space[0]

    @property
    def workload_dict(self) -> Dict[str, Any]:
        """The workload as a dict (what records hold)."""
        return _workload_dict(self.workload)

    @property
    def key(self) -> Tuple[str, str, str, str]:
        """``(kind, strategy, config digest, workload JSON)``: what records are keyed by."""
        return record_key(self.kind, self.strategy, self.config, self.workload)

    def spec(self) -> Dict[str, Any]:
        """A JSON-able description, enough to rebuild the task in another process
        (:meth:`from_spec`)."""
        return {"kind": self.kind, "strategy": self.strategy, "config": self.config.name,
                "config_value": self.config.to_dict(), "workload": self.workload_dict,
                "epilogue": [list(stage) for stage in self.epilogue]}

    @classmethod
    def from_spec(cls, spec: Dict[str, Any]) -> "Task":
        """The task of a :meth:`spec` dict."""
        config = VTAConfig.from_dict(spec["config_value"], name=spec["config"])
        template = get_template(spec["kind"], spec["strategy"])
        return cls(spec["kind"], template.workload_from_dict(spec["workload"]),
                   tuple(tuple(s) for s in spec["epilogue"]), spec["strategy"], config)

    @classmethod
    def create(cls, kind: str, workload: Any, epilogue=(), strategy: str = "stock",
               config: Union[str, VTAConfig] = "default") -> "Task":
        """A task from its parts (``workload`` may be a dict of the template's workload fields)."""
        if isinstance(workload, dict):
            workload = get_template(kind, strategy).workload_from_dict(workload)
        return cls(kind, workload, tuple(tuple(s) for s in epilogue), strategy, load_config(config))

    @property
    def name(self) -> str:
        """``"conv2d 1x64x56x56 -> 64 k3x3 s1 p1"``."""
        return f"{self.kind} {workload_text(self.kind, self.workload_dict)}"

    def __repr__(self) -> str:
        shared = f", x{self.count}" if self.count > 1 else ""
        return (f"Task({self.name}, epilogue {'+'.join(s[0] for s in self.epilogue) or 'none'}, "
                f"strategy {self.strategy!r}, config {self.config.name!r}{shared})")


def record_key(kind: str, strategy: str, config: VTAConfig, workload: Any
               ) -> Tuple[str, str, str, str]:
    """``(kind, strategy, config digest, workload JSON)``: the key of tuning records."""
    return (kind, strategy, config_digest(config),
            json.dumps(_workload_dict(workload), sort_keys=True))


def _config_of(target) -> VTAConfig:
    import tvm

    from vta_ext.target import config_of_target, is_vta_target

    if isinstance(target, VTAConfig):
        return target
    if isinstance(target, str) and target not in ("ext_vta",) and not target.startswith("{"):
        try:
            return load_config(target)
        except Exception:  # not a preset name: a target string
            pass
    tgt = tvm.target.Target(target) if isinstance(target, str) else target
    if not is_vta_target(tgt):
        raise ValueError(f"extract_tasks needs an ext_vta target (or a VTA configuration), got "
                         f"{target!r}")
    return config_of_target(tgt)


def extract_tasks(mod, target: Any = "ext_vta", strategy: Optional[str] = None,
                  config: Union[None, str, VTAConfig] = None) -> List[Task]:
    """The tuning tasks of a Relax module: one per distinct VTA operator with tunable knobs.

    Parameters
    ----------
    mod : tvm.IRModule
        The Relax module that would be built with ``relax.build(mod, target="ext_vta")``.
    target : str or tvm.target.Target
        An ``ext_vta`` target (``"ext_vta"`` or ``vta_ext.vta_target("pipelined")``); its
        ``model`` names the configuration.
    strategy : str, optional
        The strategy to tune; default: the one of the build options in effect.
    config : str or VTAConfig, optional
        Overrides the target's configuration.

    Notes
    -----
    The offload pass compiles every matched operator with the knobs in effect (TPS by default;
    seconds for a whole ResNet-18) and publishes its build report
    (:func:`vta_ext.last_build_report`), as a build would.

    Returns
    -------
    list of Task
        In the order of first occurrence; operators sharing kind, workload and the kinds of their
        epilogue stages (shift amounts and clip bounds do not change a program's cost) are one
        task (:attr:`Task.count`), measured with the first one's epilogue. Operators whose template has no knobs (pools, adds, depthwise
        on the ALU) are not tasks. An empty list, with a warning, if nothing is tunable.
    """
    from tvm import relax

    import vta_ext
    from vta_ext.offload import OffloadToVTA, RUN_FUNC

    cfg = load_config(config) if config is not None else _config_of(target)
    options = vta_ext.options.current_options()
    if strategy is not None:
        get_strategy(strategy)  # an unknown name: the error lists the registered ones
        options = dataclasses.replace(options, strategy=strategy)
    with options:
        lowered = OffloadToVTA(cfg)(mod)
    keys: List[str] = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_dps_packed" \
                and str(expr.args[0].global_symbol) == RUN_FUNC:
            keys.append(str(expr.args[1].fields[-1].value))

    for func in lowered.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    tasks: Dict[tuple, Task] = {}
    skipped: Dict[str, int] = {}
    for key in keys:
        spec = json.loads(key)
        task = Task.from_spec({**spec, "kind": spec["op"]})
        # the stage kinds decide the program's shape and cost; shift amounts and clip bounds
        # do not, so operators that differ only in them share a task (and its records)
        ident = (task.kind, task.strategy, json.dumps(spec["workload"], sort_keys=True),
                 tuple(stage[0] for stage in task.epilogue))
        if ident in tasks:
            tasks[ident] = dataclasses.replace(tasks[ident], count=tasks[ident].count + 1,
                                               _space=tasks[ident]._space)
            continue
        if not task.knob_space.names:
            skipped[task.kind] = skipped.get(task.kind, 0) + 1
            continue
        tasks[ident] = task
    if skipped:
        logger.info("extract_tasks: no tunable knobs for %s", ", ".join(
            f"{n}x {kind}" for kind, n in sorted(skipped.items())))
    if not tasks:
        logger.warning("extract_tasks: the module has no VTA operator with tunable knobs on "
                       "config %r (%d VTA operator(s) found); nothing to tune", cfg.name, len(keys))
    return list(tasks.values())
