"""Tests of the vectorised functional simulator (``vta_ext.sim``).

Each semantic rule of the apache fsim (facts §3) is checked against a hand computation or numpy;
the whole simulator is cross-checked against a deliberately naive scalar interpreter, written here
from the facts and independent of the simulator's code (it decodes with ``vta_ext.isa`` and loops
over every execution and lane), on random, correctly synchronised programs.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import pytest

from vta_ext.config import VTAConfig, load_config
from vta_ext.isa import (AluInsn, AluOp, FinishInsn, GemmInsn, Insn, MemInsn, MemType, Opcode, Uop,
                         clip_imm, decode_stream, encode_stream)
from vta_ext.sim import COUNTER_NAMES, FunctionalSimulator, SimStats, SimulationError, run_binary

CFG = load_config("default")
BASE = 0x1000          # physical address of dram[0]
INSN_OFF = 0x10000     # byte offset of the instruction stream in the image
IMAGE_BYTES = 0x20000


def wrap32(v: int) -> int:
    return ((int(v) + (1 << 31)) % (1 << 32)) - (1 << 31)


def wrap8(v: int) -> int:
    return ((int(v) + 128) % 256) - 128


def module(insn: Insn) -> str:
    if insn.opcode == Opcode.STORE:
        return "store"
    if insn.opcode == Opcode.LOAD and insn.memory_type in (MemType.INP, MemType.WGT):
        return "load"
    return "compute"


def finish_stream(insns: Sequence[Insn]) -> List[Insn]:
    """Append the runtime's closing handshake and FINISH.

    FINISH ends a run, so (as the runtime's synchronize does) the last load-module and the last
    store-module instruction push a token that a compute NOP pops before FINISH.
    """
    insns = list(insns)
    nop = MemInsn(memory_type=MemType.UOP)
    for insn in reversed(insns):
        if module(insn) == "load":
            insn.push_next_dep = nop.pop_prev_dep = True
            break
    for insn in reversed(insns):
        if module(insn) == "store":
            insn.push_prev_dep = nop.pop_next_dep = True
            break
    return insns + [nop, FinishInsn()]


def image() -> np.ndarray:
    return np.zeros(IMAGE_BYTES, np.uint8)


def put(dram: np.ndarray, offset: int, array: np.ndarray) -> None:
    data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
    dram[offset:offset + data.size] = data


def run(sim: FunctionalSimulator, dram: np.ndarray, insns: Sequence[Insn],
        cfg: VTAConfig = CFG) -> SimStats:
    stream = encode_stream(cfg, insns)
    dram[INSN_OFF:INSN_OFF + len(stream)] = np.frombuffer(stream, np.uint8)
    return sim.run(dram, BASE, BASE + INSN_OFF, len(insns))


def dram_base(offset: int, mem: int, cfg: VTAConfig = CFG) -> int:
    """The ``dram_base`` field addressing image byte ``offset`` for memory type ``mem``."""
    elem = cfg.elem_bytes(mem)
    assert (BASE + offset) % elem == 0
    return (BASE + offset) // elem


def load(mem: int, sram: int, offset: int, y: int, x: int, stride: Optional[int] = None,
         pads=(0, 0, 0, 0), pad_min: bool = False, cfg: VTAConfig = CFG, **flags) -> MemInsn:
    return MemInsn(opcode=Opcode.LOAD, memory_type=mem, sram_base=sram,
                   dram_base=dram_base(offset, mem, cfg), y_size=y, x_size=x,
                   x_stride=x if stride is None else stride, y_pad_0=pads[0], y_pad_1=pads[1],
                   x_pad_0=pads[2], x_pad_1=pads[3], pad_min=pad_min, **flags)


def store(sram: int, offset: int, y: int, x: int, stride: Optional[int] = None,
          cfg: VTAConfig = CFG, **flags) -> MemInsn:
    return MemInsn(opcode=Opcode.STORE, memory_type=MemType.OUT, sram_base=sram,
                   dram_base=dram_base(offset, MemType.OUT, cfg), y_size=y, x_size=x,
                   x_stride=x if stride is None else stride, **flags)


def uop_words(uops: Sequence[Uop], cfg: VTAConfig = CFG) -> np.ndarray:
    return np.frombuffer(b"".join(u.encode(cfg) for u in uops), np.uint8)


UOP_OFF = 0x8000


def with_uops(dram: np.ndarray, uops: Sequence[Uop], sram: int = 0,
              cfg: VTAConfig = CFG) -> MemInsn:
    """Write ``uops`` into the image and return the LOAD UOP that brings them on chip."""
    put(dram, UOP_OFF + 4 * sram, uop_words(uops, cfg))
    return load(MemType.UOP, sram, UOP_OFF + 4 * sram, 1, len(uops), cfg=cfg)


def acc_values(sim: FunctionalSimulator) -> np.ndarray:
    return sim.sram("acc").reshape(sim.config.acc_depth, -1)


def set_acc(sim: FunctionalSimulator, dram: np.ndarray, rows: np.ndarray, sram: int = 0,
            offset: int = 0x4000) -> None:
    """Load int32 rows (n, BATCH*BLOCK_OUT) into the accumulators through a LOAD ACC program."""
    rows = np.asarray(rows, np.int32)
    put(dram, offset, rows)
    run(sim, dram, finish_stream([load(MemType.ACC, sram, offset, 1, rows.shape[0])]))


# ====================================================================== scalar reference
class ScalarReference:
    """A naive, obviously sequential interpreter of the fsim semantics (facts §3).

    Instructions run in stream order; this equals the simulator's queue order for the correctly
    synchronised programs it is used with.
    """

    def __init__(self, cfg: VTAConfig) -> None:
        self.cfg = cfg
        self.inp = np.zeros((cfg.inp_depth, cfg.BATCH * cfg.BLOCK_IN), np.int64)
        self.wgt = np.zeros((cfg.wgt_depth, cfg.BLOCK_OUT * cfg.BLOCK_IN), np.int64)
        self.acc = np.zeros((cfg.acc_depth, cfg.BATCH * cfg.BLOCK_OUT), np.int64)
        self.uop = [Uop() for _ in range(cfg.uop_depth)]
        self.stats = {name: 0 for name in COUNTER_NAMES}

    def lanes(self, mem: int, raw: bytes) -> list:
        if mem in (MemType.INP, MemType.WGT, MemType.ACC_8BIT):
            return [b - 256 if b >= 128 else b for b in raw]
        if mem == MemType.ACC:
            return [int.from_bytes(raw[k:k + 4], "little", signed=True)
                    for k in range(0, len(raw), 4)]
        return [Uop.decode(self.cfg, raw)]

    def run(self, dram: np.ndarray, base: int, insns: Sequence[Insn]) -> None:
        for insn in insns:
            if insn.opcode == Opcode.LOAD and insn.x_size:
                self.load(dram, base, insn)
            elif insn.opcode == Opcode.STORE and insn.x_size:
                self.store(dram, base, insn)
            elif insn.opcode == Opcode.GEMM:
                self.gemm(insn)
            elif insn.opcode == Opcode.ALU:
                self.alu(insn)
            elif insn.opcode == Opcode.FINISH:
                return

    def load(self, dram, base, insn: MemInsn) -> None:
        cfg, mem = self.cfg, insn.memory_type
        elem = cfg.elem_bytes(mem)
        counted = cfg.acc_elem_bytes if mem == MemType.ACC_8BIT else elem
        key = {MemType.INP: "inp", MemType.WGT: "wgt", MemType.ACC: "acc", MemType.ACC_8BIT: "acc",
               MemType.UOP: "uop"}[mem]
        self.stats[f"{key}_load_nbytes"] += insn.x_size * insn.y_size * counted
        target = {"inp": self.inp, "wgt": self.wgt, "acc": self.acc, "uop": self.uop}[key]
        if mem == MemType.UOP:
            pad = Uop.decode(cfg, (0x80000000 if insn.pad_min else 0).to_bytes(4, "little"))
        elif mem in (MemType.ACC, MemType.ACC_8BIT):
            pad = -(1 << 31) if insn.pad_min else 0
        else:
            pad = -128 if insn.pad_min else 0
        x_total = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        y_total = insn.y_pad_0 + insn.y_size + insn.y_pad_1
        for yy in range(y_total):
            for xx in range(x_total):
                index = insn.sram_base + yy * x_total + xx
                y, x = yy - insn.y_pad_0, xx - insn.x_pad_0
                if 0 <= y < insn.y_size and 0 <= x < insn.x_size:
                    addr = (insn.dram_base + y * insn.x_stride + x) * elem - base
                    value = self.lanes(mem, bytes(dram[addr:addr + elem]))
                else:
                    value = pad if mem == MemType.UOP else [pad] * target.shape[1]
                if mem == MemType.UOP:
                    target[index] = value[0] if isinstance(value, list) else value
                else:
                    target[index] = value

    def store(self, dram, base, insn: MemInsn) -> None:
        lanes = self.acc.shape[1]
        self.stats["out_store_nbytes"] += insn.x_size * insn.y_size * lanes
        for y in range(insn.y_size):
            for x in range(insn.x_size):
                row = self.acc[insn.sram_base + y * insn.x_size + x]
                addr = (insn.dram_base + y * insn.x_stride + x) * lanes - base
                dram[addr:addr + lanes] = [wrap8(v) & 0xFF for v in row]

    def executions(self, insn):
        for y in range(insn.iter_out):
            for x in range(insn.iter_in):
                for u in range(insn.uop_bgn, insn.uop_end):
                    yield y, x, self.uop[u]

    def gemm(self, insn: GemmInsn) -> None:
        cfg = self.cfg
        if not insn.reset_reg:
            n_uop = insn.uop_end - insn.uop_bgn
            self.stats["gemm_counter"] += insn.iter_out * insn.iter_in * n_uop
        for y, x, uop in self.executions(insn):
            a = uop.dst_idx + y * insn.dst_factor_out + x * insn.dst_factor_in
            if insn.reset_reg:
                self.acc[a] = 0
                continue
            i = uop.src_idx + y * insn.src_factor_out + x * insn.src_factor_in
            w = uop.wgt_idx + y * insn.wgt_factor_out + x * insn.wgt_factor_in
            inp = self.inp[i].reshape(cfg.BATCH, cfg.BLOCK_IN)
            wgt = self.wgt[w].reshape(cfg.BLOCK_OUT, cfg.BLOCK_IN)
            for b in range(cfg.BATCH):
                for j in range(cfg.BLOCK_OUT):
                    lane = b * cfg.BLOCK_OUT + j
                    total = int(self.acc[a][lane]) + int(np.dot(inp[b], wgt[j]))
                    self.acc[a][lane] = wrap32(total)

    @staticmethod
    def alu_op(op: int, a: int, b: int, imm: int) -> int:
        if op == AluOp.MIN:
            return min(a, b)
        if op == AluOp.MAX:
            return max(a, b)
        if op == AluOp.ADD:
            return wrap32(a + b)
        if op == AluOp.MUL:
            return wrap32(a * b)
        if op == AluOp.SHR:
            return a >> (b & 31) if b >= 0 else wrap32(a << ((-b) & 31))
        if op == AluOp.CLIP:
            lo, hi = wrap8(imm & 0xFF), wrap8((imm >> 8) & 0xFF)
            return max(min(a, hi), lo)
        raise AssertionError(op)

    def alu(self, insn: AluInsn) -> None:
        self.stats["alu_counter"] += insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
        for y, x, uop in self.executions(insn):
            d = uop.dst_idx + y * insn.dst_factor_out + x * insn.dst_factor_in
            s = uop.src_idx + y * insn.src_factor_out + x * insn.src_factor_in
            for lane in range(self.acc.shape[1]):
                b = insn.imm if insn.use_imm else int(self.acc[s][lane])
                self.acc[d][lane] = self.alu_op(insn.alu_opcode, int(self.acc[d][lane]), b,
                                                insn.imm)


# ====================================================================== random programs
class ProgramGenerator:
    """Random, correctly synchronised programs in rounds of load / compute / store phases.

    Round r: load phase (INP/WGT loads; the first pops g2l if r > 0, the last pushes l2g), compute
    phase (UOP/ACC/ACC_8BIT loads, GEMM, ALU; the first pops l2g and, if r > 0, s2g; the last
    pushes g2s and, if another round follows, g2l), store phase (the first pops g2s, the last
    pushes s2g). A compute NOP popping s2g and FINISH close the program. Any schedule the tokens
    allow therefore gives the stream-order result.
    """

    DATA_OFF, OUT_OFF, UOP_AREA = 0x0000, 0xC000, 0x8000

    def __init__(self, cfg: VTAConfig, rng: np.random.Generator) -> None:
        self.cfg, self.rng = cfg, rng
        self.dram = image()
        self.dram[self.DATA_OFF:self.DATA_OFF + 0x8000] = rng.integers(0, 256, 0x8000,
                                                                       dtype=np.uint8)
        # accumulators: keep ACC data moderate so that GEMM/ALU wrap only sometimes
        self.uop_cursor = 0

    def r(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def mem_load(self, mem: int) -> MemInsn:
        cfg = self.cfg
        elem = cfg.elem_bytes(mem)
        y, x = self.r(1, 3), self.r(1, 4)
        stride = x + self.r(-1, 2) if x > 1 else x + self.r(0, 2)
        pads = tuple(self.r(0, 2) if self.rng.random() < 0.5 else 0 for _ in range(4))
        rows = (pads[0] + y + pads[1]) * (pads[2] + x + pads[3])
        depth = {MemType.INP: 64, MemType.WGT: 48, MemType.ACC: 64, MemType.ACC_8BIT: 64}[mem]
        sram = self.r(0, depth - rows)
        span = ((y - 1) * stride + x) * elem
        first = (self.DATA_OFF + BASE + elem - 1) // elem * elem - BASE
        offset = first + elem * self.r(0, (0x8000 - span - (first - self.DATA_OFF)) // elem)
        return load(mem, sram, offset, y, x, stride, pads, pad_min=self.rng.random() < 0.3, cfg=cfg)

    def uop_load(self) -> MemInsn:
        cfg = self.cfg
        n = self.r(1, 6)
        uops = [Uop(self.r(0, 40), self.r(0, 40), self.r(0, 30)) for _ in range(n)]
        start = self.r(0, 8)
        put(self.dram, self.UOP_AREA + 4 * self.uop_cursor, uop_words(uops, cfg))
        insn = load(MemType.UOP, start, self.UOP_AREA + 4 * self.uop_cursor, 1, n, cfg=cfg)
        self.uop_cursor += n
        return insn

    def loops(self, insn):
        insn.uop_bgn = self.r(0, 10)
        insn.uop_end = insn.uop_bgn + self.r(0, 4)
        insn.iter_out, insn.iter_in = self.r(1, 3), self.r(1, 3)
        for name in ("dst_factor_out", "dst_factor_in", "src_factor_out", "src_factor_in"):
            setattr(insn, name, self.r(0, 4) if self.rng.random() < 0.7 else 0)
        return insn

    def gemm(self) -> GemmInsn:
        insn = self.loops(GemmInsn(reset_reg=self.rng.random() < 0.2))
        insn.wgt_factor_out = self.r(0, 3) if self.rng.random() < 0.6 else 0
        insn.wgt_factor_in = self.r(0, 3) if self.rng.random() < 0.6 else 0
        return insn

    def alu(self) -> AluInsn:
        op = int(self.rng.choice([AluOp.MIN, AluOp.MAX, AluOp.ADD, AluOp.SHR, AluOp.MUL,
                                  AluOp.CLIP]))
        use_imm = op == AluOp.CLIP or self.rng.random() < 0.5
        if op == AluOp.CLIP:
            lo, hi = sorted((self.r(-128, 127), self.r(-128, 127)))
            imm = clip_imm(lo, hi)
        elif op == AluOp.SHR:
            imm = self.r(-12, 12)
        else:
            imm = self.r(-(1 << 15), (1 << 15) - 1)
        return self.loops(AluInsn(alu_opcode=op, use_imm=use_imm, imm=imm))

    def store(self) -> MemInsn:
        y, x = self.r(1, 3), self.r(1, 4)
        stride = max(1, x + self.r(-1, 2))
        offset = self.OUT_OFF + self.cfg.out_elem_bytes * self.r(0, 64)
        return store(self.r(0, 60), offset, y, x, stride, cfg=self.cfg)

    def program(self, rounds: int) -> List[Insn]:
        insns: List[Insn] = []
        for rnd in range(rounds):
            last = rnd == rounds - 1
            phase = [self.mem_load(int(self.rng.choice([MemType.INP, MemType.WGT])))
                     for _ in range(self.r(0, 3))] or [MemInsn(memory_type=MemType.INP)]
            phase[0].pop_next_dep = rnd > 0
            phase[-1].push_next_dep = True
            insns += phase
            phase = []
            for _ in range(self.r(1, 6)):
                kind = self.rng.random()
                if kind < 0.25:
                    phase.append(self.uop_load())
                elif kind < 0.4:
                    mem = int(self.rng.choice([MemType.ACC, MemType.ACC_8BIT]))
                    phase.append(self.mem_load(mem))
                elif kind < 0.7:
                    phase.append(self.gemm())
                else:
                    phase.append(self.alu())
            phase[0].pop_prev_dep = True
            phase[0].pop_next_dep = rnd > 0
            phase[-1].push_next_dep = True
            phase[-1].push_prev_dep = not last
            insns += phase
            phase = [self.store() for _ in range(self.r(0, 2))] or [
                MemInsn(opcode=Opcode.STORE, memory_type=MemType.UOP)]
            phase[0].pop_prev_dep = True
            phase[-1].push_prev_dep = True
            insns += phase
        insns.append(MemInsn(memory_type=MemType.UOP, pop_next_dep=True))
        insns.append(FinishInsn())
        return insns


SMALL_BATCH_CFG = VTAConfig.from_dict({"LOG_BATCH": 1, "LOG_BLOCK_IN": 3, "LOG_BLOCK_OUT": 2,
                                       "LOG_INP_BUFF_SIZE": 12, "LOG_WGT_BUFF_SIZE": 12,
                                       "LOG_ACC_BUFF_SIZE": 12, "LOG_UOP_BUFF_SIZE": 10},
                                      name="small-batch")


@pytest.mark.parametrize("cfg", [CFG, SMALL_BATCH_CFG, load_config("2x16x16"),
                                 load_config("1x32x32")], ids=lambda c: c.name)
@pytest.mark.parametrize("seed", [0, 1, *(pytest.param(s, marks=pytest.mark.slow) for s in range(2, 8))])
def test_fast_path_matches_scalar_reference(cfg: VTAConfig, seed: int) -> None:
    gen = ProgramGenerator(cfg, np.random.default_rng(seed))
    insns = gen.program(rounds=3)
    stream = encode_stream(cfg, insns)
    dram = gen.dram
    dram[INSN_OFF:INSN_OFF + len(stream)] = np.frombuffer(stream, np.uint8)
    ref_dram = dram.copy()
    ref = ScalarReference(cfg)
    ref.run(ref_dram, BASE, decode_stream(cfg, stream))

    sim = FunctionalSimulator(cfg)
    stats = sim.run(dram, BASE, BASE + INSN_OFF, len(insns))

    assert stats.as_dict() == ref.stats
    np.testing.assert_array_equal(dram, ref_dram)
    np.testing.assert_array_equal(acc_values(sim), ref.acc)
    np.testing.assert_array_equal(sim.sram("inp").reshape(cfg.inp_depth, -1), ref.inp)
    np.testing.assert_array_equal(sim.sram("wgt").reshape(cfg.wgt_depth, -1), ref.wgt)
    ref_uops = np.array([int.from_bytes(u.encode(cfg), "little") for u in ref.uop], np.uint32)
    np.testing.assert_array_equal(sim.sram("uop"), ref_uops)


def test_random_programs_exercise_every_feature() -> None:
    """Guard against a generator that silently stops covering cases."""
    seen = set()
    for seed in range(12):
        for insn in ProgramGenerator(CFG, np.random.default_rng(seed)).program(rounds=3):
            if isinstance(insn, MemInsn) and insn.x_size:
                seen.add((Opcode(insn.opcode).name, MemType(insn.memory_type).name))
                if insn.pad_min and (insn.x_pad_0 or insn.y_pad_1):
                    seen.add("pad_min")
                if insn.x_stride < insn.x_size and insn.y_size > 1:
                    seen.add("overlapping rows")
            elif isinstance(insn, AluInsn):
                seen.add((AluOp(insn.alu_opcode).name, insn.use_imm))
            elif isinstance(insn, GemmInsn):
                seen.add(("GEMM", insn.reset_reg))
    for item in [("LOAD", m) for m in ("INP", "WGT", "ACC", "ACC_8BIT", "UOP")] + [
            ("STORE", "OUT"), ("GEMM", True), ("GEMM", False), "pad_min", "overlapping rows",
            ("CLIP", True)] + [(op, imm) for op in ("MIN", "MAX", "ADD", "SHR", "MUL")
                               for imm in (True, False)]:
        assert item in seen, item


# ====================================================================== LOAD
@pytest.mark.parametrize("pad_min", [False, True])
def test_load_inp_padding_on_every_side(pad_min: bool) -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    data = np.arange(2 * 5 * 16, dtype=np.int64).reshape(2, 5, 16) % 251 - 125
    put(dram, 0x100, data.astype(np.int8))
    # rows 0,1 of a 5-element-wide matrix, 3 elements each, starting at element 1
    insn = load(MemType.INP, 7, 0x100 + 16, 2, 3, stride=5, pads=(1, 2, 2, 1), pad_min=pad_min)
    stats = run(sim, dram, finish_stream([insn]))
    pad = -128 if pad_min else 0
    expected = np.full((5, 6, 16), pad, np.int64)
    expected[1:3, 2:5] = data[:, 1:4]
    got = sim.sram("inp")[7:7 + 30].reshape(5, 6, 16)
    np.testing.assert_array_equal(got, expected)
    assert stats.inp_load_nbytes == 2 * 3 * 16  # padding not counted
    assert (sim.sram("inp")[37:] == 0).all() and (sim.sram("inp")[:7] == 0).all()


def test_load_wgt_pad_min_and_lane_order() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    w = np.random.default_rng(1).integers(-128, 128, (2, 16, 16), dtype=np.int8)
    put(dram, 0x200, w)
    run(sim, dram, finish_stream([load(MemType.WGT, 0, 0x200, 1, 2, pads=(0, 0, 1, 0),
                                       pad_min=True)]))
    got = sim.sram("wgt")
    assert (got[0] == -128).all()
    np.testing.assert_array_equal(got[1:3], w)  # element = [BLOCK_OUT][BLOCK_IN]


@pytest.mark.parametrize("mem", [MemType.ACC, MemType.ACC_8BIT])
def test_load_acc_pad_min_is_int32_min(mem: int) -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    run(sim, dram, finish_stream([load(mem, 3, 0x400, 1, 1, pads=(1, 1, 1, 1), pad_min=True)]))
    block = acc_values(sim)[3:12].reshape(3, 3, 16)
    assert (block[1, 1] == 0).all()
    mask = np.ones((3, 3), bool)
    mask[1, 1] = False
    assert (block[mask] == np.iinfo(np.int32).min).all()


def test_load_acc_8bit_sign_extends_with_16_byte_elements() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    values = np.arange(-128, 128, dtype=np.int64).astype(np.int8).reshape(16, 16)
    put(dram, 0x800, values)
    assert CFG.elem_bytes(MemType.ACC_8BIT) == 16
    # 2 rows of 3 elements, DRAM row stride 5 elements of 16 bytes
    insn = load(MemType.ACC_8BIT, 10, 0x800, 2, 3, stride=5, pads=(0, 0, 0, 1))
    stats = run(sim, dram, finish_stream([insn]))
    got = acc_values(sim)[10:18].reshape(2, 4, 16)
    np.testing.assert_array_equal(got[0, :3], values[0:3].astype(np.int32))
    np.testing.assert_array_equal(got[1, :3], values[5:8].astype(np.int32))
    assert (got[:, 3] == 0).all()
    assert stats.acc_load_nbytes == 2 * 3 * CFG.acc_elem_bytes  # 64 per element, not 16
    assert stats.as_dict() == {**SimStats().as_dict(), "acc_load_nbytes": 384}


def test_load_acc_little_endian_int32() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    rows = np.array([[(1 << 31) - 1, -(1 << 31), -1, 123456789] * 4], np.int32)
    set_acc(sim, dram, rows, sram=5)
    np.testing.assert_array_equal(acc_values(sim)[5], rows[0])


def test_load_with_zero_x_size_is_a_nop_even_for_unknown_types() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    nop = MemInsn(opcode=Opcode.LOAD, memory_type=MemType.ACC, y_size=3, x_size=0, sram_base=9)
    stats = run(sim, dram, finish_stream([nop]))
    assert stats == SimStats()


def test_load_y_size_zero_writes_only_padding() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    set_acc(sim, dram, np.full((4, 16), 7))
    run(sim, dram, finish_stream([load(MemType.ACC, 0, 0, 0, 1, pads=(2, 0, 0, 0))]))
    acc = acc_values(sim)
    assert (acc[:2] == 0).all() and (acc[2:4] == 7).all()


# ====================================================================== STORE
def test_store_truncates_to_int8_with_dram_stride() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    values = np.array([300, -129, 127, -128, 128, 255, 256, -1, 1 << 30, -(1 << 31), 44, 0,
                       65535, -32768, 99, -99], np.int32)
    rows = np.stack([values + k for k in range(4)])
    set_acc(sim, dram, rows)
    stats = run(sim, dram, finish_stream([store(0, 0x1000, 2, 2, stride=3)]))
    out = dram[0x1000:0x1000 + 6 * 16].view(np.int8).reshape(2, 3, 16)
    expected = rows.astype(np.int64)
    expected = ((expected + 128) % 256 - 128).astype(np.int8)
    np.testing.assert_array_equal(out[0, :2], expected[0:2])
    np.testing.assert_array_equal(out[1, :2], expected[2:4])
    assert (out[:, 2] == 0).all()  # the stride gap is untouched
    assert out[0, 0, 0] == 44 and out[0, 0, 1] == 127
    assert stats.out_store_nbytes == 4 * 16


@pytest.mark.parametrize("mem", [MemType.ACC, MemType.UOP, MemType.INP])
def test_store_of_non_out_memory_type_is_an_error(mem: int) -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    bad = MemInsn(opcode=Opcode.STORE, memory_type=mem, y_size=1, x_size=1, x_stride=1,
                  dram_base=dram_base(0x1000, MemType.OUT))
    with pytest.raises(SimulationError, match=r"#0 .*STORE.*OUT only"):
        run(sim, dram, finish_stream([bad]))


def test_store_with_padding_is_an_error() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    bad = store(0, 0x1000, 1, 1)
    bad.x_pad_1 = 1
    with pytest.raises(SimulationError, match="padding"):
        run(sim, dram, finish_stream([bad]))


# ====================================================================== GEMM
def gemm_setup(rng, n_inp=8, n_wgt=4, n_acc=8):
    sim, dram = FunctionalSimulator(CFG), image()
    inp = rng.integers(-128, 128, (n_inp, 16), dtype=np.int8)
    wgt = rng.integers(-128, 128, (n_wgt, 16, 16), dtype=np.int8)
    acc0 = rng.integers(-(1 << 31), 1 << 31, (n_acc, 16), dtype=np.int64).astype(np.int32)
    put(dram, 0x0, inp)
    put(dram, 0x1000, wgt)
    set_acc(sim, dram, acc0, offset=0x6000)
    run(sim, dram, finish_stream([load(MemType.INP, 0, 0x0, 1, n_inp),
                                  load(MemType.WGT, 0, 0x1000, 1, n_wgt)]))
    return sim, dram, inp.astype(np.int64), wgt.astype(np.int64), acc0.astype(np.int64)


def test_gemm_affine_loops_and_wrapping() -> None:
    rng = np.random.default_rng(7)
    sim, dram, inp, wgt, acc0 = gemm_setup(rng)
    uops = [Uop(0, 1, 0), Uop(1, 0, 2)]
    gemm = GemmInsn(uop_bgn=0, uop_end=2, iter_out=2, iter_in=3, dst_factor_out=4,
                    dst_factor_in=1, src_factor_out=2, src_factor_in=1, wgt_factor_out=1,
                    wgt_factor_in=0)
    stats = run(sim, dram, finish_stream([with_uops(dram, uops), gemm]))
    expected = acc0.copy()
    for y in range(2):
        for x in range(3):
            for u in uops:
                a = u.dst_idx + 4 * y + x
                i = u.src_idx + 2 * y + x
                w = u.wgt_idx + y
                expected[a] += wgt[w] @ inp[i]
    expected = (expected + (1 << 31)) % (1 << 32) - (1 << 31)
    np.testing.assert_array_equal(acc_values(sim)[:8], expected)
    assert stats.gemm_counter == 2 * 3 * 2
    assert stats.uop_load_nbytes == 2 * 4


def test_gemm_reduction_over_all_axes_with_repeated_accumulator() -> None:
    """Every execution adds into the same accumulator (K over both loops and the uops)."""
    rng = np.random.default_rng(8)
    sim, dram, inp, wgt, acc0 = gemm_setup(rng)
    uops = [Uop(2, k, k % 4) for k in range(4)]
    gemm = GemmInsn(uop_bgn=0, uop_end=4, iter_out=3, iter_in=2, src_factor_out=1,
                    src_factor_in=2, wgt_factor_in=0, wgt_factor_out=0)
    run(sim, dram, finish_stream([with_uops(dram, uops), gemm]))
    total = acc0[2].copy()
    for y in range(3):
        for x in range(2):
            for k in range(4):
                total += wgt[k % 4] @ inp[k + y + 2 * x]
    assert (acc_values(sim)[2] == (total + (1 << 31)) % (1 << 32) - (1 << 31)).all()


def test_gemm_reset_zeroes_and_is_not_counted() -> None:
    rng = np.random.default_rng(9)
    sim, dram, _, _, acc0 = gemm_setup(rng)
    reset = GemmInsn(reset_reg=True, uop_bgn=0, uop_end=1, iter_out=2, iter_in=1,
                     dst_factor_out=3)
    stats = run(sim, dram, finish_stream([with_uops(dram, [Uop(1, 0, 0)]), reset]))
    acc = acc_values(sim)
    assert (acc[[1, 4]] == 0).all()
    np.testing.assert_array_equal(acc[[0, 2, 3, 5]], acc0[[0, 2, 3, 5]])
    assert stats.gemm_counter == 0


def test_gemm_exact_at_int8_extremes() -> None:
    """Sums beyond 2^24 stay exact: 95 blocks of -128 x -128 (2^18 per block) plus a 1 x 1."""
    sim, dram = FunctionalSimulator(CFG), image()
    inp = np.full((96, 16), -128, np.int8)
    inp[95] = 0
    inp[95, 0] = 1
    wgt = np.full((96, 16, 16), -128, np.int8)
    wgt[95] = 1
    put(dram, 0x0, inp)
    put(dram, 0x9000, wgt)
    reset = GemmInsn(reset_reg=True, uop_bgn=0, uop_end=1)
    gemm = GemmInsn(uop_bgn=0, uop_end=1, iter_out=1, iter_in=96, src_factor_in=1,
                    wgt_factor_in=1)
    run(sim, dram, finish_stream([load(MemType.INP, 0, 0x0, 1, 96),
                                  load(MemType.WGT, 0, 0x9000, 1, 96),
                                  with_uops(dram, [Uop(0, 0, 0)]), reset, gemm, gemm]))
    # 2 GEMMs x (95 blocks x 16 lanes x 2^14 + 1): odd and above 2^24, not a float32 value
    assert (acc_values(sim)[0] == 2 * (95 * 16 * 16384 + 1)).all()


def test_gemm_and_alu_use_micro_op_fields_at_full_width() -> None:
    rng = np.random.default_rng(11)
    sim, dram = FunctionalSimulator(CFG), image()
    top_inp, top_wgt, top_acc = CFG.inp_depth - 1, CFG.wgt_depth - 1, CFG.acc_depth - 1
    inp = rng.integers(-128, 128, (1, 16), dtype=np.int8)
    wgt = rng.integers(-128, 128, (1, 16, 16), dtype=np.int8)
    put(dram, 0x0, inp)
    put(dram, 0x1000, wgt)
    run(sim, dram, finish_stream([
        load(MemType.INP, top_inp, 0x0, 1, 1), load(MemType.WGT, top_wgt, 0x1000, 1, 1),
        with_uops(dram, [Uop(top_acc, top_inp, top_wgt), Uop(top_acc - 1, top_acc, 0)]),
        GemmInsn(uop_bgn=0, uop_end=1),
        AluInsn(alu_opcode=AluOp.ADD, uop_bgn=1, uop_end=2)]))
    product = wgt[0].astype(np.int64) @ inp[0].astype(np.int64)
    np.testing.assert_array_equal(acc_values(sim)[top_acc], product)
    np.testing.assert_array_equal(acc_values(sim)[top_acc - 1], product)


# ====================================================================== ALU
def alu_program(dram, op, use_imm, imm, uops, **loops):
    insn = AluInsn(alu_opcode=op, use_imm=use_imm, imm=imm, uop_bgn=0, uop_end=len(uops),
                   **loops)
    return finish_stream([with_uops(dram, uops), insn])


A_VALUES = np.array([0, 1, -1, 7, -7, 100, -100, 1 << 30, -(1 << 30), (1 << 31) - 1, -(1 << 31),
                     12345, -54321, 255, -256, 3], np.int32)
B_VALUES = np.array([5, -5, 3, -3, 31, -31, 2, 0, 1, -1, 2, 16, -16, 8, -8, 40], np.int32)


def expected_alu(op: int, a: np.ndarray, b: np.ndarray, imm: int = 0) -> np.ndarray:
    return np.array([ScalarReference.alu_op(op, int(x), int(y), imm) for x, y in zip(a, b)])


@pytest.mark.parametrize("op", [AluOp.MIN, AluOp.MAX, AluOp.ADD, AluOp.SHR, AluOp.MUL])
def test_alu_vector_ops(op: int) -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    set_acc(sim, dram, np.stack([A_VALUES, B_VALUES]))
    stats = run(sim, dram, alu_program(dram, op, False, 0, [Uop(0, 1)]))
    np.testing.assert_array_equal(acc_values(sim)[0], expected_alu(op, A_VALUES, B_VALUES))
    np.testing.assert_array_equal(acc_values(sim)[1], B_VALUES)
    assert stats.alu_counter == 1


def test_alu_ops_against_hand_values() -> None:
    """Independent spot values for the rules (not computed by the reference helper)."""
    cases = {
        AluOp.ADD: ((1 << 31) - 1, 1, -(1 << 31)),
        AluOp.MUL: (1 << 20, 1 << 12, 0),
        AluOp.SHR: (-7, 1, -4),        # arithmetic shift rounds towards -inf
        AluOp.MIN: (-3, 2, -3),
        AluOp.MAX: (-3, 2, 2),
    }
    for op, (a, imm, result) in cases.items():
        sim, dram = FunctionalSimulator(CFG), image()
        set_acc(sim, dram, np.full((1, 16), a))
        run(sim, dram, alu_program(dram, op, True, imm, [Uop(0, 0)]))
        assert (acc_values(sim)[0] == result).all(), op
    sim, dram = FunctionalSimulator(CFG), image()
    set_acc(sim, dram, np.full((1, 16), 3))
    run(sim, dram, alu_program(dram, AluOp.SHR, True, -4, [Uop(0, 0)]))  # shift left by 4
    assert (acc_values(sim)[0] == 48).all()
    run(sim, dram, alu_program(dram, AluOp.SHR, True, -28, [Uop(0, 0)]))  # 48 << 28 wraps
    assert (acc_values(sim)[0] == 0).all()


@pytest.mark.parametrize("op", [AluOp.MIN, AluOp.MAX, AluOp.ADD, AluOp.SHR, AluOp.MUL])
@pytest.mark.parametrize("imm", [-32768, -9, -1, 0, 3, 32767])
def test_alu_immediate_is_sign_extended_and_uses_dst(op: int, imm: int) -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    set_acc(sim, dram, np.stack([A_VALUES, B_VALUES]))
    # src index 1 must be ignored with use_imm: dst = f(dst, imm)
    run(sim, dram, alu_program(dram, op, True, imm, [Uop(0, 1)]))
    np.testing.assert_array_equal(acc_values(sim)[0],
                                  expected_alu(op, A_VALUES, np.full(16, imm)))
    np.testing.assert_array_equal(acc_values(sim)[1], B_VALUES)


@pytest.mark.parametrize("lo,hi", [(0, 127), (-128, 127), (5, 5), (-128, -128), (127, 127),
                                   (-3, 4)])
def test_alu_clip_bounds(lo: int, hi: int) -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    values = np.array([-(1 << 31), -129, -128, -127, -4, -3, -1, 0, 1, 4, 5, 6, 126, 127, 128,
                       (1 << 31) - 1], np.int32)
    set_acc(sim, dram, values[None])
    run(sim, dram, alu_program(dram, AluOp.CLIP, True, clip_imm(lo, hi), [Uop(0, 0)]))
    np.testing.assert_array_equal(acc_values(sim)[0], np.clip(values, lo, hi))


def test_alu_clip_without_immediate_is_an_error() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    with pytest.raises(SimulationError, match="CLIP.*use_imm"):
        run(sim, dram, alu_program(dram, AluOp.CLIP, False, 0, [Uop(0, 0)]))


@pytest.mark.parametrize("opcode", [6, 7])
def test_alu_unknown_opcode_is_an_error(opcode: int) -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    prog = alu_program(dram, opcode, True, 1, [Uop(0, 0)])
    with pytest.raises(SimulationError, match=f"#1 .*unknown ALU opcode {opcode}"):
        run(sim, dram, prog)


def test_alu_affine_loops_and_counter() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    rows = np.arange(48 * 16, dtype=np.int32).reshape(48, 16) - 200
    set_acc(sim, dram, rows)
    insn_loops = dict(iter_out=2, iter_in=3, dst_factor_out=6, dst_factor_in=2,
                      src_factor_out=1, src_factor_in=8)
    stats = run(sim, dram, alu_program(dram, AluOp.ADD, False, 0, [Uop(0, 20), Uop(1, 21)],
                                       **insn_loops))
    expected = rows.astype(np.int64).copy()
    for y in range(2):
        for x in range(3):
            for d, s in ((0, 20), (1, 21)):
                expected[d + 6 * y + 2 * x] += expected[s + y + 8 * x]
    np.testing.assert_array_equal(acc_values(sim)[:48], expected)
    assert stats.alu_counter == 12


def test_alu_sequential_semantics_on_overlapping_indices() -> None:
    """Executions that read results of earlier ones see them (a running prefix sum)."""
    sim, dram = FunctionalSimulator(CFG), image()
    rows = np.arange(1, 9, dtype=np.int32)[:, None].repeat(16, 1)
    set_acc(sim, dram, rows)
    # acc[k+1] += acc[k] for k = 0..6, in order -> prefix sums
    run(sim, dram, alu_program(dram, AluOp.ADD, False, 0, [Uop(1, 0)], iter_in=7,
                               dst_factor_in=1, src_factor_in=1))
    np.testing.assert_array_equal(acc_values(sim)[:8, 0], np.cumsum(np.arange(1, 9)))


@pytest.mark.parametrize("op", [AluOp.MAX, AluOp.ADD, AluOp.MUL, AluOp.SHR])
def test_alu_reduction_into_one_destination(op: int) -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    rows = np.random.default_rng(3).integers(-50, 50, (9, 16)).astype(np.int32)
    rows[1:, :] %= 5  # small shift amounts for SHR
    set_acc(sim, dram, rows)
    run(sim, dram, alu_program(dram, op, False, 0, [Uop(0, 1)], iter_in=8, src_factor_in=1))
    expected = rows[0].astype(np.int64)
    for k in range(1, 9):
        expected = expected_alu(op, expected, rows[k])
    np.testing.assert_array_equal(acc_values(sim)[0], expected)


def test_alu_repeated_immediate_applies_each_time() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    set_acc(sim, dram, np.full((2, 16), 5))
    run(sim, dram, alu_program(dram, AluOp.MUL, True, 3, [Uop(0, 0), Uop(1, 1), Uop(0, 0)],
                               iter_out=2))
    assert (acc_values(sim)[0] == 5 * 3 ** 4).all() and (acc_values(sim)[1] == 15 * 3).all()


# ====================================================================== tokens and scheduling
def test_tokens_order_modules_pop_before_push_after() -> None:
    """The store sees the accumulator between two ALU instructions because of the tokens."""
    sim, dram = FunctionalSimulator(CFG), image()
    set_acc(sim, dram, np.zeros((1, 16)))
    uops = with_uops(dram, [Uop(0, 0)])
    add = dict(alu_opcode=AluOp.ADD, use_imm=True, uop_bgn=0, uop_end=1)
    insns = [
        store(0, 0x1000, 1, 1, pop_prev_dep=True, push_prev_dep=True),   # waits for ALU 1
        uops,
        AluInsn(imm=1, push_next_dep=True, **add),                       # acc = 1, token to store
        AluInsn(imm=10, pop_next_dep=True, **add),                       # waits for the store
        store(0, 0x1010, 1, 1),                                          # no token: runs at once
        FinishInsn(),
    ]
    run(sim, dram, insns)
    assert (dram[0x1000:0x1010] == 1).all()       # value after ALU 1 only
    assert (acc_values(sim)[0] == 11).all()
    assert (dram[0x1010:0x1020] == 1).all()       # store queue is in order: after the first store
    assert sim.tokens == {"l2g": 0, "s2g": 0, "g2l": 0, "g2s": 0}


def test_tokens_persist_across_runs_like_the_global_fsim_queues() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    producer = finish_stream([MemInsn(memory_type=MemType.UOP, push_prev_dep=True)])  # g2l += 1
    consumer = finish_stream([MemInsn(memory_type=MemType.INP, pop_next_dep=True)])   # pops g2l
    run(sim, dram, producer)
    assert sim.tokens["g2l"] == 1
    run(sim, dram, consumer)
    assert sim.tokens["g2l"] == 0
    with pytest.raises(SimulationError, match="deadlock.*g2l"):
        run(sim, dram, consumer)


def test_finish_ends_the_run_and_reports_unexecuted_instructions() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    set_acc(sim, dram, np.full((1, 16), 9))
    assert sim.unexecuted == []
    # no token orders the store before FINISH: the compute module reaches FINISH first
    run(sim, dram, [MemInsn(memory_type=MemType.UOP), FinishInsn(), store(0, 0x1000, 1, 1)])
    assert sim.unexecuted == [2]
    assert (dram[0x1000:0x1010] == 0).all()
    run(sim, dram, finish_stream([store(0, 0x1000, 1, 1)]))  # synchronised: the store runs
    assert sim.unexecuted == [] and (dram[0x1000:0x1010] == 9).all()


def test_deadlock_raises_and_names_the_blocked_instruction() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    insns = [load(MemType.INP, 0, 0, 1, 1), MemInsn(memory_type=MemType.UOP, pop_prev_dep=True),
             FinishInsn()]
    with pytest.raises(SimulationError, match=r"deadlock.*#1 \(compute: NOP-LOAD.*l2g") as info:
        run(sim, dram, insns)
    assert info.value.insn_index == 1 and "pop_prev" in info.value.insn_text


def test_stream_without_finish_is_an_error() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    with pytest.raises(SimulationError, match="without FINISH"):
        run(sim, dram, [load(MemType.INP, 0, 0, 1, 1)])


@pytest.mark.parametrize("insn", [
    MemInsn(memory_type=MemType.INP, pop_prev_dep=True),
    MemInsn(memory_type=MemType.WGT, push_prev_dep=True),
    MemInsn(opcode=Opcode.STORE, memory_type=MemType.OUT, pop_next_dep=True),
    MemInsn(opcode=Opcode.STORE, memory_type=MemType.OUT, push_next_dep=True),
], ids=["load-pop-prev", "load-push-prev", "store-pop-next", "store-push-next"])
def test_flags_without_a_queue_are_errors(insn: MemInsn) -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    with pytest.raises(SimulationError, match="#0 .*must be 0"):
        run(sim, dram, finish_stream([insn]))


def test_unknown_opcode_is_an_error() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    stream = bytearray(encode_stream(CFG, finish_stream([MemInsn()])))
    stream[0] = (stream[0] & ~7) | 6
    dram[INSN_OFF:INSN_OFF + len(stream)] = np.frombuffer(bytes(stream), np.uint8)
    with pytest.raises(SimulationError, match="#0 .*unknown opcode 6"):
        sim.run(dram, BASE, BASE + INSN_OFF, 2)


# ====================================================================== range checks
@pytest.mark.parametrize("insn,pattern", [
    (load(MemType.INP, CFG.inp_depth - 2, 0, 1, 3), "INP writes SRAM elements"),
    (load(MemType.ACC, CFG.acc_depth - 7, 0, 2, 2, pads=(0, 0, 1, 1)), "beyond the buffer depth"),
    (load(MemType.WGT, 0, IMAGE_BYTES - 256, 1, 2), "outside the DRAM image"),
    (load(MemType.INP, 0, 0x100, 3, 1, stride=IMAGE_BYTES // 32), "outside the DRAM image"),
    (MemInsn(memory_type=MemType.INP, x_size=1, y_size=1, dram_base=0), "outside the DRAM image"),
    (store(CFG.acc_depth - 1, 0, 1, 2), "STORE reads accumulator elements"),
    (store(0, IMAGE_BYTES - 16, 1, 2), "outside the DRAM image"),
    (MemInsn(memory_type=6, x_size=1, y_size=1), "unknown memory type 6"),
], ids=["inp-sram", "acc-pad-sram", "dram-end", "dram-stride", "dram-below", "store-sram",
        "store-dram", "mem-type"])
def test_out_of_range_memory_accesses(insn: MemInsn, pattern: str) -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    with pytest.raises(SimulationError, match=f"#0 .*{pattern}"):
        run(sim, dram, finish_stream([insn]))


@pytest.mark.parametrize("insn,pattern", [
    (GemmInsn(uop_bgn=0, uop_end=1, iter_out=3, dst_factor_out=1100),
     "accumulator index reaches 2200"),
    (GemmInsn(uop_bgn=0, uop_end=1, iter_in=3, src_factor_in=1024), "input index reaches 2048"),
    (GemmInsn(uop_bgn=0, uop_end=1, iter_in=3, wgt_factor_in=512), "weight index reaches 1024"),
    (GemmInsn(reset_reg=True, uop_bgn=0, uop_end=1, iter_in=3, dst_factor_in=1024),
     "accumulator index"),
    (AluInsn(uop_bgn=0, uop_end=1, iter_in=3, src_factor_in=1024), "ALU source index"),
    (AluInsn(uop_bgn=0, uop_end=1, use_imm=True, iter_out=3, dst_factor_out=1500),
     "ALU destination index reaches 3000"),
    (GemmInsn(uop_bgn=CFG.uop_depth - 1, uop_end=CFG.uop_depth + 1), "micro-op range"),
    (GemmInsn(uop_bgn=5, uop_end=4), "uop_end 4 is below uop_bgn 5"),
], ids=["gemm-acc", "gemm-inp", "gemm-wgt", "reset-acc", "alu-src", "alu-dst", "uop-range",
        "uop-order"])
def test_out_of_range_compute_indices(insn, pattern: str) -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    with pytest.raises(SimulationError, match=f"#1 .*{pattern}"):
        run(sim, dram, finish_stream([with_uops(dram, [Uop(0, 0, 0)]), insn]))


def test_instruction_stream_outside_dram_is_an_error() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    with pytest.raises(SimulationError, match="instruction stream"):
        sim.run(dram, BASE, BASE + IMAGE_BYTES - 16, 2)


# ====================================================================== state and statistics
def test_sram_persists_across_runs_and_reset_clears() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    set_acc(sim, dram, np.full((1, 16), 42))
    run(sim, dram, finish_stream([store(0, 0x1000, 1, 1)]))
    assert (dram[0x1000:0x1010] == 42).all()
    sim.reset()
    run(sim, dram, finish_stream([store(0, 0x1000, 1, 1)]))
    assert (dram[0x1000:0x1010] == 0).all()


def test_stats_per_run_cumulative_and_format() -> None:
    sim, dram = FunctionalSimulator(CFG), image()
    insns = finish_stream([load(MemType.INP, 0, 0, 2, 3), load(MemType.WGT, 0, 0, 1, 2),
                           load(MemType.ACC, 0, 0, 1, 1), with_uops(dram, [Uop(), Uop()]),
                           GemmInsn(uop_bgn=0, uop_end=2, iter_out=3, iter_in=5),
                           GemmInsn(reset_reg=True, uop_bgn=0, uop_end=2),
                           AluInsn(uop_bgn=0, uop_end=2, iter_out=2, use_imm=True),
                           store(0, 0x1000, 1, 3)])
    first = run(sim, dram, insns)
    assert first.as_dict() == {"inp_load_nbytes": 96, "wgt_load_nbytes": 512,
                               "acc_load_nbytes": 64, "uop_load_nbytes": 8,
                               "out_store_nbytes": 48, "gemm_counter": 30, "alu_counter": 4}
    second = run(sim, dram, insns)
    assert second == first
    assert sim.stats == first + second
    assert list(sim.stats.as_dict()) == list(COUNTER_NAMES)
    text = repr(first)
    assert all(name in text for name in COUNTER_NAMES) and "gemm_counter=30" in text
    sim.clear_stats()
    assert sim.stats == SimStats()


def test_run_binary_and_input_validation() -> None:
    dram = image()
    insns = finish_stream([load(MemType.INP, 0, 0, 1, 1)])
    stream = encode_stream(CFG, insns)
    dram[INSN_OFF:INSN_OFF + len(stream)] = np.frombuffer(stream, np.uint8)
    assert run_binary(CFG, dram, BASE, BASE + INSN_OFF, len(insns)).inp_load_nbytes == 16
    sim = FunctionalSimulator(CFG)
    with pytest.raises(TypeError):
        sim.run(dram.view(np.int8), BASE, BASE + INSN_OFF, 2)
    readonly = dram.copy()
    readonly.flags.writeable = False
    with pytest.raises(ValueError):
        sim.run(readonly, BASE, BASE + INSN_OFF, 2)


# ====================================================================== plan cache
def test_identical_instructions_follow_new_micro_ops() -> None:
    """The same GEMM/ALU bits after a micro-op reload use the new micro-ops (plan cache key)."""
    rng = np.random.default_rng(12)
    sim, dram, inp, wgt, acc0 = gemm_setup(rng)
    gemm = GemmInsn(uop_bgn=0, uop_end=1, iter_in=2, dst_factor_in=1, src_factor_in=1)
    alu = AluInsn(alu_opcode=AluOp.ADD, use_imm=True, imm=5, uop_bgn=0, uop_end=1)
    put(dram, UOP_OFF, uop_words([Uop(0, 0, 0)]))
    put(dram, UOP_OFF + 4, uop_words([Uop(4, 2, 1)]))
    load_a = load(MemType.UOP, 0, UOP_OFF, 1, 1)
    load_b = load(MemType.UOP, 0, UOP_OFF + 4, 1, 1)
    run(sim, dram, finish_stream([load_a, gemm, alu, load_b, gemm, alu]))
    expected = acc0.copy()
    for (dst, src, w) in ((0, 0, 0), (4, 2, 1)):
        for x in range(2):
            expected[dst + x] += wgt[w] @ inp[src + x]
        expected[dst] += 5
    expected = (expected + (1 << 31)) % (1 << 32) - (1 << 31)
    np.testing.assert_array_equal(acc_values(sim)[:8], expected)


def test_rerun_on_the_same_simulator_gives_the_same_result() -> None:
    """Cached decoding and plans (kept across reset) reproduce a fresh simulator's result."""
    gen = ProgramGenerator(CFG, np.random.default_rng(21))
    insns = gen.program(rounds=3)
    sim = FunctionalSimulator(CFG)
    first_dram = gen.dram.copy()
    first = run(sim, first_dram, insns)
    first_acc = acc_values(sim)
    sim.reset()
    second_dram = gen.dram.copy()
    second = run(sim, second_dram, insns)
    assert first == second
    np.testing.assert_array_equal(first_dram, second_dram)
    np.testing.assert_array_equal(acc_values(sim), first_acc)


def test_gemm_matrix_roles_with_batch_2() -> None:
    """Rows (outer loop), columns (inner loop) and a micro-op reduction with BATCH = 2."""
    cfg = load_config("2x16x16")
    rng = np.random.default_rng(13)
    sim, dram = FunctionalSimulator(cfg), image()
    rows, cols, red = 3, 4, 2
    inp = rng.integers(-128, 128, (rows * red, 2, 16), dtype=np.int8)
    wgt = rng.integers(-128, 128, (cols * red, 16, 16), dtype=np.int8)
    put(dram, 0x0, inp)
    put(dram, 0x1000, wgt)
    uops = [Uop(0, k, k) for k in range(red)]  # acc[r*cols + c] += inp[r*red + k] . wgt[c*red + k]
    gemm = GemmInsn(uop_bgn=0, uop_end=red, iter_out=rows, iter_in=cols, dst_factor_out=cols,
                    dst_factor_in=1, src_factor_out=red, src_factor_in=0, wgt_factor_out=0,
                    wgt_factor_in=red)
    run(sim, dram, finish_stream([load(MemType.INP, 0, 0x0, 1, rows * red, cfg=cfg),
                                  load(MemType.WGT, 0, 0x1000, 1, cols * red, cfg=cfg),
                                  with_uops(dram, uops, cfg=cfg), gemm]), cfg)
    x = inp.reshape(rows, red, 2, 16).astype(np.int64)
    w = wgt.reshape(cols, red, 16, 16).astype(np.int64)
    expected = np.einsum("rkbi,ckoi->rcbo", x, w).reshape(rows * cols, 2 * 16)
    np.testing.assert_array_equal(acc_values(sim)[:rows * cols], expected)
