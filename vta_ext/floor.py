"""The floor of a VTA operator: the fewest cycles any plan of it can take on a configuration.

The floor is ``max(compute, memory)`` of the operator *as written* (no padding):

* **compute** = GEMM part + ALU part:

  - GEMM: the operator's MACs (:func:`vta_ext.quantize.call_macs`, no padding)
    ``/ (BATCH * BLOCK_IN * BLOCK_OUT) * GEMM_CYCLES_PER_UOP``;
  - ALU: output elements ``/ (BATCH * BLOCK_OUT)`` times the cycles of the ALU passes the
    operator needs per output block. Each pass costs its own cycles per micro-op: an immediate
    op (SHR, CLIP, MIN/MAX/ADD/MUL imm) ``ALU_CYCLES_PER_UOP_IMM``, a vector-vector op (the bias
    or multiplier ADD / MUL, the taps of a depthwise convolution, the MAX / ADD of a pooling
    window) ``ALU_CYCLES_PER_UOP_VEC``: the cycle model (:mod:`vta_ext.sim.cycles`) charges them
    so, and a floor must not charge a vector pass less than the hardware can do it in.

* **memory** = every tensor the operator must move, moved once, each at the bandwidth of the
  memory kind it travels as (``<kind>_BYTES_PER_CYCLE``, 0 being the bus rate
  ``MEM_BYTES_PER_CYCLE``), plus what any DMA of it costs at the least: one instruction of one
  row, ``INSN_ISSUE_CYCLES + <kind>_INSN_CYCLES + DMA_OVERHEAD_CYCLES + <kind>_ROW_CYCLES +
  MEM_LATENCY_CYCLES`` (:meth:`vta_ext.sim.cycles.DmaCost.cycles` of one instruction and one
  row: the cycle model's own rule). The tensors: the input elements it reads (a window that
  skips rows or columns, e.g. a 1x1 convolution of stride 2, reads only the ones it touches), the
  weights, one int32 per output channel for each vector epilogue stage (bias, multiplier), and
  the output. The output travels as ``OUT``. A GEMM operator's input and weights travel as
  ``INP`` and ``WGT``, one each way round (an embedding may bind the weights to the input
  buffer): the cheaper assignment is charged. The other tensors (an ALU operator's inputs, the
  epilogue vectors, which a folded bias carries in the weights) are charged at the cheapest load
  kind (``INP``, ``WGT``, ``ACC``). The modules move data in parallel: the load module (LOAD INP
  / WGT), the compute module (LOAD ACC / ACC_8BIT) and the store module each drive their own AXI
  master (the Pynq design's RTL, ``../shared/vta-hw``: five masters, each with its own slave, no
  shared-bus arbitration; the cycle model's DMAs overlap the same way; on the RTL a LOAD INP of
  1,024 rows, a STORE of 1,024 rows and a LOAD ACC of 256 rows take 2,119 cycles together, as
  the LOAD alone does: ``docs/efficiency.md``). So the memory term is the
  busiest master's least work (:func:`memory_floor`): the output on the store module; a GEMM
  operator's input and weights on the load module (only it fills those buffers); the tensors that
  either load path can carry (an ALU operator's inputs where both ``LOAD ACC_8BIT`` and an identity
  GEMM from the input buffer exist, the int32 epilogue vectors) split at best evenly between the
  two load masters.

The ALU passes per output block, by operator:

* GEMM operators (conv2d, group / dilated conv2d, conv1d, dense, batched matmul): the epilogue's
  ALU instructions (:func:`~vta_ext.templates.epilogue.alu_ops`; shift + clip is two passes, a clip
  without ``EXT_CLIP`` or outside int8 two more). A bias that is the first stage is not counted: it
  can be the accumulator's initial value.
* depthwise conv2d: the smaller floor of the units that can run it (:func:`depthwise_floor`):

  - ALU taps (with ``ISA_ALU_MUL``): ``2 * taps - 1`` vector passes (every tap a MUL, every tap
    but the first an ADD into the sum), plus the epilogue with a leading bias counted (the sum
    already starts from the first tap's product, so the bias is one more ADD);
  - GEMM block-diagonal (with ``BLOCK_IN == BLOCK_OUT``; :mod:`tvm_csp_embed.depthwise`): the
    grouped conv2d of ``BLOCK`` channels per group whose weight tile per (group, tap) is diagonal,
    i.e. one GEMM micro-op per tap and output block (``taps * GEMM_CYCLES_PER_UOP`` per block),
    the epilogue as a GEMM operator's (a leading bias is the accumulator's initial value), and
    ``BLOCK_IN`` times the depthwise weight bytes (the diagonal tiles' zeros are moved too).

  A banded embedding over the image width (not implemented) would have a floor of its own.
* max pooling: the fewer vector MAX passes of the plans that can run it
  (:func:`max_pool_passes`): the direct plan's ``taps - 1`` (the first window element is the
  initial value) and the in-place plan's (:func:`vta_ext.templates.pool.inplace_passes` per
  output: ``(pool_h - 1) * columns / out_cols + pool_w - 1`` over the input columns the windows
  read; it needs no ``EXT_PAD_MIN`` beyond what padding needs on every plan).
* average pooling: ``taps - 1`` vector ADD passes plus the division by a constant: at least a
  multiply and a shift (one shift for a power-of-two window): a lower bound, the exact
  truncating division takes more.
* add: one vector ADD; hardswish ``x * clip(x + offset, lo, hi)``: the ADD imm and the clip, then a
  vector MUL; clip: the epilogue alone. Each then runs its epilogue.

Efficiency is floor / modelled cycles (:func:`efficiency`); it is at most 1 unless the floor or
the cycle model is wrong.

The build report knows an operator by its compiled key (:func:`vta_ext.executor.op_key`: kind,
the template's workload, epilogue, configuration) and the MACs and output elements of the
operator as written; :func:`key_floor` takes those. The stock templates' workloads are padded to
whole blocks, so for them the unpadded channels come from the MACs and output elements. Only
with ``BATCH > 1`` can the split of batch and channels be ambiguous; then the smallest floor of
the possible splits is taken, so the floor stays a lower bound.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .config import VTAConfig
from .templates.epilogue import (VECTOR_STAGES, Epilogue, alu_ops, normalize_epilogue,
                                 split_pool_stage)
from .templates.workload import out_size

__all__ = ["Floor", "OperatorSize", "operator_floor", "depthwise_floor", "max_pool_passes",
           "own_floor", "serial_floor", "gemm_row_serial",
           "SERIAL_KINDS", "key_floor", "efficiency",
           "GEMM_KINDS", "ALU_KINDS", "memory_floor", "moved_cycles", "cheapest_moved", "LOAD_KINDS"]

#: operator kinds that run on the GEMM core
GEMM_KINDS = ("conv2d", "group_conv2d", "dilated_conv2d", "conv1d", "dense", "batch_matmul")
#: operator kinds that run on the ALU (a depthwise conv2d on the GEMM core too: :func:`depthwise_floor`)
ALU_KINDS = ("depthwise_conv2d", "max_pool2d", "avg_pool2d", "add", "hswish", "clip")


@dataclass(frozen=True)
class Floor:
    """The floor of one operator (or the sum over several) on a configuration, in cycles.

    Attributes
    ----------
    compute_gemm : float
        GEMM micro-ops of the unpadded MACs times ``GEMM_CYCLES_PER_UOP``.
    compute_alu : float
        ALU micro-ops of the passes the operator needs times their cycles per micro-op.
    memory : float
        The busiest DMA master's work: every tensor moved once at its memory kind's bandwidth,
        plus one DMA instruction of one row for each, on the master that carries it
        (:func:`memory_floor`).
    serial : float
        Compute-module cycles besides the passes that no other module can take over: an ALU
        operator's inputs into the accumulator, a GEMM operator's accumulator initialisation
        (:func:`serial_floor`). Not part of :attr:`total`: it enters :attr:`structural`.
    """

    compute_gemm: float
    compute_alu: float
    memory: float
    serial: float = 0.0

    @property
    def compute(self) -> float:
        """GEMM plus ALU cycles."""
        return self.compute_gemm + self.compute_alu

    @property
    def total(self) -> float:
        """``max(compute, memory)``: no plan on the configuration takes fewer cycles."""
        return max(self.compute, self.memory)

    @property
    def structural(self) -> float:
        """``max(compute + serial, memory)``: :attr:`total` with the compute module's own work
        that cannot overlap its passes (:func:`serial_floor`: the accumulator is written only by
        the compute module, so an ALU operator's inputs and a GEMM operator's initial values
        pass through it). Also no plan can beat it; the gap between the two is structural
        (issue 32, item 3)."""
        return max(self.compute + self.serial, self.memory)

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"memory"``: which term sets :attr:`total`."""
        return "compute" if self.compute >= self.memory else "memory"

    def __add__(self, other: "Floor") -> "Floor":
        """The parts summed (the total of a sum is the max of the summed parts, which is at most
        the sum of the totals: operators of a network do not overlap on VTA)."""
        return Floor(self.compute_gemm + other.compute_gemm, self.compute_alu + other.compute_alu,
                     self.memory + other.memory, self.serial + other.serial)

    def as_dict(self) -> Dict[str, Any]:
        """The parts, :attr:`total` and :attr:`bound` as JSON-able values."""
        return {"compute_gemm": self.compute_gemm, "compute_alu": self.compute_alu,
                "memory": self.memory, "total": self.total, "bound": self.bound,
                "serial": self.serial, "structural": self.structural}

    def __repr__(self) -> str:
        return (f"Floor({self.total:,.0f} cycles, {self.bound} bound: GEMM {self.compute_gemm:,.0f}"
                f" + ALU {self.compute_alu:,.0f}, memory {self.memory:,.0f})")


