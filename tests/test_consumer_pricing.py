"""A plan's host layout priced by the real consumer of its output (``MatchedOp.consumers``, set by
the offload pass's pre-pass, :mod:`vta_ext.offload.consumers`; priced by
:func:`tvm_csp_embed.choice.plan_host_bytes`).

The same conv (1x16x14x14 * 32x16x3x3 + bias, >> 8, clip; weight and bias constants) is built
with its output going to the function's result (the CPU), to a second VTA conv, or to both. The
priced bytes are checked against the relayouts the build emits, counted on the offloaded module
independently of the pricing: the output of every binding that is not the VTA call and not a view
(``reshape``), as the build report counts them.
"""
import numpy as np
import pytest
import tvm
from conftest import conv2d_nchw, conv_chain, requantize
from tvm import relax

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
import vta_ext
from tvm_csp_embed import choice
from vta_ext.config import load_config
from vta_ext.host import VIEW_OPS
from vta_ext.offload import OffloadToVTA

pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")

RNG = np.random.default_rng(7)
W1 = RNG.integers(-128, 128, (32, 16, 3, 3)).astype(np.int8)
B1 = RNG.integers(-1000, 1000, (1, 32, 1, 1)).astype(np.int32)
W2 = RNG.integers(-128, 128, (16, 32, 3, 3)).astype(np.int8)
X = RNG.integers(-128, 128, (1, 16, 14, 14)).astype(np.int8)


def _module(to: str):
    """``main(x)``: conv1 whose output goes to ``to``: ``"cpu"`` (the result), ``"vta"`` (a
    second conv, whose output is the result) or ``"both"`` (the result is the tuple of the two)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(X.shape, "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y1 = conv_chain(bb, x, relax.const(W1), relax.const(B1), padding=1, shift=8,
                            clip=(-128, 127))
            if to == "cpu":
                out = bb.emit_output(y1)
            else:
                y2 = conv_chain(bb, y1, relax.const(W2), None, padding=1, shift=8,
                                clip=(-128, 127))
                out = bb.emit_output(y2 if to == "vta" else relax.Tuple([y1, y2]))
        bb.emit_func_output(out)
    return bb.get()


def _reference(to: str):
    y1 = requantize(conv2d_nchw(X, W1, padding=1), B1, 8, (-128, 127))
    if to == "cpu":
        return [y1]
    y2 = requantize(conv2d_nchw(y1, W2, padding=1), None, 8, (-128, 127))
    return [y2] if to == "vta" else [y1, y2]


def _relayout_bytes(mod):
    """Bytes of the relayout bindings of the offloaded ``mod`` before each VTA call and after
    the last: a list with one entry per VTA call (what runs before it, since the previous one)
    and one for what follows the last."""
    (func,) = [f for f in mod.functions.values() if isinstance(f, relax.Function)]
    parts, n = [], 0
    for block in func.body.blocks:
        for b in block.bindings:
            op = b.value.op.name if isinstance(b.value, relax.Call) else None
            if op == "relax.call_dps_packed":
                parts.append(n)
                n = 0
            elif op is not None and op not in VIEW_OPS:
                n += int(np.prod([int(d) for d in b.var.ty.shape])) * \
                    max(1, tvm.runtime.DataType(str(b.var.ty.dtype)).bits // 8)
    return parts + [n]


def _offloaded(to: str, strategy: str):
    """The offloaded module, and every matched conv and its plan as the template saw them."""
    seen = []
    template = vta_ext.strategy.get_template("conv2d", strategy)
    plan = type(template).plan

    def spy(self, op, config):
        out = plan(self, op, config)
        seen.append((op, out))
        return out

    with pytest.MonkeyPatch.context() as mp, vta_ext.build_options(strategy=strategy):
        mp.setattr(type(template), "plan", spy)
        mod = OffloadToVTA(load_config("default"))(_module(to))
    return mod, seen


@pytest.mark.parametrize("to", ["cpu", "vta", "both"])
def test_stock_plan_output_priced_as_the_build_relayouts_it(to):
    """With the stock template's plan (one fixed plan, the stock blocked layout): to the CPU its
    output costs its unpack, to a VTA conv nothing (handed over); the priced bytes of conv1 equal
    the relayouts the build emits for it (its input's packing, and what follows its VTA call up
    to the next call or the end)."""
    cfg = load_config("default")
    mod, seen = _offloaded(to, "stock")
    (op1, plan1), *rest = seen
    assert op1.consumers == {"cpu": ("cpu",), "vta": ("vta",), "both": ("cpu", "vta")}[to]
    parts = _relayout_bytes(mod)
    real = parts[0] + parts[1]     # x's packing, then what follows conv1's call up to the next
    priced = choice.plan_host_bytes(op1, plan1.in_layout, plan1.out_layout,
                                    choice.blocked_output(op1, cfg))
    assert priced == real
    unpack = int(np.prod(X.shape[:1] + (32,) + X.shape[2:]))   # one transpose of 1x32x14x14
    assert priced - parts[0] == (0 if to == "vta" else unpack)
    if rest:
        (op2, _), = rest
        assert op2.input_unpacked == (to == "both") and op2.consumers == ("cpu",)


@pytest.mark.parametrize("to", ["cpu", "vta", "both"])
def test_outputs_bit_exact(to):
    """Every consumer arrangement runs bit-exact under csp-relaxed against numpy."""
    with vta_ext.build_options(strategy="csp-relaxed"):
        ex = relax.build(_module(to), target="ext_vta")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(X))
    got = [got] if isinstance(got, tvm.runtime.Tensor) else list(got)
    for g, ref in zip(got, _reference(to)):
        np.testing.assert_array_equal(g.numpy(), ref)


def test_csp_plan_to_the_cpu_priced_as_the_build_relayouts_it(tmp_path, monkeypatch):
    """Under csp-relaxed (end-to-end) a conv whose output goes to the CPU: the host bytes the
    choice priced its chosen plan at equal every relayout the build emits (the packing of the
    input and the unpacking of the output, whatever its layout). A fresh cache: the choice runs."""
    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    calls = []
    real = choice.plan_host_bytes

    def spy(op, in_layout, out_layout, stock_out):
        n = real(op, in_layout, out_layout, stock_out)
        calls.append((out_layout, n))
        return n

    monkeypatch.setattr(choice, "plan_host_bytes", spy)
    mod, seen = _offloaded("cpu", "csp-relaxed")
    (op1, plan1), = seen
    assert op1.consumers == ("cpu",)
    assert "output to the CPU" in plan1.description
    priced = {n for out, n in calls if out is plan1.out_layout}
    assert priced, "the chosen plan was not priced (stock chosen?)"
    assert sum(_relayout_bytes(mod)) in priced


def _pool_module(hw: int):
    """``main(x)``: conv1 on a 1x16xHWxHW input, its output's only user a global average pool
    (``avg_pool2d`` of the whole HWxHW window, clip, int8)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, hw, hw), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y1 = conv_chain(bb, x, relax.const(W1), relax.const(B1), padding=1, shift=8,
                            clip=(-128, 127))
            y = bb.emit(relax.op.nn.avg_pool2d(relax.op.astype(y1, "int32"), (hw, hw)))
            y = bb.emit(relax.op.clip(y, -128, 127))
            out = bb.emit_output(bb.emit(relax.op.astype(y, "int8")))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("hw", [14, 28])
