"""The offload pass itself: :func:`OffloadToVTA`, run by the ``ext_vta`` pipeline."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

import tvm
from tvm import relax

from ..config import VTAConfig
from ..errors import TemplateRefusal
from ..heap import frozen_heap
from ..options import current_options
from ..report import publish
from ..strategy import MatchedOp, get_template
from ..timing import phase, timed_build
from .consumers import consumer_flags, lane_requests
from .placements import build_report
from .poolsplit import split_pooled_concats
from .rewrite import Offloader

__all__ = ["OffloadToVTA"]


def _prefetch(mod: tvm.IRModule, config: VTAConfig) -> Dict[str, dict]:
    """Give each template all of the module's operators it will plan (``OpTemplate.prefetch``),
    before they are planned one at a time, but those it is known to refuse
    (``OpTemplate.refusal``), then have each start that work in the module's operator order
    (``OpTemplate.start_prefetched``); return who uses each one's output
    (:func:`~vta_ext.offload.consumers.consumer_flags`, by ``MatchedOp.name``)."""
    matcher = Offloader(mod, config, match_only=True)
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            matcher.visit_expr(func)
    strategy = current_options().strategy_name
    groups: Dict[int, Tuple[object, List[MatchedOp]]] = {}
    templates: Dict[str, object] = {}
    for m in matcher.matched:
        try:
            template = get_template(m.kind, strategy)
        except TemplateRefusal:
            continue
        if template.refusal(m, config) is not None:
            continue                    # stays on the CPU: planning it will say why
        templates[m.name] = template
        groups.setdefault(id(template), (template, []))[1].append(m)
    pairs = list(zip(matcher.matched, matcher.matched_ends))
    flags = consumer_flags(mod, pairs, lambda m: m.name in templates)
    for name, extra in lane_requests(mod, pairs, config, strategy,
                                     lambda m: m.name in templates).items():
        flags.setdefault(name, {}).update(extra)
    for template, ops in groups.values():
        template.prefetch([dataclasses.replace(m, **flags.get(m.name, {})) for m in ops], config)
    order = [m.name for m in matcher.matched]
    for template, _ in groups.values():
        template.start_prefetched(order)
    return flags


def OffloadToVTA(config: VTAConfig) -> tvm.transform.Pass:  # noqa: N802 (TVM pass naming)
    """The offload pass for ``config``; publishes a :class:`BuildReport` when it runs."""

    @tvm.transform.module_pass(opt_level=0, name="VTAOffload")
    def offload(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        # the collector walks only what the last paused step left (:mod:`vta_ext.heap`)
        with frozen_heap(), timed_build() as timer:
            if current_options().fuse_pool:   # a pool of a concat: one pool per part
                mod = split_pooled_concats(mod)
            with phase("solve"):
                consumers = _prefetch(mod, config)
            rewriter = Offloader(mod, config, consumers=consumers)
            for gvar, func in list(mod.functions.items()):
                if isinstance(func, relax.Function):
                    rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
            rewriter.finish()
            new_mod = relax.transform.DeadCodeElimination()(rewriter.builder_.get())
            report = build_report(mod, new_mod, rewriter, config)
        report.timings = dict(timer.seconds)
        publish(report)
        return new_mod

    return offload
