"""A TIR schedule whose primitives skip TVM's per-call argument type check.

``tvm.s_tir.Schedule`` wraps each primitive (``split``, ``compute_at``, ``tensorize``, ...) in a
Python type checker that binds the signature and walks every argument's type hint on every call.
The templates of this package call a few hundred primitives per operator with arguments they
build themselves, and the check was about a third of their schedule time (a ResNet-18 build:
2,273 checked calls). :func:`unchecked_schedule` returns an ordinary ``Schedule`` object whose
primitives call the unwrapped functions; TVM still validates every argument in C++ (a wrong
argument raises there instead of in the Python check).
"""
from __future__ import annotations

import functools

__all__ = ["unchecked_schedule", "continued_reduction", "schedule_bias_gemm"]


@functools.lru_cache(maxsize=None)
def _unchecked_class():
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule import _type_checker

    def checked(attr) -> bool:   # a function wrapped by _type_checker.type_checked
        code = getattr(attr, "__code__", None)
        return (hasattr(attr, "__wrapped__") and code is not None
                and code.co_filename == _type_checker.__file__)

    methods = {name: attr.__wrapped__ for name, attr in vars(Schedule).items() if checked(attr)}
    methods["__module__"] = __name__
    return type("UncheckedSchedule", (Schedule,), methods)


def unchecked_schedule(func):
    """``tvm.s_tir.Schedule(func)`` with the Python type check of its primitives skipped.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc or tvm.IRModule
        What to schedule, as for ``Schedule``.

    Returns
    -------
    tvm.s_tir.Schedule
        An instance of a subclass of ``Schedule``; it behaves like one in every other way.
    """
    sch = _unchecked_class()(func)
    return sch


def continued_reduction(sch, name: str, prev: str):
    """The module of ``sch`` with the reduction block ``name`` starting from the value of block
    ``prev`` at the same index instead of 0 (its init reads ``prev``'s buffer): what the TE stage
    states (``te.sum(..., init=prev)``) but ``te.create_prim_func`` drops (it writes the
    reducer's identity).

    Parameters
    ----------
    sch : tvm.s_tir.Schedule
    name, prev : str
        The continued reduction block and the block whose value it starts from.

    Returns
    -------
    tvm.IRModule
        The replaced module (schedule it again with :func:`unchecked_schedule`).
    """
    import tvm
    from tvm.s_tir.stmt import SBlock
    from tvm.tirx import BufferLoad
    from tvm.tirx.stmt import BufferStore

    blk = sch.get_sblock(name)
    old = sch.get(blk)
    written = sch.get(sch.get_sblock(prev)).writes[0]
    src, at = written.source, list(old.init.indices)
    region = tvm.ir.TensorRegion(src, [tvm.ir.Range.from_min_extent(i, 1) for i in at], written.ty)
    new = SBlock(old.iter_vars, list(old.reads) + [region], old.writes, old.name_hint, old.body,
                 BufferStore(old.init.buffer, BufferLoad(src, at), at), old.alloc_buffers,
                 old.match_buffers, old.annotations)
    sch.state.replace(sch.get_sref(blk), new, {old: new})
    return sch.mod


def _drop_init_read(sch, blk, src) -> None:
    """Remove from the update block ``blk`` of a reduction decomposed by ``decompose_reduction``
    the read of buffer ``src``, which its init (:func:`continued_reduction`) read: only the init
    block reads it (the read kept the stages in order until the decomposition; the update must
    match the GEMM intrinsic, which reads the accumulator, the input and the weights)."""
    from tvm.s_tir.stmt import SBlock

    old = sch.get(blk)
    reads = [r for r in old.reads if not r.source.same_as(src)]
    new = SBlock(old.iter_vars, reads, old.writes, old.name_hint, old.body, old.init,
                 old.alloc_buffers, old.match_buffers, old.annotations)
    sch.state.replace(sch.get_sref(blk), new, {old: new})


def schedule_bias_gemm(sch, name: str, store, gemm_name: str, batched: bool,
                       operands: tuple = ("bias_row", "bias_digits")) -> None:
    """Schedule a bias GEMM stage ``name`` (a reduction over the lanes of a constant input row
    times a digit weight tile, continuing the accumulator of the stage before:
    :func:`continued_reduction`), computed at the output tile's ``store`` loop: its constant row
    and digit tiles loaded there, after the tile's GEMM loops (so that their loads do not wait
    for the previous tile's epilogue), its accumulator that of the stage before (its init, a
    copy, made an alias, :data:`vta_ext.lower.intrin.ACC_ALIAS_PRAGMA`), the GEMM intrinsic
    ``gemm_name`` tensorized at the lanes: the tile's two outer loops fold into the
    instruction's (input and weight factors 0), the others are its micro-ops.

    Parameters
    ----------
    sch : tvm.s_tir.Schedule
    name : str
        The bias GEMM block.
    store : loop
        The output tile's store loop.
    gemm_name : str
        The registered GEMM intrinsic.
    batched : bool
        Whether the lanes have a batch loop (``BATCH > 1``) above the output channel lanes.
    operands : tuple of str
        The names of the constant row and the digit tiles (loaded into the input and weight
        buffers).
    """
    from .intrin import ACC_ALIAS_PRAGMA
    from ..memory import INP_SCOPE, WGT_SCOPE

    blk = sch.get_sblock(name)
    acc = sch.get(blk).writes[0].source
    # the accumulator it continues: the other buffer of its scope that it reads
    (prev,) = [r.source for r in sch.get(blk).reads
               if r.source.scope() == acc.scope() and not r.source.same_as(acc)]
    for buf, scope in zip(operands, (INP_SCOPE, WGT_SCOPE)):
        reads = [r.source.name for r in sch.get(blk).reads]
        sch.compute_at(sch.cache_read(blk, reads.index(buf), scope), store)
    loops = sch.get_loops(blk)
    below = next(i for i, lp in enumerate(loops) if sch.get(lp).same_as(sch.get(store))) + 1
    init = sch.decompose_reduction(blk, loops[below])
    sch.annotate(sch.get_loops(init)[below], ACC_ALIAS_PRAGMA, 1)
    _drop_init_read(sch, blk, prev)
    loops = sch.get_loops(blk)
    sch.tensorize(loops[-3] if batched else loops[-2], gemm_name)
