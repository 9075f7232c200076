"""VTA-style post-training quantisation of float models into canonical int8 Relax.

The quantiser turns a float32 model (a PyTorch ``nn.Module``, or a float Relax module from any
frontend, e.g. ONNX) into an int8 Relax module made of the canonical patterns that the ``ext_vta``
offload pass recognises. It follows the scheme of the original VTA stack: symmetric int8
activations and weights whose scales are powers of two, int32 accumulation, and requantisation by
an arithmetic right shift followed by a clip, which VTA's ALU performs (SHR, CLIP/MIN/MAX) before
the store truncates to int8.

**Partial quantisation.** An operator the quantiser cannot map to int8 (sigmoid, SiLU, the product
of two computed tensors, ...) stays in float32 on the CPU: its quantised inputs are dequantised
(``astype(q, float32) * 2**e``) and its result is quantised again where an int8 operator consumes
it. Every such operator is listed in :attr:`QuantizedModel.cpu_float_ops` with the reason and the
source layer (the torch module path recorded by the import). Only real errors (unrepresentable
scales, a malformed graph) raise :class:`QuantizationError`.

Pipeline
--------
1. **BatchNorm folding** (:func:`fold_batchnorm`, torch models only): every ``Conv2d`` whose only
   consumer is a ``BatchNorm2d`` (eval mode) absorbs it, so the graph has conv + bias only. Then
   **cross-layer equalisation** (:func:`equalize_cross_layer`, on by default) rescales the channels
   of every conv-ReLU-conv pair so both have equal per-channel weight ranges; this is exact in
   float and is what makes per-tensor weight scales work for depthwise convolutions (MobileNet).
2. **Import**: ``torch.export`` + TVM's ``ExportedProgramImporter`` (weights become constants);
   the torch layer of every Relax binding is recorded (:func:`import_exported_program`); then
   ``FoldConstant`` / ``CanonicalizeBindings`` / ``DeadCodeElimination``.
3. **Analysis** (:class:`~vta_ext.quantize.graph.Analyser`): the float bindings become *nodes*:

   * ``conv``: conv2d (any ``groups``) with a constant weight, and the chain of single-user
     epilogue steps after it: per-channel constant add / subtract / multiply / divide and
     BatchNorm (folded into weight and bias), ReLU and any clip (ReLU6, hardtanh; the clip
     becomes the requantisation tail's clip, exactly: rounding is monotone). A per-channel
     affine map of a quantised tensor that follows no conv (a pre-activation BatchNorm,
     ``(x + 3) / 6`` of a hard sigmoid) is a ``conv`` too: a 1x1 depthwise conv;
   * ``linear``: matmul with a constant weight, with the same epilogue;
   * ``add``: sum of two tensors of one shape [+ ReLU/clip];
   * ``avgpool``: ``avg_pool2d`` as given, ``mean`` over H, W (keepdims or not; without it
     the pool is followed by an int8 reshape), ``adaptive_avg_pool2d`` whose output divides
     the input (``avg_pool2d`` with kernel = stride = in / out; the identity when equal);
   * ``maxpool``; ``layout`` (reshape, permute_dims, strided_slice, squeeze, an item of a
     ``split``), ``split``, ``concat``: no arithmetic, one scale for inputs and output;
   * ``hswish``: ``x * clip(x + 3, 0, 6) / 6`` (Hardswish) in int32 arithmetic;
   * ``clip``: a ReLU/clip of a quantised tensor with no requantisation to fuse into;
   * ``input`` / ``quant``: the model input, or a float tensor computed on the CPU, quantised
     where an int8 node consumes it;
   * ``float``: anything else, computed in float32 on the CPU (see above).

4. **Calibration**: the float graph runs on llvm on the calibration input(s), with the float
   tensor of every node as an extra output; each node records ``max |x|`` (after its fused
   epilogue).
5. **Scales** (:func:`~vta_ext.quantize.scales.choose_scales`, powers of two, ``s = 2**e``):

   * activation: ``e = ceil(log2(max|x| / 127))`` (so the calibrated range fits in int8);
   * weight (per tensor): ``e_w = ceil(log2(max|W| / 127))``, ``W_q = round(W / 2**e_w)``;
   * the int32 accumulator of a conv/linear has exponent ``e_x + e_w``; its bias is
     ``round(b / 2**(e_x + e_w))``;
   * the two operands of an ``add``, and the inputs and output of ``maxpool`` / ``layout`` /
     ``split`` / ``concat`` / ``clip`` share one scale: such tensors are merged into groups
     (union-find) and the group takes the largest exponent of its members — the producers'
     requantisation shifts absorb the difference (a concat of differently scaled branches costs
     no arithmetic);
   * **no negative shifts**: a requantising node's output exponent is raised, if needed, to its
     accumulator exponent (``e_x + e_w`` for conv/linear, ``e_x`` for add and average pool).
     Both rules only ever raise exponents, so they are iterated to a fixed point. A shift above
     31, or a group that never settles, raises :class:`QuantizationError`.

   The requantisation shift of a node is ``e_out - e_acc`` (0..31).
6. **Rewrite** (:func:`~vta_ext.quantize.emit.emit_module`) into int8 Relax using these patterns
   (the contract with the offload pass):

   * input / quant: ``astype(clip(round(x * 2**-e), -128, 127), "int8")`` on the CPU;
   * conv2d: ``conv2d(int8 NCHW, int8 OIHW constant, ..., out_dtype="int32")`` ->
     ``add(., int32 constant (1, O, 1, 1))`` -> ``right_shift(., const int32)`` ->
     ``clip(., lo, hi)`` -> ``astype(., "int8")``;
   * linear: ``matmul(int8 [N, K], permute_dims(int8 constant [M, K]), out_dtype="int32")`` ->
     ``add(., int32 constant [M])`` -> right_shift -> clip -> astype;
   * max pool: ``max_pool2d`` on the int8 tensor (same scale; ``ceil_mode`` dropped where it does
     not change the output size);
   * average pool: ``avg_pool2d(astype(x, "int32"), ...)`` -> [right_shift] -> clip -> astype
     [-> reshape for a mean without keepdims] (TVM divides with truncation toward zero);
   * add: ``add(astype(a, "int32"), astype(b, "int32"))`` -> [right_shift] -> clip -> astype;
   * layout / split / concat: the operator itself on int8;
   * hardswish: ``t = clip(astype(x, int32) + t3, 0, t6)``, ``p = astype(x, int32) * t * M``,
     ``(p + 2**(k-1)) >> k`` -> clip -> astype, with ``t3 = 3 / 2**e_x``, ``t6 = 2 t3`` and
     ``M / 2**k = 2**(2 e_x - e_out) / 6`` (:func:`~vta_ext.quantize.common.fixed_point_multiplier`:
     ``M`` fits the ALU's 16-bit immediate and ``128 * t6 * M + 2**(k-1) < 2**31``, so nothing
     overflows int32);
   * float operators: the original operator on dequantised inputs,
     ``astype(q, "float32") * 2**e``;
   * output: ``astype(q, "float32") * 2**e`` on the CPU (a float output is returned as is).

   ``clip`` is ``[round(lo / s), round(hi / s)]`` within ``[-128, 127]`` for a fused clip
   ``[lo, hi]`` (``[0, 127]`` for a ReLU, ``[0, 96]`` for a ReLU6 at scale 1/16). The optional
   ``right_shift`` of add/average pool is emitted only for a non-zero shift; conv/linear always
   carry their bias add and shift.

Rounding
--------
Activations and weights are rounded to nearest (``np.round``, half to even) when quantised from
float. ``right_shift`` floors; for conv/linear the quantiser turns that into round-half-up by
adding ``2**(shift-1)`` to the int32 bias (free: the bias add is part of the pattern anyway).
Adds and average pools have no bias, so their shifts floor, and the pool's division truncates.

Everything is deterministic: no randomness, calibration is a pure function of the model and the
calibration inputs.
"""
from __future__ import annotations

