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
reasons. The build report's line of the operator says which schedule ran and why.

Registered for ``max_pool2d`` under ``csp-relaxed`` (``csp-strict`` and ``stock`` keep the direct
schedule through the stock template).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Sequence, Tuple

from vta_ext.errors import TemplateRefusal
from vta_ext.stock import StockPool
from vta_ext.strategy import (MatchedOp, OpPlan, OpTemplate, register_plan_summary,
                              register_template)
from vta_ext.templates.pool import MAX_POOL_SCHEDULES, PoolWorkload, build_max_pool2d

from .depthwise import modelled_cycles

__all__ = ["PoolScheduleWorkload", "MaxPoolTemplate", "SCHEDULE_TEXT"]

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
        timed: Dict[str, int] = {}
        refused: Dict[str, str] = {}
        for schedule in MAX_POOL_SCHEDULES:
            wl = PoolScheduleWorkload(**base, schedule=schedule)
            knobs = options.knobs_for(self.kind, self.strategy, wl, config)[0]
            try:
                timed[schedule] = modelled_cycles(self.kind, self.strategy, config, wl,
                                                  op.epilogue, knobs)
            except TemplateRefusal as err:
                refused[schedule] = str(err)
        if not timed:
            raise TemplateRefusal(f"{self.strategy}: no max-pool schedule runs it: " + "; ".join(
                f"{SCHEDULE_TEXT[s]}: {refused[s]}" for s in MAX_POOL_SCHEDULES))
        schedule, why = choose_schedule(timed, refused)
        return OpPlan(PoolScheduleWorkload(**base, schedule=schedule), stock.inputs,
                      stock.out_layout,
                      f"{stock.description}; {SCHEDULE_TEXT[schedule]} chosen by "
                      f"{self.strategy}: {why}", stock.padding, in_layout=stock.in_layout)

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
