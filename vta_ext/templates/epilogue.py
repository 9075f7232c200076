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
``("mul", c)``          ``x * c``                                   MUL imm ``c``
``("mulv",)``           ``x * m`` (per-output-channel int32         MUL vector (template-specific)
                        multiplier tensor in the acc)
``("bias_gemm",)``      ``x + bias``, added by a GEMM of a          none (a GEMM micro-op per
                        constant input row and the bias's digits    accumulator entry; CSP
                        (first stage only)                          programs only, see below)
``("residual",)``       ``x + int32(r)``, ``r`` the int8 tensor     none (a GEMM micro-op per
                        ``residual`` at the output's position       accumulator entry through the
                        (a residual add fused into its conv)        identity tile; CSP programs
                                                                    only,
                                                                    :mod:`tvm_csp_embed.codegen.residual`)
======================  ==========================================  =============================

followed by the STORE, which keeps the low 8 bits of every lane. int32 arithmetic wraps on the ALU.
Immediates must fit the signed 16-bit ALU immediate; at most one ``("bias",)`` and one
``("mulv",)`` stage. ``("bias",)`` and ``("mulv",)`` are the *vector* stages: their operand is a
per-output-channel int32 tensor loaded into the accumulator (the multiplier in the layout of the
bias), so only templates with an output-channel axis take them (GEMM templates, depthwise conv2d).

``("bias_gemm",)`` is not an operator's stage but a program's: a CSP program that adds its bias
by one GEMM instruction per output tile instead of the vector ADD
(:mod:`tvm_csp_embed.codegen.biasfold`, :func:`~tvm_csp_embed.codegen.biasfold.gemm_bias_epilogue`)
runs it in place of a leading ``("bias",)``, and so does the ``conv2d_packed`` template for the
block-diagonal programs of :mod:`tvm_csp_embed.depthwise` (its ``bias_gemm_shapes``); the
stock strategy never passes it.

The fixed-point requantisation of TFLite / TVM QNN / PT2E graphs is the epilogue
``bias, shr s1, mul M (or mulv), add 2**(k-1), shr k, clip``. Its int32 products must not
overflow: the ALU wraps, the CPU build does not promise to (LLVM's signed arithmetic), so an
epilogue with a multiply is only executed when :func:`epilogue_range` proves every intermediate
value fits int32 for the operator's accumulator range (else :class:`EpilogueRefusal`).
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
           "MAX_SHIFT", "VECTOR_STAGES", "GEMM_BIAS_STAGE", "normalize_epilogue", "has_bias", "has_multiplier",
           "vector_stages", "alu_ops", "alu_count", "alu_cycles", "te_stage", "emit_epilogue",
           "epilogue_range", "has_multiply", "fit_immediates", "simplify_epilogue",
           "epilogue_shape", "RESIDUAL_STAGE", "RESIDUAL_TENSOR", "has_residual", "split_residual",
           "int8_bounds", "POOL_EPILOGUE", "split_pool_stage"]

Stage = Tuple[Any, ...]
#: a normalised epilogue: a tuple of stages (tuples whose first item is the kind)
Epilogue = Tuple[Stage, ...]

#: ``(conv >> 8) + bias``, clip [0, 127]: the original integration tests
EPILOGUE_ORIGINAL: Epilogue = (("shr", 8), ("bias",), ("clip", 0, 127))
#: ``(conv + bias) >> s``, clip: the Relax pipeline's requantisation (shift 8 shown)
EPILOGUE_PIPELINE: Epilogue = (("bias",), ("shr", 8), ("clip", 0, 127))

#: stage kind -> number of integer arguments
STAGE_ARITY = {"shr": 1, "bias": 0, "clip": 2, "min": 1, "max": 1, "add": 1, "mul": 1, "mulv": 0,
               "bias_gemm": 0, "residual": 0}
