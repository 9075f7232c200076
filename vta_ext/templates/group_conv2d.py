"""The ``group_conv2d_packed`` template (original ``vta/top/vta_group_conv2d.py``).

Layouts (``b = BATCH``, ``ci = BLOCK_IN``, ``co = BLOCK_OUT``)::

    data    (N/b, C/ci, H, W, b, ci)                   int8
    kernel  (O/co, (C/groups)/ci, KH, KW, co, ci)      int8
    bias    (1 or N/b, O/co, 1, 1, b, co)              int32   (optional)
    out     (N/b, O/co, OH, OW, b, co)                 int8

Output-channel block ``o`` of group ``g = o // ((O/co)/groups)`` reduces over the input-channel
blocks ``g * (C/groups)/ci + k_o`` (facts §5.10). The TE compute and the s_tir schedule are those of
:mod:`.conv2d` with a ``groups`` parameter: the output-channel axis is first split into
``(group, block within the group)`` so that the input index stays affine; the knobs (``tile_co`` and
``oc_nthread`` apply within a group) and the epilogue are the conv2d ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..config import VTAConfig, load_config
from .conv2d import CompiledConv2d, Conv2dError, Conv2dKnobs, Conv2dWorkload, build_conv2d

__all__ = ["GroupConv2dWorkload", "build_group_conv2d", "CompiledGroupConv2d"]

#: a compiled group conv2d has the interface of :class:`~.conv2d.CompiledConv2d`
CompiledGroupConv2d = CompiledConv2d


@dataclass(frozen=True)
class GroupConv2dWorkload(Conv2dWorkload):
    """A grouped conv2d in NCHW terms (``1 < groups < in_channels``; channels per group multiples
    of ``BLOCK_IN`` / ``BLOCK_OUT``)."""

    groups: int = 1


def build_group_conv2d(cfg: Union[VTAConfig, str], workload: GroupConv2dWorkload, epilogue=(),
                       knobs: Union[Conv2dKnobs, str, None] = None) -> CompiledConv2d:
    """Compile a packed group conv2d + epilogue for ``cfg``.

    Parameters
    ----------
    cfg : VTAConfig or str
        Configuration (or preset name).
    workload : GroupConv2dWorkload
        The layer; ``1 < groups < in_channels``.
    epilogue : sequence of tuples
        Requantisation stages (:func:`vta_ext.templates.conv2d.normalize_epilogue`).
    knobs : Conv2dKnobs, str or None
        As :func:`vta_ext.templates.conv2d.build_conv2d` (None = Tiling Parameter Search,
        ``"fallback"`` = inner tiles 1).

    Returns
    -------
    CompiledConv2d
        ``.program`` and ``.run(data, kernel, bias=None, simulator=None) -> (out, SimStats)``.

    Raises
    ------
    Conv2dError
        For a group count outside ``(1, in_channels)``, channels per group that are not multiples
        of the blocks, or knobs that do not divide the per-group axes.
    """
    cfg = load_config(cfg)
    g = int(getattr(workload, "groups", 1))
    if not isinstance(workload, GroupConv2dWorkload):
        raise Conv2dError(f"expected a GroupConv2dWorkload, got {type(workload).__name__}")
    if not 1 < g < workload.in_channels:
        raise Conv2dError(f"group_conv2d needs 1 < groups < in_channels, got groups={g}, "
                          f"in_channels={workload.in_channels} (use conv2d for groups=1 and "
                          "depthwise_conv2d for groups=in_channels)")
    return build_conv2d(cfg, workload, epilogue, knobs)
