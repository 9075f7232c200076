"""Depthwise convolutions on the GEMM core: the block-diagonal embedding, chosen per layer against
the stock ALU template.

A depthwise conv2d over ``C`` channels is exactly a grouped conv2d with ``groups = C / BLOCK`` and
``BLOCK = BLOCK_IN = BLOCK_OUT`` channels per group whose ``BLOCK x BLOCK`` weight tile per
(group, tap) is diagonal: ``w[c, 0, r, s]`` on the diagonal, zeros elsewhere. One GEMM micro-op
per tap then multiplies ``BLOCK`` channels of one pixel by that tile, so a 3x3 layer takes 9
micro-ops per ``BATCH x BLOCK`` outputs (36 cycles on ``default`` at 4 cycles per micro-op)
against the ALU template's MUL and ADD pass per tap (~17 vector passes, ~100 cycles). The price is
weight traffic: ``BLOCK`` times the depthwise weights (2.3 KB per 16 channels of a 3x3 layer).

* **Program**: the stock ``group_conv2d_packed`` template (:mod:`vta_ext.templates.group_conv2d`;
  ``conv2d_packed`` when ``C <= BLOCK``, one group) on the workload of
  :func:`diagonal_workload`; its conv stage runs the taps outside the pixel loops, so the micro-ops
  writing one accumulator row are a tile's pixels apart (the hazard contract of ``pynq`` holds
  without a cure for every tile of more than 3 pixels).
* **Weights**: expanded to the block-diagonal OIHW tensor and packed like a conv2d kernel
  (:func:`pack_diagonal_weight`); a constant weight (every quantised model's) is relayouted at
  build time with numpy, any other in Relax on the host.
* **Padding**: channels are padded to whole blocks, as the ALU template pads them; the padded
  channels have zero weights.
* **Choice** (:class:`DepthwiseTemplate`): both plans (``unit="alu"``: the stock ALU template,
  ``unit="gemm"``: the block-diagonal program) take the activation and leave the output in the
  same packed layout (``(N/b, C/BLOCK, H, W, b, BLOCK)``), and the same bias and multiplier
  layout, so they differ only on VTA: each is built and timed on the cycle model (weight loads
  included; the GEMM program under the knobs option ``cycles`` at its searched point,
  :mod:`.stock_knobs`) and the fewer cycles win, the ALU template on a tie. A plan whose template refuses
  (the ALU template on a configuration without ALU MUL or ACC_8BIT loads, ``pynq``) leaves the
  other as the only one; when both refuse the operator stays on the CPU with both reasons. Under
  the objective ``footprint`` the ALU template (``BLOCK`` times fewer weight bytes) is taken when
  it builds. The report line says which unit ran and why.

Registered for ``depthwise_conv2d`` under ``csp-relaxed`` (``csp-strict`` and ``stock`` keep the
ALU template).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tvm
from tvm import relax

from vta_ext.errors import TemplateRefusal
from vta_ext.packing import pack_conv_weight
from vta_ext.stock import StockDepthwiseConv2d, _gemm_knob_space
from vta_ext.strategy import (KnobSpace, MatchedOp, OpPlan, OpTemplate, register_plan_summary,
                              register_template)
from vta_ext.templates.depthwise import NEEDED_EXTENSIONS, DepthwiseConv2dWorkload
from vta_ext.templates.errors import KnobError
from vta_ext.templates.workload import Conv2dWorkload, GroupConv2dWorkload

from .candidates import MODES
from .reference import register_reference
from .stock_knobs import StockSearch, searches

__all__ = ["DepthwiseUnitWorkload", "DepthwiseTemplate", "UNITS", "diagonal_workload",
           "diagonal_weight", "pack_diagonal_weight", "diagonal_inputs", "build_diagonal", "diagonal_reference",
           "modelled_cycles", "refusal_key", "gemm_reference"]


#: the units that can run a depthwise convolution, in the order a tie is broken
UNITS = ("alu", "gemm")
#: how the build report names each unit's plan
UNIT_TEXT = {"alu": "the stock ALU template (a MUL and an ADD pass per tap)",
             "gemm": "GEMM block-diagonal (one micro-op per tap and pixel on a diagonal weight tile)"}


@dataclass(frozen=True)
class DepthwiseUnitWorkload(DepthwiseConv2dWorkload):
    """A depthwise conv2d (batch and channels padded to whole blocks) and the unit that runs it:
    ``"alu"`` (:func:`vta_ext.templates.depthwise.build_depthwise_conv2d`) or ``"gemm"`` (the
    block-diagonal grouped conv2d of :func:`diagonal_workload`). ``knobs``: the GEMM program's
    searched knob point (``(name, value)`` pairs, :mod:`.stock_knobs`), built under the knobs
    option ``cycles``; empty: the template's own point (TPS). ``bias_gemm``: the GEMM program adds
    the bias by one GEMM of a constant block (:func:`diagonal_bias_gemm`)."""

    unit: str = "alu"
    knobs: Tuple[Tuple[str, Any], ...] = ()
    bias_gemm: bool = False

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"DepthwiseUnitWorkload.unit {self.unit!r}: one of {', '.join(UNITS)}")
        if self.bias_gemm and self.unit != "gemm":
            raise ValueError("DepthwiseUnitWorkload.bias_gemm: only the GEMM unit adds the bias by a GEMM")
        object.__setattr__(self, "knobs", tuple(tuple(kv) for kv in self.knobs))

    @property
    def depthwise(self) -> DepthwiseConv2dWorkload:
        """The workload of the ALU template (this one without :attr:`unit` and :attr:`knobs`)."""
        values = dataclasses.asdict(self)
        del values["unit"], values["knobs"], values["bias_gemm"]
        return DepthwiseConv2dWorkload(**values)


def _block(config) -> int:
    """The diagonal block of ``config`` (``BLOCK_IN == BLOCK_OUT``), else a refusal."""
    if config.BLOCK_IN != config.BLOCK_OUT:
        raise TemplateRefusal(f"GEMM block-diagonal needs BLOCK_IN == BLOCK_OUT (square "
                              f"diagonal tiles); {config.name} has {config.BLOCK_IN}x"
                              f"{config.BLOCK_OUT}")
    return config.BLOCK_IN


def alu_floor(config, op: MatchedOp, wl: DepthwiseConv2dWorkload) -> float:
    """A lower bound on the cycles of the ALU unit's program of depthwise ``op`` (``wl``: its
    stock workload, channels padded): the floor of the operator as written on the ALU taps
    alone (:func:`vta_ext.floor.own_floor`; the padded channels only add work).

    Parameters
    ----------
    config : VTAConfig
    op : MatchedOp
        The depthwise conv2d (its activation gives the channels as written).
    wl : DepthwiseConv2dWorkload
        Its kernel, padding and strides.

    Returns
    -------
    float
        :attr:`vta_ext.floor.Floor.total` of the ALU unit.
    """
    from vta_ext.floor import OperatorSize, own_floor, touched
    from vta_ext.templates.epilogue import normalize_epilogue

    n, c, h, w = (int(d) for d in op.operands[0].ty.shape)
    oh, ow = wl.out_height, wl.out_width
    plane = (touched(h, wl.kernel_h, wl.pad_h, wl.stride_h, oh)
             * touched(w, wl.kernel_w, wl.pad_w, wl.stride_w, ow))
    taps = wl.kernel_h * wl.kernel_w
    size = OperatorSize("depthwise_conv2d", 0, n * c * oh * ow, n * c * plane, c * taps, c, taps,
                        epilogue=normalize_epilogue(op.epilogue))
    return own_floor(config, size).total


def diagonal_workload(config, wl: DepthwiseConv2dWorkload):
    """The grouped conv2d that computes depthwise ``wl`` with block-diagonal weights on ``config``
    (or a grouped conv2d of narrow groups: :mod:`.grouped`; the program does not depend on the
    group width, only its weights do).

    Parameters
    ----------
    config : VTAConfig
        Gives the block (``BLOCK_IN == BLOCK_OUT``).
    wl : DepthwiseConv2dWorkload or workload with ``channels`` and the conv2d geometry
        Channels a multiple of the block.

    Returns
    -------
    GroupConv2dWorkload or Conv2dWorkload
        ``groups = channels / BLOCK`` of ``BLOCK`` channels each; a plain :class:`Conv2dWorkload`
        for one group (``channels == BLOCK``).

    Raises
    ------
    TemplateRefusal
        For a configuration whose blocks are not square.
    """
    block = _block(config)
    groups = wl.channels // block
    values = dict(batch=wl.batch, height=wl.height, width=wl.width, in_channels=wl.channels,
                  out_channels=wl.channels, kernel_h=wl.kernel_h, kernel_w=wl.kernel_w,
                  pad_h=wl.pad_h, pad_w=wl.pad_w, stride_h=wl.stride_h, stride_w=wl.stride_w)
    if groups == 1:
        return Conv2dWorkload(**values)
    return GroupConv2dWorkload(**values, groups=groups)


def diagonal_weight(weight: np.ndarray, padded: int, block: int, width: int = 1) -> np.ndarray:
    """Grouped weights ``(C, width, KH, KW)`` of groups of ``width`` channels (``width`` divides
    ``block``; 1: depthwise) -> the block-diagonal grouped kernel ``(padded, block, KH, KW)``
    (OIHW of ``padded / block`` groups): output channel ``c`` has ``weight[c, j]`` at input lane
    ``(c - c % width) % block + j`` of its group and zeros elsewhere, so each ``block x block``
    tile holds ``block / width`` groups' ``width x width`` blocks on its diagonal; the channels
    ``C..padded`` are zero.

    >>> diagonal_weight(np.array([[[[1]]], [[[2]]], [[[3]]]], np.int8), 4, 2)[:, :, 0, 0].tolist()
    [[1, 0], [0, 2], [3, 0], [0, 0]]
    >>> diagonal_weight(np.arange(1, 9, dtype=np.int8).reshape(4, 2, 1, 1), 4, 4, 2)[..., 0, 0].tolist()
    [[1, 2, 0, 0], [3, 4, 0, 0], [0, 0, 5, 6], [0, 0, 7, 8]]
    """
    c, w, kh, kw = weight.shape
    if w != width or block % width or c % width:
        raise ValueError(f"diagonal_weight: a weight of groups of {width} channel(s) in a block of "
                         f"{block} is (C, {width}, KH, KW) with C and {block} multiples of "
                         f"{width}, got {weight.shape}")
    out = np.zeros((padded, block, kh, kw), weight.dtype)
    rows = np.arange(c)
    for j in range(width):
        out[rows, (rows - rows % width) % block + j] = weight[:, j]
    return out


def pack_diagonal_weight(packer, weight, channels: int, padded: int, kh: int, kw: int, block: int,
                         width: int = 1):
    """The packed block-diagonal kernel ``(padded/block, 1, KH, KW, block, block)`` of grouped
    ``weight`` ``(C, width, KH, KW)`` (groups of ``width`` channels; 1: depthwise): a constant is
    expanded now (:func:`diagonal_weight`), any other operand by Relax code on the host (a
    multiply by the mask of the diagonal blocks); then the conv2d kernel packing
    (:func:`vta_ext.packing.pack_conv_weight`)."""
    x = packer.operand(weight)
    if isinstance(x, tvm.ir.expr.Constant):
        oihw = relax.const(diagonal_weight(x.value.numpy(), padded, block, width), str(x.ty.dtype))
    else:
        dtype = str(x.ty.dtype)
        per = block // width        # groups per tile
        flat = packer.emit(relax.op.reshape(x, (channels, width, kh, kw)), "flat_weight")
        if padded != channels:
            flat = packer.emit(relax.op.nn.pad(flat, [0, padded - channels, 0, 0, 0, 0, 0, 0]),
                               "pad_weight")
        # (tile, output group in tile, output lane, 1, input lane, KH, KW) times the mask
        # (1, output group, 1, input group, 1, 1, 1) of the tile's diagonal groups
        grouped = packer.emit(relax.op.reshape(flat, (padded // block, per, width, 1, width, kh, kw)),
                              "group_weight")
        mask = relax.const(np.eye(per, dtype=dtype).reshape(1, per, 1, per, 1, 1, 1), dtype)
        diag = packer.emit(relax.op.multiply(grouped, mask), "diagonal_weight")
        oihw = packer.emit(relax.op.reshape(diag, (padded, block, kh, kw)), "oihw_weight")
    return pack_conv_weight(packer, oihw, (padded, block, kh, kw), padded, block, block, block)


def diagonal_inputs(op: MatchedOp, config, wl, width: int = 1):
    """``inputs(packer)`` of the block-diagonal plan of ``op`` (:class:`vta_ext.strategy.OpPlan`):
    the activation in the stock blocked layout, the weights of groups of ``width`` channels
    expanded to the diagonal tiles (:func:`pack_diagonal_weight`), the bias and multiplier as the
    stock templates pack them; ``wl`` gives the padded channels and the kernel."""
    from vta_ext.packing import BlockedActivation, pack_channel_bias

    data, weight = op.operands
    n, c, h, w = (int(d) for d in data.ty.shape)
    b, block = config.BATCH, _block(config)
    act = BlockedActivation(n, c, h, w, b, block)

    def inputs(packer):
        d, kept = act.pack(packer, data)
        packer.note_kept(kept)
        args = [d, pack_diagonal_weight(packer, weight, c, wl.channels, wl.kernel_h, wl.kernel_w,
                                        block, width)]
        for vector in (op.bias, op.multiplier):
            if vector is not None:
                args.append(pack_channel_bias(packer, vector, c, wl.channels, b, block))
        return args

    return inputs


def diagonal_bias_gemm(op: MatchedOp, config, wl, kind: Optional[str] = None) -> Tuple[bool, str]:
    """Whether the block-diagonal program of ``op`` (workload ``wl``, :func:`diagonal_workload`)
    can add the bias by one GEMM of a constant block instead of the vector ALU ADD: the bias a
    constant and in the range ``BLOCK_IN`` lanes hold
    (:func:`~.codegen.biasfold.gemm_bias_lanes_decision`; the program's weight operand has the
    output channel on its ``y`` axis): ``(True, sentence)``, ``(False, "not by a GEMM: <why>")``
    or ``(False, "")`` without a bias. ``kind``: the program's operator kind when it is not
    the block-diagonal one's (the block-sparse program, :mod:`.blocksparse`)."""
    import tvm

    from .codegen.biasfold import gemm_bias_lanes_decision

    if kind is None:
        kind = ("group_conv2d" if isinstance(diagonal_workload(config, wl), GroupConv2dWorkload)
                else "conv2d")
    bias = op.bias.value.numpy() if isinstance(op.bias, tvm.ir.expr.Constant) else None
    return gemm_bias_lanes_decision(kind, op.epilogue, bias, _block(config))


