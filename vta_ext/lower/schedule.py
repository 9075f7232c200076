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

__all__ = ["unchecked_schedule"]


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
