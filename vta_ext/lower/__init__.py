"""Lowering of scheduled TIR to VTA instruction streams, one concept per module.

* :mod:`.intrin` -- the GEMM / reset tensor intrinsics (``tvm.s_tir.TensorIntrin``) per GEMM shape;
* :mod:`.schedule` -- a ``tvm.s_tir.Schedule`` without the Python type check of each primitive;
* :mod:`.passes` -- the s_tir/tirx lowering passes (scheduled TIR -> flat loops, affine indices);
* :mod:`.affine` -- affine index expressions (:class:`~.affine.Aff`);
* :mod:`.ir` -- the nodes of the lowering (buffers, loops, DMAs, ALU stages, GEMM kernels, regions);
* :mod:`.convert` -- TIR conversion: lowered TIR -> loops and recognised statements;
* :mod:`.patterns` -- DMA/ALU pattern analysis (InjectDMAIntrin, InjectALUIntrin);
* :mod:`.uops` -- micro-op folding (FoldUopLoop) and micro-op kernels;
* :mod:`.alloc` -- the scratchpad allocator;
* :mod:`.sync` -- the dependency-token planner (CoProcInstDepDetector);
* :mod:`.codegen` -- emission: :func:`~.codegen.lower_to_runtime` runs the steps and compiles a
  Python generator of :class:`vta_ext.runtime.CommandQueue` calls (virtual threads, reuse);
* :mod:`.racecheck` -- static race/deadlock check of a program under the token semantics.

Submodules are imported explicitly (some import TVM, which takes seconds).
"""
