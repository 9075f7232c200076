"""Static check that a VTA program is race-free under the dependency-token semantics.

The functional simulator runs the three modules in one fixed round-robin order, so a missing
dependency token can go unnoticed there. :func:`check_races` instead derives the *happens-before*
relation the tokens guarantee -- program order inside each module, plus "the k-th pop of a queue
happens after the k-th push" -- with vector clocks, and checks every pair of accesses to the same
on-chip element from different modules (input/weight buffers: load vs compute module; accumulator:
compute vs store module) where at least one is a write. Any unordered pair is a race: some
legitimate execution order of the hardware would read stale or clobbered data.

It also reports deadlocks (a pop that no push can ever satisfy) and the tokens left in the queues
at each FINISH.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np

from ..isa import (STAGE_QUEUES, TOKEN_QUEUES, AluInsn, FinishInsn, GemmInsn, MemInsn, MemType,
                   Opcode, Stage, decode_uops, insn_stage)
from ..memory import LOAD_TARGETS, STORE_SOURCE, scratchpads

__all__ = ["RaceError", "RaceReport", "check_races"]

#: the data scratchpads whose elements are checked (micro-ops are only read by the compute module)
_CHECKED = (MemType.INP, MemType.WGT, MemType.ACC)


class RaceError(AssertionError):
    """Two accesses from different modules to the same on-chip element are not ordered by tokens."""


@dataclass
class RaceReport:
    instructions: int = 0
    checked_accesses: int = 0
    leftover_tokens: List[Dict[str, int]] = field(default_factory=list)


class _Mem:
    """Last writer (module index and position) and latest reads of every element of a scratchpad."""

    def __init__(self, depth: int):
        self.lw_mod = np.full(depth, -1, np.int64)
        self.lw_pos = np.zeros(depth, np.int64)
        # latest read position per module (1-based)
        self.lr_pos = np.zeros((len(Stage), depth), np.int64)


def check_races(program, raise_on_race: bool = True) -> RaceReport:
    """Check ``program`` (a :class:`vta_ext.runtime.Program`); raise :class:`RaceError` on the first
    race (or deadlock) unless ``raise_on_race`` is False. Returns a :class:`RaceReport`."""
    cfg = program.config
    pads = scratchpads(cfg)
    mems = {m: _Mem(pads[m].depth) for m in _CHECKED}
    uop_sram: List[Tuple[int, int, int]] = [(0, 0, 0)] * pads[MemType.UOP].depth
    report = RaceReport()
    insns = program.insns
    # split into segments at FINISH
    segments, cur = [], []
    for insn in insns:
        cur.append(insn)
        if isinstance(insn, FinishInsn):
            segments.append(cur)
            cur = []
    if cur:
        segments.append(cur)
    dram = program.dram
    base = program.dram_base
    tokens = {q: [] for q in TOKEN_QUEUES}   # FIFO of vector clocks
    races: List[str] = []

    def access(mem, idx, write, mod, pos, vc, i):
        m = mems[mem]
        idx = np.asarray(idx, np.int64).ravel()
        if idx.size == 0:
            return
        if idx.min() < 0 or idx.max() >= m.lw_mod.size:
            races.append(f"insn #{i} ({insns_all[i]}): {mem.name} index out of range")
            return
        report.checked_accesses += idx.size
        lw_mod, lw_pos = m.lw_mod[idx], m.lw_pos[idx]
        other = (lw_mod >= 0) & (lw_mod != mod)
        if other.any():
            need = lw_pos[other]
            have = vc[lw_mod[other]]
            bad = need > have
            if bad.any():
                j = int(np.flatnonzero(other)[np.argmax(bad)])
                races.append(f"insn #{i} ({insns_all[i]}) {'writes' if write else 'reads'} "
                             f"{mem.name}[{int(idx[j])}] written by module "
                             f"{_name(int(lw_mod[j]))} at its position {int(lw_pos[j])} without a "
                             "token ordering them")
        if write:
            for r in range(len(Stage)):
                if r == mod:
                    continue
                rp = m.lr_pos[r][idx]
                bad = rp > vc[r]
                if bad.any():
                    j = int(np.argmax(bad))
                    races.append(f"insn #{i} ({insns_all[i]}) overwrites {mem.name}[{int(idx[j])}] "
                                 f"read by module {_name(r)} at its position {int(rp[j])} without "
                                 "a token")
            m.lw_mod[idx] = mod
            m.lw_pos[idx] = pos
            m.lr_pos[:, idx] = 0
        else:
            np.maximum.at(m.lr_pos[mod], idx, pos)

    insns_all = insns
    offset = 0
    for seg in segments:
        n = len(seg)
        queues = [[] for _ in Stage]
        for k, insn in enumerate(seg):
            queues[insn_stage(insn).index].append(k)
        heads = [0] * len(Stage)
        counters = [0] * len(Stage)
        clocks = [np.zeros(len(Stage), np.int64) for _ in Stage]
        done = False
        while not done:
            progress = False
            for stage in Stage:
                mod = stage.index
                side = STAGE_QUEUES[stage]
                pop_p, pop_n, push_p, push_n = side.pop_prev, side.pop_next, side.push_prev, \
                    side.push_next
                while heads[mod] < len(queues[mod]) and not done:
                    k = queues[mod][heads[mod]]
                    insn = seg[k]
                    if (insn.pop_prev_dep and not tokens[pop_p]) or \
                            (insn.pop_next_dep and not tokens[pop_n]):
                        break
                    vc = clocks[mod].copy()
                    if insn.pop_next_dep:
                        vc = np.maximum(vc, tokens[pop_n].pop(0))
                    if insn.pop_prev_dep:
                        vc = np.maximum(vc, tokens[pop_p].pop(0))
                    counters[mod] += 1
                    pos = counters[mod]
                    vc[mod] = pos
                    clocks[mod] = vc
                    i = offset + k
                    _accesses(cfg, insn, mod, pos, vc, i, access, uop_sram, dram, base)
                    if insn.push_prev_dep:
                        tokens[push_p].append(vc.copy())
                    if insn.push_next_dep:
                        tokens[push_n].append(vc.copy())
                    heads[mod] += 1
                    progress = True
                    if isinstance(insn, FinishInsn):
                        done = True
            if not done and not progress:
                blocked = [f"#{offset + queues[m][heads[m]]} ({seg[queues[m][heads[m]]]})"
                           for m in range(len(Stage)) if heads[m] < len(queues[m])]
                msg = f"deadlock: no module can proceed; blocked: {'; '.join(blocked)}"
                if raise_on_race:
                    raise RaceError(msg)
                races.append(msg)
                break
            if races and raise_on_race:
                raise RaceError(races[0])
        report.instructions += n
        report.leftover_tokens.append({q: len(v) for q, v in tokens.items()})
        offset += n
    if races and raise_on_race:
        raise RaceError(races[0])
    return report


def _name(module_index: int) -> str:
    """Name of the module with 0-based index ``module_index`` (load, compute, store)."""
    return list(Stage)[module_index].name.lower()


def _accesses(cfg, insn, mod, pos, vc, i, access, uop_sram, dram, base):
    if isinstance(insn, MemInsn):
        if insn.x_size == 0:
            return
        if insn.opcode == Opcode.STORE:
            n = insn.x_size * insn.y_size
            access(STORE_SOURCE, np.arange(insn.sram_base, insn.sram_base + n), False, mod, pos,
                   vc, i)
            return
        rows = insn.y_pad_0 + insn.y_size + insn.y_pad_1
        cols = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        n = rows * cols
        mem = LOAD_TARGETS[MemType(insn.memory_type)]
        if mem == MemType.UOP:
            entry = cfg.elem_bytes(MemType.UOP)
            start = insn.dram_base * entry - base
            for j, u in enumerate(decode_uops(cfg, bytes(dram[start:start + entry * insn.x_size]))):
                uop_sram[insn.sram_base + j] = (u.dst_idx, u.src_idx, u.wgt_idx)
            return
        access(mem, np.arange(insn.sram_base, insn.sram_base + n), True, mod, pos, vc, i)
        return
    if isinstance(insn, (GemmInsn, AluInsn)):
        uops = np.array(uop_sram[insn.uop_bgn:insn.uop_end], np.int64).reshape(-1, 3)
        y = np.arange(insn.iter_out)[:, None, None]
        x = np.arange(insn.iter_in)[None, :, None]
        dst = uops[None, None, :, 0] + y * insn.dst_factor_out + x * insn.dst_factor_in
        src = uops[None, None, :, 1] + y * insn.src_factor_out + x * insn.src_factor_in
        if isinstance(insn, GemmInsn):
            if not insn.reset_reg:
                wgt = uops[None, None, :, 2] + y * insn.wgt_factor_out + x * insn.wgt_factor_in
                access(MemType.INP, src, False, mod, pos, vc, i)
                access(MemType.WGT, wgt, False, mod, pos, vc, i)
                access(MemType.ACC, dst, False, mod, pos, vc, i)
            access(MemType.ACC, dst, True, mod, pos, vc, i)
        else:
            if not insn.use_imm:
                access(MemType.ACC, src, False, mod, pos, vc, i)
            access(MemType.ACC, dst, False, mod, pos, vc, i)
            access(MemType.ACC, dst, True, mod, pos, vc, i)
