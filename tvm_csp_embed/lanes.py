"""Lane constants a producer writes into the padded channels of its packed output, for a
consumer that folds its bias into them.

A packed activation of ``C`` channels padded to whole ``BLOCK_OUT`` blocks (RegNetX: 72 -> 80,
168 -> 176, 408 -> 416) has ``L`` padded channels. A consumer whose reduction runs over them (a
1x1 conv2d) can fold its constant bias into them as spare reduction lanes
(:mod:`.codegen.biasfold`), but then the lanes must hold the constants ``(1, A, A, ...)``; written
by a host pass into the handed-over tensor, that pass costs more than the ALU work it saves. Here
the *producer* writes them: its padded output channels have zero weights, so a bias of ``c <<
shift`` leaves ``c`` after its epilogue (:func:`~.codegen.biasfold.lane_biases`), at no cost to
its program. The fact "the padded channels of this packed tensor hold ``(v_0, v_1, ...)``" is:

* **asked for** by the offload pass's pre-pass (:func:`pair_lanes`, registered as the lane
  pairing of ``csp-relaxed``): a GEMM producer whose output a folding consumer takes
  (:func:`may_fold`) is asked to write :func:`~.codegen.biasfold.fold_constants` ``(L, A)`` with
  ``A`` the constant its epilogue keeps (127 after a ReLU); a residual add's output carries its own
  scalar semantics applied to its inputs' constants (:func:`add_lanes`, the add's definition), so
  where a folding consumer takes an add's output, one of the add's GEMM producers (used by the add
  alone) is asked to write the constants that make the add's output ``(1, A, ...)`` given its
  other input's;
* **stated** by the producer's plan (:attr:`vta_ext.strategy.OpPlan.out_lanes`,
  :func:`producer_lanes`; for a request it cannot honour the report line says why), and handed
  over with the packed tensor (:attr:`vta_ext.strategy.MatchedOp.input_lanes`);
* **used** by a consumer only if its data layout is the handed-over one and every spare lane of
  its fold holds ``(1, A, ...)`` (:func:`handed_constant`,
  :func:`~.codegen.biasfold.handed_lane_constant`); else today's fold (or none) runs and the
  report line says why.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["GEMM_PRODUCERS", "padded_lanes", "may_fold", "add_lanes", "pair_lanes",
           "requested_biases", "bias_with_lanes", "producer_lanes", "lane_bias_layout", "handed_constant",
           "lanes_text", "lanes_key"]

#: operator kinds whose programs add a per-channel bias from a packed bias tensor and can so
#: write constants into their padded output channels
GEMM_PRODUCERS = ("conv2d", "group_conv2d")
#: operator kinds whose CSP plans can fold their bias into their input's padded channels
FOLDERS = ("conv2d",)


def lanes_text(values: Sequence[int]) -> str:
    """``"(1, 127 x7)"``: lane constants for the report."""
    v = [int(x) for x in values]
    if len(v) > 2 and len(set(v[1:])) == 1:
        return f"({v[0]}, {v[1]} x{len(v) - 1})"
    return "(" + ", ".join(map(str, v)) + ")"


def lanes_key(op) -> list:
    """What a plan of ``op`` depends on of the lane constants, as the caches key it: the constants
    of its first input's padded channels and those it is asked to write."""
    first = op.input_lanes[0] if op.input_lanes else None
    return [None if first is None or not any(first) else list(first),
            None if op.write_lanes is None else list(op.write_lanes)]


def padded_lanes(op, config) -> int:
    """The padded channels of ``op``'s packed output: ``C`` of its 4-D NCHW output padded to
    whole ``BLOCK_OUT`` blocks; 0 for other outputs."""
    shape = tuple(int(d) for d in op.core.ty.shape)
    return (-shape[1]) % config.BLOCK_OUT if len(shape) == 4 else 0


