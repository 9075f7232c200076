"""Max pooling under ``csp-relaxed``: the ALU template's direct or separable schedule, whichever
the cycle model times faster.

The stock max-pool template (:mod:`vta_ext.templates.pool`) has two schedules
(:data:`~vta_ext.templates.pool.MAX_POOL_SCHEDULES`): ``"direct"``, the stock strategy's program
(the first window element copied, then one MAX pass per other element), and ``"separable"``
(the height reduced in place once per output row and input column, then the width into output
rows filled with the lane minimum: about 7 vector passes per output of a 3x3 stride-2 pool against
10, 5 of a 3x3 stride-1 pool). Both take and leave the stock blocked layouts, so they differ only
on VTA.

:class:`MaxPoolTemplate` plans the operator as the stock template does, builds both schedules and
times them on the cycle model (:func:`~.depthwise.modelled_cycles`); the fewer cycles win, the
direct schedule on a tie. A schedule the template refuses (the separable one without
``EXT_PAD_MIN``) leaves the other; when both refuse, the operator stays on the CPU with both
reasons. The build report's line of the operator says which schedule ran and why. The choice and
its sentence are kept on disk (``pools/`` of :func:`~.cache.cache_dir`, keyed by the workload,
the epilogue, each schedule's knobs, the configuration's value and the code,
:func:`schedule_key`): a warm build builds and times neither schedule, only the chosen one's
program is built (for the VTA call).

Registered for ``max_pool2d`` under ``csp-relaxed`` (``csp-strict`` and ``stock`` keep the direct
schedule through the stock template).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from vta_ext.errors import TemplateRefusal
from vta_ext.stock import StockPool
from vta_ext.strategy import (MatchedOp, OpPlan, OpTemplate, register_plan_summary,
                              register_template)
from vta_ext.templates.pool import MAX_POOL_SCHEDULES, PoolWorkload, build_max_pool2d

from .cache import _write, cache_dir, source_digest
from .depthwise import modelled_cycles

__all__ = ["PoolScheduleWorkload", "MaxPoolTemplate", "SCHEDULE_TEXT", "schedule_key"]

#: how the build report names each schedule
SCHEDULE_TEXT = {"direct": "the direct max pool (a copy, then a MAX pass per window element)",
                 "separable": "the separable max pool (height in place, then width into a "
                              "lane-minimum fill)"}


@dataclass(frozen=True)
class PoolScheduleWorkload(PoolWorkload):
    """A max pool (batch and channels padded to whole blocks) and the schedule that runs it (one
    of :data:`~vta_ext.templates.pool.MAX_POOL_SCHEDULES`)."""

    schedule: str = "direct"

    def __post_init__(self) -> None:
        if self.schedule not in MAX_POOL_SCHEDULES:
            raise ValueError(f"PoolScheduleWorkload.schedule {self.schedule!r}: one of "
                             f"{', '.join(MAX_POOL_SCHEDULES)}")

    @property
    def pool(self) -> PoolWorkload:
        """The template's workload (this one without :attr:`schedule`)."""
        values = dataclasses.asdict(self)
        del values["schedule"]
        return PoolWorkload(**values)


def choose_schedule(timed: Dict[str, int], refused: Dict[str, str]) -> Tuple[str, str]:
    """The schedule to run and the sentence saying why.

    Parameters
    ----------
    timed : dict
        Modelled cycles of each schedule that builds.
    refused : dict
        The refusal of each schedule that does not.

    Returns
    -------
    tuple of str
        The fewest cycles (the direct schedule on a tie), and the report's words.
    """
    def text(s: str) -> str:
        return f"{timed[s]:,} cycles" if s in timed else f"refused ({refused[s]})"

    if len(timed) == 1:
        (schedule,) = timed
        other = next(s for s in MAX_POOL_SCHEDULES if s != schedule)
        return schedule, (f"the only schedule that runs it ({text(schedule)}); "
                          f"{SCHEDULE_TEXT[other]} {text(other)}")
    schedule = min(MAX_POOL_SCHEDULES, key=lambda s: (timed[s], MAX_POOL_SCHEDULES.index(s)))
    other = next(s for s in MAX_POOL_SCHEDULES if s != schedule)
    return schedule, (f"fewest cycles on the cycle model: {text(schedule)} against "
                      f"{text(other)} ({timed[other] / max(timed[schedule], 1):.2f}x) for "
                      f"{SCHEDULE_TEXT[other]}")


