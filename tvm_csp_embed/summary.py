"""The CSP strategies' words in the build report's line of an operator.

``vta_ext.last_build_report()`` prints one line per operator; for an operator planned by a CSP
template (:class:`~tvm_csp_embed.strategy.CspGemmTemplate`) the strategy column reads
``"csp-relaxed NHWC x=1 y=k16 z=c16"`` (strategy, layout of the free dims, the embedding's mapping
of the GEMM axes), or ``"stock (csp-relaxed chose it)"`` / ``"stock (csp-relaxed fell back)"``
when the template used the stock template's plan. The full rationale stays in the report's
``explain(i)``. Importing :mod:`tvm_csp_embed` registers this
(:func:`vta_ext.strategy.register_plan_summary`).
"""
from __future__ import annotations

from vta_ext.strategy import OpPlan, OpTemplate, register_plan_summary

from .strategy import CspWorkload, packed_of

__all__ = ["plan_summary"]

#: the text :meth:`CspGemmTemplate._stock` puts in a plan that fell back to the stock template
FALLBACK_MARK = "STOCK FALLBACK"


def plan_summary(template: OpTemplate, plan: OpPlan, config) -> str:
    """The strategy and embedding of a CSP template's ``plan`` in a few words.

    Parameters
    ----------
    template : OpTemplate
        The CSP template that planned the operator.
    plan : OpPlan
        Its plan; ``plan.workload`` is a :class:`~tvm_csp_embed.strategy.CspWorkload`.
    config : VTAConfig
        The configuration it was planned for (the embedding is decoded for its GEMM shape).

    Returns
    -------
    str
        ``"csp-relaxed NHWC x=1 y=k16 z=c16"``, or ``"stock (csp-relaxed chose it)"`` /
        ``"stock (csp-relaxed fell back)"`` for a plan of the stock template.
    """
    workload: CspWorkload = plan.workload
    if workload.stock:
        how = "fell back" if FALLBACK_MARK in plan.description else "chose it"
        return f"stock ({template.strategy} {how})"
    embedding = packed_of(workload, config).embedding
    fold = (f", bias in {workload.bias_lanes} lanes" if workload.bias_lanes else
            ", bias by GEMM" if workload.bias_gemm else "")
    return f"{template.strategy} {workload.layout} {embedding.mapping_str()}{fold}"


register_plan_summary(CspWorkload, plan_summary)
