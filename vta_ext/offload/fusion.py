"""A residual add fused into the conv that produces one of its operands (issue 32 item 2).

The conv is offloaded as usual; the add that follows it, when it is the only user of the
conv's output, is then built as one program with the conv: the conv's plan and knobs, its
epilogue followed by the residual stage and the add's epilogue
(:func:`tvm_csp_embed.codegen.residual.fused_epilogue`), the add's other operand packed in
the conv's output layout as one more input. The conv's VTA call is left without a user (dead
code, removed by the pass) and its report entry becomes the fused operator's.

The fusion applies only where the fused program is faster on the cycle model than the conv's
and the add's programs together, and only to a conv whose template offers the residual stage
(its ``residual`` attribute: the CSP templates; the stock templates take none); where it does
not, the add is built as before and its report line says why (``Offloader._fuse``).

The decision is made once per (conv program, add program) and kept: in the process for the
identical adds of a network's repeated blocks, and on disk through the conv's template
(``template.residual.decisions``, in the plugin :class:`tvm_csp_embed.fusion.FusionDecisions`),
so that a warm build compiles the fused program at the knobs kept and neither the conv's nor
the add's own program, nor runs the cycle model (:meth:`ResidualFusion.decide`).

A max pool fused into the conv that produces its input (``build_options(fuse_pool=True)``) is
decided the same way (:meth:`ResidualFusion.decide` with the template's ``pool`` support, the
plugin's :class:`tvm_csp_embed.fusion.PoolSupport`): the pool alone uses the conv's output, takes
no padding, and the fused program is faster than the conv's and the pool's together
(:meth:`ResidualFusion.pool_refusal`, ``Offloader._fuse_pool``). A pool of a channel concat of
conv outputs is split into one pool per part first (:mod:`vta_ext.offload.poolsplit`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from tvm import relax

from ..quantize.common import shape_of

__all__ = ["ResidualFusion", "FusableConv", "strategy_fuses"]

logger = logging.getLogger("vta_ext")


def strategy_fuses(strategy: str, stage: str = "residual") -> bool:
    """Whether the conv template of ``strategy`` offers the ``stage`` (``"residual"`` or
    ``"pool"``: its attribute of that name, the one definition of which strategies fuse)."""
    from ..errors import TemplateRefusal
    from ..strategy import get_template

    try:
        return getattr(get_template("conv2d", strategy), stage, None) is not None
    except (TemplateRefusal, KeyError, ValueError):
        return False


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
    parts: Optional[str] = None     # how vta_ext.run_placed places them, None: vta_ext.run


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
        # (conv key, add key) -> the decision (ResidualFusion.decide)
        self._decisions: Dict[Tuple[str, str], Dict[str, Any]] = {}
        self._stale: set = set()    # pairs whose kept decision did not build (forget)

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
        residual = getattr(conv.template, "residual", None)
        refused = _producer_refusal(conv, residual, "residual")
        if refused:
            return refused
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
    def defer(template, key: str) -> bool:
        """Whether the conv program ``key`` of ``template`` may be compiled last (when the
        report is written) rather than now: a kept decision chose it for an add, so the fused
        program may replace it, and its own program built with this key before (the decision's
        comparison compiled it)."""
        residual = getattr(template, "residual", None)
        return residual is not None and residual.decisions(key).any_fused()

    def decide(self, conv: FusableConv, add_key: str, epilogue, config,
               support=None) -> Dict[str, Any]:
        """Whether the add of program ``add_key`` fuses into ``conv`` with ``epilogue``:
        ``{"fused", "knobs", "cycles": [fused, conv, add] or None, "words", "by", "chosen"}``
        (``chosen``: of the add's fusing convs, this one's fused program is the fastest;
        :meth:`choose`). Kept in this build for an identical add, and on disk (the conv
        template's ``residual.decisions``), where a warm build reads it without compiling
        anything; else decided here (:meth:`_decide`) and kept. A kept decision whose fused
        program no longer builds is decided again (:meth:`forget`). ``support``: the template's
        stage support (default its ``residual``; a pool's: its ``pool``, ``add_key`` the pool's
        program key)."""
        memo = (conv.key, add_key)
        if memo in self._decisions:
            return self._decisions[memo]
        support = support or conv.template.residual
        kept = support.decisions(conv.key)
        decision = None if memo in self._stale else kept.get(add_key)
        if decision is None:
            decision, keep = self._decide(conv, add_key, epilogue, config, support)
            if keep:
                kept.put(add_key, decision)
        self._decisions[memo] = decision
        return decision

    def forget(self, conv: FusableConv, add_key: str) -> bool:
        """Drop the kept decision of ``conv`` and the add ``add_key`` (its fused program does
        not build): the next :meth:`decide` decides again. False where it was decided in this
        build already (nothing to decide again)."""
        memo = (conv.key, add_key)
        if memo in self._stale:
            return False
        logger.warning("fusion decisions: the kept knobs of %s and its add no longer build; "
                       "deciding again", conv.op.name)
        self._stale.add(memo)
        self._decisions.pop(memo, None)
        return True

    def pool_candidate(self, pool) -> Tuple[Optional[FusableConv], str]:
        """The conv the matched max ``pool`` may fuse into, and why there is none (one line)."""
        name = getattr(pool.operands[0], "name", None)
        conv = self.convs.get(name)
        if conv is None:
            return None, "its input is not the output of a conv offloaded in this build"
        if self.uses.get(name, 0) != 1:
            return None, f"the output of {conv.op.name} has other users than the pool"
        return conv, ""

    @staticmethod
    def pool_window(pool) -> Tuple[Optional[Tuple[int, int, int, int]], str]:
        """``(pool_h, pool_w, stride_h, stride_w)`` of the matched max ``pool``, or None and why
        it is not one a conv's program takes (padding, dilation, a ceil-mode size, a layout)."""
        attrs = pool.core.attrs
        if str(attrs.layout) != "NCHW" or str(attrs.out_layout) != "NCHW":
            return None, f"the pool's layout is {attrs.layout}, not NCHW"
        if any(int(p) for p in attrs.padding):
            return None, f"the pool is padded ({[int(p) for p in attrs.padding]})"
        if any(int(d) != 1 for d in attrs.dilation):
            return None, "the pool is dilated"
        window = tuple(int(v) for v in tuple(attrs.pool_size) + tuple(attrs.strides))
        shape, out = shape_of(pool.core.args[0]), list(shape_of(pool.core))
        floor = [(shape[2 + i] - window[i]) // window[2 + i] + 1 for i in range(2)]
        if out[2:] != floor:
            return None, f"the pool's output {out[2:]} is not its floor size {floor} (ceil mode)"
        return window, ""

    def pool_refusal(self, conv: FusableConv, pool, window, pool_plan,
                     config) -> Optional[str]:
        """Why the max ``pool`` of ``window`` and ``pool_plan`` cannot fuse into ``conv`` (one
        line), or None: the pool does not read the conv's output in its packed layout, the
        conv's template takes no pool stage (its ``pool`` attribute, the plugin's
        :class:`tvm_csp_embed.fusion.PoolSupport`), or that support refuses it."""
        support = getattr(conv.template, "pool", None)
        if pool.input_layout is None:
            return "the pool does not read the conv's output in its packed layout"
        return _producer_refusal(conv, support, "pool") or support.refusal(
            conv, window, pool_plan.out_layout.shape, config)

    def choose(self, chosen: FusableConv, others: List[FusableConv], add_key: str) -> None:
        """Record that the add ``add_key`` fused into ``chosen`` and not into ``others`` (whose
        fused programs were slower): a warm build defers only the chosen conv's own program."""
        for conv in [chosen] + others:
            decision = self._decisions[(conv.key, add_key)]
            if decision.get("chosen") != (conv is chosen):
                decision["chosen"] = conv is chosen
                conv.template.residual.decisions(conv.key).put(add_key, decision)

    def _decide(self, conv: FusableConv, add_key: str, epilogue, config,
                support) -> Tuple[Dict[str, Any], bool]:
        """:meth:`decide` by compiling: the conv's and the add's own programs, the fused one at
        the first knob choice that builds (:meth:`knob_choices`), fused where it is faster on
        the cycle model; the decision and whether to keep it (not when an own program is
        refused: the add's refusal is the rewriter's to report)."""
        from ..errors import TemplateRefusal
        from ..executor import compiled_op, cycle_report, op_key
        from ..templates.errors import KnobError
        from ..timing import phase

        try:
            with phase("codegen"):
                compiled_op(conv.key, config=config)
                compiled_op(add_key, config=config)
        except (TemplateRefusal, KnobError) as err:
            return dict(fused=False, knobs=None, cycles=None, by="",
                        words=f"an own program is refused: {err}"), False
        refused = "no knob point of the fused program to try"
        choices = self.knob_choices(conv, epilogue, config) \
            if support is conv.template.residual else support.knob_choices(conv, epilogue, config)
        for knobs in choices:
            key = op_key(conv.op.kind, conv.template.strategy, config, conv.plan.workload,
                         epilogue, knobs)
            refused = self.compile(key, config)
            if refused:
                continue
            cycles = [cycle_report(k).total_cycles for k in (key, conv.key, add_key)]
            fused, own, add = cycles
            words = (f"{fused:,} cycles against conv {own:,} + {support.label} {add:,} = "
                     f"{own + add:,}")
            return dict(fused=fused < own + add, knobs=knobs, cycles=cycles, words=words,
                        by="cycle model"), True
        return dict(fused=False, knobs=None, cycles=None, words=refused, by=""), True


def _producer_refusal(conv: FusableConv, support: Any, stage: str) -> Optional[str]:
    """Why ``conv`` takes no ``stage`` (``"residual"``, ``"pool"``) whatever the operator fused
    into it (one line), or None: its template's ``support`` is None, it runs the stock template,
    it is not a conv2d."""
    if support is None:
        return f"the conv's strategy {conv.template.strategy} takes no {stage} stage"
    if getattr(conv.plan.workload, "stock", None):
        return f"the conv runs the stock template, which takes no {stage} stage"
    if conv.op.kind != "conv2d":
        return f"the producer is a {conv.op.kind}, not a conv2d"
    return None
