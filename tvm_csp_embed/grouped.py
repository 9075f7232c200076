"""Grouped convolutions of narrow groups on the GEMM core: the block-diagonal unit, chosen per
layer against the CSP plan.

A grouped conv2d with ``w < BLOCK`` channels per group (ResNeXt-50 32x4d: ``w = 4`` and ``8``)
is one the stock template refuses (it cannot pad inside a group); the CSP strategy embeds it
(:class:`~.strategy.CspGemmTemplate`). The block-diagonal unit is the depthwise one
(:mod:`.depthwise`) with groups of ``w`` channels: each ``BLOCK x BLOCK`` weight tile per (tile,
tap) holds ``BLOCK / w`` groups' ``w x w`` blocks on its diagonal and zeros elsewhere, and the
stock ``group_conv2d_packed`` template runs the grouped conv2d of ``BLOCK`` channels per group
(:func:`~.depthwise.diagonal_workload`, :func:`~.depthwise.build_diagonal`). One GEMM micro-op per
tap then computes ``BLOCK / w`` groups of one pixel; ``1 - w / BLOCK`` of its MACs are on the
zero lanes, and the weights moved are ``BLOCK / w`` times the grouped weights (the zeros travel
too). The floor (:mod:`vta_ext.floor`) counts the MACs as written, so the efficiency of this unit
is at most ``w / BLOCK`` where the GEMM bounds it.

* **Which layers**: ``w = C / groups < BLOCK`` with as many output as input channels per group;
  other grouped convs keep the CSP plan alone. The unit is refused, with the reason in the report
  line, when ``w`` does not divide ``BLOCK`` (a group would straddle two tiles; padding each group
  to the next divisor of ``BLOCK`` would need an activation layout padded inside the channels,
  which no neighbouring operator hands over, so it is not done), when a group has other than as
  many output as input channels, or on a configuration whose blocks are not square.
* **Layouts**: the activation and output in the stock blocked layout ``(N/b, C/BLOCK, H, W, b,
  BLOCK)`` (channels padded to whole blocks, the padded channels' weights zero); the weights
  expanded (:func:`~.depthwise.pack_diagonal_weight` with ``width = w``) at build time for a
  constant, in Relax on the host otherwise.
* **Choice** (:class:`NarrowGroupTemplate`): the CSP plan (the best embedding by the objective,
  :func:`~.choice.choose`) and the block-diagonal program are both built and scored by the
  objective: ``cycles``: the cycle model of each program with its weight loads; ``end-to-end``:
  plus the host layout traffic each plan adds around the operator
  (:func:`~.choice.plan_host_bytes`, :func:`~.choice.operand_pack_bytes`), and the CPU is the
  third contender (the stock template refuses these convs); ``combined``: modelled seconds plus
  the measured host relayout. The lower score wins, the CSP plan on a tie. Under ``footprint``
  the units are not compared (the CSP plan stands; the report line says so). A unit that does
  not build leaves the other; when neither does, the operator stays on the CPU with both reasons.
* **Build work**: each unit's programs (and bias twins) are timed once per epilogue shape
  (:func:`~.depthwise.modelled_cycles`), and a cold build times them while it waits for a solve
  (:meth:`NarrowGroupTemplate.prefetch`): they need no solve, so :meth:`~NarrowGroupTemplate._plan`
  finds their counts kept.

* **Groups that are not whole blocks** (RegNetX: ``w = 24``): the block-diagonal unit is
  refused (``w`` does not divide ``BLOCK``), and the block-sparse program
  (:mod:`.blocksparse`: only the nonzero ``BLOCK x BLOCK`` tiles of the block-diagonal weight,
  7 per tap for a pair of 24-channel groups, in the stock blocked layout) is the unit that
  competes with the CSP plan, built and scored the same way; the choice weighs every unit that
  plans and the report line names each with its score or its refusal. For ``w`` dividing
  ``BLOCK`` the block-sparse program is refused (the block-diagonal unit runs the same tiles).
* **Groups of exactly one block** (``w = BLOCK``: MobileNet's D1-D9, RegNetX-400MF): the
  block-diagonal unit is refused (it would be the stock grouped conv2d template, which the CSP
  plan already weighs), and the block-sparse program (one nonzero tile per output block and tap,
  each group its own unit, the whole image per tile where it fits) competes with the CSP plan;
  groups of several whole blocks keep the CSP plan alone.

Registered for ``group_conv2d`` under ``csp-relaxed`` (``csp-strict`` keeps the CSP plan alone).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from vta_ext.errors import TemplateRefusal
from vta_ext.packing import BlockedActivation, padding_text
from vta_ext.stock import _gemm_knob_space, _symmetric_padding
from vta_ext.strategy import (KnobSpace, MatchedOp, OpPlan, OpTemplate, register_plan_summary,
                              register_template)
from vta_ext.templates.workload import GroupConv2dWorkload

from .blocksparse import (BlockSparseWorkload, block_sparse_weight, build_block_sparse,
                          tile_count)
from .cache import source_digest
from .candidates import CspWorkload, _shape, data_layout
from .csp_reference import gemm_reference as csp_gemm_reference
from .depthwise import (_block, _UnitCache, bias_twin, build_diagonal, diagonal_bias_gemm,
                        diagonal_inputs, diagonal_reference, diagonal_workload, modelled_cycles,
                        program_epilogue)
from .reference import register_reference
from .lanes import bias_with_lanes, producer_lanes, requested_biases
from .strategy import CspGemmTemplate

__all__ = ["NarrowGroupWorkload", "NarrowGroupTemplate", "competes"]

#: how the build report names the plans
DIAGONAL_TEXT = "GEMM block-diagonal"
SPARSE_TEXT = "GEMM block-sparse"
CSP_TEXT = "the CSP plan"
#: the units, in the order a tie is broken
UNITS = ("csp", "diagonal", "sparse")


@dataclass(frozen=True)
class NarrowGroupWorkload(GroupConv2dWorkload):
    """A grouped conv2d of ``groups`` groups of ``group_width`` channels (channels padded to whole
    blocks: ``in_channels == out_channels``, at least ``groups * group_width``) run by the
    block-diagonal program. :attr:`groups` is the operator's own (the floor reads the operator
    as written from it). ``bias_gemm``: the program adds the bias by one GEMM of a constant block
    (:func:`~.depthwise.diagonal_bias_gemm`)."""

    group_width: int = 1
    bias_gemm: bool = False

    @property
    def channels(self) -> int:
        """The padded channels (:func:`~.depthwise.diagonal_workload` reads them)."""
        return self.in_channels


def competes(op: MatchedOp, config) -> Optional[int]:
    """The channels per group of grouped ``op`` if the units of this module compete with the CSP
    plan: fewer than ``BLOCK_IN`` (the block-diagonal unit), exactly one block or not whole
    blocks (the block-sparse program, :mod:`.blocksparse`); None when the groups are several
    whole blocks (the CSP plan alone)."""
    w = _shape(op.operands[1])[1]
    return w if w <= config.BLOCK_IN or w % config.BLOCK_IN else None


@dataclass(frozen=True)
class _Geometry:
    """What the block-diagonal and block-sparse plans read of a grouped conv2d: the block, the
    activation and output layouts, the workload fields but batch and channels, and the report's
    shape text."""

    block: int
    act: BlockedActivation
    out: BlockedActivation
    fields: Dict[str, int]
    text: str


def _geometry(op: MatchedOp, config, width: int) -> _Geometry:
    """The :class:`_Geometry` of grouped ``op`` (groups of ``width`` channels), or a refusal for
    groups of unequal input and output channels, dilation or blocks that are not square."""
    block = _block(config)
    data, weight = op.operands
    n, c, h, w = _shape(data)
    o, _, kh, kw = _shape(weight)
    groups = int(op.core.attrs.groups)
    if o != c:
        raise TemplateRefusal(f"{o // groups} output against {width} input channels per group: "
                              "the tiles hold whole groups only when they are equal")
    if any(int(d) != 1 for d in op.core.attrs.dilation):
        raise TemplateRefusal(f"dilation {tuple(int(d) for d in op.core.attrs.dilation)}")
    pad_h, pad_w = _symmetric_padding(op)
    sh, sw = (int(s) for s in op.core.attrs.strides)
    _, _, oh, ow = _shape(op.core)
    fields = dict(height=h, width=w, kernel_h=kh, kernel_w=kw, pad_h=pad_h, pad_w=pad_w,
                  stride_h=sh, stride_w=sw, groups=groups, group_width=width)
    return _Geometry(block, BlockedActivation(n, c, h, w, config.BATCH, block),
                     BlockedActivation(n, o, oh, ow, config.BATCH, block), fields,
                     f"{n}x{c}x{h}x{w} * {o}x{width}x{kh}x{kw} g{groups} s{sh} p{pad_h}")


def _diagonal_plan(op: MatchedOp, config, width: int) -> OpPlan:
    """The block-diagonal plan of ``op`` (groups of ``width`` channels), or a refusal saying why
    the unit cannot run it."""
    geo = _geometry(op, config, width)
    if width == geo.block:
        raise TemplateRefusal(f"groups of one {width}-channel block: the block-diagonal program "
                              "is the stock grouped conv2d template, which the CSP plan weighs")
    if geo.block % width:
        raise TemplateRefusal(f"{width} channels per group do not divide the {geo.block}-channel "
                              "block (a group would straddle two weight tiles; padding each group "
                              "would need a channel layout padded inside the activation)")
    np_, cp = geo.act.padded
    wl = NarrowGroupWorkload(batch=np_, in_channels=cp, out_channels=cp, **geo.fields)
    return OpPlan(wl, diagonal_inputs(op, config, wl, width), geo.out, geo.text,
                  padding_text(*geo.act.padding(), ("channels per group (lanes of the diagonal "
                                                    "tile)", width, geo.block)),
                  in_layout=geo.act)


def _sparse_plan(op: MatchedOp, config, width: int) -> OpPlan:
    """The block-sparse plan of ``op`` (:mod:`.blocksparse`), or a refusal saying why it does
    not run it."""
    import tvm

    geo = _geometry(op, config, width)
    block, act = geo.block, geo.act
    data, weight = op.operands
    c = act.c
    if width < block and block % width == 0:
        raise TemplateRefusal(f"groups of {width} channels divide the {block}-channel block: "
                              f"the block-diagonal unit runs the same tiles")
    if not isinstance(weight, tvm.ir.expr.Constant):
        raise TemplateRefusal("the weight is not a constant (its nonzero tiles are packed at "
                              "build time)")
    np_, cp = act.padded
    wl = BlockSparseWorkload(batch=np_, in_channels=c, out_channels=c, **geo.fields)
    tiles = tile_count(c, width, block)
    desc = f"{geo.text}; {tiles} nonzero weight tiles per tap (of {(cp // block) ** 2})"
    bias = _lane_bias(op)         # with the padded channels' lane constants, when asked
    lanes, words = producer_lanes(op, config, geo.out, writes=bias is not op.bias)
    if words:
        desc += f"; {words}"

    def inputs(packer):
        from tvm import relax

        from vta_ext.packing import pack_channel_bias

        d, kept = act.pack(packer, data)
        packer.note_kept(kept)
        args = [d, relax.const(block_sparse_weight(weight.value.numpy(), block), "int8")]
        for vector in (bias, op.multiplier):
            if vector is not None:
                n = cp if vector is not op.bias and vector is bias else c  # with its lanes
                args.append(pack_channel_bias(packer, vector, n, cp, act.batch_block, block))
        return args

    return OpPlan(wl, inputs, geo.out, desc,
                  padding_text(*act.padding(), ("MACs per pixel and tap (lanes of the nonzero "
                                                "tiles)", c * width, tiles * block * block)),
                  in_layout=act, out_lanes=lanes)


def _lane_bias(op: MatchedOp):
    """``op``'s bias with the biases of its padded channels that write the lane constants it is
    asked for appended (:func:`~.lanes.requested_biases`; a constant), else ``op.bias``."""
    import numpy as np
    from tvm import relax

    if requested_biases(op) is None:
        return op.bias
    return relax.const(bias_with_lanes(op).astype(np.int32), "int32")


def _twin_decision(op: MatchedOp, config, wl) -> Tuple[bool, str]:
    """Whether the block-diagonal or block-sparse program of ``wl`` may add ``op``'s bias by a
    GEMM, and the words saying how or why not (:func:`~.depthwise.diagonal_bias_gemm`; the
    block-sparse program's bias GEMM takes its padded channels' lane biases too)."""
    sparse = isinstance(wl, BlockSparseWorkload)
    ranged = dataclasses.replace(op, bias=_lane_bias(op)) if sparse else op
    return diagonal_bias_gemm(ranged, config, wl, "group_conv2d" if sparse else None)


@dataclass
class _Scored:
    """One contender: its plan, VTA cycles and score by the objective (lower is better)."""

    plan: OpPlan
    cycles: int
    score: float
    text: str


class NarrowGroupTemplate(CspGemmTemplate):
    """``group_conv2d`` under ``csp-relaxed``: the CSP plan or, for narrow groups, the
    block-diagonal program, whichever the objective scores better (module docstring)."""

    def __init__(self, strategy: str) -> None:
        super().__init__("group_conv2d", strategy)

    def workload_from_dict(self, values: Dict[str, Any]):
        if "group_width" not in values:
            return CspWorkload(**values)
        return (BlockSparseWorkload if "sparse" in values else NarrowGroupWorkload)(**values)

    # ---------------------------------------------------------------- plan
    def prefetch(self, ops: Sequence[MatchedOp], config) -> None:
        """The CSP plan's solves queued (:meth:`.CspGemmTemplate.prefetch`), and the threads
        that wait for a background solve given the narrow grouped convs' own units to time
        meanwhile, in module order (:meth:`_time_units_ahead`, :func:`~.cache.add_idle_work`):
        their programs do not depend on any solve, and :meth:`_plan` then finds their counts
        kept (:func:`~.depthwise.modelled_cycles`). Nothing is queued under ``footprint`` (the
        units are not compared) nor with tuned records."""
        from vta_ext.options import current_options

        from .cache import add_idle_work, remove_idle_work

        super().prefetch(ops, config)
        remove_idle_work(getattr(self, "_units_idle", None))
        self._units_ahead: Dict[str, MatchedOp] = {}
        options = current_options()
        if options.records is not None or options.objective == "footprint":
            return
        self._units_ahead = {op.name: op for op in ops if competes(op, config) is not None}
        self._units_idle = self._time_units_ahead(config, self._units_ahead)
        add_idle_work(self._units_idle)

    def _time_units_ahead(self, config, ahead: Dict[str, MatchedOp]):
        """Idle work (:func:`~.cache.add_idle_work`): the next operator of ``ahead`` not planned
        yet (:meth:`_plan` removes its own) has its block-diagonal or block-sparse program and
        that program's bias twin built and timed as :meth:`_plan` would (:meth:`_time_units`).
        The counts are the same whenever they are made: they depend on the operator, the
        configuration and the options only."""
        from vta_ext.options import current_options
        from vta_ext.timing import phase

        from .cache import remove_idle_work

        def step() -> bool:
            if not ahead:
                remove_idle_work(step)
                return False
            op = ahead.pop(next(iter(ahead)))
            with phase("plan"):
                self._time_units(op, config, current_options())
            return True
        return step

    def _time_units(self, op: MatchedOp, config, options) -> None:
        """Build and time the block-diagonal or block-sparse program of narrow grouped ``op``
        and its bias twin (:func:`~.depthwise.bias_twin`), as :meth:`_plan` scores them, unless
        the unit cache holds the choice already (:meth:`_unit_cache`: then :meth:`_plan` times
        nothing); a unit that refuses is left for :meth:`_plan` to report."""
        width = competes(op, config)
        own: Dict[str, OpPlan] = {}
        for unit, make in (("diagonal", _diagonal_plan), ("sparse", _sparse_plan)):
            try:
                own[unit] = make(op, config, width)
            except TemplateRefusal:
                continue
        cache = self._unit_cache(op, config, options, own) if own else None
        if cache is not None and cache.load() is not None:
            return
        for plan in own.values():
            try:
                bias_twin(plan.workload, lambda w: self._cycles(op, config, w, options),
                          _twin_decision(op, config, plan.workload))
            except TemplateRefusal:
                continue

    def _plan(self, op: MatchedOp, config) -> OpPlan:
        getattr(self, "_units_ahead", {}).pop(op.name, None)
        width = competes(op, config)
        if width is None:
            return super()._plan(op, config)
        from vta_ext.options import current_options

        options = current_options()
        refused: Dict[str, str] = {}
        plans: Dict[str, OpPlan] = {}
        makers = {"csp": lambda: super(NarrowGroupTemplate, self)._plan(op, config),
                  "diagonal": lambda: _diagonal_plan(op, config, width),
                  "sparse": lambda: _sparse_plan(op, config, width)}
        for unit in UNITS:
            try:
                plans[unit] = makers[unit]()
            except TemplateRefusal as err:
                refused[unit] = str(err)
        if options.objective == "footprint" and "csp" in plans:
            return self._described(plans["csp"], CSP_TEXT, f"objective footprint: the "
                                   f"{DIAGONAL_TEXT} and {SPARSE_TEXT} units are not compared "
                                   "by footprint")
        # the choice is kept on disk and served when the same units plan again
        own = {u: p for u, p in plans.items() if u != "csp"}
        cache = self._unit_cache(op, config, options, own) if own else None
        hit = cache.load() if cache is not None else None
        cached = self._cached_unit(plans, width, config, hit) if hit is not None else None
        if cached is not None:
            return cached

        scored: Dict[str, _Scored] = {}
        biases: Dict[str, Dict[str, Any]] = {}

        def store(unit: str, why: str) -> None:
            if cache is not None:
                cache.store({"unit": unit, "why": why, "planned": sorted(plans),
                             **biases.get(unit, {})})
        for unit, plan in plans.items():
            try:
                scored[unit] = self._score(op, config, plan, options)
            except TemplateRefusal as err:
                refused[unit] = str(err)
        for own in ("diagonal", "sparse"):
            if own in scored:
                scored[own], biases[own] = self._bias_twin(op, config, scored[own], options)
        cpu = self._cpu(op, config, options)
        if not scored:
            raise TemplateRefusal(f"{self.strategy}: no unit runs this grouped conv2d: " + "; ".join(
                f"{self._name(u, width, config)}: {refused.get(u)}" for u in UNITS))
        unit = min(scored, key=lambda u: (scored[u].score, UNITS.index(u)))
        best = scored[unit]
        if cpu is not None and cpu[0] < best.score:
            units = [f"{s.text} for {self._name(u, width, config)}" for u, s in scored.items()]
            units += [f"{self._name(u, width, config)} refused ({r})" for u, r in refused.items()]
            why = f"{self.strategy}: end to end cheaper on the CPU: {cpu[1]}, against {'; '.join(units)}"
            store("cpu", why)
            raise TemplateRefusal(why)
        others = [f"{scored[u].text} ({scored[u].score / max(best.score, 1e-12):.2f}x) for "
                  f"{self._name(u, width, config)}" for u in UNITS if u in scored and u != unit]
        others += [f"{self._name(u, width, config)} refused ({refused[u]})" for u in UNITS
                   if u in refused]
        if len(scored) > 1:
            why = f"{self._what(options)}: {best.text} against {'; '.join(others)}"
        else:
            why = f"the only unit that runs it ({best.text}); {'; '.join(others)}"
        store(unit, why)
        return self._described(best.plan, self._name(unit, width, config), why)

    def _unit_cache(self, op: MatchedOp, config, options,
                    own: Dict[str, OpPlan]) -> Optional[_UnitCache]:
        """The persistent entry of the unit chosen for narrow grouped ``op`` (``<cache_dir>/units/``,
        :class:`~.depthwise._UnitCache`), or None with tuned records (looked up per plan) or
        when the CSP plan's own entry was not kept (a solver timeout may pass later). The CSP
        plan's entry (an embedding, or a refusal: the CPU end to end) is a definite decision, so
        the units' comparison, or the block-diagonal unit's against the CPU, is one too.

        The key holds what the choice depends on: the CSP plan's own plan cache key (the
        operator, the configuration's value, the epilogue's shape, the objective with its host
        model, the knobs option, the producer's layout, the bias signature and the code), the
        block-diagonal and block-sparse plans' workloads (``own``, by unit) with their knobs
        options, which operands are constants (their host packing is priced end to end) and
        :func:`~.cache.source_digest`."""
        import tvm

        if options.records is not None:
            return None
        base = self._base(op)
        layouts = self._layouts(options.layout, base, config)
        csp = self._plan_cache(config, base, layouts, op, options,
                               self._stock_contender(op, config, options))
        if not csp.path.exists():     # the CSP plan was not kept (a solver timeout): nor is this
            return None
        units = {u: [dataclasses.asdict(p.workload),
                     options.knobs_for(self.kind, self.strategy, p.workload, config)[0]]
                 for u, p in sorted(own.items())}
        constants = [None if e is None else isinstance(e, tvm.ir.expr.Constant)
                     for e in (*op.operands[1:], op.bias, op.multiplier)]
        text = json.dumps({"v": 4, "units": "narrow-group", "strategy": self.strategy,
                           "csp": csp.key, "own": units, "constants": constants,
                           "code": source_digest()}, sort_keys=True, default=str)
        return _UnitCache(hashlib.sha256(text.encode()).hexdigest()[:32], ("unit", "why", "planned"))

    def _cached_unit(self, plans: Dict[str, OpPlan], width: int, config,
                     entry: Dict[str, Any]) -> Optional[OpPlan]:
        """The plan of ``plans`` that a unit cache entry chose, with the entry's sentence, no unit
        built nor timed; a refusal when the entry chose the CPU. None when the units that plan now
        are not the entry's (then the choice is made again and the entry rewritten), or for an
        entry naming no unit."""
        unit, why = entry["unit"], entry["why"]
        if entry["planned"] != sorted(plans) or unit not in ("cpu", *plans):
            return None
        if unit == "cpu":
            raise TemplateRefusal(why)
        plan = plans[unit]
        if unit in ("diagonal", "sparse"):
            plan = self._with_bias(plan, entry.get("bias_gemm", False), entry.get("bias_words", ""))
        return self._described(plan, self._name(unit, width, config), why)

    def _bias_twin(self, op: MatchedOp, config, add: _Scored, options
                   ) -> Tuple[_Scored, Dict[str, Any]]:
        """The block-diagonal or block-sparse contender ``add`` (the bias by the ALU ADD) or its
        twin that adds the bias by a GEMM, whichever has fewer VTA cycles
        (:func:`~.depthwise.bias_twin`; the host work is the same), with the choice's words in
        its report text; and the unit cache entry's fields that record it."""
        scored = {add.plan.workload: add}

        def cycles_of(wl) -> int:
            if wl not in scored:
                scored[wl] = self._score(op, config, dataclasses.replace(add.plan, workload=wl),
                                         options)
            return scored[wl].cycles
        wl, _, words = bias_twin(add.plan.workload, cycles_of,
                                 _twin_decision(op, config, add.plan.workload))
        best = scored[wl]
        best = dataclasses.replace(best, plan=self._with_bias(best.plan, wl.bias_gemm, words))
        return best, {"bias_gemm": wl.bias_gemm, "bias_words": words}

    @staticmethod
    def _with_bias(plan: OpPlan, bias_gemm: bool, words: str) -> OpPlan:
        """The block-diagonal or block-sparse ``plan`` with the bias by a GEMM when ``bias_gemm``,
        and ``words``
        (how it adds the bias and why) in its report text."""
        wl = dataclasses.replace(plan.workload, bias_gemm=bias_gemm)
        text = f"{plan.description}; {words}" if words else plan.description
        return dataclasses.replace(plan, workload=wl, description=text)

    def _described(self, plan: OpPlan, name: str, why: str) -> OpPlan:
        """``plan`` with the choice between the units (``name`` the chosen one) in its report
        text."""
        return dataclasses.replace(plan, description=f"{plan.description}; {name} chosen by "
                                                     f"{self.strategy} over the other unit: {why}")

    @staticmethod
    def _name(unit: str, width: int, config) -> str:
        if unit == "csp":
            return CSP_TEXT
        block = config.BLOCK_IN
        if unit == "sparse":
            return f"{SPARSE_TEXT} (groups of {width} channels, only the nonzero {block}x{block} weight tiles)"
        per = {0: "groups", 1: "one group"}.get(block // width if block % width == 0 else 0,
                                                  f"{block // width} groups")
        return f"{DIAGONAL_TEXT} ({per} of {width} channels per {block}x{block} weight tile)"

    @staticmethod
    def _what(options) -> str:
        return {"end-to-end": "fewest cycles end to end", "combined": "fastest combined"}.get(
            options.objective, "fewest cycles on the cycle model")

    def _cycles(self, op: MatchedOp, config, wl, options) -> int:
        """The cycle model's count of ``wl``'s program under the build's knobs option
        (:func:`~.depthwise.modelled_cycles`: built, or served by a program of the same epilogue
        shape; a refusal when it does not build)."""
        knobs = options.knobs_for(self.kind, self.strategy, wl, config)[0]
        return modelled_cycles(self.kind, self.strategy, config, wl, op.epilogue, knobs)

    def _score(self, op: MatchedOp, config, plan: OpPlan, options) -> _Scored:
        """``plan`` built and scored by the objective (a refusal when it does not build)."""
        from .choice import blocked_output, operand_pack_bytes, plan_host_bytes

        cycles = self._cycles(op, config, plan.workload, options)
        if options.objective == "end-to-end":
            nbytes = (plan_host_bytes(op, plan.in_layout, plan.out_layout,
                                      blocked_output(op, config))
                      + operand_pack_bytes(op, plan.inputs))
            score = cycles + options.host.layout_cycles(nbytes)
            return _Scored(plan, cycles, score, f"{score:,.0f} cycles end to end ({cycles:,} VTA "
                                                f"+ {nbytes:,} B host layout)")
        if options.objective == "combined":
            from .hosttime import relayout_seconds

            src = getattr(plan.in_layout, "src_shape", _shape(op.operands[0]))
            host = relayout_seconds(plan.in_layout, src, plan.out_layout, 5)[1]
            score = cycles / (config.CLOCK_MHZ * 1e6) + host
            return _Scored(plan, cycles, score, f"{score * 1e3:.3f} ms (cycles {cycles:,}, host "
                                                f"{host * 1e3:.3f} ms)")
        return _Scored(plan, cycles, cycles, f"{cycles:,} cycles")

    def _cpu(self, op: MatchedOp, config, options) -> Optional[Tuple[float, str]]:
        """``(score, text)`` of leaving ``op`` on the CPU under the ``end-to-end`` objective (as
        :func:`~.choice.choose` prices it), else None."""
        if options.objective != "end-to-end":
            return None
        from .choice import blocked_output, cpu_cost, cpu_text

        cost = cpu_cost(op, blocked_output(op, config), options.host)
        return cost[2], cpu_text(cost, options.host)

    def _plan_of(self, op: MatchedOp, config, cand, why: str, n_usable: int, notes) -> OpPlan:
        """The CSP plan with the layout its activation is taken in (the host layout pricing of
        the choice between the units needs it)."""
        plan = super()._plan_of(op, config, cand, why, n_usable, notes)
        return dataclasses.replace(plan, in_layout=data_layout(cand))

    # ---------------------------------------------------------------- build
    def build(self, config, workload, epilogue: Sequence[tuple], knobs) -> Any:
        if isinstance(workload, BlockSparseWorkload):
            return build_block_sparse(config, workload, program_epilogue(workload, epilogue),
                                      knobs)
        if isinstance(workload, NarrowGroupWorkload):
            return build_diagonal(config, workload, epilogue, knobs)
        return super().build(config, workload, epilogue, knobs)

    def knob_space(self, config, workload, epilogue: Sequence[tuple]) -> KnobSpace:
        """The conv2d knobs of the block-diagonal program, none for the block-sparse one, or the
        CSP plan's."""
        if isinstance(workload, BlockSparseWorkload):
            return KnobSpace()
        if isinstance(workload, NarrowGroupWorkload):
            return _gemm_knob_space(config, diagonal_workload(config, workload),
                                    program_epilogue(workload, epilogue))
        return super().knob_space(config, workload, epilogue)


