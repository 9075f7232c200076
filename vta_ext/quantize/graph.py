"""Analysis of a float Relax ``main`` into quantised nodes and float CPU operators."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import tvm
from tvm import relax

from .common import (Constant, QuantizationError, dtype_of, op_name, prim_float, shape_of,
                     used_vars)
from .torch_import import source_layers

__all__ = ["QNode", "CpuFloatOp", "QuantizedModel", "Analyser", "TENSOR_KINDS"]

#: node kinds whose output is one int8 tensor with a scale (everything but ``float``/``split``)
TENSOR_KINDS = ("input", "quant", "conv", "linear", "add", "avgpool", "maxpool", "layout",
                "concat", "hswish", "clip")

_LAYOUT_OPS = ("relax.reshape", "relax.permute_dims", "relax.strided_slice", "relax.squeeze",
               "relax.expand_dims", "relax.flatten")
_AFFINE_OPS = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")
_TRANSCENDENTAL = ("relax.sigmoid", "relax.tanh", "relax.exp", "relax.log", "relax.erf",
                   "relax.nn.gelu", "relax.nn.silu", "relax.nn.softmax", "relax.nn.log_softmax",
                   "relax.sqrt", "relax.rsqrt", "relax.power", "relax.nn.gelu_tanh")


@dataclass
class QNode:
    """One step of the quantised program: an int8 tensor, or a float operator left on the CPU.

    Attributes
    ----------
    kind : str
        ``input`` (the model input, quantised), ``quant`` (a float tensor computed on the CPU,
        quantised), ``conv`` (conv2d, or a per-channel affine map as a 1x1 depthwise conv),
        ``linear``, ``add`` (of two quantised tensors), ``avgpool``, ``maxpool``, ``layout``
        (reshape, transpose, slice, an item of a split: no arithmetic), ``concat``, ``split``
        (an int8 tuple), ``hswish``, ``clip`` (an int8 clip with no requantisation to fuse into),
        or ``float`` (a float32 operator on the CPU, see :attr:`reason`).
    name : str
        Name of the float Relax variable whose value this node represents (the end of the fused
        chain, e.g. the ReLU after conv + bias).
    inputs : list of int
        Indices of the quantised input nodes (for ``float``: the nodes it dequantises).
    call : relax.Expr or None
        The float expression (conv, pool, layout operator, or the float operator itself).
    weight, bias : numpy.ndarray or None
        Float weight (OIHW for conv, [M, K] for linear) and bias, with every fused per-channel
        affine step (BatchNorm, constant add/multiply) folded in.
    lo, hi : float
        Fused clip bounds in float (ReLU: ``[0, inf)``, ReLU6: ``[0, 6]``).
    max_abs : float
        Calibrated ``max |x|`` of the float tensor.
    exponent : int
        Output scale exponent (``scale = 2**exponent``), set by scale selection.
    weight_exponent : int or None
        Weight scale exponent of conv/linear nodes.
    shift : int
        Requantisation right shift (conv, linear, add, avgpool).
    params : dict
        Kind-specific attributes (conv strides/padding/groups, pool window, hardswish constants).
    core : str
        Float variable of the node's core operator (the conv2d before its fused bias/ReLU).
    layer : str
        Source layer (``"features.3.conv.0.0 (aten.convolution)"``) if the frontend recorded it.
    reason : str
        Why a ``float`` node stays in float.
    qscale : float or None
        The scale a quantised source graph (PT2E, ONNX QDQ) gave this tensor; None for
        calibrated power-of-two scales.
    """

    kind: str
    name: str
    inputs: List[int] = field(default_factory=list)
    call: Optional[relax.Expr] = None
    weight: Optional[np.ndarray] = None
    bias: Optional[np.ndarray] = None
    lo: float = -np.inf
    hi: float = np.inf
    max_abs: float = 0.0
    exponent: int = 0
    weight_exponent: Optional[int] = None
    shift: int = 0
    params: dict = field(default_factory=dict)
    core: str = ""
    layer: str = ""
    reason: str = ""
    qscale: Optional[float] = None

    @property
    def relu(self) -> bool:
        """Whether the fused clip removes negative values (a ReLU or ReLU6 follows)."""
        return self.lo >= 0

    @property
    def scale(self) -> float:
        """The output scale: the source graph's (``qscale``, QDQ graphs) or ``2**exponent``."""
        return self.qscale if self.qscale is not None else 2.0 ** self.exponent


