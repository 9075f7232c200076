"""The candidates of an operator under a CSP strategy: the operator as a :class:`CspWorkload` in
each candidate layout of its free dims (and, under ``csp-relaxed``, the fused conv2d variants), the
solver's embeddings of the GEMM into each (:func:`candidates`, through the disk cache), each as a
packed GEMM program (:func:`packed_of`) with its static figures (:class:`Candidate`).

Choosing among them is :mod:`.choice`; the template that plans and builds an operator is
:mod:`.strategy`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from vta_ext.errors import TemplateRefusal
from vta_ext.strategy import MatchedOp

from .cache import CachedSolve, SolveRequest, cached_embeddings, permuted_embeddings
from .codegen.knobs import KnobPoint, Pruned, fallback_point, tps_point
from .codegen.plan import PackedGemm, packed_gemm
from .embedding import Embedding, decode
from .instructions import gemm
from .operators import OPERATOR_KINDS, mapping_extents
from .operators import operator_workload as _new_operator_workload
from .solve import CONSTRAINT_SETS, PERMUTABLE, RawSolution, padding_cost
from .workload import FUSED_CONV_VARIANTS, conv2d, conv2d_fused, dense, group_conv2d

__all__ = ["MODES", "STRATEGY_NAMES", "DEFAULT_SOLUTIONS", "DEFAULT_TIMEOUT", "CONV_LAYOUTS",
           "CspWorkload", "Candidate", "operator_workload", "fused_variants", "packed_of",
           "stock_mapping_cost", "solve_request", "layout_solves", "candidates", "bias_signature", "fold_candidate",
           "settle",
           "kept_twin", "gemm_twin", "is_stock_mapping", "with_stock_mapping", "thread_padded_twins", "unfolded", "program_epilogue", "operand_layouts", "packed_inputs"]

#: strategy name -> constraint set of the solver
MODES = {"csp-strict": "strict", "csp-relaxed": "relaxed"}
STRATEGY_NAMES = tuple(MODES)
#: embeddings the solver returns per layer and layout
DEFAULT_SOLUTIONS = 4
#: structures the solve of a layer and layout keeps (:func:`layout_solves`; an enumeration visits
#: every structure within the cost bound whatever it keeps, so keeping more costs no solve time):
#: the candidates are the ``DEFAULT_SOLUTIONS`` cheapest, plus the stock mapping's embedding where
#: it is among these and not among those (:func:`with_stock_mapping`)
ENUMERATED_SOLUTIONS = 16
#: seconds the solver may take per layer and layout
DEFAULT_TIMEOUT = 30.0
#: the layouts of a conv2d's free dims, with the permutations from NCHW/OIHW (``permute_dims`` axes)
CONV_LAYOUTS = {"NCHW": {"data": (0, 1, 2, 3), "weight": (0, 1, 2, 3), "out": (0, 1, 2, 3)},
                "NHWC": {"data": (0, 2, 3, 1), "weight": (2, 3, 1, 0), "out": (0, 2, 3, 1)}}




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
    bias_lanes : int
        Spare reduction lanes the operator's constant bias is folded into
        (:mod:`~tvm_csp_embed.codegen.biasfold`): the program runs the epilogue without its bias
        stage and the host layouts write the lane constants and digits; 0: the bias (if any)
        stays on the ALU.
    stock_knobs : tuple of (str, Any)
        With ``stock``: the knob point ``csp-relaxed`` searched for the stock template's program
        (:mod:`~tvm_csp_embed.stock_knobs`), built under the knobs option ``cycles``; empty: the
        template's own point (TPS).
    bias_gemm : bool
        The program adds the operator's constant bias by one GEMM of a constant block per output
        tile instead of the vector ALU ADD (:func:`~tvm_csp_embed.codegen.biasfold.gemm_bias_epilogue`).
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
    bias_lanes: int = 0
    stock_knobs: Tuple[Tuple[str, Any], ...] = ()
    bias_gemm: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _tuples(getattr(self, f.name)))

    def with_bias_lanes(self, lanes: int, gemm: bool = False) -> "CspWorkload":
        """This workload with ``bias_lanes`` and ``bias_gemm`` set (``dataclasses.replace``
        without normalising the other fields again: they already are)."""
        if lanes == self.bias_lanes and gemm == self.bias_gemm:
            return self
        new = object.__new__(CspWorkload)
        new.__dict__.update({name: self.__dict__[name] for name in _FIELDS}, bias_lanes=int(lanes),
                            bias_gemm=bool(gemm))
        return new

    @property
    def p(self) -> Dict[str, int]:
        """The operator parameters as a dict."""
        return dict(self.params)


_FIELDS = tuple(f.name for f in dataclasses.fields(CspWorkload))


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
    #: the bias fold's sentence for the build report (:func:`fold_candidate`), "" without a bias
    bias_note: str = ""
    #: the workload whose place among the timed candidates this one shares (a
    #: :func:`thread_padded_twins`' embedding), None: its own (:func:`unfolded` of its workload)
    place: Optional[CspWorkload] = None
    #: what the bias fold still has to decide (:func:`fold_candidate`): steps that set the form's
    #: ``bias_lanes`` and the ``bias_note``s, run in order by :func:`settle`; empty: decided
    pending: List[Callable[["Candidate"], None]] = dataclasses.field(default_factory=list,
                                                                     repr=False)
    #: the other lanes' constant of a bias folded into lane constants the producer wrote into
    #: its padded channels (:func:`~.lanes.handed_constant`): the data is taken over as it is
    lane_constant: Optional[int] = None

    @property
    def label(self) -> str:
        e = self.embedding
        return (f"{self.workload.layout} {e.mapping_str()} (A<-{e.binding['A']}"
                + (f", pad {' '.join(f'{d}+{v}' for d, v in e.padding.items())}" if e.padding else "")
                + (f", bias in {self.workload.bias_lanes} lanes" if self.workload.bias_lanes else "")
                + (", bias by GEMM" if self.workload.bias_gemm else "")
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


def layout_solves(config, base: CspWorkload, mode: str, layouts: Sequence[str],
                  solutions: Optional[int] = None, timeout: Optional[float] = None
                  ) -> List[Tuple[str, SolveRequest, Optional[Tuple[str, Tuple[int, ...]]]]]:
    """Per layout of ``base``'s operator (in order): the layout, its :func:`solve_request`, and
    ``(source layout, order)`` when its workload is a dim permutation of an earlier layout's
    (:meth:`~tvm_csp_embed.workload.Workload.permutation_of`; NHWC of NCHW) under a constraint
    set with :data:`~tvm_csp_embed.solve.PERMUTABLE`, else None. A layout with a source is not
    solved: its embeddings are the source's, permuted (:func:`~.cache.permuted_embeddings`).
    An enumeration's request keeps at least :data:`ENUMERATED_SOLUTIONS` structures
    (:func:`candidates` takes ``solutions`` of them and the stock mapping's,
    :func:`with_stock_mapping`)."""
    permutable = all(c in CONSTRAINT_SETS.get(mode, ()) for c in PERMUTABLE)
    out = []
    for layout in layouts:
        req = solve_request(config, dataclasses.replace(base, layout=layout, mode=mode),
                            _enumerated(solutions), timeout)
        source = None
        for prev, preq, psrc in out if permutable else ():
            order = req.wl.permutation_of(preq.wl) if psrc is None else None
            if order is not None and (preq.solutions, preq.max_cost) == (req.solutions, req.max_cost):
                source = (prev, order)
                break
        out.append((layout, req, source))
    return out


def _enumerated(solutions: Optional[int]) -> int:
    """The structures a solve asked for ``solutions`` keeps: at least
    :data:`ENUMERATED_SOLUTIONS` for an enumeration (more than one), ``solutions`` for a branch
    and bound (one)."""
    n = DEFAULT_SOLUTIONS if solutions is None else solutions
    return n if n <= 1 else max(n, ENUMERATED_SOLUTIONS)


def is_stock_mapping(emb, wl) -> bool:
    """Whether embedding ``emb`` of the conv2d ``wl`` is the stock template's mapping: the data on
    operand ``A``, ``y`` walking the output channels alone, ``z`` the input channels alone (``x``
    the batch, if anything): the mapping whose output is the stock blocked layout, which a next
    VTA operator takes without host layout work."""
    if not ({"k", "c"} <= set(wl.dims) and wl.inputs):
        return False
    return (emb.binding.get("A") == wl.inputs[0].name and emb.dims_of("y") == ("k",)
            and emb.dims_of("z") == ("c",) and set(emb.dims_of("x")) <= {"n"})


def with_stock_mapping(embeddings: Sequence, solutions: int, wl) -> List:
    """The ``solutions`` first of ``embeddings`` (best first), and after them the first stock
    mapping among the rest (:func:`is_stock_mapping`) when none of those is one: the solver ranks
    structures by padding, so a layer that pads less with the pixels on the lanes (a 1x1 conv of
    72 output channels at 112x112) would otherwise lose the one embedding whose layout its
    neighbours hand over for free."""
    first = list(embeddings[:solutions])
    if any(is_stock_mapping(e, wl) for e in first):
        return first
    return first + [e for e in embeddings[solutions:] if is_stock_mapping(e, wl)][:1]


def candidates(config, base: CspWorkload, mode: str, layouts: Sequence[str], epilogue,
               solutions: int = DEFAULT_SOLUTIONS, timeout: float = DEFAULT_TIMEOUT,
               statuses: Optional[Dict[str, str]] = None) -> Tuple[List[Candidate], List[str]]:
    """The embeddings of ``base``'s operator in each layout, with their static figures.

    Returns the candidates (best first by the solver within a layout) and the solver messages of
    layouts without an embedding. ``statuses``, if given, receives the solver's status per layout
    (``"ok"``, ``"infeasible"`` or ``"timeout"``).
    """
    out, notes = [], []
    solved: Dict[str, CachedSolve] = {}
    for layout, req, source in layout_solves(config, base, mode, layouts, solutions, timeout):
        cw0 = dataclasses.replace(base, layout=layout, mode=mode)
        if source is not None and solved[source[0]].status in ("ok", "infeasible"):
            res = permuted_embeddings(solved[source[0]], source[1], req.wl, req.instr, mode, config)
        else:       # its own solve (also when the source's timed out)
            res = cached_embeddings(req.wl, req.instr, mode, solutions=req.solutions,
                                    timeout=timeout, cfg=config, max_cost=req.max_cost)
        solved[layout] = res
        if statuses is not None:
            statuses[layout] = res.status
        if res.status != "ok":
            notes.append(f"{layout}: {res.message}")
            continue
        for emb in with_stock_mapping(res.embeddings, solutions, req.wl):
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
            if mode != "strict":
                out.extend(thread_padded_twins(config, cand, epilogue))
    return out, notes


def thread_padded_twins(config, cand: Candidate, epilogue) -> List[Candidate]:
    """The twins of ``cand`` whose odd output-channel loop is padded by zero weights so that it can
    carry two virtual threads: one tile more, and where that is not a multiple of four the tiles
    that make one (:func:`~.codegen.loops.thread_paddings`). A twin is offered when the knob
    model's cycle estimate of its fastest point (:func:`~.codegen.knobs.cycle_point`) is below the
    embedding's own; empty when none is, or the loop needs no padding. Both paddings are offered
    where both beat the embedding, because their estimates can tie within the estimate's error
    while their programs differ by a few per cent (RegNetX-1.6GF's 912 channels: 928 and 960). The
    twins share the embedding's place among the candidates the choice times (``place``); it times
    them all."""
    from .codegen.knobs import cycle_point
    from .codegen.loops import thread_paddings

    if cand.refused:
        return []
    own = cycle_point(config, cand.packed, epilogue)
    if own is None:
        return []
    cw, twins = cand.workload, []
    for dim, elements in thread_paddings(cand.packed):
        pad = list(cw.pad)
        pad[cand.embedding.workload.dims.index(dim)] += elements
        twin_cw = dataclasses.replace(cw, pad=tuple(pad))
        pg = packed_of(twin_cw, config)
        padded = cycle_point(config, pg, epilogue)
        if padded is None or padded.cycles >= own.cycles:
            continue
        point = tps_point(config, pg, epilogue)
        twins.append(Candidate(twin_cw, pg.embedding, pg,
                               estimate=_estimate(config, pg, point or padded),
                               footprint=_footprint(pg), place=cw))
    return twins


def bias_signature(op) -> Any:
    """What the bias fold decision of ``op`` depends on besides its packed program, as the
    caches key it: None without a bias stage, ``"runtime"`` for a bias that is not a constant,
    else the bias's range and whether the weights are constants."""
    import tvm

    from vta_ext.templates.epilogue import has_bias, normalize_epilogue

    if not has_bias(normalize_epilogue(op.epilogue)) or op.bias is None:
        return None
    if not isinstance(op.bias, tvm.ir.expr.Constant):
        return "runtime"
    b = op.bias.value.numpy()
    return ["const", int(b.min()), int(b.max()), isinstance(op.operands[1], tvm.ir.expr.Constant)]


def fold_candidate(op, cand: Candidate, kind: str) -> Candidate:
    """``cand`` with the bias fold decided for ``op`` (:func:`~.codegen.biasfold.fold_decision`):
    its workload's ``bias_lanes`` and its ``bias_note`` set (``csp-strict`` never folds).

    Whether the bias folds is decided now (:func:`~.codegen.biasfold.fold_fits`); which form it
    takes (every spare lane, or the subset a stencil gather writes, whose check follows every
    lane position) is left to :func:`settle`, which the choice runs only on the candidates whose
    exact host bytes it needs (:mod:`.choice`). Until then ``bias_lanes`` is the number of every
    spare lane: nonzero exactly when the bias folds, which is all the epilogue and the cycle
    bound need (:func:`program_epilogue`)."""
    import tvm

    from .codegen.biasfold import fold_decision, fold_fits
    from .lanes import bias_with_lanes, handed_constant

    # with the biases of the padded output channels that write lane constants there, if asked
    bias = bias_with_lanes(op)
    args = (cand.packed, kind, op.epilogue, bias, isinstance(op.operands[1], tvm.ir.expr.Constant))
    strict = cand.workload.mode == "strict"
    handed, unused = (None, "") if strict else handed_constant(op, cand.packed)
    lanes, note = fold_fits(*args, strict=strict, handed=handed)
    cand.workload = cand.workload.with_bias_lanes(lanes)
    cand.bias_note = note
    cand.lane_constant = handed if lanes else None
    if lanes and handed is not None:
        cand.bias_note = fold_decision(*args, strict=strict, handed=handed)[1]
    elif lanes:
        def decide(c: Candidate) -> None:
            lanes, c.bias_note = fold_decision(*args, strict=strict)
            c.workload = c.workload.with_bias_lanes(lanes)
            if unused:
                c.bias_note += f"; the input's lane constants not used: {unused}"

        cand.pending.append(decide)
    elif unused and note:
        cand.bias_note += f"; the input's lane constants not used: {unused}"
    return cand


def settle(cand: Candidate) -> Candidate:
    """``cand`` with what its bias fold left pending (:func:`fold_candidate`, and the notes of its
    twins, :func:`kept_twin`, :func:`gemm_twin`) decided: its form's ``bias_lanes`` and its
    ``bias_note``. Idempotent."""
    while cand.pending:
        cand.pending.pop(0)(cand)
    return cand


def _when_settled(cand: Candidate, step: Callable[[Candidate], None]) -> None:
    """Run ``step(cand)`` now if ``cand`` has nothing pending, else after what is (:func:`settle`)."""
    if cand.pending:
        cand.pending.append(step)
    else:
        step(cand)


def kept_twin(cand: Candidate) -> Candidate:
    """The embedding of a folded candidate with its bias kept on the ALU: offered next to it when
    the objective prices host work, since writing the fold's lane constants may cost host layout
    work (:func:`~.codegen.biasfold.fold_data_layout`: a ``concat`` onto a gather's source, or a
    ``set`` pass over the packed input) that outweighs the ALU pass it saves."""
    twin = Candidate(cand.workload.with_bias_lanes(0), cand.embedding, cand.packed,
                     estimate=cand.estimate, footprint=cand.footprint, place=cand.place)
    if cand.pending:                 # its note names the fold's form: decided with cand's
        twin.pending.append(lambda t: _kept_note(t, settle(cand)))
    else:
        _kept_note(twin, cand)
    return twin


def _kept_note(twin: Candidate, cand: Candidate) -> None:
    """Set the ``bias_note`` of :func:`kept_twin` ``twin`` of the folded ``cand``."""
    from vta_ext.host import layout_traffic

    from .codegen.biasfold import fold_form_note

    extra = layout_traffic(data_layout(cand)) - layout_traffic(data_layout(cand, folded=False))
    note = ("its lane constants written by the producer" if cand.lane_constant is not None
            else fold_form_note(cand.packed, cand.workload.bias_lanes))
    twin.bias_note = (f"{_KEPT_BY_OBJECTIVE} the fold into {cand.workload.bias_lanes} "
                      f"lanes (its lane constants add {extra:,} bytes of host layout "
                      f"traffic{'; ' + note if note else ''})")


#: how :func:`kept_twin`'s report sentence starts (its GEMM twin, :func:`gemm_twin`, repeats
#: the reason the fold was not taken)
_KEPT_ON_ALU = "bias kept on the ALU: "
_KEPT_BY_OBJECTIVE = f"{_KEPT_ON_ALU}the objective prefers it to"


def gemm_twin(op, cand: Candidate, kind: str) -> Optional[Candidate]:
    """The twin of a candidate whose bias stays on the ALU (``cand``, after :func:`fold_candidate`)
    that adds it by a GEMM instead (:func:`~.codegen.biasfold.gemm_bias_decision`), or None when
    it cannot; either way ``cand.bias_note`` gets the reason. The choice times both and keeps the
    faster (on ``default`` a tile of many output channel blocks and few rows may not gain)."""
    import tvm

    from .codegen.biasfold import gemm_bias_decision

    if cand.workload.bias_lanes or cand.workload.bias_gemm:
        return None
    from .lanes import bias_with_lanes

    bias = bias_with_lanes(op)          # the padded channels' lane biases get digits too
    ok, note = gemm_bias_decision(cand.packed, kind, op.epilogue, bias,
                                  strict=cand.workload.mode == "strict")
    if not ok:
        def refused(c: Candidate) -> None:
            if note and c.bias_note:
                c.bias_note += f"; {note}"

        _when_settled(cand, refused)      # cand's note may wait for its fold's form
        return None
    twin = Candidate(cand.workload.with_bias_lanes(0, gemm=True), cand.embedding, cand.packed,
                     estimate=cand.estimate, footprint=cand.footprint, bias_note=note,
                     place=cand.place)

    def notes(c: Candidate) -> None:
        if c.bias_note.startswith(_KEPT_BY_OBJECTIVE):     # the twin of a kept_twin
            twin.bias_note += f"; not folded: {c.bias_note[len(_KEPT_ON_ALU):]}"
        if c.bias_note:
            c.bias_note += "; not by a GEMM: it was not faster"

    if cand.pending:
        twin.pending.append(lambda t: settle(cand))
    _when_settled(cand, notes)
    return twin


def unfolded(cw: CspWorkload) -> CspWorkload:
    """``cw`` without its bias fold or bias GEMM: the embedding a candidate and its twins share."""
    return cw.with_bias_lanes(0)


def program_epilogue(cw: CspWorkload, epilogue) -> Tuple[tuple, ...]:
    """The epilogue the program of ``cw`` runs: ``epilogue`` without its bias stage when the bias
    is folded (``cw.bias_lanes``, :func:`~.codegen.biasfold.fold_epilogue`), with the bias GEMM
    in its place when ``cw.bias_gemm`` (:func:`~.codegen.biasfold.gemm_bias_epilogue`)."""
    from vta_ext.templates.epilogue import normalize_epilogue

    from .codegen.biasfold import fold_epilogue, gemm_bias_epilogue

    if cw.bias_gemm:
        return gemm_bias_epilogue(epilogue)
    return fold_epilogue(epilogue) if cw.bias_lanes else normalize_epilogue(epilogue)


def operand_layouts(op, cand: Candidate) -> Dict[str, Any]:
    """Tensor name -> host layout of the data and weight operands of ``cand`` for ``op``: the
    packed program's own, or with the bias folded in (:func:`~.codegen.biasfold.fold_layouts`)
    when ``cand.workload.bias_lanes``."""
    pg = cand.packed
    if cand.workload.bias_lanes:
        from .codegen.biasfold import fold_layouts
        from .lanes import bias_with_lanes

        return fold_layouts(pg, bias_with_lanes(op), cand.workload.bias_lanes,
                            handed=cand.lane_constant)
    return {pg.operands[r].tensor: pg.operands[r].host for r in "AB"}


def data_layout(cand: Candidate, folded: bool = True):
    """The host layout of ``cand``'s data operand (its activation): the packed program's own, or
    with the lane constants of a folded bias (:func:`~.codegen.biasfold.fold_data_layout`) unless
    ``folded`` is False; the same as ``operand_layouts(op, cand)`` gives for it, without the
    weights' bias digits."""
    pg = cand.packed
    if folded and cand.workload.bias_lanes and cand.lane_constant is None:
        from .codegen.biasfold import fold_data_layout

        return fold_data_layout(pg, cand.workload.bias_lanes)
    data = cand.embedding.workload.inputs[0].name
    return next(pg.operands[r].host for r in "AB" if pg.operands[r].tensor == data)


def packed_inputs(op, cand: Candidate, lane_bias=None):
    """``inputs(packer)`` of the plan of ``cand`` for the matched operator ``op``
    (:class:`vta_ext.strategy.OpPlan`): packs the activation (or takes it over from the previous
    VTA operator), the weight and the bias into the candidate's layouts and returns the VTA call's
    packed arguments in the program's order (A, B, bias). A folded bias (``bias_lanes``) is no
    argument: the data and weight layouts write it in (:func:`operand_layouts`), and the data is
    packed from the operator's tensor (a hand-over would miss the lane constants), unless the
    producer wrote them into its padded channels (``cand.lane_constant``): then it must be
    taken over. ``lane_bias``: the biases of the padded output channels that write lane
    constants there (:func:`~.lanes.requested_biases`), set into the packed bias
    (:func:`~.lanes.lane_bias_layout`)."""
    pg = cand.packed
    A, B = pg.operands["A"], pg.operands["B"]
    folded = bool(cand.workload.bias_lanes)
    handed = folded and cand.lane_constant is not None
    data_name, weight_name = (t.name for t in cand.embedding.workload.inputs)

    def inputs(packer):
        layouts = operand_layouts(op, cand)
        args = {}
        for name, expr in ((data_name, op.operands[0]), (weight_name, op.operands[1])):
            layout = layouts[name]
            kept = None if folded and not handed else packer.handover(expr, layout)
            if kept is None and handed and name == data_name:
                raise RuntimeError(f"{cand.label}: the bias is folded into the lane constants "
                                   "of the producer's padded channels, but its output is not "
                                   "handed over")
            args[name] = kept if kept is not None else layout.pack(packer, expr)
            if name == data_name:
                packer.note_kept(kept is not None)
        out = [args[A.tensor], args[B.tensor]]
        if op.bias is not None and not folded:
            bias = pg.bias_layout(_shape(op.bias))
            if lane_bias is not None:
                from .lanes import lane_bias_layout

                bias = lane_bias_layout(bias, pg.operands["C"].host, _shape(op.core)[1],
                                        lane_bias)
            out.append(bias.pack(packer, op.bias))
        return out

    return inputs
