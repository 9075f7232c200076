"""The ``group_conv2d_packed`` template (original ``vta/top/vta_group_conv2d.py``).

Layouts (``b = BATCH``, ``ci = BLOCK_IN``, ``co = BLOCK_OUT``)::

    data    (N/b, C/ci, H, W, b, ci)                   int8
    kernel  (O/co, (C/groups)/ci, KH, KW, co, ci)      int8
    bias    (1 or N/b, O/co, 1, 1, b, co)              int32   (optional)
    mult    (1 or N/b, O/co, 1, 1, b, co)              int32   (optional per-channel multiplier)
    out     (N/b, O/co, OH, OW, b, co)                 int8

Output-channel block ``o`` of group ``g = o // ((O/co)/groups)`` reduces over the input-channel
blocks ``g * (C/groups)/ci + k_o`` (facts §5.10). The TE compute and the s_tir schedule are those of
:mod:`.conv2d` with a ``groups`` parameter. As in the original, ``tile_co`` and ``oc_nthread`` split
the full output-channel axis, so an output-channel tile may span several groups (it then loads the
input-channel blocks of all of them) or lie inside one group; see :mod:`.tiling` for the knob space.
"""
from __future__ import annotations

from typing import Union

from ..config import VTAConfig, load_config
from .conv2d import CompiledConv2d, build_conv2d
from .errors import Conv2dError, Conv2dRefusal
from .workload import GroupConv2dWorkload

__all__ = ["GroupConv2dWorkload", "build_group_conv2d"]


def build_group_conv2d(cfg: Union[VTAConfig, str], workload: GroupConv2dWorkload, epilogue=(),
                       knobs=None, lean: bool = False) -> CompiledConv2d:
    """Compile a packed group conv2d + epilogue for ``cfg``.

    Parameters
    ----------
    cfg : VTAConfig or str
        Configuration (or preset name).
    workload : GroupConv2dWorkload
        The layer; ``1 < groups < in_channels``.
    epilogue : sequence of tuples
        Requantisation stages (:mod:`vta_ext.templates.epilogue`).
    knobs : None, str, Conv2dKnobs or dict
        As :func:`vta_ext.templates.conv2d.build_conv2d` (None = Tiling Parameter Search,
        ``"fallback"`` = inner tiles 1).
    lean : bool
        As :func:`vta_ext.templates.conv2d.build_conv2d` (the accumulator filled, the loads
        released early; csp-relaxed's block-diagonal programs).

    Returns
    -------
    CompiledConv2d
        ``.program`` and ``.run(data, kernel, bias=None, simulator=None) -> (out, SimStats)``.

    Raises
    ------
    Conv2dRefusal
        For a group count outside ``(1, in_channels)`` or channels per group that are not multiples
        of the blocks.
    KnobError
        For knobs outside the knob space.
    """
    cfg = load_config(cfg)
    if not isinstance(workload, GroupConv2dWorkload):
        raise Conv2dError(f"expected a GroupConv2dWorkload, got {type(workload).__name__}")
    if not 1 < workload.groups < workload.in_channels:
        raise Conv2dRefusal(f"group_conv2d needs 1 < groups < in_channels, got "
                            f"groups={workload.groups}, in_channels={workload.in_channels} (use "
                            "conv2d for groups=1 and depthwise_conv2d for groups=in_channels)")
    return build_conv2d(cfg, workload, epilogue, knobs, lean=lean)