@dataclass(frozen=True)
class CpuFloatOp:
    """An operator the quantiser left in float32 on the CPU.

    Attributes
    ----------
    var : str
        Its variable in the quantised module (:attr:`QuantizedModel.mod`); build report entries
        (:class:`vta_ext.report.OpPlacement`) carry the same name.
    op : str
        The Relax operator (``relax.sigmoid``).
    layer : str
        The source layer: torch module path (``features.1.block.0.2``), ``""`` if unknown.
    source_op : str
        The source operator (``aten.silu``), ``""`` if unknown.
    reason : str
        Why it has no int8 mapping.
    """

    var: str
    op: str
    layer: str
    source_op: str
    reason: str

    def __str__(self) -> str:
        where = f"{self.layer} ({self.source_op})" if self.layer else "(unknown layer)"
        return f"{self.op} at {where}: {self.reason}"


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
        The program in order: quantised tensors with their scales and shifts, and the float
        operators left on the CPU (``kind == "float"``).
    outputs : list of int or str
        Per output of the returned tuple: the index of its quantised node (dequantised at the
        end), or the name of the float variable it is (a float operator's result).
    cpu_float_ops : list of CpuFloatOp
        Every operator left in float32 on the CPU, with the reason and the source layer
        (:meth:`cpu_float_table` prints them).
    layers : dict
        Variable of :attr:`mod` -> source layer (``"layer1.0.conv1 (aten.convolution)"``), for every
        binding whose source the frontend recorded.
    """

    mod: tvm.IRModule
    float_mod: tvm.IRModule
    nodes: List[QNode]
    outputs: List[Union[int, str]]
    cpu_float_ops: List[CpuFloatOp] = field(default_factory=list)
    layers: Dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """A table of nodes: kind, float variable, exponents, shifts, source layer."""
        lines = [f"{'#':>3} {'kind':<8} {'var':<8} {'e_out':>5} {'e_w':>4} {'shift':>5} relu "
                 f"{'max|x|':>9}  layer"]
        for i, n in enumerate(self.nodes):
            if n.kind == "float":
                lines.append(f"{i:>3} {'float':<8} {n.name:<8} {'':>5} {'':>4} {'':>5} {'':>4} "
                             f"{'':>9}  {n.layer}  [CPU float32: {n.reason}]")
                continue
            ew = "" if n.weight_exponent is None else str(n.weight_exponent)
            extra = ""
            if n.qscale is not None:  # the source graph's scale, not 2**e_out
                extra = f"  [scale {n.qscale:.6g}"
                rq = n.params.get("requant")
                if rq is not None:
                    m = np.asarray(rq["multiplier"])
                    extra += (f", requant >>{rq['pre_shift']} *M({m.min()}..{m.max()}) "
                              f">>{rq['shift']}")
                extra += "]"
            lines.append(f"{i:>3} {n.kind:<8} {n.name:<8} {n.exponent:>5} {ew:>4} {n.shift:>5} "
                         f"{'y' if n.relu else ' ':>4} {n.max_abs:>9.4g}  {n.layer}{extra}")
        return "\n".join(lines)

    def cpu_float_table(self) -> str:
        """The operators left in float32 on the CPU: variable, operator, source layer, reason."""
        if not self.cpu_float_ops:
            return "no operator left in float32: the whole model is int8"
        rows = [(o.var, o.op, f"{o.layer} ({o.source_op})" if o.layer else "?", o.reason)
                for o in self.cpu_float_ops]
        widths = [max(len(r[i]) for r in rows + [("variable", "operator", "source layer", "")])
                  for i in range(3)]
        head = ("variable".ljust(widths[0]), "operator".ljust(widths[1]),
                "source layer".ljust(widths[2]), "why it stays in float32 on the CPU")
        lines = ["  ".join(head)]
        lines += ["  ".join((r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2].ljust(widths[2]),
                             r[3])) for r in rows]
        return "\n".join(lines)


# ------------------------------------------------------------------------------- helpers
def _linear_weight(rhs) -> Optional[np.ndarray]:
    """The [M, K] weight of ``x @ rhs`` if ``rhs`` is a constant [K, M] or permute_dims of [M, K]."""
    if isinstance(rhs, Constant) and len(shape_of(rhs)) == 2:
        return rhs.value.numpy().astype(np.float64).T
    if op_name(rhs) == "relax.permute_dims" and isinstance(rhs.args[0], Constant):
        axes = rhs.attrs.axes
        if axes is None or [int(a) for a in axes] == [1, 0]:
            return rhs.args[0].value.numpy().astype(np.float64)
    return None


def _per_channel(const, channels: int, rank: int) -> Optional[np.ndarray]:
    """A constant that broadcasts as one value per channel (axis 1 of NCHW, the last axis of a
    2-D tensor), as a vector of ``channels`` values; None otherwise."""
    arr = const.value.numpy().astype(np.float64)
    if arr.size == 1 and arr.ndim <= rank:
        return np.full(channels, float(arr.reshape(-1)[0]))
    ok = {4: [(channels, 1, 1), (1, channels, 1, 1)], 2: [(channels,), (1, channels)]}.get(rank, [])
    return arr.reshape(-1) if arr.shape in ok else None


def _pool_out(size: int, pool: int, stride: int, pad_lo: int, pad_hi: int, dilation: int,
              ceil: bool) -> int:
    span = size + pad_lo + pad_hi - dilation * (pool - 1) - 1
    if not ceil:
        return span // stride + 1
    out = -(-span // stride) + 1
    if (out - 1) * stride >= size + pad_lo:  # the last window must start inside the input
        out -= 1
    return out


def _canonical_ceil_mode(call) -> bool:
    """The ``ceil_mode`` of a pool, False where it does not change the output size."""
    a = call.attrs
    if not bool(a.ceil_mode):
        return False
    _, _, h, w = shape_of(call.args[0])
    p = [int(v) for v in a.padding]
    floor = (_pool_out(h, int(a.pool_size[0]), int(a.strides[0]), p[0], p[2], int(a.dilation[0]),
                       False),
             _pool_out(w, int(a.pool_size[1]), int(a.strides[1]), p[1], p[3], int(a.dilation[1]),
                       False))
    return floor != shape_of(call)[2:]


def float_reason(op: Optional[str], value) -> str:
    """Why the quantiser keeps operator ``op`` in float32."""
    short = (op or type(value).__name__).replace("relax.nn.", "").replace("relax.", "")
    if op in _TRANSCENDENTAL:
        return (f"{short} has no int8 form on VTA's ALU (no lookup-table instruction); "
                "float32 on the CPU")
    if op in ("relax.quantize", "relax.dequantize"):
        return (f"{short} with a non-zero zero point or per-channel activation scales (an "
                "asymmetric quantiser): VTA has no zero-point arithmetic; quantise symmetric int8 "
                "(vta_ext.quantize.symmetric_quantizer for PT2E, ActivationSymmetric=True for "
                "ONNX Runtime); float32 on the CPU")
    if op in ("relax.multiply", "relax.divide"):
        return (f"{short} of two computed tensors (gating, squeeze-excitation) has no int8 "
                "mapping in the quantiser; float32 on the CPU")
    return f"the quantiser has no int8 mapping for {short}; float32 on the CPU"


# ------------------------------------------------------------------------------- analyser
class Analyser:
    """Groups the float bindings of ``main`` into :class:`QNode` s (quantised or float)."""

    def __init__(self, func: relax.Function, annotations: Optional[Dict[str, float]] = None,
                 qweights: Optional[Dict[bytes, tuple]] = None) -> None:
        #: variable -> activation scale given by the source graph (QDQ); weight bytes -> (q, scale)
        self.annotations = annotations or {}
        self.qweights = qweights or {}
        if len(func.params) != 1:
            raise QuantizationError(f"main must take one tensor input, it takes "
                                    f"{len(func.params)}; quantise a model with one input")
        self.bindings = [b for block in func.body.blocks for b in block.bindings]
        for b in self.bindings:
            if not isinstance(b, relax.VarBinding):
                raise QuantizationError(f"unsupported binding {type(b).__name__} of "
                                        f"{b.var.name}: main must be a plain dataflow graph")
        names = [b.var.name for b in self.bindings] + [func.params[0].name]
        if len(set(names)) != len(names):
            raise QuantizationError("variable names of main are not unique")
        self.value = {b.var.name: b.value for b in self.bindings}
        self.var = {b.var.name: b.var for b in self.bindings}
        self.users: Dict[str, List[str]] = {n: [] for n in names}
        for b in self.bindings:
            for used in used_vars(b.value):
                self.users.setdefault(used, []).append(b.var.name)
        body = func.body.body
        self.body = body
        for used in used_vars(body):
            self.users.setdefault(used, []).append("<return>")
        self.sources = source_layers(func)
        self.nodes: List[QNode] = []
        self.node_of: Dict[str, int] = {}  # float var name -> index of its quantised node
        self.param = func.params[0]
        self.float_vars = {self.param.name}  # float values available on the CPU
        self.var[self.param.name] = self.param
        self.consumed: set = set()
        self.outputs: List[Union[int, str]] = []

    # ------------------------------------------------------------------ bookkeeping
    def layer(self, name: str) -> str:
        """``"features.3 (aten.cat)"`` for a float variable, ``""`` if unknown."""
        src = self.sources.get(name)
        return f"{src[0]} ({src[1]})" if src else ""

    def where(self, name: str, op: Optional[str]) -> str:
        """How messages name a binding: its source layer and operator, or the Relax variable."""
        layer = self.layer(name)
        return f"{layer}, Relax {op} {name}" if layer else f"Relax {op} {name}"

    def _add(self, node: QNode) -> int:
        if not node.layer:
            node.layer = self.layer(node.core or node.name)
        if node.kind != "float" and node.name in self.annotations:
            node.qscale = self.annotations[node.name]
        self.nodes.append(node)
        if node.kind != "float":
            self.node_of[node.name] = len(self.nodes) - 1
        return len(self.nodes) - 1

    def _float(self, name: str, value, reason: str) -> None:
        inputs = sorted({self.node_of[v] for v in used_vars(value)
                         if v in self.node_of and v not in self.float_vars})
        self._add(QNode("float", name, inputs, call=value, core=name, reason=reason))
        self.float_vars.add(name)

    def _single_user(self, name: str) -> Optional[str]:
        users = self.users.get(name, [])
        return users[0] if len(users) == 1 and users[0] != "<return>" else None

    def is_q(self, expr) -> bool:
        """Whether ``expr`` is a variable with a quantised int8 node."""
        return isinstance(expr, relax.Var) and expr.name in self.node_of

    def quantisable(self, expr) -> bool:
        """Whether ``expr`` is quantised, or a float32 tensor that can be quantised."""
        if self.is_q(expr):
            return True
        return (isinstance(expr, relax.Var) and expr.name in self.float_vars
                and isinstance(expr.ty, relax.TensorType) and dtype_of(expr) == "float32")

    def qin(self, expr) -> int:
        """The quantised node of ``expr``; a float tensor gets a new ``quant``/``input`` node."""
        if self.is_q(expr):
            return self.node_of[expr.name]
        if not self.quantisable(expr):
            raise QuantizationError(f"internal: {expr} is neither quantised nor a float tensor")
        kind = "input" if expr.name == self.param.name else "quant"
        return self._add(QNode(kind, expr.name, core=expr.name))

    def scale_of(self, expr) -> Optional[float]:
        """The source graph's scale of a variable (QDQ graphs), through its quantised node."""
        if not isinstance(expr, relax.Var):
            return None
        if expr.name in self.node_of:
            return self.nodes[self.node_of[expr.name]].qscale
        return self.annotations.get(expr.name)

    def _graph_weight(self, node: QNode, const, transposed: bool) -> None:
        """Attach the source graph's int8 weight and its scales (QDQ graphs), if recorded."""
        val = const.value.numpy()
        found = self.qweights.get(val.tobytes())
        if found is None and val.ndim == 2:  # a transposed weight folded into a constant
            found = self.qweights.get(np.ascontiguousarray(val.T).tobytes())
            transposed = not transposed
        if found is None:
            return
        q, scale, axis = found
        q = np.asarray(q, np.int64)
        out_axis = 1 if transposed else 0
        if transposed:
            q = q.T
        scale = np.asarray(scale, np.float64).reshape(-1)
        if scale.size == 1:
            scale = np.full(q.shape[0], scale[0])
        elif axis != out_axis or scale.size != q.shape[0]:
            return  # scales along the input channels: re-quantise from the float weight instead
        node.params["qweight"] = (q, scale)

    # ------------------------------------------------------------------ epilogues
    def _step(self, name: str, cur: str, channels: int, rank: int):
        """The fused epilogue step that binding ``name`` applies to variable ``cur``, or None:
        ``("clip", lo, hi)`` or ``("affine", mul, add, extra consumed vars)``."""
        value = self.value[name]
        op = op_name(value)
        args = list(value.args) if isinstance(value, relax.Call) else []
        if not args or not (isinstance(args[0], relax.Var) or op in _AFFINE_OPS):
            return None
        if op == "relax.nn.relu" and args[0].name == cur:
            return ("clip", 0.0, np.inf)
        if op == "relax.clip" and args[0].name == cur:
            return ("clip", prim_float(args[1]), prim_float(args[2]))
        if op in _AFFINE_OPS and len(args) == 2:
            a, b = args
            if isinstance(a, relax.Var) and a.name == cur and isinstance(b, Constant):
                c, var_first = b, True
            elif isinstance(b, relax.Var) and b.name == cur and isinstance(a, Constant):
                c, var_first = a, False
            else:
                return None
            if shape_of(value) != shape_of(self.var[cur]):
                return None  # the constant broadcasts the tensor to a larger shape
            v = _per_channel(c, channels, rank)
            if v is None:
                return None
            one, zero = np.ones(channels), np.zeros(channels)
            if op == "relax.add":
                return ("affine", one, v, ())
            if op == "relax.subtract":
                return ("affine", one, -v, ()) if var_first else ("affine", -one, v, ())
            if op == "relax.multiply":
                return ("affine", v, zero, ())
            if op == "relax.divide" and var_first and np.all(v != 0):
                return ("affine", 1.0 / v, zero, ())
            return None
        if op == "relax.nn.batch_norm" and args[0].name == cur and rank == 4 \
                and int(value.attrs.axis) == 1 and all(isinstance(x, Constant) for x in args[1:5]):
            item = self._single_user(name)
            if not (isinstance(self.value.get(item), relax.TupleGetItem)
                    and int(self.value[item].index) == 0):
                return None
            gamma, beta, mean, var = (x.value.numpy().astype(np.float64) for x in args[1:5])
            if not bool(value.attrs.scale):
                gamma = np.ones_like(gamma)
            if not bool(value.attrs.center):
                beta = np.zeros_like(beta)
            mul = gamma / np.sqrt(var + float(value.attrs.epsilon))
            return ("affine", mul, beta - mean * mul, (item,))
        return None

    def _apply(self, node: QNode, step) -> bool:
        """Fold ``step`` into ``node``; False if it cannot be folded."""
        if step[0] == "clip":
            node.lo, node.hi = max(node.lo, step[1]), min(node.hi, step[2])
            return True
        _, mul, add, _ = step
        if node.weight is None:
            return False
        if np.isfinite(node.lo) or np.isfinite(node.hi):
            # clip(y, lo, hi) * m + a == clip(y * m + a, lo * m + a, hi * m + a) for one m > 0
            if not (np.all(mul == mul[0]) and mul[0] > 0 and np.all(add == add[0])):
                return False
            node.lo, node.hi = node.lo * mul[0] + add[0], node.hi * mul[0] + add[0]
        shape = (-1,) + (1,) * (node.weight.ndim - 1)
        if np.any(mul != 1.0):
            node.params.pop("qweight", None)  # the graph's int8 weight no longer applies
        node.weight = node.weight * mul.reshape(shape)
        bias = np.zeros(node.weight.shape[0]) if node.bias is None else node.bias
        node.bias = bias * mul + add
        return True

    def _absorb(self, node: QNode, start: str, channels: int, rank: int) -> None:
        """Fuse the chain of single-user epilogue steps after ``start`` into ``node``."""
        cur = start
        while True:
            nxt = self._single_user(cur)
            if nxt is None:
                break
            step = self._step(nxt, cur, channels, rank)
            if step is None or not self._apply(node, step):
                break
            self.consumed.add(nxt)
            cur = nxt
            if step[0] == "affine" and step[3]:
                self.consumed.update(step[3])
                cur = step[3][-1]
        node.name = cur

    # ------------------------------------------------------------------ patterns
    def _hswish(self, name: str, value) -> Optional[Tuple[str, List[str]]]:
        """Match ``x * clip(x + 3, 0, 6) / 6`` starting at ``add(x, 3)``; (end var, chain)."""
        if op_name(value) != "relax.add":
            return None
        x, three = value.args
        if isinstance(x, Constant):
            x, three = three, x
        if not (isinstance(x, relax.Var) and isinstance(three, Constant)
                and three.value.numpy().size == 1 and float(three.value.numpy()) == 3.0):
            return None
        chain, cur, lo, hi = [], name, -np.inf, np.inf
        while True:
            nxt = self._single_user(cur)
            v = self.value.get(nxt) if nxt else None
            if op_name(v) == "relax.clip" and getattr(v.args[0], "name", None) == cur:
                lo, hi = max(lo, prim_float(v.args[1])), min(hi, prim_float(v.args[2]))
            elif op_name(v) == "relax.nn.relu" and getattr(v.args[0], "name", None) == cur:
                lo = max(lo, 0.0)
            else:
                break
            chain.append(nxt)
            cur = nxt
        if (lo, hi) != (0.0, 6.0):
            return None
        nxt = self._single_user(cur)
        v = self.value.get(nxt) if nxt else None
        if op_name(v) != "relax.multiply" or {getattr(a, "name", None) for a in v.args} != {
                x.name, cur}:
            return None
        chain.append(nxt)
        last = self._single_user(nxt)
        v = self.value.get(last) if last else None
        if not (op_name(v) in ("relax.divide", "relax.multiply")
                and getattr(v.args[0], "name", None) == nxt
                and isinstance(v.args[1], Constant) and v.args[1].value.numpy().size == 1):
            return None
        c = float(v.args[1].value.numpy())
        if not (op_name(v) == "relax.divide" and c == 6.0
                or op_name(v) == "relax.multiply" and abs(c * 6.0 - 1.0) < 1e-6):
            return None
        chain.append(last)
        return last, chain

    def _conv(self, name: str, value) -> None:
        a = value.attrs
        data, weight = value.args
        if not isinstance(weight, Constant):
            return self._float(name, value, "conv2d weight is not a constant (computed at run "
                               "time); float32 on the CPU")
        if (a.data_layout, a.kernel_layout) != ("NCHW", "OIHW") or len(shape_of(data)) != 4:
            return self._float(name, value, f"conv2d layout {a.data_layout}/{a.kernel_layout}; "
                               "the quantiser maps NCHW/OIHW; float32 on the CPU")
        if not self.quantisable(data):
            return self._float(name, value, "conv2d input is not a float32 tensor")
        w = weight.value.numpy().astype(np.float64)
        node = QNode("conv", name, [self.qin(data)], call=value, weight=w, core=name,
                     params=dict(strides=[int(s) for s in a.strides],
                                 padding=[int(p) for p in a.padding],
                                 dilation=[int(d) for d in a.dilation], groups=int(a.groups)))
        self._graph_weight(node, weight, transposed=False)
        self._absorb(node, name, w.shape[0], 4)
        self._add(node)

    def _affine_node(self, name: str, value, step) -> None:
        """A per-channel affine map of a quantised NCHW tensor as a 1x1 depthwise conv."""
        x = next(arg for arg in value.args if isinstance(arg, relax.Var))
        channels = shape_of(x)[1]
        node = QNode("conv", name, [self.qin(x)], call=value, weight=np.ones((channels, 1, 1, 1)),
                     bias=np.zeros(channels), core=name,
                     params=dict(strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1],
                                 groups=channels, affine=True))
        self._apply(node, step)
        end = name
        if step[3]:
            self.consumed.update(step[3])
            end = step[3][-1]
        self._absorb(node, end, channels, 4)
        self._add(node)

    def _pool(self, name: str, value, op: str) -> None:
        src = value.args[0]
        if len(shape_of(src)) != 4 or not self.quantisable(src):
            return self._float(name, value, f"{op} input is not a float32 NCHW tensor")
        n, c, h, w = shape_of(src)
        params = dict(pool_size=[h, w], strides=[1, 1], padding=[0, 0, 0, 0], ceil_mode=False,
                      count_include_pad=False, squeeze=False)
        if op == "relax.mean":
            axes = sorted(int(x) % 4 for x in value.attrs.axis)
            if axes != [2, 3]:
                return self._float(name, value, f"mean over axes {axes}; the quantiser maps a "
                                   "mean over H, W (a global average pool); float32 on the CPU")
            params["squeeze"] = not bool(value.attrs.keepdims)
        elif op == "relax.nn.adaptive_avg_pool2d":
            if str(value.attrs.layout) != "NCHW":
                return self._float(name, value, "adaptive_avg_pool2d layout is not NCHW")
            _, _, oh, ow = shape_of(value)
            if h % oh or w % ow:
                return self._float(name, value, f"adaptive_avg_pool2d output {oh}x{ow} does not "
                                   f"divide the input {h}x{w} (windows of unequal size); "
                                   "float32 on the CPU")
            if (oh, ow) == (h, w):  # the identity: an alias of its input
                if self.is_q(src):
                    self._add(QNode("layout", name, [self.qin(src)], call=src, core=name))
                else:
                    self._float(name, src, "identity on a float tensor")
                return None
            params.update(pool_size=[h // oh, w // ow], strides=[h // oh, w // ow])
        else:  # avg_pool2d
            a = value.attrs
            if str(a.layout) != "NCHW" or any(int(d) != 1 for d in a.dilation):
                return self._float(name, value, "avg_pool2d is not NCHW or is dilated")
            params.update(pool_size=[int(p) for p in a.pool_size],
                          strides=[int(s) for s in a.strides], padding=[int(p) for p in a.padding],
                          ceil_mode=_canonical_ceil_mode(value),
                          # without padding every window is full: the flag changes nothing
                          count_include_pad=bool(a.count_include_pad)
                          and any(int(p) for p in a.padding))
        node = QNode("avgpool", name, [self.qin(src)], call=value, core=name, params=params)
        self._absorb(node, name, c, 4)
        self._add(node)
        return None

    # ------------------------------------------------------------------ main loop
    def run(self) -> Tuple[List[QNode], List[Union[int, str]]]:
        """Analyse every binding; returns the nodes and the outputs."""
        for b in self.bindings:
            if b.var.name not in self.consumed:
                self._visit(b.var.name, b.value)
        fields = self.body.fields if isinstance(self.body, relax.Tuple) else [self.body]
        for f in fields:
            if not isinstance(f, relax.Var):
                raise QuantizationError(f"main returns {type(f).__name__}; expected variables")
            if f.name in self.float_vars:
                self.outputs.append(f.name)
            elif f.name in self.node_of:
                self.outputs.append(self.node_of[f.name])
            elif isinstance(self.value.get(f.name), relax.Tuple):
                for g in self.value[f.name].fields:
                    self.outputs.append(g.name if g.name in self.float_vars else self.node_of[g.name])
            else:
                raise QuantizationError(f"main returns {f.name}, which was not analysed")
        return self.nodes, self.outputs

    def _visit(self, name: str, value) -> None:  # noqa: C901 - one dispatch over operators
        op = op_name(value)
        if isinstance(value, relax.Tuple):
            if self._single_user(name) is None and "<return>" in self.users.get(name, []):
                return None  # the returned tuple
            return self._float(name, value, "tuple of tensors")
        if op == "relax.nn.conv2d":
            return self._conv(name, value)
        if op == "relax.matmul":
            lhs, rhs = value.args
            weight = _linear_weight(rhs)
            if weight is None or len(shape_of(lhs)) != 2 or not self.quantisable(lhs):
                return self._float(name, value, "matmul is not [N, K] x a constant [K, M]; "
                                   "float32 on the CPU")
            node = QNode("linear", name, [self.qin(lhs)], call=value, weight=weight, core=name)
            const = rhs.args[0] if op_name(rhs) == "relax.permute_dims" else rhs
            self._graph_weight(node, const, transposed=const is rhs)
            self._absorb(node, name, weight.shape[0], 2)
            self._add(node)
            return None
        if op in _AFFINE_OPS:
            lhs, rhs = value.args
            if not isinstance(lhs, Constant) and not isinstance(rhs, Constant):
                scales = {self.scale_of(lhs), self.scale_of(rhs)} - {None}
                if op == "relax.add" and len(scales) > 1:
                    return self._float(name, value, f"add of operands quantised with different "
                                       f"scales {sorted(scales)} by the source graph (VTA adds "
                                       "at one scale); quantise both operands with one shared "
                                       "scale (SharedQuantizationSpec); float32 on the CPU")
                if (op == "relax.add" and shape_of(lhs) == shape_of(rhs) == shape_of(value)
                        and (self.is_q(lhs) or self.is_q(rhs))
                        and self.quantisable(lhs) and self.quantisable(rhs)):
                    node = QNode("add", name, [self.qin(lhs), self.qin(rhs)], call=value,
                                 core=name)
                    self._absorb(node, name, shape_of(value)[1], len(shape_of(value)))
                    self._add(node)
                    return None
                return self._float(name, value, float_reason(op, value) if op != "relax.add"
                                   else "add of tensors that are float or of different shapes; "
                                   "float32 on the CPU")
            hswish = self._hswish(name, value)
            x = rhs if isinstance(lhs, Constant) else lhs
            if hswish is not None and self.quantisable(x):
                end, chain = hswish
                self.consumed.update(chain)
                self._add(QNode("hswish", end, [self.qin(x)], call=value, core=name))
                return None
            if self.is_q(x) and len(shape_of(x)) == 4:
                step = self._step(name, x.name, shape_of(x)[1], 4)
                if step is not None:
                    return self._affine_node(name, value, step)
            why = ("its input is a float tensor" if not self.is_q(x) else
                   "the constant is not one value per channel")
            return self._float(name, value, f"{op.replace('relax.', '')} with a constant: {why}; "
                               "float32 on the CPU")
        if op == "relax.nn.batch_norm":
            x = value.args[0]
            if self.is_q(x) and len(shape_of(x)) == 4:
                step = self._step(name, x.name, shape_of(x)[1], 4)
                if step is not None:
                    return self._affine_node(name, value, step)
            return self._float(name, value, "batch_norm that is not folded into a convolution "
                               "and whose input is float; float32 on the CPU")
        if op in ("relax.nn.relu", "relax.clip"):
            x = value.args[0]
            if self.is_q(x):
                node = QNode("clip", name, [self.qin(x)], call=value, core=name)
                self._apply(node, self._step(name, x.name, 1, 1))
                self._absorb(node, name, 1, 1)
                self._add(node)
                return None
            return self._float(name, value, f"{op.replace('relax.nn.', '').replace('relax.', '')} "
                               "of a float tensor; float32 on the CPU")
        if op in ("relax.mean", "relax.nn.adaptive_avg_pool2d", "relax.nn.avg_pool2d"):
            return self._pool(name, value, op)
        if op == "relax.nn.max_pool2d":
            src = value.args[0]
            a = value.attrs
            if str(a.layout) != "NCHW" or not self.quantisable(src):
                return self._float(name, value, "max_pool2d is not NCHW on a float32 tensor")
            self._add(QNode("maxpool", name, [self.qin(src)], call=value, core=name,
                            params=dict(ceil_mode=_canonical_ceil_mode(value))))
            return None
        if op in _LAYOUT_OPS or op == "relax.split":
            src = value.args[0]
            if self.is_q(src):
                kind = "split" if op == "relax.split" else "layout"
                self._add(QNode(kind, name, [self.qin(src)], call=value, core=name))
                return None
            return self._float(name, value, f"{op.replace('relax.', '')} of a float tensor "
                               "(layout only, follows its input); float32 on the CPU")
        if isinstance(value, relax.TupleGetItem):
            tup = value.tuple_value
            if isinstance(tup, relax.Var) and tup.name in self.node_of:
                self._add(QNode("layout", name, [self.node_of[tup.name]], call=value, core=name))
                return None
            return self._float(name, value, "item of a float tuple; float32 on the CPU")
        if op == "relax.concat":
            parts = list(value.args[0].fields)
            if (all(isinstance(p, relax.Var) for p in parts) and any(self.is_q(p) for p in parts)
                    and all(self.quantisable(p) for p in parts)):
                self._add(QNode("concat", name, [self.qin(p) for p in parts], call=value,
                                core=name))
                return None
            return self._float(name, value, "concat of float tensors; float32 on the CPU")
        return self._float(name, value, float_reason(op, value))
