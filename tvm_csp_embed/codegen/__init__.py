"""Code generation from an embedding: host relayout, packed TE compute, s_tir schedule, knobs.

One generator for every operator and every mapping family (:mod:`.plan`):

* :mod:`.relayout` -- host relayout steps (pad, stencil unroll, split, transpose, fuse) as Relax ops
  or, for constants, numpy at build time;
* :mod:`.plan` -- :func:`packed_gemm`: the free loops, packed operands and loop roles of an
  embedding of the VTA GEMM;
* :mod:`.loops` -- the loop structure of the schedule (tiled loops, virtual threads, loop orders);
* :mod:`.schedule` -- the packed TE compute and its s_tir schedule (VTA scopes, GEMM intrinsic);
* :mod:`.knobs` -- the knob space over the free loops, its model, and the search for the TPS
  default point (the whole domain at once, with numpy);
* :mod:`.build` -- :func:`build_gemm`: lowering by :mod:`vta_ext.lower` into a VTA program;
* :mod:`.biasfold` -- a constant bias folded into the spare reduction lanes (lane constants in the
  data layout, int8 digits in the weights; the epilogue without its bias stage);
* :mod:`.poolstage` -- a max pool fused after the epilogue (:class:`PoolStage`,
  ``build_gemm(pool=...)``).
"""
from .build import CompiledGemm, build_gemm, resolve_knobs
from .knobs import (KnobGrid, KnobPoint, Pruned, enumerate_points, evaluate, knob_domain, knob_grid,
                    knob_names, search, tps_point)
from .loops import loop_orders
from .plan import FreeLoop, PackedDim, PackedGemm, PackedOperand, loop_roles, packed_gemm
from .poolstage import PoolStage
from .relayout import HostLayout
from .schedule import gemm_compute, schedule_gemm

__all__ = ["HostLayout", "FreeLoop", "PackedDim", "PackedOperand", "PackedGemm", "packed_gemm",
           "loop_roles", "gemm_compute", "schedule_gemm", "loop_orders", "KnobPoint", "Pruned",
           "knob_names", "knob_domain", "evaluate", "enumerate_points", "KnobGrid", "knob_grid", "search",
           "tps_point", "CompiledGemm",
           "build_gemm", "resolve_knobs", "PoolStage"]