def program_epilogue(wl, epilogue: Sequence[tuple]) -> Tuple[tuple, ...]:
    """The epilogue the block-diagonal program of ``wl`` runs: the operator's, with its leading
    ``("bias",)`` replaced by the bias GEMM when ``wl.bias_gemm``
    (:func:`~.codegen.biasfold.gemm_bias_epilogue`)."""
    from vta_ext.templates.epilogue import normalize_epilogue

    from .codegen.biasfold import gemm_bias_epilogue

    if getattr(wl, "bias_gemm", False):
        return gemm_bias_epilogue(epilogue)
    return normalize_epilogue(epilogue)


def bias_twin(wl, cycles_of, decision: Tuple[bool, str]) -> Tuple[Any, int, str]:
    """Of the block-diagonal workload ``wl`` (the bias by the ALU ADD) and its twin that adds it
    by a GEMM (``decision``: :func:`diagonal_bias_gemm`'s), the one ``cycles_of(workload)``
    times faster (the ADD on a tie): ``(workload, cycles, the report's words)``. A twin that does
    not build (its row and digit tiles overflow a buffer) leaves the ADD, and the words say
    why."""
    add = cycles_of(wl)
    can, note = decision
    if not can:
        return wl, add, f"bias by the vector ALU ADD ({note})" if note else ""
    twin = dataclasses.replace(wl, bias_gemm=True)
    try:
        by_gemm = cycles_of(twin)
    except TemplateRefusal as err:
        return wl, add, f"bias by the vector ALU ADD (not by a GEMM: it does not build: {err})"
    if by_gemm < add:
        return twin, by_gemm, f"{note}: {by_gemm:,} against {add:,} cycles with the ALU ADD"
    return wl, add, (f"bias by the vector ALU ADD (not by a GEMM: not faster, {by_gemm:,} against "
                     f"{add:,} cycles)")


