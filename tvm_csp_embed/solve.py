"""Solver driver: MiniZinc data from a workload and an instruction, Gecode runs, statistics.

:func:`solve` builds the data of ``models/embed.mzn``, flattens it with ``minizinc -c`` (Gecode's
library), runs ``fzn-gecode`` on the FlatZinc (minimising the padding cost), decodes the
structural variables and the scalar node coordinates, and returns a :class:`SolveResult` with
per-solve :class:`SolveStats`. Options: the constraint set (``"strict"``, ``"relaxed"`` or
explicit switches), the search order, the dimension-order portfolio of Rieber et al. eq. (12) run
in parallel processes (first answer wins; each asset one ``minizinc`` run) and the per-group
domain bound of eq. (11), a time limit, and the N best distinct solutions.

:func:`solve_batch` solves several problems with one flattening: MiniZinc's start (the parse of
its library, about 0.06 s of CPU, more than flattening one instance) is paid once per batch. The
instances go into one model under per-instance name prefixes, the FlatZinc is cut back into one
per instance (they share no variable), and each is searched on its own, with its own search
annotation and goal: the same solutions in the same order as :func:`solve` (the search is complete
and branches on the same variables in the same order; ``tests/test_embed_model.py`` checks all 823
reference solves both ways). A build solves in such batches
(:func:`tvm_csp_embed.cache.solve_concurrently`). Gecode copies every search node (``-c-d 1``)
rather than recomputing it: the same tree, with less propagation redone.

One flattening and one search per problem. For one solution it minimises the cost (branch and
bound). For the N best it enumerates every structure (``-a``; the scalar nodes are functional in the
structure, so solutions are distinct structures), optionally below a cost bound (``max_cost``),
and keeps the N cheapest: a complete enumeration proves them the N best, and fewer than N means
that no more exist, without a further solve. In a batch (:func:`solve_batch`) an enumeration first
looks at its first ``FIRST_LOOK * N`` solutions; the N best of all cost no more than the N-th
cheapest of those, so unless that look was the whole enumeration, it runs again under that bound
(appended to the FlatZinc): the same N, and a 3-channel stem's enumeration of 91 solutions
becomes 12 plus 9. (A model with N copies of the variables minimising
their total cost, tried first, takes 10-60x longer on the relaxed thin-channel layers: branch and
bound keeps re-searching the later copies under every structure of the first.)

The cost of a solve is MiniZinc's flattening. The model therefore makes a variable only of the
scalar values some constraint reads (``models/embed.mzn`` header): the data nodes, pooled so that
data nodes differing only in bits that cannot change a coordinate share one variable, and of the
multiply nodes only sums of the bit steps ``u`` (the corner node, the reduction chain's nodes of
one bit). The decoder composes the rest from the solver's values: every multiply node is ``o``
plus the ``u`` of its set bits, every data node its pool entry. The search annotation branches on
the same values in the same order as the model with one variable per node did (the output data
nodes, the origin, in the node order the single-bit multiply nodes: every other scalar value is a
function of these), so branch and bound and the enumeration meet the solutions in the same order.
Against that model (``tests/data/embed_reference.json``, ``tests/test_embed_model.py``: the same
solutions in the same order on 823 solves) one solve of a ResNet-18 conv2d takes 3-3.7x fewer
instructions (MiniZinc and Gecode, valgrind: about 1.85e9 -> 0.61e9 relaxed, 1.64e9 -> 0.45e9
strict, of which 0.34e9 are MiniZinc's own start-up on an empty model).
"""
from __future__ import annotations

import functools
import itertools
import math
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import Executor, Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .instructions import InstructionGraph
from .workload import Workload

__all__ = ["CONSTRAINTS", "CONSTRAINT_SETS", "SEARCHES", "SolveStats", "RawSolution", "SolveResult",
           "EmbeddingNotFound", "SolverError", "solve", "Problem", "solve_batch", "portfolio_orders",
           "build_data", "PERMUTABLE", "permuted_solution"]

MODEL = Path(__file__).resolve().parent / "models" / "embed.mzn"

#: switchable constraints of the model, by name
CONSTRAINTS = ("iso", "alldiff", "rect", "origin", "dense", "linear", "symmetry", "pad")
#: named constraint sets: ``strict`` is the paper's sec. 5 list (plus padding and symmetry
#: breaking); ``relaxed`` (sec. 6) drops dense and linear access: filter dims may fold into
#: an instruction axis by stencil unrolling, and strides are allowed
CONSTRAINT_SETS: Dict[str, Tuple[str, ...]] = {
    "strict": ("iso", "alldiff", "rect", "origin", "dense", "linear", "symmetry", "pad"),
    "relaxed": ("iso", "alldiff", "rect", "origin", "symmetry", "pad"),
}
#: search orders: ``struct`` = structural variables first (output axes first), then the
#: scalar nodes output-first; ``nodes`` = the paper's order on scalar nodes only (outputs,
#: multiplies, inputs) with structure and padding last
SEARCHES = ("struct", "nodes")

#: weights of the cost: padding (per doubling of a dim's extent), per stencil-unrolled
#: bit, per strided factor, and for binding the weights to A
PAD_WEIGHT, UNROLL_WEIGHT, STRIDE_WEIGHT, BIND_WEIGHT = 1000, 20, 5, 2


class EmbeddingNotFound(RuntimeError):
    """No embedding: the constraint set is infeasible for this operator, or the time ran out.

    Attributes
    ----------
    status : str
        ``"infeasible"`` or ``"timeout"``.
    """

    def __init__(self, status: str, message: str):
        self.status = status
        super().__init__(message)


class SolverError(RuntimeError):
    """MiniZinc or Gecode failed (message carries the solver's own error text)."""


@dataclass
class SolveStats:
    """Statistics of one solve.

    Attributes
    ----------
    wall_seconds : float
        End-to-end wall time (data generation, MiniZinc flattening and Gecode).
    flatten_seconds, solve_seconds : float
        MiniZinc flattening and Gecode times as reported by ``-s``.
    nodes, failures : int
        Gecode search-tree nodes and failures.
    asset : str
        The winning portfolio asset (dimension order), or ``"default"``.
    runs : int
        Number of MiniZinc processes started.
    batch : int
        Number of instances flattened together with this one's in one MiniZinc process
        (:func:`solve_batch`), this one included.
    """

    wall_seconds: float = 0.0
    flatten_seconds: float = 0.0
    solve_seconds: float = 0.0
    nodes: int = 0
    failures: int = 0
    asset: str = "default"
    runs: int = 0
    batch: int = 1

    def __repr__(self) -> str:
        return (f"SolveStats(wall={self.wall_seconds:.3f}s, flatten={self.flatten_seconds:.3f}s, "
                f"solve={self.solve_seconds:.3f}s, nodes={self.nodes}, failures={self.failures}, "
                f"asset={self.asset})")


@dataclass
class RawSolution:
    """One solution of the constraint program, in the original dim order of the workload.

    Attributes
    ----------
    binding : int
        1: A reads ``inputs[0]``, B reads ``inputs[1]``; 2: swapped.
    bit_dims : tuple of int
        Loop dim (0-based, original order) walked by each instruction bit (axes in order,
        innermost bit first).
    bit_steps : tuple of int
        Step of each bit.
    pad : tuple of int
        Padding per loop dim.
    cost : int
        Objective value.
    optimal : bool
        True if Gecode proved the cost optimal (under the nogoods of earlier solutions).
    p : list of tuple of int
        Coordinates of every multiply node (rows in ``InstructionGraph.mult_nodes`` order).
    data_nodes : dict
        Operand -> list of tensor coordinates of its data nodes (``operand_nodes`` order).
    stats : SolveStats
    """

    binding: int
    bit_dims: Tuple[int, ...]
    bit_steps: Tuple[int, ...]
    pad: Tuple[int, ...]
    cost: int
    optimal: bool
    p: List[Tuple[int, ...]]
    data_nodes: Dict[str, List[Tuple[int, ...]]]
    stats: SolveStats = field(default_factory=SolveStats)

    def key(self) -> Tuple:
        """Structural identity (distinct solutions differ here)."""
        return (self.binding, self.bit_dims, self.bit_steps)


@dataclass
class SolveResult:
    """All solutions of one :func:`solve` call.

    Attributes
    ----------
    status : str
        ``"ok"``, ``"infeasible"`` or ``"timeout"``.
    solutions : list of RawSolution
        Best first.
    stats : SolveStats
        Totals over all runs (wall time end to end).
    message : str
        Human-readable outcome.
    """

    status: str
    solutions: List[RawSolution]
    stats: SolveStats
    message: str = ""

    def __repr__(self) -> str:
        return f"SolveResult({self.status}, {len(self.solutions)} solution(s), {self.stats!r})"