#: the stage of a program that adds its bias by a GEMM (no ALU instruction; see the module notes)
GEMM_BIAS_STAGE = ("bias_gemm",)
#: the residual add of a fused conv + add (:mod:`tvm_csp_embed.codegen.residual`): ``x +
#: int32(r)``, ``r`` the add's other int8 operand at the output's own position, LOADed INP and
#: added by a GEMM through the identity tile (CSP programs only; no ALU instruction)
RESIDUAL_STAGE = ("residual",)
#: the name of the residual operand's DRAM tensor (the output's packed shape, int8)
RESIDUAL_TENSOR = "residual"
#: the stages whose operand is a per-output-channel int32 tensor in the accumulator, in the order
#: a template takes their packed tensors (after its data operands)
VECTOR_STAGES = ("bias", "mulv")
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
    for kind in VECTOR_STAGES:
        if sum(st[0] == kind for st in out) > 1:
            raise EpilogueRefusal(f"at most one ({kind!r},) epilogue stage is supported")
    return tuple(out)


def has_bias(epilogue: Epilogue) -> bool:
    """Whether the (normalised) epilogue adds a bias tensor."""
    return any(st[0] == "bias" for st in epilogue)


def has_multiplier(epilogue: Epilogue) -> bool:
    """Whether the (normalised) epilogue multiplies by a per-channel multiplier tensor."""
    return any(st[0] == "mulv" for st in epilogue)


def has_residual(epilogue: Epilogue) -> bool:
    """Whether the (normalised) epilogue has the residual add stage :data:`RESIDUAL_STAGE`."""
    return RESIDUAL_STAGE in epilogue


def split_residual(epilogue: Epilogue) -> Tuple[Epilogue, Epilogue]:
    """The stages before and after the (one) :data:`RESIDUAL_STAGE` of ``epilogue``: the conv's
    epilogue and the add's; ``(epilogue, ())`` without one."""
    if RESIDUAL_STAGE not in epilogue:
        return tuple(epilogue), ()
    at = epilogue.index(RESIDUAL_STAGE)
    if RESIDUAL_STAGE in epilogue[at + 1:]:
        raise EpilogueRefusal("at most one ('residual',) epilogue stage is supported")
    return tuple(epilogue[:at]), tuple(epilogue[at + 1:])


#: the kind of the last epilogue stage that names a max pool fused into a conv's program in its
#: key (``(POOL_EPILOGUE, pool_h, pool_w, stride_h, stride_w)``; not an ALU stage: the plugin's
#: :mod:`tvm_csp_embed.codegen.poolstage` builds it, :func:`vta_ext.floor.key_floor` skips it)
POOL_EPILOGUE = "maxpool"


def split_pool_stage(epilogue: Iterable) -> Tuple[Tuple[Any, ...], Optional[Tuple[int, ...]]]:
    """``epilogue`` without its last :data:`POOL_EPILOGUE` stage, and that pool's ``(pool_h,
    pool_w, stride_h, stride_w)`` (None: no pool stage)."""
    epilogue = tuple(tuple(st) for st in epilogue)
    if not epilogue or epilogue[-1][0] != POOL_EPILOGUE:
        return epilogue, None
    return epilogue[:-1], tuple(int(v) for v in epilogue[-1][1:5])


def int8_bounds(epilogue: Optional[Iterable]) -> Optional[Tuple[int, int]]:
    """``(lo, hi)``: the bounds ``epilogue`` ends in (its last clip, or max / min pair), where they
    lie inside int8 (then the accumulator holds exactly the int8 value the program stores: its
    truncating store is the identity); else None."""
    ep = normalize_epilogue(epilogue)
    lo, hi = None, None
    for st in ep[::-1]:   # the last bounds, up to the first stage that is not one
        if st[0] == "clip":
            lo, hi = (st[1] if lo is None else lo), (st[2] if hi is None else hi)
        elif st[0] == "max":
            lo = st[1] if lo is None else lo
        elif st[0] == "min":
            hi = st[1] if hi is None else hi
        else:
            break
    if lo is None or hi is None or lo < -128 or hi > 127:
        return None
    return lo, hi


def has_multiply(epilogue: Epilogue) -> bool:
    """Whether the epilogue multiplies (``("mul", c)`` or ``("mulv",)``)."""
    return any(st[0] in ("mul", "mulv") for st in epilogue)


def vector_stages(epilogue: Epilogue) -> Tuple[str, ...]:
    """The vector stages of the epilogue, in the order a template takes their tensors
    (:data:`VECTOR_STAGES` order: bias, then the multiplier)."""
    kinds = {st[0] for st in epilogue}
    return tuple(k for k in VECTOR_STAGES if k in kinds)


