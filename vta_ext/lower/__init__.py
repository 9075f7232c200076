"""Lowering of scheduled TIR to VTA instruction streams.

* :mod:`.intrin` -- the GEMM / reset tensor intrinsics (``tvm.s_tir.TensorIntrin``) per GEMM shape;
* :mod:`.passes` -- the s_tir/tirx lowering passes (scheduled TIR -> flat loops, affine indices);
* :mod:`.codegen` -- lowered TIR -> Python generator of :class:`vta_ext.runtime.CommandQueue` calls
  (DMA, ALU, GEMM micro-op kernels, dependency tokens, virtual threads);
* :mod:`.racecheck` -- static race/deadlock check of a program under the token semantics.

Submodules are imported explicitly (they import TVM, which takes seconds).
"""
