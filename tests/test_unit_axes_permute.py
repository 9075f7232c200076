"""A relayout permutation that moves only axes of length 1 moves no element in memory: the host
layout emits it as a reshape (a view) and does not count it as copied bytes
(:class:`tvm_csp_embed.codegen.relayout.HostLayout`). DB0's packed input ends in one
(``(..., 16, 1) -> (..., 1, 16)``)."""
import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_csp_embed.codegen.relayout import HostLayout


class _Packer:
    """The two methods a host layout calls while emitting, bound to a BlockBuilder."""

    def __init__(self, bb):
        self.bb = bb

    def operand(self, expr):
        return expr

    def emit(self, expr, name):
        return self.bb.emit(expr, name)

    emit_unpack = emit


def _emitted(layout: HostLayout, x: np.ndarray):
    """The packed ``x`` by the Relax ops the layout emits (built for llvm), and their op names."""
    bb = relax.BlockBuilder()
    var = relax.Var("x", relax.TensorType(x.shape, "int8"))
    with bb.function("main", [var]):
        with bb.dataflow():
            out = bb.emit_output(layout.pack(_Packer(bb), var))
        bb.emit_func_output(out)
    mod = bb.get()
    ops = [b.value.op.name for b in mod["main"].body.blocks[0].bindings
           if isinstance(b.value, relax.Call)]
    ex = relax.build(mod, target="llvm")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    return got, ops


@pytest.mark.parametrize("perm,view", [((0, 1, 3, 2), True),     # (2, 3, 16, 1) -> (2, 3, 1, 16)
                                       ((0, 3, 1, 2), True),     # the unit axis to the front
                                       ((1, 0, 2, 3), False),    # 2 and 3 swap: a copy
                                       ((0, 2, 1, 3), False)])
def test_a_permutation_of_unit_axes_is_a_view(perm, view):
    x = np.random.default_rng(3).integers(-128, 128, (2, 3, 16, 1)).astype(np.int8)
    layout = HostLayout(x.shape, (("permute", perm),), "t")
    got, ops = _emitted(layout, x)
    np.testing.assert_array_equal(got, np.transpose(x, perm))
    assert ops == (["relax.reshape"] if view else ["relax.permute_dims"])
    assert layout.copied == (0 if view else x.size)
