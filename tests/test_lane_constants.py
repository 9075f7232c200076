"""Lane constants a producer writes into its padded output channels (``codegen/biasfold.py``):
the digits of a positive lane constant (a ReLU producer cannot write -128), the producer's biases
for them, and a producer -> consumer pair with padded channels whose consumer folds its bias into
the producer's padded channels, bit-exact against the unfused definition (numpy, int64).

The network wiring (the producer told to write them, the consumer told its input carries them) is
not built yet: these tests pin the arithmetic it rests on.
"""
from __future__ import annotations

import numpy as np
import pytest

from tvm_csp_embed.codegen.biasfold import (POSITIVE_LANE_CONSTANT, fold_constants, fold_digits,
                                            fold_range, producer_lane_bias)
from tvm_csp_embed.reference import apply_epilogue

RELU = (("bias",), ("shr", 8), ("clip", 0, 127))
SIGNED = (("bias",), ("shr", 6), ("clip", -128, 127))


def test_positive_constant_range_and_digits_by_hand():
    # 1000 = 111 + 127 * 7; -1000 = 16 + 127 * (-8)
    assert fold_digits([1000, -1000], 3, 127).tolist() == [[111, 7, 0], [16, -8, 0]]
    # 8 lanes: 126 + 7 * 127 * 127 and -127 + 7 * 127 * (-128)
    lo, hi = -127 - 7 * 127 * 128, 126 + 7 * 127 * 127
    assert fold_range(8, 127) == (lo, hi) == (-113_919, 113_029)
    assert fold_digits([hi, lo], 8, 127).tolist() == [[126] + [127] * 7, [-127] + [-128] * 7]
    for bad in (hi + 1, lo - 1):
        with pytest.raises(ValueError, match="outside"):
            fold_digits([bad], 8, 127)
    for bad in (0, 1, -1, 128, -129):
        with pytest.raises(ValueError, match="lane constant"):
            fold_range(3, bad)


@pytest.mark.parametrize("lanes,a", [(2, 127), (8, 127), (3, 64), (4, -100), (5, -128)])
def test_digits_sum_to_every_bias_of_the_range(lanes, a):
    consts = np.array([1] + [a] * (lanes - 1), dtype=np.int64)    # by hand
    lo, hi = fold_range(lanes, a)
    b = np.concatenate([np.arange(lo, lo + 400), np.arange(-400, 400), np.arange(hi - 400, hi + 1),
                        np.random.default_rng(lanes).integers(lo, hi + 1, 3000)])
    digits = fold_digits(b, lanes, a)
    assert digits.dtype == np.int8
    np.testing.assert_array_equal(digits.astype(np.int64) @ consts, b)
    np.testing.assert_array_equal(fold_constants(lanes, a).astype(np.int64), consts)


@pytest.mark.parametrize("epilogue,constant", [(RELU, POSITIVE_LANE_CONSTANT), (SIGNED, -128)])
def test_producer_bias_leaves_the_constants_through_its_epilogue(epilogue, constant):
    biases, a, why = producer_lane_bias(epilogue, 8)
    assert why == "" and a == constant
    out = apply_epilogue(np.zeros(8, dtype=np.int64), epilogue, biases)   # zero weights
    np.testing.assert_array_equal(out, [1] + [constant] * 7)


def test_producer_bias_refused_with_a_reason():
    for epilogue, words in [((("shr", 8), ("bias",), ("clip", 0, 127)), "does not start"),
                            ((("bias",), ("mul", 3), ("clip", 0, 127)), "not bias, shifts"),
                            ((("bias",), ("clip", 0, 100)), "keep neither")]:
        biases, a, why = producer_lane_bias(epilogue, 4)
        assert biases is None and a == 0 and words in why


def test_producer_consumer_pair_with_padded_channels_bit_exact():
    """72 channels padded to 80 (RegNet): the producer writes the constants into channels
    72..79, the consumer's 1x1 conv puts its bias digits on those input channels and adds no
    bias; its output equals the unfolded conv + bias + epilogue."""
    rng = np.random.default_rng(3)
    c_in, c_mid, c_pad, c_out, hw = 24, 72, 80, 40, 5
    x = rng.integers(-128, 128, (c_in, hw, hw))
    w1 = rng.integers(-128, 128, (c_mid, c_in))
    b1 = rng.integers(-2 ** 14, 2 ** 14, c_mid)
    w2 = rng.integers(-128, 128, (c_out, c_mid))
    b2 = rng.integers(-90_000, 90_000, c_out)
    lanes = c_pad - c_mid
    # the producer's padded program: zero weights in the padded output channels, their bias
    pad_bias, a, _ = producer_lane_bias(RELU, lanes)
    w1p = np.concatenate([w1, np.zeros((lanes, c_in), np.int64)])
    b1p = np.concatenate([b1, pad_bias])
    mid = apply_epilogue(np.einsum("kc,chw->khw", w1p, x), RELU, b1p[:, None, None])
    np.testing.assert_array_equal(mid[c_mid:], np.broadcast_to(
        fold_constants(lanes, a)[:, None, None], (lanes, hw, hw)))
    # the consumer: its bias's digits on the padded input channels, no bias stage
    w2p = np.concatenate([w2, fold_digits(b2, lanes, a).astype(np.int64)], axis=1)
    folded = apply_epilogue(np.einsum("kc,chw->khw", w2p, mid.astype(np.int64)),
                            RELU[1:], None)
    # the reference: the operators' definitions, unpadded
    ref_mid = apply_epilogue(np.einsum("kc,chw->khw", w1, x), RELU, b1[:, None, None])
    ref = apply_epilogue(np.einsum("kc,chw->khw", w2, ref_mid.astype(np.int64)), RELU,
                         b2[:, None, None])
    np.testing.assert_array_equal(mid[:c_mid], ref_mid)
    np.testing.assert_array_equal(folded, ref)
