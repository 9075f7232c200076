"""Independent proofs of an embedding, separate from the MiniZinc model.

* :func:`check_scalar` re-checks a solution at scalar level against the islpy relations of
  the (padded) operator: every instruction node lies in the instance set with the right
  statement label, every instruction edge (multiply -> add, data -> multiply, add -> output,
  reduction chain, spatial star) maps onto an operator edge, and the nodes are distinct.
  It also checks that the solver's scalar node values equal the ones implied by the
  decoded mapping.
* :func:`execute` is a numpy executor: it applies the relayout plan to the tensors, runs the
  implied sequence of blocked instruction calls, unpacks the output and crops padding.
  :func:`check_numeric` compares it with the directly computed operator.
* :func:`check_instruction` ties an instruction graph to :mod:`vta_ext`: one GEMM on the
  functional simulator must compute what the graph says.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .embedding import Embedding, TensorRelayout
from .instructions import InstructionGraph
from .solve import RawSolution
from .workload import STMT_ADD, STMT_MUL, Workload

__all__ = ["ProofError", "ScalarReport", "check_scalar", "check_raw", "apply_relayout", "execute", "check_numeric",
           "node_points", "check_instruction"]


class ProofError(AssertionError):
    """An embedding failed an independent check; the message names the check and a witness."""


@dataclass
class ScalarReport:
    """Outcome of :func:`check_scalar`: checked edge counts by label."""

    workload: str
    checked: Dict[str, int] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"ScalarReport({self.workload}: " + ", ".join(f"{k}={v}" for k, v in self.checked.items()) + ")"


def node_points(emb: Embedding) -> List[Tuple[int, ...]]:
    """Loop coordinates of every multiply node of the origin call, from the decoded mapping."""
    wl, instr = emb.workload, emb.instruction
    pts = []
    for q in instr.mult_nodes():
        p = [0] * len(wl.dims)
        for a, am in enumerate(emb.axes):
            rem = q[a]
            for f in reversed(am.factors):  # innermost factor varies fastest
                digit = rem % f.size
                rem //= f.size
                p[wl.dims.index(f.dim)] += digit * f.stride
        pts.append(tuple(p))
    return pts


def _S(p: Sequence[int], t: int) -> str:
    return "S[" + ", ".join(str(int(v)) for v in p) + f", {t}]"


def _T(name: str, c: Sequence[int]) -> str:
    return f"{name}[" + ", ".join(str(int(v)) for v in c) + "]"


def check_scalar(emb: Embedding) -> ScalarReport:
    """Re-check an embedding against the islpy model of the padded operator.

    Checks that the solver's multiply nodes are the points the decoded mapping implies,
    then runs :func:`check_raw`.

    Raises
    ------
    ProofError
        Naming the failed check.
    """
    raw = emb.raw
    pts = node_points(emb)
    if [tuple(x) for x in raw.p] != pts:
        bad = next(i for i, (a, b) in enumerate(zip(raw.p, pts)) if tuple(a) != b)
        raise ProofError(f"solver node {bad} at {raw.p[bad]} but the decoded mapping puts it at {pts[bad]}")
    return check_raw(raw, emb.workload, emb.instruction)


def check_raw(raw: RawSolution, wl: Workload, instr: InstructionGraph) -> ScalarReport:
    """Re-check a solver solution (scalar node values) against the islpy relations.

    Works for any solution, including non-rectangular ones (``rect`` switched off): every
    instruction node must lie in the instance set of the padded operator with its statement
    label (multiply 0, add 1); every edge multiply -> add, data -> multiply, add -> output,
    reduction chain and spatial star must be an operator edge; nodes must be distinct.

    Raises
    ------
    ProofError
        Naming the failed check and a witness.
    """
    import islpy as isl
    order = (0, 1, 2) if raw.binding == 1 else (1, 0, 2)
    binding = {op: wl.tensors[i].name for op, i in zip("ABC", order)}
    pw = wl.padded(dict(zip(wl.dims, raw.pad)))
    P = pw.polyhedral
    rep = ScalarReport(wl.name)
    pts = [tuple(int(v) for v in x) for x in raw.p]
    nodes = instr.mult_nodes()
    if len(pts) != len(nodes):
        raise ProofError(f"{len(pts)} multiply nodes, the instruction has {len(nodes)}")
    for t, lab in ((STMT_MUL, "mul nodes"), (STMT_ADD, "add nodes")):
        s = isl.Set("{ " + "; ".join(_S(p, t) for p in pts) + " }")
        if not s.is_subset(P.instance_set):
            raise ProofError(f"{lab}: some node is outside the instance set {P.instance_set}")
        rep.checked[lab] = len(pts)
    if len(set(pts)) != len(pts):
        raise ProofError("allDiff: two multiply nodes map to the same operator instance")

    def edges_in(pairs: List[Tuple[str, str]], rel, label: str):
        if not pairs:
            rep.checked[label] = 0
            return
        m = isl.Map("{ " + "; ".join(f"{a} -> {b}" for a, b in pairs) + " }")
        if not m.is_subset(rel):
            for a, b in pairs:
                if not isl.Map(f"{{ {a} -> {b} }}").is_subset(rel):
                    raise ProofError(f"edge {label}: {a} -> {b} is not an operator edge")
        rep.checked[label] = len(pairs)
    edges_in([(_S(p, STMT_MUL), _S(p, STMT_ADD)) for p in pts], P.mul_to_add, "mul->add")
    for op in "ABC":
        tname = binding[op]
        vals = raw.data_nodes[op]
        if len(set(vals)) != len(vals):
            raise ProofError(f"allDiff: two data nodes of operand {op} map to the same element of {tname}")
        onodes = instr.operand_nodes(op)
        pairs = []
        for q, p in zip(nodes, pts):
            c = vals[onodes.index(instr.operand_node_of(op, q))]
            pairs.append((_S(p, STMT_ADD if op == "C" else STMT_MUL), _T(tname, c)))
        edges_in(pairs, P.access[tname], f"{op}<->{'add' if op == 'C' else 'mul'}")
        tset = isl.Set("{ " + "; ".join(_T(tname, c) for c in vals) + " }")
        if not tset.is_subset(P.tensor_sets[tname]):
            raise ProofError(f"data nodes of {op} lie outside tensor {tname}")
    idx = {q: i for i, q in enumerate(nodes)}
    ed = instr.edges()
    edges_in([(_S(pts[idx[a]], STMT_ADD), _S(pts[idx[b]], STMT_ADD)) for a, b in ed["chain"]],
             P.reduction_pairs, "chain")
    edges_in([(_S(pts[idx[a]], STMT_MUL), _S(pts[idx[b]], STMT_MUL)) for a, b in ed["spatial"]],
             P.spatial, "spatial")
    return rep


# ---------------------------------------------------------------------- numpy executor
def apply_relayout(arr: np.ndarray, plan: TensorRelayout, wl: Workload, ext: Sequence[int]) -> np.ndarray:
    """Apply a relayout plan (pad, unroll, split, transpose, fuse) to a tensor."""
    t = next(x for x in wl.tensors if x.name == plan.tensor)
    labels: List[Tuple[str, int]] = [("t", e) for e in range(t.rank)]
    for st in plan.steps:
        a = st.args
        if st.kind == "pad":
            arr = np.pad(arr, a["pad"])
        elif st.kind == "unroll":
            pos = labels.index(("t", a["dim"]))
            loops = a["loops"]
            grids = np.meshgrid(*[np.arange(ext[d]) for d in loops], indexing="ij")
            idx = a["const"] + sum(c * g for c, g in zip(a["coef"], grids))
            arr = np.take(arr, idx, axis=pos)
            labels[pos:pos + 1] = [("i", d) for d in loops]
        elif st.kind == "split":
            d = wl.dims.index(a["dim"])
            if ("i", d) in labels:
                pos = labels.index(("i", d))
            else:
                pos = next(i for i, l in enumerate(labels) if l[0] == "t" and t.loop_dims_of(l[1]) == (d,))
            tiles, size, stride = a["into"]
            arr = arr.reshape(arr.shape[:pos] + (tiles, size, stride) + arr.shape[pos + 1:])
            labels[pos:pos + 1] = [("tile", d), ("digit", d), ("sub", d)]
        elif st.kind == "transpose":
            arr = np.transpose(arr, a["perm"])
            labels = [labels[i] for i in a["perm"]]
        elif st.kind == "fuse":
            arr = arr.reshape(a["shape"])
        else:
            raise ValueError(f"unknown relayout step {st.kind}")
    return arr


def _call_grid(emb: Embedding) -> Dict[Tuple[str, int], np.ndarray]:
    wl = emb.workload
    ext = [emb.padded_extents[d] for d in wl.dims]
    walked = emb.walked
    names, ranges = [], []
    for d, dn in enumerate(wl.dims):
        if dn in walked:
            f = walked[dn]
            names += [("tile", d), ("sub", d)]
            ranges += [ext[d] // (f.size * f.stride), f.stride]
        else:
            names.append(("i", d))
            ranges.append(ext[d])
    grids = np.meshgrid(*[np.arange(r) for r in ranges], indexing="ij")
    g = {n: x.ravel() for n, x in zip(names, grids)}
    for d, dn in enumerate(wl.dims):  # call origin per loop dim
        if dn in walked:
            f = walked[dn]
            g[("base", d)] = g[("tile", d)] * f.size * f.stride + g[("sub", d)]
        else:
            g[("base", d)] = g[("i", d)]
    return g


def _free_index(plan: TensorRelayout, wl: Workload, grid) -> Tuple[np.ndarray, ...]:
    t = next(x for x in wl.tensors if x.name == plan.tensor)
    idx = []
    for lab in plan.packed_labels:
        if lab[0] == "axis":
            continue
        if lab[0] == "t":
            e = lab[1]
            v = t.const[e] + sum(c * grid[("base", d)] for d, c in enumerate(t.coef[e]) if c)
            idx.append(np.asarray(v) + np.zeros_like(grid[("base", 0)]))
        elif lab[0] == "i":
            idx.append(grid[("i", lab[1])])
        else:
            idx.append(grid[lab])
    return tuple(idx)


def execute(emb: Embedding, in0: np.ndarray, in1: np.ndarray) -> np.ndarray:
    """Run the embedding: relayout, blocked instruction calls, unpack (numpy, int64).

    Parameters
    ----------
    in0, in1 : numpy.ndarray
        The operator's input tensors (``workload.inputs`` order).

    Returns
    -------
    numpy.ndarray
        The output tensor (original shape).
    """
    wl, instr = emb.workload, emb.instruction
    ext = [emb.padded_extents[d] for d in wl.dims]
    arrays = {wl.inputs[0].name: in0.astype(np.int64), wl.inputs[1].name: in1.astype(np.int64)}
    packed = {}
    for op in "AB":
        name = emb.binding[op]
        packed[op] = apply_relayout(arrays[name], emb.relayout[name], wl, ext)
    cplan = emb.relayout[emb.binding["C"]]
    out_t = wl.output
    cpacked = np.zeros(cplan.packed_shape, dtype=np.int64)
    grid = _call_grid(emb)
    ncalls = len(grid[("base", 0)])
    if ncalls != emb.instruction_count:
        raise ProofError(f"call grid has {ncalls} calls, the embedding claims {emb.instruction_count}")
    tiles = {op: packed[op][_free_index(emb.relayout[emb.binding[op]], wl, grid)] for op in "AB"}
    contrib = np.einsum(instr.einsum(), tiles["A"], tiles["B"])
    np.add.at(cpacked, _free_index(cplan, wl, grid), contrib)
    # unpack: the same plan applied to (1 + flat index) of the output; padding becomes 0
    n_out = math.prod(out_t.shape)
    idx = apply_relayout(np.arange(1, n_out + 1).reshape(out_t.shape), cplan, wl, ext).ravel()
    keep = idx > 0
    if np.count_nonzero(keep) != n_out or len(np.unique(idx[keep])) != n_out:
        raise ProofError("output relayout does not hold every output element exactly once")
    out = np.zeros(n_out, dtype=np.int64)
    out[idx[keep] - 1] = cpacked.ravel()[keep]
    return out.reshape(out_t.shape)


def check_numeric(emb: Embedding, seed: int = 0, in0: Optional[np.ndarray] = None,
                  in1: Optional[np.ndarray] = None) -> np.ndarray:
    """Execute the embedding on random int8 data and compare with the direct operator.

    Returns the executed output. Raises :class:`ProofError` on a mismatch.
    """
    wl = emb.workload
    rng = np.random.default_rng(seed)
    if in0 is None:
        in0 = rng.integers(-128, 128, size=wl.inputs[0].shape, dtype=np.int64)
    if in1 is None:
        in1 = rng.integers(-128, 128, size=wl.inputs[1].shape, dtype=np.int64)
    got = execute(emb, in0, in1)
    ref = wl.reference(in0, in1)
    if got.shape != ref.shape or not np.array_equal(got, ref):
        bad = np.argwhere(got != ref)
        raise ProofError(f"numpy execution of {emb!r} differs from the operator at {len(bad)} elements, "
                         f"first {tuple(bad[0]) if len(bad) else 'shape'}")
    return got


# ---------------------------------------------------------------------- the instruction itself
def check_instruction(instr: InstructionGraph, cfg, seed: int = 0) -> np.ndarray:
    """Check an instruction graph against the accelerator's own semantics (:mod:`vta_ext`).

    Runs one VTA GEMM on the functional simulator: random int8 tiles are written in the lane
    order of the input and weight scratchpads (:func:`vta_ext.memory.scratchpad`), the accumulator
    is reset, one GEMM micro-op runs and the accumulator is stored (the store keeps the low byte of
    every lane). The graph's operands are those same bytes read as arrays over their
    ``operand_axes`` (row-major), and its einsum must give the stored tile. A graph whose operand
    axes disagree with the hardware (e.g. B declared ``(z, y)``, not transposed) fails.

    Returns the stored tile.

    Raises
    ------
    ProofError
        If the graph is not a GEMM, its operand sizes differ from the scratchpad lanes, or its
        einsum differs from the simulator.
    """
    from vta_ext.isa import MemType, Stage
    from vta_ext.memory import scratchpad
    from vta_ext.runtime import CommandQueue, UopKernel

    if instr.kind != "gemm":
        raise ProofError(f"{instr.name}: only GEMM graphs can be checked against the VTA GEMM")
    sizes = dict(zip(instr.axes, instr.sizes))
    lanes = {"A": scratchpad(cfg, MemType.INP).lane_shape, "B": scratchpad(cfg, MemType.WGT).lane_shape,
             "C": scratchpad(cfg, MemType.ACC).lane_shape}
    shapes = {op: tuple(sizes[a] for a in instr.operand_axes[op]) for op in "ABC"}
    for op in "ABC":
        if math.prod(shapes[op]) != math.prod(lanes[op]):
            raise ProofError(f"{instr.name}: operand {op} has {math.prod(shapes[op])} elements, the "
                             f"VTA tile {lanes[op]} has {math.prod(lanes[op])}")
    rng = np.random.default_rng(seed)
    raw = {op: rng.integers(-128, 128, math.prod(lanes[op])).astype(np.int8) for op in "AB"}
    q = CommandQueue(cfg)
    bufs = {"inp": q.alloc(raw["A"].nbytes, "inp"), "wgt": q.alloc(raw["B"].nbytes, "wgt"),
            "out": q.alloc(math.prod(lanes["C"]), "out")}
    q.load_2d(bufs["inp"], 0, 1, 1, 1, 0, 0, 0, 0, 0, MemType.INP)
    q.load_2d(bufs["wgt"], 0, 1, 1, 1, 0, 0, 0, 0, 0, MemType.WGT)
    q.dep_push(Stage.LOAD, Stage.COMPUTE)
    q.dep_pop(Stage.LOAD, Stage.COMPUTE)
    for reset in (True, False):
        kernel = UopKernel("gemm", reset=reset)
        kernel.push(0, 0, 0)
        q.push_gemm(kernel)
    q.dep_push(Stage.COMPUTE, Stage.STORE)
    q.dep_pop(Stage.COMPUTE, Stage.STORE)
    q.store_2d(0, MemType.OUT, bufs["out"], 0, 1, 1, 1)
    prog = q.synchronize()
    prog.write("inp", raw["A"])
    prog.write("wgt", raw["B"])
    prog.run()
    got = prog.read("out", np.int8, lanes["C"])
    a = raw["A"].astype(np.int64).reshape((1,) + shapes["A"])
    b = raw["B"].astype(np.int64).reshape((1,) + shapes["B"])
    expect = np.einsum(instr.einsum(), a, b)[0].reshape(-1)
    expect = expect.astype(np.int32).astype(np.int8).reshape(lanes["C"])  # the store's low byte
    if not np.array_equal(got, expect):
        bad = np.argwhere(got != expect)
        ops = ", ".join(o + "[" + ",".join(instr.operand_axes[o]) + "]" for o in "ABC")
        raise ProofError(f"{instr.name} ({ops}) differs from the VTA GEMM of {cfg.name!r} at {len(bad)} "
                         f"of {got.size} output lanes (first {tuple(int(i) for i in bad[0])}): the "
                         "operand axes do not match the hardware's C[x,y] += A[x,z] * B[y,z]")
    return got