#: why each program that did not build refused, per process, by :func:`refusal_key`: the
#: executor keeps only the programs that build, and a key builds the same program every time, so
#: it refuses again (MobileNetV2's 1x384x14x14 bias GEMM twins: five layers, three shifts, one
#: epilogue shape)
_REFUSED: Dict[str, str] = {}


def refusal_key(kind: str, strategy: str, config, wl, epilogue: Sequence[tuple], knobs) -> str:
    """What :data:`_REFUSED` keeps the refusal of the program of ``wl`` under.

    For a depthwise block-diagonal program (a :class:`DepthwiseUnitWorkload` of ``unit="gemm"``,
    :func:`build_diagonal`): its
    :func:`~vta_ext.executor.op_key` with the epilogue replaced by its shape
    (:func:`~vta_ext.templates.epilogue.epilogue_shape`, immediates left out). Such a program
    refuses when its tiles do not fit the scratchpads (the lowering's allocation,
    ``vta_ext.lower.alloc.allocate``), and its buffers are the operands' tiles and one per vector
    stage: an immediate ALU stage loads nothing, so the allocation and the words of the refusal
    (workload, knobs, configuration, buffers) are the same for every immediate. Any other
    program: its own key.
    """
    from vta_ext.executor import op_key
    from vta_ext.templates.epilogue import epilogue_shape

    if not (isinstance(wl, DepthwiseUnitWorkload) and wl.unit == "gemm"):
        return op_key(kind, strategy, config, wl, epilogue, knobs)
    return op_key(kind, strategy, config, wl, epilogue_shape(config, epilogue), knobs)


