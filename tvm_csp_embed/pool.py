"""Pools and adds under ``csp-relaxed``: the ALU template's schedule and input path that the
cycle model times fastest.

The stock max-pool template (:mod:`vta_ext.templates.pool`) has two schedules
(:data:`~vta_ext.templates.pool.MAX_POOL_SCHEDULES`): ``"direct"``, the stock strategy's program
(the first window element copied, then one MAX pass per other element), and ``"separable"``
(the height reduced in place once per output row and input column, then the width into output
rows filled with the lane minimum: about 7 vector passes per output of a 3x3 stride-2 pool against
10, 5 of a 3x3 stride-1 pool) and ``"inplace"`` (the separable height pass, then the width in
place too, with no fill: one pass per output fewer, each output STOREd from its window row). The pool and add templates have two input paths
(:data:`~vta_ext.templates.alu_program.INPUT_PATHS`): ``"acc8"``, the stock programs' LOAD
ACC_8BIT on the compute module, and ``"gemm"``, LOAD INP on the load module and GEMM micro-ops
through an identity weight tile (:class:`~vta_ext.templates.alu_program.IdentityInput`: a
reset and one GEMM a row; the average pool's window sum and the add's second operand are GEMMs
too, ``GEMM_CYCLES_PER_UOP`` a row against an ALU vector pass). All take and leave the stock
blocked layouts, so they differ only on VTA.

:class:`MaxPoolTemplate` (every schedule x input path), :class:`AvgPoolTemplate` and
:class:`AddTemplate` (every input path) plan the operator as the stock template does, build each
variant and time it on the cycle model (:func:`~.depthwise.modelled_cycles`); the fewest cycles
win, the earlier variant (the stock program first) on a tie. A variant the template refuses (the
separable schedule without ``EXT_PAD_MIN``, the GEMM input path of a max pool with padding, whose
zero INP padding could win a MAX) leaves the others; when all refuse, the operator stays on the CPU
with every reason. The build report's line of the operator says which variant ran and why. The
choice and its sentence are kept on disk (``pools/`` of :func:`~.cache.cache_dir`, keyed by the
workload, the epilogue, each variant's knobs, the configuration's value and the code,
:func:`variant_key`): a warm build builds and times no variant, only the chosen one's program is
built (for the VTA call).

Registered for ``max_pool2d``, ``avg_pool2d`` and ``add`` under ``csp-relaxed`` (``csp-strict``
and ``stock`` keep the stock programs).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from vta_ext.errors import TemplateRefusal
from vta_ext.stock import StockAdd, StockPool
from vta_ext.strategy import (MatchedOp, OpPlan, OpTemplate, register_plan_summary,
                              register_template)
from vta_ext.templates.alu_program import INPUT_PATHS
from vta_ext.templates.eltwise import EltwiseWorkload, build_add
from vta_ext.templates.pool import (MAX_POOL_SCHEDULES, PoolWorkload, build_avg_pool2d,
                                    build_max_pool2d)

from .cache import _write, cache_dir, source_digest
from .depthwise import modelled_cycles

__all__ = ["PoolScheduleWorkload", "AvgPoolInputWorkload", "AddInputWorkload", "MaxPoolTemplate",
           "AvgPoolTemplate", "AddTemplate", "SCHEDULE_TEXT", "INPUT_TEXT", "variant_text",
           "choose_variant", "variant_key"]

#: how the build report names each max-pool schedule
SCHEDULE_TEXT = {"direct": "the direct max pool (a copy, then a MAX pass per window element)",
                 "separable": "the separable max pool (height in place, then width into a "
                              "lane-minimum fill)",
                 "inplace": "the in-place max pool (height, then width, in place in the window; "
                            "each output stored from there)"}
#: the build report's one word for a schedule in a plan's summary (else its name)
SCHEDULE_WORD = {"inplace": "in-place"}
#: how the build report names each input path
INPUT_TEXT = {"acc8": "inputs by LOAD ACC_8BIT (compute module)",
              "gemm": "inputs by LOAD INP (load module) and identity GEMMs",
              "split": "the first input by LOAD ACC_8BIT, the second by LOAD INP and an identity "
                       "GEMM"}
#: the input paths of a one-input template (the pools)
ONE_INPUT_PATHS = tuple(p for p in INPUT_PATHS if p != "split")


def _check_input_path(input_path: str, what: str) -> None:
    if input_path not in INPUT_PATHS:
        raise ValueError(f"{what}.input_path {input_path!r}: one of {', '.join(INPUT_PATHS)}")


class _Variant:
    """A stock workload with the variant fields ``VARIANT`` (an input path, and a schedule):
    :attr:`base` is the stock workload (the template's), a ``BASE``."""

    VARIANT: Tuple[str, ...] = ("input_path",)
    BASE: type = type(None)

    def __post_init__(self) -> None:
        _check_input_path(self.input_path, type(self).__name__)

    @property
    def base(self):
        """The template's workload (this one without the variant fields)."""
        return self.BASE(**{k: v for k, v in dataclasses.asdict(self).items()
                            if k not in self.VARIANT})


@dataclass(frozen=True)
class PoolScheduleWorkload(_Variant, PoolWorkload):
    """A max pool (batch and channels padded to whole blocks), the schedule that runs it (one of
    :data:`~vta_ext.templates.pool.MAX_POOL_SCHEDULES`) and its input path (one of
    :data:`~vta_ext.templates.alu_program.INPUT_PATHS`)."""

    VARIANT = ("schedule", "input_path")
    BASE = PoolWorkload
    schedule: str = "direct"
    input_path: str = "acc8"

    def __post_init__(self) -> None:
        if self.schedule not in MAX_POOL_SCHEDULES:
            raise ValueError(f"PoolScheduleWorkload.schedule {self.schedule!r}: one of "
                             f"{', '.join(MAX_POOL_SCHEDULES)}")
        super().__post_init__()


@dataclass(frozen=True)
class AvgPoolInputWorkload(_Variant, PoolWorkload):
    """An average pool and its input path (one of
    :data:`~vta_ext.templates.alu_program.INPUT_PATHS`)."""

    BASE = PoolWorkload
    input_path: str = "acc8"


@dataclass(frozen=True)
class AddInputWorkload(_Variant, EltwiseWorkload):
    """A residual add and its input path (one of
    :data:`~vta_ext.templates.alu_program.INPUT_PATHS`)."""

    BASE = EltwiseWorkload
    input_path: str = "acc8"


def variant_text(variant: Dict[str, str]) -> str:
    """The build report's words for a variant (``schedule`` and / or ``input_path``)."""
    parts = []
    if "schedule" in variant:
        parts.append(SCHEDULE_TEXT[variant["schedule"]])
    parts.append(INPUT_TEXT[variant["input_path"]])
    return " with ".join(parts)


def choose_variant(variants: Sequence[Dict[str, str]], timed: Dict[int, int],
                   refused: Dict[int, str]) -> Tuple[int, str]:
    """The variant to run and the sentence saying why.

    Parameters
    ----------
    variants : sequence of dict
        The variants, the stock program first.
    timed : dict
        Modelled cycles of each variant (by index) that builds.
    refused : dict
        The refusal of each variant (by index) that does not.

    Returns
    -------
    tuple
        The index of the fewest cycles (the earlier variant on a tie) and the report's words: the
        runner-up's cycles and ratio, then every other variant's cycles or refusal.
    """
    def text(i: int) -> str:
        what = f"{timed[i]:,} cycles" if i in timed else f"refused ({refused[i]})"
        return f"{variant_text(variants[i])} {what}"

    order = sorted(timed, key=lambda i: (timed[i], i))
    best = order[0]
    others = [i for i in range(len(variants)) if i != best]
    if len(order) == 1:
        return best, (f"the only variant that runs it ({timed[best]:,} cycles); "
                      + "; ".join(text(i) for i in others))
    runner = order[1]
    rest = [i for i in others if i != runner]
    return best, (f"fewest cycles on the cycle model: {timed[best]:,} cycles against "
                  f"{timed[runner]:,} ({timed[runner] / max(timed[best], 1):.2f}x) for "
                  f"{variant_text(variants[runner])}"
                  + "".join(f"; {text(i)}" for i in rest))


def variant_key(kind: str, workload_type, config, strategy: str, base: Dict[str, Any],
                variants: Sequence[Dict[str, str]], epilogue, knobs: Sequence[Any]) -> str:
    """The variant cache's key: the compiled-operator key of each variant of the operator
    ``base`` (the stock workload's fields) with its ``knobs`` (:func:`vta_ext.executor.op_key`:
    the workload, the epilogue, the knobs and the configuration's value) and the code that
    builds and times them (:func:`~.cache.source_digest`)."""
    from vta_ext.executor import op_key

    keys = [op_key(kind, strategy, config, workload_type(**base, **v), epilogue, k)
            for v, k in zip(variants, knobs)]
    text = json.dumps({"v": 2, "programs": keys, "code": source_digest()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _kept_variant(key: str, count: int) -> Optional[Tuple[int, str]]:
    """The variant index and sentence kept under ``key`` (:func:`variant_key`), or None."""
    path = cache_dir() / "pools" / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        index, why = int(data["variant"]), str(data["why"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (index, why) if 0 <= index < count else None


class _TimedVariantTemplate(OpTemplate):
    """An ALU operator under a CSP strategy: the stock plan, run by the variant (schedule, input
    path) of fewest modelled cycles (module docstring). Subclasses set ``kind``,
    ``workload_type``, ``variants`` (the stock program first), ``noun``, ``builder`` (the ALU
    template's build function, taking the variant fields as keywords) and :meth:`_stock`."""

    variants: Tuple[Dict[str, str], ...] = ()
    noun = ""

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy
        self.report_text = f"{strategy} {self.noun}"
        self._stock_template = self._stock()

    def _stock(self) -> OpTemplate:
        raise NotImplementedError

    def refusal(self, op: MatchedOp, config) -> Optional[str]:
        """The stock template's (every variant runs the stock plan's workload)."""
        return self._stock_template.refusal(op, config)

    def plan(self, op: MatchedOp, config) -> OpPlan:
        """The stock plan of ``op`` with the variant of fewer modelled cycles."""
        from vta_ext.options import current_options

        options = current_options()
        stock = self._stock_template.plan(op, config)
        base = dataclasses.asdict(stock.workload)
        knobs = [options.knobs_for(self.kind, self.strategy, self.workload_type(**base, **v),
                                   config)[0] for v in self.variants]
        key = variant_key(self.kind, self.workload_type, config, self.strategy, base,
                          self.variants, op.epilogue, knobs)
        kept = _kept_variant(key, len(self.variants))
        if kept is not None:
            index, why = kept
        else:
            index, why = self._timed_choice(config, op, base, knobs)
            _write(cache_dir() / "pools" / f"{key}.json", {"variant": index, "why": why})
        variant = self.variants[index]
        return OpPlan(self.workload_type(**base, **variant), stock.inputs, stock.out_layout,
                      f"{stock.description}; {variant_text(variant)} chosen by "
                      f"{self.strategy}: {why}", stock.padding, in_layout=stock.in_layout)

    #: the builder's keywords besides the variant's fields
    builder_options: Dict[str, Any] = {}

    def build(self, config, workload, epilogue: Sequence[tuple], knobs) -> Any:
        """The ALU template's program of ``workload.base`` with the variant's fields."""
        return self.builder(config, workload.base, tuple(epilogue), knobs, **self.builder_options,
                            **{k: getattr(workload, k) for k in workload.VARIANT})

    def _timed_choice(self, config, op: MatchedOp, base: Dict[str, Any],
                      knobs: Sequence[Any]) -> Tuple[int, str]:
        """Build and time every variant of ``base`` (:func:`choose_variant`); raises
        :class:`~vta_ext.errors.TemplateRefusal` with every reason when none builds."""
        timed: Dict[int, int] = {}
        refused: Dict[int, str] = {}
        for i, variant in enumerate(self.variants):
            wl = self.workload_type(**base, **variant)
            try:
                timed[i] = modelled_cycles(self.kind, self.strategy, config, wl, op.epilogue,
                                           knobs[i])
            except TemplateRefusal as err:
                refused[i] = str(err)
        if not timed:
            raise TemplateRefusal(f"{self.strategy}: no {self.noun} variant runs it: " + "; ".join(
                f"{variant_text(v)}: {refused[i]}" for i, v in enumerate(self.variants)))
        return choose_variant(self.variants, timed, refused)


class MaxPoolTemplate(_TimedVariantTemplate):
    """``max_pool2d`` under a CSP strategy: the direct or the separable schedule, with either
    input path, whichever the cycle model times fastest (module docstring)."""

    kind = "max_pool2d"
    workload_type = PoolScheduleWorkload
    noun = "max pool"
    variants = tuple(dict(schedule=s, input_path=p) for p in ONE_INPUT_PATHS
                     for s in MAX_POOL_SCHEDULES)
    builder = staticmethod(build_max_pool2d)
    builder_options = {"lean": True}   # no int8 clip after the max

    def _stock(self) -> OpTemplate:
        return StockPool("max_pool2d")


class AvgPoolTemplate(_TimedVariantTemplate):
    """``avg_pool2d`` under a CSP strategy: the input path the cycle model times faster."""

    kind = "avg_pool2d"
    workload_type = AvgPoolInputWorkload
    noun = "avg pool"
    variants = tuple(dict(input_path=p) for p in ONE_INPUT_PATHS)
    builder = staticmethod(build_avg_pool2d)
    builder_options = {"lean": True}   # the power-of-two division, no int8 clip

    def _stock(self) -> OpTemplate:
        return StockPool("avg_pool2d")


class AddTemplate(_TimedVariantTemplate):
    """``add`` under a CSP strategy: the input path the cycle model times faster."""

    kind = "add"
    workload_type = AddInputWorkload
    noun = "add"
    variants = tuple(dict(input_path=p) for p in INPUT_PATHS)
    builder = staticmethod(build_add)

    def _stock(self) -> OpTemplate:
        return StockAdd()

    def plan(self, op: MatchedOp, config) -> OpPlan:
        """The timed variant's plan, stating the constants of its output's padded channels when
        both inputs are handed over with theirs (:func:`~.lanes.add_lanes`)."""
        from .lanes import add_lanes

        plan = super().plan(op, config)
        known = tuple(op.input_lanes)
        if len(known) == 2 and all(k is not None for k in known) and len(set(map(len, known))) == 1:
            plan = dataclasses.replace(plan, out_lanes=tuple(
                int(v) for v in add_lanes(op.epilogue, *known)))
        return plan



def _summary(noun: str, stock_variant: Dict[str, str]) -> Callable[[OpTemplate, OpPlan, Any], str]:
    """The build report's few words of a plan: ``"csp-relaxed separable max pool, gemm
    inputs"`` or ``"stock max pool (csp-relaxed chose it)"`` for the stock program."""
    def summarise(template: OpTemplate, plan: OpPlan, config) -> str:
        variant = {k: getattr(plan.workload, k) for k in stock_variant}
        if variant == stock_variant:
            what = f"direct {noun}" if "schedule" in variant else noun
            return f"stock {what} ({template.strategy} chose it)"
        words = ([SCHEDULE_WORD.get(variant["schedule"], variant["schedule"])]
                 if variant.get("schedule", "direct") != "direct" else [])
        inputs = {"acc8": "", "gemm": ", gemm inputs",
                  "split": ", split inputs"}[variant["input_path"]]
        return f"{template.strategy} {' '.join(words + [noun])}{inputs}"
    return summarise


register_plan_summary(PoolScheduleWorkload, _summary("max pool", MaxPoolTemplate.variants[0]))
register_plan_summary(AvgPoolInputWorkload, _summary("avg pool", AvgPoolTemplate.variants[0]))
register_plan_summary(AddInputWorkload, _summary("add", AddTemplate.variants[0]))
for _template in (MaxPoolTemplate, AvgPoolTemplate, AddTemplate):
    register_template(_template.kind, "csp-relaxed", _template("csp-relaxed"))