def alu_ops(cfg: VTAConfig, stage: Stage) -> List[Tuple[AluOp, int]]:
    """The ALU instructions ``(op, immediate)`` of an immediate stage, in order.

    ``("bias_gemm",)`` and ``("residual",)`` have none (``[]``: their GEMM is no ALU
    instruction).
    ``("bias",)`` and ``("mulv",)`` are not immediate stages (their vector ADD / MUL depends on the
    template's layout of the vector rows): they raise :class:`EpilogueError`.
    """
    kind = stage[0]
    if kind == "shr":
        return [(AluOp.SHR, stage[1])] if stage[1] else []
    if stage in (GEMM_BIAS_STAGE, RESIDUAL_STAGE):
        return []
    if kind == "clip":
        return clip_alu_ops(cfg.EXT_CLIP, stage[1], stage[2])
    if kind in ("min", "max", "add", "mul"):
        return [({"min": AluOp.MIN, "max": AluOp.MAX, "add": AluOp.ADD, "mul": AluOp.MUL}[kind],
                 stage[1])]
    raise EpilogueError(f"epilogue stage {stage!r} has no immediate ALU form")


def alu_count(cfg: VTAConfig, epilogue: Epilogue) -> int:
    """ALU instructions the epilogue costs per tile (a vector ADD / MUL counted as one)."""
    return sum(1 if st[0] in VECTOR_STAGES else len(alu_ops(cfg, st)) for st in epilogue)


def alu_cycles(cfg: VTAConfig, epilogue: Epilogue) -> int:
    """ALU cycles the epilogue costs per accumulator entry: every instruction of
    :func:`alu_count` at its cycles per micro-op (a vector stage ``ALU_CYCLES_PER_UOP_VEC``, an
    immediate one ``ALU_CYCLES_PER_UOP_IMM``), as the cycle model times them."""
    return sum(cfg.ALU_CYCLES_PER_UOP_VEC if st[0] in VECTOR_STAGES
               else cfg.ALU_CYCLES_PER_UOP_IMM * len(alu_ops(cfg, st)) for st in epilogue)


def te_stage(stage: Stage, value, bias_value=None):
    """The TE/TIR expression of ``stage`` applied to the int32 ``value``.

    ``bias_value`` is the int32 element of the stage's tensor for a vector stage (the bias of a
    ``("bias",)``, the multiplier of a ``("mulv",)``). The lowering recognises
    ``max(min(x, hi), lo)`` as one clip and emits it as :func:`alu_ops` does.

    Raises
    ------
    EpilogueRefusal
        For a ``("mulv",)`` stage without its multiplier (a template that has no multiplier tensor
        refuses the operator, which stays on the CPU).
    """
    from tvm import te, tirx

    kind = stage[0]
    if kind == "bias":
        if bias_value is None:
            raise EpilogueError("a ('bias',) stage needs the bias value")
        return value + bias_value
    if kind == "mulv":
        if bias_value is None:
            raise EpilogueRefusal("this template takes no per-channel multiplier ('mulv',) "
                                  "epilogue stage")
        return value * bias_value
    if kind == "mul":
        return value * tirx.const(stage[1], "int32")
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
    if stage in (GEMM_BIAS_STAGE, RESIDUAL_STAGE):
        raise EpilogueRefusal(f"{stage!r} takes a second tensor: only the CSP programs run it "
                              "(tvm_csp_embed.codegen.schedule)")
    raise EpilogueError(f"unknown epilogue stage {stage!r}")


