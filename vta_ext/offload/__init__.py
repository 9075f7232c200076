"""Relax pass that offloads canonical quantised int8 patterns to VTA.

Matched patterns (NCHW activations, int8 in, int32 accumulation; see ``docs/templates-api.md``)::

    core -> tail -> R.astype(., "int8")

    tail = any sequence of R.add(., bias int32 per channel) (at most one),
           R.multiply(., multiplier int32 per channel) (at most one), R.right_shift(., constant),
           R.add / R.multiply(., int32 scalar constant), R.clip(., lo, hi), no-op int32 casts
           (e.g. the fixed-point requantisation of PT2E / QDQ graphs:
            bias, >> s1, * M, + 2**(k-1), >> k, clip; M a scalar or one per output channel)

    core = R.nn.conv2d(int8 NCHW, int8 OIHW, out_dtype="int32")         conv2d / group / depthwise
                                                                          (dilated_conv2d: groups 1,
                                                                          dilation > 1)
         | R.nn.conv1d(int8 NCW, int8 OIW, out_dtype="int32")           conv1d (groups 1)
         | R.matmul(int8 [N,K], R.permute_dims(int8 [M,K]), "int32")     dense
         | R.matmul(int8 [B,N,K], int8 [B,K,M], "int32")                   batch_matmul
         | R.matmul(int8 [B,N,K], R.permute_dims(int8 [B,M,K], [0, 2, 1]), "int32")
         | R.nn.avg_pool2d(R.astype(int8, "int32"))                       average pooling
         | R.add(R.astype(int8, "int32"), R.astype(int8, "int32"))        residual add
         | R.multiply(x, R.clip(R.add(x, c), lo, hi)), x = R.astype(int8, "int32")
                                                                          hardswish

    R.nn.max_pool2d(int8 NCHW)                                            max pooling
    R.clip(int8 NCHW, lo, hi)                                             int8 clip (ReLU6)

The pass only *matches* (:mod:`~vta_ext.offload.match`); what each match becomes is up to the strategy in effect
(:func:`vta_ext.build_options`, :mod:`vta_ext.strategy`). Its template plans the packed layouts;
the pass emits their packing on the CPU, one ``call_dps_packed("vta_ext.run", ...)`` that executes
the prebuilt VTA program, and the unpacking. Consecutive VTA operators whose layouts agree hand
over the packed tensor directly; block-aligned channel concats, splits and channel shuffles of
packed tensors are made on the packed tensors, and a concat (or split piece) of one batch block
that a VTA operator takes is passed as its parts (``vta_ext.run_placed``), which the runtime
places in the operator's DRAM buffer: no host copy. Instruction streams are built here, at build time
(:mod:`vta_ext.executor`).

One concept per module: :mod:`~vta_ext.offload.match` (the patterns),
:mod:`~vta_ext.offload.overflow` (the int32 overflow proof of a multiply tail),
:mod:`~vta_ext.offload.rewrite` (the rewriter: placement through the strategy's template),
:mod:`~vta_ext.offload.handover` (packed tensors handed over; concat / split / shuffle on them),
:mod:`~vta_ext.offload.consumers` (who uses each matched operator's output, known before planning),
:mod:`~vta_ext.offload.fusion` (a residual add fused into the conv that produces one of its
operands, a max pool into the conv that produces its input, where the cycle model prefers it),
:mod:`~vta_ext.offload.poolsplit` (a max pool of a channel concat split into one pool per part),
:mod:`~vta_ext.offload.placements` (the build report), :mod:`~vta_ext.offload.transform` (the
pass) and :mod:`~vta_ext.offload.names` (the names of what it emits).

Only a :class:`~vta_ext.errors.TemplateRefusal` keeps a matched operator on the CPU; any other
error fails the build with a :class:`~vta_ext.errors.VTABuildError` naming the operator and its
shapes. The :class:`~vta_ext.report.BuildReport` lists every placement and why.
"""
from ..report import CPU_REASONS_ATTR, LAYERS_ATTR
from .names import RUN_FUNC
from .transform import OffloadToVTA

__all__ = ["OffloadToVTA", "RUN_FUNC", "LAYERS_ATTR", "CPU_REASONS_ATTR"]
