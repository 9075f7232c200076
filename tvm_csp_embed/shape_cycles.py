"""Cycle-model counts of the programs a choice times, shared across epilogue immediates.

A choice (:func:`~.choice.choose`, the stock contender's timing and its knob point search) builds
a candidate's program and times it on the cycle model. The programs of two epilogues of one shape
(:func:`~vta_ext.templates.epilogue.epilogue_shape`: the same stages and ALU operations, other
shifts and clips) run the same instruction stream, the immediates aside, so they time the same
(the choice cache keys its choices by that shape already). A network's repeated blocks (ResNeXt-50's
bottlenecks, RegNet's stages) differ in little but their shifts: :func:`modelled_cycles` times one
program per shape and serves the count to the others, which are then built only if they are
chosen (when the build generates the chosen operator's code).
"""
from __future__ import annotations

import hashlib
import threading
from typing import Any, Dict, Sequence

__all__ = ["modelled_cycles", "shape_key", "forget"]

#: cycle-model counts by the SHA-256 of :func:`shape_key` (a key holds the configuration's value:
#: a configuration sweep keeps 32 bytes per program, not the key), for this process
_COUNTS: Dict[bytes, int] = {}
_LOCK = threading.Lock()


def shape_key(kind: str, strategy: str, config, workload: Any, epilogue: Sequence[tuple],
              knobs: Any) -> str:
    """The compiled operator key (:func:`vta_ext.executor.op_key`) of the program with the
    epilogue ``epilogue`` replaced by its shape: the same for every epilogue of that shape."""
    from vta_ext.executor import op_key
    from vta_ext.templates.epilogue import epilogue_shape

    return op_key(kind, strategy, config, workload, epilogue_shape(config, epilogue), knobs)


def modelled_cycles(kind: str, strategy: str, config, workload: Any, epilogue: Sequence[tuple],
                    knobs: Any) -> int:
    """The cycle model's count of the program of ``(kind, strategy, config, workload, epilogue,
    knobs)``: the count of a program of the same epilogue shape timed before in this process
    (:func:`shape_key`), else the program built (:func:`vta_ext.executor.compiled_op`) and timed
    (:func:`vta_ext.executor.cycle_report`).

    Raises
    ------
    vta_ext.templates.errors.KnobError, vta_ext.errors.TemplateRefusal
        As :func:`~vta_ext.executor.compiled_op` does when the program does not build (nothing
        is kept: the next request builds it again).
    """
    from vta_ext.executor import compiled_op, cycle_report, op_key

    skey = hashlib.sha256(shape_key(kind, strategy, config, workload, epilogue, knobs).encode()
                          ).digest()
    with _LOCK:
        count = _COUNTS.get(skey)
    if count is not None:
        return count
    key = op_key(kind, strategy, config, workload, epilogue, knobs)
    compiled_op(key, config=config)
    count = cycle_report(key).total_cycles
    with _LOCK:
        _COUNTS[skey] = count
    return count


def forget() -> int:
    """Drop every kept count (the next request builds and times again); returns how many."""
    with _LOCK:
        n = len(_COUNTS)
        _COUNTS.clear()
    return n
