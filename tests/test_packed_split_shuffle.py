"""Channel split and channel shuffle of VTA outputs in the packed layout (ShuffleNetV2's blocks):
a block-aligned split is a slice of the packed tensor's channel-block axis per piece, a shuffle
whose groups are whole channel blocks is one transpose of the packed tensor, and the next VTA
operator takes either over. References: numpy (the NCHW shuffle, then ``pack_nchw``) and the
llvm build of the same Relax module."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from conftest import pack_nchw, vta_and_llvm
from vta_ext.packing import BlockedActivation, channel_shuffle_map

LAYOUT = "layout transform around a VTA operator"


def _nchw_shuffle(x: np.ndarray, groups: int) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, groups, c // groups, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)


@pytest.mark.parametrize("n,c,groups,b,k", [(1, 96, 2, 1, 16), (2, 64, 4, 2, 16),
                                            (1, 72, 3, 1, 12), (3, 32, 2, 2, 16),
                                            (1, 64, 8, 1, 8)])
def test_packed_channel_shuffle_matches_numpy(n, c, groups, b, k):
    x = np.random.default_rng(c + groups).integers(-128, 128, (n, c, 5, 3)).astype(np.int8)
    layout = BlockedActivation(n, c, 5, 3, b, k)
    packed = layout.pack_numpy(x)
    got = np.zeros_like(packed)
    got[channel_shuffle_map(layout, groups)(*np.indices(packed.shape))] = packed
    np_ = -(-n // b) * b  # the packing pads the batch to whole blocks
    ref = pack_nchw(np.pad(_nchw_shuffle(x, groups), [(0, np_ - n), (0, 0), (0, 0), (0, 0)]), b, k)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("c,groups,k", [(48, 2, 16), (64, 3, 16), (96, 32, 16)])
def test_packed_channel_shuffle_refuses_non_blockwise(c, groups, k):
    with pytest.raises(ValueError, match="blockwise only if"):
        channel_shuffle_map(BlockedActivation(1, c, 4, 4, 1, k), groups)


def _conv(bb, x, w, shift, padding=0):
    a = bb.emit(relax.op.nn.conv2d(x, w, padding=padding, out_dtype="int32"))
    a = bb.emit(relax.op.right_shift(a, relax.const(shift, "int32")))
    a = bb.emit(relax.op.clip(a, -128, 127))
    return bb.emit(relax.op.astype(a, "int8"))


def _shuffle_unit(channels: int):
    """conv 16 -> ``channels`` -> split in halves -> 1x1 conv of the second half -> concat with the
    first half -> channel shuffle (2 groups) -> 3x3 conv to 16 channels."""
    half = channels // 2
    x = relax.Var("x", relax.TensorType((1, 16, 6, 6), "int8"))
    rng = np.random.default_rng(channels)
    weight = lambda *shape: relax.const(rng.integers(-4, 5, shape).astype(np.int8))  # noqa: E731
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = _conv(bb, x, weight(channels, 16, 1, 1), 3)
            halves = bb.emit(relax.op.split(y, 2, axis=1), name_hint="halves")
            left = bb.emit(relax.TupleGetItem(halves, 0))
            right = bb.emit(relax.TupleGetItem(halves, 1))
            right = _conv(bb, right, weight(half, half, 1, 1), 3)
            cat = bb.emit(relax.op.concat([left, right], axis=1), name_hint="cat")
            s = bb.emit(relax.op.reshape(cat, (1, 2, half, 6, 6)))
            s = bb.emit(relax.op.permute_dims(s, [0, 2, 1, 3, 4]))
            s = bb.emit(relax.op.reshape(s, (1, channels, 6, 6)), name_hint="shuffled")
            out = _conv(bb, s, weight(16, channels, 3, 3), 5, padding=1)
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def test_shuffle_unit_in_the_packed_layout():
    x = np.random.default_rng(1).integers(-128, 128, (1, 16, 6, 6)).astype(np.int8)
    got, ref, report = vta_and_llvm(_shuffle_unit(64), [x])
    np.testing.assert_array_equal(got, ref)
    assert len(np.unique(got)) > 50
    assert report.devices("relax.nn.conv2d") == ["vta"] * 3
    # the branch conv takes its split piece over, the last conv the shuffled tensor
    convs = [p for p in report.on_vta if p.op == "relax.nn.conv2d"]
    assert ["input kept in the packed layout" in p.detail for p in convs] == [False, True, True]
    (split,) = [p for p in report.on_cpu if p.name == "halves"]
    (shuffle,) = [p for p in report.on_cpu if p.name == "shuffled"]
    assert "made in its packed layout" in split.reason and "32+32" in split.reason
    assert "made in its packed layout" in shuffle.reason
    assert "one layout_transform" in shuffle.reason
    (cat,) = [p for p in report.on_cpu if p.name == "cat"]  # the shuffle, on the host, takes it
    assert "one host copy" in cat.reason and "a CPU operator uses the packed concat" in cat.reason
    # the piece the branch conv takes is read in place from the split tensor's channel blocks
    assert "split piece read in place" in convs[1].detail
    layout_ops = sorted(p.op for p in report.on_cpu if p.reason == LAYOUT)
    # by hand: pack x (reshape, permute; no padding), the slice of the piece the host concat
    # takes, the packed concat, the shuffle (one layout_transform), unpack the output (permute,
    # reshape)
    assert layout_ops == sorted(["relax.reshape", "relax.permute_dims", "relax.strided_slice",
                                 "relax.concat", "relax.layout_transform", "relax.permute_dims",
                                 "relax.reshape"])
    assert report.host_relayouts == 7
    # nothing else runs on the CPU: no NCHW split, concat or shuffle; the shuffle's first two
    # NCHW steps (reshape, permute_dims) are reported as part of the packed one
    others = [p for p in report.on_cpu if p.reason != LAYOUT and p.name not in
              ("halves", "cat", "shuffled")]
    assert sorted(p.op for p in others) == ["relax.permute_dims", "relax.reshape"]
    assert all(p.reason == shuffle.reason for p in others)


def test_unaligned_split_and_shuffle_stay_in_nchw():
    """48 channels: halves of 24 are not whole 16-channel blocks; bit-exact, with the reasons."""
    x = np.random.default_rng(2).integers(-128, 128, (1, 16, 6, 6)).astype(np.int8)
    got, ref, report = vta_and_llvm(_shuffle_unit(48), [x])
    np.testing.assert_array_equal(got, ref)
    assert report.devices("relax.nn.conv2d") == ["vta"] * 3
    (split,) = [p for p in report.on_cpu if p.name == "halves"]
    assert "not a whole number of 16-channel blocks" in split.reason and "NCHW" in split.reason
    convs = [p for p in report.on_vta if p.op == "relax.nn.conv2d"]
    assert not any("input kept" in p.detail for p in convs)