from typing import Dict, Sequence, Tuple, Union

import numpy as np
import tvm

from ..report import CPU_REASONS_ATTR, LAYERS_ATTR
from .common import QMAX, QMIN, QuantizationError, fixed_point_multiplier, op_name, shape_of
from .emit import emit_module
from .graph import Analyser, CpuFloatOp, QNode, QuantizedModel
from .qdq import (OnnxImportError, has_qdq, import_onnx, import_pt2e, strip_qdq,
                  symmetric_quantizer)
from .scales import calibrate, choose_scales
from .torch_import import (equalize_cross_layer, fold_batchnorm, import_exported_program,
                           import_torch, normalise, source_layers)

__all__ = ["call_macs", "QuantizationError", "QNode", "CpuFloatOp", "QuantizedModel", "fold_batchnorm",
           "equalize_cross_layer", "import_torch", "import_exported_program", "calibrate",
           "quantize_relax", "quantize_torch", "op_macs", "fixed_point_multiplier",
           "source_layers", "QMIN", "QMAX", "import_pt2e", "import_onnx", "quantize_pt2e",
           "quantize_onnx", "symmetric_quantizer", "OnnxImportError"]


def quantize_relax(float_mod: tvm.IRModule,
                   calibration: Union[np.ndarray, Sequence[np.ndarray]]) -> QuantizedModel:
    """Quantise a float32 Relax module (``main`` with one input) into canonical int8 Relax.

    Parameters
    ----------
    float_mod : tvm.IRModule
        Float module with constant weights (from ``from_exported_program``, ``from_onnx``, ...).
        BatchNorm that follows a convolution is folded here if it was not folded before.
    calibration : numpy.ndarray or sequence of numpy.ndarray
        Calibration input(s) of the module's input shape.

    Returns
    -------
    QuantizedModel
        The int8 module; operators without an int8 mapping stay in float32 on the CPU and are
        listed in :attr:`QuantizedModel.cpu_float_ops`.

    Raises
    ------
    QuantizationError
        For a malformed graph (several inputs, non-dataflow control flow) or unrepresentable
        scales (shifts outside 0..31, int32 bias overflow).
    """
    annotations: Dict[str, float] = {}
    qweights: Dict[bytes, tuple] = {}
    if has_qdq(float_mod["main"]):  # PT2E / ONNX QDQ: keep the graph's scales and int8 weights
        float_mod, annotations, qweights = strip_qdq(float_mod)
    float_mod = normalise(float_mod)  # keeps main's attributes (the source layers)
    if isinstance(calibration, np.ndarray):
        calibration = [calibration]
    func = float_mod["main"]
    nodes, outputs = Analyser(func, annotations, qweights).run()
    names = [n.name for n in nodes if n.kind not in ("float", "split")]
    ranges = calibrate(float_mod, names, calibration)
    for n in nodes:
        n.max_abs = ranges.get(n.name, 0.0) if n.kind != "float" else 0.0
    choose_scales(nodes)
    mod, cpu_float, layers = emit_module(nodes, outputs, func.params[0])
    # for the build report (vta_ext.report): each binding's source layer, and why the float32
    # operators stay on the CPU
    mod["main"] = mod["main"].with_attr(LAYERS_ATTR, layers).with_attr(
        CPU_REASONS_ATTR, {op.var: op.reason for op in cpu_float})
    return QuantizedModel(mod, float_mod, nodes, outputs, cpu_float, layers)