def may_fold(op) -> bool:
    """Whether ``op``'s CSP plan may fold its bias into its input's padded channels: a conv2d
    with constant weights and a constant bias in the epilogue's first stage."""
    import tvm

    from vta_ext.templates.epilogue import normalize_epilogue

    epilogue = normalize_epilogue(op.epilogue)
    return (op.kind in FOLDERS and bool(epilogue) and epilogue[0] == ("bias",)
            and isinstance(op.bias, tvm.ir.expr.Constant)
            and isinstance(op.operands[1], tvm.ir.expr.Constant))


def add_lanes(epilogue: Sequence[tuple], a, b) -> np.ndarray:
    """The constants of a residual add's output lanes from its inputs' ``a`` and ``b``: the
    add's definition ``int8(epilogue(int32(a) + int32(b)))``
    (:func:`~.reference.apply_epilogue`), elementwise."""
    from .reference import apply_epilogue

    return apply_epilogue(np.asarray(a, np.int64) + np.asarray(b, np.int64), epilogue, None)


def _writable(op, constants) -> bool:
    """Whether GEMM producer ``op`` can write ``constants`` (:func:`~.codegen.biasfold.lane_biases`)."""
    from .codegen.biasfold import lane_biases

    return op.kind in GEMM_PRODUCERS and lane_biases(op.epilogue, constants)[0] is not None


def _fold_target(op, lanes: int) -> Optional[Tuple[int, ...]]:
    """The fold constants GEMM producer ``op`` can write into ``lanes`` padded channels, or None."""
    from .codegen.biasfold import fold_constants, producer_lane_bias

    if op.kind not in GEMM_PRODUCERS:
        return None
    biases, a, _ = producer_lane_bias(op.epilogue, lanes)
    return None if biases is None else tuple(int(v) for v in fold_constants(lanes, a))


def _solve_add(add, target: np.ndarray, other: np.ndarray, writer) -> Optional[Tuple[int, ...]]:
    """Per lane the int8 ``x`` (smallest magnitude) with :func:`add_lanes` ``(x, other) ==
    target`` that ``writer`` can write, or None."""
    int8 = np.iinfo(np.int8)
    xs = np.arange(int8.min, int8.max + 1, dtype=np.int64)
    order = xs[np.argsort(np.abs(xs), kind="stable")]
    out = []
    for t, o in zip(target, other):
        hits = order[add_lanes(add.epilogue, order, np.full_like(order, o)) == t]
        hits = [int(x) for x in hits if _writable(writer, [x])]
        if not hits:
            return None
        out.append(hits[0])
    return tuple(out)


def pair_lanes(ops: Sequence, users: Dict[str, List], config) -> Dict[str, dict]:
    """The lane pairing of ``csp-relaxed`` (:func:`vta_ext.offload.consumers.register_lane_pairing`):
    ``MatchedOp.name -> {"write_lanes": constants}`` for every producer asked to write lane
    constants (module notes).

    Parameters
    ----------
    ops : sequence of MatchedOp
        The operators the templates will plan, in order (a producer before its consumers).
    users : dict
        :func:`vta_ext.offload.consumers.matched_users` of them.
    config : VTAConfig
    """
    lanes = {m.name: padded_lanes(m, config) for m in ops}
    # direct: a folding consumer takes the output; wanted: that, or a wanted add takes it
    direct: Dict[str, bool] = {}
    wanted: Dict[str, bool] = {}
    for m in reversed(ops):
        takers = [u for u in users.get(m.name, ()) if u is not None]
        direct[m.name] = bool(lanes[m.name]) and any(i == 0 and may_fold(t) for t, i in takers)
        wanted[m.name] = direct[m.name] or (bool(lanes[m.name]) and any(
            t.kind == "add" and wanted.get(t.name, False) for t, _ in takers))
    inputs: Dict[str, Dict[int, object]] = {}
    for m in ops:
        for u in users.get(m.name, ()):
            if u is not None:
                inputs.setdefault(u[0].name, {})[u[1]] = m
    fact: Dict[str, Optional[Tuple[int, ...]]] = {}
    write: Dict[str, Tuple[int, ...]] = {}
    for m in ops:
        n = lanes[m.name]
        if not n:
            continue
        zeros = (0,) * n
        if m.kind in GEMM_PRODUCERS:
            target = _fold_target(m, n) if direct[m.name] else None
            if target is not None:
                write[m.name] = fact[m.name] = target
            else:
                fact[m.name] = zeros if _writable(m, zeros) else None
        elif m.kind == "add" and len(m.operands) == 2:
            ins = [inputs.get(m.name, {}).get(i) for i in range(2)]
            known = [None if p is None else fact.get(p.name) for p in ins]
            if wanted[m.name] and all(p is not None for p in ins):
                _ask_add_writer(m, ins, known, n, users, direct, write, fact)
                known = [fact.get(p.name) for p in ins]
            fact[m.name] = (None if any(k is None for k in known)
                            else tuple(int(v) for v in add_lanes(m.epilogue, *known)))
    return {name: {"write_lanes": values} for name, values in write.items() if any(values)}


