"""The CSP strategies ``csp-strict`` and ``csp-relaxed`` in :mod:`vta_ext`'s strategy registry.

``import tvm_csp_embed`` registers both and makes ``csp-relaxed`` the default of
``relax.build(mod, target="ext_vta")``; ``vta_ext.build_options(strategy="stock")`` keeps the stock
templates. Per matched operator (conv2d, group conv2d, dense; average pools and the residual add
fall back to ``stock``; max pools choose between the ALU template's direct and separable schedules
in :mod:`.pool` under ``csp-relaxed``; depthwise convolutions choose between the ALU template and the GEMM core in
:mod:`.depthwise` under ``csp-relaxed``, and grouped convolutions of fewer than ``BLOCK_IN``
channels per group between this template's plan and the GEMM block-diagonal program in
:mod:`.grouped`, whose template replaces this one for ``group_conv2d`` under ``csp-relaxed``):

1. the operator becomes a :class:`~tvm_csp_embed.workload.Workload` in each candidate layout of its
   free dims (``build_options(layout=...)``: ``NCHW``, ``NHWC`` or ``auto`` = both; under
   ``csp-relaxed``, ``auto`` adds the conv2d variants whose reduction is one fused dim,
   ``fused-rs`` and ``fused-crs``, where they pad the reduction less than the stock mapping:
   :func:`fused_variants`);
2. the solver (:func:`tvm_csp_embed.cache.cached_embeddings`, one MiniZinc process, cached on
   disk) gives the best embeddings of the GEMM under the strategy's constraint set (``strict``: the
   stock mapping family; ``relaxed``: stencil unrolling, fused z, strides) that cost the solver no
   more than the stock mapping (:func:`stock_mapping_cost`: less padding, or as little);
3. each embedding becomes a packed GEMM program (:mod:`tvm_csp_embed.codegen`) with its knob space;
   under ``csp-relaxed`` a constant bias is folded into its spare reduction lanes where it fits
   (:mod:`tvm_csp_embed.codegen.biasfold`, :func:`~.candidates.fold_candidate`; the report row says
   why when the ALU ADD stays), and under the objectives that price host work
   (:data:`HOST_PRICED`) the same embedding with the ADD kept competes too; a bias that stays
   on the ALU has a twin that adds it by one GEMM of a constant block per output tile
   (:func:`~.candidates.gemm_twin`; also the twin with the ADD kept, where the bias folds), and
   the faster of the two is kept; an embedding whose output-channel loop has an odd number of
   tiles has a twin padded by one tile of zero weights, so that the loop carries two virtual
   threads (:func:`~.candidates.thread_padded_twins`, offered when the knob model estimates it
   faster);
4. the candidates are ranked by ``build_options(objective=...)``: ``cycles`` (the cycle model of the
   built program; the two best by a static estimate are built), ``combined`` (cycles at the
   configuration's clock plus the measured host relayout time) or ``footprint`` (bytes of the packed
   tensors). The cycle model times up to :data:`CYCLE_RANKED` candidates, best static estimate
   first, within :data:`RANK_FACTOR` of the best (in practice all of them: the static estimate
   misjudges the operand-swapped embeddings). Under ``csp-relaxed`` the stock template's own plan
   of the operator is timed too, at the knob point it would be built at (under the knobs option
   ``cycles`` the best of TPS and its two-thread variants, :mod:`.stock_knobs`; the ``stock``
   strategy keeps TPS) (the stock-family embedding may have been cut from the timed set,
   or differ from the stock program in a few instructions) and is chosen when it is at least as
   fast: ``csp-relaxed`` is never slower than ``stock`` by its objective, and the report says
   ``stock template chosen by csp-relaxed: ...``. The choice is cached on disk next to the
   embeddings;
5. the plan emits the host relayout through the offload pass's packer and the output layout that
   unpacks it.

Steps 1-3 live in :mod:`.candidates`, step 4 in :mod:`.choice`, the persistent plan cache in
:mod:`.plan_cache`; this module holds the template (:class:`CspGemmTemplate`: plan, build, knob
space) and registers the strategies.

A solver timeout or "no embedding" keeps the operator on the ``stock`` template, and the build
report says so (``STOCK FALLBACK: ...``). Only a :class:`~vta_ext.errors.TemplateRefusal` (from the
stock fallback or an epilogue the ALU cannot run) keeps an operator on the CPU.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import vta_ext  # noqa: F401  (registers the stock strategy)
from vta_ext.errors import TemplateRefusal
from vta_ext.strategy import (GridPoints, KnobSpace, MatchedOp, OpPlan, OpTemplate, PrunedPoints,
                              Strategy, get_template, register_strategy, register_template,
                              set_default_strategy)
from vta_ext.timing import phase

from .cache import add_idle_work, queue_solves, remove_idle_work, solved, start_queued
from .candidates import (CONV_LAYOUTS, DEFAULT_SOLUTIONS, DEFAULT_TIMEOUT, MODES, STRATEGY_NAMES,
                         Candidate, CspWorkload, _conv_params, _packed, _shape, bias_signature,  # noqa: F401
                         candidates, fold_candidate, fused_variants, gemm_twin, layout_solves, operator_workload,
                         packed_inputs, kept_twin, packed_of, program_epilogue, settle, solve_request, stock_mapping_cost,
                         unfolded)
from .choice import (AGREEMENT_SLACK, CPU, CYCLE_RANKED, RANK_FACTOR, STOCK, STOCK_COMPARED,
                     StockContender, _choice_key, _contender_key, blocked_output, choose,
                     consumer_key, gc_paused,
                     host_relayout_seconds, objective_key, plan_host_bytes)
from .codegen.build import build_gemm
from .fusion import PoolSupport, ResidualSupport
from .codegen.poolstage import split_pool
from .codegen.knobs import KnobPoint, cached_grid, cycle_point, fallback_point, knob_names, tps_point
from .codegen.knobs import seed_tps_point
from .operators import LAYOUTS, OPERATOR_KINDS, operator_params, operator_text
from .lanes import producer_lanes, requested_biases
from .plan_cache import PLAN_VERSION, PlanCache, _SEARCHES
from .stock_knobs import StockSearch, searches
from .solve import SolverError

__all__ = ["MODES", "CspWorkload", "CspGemmTemplate", "Candidate", "PlanCache", "STRATEGY_NAMES",
           "DEFAULT_SOLUTIONS", "DEFAULT_TIMEOUT", "STOCK_COMPARED", "STOCK", "CPU", "operator_workload",
           "AGREEMENT_SLACK", "CYCLE_RANKED", "RANK_FACTOR", "PLAN_VERSION", "CONV_LAYOUTS",
           "packed_of", "candidates", "solve_request", "stock_mapping_cost", "objective_key",
           "plan_host_bytes", "blocked_output", "host_relayout_seconds", "fused_variants"]

logger = logging.getLogger("tvm_csp_embed")

#: how the report names the loop dims of the conv2d and dense workloads
#: the objectives that price host work: under them a folded candidate has a twin with the bias
#: kept on the ALU (:func:`~.candidates.kept_twin`), and the objective chooses between the two
HOST_PRICED = ("end-to-end", "combined")

DIM_WORDS = {"n": "batch", "b": "batch", "c": "in channels", "i": "in features", "k": "out channels",
             "o": "out features", "r": "filter rows", "s": "filter columns", "oh": "output rows",
             "ow": "output columns", "rs": "filter rows x columns (fused)",
             "crs": "in channels x filter rows x columns (fused)"}




# ------------------------------------------------------------------------------------ template
class CspGemmTemplate(OpTemplate):
    """The CSP template of a GEMM operator kind (conv2d, dense) under one CSP strategy."""

    workload_type = CspWorkload
    #: the residual stage this template's programs take (``vta_ext.offload.fusion`` reaches it
    #: through the template, never by importing the plugin)
    residual = ResidualSupport()
    #: the max pool stage this template's convs take (``vta_ext.offload.fusion``, the same way)
    pool = PoolSupport()

    def __init__(self, kind: str, strategy: str) -> None:
        self.kind = kind
        self.strategy = strategy
        self.mode = MODES[strategy]
        self.report_text = f"{strategy} embedding"

    def workload_from_dict(self, values: Dict[str, Any]) -> CspWorkload:
        return CspWorkload(**values)

    # ---------------------------------------------------------------- plan
    def _base(self, op: MatchedOp) -> CspWorkload:
        if self.kind in OPERATOR_KINDS:
            return CspWorkload(self.kind, operator_params(self.kind, op), layout=LAYOUTS[self.kind])
        if self.kind in ("conv2d", "group_conv2d"):
            return CspWorkload(self.kind, _conv_params(op))
        if self.kind == "dense":
            (n, k), (m, _) = _shape(op.operands[0]), _shape(op.operands[1])
            return CspWorkload("dense", (("n", n), ("k", k), ("m", m)))
        raise TemplateRefusal(f"no CSP template for {self.kind}")

    def _layouts(self, layout: str, base: Optional[CspWorkload] = None, config=None) -> List[str]:
        if self.kind in OPERATOR_KINDS:
            return [LAYOUTS[self.kind]]  # the operator's own layout only
        if self.kind == "dense":
            return ["NCHW"]
        if layout != "auto":
            return [layout]
        fused = fused_variants(base, config) if base is not None and self.mode == "relaxed" else []
        return ["NCHW", "NHWC"] + fused

    def _stock_workload(self, plan: OpPlan) -> CspWorkload:
        """The workload of the stock template's ``plan`` under this strategy."""
        return CspWorkload(self.kind, (), stock=tuple(dataclasses.asdict(plan.workload).items()))

    def _stock(self, op: MatchedOp, config, reason: str, chosen: bool = False) -> OpPlan:
        """The stock template's plan: a fallback (no usable embedding), or ``chosen`` because it is
        at least as good as every embedding by the objective. Under ``csp-relaxed`` and the knobs
        option ``cycles`` its program is built at the searched point (:mod:`.stock_knobs`)."""
        from vta_ext.options import current_options
        from vta_ext.templates.errors import KnobError

        try:
            plan = get_template(self.kind, "stock").plan(op, config)
        except TemplateRefusal as err:  # a kind without a stock template (tvm_csp_embed.operators)
            raise TemplateRefusal(f"{self.strategy}: {reason}; no stock template to fall back "
                                  f"to for {self.kind}") from err
        text = (f"stock template chosen by {self.strategy}: {reason}" if chosen else
                f"STOCK FALLBACK ({self.strategy}: {reason})")
        workload = self._stock_workload(plan)
        search = self._search(plan, op, config, current_options())
        if search is not None:
            try:
                point = search.point()
            except (KnobError, TemplateRefusal) as err:
                text += f"; knobs: the template's own (the point search failed: {err})"
            else:
                workload = search.place(point.knobs)
                text += f"; {point.text(self.strategy)}"
        lanes, words = producer_lanes(op, config, plan.out_layout, writes=False)
        # with the stock plan's activation layout: the grouped units' choice prices its packing
        return OpPlan(workload, plan.inputs, plan.out_layout,
                      f"{plan.description}; {text}" + (f"; {words}" if words else ""),
                      plan.padding, in_layout=plan.in_layout, out_lanes=lanes)

    def _search(self, plan: OpPlan, op: MatchedOp, config, options) -> Optional[StockSearch]:
        """The point search of the stock template's ``plan`` for ``op`` (:mod:`.stock_knobs`),
        or None when the build does not search (:func:`~.stock_knobs.searches`)."""
        scw = self._stock_workload(plan)
        policy = options.knobs_for(self.kind, self.strategy, scw, config)[0]
        if not searches(policy, self.mode):
            return None

        def cycles_of(workload: CspWorkload) -> int:
            from .shape_cycles import modelled_cycles

            return modelled_cycles(self.kind, self.strategy, config, workload, op.epilogue, policy)

        return StockSearch(config, plan.workload, tuple(op.epilogue),
                           lambda knobs: dataclasses.replace(scw, stock_knobs=knobs), cycles_of)

    def plan(self, op: MatchedOp, config) -> OpPlan:
        # the cyclic garbage collector pauses meanwhile (:func:`~.choice.gc_paused`)
        with gc_paused():
            return self._plan(op, config)

    def _plan(self, op: MatchedOp, config) -> OpPlan:
        from vta_ext.options import current_options

        options = current_options()
        base = self._base(op)
        layouts = self._layouts(options.layout, base, config)
        getattr(self, "_ahead", {}).pop(_ahead_key(base, layouts, op.epilogue), None)
        contender = self._stock_contender(op, config, options)
        cache = self._plan_cache(config, base, layouts, op, options, contender)
        if cache is not None:
            hit = cache.load()
            if hit is not None:
                return self._cached_plan(op, config, hit)
        statuses: Dict[str, str] = {}
        try:
            cands, notes = candidates(config, base, self.mode, layouts, op.epilogue,
                                      solutions=DEFAULT_SOLUTIONS, timeout=DEFAULT_TIMEOUT,
                                      statuses=statuses)
        except SolverError as err:
            return self._stock(op, config, f"the solver failed: {err}")  # not cached: may pass later
        usable = []
        for c in cands:
            if not c.refused:
                usable.append(fold_candidate(op, c, self.kind))
                kept = (kept_twin(c) if c.workload.bias_lanes and options.objective in HOST_PRICED
                        else None)
                if kept is not None:
                    usable.append(kept)
                # the bias by a GEMM is the twin of the one that keeps it off the lanes
                twin = gemm_twin(op, c if kept is None else kept, self.kind)
                if twin is not None:
                    usable.append(twin)
        if not usable:
            why = "; ".join(notes + [f"{c.label}: {c.refused}" for c in cands]) or "no embedding"
            if cache is not None and "timeout" not in statuses.values():  # a timeout may pass later
                cache.store({"plan": "fallback", "why": why})
            return self._stock(op, config, why)
        with phase("choice"):
            best, why = self._choose(config, base, layouts, usable, op, options, contender)
        if best is None:
            if cache is not None:
                cache.store({"plan": "fallback", "why": why})
            return self._stock(op, config, why)
        if best is STOCK:
            if cache is not None:
                cache.store({"plan": "stock", "why": why})
            return self._stock(op, config, why, chosen=True)
        if best is CPU:
            if cache is not None:
                cache.store({"plan": "cpu", "why": why})
            raise TemplateRefusal(f"{self.strategy}: {why}")
        if cache is not None:
            policy = options.knobs_for(self.kind, self.strategy, best.workload, config)[0]
            point = (_SEARCHES[policy](config, best.packed, program_epilogue(best.workload, op.epilogue))
                     if isinstance(policy, str) and policy in _SEARCHES else None)
            cache.store({"plan": "embedding", "why": why, "workload": dataclasses.asdict(best.workload),
                         "usable": len(usable), "notes": notes, "policy": policy if point else None,
                         "knobs": None if point is None else point.knobs})
        return self._plan_of(op, config, best, why, len(usable), notes)

    def prefetch(self, ops: Sequence[MatchedOp], config) -> None:
        """Queue the solves of the distinct workloads of ``ops`` (every candidate layout that is
        not a dim permutation of another, :func:`~.candidates.layout_solves`;
        :func:`~tvm_csp_embed.cache.queue_solves`), which :meth:`start_prefetched` starts in the
        module's operator order, every template's together, as a bounded pool of MiniZinc
        processes in the background (:func:`~tvm_csp_embed.cache.solve_concurrently`):
        :meth:`plan` waits only for its own operator's solves, so planning the first operators
        overlaps solving the later ones."""
        from vta_ext.options import current_options

        options = current_options()
        ahead = {}
        for op in ops:
            try:
                base = self._base(op)
                layouts = self._layouts(options.layout, base, config)
                mine = [req for _, req, source in layout_solves(
                    config, base, self.mode, layouts, timeout=DEFAULT_TIMEOUT)
                    if source is None]   # the others: permuted
            except Exception:  # noqa: BLE001 -- plan() meets the same error and reports it
                continue
            queue_solves(op.name, mine)
            ahead.setdefault(_ahead_key(base, layouts, op.epilogue),
                             (base, layouts, op.epilogue, [r.key for r in mine]))
        remove_idle_work(getattr(self, "_idle", None))
        self._ahead = ahead
        self._idle = self._look_ahead(config, ahead)
        add_idle_work(self._idle)

    def start_prefetched(self, order: Sequence[str]) -> None:
        """Start the solves every CSP template's :meth:`prefetch` queued, in the operator order
        ``order`` (:func:`~tvm_csp_embed.cache.start_queued`; the first template called starts
        them all)."""
        start_queued(order)

    def _look_ahead(self, config, ahead: Dict[tuple, tuple]):
        """Idle work (:func:`~.cache.add_idle_work`) while :meth:`plan` waits for a solve: the
        candidates of the next operator in ``ahead`` whose solves are done (their packed
        programs and knob points, kept in their caches for its own :meth:`plan`, which removes
        it from ``ahead``)."""
        def step() -> bool:
            for key, (base, layouts, epilogue, keys) in ahead.items():
                if all(map(solved, keys)):
                    del ahead[key]
                    with phase("plan"):
                        try:
                            candidates(config, base, self.mode, layouts, epilogue,
                                       solutions=DEFAULT_SOLUTIONS, timeout=DEFAULT_TIMEOUT)
                        except Exception:  # noqa: BLE001 -- its plan() reports it
                            pass
                    break
            else:
                if not ahead:
                    remove_idle_work(step)
                return False
            if not ahead:
                remove_idle_work(step)
            return True
        return step

    def _plan_cache(self, config, base: CspWorkload, layouts, op: MatchedOp, options, contender
                    ) -> Optional[PlanCache]:
        """The persistent plan cache entry of this operator (None with tuned records: a record
        is looked up per candidate, after the candidates are known)."""
        if options.records is not None:
            return None
        knobs = options.knobs_for(self.kind, self.strategy, base, config)[0]
        key = _choice_key(config, base, self.mode, layouts, objective_key(options), op.epilogue,
                          ["plan", PLAN_VERSION, knobs], _contender_key(contender), op.input_layout,
                          bias_signature(op), consumer_key(op))
        return PlanCache(key)

    def _cached_plan(self, op: MatchedOp, config, entry: Dict[str, Any]) -> OpPlan:
        """The plan a :class:`PlanCache` entry records, rebuilt without solving or timing."""
        kind = entry["plan"]
        if kind == "cpu":
            raise TemplateRefusal(f"{self.strategy}: {entry['why']}")
        if kind in ("stock", "fallback"):
            return self._stock(op, config, entry["why"], chosen=kind == "stock")
        cw = CspWorkload(**entry["workload"])
        pg = packed_of(cw, config)
        # the fold decided again: the key holds what it depends on (bias_signature), so the
        # decision is the entry's
        cand = settle(fold_candidate(op, Candidate(unfolded(cw), pg.embedding, pg), self.kind))
        if cand.workload.bias_lanes and not cw.bias_lanes:
            cand = kept_twin(cand)
        twin = gemm_twin(op, cand, self.kind)
        if cw.bias_gemm and twin is not None:
            cand = twin
        if cand.workload != cw:
            raise RuntimeError(f"plan cache entry {entry.get('key')}: its bias fold "
                               f"({cw.bias_lanes} lanes) is not the one decided now "
                               f"({cand.bias_note}); delete it")
        if entry.get("knobs"):     # the knob point found when the plan was made: no search again
            seed_tps_point(config, pg, program_epilogue(cw, op.epilogue), entry["knobs"],
                           "cycles" if entry.get("policy") == "cycles" else "bytes")
        return self._plan_of(op, config, cand, entry["why"], int(entry["usable"]), list(entry["notes"]))

    def _stock_contender(self, op: MatchedOp, config, options) -> Optional[StockContender]:
        """The stock template's contender for ``op`` when the objective compares it (cycles or
        combined, under a constraint set of :data:`STOCK_COMPARED`), else None (also when the
        stock template refuses the operator); with its point search when the build searches
        one (:meth:`_search`), which runs only if the contender is timed."""
        if options.objective == "footprint" or self.mode not in STOCK_COMPARED:
            return None
        try:
            plan = get_template(self.kind, "stock").plan(op, config)
        except TemplateRefusal:
            return None
        scw = self._stock_workload(plan)
        return StockContender(plan, scw, options.knobs_for(self.kind, self.strategy, scw, config)[0],
                              self._search(plan, op, config, options))

    def _choose(self, config, base, layouts, usable: List[Candidate], op: MatchedOp, options,
                contender) -> Tuple[Any, str]:
        """The candidate the objective prefers (or :data:`~.choice.STOCK` / :data:`~.choice.CPU`)
        and the sentence saying why (:func:`.choice.choose`)."""
        return choose(self.kind, self.strategy, self.mode, config, base, layouts, usable, op,
                      options, contender)

    def _plan_of(self, op: MatchedOp, config, cand: Candidate, why: str, n_usable: int,
                 notes: List[str]) -> OpPlan:
        pg = cand.packed
        lane_bias = requested_biases(op)
        writes = lane_bias is not None      # by its packed bias, or by its fold's digits
        lanes, words = producer_lanes(op, config, pg.operands["C"].host, writes)
        inputs = packed_inputs(op, cand, lane_bias if lanes is not None and writes else None)
        e = cand.embedding
        unrolled = ", ".join(f"{t} stencil-unrolled over {'/'.join(d)}" for t, d in e.unrolled.items())
        desc = (f"{_op_text(cand.workload)}; embedding {e.mapping_str()} in layout "
                f"{cand.workload.layout} (A<-{e.binding['A']}, B<-{e.binding['B']}"
                + (f"; {unrolled}" if unrolled else "") + f"); chosen for {why}")
        if cand.bias_note:
            desc += "; " + cand.bias_note
        if words:
            desc += "; " + words
        if notes:
            desc += "; " + "; ".join(notes)
        pads = ", ".join(f"{DIM_WORDS.get(d, d)} {e.workload.extents[e.workload.dims.index(d)]}->"
                         f"{e.padded_extents[d]}" for d in e.padding)
        return OpPlan(cand.workload, inputs, pg.operands["C"].host, desc, pads, out_lanes=lanes)

    # ---------------------------------------------------------------- build
    def build(self, config, workload: CspWorkload, epilogue: Sequence[tuple], knobs) -> Any:
        if workload.stock:
            stock = get_template(self.kind, "stock")
            if workload.stock_knobs and knobs == "cycles":    # the point csp-relaxed searched
                knobs = dict(workload.stock_knobs)
            return stock.build(config, stock.workload_from_dict(dict(workload.stock)), epilogue, knobs)
        epilogue, pool = split_pool(epilogue)
        if pool is not None:
            return build_gemm(config, packed_of(workload, config),
                              program_epilogue(workload, epilogue), knobs, pool=pool)
        return build_gemm(config, packed_of(workload, config), program_epilogue(workload, epilogue),
                          knobs)

    def knob_space(self, config, workload: CspWorkload, epilogue: Sequence[tuple]) -> KnobSpace:
        if workload.stock:
            stock = get_template(self.kind, "stock")
            return stock.knob_space(config, stock.workload_from_dict(dict(workload.stock)), epilogue)
        pg = packed_of(workload, config)
        epilogue = program_epilogue(workload, epilogue)
        grid = cached_grid(config, pg, epilogue)
        # the dicts and reasons are built when read
        points = GridPoints([(grid, np.flatnonzero(grid.valid))])
        pruned = PrunedPoints([(grid, np.flatnonzero(~grid.valid))])
        tps = tps_point(config, pg, epilogue)
        fb = fallback_point(config, pg, epilogue)
        fast = cycle_point(config, pg, epilogue)
        return KnobSpace(knob_names(pg), points, pruned,
                         dict(tps.knobs) if tps else None,
                         dict(fb.knobs) if isinstance(fb, KnobPoint) else None,
                         dict(fast.knobs) if fast else None)