@dataclass(frozen=True)
class OperatorSize:
    """An operator as written (no padding), in the terms of the floor.

    Attributes
    ----------
    kind : str
        The operator kind (:data:`GEMM_KINDS`, :data:`ALU_KINDS`).
    macs : int
        Multiply-accumulates (GEMM kinds; 0 for the others).
    out_elements : int
        Elements of the output.
    in_elements : int
        Elements of the activation inputs the operator reads (both of an add).
    weight_elements : int
        Elements of the weights (0 for pooling and element-wise operators).
    channels : int
        Output channels: the lanes of a per-channel bias or multiplier.
    taps : int
        Window elements per output (depthwise convolution and pooling; else 0).
    epilogue : tuple
        The normalised epilogue (:func:`~vta_ext.templates.epilogue.normalize_epilogue`).
    body : tuple
        Immediate stages the operator itself runs before its epilogue (hardswish: the add and
        clip of ``clip(x + offset, lo, hi)``).
    window : tuple
        A max pool's ``(pool_h, pool_w, out_rows, out_cols, columns)``, ``columns`` the input
        columns its windows read (:func:`max_pool_passes`); ``()``: unknown (only the direct plan
        is counted) or another kind.
    """

    kind: str
    macs: int
    out_elements: int
    in_elements: int
    weight_elements: int = 0
    channels: int = 0
    taps: int = 0
    epilogue: Epilogue = ()
    body: Epilogue = ()
    window: Tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in GEMM_KINDS + ALU_KINDS:
            raise ValueError(f"OperatorSize.kind {self.kind!r}: no floor for this operator kind; "
                             f"known: {', '.join(GEMM_KINDS + ALU_KINDS)}")
        if self.kind in GEMM_KINDS and self.macs <= 0:
            raise ValueError(f"OperatorSize.macs {self.macs} of a {self.kind}: give the MACs of "
                             "the operator as written (vta_ext.quantize.call_macs)")


