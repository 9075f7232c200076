"""The s_tir/tirx lowering passes that turn a scheduled (tensorized) PrimFunc into flat loops.

After :func:`lower_schedule` every buffer is flat (1-D), on-chip buffers are compacted to the tile a
loop iteration uses, tensorized GEMMs are ``T.call_extern`` markers whose arguments are affine element
offsets, and every index is an affine expression of loop variables -- the form
:mod:`vta_ext.lower.codegen` translates into runtime calls.
"""
from __future__ import annotations

import tvm
from tvm import s_tir, tirx

__all__ = ["lowering_passes", "lower_schedule"]


def lowering_passes() -> tvm.transform.Pass:
    return tvm.transform.Sequential([
        s_tir.transform.CanonicalizeLoop(),
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.LowerOpaqueBlock(),
        tirx.transform.FlattenBuffer(),
        tirx.transform.StmtSimplify(),
    ])


def lower_schedule(mod: tvm.IRModule) -> tvm.IRModule:
    """Apply :func:`lowering_passes` to a scheduled module (e.g. ``Schedule.mod``)."""
    return lowering_passes()(mod)
