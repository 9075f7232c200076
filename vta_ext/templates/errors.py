"""The exceptions of the stock templates, and which of them keep an operator on the CPU.

Three kinds of failure, three behaviours of ``relax.build``:

* a **refusal** (a :class:`~vta_ext.errors.TemplateRefusal`): the template does not implement this
  operator instance -- unsupported padding, stride or shape, an epilogue immediate the ALU cannot
  hold, no tiling that fits the scratchpads, a missing ISA extension. The operator stays on the
  CPU and the build report prints the message. Classes: :class:`Conv2dRefusal`,
  :class:`AluTemplateRefusal`, :class:`EpilogueRefusal`.
* a **knob error** (:class:`KnobError`): the knobs a user, a tuner or a record gave are not a point
  of the template's knob space. The build fails; the message names the knob and its valid values.
* any other :class:`TemplateError` (:class:`Conv2dError`, :class:`AluTemplateError`,
  :class:`EpilogueError`): the template was called wrongly (a malformed epilogue stage, packed
  inputs of the wrong shape). The build fails.
"""
from __future__ import annotations

from ..errors import TemplateRefusal

__all__ = ["TemplateError", "KnobError", "EpilogueError", "EpilogueRefusal", "Conv2dError",
           "Conv2dRefusal", "AluTemplateError", "AluTemplateRefusal"]


class TemplateError(ValueError):
    """A stock template was used wrongly (the message says what to change)."""


class KnobError(TemplateError):
    """The knobs are not a point of the template's knob space; never a refusal.

    The message names the knob and lists its valid values (or the reason the point was pruned).
    """


class EpilogueError(TemplateError):
    """A malformed epilogue stage (unknown kind, wrong number of arguments)."""


class EpilogueRefusal(EpilogueError, TemplateRefusal):
    """A well-formed epilogue the ALU cannot execute (e.g. an immediate outside int16)."""


class Conv2dError(TemplateError):
    """Misuse of a GEMM template (conv2d, group conv2d, dense): e.g. packed inputs of a wrong shape."""


class Conv2dRefusal(Conv2dError, TemplateRefusal):
    """A GEMM workload the templates do not implement (e.g. padding beyond the DMA pad field)."""


class AluTemplateError(TemplateError):
    """Misuse of an ALU template (pooling, residual add, depthwise conv2d)."""


class AluTemplateRefusal(AluTemplateError, TemplateRefusal):
    """A workload or configuration the ALU templates do not implement (e.g. a row that does not fit
    the accumulator, a missing ISA extension)."""
