"""Property test: random small matmuls and convolutions embed, and every embedding is proven."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_csp_embed import conv2d, embed, gemm, matmul
from tvm_csp_embed.verify import check_numeric, check_scalar

SMALL = gemm((1, 4, 4))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(M=st.integers(1, 6), N=st.integers(1, 9), K=st.integers(1, 9), tb=st.booleans(),
       mode=st.sampled_from(["strict", "relaxed"]))
def test_random_matmul(M, N, K, tb, mode):
    e = embed(matmul(M, N, K, transpose_b=tb), SMALL, mode)
    check_scalar(e)
    check_numeric(e, seed=M * 100 + N * 10 + K)
    # padding never exceeds one block per walked dim
    for d, p in e.padding.items():
        assert p < e.walked[d].size * e.walked[d].stride


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.integers(1, 5), k=st.integers(1, 6), hw=st.integers(3, 6), r=st.integers(1, 3),
       stride=st.integers(1, 2), pad=st.integers(0, 1), layout=st.sampled_from(["NCHW", "NHWC", "HWNC"]),
       mode=st.sampled_from(["strict", "relaxed"]))
def test_random_conv(c, k, hw, r, stride, pad, layout, mode):
    if hw + 2 * pad < r:
        return
    wl = conv2d(1, c, hw, hw, k, r, r, pad=(pad, pad), stride=(stride, stride), layout=layout)
    e = embed(wl, SMALL, mode)
    check_scalar(e)
    check_numeric(e, seed=c + 10 * k)
    if mode == "strict":
        assert e.dims_of("z") == ("c",)  # strict: only the linear reduction dim