def reference(config, wl, epilogue, rng):
    """The tuner's numpy reference: the stock grouped conv2d one on the block-diagonal program's
    workload (:func:`~.depthwise.diagonal_reference`), or the CSP plan's; the block-sparse
    program has no knobs, so it is never a tuning task."""
    if isinstance(wl, BlockSparseWorkload):
        raise LookupError("no tuning reference for the block-sparse program: it has no knobs")
    if isinstance(wl, NarrowGroupWorkload):
        return diagonal_reference(config, wl, epilogue, rng)
    return csp_gemm_reference(config, wl, epilogue, rng)


def plan_summary(template: OpTemplate, plan: OpPlan, config) -> str:
    """``"csp-relaxed GEMM block-diagonal w4"``."""
    return f"{template.strategy} {DIAGONAL_TEXT} w{plan.workload.group_width}"


def sparse_summary(template: OpTemplate, plan: OpPlan, config) -> str:
    """``"csp-relaxed GEMM block-sparse w24"``."""
    return f"{template.strategy} {SPARSE_TEXT} w{plan.workload.group_width}"


register_plan_summary(NarrowGroupWorkload, plan_summary)
register_plan_summary(BlockSparseWorkload, sparse_summary)
register_template("group_conv2d", "csp-relaxed", NarrowGroupTemplate("csp-relaxed"))
register_reference("group_conv2d", "csp-relaxed", reference)
