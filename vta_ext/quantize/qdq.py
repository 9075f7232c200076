"""Standard quantised graphs: PyTorch PT2E (``torchao.quantization.pt2e``) and ONNX QDQ.

Both arrive in Relax as float graphs with ``relax.quantize`` / ``relax.dequantize`` around the
operators (TVM's ONNX importer makes them from QuantizeLinear / DequantizeLinear;
:func:`import_pt2e` maps PyTorch's ``quantized_decomposed`` operators to them). :func:`strip_qdq`
removes every symmetric pair ``dequantize(quantize(x, s, 0), s, 0)`` and remembers ``s`` as the
scale of ``x``, and turns ``dequantize(int8 constant, s_w, 0)`` into the float weight, remembering
the int8 values and ``s_w``. The quantiser then keeps those scales and weights instead of
calibrating power-of-two ones, and requantises with fixed-point multipliers where a ratio of
scales is not a power of two (:func:`vta_ext.quantize.scales._fixed_point_requant`).

Only symmetric int8 is mapped (zero point 0): VTA has no zero-point arithmetic. A pair with a
non-zero zero point (``X86InductorQuantizer``'s uint8 activations, ONNX Runtime's default
asymmetric activations) stays in float32 on the CPU, listed with that reason; export with
:func:`symmetric_quantizer` (PT2E) or ``ActivationSymmetric=True`` / ``WeightSymmetric=True``
(ONNX Runtime) instead.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import tvm
from tvm import relax

from .common import Constant, QuantizationError, op_name, substitute
from .torch_import import SOURCE_ATTR, import_exported_program, normalise

__all__ = ["strip_qdq", "has_qdq", "symmetric_quantizer", "import_pt2e", "import_onnx"]


def has_qdq(func: relax.Function) -> bool:
    """Whether ``func`` has ``relax.quantize`` / ``relax.dequantize`` operators."""
    return any(op_name(b.value) in ("relax.quantize", "relax.dequantize")
               for blk in func.body.blocks for b in blk.bindings)


def _const(expr, value: Optional[dict] = None) -> Optional[np.ndarray]:
    """The value of a constant, or of ``astype`` of a constant bound to a variable."""
    if isinstance(expr, Constant):
        return expr.value.numpy()
    bound = value.get(expr.name) if value is not None and isinstance(expr, relax.Var) else None
    if op_name(bound) == "relax.astype" and isinstance(bound.args[0], Constant):
        return bound.args[0].value.numpy().astype(str(bound.attrs.dtype))
    return None


def strip_qdq(mod: tvm.IRModule) -> Tuple[tvm.IRModule, Dict[str, float], Dict[bytes, tuple]]:
    """Remove symmetric quantize/dequantize pairs; see the module docstring.

    Returns
    -------
    tuple
        ``(float module, {variable: activation scale}, {float weight bytes: (int8 weight,
        scales, axis)})``. The module keeps ``main``'s attributes (the source layers).
    """
    func = mod["main"]
    bindings = [b for blk in func.body.blocks for b in blk.bindings]
    value = {b.var.name: b.value for b in bindings}
    rename: Dict[str, relax.Expr] = {}
    annotations: Dict[str, float] = {}
    weights: Dict[bytes, tuple] = {}
    params = [relax.Var(p.name, p.ty) for p in func.params]
    env = {p.name: v for p, v in zip(func.params, params)}

    def lookup(var):
        return rename.get(var.name, env.get(var.name, var))

    bb = relax.BlockBuilder()
    attrs = {str(k): v for k, v in func.attrs.items()} if func.attrs is not None else {}
    with bb.function("main", params, attrs=attrs):
        with bb.dataflow():
            for b in bindings:
                v = b.value
                op = op_name(v)
                if op == "relax.dequantize":
                    data, scale, zp = v.args
                    s, z = _const(scale, value), _const(zp, value)
                    src = value.get(data.name) if isinstance(data, relax.Var) else None
                    if s is not None and z is not None and not np.any(z):
                        q = _const(data)
                        if q is not None and str(q.dtype) == "int8":  # a weight
                            axis = int(v.attrs.axis) % q.ndim
                            shape = [1] * q.ndim
                            if s.size > 1:
                                shape[axis] = -1
                            w = (q.astype(np.float32) * s.astype(np.float32).reshape(shape))
                            weights[w.astype(np.float32).tobytes()] = (q, s.reshape(-1), axis)
                            rename[b.var.name] = relax.const(w.astype(np.float32))
                            continue
                        if (op_name(src) == "relax.quantize" and str(src.attrs.out_dtype) == "int8"
                                and s.size == 1
                                and np.array_equal(_const(src.args[1], value), s)
                                and not np.any(_const(src.args[2], value))):
                            x = src.args[0]
                            rename[b.var.name] = lookup(x) if isinstance(x, relax.Var) else x
                            if isinstance(x, relax.Var):
                                annotations[x.name] = float(s.reshape(-1)[0])
                            continue
                new = bb.emit(substitute(v, lookup), name_hint=b.var.name)
                env[b.var.name] = new
            body = substitute(func.body.body, lookup)
            out = bb.emit_output(body)
        bb.emit_func_output(out)
    stripped = relax.transform.DeadCodeElimination()(bb.get())
    return stripped, annotations, weights


# ------------------------------------------------------------------------------- PT2E
def symmetric_quantizer(per_channel: bool = False):
    """A ``torchao`` PT2E ``Quantizer`` for VTA: symmetric int8 per-tensor activations (zero point
    0, -128..127), symmetric int8 weights (-127..127) per tensor or per output channel, float
    biases. Annotates conv2d and linear (with a following ReLU fused into their output), adds
    and concats (all operands share one scale), and max pools / flattens / reshapes /
    transposes / splits (sharing their input's scale).

    Parameters
    ----------
    per_channel : bool
        Per-output-channel weight scales (requantised by a vector of multipliers).
    """
    import torch
    from torchao.quantization.pt2e.observer import MinMaxObserver, PerChannelMinMaxObserver
    from torchao.quantization.pt2e.quantizer import (QuantizationAnnotation, QuantizationSpec,
                                                     Quantizer, SharedQuantizationSpec)

    act = QuantizationSpec(torch.int8, MinMaxObserver.with_args(
        qscheme=torch.per_tensor_symmetric, dtype=torch.int8, quant_min=-128, quant_max=127),
        -128, 127, torch.per_tensor_symmetric)
    if per_channel:
        wgt = QuantizationSpec(torch.int8, PerChannelMinMaxObserver.with_args(
            qscheme=torch.per_channel_symmetric, dtype=torch.int8, quant_min=-127, quant_max=127,
            ch_axis=0), -127, 127, torch.per_channel_symmetric, ch_axis=0)
    else:
        wgt = QuantizationSpec(torch.int8, MinMaxObserver.with_args(
            qscheme=torch.per_tensor_symmetric, dtype=torch.int8, quant_min=-127, quant_max=127),
            -127, 127, torch.per_tensor_symmetric)
    import operator

    aten = torch.ops.aten
    splits = (aten.chunk.default, aten.split.Tensor, aten.split_with_sizes.default)
    relus = (aten.relu.default, aten.relu_.default)
    shared = (aten.max_pool2d.default, aten.flatten.using_ints, aten.view.default,
              aten.reshape.default, aten.adaptive_avg_pool2d.default, aten.transpose.int,
              aten.permute.default, aten.contiguous.default, aten.clone.default)

    def mark(node, **kw):
        node.meta["quantization_annotation"] = QuantizationAnnotation(_annotated=True, **kw)

    class VTAQuantizer(Quantizer):
        """Symmetric int8 for VTA (see :func:`symmetric_quantizer`)."""

        def annotate(self, gm):
            for n in gm.graph.nodes:
                if n.op != "call_function":
                    continue
                users = list(n.users)
                relu = users[0] if len(users) == 1 and users[0].target in relus else None
                if n.target in (aten.conv2d.default, aten.linear.default):
                    mark(n, input_qspec_map={n.args[0]: act, n.args[1]: wgt},
                         output_qspec=None if relu else act)
                    if relu is not None:
                        mark(relu, output_qspec=act)
                elif n.target in (aten.add.Tensor, aten.add_.Tensor) and all(
                        isinstance(a, torch.fx.Node) for a in n.args[:2]):
                    a, b = n.args[:2]
                    mark(n, input_qspec_map={a: act, b: SharedQuantizationSpec((a, n))},
                         output_qspec=None if relu else act)
                    if relu is not None:
                        mark(relu, output_qspec=act)
                elif n.target in (aten.cat.default, aten.concat.default) and isinstance(
                        n.args[0], (list, tuple)) and all(isinstance(a, torch.fx.Node)
                                                          for a in n.args[0]):
                    first, *rest = n.args[0]  # one scale for every operand and the result
                    qmap = {first: act}
                    qmap.update({a: SharedQuantizationSpec((first, n)) for a in rest})
                    mark(n, input_qspec_map=qmap, output_qspec=SharedQuantizationSpec((first, n)))
                elif n.target in splits and isinstance(n.args[0], torch.fx.Node):
                    # the pieces (getitem users) keep the input's scale
                    mark(n, input_qspec_map={n.args[0]: act})
                    for user in n.users:
                        if user.target is operator.getitem:
                            mark(user, output_qspec=SharedQuantizationSpec((n.args[0], n)))
                elif n.target in shared and isinstance(n.args[0], torch.fx.Node):
                    mark(n, input_qspec_map={n.args[0]: act},
                         output_qspec=SharedQuantizationSpec((n.args[0], n)))
            return gm

        def validate(self, gm) -> None:
            return None

    return VTAQuantizer()


def _pt2e_converters():
    """TVM converters for PyTorch's ``quantized_decomposed`` operators -> relax.(de)quantize."""

    def per_tensor(quant: bool):
        def convert(node, importer):
            x = importer.env[node.args[0]]
            scale, zp, _, _, dtype = node.args[1:6]
            dtype = str(dtype).replace("torch.", "")
            s = relax.const(np.float32(scale))
            z = relax.const(np.array(zp, dtype=dtype))
            if quant:
                return importer.block_builder.emit(relax.op.quantize(x, s, z, -1, dtype))
            return importer.block_builder.emit(relax.op.dequantize(x, s, z, -1, "float32"))
        return convert

    def per_channel(quant: bool):
        def convert(node, importer):
            x, s, z = (importer.env[a] for a in node.args[:3])
            axis, dtype = node.args[3], str(node.args[6]).replace("torch.", "")
            z = importer.block_builder.emit(relax.op.astype(z, dtype))
            s = importer.block_builder.emit(relax.op.astype(s, "float32"))
            if quant:
                return importer.block_builder.emit(relax.op.quantize(x, s, z, axis, dtype))
            return importer.block_builder.emit(relax.op.dequantize(x, s, z, axis, "float32"))
        return convert

    return {"quantize_per_tensor.default": per_tensor(True),
            "dequantize_per_tensor.default": per_tensor(False),
            "quantize_per_channel.default": per_channel(True),
            "dequantize_per_channel.default": per_channel(False)}


def import_pt2e(converted, example: np.ndarray) -> tvm.IRModule:
    """Export a ``convert_pt2e`` model and import it with its quantize/dequantize operators.

    Parameters
    ----------
    converted : torch.fx.GraphModule
        The result of ``convert_pt2e(prepare_pt2e(exported.module(), quantizer))`` after
        calibration.
    example : numpy.ndarray
        An input of the shape to specialise to.

    Returns
    -------
    tvm.IRModule
        Float Relax with ``relax.quantize`` / ``relax.dequantize``, source layers recorded.
    """
    import torch

    with torch.no_grad():
        program = torch.export.export(converted, (torch.from_numpy(np.ascontiguousarray(example)),))
    mod = import_exported_program(program, custom_convert_map=_pt2e_converters())
    return relax.transform.CanonicalizeBindings()(mod)


# ------------------------------------------------------------------------------- ONNX
#: ONNX operators of the QOperator format that TVM's importer lacks, and what to export instead
_QOPERATOR_HINT = ("TVM imports ONNX quantisation in the QDQ format (QuantizeLinear / "
                   "DequantizeLinear around float operators), not the QOperator format "
                   "(QLinearConv, QLinearMatMul, ConvInteger, ...): re-quantise with "
                   "onnxruntime.quantization.quantize_static(..., quant_format=QuantFormat.QDQ, "
                   "activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, "
                   "extra_options={'ActivationSymmetric': True, 'WeightSymmetric': True}), or "
                   "import the float model and quantise it with vta_ext.quantize.quantize_relax")


class OnnxImportError(QuantizationError):
    """TVM's ONNX importer refused the model; the message says what to export instead."""


def import_onnx(model, shape: Optional[Tuple[int, ...]] = None) -> tvm.IRModule:
    """Import an ONNX model (float, or QDQ-quantised) with TVM's importer, explaining refusals.

    Parameters
    ----------
    model : onnx.ModelProto or str
        The model or the path of a ``.onnx`` file.
    shape : tuple of int, optional
        The input shape, if the model's is dynamic.

    Returns
    -------
    tvm.IRModule
        Float Relax (with ``relax.quantize`` / ``relax.dequantize`` for a QDQ model); ``main``
        records each binding's ONNX node as its source layer.

    Raises
    ------
    OnnxImportError
        For operators TVM cannot import (``QLinearConv`` and the rest of the QOperator format:
        export QDQ instead), naming the operators and the nodes.
    """
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    if isinstance(model, str):
        model = onnx.load(model)
    qoperator = sorted({n.op_type for n in model.graph.node
                        if n.op_type.startswith("QLinear") or n.op_type.endswith("Integer")})
    if qoperator:
        names = [n.name or n.op_type for n in model.graph.node if n.op_type in qoperator][:3]
        raise OnnxImportError(f"ONNX operators {qoperator} (nodes {names}...): {_QOPERATOR_HINT}")
    shape_dict = None
    if shape is not None:
        shape_dict = {model.graph.input[0].name: list(shape)}
    try:
        mod = from_onnx(model, shape_dict=shape_dict, keep_params_in_input=False)
    except Exception as err:  # noqa: BLE001 - re-raised with the fix
        raise OnnxImportError(f"TVM's ONNX importer failed: {type(err).__name__}: {err}. If the "
                              f"model is quantised: {_QOPERATOR_HINT}") from err
    func = mod["main"]
    layers = {}
    if func.attrs is None or SOURCE_ATTR not in func.attrs:
        mod["main"] = func.with_attr(SOURCE_ATTR, layers)
    return normalise_keep_qdq(mod)


def normalise_keep_qdq(mod: tvm.IRModule) -> tvm.IRModule:
    """Canonicalise without folding ``dequantize`` of constant weights away."""
    return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(mod))