def _stage_passes(config: VTAConfig, stages: Sequence[tuple]) -> Tuple[int, int]:
    """(immediate, vector) ALU passes of epilogue ``stages``."""
    imm = vec = 0
    for st in stages:
        if st[0] in VECTOR_STAGES:
            vec += 1
        else:
            imm += len(alu_ops(config, st))
    return imm, vec


def alu_passes(config: VTAConfig, size: OperatorSize) -> Tuple[int, int]:
    """``(immediate, vector)``: the ALU passes per output block ``size`` needs at the least (see
    the module docstring)."""
    epilogue = size.epilogue
    if size.kind in GEMM_KINDS and epilogue and epilogue[0][0] == "bias":
        epilogue = epilogue[1:]  # the accumulator's initial value
    imm, vec = _stage_passes(config, size.body + epilogue)
    if size.kind == "depthwise_conv2d":
        vec += 2 * size.taps - 1
    elif size.kind == "max_pool2d":
        vec += max_pool_passes(config, size)
    elif size.kind == "avg_pool2d":
        vec += size.taps - 1
        imm += 1 if size.taps & (size.taps - 1) == 0 else 2
    elif size.kind == "add":
        vec += 1
    elif size.kind == "hswish":
        vec += 1
    return imm, vec


def max_pool_passes(config: VTAConfig, size: OperatorSize) -> float:
    """Vector MAX passes per output block of the max pool ``size`` at the least: the fewer of
    the plans that can run it.

    Parameters
    ----------
    config : VTAConfig
        Unused (every configuration that runs a max pool runs the in-place plan's passes).
    size : OperatorSize
        A ``max_pool2d``; the in-place plan counts only with its :attr:`~OperatorSize.window`.

    Returns
    -------
    float
        ``taps - 1`` (the direct plan, the first window element the initial value), or the
        in-place plan's :func:`~vta_ext.templates.pool.inplace_passes` per output, whichever is
        smaller.
    """
    from .templates.pool import inplace_passes

    direct = size.taps - 1
    if not size.window:
        return direct
    pool_h, pool_w, out_rows, out_cols, columns = size.window
    return min(direct, inplace_passes(pool_h, pool_w, columns, out_rows, out_cols)
               / (out_rows * out_cols))


def operator_floor(config: VTAConfig, size: OperatorSize) -> Floor:
    """The floor of the operator ``size`` on ``config``.

    Parameters
    ----------
    config : VTAConfig
        Supplies the block shape, the cycles per micro-op and the bytes per cycle.
    size : OperatorSize
        The operator as written.

    Returns
    -------
    Floor
    """
    cfg = config
    floor = own_floor(cfg, size)
    if size.kind in ("add", "avg_pool2d") and cfg.BLOCK_IN == cfg.BLOCK_OUT:
        return identity_gemm_floor(cfg, size, floor)
    return depthwise_floor(cfg, size, floor) if size.kind == "depthwise_conv2d" else floor