# ---------------------------------------------------------------------- data
def padding_cost(extent: int, pad: int) -> int:
    """The model's cost of padding a loop dim of ``extent`` by ``pad``: ``PAD_WEIGHT`` per doubling."""
    return round(PAD_WEIGHT * math.log2((extent + pad) / extent))


def _padding_within(extent: int, most: int, max_cost: int) -> int:
    """The largest padding of a loop dim of ``extent``, at most ``most``, whose
    :func:`padding_cost` is within ``max_cost`` (0 if none is)."""
    lo, hi = 0, most              # padding_cost grows with the padding: bisect
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if padding_cost(extent, mid) <= max_cost:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _bits(instr: InstructionGraph) -> Tuple[List[int], List[int]]:
    bax, bpos = [], []
    for a, L in enumerate(instr.log_sizes):
        for b in range(L):
            bax.append(a)
            bpos.append(b)
    return bax, bpos


#: the constraints under which :func:`permuted_solution` gives a solve's solutions for a permuted
#: workload: axis-parallel rectangles (each walked dim one run of bits of one axis) and the
#: symmetry breaking that orders the runs of an axis by loop dim
PERMUTABLE = ("rect", "symmetry")


def permuted_solution(s: RawSolution, order: Sequence[int], instr: InstructionGraph
                      ) -> RawSolution:
    """Solution ``s`` of a workload ``wl`` as the solution of ``wl.permuted(order)`` (the loop dims
    reordered: ``order[i]`` is the old index of the new dim ``i``; see
    :meth:`~tvm_csp_embed.workload.Workload.permutation_of`), under a constraint set with
    :data:`PERMUTABLE`.

    The model is the same after renaming the dims (padding, bindings, strides and the cost are
    per dim; tensor dims enter only as sets of data node coordinates), except for its symmetry
    breaking, which keeps one order of the factor runs of each axis: inner runs walk later loop
    dims. So each axis's runs are put in that order for the new dim indices; each run keeps its
    steps, the padding moves with its dim, and the cost and optimality stay. The scalar node
    values are left empty (:func:`~tvm_csp_embed.embedding.decode` does not read them).
    """
    new_of = {old: new for new, old in enumerate(order)}
    bax, _ = _bits(instr)
    dims, steps = [], []
    for a in range(len(instr.axes)):
        runs: List[Tuple[int, List[int]]] = []
        for b in (b for b in range(len(bax)) if bax[b] == a):
            d = new_of[s.bit_dims[b]]
            if runs and runs[-1][0] == d:
                runs[-1][1].append(s.bit_steps[b])
            else:
                runs.append((d, [s.bit_steps[b]]))
        for d, st in sorted(runs, key=lambda r: -r[0]):
            dims += [d] * len(st)
            steps += st
    return RawSolution(s.binding, tuple(dims), tuple(steps), tuple(s.pad[o] for o in order),
                       s.cost, s.optimal, [], {})


def _bindings(instr: InstructionGraph, wl: Workload, commutative: bool) -> List[Tuple[int, int, int]]:
    b = [(0, 1, 2)]
    if commutative and instr.operand_axes["A"] != instr.operand_axes["B"]:
        b.append((1, 0, 2))
    return b


_BOOL = {True: "true", False: "false"}


def _arr(vals) -> str:
    vals = list(vals)
    kinds = set(map(type, vals))
    if kinds <= {int}:
        return "[" + ",".join(map(str, vals)) + "]"
    if kinds == {bool}:
        return "[" + ",".join(map(_BOOL.__getitem__, vals)) + "]"
    return "[" + ",".join(_v(v) for v in vals) + "]"