def schedule_key(config, strategy: str, base: Dict[str, Any], epilogue,
                 knobs: Dict[str, Any]) -> str:
    """The pool schedule cache's key: the compiled-operator key of each schedule of the pool
    ``base`` (the stock workload's fields) with its ``knobs`` (:func:`vta_ext.executor.op_key`:
    the workload, the epilogue, the knobs and the configuration's value) and the code that builds
    and times them (:func:`~.cache.source_digest`)."""
    from vta_ext.executor import op_key

    keys = [op_key(MaxPoolTemplate.kind, strategy, config,
                   PoolScheduleWorkload(**base, schedule=s), epilogue, knobs[s])
            for s in MAX_POOL_SCHEDULES]
    text = json.dumps({"v": 1, "programs": keys, "code": source_digest()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _kept_schedule(key: str) -> Optional[Tuple[str, str]]:
    """The schedule and sentence kept under ``key`` (:func:`schedule_key`), or None."""
    path = cache_dir() / "pools" / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        schedule, why = data["schedule"], data["why"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (schedule, why) if schedule in MAX_POOL_SCHEDULES else None


class MaxPoolTemplate(OpTemplate):
    """``max_pool2d`` under a CSP strategy: the direct or the separable schedule, whichever the
    cycle model times faster (module docstring)."""

    kind = "max_pool2d"
    workload_type = PoolScheduleWorkload

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy
        self.report_text = f"{strategy} max pool"
        self._stock = StockPool("max_pool2d")

    def plan(self, op: MatchedOp, config) -> OpPlan:
        """The stock plan of ``op`` with the schedule of fewer modelled cycles."""
        from vta_ext.options import current_options

        options = current_options()
        stock = self._stock.plan(op, config)
        base = dataclasses.asdict(stock.workload)
        knobs = {s: options.knobs_for(self.kind, self.strategy,
                                      PoolScheduleWorkload(**base, schedule=s), config)[0]
                 for s in MAX_POOL_SCHEDULES}
        key = schedule_key(config, self.strategy, base, op.epilogue, knobs)
        kept = _kept_schedule(key)
        if kept is not None:
            schedule, why = kept
        else:
            schedule, why = self._timed_choice(config, op, base, knobs)
            _write(cache_dir() / "pools" / f"{key}.json", {"schedule": schedule, "why": why})
        return OpPlan(PoolScheduleWorkload(**base, schedule=schedule), stock.inputs,
                      stock.out_layout,
                      f"{stock.description}; {SCHEDULE_TEXT[schedule]} chosen by "
                      f"{self.strategy}: {why}", stock.padding, in_layout=stock.in_layout)

    def _timed_choice(self, config, op: MatchedOp, base: Dict[str, Any],
                      knobs: Dict[str, Any]) -> Tuple[str, str]:
        """Build and time both schedules of the pool ``base`` (:func:`choose_schedule`); raises
        :class:`~vta_ext.errors.TemplateRefusal` with both reasons when neither builds."""
        timed: Dict[str, int] = {}
        refused: Dict[str, str] = {}
        for schedule in MAX_POOL_SCHEDULES:
            wl = PoolScheduleWorkload(**base, schedule=schedule)
            try:
                timed[schedule] = modelled_cycles(self.kind, self.strategy, config, wl,
                                                  op.epilogue, knobs[schedule])
            except TemplateRefusal as err:
                refused[schedule] = str(err)
        if not timed:
            raise TemplateRefusal(f"{self.strategy}: no max-pool schedule runs it: " + "; ".join(
                f"{SCHEDULE_TEXT[s]}: {refused[s]}" for s in MAX_POOL_SCHEDULES))
        return choose_schedule(timed, refused)

    def build(self, config, workload: PoolScheduleWorkload, epilogue: Sequence[tuple],
              knobs) -> Any:
        """The ALU template's program of ``workload.pool`` with ``workload.schedule``."""
        return build_max_pool2d(config, workload.pool, tuple(epilogue), knobs,
                                schedule=workload.schedule)


def plan_summary(template: OpTemplate, plan: OpPlan, config) -> str:
    """``"csp-relaxed separable max pool"`` or ``"stock direct max pool (csp-relaxed chose
    it)"``."""
    if plan.workload.schedule == "separable":
        return f"{template.strategy} separable max pool"
    return f"stock direct max pool ({template.strategy} chose it)"


register_plan_summary(PoolScheduleWorkload, plan_summary)
register_template("max_pool2d", "csp-relaxed", MaxPoolTemplate("csp-relaxed"))
