"""A lower bound of a module's cycles on a configuration, from the operators alone (no build).

The search prunes a configuration when this bound already loses to a measured point of no more
area (:mod:`.explore`). It must never exceed what an evaluation (:mod:`.evaluate`) reports, so it
is a floor of the cycle model (:mod:`vta_ext.sim.cycles`), per matched operator:

* an operator on the GEMM unit needs at least ``ceil(MACs / (BATCH x BLOCK_IN x BLOCK_OUT))``
  micro-ops of ``GEMM_CYCLES_PER_UOP`` cycles each on the compute module (padding only adds
  micro-ops); its load module moves every weight byte at least once and its store module every
  output byte, at ``MEM_BYTES_PER_CYCLE`` (the three modules overlap, so the floor is their
  maximum, not their sum);
* an operator may instead stay on the CPU, where the evaluation charges the host model's cycles
  for its MACs (the build report's ``cpu_macs``), so its bound is the smaller of the two;
* an operator on the ALU (depthwise, pooling, add, ...) is bounded by 0.

It is not :func:`vta_ext.floor.operator_floor` (issue 18's floor, what efficiency is measured
against): that floor charges every byte of an operator to one bus and the epilogue's ALU passes at
their ideal count, a target rather than a proven bound of the cycle model, whose load and store
modules run at once. Pruning must never drop a point an evaluation would put on the front, so the
search keeps this weaker bound; the operator kinds on the GEMM unit are the floor's
(:data:`vta_ext.floor.GEMM_KINDS`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Sequence

import numpy as np

from vta_ext.config import VTAConfig
from vta_ext.floor import GEMM_KINDS

__all__ = ["OperatorCost", "GEMM_KINDS", "matched_operators", "operator_floor", "lower_bound"]



@dataclass(frozen=True)
class OperatorCost:
    """What the bound needs of one matched operator (configuration-independent).

    Attributes
    ----------
    kind : str
        The matched kind (``"conv2d"``, ``"dense"``, ``"max_pool2d"``, ...).
    name : str
        The Relax variable of its core call.
    macs : int
        Its MACs (:func:`vta_ext.quantize.call_macs`).
    weight_bytes, out_bytes : int
        Bytes of its second operand (weights) and of its int8 output.
    cpu_cycles : float
        What the evaluation charges when it stays on the CPU (host model cycles of the MACs the
        build report counts for it; 0 for operators the report counts no MACs for).
    """

    kind: str
    name: str
    macs: int
    weight_bytes: int
    out_bytes: int
    cpu_cycles: float


def _size(expr) -> int:
    return int(np.prod([int(d) for d in expr.ty.shape], dtype=np.int64))


def matched_operators(mod, config: VTAConfig) -> List[OperatorCost]:
    """The operators the offload pass matches in ``mod`` (matching only: nothing is planned).

    Matching does not depend on the configuration beyond its ISA extensions, which every space
    keeps from its base.
    """
    from tvm import relax

    from vta_ext.offload.rewrite import Offloader  # the pass's own matcher, as its prefetch uses it
    from vta_ext.options import current_options
    from vta_ext.host import host_model
    from vta_ext.quantize import call_macs, op_macs

    matcher = Offloader(mod, config, match_only=True)
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            matcher.visit_expr(func)
    try:
        counted = op_macs(mod)  # the MACs the build report charges to the CPU (cpu_macs)
    except Exception:  # noqa: BLE001 -- no plain ``main``: the report counts no CPU MACs either
        counted = {}
    host = host_model(current_options().host)
    ops = []
    for m in matcher.matched:
        weight = _size(m.operands[1]) if len(m.operands) > 1 else 0
        cpu = host.cpu_cycles(counted[m.name][1]) if m.name in counted else 0.0
        ops.append(OperatorCost(m.kind, m.name, call_macs(m.core), weight, _size(m.core), cpu))
    return ops


def operator_floor(op: OperatorCost, config: VTAConfig) -> float:
    """The fewest cycles ``op`` can cost on ``config`` (module docstring)."""
    if op.kind not in GEMM_KINDS:
        return 0.0
    pe = config.BATCH * config.BLOCK_IN * config.BLOCK_OUT
    compute = math.ceil(op.macs / pe) * config.GEMM_CYCLES_PER_UOP
    memory = max(op.weight_bytes, op.out_bytes) / config.MEM_BYTES_PER_CYCLE
    return min(float(max(compute, memory)), op.cpu_cycles)


def lower_bound(ops: Sequence[OperatorCost], config: VTAConfig) -> float:
    """A lower bound of the evaluated cycles of the module whose operators are ``ops``."""
    return float(sum(operator_floor(op, config) for op in ops))
