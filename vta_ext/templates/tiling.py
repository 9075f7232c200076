"""Tiling Parameter Search (TPS): the default tiling of the GEMM templates.

After the paper's Appendix A (``vta-configurable-stack-intel``): enumerate the knob space of the
conv2d schedule -- inner split factors ``tile_b, tile_h, tile_w, tile_co, tile_ci`` over the
divisors of their axes and the virtual threads ``oc_nthread, h_nthread`` in {1, 2} (not both 2) --
keep the tilings whose on-chip tiles fit the ``inp``/``wgt``/``acc`` scratchpads (all virtual-thread
copies) and whose GEMM micro-op kernel fits, and choose the one that moves the fewest DRAM bytes;
ties are broken by fewer (estimated) instructions, then by more virtual threads (load/compute
overlap), then by the knob tuple -- so the choice is deterministic.

The DRAM model (:func:`dram_bytes`) is not the paper's approximation but an exact count of what the
schedule of :mod:`.conv2d` loads and stores (and what the simulator's counters report):

* input: every output tile (``tile_h x tile_w`` outputs, ``tile_co`` channel blocks) and every
  batch block loads, per reduction step, the ``tile_ci`` channel blocks of its input window clipped
  to the image (padding is produced by the DMA and not read): ``N/b * (O/co)/tile_co * (C/g)/ci *
  R * C_`` elements, ``R``/``C_`` the sums over the row/column tiles of the clipped window sizes;
* weight: every output tile and batch block loads its ``tile_co x (C/g)/ci x KH x KW`` kernel
  elements: ``N/b * OH/tile_h * OW/tile_w * O/co * (C/g)/ci * KH * KW`` elements (``N/b/tile_b``
  instead of ``N/b`` when ``(C/g)/ci == 1``: the caches then sit at the store point);
* accumulator (bias): ``tile_b x tile_co`` elements per output tile;
* output: every output element once.

With reuse-aware double buffering (``reuse``; :func:`vta_ext.lower.codegen.lower_to_runtime`) the
tile shared by the two virtual threads is loaded once: the input bytes halve with
``oc_nthread = 2``, the weight bytes with ``h_nthread = 2``.

Dense layers are 1x1 conv2d workloads (:func:`vta_ext.templates.dense.dense_as_conv2d`); group
convolutions carry ``groups`` (the output-channel tiles and ``oc_nthread`` apply within a group).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

from ..config import VTAConfig, load_config
from .conv2d import (Conv2dKnobs, Conv2dWorkload, check_workload, estimate_sram_usage,
                     normalize_epilogue)

__all__ = ["TilingChoice", "dram_bytes", "estimate_insns", "gemm_uops", "tps_knobs",
           "enumerate_tilings", "BYTE_COUNTERS"]

#: the simulator counters the DRAM model predicts
BYTE_COUNTERS = ("inp_load_nbytes", "wgt_load_nbytes", "acc_load_nbytes", "out_store_nbytes")


@dataclass(frozen=True)
class TilingChoice:
    """A tiling with its modelled cost.

    Attributes
    ----------
    knobs : Conv2dKnobs
        The schedule knobs.
    bytes : dict
        Modelled DRAM bytes per counter (keys :data:`BYTE_COUNTERS`).
    insns : int
        Estimated instruction count (tie-breaker only).
    sram : dict
        On-chip elements per scratchpad (``inp``, ``wgt``, ``acc``), all virtual threads.
    uops : int
        Micro-ops of the GEMM kernel.
    candidates : int
        Number of feasible tilings considered.
    """

    knobs: Conv2dKnobs
    bytes: Dict[str, int]
    insns: int
    sram: Dict[str, int]
    uops: int
    candidates: int = 0

    @property
    def total_bytes(self) -> int:
        """Sum of the modelled load and store bytes."""
        return sum(self.bytes.values())


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _groups(wl) -> int:
    return int(getattr(wl, "groups", 1))


def _clipped_sum(n_out: int, tile: int, stride: int, kernel: int, pad: int, size: int) -> int:
    """Sum over the ``n_out / tile`` tiles of the input rows (or columns) a tile's window reads
    inside the image ``[0, size)``."""
    win = (tile - 1) * stride + kernel
    total = 0
    for t in range(n_out // tile):
        lo = t * tile * stride - pad
        total += max(0, min(lo + win, size) - max(lo, 0))
    return total


def dram_bytes(cfg: VTAConfig, wl: Conv2dWorkload, knobs: Conv2dKnobs,
               with_bias: bool = True) -> Dict[str, int]:
    """Exact DRAM bytes the conv2d schedule with ``knobs`` loads and stores (module docstring).

    Parameters
    ----------
    cfg : VTAConfig
        Configuration.
    wl : Conv2dWorkload
        Layer (a ``groups`` attribute is honoured).
    knobs : Conv2dKnobs
        Schedule knobs (``reuse`` halves the shared tile's loads).
    with_bias : bool
        Whether the epilogue loads a bias into the accumulator.

    Returns
    -------
    dict
        Bytes per simulator counter (:data:`BYTE_COUNTERS`).
    """
    cfg = load_config(cfg)
    B, BI, BO = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    g = _groups(wl)
    nb, ob, cbg = wl.batch // B, wl.out_channels // BO, wl.in_channels // g // BI
    OH, OW, K2 = wl.out_height, wl.out_width, wl.kernel_h * wl.kernel_w
    k = knobs
    rows = _clipped_sum(OH, k.tile_h, wl.stride_h, wl.kernel_h, wl.pad_h, wl.height)
    cols = _clipped_sum(OW, k.tile_w, wl.stride_w, wl.kernel_w, wl.pad_w, wl.width)
    inp = nb * (ob // k.tile_co) * cbg * rows * cols * cfg.inp_elem_bytes
    # the caches sit at the outer reduction loop, inside the tile's batch loop (weights reloaded
    # per batch block) -- unless there is a single input-channel block: then they sit at the store
    # point and the tile_b batch blocks share the weight tile
    wgt_rounds = nb // k.tile_b if cbg == 1 else nb
    wgt = wgt_rounds * (OH // k.tile_h) * (OW // k.tile_w) * ob * cbg * K2 * cfg.wgt_elem_bytes
    acc = nb * ob * (OH // k.tile_h) * (OW // k.tile_w) * cfg.acc_elem_bytes if with_bias else 0
    out = nb * ob * OH * OW * cfg.out_elem_bytes
    if k.reuse and k.oc_nthread * k.h_nthread == 2:
        if k.oc_nthread == 2:
            inp //= 2
        else:
            wgt //= 2
    return {"inp_load_nbytes": inp, "wgt_load_nbytes": wgt, "acc_load_nbytes": acc,
            "out_store_nbytes": out}


def gemm_uops(wl: Conv2dWorkload, knobs: Conv2dKnobs) -> int:
    """Micro-ops of the GEMM kernel: of the non-unit loops ``(tile_w, KW, KH, tile_co, tile_h,
    tile_ci)`` inside the reduction step, the two outermost are folded into the instruction, the
    others unrolled."""
    k = knobs
    inner = [e for e in (k.tile_w, wl.kernel_w, wl.kernel_h, k.tile_co, k.tile_h, k.tile_ci) if e > 1]
    n = 1
    for e in inner[2:]:
        n *= e
    return n


def estimate_insns(cfg: VTAConfig, wl: Conv2dWorkload, knobs: Conv2dKnobs,
                   n_alu: int = 3) -> int:
    """A rough instruction count (tie-breaker): per output tile and batch block, per reduction step
    ``tile_ci`` input loads, a weight load and a GEMM; per tile a reset, a bias load, the ALU stages
    and ``tile_b * tile_co`` stores."""
    B = cfg.BATCH
    g = _groups(wl)
    nb, ob, cbg = wl.batch // B, wl.out_channels // cfg.BLOCK_OUT, wl.in_channels // g // cfg.BLOCK_IN
    k = knobs
    tiles = (nb // k.tile_b) * (ob // k.tile_co) * (wl.out_height // k.tile_h) * \
        (wl.out_width // k.tile_w)
    inp_loads = k.tile_ci // (2 if k.reuse and k.oc_nthread == 2 else 1)
    return tiles * (k.tile_b * (cbg // k.tile_ci) * (inp_loads + 2) + 2 + n_alu + k.tile_b * k.tile_co)


def enumerate_tilings(cfg: VTAConfig, wl: Conv2dWorkload, epilogue=(), reuse: bool = False,
                      max_uops: Optional[int] = None):
    """Yield every feasible :class:`TilingChoice` (tiles fit the scratchpads, kernel fits the
    micro-op budget) of the knob space."""
    cfg = load_config(cfg)
    check_workload(cfg, wl)
    ep = normalize_epilogue(epilogue)
    with_bias = any(st[0] == "bias" for st in ep)
    n_alu = sum(2 if st[0] == "clip" and not cfg.EXT_CLIP else 1 for st in ep if st[0] != "bias") \
        + (1 if with_bias else 0)
    max_uops = cfg.uop_depth // 2 if max_uops is None else max_uops
    B = cfg.BATCH
    g = _groups(wl)
    nb, opg, cbg = wl.batch // B, wl.out_channels // cfg.BLOCK_OUT // g, wl.in_channels // g // cfg.BLOCK_IN
    OH, OW = wl.out_height, wl.out_width
    limits = {"inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "acc": cfg.acc_depth}
    for tb in _divisors(nb):
        for th in _divisors(OH):
            for tw in _divisors(OW):
                for tco in _divisors(opg):
                    for tci in _divisors(cbg):
                        for ocn, hn in ((1, 1), (2, 1), (1, 2)):
                            if (opg // tco) % ocn or (OH // th) % hn:
                                continue
                            kn = Conv2dKnobs(tb, th, tw, tci, tco, ocn, hn,
                                             reuse=bool(reuse and ocn * hn == 2))
                            use = estimate_sram_usage(cfg, wl, kn, with_bias)
                            if any(use[m] > limits[m] for m in use):
                                continue
                            uops = gemm_uops(wl, kn)
                            if uops > max_uops:
                                continue
                            yield TilingChoice(kn, dram_bytes(cfg, wl, kn, with_bias),
                                               estimate_insns(cfg, wl, kn, n_alu), use, uops)


def _key(c: TilingChoice) -> Tuple:
    k = c.knobs
    return (c.total_bytes, c.insns, -(k.oc_nthread * k.h_nthread),
            (k.tile_b, k.tile_h, k.tile_w, k.tile_ci, k.tile_co, k.oc_nthread, k.h_nthread))


def tps_knobs(cfg: Union[VTAConfig, str], wl: Conv2dWorkload, epilogue=(), reuse: bool = False,
              max_uops: Optional[int] = None) -> TilingChoice:
    """The TPS tiling of ``wl`` on ``cfg``: minimum modelled DRAM bytes among the feasible tilings.

    Parameters
    ----------
    cfg : VTAConfig or str
        Configuration.
    wl : Conv2dWorkload
        Layer (``GroupConv2dWorkload`` or the 1x1 form of a dense layer included).
    epilogue : sequence of tuples
        The epilogue (a bias stage adds accumulator traffic and footprint).
    reuse : bool
        Allow reuse-aware double buffering (the two-thread tilings then load the shared tile once).
    max_uops : int, optional
        Micro-op budget of the GEMM kernel (default half the micro-op buffer).

    Returns
    -------
    TilingChoice
        The chosen knobs with their modelled bytes.

    Raises
    ------
    ValueError
        If no tiling fits (not even the fallback: the workload is too large for the scratchpads).
    """
    cfg = load_config(cfg)
    best, n = None, 0
    for c in enumerate_tilings(cfg, wl, epilogue, reuse, max_uops):
        n += 1
        if best is None or _key(c) < _key(best):
            best = c
    if best is None:
        raise ValueError(f"no tiling of {wl} fits the scratchpads of {cfg.name!r} (inp "
                         f"{cfg.inp_depth}, wgt {cfg.wgt_depth}, acc {cfg.acc_depth} elements)")
    return TilingChoice(best.knobs, best.bytes, best.insns, best.sram, best.uops, n)
