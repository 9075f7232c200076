"""Channel concat of VTA outputs in the packed layout: block-aligned parts with one batch block are
placed side by side in the DRAM buffer of the consuming VTA operator (``vta_ext.run_placed``, no
host concat, no unpack/pack); unaligned parts fall back to the NCHW concat with the reason in the
report. Reference: the llvm build of the same module."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from conftest import vta_and_llvm

LAYOUT = "layout transform around a VTA operator"


def _module(channels, batch=1):
    """Parallel 1x1 convs with ``channels`` outputs, concatenated, then a 3x3 conv."""
    x = relax.Var("x", relax.TensorType((batch, 16, 6, 6), "int8"))
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
        assert "placed in DRAM" in cat.reason and "no copy" in cat.reason
        assert "input kept in the packed layout" in consumer.detail
        # the consumer got the parts, and no host concat is left
        assert f"concatenated in DRAM from {len(channels)} packed parts" in consumer.detail
        assert "relax.concat" not in layout_ops
        assert "relax.strided_slice" not in layout_ops  # nothing unpacked
    else:
        assert "not a whole number of 16-channel blocks" in cat.reason and "NCHW" in cat.reason
        assert "input kept" not in consumer.detail and "concatenated in DRAM" not in consumer.detail


def test_concat_of_csp_outputs_in_the_blocked_arrangement_is_made_packed():
    """The parts are CSP embeddings (their output a CSP ``HostLayout``, not the stock class) whose
    packed output puts every element where the stock blocked layout does: the concat is made on
    the packed tensors and placed in DRAM like stock outputs, with no unpack/concat/pack on the
    host (before, only the stock class counted: 12 host layout operations instead of 6)."""
    import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
    import vta_ext

    mod = _module([16, 32])
    x = np.random.default_rng(1).integers(-128, 128, (1, 16, 6, 6)).astype(np.int8)
    with vta_ext.build_options(strategy="csp-relaxed"):
        got, ref, report = vta_and_llvm(mod, [x])
    np.testing.assert_array_equal(got, ref)
    parts = report.on_vta[:2]
    assert all(p.plan.startswith("csp-relaxed NCHW") for p in parts), [p.plan for p in parts]
    (cat,) = [p for p in report.on_cpu if p.name == "cat"]
    assert "made in their packed layout" in cat.reason and "placed in DRAM" in cat.reason
    layout_ops = [p.op for p in report.on_cpu if p.reason == LAYOUT]
    assert "relax.concat" not in layout_ops and "relax.strided_slice" not in layout_ops
    # pack the input once, unpack the output once, nothing around the concat
    assert report.host_relayouts == 6


def test_placed_concat_leaves_no_host_concat_in_the_module():
    """The offloaded module calls ``vta_ext.run_placed`` with the three parts as the consumer's
    first operand (spec "*+*+*,*": data of three whole parts, then the weight) and binds no
    concat."""
    from vta_ext import load_config
    from vta_ext.offload import OffloadToVTA

    text = OffloadToVTA(load_config("default"))(_module([16, 16, 8])).script()
    assert text.count('"vta_ext.run_placed"') == 1 and '"*+*+*,*"' in text
    assert "concat" not in text


def test_concat_of_two_batch_blocks_is_one_host_copy():
    """Batch 2 on the default configuration (BATCH 1): two batch blocks, so the parts are not
    contiguous in the packed concat; it stays one host copy, and the report says why."""
    x = np.random.default_rng(3).integers(-128, 128, (2, 16, 6, 6)).astype(np.int8)
    got, ref, report = vta_and_llvm(_module([16, 32], batch=2), [x])
    np.testing.assert_array_equal(got, ref)
    assert report.devices("relax.nn.conv2d") == ["vta"] * 3
    (cat,) = [p for p in report.on_cpu if p.name == "cat"]
    assert "one host copy" in cat.reason and "more than one batch block" in cat.reason
    consumer = report.on_vta[-1]
    assert "input kept in the packed layout" in consumer.detail
    assert "concatenated in DRAM" not in consumer.detail
    assert "relax.concat" in [p.op for p in report.on_cpu if p.reason == LAYOUT]


def test_program_places_parts_and_refuses_a_copied_stand_in():
    """``Program.placed`` / ``write``: the parts land side by side in the buffer (= numpy's
    concat along the channel-block axis); a stand-in that was copied before writing is an error."""
    from vta_ext import load_config
    from vta_ext.runtime import DramBuffer, Program, RuntimeError_

    rng = np.random.default_rng(4)
    a = rng.integers(-128, 128, (1, 2, 3, 3, 1, 16)).astype(np.int8)
    b = rng.integers(-128, 128, (1, 1, 3, 3, 1, 16)).astype(np.int8)
    shape = (1, 3, 3, 3, 1, 16)
    prog = Program(load_config("default"), np.zeros(4096, np.uint8), 4096, [],
                   {"data": DramBuffer("data", 4096, 432)}, [])
    prog.write("data", prog.placed([a, b], shape, np.int8))
    prog.check_placed()
    np.testing.assert_array_equal(prog.read("data", np.int8, shape), np.concatenate([a, b], 1))
    prog.write("data", prog.placed([b, a], shape, np.int8).copy())  # the stand-in, copied
    with pytest.raises(RuntimeError_, match="not written"):
        prog.check_placed()
    prog.check_placed()  # forgotten after the error
    with pytest.raises(ValueError, match="do not make an operand"):
        prog.placed([a], shape, np.int8)
