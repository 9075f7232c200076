"""Wall time of the host relayout around a VTA operator, compiled for llvm.

A packed layout (:class:`~tvm_csp_embed.codegen.relayout.HostLayout`, or the stock
:class:`vta_ext.packing.BlockedActivation`) emits its packing and unpacking as Relax ops through a
packer. :func:`relayout_seconds` compiles the packing of the activation and the unpacking of the
output as two small Relax functions for llvm (exactly the ops the offload pass emits) and returns
their wall time, min and median over repeats, summed. Constant weights are relayouted at build time
and cost nothing at run time.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Tuple

__all__ = ["relayout_seconds"]


class _TimingPacker:
    """The packer protocol of :mod:`vta_ext.packing`, binding into a plain BlockBuilder."""

    def __init__(self, bb) -> None:
        self.bb = bb

    def emit(self, expr, name: str):
        return self.bb.emit(expr, name_hint=f"pack_{name}")

    def emit_unpack(self, expr, name: str):
        return self.bb.emit(expr, name_hint=f"unpack_{name}")

    def operand(self, expr):
        return expr

    def add_func(self, func, name: str):
        return self.bb.add_func(func, name)

    def handover(self, expr, layout):
        return None

    def note_kept(self, kept: bool) -> None:
        pass


def _compiled(layout: Any, kind: str, shape: Tuple[int, ...]):
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "int8"))
    packer = _TimingPacker(bb)
    with bb.function("main", [x]):
        with bb.dataflow():
            if kind == "pack":
                y = layout.pack(packer, x)
                y = y[0] if isinstance(y, tuple) else y        # BlockedActivation: (expr, kept)
            else:
                y = bb.emit(layout.unpack(packer, x))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    ex = relax.build(bb.get(), target="llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"]


def relayout_seconds(pack_layout: Any, src_shape: Tuple[int, ...], unpack_layout: Any,
                     repeats: int = 20) -> Tuple[float, float]:
    """``(min, median)`` seconds of packing an int8 tensor of ``src_shape`` with ``pack_layout`` plus
    unpacking the packed output of ``unpack_layout`` (each timed separately over ``repeats`` runs
    after a warm-up; the two minima and the two medians are summed)."""
    import numpy as np
    import tvm

    mins, medians = [], []
    for layout, kind, shape in ((pack_layout, "pack", tuple(src_shape)),
                                (unpack_layout, "unpack", tuple(unpack_layout.shape))):
        fn = _compiled(layout, kind, shape)
        arr = tvm.runtime.tensor(np.zeros(shape, np.int8))
        fn(arr)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn(arr)
            times.append(time.perf_counter() - t)
        mins.append(min(times))
        medians.append(statistics.median(times))
    return sum(mins), sum(medians)
