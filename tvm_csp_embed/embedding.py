"""Embedding records: from a solver solution to dim mapping, tiling and relayout plan.

An :class:`Embedding` says which operator loop dims (split into factors with strides, or
fused) map to each instruction axis, which tensor each operand reads, how every loop dim is
padded, how every tensor is relaid out (pad, stencil unroll, split, transpose, fuse) into
packed instruction tiles, which loops stay free for scheduling, and the instruction count
and tensor footprints implied.  :func:`embed` is the one-call entry point.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .instructions import InstructionGraph, gemm
from .solve import EmbeddingNotFound, RawSolution, SolveResult, SolveStats, solve
from .workload import TensorAccess, Workload

__all__ = ["Factor", "AxisMapping", "RelayoutStep", "TensorRelayout", "Embedding", "EmbeddingError",
           "decode", "embed", "embed_all"]


class EmbeddingError(ValueError):
    """A solution cannot be turned into a tiled embedding (e.g. not a hyper-rectangle)."""


@dataclass(frozen=True)
class Factor:
    """One factor of an instruction axis: ``size`` points of loop dim ``dim``, ``stride`` apart."""

    dim: str
    size: int
    stride: int = 1

    def __str__(self) -> str:
        return f"{self.dim}{self.size}" + (f"/{self.stride}" if self.stride > 1 else "")


@dataclass(frozen=True)
class AxisMapping:
    """The loop dims an instruction axis walks, outermost factor first.

    Attributes
    ----------
    axis : str
    size : int
    factors : tuple of Factor
        Empty for an axis of size 1.
    """

    axis: str
    size: int
    factors: Tuple[Factor, ...]

    def __str__(self) -> str:
        return "*".join(str(f) for f in self.factors) or "1"


@dataclass(frozen=True)
class RelayoutStep:
    """One step of a tensor relayout.

    ``kind`` and ``args``:

    * ``"pad"``: ``{"pad": ((lo, hi), ...)}`` zero padding per tensor dim;
    * ``"unroll"``: ``{"dim": e, "loops": (d, ...)}`` stencil unrolling of tensor dim ``e``
      into one dim per loop dim (a gather ``new[..., i_d, ...] = old[..., sum c_d i_d + k, ...]``);
    * ``"split"``: ``{"dim": d, "into": (tiles, size, stride)}`` loop-dim split
      ``i = tile * size * stride + digit * stride + sub``;
    * ``"transpose"``: ``{"perm": (...)}``;
    * ``"fuse"``: ``{"shape": (...)}``: reshape of the trailing factor dims into the tile.
    """

    kind: str
    args: Dict[str, Any]

    def __str__(self) -> str:
        a = ", ".join(f"{k}={v}" for k, v in self.args.items())
        return f"{self.kind}({a})"


@dataclass
class TensorRelayout:
    """Relayout plan of one tensor into packed instruction tiles.

    Attributes
    ----------
    tensor : str
    operand : str
        Instruction operand (``"A"``, ``"B"`` or ``"C"``).
    steps : list of RelayoutStep
    packed_labels : tuple
        Label of every packed dim: ``("t", e)`` a tensor dim, ``("i", d)`` a loop dim (after
        unrolling), ``("tile", d)``, ``("sub", d)``; the trailing tile dims are
        ``("axis", name)``.
    packed_shape : tuple of int
    element_bytes : int
    """

    tensor: str
    operand: str
    steps: List[RelayoutStep]
    packed_labels: Tuple[Tuple[str, Any], ...]
    packed_shape: Tuple[int, ...]
    element_bytes: int = 1

    @property
    def footprint_bytes(self) -> int:
        """Bytes of the packed tensor."""
        return math.prod(self.packed_shape) * self.element_bytes

    def __str__(self) -> str:
        return f"{self.tensor}->{self.operand}: " + " | ".join(str(s) for s in self.steps)


@dataclass
class Embedding:
    """An embedding of an instruction into an operator, ready for code generation.

    Attributes
    ----------
    workload : Workload
    instruction : InstructionGraph
    mode : str
        Constraint set used (``"strict"``, ``"relaxed"`` or ``"custom"``).
    axes : tuple of AxisMapping
        Per instruction axis, the loop dims it walks.
    binding : dict
        Operand -> tensor name (``{"A": "data", "B": "weight", "C": "out"}``).
    padding : dict
        Loop dim -> padded elements (only non-zero entries).
    padded_extents : dict
        Loop dim -> extent after padding.
    relayout : dict
        Tensor name -> :class:`TensorRelayout`.
    free_dims : dict
        Loop dim -> number of iterations left to the schedule (tile loops of walked dims,
        sub-offset loops of strided ones, whole unwalked dims).
    instruction_count : int
        Instruction calls for the whole operator.
    cost : int
        Solver objective (padding, stencil unrolling, strides).
    raw : RawSolution
        The solver's solution (scalar node coordinates included).
    stats : SolveStats
    baseline : dict, optional
        When requested (``embed(..., baseline="strict")``), the mapping and padded volume of
        the best embedding under the baseline constraint set (the stock mapping in strict).
    """

    workload: Workload
    instruction: InstructionGraph
    mode: str
    axes: Tuple[AxisMapping, ...]
    binding: Dict[str, str]
    padding: Dict[str, int]
    padded_extents: Dict[str, int]
    relayout: Dict[str, TensorRelayout]
    free_dims: Dict[str, int]
    instruction_count: int
    cost: int
    raw: RawSolution
    stats: SolveStats = field(default_factory=SolveStats)
    baseline: Optional[Dict[str, Any]] = None

    @property
    def padding_saved(self) -> Optional[float]:
        """Baseline padded volume over this one (> 1: this embedding pads less), if known."""
        if not self.baseline:
            return None
        return self.baseline["padded_volume"] / self.padded_volume_ratio

    # ------------------------------------------------------------------ derived figures
    def axis(self, name: str) -> AxisMapping:
        """The mapping of instruction axis ``name``."""
        for a in self.axes:
            if a.axis == name:
                return a
        raise KeyError(name)

    def dims_of(self, axis: str) -> Tuple[str, ...]:
        """Loop dims walked by instruction axis ``axis`` (outermost first)."""
        return tuple(f.dim for f in self.axis(axis).factors)

    @property
    def walked(self) -> Dict[str, Factor]:
        """Loop dim -> its factor, for every dim some axis walks."""
        return {f.dim: f for a in self.axes for f in a.factors}

    @property
    def padded_volume_ratio(self) -> float:
        """Padded multiply count over the original one (1.0 = no padding)."""
        return math.prod(self.padded_extents[d] / x for d, x in zip(self.workload.dims, self.workload.extents))

    @property
    def footprint_bytes(self) -> int:
        """Total bytes of all packed tensors."""
        return sum(r.footprint_bytes for r in self.relayout.values())

    @property
    def unrolled(self) -> Dict[str, Tuple[str, ...]]:
        """Tensor -> loop dims it is stencil-unrolled along (im2col-like), when any."""
        out = {}
        for r in self.relayout.values():
            loops = tuple(self.workload.dims[d] for s in r.steps if s.kind == "unroll" for d in s.args["loops"])
            if loops:
                out[r.tensor] = loops
        return out

    def mapping_str(self) -> str:
        """Compact mapping, e.g. ``x=1 y=k16 z=c4*r4``."""
        return " ".join(f"{a.axis}={a}" for a in self.axes)

    def __str__(self) -> str:
        wl = self.workload
        lines = [f"Embedding of {self.instruction.name} into {wl.name} [{self.mode}]",
                 f"  operator : {wl.describe()}",
                 f"  mapping  : {self.mapping_str()}",
                 f"  binding  : " + ", ".join(f"{o}<-{t}" for o, t in self.binding.items()),
                 f"  padding  : " + (", ".join(f"{d}+{p}" for d, p in self.padding.items()) or "none")
                 + f" (padded volume x{self.padded_volume_ratio:.3f})",
                 f"  free     : " + ", ".join(f"{d}:{n}" for d, n in self.free_dims.items()),
                 f"  calls    : {self.instruction_count}",
                 f"  footprint: {self.footprint_bytes} B ("
                 + ", ".join(f"{t} {r.footprint_bytes}" for t, r in self.relayout.items()) + ")"]
        for r in self.relayout.values():
            lines.append(f"  relayout : {r}")
        if self.baseline:
            lines.append(f"  baseline : {self.baseline['mode']} {self.baseline['mapping']} padded volume "
                         f"x{self.baseline['padded_volume']:.3f}; padding saved x{self.padding_saved:.3f}")
        lines.append(f"  solver   : cost={self.cost} {self.stats!r}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Embedding({self.workload.name}, {self.instruction.name}, {self.mode}: {self.mapping_str()}, "
                f"pad={self.padding}, calls={self.instruction_count})")


# ---------------------------------------------------------------------- decoding
def _axis_factors(instr: InstructionGraph, wl: Workload, raw: RawSolution) -> Tuple[AxisMapping, ...]:
    out = []
    b0 = 0
    for a, (name, L) in enumerate(zip(instr.axes, instr.log_sizes)):
        dims = raw.bit_dims[b0:b0 + L]
        steps = raw.bit_steps[b0:b0 + L]
        runs: List[List[int]] = []
        for b in range(L):
            if b > 0 and dims[b] == dims[b - 1] and steps[b] == 2 * steps[b - 1]:
                runs[-1].append(b)
            else:
                runs.append([b])
        fac = []
        for run in reversed(runs):  # outermost first
            fac.append(Factor(wl.dims[dims[run[0]]], 2 ** len(run), steps[run[0]]))
        seen = [f.dim for f in fac]
        if len(set(seen)) != len(seen):
            raise EmbeddingError(f"axis {name}: loop dims {seen} not contiguous; not a hyper-rectangle")
        out.append(AxisMapping(name, instr.sizes[a], tuple(fac)))
        b0 += L
    all_dims = [f.dim for am in out for f in am.factors]
    if len(set(all_dims)) != len(all_dims):
        raise EmbeddingError(f"loop dims {all_dims} walked by several axes; not axis-parallel")
    return tuple(out)


def _element_bytes(cfg: Any, role: str) -> int:
    if cfg is None:
        return 1
    key = {"in0": "LOG_INP_WIDTH", "in1": "LOG_WGT_WIDTH", "out": "LOG_OUT_WIDTH"}[role]
    log = getattr(cfg, key, None)
    if log is None and role == "out":
        log = getattr(cfg, "LOG_INP_WIDTH", 3)
    return max(1, (2 ** int(log)) // 8) if log is not None else 1


def _relayout(wl: Workload, instr: InstructionGraph, t: TensorAccess, op: str, axes: Tuple[AxisMapping, ...],
              ext: Sequence[int], elem: int) -> TensorRelayout:
    len(wl.dims)
    walked = {wl.dims.index(f.dim): (f, am.axis) for am in axes for f in am.factors}
    op_axes = instr.operand_axes[op]
    steps: List[RelayoutStep] = []
    # 1. pad every tensor dim to what the padded loop box reads
    need = [t.const[e] + sum(c * (x - 1) for c, x in zip(t.coef[e], ext)) + 1 for e in range(t.rank)]
    pads = tuple((0, max(0, n - s)) for n, s in zip(need, t.shape))
    shape = [max(n, s) for n, s in zip(need, t.shape)]
    if any(p[1] for p in pads):
        steps.append(RelayoutStep("pad", {"pad": pads}))
    labels: List[Tuple[str, Any]] = []
    lshape: List[int] = []
    # 2. stencil unroll the tensor dims that hold a walked loop dim with a non-trivial subscript
    for e in range(t.rank):
        ld = t.loop_dims_of(e)
        w = [d for d in ld if d in walked]
        if w:
            if op == "C" and (ld != (w[0],) or t.coef[e][w[0]] != 1 or t.const[e] != 0):
                raise EmbeddingError(f"output {t.name} subscript {t.subscript_str(e, wl.dims)} would need a "
                                     "scatter; not supported")
            if ld == (w[0],) and t.coef[e][w[0]] == 1 and t.const[e] == 0:
                labels.append(("i", w[0]))
                lshape.append(ext[w[0]])
            else:
                steps.append(RelayoutStep("unroll", {"dim": e, "tensor_dim": t.dim_names[e],
                                                     "into": tuple(wl.dims[d] for d in ld), "loops": ld,
                                                     "coef": tuple(t.coef[e][d] for d in ld), "const": t.const[e]}))
                for d in ld:
                    labels.append(("i", d))
                    lshape.append(ext[d])
        else:
            labels.append(("t", e))
            lshape.append(shape[e])
    # 3. split the walked loop dims into (tile, digit, sub)
    final_labels: List[Tuple[str, Any]] = []
    final_shape: List[int] = []
    digit_pos: Dict[int, int] = {}
    for lab, n in zip(labels, lshape):
        if lab[0] == "i" and lab[1] in walked:
            d = lab[1]
            f, _ = walked[d]
            tiles, left = divmod(n, f.size * f.stride)
            if left or not tiles:
                raise EmbeddingError(
                    f"{t.name}: the factor of dim {wl.dims[d]!r} (size {f.size}, stride "
                    f"{f.stride}) does not tile its extent {n}; not a hyper-rectangle (solve with "
                    "the 'rect' constraint)")
            steps.append(RelayoutStep("split", {"dim": wl.dims[d], "into": (tiles, f.size, f.stride)}))
            final_labels += [("tile", d)]
            final_shape += [tiles]
            digit_pos[d] = len(final_labels)
            final_labels += [("digit", d), ("sub", d)]
            final_shape += [f.size, f.stride]
        else:
            final_labels.append(lab)
            final_shape.append(n)
    # 4. transpose digits to the end in operand axis order (outermost factor first); 5. fuse
    order_digits = [digit_pos[wl.dims.index(f.dim)] for ax in op_axes for am in axes if am.axis == ax
                    for f in am.factors]
    rest = [i for i in range(len(final_labels)) if i not in order_digits and
            not (final_labels[i][0] == "sub" and walked[final_labels[i][1]][0].stride == 1)]
    unit_subs = [i for i in range(len(final_labels)) if final_labels[i][0] == "sub"
                 and walked[final_labels[i][1]][0].stride == 1]
    perm = tuple(rest + unit_subs + order_digits)
    if perm != tuple(range(len(perm))):
        steps.append(RelayoutStep("transpose", {"perm": perm}))
    tile_shape = tuple(instr.sizes[instr.axes.index(ax)] for ax in op_axes)
    free_labels = tuple(final_labels[i] for i in rest)
    free_shape = tuple(final_shape[i] for i in rest)
    steps.append(RelayoutStep("fuse", {"shape": free_shape + tile_shape}))
    packed_labels = free_labels + tuple(("axis", ax) for ax in op_axes)
    return TensorRelayout(t.name, op, steps, packed_labels, free_shape + tile_shape, elem)


def decode(raw: RawSolution, wl: Workload, instr: InstructionGraph, mode: str = "custom",
           cfg: Any = None) -> Embedding:
    """Turn a solver solution into an :class:`Embedding`.

    Raises
    ------
    EmbeddingError
        If the solution is not an axis-parallel hyper-rectangle (possible only with the
        ``rect`` constraint switched off).
    """
    axes = _axis_factors(instr, wl, raw)
    len(wl.dims)
    ext = [x + p for x, p in zip(wl.extents, raw.pad)]
    roles = ("in0", "in1", "out")
    order = (0, 1, 2) if raw.binding == 1 else (1, 0, 2)
    binding = {op: wl.tensors[i].name for op, i in zip("ABC", order)}
    relayout = {}
    for op, i in zip("ABC", order):
        t = wl.tensors[i]
        relayout[t.name] = _relayout(wl, instr, t, op, axes, ext, _element_bytes(cfg, roles[i]))
    walked = {f.dim: f for am in axes for f in am.factors}
    free = {}
    calls = 1
    for d, x in zip(wl.dims, ext):
        n = x // walked[d].size if d in walked else x
        free[d] = n
        calls *= n
    return Embedding(wl, instr, mode, axes, binding,
                     {d: p for d, p in zip(wl.dims, raw.pad) if p}, dict(zip(wl.dims, ext)), relayout, free,
                     calls, raw.cost, raw, raw.stats)


def embed_all(wl: Workload, instr: Optional[InstructionGraph] = None, mode: str = "strict", *,
              solutions: int = 1, cfg: Any = None, baseline: Optional[str] = None, objective: str = "volume",
              footprint_candidates: int = 8, **kw) -> Tuple[List[Embedding], SolveResult]:
    """Solve and decode up to ``solutions`` best distinct embeddings.

    baseline : str, optional
        Also solve this constraint set (e.g. ``"strict"``, the stock mapping) and record its
        padded volume in every embedding's ``baseline`` (see ``padding_saved``).
    objective : str
        ``"volume"`` (default): the solver minimises the padded volume (plus small penalties
        for stencil unrolling and strides).  ``"footprint"``: the ``footprint_candidates`` best
        embeddings by volume are ranked by packed-tensor bytes (a post-hoc ranking, not an
        in-model objective).

    Returns
    -------
    (list of Embedding, SolveResult)
        The list is empty when the status is not ``"ok"``.
    """
    if instr is None:
        instr = gemm(cfg if cfg is not None else (1, 16, 16))
    if objective not in ("volume", "footprint"):
        raise ValueError(f"objective {objective!r}: use 'volume' or 'footprint'")
    n = solutions if objective == "volume" else max(solutions, footprint_candidates)
    res = solve(wl, instr, mode, solutions=n, **kw)
    name = mode if isinstance(mode, str) else "custom"
    embs = [decode(s, wl, instr, name, cfg) for s in res.solutions]
    if objective == "footprint":
        embs = sorted(embs, key=lambda e: (e.footprint_bytes, e.cost))[:solutions]
        res.solutions = [e.raw for e in embs]
    if baseline and embs:
        bres = solve(wl, instr, baseline, solutions=1, **kw)
        if bres.solutions:
            b = decode(bres.solutions[0], wl, instr, baseline, cfg)
            info = {"mode": baseline, "mapping": b.mapping_str(), "padded_volume": b.padded_volume_ratio,
                    "padding": dict(b.padding), "footprint_bytes": b.footprint_bytes}
            for e in embs:
                e.baseline = info
    return embs, res


def embed(wl: Workload, instr: Optional[InstructionGraph] = None, mode: str = "strict", *, cfg: Any = None,
          baseline: Optional[str] = None, objective: str = "volume", **kw) -> Embedding:
    """The best embedding of ``instr`` (default: VTA GEMM of ``cfg``) into ``wl``.

    Parameters
    ----------
    wl : Workload
    instr : InstructionGraph, optional
    mode : str
        ``"strict"`` or ``"relaxed"`` (or a list of constraint names).
    cfg : VTAConfig, optional
        Used for the default instruction and for element sizes of the footprints.
    baseline : str, optional
        Constraint set whose best padded volume is recorded for comparison.
    objective : str
        ``"volume"`` or ``"footprint"`` (see :func:`embed_all`).
    **kw
        Passed to :func:`tvm_csp_embed.solve.solve` (``timeout``, ``portfolio``, ...).

    Raises
    ------
    EmbeddingNotFound
        ``status="timeout"`` with "no embedding found within T s", or ``"infeasible"``.
    """
    embs, res = embed_all(wl, instr, mode, solutions=1, cfg=cfg, baseline=baseline, objective=objective, **kw)
    if not embs:
        raise EmbeddingNotFound(res.status, res.message)
    return embs[0]