def modelled_cycles(kind: str, strategy: str, config, wl, epilogue, knobs) -> int:
    """Modelled cycles of the program of ``wl`` under ``(kind, strategy)``: the count of a
    program of the same epilogue shape timed before in this process, else the program built
    (cached by the executor) and timed (:func:`.shape_cycles.modelled_cycles`); a
    :class:`TemplateRefusal` when its template refuses it or its knobs (its words kept in
    :data:`_REFUSED` by :func:`refusal_key`: a program of the same key, or a block-diagonal one
    of the same epilogue shape, is not built)."""
    from .shape_cycles import modelled_cycles as shape_cycles

    refused = refusal_key(kind, strategy, config, wl, epilogue, knobs)
    if refused in _REFUSED:
        raise TemplateRefusal(_REFUSED[refused])
    try:
        return shape_cycles(kind, strategy, config, wl, epilogue, knobs)
    except KnobError as err:
        _REFUSED[refused] = f"knobs {knobs!r}: {err}"
        raise TemplateRefusal(_REFUSED[refused]) from err
    except TemplateRefusal as err:
        _REFUSED[refused] = str(err)
        raise


def build_diagonal(config, wl, epilogue: Sequence[tuple], knobs) -> Any:
    """The stock grouped conv2d program (``conv2d_packed`` for one group) of
    :func:`diagonal_workload` of ``wl``, at the point csp-relaxed searched (``wl.knobs``,
    :mod:`.stock_knobs`) under the default knobs policy, with the bias added by a GEMM when
    ``wl.bias_gemm`` (:func:`program_epilogue`), on the template's lean path (``lean=True``:
    the accumulator filled, each tile's loads released by the previous tile's last GEMM)."""
    from vta_ext.templates.conv2d import build_conv2d
    from vta_ext.templates.group_conv2d import build_group_conv2d

    gw = diagonal_workload(config, wl)
    compiled = _load_program(config, wl, epilogue, knobs)
    if compiled is None:
        builder = build_group_conv2d if isinstance(gw, GroupConv2dWorkload) else build_conv2d
        point = dict(wl.knobs) if getattr(wl, "knobs", ()) and knobs == "cycles" else knobs
        compiled = builder(config, gw, program_epilogue(wl, epilogue), point, lean=True)
    if compiled.gemm_bias:
        compiled.bias_operands = functools.partial(_bias_gemm_operands, lanes=_block(config))
    return compiled