def quantize_torch(model, calibration: Union[np.ndarray, Sequence[np.ndarray]],
                   equalize: bool = True) -> QuantizedModel:
    """Fold BatchNorm, import a PyTorch model and quantise it (see the module docstring).

    Parameters
    ----------
    model : torch.nn.Module
        Float model in eval mode with one NCHW float32 input.
    calibration : numpy.ndarray or sequence of numpy.ndarray
        Calibration input(s); the first fixes the input shape of the module.
    equalize : bool
        Equalise the weight ranges of conv-ReLU-conv pairs first (:func:`equalize_cross_layer`).

    Returns
    -------
    QuantizedModel
    """
    if isinstance(calibration, np.ndarray):
        calibration = [calibration]
    return quantize_relax(import_torch(model, calibration[0], equalize), calibration)


def call_macs(call) -> int:
    """Multiply-accumulates of one conv1d / conv2d / matmul call (0 for any other call): every
    output element times the reduction it sums (a grouped conv reduces over its group's channels).
    The one rule the build report and the end-to-end objective count MACs by."""
    op = op_name(call)
    out = shape_of(call)
    if op in ("relax.nn.conv2d", "relax.nn.conv1d"):
        _, cg, *kernel = shape_of(call.args[1])
        return int(np.prod(out, dtype=np.int64)) * cg * int(np.prod(kernel, dtype=np.int64))
    if op == "relax.matmul":
        lhs = shape_of(call.args[0])
        return int(np.prod(out, dtype=np.int64)) * lhs[-1]
    return 0


def op_macs(mod: tvm.IRModule) -> Dict[str, Tuple[str, int]]:
    """Multiply-accumulates of every conv2d and matmul binding of ``main`` (int8 or float).

    Returns
    -------
    dict
        Variable name -> (operator name, MACs), in program order.
    """
    result: Dict[str, Tuple[str, int]] = {}
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            op = op_name(b.value)
            if op in ("relax.nn.conv2d", "relax.matmul"):
                result[b.var.name] = (op, call_macs(b.value))
    return result


def quantize_pt2e(converted, calibration: Union[np.ndarray, Sequence[np.ndarray]]) -> QuantizedModel:
    """Import a PyTorch PT2E-quantised model (``convert_pt2e``) and map it to int8 Relax.

    The graph's own scales and int8 weights are kept (:mod:`vta_ext.quantize.qdq`); ratios of
    scales that are not powers of two are requantised by fixed-point multipliers. Use
    :func:`symmetric_quantizer` for ``prepare_pt2e``: zero points other than 0 stay in float.

    Parameters
    ----------
    converted : torch.fx.GraphModule
        The calibrated and converted model.
    calibration : numpy.ndarray or sequence of numpy.ndarray
        Input(s): the first fixes the input shape; they calibrate tensors the graph left
        unquantised.
    """
    if isinstance(calibration, np.ndarray):
        calibration = [calibration]
    return quantize_relax(import_pt2e(converted, calibration[0]), calibration)


def quantize_onnx(model, calibration: Union[np.ndarray, Sequence[np.ndarray]]) -> QuantizedModel:
    """Import an ONNX model, float or QDQ-quantised (:func:`import_onnx`), and quantise it:
    a float model VTA-style with power-of-two scales, a QDQ model with its own scales."""
    if isinstance(calibration, np.ndarray):
        calibration = [calibration]
    return quantize_relax(import_onnx(model, calibration[0].shape), calibration)