def emit_epilogue(q, cfg: VTAConfig, epilogue: Epilogue, base: int, size: int,
                  bias: Optional[Callable] = None, mult: Optional[Callable] = None) -> None:
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
    mult : callable, optional
        ``mult(q)`` emits the vector MUL of a ``("mulv",)`` stage; None if the template takes no
        per-channel multiplier.

    Raises
    ------
    EpilogueRefusal
        For a vector stage the template does not take, or a ``("bias_gemm",)`` stage.
    """
    for st in epilogue:
        if st in (GEMM_BIAS_STAGE, RESIDUAL_STAGE):
            raise EpilogueRefusal(f"{st!r} takes a second tensor: only the CSP programs run it")
        if st[0] in VECTOR_STAGES:
            emit = bias if st[0] == "bias" else mult
            if emit is None:
                raise EpilogueRefusal(f"this operator takes no ({st[0]!r},) epilogue stage")
            emit(q)
            continue
        for op, imm in alu_ops(cfg, st):
            alu_range(q, op, base, size, imm)


INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def epilogue_range(epilogue: Epilogue, lo, hi, bias=None, multiplier=None, what: str = "operator"):
    """Interval arithmetic through the epilogue: the range of every intermediate int32 value.

    Parameters
    ----------
    epilogue : Epilogue
        Normalised stages.
    lo, hi : int or numpy array
        Bounds of the int32 accumulator (scalars, or per output channel).
    bias, multiplier : numpy array, optional
        The per-channel tensors of the ``("bias",)`` / ``("mulv",)`` stages (flattened).
    what : str
        Names the operator in the refusal.

    Returns
    -------
    tuple
        ``(lo, hi)`` of the value after the last stage (numpy int64 arrays, per channel).

    Raises
    ------
    EpilogueRefusal
        When an ADD or MUL stage can leave int32: the ALU wraps modulo 2**32, the CPU build's
        signed arithmetic is not promised to (LLVM ``nsw``), so VTA could differ from it.
    """
    import numpy as np

    lo = np.asarray(lo, dtype=object)
    hi = np.asarray(hi, dtype=object)  # Python integers: no wrap in the analysis itself
    vec = {"bias": bias, "mulv": multiplier}
    for st in epilogue:
        kind = st[0]
        if kind in VECTOR_STAGES:
            if vec[kind] is None:
                raise EpilogueError(f"epilogue_range: the {kind!r} stage needs its tensor")
            operand = np.asarray(vec[kind]).astype(np.int64).astype(object).reshape(-1)
        else:
            operand = st[1] if len(st) > 1 else None
        if kind in ("bias", "add"):
            lo, hi = lo + operand, hi + operand
        elif kind in ("mul", "mulv"):
            a, b = lo * operand, hi * operand
            lo = np.minimum(a, b) if isinstance(a, np.ndarray) else min(a, b)
            hi = np.maximum(a, b) if isinstance(a, np.ndarray) else max(a, b)
        elif kind == "shr":
            lo, hi = lo // (1 << st[1]), hi // (1 << st[1])
        elif kind in ("clip", "min", "max"):
            cap_lo = st[1] if kind in ("clip", "max") else None
            cap_hi = st[2] if kind == "clip" else (st[1] if kind == "min" else None)
            if cap_hi is not None:
                lo, hi = np.minimum(lo, cap_hi), np.minimum(hi, cap_hi)
            if cap_lo is not None:
                lo, hi = np.maximum(lo, cap_lo), np.maximum(hi, cap_lo)
        lo, hi = np.asarray(lo, dtype=object), np.asarray(hi, dtype=object)
        low, high = int(np.min(lo)), int(np.max(hi))
        if low < INT32_MIN or high > INT32_MAX:
            raise EpilogueRefusal(
                f"{what}: epilogue stage {st!r} can reach {low if low < INT32_MIN else high} for "
                f"the accumulator's range, outside int32; VTA's ALU wraps modulo 2**32 and the "
                "CPU build's signed int32 arithmetic does not promise to, so the results could "
                "differ (a smaller multiplier with a smaller shift, or a pre-shift before the "
                "multiply, avoids it)")
    return lo.astype(np.int64), hi.astype(np.int64)


def fit_immediates(epilogue: Epilogue) -> Epilogue:
    """The same epilogue with a rounding add too large for the 16-bit immediate moved behind part
    of the following shift: ``("add", c), ("shr", k)`` with ``c = c' * 2**a``, ``a <= k``, becomes
    ``("shr", a), ("add", c'), ("shr", k - a)`` with the smallest ``a`` that makes ``c'`` fit.

    Exact for every int32 ``x``: ``floor((x + c' 2**a) / 2**k) = floor((floor(x / 2**a) + c') /
    2**(k-a))`` (``floor(floor(y) / n) = floor(y / n)`` for a positive integer ``n``), and no
    intermediate value grows. This is how the fixed-point requantisation's ``+ 2**(k-1)`` (``k`` up
    to 31) runs on the ALU. Other stages are returned unchanged (out-of-range immediates are still
    refused by :func:`normalize_epilogue`).
    """
    out: List[Stage] = []
    stages = [tuple(st) for st in epilogue]
    i = 0
    while i < len(stages):
        st = stages[i]
        nxt = stages[i + 1] if i + 1 < len(stages) else None
        if st[0] == "add" and not IMM_MIN <= st[1] <= IMM_MAX and nxt is not None \
                and nxt[0] == "shr" and st[1] != 0:
            c, k = st[1], nxt[1]
            a = next((a for a in range(1, k + 1) if c % (1 << a) == 0
                      and IMM_MIN <= c >> a <= IMM_MAX), None)
            if a is not None:
                out += [("shr", a), ("add", c >> a)] + ([("shr", k - a)] if k > a else [])
                i += 2
                continue
        out.append(st)
        i += 1
    return tuple(out)


#: the interval of a bounding stage: (lower bound or None, upper bound or None)
_BOUNDS = {"clip": lambda st: (st[1], st[2]), "min": lambda st: (None, st[1]),
           "max": lambda st: (st[1], None)}


def _bounding_stage(lo: Optional[int], hi: Optional[int]) -> Stage:
    if lo is not None and hi is not None:
        return ("clip", lo, hi)
    return ("min", hi) if lo is None else ("max", lo)


def simplify_epilogue(epilogue: Epilogue) -> Epilogue:
    """The same function of the int32 accumulator with fewer ALU passes, by exact rewrites only:

    * identities are dropped: ``("shr", 0)``, ``("add", 0)``, ``("mul", 1)``;
    * consecutive shifts merge, ``("shr", a), ("shr", b)`` -> ``("shr", min(a + b, 31))``
      (``floor(floor(x / 2**a) / 2**b) = floor(x / 2**(a+b))``, and an int32 shifted right by 31
      is already 0 or -1, which further shifts keep);
    * consecutive bounds (``clip``, ``min``, ``max``) whose intervals overlap merge into one bound
      on the intersection (clamping to ``I`` then to ``J`` is clamping to ``I & J`` when that is
      not empty), e.g. ``("min", 127), ("max", 0)`` -> ``("clip", 0, 127)``, one CLIP.

    Vector stages, adds and multiplies are kept as they are (their int32 range proof,
    :func:`epilogue_range`, is about the stages as given).
    """
    out: List[Stage] = []
    for st in epilogue:
        st = tuple(st)
        if st in (("shr", 0), ("add", 0), ("mul", 1)):
            continue
        prev = out[-1] if out else None
        if prev is not None and prev[0] == "shr" and st[0] == "shr":
            out[-1] = ("shr", min(prev[1] + st[1], MAX_SHIFT))
            continue
        if prev is not None and prev[0] in _BOUNDS and st[0] in _BOUNDS:
            (l1, h1), (l2, h2) = _BOUNDS[prev[0]](prev), _BOUNDS[st[0]](st)
            lo = l2 if l1 is None else (l1 if l2 is None else max(l1, l2))
            hi = h2 if h1 is None else (h1 if h2 is None else min(h1, h2))
            if lo is None or hi is None or lo <= hi:
                out[-1] = _bounding_stage(lo, hi)
                continue
        out.append(st)
    return tuple(out)


def epilogue_shape(cfg: VTAConfig, epilogue) -> Tuple[Tuple[Tuple[str, ...], ...], ...]:
    """What of ``epilogue`` a program's instructions and cycles depend on: per stage, its kind and
    the ALU operations it runs (:func:`alu_ops`), immediates left out, as given and after
    :func:`simplify_epilogue` (the scheduled templates run the simplified form).

    Two epilogues of one shape run the same instruction stream, the immediates aside, under every
    template, so they time the same on the cycle model and move the same bytes: e.g. the shifts
    and clips of a network's repeated blocks. The choice between plans is made once per shape.
    Whether an epilogue with a multiply may run at all (:func:`epilogue_range`) is decided before
    any plan is made.
    """
    def shape(stages: Epilogue) -> Tuple[Tuple[str, ...], ...]:
        return tuple((st[0],) if st[0] in VECTOR_STAGES else
                     (st[0],) + tuple(op.name for op, _ in alu_ops(cfg, st)) for st in stages)

    ep = normalize_epilogue(epilogue)
    return shape(ep), shape(simplify_epilogue(ep))
