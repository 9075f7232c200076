"""A residual add fused into the conv that produces one of its operands (issue 32 item 2).

The conv is offloaded as usual; the add that follows it, when it is the only user of the
conv's output, is then built as one program with the conv: the conv's plan and knobs, its
epilogue followed by the residual stage and the add's epilogue
(:func:`tvm_csp_embed.codegen.residual.fused_epilogue`), the add's other operand packed in
the conv's output layout as one more input. The conv's VTA call is left without a user (dead
code, removed by the pass) and its report entry becomes the fused operator's.

The fusion applies only where the fused program is faster on the cycle model than the conv's
and the add's programs together, and only to a conv of a CSP embedding under ``csp-relaxed``
(the stock templates take no residual stage); where it does not, the add is built as before
and its report line says why (:meth:`ResidualFusion.fuse`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from tvm import relax

__all__ = ["ResidualFusion", "FusableConv", "FUSING_STRATEGIES"]

#: the strategies whose conv programs take the residual stage
FUSING_STRATEGIES = ("csp-relaxed",)


@dataclass
class FusableConv:
    """What the rewriter kept of an offloaded conv for an add that may fuse into it."""

    op: Any             # the MatchedOp
    template: Any
    plan: Any           # its OpPlan
    knobs: Any
    key: str
    args: List[Any]     # the packed arguments of its VTA call
    entry: int          # its index in the rewriter's offloaded / op_keys


def use_counts(func: relax.Function) -> Dict[str, int]:
    """Variable name -> the number of bindings (and the function's result) that use it."""
    counts: Dict[str, int] = {}

    def count(expr) -> None:
        for var in relax.analysis.free_vars(expr):
            counts[var.name] = counts.get(var.name, 0) + 1

    body = func.body
    for block in getattr(body, "blocks", []):
        for binding in block.bindings:
            count(binding.value)
    count(body.body)
    return counts


class ResidualFusion:
    """The rewriter's record of fusable convs and its fusion decisions."""

    def __init__(self, mod) -> None:
        self.uses: Dict[str, int] = {}
        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                for name, n in use_counts(func).items():
                    self.uses[name] = self.uses.get(name, 0) + n
        self.convs: Dict[str, FusableConv] = {}   # the conv's int8 output variable -> it
        # identical adds (a network's repeated blocks) reuse these: why a fused program's key
        # was refused
        self._refused: Dict[str, str] = {}
        self.builds = 0     # fused programs compiled or refused by this build (the report says)

    def note_conv(self, binding: str, conv: FusableConv) -> None:
        """An offloaded conv whose int8 output is bound to ``binding``."""
        self.convs[binding] = conv

    def candidates(self, add) -> Tuple[List[Tuple[FusableConv, int]], str]:
        """The convs the matched ``add`` may fuse into, each with the index of its operand, and
        why there is none (``""`` when there are)."""
        names = [getattr(o, "name", None) for o in add.operands]
        found = [(self.convs[n], i) for i, n in enumerate(names) if n in self.convs]
        if not found:
            return [], "no operand is the output of a conv offloaded in this build"
        if names[0] == names[1]:
            return [], "both operands are the same tensor"
        alone = [(conv, i) for conv, i in found if self.uses.get(names[i], 0) == 1]
        if not alone:
            return [], f"the output of {found[0][0].op.name} has other users than the add"
        return alone, ""

    def refusal(self, conv: FusableConv, add, add_plan, config) -> Optional[str]:
        """Why ``add`` cannot fuse into ``conv`` (one line), or None. The residual stage is the
        conv template's to give (its ``residual`` attribute: the plugin's
        :class:`tvm_csp_embed.codegen.residual.ResidualSupport`); ``vta_ext`` never imports it."""
        strategy = conv.template.strategy
        residual = getattr(conv.template, "residual", None)
        if strategy not in FUSING_STRATEGIES or residual is None:
            return f"the conv's strategy {strategy} takes no residual stage"
        if getattr(conv.plan.workload, "stock", None):
            return "the conv runs the stock template, which takes no residual stage"
        if conv.op.kind != "conv2d":
            return f"the producer is a {conv.op.kind}, not a conv2d"
        if config.BLOCK_IN != config.BLOCK_OUT:
            return "the identity tile of the residual GEMM needs BLOCK_IN == BLOCK_OUT"
        if add.write_lanes is not None and any(add.write_lanes):
            return "the add writes lane constants into its padded channels for its consumer"
        if tuple(add_plan.out_layout.shape) != tuple(conv.plan.out_layout.shape):
            return (f"the add's packed layout {tuple(add_plan.out_layout.shape)} is not the "
                    f"conv's output layout {tuple(conv.plan.out_layout.shape)}")
        return residual.refusal(conv.op.epilogue)

    @staticmethod
    def knob_choices(conv: FusableConv, epilogue, config) -> Iterator[Any]:
        """The knobs a fused program of ``conv`` with ``epilogue`` is built with on ``config``,
        in the order tried, each computed only when the one before did not build: the conv's
        template's (``template.residual.knob_choices``, in the plugin:
        :func:`tvm_csp_embed.codegen.residual.fused_knob_choices`)."""
        return conv.template.residual.knob_choices(conv, epilogue, config)

    def compile(self, key: str, config) -> Optional[str]:
        """Compile the fused program ``key`` (cached by :func:`vta_ext.executor.compiled_op`);
        why it is refused (one line, remembered for an identical add), or None."""
        from ..errors import TemplateRefusal
        from ..executor import compiled_op
        from ..templates.errors import KnobError
        from ..timing import phase

        if key not in self._refused:
            try:
                with phase("codegen"):
                    compiled_op(key, config=config)
                return None
            except (TemplateRefusal, KnobError) as err:   # e.g. no room for the residual tile
                self._refused[key] = f"the fused program is refused: {err}"
            finally:
                self.builds += 1
        return self._refused[key]

    @staticmethod
    def faster(fused_key: str, conv_key: str, add_key: str) -> Tuple[bool, int, str]:
        """Whether the fused program is faster on the cycle model than the conv's and the
        add's, its cycles, and the figures as words."""
        from ..executor import cycle_report

        fused, conv, add = (cycle_report(k).total_cycles for k in (fused_key, conv_key, add_key))
        words = f"{fused:,} cycles against conv {conv:,} + add {add:,} = {conv + add:,}"
        return fused < conv + add, fused, words
