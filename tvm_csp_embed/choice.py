"""Choosing among an operator's candidates (:mod:`.candidates`) by the build's objective.

:func:`choose` times the best candidates by their static estimate on the cycle model (at most
:data:`CYCLE_RANKED`, within :data:`RANK_FACTOR` of the best estimate), scores them by
``build_options(objective=...)`` (VTA cycles, plus the host layout traffic priced by the host model
for ``end-to-end``, or the measured host relayout time for ``combined``; ``footprint`` takes the
smallest packed tensors), compares the stock template's own plan (:func:`time_stock`) and, where
the stock template refuses the operator, leaving it on the CPU; :func:`agree` prefers a plan within
:data:`AGREEMENT_SLACK` that hands its tensors over to the neighbouring VTA operators. The choice and
the sentence saying why are cached on disk (``choices/``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import tvm

from vta_ext.errors import TemplateRefusal
from vta_ext.strategy import MatchedOp, OpPlan, get_template

from .collector import gc_paused  # noqa: F401  (re-exported: choice.gc_paused)
from .cache import _write, cache_dir, source_digest
from .candidates import (DEFAULT_SOLUTIONS, Candidate, CspWorkload, _shape, bias_signature,
                         is_stock_mapping,
                         data_layout, packed_inputs, settle, unfolded)
from .codegen.plan import PackedGemm

__all__ = ["StockContender", "CYCLE_RANKED", "RANK_FACTOR", "STOCK_COMPARED", "AGREEMENT_SLACK",
           "STOCK", "CPU", "PRUNE_BY_BOUND",
           "choose", "cycles_bound", "agree", "time_stock", "stock_refuses", "objective_key",
           "cpu_cost", "cpu_text", "cpu_bound_exceeded",
           "plan_host_bytes", "folded_host_bytes_bound", "output_users", "consumer_key", "consumer_text",
           "operand_pack_bytes", "blocked_output", "cpu_host_bytes", "host_relayout_seconds",
           "gc_paused",
           "stock_host_relayout_seconds"]

#: candidates built and timed by the cycle model: at most this many, best static estimate first,
#: and only those within RANK_FACTOR of the best estimate
CYCLE_RANKED = 8
RANK_FACTOR = 4.0
#: the constraint sets whose choice (objective cycles or combined) also times the stock template's
#: plan and keeps it when it is at least as fast. ``strict`` is the stock mapping family itself (its
#: NCHW program equals stock's), so only ``relaxed`` compares.
STOCK_COMPARED = ("relaxed",)
#: layout agreement: for an operator whose input is a previous VTA operator's packed output, a
#: plan (embedding or the stock plan) that takes that tensor over and leaves its output in the
#: stock blocked arrangement of the neighbouring VTA operators is preferred to a faster one that
#: needs a host unpack/pack on either side, if its score is within this fraction of the fastest
AGREEMENT_SLACK = 0.02
#: what :func:`choose` returns when the stock template wins
STOCK = "stock"
#: skip building a candidate whose proven lower bound cannot beat the best timed one (see
#: :func:`_choose`); False times every candidate the ranking admits (the exhaustive choice)
PRUNE_BY_BOUND = True


def host_relayout_seconds(pg: PackedGemm, repeats: int = 5, data_layout=None) -> float:
    """Median wall time of the host relayout that runs per inference: packing the activation (in
    ``data_layout``, default the program's own layout of it) and unpacking the output (constant
    weights are relayouted at build time)."""
    from .hosttime import relayout_seconds

    data = pg.embedding.workload.inputs[0].name
    act = next(pg.operands[r] for r in "AB" if pg.operands[r].tensor == data).host
    act = act if data_layout is None else data_layout
    return relayout_seconds(act, act.src_shape, pg.operands["C"].host, repeats)[1]


def _layout_key(layout) -> Any:
    """A JSON-able description of a packed layout (its class and fields), or None."""
    if layout is None:
        return None
    fields = dataclasses.asdict(layout) if dataclasses.is_dataclass(layout) else repr(layout)
    return [type(layout).__name__, fields]


def _choice_key(config, base: CspWorkload, mode: str, layouts, objective: str, epilogue, knobs,
                stock=None, producer=None, bias=None, consumers=None) -> str:
    """The choice cache's key: the operator, the constraint set, the layouts, the objective, the
    epilogue, the knobs of every candidate, the ranking parameters, the configuration's value,
    the stock contender (its workload and knobs, or None when it is not compared), the packed
    layout the input comes in from a previous VTA operator (layout agreement), what the bias
    fold depends on (:func:`~.candidates.bias_signature`), who uses the output and whether the
    input is unpacked anyway (:func:`consumer_key`) and the code that chooses
    (:func:`~.cache.source_digest`).

    The epilogue enters as its shape (:func:`~vta_ext.templates.epilogue.epilogue_shape`): the
    programs of two epilogues of one shape time the same, so operators that differ only in their
    shifts and clips (a network's repeated blocks) share one choice."""
    from vta_ext.executor import config_digest
    from vta_ext.templates.epilogue import epilogue_shape

    text = json.dumps({"v": 12, "bias": bias, "consumers": consumers, "ranked": [CYCLE_RANKED, RANK_FACTOR, DEFAULT_SOLUTIONS],
                       "agree": [AGREEMENT_SLACK, _layout_key(producer)],
                       "base": dataclasses.asdict(base), "mode": mode, "layouts": list(layouts),
                       "objective": objective, "epilogue": epilogue_shape(config, epilogue),
                       "knobs": knobs, "stock": stock, "config": config_digest(config),
                       "code": source_digest()},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class StockContender(NamedTuple):
    """The stock template's plan of an operator as it competes with the embeddings."""

    #: the stock template's :class:`~vta_ext.strategy.OpPlan`
    plan: OpPlan
    #: the CSP workload that builds it, and the knobs option it is built with
    workload: Any
    knobs: Any
    #: the search of its knob point (:class:`~.stock_knobs.StockSearch`), None: built at
    #: ``knobs`` as the stock strategy builds it
    search: Any = None

    def built(self) -> Any:
        """The workload the plan builds (with the searched point, if any); runs the search."""
        return self.workload if self.search is None else self.search.placed()


def _contender_key(contender) -> Any:
    """The stock contender as the caches key it: its workload and knobs, and the search's format
    when its point is searched (None: no contender)."""
    if contender is None:
        return None
    return [dataclasses.asdict(contender[1]), contender[2]] + (
        [] if contender.search is None else [contender.search.key])


class _Layout:
    """A stock layout whose ``pack`` takes a name, under the one-argument packing protocol of
    :func:`~tvm_csp_embed.hosttime.relayout_seconds`."""

    def __init__(self, layout, name: str = "data") -> None:
        self.layout, self.name = layout, name
        self.shape = layout.shape

    def pack(self, packer, expr):
        return self.layout.pack(packer, expr, self.name)

    def unpack(self, packer, expr):
        return self.layout.unpack(packer, expr)


def stock_host_relayout_seconds(kind: str, op: MatchedOp, config, plan: OpPlan,
                                repeats: int = 5) -> float:
    """Median wall time of the stock plan's per-inference host relayout (packing the activation
    into the stock blocked layout and unpacking the output)."""
    from vta_ext.packing import BlockedActivation, BlockedMatrix

    from .hosttime import relayout_seconds

    shape = _shape(op.operands[0])
    if kind == "dense":
        act = _Layout(BlockedMatrix(shape[0], shape[1], config.BATCH, config.BLOCK_IN))
    else:
        act = BlockedActivation(*shape, config.BATCH, config.BLOCK_IN)
    return relayout_seconds(act, shape, plan.out_layout, repeats)[1]


@dataclass
class _StockTiming:
    """The stock template's figures when it competes with the candidates."""

    cycles: int
    host_seconds: Optional[float] = None
    host_bytes: int = 0


def objective_key(options) -> str:
    """The objective as the caches key it: ``end-to-end`` carries its host model's rates."""
    if options.objective != "end-to-end":
        return options.objective
    h = options.host
    return f"end-to-end@{h.layout_bytes_per_cycle!r},{h.cpu_macs_per_cycle!r}"


def output_users(op: MatchedOp) -> Tuple[bool, bool]:
    """``(to_vta, to_cpu)``: whether a VTA operator and whether the CPU (a CPU operator or the
    function's result) use ``op``'s output (:attr:`~vta_ext.strategy.MatchedOp.consumers`); an
    operator whose consumers are not known counts as consumed by a VTA operator only."""
    from vta_ext.report import CPU as ON_CPU, VTA as ON_VTA

    if op.consumers is None:
        return True, False
    return ON_VTA in op.consumers, ON_CPU in op.consumers


def consumer_key(op: MatchedOp) -> List[Any]:
    """What the host layout pricing of ``op``'s plans depends on besides its layouts, as the
    choice and plan caches key it: its output's users and whether its input is unpacked anyway,
    and the lane constants of its input and those it is asked to write when there are any
    (:func:`~.lanes.lanes_key`)."""
    from .lanes import lanes_key

    lanes = lanes_key(op)
    return ([None if op.consumers is None else list(op.consumers), op.input_unpacked]
            + ([lanes] if lanes != [None, None] else []))


def consumer_text(op: MatchedOp) -> str:
    """How :func:`plan_host_bytes` priced ``op``'s output and input, for the report."""
    to_vta, to_cpu = output_users(op)
    if op.consumers is None:
        text = ("host layout priced for a VTA consumer of the output (its users are not known: "
                "planned outside the offload pass)")
    elif to_cpu and to_vta:
        text = ("output to the CPU and to a VTA operator: host layout priced with its unpack, "
                "and the repack of a non-blocked layout")
    elif to_cpu:
        text = "output to the CPU: host layout priced with its unpack, whatever its layout"
    else:
        text = "output to a VTA operator: the stock blocked layout hands over for free"
    if op.input_unpacked:
        text += "; input unpacked for a CPU user anyway: only its packing priced"
    return text


def plan_host_bytes(op: MatchedOp, in_layout, out_layout, stock_out) -> int:
    """Host layout bytes per inference that a plan adds around ``op``
    (:func:`vta_ext.host.layout_traffic`):

    * input: nothing if the producing VTA operator hands its output over in ``in_layout``'s
      arrangement; else packing into ``in_layout``, after unpacking the producer's packed output
      if there is one and no CPU user unpacks it anyway (``op.input_unpacked``);
    * output, by its users (:func:`output_users`): for a CPU user, unpacking ``out_layout``
      whatever it is (the stock blocked arrangement too); for a VTA operator, nothing if
      ``out_layout`` is the stock blocked arrangement (``stock_out``) that the neighbouring VTA
      operators take over, or holds it as its first channel blocks (a thread-padded twin's
      output, read in place: :func:`vta_ext.packing.hands_over`), else unpacking it (once, shared with a CPU user) and packing into
      the stock arrangement again.
    """
    from vta_ext.host import layout_traffic
    from vta_ext.packing import same_arrangement

    taken = (op.input_layout is not None and in_layout is not None
             and same_arrangement(op.input_layout, in_layout))
    cost = _output_host_bytes(op, out_layout, stock_out)
    if not taken:
        cost += ((0 if op.input_unpacked else layout_traffic(op.input_layout, unpack=True))
                 + layout_traffic(in_layout))
    return cost


def _output_host_bytes(op: MatchedOp, out_layout, stock_out) -> int:
    """The output's part of :func:`plan_host_bytes`."""
    from vta_ext.host import layout_traffic
    from vta_ext.packing import hands_over

    # the stock arrangement itself, or as the first channel blocks of a thread-padded output,
    # which the consumers read in place (vta_ext.packing.blocked_prefix)
    kept = hands_over(out_layout, stock_out)
    to_vta, to_cpu = output_users(op)
    repacked = to_vta and not kept
    cost = 0
    if to_cpu or repacked:
        cost += layout_traffic(out_layout, unpack=True)
    if repacked:
        cost += layout_traffic(stock_out)
    return cost


def folded_host_bytes_bound(op: MatchedOp, data_bytes: int, out_layout, stock_out) -> int:
    """A lower bound on :func:`plan_host_bytes` ``(op, in_layout, out_layout, stock_out)`` for
    every data layout ``in_layout`` that writes at least ``data_bytes`` bytes
    (:func:`vta_ext.host.layout_traffic`; for a folded bias whose form is not decided yet,
    :func:`~.codegen.biasfold.fold_copied_bound`): the output's part exactly, plus
    ``data_bytes`` for an input from the host (``op.input_layout`` None), else nothing.

    Proof. The output's part does not depend on ``in_layout``. With ``op.input_layout`` None
    nothing is taken over and no producer's output is unpacked: the input's part is
    ``layout_traffic(in_layout) >= data_bytes``. Otherwise the input's part is at least 0 (the
    packed input may be taken over).
    """
    return (data_bytes if op.input_layout is None else 0) + _output_host_bytes(op, out_layout,
                                                                              stock_out)


class _CountingPacker:
    """The packer protocol of :mod:`vta_ext.packing`: emits nothing, and sums per operand the bytes
    of the packing steps that copy (every op but :data:`vta_ext.host.VIEW_OPS`), as the build
    report counts them (:mod:`vta_ext.offload.placements`). A constant operand is relayouted at
    build time, so it adds nothing."""

    def __init__(self) -> None:
        from tvm import relax

        self._bb = relax.BlockBuilder()
        self._bb._begin_binding_block()       # a scope to normalise (type) the steps in
        self.bytes: dict = {}
        self._source = None

    def operand(self, expr):
        self._source = expr
        return expr

    def emit(self, expr, name: str):
        from vta_ext.host import VIEW_OPS

        out = self._bb.normalize(expr)
        if expr.op.name not in VIEW_OPS:
            ty = out.ty
            n = math.prod(int(d) for d in ty.shape) * max(1, tvm.runtime.DataType(str(ty.dtype)).bits // 8)
            self.bytes[self._source] = self.bytes.get(self._source, 0) + n
        return out

    emit_unpack = emit

    def add_func(self, func, name: str):
        return self._bb.add_func(func, name)

    def handover(self, expr, layout):
        return None

    def note_kept(self, kept: bool) -> None:
        pass

    def close(self) -> None:
        self._bb._end_block()


def operand_pack_bytes(op: MatchedOp, inputs) -> int:
    """Host layout bytes per inference of packing ``op``'s weight, bias and multiplier when they
    are not constants (function inputs, e.g. ``relay_examples/conv_block.py``): what ``inputs``
    (an :class:`~vta_ext.strategy.OpPlan`'s ``inputs(packer)``) emits for every operand but the
    activation, which :func:`plan_host_bytes` prices with the hand-over."""
    if all(isinstance(e, tvm.ir.expr.Constant) for e in (*op.operands[1:], op.bias, op.multiplier)
           if e is not None):
        return 0
    packer = _CountingPacker()
    try:
        inputs(packer)
    finally:
        packer.close()
    return sum(n for src, n in packer.bytes.items() if src is not op.operands[0])


def blocked_output(op: MatchedOp, config):
    """The stock blocked arrangement of ``op``'s output (what the neighbouring VTA operators
    take over), or None for an output that is not 2-D or 4-D
    (:func:`vta_ext.packing.blocked_arrangement`)."""
    from vta_ext.packing import blocked_arrangement

    return blocked_arrangement(_shape(op.core), config)


def cpu_host_bytes(op: MatchedOp, out_layout) -> int:
    """Host layout bytes per inference when ``op`` stays on the CPU between VTA operators:
    unpacking its input from the producing VTA operator, if any (and no CPU user unpacks it
    anyway), and packing its output into ``out_layout`` (the stock blocked arrangement) for a
    VTA operator that uses it (:func:`output_users`)."""
    from vta_ext.host import layout_traffic

    to_vta, _ = output_users(op)
    return ((0 if op.input_unpacked else layout_traffic(op.input_layout, unpack=True))
            + (layout_traffic(out_layout) if to_vta else 0))


#: what :func:`choose` returns when running the operator on the CPU is cheaper
#: end to end than every plan for VTA (only where the stock template refuses the operator)
CPU = "cpu"


def cpu_cost(op: MatchedOp, out_layout, host) -> Tuple[int, int, float]:
    """``(macs, layout_bytes, score)`` of leaving ``op`` on the CPU under the ``end-to-end``
    objective: its MACs (:func:`vta_ext.quantize.call_macs`) and host layout bytes
    (:func:`cpu_host_bytes` with ``out_layout``, the stock blocked arrangement) priced by the
    host model ``host``."""
    from vta_ext.quantize import call_macs

    macs = call_macs(op.core)
    layout = cpu_host_bytes(op, out_layout)
    return macs, layout, host.cpu_cycles(macs) + host.layout_cycles(layout)


def cpu_text(cost: Tuple[int, int, float], host) -> str:
    """How the report words :func:`cpu_cost`'s ``cost`` under the host model ``host``."""
    macs, layout, score = cost
    return (f"{score:,.0f} cycles ({macs:,} MACs and {layout:,} B host layout, host model "
            f"{host.name})")


def cpu_bound_exceeded(usable: List[Candidate], on_cpu: float, bounds: Sequence[Any]
                       ) -> Optional[float]:
    """The lowest of the candidates' lower bounds when every one of ``usable`` has a lower bound
    on its end-to-end score above the CPU's score ``on_cpu`` (then none can beat the CPU,
    whichever of them builds or fails to), else None. ``bounds`` are lower bounds on a
    candidate's score, each at least the one before it and dearer to compute (:func:`_choose`'s
    ``output_bound``, ``cheap_bound`` and ``lower_bound``): a later one is computed only for a
    candidate whose earlier ones do not exceed ``on_cpu``."""
    found = []
    for c in usable:
        for bound in bounds:
            b = bound(c)
            if b > on_cpu:
                found.append(b)
                break
        else:
            return None
    return min(found) if found else None


def stock_refuses(kind: str, op: MatchedOp, config) -> bool:
    """Whether the stock template refuses ``op`` (or there is none for its kind): then the
    end-to-end objective weighs leaving the operator on the CPU against running it on VTA."""
    try:
        get_template(kind, "stock").plan(op, config)
    except TemplateRefusal:
        return True
    return False


def cycles_bound(config, kind: str, op: MatchedOp, cand: Candidate) -> float:
    """A lower bound on the cycle model's count of any program of the candidate ``cand`` for
    ``op`` (an operator of ``kind``), known before it is built: the largest of the three
    modules' bounds, each module running its instructions one after the other from the
    instruction fetch on (:func:`vta_ext.sim.cycles.timing`).

    * compute: the summed durations of its instructions are at least the micro-op cycles that
      every program of ``cand.packed`` runs whatever its knobs
      (:func:`~.codegen.knobs.compute_work`): every GEMM call of the embedding, the
      initialisation of every accumulator entry, and every accumulator entry through every ALU
      pass of the epilogue the program runs (without the bias stage when the bias is folded,
      :func:`~.candidates.program_epilogue`; simplified as the build simplifies it); plus the
      fixed cycles of the fewest instructions that can do it (:func:`_compute_fixed`) and the
      FINISH;
    * load: the operator's input and weights (as written, :func:`vta_ext.floor.key_floor`'s
      sizes), each moved once at the bandwidth of the buffer the embedding binds it to (``A``:
      ``INP``, ``B``: ``WGT``) in at least one DMA of one row
      (:func:`vta_ext.floor.moved_cycles`);
    * store: the output, the same way as ``OUT``.
    """
    from vta_ext.templates.epilogue import simplify_epilogue

    from .candidates import program_epilogue
    from .codegen.knobs import _free_dims, compute_work

    ep = simplify_epilogue(program_epilogue(cand.workload, op.epilogue))
    pg = cand.packed
    blocks = math.prod(d.extent for d in _free_dims(pg.operands["C"]))
    compute = (sum(compute_work(config, pg, ep).values())
               + _compute_fixed(config, blocks, ep, "reset" if pg.embedding.mode == "strict"
                                else "fill"))
    data_in_a = pg.operands["A"].tensor == pg.embedding.workload.inputs[0].name
    return max(compute, *_memory_bounds(config, kind, cand.workload, op,
                                        "INP" if data_in_a else "WGT"))


def _compute_fixed(config, blocks: int, ep, init: str) -> float:
    """A lower bound on the fixed cycles of the compute module's instructions
    (:func:`vta_ext.sim.cycles.timing`) of a program of ``blocks`` accumulator entries with the
    (simplified) epilogue ``ep``: the instruction fetch, the FINISH and, for every group of at
    most ``acc_depth`` entries (an instruction addresses the accumulator scratchpad only, so it
    reaches at most that many entries), a GEMM, an initialisation (a reset GEMM, or an
    accumulator fill LOAD of ``init`` ``"fill"``), the bias GEMM of a ``("bias_gemm",)`` stage
    and every ALU instruction of the epilogue (:func:`~vta_ext.templates.epilogue.alu_count`)."""
    from vta_ext.sim.cycles import timing
    from vta_ext.templates.epilogue import GEMM_BIAS_STAGE, alu_count

    t = timing(config)
    groups = -(-blocks // config.acc_depth)
    first = t.gemm_fixed if init == "reset" else t.dma("ACC").fixed
    gemms = 2 if GEMM_BIAS_STAGE in ep else 1      # the bias GEMM (:mod:`.codegen.biasfold`)
    return (t.fetch + t.finish
            + groups * (gemms * t.gemm_fixed + first + alu_count(config, ep) * t.alu_fixed))


def _memory_bounds(config, kind: str, workload, op: MatchedOp, data_kind: str) -> Tuple[float, ...]:
    """``(load, store)`` lower bounds of a program of ``op`` (CSP ``workload``; its data bound to
    the buffer ``data_kind``, ``INP`` or ``WGT``, the weights to the other): the module's fetch
    plus the operator's tensors as written, each moved once (:func:`vta_ext.floor.moved_cycles`);
    ``()`` for an operator whose sizes the floor does not know."""
    from vta_ext.floor import GEMM_KINDS, _csp_size, moved_cycles
    from vta_ext.quantize import call_macs
    from vta_ext.sim.cycles import timing

    if workload.stock or workload.op not in GEMM_KINDS:
        return ()
    try:
        shape = [int(d) for d in op.core.ty.shape]
        size = _csp_size(workload.op, dict(workload.params), call_macs(op.core), math.prod(shape),
                         op.epilogue)
    except (AttributeError, KeyError, TypeError, ValueError):
        return ()
    cfg = config
    wgt_kind = "WGT" if data_kind == "INP" else "INP"
    fetch = timing(cfg).fetch
    load = (fetch + moved_cycles(cfg, data_kind, size.in_elements * cfg.INP_WIDTH / 8)
            + moved_cycles(cfg, wgt_kind, size.weight_elements * cfg.WGT_WIDTH / 8))
    store = fetch + moved_cycles(cfg, "OUT", size.out_elements * cfg.OUT_WIDTH / 8)
    return load, store


def stock_cycles_bound(config, kind: str, op: MatchedOp, plan, knobs=None) -> Optional[float]:
    """A lower bound on the cycle model's count of the stock template's program for ``op``
    (``plan``, :meth:`vta_ext.OpTemplate.plan`, built with ``knobs``, the knobs option), known
    before it is built; None for a template whose micro-op count this does not know.

    The stock conv2d, group conv2d and dense templates run every micro-op of their (channel
    padded) workload exactly once, whatever the tiling
    (:func:`vta_ext.templates.tiling.total_gemm_uops`), and reset every accumulator entry of the
    output once and pass it once through every ALU stage of the epilogue
    (:func:`vta_ext.templates.tiling.output_blocks`), all on the compute module, as in
    :func:`cycles_bound`.

    With the tiling ``knobs`` resolve to (:func:`vta_ext.templates.tiling.resolve_knobs`) the
    input and weight bytes it loads are known exactly (:func:`vta_ext.templates.tiling.dram_bytes`),
    and the load module moves them at their kinds' bandwidths at best (``INP``, ``WGT``), in at
    least one DMA of one row each (:func:`vta_ext.floor.moved_cycles`). With one virtual thread
    the program also runs its loads and GEMMs one after the other: a load step overwrites the
    buffers the GEMM before it reads, so it waits for that GEMM, and a GEMM waits for its loads.
    Such a program takes at least its load cycles plus its GEMMs' cycles (the resets and ALU
    passes may run under the next tile's loads, so they are not added).

    The compute module's fixed instruction cycles (:func:`_compute_fixed`) are added to the
    micro-op cycles, and each GEMM of the one-thread chain counts its fixed cycles too (at least
    one GEMM per group of ``acc_depth`` output entries).
    """
    from vta_ext.templates.epilogue import alu_cycles, has_bias, normalize_epilogue, simplify_epilogue
    from vta_ext.templates.tiling import dram_bytes, output_blocks, resolve_knobs, total_gemm_uops
    from vta_ext.templates.workload import Conv2dWorkload, DenseWorkload, dense_as_conv2d

    wl = plan.workload
    if isinstance(wl, DenseWorkload):
        wl = dense_as_conv2d(wl)
    if not isinstance(wl, Conv2dWorkload):
        return None
    from vta_ext.floor import moved_cycles
    from vta_ext.sim.cycles import timing

    blocks = output_blocks(config, wl)
    ep = simplify_epilogue(normalize_epilogue(op.epilogue))
    t = timing(config)
    gemm = total_gemm_uops(config, wl) * config.GEMM_CYCLES_PER_UOP
    compute = (gemm + blocks * (config.GEMM_CYCLES_PER_UOP + alu_cycles(config, ep))
               + _compute_fixed(config, blocks, ep, "reset"))
    if knobs is None:
        return compute
    try:
        k, _ = resolve_knobs(config, plan.workload, op.epilogue, knobs)
    except Exception:  # noqa: BLE001 -- the build meets the same problem and reports it
        return compute
    nbytes = dram_bytes(config, wl, k, has_bias(ep))
    loads = t.fetch + (moved_cycles(config, "INP", nbytes["inp_load_nbytes"])
                       + moved_cycles(config, "WGT", nbytes["wgt_load_nbytes"]))
    if k.oc_nthread * k.h_nthread == 1:
        return max(compute, loads + gemm + -(-blocks // config.acc_depth) * t.gemm_fixed)
    return max(compute, loads)


def choose(kind: str, strategy: str, mode: str, config, base, layouts, usable: List[Candidate],
           op: MatchedOp, options, contender) -> Tuple[Any, str]:
    """The candidate the objective prefers (or :data:`STOCK`), and the sentence saying why
    (cached on disk). The parameters and the choice are :func:`_choose`'s; the cyclic garbage
    collector pauses meanwhile (:func:`gc_paused`)."""
    with gc_paused():
        return _choose(kind, strategy, mode, config, base, layouts, usable, op, options, contender)


def _choose(kind: str, strategy: str, mode: str, config, base, layouts, usable: List[Candidate],
            op: MatchedOp, options, contender) -> Tuple[Any, str]:
    """The candidate the objective prefers (or :data:`STOCK`), and the sentence saying why
    (cached on disk).

    A candidate whose build is refused (no tiling fits) or rejects explicit knobs is dropped.
    If none is left: None and the reasons when every one was refused; explicit knobs that no
    candidate accepts raise the first candidate's :class:`KnobError`. Under ``csp-relaxed``
    (objective cycles or combined) the stock template's plan is timed with the same knobs
    option and returned as :data:`STOCK` when it is at least as good as the best candidate.
    ``contender`` is :meth:`_stock_contender`'s answer for ``op``.

    The candidates considered are those of the first :data:`CYCLE_RANKED` embeddings by the static
    estimate, up to :data:`RANK_FACTOR` times the best estimate (a candidate whose build fails
    leaves its place to the next). They are timed lowest lower bound first. Under the objectives
    ``cycles`` and ``end-to-end``, a plan (a candidate or the stock template's) whose score has a
    lower bound (:func:`cycles_bound` or :func:`stock_cycles_bound`, plus its host layout cycles)
    above a timed plan's score that agrees with the neighbouring layouts at least as well
    (:func:`agreement_points`), or above the best score plus :data:`AGREEMENT_SLACK` when layout
    agreement applies, is not built: it could be neither the fastest nor the plan layout
    agreement takes. A candidate not built counts as considered: the only way this can differ
    from building every considered candidate is a candidate whose build would have failed and
    left its place to one more.
    """
    from vta_ext.templates.errors import KnobError

    objective = options.objective
    eager = ""
    if getattr(options, "records", None) is not None and any(c.pending for c in usable):
        # a tuned record may be keyed by the fold's form: decide every one first
        eager = ("; every bias fold's form decided before the choice (tuned records may depend "
                 "on it)")
        for c in usable:
            settle(c)
    knobs = {id(c): options.knobs_for(kind, strategy, c.workload, config)[0] for c in usable}
    key = _choice_key(config, base, mode, layouts, objective_key(options), op.epilogue,
                      [knobs[id(c)] for c in usable], _contender_key(contender),
                      op.input_layout, bias_signature(op), consumer_key(op))
    path = cache_dir() / "choices" / f"{key}.json"
    if path.exists():
        try:
            data = json.loads(path.read_text())
            if data.get("stock") and contender is not None:
                return STOCK, data["why"]
            if data.get("cpu"):
                return CPU, data["why"]
            chosen = CspWorkload(**data["workload"])
            for c in usable:
                if unfolded(c.workload) == unfolded(chosen) and settle(c).workload == chosen:
                    return c, data["why"]
        except (OSError, ValueError, KeyError):
            pass
    if objective == "footprint":
        ranked = sorted(usable, key=lambda c: (c.footprint, c.estimate))
        best = settle(ranked[0])
        why = (f"smallest packed footprint {best.footprint:,} B of {len(usable)} embedding(s)"
               + (f" (next {ranked[1].footprint:,} B, {ranked[1].label})" if len(ranked) > 1 else ""))
    else:
        from .shape_cycles import modelled_cycles

        timed, dropped, knob_errors, skipped = [], [], [], []
        stock_out = contender[0].out_layout if contender is not None else blocked_output(op, config)
        first = min(c.estimate for c in usable)
        clock = config.CLOCK_MHZ * 1e6
        host = options.host

        def score(c):
            if objective == "combined":
                return c.cycles / clock + (c.host_seconds or 0.0)
            if objective == "end-to-end":
                return c.cycles + host.layout_cycles(c.host_bytes)
            return c.cycles

        # an embedding and its twin with the bias kept on the ALU (:func:`~.candidates.kept_twin`)
        # take one place of CYCLE_RANKED
        # and twins padded for two threads (:func:`~.candidates.thread_padded_twins`)
        place_of = {id(c): unfolded(c.place or c.workload) for c in usable}
        # the stock mapping's embedding (and its twins) is timed wherever its static estimate,
        # which does not see host layout work, ranks it: its layout the neighbours hand over
        anchored = {place_of[id(c)] for c in usable if c.embedding is not None
                    and is_stock_mapping(c.embedding, c.embedding.workload)}
        distinct = lambda cands: len({place_of[id(c)] for c in cands})  # noqa: E731
        prune = PRUNE_BY_BOUND and objective in ("cycles", "end-to-end")
        slack = 1 + AGREEMENT_SLACK if op.input_layout is not None else 1
        agree_out = contender[0].out_layout if contender is not None else None
        by_estimate = sorted(usable, key=lambda c: c.estimate)
        rank = {id(c): i for i, c in enumerate(by_estimate)}
        failed, done, lower, cheap, cycles = set(), set(), {}, {}, {}

        def considered():
            """The candidates the choice times: in estimate order, those of the first
            CYCLE_RANKED embeddings, up to RANK_FACTOR times the best estimate once one is in,
            and those of the stock mapping (:data:`anchored`) wherever they rank; a candidate
            whose build failed leaves its place to the next."""
            out, places, closed = [], set(), False
            for c in by_estimate:
                if id(c) in failed:
                    continue
                place = place_of[id(c)]
                closed = closed or (len(places) == CYCLE_RANKED and place not in places) or bool(
                    out and c.estimate > RANK_FACTOR * first)
                if closed and place not in anchored:
                    continue
                places.add(place)
                out.append(c)
            return out

        def form_pending(c) -> bool:
            """Whether ``c``'s bias fold has not decided its form yet (:func:`settle`; a twin
            whose bias is not folded may still wait for its note, which no bound needs)."""
            return bool(c.pending and c.workload.bias_lanes)

        def settled(c):
            """``c`` with its fold's form decided (:func:`settle`), when it has one."""
            return settle(c) if form_pending(c) else c

        def cycles_of(c):
            """:func:`cycles_bound` of ``c`` (the same before and after :func:`settle`: it needs
            only whether the bias folds)."""
            if id(c) not in cycles:
                cycles[id(c)] = cycles_bound(config, kind, op, c)
            return cycles[id(c)]

        def lower_bound(c):
            """A lower bound on ``c``'s score (its bias fold settled, its host bytes set on the
            way)."""
            if id(c) not in lower:
                act = data_layout(settled(c))   # with the lane constants of a folded bias
                c.host_bytes = (plan_host_bytes(op, act, c.packed.operands["C"].host, stock_out)
                                + operand_pack_bytes(op, packed_inputs(op, c)))
                lower[id(c)] = cycles_of(c) + (
                    host.layout_cycles(c.host_bytes) if objective == "end-to-end" else 0)
            return lower[id(c)]

        def cheap_bound(c):
            """A lower bound on :func:`lower_bound` of ``c`` that needs no fold form while one is
            pending (:func:`folded_host_bytes_bound` of
            :func:`~.codegen.biasfold.fold_copied_bound`; a folded bias's weights and bias are
            constants, so no operand is packed at run time), else that bound itself."""
            from .codegen.biasfold import fold_copied_bound

            if id(c) in lower or not form_pending(c):
                return lower_bound(c)
            if id(c) not in cheap:
                nbytes = folded_host_bytes_bound(op, fold_copied_bound(c.packed),
                                                 c.packed.operands["C"].host, stock_out)
                cheap[id(c)] = cycles_of(c) + (
                    host.layout_cycles(nbytes) if objective == "end-to-end" else 0)
            return cheap[id(c)]

        def points_bound(c) -> int:
            """:func:`agreement_points` of ``c``, or at least as many while its fold form is
            pending (its input is counted as taken over whenever a VTA operator produces it)."""
            if not form_pending(c):
                return agreement_points(op, agree_out, *plan_layouts(op, c))
            return (agreement_points(op, agree_out, None, c.packed.operands["C"].host)
                    + int(op.input_layout is not None))

        def lowest(pending):
            """The candidate of ``pending`` of the lowest ``(lower_bound, rank)``, computing that
            bound only while a candidate could still be it (by :func:`cheap_bound` order); those
            seen on the way whose cheap bound is already beaten are skipped, as they would be
            when their turn came (``beaten`` only grows with the bound and with the timed plans
            until then, and no build happens in between). None if every one is skipped."""
            best = None
            for c in sorted(pending, key=lambda c: (cheap_bound(c), rank[id(c)])):
                if best is not None and best[0] <= (cheap_bound(c), rank[id(c)]):
                    break
                if prune and form_pending(c) and beaten(cheap_bound(c), points_bound(c)):
                    done.add(id(c))
                    skipped.append(c)
                    continue
                if best is None or (lower_bound(c), rank[id(c)]) < best[0]:
                    best = ((lower_bound(c), rank[id(c)]), c)
            return None if best is None else best[1]

        def beaten(bound, pts) -> bool:
            """Whether a plan whose score is at least ``bound`` and whose layout agreement is
            ``pts`` points can be neither the fastest plan nor the one layout agreement takes
            (:func:`agree`): a timed plan scores less and agrees at least as well, or the
            bound exceeds the best score by more than the agreement slack."""
            return bool(timed) and (bound > slack * min(map(score, timed)) or any(
                score(t) < bound and agreement_points(op, agree_out, *plan_layouts(op, t)) >= pts
                for t in timed))

        def output_bound(c):
            """A lower bound on :func:`cheap_bound` of ``c`` that needs neither its fold's form
            nor its data layout: the cycles bound plus the output's host layout cycles (the
            input's part of :func:`plan_host_bytes` is at least 0)."""
            return cycles_of(c) + (host.layout_cycles(_output_host_bytes(
                op, c.packed.operands["C"].host, stock_out)) if objective == "end-to-end" else 0)

        cpu = (cpu_cost(op, stock_out, host) if objective == "end-to-end" and contender is None
               and stock_refuses(kind, op, config) else None)
        if prune and cpu is not None and cpu[0]:
            above = cpu_bound_exceeded(usable, cpu[2], (output_bound, cheap_bound, lower_bound))
            if above is not None:    # no candidate can beat the CPU, whichever of them builds
                why = (f"end to end cheaper on the CPU: {cpu_text(cpu, host)} against at least "
                       f"{above:,.0f} cycles end to end for every one of the {distinct(usable)} "
                       f"embedding(s) on VTA (none built: a lower bound on each one's score "
                       f"exceeds the CPU's); the stock template refuses it too; {consumer_text(op)}")
                _write(path, {"cpu": True, "why": why})
                return CPU, why
        # time the considered candidates, the most promising (lowest bound) first: a candidate
        # whose bound shows it cannot be taken is not built
        while True:
            pending = [c for c in considered() if id(c) not in done]
            if not pending:
                break
            c = lowest(pending)
            if c is None:
                continue
            done.add(id(c))
            if prune and beaten(lower_bound(c), agreement_points(op, agree_out, *plan_layouts(op, c))):
                skipped.append(c)
                continue
            try:
                c.cycles = modelled_cycles(kind, strategy, config, c.workload, op.epilogue,
                                           knobs[id(c)])
            except KnobError as err:
                knob_errors.append(err)
                dropped.append(f"{c.label}: {err}")
                failed.add(id(c))
                continue
            except TemplateRefusal as err:
                dropped.append(f"{c.label}: {err}")
                failed.add(id(c))
                continue
            if objective == "combined":
                c.host_seconds = host_relayout_seconds(c.packed, data_layout=data_layout(c))
            timed.append(c)
        # equal scores: the order of the static estimate, whatever order they were timed in
        timed.sort(key=lambda c: rank[id(c)])
        if not timed:
            if knob_errors:
                raise knob_errors[0]
            return None, "; ".join(dropped)
        ranked = sorted(timed, key=score)
        best = ranked[0]
        if objective == "combined":
            unit = (lambda c: f"{score(c) * 1e3:.3f} ms (cycles {c.cycles:,}, host "
                    f"{c.host_seconds * 1e3:.3f} ms)")
        elif objective == "end-to-end":
            unit = (lambda c: f"{score(c):,.0f} cycles end to end ({c.cycles:,} VTA + "
                    f"{c.host_bytes:,} B host layout)")
        else:
            unit = lambda c: f"{c.cycles:,} cycles"  # noqa: E731
        what = {"combined": "fastest combined", "end-to-end": "fewest cycles end to end"}.get(
            objective, "fewest cycles")
        timed_text = (f"{distinct(timed)} of {distinct(usable)} embedding(s) timed by the cycle model "
                      f"(the best by the static estimate, within x{RANK_FACTOR:g} of it)"
                      + (f", {len(skipped)} more not built: a lower bound on their score exceeds "
                         f"the best" if skipped else "")
                      + (f"; {consumer_text(op)}" if objective == "end-to-end" else "") + eager)
        stock, stock_skip = None, None
        if PRUNE_BY_BOUND and objective in ("cycles", "end-to-end") and contender is not None:
            bound = (stock_cycles_bound(config, kind, op, contender.plan, contender.knobs)
                     if contender.search is None else contender.search.bound())
            if bound is not None and objective == "end-to-end":
                bound += host.layout_cycles(stock_host_bytes(op, contender[0]))
            if bound is not None and beaten(bound, agreement_points(
                    op, agree_out, contender[0].in_layout, contender[0].out_layout)):
                stock_skip = bound      # it could be neither the fastest nor the agreed plan
        if stock_skip is None:
            stock = time_stock(kind, strategy, config, op, contender, objective, dropped)
        else:
            timed_text += (f"; the stock template's plan not built: a lower bound on its score, "
                           f"{stock_skip:,.0f}, exceeds the best")
        if cpu is not None:
            if cpu[0] and cpu[2] < score(best):
                why = (f"end to end cheaper on the CPU: {cpu_text(cpu, host)} against "
                       f"{unit(best)} for the best embedding {best.label} on VTA; the stock "
                       f"template refuses it too; {consumer_text(op)}")
                _write(path, {"cpu": True, "why": why})
                return CPU, why
        agreed, agree_text = agree(op, ranked, stock, contender, score, unit)
        if agreed is STOCK or (agreed is None and stock is not None
                               and score(stock) <= score(best)):
            why = (f"{what}: {unit(stock)} with the stock template's own plan, at least as good "
                   f"as the best embedding {best.label}: {unit(best)}; {timed_text}"
                   if agreed is None else f"{agree_text}; {timed_text}")
            _write(path, {"stock": True, "why": why})
            return STOCK, why
        if agreed is not None:
            why = (f"{agree_text}; {timed_text}"
                   + (f"; stock template: {unit(stock)}" if stock is not None else ""))
            best = agreed
        else:
            why = (f"{what}: {unit(best)}; {timed_text}"
                   + (f"; next {ranked[1].label}: {unit(ranked[1])}" if len(ranked) > 1 else "")
                   + (f"; stock template: {unit(stock)}" if stock is not None else ""))
    _write(path, {"workload": dataclasses.asdict(best.workload), "why": why})
    return settle(best), why



def plan_layouts(op: MatchedOp, cand: Candidate) -> Tuple[Any, Any]:
    """The host layouts ``cand``'s plan for ``op`` takes its activation in (with the lane
    constants of a folded bias) and leaves its output in."""
    return data_layout(cand), cand.packed.operands["C"].host


def agreement_points(op: MatchedOp, stock_out, in_layout, out_layout) -> int:
    """Layout agreement points of a plan for ``op`` taking its activation in ``in_layout`` and
    leaving its output in ``out_layout`` (:func:`agree`): one for taking the producer's packed
    output over, one for leaving the output in the stock template's arrangement ``stock_out``
    when a VTA operator uses it (:func:`output_users`; None: no stock plan, no point)."""
    from vta_ext.packing import hands_over, same_arrangement

    taken = (op.input_layout is not None and in_layout is not None
             and same_arrangement(op.input_layout, in_layout))
    kept = output_users(op)[0] and hands_over(out_layout, stock_out)
    return int(taken) + int(kept)


def agree(op: MatchedOp, ranked: List[Candidate], stock, contender, score, unit):
    """Layout agreement (:data:`AGREEMENT_SLACK`) for an operator fed by a VTA operator.

    Each plan scores one point for taking the producer's packed output over (its data layout
    has the same arrangement, :func:`vta_ext.packing.same_arrangement`) and one for leaving its
    output in the stock blocked arrangement the neighbouring VTA operators use. Returns the
    plan to take instead of the fastest (a candidate or :data:`STOCK`) and the sentence saying
    why, or ``(None, "")`` when the fastest plan agrees at least as well or no plan within the
    slack agrees better (and always when the input comes from the host).
    """
    if op.input_layout is None or not ranked:
        return None, ""
    stock_out = contender[0].out_layout if contender is not None else None
    entries = []  # (score, order, plan, label, points); the stock plan first on a tie
    if stock is not None:
        entries.append((score(stock), 0, STOCK, "the stock template's own plan",
                        agreement_points(op, stock_out, contender[0].in_layout,
                                         contender[0].out_layout), stock))
    for i, c in enumerate(ranked):
        entries.append((score(c), i + 1, c, c.label,
                        agreement_points(op, stock_out, *plan_layouts(op, c)), c))
    entries.sort(key=lambda e: (e[0], e[1]))
    fastest = entries[0]
    close = [e for e in entries if e[0] <= fastest[0] * (1 + AGREEMENT_SLACK)]
    chosen = max(close, key=lambda e: (e[4], -e[0], -e[1]))
    if chosen[4] <= fastest[4]:
        return None, ""
    extra = 100.0 * (chosen[0] / fastest[0] - 1) if fastest[0] else 0.0
    return chosen[2], (f"layout agreement: {chosen[3]} ({unit(chosen[5])}) hands over with "
                       f"{chosen[4]} of its 2 neighbouring VTA operator side(s) against "
                       f"{fastest[4]} for the fastest, {fastest[3]} ({unit(fastest[5])}), "
                       f"+{extra:.2f} % (slack {100 * AGREEMENT_SLACK:g} %)")



def time_stock(kind: str, strategy: str, config, op: MatchedOp, contender, objective: str,
               dropped: List[str]):
    """The stock contender timed like a candidate (an object with ``cycles`` and
    ``host_seconds``) at the point it is built at (:meth:`StockContender.built`), or None when
    there is none or it does not build with the knobs option (then the reason joins
    ``dropped``)."""
    from vta_ext.templates.errors import KnobError

    from .shape_cycles import modelled_cycles

    if contender is None:
        return None
    plan, _, knobs, _ = contender
    try:
        cycles = modelled_cycles(kind, strategy, config, contender.built(), op.epilogue, knobs)
    except (KnobError, TemplateRefusal) as err:
        dropped.append(f"stock template: {err}")
        return None
    host = (stock_host_relayout_seconds(kind, op, config, plan)
            if objective == "combined" else None)
    return _StockTiming(cycles, host, stock_host_bytes(op, plan))


def stock_host_bytes(op: MatchedOp, plan) -> int:
    """Host layout bytes per inference of the stock template's ``plan`` for ``op``: its
    activation's packing and output's unpacking, and the operands it packs at run time."""
    return (plan_host_bytes(op, plan.in_layout, plan.out_layout, plan.out_layout)
            + operand_pack_bytes(op, plan.inputs))