def _ask_add_writer(add, ins, known, n: int, users, direct, write, fact) -> None:
    """For a wanted add whose inputs ``ins`` are matched producers: unless its output holds the
    fold constants already, ask one of them (a GEMM producer used by the add alone, no folding
    consumer's own producer) to write the constants that make the add's output the fold
    constants (127 first, then -128), the other input's as they are."""
    from .codegen.biasfold import LANE_CONSTANT, POSITIVE_LANE_CONSTANT, fold_constants

    free = [j for j, p in enumerate(ins)
            if p.kind in GEMM_PRODUCERS and not direct[p.name] and p.name not in write
            and len(users.get(p.name, ())) == 1]
    # a writer that would not fold its own bias into its input's lanes loses no fold of its own
    free.sort(key=lambda j: may_fold(ins[j]))
    for a in (POSITIVE_LANE_CONSTANT, LANE_CONSTANT):
        target = fold_constants(n, a).astype(np.int64)
        if all(k is not None for k in known) and np.array_equal(
                add_lanes(add.epilogue, *known).astype(np.int64), target):
            return
        for j in free:
            other = known[1 - j]
            if other is None:
                continue
            x = _solve_add(add, target, np.asarray(other, np.int64), ins[j])
            if x is not None:
                write[ins[j].name] = fact[ins[j].name] = x
                return


def requested_biases(op) -> Optional[np.ndarray]:
    """The int32 biases of ``op``'s padded output channels that write the lane constants it is
    asked for (:attr:`~vta_ext.strategy.MatchedOp.write_lanes`), or None when none are asked
    (all zero), its bias is runtime data (writing them would be a host pass per inference) or
    its epilogue cannot write them."""
    import tvm

    from .codegen.biasfold import lane_biases

    if op.write_lanes is None or not any(op.write_lanes) \
            or not isinstance(op.bias, tvm.ir.expr.Constant):
        return None
    return lane_biases(op.epilogue, op.write_lanes)[0]


def bias_with_lanes(op) -> Optional[np.ndarray]:
    """``op``'s constant bias values (flat) followed by :func:`requested_biases` when it is
    asked to write lane constants: what a fold's digits or a bias GEMM's digits hold; None for
    a runtime bias."""
    import tvm

    if not isinstance(op.bias, tvm.ir.expr.Constant):
        return None
    bias = op.bias.value.numpy().ravel()
    extra = requested_biases(op)
    return bias if extra is None else np.concatenate([bias.astype(np.int64), extra])


