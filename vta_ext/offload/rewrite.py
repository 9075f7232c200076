"""The offload pass's rewriter: each matched operator becomes packing on the host, one call of its
prebuilt VTA program, and unpacking.

The strategy in effect (:func:`vta_ext.build_options`) gives the operator's template; the template
plans the packed layouts and the rewriter emits them (it is the template's *packer*: ``emit``,
``emit_unpack``, ``operand``, ``handover``, ``note_kept``). The instruction stream is built here, at
build time (:mod:`vta_ext.executor`). Only a :class:`~vta_ext.errors.TemplateRefusal` keeps a
matched operator on the CPU (the reason is recorded for the report); any other error fails the
build with a :class:`~vta_ext.errors.VTABuildError` naming the operator and its shapes.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List, Optional, Tuple

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..config import VTAConfig
from ..errors import TemplateRefusal, VTABuildError
from ..executor import compiled_op, op_key
from ..options import current_options
from ..packing import blocked_prefix, prefix_axis
from ..quantize import call_macs
from ..quantize.common import op_name as _op_name, shape_of as _shape
from ..strategy import MatchedOp, get_template
from ..timing import phase
from .fusion import FusableConv, ResidualFusion, strategy_fuses
from .handover import PackedHandover
from .match import PatternMatcher
from .names import PACK_PREFIX, RUN_FUNC, RUN_PLACED_FUNC, UNPACK_PREFIX
from .overflow import check_overflow

__all__ = ["Offloader"]

logger = logging.getLogger("vta_ext")


@mutator
class Offloader(PyExprMutator):
    """Rewrites matched patterns; remembers why unmatched candidates stay on the CPU.

    The matching is :class:`~vta_ext.offload.match.PatternMatcher`'s, the overflow proof
    :func:`~vta_ext.offload.overflow.check_overflow`, the packed tensors and the layout work on
    them :class:`~vta_ext.offload.handover.PackedHandover`'s; what each placement was is kept for
    the report (:func:`~vta_ext.offload.placements.build_report`)."""

    def __init__(self, mod: tvm.IRModule, config: VTAConfig, match_only: bool = False,
                 consumers: Optional[Dict[str, dict]] = None) -> None:
        super().__init__(mod)
        self.config = config
        # match_only: record every matched operator in ``matched`` (and the variable its last
        # call is bound to in ``matched_ends``) and rewrite nothing
        self.match_only = match_only
        self.matched: List[MatchedOp] = []
        self.matched_ends: List[str] = []
        # MatchedOp.name -> the consumer fields set before planning (vta_ext.offload.consumers)
        self.consumers = consumers or {}
        self.op_keys: List[str] = []  # the compiled-operator key of every VTA call, in order
        self.rejected: Dict[str, str] = {}  # var name of a candidate core op -> reason
        # (relax op, what, detail, var, further OpPlacement fields), one per entry of op_keys
        self.offloaded: List[Tuple[str, str, str, str, dict]] = []
        self.unpack_vars: set = set()  # variables now bound to the last unpacking step
        self.matcher = PatternMatcher(self._producer)
        self.packed = PackedHandover(self._emit, self._producer, self.rejected)
        self._rewritten_binding = False
        self._last_packed = None
        self._current_binding = ""
        self._kept = False
        # the convs a residual add may fuse into (vta_ext.offload.fusion)
        self.fusion = ResidualFusion(mod)
        # per entry of offloaded: (knobs origin, epilogue) of the words its program fills in
        # (the program may be compiled last or replaced by a fused one: ``finish``)
        self._program_words: List[Tuple[str, tuple]] = []

    def __repr__(self) -> str:
        return (f"Offloader(config {self.config.name!r}, {len(self.op_keys)} VTA calls, "
                f"{len(self.rejected)} refused, {self.fusion.builds} fused programs compiled)")

    # ---------------------------------------------------------------- helpers
    def _producer(self, expr):
        if isinstance(expr, relax.Var):
            return self.lookup_binding(expr)
        return None

    def _emit(self, expr, name: str):
        return self.builder_.emit(expr, name_hint=name)

    # ---------------------------------------------------------------- packer (vta_ext.packing)
    def emit(self, expr, name: str):
        """Bind a packing step on the host."""
        return self._emit(expr, f"{PACK_PREFIX}_{name}")

    def emit_unpack(self, expr, name: str):
        """Bind an unpacking step on the host."""
        return self._emit(expr, f"{UNPACK_PREFIX}_{name}")

    def add_func(self, func, name: str):
        """Add a host PrimFunc (a fused relayout kernel) to the module; its GlobalVar."""
        return self.builder_.add_func(func, name)

    def operand(self, expr):
        """The rewritten operand ``expr``."""
        return self.visit_expr(expr)

    def producer_layout(self, expr):
        """The packed layout ``expr`` is available in as a previous VTA operator's output, or
        None (:meth:`PackedHandover.producer_layout`)."""
        return self.packed.producer_layout(expr)

    def handover(self, expr, layout):
        """The packed output of a previous VTA operator for ``expr`` in ``layout``, or None
        (:meth:`PackedHandover.handover`)."""
        return self.packed.handover(expr, layout)

    def note_kept(self, kept: bool) -> None:
        """Record whether the activation input was handed over in the packed layout."""
        self._kept = kept

    # ---------------------------------------------------------------- rewriting
    def rewrite(self, m: MatchedOp) -> Optional[relax.Expr]:
        """Replace ``m`` by packing + VTA call + unpacking, or return None if the strategy's
        template refuses it (the reason is recorded for the report)."""
        if self.match_only:
            self.matched.append(m)
            self.matched_ends.append(self._current_binding)
            return None
        options = current_options()
        strategy = options.strategy_name
        try:
            template = get_template(m.kind, strategy)
            check_overflow(m, self.matcher.source_tails.get(m.name))
            m = dataclasses.replace(m, **self.consumers.get(m.name, {}))
            if m.operands:
                m = dataclasses.replace(m, input_layout=self.producer_layout(m.operands[0]),
                                        input_lanes=tuple(map(self.packed.lanes_of, m.operands)))
            with phase("plan"):
                plan = template.plan(m, self.config)
            knobs, origin = options.knobs_for(m.kind, template.strategy, plan.workload, self.config)
            key = op_key(m.kind, template.strategy, self.config, plan.workload, m.epilogue, knobs)
        except TemplateRefusal as err:
            return self._refused(m, err)
        except Exception as err:
            raise self._failed(m, strategy, err) from err
        # the program is built now (the instruction stream), except an add's, built where it is
        # not fused, and a conv's that a kept fusion decision may replace (built by ``finish``)
        fusing = (options.fuse_residual and m.kind == "add") or (
            options.fuse_pool and m.kind == "max_pool2d")
        if not fusing and not ((options.fuse_residual or options.fuse_pool)
                               and m.kind == "conv2d" and self.fusion.defer(template, key)):
            if not self._compile(m, strategy, key):
                return None
        fusion_note, fuse = "", None
        if m.kind == "add" and strategy_fuses(strategy):
            if not options.fuse_residual:
                fusion_note = "off (build_options(fuse_residual=True) turns it on)"
            else:
                fuse = self._fuse
        elif m.kind == "max_pool2d":
            if options.fuse_pool:
                fuse = self._fuse_pool
            elif self.fusion.pool_candidate(m)[0] is not None and strategy_fuses(strategy, "pool"):
                fusion_note = "off (build_options(fuse_pool=True) turns it on)"
        if fuse is not None:
            try:
                fused, fusion_note = fuse(m, plan, key)
            except VTABuildError:
                raise
            except Exception as err:
                raise self._failed(m, strategy, err) from err
            if fused is not None:
                return fused
        if fusing and not self._compile(m, strategy, key):
            return None
        self._kept = False
        args, parts = self.packed.place(plan.inputs(self), m.name)
        func, extra = (RUN_FUNC, []) if parts is None else (
            RUN_PLACED_FUNC, [tvm.ir.StringImm(parts)])
        out_packed = self._emit(relax.call_dps_packed(
            func, args + extra + [tvm.ir.StringImm(key)],
            relax.TensorType(plan.out_layout.shape, "int8")), f"vta_{m.kind}")
        out = plan.out_layout.unpack(self, out_packed)
        self._rewritten_binding = True
        self._last_packed = (out_packed, plan.out_layout, plan.out_lanes)
        detail = f"{plan.description}, {_PROGRAM}"
        if self._kept:
            detail += "; input kept in the packed layout of the previous VTA operator"
        if parts is not None and "+" in parts:
            count = 1 + max(p.count("+") for p in parts.split(","))
            detail += (f"; input concatenated in DRAM from {count} packed parts (placed by "
                       "vta_ext.run_placed, no host copy)")
        prefixes = self.packed.placed_prefixes
        if parts is not None and parts.count(":") > len(prefixes):
            detail += ("; split piece read in place from its source's channel blocks "
                       "(vta_ext.run_placed, no host slice)")
        if prefixes:
            detail += "; input read in place as " + " and ".join(
                f"the first {end - begin} {_AXIS_WORDS[axis]}" for begin, end, axis in prefixes) + (
                f" of {'its producers' if len(prefixes) > 1 else 'its producer'}'s padded "
                f"output{'s' if len(prefixes) > 1 else ''} (vta_ext.run_placed, no host pass)")
        prefix = blocked_prefix(plan.out_layout)
        if prefix is not None:
            axis = prefix_axis(plan.out_layout.shape, prefix.shape)
            detail += (f"; output padded to {plan.out_layout.shape[axis]} {_AXIS_WORDS[axis]}, "
                       f"held as its first {prefix.shape[axis]} (the stock blocked layout): VTA "
                       "consumers taking that layout read them in place, no host pass")
        if m.write_lanes is not None and plan.out_lanes != tuple(m.write_lanes) \
                and "lane constants" not in detail:
            detail += ("; the lane constants asked for its padded output channels are not "
                       f"written: its plan ({template.report_text}) does not write them")
        if fusion_note:
            detail += f"; not fused into its conv: {fusion_note}"
        if plan.padding:
            detail += f"; PADDED {plan.padding}"
            # the build logs one WARNING line for all padded operators (report.publish)
            logger.info("%s %s: %s pads %s", m.kind, plan.description, template.report_text,
                        plan.padding)
        try:
            summary = template.plan_summary(plan, self.config)
        except Exception as err:  # noqa: BLE001 -- the report's words must not fail a build
            logger.warning("no short plan text for %s %r: %s: %s", m.kind, m.name,
                           type(err).__name__, err)
            summary = template.strategy
        fields = dict(kind=m.kind, plan=summary, padding=plan.padding, macs=call_macs(m.core),
                      elements=_size(_shape(m.core)), packed_elements=_size(plan.out_layout.shape),
                      call=len(self.op_keys))
        if m.kind == "conv2d":
            self.fusion.note_conv(self._current_binding, FusableConv(
                m, template, plan, knobs, key, args, len(self.offloaded), parts))
        self.offloaded.append((_op_name(m.core), f"{m.kind} ({template.report_text})", detail,
                               m.name, fields))
        self.op_keys.append(key)
        self._program_words.append((origin, tuple(m.epilogue)))
        return out

    def _compile(self, m: MatchedOp, strategy: str, key: str) -> bool:
        """Build the program ``key`` of ``m``; False where its template refuses it (recorded:
        ``m`` stays on the CPU).

        Raises
        ------
        VTABuildError
            For any other error, naming the operator and its shapes.
        """
        try:
            with phase("codegen"):
                compiled_op(key, config=self.config)  # the instruction stream, built now
        except TemplateRefusal as err:
            self._refused(m, err)
            return False
        except Exception as err:
            raise self._failed(m, strategy, err) from err
        return True

    def _refused(self, m: MatchedOp, err: TemplateRefusal) -> None:
        """Record why ``m`` stays on the CPU (its template refused it)."""
        logger.info("%s %r (%s) stays on the CPU: %s", m.kind, m.name, m.shapes, err)
        self.rejected[m.name] = str(err)
        return None

    def _failed(self, m: MatchedOp, strategy: str, err: Exception) -> VTABuildError:
        """The error that fails the build where building ``m`` raised ``err``."""
        return VTABuildError(
            f"building {m.kind} {m.name!r} ({m.shapes}, epilogue {list(m.epilogue)}) for VTA "
            f"with strategy {strategy!r} on config {self.config.name!r} failed: "
            f"{type(err).__name__}: {err}")

    def finish(self) -> None:
        """Fill in each VTA operator's report words about its program (epilogue, instruction
        count, knobs, tiling), compiling the programs left for last (a conv a kept fusion
        decision deferred, whose add did not fuse after all).

        Raises
        ------
        VTABuildError
            Where such a program fails to build (its call is already in the module).
        """
        for i, (op, what, detail, var, fields) in enumerate(self.offloaded):
            if _PROGRAM not in detail:
                continue
            origin, epilogue = self._program_words[i]
            try:
                with phase("codegen"):
                    compiled = compiled_op(self.op_keys[i], config=self.config)
            except Exception as err:
                raise VTABuildError(
                    f"building the deferred program of {what} {var!r} for VTA on config "
                    f"{self.config.name!r} failed: {type(err).__name__}: {err}") from err
            words = (f"epilogue {'+'.join(s[0] for s in epilogue) or 'none'}, "
                     f"{compiled.program.insn_count} insns, {origin}{_tiling_text(compiled)}")
            self.offloaded[i] = (op, what, detail.replace(_PROGRAM, words), var, fields)

    def _fuse(self, add: MatchedOp, add_plan, add_key: str) -> Tuple[Optional[relax.Expr], str]:
        """The residual ``add`` fused into the conv that produces one of its operands
        (:mod:`~vta_ext.offload.fusion`): the fused call's unpacked output, or None and why
        not (one line). Each (conv, add) pair is decided once (:meth:`ResidualFusion.decide`);
        of two fusing convs, the faster fused program is kept."""
        found, why = self.fusion.candidates(add)
        best, reasons, slowest, fusing = None, [], [], []
        for conv, index in found:
            refused = self.fusion.refusal(conv, add, add_plan, self.config) or (
                "the conv's input is placed from parts (vta_ext.run_placed)"
                if conv.parts is not None else "")
            if refused:
                reasons.append(refused)
                continue
            epilogue = conv.template.residual.fused_epilogue(conv.op.epilogue, add.epilogue)
            decision = self.fusion.decide(conv, add_key, epilogue, self.config)
            if decision["fused"]:
                fusing.append(conv)
                cycles = decision["cycles"][0]
                if best is None or cycles < best[0]:
                    best = (cycles, conv, index, decision, epilogue)
            elif decision["cycles"]:
                slowest.append((decision["cycles"][0], f"not faster fused ({decision['words']})"))
            else:
                reasons.append(decision["words"])
        if best is None:    # the fastest fused program that was built, else the first refusal
            return None, why or (min(slowest)[1] if slowest else reasons[0])
        _, conv, index, decision, epilogue = best
        key = self._built_fused(conv, epilogue, decision, add_key, f"the residual add {add.name!r}")
        if key is None:
            return self._fuse(add, add_plan, add_key)
        self.fusion.choose(conv, [c for c in fusing if c is not conv], add_key)
        layout = conv.plan.out_layout
        other = add.operands[1 - index]
        residual = self.handover(other, layout)
        kept = residual is not None
        if residual is None:
            residual = layout.pack(self, other)
        words = (f"residual add {add.name} fused ({decision['words']}, decided by the "
                 f"{decision['by']}; its other operand "
                 f"{'kept in the packed layout' if kept else 'packed on the host'})")
        return self._fused_call(conv, key, epilogue, [residual], layout, add_plan.out_lanes,
                                "add", words), ""

    def _built_fused(self, conv: FusableConv, epilogue, decision, other_key: str,
                     what: str) -> Optional[str]:
        """The key of the fused program of ``conv`` with ``epilogue`` at the knobs of
        ``decision``, compiled; None where a kept decision no longer builds and was forgotten
        (the caller decides again).

        Raises
        ------
        VTABuildError
            Where the program decided in this build does not build now (``what``: the operator
            fused into ``conv``).
        """
        key = op_key(conv.op.kind, conv.template.strategy, self.config, conv.plan.workload,
                     epilogue, decision["knobs"])
        if self.fusion.compile(key, self.config) is not None:   # a kept decision gone stale
            if self.fusion.forget(conv, other_key):
                return None
            raise VTABuildError(f"the fused program of {conv.op.name!r} and {what} built when "
                                "decided and not now")
        return key

    def _fused_call(self, conv: FusableConv, key: str, epilogue, extra: list, layout, lanes,
                    stage: str, words: str) -> relax.Expr:
        """Emit the call of the fused program ``key`` on the conv's packed inputs and ``extra``
        (its output packed in ``layout``, with ``lanes``), and its unpacking; the conv's report
        entry becomes the fused operator's (``conv2d + <stage>``, ``words`` added)."""
        func, placed = (RUN_FUNC, []) if conv.parts is None else (
            RUN_PLACED_FUNC, [tvm.ir.StringImm(conv.parts)])
        out_packed = self._emit(relax.call_dps_packed(
            func, conv.args + extra + placed + [tvm.ir.StringImm(key)],
            relax.TensorType(layout.shape, "int8")), f"vta_conv2d_{stage.replace(' ', '_')}")
        out = layout.unpack(self, out_packed)
        self._rewritten_binding = True
        self._last_packed = (out_packed, layout, lanes)
        op, what, detail, var, fields = self.offloaded[conv.entry]
        self.offloaded[conv.entry] = (op, f"conv2d + {stage} ({conv.template.report_text})",
                                      f"{detail}; {words}", var, fields)
        self.op_keys[conv.entry] = key
        self._program_words[conv.entry] = (self._program_words[conv.entry][0], tuple(epilogue))
        return out

    def _fuse_pool(self, pool: MatchedOp, pool_plan,
                   pool_key: str) -> Tuple[Optional[relax.Expr], str]:
        """The max ``pool`` fused into the conv that produces its input
        (:mod:`~vta_ext.offload.fusion`): the fused call's unpacked output, or None and why not
        (one line). Decided once per (conv, pool) program pair, by the cycle model
        (:meth:`ResidualFusion.decide` with the conv template's ``pool`` support)."""
        conv, why = self.fusion.pool_candidate(pool)
        window = None
        if conv is not None:
            window, why = self.fusion.pool_window(pool)
        if window is not None:
            why = self.fusion.pool_refusal(conv, pool, window, pool_plan, self.config) or ""
        if why:
            return None, why
        support = conv.template.pool
        epilogue = support.fused_epilogue(conv.op.epilogue, window)
        decision = self.fusion.decide(conv, pool_key, epilogue, self.config, support)
        if not decision["fused"]:
            return None, (f"not faster fused ({decision['words']})" if decision["cycles"]
                          else decision["words"])
        key = self._built_fused(conv, epilogue, decision, pool_key, f"the max pool {pool.name!r}")
        if key is None:
            return self._fuse_pool(pool, pool_plan, pool_key)
        words = (f"max pool {pool.name} ({'x'.join(map(str, window[:2]))} stride "
                 f"{'x'.join(map(str, window[2:]))}) fused ({decision['words']}, decided by "
                 f"the {decision['by']})")
        return self._fused_call(conv, key, epilogue, [], pool_plan.out_layout,
                                pool_plan.out_lanes, "max pool", words), ""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        match, reason = self.matcher.match_call(call, self._current_binding)
        if match is not None:
            out = self.rewrite(match)
            if out is not None:
                return out
        elif reason:
            core = self.matcher.find_core(call)
            if core:
                self.rejected.setdefault(core, reason)
        return super().visit_call_(call)

    def visit_var_binding_(self, binding) -> None:
        value = binding.value
        self._current_binding = binding.var.name
        if _op_name(value) in ("relax.nn.conv2d", "relax.nn.conv1d"):
            _, reason = self.matcher.conv_kind(value)
            if reason:
                self.rejected[binding.var.name] = reason
        self._rewritten_binding = False
        super().visit_var_binding_(binding)
        if self._rewritten_binding:
            self.unpack_vars.add(binding.var.name)
            if self._last_packed is not None:
                self.packed.hold(binding.var, *self._last_packed)
        else:
            self.packed.track(binding)


#: where a VTA operator's report words stand for its program until ``Offloader.finish``
_PROGRAM = "\x00program\x00"

#: what an axis of a packed activation ``(N/b, C/k, H, W, b, k)`` counts, for the report
_AXIS_WORDS = {1: "channel blocks", 2: "rows", 3: "columns"}


def _size(shape) -> int:
    return int(np.prod([int(d) for d in shape], dtype=np.int64))


def _tiling_text(compiled) -> str:
    """", tiling tile_h=7 oc_nthread=2" for a compiled GEMM operator (knobs that are not 1); for an
    ALU operator whose tile the cycle model picked, how (``info["tiling"]``:
    :func:`vta_ext.templates.eltwise.timed_tiling_text`)."""
    knobs = getattr(compiled, "knobs", None)
    if knobs is None or not hasattr(knobs, "__dataclass_fields__"):
        tiling = getattr(compiled, "info", {}).get("tiling")
        return f", tiling {tiling}" if tiling else ""
    chosen = [f"{name}={getattr(knobs, name)}" for name in knobs.__dataclass_fields__
              if getattr(knobs, name) not in (1, False)]
    return ", tiling " + (" ".join(chosen) if chosen else "all inner tiles 1")
