"""The epilogue: element-wise stages on the int32 accumulator, then the truncating int8 store.

Every template that writes an int8 result takes an epilogue, and this module is its one
definition: the stage kinds with their arguments and validation (:func:`normalize_epilogue`), the
ALU instructions of a stage (:func:`alu_ops`), the ALU emission of the hand-written templates
(:func:`emit_epilogue`) and the TE expression of the scheduled ones (:func:`te_stage`), side by side.

An epilogue is a tuple of stages applied in order to the int32 accumulator:

======================  ==========================================  =============================
stage                   value                                       ALU instructions
======================  ==========================================  =============================
``("shr", s)``          ``x >> s`` (arithmetic, ``0 <= s <= 31``)   SHR imm ``s`` (none if 0)
``("bias",)``           ``x + bias`` (int32 tensor in the acc)      ADD vector (template-specific)
``("clip", lo, hi)``    ``max(min(x, hi), lo)``                     CLIP imm with ``EXT_CLIP`` and
                                                                    int8 bounds, else MIN ``hi``
                                                                    then MAX ``lo``
``("min", c)``          ``min(x, c)``                               MIN imm ``c``
``("max", c)``          ``max(x, c)``                               MAX imm ``c``
``("add", c)``          ``x + c``                                   ADD imm ``c``
======================  ==========================================  =============================

followed by the STORE, which keeps the low 8 bits of every lane. int32 arithmetic wraps.
Immediates must fit the signed 16-bit ALU immediate; at most one ``("bias",)`` stage.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Iterable, List, Optional, Tuple

from ..config import VTAConfig
from ..isa import AluOp, clip_alu_ops
from ..layout import IMM_MAX, IMM_MIN
from .alu_program import alu_range
from .errors import EpilogueError, EpilogueRefusal

__all__ = ["Stage", "Epilogue", "EPILOGUE_ORIGINAL", "EPILOGUE_PIPELINE", "STAGE_ARITY",
           "MAX_SHIFT", "normalize_epilogue", "has_bias", "alu_ops", "alu_count", "te_stage",
           "emit_epilogue"]

Stage = Tuple[Any, ...]
#: a normalised epilogue: a tuple of stages (tuples whose first item is the kind)
Epilogue = Tuple[Stage, ...]

#: ``(conv >> 8) + bias``, clip [0, 127]: the original integration tests
EPILOGUE_ORIGINAL: Epilogue = (("shr", 8), ("bias",), ("clip", 0, 127))
#: ``(conv + bias) >> s``, clip: the Relax pipeline's requantisation (shift 8 shown)
EPILOGUE_PIPELINE: Epilogue = (("bias",), ("shr", 8), ("clip", 0, 127))

#: stage kind -> number of integer arguments
STAGE_ARITY = {"shr": 1, "bias": 0, "clip": 2, "min": 1, "max": 1, "add": 1}
#: largest right shift of the int32 accumulator
MAX_SHIFT = 31


def _int(stage: Stage, value: Any) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise EpilogueError(f"epilogue stage {stage!r}: argument {value!r} is not an integer")
    return int(value)


def normalize_epilogue(epilogue: Optional[Iterable]) -> Epilogue:
    """Validate an epilogue description and return it as a tuple of tuples.

    A stage may be given as a tuple, a list or a bare kind string (``"bias"``).

    Raises
    ------
    EpilogueError
        For a malformed stage: unknown kind, wrong number of arguments, non-integer arguments,
        ``clip`` with ``lo > hi``.
    EpilogueRefusal
        For a well-formed epilogue the ALU cannot execute: a shift outside ``0..31``, an
        immediate outside int16, more than one ``("bias",)`` stage.
    """
    if epilogue is None:
        return ()
    out: List[Stage] = []
    for st in epilogue:
        st = (st,) if isinstance(st, str) else tuple(st)
        if not st:
            raise EpilogueError("empty epilogue stage")
        kind = st[0]
        if kind not in STAGE_ARITY:
            raise EpilogueError(f"unknown epilogue stage {st!r}; known: {', '.join(STAGE_ARITY)}")
        if len(st) != 1 + STAGE_ARITY[kind]:
            args = ", ".join(["lo", "hi"] if kind == "clip" else ["c"] * STAGE_ARITY[kind])
            raise EpilogueError(f"epilogue stage {st!r}: expected ({kind!r}{', ' if args else ''}"
                                f"{args})")
        norm = (kind,) + tuple(_int(st, v) for v in st[1:])
        if kind == "shr" and not 0 <= norm[1] <= MAX_SHIFT:
            raise EpilogueRefusal(f"epilogue stage {st!r}: the shift must be in 0..{MAX_SHIFT}")
        if kind == "clip" and norm[1] > norm[2]:
            raise EpilogueError(f"epilogue stage {st!r}: expected ('clip', lo, hi) with lo <= hi")
        for v in norm[1:]:
            if not IMM_MIN <= v <= IMM_MAX:
                raise EpilogueRefusal(f"epilogue stage {st!r}: immediate {v} does not fit the "
                                      f"16-bit ALU immediate ({IMM_MIN}..{IMM_MAX})")
        out.append(norm)
    if sum(st[0] == "bias" for st in out) > 1:
        raise EpilogueRefusal("at most one ('bias',) epilogue stage is supported")
    return tuple(out)


def has_bias(epilogue: Epilogue) -> bool:
    """Whether the (normalised) epilogue adds a bias tensor."""
    return any(st[0] == "bias" for st in epilogue)


def alu_ops(cfg: VTAConfig, stage: Stage) -> List[Tuple[AluOp, int]]:
    """The ALU instructions ``(op, immediate)`` of an immediate stage, in order.

    ``("bias",)`` is not an immediate stage (its vector ADD depends on the template's layout of the
    bias rows): it raises :class:`EpilogueError`.
    """
    kind = stage[0]
    if kind == "shr":
        return [(AluOp.SHR, stage[1])] if stage[1] else []
    if kind == "clip":
        return clip_alu_ops(cfg.EXT_CLIP, stage[1], stage[2])
    if kind in ("min", "max", "add"):
        return [({"min": AluOp.MIN, "max": AluOp.MAX, "add": AluOp.ADD}[kind], stage[1])]
    raise EpilogueError(f"epilogue stage {stage!r} has no immediate ALU form")


def alu_count(cfg: VTAConfig, epilogue: Epilogue) -> int:
    """ALU instructions the epilogue costs per tile (the bias ADD counted as one)."""
    return sum(1 if st[0] == "bias" else len(alu_ops(cfg, st)) for st in epilogue)


def te_stage(stage: Stage, value, bias_value=None):
    """The TE/TIR expression of ``stage`` applied to the int32 ``value``.

    ``bias_value`` is the int32 bias element for a ``("bias",)`` stage. The lowering recognises
    ``max(min(x, hi), lo)`` as one clip and emits it as :func:`alu_ops` does.
    """
    from tvm import te, tirx

    kind = stage[0]
    if kind == "bias":
        if bias_value is None:
            raise EpilogueError("a ('bias',) stage needs the bias value")
        return value + bias_value
    if kind == "shr":
        return value >> tirx.const(stage[1], "int32")
    if kind == "clip":
        return te.max(te.min(value, tirx.const(stage[2], "int32")), tirx.const(stage[1], "int32"))
    if kind == "min":
        return te.min(value, tirx.const(stage[1], "int32"))
    if kind == "max":
        return te.max(value, tirx.const(stage[1], "int32"))
    if kind == "add":
        return value + tirx.const(stage[1], "int32")
    raise EpilogueError(f"unknown epilogue stage {stage!r}")


def emit_epilogue(q, cfg: VTAConfig, epilogue: Epilogue, base: int, size: int,
                  bias: Optional[Callable] = None) -> None:
    """Emit the (normalised) epilogue on the accumulator rows ``[base, base + size)``.

    Parameters
    ----------
    q : vta_ext.runtime.CommandQueue
        The queue the ALU instructions go to.
    cfg : VTAConfig
        Configuration (decides CLIP vs MIN + MAX).
    epilogue : Epilogue
        Normalised stages.
    base, size : int
        The dense range of accumulator rows.
    bias : callable, optional
        ``bias(q)`` emits the vector ADD of a ``("bias",)`` stage (the layout of the bias rows is
        the template's business); None if the template takes no bias.

    Raises
    ------
    EpilogueRefusal
        For a ``("bias",)`` stage when the template takes no bias.
    """
    for st in epilogue:
        if st[0] == "bias":
            if bias is None:
                raise EpilogueRefusal("this operator takes no ('bias',) epilogue stage")
            bias(q)
            continue
        for op, imm in alu_ops(cfg, st):
            alu_range(q, op, base, size, imm)
