"""The residual stage as the CSP conv template offers it to ``vta_ext``'s offload pass.

``vta_ext.offload.fusion`` fuses a residual add into the conv that produces one of its operands
only through the conv's template: :attr:`tvm_csp_embed.strategy.CspGemmTemplate.residual` is a
:class:`ResidualSupport`, so ``vta_ext`` never imports this plugin (``tests/test_imports.py``).
The stage itself: :mod:`tvm_csp_embed.codegen.residual`; the design: ``docs/csp-strategy.md``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Optional

from vta_ext.errors import TemplateRefusal
from vta_ext.executor import compiled_op

from .candidates import program_epilogue
from .codegen.build import residual_first_point, resolve_knobs
from .codegen.residual import fused_epilogue, knob_view, residual_overflow, residual_refusal

__all__ = ["ResidualSupport", "fused_knob_choices"]


class ResidualSupport:
    """What a CSP conv template gives the offload pass's residual fusion: its refusal, the fused
    epilogue and the knob points to try (the functions of :mod:`.codegen.residual` and
    :func:`fused_knob_choices`)."""

    @staticmethod
    def refusal(conv_epilogue) -> Optional[str]:
        """Why a conv with ``conv_epilogue`` takes no residual stage, or None
        (:func:`~.codegen.residual.residual_refusal`)."""
        return residual_refusal(conv_epilogue)

    @staticmethod
    def fused_epilogue(conv_epilogue, add_epilogue):
        """The fused program's epilogue (:func:`~.codegen.residual.fused_epilogue`)."""
        return fused_epilogue(conv_epilogue, add_epilogue)

    @staticmethod
    def knob_choices(conv, epilogue, config) -> Iterator[Any]:
        """:func:`fused_knob_choices`."""
        return fused_knob_choices(conv, epilogue, config)

    def __repr__(self) -> str:
        return "ResidualSupport()"


def fused_knob_choices(conv, epilogue, config) -> Iterator[Any]:
    """The knobs a fused program of ``conv`` (a :class:`vta_ext.offload.fusion.FusableConv`) with
    ``epilogue`` is built with on ``config``, in the order tried, each computed only when the one
    before did not build (the first that builds is kept, ``Offloader._fuse``). Where the conv's
    policy is a preset, the point its own program was built at comes first (on regnet_x_1_6gf
    224 ``pipelined`` and ``default`` never slower than the preset searched again with the add's
    stages); then the preset's point for the fused epilogue
    (:func:`~.codegen.build.residual_first_point`) and the point of the halved buffers
    (:func:`~.codegen.residual.knob_view`), which leaves the residual tile room. A point whose
    residual tile does not fit (:func:`~.codegen.residual.residual_overflow`) is left out, not
    lowered."""

    compiled = compiled_op(conv.key) if isinstance(conv.knobs, str) else None
    if not dataclasses.is_dataclass(getattr(compiled, "knobs", None)):
        yield conv.knobs
        return
    pg, program_ep = compiled.plan, program_epilogue(conv.plan.workload, epilogue)
    own = dataclasses.asdict(compiled.knobs)
    if not residual_overflow(config, pg, program_ep, own):
        yield own
    try:
        first = residual_first_point(config, pg, program_ep, conv.knobs)
    except TemplateRefusal:     # no point of the preset: its build says why
        yield conv.knobs
        return
    if first != own and not residual_overflow(config, pg, program_ep, first):
        yield first
    view_cfg, view_ep = knob_view(config, program_ep)
    halved = resolve_knobs(view_cfg, pg, view_ep, conv.knobs)[0]
    if halved not in (own, first):
        yield halved