def _ahead_key(base: CspWorkload, layouts, epilogue) -> tuple:
    """What an operator's candidates depend on (:meth:`CspGemmTemplate._look_ahead`)."""
    return base, tuple(layouts), repr(epilogue)


def _op_text(cw: CspWorkload) -> str:
    if cw.op in OPERATOR_KINDS:
        return operator_text(cw)
    p = cw.p
    if cw.op in ("conv2d", "group_conv2d"):
        g = p.get("g", 1)
        return (f"{p['n']}x{p['c']}x{p['h']}x{p['w']} * {p['k']}x{p['c'] // g}x{p['kh']}x{p['kw']}"
                f"{f' g{g}' if g > 1 else ''} s{p['sh']} p{p['pt']}")
    return f"{p['n']}x{p['k']} * {p['m']}x{p['k']}"


# ------------------------------------------------------------------------------------ registry
for _name in STRATEGY_NAMES:
    register_strategy(Strategy(_name, f"the MiniZinc-solved embeddings of tvm_csp_embed "
                                      f"({MODES[_name]} constraints)", fallback="stock"))
    for _kind in ("conv2d", "group_conv2d", "dense") + OPERATOR_KINDS:
        register_template(_kind, _name, CspGemmTemplate(_kind, _name))
set_default_strategy("csp-relaxed")