def identity_gemm_floor(config: VTAConfig, size: OperatorSize, alu: Floor) -> Floor:
    """The floor of an add or an average pool whose sums GEMM micro-ops through an identity
    weight tile can make (``BLOCK_IN == BLOCK_OUT``).

    Parameters
    ----------
    config : VTAConfig
        The configuration.
    size : OperatorSize
        An ``add`` or ``avg_pool2d``.
    alu : Floor
        Its floor with the sums as ALU vector passes (:func:`alu_passes`).

    Returns
    -------
    Floor
        Per term the lower of ``alu`` and the GEMM way: the add's second operand, or every tap
        of an average pool, one micro-op (``GEMM_CYCLES_PER_UOP``) an output row instead of the
        vector ADD passes (one; ``taps - 1``), the rest of the ALU passes the same; serially
        the add's first operand into the accumulator (half of :func:`serial_floor`), or the
        pool's outputs an initial value (its taps read the input buffer, not the accumulator).
        The compute terms are those of the way with less compute, the serial term makes
        ``compute + serial`` the lower of the two ways', so :attr:`Floor.total` and
        :attr:`Floor.structural` are each the lower of the two.
    """
    cfg = config
    rows = size.out_elements / (cfg.BATCH * cfg.BLOCK_OUT)
    if size.kind == "add":
        taps, sums, serial = 1, 1, alu.serial / 2
    else:
        init = min(cfg.PAD_ELEM_CYCLES, cfg.GEMM_CYCLES_PER_UOP, cfg.ALU_CYCLES_PER_UOP_IMM)
        taps, sums, serial = size.taps, size.taps - 1, rows * init
    way = Floor(rows * taps * cfg.GEMM_CYCLES_PER_UOP,
                alu.compute_alu - rows * sums * cfg.ALU_CYCLES_PER_UOP_VEC, alu.memory, serial)
    best = min((alu, way), key=lambda f: f.compute)
    return Floor(best.compute_gemm, best.compute_alu, alu.memory,
                 min(f.compute + f.serial for f in (alu, way)) - best.compute)


#: the memory kinds a LOAD moves (``OUT`` is the STORE's)
LOAD_KINDS = ("INP", "WGT", "ACC")


def moved_cycles(config: VTAConfig, kind: str, nbytes: float) -> float:
    """The fewest cycles in which DMAs of memory kind ``kind`` move ``nbytes`` (none if 0): the
    bytes at the kind's bandwidth and one instruction of one row (the cycle model's
    :meth:`~vta_ext.sim.cycles.DmaCost.cycles`)."""
    from .sim.cycles import timing

    return timing(config).dma(kind).cycles(1, 1, nbytes) if nbytes else 0


def cheapest_moved(config: VTAConfig, nbytes: float, kinds: Sequence[str] = LOAD_KINDS) -> float:
    """:func:`moved_cycles` of ``nbytes`` at the cheapest of ``kinds``."""
    return min(moved_cycles(config, k, nbytes) for k in kinds)


def memory_floor(config: VTAConfig, size: OperatorSize) -> float:
    """The memory term of the floor of ``size``: the least work of the busiest DMA master
    (module docstring).

    Each tensor is moved once at its cheapest kind (:func:`moved_cycles`). The output goes to the
    store master. A GEMM operator's input and weights go to the load master (the input and weight
    buffers are filled only by it). An ALU operator's inputs go to the compute master by ``LOAD
    ACC_8BIT`` (with ``ISA_ACC_8BIT_LOAD``) or to the load master by ``LOAD INP`` and an identity
    GEMM (``BLOCK_IN == BLOCK_OUT``): with both ways they may be split between the two. The int32
    epilogue vectors may go either way (``LOAD ACC``, or digits in the weights). With ``only_load``
    and ``only_compute`` the bytes only one of the two load masters can take and ``either`` those
    both can, the load side is ``max(only_load, only_compute, (only_load + only_compute +
    either) / 2)``; the term is the larger of it and the output's.
    """
    cfg = config
    vectors = sum(st[0] in VECTOR_STAGES for st in size.epilogue)
    inp = size.in_elements * cfg.INP_WIDTH / 8
    wgt = size.weight_elements * cfg.WGT_WIDTH / 8
    either = cheapest_moved(cfg, vectors * size.channels * cfg.ACC_WIDTH / 8)
    only_load = only_compute = 0.0
    if size.kind in GEMM_KINDS:
        only_load = min(moved_cycles(cfg, "INP", inp) + moved_cycles(cfg, "WGT", wgt),
                        moved_cycles(cfg, "WGT", inp) + moved_cycles(cfg, "INP", wgt))
    else:
        operands = (2 * cheapest_moved(cfg, inp / 2) if size.kind == "add"   # two inputs
                    else cheapest_moved(cfg, inp) + cheapest_moved(cfg, wgt))
        by_acc, by_inp = bool(cfg.ISA_ACC_8BIT_LOAD), cfg.BLOCK_IN == cfg.BLOCK_OUT
        if by_acc and by_inp:
            either += operands
        elif by_inp:
            only_load = operands
        else:
            only_compute = operands
    load = max(only_load, only_compute, (only_load + only_compute + either) / 2)
    return max(load, moved_cycles(cfg, "OUT", size.out_elements * cfg.OUT_WIDTH / 8))


