"""Channel concat of VTA outputs in the packed layout: block-aligned parts are put side by side
along the channel-block axis (one host copy, no unpack/pack) and the next VTA operator takes the
packed tensor over; unaligned parts fall back to the NCHW concat with the reason in the report.
Reference: the llvm build of the same module."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from conftest import vta_and_llvm


def _module(channels):
    """Parallel 1x1 convs with ``channels`` outputs, concatenated, then a 3x3 conv."""
    x = relax.Var("x", relax.TensorType((1, 16, 6, 6), "int8"))
    bb = relax.BlockBuilder()
    rng = np.random.default_rng(0)
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = []
            for c in channels:
                w = relax.const(rng.integers(-4, 5, (c, 16, 1, 1)).astype(np.int8))
                a = bb.emit(relax.op.nn.conv2d(x, w, out_dtype="int32"))
                a = bb.emit(relax.op.right_shift(a, relax.const(2, "int32")))
                a = bb.emit(relax.op.clip(a, -128, 127))
                parts.append(bb.emit(relax.op.astype(a, "int8")))
            y = bb.emit(relax.op.concat(parts, axis=1), name_hint="cat")
            w = relax.const(rng.integers(-4, 5, (16, sum(channels), 3, 3)).astype(np.int8))
            a = bb.emit(relax.op.nn.conv2d(y, w, padding=1, out_dtype="int32"))
            a = bb.emit(relax.op.right_shift(a, relax.const(4, "int32")))
            a = bb.emit(relax.op.clip(a, -128, 127))
            out = bb.emit_output(relax.op.astype(a, "int8"))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("channels,packed", [([16, 32], True), ([16, 16, 8], True),
                                             ([8, 16], False)])
def test_channel_concat_in_the_packed_layout(channels, packed):
    mod = _module(channels)
    x = np.random.default_rng(1).integers(-128, 128, (1, 16, 6, 6)).astype(np.int8)
    got, ref, report = vta_and_llvm(mod, [x])
    np.testing.assert_array_equal(got, ref)
    assert len(np.unique(got)) > 50
    assert report.devices("relax.nn.conv2d") == ["vta"] * (len(channels) + 1)
    (cat,) = [p for p in report.on_cpu if p.name == "cat"]
    consumer = report.on_vta[-1]
    layout_ops = [p.op for p in report.on_cpu if p.reason == "layout transform around a VTA operator"]
    if packed:
        assert "made in their packed layout" in cat.reason and "no unpack/pack" in cat.reason
        assert "input kept in the packed layout" in consumer.detail
        assert "relax.strided_slice" not in layout_ops  # nothing unpacked
    else:
        assert "not a whole number of 16-channel blocks" in cat.reason and "NCHW" in cat.reason
        assert "input kept" not in consumer.detail
