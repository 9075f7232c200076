"""The CSP strategies ``csp-strict`` and ``csp-relaxed`` in :mod:`vta_ext`'s strategy registry.

``import tvm_csp_embed`` registers both and makes ``csp-relaxed`` the default of
``relax.build(mod, target="ext_vta")``; ``vta_ext.build_options(strategy="stock")`` keeps the stock
templates. Per matched operator (conv2d, group conv2d, dense; pools, the residual add and depthwise
convolutions fall back to ``stock``):

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
4. the candidates are ranked by ``build_options(objective=...)``: ``cycles`` (the cycle model of the
   built program; the two best by a static estimate are built), ``combined`` (cycles at the
   configuration's clock plus the measured host relayout time) or ``footprint`` (bytes of the packed
   tensors). The cycle model times up to :data:`CYCLE_RANKED` candidates, best static estimate
   first, within :data:`RANK_FACTOR` of the best (in practice all of them: the static estimate
   misjudges the operand-swapped embeddings). Under ``csp-relaxed`` the stock template's own plan
   of the operator is timed too (the stock-family embedding may have been cut from the timed set,
   or differ from the stock program in a few instructions) and is chosen when it is at least as
   fast: ``csp-relaxed`` is never slower than ``stock`` by its objective, and the report says
   ``stock template chosen by csp-relaxed: ...``. The choice is cached on disk next to the
   embeddings;
5. the plan emits the host relayout through the offload pass's packer and the output layout that
   unpacks it.

A solver timeout or "no embedding" keeps the operator on the ``stock`` template, and the build
report says so (``STOCK FALLBACK: ...``). Only a :class:`~vta_ext.errors.TemplateRefusal` (from the
stock fallback or an epilogue the ALU cannot run) keeps an operator on the CPU.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import vta_ext  # noqa: F401  (registers the stock strategy)
from vta_ext.errors import TemplateRefusal
from vta_ext.timing import phase
from vta_ext.strategy import (KnobSpace, MatchedOp, OpPlan, OpTemplate, Strategy, get_template,
                              register_strategy, register_template, set_default_strategy)

from .cache import SolveRequest, _write, cache_dir, cached_embeddings, solve_concurrently
from .codegen.build import build_gemm
from .codegen.knobs import (KnobPoint, Pruned, cycle_point, fallback_point, knob_grid,
                            knob_names, seed_tps_point, tps_point)
from .codegen.plan import PackedGemm, packed_gemm
from .embedding import Embedding, decode
from .instructions import gemm
from .operators import LAYOUTS, OPERATOR_KINDS, mapping_extents, operator_params, operator_text
from .operators import operator_workload as _new_operator_workload
from .solve import RawSolution, SolverError, padding_cost
from .workload import FUSED_CONV_VARIANTS, Workload, conv2d, conv2d_fused, dense, group_conv2d

__all__ = ["MODES", "CspWorkload", "CspGemmTemplate", "Candidate", "PlanCache", "STRATEGY_NAMES",
           "DEFAULT_SOLUTIONS", "DEFAULT_TIMEOUT", "STOCK_COMPARED", "STOCK", "operator_workload",
           "AGREEMENT_SLACK",
           "packed_of", "candidates", "stock_mapping_cost", "objective_key", "plan_host_bytes", "host_relayout_seconds", "fused_variants"]

logger = logging.getLogger("tvm_csp_embed")

#: strategy name -> constraint set of the solver
MODES = {"csp-strict": "strict", "csp-relaxed": "relaxed"}
STRATEGY_NAMES = tuple(MODES)
#: embeddings the solver returns per layer and layout
DEFAULT_SOLUTIONS = 4
#: seconds the solver may take per layer and layout
DEFAULT_TIMEOUT = 30.0
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
#: what :meth:`CspGemmTemplate._choose` returns when the stock template wins
STOCK = "stock"
#: the layouts of a conv2d's free dims, with the permutations from NCHW/OIHW (``permute_dims`` axes)
CONV_LAYOUTS = {"NCHW": {"data": (0, 1, 2, 3), "weight": (0, 1, 2, 3), "out": (0, 1, 2, 3)},
                "NHWC": {"data": (0, 2, 3, 1), "weight": (2, 3, 1, 0), "out": (0, 2, 3, 1)}}


#: how the report names the loop dims of the conv2d and dense workloads
DIM_WORDS = {"n": "batch", "b": "batch", "c": "in channels", "i": "in features", "k": "out channels",
             "o": "out features", "r": "filter rows", "s": "filter columns", "oh": "output rows",
             "ow": "output columns", "rs": "filter rows x columns (fused)",
             "crs": "in channels x filter rows x columns (fused)"}


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, (list, tuple)) else v


@dataclass(frozen=True)
class CspWorkload:
    """What a compiled CSP operator is rebuilt from: the operator and the embedding's structure.

    Attributes
    ----------
    op : str
        ``"conv2d"``, ``"group_conv2d"`` or ``"dense"``.
    params : tuple of (str, int)
        Operator parameters (conv2d: ``n c h w k kh kw pt pl pb pr sh sw``, plus ``g`` for a group
        conv2d; dense: ``n k m``).
    layout : str
        Layout of the free dims (``"NCHW"`` or ``"NHWC"``; dense: ``"NCHW"``).
    mode : str
        Constraint set (``"strict"`` or ``"relaxed"``).
    binding, bit_dims, bit_steps, pad
        The solver's structural solution (:class:`~tvm_csp_embed.solve.RawSolution`).
    stock : tuple of (str, int)
        Non-empty when the operator fell back to the stock template: its workload's fields.
    """

    op: str
    params: Tuple[Tuple[str, int], ...]
    layout: str = "NCHW"
    mode: str = "relaxed"
    binding: int = 1
    bit_dims: Tuple[int, ...] = ()
    bit_steps: Tuple[int, ...] = ()
    pad: Tuple[int, ...] = ()
    stock: Tuple[Tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _tuples(getattr(self, f.name)))

    @property
    def p(self) -> Dict[str, int]:
        """The operator parameters as a dict."""
        return dict(self.params)


# ------------------------------------------------------------------------------------ operators
def _shape(expr) -> Tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


def _conv_params(op: MatchedOp) -> Tuple[Tuple[str, int], ...]:
    a = op.core.attrs
    if any(int(d) != 1 for d in a.dilation):
        raise TemplateRefusal(f"dilation {tuple(int(d) for d in a.dilation)} is not supported by "
                              "the CSP conv2d workload")
    n, c, h, w = _shape(op.operands[0])
    k, _, kh, kw = _shape(op.operands[1])
    pt, pl, pb, pr = (int(v) for v in a.padding)
    params = (("n", n), ("c", c), ("h", h), ("w", w), ("k", k), ("kh", kh), ("kw", kw), ("pt", pt),
              ("pl", pl), ("pb", pb), ("pr", pr), ("sh", int(a.strides[0])), ("sw", int(a.strides[1])))
    groups = int(a.groups)
    return params + ((("g", groups),) if groups > 1 else ())


def operator_workload(cw: CspWorkload):
    """``(workload, operator shapes, source steps, input pads)`` of ``cw``'s operator in its layout
    (the arguments of :func:`~tvm_csp_embed.codegen.plan.packed_gemm`)."""
    if cw.op in OPERATOR_KINDS:  # batched matmul, conv1d, dilated conv2d: tvm_csp_embed.operators
        return _new_operator_workload(cw)
    p = cw.p
    if cw.op in ("conv2d", "group_conv2d"):
        n, c, k, g = p["n"], p["c"], p["k"], p.get("g", 1)
        h, w = p["h"] + p["pt"] + p["pb"], p["w"] + p["pl"] + p["pr"]
        name = f"{cw.op}_{cw.layout}_" + "_".join(f"{key}{v}" for key, v in cw.params)
        if cw.op == "conv2d" and cw.layout in FUSED_CONV_VARIANTS:
            return _fused_conv(cw, name)
        if cw.op == "conv2d":
            wl = conv2d(n, c, h, w, k, p["kh"], p["kw"], stride=(p["sh"], p["sw"]), layout=cw.layout,
                        name=name)
            steps = CONV_LAYOUTS[cw.layout]
        else:
            wl = group_conv2d(n, c, h, w, k, p["kh"], p["kw"], g, stride=(p["sh"], p["sw"]),
                              layout=cw.layout, name=name)
            steps = _group_steps(cw)
        oh = (h - p["kh"]) // p["sh"] + 1
        ow = (w - p["kw"]) // p["sw"] + 1
        shapes = {"data": (n, c, p["h"], p["w"]), "weight": (k, c // g, p["kh"], p["kw"]),
                  "out": (n, k, oh, ow)}
        dpad = {"n": (0, 0), "g": (0, 0), "c": (0, 0), "h": (p["pt"], p["pb"]), "w": (p["pl"], p["pr"])}
        pads = {"data": tuple(dpad[d] for d in wl.inputs[0].dim_names)}
        return wl, shapes, steps, pads
    if cw.op == "dense":
        wl = dense(p["n"], p["k"], p["m"], name=f"dense_n{p['n']}_k{p['k']}_m{p['m']}")
        return wl, {"data": (p["n"], p["k"]), "weight": (p["m"], p["k"]), "out": (p["n"], p["m"])}, {}, {}
    raise ValueError(f"no CSP workload for operator {cw.op!r}")


def _fused_conv(cw: CspWorkload, name: str):
    """:func:`operator_workload` of a conv2d in a fused-reduction variant
    (:func:`~tvm_csp_embed.workload.conv2d_fused`): the source steps pad the input and unfold it
    (stencil-unroll the columns, and for ``fused-crs`` the rows, then fuse the reduction dims);
    the weights are a reshape of the OIHW filter."""
    p = cw.p
    n, c, k, R, S, sh, sw = p["n"], p["c"], p["k"], p["kh"], p["kw"], p["sh"], p["sw"]
    h, w = p["h"] + p["pt"] + p["pb"], p["w"] + p["pl"] + p["pr"]
    wl = conv2d_fused(n, c, h, w, k, R, S, stride=(sh, sw), variant=cw.layout, name=name)
    oh, ow = (h - R) // sh + 1, (w - S) // sw + 1
    pad = ("pad", ((0, 0), (0, 0), (p["pt"], p["pb"]), (p["pl"], p["pr"])))
    cols = ("unroll", 3, (ow, S), (sw, 1), 0)           # (n, c, h, w) -> (n, c, h, ow, S)
    if cw.layout == "fused-rs":
        data = (pad, cols, ("permute", (0, 1, 3, 2, 4)), ("reshape", (n, c, ow, h * S)))
        weight = (("reshape", (k, c, R * S)),)
    else:
        rows = ("unroll", 2, (oh, R), (sh, 1), 0)       # -> (n, c, oh, R, ow, S)
        data = (pad, rows, ("unroll", 4, (ow, S), (sw, 1), 0), ("permute", (0, 2, 4, 1, 3, 5)),
                ("reshape", (n, oh, ow, c * R * S)))
        weight = (("reshape", (k, c * R * S)),)
    shapes = {"data": (n, c, p["h"], p["w"]), "weight": (k, c, R, S), "out": (n, k, oh, ow)}
    return wl, shapes, {"data": data, "weight": weight}, {}


def fused_variants(cw: CspWorkload, config) -> List[str]:
    """The fused-reduction variants (:data:`~tvm_csp_embed.workload.FUSED_CONV_VARIANTS`) offered
    for ``cw``'s conv2d: those whose fused reduction, padded to the GEMM's reduction block, is
    smaller than the stock mapping's (input channels padded to the block, times the filter); of
    two equal ones the first (``fused-rs`` copies less input)."""
    if cw.op != "conv2d":
        return []
    p = cw.p
    c, rs, blk = p["c"], p["kh"] * p["kw"], config.BLOCK_IN
    volume = {"fused-rs": c * -(-rs // blk) * blk, "fused-crs": -(-(c * rs) // blk) * blk}
    best = -(-c // blk) * blk * rs
    out = []
    for v in FUSED_CONV_VARIANTS:
        if volume[v] < best:
            out.append(v)
            best = volume[v]
    return out


def _group_steps(cw: CspWorkload) -> Dict[str, tuple]:
    """Source steps of a group conv2d: NCHW/OIHW channels split into (group, channel)."""
    p = cw.p
    n, g = p["n"], p["g"]
    cg, kg = p["c"] // g, p["k"] // g
    oh = (p["h"] + p["pt"] + p["pb"] - p["kh"]) // p["sh"] + 1
    ow = (p["w"] + p["pl"] + p["pr"] - p["kw"]) // p["sw"] + 1
    wsplit = ("reshape", (g, kg, cg, p["kh"], p["kw"]))
    if cw.layout == "NCHW":
        return {"data": (("reshape", (n, g, cg, p["h"], p["w"])),), "weight": (wsplit,),
                "out": (("reshape", (n, g, kg, oh, ow)),)}
    return {"data": (("permute", (0, 2, 3, 1)), ("reshape", (n, p["h"], p["w"], g, cg))),
            "weight": (wsplit, ("permute", (3, 4, 0, 2, 1))),
            "out": (("permute", (0, 2, 3, 1)), ("reshape", (n, oh, ow, g, kg)))}


@functools.lru_cache(maxsize=256)
def _packed(cw: CspWorkload, instr_sizes: Tuple[int, int, int]) -> PackedGemm:
    wl, shapes, perms, pads = operator_workload(cw)
    raw = RawSolution(cw.binding, cw.bit_dims, cw.bit_steps, cw.pad, 0, True, [], {})
    emb = decode(raw, wl, gemm(instr_sizes), cw.mode)
    return packed_gemm(emb, shapes, perms, pads)


def packed_of(cw: CspWorkload, config) -> PackedGemm:
    """The packed GEMM program of ``cw`` on ``config`` (cached)."""
    return _packed(cw, (config.BATCH, config.BLOCK_IN, config.BLOCK_OUT))


def _record(base: CspWorkload, layout: str, emb: Embedding) -> CspWorkload:
    r = emb.raw
    return dataclasses.replace(base, layout=layout, mode=emb.mode, binding=r.binding,
                               bit_dims=tuple(r.bit_dims), bit_steps=tuple(r.bit_steps), pad=tuple(r.pad))


# ------------------------------------------------------------------------------------ candidates
@dataclass
class Candidate:
    """One embedding considered for an operator, with its figures."""

    workload: CspWorkload
    embedding: Embedding
    packed: PackedGemm
    estimate: float = math.inf
    cycles: Optional[int] = None
    host_seconds: Optional[float] = None
    host_bytes: int = 0
    footprint: int = 0
    refused: str = ""

    @property
    def label(self) -> str:
        e = self.embedding
        return (f"{self.workload.layout} {e.mapping_str()} (A<-{e.binding['A']}"
                + (f", pad {' '.join(f'{d}+{v}' for d, v in e.padding.items())}" if e.padding else "")
                + ")")


def stock_mapping_cost(cw: CspWorkload, config) -> int:
    """The solver's cost of the stock mapping (x = batch, y = output channels, z = input channels,
    each padded to its block): the bound of the candidates, since the stock template is always
    there to fall back to."""
    if cw.op in OPERATOR_KINDS:
        return sum(padding_cost(x, -(-x // b) * b - x) for x, b in
                   zip(mapping_extents(cw), (config.BATCH, config.BLOCK_OUT, config.BLOCK_IN)))
    p = cw.p
    g = p.get("g", 1)
    dims = ((p["n"], config.BATCH), (p["k"] // g, config.BLOCK_OUT), (p["c"] // g, config.BLOCK_IN)) \
        if cw.op != "dense" else ((p["n"], config.BATCH), (p["m"], config.BLOCK_OUT),
                                  (p["k"], config.BLOCK_IN))
    return sum(padding_cost(x, -(-x // b) * b - x) for x, b in dims)


def _footprint(pg: PackedGemm) -> int:
    ops = pg.operands
    return sum(math.prod(ops[r].stored_shape) for r in "ABC")


def _estimate(config, pg: PackedGemm, point: KnobPoint) -> float:
    """Static cycles: GEMM micro-op cycles plus modelled DRAM bytes at the memory bandwidth."""
    return (pg.embedding.instruction_count * config.GEMM_CYCLES_PER_UOP
            + point.total_bytes / config.MEM_BYTES_PER_CYCLE)


def solve_request(config, cw: CspWorkload, solutions: Optional[int] = None,
                  timeout: Optional[float] = None) -> SolveRequest:
    """The solve behind ``cw``'s operator in ``cw``'s layout and constraint set: its workload, the
    configuration's GEMM, and the stock mapping's cost as the bound (``solutions`` and
    ``timeout`` default to :data:`DEFAULT_SOLUTIONS` and :data:`DEFAULT_TIMEOUT` as they are now)."""
    solutions = DEFAULT_SOLUTIONS if solutions is None else solutions
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    return SolveRequest(operator_workload(cw)[0], gemm((config.BATCH, config.BLOCK_IN, config.BLOCK_OUT)),
                        cw.mode, solutions, timeout, stock_mapping_cost(cw, config), config)


def candidates(config, base: CspWorkload, mode: str, layouts: Sequence[str], epilogue,
               solutions: int = DEFAULT_SOLUTIONS, timeout: float = DEFAULT_TIMEOUT,
               statuses: Optional[Dict[str, str]] = None) -> Tuple[List[Candidate], List[str]]:
    """The embeddings of ``base``'s operator in each layout, with their static figures.

    Returns the candidates (best first by the solver within a layout) and the solver messages of
    layouts without an embedding. ``statuses``, if given, receives the solver's status per layout
    (``"ok"``, ``"infeasible"`` or ``"timeout"``).
    """
    out, notes = [], []
    for layout in layouts:
        cw0 = dataclasses.replace(base, layout=layout, mode=mode)
        req = solve_request(config, cw0, solutions, timeout)
        res = cached_embeddings(req.wl, req.instr, mode, solutions=solutions, timeout=timeout,
                                cfg=config, max_cost=req.max_cost)
        if statuses is not None:
            statuses[layout] = res.status
        if res.status != "ok":
            notes.append(f"{layout}: {res.message}")
            continue
        for emb in res.embeddings:
            cw = _record(cw0, layout, emb)
            pg = packed_of(cw, config)
            cand = Candidate(cw, emb, pg, footprint=_footprint(pg))
            point = tps_point(config, pg, epilogue)
            if point is None:
                fb = fallback_point(config, pg, epilogue)
                cand.refused = f"no tiling fits: {fb.reason if isinstance(fb, Pruned) else fb}"
            else:
                cand.estimate = _estimate(config, pg, point)
            out.append(cand)
    return out, notes


def host_relayout_seconds(pg: PackedGemm, repeats: int = 5) -> float:
    """Median wall time of the host relayout that runs per inference: packing the activation and
    unpacking the output (constant weights are relayouted at build time)."""
    from .hosttime import relayout_seconds

    data = pg.embedding.workload.inputs[0].name
    act = next(pg.operands[r] for r in "AB" if pg.operands[r].tensor == data)
    return relayout_seconds(act.host, act.host.src_shape, pg.operands["C"].host, repeats)[1]


def _layout_key(layout) -> Any:
    """A JSON-able description of a packed layout (its class and fields), or None."""
    if layout is None:
        return None
    fields = dataclasses.asdict(layout) if dataclasses.is_dataclass(layout) else repr(layout)
    return [type(layout).__name__, fields]


def _choice_key(config, base: CspWorkload, mode: str, layouts, objective: str, epilogue, knobs,
                stock=None, producer=None) -> str:
    """The choice cache's key: the operator, the constraint set, the layouts, the objective, the
    epilogue, the knobs of every candidate, the ranking parameters, the configuration's value,
    the stock contender (its workload and knobs, or None when it is not compared) and the packed
    layout the input comes in from a previous VTA operator (layout agreement)."""
    from vta_ext.executor import config_digest

    text = json.dumps({"v": 5, "ranked": [CYCLE_RANKED, RANK_FACTOR, DEFAULT_SOLUTIONS],
                       "agree": [AGREEMENT_SLACK, _layout_key(producer)],
                       "base": dataclasses.asdict(base), "mode": mode, "layouts": list(layouts),
                       "objective": objective, "epilogue": [list(s) for s in epilogue],
                       "knobs": knobs, "stock": stock, "config": config_digest(config)},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _contender_key(contender) -> Any:
    """The stock contender as the caches key it: its workload and knobs (None: no contender)."""
    return None if contender is None else [dataclasses.asdict(contender[1]), contender[2]]


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


def plan_host_bytes(op: MatchedOp, in_layout, out_layout, stock_out) -> int:
    """Host layout bytes per inference that a plan adds around ``op``
    (:func:`vta_ext.host.layout_traffic`):

    * input: nothing if the producing VTA operator hands its output over in ``in_layout``'s
      arrangement; else packing into ``in_layout``, after unpacking the producer's packed output
      if there is one;
    * output: nothing if ``out_layout`` is the stock blocked arrangement (``stock_out``) that the
      neighbouring VTA operators take over; else unpacking it, and packing into the stock
      arrangement again for the next operator.
    """
    from vta_ext.host import layout_traffic
    from vta_ext.packing import same_arrangement

    taken = (op.input_layout is not None and in_layout is not None
             and same_arrangement(op.input_layout, in_layout))
    kept = stock_out is not None and out_layout is not None and same_arrangement(out_layout, stock_out)
    cost = 0
    if not taken:
        cost += layout_traffic(op.input_layout) + layout_traffic(in_layout)
    if not kept:
        cost += layout_traffic(out_layout) + layout_traffic(stock_out)
    return cost


def blocked_output(op: MatchedOp, config):
    """The stock blocked arrangement of ``op``'s output (what the neighbouring VTA operators
    take over), or None for an output that is not 2-D or 4-D."""
    from vta_ext.packing import BlockedActivation, BlockedMatrix

    shape = _shape(op.core)
    if len(shape) == 4:
        return BlockedActivation(*shape, config.BATCH, config.BLOCK_OUT)
    if len(shape) == 2:
        return BlockedMatrix(shape[0], shape[1], config.BATCH, config.BLOCK_OUT)
    return None


def cpu_host_bytes(op: MatchedOp, out_layout) -> int:
    """Host layout bytes per inference when ``op`` stays on the CPU between VTA operators:
    unpacking its input from the producing VTA operator, if any, and packing its output into
    ``out_layout`` (the stock blocked arrangement) for the next one."""
    from vta_ext.host import layout_traffic

    return layout_traffic(op.input_layout) + layout_traffic(out_layout)


#: what :meth:`CspGemmTemplate._choose` returns when running the operator on the CPU is cheaper
#: end to end than every plan for VTA (only where the stock template refuses the operator)
CPU = "cpu"


# ------------------------------------------------------------------------------------ plan cache
#: the plan cache's format: bump it when the choice rule changes what a key means
PLAN_VERSION = 3

#: the knob search behind each searching knob policy (the point a plan cache entry keeps)
_SEARCHES = {"tps": tps_point, "cycles": cycle_point}


class PlanCache:
    """One entry of the persistent plan cache: the plan chosen for an operator instance.

    The key is the choice cache's (:func:`_choice_key`: configuration value, operator, constraint
    set, layouts, objective, epilogue, knobs option, the stock contender, the producer's layout) with
    :data:`PLAN_VERSION`. An entry records the chosen embedding's workload (from which the packed
    program is rebuilt without the solver) and its TPS knob point (under the ``tps`` knobs option),
    or that the stock template was chosen or fallen back to, with the sentence saying why. A warm build reads it instead of solving, building the candidates
    and timing them; only the chosen plan's code is generated.

    Files live in ``<cache_dir>/plans/<key>.json`` and are written atomically (a temporary file,
    then a rename), so a concurrent build reads a whole entry or none. An entry that cannot be read,
    is not JSON, or holds another key or format is ignored with a warning and rewritten.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self.path = cache_dir() / "plans" / f"{key}.json"

    def __repr__(self) -> str:
        return f"PlanCache({self.key}, {'present' if self.path.exists() else 'absent'})"

    def load(self) -> Optional[Dict[str, Any]]:
        """The entry, or None when there is none or it is unusable (warned)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as err:
            logger.warning("plan cache: cannot read %s (%s); planning again", self.path, err)
            return None
        try:
            data = json.loads(text)
            ok = (isinstance(data, dict) and data.get("key") == self.key
                  and data.get("version") == PLAN_VERSION
                  and data.get("plan") in ("embedding", "stock", "fallback", "cpu") and "why" in data
                  and (data["plan"] != "embedding"
                       or {"workload", "usable", "notes"} <= set(data)))
        except ValueError:
            ok = False
        if not ok:
            logger.warning("plan cache: ignoring the corrupt or foreign entry %s; planning again "
                           "and rewriting it", self.path)
            return None
        return data

    def store(self, entry: Dict[str, Any]) -> None:
        """Write ``entry`` (atomically)."""
        _write(self.path, {"key": self.key, "version": PLAN_VERSION, **entry})


# ------------------------------------------------------------------------------------ template
class CspGemmTemplate(OpTemplate):
    """The CSP template of a GEMM operator kind (conv2d, dense) under one CSP strategy."""

    workload_type = CspWorkload

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
        at least as good as every embedding by the objective."""
        try:
            plan = get_template(self.kind, "stock").plan(op, config)
        except TemplateRefusal as err:  # a kind without a stock template (tvm_csp_embed.operators)
            raise TemplateRefusal(f"{self.strategy}: {reason}; no stock template to fall back "
                                  f"to for {self.kind}") from err
        text = (f"stock template chosen by {self.strategy}: {reason}" if chosen else
                f"STOCK FALLBACK ({self.strategy}: {reason})")
        return OpPlan(self._stock_workload(plan), plan.inputs, plan.out_layout,
                      f"{plan.description}; {text}", plan.padding)

    def plan(self, op: MatchedOp, config) -> OpPlan:
        from vta_ext.options import current_options

        options = current_options()
        base = self._base(op)
        layouts = self._layouts(options.layout, base, config)
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
        usable = [c for c in cands if not c.refused]
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
            point = (_SEARCHES[policy](config, best.packed, op.epilogue)
                     if isinstance(policy, str) and policy in _SEARCHES else None)
            cache.store({"plan": "embedding", "why": why, "workload": dataclasses.asdict(best.workload),
                         "usable": len(usable), "notes": notes, "policy": policy if point else None,
                         "knobs": None if point is None else point.knobs})
        return self._plan_of(op, config, best, why, len(usable), notes)

    def prefetch(self, ops: Sequence[MatchedOp], config) -> None:
        """Start solving the distinct workloads of ``ops`` (every candidate layout) concurrently,
        in the order of ``ops``, as a bounded pool of MiniZinc processes in the background
        (:func:`~tvm_csp_embed.cache.solve_concurrently`): :meth:`plan` waits only for its own
        operator's solves, so planning the first operators overlaps solving the later ones."""
        from vta_ext.options import current_options

        options = current_options()
        requests = []
        for op in ops:
            try:
                base = self._base(op)
                for layout in self._layouts(options.layout, base, config):
                    cw = dataclasses.replace(base, layout=layout, mode=self.mode)
                    requests.append(solve_request(config, cw))
            except Exception:  # noqa: BLE001 -- plan() meets the same error and reports it
                continue
        solve_concurrently(requests, wait=False)

    def _plan_cache(self, config, base: CspWorkload, layouts, op: MatchedOp, options, contender
                    ) -> Optional[PlanCache]:
        """The persistent plan cache entry of this operator (None with tuned records: a record
        is looked up per candidate, after the candidates are known)."""
        if options.records is not None:
            return None
        knobs = options.knobs_for(self.kind, self.strategy, base, config)[0]
        key = _choice_key(config, base, self.mode, layouts, objective_key(options), op.epilogue,
                          ["plan", PLAN_VERSION, knobs], _contender_key(contender), op.input_layout)
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
        if entry.get("knobs"):     # the knob point found when the plan was made: no search again
            seed_tps_point(config, pg, op.epilogue, entry["knobs"],
                           "cycles" if entry.get("policy") == "cycles" else "bytes")
        cand = Candidate(cw, pg.embedding, pg)
        return self._plan_of(op, config, cand, entry["why"], int(entry["usable"]), list(entry["notes"]))

    def _stock_refuses(self, op: MatchedOp, config) -> bool:
        """Whether the stock template refuses ``op`` (or there is none for its kind): then the
        end-to-end objective weighs leaving the operator on the CPU against running it on VTA."""
        try:
            get_template(self.kind, "stock").plan(op, config)
        except TemplateRefusal:
            return True
        return False

    def _stock_contender(self, op: MatchedOp, config, options):
        """``(plan, workload, knobs)`` of the stock template for ``op`` when the objective compares
        it (cycles or combined, under a constraint set of :data:`STOCK_COMPARED`), else None (also
        when the stock template refuses the operator)."""
        if options.objective == "footprint" or self.mode not in STOCK_COMPARED:
            return None
        try:
            plan = get_template(self.kind, "stock").plan(op, config)
        except TemplateRefusal:
            return None
        scw = self._stock_workload(plan)
        return plan, scw, options.knobs_for(self.kind, self.strategy, scw, config)[0]

    def _choose(self, config, base, layouts, usable: List[Candidate], op: MatchedOp, options,
                contender) -> Tuple[Any, str]:
        """The candidate the objective prefers (or :data:`STOCK`), and the sentence saying why
        (cached on disk).

        A candidate whose build is refused (no tiling fits) or rejects explicit knobs is dropped.
        If none is left: None and the reasons when every one was refused; explicit knobs that no
        candidate accepts raise the first candidate's :class:`KnobError`. Under ``csp-relaxed``
        (objective cycles or combined) the stock template's plan is timed with the same knobs
        option and returned as :data:`STOCK` when it is at least as good as the best candidate.
        ``contender`` is :meth:`_stock_contender`'s answer for ``op``.
        """
        from vta_ext.templates.errors import KnobError

        objective = options.objective
        knobs = {c.workload: options.knobs_for(self.kind, self.strategy, c.workload, config)[0]
                 for c in usable}
        key = _choice_key(config, base, self.mode, layouts, objective_key(options), op.epilogue,
                          [knobs[c.workload] for c in usable], _contender_key(contender),
                          op.input_layout)
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
                    if c.workload == chosen:
                        return c, data["why"]
            except (OSError, ValueError, KeyError):
                pass
        if objective == "footprint":
            ranked = sorted(usable, key=lambda c: (c.footprint, c.estimate))
            best = ranked[0]
            why = (f"smallest packed footprint {best.footprint:,} B of {len(usable)} embedding(s)"
                   + (f" (next {ranked[1].footprint:,} B, {ranked[1].label})" if len(ranked) > 1 else ""))
        else:
            from vta_ext.executor import compiled_op, cycle_report, op_key

            timed, dropped, knob_errors = [], [], []
            stock_out = contender[0].out_layout if contender is not None else blocked_output(op, config)
            first = min(c.estimate for c in usable)
            for c in sorted(usable, key=lambda c: c.estimate):
                if len(timed) == CYCLE_RANKED or (timed and c.estimate > RANK_FACTOR * first):
                    break
                k = op_key(self.kind, self.strategy, config, c.workload, op.epilogue, knobs[c.workload])
                try:
                    compiled_op(k, config=config)
                except KnobError as err:
                    knob_errors.append(err)
                    dropped.append(f"{c.label}: {err}")
                    continue
                except TemplateRefusal as err:
                    dropped.append(f"{c.label}: {err}")
                    continue
                c.cycles = cycle_report(k).total_cycles
                if objective == "combined":
                    c.host_seconds = host_relayout_seconds(c.packed)
                data = c.embedding.workload.inputs[0].name
                act = next(o.host for o in (c.packed.operands["A"], c.packed.operands["B"])
                           if o.tensor == data)
                c.host_bytes = plan_host_bytes(op, act, c.packed.operands["C"].host, stock_out)
                timed.append(c)
            if not timed:
                if knob_errors:
                    raise knob_errors[0]
                return None, "; ".join(dropped)
            clock = config.CLOCK_MHZ * 1e6

            host = options.host

            def score(c):
                if objective == "combined":
                    return c.cycles / clock + (c.host_seconds or 0.0)
                if objective == "end-to-end":
                    return c.cycles + host.layout_cycles(c.host_bytes)
                return c.cycles
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
            timed_text = (f"{len(timed)} of {len(usable)} embedding(s) timed by the cycle model "
                          f"(the best by the static estimate, within x{RANK_FACTOR:g} of it)")
            stock = self._time_stock(config, op, contender, objective, dropped)
            if objective == "end-to-end" and contender is None and self._stock_refuses(op, config):
                from vta_ext.quantize import call_macs

                macs = call_macs(op.core)
                layout = cpu_host_bytes(op, stock_out)
                on_cpu = host.cpu_cycles(macs) + host.layout_cycles(layout)
                if macs and on_cpu < score(best):
                    why = (f"end to end cheaper on the CPU: {on_cpu:,.0f} cycles ({macs:,} MACs and "
                           f"{layout:,} B host layout, host model {host.name}) against "
                           f"{unit(best)} for the best embedding {best.label} on VTA; the stock "
                           f"template refuses it too")
                    _write(path, {"cpu": True, "why": why})
                    return CPU, why
            agreed, agree_text = self._agree(op, ranked, stock, contender, score, unit)
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
        return best, why

    @staticmethod
    def _agree(op: MatchedOp, ranked: List[Candidate], stock, contender, score, unit):
        """Layout agreement (:data:`AGREEMENT_SLACK`) for an operator fed by a VTA operator.

        Each plan scores one point for taking the producer's packed output over (its data layout
        has the same arrangement, :func:`vta_ext.packing.same_arrangement`) and one for leaving its
        output in the stock blocked arrangement the neighbouring VTA operators use. Returns the
        plan to take instead of the fastest (a candidate or :data:`STOCK`) and the sentence saying
        why, or ``(None, "")`` when the fastest plan agrees at least as well or no plan within the
        slack agrees better (and always when the input comes from the host).
        """
        from vta_ext.packing import same_arrangement

        if op.input_layout is None or not ranked:
            return None, ""
        stock_out = contender[0].out_layout if contender is not None else None

        def points(in_layout, out_layout) -> int:
            taken = in_layout is not None and same_arrangement(op.input_layout, in_layout)
            kept = (stock_out is not None and out_layout is not None
                    and same_arrangement(out_layout, stock_out))
            return int(taken) + int(kept)

        entries = []  # (score, order, plan, label, points); the stock plan first on a tie
        if stock is not None:
            entries.append((score(stock), 0, STOCK, "the stock template's own plan",
                            points(contender[0].in_layout, contender[0].out_layout), stock))
        for i, c in enumerate(ranked):
            pg = c.packed
            data = c.embedding.workload.inputs[0].name
            host = next(o.host for o in (pg.operands["A"], pg.operands["B"]) if o.tensor == data)
            entries.append((score(c), i + 1, c, c.label, points(host, pg.operands["C"].host), c))
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

    def _time_stock(self, config, op: MatchedOp, contender, objective: str, dropped: List[str]):
        """The stock contender timed like a candidate (an object with ``cycles`` and
        ``host_seconds``), or None when there is none or it does not build with the knobs option
        (then the reason joins ``dropped``)."""
        from vta_ext.executor import compiled_op, cycle_report, op_key
        from vta_ext.templates.errors import KnobError

        if contender is None:
            return None
        plan, scw, knobs = contender
        k = op_key(self.kind, self.strategy, config, scw, op.epilogue, knobs)
        try:
            compiled_op(k, config=config)
        except (KnobError, TemplateRefusal) as err:
            dropped.append(f"stock template: {err}")
            return None
        host = (stock_host_relayout_seconds(self.kind, op, config, plan)
                if objective == "combined" else None)
        return _StockTiming(cycle_report(k).total_cycles, host,
                            plan_host_bytes(op, plan.in_layout, plan.out_layout, plan.out_layout))

    def _plan_of(self, op: MatchedOp, config, cand: Candidate, why: str, n_usable: int,
                 notes: List[str]) -> OpPlan:
        pg = cand.packed
        emb = cand.embedding
        A, B = pg.operands["A"], pg.operands["B"]
        by_tensor = {A.tensor: A, B.tensor: B}
        data_name, weight_name = (t.name for t in emb.workload.inputs)

        def inputs(packer):
            args = {}
            for name, expr in ((data_name, op.operands[0]), (weight_name, op.operands[1])):
                operand = by_tensor[name]
                kept = packer.handover(expr, operand.host)
                args[name] = kept if kept is not None else operand.host.pack(packer, expr)
                if name == data_name:
                    packer.note_kept(kept is not None)
            out = [args[A.tensor], args[B.tensor]]
            if op.bias is not None:
                out.append(pg.bias_layout(_shape(op.bias)).pack(packer, op.bias))
            return out

        e = emb
        unrolled = ", ".join(f"{t} stencil-unrolled over {'/'.join(d)}" for t, d in e.unrolled.items())
        desc = (f"{_op_text(cand.workload)}; embedding {e.mapping_str()} in layout "
                f"{cand.workload.layout} (A<-{e.binding['A']}, B<-{e.binding['B']}"
                + (f"; {unrolled}" if unrolled else "") + f"); chosen for {why}")
        if notes:
            desc += "; " + "; ".join(notes)
        pads = ", ".join(f"{DIM_WORDS.get(d, d)} {e.workload.extents[e.workload.dims.index(d)]}->"
                         f"{e.padded_extents[d]}" for d in e.padding)
        return OpPlan(cand.workload, inputs, pg.operands["C"].host, desc, pads)

    # ---------------------------------------------------------------- build
    def build(self, config, workload: CspWorkload, epilogue: Sequence[tuple], knobs) -> Any:
        if workload.stock:
            stock = get_template(self.kind, "stock")
            return stock.build(config, stock.workload_from_dict(dict(workload.stock)), epilogue, knobs)
        return build_gemm(config, packed_of(workload, config), epilogue, knobs)

    def knob_space(self, config, workload: CspWorkload, epilogue: Sequence[tuple]) -> KnobSpace:
        if workload.stock:
            stock = get_template(self.kind, "stock")
            return stock.knob_space(config, stock.workload_from_dict(dict(workload.stock)), epilogue)
        pg = packed_of(workload, config)
        grid = knob_grid(config, pg, epilogue)
        points = grid.points(np.flatnonzero(grid.valid))
        bad = np.flatnonzero(~grid.valid)
        pruned = [(p, grid.why(i)) for p, i in zip(grid.points(bad), bad)]
        tps = tps_point(config, pg, epilogue)
        fb = fallback_point(config, pg, epilogue)
        fast = cycle_point(config, pg, epilogue)
        return KnobSpace(knob_names(pg), tuple(points), tuple(pruned),
                         dict(tps.knobs) if tps else None,
                         dict(fb.knobs) if isinstance(fb, KnobPoint) else None,
                         dict(fast.knobs) if fast else None)


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