def _program_path(config, wl, epilogue: Sequence[tuple], knobs) -> Any:
    """Where the program cache keeps the block-diagonal program :func:`build_diagonal` builds
    from these arguments (``<cache_dir>/programs/``): keyed by all of them, the configuration's
    value and the code (:func:`~.cache.source_digest`)."""
    import hashlib

    from .cache import cache_dir, source_digest

    text = json.dumps({"v": 1, "config": config.to_dict(), "type": type(wl).__name__,
                       "workload": dataclasses.asdict(wl), "knobs": knobs,
                       "epilogue": [list(stage) for stage in epilogue], "code": source_digest()},
                      sort_keys=True, default=str)
    return cache_dir() / "programs" / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.npz"


def keep_program(config, wl, epilogue: Sequence[tuple], knobs, compiled) -> None:
    """Store the block-diagonal program ``compiled`` (:func:`build_diagonal` of the other
    arguments) in the program cache, so that a warm build, which reads its plan from the
    caches, loads it (:func:`_load_program`) instead of scheduling, lowering and emitting it
    again: arrays only (:meth:`vta_ext.runtime.Program.to_arrays` and the compiled operator's
    knobs and shapes as JSON), written atomically."""
    import os
    import tempfile

    from vta_ext.templates.knobs import Conv2dKnobs

    if type(compiled.knobs) is not Conv2dKnobs:
        raise TypeError(f"keep_program: a block-diagonal program has Conv2dKnobs, got "
                        f"{type(compiled.knobs).__name__}")
    path = _program_path(config, wl, epilogue, knobs)
    meta = {"knobs": dataclasses.asdict(compiled.knobs),
            "shapes": {k: list(v) for k, v in compiled.shapes.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp_", suffix=".npz")
    with os.fdopen(fd, "wb") as f:
        np.savez(f, meta=np.array(json.dumps(meta)), **compiled.program.to_arrays())
    os.replace(tmp, path)       # atomic: concurrent builds never read half a file


def _load_program(config, wl, epilogue: Sequence[tuple], knobs) -> Optional[Any]:
    """The block-diagonal program :func:`keep_program` stored for these arguments (its bias
    operands not set), or None (none stored, or unreadable: it is built)."""
    import zipfile

    from vta_ext.runtime import Program
    from vta_ext.templates.conv2d import CompiledConv2d
    from vta_ext.templates.epilogue import normalize_epilogue
    from vta_ext.templates.knobs import Conv2dKnobs

    try:
        with np.load(_program_path(config, wl, epilogue, knobs), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(str(arrays.pop("meta")))
        program = Program.from_arrays(config, arrays)
        knob_point = Conv2dKnobs(**meta["knobs"])
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
        return None
    shapes = {k: tuple(v) for k, v in meta["shapes"].items()}
    return CompiledConv2d(config, diagonal_workload(config, wl),
                          normalize_epilogue(program_epilogue(wl, epilogue)), knob_point, program,
                          shapes, {"load": 0.0})


def _bias_gemm_operands(bias_packed: np.ndarray, lanes: int) -> Dict[str, np.ndarray]:
    """The bias GEMM's constant row and digit tiles of a packed per-channel bias
    (:func:`~.codegen.biasfold.gemm_bias_operands`), by the program's tensor names."""
    from .codegen.biasfold import gemm_bias_operands

    return dict(zip(("bias_row", "bias_digits"), gemm_bias_operands(bias_packed, lanes)))


class _UnitCache:
    """One persistent entry of an operator's chosen unit (``<cache_dir>/units/``), so that a warm
    build neither builds nor times the units again: for a depthwise conv2d its workload (the unit
    and the searched knob point) and the sentence saying why; for a narrow grouped conv2d
    (:mod:`.grouped`) the unit and why. ``fields``: the keys an entry must hold."""

    def __init__(self, key: str, fields: Tuple[str, ...] = ("workload", "why")) -> None:
        from .cache import cache_dir

        self.path = cache_dir() / "units" / f"{key}.json"
        self.fields = fields

    def load(self) -> Optional[Dict[str, Any]]:
        """The entry, or None (none yet, or unreadable: the units are timed again)."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        ok = isinstance(data, dict) and set(self.fields) <= set(data)
        return data if ok else None

    def store(self, entry: Dict[str, Any]) -> None:
        """Write ``entry`` atomically."""
        from .cache import _write

        _write(self.path, entry)


def _unit_cache(template, op: MatchedOp, config, base: Dict[str, Any], options) -> Optional[_UnitCache]:
    """The unit cache entry of one depthwise conv2d: keyed by the configuration's value, the
    workload, the epilogue's shape, the bias's range (the bias GEMM needs it in range), the objective, each unit's knobs option and the code
    (:func:`~.cache.source_digest`); None with tuned records (looked up per unit)."""
    import hashlib

    from vta_ext.executor import config_digest
    from vta_ext.templates.epilogue import epilogue_shape

    from .cache import source_digest
    from .candidates import bias_signature

    if options.records is not None:
        return None
    policies = [options.knobs_for(template.kind, template.strategy,
                                  DepthwiseUnitWorkload(**base, unit=u), config)[0] for u in UNITS]
    text = json.dumps({"v": 2, "bias": bias_signature(op), "strategy": template.strategy, "config": config_digest(config),
                       "base": base, "epilogue": epilogue_shape(config, op.epilogue),
                       "objective": options.objective, "knobs": policies,
                       "code": source_digest()}, sort_keys=True, default=str)
    return _UnitCache(hashlib.sha256(text.encode()).hexdigest()[:32])


class DepthwiseTemplate(OpTemplate):
    """``depthwise_conv2d`` under a CSP strategy: the ALU template or the GEMM block-diagonal
    program, whichever the cycle model times faster (module docstring)."""

    kind = "depthwise_conv2d"
    workload_type = DepthwiseUnitWorkload

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy
        self.report_text = f"{strategy} depthwise"
        self._stock = StockDepthwiseConv2d()

    # ---------------------------------------------------------------- plan
    def prefetch(self, ops: Sequence[MatchedOp], config) -> None:
        """Have the threads that wait for a background solve choose the units of ``ops``
        meanwhile, in module order (:meth:`_look_ahead`, :func:`~.cache.add_idle_work`): a cold
        build then builds and times the block-diagonal knob points while it would otherwise wait,
        and :meth:`plan` finds the choice in the unit cache. Nothing is queued with tuned records
        (no unit cache: :func:`_unit_cache`)."""
        from vta_ext.options import current_options

        from .cache import add_idle_work, remove_idle_work

        remove_idle_work(getattr(self, "_idle", None))
        self._ahead: Dict[str, MatchedOp] = {}
        if current_options().records is not None:
            return
        self._ahead = {op.name: op for op in ops}
        self._idle = self._look_ahead(config)
        add_idle_work(self._idle)

    def _look_ahead(self, config):
        """Idle work (:func:`~.cache.add_idle_work`): the unit choice of the next operator of
        :meth:`prefetch` not planned yet (:meth:`plan`, whose result the unit cache keeps; its
        errors are left for its own plan to report). It gives the same choice whenever it runs:
        the choice depends only on the operator, the configuration and the options."""
        from vta_ext.timing import phase

        from .cache import remove_idle_work

        def step() -> bool:
            if not self._ahead:
                remove_idle_work(step)
                return False
            op = next(iter(self._ahead.values()))
            with phase("plan"):
                try:
                    self.plan(op, config)
                except Exception:  # noqa: BLE001 -- its own plan() reports it
                    pass
            return True
        return step

    def plan(self, op: MatchedOp, config) -> OpPlan:
        from vta_ext.options import current_options

        getattr(self, "_ahead", {}).pop(op.name, None)
        options = current_options()
        stock = self._stock.plan(op, config)     # refuses dilation and asymmetric padding
        base = dataclasses.asdict(stock.workload)
        cache = _unit_cache(self, op, config, base, options)
        hit = cache.load() if cache is not None else None
        if hit is not None:      # a warm build: the unit and its point as chosen before
            wl = DepthwiseUnitWorkload(**{**hit["workload"], "knobs": tuple(
                tuple(kv) for kv in hit["workload"]["knobs"])})
            return self._plan_of(op, config, stock, wl, hit["why"])
        timed: Dict[str, int] = {}
        refused: Dict[str, str] = {}
        workloads: Dict[str, DepthwiseUnitWorkload] = {}
        notes: Dict[str, str] = {}
        policies: Dict[str, Any] = {}
        floor: Optional[float] = None
        for unit in ("gemm", "alu"):       # the GEMM unit first: its cycles may spare the ALU's
            wl = DepthwiseUnitWorkload(**base, unit=unit)
            policy = policies[unit] = options.knobs_for(self.kind, self.strategy, wl, config)[0]
            workloads[unit], notes[unit] = wl, ""
            if unit == "alu" and "gemm" in timed and options.objective != "footprint" and all(
                    getattr(config, f) for f in NEEDED_EXTENSIONS):
                floor = alu_floor(config, op, stock.workload)
                if floor > timed["gemm"]:     # the ALU unit cannot win (it wins a tie only)
                    continue
            try:
                wl, timed[unit], notes[unit] = self._timed_unit(
                    config, wl, op.epilogue, policy, diagonal_bias_gemm(op, config, wl))
            except TemplateRefusal as err:
                refused[unit] = str(err)
            workloads[unit] = wl
        if not timed:
            raise TemplateRefusal(f"{self.strategy}: no unit runs this depthwise conv2d: "
                                  + "; ".join(f"{UNIT_TEXT[u]}: {refused[u]}" for u in UNITS))
        if set(timed) | set(refused) == {"gemm"}:     # the ALU unit not built: its floor
            unit, why = "gemm", self._floored(timed["gemm"], floor)
        else:
            unit, why = self._choose(timed, refused, options.objective)
        wl = workloads[unit]
        if notes[unit]:
            why += f"; {notes[unit]}"
        if cache is not None:
            cache.store({"workload": dataclasses.asdict(wl), "why": why})
            if unit == "gemm":      # built and timed above: the program a warm build loads
                self._keep(config, wl, op.epilogue, policies[unit])
        return self._plan_of(op, config, stock, wl, why)

    def _keep(self, config, wl: DepthwiseUnitWorkload, epilogue, policy) -> None:
        """Store the chosen block-diagonal program (built when the plan timed it) in the program
        cache (:func:`keep_program`) under the arguments its build gets."""
        from vta_ext.executor import compiled_op, op_key

        compiled = compiled_op(op_key(self.kind, self.strategy, config, wl, epilogue, policy),
                               config=config)
        keep_program(config, wl, tuple(tuple(stage) for stage in epilogue), policy, compiled)

    def _plan_of(self, op: MatchedOp, config, stock: OpPlan, wl: DepthwiseUnitWorkload,
                 why: str) -> OpPlan:
        inputs = stock.inputs if wl.unit == "alu" else diagonal_inputs(op, config, wl)
        return OpPlan(wl, inputs, stock.out_layout,
                      f"{stock.description}; {UNIT_TEXT[wl.unit]} chosen by {self.strategy}: {why}",
                      stock.padding, in_layout=stock.in_layout)

    @staticmethod
    def _floored(gemm: int, floor: float) -> str:
        """Why the GEMM unit runs when the ALU unit's floor (:func:`alu_floor`) exceeds its
        cycles."""
        return (f"fewest cycles on the cycle model: {gemm:,} cycles against at least "
                f"{math.ceil(floor):,} cycles ({floor / max(gemm, 1):.2f}x or more: its floor, so "
                f"not built) for {UNIT_TEXT['alu']}; both take and leave the same packed layouts, "
                "so the host work is the same")

    @staticmethod
    def _choose(timed: Dict[str, int], refused: Dict[str, str], objective: str) -> Tuple[str, str]:
        """The unit to run and the sentence saying why."""
        def text(u):
            return f"{timed[u]:,} cycles" if u in timed else f"refused ({refused[u]})"

        if len(timed) == 1:
            (unit,) = timed
            other = next(u for u in UNITS if u != unit)
            return unit, f"the only unit that runs it ({text(unit)}); {UNIT_TEXT[other]} {text(other)}"
        if objective == "footprint":
            return "alu", (f"smallest packed footprint (the ALU template's weights are 1/BLOCK of "
                           f"the block-diagonal ones); GEMM {text('gemm')}, ALU {text('alu')}")
        unit = min(UNITS, key=lambda u: (timed[u], UNITS.index(u)))
        other = "gemm" if unit == "alu" else "alu"
        return unit, (f"fewest cycles on the cycle model: {text(unit)} against {text(other)} "
                      f"({timed[other] / max(timed[unit], 1):.2f}x) for {UNIT_TEXT[other]}; both "
                      "take and leave the same packed layouts, so the host work is the same")

    def _timed_unit(self, config, wl: DepthwiseUnitWorkload, epilogue, policy,
                    bias: Tuple[bool, str] = (False, "")) -> Tuple[DepthwiseUnitWorkload, int, str]:
        """``wl``'s unit as the plan builds it under the knobs ``policy``: its workload (the GEMM
        unit at its searched knob point when the build searches one, :mod:`.stock_knobs`, with
        the bias by a GEMM when ``bias`` (:func:`diagonal_bias_gemm`) allows it and it is faster,
        :func:`bias_twin`), its modelled cycles and the report's words for the searched point
        and the bias ("" if none)."""
        if wl.unit != "gemm":
            return wl, self.cycles(config, wl, epilogue, policy), ""
        wl, cycles, words = self._searched(config, wl, epilogue, policy)
        wl, cycles, bias_words = bias_twin(
            wl, lambda w: cycles if w == wl else self.cycles(config, w, epilogue, policy), bias)
        return wl, cycles, "; ".join(w for w in (words, bias_words) if w)

    def _searched(self, config, wl: DepthwiseUnitWorkload, epilogue, policy
                  ) -> Tuple[DepthwiseUnitWorkload, int, str]:
        """The GEMM unit ``wl`` at its searched knob point when the build searches one
        (:mod:`.stock_knobs`), its modelled cycles and the words for the point ("" if none)."""
        if not searches(policy, MODES[self.strategy]):
            return wl, self.cycles(config, wl, epilogue, policy), ""
        search = StockSearch(config, diagonal_workload(config, wl), tuple(epilogue),
                             lambda knobs: dataclasses.replace(wl, knobs=knobs),
                             lambda w: self.cycles(config, w, epilogue, policy))
        point = search.point()
        return search.place(point.knobs), point.cycles, point.text(self.strategy)

    def cycles(self, config, wl: DepthwiseUnitWorkload, epilogue, knobs) -> int:
        """Modelled cycles of ``wl``'s program (:func:`modelled_cycles`)."""
        return modelled_cycles(self.kind, self.strategy, config, wl, epilogue, knobs)

    def unit_cycles(self, key: str) -> Dict[str, Optional[int]]:
        """Both units' modelled cycles for the compiled depthwise operator ``key``
        (:func:`vta_ext.executor.op_key` of one of this template's plans), with its epilogue and
        knobs (the GEMM unit at the point the plan would build it at): ``{"alu": cycles or None,
        "gemm": cycles or None}`` (None: the template refuses)."""
        from vta_ext.config import VTAConfig

        spec = json.loads(key)
        wl = DepthwiseUnitWorkload(**spec["workload"])
        cfg = VTAConfig.from_dict(spec["config_value"], name=spec["config"])
        epilogue = tuple(tuple(stage) for stage in spec["epilogue"])
        out: Dict[str, Optional[int]] = {}
        for unit in UNITS:
            try:
                # the bias GEMM where the plan took it (the plan found it possible and faster)
                out[unit] = self._timed_unit(
                    cfg, dataclasses.replace(wl, unit=unit, knobs=(), bias_gemm=False), epilogue,
                    spec["knobs"], (wl.bias_gemm and unit == "gemm", "bias added by one GEMM"))[1]
            except TemplateRefusal:
                out[unit] = None
        return out

    # ---------------------------------------------------------------- build
    def build(self, config, workload: DepthwiseUnitWorkload, epilogue: Sequence[tuple], knobs) -> Any:
        if workload.unit == "alu":
            from vta_ext.templates.depthwise import build_depthwise_conv2d

            return build_depthwise_conv2d(config, workload.depthwise, tuple(epilogue), knobs)
        return build_diagonal(config, workload, epilogue, knobs)

    def knob_space(self, config, workload: DepthwiseUnitWorkload, epilogue: Sequence[tuple]) -> KnobSpace:
        """The GEMM conv2d knobs of the block-diagonal program; none for the ALU template."""
        if workload.unit == "alu":
            return KnobSpace()
        return _gemm_knob_space(config, diagonal_workload(config, workload),
                                program_epilogue(workload, epilogue))


def gemm_reference(config, wl: DepthwiseUnitWorkload, epilogue, rng):
    """The tuner's numpy reference of the block-diagonal program (``unit="gemm"``; the ALU
    template has no knobs, so it is never a tuning task): the stock grouped conv2d reference on
    :func:`diagonal_workload` (random weights in every lane of the tiles, a stronger check of
    the program than diagonal ones)."""
    if wl.unit != "gemm":
        raise LookupError(f"no tuning reference for the {wl.unit} unit of a depthwise conv2d: its "
                          "template has no knobs")
    return diagonal_reference(config, wl, epilogue, rng)


def diagonal_reference(config, wl, epilogue, rng):
    """The stock grouped conv2d numpy reference on :func:`diagonal_workload` of ``wl`` (random
    weights in every lane of the tiles)."""
    from .reference import reference_for

    gw = diagonal_workload(config, wl)
    kind = "group_conv2d" if isinstance(gw, GroupConv2dWorkload) else "conv2d"
    return reference_for(kind, "stock")(config, gw, epilogue, rng)


def plan_summary(template: OpTemplate, plan: OpPlan, config) -> str:
    """``"csp-relaxed GEMM block-diagonal"`` or ``"stock ALU (csp-relaxed chose it)"``."""
    if plan.workload.unit == "gemm":
        return f"{template.strategy} GEMM block-diagonal"
    return f"stock ALU ({template.strategy} chose it)"


register_plan_summary(DepthwiseUnitWorkload, plan_summary)
register_template("depthwise_conv2d", "csp-relaxed", DepthwiseTemplate("csp-relaxed"))
register_reference("depthwise_conv2d", "csp-relaxed", gemm_reference)
