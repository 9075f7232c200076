"""A relayout permutation that moves only axes of length 1 moves no element in memory: the host
layout emits it as a reshape (a view) and does not count it as copied bytes
(:class:`tvm_csp_embed.codegen.relayout.HostLayout`). DB0's packed input ends in one
(``(..., 16, 1) -> (..., 1, 16)``)."""
import numpy as np
import pytest
from conftest import emitted_packing

from tvm_csp_embed.codegen.relayout import HostLayout


@pytest.mark.parametrize("perm,view", [((0, 1, 3, 2), True),     # (2, 3, 16, 1) -> (2, 3, 1, 16)
                                       ((0, 3, 1, 2), True),     # the unit axis to the front
                                       ((1, 0, 2, 3), False),    # 2 and 3 swap: a copy
                                       ((0, 2, 1, 3), False)])
def test_a_permutation_of_unit_axes_is_a_view(perm, view):
    x = np.random.default_rng(3).integers(-128, 128, (2, 3, 16, 1)).astype(np.int8)
    layout = HostLayout(x.shape, (("permute", perm),), "t")
    written, pack = emitted_packing(layout)
    np.testing.assert_array_equal(pack(x), np.transpose(x, perm))
    assert written == ([] if view else [("relax.permute_dims", x.size)])
    assert layout.copied == (0 if view else x.size)
