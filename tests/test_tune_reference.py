"""The tuner's numpy references (tvm_csp_embed.tune.reference): the per-channel multiplier stage
``("mulv",)`` of vta_ext.templates.epilogue, against hand-computed values and against the stock
templates on the functional simulator."""
import numpy as np
import pytest

from tvm_csp_embed import tune
from tvm_csp_embed.tune.measure import verify_point
from tvm_csp_embed.tune.reference import apply_epilogue, reference_for

REQUANT = (("bias",), ("shr", 2), ("mulv",), ("add", 1))


def test_mulv_stage_by_hand():
    # channel 0: (1000 + 24) >> 2 = 256, * -3 = -768, + 1 = -767, stored as its low byte: 1
    # channel 1: (-3 + 7) >> 2 = 1, * 100 = 100, + 1 = 101
    acc = np.array([[1000, -3]])
    out = apply_epilogue(acc, REQUANT, np.array([[24, 7]]), np.array([[-3, 100]]))
    assert out.dtype == np.int8 and out.tolist() == [[1, 101]]
    # the product wraps modulo 2**32 as on the ALU: 2**30 * 4 = 2**32 -> 0; then clip
    out = apply_epilogue(np.array([1 << 30, 5]), (("mulv",), ("clip", -128, 127)), None,
                         np.array([4, -100]))
    assert out.tolist() == [0, -128]


def test_mulv_without_its_tensor_is_an_error():
    with pytest.raises(ValueError, match="mulv"):
        apply_epilogue(np.array([1]), (("mulv",),), None)


@pytest.mark.parametrize("kind, workload", [
    ("dense", dict(batch=1, in_features=32, out_features=32)),
    ("conv2d", dict(batch=1, height=4, width=4, in_channels=16, out_channels=32, kernel_h=3,
                    kernel_w=3, pad_h=1, pad_w=1, stride_h=1, stride_w=1)),
])
def test_mulv_reference_agrees_with_the_stock_template(kind, workload):
    """Inputs: data, weights, then bias and multiplier (VECTOR_STAGES order); the template's
    output on the functional simulator equals the reference bit for bit."""
    task = tune.Task.create(kind, workload, REQUANT + (("shr", 3), ("clip", -128, 127)),
                            "stock", "default")
    inputs, _ = reference_for(kind, "stock")(task.config, task.workload, task.epilogue,
                                             np.random.default_rng(0))
    assert len(inputs) == 4 and all(a.dtype == np.int32 for a in inputs[2:])
    assert verify_point(task.spec(), task.knob_space.tps) is None
