"""Where each matched operator's output goes, known before any operator is planned.

The offload pass's match-only pre-pass (:func:`~vta_ext.offload.transform.OffloadToVTA`) finds
every operator it will offload. :func:`consumer_flags` reads the module's bindings and tells, per
matched operator, who uses its int8 output:

* ``"vta"``: another matched operator (with a template under the strategy in effect) takes it as
  an operand; a channel concat, split piece or channel shuffle of it counts as its own users (the
  pass makes them on the packed tensor, :mod:`~vta_ext.offload.handover`);
* ``"cpu"``: any other operator, or the function's result: the host unpacks the output to the
  operator's own layout whatever packed layout VTA leaves it in.

and whether the operator's activation input is a matched operator's output that the host unpacks
for a CPU user anyway (then taking it in another layout costs only the packing). The flags become
:attr:`~vta_ext.strategy.MatchedOp.consumers` and :attr:`~vta_ext.strategy.MatchedOp.input_unpacked`,
which the CSP choice's host layout pricing reads (``tvm_csp_embed.choice.plan_host_bytes``).

A strategy may register a *lane pairing* (:func:`register_lane_pairing`): from the matched
operators and which of them take which one's output (:func:`matched_users`) it decides which
operators write constants into the padded channels of their packed output, for a consumer that
folds its bias into them (:attr:`~vta_ext.strategy.MatchedOp.write_lanes`; :func:`lane_requests`).

A matched operator whose template is known to refuse it (``OpTemplate.refusal``: the reasons a
template can tell without planning, e.g. an average pool without an exact reciprocal) counts as a
CPU user. One that a template refuses only when planning it still counts as ``"vta"``, and a concat
or split that is not block-aligned is made in NCHW after all: both are known only once the
operators are planned.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Sequence, Set, Tuple

from tvm import relax

from ..quantize.common import op_name as _op_name, shape_of as _shape
from ..report import CPU, VTA
from ..strategy import MatchedOp

__all__ = ["consumer_flags", "register_lane_pairing", "lane_requests", "matched_users"]

#: ops a VTA output passes through in its packed layout (:mod:`~vta_ext.offload.handover`): their
#: users are the output's users
PASS_THROUGH = ("relax.concat", "relax.split")


def consumer_flags(mod, matched: Sequence[Tuple[MatchedOp, str]],
                   on_vta: Callable[[MatchedOp], bool]) -> Dict[str, dict]:
    """The consumer flags of every matched operator of ``mod``.

    Parameters
    ----------
    mod : tvm.IRModule
        The module the offload pass runs on.
    matched : sequence of (MatchedOp, str)
        Every matched operator with the name of the variable its last call (the ``astype int8``,
        the int8 pool or clip) is bound to, as the match-only pre-pass found them.
    on_vta : callable
        Whether a matched operator has a template under the strategy in effect that is not known
        to refuse it (it runs on VTA unless the template refuses it when planning).

    Returns
    -------
    dict
        ``MatchedOp.name`` -> ``{"consumers": (...), "input_unpacked": bool}``, the fields of
        :class:`~vta_ext.strategy.MatchedOp` the pass sets before planning.
    """
    flags: Dict[str, dict] = {}
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            flags.update(_function_flags(func, matched, on_vta))
    return flags


def _function_flags(func: relax.Function, matched: Sequence[Tuple[MatchedOp, str]],
                    on_vta: Callable[[MatchedOp], bool]) -> Dict[str, dict]:
    """:func:`consumer_flags` of the matched operators ending in ``func``."""
    bindings, ends, owner = _owners(func, matched)
    values = {var.name: value for var, value in bindings}
    users = _users(func, bindings)
    memo: Dict[str, frozenset] = {}

    def kinds(name: str) -> frozenset:
        """Who uses the value of ``name``: VTA and/or CPU."""
        if name not in memo:
            found: Set[str] = set()
            for user in users.get(name, ()):
                if user is None:
                    found.add(CPU)              # the function's result
                elif user in owner:
                    found.add(VTA if on_vta(owner[user]) else CPU)
                elif _passes_through(values.get(user)):
                    found |= kinds(user)
                else:
                    found.add(CPU)
            memo[name] = frozenset(found)
        return memo[name]

    out: Dict[str, dict] = {}
    for end, m in ends.items():
        out[m.name] = {"consumers": tuple(sorted(kinds(end)))}
    for end, m in ends.items():
        source = m.operands[0] if m.operands else None
        producer = ends.get(source.name) if isinstance(source, relax.Var) else None
        out[m.name]["input_unpacked"] = (producer is not None
                                         and CPU in out[producer.name]["consumers"])
    return out


#: strategy name -> its lane pairing (:func:`register_lane_pairing`)
_LANE_PAIRINGS: Dict[str, Callable] = {}


def register_lane_pairing(strategy: str, pairing: Callable) -> None:
    """Register ``pairing(ops, users, config) -> {MatchedOp.name: {"write_lanes": tuple}}`` for
    ``strategy``: ``ops`` the matched operators its templates will plan, in order, ``users``
    :func:`matched_users` of them."""
    _LANE_PAIRINGS[strategy] = pairing


def lane_requests(mod, matched: Sequence[Tuple[MatchedOp, str]], config, strategy: str,
                  on_vta: Callable[[MatchedOp], bool]) -> Dict[str, dict]:
    """The ``write_lanes`` field of each matched operator the lane pairing of ``strategy``
    asks to write lane constants (empty when the strategy has none)."""
    pairing = _LANE_PAIRINGS.get(strategy)
    if pairing is None:
        return {}
    ops = [m for m, _ in matched if on_vta(m)]
    return pairing(ops, matched_users(mod, [(m, e) for m, e in matched if on_vta(m)]), config)


def matched_users(mod, matched: Sequence[Tuple[MatchedOp, str]]) -> Dict[str, List[Any]]:
    """``MatchedOp.name`` -> the users of its output: ``(MatchedOp, operand index)`` for a
    matched operator that takes it as an operand directly, None for any other user (a CPU
    operator, a concat, the function's result)."""
    out: Dict[str, List[Any]] = {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        bindings, ends, owner = _owners(func, matched)
        users = _users(func, bindings)
        for end, m in ends.items():
            found: List[Any] = []
            for user in users.get(end, ()):
                taker = owner.get(user) if user is not None else None
                index = next((i for i, e in enumerate(taker.operands)
                              if isinstance(e, relax.Var) and e.name == end), None) \
                    if taker is not None and taker is not m else None
                found.append(None if index is None else (taker, index))
            out[m.name] = found
    return out


def _owners(func: relax.Function, matched: Sequence[Tuple[MatchedOp, str]]):
    """``(bindings, ends, owner)`` of ``func``: its bindings (:func:`_bindings`), the matched
    operators ending in it by the name of their last binding, and the matched operator each
    binding belongs to (:func:`_interior`)."""
    bindings = _bindings(func)
    values = {var.name: value for var, value in bindings}
    ends = {end: m for m, end in matched if end in values}
    owner: Dict[str, MatchedOp] = {}
    for end, m in ends.items():
        for name in _interior(end, m, values, set(ends)):
            owner.setdefault(name, m)
    return bindings, ends, owner


def _bindings(func: relax.Function) -> List[Tuple[relax.Var, relax.Expr]]:
    """``(var, value)`` of every binding of ``func``'s body, in order."""
    body = func.body
    return [(b.var, b.value) for block in getattr(body, "blocks", []) for b in block.bindings]


def _referenced(expr) -> Iterable[str]:
    """Names of the variables ``expr`` uses directly (through tuples, not through bindings)."""
    if isinstance(expr, relax.Var):
        yield expr.name
    elif isinstance(expr, relax.Tuple):
        for field in expr.fields:
            yield from _referenced(field)
    elif isinstance(expr, relax.TupleGetItem):
        yield from _referenced(expr.tuple_value)
    elif isinstance(expr, relax.Call):
        for arg in expr.args:
            yield from _referenced(arg)


def _users(func: relax.Function, bindings) -> Dict[str, List]:
    """Variable name -> names of the bindings using it (None: the function's result)."""
    users: Dict[str, List] = {}
    for var, value in bindings:
        for name in set(_referenced(value)):
            users.setdefault(name, []).append(var.name)
    for name in set(_referenced(func.body.body)):
        users.setdefault(name, []).append(None)
    return users


def _interior(end: str, m: MatchedOp, values: Dict[str, relax.Expr], ends: Set[str]) -> Set[str]:
    """Names of the bindings the matched operator ``m`` (its last call bound to ``end``) replaces:
    from ``end`` back through the calls' arguments, stopping at its operands, bias and multiplier
    and at other matched operators' outputs."""
    leaves = {e.name for e in (*m.operands, m.bias, m.multiplier) if isinstance(e, relax.Var)}
    seen, todo = set(), [end]
    while todo:
        name = todo.pop()
        if name in seen or name not in values:
            continue
        seen.add(name)
        todo += [n for n in _referenced(values[name])
                 if n not in leaves and (n not in ends or n == end)]
    return seen


def _passes_through(value) -> bool:
    """Whether ``value`` hands a packed VTA output on in its packed layout: another name for it
    (a variable bound to a variable), a channel concat or split, a split's piece, or a step of a
    channel shuffle (reshape, permute_dims)."""
    if isinstance(value, (relax.Var, relax.TupleGetItem)):
        return True
    name = _op_name(value)
    if name in PASS_THROUGH:
        return True
    if name == "relax.permute_dims":
        axes = value.attrs.axes
        return axes is not None and [int(a) for a in axes] == [0, 2, 1, 3, 4]
    if name == "relax.reshape":        # into the (N, g, C/g, H, W) view, or back out of it
        try:
            return len(_shape(value)) == 5 or len(_shape(value.args[0])) == 5
        except (AttributeError, TypeError, ValueError):
            return False
    return False