def test_a_pool_sure_to_be_refused_is_no_vta_consumer(hw):
    """A 28x28 window's divisor, 784, has no exact multiply-shift reciprocal within int32, so the
    pool stays on the CPU, and the conv feeding it must count its output as going to the CPU
    (its unpack priced); a 14x14 window's pool runs on VTA and the conv's output is handed over.
    The reference is the build report's own placement of the pool."""
    x = RNG.integers(-128, 128, (1, 16, hw, hw)).astype(np.int8)
    seen = []
    template = vta_ext.strategy.get_template("conv2d", "csp-relaxed")
    plan = type(template).plan

    def spy(self, op, config):
        seen.append(op)
        return plan(self, op, config)

    with pytest.MonkeyPatch.context() as mp, vta_ext.build_options(strategy="csp-relaxed"):
        mp.setattr(type(template), "plan", spy)
        ex = relax.build(_pool_module(hw), target="ext_vta")
    report = vta_ext.last_build_report()
    pools = [p for p in report.operators if p.op == "relax.nn.avg_pool2d"]
    assert len(pools) == 1
    on_vta = pools[0] in report.on_vta
    assert on_vta == (hw == 14), str(report)
    if not on_vta:
        assert "no exact multiply-shift reciprocal" in pools[0].reason
    (op1,) = seen
    assert op1.consumers == (("vta",) if on_vta else ("cpu",))
    y1 = requantize(conv2d_nchw(x, W1, padding=1), B1, 8, (-128, 127)).astype(np.int64)
    total = y1.sum(axis=(2, 3), keepdims=True)
    mean = np.sign(total) * (np.abs(total) // (hw * hw))     # TVM's integer avg pool truncates
    ref = np.clip(mean, -128, 127).astype(np.int8)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, ref)
