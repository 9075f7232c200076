"""A max pool of a channel concat split into one pool per part (issue 32), before the offload.

``max_pool2d(concat((e1, e2), axis=1)) -> concat((max_pool2d(e1), max_pool2d(e2)), axis=1)``: a
pool works on each channel alone, so the two are equal to the bit. Squeezenet's fire modules end
in such a pool over the concat of their two expand convs; split, each pool's input is one conv's
output, which the offload pass may then fuse into that conv (``build_options(fuse_pool=True)``,
:mod:`vta_ext.offload.fusion`). Only a concat that the pool alone uses is split (else the concat
stays for its other users and the split pools would read the parts twice). Run by
:func:`vta_ext.offload.transform.OffloadToVTA` when ``fuse_pool`` is on.
"""
from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..quantize.common import op_name
from .fusion import use_counts

__all__ = ["split_pooled_concats"]


@mutator
class _PoolSplitter(PyExprMutator):
    """Rewrites ``max_pool2d(concat(parts, axis=1))`` bindings (module docstring)."""

    def __init__(self, mod: tvm.IRModule, uses) -> None:
        super().__init__(mod)
        self.uses = uses
        self.split = 0

    def visit_var_binding_(self, binding) -> None:
        value = binding.value
        if op_name(value) == "relax.nn.max_pool2d" and isinstance(value.args[0], relax.Var):
            concat = self.lookup_binding(value.args[0])
            attrs = value.attrs
            if (op_name(concat) == "relax.concat" and int(concat.attrs.axis) == 1
                    and str(attrs.layout) == "NCHW" and str(attrs.out_layout) == "NCHW"
                    and isinstance(concat.args[0], relax.Tuple)
                    and self.uses.get(value.args[0].name, 0) == 1):
                pools = [self.builder_.emit(relax.op.nn.max_pool2d(
                    self.visit_expr(part), attrs.pool_size, attrs.strides, attrs.padding,
                    attrs.dilation, bool(attrs.ceil_mode), bool(attrs.count_include_pad),
                    str(attrs.layout), str(attrs.out_layout)),
                    name_hint=f"{binding.var.name}_part{i}")
                    for i, part in enumerate(concat.args[0].fields)]
                concat = self.builder_.normalize(relax.op.concat(pools, axis=1))
                self.builder_.emit_normalized(relax.VarBinding(binding.var, concat))
                self.split += 1
                return
        super().visit_var_binding_(binding)


def split_pooled_concats(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each max pool of a channel concat that it alone uses split into a concat of
    one pool per part (module docstring); the concats left without a user removed."""
    uses = {}
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            for name, n in use_counts(func).items():
                uses[name] = uses.get(name, 0) + n
    splitter = _PoolSplitter(mod, uses)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            splitter.builder_.update_func(gvar, splitter.visit_expr(func))
    if not splitter.split:
        return mod
    return relax.transform.DeadCodeElimination()(splitter.builder_.get())
