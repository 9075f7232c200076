"""The stock operator templates: the fixed templates of the original VTA stack, rebuilt.

Shared definitions (one home each):

* :mod:`.errors` -- the template exceptions; which are refusals (operator stays on the CPU) and
  which fail the build (:class:`~.errors.KnobError`, misuse);
* :mod:`.workload` -- the GEMM workloads (conv2d, group conv2d, dense), the output-size and window
  formulas, the GEMM workload refusals;
* :mod:`.knobs` -- the GEMM knob dataclasses and the ``knobs`` argument of every ``build_<op>``
  (None / ``"tps"`` / ``"fallback"`` / dataclass / dict);
* :mod:`.epilogue` -- the epilogue stages: validation, ALU instructions, TE expression;
* :mod:`.tiling` -- the knob space of the GEMM templates, its DRAM / scratchpad / micro-op model,
  the Tiling Parameter Search and the fallback point.

Templates (``build_<op>(cfg, workload, epilogue=(), knobs=None)``, see ``docs/templates-api.md``):

* :mod:`.conv2d`, :mod:`.group_conv2d`, :mod:`.dense` -- TE compute + s_tir schedule, lowered by
  :mod:`vta_ext.lower`;
* :mod:`.pool`, :mod:`.eltwise`, :mod:`.depthwise` -- hand-written ALU programs, with the helpers of
  :mod:`.alu_program`.
"""