def _v(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(int(v))


def _nd(name: str, ranges: Sequence[str], flat: Sequence) -> str:
    return f"{name} = array{len(ranges)}d({','.join(ranges)},{_arr(flat)});"


@dataclass
class _ModelData:
    """The data of one solve: the dzn text and what decoding a solution needs (the pool index of
    every data node, the set bits of every multiply node)."""

    dzn: str
    qbit: np.ndarray                             # multiply node x bit: 1 if the bit is set
    tix: List[List[List[List[int]]]]             # [binding][operand][data node][tensor dim] -> pool entry
    singles: List[int]                           # bits of the single-bit multiply nodes, in node order


def build_data(wl: Workload, instr: InstructionGraph, constraints: Sequence[str], *,
               commutative: bool = True, bound: bool = False, bound_stride: int = 1,
               compat: bool = True, max_cost: Optional[int] = None) -> str:
    """MiniZinc data (dzn text) for ``models/embed.mzn``.

    ``compat=False`` switches off the precomputed structural table of the dataflow edges
    (``COMPAT``, and the bit domains derived from it): the model's own edge constraints must then
    keep every solution sound (:func:`tvm_csp_embed.verify.check_raw`). ``max_cost``, the cost
    bound the solve posts, ends each dim's padding domain where padding costs more (then an
    extent-1 dim leaves the bits' domains: no bit can walk it).

    Raises
    ------
    ValueError
        If a tensor uses one loop dim in two subscripts (the allDiff decomposition needs
        the loop dims partitioned among a tensor's subscripts).
    """
    return _model_data(wl, instr, constraints, commutative=commutative, bound=bound,
                       bound_stride=bound_stride, compat=compat, max_cost=max_cost).dzn


def _model_data(wl: Workload, instr: InstructionGraph, constraints: Sequence[str], *,
                commutative: bool = True, bound: bool = False, bound_stride: int = 1,
                compat: bool = True, max_cost: Optional[int] = None) -> _ModelData:
    bad = set(constraints) - set(CONSTRAINTS)
    if bad:
        raise ValueError(f"unknown constraint(s) {sorted(bad)}; known: {CONSTRAINTS}")
    D = len(wl.dims)
    ext = list(wl.extents)
    tensors = wl.tensors
    for t in tensors:
        for d in range(D):
            if sum(1 for e in range(t.rank) if t.coef[e][d]) > 1:
                raise ValueError(f"tensor {t.name}: loop dim {wl.dims[d]} occurs in two subscripts; "
                                 "the allDiff decomposition needs a partition (rewrite the operator)")
    Nmax = max(instr.sizes)
    use_pad = "pad" in constraints
    padmax = [max(Nmax - 1, x - 1) if use_pad else 0 for x in ext]
    if max_cost is not None:
        # every cost term is >= 0, so a solution within the bound pads no dim by more than the
        # bound pays for: the padding's domain (and with it the cost table, the coordinate
        # domains and the steps) ends there; an extent-1 dim that cannot be padded is not walked
        padmax = [_padding_within(x, pm, max_cost) for x, pm in zip(ext, padmax)]
    padall = max(padmax)
    bax, bpos = _bits(instr)
    NBIT = len(bax)
    nodes = instr.mult_nodes()
    NQ = len(nodes)
    qbits = [[b for b in range(NBIT) if (q[bax[b]] >> bpos[b]) & 1] for q in nodes]
    qmask = [sum(1 << b for b in bs) for bs in qbits]
    ops = ("A", "B", "C")
    opax = [[a in instr.operand_axes[o] for a in instr.axes] for o in ops]
    nn = [len(instr.operand_nodes(o)) for o in ops]
    nnmax = max(nn)
    rep = []                 # representative multiply node (0-based) of every data node
    node_index = {q: i for i, q in enumerate(nodes)}
    for o in ops:
        row = []
        for dn in instr.operand_nodes(o):
            q = [0] * len(instr.axes)
            for a, v in zip(instr.operand_axes[o], dn):
                q[instr.axes.index(a)] = v
            row.append(node_index[tuple(q)])
        rep.append(row)
    binds = _bindings(instr, wl, commutative)
    NB = len(binds)
    EMAX = max(t.rank for t in tensors)
    NE, COEF, CST, INE, VIS, COMPAT, LINEAR = [], [], [], [], [], [], []
    for bd in binds:
        bt = [tensors[i] for i in bd]
        NE.append([t.rank for t in bt])
        for t in bt:
            for e in range(EMAX):
                for d in range(D):
                    COEF.append(t.coef[e][d] if e < t.rank else 0)
                    INE.append(e < t.rank and t.coef[e][d] != 0)
                CST.append(t.const[e] if e < t.rank else 0)
            vis = set(t.visible())
            VIS.extend(d in vis for d in range(D))
        for a, an in enumerate(instr.axes):
            for d in range(D):
                ok = instr.reduction[a] == wl.reduction[d]
                lin = True
                for o, t in zip(ops, bt):
                    inop = an in instr.operand_axes[o]
                    ok = ok and (inop == (d in t.visible()))
                    if inop:
                        lin = lin and t.is_linear(d)
                COMPAT.append(ok or not compat)
                LINEAR.append(lin)
    # per-bit dims admissible under some binding: the dataflow edges (iso) and linear access
    # (linear) are posted in full in the model; this only shrinks domains before flattening.
    # A bit walking dim d puts the corner node at d >= 1, within the padded extent: a dim of
    # extent 1 needs padding (under a cost bound below padding_cost(1, 1), not allowed: a 1x1
    # filter's r and s)
    walkable = [x + pm >= 2 for x, pm in zip(ext, padmax)]
    bdom = []
    for b in range(NBIT):
        a = bax[b]
        dom = set()
        for k in range(NB):
            for d in range(D):
                i = (k * len(instr.axes) + a) * D + d
                if not walkable[d]:
                    continue
                if ("iso" not in constraints or COMPAT[i]) and ("linear" not in constraints or LINEAR[i]):
                    dom.add(d + 1)
        bdom.append(dom)
    thi = []
    for k in range(3):
        hi = 0
        for bd in binds:
            t = tensors[bd[k]]
            for e in range(t.rank):
                hi = max(hi, t.const[e] + sum(c * (x + pm - 1) for c, x, pm in zip(t.coef[e], ext, padmax)))
        thi.append(hi)
    strided = "dense" not in constraints
    stmax = max(ext) if strided else 1
    maxstep = max(1, max(x + pm for x, pm in zip(ext, padmax)))
    logc = [padding_cost(ext[d], v) for d in range(D) for v in range(padall + 1)]
    red_ax = [i for i, r in enumerate(instr.reduction) if r]
    bnd = [min(x + pm - 1, Nmax * bound_stride - 1) for x, pm in zip(ext, padmax)]
    # the data node pool (model header): per (binding, operand, tensor dim) one entry per subset
    # of the operand's bits that may change that coordinate; a data node's entry is the subset
    # of its representative's bits. Without iso the data nodes are free: one entry each.
    iso = "iso" in constraints
    opbits = [[b for b in range(NBIT) if opax[t][bax[b]]] for t in range(3)]
    ntp = 0
    base: List[Tuple[int, int, int, int]] = []    # pool entry, binding, operand, tensor dim (1-based)
    chain: List[Tuple[int, int, int]] = []        # pool entry, its entry without the lowest bit, step
    steps: Dict[Tuple[int, int, int, int], int] = {}   # (binding, operand, tensor dim, bit) -> step
    tplo = [[[0] * EMAX for _ in range(3)] for _ in range(NB)]
    tphi = [[[0] * EMAX for _ in range(3)] for _ in range(NB)]
    tix = [[[[0] * EMAX for _ in range(nnmax)] for _ in range(3)] for _ in range(NB)]
    groups: Dict[Tuple[int, int, int], Tuple[int, int, List[int]]] = {}
    for k in range(NB):
        for t in range(3):
            for e in range(NE[k][t]):
                # the output's tensor is the same under every binding: one pool
                key = (binds[k][t], t, e) if iso else (k, t, e)
                if key not in groups:
                    first = ntp + 1
                    if iso:
                        coef = [COEF[((k * 3 + t) * EMAX + e) * D + d] for d in range(D)]
                        rel = [b for b in opbits[t] if any(coef[d - 1] for d in bdom[b])]
                        relmask = sum(1 << b for b in rel)
                        index = {}                   # subset of rel (a bit mask) -> pool entry
                        for m in range(2 ** len(rel)):
                            sub = sum(1 << b for i, b in enumerate(rel) if (m >> i) & 1)
                            ntp += 1
                            index[sub] = ntp
                            if sub:                  # its lowest bit, and the subset without it
                                low = (sub & -sub).bit_length() - 1
                                step = steps.setdefault((k + 1, t + 1, e + 1, low + 1), len(steps) + 1)
                                chain.append((ntp, index[sub & (sub - 1)], step))
                            else:
                                base.append((ntp, k + 1, t + 1, e + 1))
                        ids = [index[qmask[rep[t][j]] & relmask] for j in range(nn[t])]
                    else:
                        ids = list(range(ntp + 1, ntp + nn[t] + 1))
                        ntp += nn[t]
                    groups[key] = (first, ntp, ids)
                first, last, ids = groups[key]
                tplo[k][t][e], tphi[k][t][e] = first, last
                for j in range(nn[t]):
                    tix[k][t][j][e] = ids[j]
    star = [tix[0][2][j][e] for j in range(nn[2]) for e in range(EMAX)]
    qbits_model = qbits if ("alldiff" in constraints and "rect" not in constraints) else []
    _set = lambda bs: "{" + ",".join(str(b + 1) for b in bs) + "}"
    lines = [
        f"D = {D};", f"ext = {_arr(ext)};", f"PADMAX = {_arr(padmax)};",
        f"NAX = {len(instr.axes)};", f"NBIT = {NBIT};",
        f"BAX = {_arr([a + 1 for a in bax])};", f"BPOS = {_arr(bpos)};",
        f"NQ = {NQ};",
        _nd("OPAX", ["1..3", "1..NAX"], sum(opax, [])), f"NN = {_arr(nn)};", f"NNMAX = {nnmax};",
        f"NB = {NB};", f"EMAX = {EMAX};",
        _nd("NE", ["1..NB", "1..3"], sum(NE, [])),
        _nd("COEF", ["1..NB", "1..3", "1..EMAX", "1..D"], COEF),
        _nd("CST", ["1..NB", "1..3", "1..EMAX"], CST),
        _nd("INE", ["1..NB", "1..3", "1..EMAX", "1..D"], INE),
        _nd("VIS", ["1..NB", "1..3", "1..D"], VIS),
        _nd("COMPAT", ["1..NB", "1..NAX", "1..D"], COMPAT),
        _nd("LINEAR", ["1..NB", "1..NAX", "1..D"], LINEAR),
        f"BINDCOST = {_arr([BIND_WEIGHT * k for k in range(NB)])};",
        "TLO = 0;", f"THI = {max(thi)};",
        f"MAXSTEP = {maxstep};", f"STMAX = {stmax};", f"PADALL = {padall};",
        _nd("LOGC", ["1..D", f"0..{padall}"], logc),
        f"UNROLLW = {UNROLL_WEIGHT};", f"STRIDEW = {STRIDE_WEIGHT};",
        f"POW2 = array1d(0..{NBIT}, {_arr([2 ** i for i in range(NBIT + 1)])});",
        f"ISRED = {_arr(list(wl.reduction))};",
        f"CHAINB = {_set(b for b in range(NBIT) if bax[b] in red_ax)};",
        f"NQP = {len(qbits_model)};", "QBITS = [" + ",".join(_set(bs) for bs in qbits_model) + "];",
        f"NTP = {ntp};", f"NBASE = {len(base)};",
        *(f"{name} = {_arr([x[i] for x in base])};"
          for i, name in enumerate(("BASEI", "BASEK", "BASET", "BASEE"))),
        f"NCHAIN = {len(chain)};",
        *(f"{name} = {_arr([x[i] for x in chain])};" for i, name in enumerate(("CHI", "CHPREV", "CHW"))),
        f"NWS = {len(steps)};",
        *(f"{name} = {_arr([x[i] for x in steps])};" for i, name in enumerate(("WSK", "WST", "WSE", "WSB"))),
        _nd("TPLO", ["1..NB", "1..3", "1..EMAX"], sum(sum(tplo, []), [])),
        _nd("TPHI", ["1..NB", "1..3", "1..EMAX"], sum(sum(tphi, []), [])),
        _nd("STAR", [f"1..{nn[2]}", "1..EMAX"], star),
        _nd("PADDENSE", ["1..D", f"0..{NBIT}"],
            [(-(-x // 2 ** k)) * 2 ** k - x for x in ext for k in range(NBIT + 1)]),
        "BDOM = [" + ",".join("{" + ",".join(str(d) for d in sorted(x)) + "}" for x in bdom) + "];",
    ]
    for c in CONSTRAINTS:
        lines.append(f"c_{c} = {_v(c in constraints)};")
    lines.append(f"c_bound = {_v(bound)};")
    lines.append(f"BOUND = {_arr(bnd)};")
    singles = [bs[0] for bs in qbits if len(bs) == 1]
    qbit = ((np.array(qmask, dtype=np.int64)[:, None] >> np.arange(NBIT)) & 1).reshape(NQ, NBIT)
    return _ModelData("\n".join(lines) + "\n", qbit, tix, singles)


def _search_ann(instr: InstructionGraph, search: str, md: _ModelData, iso: bool = True) -> str:
    """The search annotation: a ``seq_search`` of :func:`_search_entries`."""
    return f"seq_search([{', '.join(_search_entries(instr, search, md, iso))}])"


def _search_entries(instr: InstructionGraph, search: str, md: _ModelData, iso: bool = True) -> List[str]:
    """The ``int_search`` entries of the search annotation, in order. On the scalar nodes it
    branches on the values that decide the order of the solutions: the output data nodes under binding 1, the origin and the multiply nodes of
    one bit (every other multiply node is the origin plus steps of single-bit nodes before it in
    node order, and with iso every data node is a function of the multiply nodes, so neither can be
    the first value in which two solutions differ)."""
    bax, bpos = _bits(instr)
    # output axes first (axes of C, then the others), outermost bit of each axis first
    cax = [instr.axes.index(a) for a in instr.operand_axes["C"]]
    order_ax = cax + [a for a in range(len(instr.axes)) if a not in cax]
    bits = [b for a in order_ax for b in sorted((b for b in range(len(bax)) if bax[b] == a),
                                                  key=lambda b: -bpos[b])]
    blist = ",".join(f"bdim[{b + 1}]" for b in bits)
    slist = ",".join(f"bstep[{b + 1}]" for b in bits)

    def pool(k: int, t: int) -> List[str]:
        return [f"TP[{i}]" for row in md.tix[k][t] for i in row if i]
    scalars = [f"int_search([{','.join(pool(0, 2))}], input_order, indomain_min)"]
    singles = "[" + ",".join(str(b + 1) for b in md.singles) + "]"
    nodes = "o" if search == "struct" else f"o ++ [node({{b}}, d) | b in {singles}, d in DIMS]"
    scalars.append(f"int_search({nodes}, input_order, indomain_min)")
    if not iso:       # the data nodes are free: they order the solutions too
        for t in (0, 1):
            tl = [x for k in range(len(md.tix)) for x in pool(k, t)]
            scalars.append(f"int_search([{','.join(tl)}], input_order, indomain_min)")
    if not bits:
        blist = slist = ""
    # structure: binding, the dim of each bit, then padding (cheapest first) and strides
    struct = (["int_search([bind], input_order, indomain_min)"]
              + ([f"int_search([{blist}], input_order, indomain_min)"] if bits else [])
              + ["int_search(pad, input_order, indomain_min)"]
              + ([f"int_search([{slist}], input_order, indomain_min)"] if bits else []))
    if search == "struct":
        return struct + scalars
    if search == "nodes":
        return scalars + struct
    raise ValueError(f"unknown search {search!r}; use one of {SEARCHES}")


_OUT = ('output ["SOL bind=\\(bind) bdim=\\(bdim) bstep=\\(bstep) pad=\\(pad) cost=\\(cost)\\n",\n'
        '        "O=\\(o)\\nT=\\(TP)\\n"];\n')


def _ints(s: str) -> List[int]:
    return [int(x) for x in re.findall(r"-?\d+", s)]


@dataclass
class _Run:
    proc: subprocess.Popen
    order: Tuple[int, ...]
    asset: str
    t0: float


def _launch(wl: Workload, instr: InstructionGraph, constraints, search, timeout, workdir, tag,
            nogoods: Sequence[RawSolution], order: Sequence[int], commutative, bound, bound_stride,
            optimise: bool, enumerate_all: bool = False, max_cost: Optional[int] = None,
            compat: bool = True) -> subprocess.Popen:
    wlp = wl.permuted(order)
    inv = {old: new for new, old in enumerate(order)}
    md = _model_data(wlp, instr, constraints, commutative=commutative, bound=bound,
                     bound_stride=bound_stride, compat=compat, max_cost=max_cost)
    ng = []
    for s in nogoods:
        conj = [f"bind = {s.binding}"]
        conj += [f"bdim[{b + 1}] = {inv[d] + 1}" for b, d in enumerate(s.bit_dims)]
        conj += [f"bstep[{b + 1}] = {st}" for b, st in enumerate(s.bit_steps)]
        ng.append("constraint not (" + " /\\ ".join(conj) + ");")
    mzn = Path(workdir) / f"{tag}.mzn"
    dzn = Path(workdir) / f"{tag}.dzn"
    goal = "minimize cost" if optimise and not enumerate_all else "satisfy"
    if max_cost is not None:
        ng.append(f"constraint cost <= {int(max_cost)};")
    mzn.write_text(f'include "{MODEL}";\n' + "\n".join(ng) + "\n"
                   f"solve :: {_search_ann(instr, search, md, 'iso' in constraints)} {goal};\n" + _OUT)
    dzn.write_text(md.dzn)
    cmd = ["minizinc", "--solver", "gecode", "-s", "--time-limit", str(int(timeout * 1000))]
    if enumerate_all:
        cmd.append("-a")
    cmd += [str(mzn), str(dzn)]
    # output goes to files: an enumeration prints more than a pipe buffer holds, and the driver
    # polls several processes without reading their pipes
    out = open(Path(workdir) / f"{tag}.out", "w+")
    err = open(Path(workdir) / f"{tag}.err", "w+")
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
    proc.out_file, proc.err_file, proc.model_data = out, err, md
    return proc


def _outputs(proc: subprocess.Popen) -> Tuple[str, str]:
    """Stdout and stderr of a finished :func:`_launch` process (its files are closed)."""
    texts = []
    for f in (proc.out_file, proc.err_file):
        f.seek(0)
        texts.append(f.read())
        f.close()
    return texts[0], texts[1]


def _parse(out: str, err: str, rc: int, wl: Workload, instr: InstructionGraph, order: Sequence[int],
           md: _ModelData) -> Tuple[str, List[RawSolution], Dict[str, float]]:
    """Status, every solution printed (in order) and MiniZinc's statistics.

    The scalar values are the solver's: every multiply node is the origin ``o`` plus the steps
    ``u`` of its set bits (the model's definition of a node), every data node its pool entry."""
    stats = _stats(out)
    sols = re.findall(r"SOL bind=(\d+) bdim=\[(.*?)\] bstep=\[(.*?)\] pad=\[(.*?)\] cost=(-?\d+)\n"
                      r"O=\[(.*?)\]\nT=\[(.*?)\]", out, re.S)
    complete = "==========" in out
    if not sols:
        if "=====UNSATISFIABLE=====" in out:
            return "infeasible", [], stats
        if rc != 0 and "UNKNOWN" not in out:
            raise SolverError(f"minizinc failed (exit {rc}) on {wl.name}: {err.strip()[-2000:]}")
        return "timeout", [], stats
    found = [_raw_solution(wl, instr, order, md, int(b), _ints(bd), _ints(bs), _ints(pad), int(cost),
                           _ints(O), _ints(T), complete)
             for b, bd, bs, pad, cost, O, T in sols]
    return "ok", found, stats


def _raw_solution(wl: Workload, instr: InstructionGraph, order: Sequence[int], md: _ModelData,
                  bind: int, bdim: Sequence[int], bstep: Sequence[int], pad: Sequence[int], cost: int,
                  o: Sequence[int], tp: Sequence[int], complete: bool) -> RawSolution:
    """A solution from the solver's values (in the permuted dim order ``order``), in the original
    dim order. Every multiply node is the origin ``o`` plus the step vectors ``u`` of its set bits
    (a bit's step vector is its step in the dim it walks, the model's ``u``), every data node its
    pool entry of ``tp``."""
    D = len(wl.dims)
    binds = _bindings(instr, wl, True)
    inv = [order.index(d) for d in range(D)]                # original dim -> permuted dim
    bdp = [order[x - 1] for x in bdim]                      # permuted dim -> original dim
    pad_orig = [0] * D
    for new, old in enumerate(order):
        pad_orig[old] = pad[new]
    u = np.zeros((len(bdim), D), dtype=np.int64)
    u[np.arange(len(bdim)), np.asarray(bdim, dtype=np.int64) - 1] = bstep
    pts = (md.qbit @ u + np.asarray(o, dtype=np.int64))[:, inv]
    prow = [tuple(r) for r in pts.tolist()]
    data_nodes = {}
    for k, op in enumerate("ABC"):
        rank = wl.tensors[binds[bind - 1][k]].rank
        data_nodes[op] = [tuple(tp[i - 1] for i in row[:rank])
                          for row in md.tix[bind - 1][k][:len(instr.operand_nodes(op))]]
    return RawSolution(bind, tuple(bdp), tuple(bstep), tuple(pad_orig), cost, complete, prow, data_nodes)


def portfolio_orders(wl: Workload, instr: InstructionGraph) -> List[Tuple[int, ...]]:
    """Dimension orders of the portfolio (Rieber et al., eq. 12).

    One asset per choice of distinct spatial dims for the instruction's spatial axes and of
    reduction dims for its reduction axes, placed first (in axis order) so that the
    lexicographic search meets them first: ``n_s!/(n_s-k_s)! * n_r!/(n_r-k_r)!`` assets.
    The workload's own order comes first.
    """
    sp = [d for d in range(len(wl.dims)) if not wl.reduction[d]]
    rd = [d for d in range(len(wl.dims)) if wl.reduction[d]]
    ks = min(sum(1 for r in instr.reduction if not r), len(sp))
    kr = min(sum(1 for r in instr.reduction if r), len(rd))
    orders = [tuple(range(len(wl.dims)))]
    for s in itertools.permutations(sp, ks):
        for r in itertools.permutations(rd, kr):
            head = list(s) + list(r)
            o = tuple(head + [d for d in range(len(wl.dims)) if d not in head])
            if o not in orders:
                orders.append(o)
    return orders


def _asset_name(wl: Workload, order: Sequence[int]) -> str:
    return "".join(wl.dims[o][0] if len(wl.dims[o]) == 1 else f"({wl.dims[o]})" for o in order)


def solve(wl: Workload, instr: InstructionGraph, mode: Union[str, Sequence[str]] = "strict", *,
          solutions: int = 1, timeout: float = 30.0, search: str = "struct", portfolio: bool = False,
          bound: bool = False, bound_stride: int = 1, jobs: int = 2, commutative: bool = True,
          optimise: bool = True, disable: Sequence[str] = (), max_cost: Optional[int] = None,
          compat: bool = True) -> SolveResult:
    """Solve the embedding constraint program.

    Parameters
    ----------
    wl : Workload
    instr : InstructionGraph
    mode : str or sequence of str
        ``"strict"``, ``"relaxed"``, or an explicit list of constraint names
        (:data:`CONSTRAINTS`).
    solutions : int
        Number of best distinct solutions. One MiniZinc process: for 1, branch and bound on the
        cost; for more, the enumeration of every structure (below ``max_cost``), of which the
        ``solutions`` cheapest are kept (fewer when fewer exist; on a timeout, the cheapest found).
    timeout : float
        Seconds for the whole call; on expiry the status is ``"timeout"``.
    search : str
        ``"struct"`` (default, fastest) or ``"nodes"`` (the paper's node order).
    portfolio : bool
        Run the dimension-order assets of eq. (12) in ``jobs`` parallel processes; the first
        finished solve wins.
    bound : bool
        Post the per-group domain bound of eq. (11): node coordinates below
        ``max(instruction sizes) * bound_stride``.
    commutative : bool
        Let either input bind to operand A.
    optimise : bool
        Minimise the padding cost (otherwise the first solution is returned).
    disable : sequence of str
        Constraint names removed from the set.
    max_cost : int, optional
        Only solutions of at most this cost (e.g. the cost of the stock mapping, which a caller
        can always fall back to; see :func:`padding_cost`).
    compat : bool
        Post the precomputed structural table of the dataflow edges (``COMPAT``) as a redundant
        propagation aid (default). Without it the model's edge constraints alone decide.

    Returns
    -------
    SolveResult
        ``status`` is ``"ok"`` with at least one solution, ``"infeasible"`` or ``"timeout"``.
    """
    if not portfolio:
        res = next(solve_batch([Problem(wl, instr, mode, solutions=solutions, timeout=timeout, search=search,
                                        bound=bound, bound_stride=bound_stride, commutative=commutative,
                                        optimise=optimise, disable=tuple(disable), max_cost=max_cost,
                                        compat=compat)]))
        if isinstance(res, Exception):
            raise res
        return res
    cons = _constraint_set(mode, disable)
    _check_minizinc()
    t_start = time.perf_counter()
    orders = portfolio_orders(wl, instr)
    workdir = tempfile.mkdtemp(prefix="csp_embed_")
    try:
        status, sols, stats, asset, runs = _solve_once(
            wl, instr, cons, search, timeout, workdir, "s0", [], orders, commutative, bound,
            bound_stride, jobs, optimise, solutions > 1, max_cost, compat)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return _result(wl, instr, cons, solutions, timeout, max_cost, status, sols, stats, asset or "default",
                   runs, t_start)


def _constraint_set(mode: Union[str, Sequence[str]], disable: Sequence[str] = ()) -> Tuple[str, ...]:
    if isinstance(mode, str) and mode not in CONSTRAINT_SETS:
        raise ValueError(f"unknown mode {mode!r}; use one of {sorted(CONSTRAINT_SETS)} or a constraint list")
    cons = CONSTRAINT_SETS[mode] if isinstance(mode, str) else tuple(mode)
    return tuple(c for c in cons if c not in disable)


def _check_minizinc() -> None:
    if shutil.which("minizinc") is None or shutil.which("fzn-gecode") is None:
        raise SolverError("the `minizinc` and `fzn-gecode` executables are not on PATH; install MiniZinc 2.6 "
                          "with Gecode (Debian: apt-get install minizinc)")


def _kept(sols: list, solutions: int) -> list:
    """The solutions a solve returns of those it printed (in order): the ``solutions`` cheapest
    distinct structures of an enumeration, or the last (best) of a branch and bound."""
    if solutions > 1:
        unique = {}
        for sol in sols:
            unique.setdefault(sol.key(), sol)
        return sorted(unique.values(), key=lambda x: (x.cost, x.key()))[:solutions]
    return sols[-1:]


def _result(wl: Workload, instr: InstructionGraph, cons: Sequence[str], solutions: int, timeout: float,
            max_cost: Optional[int], status: str, sols: List[RawSolution], stats: Dict[str, float],
            asset: str, runs: int, t_start: float, wall: Optional[float] = None, batch: int = 1
            ) -> SolveResult:
    """The :class:`SolveResult` of the solutions printed by one solve (in order): the ``solutions``
    cheapest distinct structures of an enumeration, or the last (best) of a branch and bound."""
    found = _kept(sols, solutions)
    total = SolveStats(0.0, stats.get("flatTime", 0.0), stats.get("solveTime", 0.0),
                       int(stats.get("nodes", 0)), int(stats.get("failures", 0)), asset, runs, batch)
    total.wall_seconds = time.perf_counter() - t_start if wall is None else wall
    for sol in found:
        sol.stats = SolveStats(total.wall_seconds, total.flatten_seconds, total.solve_seconds, total.nodes,
                               total.failures, total.asset, runs, batch)
    if status == "ok":
        msg = f"{len(found)} embedding(s) of {instr.name} into {wl.name} ({' '.join(cons)})"
    elif status == "timeout":
        msg = (f"no embedding found within {timeout:g} s ({instr.name} into {wl.name}, "
               f"constraints: {' '.join(cons)}); raise the timeout or relax the constraints")
    else:
        msg = (f"no embedding of {instr.name} into {wl.name} exists under the constraints "
               f"{' '.join(cons)}" + (f" at cost <= {max_cost}" if max_cost is not None else "")
               + "; try mode='relaxed' or enable padding")
    return SolveResult(status, found, total, msg)


def _solve_once(wl, instr, cons, search, timeout, workdir, tag, nogoods, orders, commutative, bound,
                bound_stride, jobs, optimise, enumerate_all=False, max_cost=None, compat=True):
    pending = list(enumerate(orders))
    running: List[_Run] = []
    best_fail = ("infeasible", {})
    n_runs = 0
    n_infeasible = 0
    t0 = time.perf_counter()
    try:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                i, order = pending.pop(0)
                left = timeout - (time.perf_counter() - t0)
                if left <= 0.05:
                    pending.clear()
                    if n_runs == 0:
                        best_fail = ("timeout", {})     # no time left to start a solver
                    break
                proc = _launch(wl, instr, cons, search, left, workdir, f"{tag}_a{i}", nogoods, order,
                               commutative, bound, bound_stride, optimise, enumerate_all, max_cost,
                               compat)
                n_runs += 1
                running.append(_Run(proc, order, _asset_name(wl, order) if len(orders) > 1 else "default",
                                    time.perf_counter()))
            if not running:
                break
            done = None
            while done is None:
                for r in running:
                    if r.proc.poll() is not None:
                        done = r
                        break
                else:
                    if len(running) == 1:
                        running[0].proc.wait()
                        done = running[0]
                    else:
                        time.sleep(0.005)
            running.remove(done)
            done.proc.wait()
            out, err = _outputs(done.proc)
            st, sols, stats = _parse(out, err, done.proc.returncode, wl, instr, done.order,
                                    done.proc.model_data)
            if sols:
                return st, sols, stats, done.asset, n_runs
            if st == "timeout":
                best_fail = ("timeout", stats)
            else:
                n_infeasible += 1
                if best_fail[0] != "timeout":
                    best_fail = ("infeasible", stats)
                # an asset is a reordering of the same problem: infeasible for one is infeasible for all
                pending.clear()
        return best_fail[0], [], best_fail[1], "", n_runs
    finally:
        for r in running:
            if r.proc.poll() is None:
                r.proc.kill()
            r.proc.wait()
            if not r.proc.out_file.closed:
                _outputs(r.proc)


# ------------------------------------------------------------------ batches
@dataclass(frozen=True)
class Problem:
    """One solve of :func:`solve_batch`: the arguments of :func:`solve` (without the portfolio).

    Attributes
    ----------
    wl : Workload
    instr : InstructionGraph
    mode : str or tuple of str
    solutions, timeout, search, bound, bound_stride, commutative, optimise, disable, max_cost, compat
        As in :func:`solve`.
    """

    wl: Workload
    instr: InstructionGraph
    mode: Union[str, Tuple[str, ...]] = "strict"
    solutions: int = 1
    timeout: float = 30.0
    search: str = "struct"
    bound: bool = False
    bound_stride: int = 1
    commutative: bool = True
    optimise: bool = True
    disable: Tuple[str, ...] = ()
    max_cost: Optional[int] = None
    compat: bool = True

    def __repr__(self) -> str:
        mode = self.mode if isinstance(self.mode, str) else "+".join(self.mode)
        return f"Problem({self.wl.name}, {self.instr.name}, {mode}, solutions={self.solutions})"


#: the model's variables a solution is read from (the scalar nodes follow from them), all arrays:
#: MiniZinc keeps an output array in the FlatZinc (fixed entries as constants) but moves a fixed
#: scalar to its output model, so the binding and the cost are read as the array ``OUT``
_OUTVARS = ("OUT", "bdim", "bstep", "pad", "o", "TP")


@dataclass
class _Job:
    problem: Problem
    cons: Tuple[str, ...]
    md: _ModelData
    entries: List[str]                   # the int_search entries of the search annotation


@dataclass
class _Flat:
    """One instance's FlatZinc, or the outcome of its flattening."""

    status: str                          # "ok" (fzn holds the instance), "infeasible" or "timeout"
    fzn: str = ""
    flatten_seconds: float = 0.0         # MiniZinc's flatTime (its share of a batch's)
    wall: float = 0.0                    # wall seconds of the flattening (its share of a batch's)
    done: float = 0.0                    # perf_counter at the end of the flattening
    batch: int = 1                       # instances flattened in the same MiniZinc process


def _job(p: Problem) -> _Job:
    cons = _constraint_set(p.mode, p.disable)
    md = _model_data(p.wl, p.instr, cons, commutative=p.commutative, bound=p.bound,
                     bound_stride=p.bound_stride, compat=p.compat, max_cost=p.max_cost)
    return _Job(p, cons, md, _search_entries(p.instr, p.search, md, "iso" in cons))


@functools.lru_cache(maxsize=4)
def _model_parts(text: str) -> Tuple[Tuple[str, ...], str, "re.Pattern[str]"]:
    """The model's include items, its other items (comments dropped) and a pattern matching every
    name it declares (parameters, variables, the ``node`` function), for :func:`_renamed`."""
    body = re.sub(r"%[^\n]*", "", text)
    include = re.compile(r'^\s*include\s+"[^"]+"\s*;', re.M)
    includes = tuple(m.group(0).strip() for m in include.finditer(body))
    body = include.sub("", body)
    names = (set(re.findall(r":\s*([A-Za-z_]\w*)\s*[;=]", body))
             | set(re.findall(r"\bfunction\b[^:]*:\s*([A-Za-z_]\w*)\s*\(", body)))
    return includes, body, re.compile(r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b")


def _renamed(text: str, prefix: str, pattern: "re.Pattern[str]") -> str:
    return pattern.sub(lambda m: prefix + m.group(1), text)


def _combined(jobs: Sequence[_Job]) -> Tuple[str, str]:
    """One MiniZinc model and its data holding every job as an independent instance: the model's
    names carry the prefix ``i<k>_`` in instance k. A single job keeps its own objective; several
    are flattened under one ``satisfy`` whose search annotation lists every instance's entries
    in order (:func:`_split` hands each instance its own back)."""
    includes, body, pattern = _model_parts(MODEL.read_text())
    mzn, dzn, entries, out = list(includes), [], [], []
    for k, job in enumerate(jobs):
        p = f"i{k}_"
        mzn.append(_renamed(body, p, pattern))
        if job.problem.max_cost is not None:
            mzn.append(_renamed(f"constraint cost <= {int(job.problem.max_cost)};", p, pattern))
        # (equated, not defined as [bind, cost]: MiniZinc would output those two scalars instead)
        mzn.append(f"array[1..2] of var int: {p}OUT; constraint {p}OUT[1] = {p}bind; "
                   f"constraint {p}OUT[2] = {p}cost;")
        dzn.append(_renamed(job.md.dzn, p, pattern))
        entries += [_renamed(e, p, pattern) for e in job.entries]
        out += [f"show({p}{v})" for v in _OUTVARS]
    goal = "satisfy"
    if len(jobs) == 1 and _branch_and_bound(jobs[0].problem):
        goal = "minimize i0_cost"
    mzn.append(f"solve :: seq_search([{', '.join(entries)}]) {goal};")
    mzn.append(f"output [{', '.join(out)}];")
    return "\n".join(mzn) + "\n", "\n".join(dzn)


def _branch_and_bound(p: Problem) -> bool:
    return p.optimise and p.solutions <= 1


def _stats(text: str) -> Dict[str, float]:
    """MiniZinc's and Gecode's statistics (``-s``) in ``text``."""
    stats: Dict[str, float] = {}
    for m in re.finditer(r"%%%mzn-stat: (\w+)=(\S+)", text):
        try:
            stats[m.group(1)] = float(m.group(2))
        except ValueError:
            pass
    return stats


def _flatten(jobs: Sequence[_Job], workdir: str, tag: str, timeout: float) -> Optional[List[_Flat]]:
    """Flatten the jobs in one MiniZinc process (``minizinc -c``): one :class:`_Flat` per job, or
    None if several jobs cannot be told apart in the result (the caller flattens them one by one).

    Raises
    ------
    SolverError
        If MiniZinc fails on a single job.
    """
    t0 = time.perf_counter()
    mzn, dzn = _combined(jobs)
    base = Path(workdir) / tag
    Path(f"{base}.mzn").write_text(mzn)
    Path(f"{base}.dzn").write_text(dzn)
    cmd = ["minizinc", "--solver", "gecode", "-c", "-s", f"{base}.mzn", f"{base}.dzn",
           "-o", f"{base}.fzn", "--no-output-ozn"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 0.05))
    except subprocess.TimeoutExpired:
        done = time.perf_counter()
        wall = (done - t0) / len(jobs)
        return [_Flat("timeout", flatten_seconds=wall, wall=wall, done=done) for _ in jobs]
    done = time.perf_counter()
    wall = (done - t0) / len(jobs)
    secs = _stats(proc.stdout).get("flatTime", done - t0) / len(jobs)
    if "=====UNSATISFIABLE=====" in proc.stdout:
        if len(jobs) > 1:
            return None
        return [_Flat("infeasible", flatten_seconds=secs, wall=wall, done=done)]
    if proc.returncode != 0:
        if len(jobs) > 1:
            return None
        raise SolverError(f"minizinc failed (exit {proc.returncode}) on {jobs[0].problem.wl.name}: "
                          f"{proc.stderr.strip()[-2000:]}")
    fzn = Path(f"{base}.fzn").read_text()
    if len(jobs) == 1:
        return [_Flat("ok", fzn, secs, wall, done)]
    parts = _split(fzn, [len(j.entries) for j in jobs], [_branch_and_bound(j.problem) for j in jobs], workdir)
    if parts is None:
        return None
    return [_Flat("ok", text, secs, wall, done, len(jobs)) for text in parts]


#: the names of variables and parameters in the FlatZinc of :func:`_combined`: the model's (with
#: their instance's prefix) and MiniZinc's own (no FlatZinc keyword or predicate name holds
#: either; a declared name must match in full)
_NAME = re.compile(r"i\d+_\w+|X_INTRODUCED_\d+_")
_PREFIX = re.compile(r"i(\d+)_")
_FIXED_VAR = re.compile(r"var (?:(-?\d+)\.\.\1: \w+[^=]*(?:= *-?\d+)?|bool: \w+[^=]*= *(?:true|false));$")


#: a constraint's annotation naming the variable it defines
_DEFINES = re.compile(r"defines_var\((\w+)\)")
#: the definition of a two-entry array (``= [bind, cost]``)
_OUT_ARRAY = re.compile(r"=\s*\[\s*([\w-]+)\s*,\s*([\w-]+)\s*\]\s*;$")
#: a FlatZinc declaration up to its name (``var 1..4: x``, ``array [1..8] of var int: x``)
_DECL = re.compile(r"[^:]*:\s*(\w+)")


def _satisfiable(fzn: str, workdir: str) -> bool:
    path = Path(workdir) / "constant.fzn"
    path.write_text(fzn)
    proc = subprocess.run(["fzn-gecode", str(path)], capture_output=True, text=True, timeout=60)
    return proc.returncode == 0 and "----------" in proc.stdout


def _split(fzn: str, n_entries: Sequence[int], bnb: Sequence[bool], workdir: str) -> Optional[List[str]]:
    """Cut the FlatZinc of several independent instances (:func:`_combined`) into one FlatZinc per
    instance: its variables are those connected through constraints and array definitions to the
    names of its prefix; parameter arrays go to every instance that reads them; its search
    annotation is its own entries of the combined one, and its goal its own. A variable whose
    value follows from parameters alone (MiniZinc's common subexpression elimination may share it
    between instances) goes, like a parameter, with its definition to every instance that reads
    it. What else is linked to no instance's names (fixed variables, constraints on constants) is
    checked once and dropped. None if something is linked to two instances, or what is linked to
    none fails."""
    K = len(n_entries)
    preds, body, solve_line = [], [], None
    for ln in fzn.split("\n"):
        if not ln:
            continue
        if ln.startswith("predicate"):
            preds.append(ln)
        elif ln.startswith("solve"):
            solve_line = ln
        else:
            body.append(ln)
    if solve_line is None:
        return None
    var: Dict[str, int] = {}                # variable -> id
    par: Dict[str, int] = {}                # parameter -> its line
    alone: List[bool] = []                  # per line: a variable's declaration naming no other
    lines: Dict[str, int] = {}              # declaration -> its line
    for i, ln in enumerate(body):
        if ln.startswith("constraint"):
            alone.append(False)
            continue
        m = _DECL.match(ln)
        if m is None or not _NAME.fullmatch(m.group(1)):
            return None                     # a name this cut does not know
        lines[m.group(1)] = i
        if ln.startswith("var "):
            var[m.group(1)] = len(var)
            alone.append("=" not in ln)
        elif ln.startswith("array") and " of var " in m.group(0):
            var[m.group(1)] = len(var)
            alone.append(False)
        else:
            par[m.group(1)] = i
            alone.append(False)
    # a variable MiniZinc defines from parameters alone (an element of a parameter array at a
    # constant index, left unevaluated) is one value; common subexpression elimination shares it
    # between instances that hold the same expression. It belongs to none: like a parameter, each
    # instance that reads it gets it, with its definition
    # (so is one assigned constants, or such variables, in its declaration)
    findall = _NAME.findall
    names = [findall(ln) for ln in body]    # per line: the names it holds
    shared: Dict[str, Optional[int]] = {}   # such a variable -> the line of its definition
    maybe = []                              # (line, variable): a definition or an assignment
    for i, ln in enumerate(body):
        if ln.startswith("constraint"):
            m = _DEFINES.search(ln) if "defines_var" in ln else None
        else:
            m = _DECL.match(ln) if "=" in ln else None
        if m and m.group(1) in var and not _PREFIX.match(m.group(1)):
            maybe.append((i, m.group(1)))
    while maybe:
        known = len(shared)
        for i, name in maybe:
            if name not in shared and all(n == name or n in par or n in shared for n in names[i]):
                shared[name] = i if body[i].startswith("constraint") else None
        if len(shared) == known:
            break
    if shared:
        skip = {i for i in shared.values() if i is not None} | {lines[n] for n in shared}
        for n in shared:
            par[n] = lines[n]
        var = {n: x for x, n in enumerate(n for n in var if n not in shared)}
    else:
        skip = set()
    parent = list(range(len(var)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    get = var.get
    first = []                              # per line: the id of its first variable, or -1
    for i, (ln, single) in enumerate(zip(body, alone)):
        if i in skip:
            first.append(-1)
            continue
        if single:
            first.append(var[_DECL.match(ln).group(1)])
            continue
        ids = [x for x in map(get, names[i]) if x is not None]
        if not ids:
            first.append(-1)
            continue
        first.append(ids[0])
        if len(ids) > 1:
            r = find(ids[0])
            for x in ids[1:]:
                rx = find(x)
                if rx != r:
                    parent[rx] = r
    owner: Dict[int, int] = {}
    for name, x in var.items():
        m = _PREFIX.match(name)
        if m:
            root, k = find(x), int(m.group(1))
            if owner.setdefault(root, k) != k:
                return None
    parts: List[List[str]] = [[] for _ in range(K)]
    detached: List[str] = []                # in no instance: checked once (below)
    for i, (ln, x) in enumerate(zip(body, first)):
        if i in skip:
            continue
        if x < 0:
            if ln.startswith("constraint"):
                detached.append(ln)         # on parameters alone
            continue                        # a parameter: copied where it is read
        k = owner.get(find(x))
        if k is None:
            if not _FIXED_VAR.match(ln):    # (a fixed variable nothing reads needs no check)
                detached.append(ln)         # a variable, or its constraint, linked to no instance
            continue
        parts[k].append(ln)

    def pars(lines: List[str]) -> List[str]:
        """The declarations of the parameters (and shared variables) ``lines`` read, with what
        those read in turn."""
        used, todo = set(), set(findall("\n".join(lines))) & par.keys()
        while todo:
            used |= todo
            more = "\n".join(body[par[p]] for p in todo)
            more += "".join("\n" + body[shared[p]] for p in todo if shared.get(p) is not None)
            todo = (set(findall(more)) & par.keys()) - used
        # the parameters first, then the shared variables (FlatZinc declares them in that order)
        return [body[par[p]] for p in sorted(used, key=lambda p: (p in shared, par[p]))]

    def definitions(lines: List[str]) -> List[str]:
        """The defining constraints of the shared variables ``lines`` (an instance's lines with
        their :func:`pars`) read."""
        if not shared:
            return []
        names = set(findall("\n".join(lines)))
        return [body[shared[n]] for n in sorted((n for n in names & shared.keys()
                                                  if shared[n] is not None), key=shared.get)]
    # the search annotation: a seq_search of every instance's entries, in instance order
    m = re.match(r"solve\s*::\s*seq_search\(\[(.*)\]\)\s*satisfy;$", solve_line)
    if m is None:
        return None
    entries, depth, start, text = [], 0, 0, m.group(1)
    for i, c in enumerate(text):
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "," and depth == 0:
            entries.append(text[start:i])
            start = i + 1
    entries.append(text[start:])
    if len(entries) != sum(n_entries):
        return None
    if detached:
        # variables and constraints linked to no instance's names (constants MiniZinc left as
        # variables, constraints on parameters): they share no variable with any instance, so
        # if they are satisfiable they change no instance's solutions (beyond repeating them, as
        # in a solve of its own); if not, they fail some instance, which cannot be told: then the
        # caller flattens the instances one by one
        if not _satisfiable("\n".join(preds + pars(detached) + detached + ["solve satisfy;"]) + "\n",
                            workdir):
            return None
    out, at = [], 0
    for k in range(K):
        mine = entries[at:at + n_entries[k]]
        at += n_entries[k]
        head = pars(parts[k] + mine)     # (a search entry may name a fixed array)
        defined = definitions(head + parts[k] + mine)
        goal = "satisfy"
        if bnb[k]:
            # the cost is OUT's second entry: a variable, or a constant if flattening fixed it
            m = _OUT_ARRAY.search(body[lines[f"i{k}_OUT"]]) if f"i{k}_OUT" in lines else None
            if m is None:
                return None
            cost = m.group(2)
            if cost not in var:
                if not re.fullmatch(r"-?\d+", cost):
                    return None
                head.append(f"var {cost}..{cost}: i{k}_objective;")
                cost = f"i{k}_objective"
            goal = f"minimize {cost}"
        out.append("\n".join(preds + head + parts[k] + defined
                             + [f"solve :: seq_search([{','.join(mine)}]) {goal};"]) + "\n")
    return out


_VALUE = re.compile(r"^(\w+) = ([^;]*);", re.M)


def _value(text: str) -> List[int]:
    """The integers of a printed FlatZinc value (an array's after its index sets)."""
    return _ints(text[text.index("["):] if "[" in text else text)


@dataclass
class _Printed:
    """One solution as fzn-gecode printed it: its structure read, the rest left as text."""

    cost: int
    structure: Tuple
    values: Dict[str, str]

    def key(self) -> Tuple:
        return self.structure


def _search(job: _Job, flat: _Flat, k: int, workdir: str, tag: str, t_start: float) -> SolveResult:
    """Run Gecode (``fzn-gecode``) on one instance's FlatZinc and read its solutions. The time limit
    counts from ``t_start`` (the start of the flattening); the result's wall time is the
    flattening's (share) plus the search's."""
    p = job.problem
    t_search = time.perf_counter()
    order = tuple(range(len(p.wl.dims)))
    if flat.status != "ok":
        return _result(p.wl, p.instr, job.cons, p.solutions, p.timeout, p.max_cost, flat.status, [],
                       {"flatTime": flat.flatten_seconds}, "default", 1, t_start)
    left = p.timeout - (flat.done - t_start)
    if left <= 0.05:
        return _result(p.wl, p.instr, job.cons, p.solutions, p.timeout, p.max_cost, "timeout", [],
                       {"flatTime": flat.flatten_seconds}, "default", 1, t_start)
    path = Path(workdir) / f"{tag}.fzn"
    path.write_text(flat.fzn)
    pre = f"i{k}_"

    def value(values: Dict[str, str], v: str) -> List[int]:
        if pre + v in values:
            return _value(values[pre + v])
        raise SolverError(f"fzn-gecode printed no value of {v} on {p.wl.name}")

    def read(text: str) -> List[_Printed]:
        """The structure of every printed solution (the scalar nodes are decoded for the kept)."""
        printed = []
        for block in text.split("----------")[:-1]:
            values = dict(_VALUE.findall(block))
            bind, cost = value(values, "OUT")
            printed.append(_Printed(cost, (bind, tuple(order[x - 1] for x in value(values, "bdim")),
                                           tuple(value(values, "bstep"))), values))
        return printed

    rc, err, text = 0, "", ""
    runs_stats: Dict[str, float] = {}           # the first look's, when the enumeration ran again
    if p.solutions > 1:
        # a first look: the first FIRST_LOOK solutions of the enumeration. If that is all, it is
        # the enumeration; else the N best of every solution cost no more than the N-th cheapest
        # of these, so the enumeration runs again under that bound (a constraint appended to the
        # FlatZinc: the same tree, pruned) and keeps the same N (_kept orders by cost and
        # structure, not by the order found)
        rc, err, text = _gecode(path, ["-n", str(FIRST_LOOK * p.solutions)], left, workdir, tag)
        printed = read(text)
        if "==========" not in text and "=====UNSATISFIABLE=====" not in text:
            runs_stats = _stats(text)
            costs = sorted({x.key(): x.cost for x in printed}.values())
            bound = costs[p.solutions - 1] if len(costs) >= p.solutions else None
            cost_var = _cost_var(flat.fzn, pre)
            search = path
            if bound is not None and cost_var is not None and (p.max_cost is None or bound < p.max_cost):
                search = Path(workdir) / f"{tag}_bounded.fzn"
                head, solve_item = flat.fzn.rstrip("\n").rsplit("\n", 1)
                search.write_text(f"{head}\nconstraint int_le({cost_var},{bound});\n{solve_item}\n")
            left = p.timeout - (time.perf_counter() - t_start)
            if left <= 0.05:
                text = ""                       # a timeout (below)
            else:
                rc, err, text = _gecode(search, ["-a"], left, workdir, tag)
    else:
        rc, err, text = _gecode(path, [], left, workdir, tag)
    stats = _stats(text)
    if runs_stats and text:
        stats["solveTime"] = stats.get("solveTime", 0.0) + runs_stats.get("solveTime", 0.0)
    stats["flatTime"] = flat.flatten_seconds
    complete = "==========" in text
    printed = read(text)
    sols = []
    for x in _kept(printed, p.solutions):
        bind, cost = value(x.values, "OUT")
        sols.append(_raw_solution(p.wl, p.instr, order, job.md, bind, value(x.values, "bdim"),
                                  value(x.values, "bstep"), value(x.values, "pad"), cost, value(x.values, "o"),
                                  value(x.values, "TP"), complete))
    status = "ok"
    if not sols:
        if "=====UNSATISFIABLE=====" in text:
            status = "infeasible"
        elif rc != 0 and "UNKNOWN" not in text:
            raise SolverError(f"fzn-gecode failed (exit {rc}) on {p.wl.name}: {err.strip()[-2000:]}")
        else:
            status = "timeout"
    return _result(p.wl, p.instr, job.cons, p.solutions, p.timeout, p.max_cost, status, sols, stats,
                   "default", 1, t_start, flat.wall + time.perf_counter() - t_search, flat.batch)


#: an enumeration first looks at this many solutions per solution asked for (:func:`_search`)
FIRST_LOOK = 3


def _gecode(path: Path, args: Sequence[str], left: float, workdir: str, tag: str
            ) -> Tuple[int, str, str]:
    """Run ``fzn-gecode`` on the FlatZinc at ``path`` with ``args`` within ``left`` seconds:
    ``(exit status, standard error, its output)``."""
    # commit distance 1: Gecode copies every search node instead of recomputing it from a copy up
    # to 8 levels up; the same tree in the same order, but propagation (nvalue) is not redone:
    # 30-40 % less search time on the thin-channel enumerations
    cmd = ["fzn-gecode", "-s", "-c-d", "1", "-t", str(max(1, int(left * 1000))), *args, str(path)]
    # output to a file: an enumeration prints more than a pipe buffer holds
    with open(Path(workdir) / f"{tag}.out", "w+") as out:
        try:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True, timeout=left + 5.0)
            rc, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            rc, err = 0, ""
        out.seek(0)
        return rc, err, out.read()


def _cost_var(fzn: str, pre: str) -> Optional[str]:
    """The FlatZinc variable of the instance's cost (the second entry of its ``OUT`` array), or
    None when flattening fixed the cost."""
    m = re.search(rf"\b{pre}OUT\b[^\n]*", fzn)
    out = _OUT_ARRAY.search(m.group(0)) if m else None
    if out is None or re.fullmatch(r"-?\d+", out.group(2)):
        return None
    return out.group(2)


def solve_batch(problems: Sequence[Problem], searches: Optional[Executor] = None
                ) -> Iterator[Union[SolveResult, Exception]]:
    """Solve several problems with one MiniZinc flattening: their results, in order, as each is
    done (a problem that fails yields its exception, a :class:`SolverError` or ``ValueError``).

    MiniZinc's start (its library parse, about 0.06 s of CPU, more than the flattening of one
    instance) is paid once per batch: the instances are flattened together as one model whose
    names carry a per-instance prefix (``minizinc -c``), the FlatZinc is cut back into one
    instance each (the instances share no variable), and Gecode (``fzn-gecode``) searches each with
    its own search annotation and goal, as :func:`solve` does: the same solutions in the same
    order (the search is complete and branches on the same variables in the same order). When the
    batch cannot be cut apart (a flattening that fails, or finds an instance infeasible) the
    problems are flattened one by one. ``flatten_seconds`` of a batched result is its share of the
    batch's flattening.

    With ``searches`` (an executor), the searches of a flattened batch run on it concurrently;
    the results are still yielded in order.
    """
    _check_minizinc()
    t_start = time.perf_counter()
    jobs: List[Union[_Job, Exception]] = []
    for p in problems:
        try:
            jobs.append(_job(p))
        except ValueError as e:
            jobs.append(e)
    valid = [j for j in jobs if isinstance(j, _Job)]
    workdir = tempfile.mkdtemp(prefix="csp_embed_")
    pending: Dict[int, Future] = {}
    try:
        flats = None
        if len(valid) > 1:
            flats = _flatten(valid, workdir, "batch", max(j.problem.timeout for j in valid))
        if flats is not None and searches is not None:
            n = 0
            for i, job in enumerate(jobs):
                if not isinstance(job, Exception):
                    pending[i] = searches.submit(_search, job, flats[n], n, workdir, f"s{i}", t_start)
                    n += 1
        n = 0
        for i, job in enumerate(jobs):
            if isinstance(job, Exception):
                yield job
                continue
            try:
                if i in pending:
                    yield pending[i].result()
                elif flats is not None:
                    yield _search(job, flats[n], n, workdir, f"s{i}", t_start)
                else:
                    t_job = time.perf_counter()
                    flat = _flatten([job], workdir, f"s{i}", job.problem.timeout)[0]
                    yield _search(job, flat, 0, workdir, f"s{i}", t_job)
            except SolverError as e:
                yield e
            n += 1
    finally:
        if pending:     # the searches read the batch's files: let them end first
            futures_wait(list(pending.values()))
        shutil.rmtree(workdir, ignore_errors=True)
