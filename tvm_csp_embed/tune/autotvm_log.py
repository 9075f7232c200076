"""AutoTVM v0.2 log lines of the original VTA templates, translated to tasks and knob dicts.

The original stack's tuned records (e.g. the public ``vta_v0.10.log`` of TopHub, shipped as
``data/tophub_vta_v0.10.log``) hold lines like::

    {"input": ["ext_dev -device=vta -keys=cpu -model=pynq_1x16_i8w8a32_15_15_18_17",
               "conv2d_packed.vta",
               [["TENSOR", [1, 4, 56, 56, 1, 16], "int8"], ["TENSOR", [4, 4, 3, 3, 16, 16], "int8"],
                [1, 1], [1, 1, 1, 1], [1, 1], "NCHW1n16c", "int32"], {}],
     "config": {"index": 828, "code_hash": null,
                "entity": [["tile_b", "sp", [1, 1]], ["tile_h", "sp", [7, 8]], ...,
                           ["oc_nthread", "ot", 2], ["h_nthread", "ot", 1]]},
     "result": [[0.0057], 0, 8.36, 1562812841.1], "version": 0.2, "tvm_version": "0.7.dev0"}

Translation:

* template ``conv2d_packed.vta`` -> ``conv2d``, ``group_conv2d_packed.vta`` -> ``group_conv2d``,
  ``dense_packed.vta`` -> ``dense``, all of strategy ``stock``;
* workload: from the packed shapes ``(N/b, C/ci, H, W, b, ci)`` and ``(O/co, (C/g)/ci, KH, KW, co,
  ci)`` (dense: ``(N/b, K/ci, b, ci)``, ``(M/co, K/ci, co, ci)``), strides, the padding
  ``[top, left, bottom, right]`` (symmetric) and the groups;
* knobs: a split ``[name, "sp", [outer, inner]]`` is the inner factor (the tile), an other-option
  knob ``[name, "ot", v]`` is ``v``; ``reuse`` (an extension) is False;
* the record applies to a configuration whose hardware part of the ``-model`` string
  (``1x16_i8w8a32_15_15_18_17``: BATCH x BLOCK, the input/weight/accumulator widths and the log2
  sizes of the micro-op, input, weight and accumulator buffers) equals the configuration's
  (:func:`model_string`); the board prefix (``pynq``) and the timing do not take part, as in the
  original, whose records were keyed by that string;
* its cost is the mean of the measured seconds (``result[0]``); ``result[1] != 0`` is an error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from vta_ext.config import VTAConfig

__all__ = ["AutoTVMRecord", "TEMPLATES", "model_string", "is_autotvm_line", "parse_autotvm_line"]

#: AutoTVM template name -> operator kind of the ``stock`` strategy
TEMPLATES = {"conv2d_packed.vta": "conv2d", "group_conv2d_packed.vta": "group_conv2d",
             "dense_packed.vta": "dense"}


def model_string(config: VTAConfig) -> str:
    """The hardware part of the original stack's ``-model`` string for ``config``,
    e.g. ``"1x16_i8w8a32_15_15_18_17"``."""
    c = config
    return (f"{c.BATCH}x{c.BLOCK_OUT}_i{1 << c.LOG_INP_WIDTH}w{1 << c.LOG_WGT_WIDTH}"
            f"a{1 << c.LOG_ACC_WIDTH}_{c.LOG_UOP_BUFF_SIZE}_{c.LOG_INP_BUFF_SIZE}_"
            f"{c.LOG_WGT_BUFF_SIZE}_{c.LOG_ACC_BUFF_SIZE}")


@dataclass(frozen=True)
class AutoTVMRecord:
    """One translated AutoTVM line.

    Attributes
    ----------
    kind : str
        Operator kind of the ``stock`` strategy.
    template : str
        The original template name (``conv2d_packed.vta``).
    model : str
        The hardware part of the ``-model`` string (:func:`model_string`).
    workload : dict
        The workload fields of the stock template.
    knobs : dict
        The knob point.
    cost : float or None
        Mean measured seconds; None for an error result.
    blocks : tuple
        ``(BATCH, BLOCK_IN, BLOCK_OUT)`` of the packed shapes.
    """

    kind: str
    template: str
    model: str
    workload: Dict[str, Any]
    knobs: Dict[str, Any]
    cost: Optional[float]
    blocks: tuple


def is_autotvm_line(obj: Any) -> bool:
    """Whether a parsed JSON line has the shape of an AutoTVM v0.1/v0.2 record."""
    return isinstance(obj, dict) and {"input", "config", "result"} <= set(obj)


def _tensor(arg, what: str) -> List[int]:
    if not (isinstance(arg, list) and len(arg) == 3 and arg[0] == "TENSOR"):
        raise ValueError(f"{what}: expected ['TENSOR', shape, dtype], got {arg!r}")
    return [int(d) for d in arg[1]]


def _symmetric(padding: List[int]) -> tuple:
    padding = [int(p) for p in padding]
    if len(padding) == 2:
        return padding[0], padding[1]
    top, left, bottom, right = padding
    if (top, left) != (bottom, right):
        raise ValueError(f"asymmetric padding {padding} (the stock templates pad symmetrically)")
    return top, left


def _conv_workload(args: list, groups: int) -> tuple:
    data, kernel = _tensor(args[0], "data"), _tensor(args[1], "kernel")
    strides, padding, dilation = args[2], args[3], args[4]
    if [int(d) for d in dilation] != [1, 1]:
        raise ValueError(f"dilation {dilation} (the stock templates do not dilate)")
    if len(data) != 6 or len(kernel) != 6:
        raise ValueError(f"packed shapes {data}, {kernel} are not NCHWnc / OIHWoi")
    pad_h, pad_w = _symmetric(padding)
    wl = dict(batch=data[0] * data[4], height=data[2], width=data[3],
              in_channels=data[1] * data[5], out_channels=kernel[0] * kernel[4],
              kernel_h=kernel[2], kernel_w=kernel[3], pad_h=pad_h, pad_w=pad_w,
              stride_h=int(strides[0]), stride_w=int(strides[1]))
    if groups > 1:
        wl["groups"] = groups
    return wl, (data[4], data[5], kernel[4])


def parse_autotvm_line(obj: Dict[str, Any]) -> AutoTVMRecord:
    """Translate one parsed AutoTVM line of a VTA template (module docstring).

    Raises
    ------
    ValueError
        For a template this project has no equivalent of, or a workload / knob it cannot map;
        the message says which.
    """
    version = obj.get("version", 0.1)
    if version not in (0.1, 0.2):
        raise ValueError(f"AutoTVM log version {version!r}; only 0.1 and 0.2 are read")
    target, template, args = obj["input"][0], obj["input"][1], obj["input"][2]
    if template not in TEMPLATES:
        raise ValueError(f"AutoTVM template {template!r} (target {target!r}) has no equivalent "
                         f"here; translated templates: {', '.join(TEMPLATES)}")
    model = ""
    for word in str(target).split():
        if word.startswith("-model="):
            model = word.split("=", 1)[1]
    model = model.split("_", 1)[1] if "_" in model else model
    kind = TEMPLATES[template]
    if kind == "dense":
        data, weight = _tensor(args[0], "data"), _tensor(args[1], "weight")
        workload = dict(batch=data[0] * data[2], in_features=data[1] * data[3],
                        out_features=weight[0] * weight[2])
        blocks = (data[2], data[3], weight[2])
    elif kind == "group_conv2d":
        workload, blocks = _conv_workload(args, int(args[5]))
    else:
        workload, blocks = _conv_workload(args, 1)
    knobs: Dict[str, Any] = {}
    for name, how, value in obj["config"]["entity"]:
        if how == "sp":
            knobs[name] = int(value[-1])
        elif how == "ot":
            knobs[name] = int(value)
        else:
            raise ValueError(f"knob {name!r} of kind {how!r}: only splits ('sp') and options "
                             "('ot') are translated")
    knobs["reuse"] = False
    result = obj["result"]
    costs = [float(c) for c in result[0]] if result and result[0] else []
    cost = sum(costs) / len(costs) if costs and int(result[1]) == 0 else None
    return AutoTVMRecord(kind, template, model, workload, knobs, cost, tuple(blocks))
