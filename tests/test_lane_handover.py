"""Lane constants a producer writes into its padded output channels and a consumer folds its bias
into, built through ``relax.build(..., target="ext_vta")`` (``tvm_csp_embed/lanes.py``).

Each module is checked bit-exact against its llvm build; the build report must show the producer
writing the constants and the consumer folding with its input taken over (no host pass), or,
where the contract cannot hold, today's path with the reason. The consumer-side check of the
handed-over constants is tested on packed tensors built here with numpy.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import conv_chain, run_module

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
import vta_ext

RELU, SIGNED = (0, 127), (-128, 127)
FOLDED = "written by the producer into its padded channels: no host pass"
KEPT = "input kept in the packed layout of the previous VTA operator"


def _chain(*, c_in=24, c_mid=72, c_out=40, hw=8, seed=3, clip1=RELU, residual=None,
           runtime_bias=False):
    """``x -> conv1x1 (c_in -> c_mid, clip1) [-> conv1x1 (c_mid -> c_mid, signed) + residual add
    with the first conv's output, epilogue ``residual``] -> conv1x1 (c_mid -> c_out, ReLU)``: the
    middle tensors pad ``c_mid`` to whole 16-channel blocks. ``runtime_bias``: the first conv's
    bias is a function parameter."""
    from tvm import relax

    rng = np.random.default_rng(seed)

    def const(shape, lo, hi, dtype):
        return relax.const(rng.integers(lo, hi, shape).astype(dtype))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c_in, hw, hw), "int8"))
    params, arrays = [x], [rng.integers(-128, 128, (1, c_in, hw, hw)).astype(np.int8)]
    if runtime_bias:
        b1 = relax.Var("b1", relax.TensorType((1, c_mid, 1, 1), "int32"))
        params.append(b1)
        arrays.append(rng.integers(-2 ** 14, 2 ** 14, (1, c_mid, 1, 1)).astype(np.int32))
    else:
        b1 = const((1, c_mid, 1, 1), -2 ** 14, 2 ** 14, "int32")
    with bb.function("main", params):
        with bb.dataflow():
            a = conv_chain(bb, x, const((c_mid, c_in, 1, 1), -128, 128, "int8"), b1, shift=8,
                           clip=clip1)
            if residual is not None:
                b = conv_chain(bb, a, const((c_mid, c_mid, 1, 1), -128, 128, "int8"),
                               const((1, c_mid, 1, 1), -2 ** 14, 2 ** 14, "int32"), shift=9,
                               clip=SIGNED)
                s = bb.emit(relax.op.add(relax.op.astype(b, "int32"), relax.op.astype(a, "int32")))
                for stage in residual:
                    s = bb.emit(relax.op.right_shift(s, relax.const(stage[1], "int32"))
                                if stage[0] == "shr" else relax.op.clip(s, *stage[1:]))
                a = bb.emit(relax.op.astype(s, "int8"))
            y = conv_chain(bb, a, const((c_out, c_mid, 1, 1), -128, 128, "int8"),
                           const((1, c_out, 1, 1), -60_000, 60_000, "int32"), shift=8, clip=RELU)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), arrays


def _built(mod, arrays, fuse_residual: bool = False):
    """The VTA placements of ``mod``'s ext_vta build, after checking its output against llvm
    (the residual add its own operator unless ``fuse_residual``: vta_ext.offload.fusion)."""
    with vta_ext.build_options(strategy="csp-relaxed", fuse_residual=fuse_residual):
        got = run_module(mod, "ext_vta", arrays)
    report = vta_ext.last_build_report()
    np.testing.assert_array_equal(got, run_module(mod, "llvm", arrays))
    return [p for p in report.on_vta if p.call is not None]


@pytest.mark.parametrize("clip1, constants", [(RELU, "(1, 127 x7)"), (SIGNED, "(1, -128 x7)")])
def test_producer_consumer_pair_bit_exact(clip1, constants):
    """72 channels padded to 80: the first conv writes (1, A x7) into channels 72..79 (A = 127
    after a ReLU, which erases -128; -128 otherwise) and the second folds its bias into them,
    taking the producer's packed output over."""
    producer, consumer = _built(*_chain(clip1=clip1))
    assert f"writes lane constants {constants} into its 8 padded output channels" in producer.detail
    assert "bias in 8 lanes" in consumer.plan
    assert f"their constants {constants[:-1]}) {FOLDED}" in consumer.detail, consumer.detail
    assert KEPT in consumer.detail


def test_residual_add_then_1x1_bit_exact():
    """The add's output lanes are its own semantics on its inputs' lanes: clip(0 + (1, 127 x7))
    = (1, 127 x7) with the first conv's constants on the shortcut and the second conv's zeros;
    the last conv folds into them."""
    first, middle, add, last = _built(*_chain(residual=[("clip", 0, 127)]))
    assert "writes lane constants (1, 127 x7)" in first.detail
    assert "writes lane constants" not in middle.detail and FOLDED in middle.detail
    assert KEPT in add.detail
    assert FOLDED in last.detail and KEPT in last.detail
    # fused into the middle conv, the add's output lanes are the same: the last conv still folds
    first, fused, last = _built(*_chain(residual=[("clip", 0, 127)]), fuse_residual=True)
    assert "residual add" in fused.detail and FOLDED in fused.detail
    assert FOLDED in last.detail and KEPT in last.detail


def test_residual_add_with_a_shift_asks_its_other_input_to_write():
    """With ``(a + b) >> 1`` the shortcut's (1, 127 x7) alone would give (0, 63 x7): the add's
    other producer writes x with (x + 1) >> 1 = 1 and (x + 127) >> 1 = 127, i.e. (1, 127 x7),
    by hand. It folds its own bias into its input's lanes too: its fold's digits include its
    padded output channels' lane biases."""
    first, middle, add, last = _built(*_chain(residual=[("shr", 1), ("clip", 0, 127)]))
    assert "writes lane constants (1, 127 x7)" in middle.detail
    assert FOLDED in middle.detail and "bias in 8 lanes" in middle.plan
    assert FOLDED in last.detail and KEPT in last.detail


def test_runtime_bias_producer_keeps_todays_path_and_says_why():
    """A producer whose bias is runtime data cannot write the constants without a host pass per
    inference: its report line says so, and the consumer folds (or not) as it did before, with
    its input from the host layout or a where pass, never from constants nobody wrote."""
    producer, consumer = _built(*_chain(runtime_bias=True))
    assert ("lane constants (1, 127 x7) asked for its 8 padded output channels not written: "
            "its bias is runtime data") in producer.detail
    assert FOLDED not in consumer.detail


# ------------------------------------------------------------------------------ the consumer's check
def _pointwise(layout: str, c: int = 72):
    """A candidate of a 1x1 conv ``1 x c x 8 x 8 -> 40`` in ``layout`` with 8 spare lanes, the
    one whose data is packed as the stock blocked layout where there is one."""
    from tvm_csp_embed.candidates import CspWorkload, candidates
    from tvm_csp_embed.codegen.biasfold import fold_lanes
    from vta_ext.config import load_config
    from vta_ext.packing import BlockedActivation, same_arrangement

    cfg = load_config("default")
    params = dict(n=1, c=c, h=8, w=8, k=40, kh=1, kw=1, pt=0, pl=0, pb=0, pr=0, sh=1, sw=1)
    base = CspWorkload("conv2d", tuple(params.items()))
    cands, _ = candidates(cfg, base, "relaxed", [layout], (("bias",), ("shr", 8)))
    found = [cand.packed for cand in cands if not isinstance(fold_lanes(cand.packed), str)
             and fold_lanes(cand.packed).lanes == 8]
    blocked = BlockedActivation(1, c, 8, 8, 1, 16)
    found.sort(key=lambda pg: not same_arrangement(
        blocked, pg.operands[fold_lanes(pg).data].host))
    assert found, f"no 8-lane candidate in {layout}"
    return found[0]


def test_handed_constant_read_from_the_packed_tensor():
    """The check reads the producer's packed tensor: channels 72..79 hold (1, A x7) for an A of
    magnitude 2..128, else the reason names what the lanes hold."""
    from tvm_csp_embed.codegen.biasfold import handed_lane_constant
    from vta_ext.packing import BlockedActivation

    pg = _pointwise("NCHW")
    blocked = BlockedActivation(1, 72, 8, 8, 1, 16)
    assert handed_lane_constant(pg, blocked, [1] + [127] * 7) == (127, "")
    assert handed_lane_constant(pg, blocked, [1] + [-5] * 7) == (-5, "")
    a, why = handed_lane_constant(pg, blocked, [2] + [127] * 7)
    assert a is None and "hold 2, 127" in why
    a, why = handed_lane_constant(pg, blocked, [1, 1] + [127] * 6)
    assert a is None and "not (1, A, A, ...)" in why
    a, why = handed_lane_constant(pg, blocked, [1] + [127] * 6)
    assert a is None and "7 lane constants for 8 padded channels" in why


def test_handed_constant_needs_the_producers_arrangement():
    """An NHWC embedding takes its data in another arrangement: the producer's lanes are not
    where its spare lanes are."""
    from tvm_csp_embed.codegen.biasfold import handed_lane_constant
    from vta_ext.packing import BlockedActivation

    pg = _pointwise("NHWC")
    a, why = handed_lane_constant(pg, BlockedActivation(1, 72, 8, 8, 1, 16), [1] + [127] * 7)
    assert a is None and "not the producer's packed one" in why
