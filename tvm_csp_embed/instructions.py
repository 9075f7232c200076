"""Instruction dataflow graphs of the accelerator, built from a VTA configuration.

An :class:`InstructionGraph` has named axes of power-of-two sizes and three operands
``A``, ``B`` (multiplied) and ``C`` (accumulated), each indexed by a subset of the axes:

* VTA GEMM: ``C[x,y] += sum_z A[x,z] * B[y,z]`` with ``(x, y, z) = (BATCH, BLOCK_OUT,
  BLOCK_IN)`` (B is transposed, as in the hardware);
* VTA ALU element-wise multiply + add: ``C[b,l] += A[b,l] * B[b,l]`` on a ``(BATCH,
  BLOCK_OUT)`` accumulator tile (Intel Labs' vector-vector MUL followed by ADD).

Every multiply node is an instruction point ``(coordinate per axis)``; its add node
coincides with it (the multiply -> add edge is functional).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple, Union

__all__ = ["InstructionGraph", "gemm", "alu_muladd", "instruction_sizes"]

OPERANDS = ("A", "B", "C")


@dataclass(frozen=True)
class InstructionGraph:
    """Dataflow graph of one instruction call.

    Attributes
    ----------
    name : str
        e.g. ``"gemm_1x16x16"``.
    kind : str
        ``"gemm"`` or ``"alu_muladd"``.
    axes : tuple of str
        Axis names (e.g. ``("x", "y", "z")``).
    sizes : tuple of int
        Axis sizes (powers of two).
    reduction : tuple of bool
        True for an axis that is summed inside the instruction (GEMM ``z``).
    operand_axes : dict
        ``{"A": ("x","z"), "B": ("y","z"), "C": ("x","y")}``: axes indexing each operand.
    """

    name: str
    kind: str
    axes: Tuple[str, ...]
    sizes: Tuple[int, ...]
    reduction: Tuple[bool, ...]
    operand_axes: Dict[str, Tuple[str, ...]]

    def __post_init__(self):
        for a, n in zip(self.axes, self.sizes):
            if n < 1 or n & (n - 1):
                raise ValueError(f"instruction axis {a} has size {n}; VTA sizes are powers of two")

    @property
    def log_sizes(self) -> Tuple[int, ...]:
        """log2 of the axis sizes."""
        return tuple(n.bit_length() - 1 for n in self.sizes)

    @property
    def num_mults(self) -> int:
        """Number of multiply (= add) nodes."""
        n = 1
        for s in self.sizes:
            n *= s
        return n

    def mult_nodes(self) -> List[Tuple[int, ...]]:
        """All multiply nodes as axis coordinates, in row-major order of ``axes``."""
        return list(itertools.product(*[range(n) for n in self.sizes]))

    def operand_nodes(self, op: str) -> List[Tuple[int, ...]]:
        """Data nodes of operand ``op`` (coordinates over its axes, row-major)."""
        idx = [self.axes.index(a) for a in self.operand_axes[op]]
        return list(itertools.product(*[range(self.sizes[i]) for i in idx]))

    def operand_node_of(self, op: str, q: Sequence[int]) -> Tuple[int, ...]:
        """Data node of operand ``op`` read (A, B) or accumulated (C) by multiply node ``q``."""
        return tuple(q[self.axes.index(a)] for a in self.operand_axes[op])

    def einsum(self) -> str:
        """numpy einsum of one call over a batch of calls ``c``: e.g. ``"cxz,cyz->cxy"``."""
        f = lambda op: "c" + "".join(self.operand_axes[op])
        return f"{f('A')},{f('B')}->{f('C')}"

    def edges(self) -> Dict[str, List[Tuple[Any, Any]]]:
        """Edges of the graph by label: ``mul->add``, ``A->mul``, ``B->mul``, ``add->C``,
        ``chain`` (add to the add of the next reduction point) and ``spatial`` (star
        around node 0: multiplies computing another output)."""
        nodes = self.mult_nodes()
        red = [i for i, r in enumerate(self.reduction) if r]
        out = {"mul->add": [(q, q) for q in nodes],
               "A->mul": [(self.operand_node_of("A", q), q) for q in nodes],
               "B->mul": [(self.operand_node_of("B", q), q) for q in nodes],
               "add->C": [(q, self.operand_node_of("C", q)) for q in nodes],
               "chain": [], "spatial": []}
        for q in nodes:
            for i in red:
                if q[i] + 1 < self.sizes[i]:
                    q2 = list(q)
                    q2[i] += 1
                    out["chain"].append((q, tuple(q2)))
        q0 = nodes[0]
        c0 = self.operand_node_of("C", q0)
        out["spatial"] = [(q0, q) for q in nodes if self.operand_node_of("C", q) != c0]
        return out

    def __repr__(self) -> str:
        ops = ", ".join(f"{o}[{','.join(self.operand_axes[o])}]" for o in OPERANDS)
        shape = ", ".join(f"{a}={n}" for a, n in zip(self.axes, self.sizes))
        return f"InstructionGraph({self.name}: {ops}; {shape})"


def instruction_sizes(cfg: Union[Any, Sequence[int]]) -> Tuple[int, int, int]:
    """``(BATCH, BLOCK_IN, BLOCK_OUT)`` of a ``VTAConfig`` or of a plain 3-tuple."""
    if hasattr(cfg, "BATCH"):
        return int(cfg.BATCH), int(cfg.BLOCK_IN), int(cfg.BLOCK_OUT)
    b, i, o = (int(v) for v in cfg)
    return b, i, o


def gemm(cfg: Union[Any, Sequence[int]] = (1, 16, 16)) -> InstructionGraph:
    """VTA GEMM ``C[x,y] += sum_z A[x,z] * B[y,z]``, ``(x,y,z) = (BATCH, BLOCK_OUT, BLOCK_IN)``.

    Parameters
    ----------
    cfg : VTAConfig or (BATCH, BLOCK_IN, BLOCK_OUT)
    """
    b, bi, bo = instruction_sizes(cfg)
    return InstructionGraph(f"gemm_{b}x{bo}x{bi}", "gemm", ("x", "y", "z"), (b, bo, bi),
                            (False, False, True), {"A": ("x", "z"), "B": ("y", "z"), "C": ("x", "y")})


def alu_muladd(cfg: Union[Any, Sequence[int]] = (1, 16, 16)) -> InstructionGraph:
    """VTA ALU element-wise multiply + add ``C[b,l] += A[b,l] * B[b,l]`` on (BATCH, BLOCK_OUT)."""
    b, _, bo = instruction_sizes(cfg)
    return InstructionGraph(f"alu_muladd_{b}x{bo}", "alu_muladd", ("b", "l"), (b, bo), (False, False),
                            {"A": ("b", "l"), "B": ("b", "l"), "C": ("b", "l")})
