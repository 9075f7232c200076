"""The exceptions that decide where an operator runs.

Exactly one exception keeps an operator on the CPU: :class:`TemplateRefusal`. A template (or a
strategy) raises it when the operator is outside what it implements, with the reason the build
report shows. Every other exception raised while building an offloaded operator is a bug or a user
error and fails ``relax.build`` with a :class:`VTABuildError` that names the operator and its shapes.
"""
from __future__ import annotations

import tvm_ffi

__all__ = ["TemplateRefusal", "VTABuildError"]


class TemplateRefusal(Exception):
    """The template (or strategy) does not implement this operator instance; it stays on the CPU.

    ``str(err)`` is the reason printed in the build report, e.g. ``"padding 17 exceeds the 4-bit
    DMA pad field (max 15)"``.
    """


@tvm_ffi.register_error("VTABuildError")
class VTABuildError(RuntimeError):
    """Building an offloaded operator failed for a reason other than a refusal.

    Registered with TVM's FFI, so it keeps its type through ``relax.build``'s C++ layers."""
