"""A residual add fused into the GEMM operator that produces one of its operands.

A network's residual ``add`` normally runs as its own VTA program: the conv that produces one
operand stores its int8 output, and the add LOADs it again (ACC_8BIT) with the other operand,
adds them and runs its own requantisation. Fused, the conv's program keeps each output tile in
the accumulator after its own epilogue, LOADs the other operand's tile INP (load module) and adds
it by a GEMM through the identity weight tile (one micro-op per accumulator row,
:func:`~.schedule._residual_stage`), runs the add's epilogue and stores once: the
conv's store, the add's reload of it and the add's program (its instructions, its fixed costs)
disappear. The epilogue of the fused program is

    conv epilogue + (RESIDUAL_STAGE,) + add epilogue

(:data:`vta_ext.templates.epilogue.RESIDUAL_STAGE`). It is bit-exact only when the conv's
epilogue ends in a bound inside int8 (then the accumulator holds exactly the int8 value the
separate conv would have stored: its truncating store is the identity), which
:func:`residual_refusal` checks.

The knob search (:mod:`.knobs`) does not know the stage. A preset first takes the conv's own
point with the add's stages (:func:`~.build.residual_points`, the order of the points tried);
where the residual tile
does not fit beside it, :func:`knob_view` gives the search the epilogue without the stage on a
configuration with the input buffer halved and the accumulator at most that half, so that
every point it returns leaves the residual's INP tile room (``ctile <= inp_depth / 2`` per
thread). The model counts the add's ALU passes, not the residual's LOAD and GEMM.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import numpy as np

from vta_ext.templates.epilogue import (RESIDUAL_STAGE, Epilogue, has_residual, int8_bounds,
                                        normalize_epilogue, split_residual)

__all__ = ["fused_epilogue", "residual_refusal", "knob_view", "residual_overflow"]


def fused_epilogue(conv_epilogue, add_epilogue) -> Epilogue:
    """The epilogue of a conv with the add fused: ``conv + (RESIDUAL_STAGE,) + add``."""
    return normalize_epilogue(tuple(conv_epilogue) + (RESIDUAL_STAGE,) + tuple(add_epilogue))


def residual_refusal(conv_epilogue) -> Optional[str]:
    """Why the add cannot be fused into a conv with ``conv_epilogue`` (one line), or None: the
    conv's epilogue does not end in a clip (or max / min pair) inside int8
    (:func:`vta_ext.templates.epilogue.int8_bounds`), so its value in the accumulator is not the
    int8 it would store."""
    if int8_bounds(conv_epilogue) is None:
        return ("the conv's epilogue does not end in a clip inside int8, so its accumulator is "
                "not the int8 it stores")
    return None


def knob_view(cfg, epilogue) -> Tuple[object, Epilogue]:
    """The configuration and epilogue the knob search sees for ``epilogue``: unchanged without
    a residual stage; with one, the epilogue without it, the input buffer halved and the
    accumulator at most that half (see the module notes)."""
    ep = normalize_epilogue(epilogue)
    if not has_residual(ep):
        return cfg, ep
    conv_ep, add_ep = split_residual(ep)
    view = dataclasses.replace(cfg, LOG_INP_BUFF_SIZE=cfg.LOG_INP_BUFF_SIZE - 1)
    while view.acc_depth > view.inp_depth:
        view = dataclasses.replace(view, LOG_ACC_BUFF_SIZE=view.LOG_ACC_BUFF_SIZE - 1)
    return view, conv_ep + add_ep


def residual_overflow(cfg, pg, epilogue, point) -> Optional[str]:
    """Why the residual tile does not fit beside the tiles of ``point`` in the input buffer (one
    line), or None: the knob model's input-buffer entries of ``point`` (``epilogue`` without
    its residual stage, :func:`.knobs.evaluate`) plus the residual's, one output tile per
    virtual thread. A fused build checks this before lowering a point (the lowering would
    refuse it with a :class:`~vta_ext.templates.errors.KnobError`)."""
    from vta_ext.isa import MemType
    from vta_ext.memory import scratchpad

    from .knobs import evaluate
    from .loops import vt_loops

    conv_ep, add_ep = split_residual(normalize_epilogue(epilogue))
    model = evaluate(cfg, pg, conv_ep + add_ep, point)
    if not hasattr(model, "sram"):     # a point the model prunes: the build says why
        return None
    threads = int(np.prod([point[f"vt_{n}"] for n in vt_loops(pg)]))
    tile = int(np.prod([point[f"tile_{n}"] for n in pg.c_loops()]))
    depth = scratchpad(cfg, MemType.INP).depth
    need = model.sram["inp"] + tile * threads
    if need <= depth:
        return None
    return (f"the residual tile ({tile} entries x {threads} virtual threads) does not fit beside "
            f"the point's input tiles ({model.sram['inp']} entries): {need} > {depth}")