def producer_lanes(op, config, out_layout, writes: bool) -> Tuple[Optional[Tuple[int, ...]], str]:
    """The constants the padded channels of ``op``'s packed output hold under a plan whose output
    layout is ``out_layout`` (:attr:`~vta_ext.strategy.OpPlan.out_lanes`), and the report's
    words on the constants it was asked to write (empty when none were asked).

    ``writes``: the plan packs :func:`requested_biases` into its padded output channels. The
    constants are known when the output is in the stock blocked arrangement (the consumers take
    it over) and the epilogue is bias, shifts and clips: the padded channels' zero weights leave
    the bias alone, zero where nothing is written."""
    import tvm

    from vta_ext.packing import blocked_arrangement, same_arrangement

    from .codegen.biasfold import lane_biases

    n = padded_lanes(op, config)
    asked = op.write_lanes is not None and any(op.write_lanes)
    if not n:
        return None, ""
    blocked = blocked_arrangement(op.core.ty.shape, config)
    why = ""
    if blocked is None or out_layout is None or not same_arrangement(out_layout, blocked):
        why = "its output is not in the stock blocked layout its consumers take over"
    elif asked and not writes:
        why = ("its plan does not add the bias from a packed bias tensor" if isinstance(
            op.bias, tvm.ir.expr.Constant) else "its bias is runtime data")
    values = tuple(op.write_lanes) if asked and writes else (0,) * n
    if not why and lane_biases(op.epilogue, values)[0] is None:
        why = lane_biases(op.epilogue, values)[1]
    if why:
        return None, (f"lane constants {lanes_text(op.write_lanes)} asked for its {n} padded "
                      f"output channels not written: {why}" if asked else "")
    return values, (f"writes lane constants {lanes_text(values)} into its {n} padded output "
                    "channels (a consumer folds its bias into them)" if asked else "")


def lane_bias_layout(host, out_layout, channels: int, biases: np.ndarray):
    """The bias host layout ``host`` (:meth:`~.codegen.plan.PackedGemm.bias_layout`) followed by
    a ``("set", ...)`` step writing ``biases`` into the padded output channels ``channels ..``:
    the output (``out_layout``, the stock blocked arrangement) numbered by channel over its padded
    width gives the channel of every packed bias position (its dims are the output's, extent 1
    where the channel does not vary); the real channels' positions are checked against the
    layout's own packing of the bias.

    Raises
    ------
    ValueError
        If the bias layout does not follow the output's channel positions.
    """
    import dataclasses

    from vta_ext.packing import as_blocked

    from .codegen.relayout import HostLayout

    blocked = as_blocked(out_layout)
    n, c, h, w = blocked.src_shape
    cp = blocked.padded[1]
    numbered = np.broadcast_to(np.arange(1, cp + 1, dtype=np.int32)[None, :, None, None],
                               (n, cp, h, w))
    wide = dataclasses.replace(blocked, c=cp).pack_numpy(np.ascontiguousarray(numbered))
    shape = tuple(host.shape)
    if len(shape) != wide.ndim or any(s not in (1, t) for s, t in zip(shape, wide.shape)):
        raise ValueError(f"bias layout {shape} is not the output's {wide.shape} with unit dims")
    channel = wide[tuple(slice(0, s) for s in shape)]
    real = host.pack_numpy(np.arange(1, c + 1, dtype=np.int32).reshape(host.src_shape))
    if not np.array_equal(np.where(channel <= c, channel, 0), real):
        raise ValueError("the bias layout does not put the channels where the output has them")
    at = np.nonzero(channel > c)
    index = tuple(tuple(int(v) for v in p) for p in zip(*at))
    values = tuple(int(biases[ch - 1 - c]) for ch in channel[at])
    return HostLayout(host.src_shape, host.steps + (("set", shape, index, values, "int32"),),
                      host.name)


def handed_constant(op, pg) -> Tuple[Optional[int], str]:
    """The other lanes' constant ``A`` when ``op``'s input is handed over with the lane constants
    ``(1, A, ...)`` in every spare lane of ``pg``'s fold (:func:`~.codegen.biasfold.handed_lane_constant`),
    else ``(None, why)``; ``(None, "")`` when the input carries no constants."""
    from .codegen.biasfold import handed_lane_constant

    first = op.input_lanes[0] if op.input_lanes else None
    if first is None or op.input_layout is None or not any(first):
        return None, ""
    return handed_lane_constant(pg, op.input_layout, first)


def _register() -> None:
    from vta_ext.offload.consumers import register_lane_pairing

    register_lane_pairing("csp-relaxed", pair_lanes)


_register()
