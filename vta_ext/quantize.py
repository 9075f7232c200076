"""VTA-style post-training quantisation of float models into canonical int8 Relax.

The quantiser turns a float32 model (a PyTorch ``nn.Module``, or a float Relax module from any
frontend) into an int8 Relax module made only of the canonical patterns that the ``ext_vta``
offload pass recognises. It follows the scheme of the original VTA stack: symmetric int8
activations and weights whose scales are powers of two, int32 accumulation, and requantisation by
an arithmetic right shift followed by a clip, which VTA's ALU performs (SHR, MIN/MAX) before the
store truncates to int8.

Pipeline
--------
1. **BatchNorm folding** (:func:`fold_batchnorm`, torch models only): every ``Conv2d`` whose only
   consumer is a ``BatchNorm2d`` (eval mode) absorbs it (``torch.fx``), so the graph has
   conv + bias only. Then **cross-layer equalisation** (:func:`equalize_cross_layer`, on by
   default) rescales the channels of every conv-ReLU-conv pair so both have equal per-channel weight
   ranges; this is exact in float and is what makes per-tensor weight scales work for depthwise
   convolutions (MobileNet).
2. **Import**: ``torch.export`` + ``from_exported_program`` (weights become constants), then
   ``FoldConstant`` / ``CanonicalizeBindings`` / ``DeadCodeElimination``.
3. **Analysis**: the float bindings are grouped into *nodes*, each producing one int8 tensor:
   ``input``; ``conv`` (conv2d [+ per-channel bias] [+ ReLU], any ``groups``); ``linear``
   (matmul with a constant weight [+ bias] [+ ReLU]); ``add`` (sum of two quantised tensors
   [+ ReLU]); ``avgpool`` (global average pool: ``mean`` over H, W, ``adaptive_avg_pool2d`` to
   1x1, or an ``avg_pool2d`` covering the input); ``maxpool``; ``reshape``. Anything else raises
   :class:`QuantizationError`.
4. **Calibration**: the float graph runs on llvm on the calibration input(s), with the float
   tensor of every node as an extra output; each node records ``max |x|`` (after its ReLU, if it
   has one).
5. **Scales** (all powers of two, ``s = 2**e``):

   * activation: ``e = ceil(log2(max|x| / 127))`` (so the calibrated range fits in int8);
   * weight (per tensor): ``e_w = ceil(log2(max|W| / 127))``, ``W_q = round(W / 2**e_w)``;
   * the int32 accumulator of a conv/linear has exponent ``e_x + e_w``; its bias is
     ``round(b / 2**(e_x + e_w))``;
   * the two operands of a residual ``add`` and the input and output of a ``maxpool`` /
     ``reshape`` must share one scale: such tensors are merged into groups (union-find) and the
     group takes the largest exponent of its members — the producers' requantisation shifts absorb
     the difference;
   * **no negative shifts**: a requantising node's output exponent is raised, if needed, to its
     accumulator exponent (``e_x + e_w`` for conv/linear, ``e_x`` for add and average pool). Both
     rules only ever raise exponents, so they are iterated to a fixed point. A shift above 31, or
     a group that never settles, raises :class:`QuantizationError`.

   The requantisation shift of a node is ``e_out - e_acc`` (0..31).
6. **Rewrite** into int8 Relax using exactly these patterns (the contract with the offload pass):

   * input: ``astype(clip(round(x * 2**-e), -128, 127), "int8")`` on the CPU;
   * conv2d: ``conv2d(int8 NCHW, int8 OIHW constant, ..., out_dtype="int32")`` ->
     ``add(., int32 constant (1, O, 1, 1))`` -> ``right_shift(., const int32)`` ->
     ``clip(., lo, hi)`` -> ``astype(., "int8")``;
   * linear: ``matmul(int8 [N, K], permute_dims(int8 constant [M, K]), out_dtype="int32")`` ->
     ``add(., int32 constant [M])`` -> right_shift -> clip -> astype;
   * max pool: ``max_pool2d`` on the int8 tensor (same scale);
   * global average pool: ``avg_pool2d(astype(x, "int32"), pool_size=(H, W))`` -> [right_shift]
     -> clip -> astype (TVM divides with truncation toward zero);
   * residual add: ``add(astype(a, "int32"), astype(b, "int32"))`` -> [right_shift] -> clip ->
     astype;
   * reshape/flatten: ``reshape`` on int8;
   * output: ``astype(q, "float32") * 2**e`` on the CPU.

   ``clip`` is ``[0, 127]`` where a ReLU follows, ``[-128, 127]`` otherwise. The optional
   ``right_shift`` of add/average pool is emitted only for a non-zero shift; conv/linear always
   carry their bias add and shift.

Rounding
--------
Activations and weights are rounded to nearest (``np.round``, half to even) when quantised from
float. ``right_shift`` floors; for conv/linear the quantiser turns that into round-half-up by
adding ``2**(shift-1)`` to the int32 bias (free: the bias add is part of the pattern anyway).
Residual adds and average pools have no bias, so their shifts floor, and the pool's division
truncates.

Everything is deterministic: no randomness, calibration is a pure function of the model and the
calibration inputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tvm
from tvm import relax

__all__ = ["QuantizationError", "QNode", "QuantizedModel", "fold_batchnorm", "equalize_cross_layer",
           "import_torch", "calibrate",
           "quantize_relax", "quantize_torch", "op_macs"]

QMIN, QMAX = -128, 127
_Constant = tvm.ir.expr.Constant


class QuantizationError(ValueError):
    """The float graph cannot be expressed with the canonical int8 patterns."""


# ------------------------------------------------------------------------------------ helpers
def _op_name(expr) -> Optional[str]:
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def _shape(expr) -> Tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


def _exponent(max_abs: float, qmax: int = QMAX) -> int:
    """Smallest ``e`` with ``max_abs / 2**e <= qmax`` (``max_abs == 0`` gives -30)."""
    if not np.isfinite(max_abs):
        raise QuantizationError(f"non-finite calibration range {max_abs}")
    if max_abs <= 0:
        return -30
    e = math.ceil(math.log2(max_abs / qmax))
    while max_abs / 2.0 ** e > qmax:  # guard against log2 rounding
        e += 1
    return e


def _quantize_array(values: np.ndarray, e: int, dtype=np.int8) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(np.round(values.astype(np.float64) * 2.0 ** -e), info.min, info.max).astype(dtype)


# -------------------------------------------------------------------------------------- nodes
@dataclass
class QNode:
    """One quantised tensor of the int8 graph and the float computation it stands for.

    Attributes
    ----------
    kind : str
        ``input``, ``conv``, ``linear``, ``add``, ``avgpool``, ``maxpool`` or ``reshape``.
    name : str
        Name of the float Relax variable whose value this node's int8 tensor represents.
    inputs : list of int
        Indices of the input nodes.
    relu : bool
        Whether a ReLU is fused (clip to ``[0, 127]``).
    call : relax.Call or None
        The float operator call (conv2d, matmul, pool, reshape).
    weight, bias : numpy.ndarray or None
        Float weight (OIHW for conv, [M, K] for linear) and bias ([O]).
    max_abs : float
        Calibrated ``max |x|`` of the float tensor.
    exponent : int
        Output scale exponent (``scale = 2**exponent``), set by scale selection.
    weight_exponent : int or None
        Weight scale exponent of conv/linear nodes.
    shift : int
        Requantisation right shift (conv, linear, add, avgpool).
    """

    kind: str
    name: str
    inputs: List[int] = field(default_factory=list)
    relu: bool = False
    call: Optional[relax.Call] = None
    weight: Optional[np.ndarray] = None
    bias: Optional[np.ndarray] = None
    max_abs: float = 0.0
    exponent: int = 0
    weight_exponent: Optional[int] = None
    shift: int = 0

    @property
    def scale(self) -> float:
        """The output scale ``2**exponent``."""
        return 2.0 ** self.exponent


@dataclass
class QuantizedModel:
    """Result of quantisation.

    Attributes
    ----------
    mod : tvm.IRModule
        The int8 Relax module (float32 input, float32 outputs; weights bound as constants).
    float_mod : tvm.IRModule
        The normalised float32 Relax module it was derived from.
    nodes : list of QNode
        The quantised tensors, in program order, with their scales and shifts.
    outputs : list of int
        Node index of every output of the tuple the module returns.
    """

    mod: tvm.IRModule
    float_mod: tvm.IRModule
    nodes: List[QNode]
    outputs: List[int]

    def summary(self) -> str:
        """A table of nodes: kind, float variable, exponents and shifts."""
        lines = [f"{'#':>3} {'kind':<8} {'var':<8} {'e_out':>5} {'e_w':>4} {'shift':>5} relu max|x|"]
        for i, n in enumerate(self.nodes):
            ew = "" if n.weight_exponent is None else str(n.weight_exponent)
            lines.append(f"{i:>3} {n.kind:<8} {n.name:<8} {n.exponent:>5} {ew:>4} {n.shift:>5} "
                         f"{'y' if n.relu else ' ':>4} {n.max_abs:.4g}")
        return "\n".join(lines)


# ------------------------------------------------------------------------------ torch front end
def fold_batchnorm(model):
    """Fold every eval-mode ``BatchNorm2d`` into the ``Conv2d`` that feeds only it.

    Parameters
    ----------
    model : torch.nn.Module
        A model in eval mode that ``torch.fx.symbolic_trace`` can trace.

    Returns
    -------
    torch.fx.GraphModule
        A traced copy with the folded convolutions (the input model is not modified).
    """
    import copy

    import torch
    import torch.fx
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    if model.training:
        raise QuantizationError("fold_batchnorm needs a model in eval mode (call model.eval())")
    gm = torch.fx.symbolic_trace(copy.deepcopy(model))
    modules = dict(gm.named_modules())
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not isinstance(modules[node.target], torch.nn.BatchNorm2d):
            continue
        prev = node.args[0]
        if (isinstance(prev, torch.fx.Node) and prev.op == "call_module"
                and isinstance(modules[prev.target], torch.nn.Conv2d) and len(prev.users) == 1):
            fused = fuse_conv_bn_eval(modules[prev.target], modules[node.target])
            parent, _, attr = prev.target.rpartition(".")
            setattr(gm.get_submodule(parent) if parent else gm, attr, fused)
            modules[prev.target] = fused
            node.replace_all_uses_with(prev)
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


def equalize_cross_layer(gm, sweeps: int = 8) -> int:
    """Cross-layer weight equalisation (Nagel et al., 2019, "Data-free quantization") in place.

    For every ``Conv2d`` A whose only consumer is a ReLU whose only consumer is a ``Conv2d`` B
    (B plain, ``groups=1``, or depthwise), output channel ``i`` of A is divided by
    ``s_i = sqrt(r1_i / r2_i)`` and input channel ``i`` of B multiplied by it, where ``r1_i`` and
    ``r2_i`` are the largest ``|w|`` of that channel in A and in B. ReLU commutes with a positive
    scale, so the float function is unchanged, while the per-channel weight ranges of both layers
    become equal — which is what a per-tensor weight scale needs (depthwise convolutions with folded
    BatchNorm otherwise have channels whose range is tens of times the median).

    Parameters
    ----------
    gm : torch.fx.GraphModule
        A traced model with BatchNorm already folded (:func:`fold_batchnorm`).
    sweeps : int
        Passes over all pairs (scales of a chain of pairs interact; a few passes settle them).

    Returns
    -------
    int
        The number of equalised pairs.
    """
    import torch

    modules = dict(gm.named_modules())

    def conv_of(node):
        if node.op == "call_module" and isinstance(modules.get(node.target), torch.nn.Conv2d):
            return modules[node.target]
        return None

    def is_relu(node) -> bool:
        return ((node.op == "call_module" and isinstance(modules.get(node.target), torch.nn.ReLU))
                or (node.op == "call_function" and node.target in (torch.relu,
                                                                    torch.nn.functional.relu)))

    pairs = []
    for node in gm.graph.nodes:
        a = conv_of(node)
        if a is None or len(node.users) != 1:
            continue
        relu = next(iter(node.users))
        if not is_relu(relu) or len(relu.users) != 1:
            continue
        b = conv_of(next(iter(relu.users)))
        if b is None or b.in_channels != a.out_channels:
            continue
        if b.groups == 1 or b.groups == b.in_channels == b.out_channels:
            pairs.append((a, b))
    with torch.no_grad():
        for _ in range(sweeps):
            for a, b in pairs:
                r1 = a.weight.abs().reshape(a.out_channels, -1).amax(1).double()
                wb = b.weight.abs()
                r2 = (wb.amax(dim=(0, 2, 3)) if b.groups == 1 else wb.reshape(b.out_channels, -1)
                      .amax(1)).double()
                s = torch.where((r1 > 0) & (r2 > 0), torch.sqrt(r1 / r2.clamp_min(1e-300)),
                                torch.ones_like(r1))
                a.weight.div_(s.reshape(-1, 1, 1, 1).to(a.weight.dtype))
                if a.bias is not None:
                    a.bias.div_(s.to(a.bias.dtype))
                shape = (1, -1, 1, 1) if b.groups == 1 else (-1, 1, 1, 1)
                b.weight.mul_(s.reshape(shape).to(b.weight.dtype))
    return len(pairs)


def import_torch(model, example: np.ndarray, equalize: bool = True) -> tvm.IRModule:
    """Fold BatchNorm, ``torch.export`` the model and import it as a float32 Relax module.

    Parameters
    ----------
    model : torch.nn.Module
        Float model in eval mode, one tensor input.
    example : numpy.ndarray
        An input of the shape the module is specialised to.
    equalize : bool
        Apply :func:`equalize_cross_layer` after folding (exact in float arithmetic).

    Returns
    -------
    tvm.IRModule
        Normalised float Relax module with the weights bound as constants.
    """
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    folded = fold_batchnorm(model)
    if equalize:
        equalize_cross_layer(folded)
    with torch.no_grad():
        program = torch.export.export(folded, (torch.from_numpy(np.ascontiguousarray(example)),))
    return _normalise(from_exported_program(program, keep_params_as_input=False))


def _normalise(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.transform.Sequential([
        relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(),
    ])(mod)


# ---------------------------------------------------------------------------------- analysis
class _Analyser:
    """Groups the float bindings of ``main`` into :class:`QNode` s."""

    def __init__(self, func: relax.Function) -> None:
        if len(func.params) != 1:
            raise QuantizationError(f"main must take one tensor input, it takes {len(func.params)}")
        blocks = func.body.blocks
        self.bindings = [b for block in blocks for b in block.bindings]
        for b in self.bindings:
            if not isinstance(b, relax.VarBinding):
                raise QuantizationError(f"unsupported binding {type(b).__name__}")
        names = [b.var.name for b in self.bindings] + [func.params[0].name]
        if len(set(names)) != len(names):
            raise QuantizationError("variable names of main are not unique")
        self.value = {b.var.name: b.value for b in self.bindings}
        self.users: Dict[str, List[str]] = {n: [] for n in names}
        for b in self.bindings:
            for used in _used_vars(b.value):
                self.users.setdefault(used, []).append(b.var.name)
        body = func.body.body
        self.body_var = body.name if isinstance(body, relax.Var) else None
        if self.body_var is not None:
            self.users[self.body_var].append("<return>")
        self.nodes: List[QNode] = []
        self.node_of: Dict[str, int] = {}  # float var name -> node index
        self.param = func.params[0]
        self._add(QNode("input", self.param.name))
        self.outputs: List[int] = []

    def _add(self, node: QNode) -> int:
        self.nodes.append(node)
        self.node_of[node.name] = len(self.nodes) - 1
        return len(self.nodes) - 1

    def _single_user(self, name: str) -> Optional[str]:
        users = self.users.get(name, [])
        return users[0] if len(users) == 1 and users[0] != "<return>" else None

    def _qin(self, expr, where: str) -> int:
        if isinstance(expr, relax.Var) and expr.name in self.node_of:
            return self.node_of[expr.name]
        raise QuantizationError(f"{where}: operand {expr} is not a quantised tensor")

    def _absorb(self, name: str, node: QNode, consumed: set, allow_bias: bool) -> str:
        """Fuse a following per-channel constant bias add and/or ReLU; returns the end var."""
        nxt = self._single_user(name)
        if allow_bias and nxt is not None and _op_name(self.value[nxt]) == "relax.add":
            a, b = self.value[nxt].args
            const = b if isinstance(b, _Constant) else a if isinstance(a, _Constant) else None
            other = a if const is b else b
            if const is not None and isinstance(other, relax.Var) and other.name == name:
                bias = const.value.numpy().astype(np.float64)
                out_ch = node.weight.shape[0]
                if bias.size == out_ch and _bias_shape_ok(bias.shape, node.kind):
                    node.bias = bias.reshape(-1)
                    consumed.add(nxt)
                    name = nxt
                    nxt = self._single_user(name)
        if nxt is not None and _op_name(self.value[nxt]) == "relax.nn.relu":
            node.relu = True
            consumed.add(nxt)
            name = nxt
        return name

    def run(self) -> Tuple[List[QNode], List[int]]:
        consumed: set = set()
        for b in self.bindings:
            name, value = b.var.name, b.value
            if name in consumed:
                continue
            op = _op_name(value)
            where = f"{name} = {op or type(value).__name__}"
            if op == "relax.nn.conv2d":
                a = value.attrs
                if (a.data_layout, a.kernel_layout) != ("NCHW", "OIHW"):
                    raise QuantizationError(f"{where}: layout {a.data_layout}/{a.kernel_layout}")
                weight = value.args[1]
                if not isinstance(weight, _Constant):
                    raise QuantizationError(f"{where}: weight is not a constant")
                node = QNode("conv", name, [self._qin(value.args[0], where)], call=value,
                             weight=weight.value.numpy().astype(np.float64))
                node.name = self._absorb(name, node, consumed, allow_bias=True)
                self._add(node)
            elif op == "relax.matmul":
                lhs, rhs = value.args
                weight = _linear_weight(rhs)
                if weight is None or len(_shape(lhs)) != 2:
                    raise QuantizationError(f"{where}: only [N, K] x constant [K, M] is supported")
                node = QNode("linear", name, [self._qin(lhs, where)], call=value, weight=weight)
                node.name = self._absorb(name, node, consumed, allow_bias=True)
                self._add(node)
            elif op == "relax.add":
                lhs, rhs = value.args
                node = QNode("add", name, [self._qin(lhs, where), self._qin(rhs, where)])
                if _shape(lhs) != _shape(rhs):
                    raise QuantizationError(f"{where}: broadcasting add {_shape(lhs)} + {_shape(rhs)}")
                node.name = self._absorb(name, node, consumed, allow_bias=False)
                self._add(node)
            elif op in ("relax.mean", "relax.nn.adaptive_avg_pool2d", "relax.nn.avg_pool2d"):
                src = value.args[0]
                if not _is_global_pool(value):
                    raise QuantizationError(f"{where}: only a global average pool (keep dims) is "
                                            f"supported, got {value}")
                node = QNode("avgpool", name, [self._qin(src, where)], call=value)
                node.name = self._absorb(name, node, consumed, allow_bias=False)
                self._add(node)
            elif op == "relax.nn.max_pool2d":
                self._add(QNode("maxpool", name, [self._qin(value.args[0], where)], call=value))
            elif op == "relax.reshape":
                self._add(QNode("reshape", name, [self._qin(value.args[0], where)], call=value))
            elif isinstance(value, relax.Tuple) and name == self.body_var:
                self.outputs = [self._qin(f, where) for f in value.fields]
            elif op == "relax.nn.relu":
                raise QuantizationError(f"{where}: a ReLU that does not directly follow a conv, "
                                        f"linear, residual add or average pool")
            else:
                raise QuantizationError(f"{where}: operator not supported by the VTA quantiser")
        if self.body_var is None or not self.outputs:
            if self.body_var in self.node_of:
                self.outputs = [self.node_of[self.body_var]]
            else:
                raise QuantizationError("main must return a quantised tensor or a tuple of them")
        return self.nodes, self.outputs


def _used_vars(expr) -> List[str]:
    names: List[str] = []
    relax.analysis.post_order_visit(
        expr, lambda e: names.append(e.name) if isinstance(e, relax.Var) else None)
    return names


def _bias_shape_ok(shape: Tuple[int, ...], kind: str) -> bool:
    """Whether a constant of ``shape`` broadcasts as one value per output channel."""
    if kind == "conv":  # NCHW: channel axis 1
        return shape[-3:] == (shape[-3], 1, 1) and all(d == 1 for d in shape[:-3])
    return all(d == 1 for d in shape[:-1])  # linear: the last axis


def _linear_weight(rhs) -> Optional[np.ndarray]:
    """The [M, K] weight of ``x @ rhs`` if ``rhs`` is a constant [K, M] or permute_dims of [M, K]."""
    if isinstance(rhs, _Constant) and len(_shape(rhs)) == 2:
        return rhs.value.numpy().astype(np.float64).T
    if _op_name(rhs) == "relax.permute_dims" and isinstance(rhs.args[0], _Constant):
        axes = rhs.attrs.axes
        if axes is None or [int(a) for a in axes] == [1, 0]:
            return rhs.args[0].value.numpy().astype(np.float64)
    return None


def _is_global_pool(call: relax.Call) -> bool:
    n, c, h, w = _shape(call.args[0])
    out = _shape(call)
    if out != (n, c, 1, 1):
        return False
    op = _op_name(call)
    if op == "relax.mean":
        axes = sorted(int(a) % 4 for a in call.attrs.axis)
        return axes == [2, 3] and bool(call.attrs.keepdims)
    if op == "relax.nn.avg_pool2d":
        a = call.attrs
        return (tuple(int(p) for p in a.pool_size) == (h, w)
                and all(int(p) == 0 for p in a.padding) and str(a.layout) == "NCHW")
    return str(call.attrs.layout) == "NCHW"  # adaptive_avg_pool2d to (1, 1)


# ------------------------------------------------------------------------------- calibration
def calibrate(float_mod: tvm.IRModule, names: Sequence[str],
              inputs: Sequence[np.ndarray]) -> Dict[str, float]:
    """``max |x|`` of the named float tensors of ``main``, over the calibration ``inputs``.

    The function is rebuilt (on llvm) to return every named tensor, then run on each input.
    """
    func = relax.transform.ToNonDataflow()(float_mod)["main"]
    bindings = {b.var.name: b.var for block in func.body.blocks for b in block.bindings}
    param = func.params[0]
    outs = [param if n == param.name else bindings[n] for n in names]
    body = relax.BlockBuilder().normalize(relax.SeqExpr(func.body.blocks, relax.Tuple(outs)))
    probe = tvm.IRModule({"main": relax.Function(func.params, body)})
    vm = relax.VirtualMachine(relax.build(probe, target="llvm"), tvm.cpu())
    ranges = {n: 0.0 for n in names}
    for x in inputs:
        results = vm["main"](tvm.runtime.tensor(np.ascontiguousarray(x, dtype=np.float32)))
        for n, r in zip(names, results):
            ranges[n] = max(ranges[n], float(np.abs(r.numpy()).max()))
    return ranges


# ---------------------------------------------------------------------------- scale selection
def _choose_scales(nodes: List[QNode]) -> None:
    parent = list(range(len(nodes)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        parent[find(i)] = find(j)

    for i, n in enumerate(nodes):
        if n.kind in ("maxpool", "reshape"):
            union(i, n.inputs[0])
        elif n.kind == "add":
            union(n.inputs[0], n.inputs[1])
        if n.kind in ("conv", "linear"):
            n.weight_exponent = _exponent(float(np.abs(n.weight).max()))
    group_e: Dict[int, int] = {}
    for i, n in enumerate(nodes):
        e = _exponent(n.max_abs)
        group_e[find(i)] = max(group_e.get(find(i), e), e)

    def acc_exponent(n: QNode) -> Optional[int]:
        if n.kind in ("conv", "linear"):
            return group_e[find(n.inputs[0])] + n.weight_exponent
        if n.kind in ("add", "avgpool"):
            return group_e[find(n.inputs[0])]
        return None

    for _ in range(4 * len(nodes) + 4):
        changed = False
        for i, n in enumerate(nodes):
            acc = acc_exponent(n)
            if acc is not None and group_e[find(i)] < acc:  # no negative shifts: raise the output
                group_e[find(i)] = acc
                changed = True
        if not changed:
            break
    else:
        raise QuantizationError("scale selection did not converge: a residual group feeds itself "
                                "through a weight with scale > 1")
    for i, n in enumerate(nodes):
        n.exponent = group_e[find(i)]
        acc = acc_exponent(n)
        if acc is not None:
            n.shift = n.exponent - acc
            if not 0 <= n.shift <= 31:
                raise QuantizationError(f"node {i} ({n.kind} {n.name}): right shift {n.shift} "
                                        f"outside 0..31")


# ------------------------------------------------------------------------------------ rewrite
class _Emitter:
    def __init__(self, bb: relax.BlockBuilder) -> None:
        self.bb = bb
        self.used: set = set()

    def __call__(self, expr, name: str):
        base, k = name, 1
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return self.bb.emit(expr, name_hint=name)

    def requant(self, acc, shift: Optional[int], relu: bool, name: str):
        if shift is not None:
            acc = self(relax.op.right_shift(acc, relax.const(shift, "int32")), f"{name}_shr")
        acc = self(relax.op.clip(acc, 0 if relu else QMIN, QMAX), f"{name}_clip")
        return self(relax.op.astype(acc, "int8"), f"{name}_q")


def _emit(nodes: List[QNode], outputs: List[int], param: relax.Var) -> tvm.IRModule:
    x = relax.Var(param.name, relax.TensorType(_shape(param), "float32"))
    bb = relax.BlockBuilder()
    emit = _Emitter(bb)
    q: List[relax.Expr] = []
    with bb.function("main", [x]):
        with bb.dataflow():
            for i, n in enumerate(nodes):
                tag = n.name
                if n.kind == "input":
                    t = emit(relax.op.multiply(x, relax.const(2.0 ** -n.exponent, "float32")),
                             f"{tag}_scaled")
                    t = emit(relax.op.round(t), f"{tag}_round")
                    t = emit(relax.op.clip(t, QMIN, QMAX), f"{tag}_clip")
                    q.append(emit(relax.op.astype(t, "int8"), f"{tag}_q"))
                elif n.kind in ("conv", "linear"):
                    src = nodes[n.inputs[0]]
                    e_acc = src.exponent + n.weight_exponent
                    w_q = _quantize_array(n.weight, n.weight_exponent)
                    bias = np.zeros(w_q.shape[0]) if n.bias is None else n.bias
                    b_q = np.round(bias * 2.0 ** -e_acc)
                    if n.shift > 0:
                        b_q += 2 ** (n.shift - 1)  # round half up instead of the shift's floor
                    if np.abs(b_q).max(initial=0) >= 2 ** 31:
                        raise QuantizationError(f"{n.kind} {n.name}: int32 bias overflow")
                    b_q = b_q.astype(np.int32)
                    if n.kind == "conv":
                        a = n.call.attrs
                        acc = emit(relax.op.nn.conv2d(
                            q[n.inputs[0]], relax.const(w_q), strides=a.strides, padding=a.padding,
                            dilation=a.dilation, groups=a.groups, data_layout="NCHW",
                            kernel_layout="OIHW", out_dtype="int32"), f"conv_{tag}")
                        bias_c = relax.const(b_q.reshape(1, -1, 1, 1))
                    else:
                        wt = emit(relax.op.permute_dims(relax.const(w_q), [1, 0]), f"wt_{tag}")
                        acc = emit(relax.op.matmul(q[n.inputs[0]], wt, out_dtype="int32"),
                                   f"matmul_{tag}")
                        bias_c = relax.const(b_q)
                    acc = emit(relax.op.add(acc, bias_c), f"{tag}_bias")
                    q.append(emit.requant(acc, n.shift, n.relu, tag))
                elif n.kind == "add":
                    a32 = emit(relax.op.astype(q[n.inputs[0]], "int32"), f"{tag}_lhs")
                    b32 = emit(relax.op.astype(q[n.inputs[1]], "int32"), f"{tag}_rhs")
                    acc = emit(relax.op.add(a32, b32), f"add_{tag}")
                    q.append(emit.requant(acc, n.shift or None, n.relu, tag))
                elif n.kind == "avgpool":
                    _, _, h, w = _shape(n.call.args[0])
                    x32 = emit(relax.op.astype(q[n.inputs[0]], "int32"), f"{tag}_i32")
                    acc = emit(relax.op.nn.avg_pool2d(x32, pool_size=(h, w), strides=(1, 1)),
                               f"avgpool_{tag}")
                    q.append(emit.requant(acc, n.shift or None, n.relu, tag))
                elif n.kind == "maxpool":
                    a = n.call.attrs
                    q.append(emit(relax.op.nn.max_pool2d(
                        q[n.inputs[0]], pool_size=a.pool_size, strides=a.strides,
                        padding=a.padding, dilation=a.dilation, ceil_mode=a.ceil_mode,
                        layout="NCHW"), f"maxpool_{tag}"))
                elif n.kind == "reshape":
                    q.append(emit(relax.op.reshape(q[n.inputs[0]], _shape(n.call)), f"reshape_{tag}"))
                else:  # pragma: no cover - the analyser only creates the kinds above
                    raise QuantizationError(f"unknown node kind {n.kind}")
            results = []
            for k, i in enumerate(outputs):
                f = emit(relax.op.astype(q[i], "float32"), f"out{k}_f32")
                results.append(emit(relax.op.multiply(
                    f, relax.const(nodes[i].scale, "float32")), f"out{k}"))
            out = bb.emit_output(relax.Tuple(results))
        bb.emit_func_output(out)
    return bb.get()


# -------------------------------------------------------------------------------- entry points
def quantize_relax(float_mod: tvm.IRModule,
                   calibration: Union[np.ndarray, Sequence[np.ndarray]]) -> QuantizedModel:
    """Quantise a float32 Relax module (``main`` with one input) into canonical int8 Relax.

    Parameters
    ----------
    float_mod : tvm.IRModule
        Float module with constant weights; BatchNorm must already be folded.
    calibration : numpy.ndarray or sequence of numpy.ndarray
        Calibration input(s) of the module's input shape.

    Returns
    -------
    QuantizedModel

    Raises
    ------
    QuantizationError
        For operators or graph shapes outside the supported set, or unrepresentable scales.
    """
    float_mod = _normalise(float_mod)
    if isinstance(calibration, np.ndarray):
        calibration = [calibration]
    func = float_mod["main"]
    nodes, outputs = _Analyser(func).run()
    ranges = calibrate(float_mod, [n.name for n in nodes], calibration)
    for n in nodes:
        n.max_abs = ranges[n.name]
    _choose_scales(nodes)
    return QuantizedModel(_emit(nodes, outputs, func.params[0]), float_mod, nodes, outputs)


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


def op_macs(mod: tvm.IRModule) -> Dict[str, Tuple[str, int]]:
    """Multiply-accumulates of every conv2d and matmul binding of ``main``.

    Returns
    -------
    dict
        Variable name -> (operator name, MACs), in program order.
    """
    result: Dict[str, Tuple[str, int]] = {}
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            op = _op_name(b.value)
            if op == "relax.nn.conv2d":
                _, c, _, _ = _shape(b.value.args[0])
                o, cg, kh, kw = _shape(b.value.args[1])
                n, _, oh, ow = _shape(b.var)
                result[b.var.name] = (op, n * o * oh * ow * cg * kh * kw)
            elif op == "relax.matmul":
                lhs, rhs = _shape(b.value.args[0]), _shape(b.value.args[1])
                result[b.var.name] = (op, int(np.prod(lhs)) * rhs[-1])
    return result