#: ALU operators whose inputs reach the ALU only through the accumulator (:func:`serial_floor`)
SERIAL_KINDS = ("max_pool2d", "avg_pool2d", "add", "hswish", "clip")


def serial_floor(config: VTAConfig, size: OperatorSize) -> float:
    """The fewest compute-module cycles operator ``size`` needs besides its GEMM and ALU passes,
    which no other module can take over (the rest of :attr:`Floor.structural`).

    * An ALU operator (:data:`SERIAL_KINDS`) reads only the accumulator, and only compute-module
      instructions write it: every input row enters by a ``LOAD ACC_8BIT`` of its int8 lanes
      (with ``ISA_ACC_8BIT_LOAD``, at the ``ACC`` bandwidth) or by a GEMM through an identity
      weight tile from rows the load module brought in (``BLOCK_IN == BLOCK_OUT``): a GEMM adds,
      so the row is first initialised as below, then ``GEMM_CYCLES_PER_UOP``; an int32 ``LOAD
      ACC`` needs int32 data in DRAM, which no VTA operator stores.
    * A GEMM operator accumulates (a GEMM adds to its accumulator row; there is no overwriting
      GEMM), so every output row starts from a value a compute-module instruction wrote: a fill
      (``PAD_ELEM_CYCLES`` a row), a reset GEMM (``GEMM_CYCLES_PER_UOP``) or an immediate ALU
      pass (``ALU_CYCLES_PER_UOP_IMM``); and its whole micro-ops and its leading bias
      (:func:`gemm_row_serial`).

    The cheaper way per row is charged, without any instruction or row overhead; 0 for the other
    kinds (a depthwise conv2d's ALU unit: its floor is the smaller unit's, left as it is).
    """
    from .sim.cycles import timing

    cfg = config
    lanes = cfg.BATCH * cfg.BLOCK_OUT
    init = min(cfg.PAD_ELEM_CYCLES, cfg.GEMM_CYCLES_PER_UOP, cfg.ALU_CYCLES_PER_UOP_IMM)
    if size.kind in GEMM_KINDS:
        return size.out_elements / lanes * gemm_row_serial(cfg, size)
    if size.kind not in SERIAL_KINDS:
        return 0.0
    per_row = []
    if cfg.ISA_ACC_8BIT_LOAD:
        per_row.append(timing(cfg).dma("ACC").cycles(0, 0, lanes * cfg.INP_WIDTH / 8))
    if cfg.BLOCK_IN == cfg.BLOCK_OUT:
        per_row.append(init + cfg.GEMM_CYCLES_PER_UOP)
    return size.in_elements / lanes * min(per_row) if per_row else 0.0


def gemm_row_serial(config: VTAConfig, size: OperatorSize) -> float:
    """The fewest compute-module cycles per output row (``BATCH * BLOCK_OUT`` outputs) a GEMM
    operator needs besides its GEMM term (``R / BLOCK_IN`` micro-ops a row, ``R = macs /
    out_elements`` the products of one output) and its ALU passes.

    Parameters
    ----------
    config : VTAConfig
        The configuration.
    size : OperatorSize
        A GEMM operator (:data:`GEMM_KINDS`).

    Returns
    -------
    float
        Without a leading bias: the initial value (the cheapest of a fill, a reset GEMM, an
        immediate ALU pass) plus the unfilled lanes of the last micro-op, ``(ceil(R / BLOCK_IN) -
        R / BLOCK_IN) * GEMM_CYCLES_PER_UOP``. A micro-op adds at most ``BLOCK_IN`` products to an
        output and touches at most ``BATCH * BLOCK_OUT`` outputs, and each output's ``R``
        products (as the GEMM term counts them, padded taps included) each take a lane: every
        output needs ``ceil(R / BLOCK_IN)`` micro-ops that touch it. With a leading bias, the
        cheapest way the bias can enter:

        - folded: a lane whose input is a constant (a lane holding an activation cannot also
          carry a data-independent term), so ``ceil((R + 1) / BLOCK_IN)`` micro-ops, plus the
          initial value;
        - added by one ALU pass (immediate or vector, the cheaper), plus the initial value and
          the whole micro-ops;
        - loaded as the initial value: a ``LOAD ACC`` of the row's int32 lanes (their bytes at the
          ``ACC`` bandwidth, no instruction or row overhead), plus the whole micro-ops.

        Where ``R`` is not a whole number (no operator of :func:`key_floor` has one) the rounding
        is not counted and a folded bias costs one lane, ``GEMM_CYCLES_PER_UOP / BLOCK_IN``.
    """
    from .sim.cycles import timing

    cfg = config
    gemm = cfg.GEMM_CYCLES_PER_UOP
    init = min(cfg.PAD_ELEM_CYCLES, gemm, cfg.ALU_CYCLES_PER_UOP_IMM)
    block = cfg.BLOCK_IN
    per = size.macs / size.out_elements / block  # the GEMM term's micro-ops per output
    products, uneven = divmod(size.macs, size.out_elements)
    whole = 0.0 if uneven else (-(-products // block) - per) * gemm
    if not (size.epilogue and size.epilogue[0][0] == "bias"):
        return init + whole
    folded = gemm / block if uneven else (-(-(products + 1) // block) - per) * gemm
    added = whole + min(cfg.ALU_CYCLES_PER_UOP_IMM, cfg.ALU_CYCLES_PER_UOP_VEC)
    row_bytes = cfg.BATCH * cfg.BLOCK_OUT * cfg.ACC_WIDTH / 8
    loaded = whole + timing(cfg).dma("ACC").cycles(0, 0, row_bytes)
    return min(init + folded, init + added, loaded)


def own_floor(config: VTAConfig, size: OperatorSize) -> Floor:
    """The floor of ``size`` run as its kind says, without the other units
    :func:`operator_floor` considers: a depthwise conv2d on the ALU taps alone (its ALU unit,
    which :mod:`tvm_csp_embed.depthwise` compares with the block-diagonal GEMM program), an add
    or average pool without the identity GEMM."""
    cfg = config
    gemm = size.macs / (cfg.BATCH * cfg.BLOCK_IN * cfg.BLOCK_OUT) * cfg.GEMM_CYCLES_PER_UOP
    imm, vec = alu_passes(cfg, size)
    alu = (size.out_elements / (cfg.BATCH * cfg.BLOCK_OUT)
           * (imm * cfg.ALU_CYCLES_PER_UOP_IMM + vec * cfg.ALU_CYCLES_PER_UOP_VEC))
    return Floor(gemm, alu, memory_floor(cfg, size), serial_floor(cfg, size))


def depthwise_floor(config: VTAConfig, size: OperatorSize, alu: Floor) -> Floor:
    """The floor of a depthwise conv2d: the smallest over the units that can run it.

    Parameters
    ----------
    config : VTAConfig
        The configuration.
    size : OperatorSize
        A ``depthwise_conv2d`` as written (``weight_elements`` = channels x taps).
    alu : Floor
        Its floor on the ALU taps (:func:`operator_floor`'s ALU passes).

    Returns
    -------
    Floor
        The smaller total of the ALU floor (when ``config`` has ``ISA_ALU_MUL``) and the GEMM
        block-diagonal floor (when ``BLOCK_IN == BLOCK_OUT``): the floor of the grouped conv2d
        with ``BLOCK_IN`` times the MACs and the weights (the diagonal tiles); the ALU floor when
        neither unit applies (the operator then has no plan on VTA).
    """
    units = [alu] if config.ISA_ALU_MUL else []
    if config.BLOCK_IN == config.BLOCK_OUT:
        block = config.BLOCK_IN
        units.append(operator_floor(config, dataclasses.replace(
            size, kind="group_conv2d", macs=size.out_elements * size.taps * block,
            weight_elements=size.weight_elements * block, taps=0)))
    return min(units, key=lambda f: f.total) if units else alu


def efficiency(floor: Floor, cycles: float) -> float:
    """``floor.total / cycles``: 1 is the best any plan can do.

    Raises
    ------
    ValueError
        For ``cycles <= 0``.
    """
    if cycles <= 0:
        raise ValueError(f"efficiency: cycles {cycles} must be positive (the modelled cycles of "
                         "the operator's program)")
    return floor.total / cycles


# ------------------------------------------------------------------------------ from a build key
def touched(size: int, window: int, pad: int, stride: int, outputs: int, dilation: int = 1) -> int:
    """Input positions along one axis that ``outputs`` windows read: ``o * stride + t * dilation -
    pad`` for ``o < outputs``, ``t < window``, inside ``[0, size)``."""
    if dilation == 1 and stride <= window:  # the windows leave no gap: one run of positions
        first, last = -pad, (outputs - 1) * stride + window - 1 - pad
        return max(0, min(last, size - 1) - max(first, 0) + 1)
    return len(_read(size, window, pad, stride, range(outputs), dilation))


def _splits(product: int, padded_batch: int, padded_channels: int, config: VTAConfig,
            block: int) -> List[Tuple[int, int]]:
    """The ``(batch, channels)`` pairs whose product is ``product`` that pad to the workload's
    ``padded_batch`` and ``padded_channels`` (one pair unless ``BATCH > 1``)."""
    out = []
    for n in range(max(1, padded_batch - config.BATCH + 1), padded_batch + 1):
        if product % n == 0 and padded_channels - block < product // n <= padded_channels:
            out.append((n, product // n))
    if not out:
        raise ValueError(f"key_floor: {product} output batch x channels do not pad to batch "
                         f"{padded_batch} and channels {padded_channels} on {config.name}: the "
                         "placement's output elements do not belong to this key")
    return out


def _stock_sizes(kind: str, wl: Dict[str, Any], macs: int, elements: int, config: VTAConfig,
                 epilogue: Epilogue) -> List[OperatorSize]:
    """The possible unpadded operators of a stock workload (padded to blocks)."""
    sizes = []
    if kind == "dense":
        k = macs // elements
        for n, m in _splits(elements, wl["batch"], wl["out_features"], config, config.BLOCK_OUT):
            sizes.append(OperatorSize(kind, macs, elements, n * k, m * k, m, epilogue=epilogue))
        return sizes
    h, w = wl["height"], wl["width"]
    if kind in ("add", "hswish", "clip"):
        inputs = 2 * elements if kind == "add" else elements
        body = ((("add", wl["offset"]), ("clip", wl["lo"], wl["hi"])) if kind == "hswish" else ())
        return [OperatorSize(kind, 0, elements, inputs, epilogue=epilogue, body=body)]
    kh, kw = (wl["pool_h"], wl["pool_w"]) if kind.endswith("pool2d") else (wl["kernel_h"],
                                                                            wl["kernel_w"])
    oh = out_size(h, kh, wl["pad_h"], wl["stride_h"])
    ow = out_size(w, kw, wl["pad_w"], wl["stride_w"])
    plane = (touched(h, kh, wl["pad_h"], wl["stride_h"], oh)
             * touched(w, kw, wl["pad_w"], wl["stride_w"], ow))
    if elements % (oh * ow):
        raise ValueError(f"key_floor: {elements} output elements are not a whole number of "
                         f"{oh}x{ow} output planes of this {kind} key")
    if kind in ("conv2d", "group_conv2d"):
        groups = wl.get("groups", 1)
        per_group = macs // (elements * kh * kw)  # input channels of one group
        for n, o in _splits(elements // (oh * ow), wl["batch"], wl["out_channels"], config,
                            config.BLOCK_OUT):
            sizes.append(OperatorSize(kind, macs, elements, n * per_group * groups * plane,
                                      o * per_group * kh * kw, o, epilogue=epilogue))
        return sizes
    window = ()
    if kind == "max_pool2d":
        window = (kh, kw, oh, ow, touched(w, kw, wl["pad_w"], wl["stride_w"], ow))
    for n, c in _splits(elements // (oh * ow), wl["batch"], wl["channels"], config,
                        config.BLOCK_OUT):
        weights = c * kh * kw if kind == "depthwise_conv2d" else 0
        sizes.append(OperatorSize(kind, 0, elements, n * c * plane, weights, c, kh * kw,
                                  epilogue=epilogue, window=window))
    return sizes


def _csp_size(kind: str, p: Dict[str, int], macs: int, elements: int,
              epilogue: Epilogue) -> OperatorSize:
    """The operator of a CSP workload's parameters (which are the unpadded operator's)."""
    if kind == "dense":
        return OperatorSize(kind, macs, elements, p["n"] * p["k"], p["m"] * p["k"], p["m"],
                            epilogue=epilogue)
    if kind == "batch_matmul":
        return OperatorSize(kind, macs, elements, p["b"] * p["n"] * p["k"],
                            p["b"] * p["k"] * p["m"], p["m"], epilogue=epilogue)
    if kind == "conv1d":
        ow = out_size(p["w"] + p["pl"] + p["pr"], (p["kw"] - 1) * p["dw"] + 1, 0, p["sw"])
        cols = touched(p["w"], p["kw"], p["pl"], p["sw"], ow, p["dw"])
        return OperatorSize(kind, macs, elements, p["n"] * p["c"] * cols,
                            p["k"] * p["c"] * p["kw"], p["k"], epilogue=epilogue)
    groups, dh, dw = p.get("g", 1), p.get("dh", 1), p.get("dw", 1)
    oh = out_size(p["h"] + p["pt"] + p["pb"], (p["kh"] - 1) * dh + 1, 0, p["sh"])
    ow = out_size(p["w"] + p["pl"] + p["pr"], (p["kw"] - 1) * dw + 1, 0, p["sw"])
    plane = (touched(p["h"], p["kh"], p["pt"], p["sh"], oh, dh)
             * touched(p["w"], p["kw"], p["pl"], p["sw"], ow, dw))
    return OperatorSize(kind, macs, elements, p["n"] * p["c"] * plane,
                        p["k"] * (p["c"] // groups) * p["kh"] * p["kw"], p["k"], epilogue=epilogue)


def key_floor(key: str, macs: int, elements: int, config: Optional[VTAConfig] = None) -> Floor:
    """The floor of a compiled VTA operator of the build.

    Parameters
    ----------
    key : str
        Its key (:func:`vta_ext.executor.op_key`): kind, workload, epilogue and configuration.
    macs : int
        MACs of the operator as written (:attr:`vta_ext.report.OpPlacement.macs`; 0 for ALU
        operators).
    elements : int
        Elements of its output as written (:attr:`vta_ext.report.OpPlacement.elements`).
    config : VTAConfig, optional
        The configuration, if the caller has it (else rebuilt from the key's value).

    Returns
    -------
    Floor

    Raises
    ------
    ValueError
        For a key of an operator kind without a floor, or figures that do not fit the key.
    """
    spec = json.loads(key)
    if config is None or config.to_dict() != spec["config_value"]:
        config = VTAConfig.from_dict(spec["config_value"], name=spec["config"])
    kind, wl = spec["op"], spec["workload"]
    # a max pool fused into a conv (its last stage): the conv's floor plus the pool's
    epilogue, pool = split_pool_stage(spec["epilogue"])
    epilogue = normalize_epilogue(epilogue)
    if elements <= 0:
        raise ValueError(f"key_floor: {elements} output elements for a {kind}; give the "
                         "operator's output elements as written")
    stock = wl.get("stock") if "params" in wl else wl
    if stock:
        sizes = _stock_sizes(kind, dict(stock), macs, elements, config, epilogue)
    else:
        sizes = [_csp_size(kind, dict(wl["params"]), macs, elements, epilogue)]
    if pool is not None:
        if stock or kind not in ("conv2d", "group_conv2d"):
            raise ValueError(f"key_floor: a max pool stage on a {'stock ' if stock else ''}{kind}")
        return _fused_pool_floor(config, sizes[0], dict(wl["params"]), pool)
    return min((operator_floor(config, s) for s in sizes), key=lambda f: f.total)


def _fused_pool_floor(config: VTAConfig, conv: OperatorSize, p: Dict[str, int],
                      pool: Tuple[int, ...]) -> Floor:
    """The floor of the CSP conv ``conv`` (parameters ``p``) with the max pool ``pool`` fused
    into it: only the conv outputs the pool's windows read need computing (a 7x7 output under a
    2x2 stride-2 pool: 6x6), from the input they read; the pool's passes add to the compute; the
    pooled output is the only store; no input of the pool is moved or enters the accumulator
    (the conv's outputs are there already), so the pool adds no memory and no serial term."""
    ph, pw, sh, sw = pool
    dh, dw = p.get("dh", 1), p.get("dw", 1)
    oh = out_size(p["h"] + p["pt"] + p["pb"], (p["kh"] - 1) * dh + 1, 0, p["sh"])
    ow = out_size(p["w"] + p["pl"] + p["pr"], (p["kw"] - 1) * dw + 1, 0, p["sw"])
    rows, cols = _read(oh, ph, 0, sh, range(out_size(oh, ph, 0, sh))), \
        _read(ow, pw, 0, sw, range(out_size(ow, pw, 0, sw)))
    read = (len(_read(p["h"], p["kh"], p["pt"], p["sh"], rows, dh))
            * len(_read(p["w"], p["kw"], p["pl"], p["sw"], cols, dw)))
    used = len(rows) * len(cols)
    part = dataclasses.replace(conv, macs=conv.macs * used // (oh * ow),
                               out_elements=conv.out_elements * used // (oh * ow),
                               in_elements=p["n"] * p["c"] * read)
    own = operator_floor(config, part)
    pool_size = _fused_pool_size(p, pool)
    memory = memory_floor(config, dataclasses.replace(part, out_elements=pool_size.out_elements))
    return Floor(own.compute_gemm,
                 own.compute_alu + operator_floor(config, pool_size).compute_alu, memory, own.serial)


def _read(size: int, window: int, pad: int, stride: int, outputs, dilation: int = 1) -> set:
    """The input positions along one axis (in ``[0, size)``) that the windows of the output
    positions ``outputs`` read (:func:`touched` counts them for the first ``n`` outputs: one
    definition of a window's reach)."""
    return ({o * stride + t * dilation - pad for o in outputs for t in range(window)}
            & set(range(size)))


def _fused_pool_size(p: Dict[str, int], pool: Tuple[int, ...]) -> OperatorSize:
    """The max pool ``(pool_h, pool_w, stride_h, stride_w)`` (no padding) of the output of the
    CSP conv of parameters ``p``, as written."""
    ph, pw, sh, sw = pool
    h = out_size(p["h"] + p["pt"] + p["pb"], (p["kh"] - 1) * p.get("dh", 1) + 1, 0, p["sh"])
    w = out_size(p["w"] + p["pl"] + p["pr"], (p["kw"] - 1) * p.get("dw", 1) + 1, 0, p["sw"])
    oh, ow = out_size(h, ph, 0, sh), out_size(w, pw, 0, sw)
    planes = p["n"] * p["k"]
    return OperatorSize("max_pool2d", 0, planes * oh * ow,
                        planes * touched(h, ph, 0, sh, oh) * touched(w, pw, 0, sw, ow), 0, p["k"],
                        ph * pw, window=(ph, pw, oh, ow, touched(w, pw, 0, sw, ow)))
