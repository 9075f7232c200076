"""Calibrate the ``pynq`` cycle model on the RTL of the Pynq HLS design.

Builds micro-benchmark programs with :class:`vta_ext.runtime.CommandQueue` (loads of each memory
type with varied sizes, strides and padding; stores; GEMM and ALU with varied micro-ops and loop
extents; micro-op loads; instruction-count sweeps; token chains and ping-pongs; the empty
program), runs each on the RTL (``vta_ext.device``, ``libvta_rtl.so``) at memory latency 0 and 40,
and fits every structural constant of the cycle model (``vta_ext/sim/cycles.py``):

1. **Exact solves from slopes.** Each constant is first solved from two benchmarks that differ in
   one quantity only (:data:`SLOPES`): e.g. ``WGT_BYTES_PER_CYCLE`` from a weight load of 1 and of
   2 elements per row (256 bytes apart), ``WGT_ROW_CYCLES`` from 1 and 2 rows, ``GEMM_INSN_CYCLES``
   from 1 and 2 GEMMs whose micro-ops stay resident. RTL cycles are exact and the structure is
   additive along one module, so these are exact solves.
2. **Refinement.** Integer coordinate descent from those values over every benchmark at both
   latencies, minimising the sum of squared relative errors, of the fixed costs per instruction
   and the start-up constants only (:data:`DESCENT_KEYS`: the model is max-plus, so where a
   token hop or the fetch overlaps an instruction's fixed cost the split between them is not a
   slope; the descent settles it). Bandwidths, per-row and per-micro-op cycles stay the exact
   slopes. ``MEM_LATENCY_CYCLES`` is not fitted: it is the latency the RTL ran at.

Writes ``docs/figures/calibrate_rtl.csv`` (one row per benchmark and latency: RTL cycles, model
cycles before and after the fit, error), ``docs/figures/calibrate_rtl.png`` and prints the
constants with their residuals. ``--write`` puts the fitted values into
``vta_ext/configs/pynq.json``.

    python scripts/calibrate_rtl.py [--write] [--latencies 0 40] [--quick]
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vta_ext.config import CONFIG_DIR, STRUCTURE_KEYS, VTAConfig, load_config  # noqa: E402
from vta_ext.isa import AluOp, MemType, Stage  # noqa: E402
from vta_ext.runtime import CommandQueue, Program, UopKernel  # noqa: E402
from vta_ext.sim.cycles import CycleModel  # noqa: E402

FIG = REPO / "docs" / "figures"
#: the constants the fit sets (MEM_LATENCY_CYCLES is the RTL's, not fitted; the per-uop ones are
#: exact integers measured by slopes and kept in the descent too)
FITTED = tuple(k for k in STRUCTURE_KEYS if k != "MEM_LATENCY_CYCLES") + (
    "GEMM_CYCLES_PER_UOP", "ALU_CYCLES_PER_UOP_IMM", "ALU_CYCLES_PER_UOP_VEC",
    "INSN_ISSUE_CYCLES", "DMA_OVERHEAD_CYCLES")
_BIG = 1 << 20
_C, _S, _L = Stage.COMPUTE, Stage.STORE, Stage.LOAD
_NAMES = {MemType.INP: "inp", MemType.WGT: "wgt", MemType.ACC: "acc"}


# --------------------------------------------------------------------------- micro-benchmarks
def _queue(cfg: VTAConfig):
    q = CommandQueue(cfg)
    return q, {m: q.alloc(_BIG, m) for m in ("inp", "wgt", "acc", "out")}


def empty(cfg) -> Program:
    """The smallest program CommandQueue makes: one compute→store token and the closing
    handshake (5 instructions: 2 compute NOPs, a store NOP, a load NOP, FINISH)."""
    q, _ = _queue(cfg)
    q.dep_push(_C, _S)
    q.dep_pop(_C, _S)
    return q.synchronize()


def loads(cfg, mem, n=1, x=1, y=1, stride=None, pads=(0, 0, 0, 0)) -> Program:
    """``n`` LOADs of ``y`` rows of ``x`` elements of ``mem``; pads = (x0, y0, x1, y1)."""
    q, b = _queue(cfg)
    x0, y0, x1, y1 = pads
    for _ in range(n):
        q.load_2d(b[_NAMES[mem]], 0, x, y, stride or x, x0, y0, x1, y1, 0, mem)
    return q.synchronize()


def stores(cfg, n=1, x=1, y=1, stride=None) -> Program:
    q, b = _queue(cfg)
    for _ in range(n):
        q.store_2d(0, MemType.OUT, b["out"], 0, x, y, stride or x)
    return q.synchronize()


def _kernel(mode, uops, outer, inner, tag, **kw) -> UopKernel:
    """``uops`` micro-ops in two loops; every (loop, uop) writes its own accumulator row (so the
    hazard contract holds); ``tag`` makes kernels distinct (a new micro-op load each)."""
    k = UopKernel(mode, **kw)
    k.loop_begin(outer, uops * inner, 0, 0)
    k.loop_begin(inner, uops, 0, 0)
    for u in range(uops):
        if mode == "gemm":
            k.push(u, 0, tag % 1024)
        else:
            k.push(u, 1024 + tag % 1024)
    k.loop_end()
    k.loop_end()
    return k


def gemm(cfg, n=1, uops=1, outer=1, inner=1, distinct=False, reset=False) -> Program:
    """``n`` GEMMs of ``outer x inner x uops`` micro-ops; ``distinct``: a micro-op load each."""
    q, _ = _queue(cfg)
    for i in range(n):
        q.push_gemm(_kernel("gemm", uops, outer, inner, i if distinct else 0, reset=reset))
    return q.synchronize()


def alu(cfg, n=1, uops=1, outer=1, inner=1, distinct=False, imm=True) -> Program:
    q, _ = _queue(cfg)
    for i in range(n):
        q.push_alu(_kernel("alu", uops, outer, inner, i if distinct else 0, alu_opcode=AluOp.ADD,
                           use_imm=imm, imm=1))
    return q.synchronize()


def tokens(cfg, a, b, n=1, pingpong=False) -> Program:
    """``n`` tokens from stage ``a`` to ``b``: all pushed, then all popped (a chain of NOPs on each
    side), or ``pingpong``: each answered by a token back before the next."""
    q, _ = _queue(cfg)
    if pingpong:
        for _ in range(n):
            q.dep_push(a, b)
            q.dep_pop(a, b)
            q.dep_push(b, a)
            q.dep_pop(b, a)
    else:
        for _ in range(n):
            q.dep_push(a, b)
        for _ in range(n):
            q.dep_pop(a, b)
    return q.synchronize()


def tiles(cfg, n=4, x=4, uops=4, double=False, alu_ops=1) -> Program:
    """A GEMM operator in miniature: per tile load inp and wgt, GEMM, ALU, store; single or
    double buffered, with the tokens the templates use."""
    q, b = _queue(cfg)
    for t in range(n):
        base = (t % 2) * 64 if double else 0
        if t >= (2 if double else 1):
            q.dep_pop(_C, _L)
        q.load_2d(b["inp"], 0, x, 2, x, 0, 0, 0, 0, base, MemType.INP)
        q.load_2d(b["wgt"], 0, x, 1, x, 0, 0, 0, 0, base % 1024, MemType.WGT)
        q.dep_push(_L, _C)
        q.dep_pop(_L, _C)
        if t >= (2 if double else 1):
            q.dep_pop(_S, _C)
        q.push_gemm(_kernel("gemm", uops, 1, 1, 0, reset=True))
        q.push_gemm(_kernel("gemm", uops, 1, x, 0))
        for _ in range(alu_ops):
            q.push_alu(_kernel("alu", uops, 1, 1, 0, alu_opcode=AluOp.SHR, use_imm=True, imm=2))
        q.dep_push(_C, _L)
        q.dep_push(_C, _S)
        q.dep_pop(_C, _S)
        q.store_2d(base, MemType.OUT, b["out"], 0, uops, 1, uops)
        q.dep_push(_S, _C)
    for _ in range(min(n, 2 if double else 1)):
        q.dep_pop(_C, _L)
        q.dep_pop(_S, _C)
        q.push_alu(_kernel("alu", 1, 1, 1, 0, alu_opcode=AluOp.ADD, use_imm=True, imm=0))
    return q.synchronize()


def benchmarks(cfg: VTAConfig, quick: bool = False) -> List[Tuple[str, str, Callable[[], Program]]]:
    """(name, group, builder) of every micro-benchmark; ``quick`` keeps a handful."""
    out = []

    def add(group, name, fn, *args, **kw):
        out.append((name, group, lambda: fn(cfg, *args, **kw)))

    add("fixed", "empty", empty)
    for mem in (MemType.INP, MemType.WGT, MemType.ACC):
        m = mem.name.lower()
        for n, x, y in ((1, 1, 1), (2, 1, 1), (4, 1, 1), (1, 2, 1), (1, 8, 1), (1, 1, 2),
                        (1, 1, 8), (1, 8, 8), (3, 4, 5), (1, 16, 3)):
            add(f"load {m}", f"{m} n{n} x{x} y{y}", loads, mem, n, x, y)
        add(f"load {m}", f"{m} x4 y4 stride 100", loads, mem, 1, 4, 4, 100)
        if mem != MemType.WGT:
            for pads in ((1, 0, 0, 0), (0, 0, 3, 0), (0, 2, 0, 0), (0, 0, 0, 1), (2, 2, 2, 2)):
                add(f"pad {m}", f"{m} x4 y4 pads {pads}", loads, mem, 1, 4, 4, pads=pads)
    for n, x, y in ((1, 1, 1), (2, 1, 1), (4, 1, 1), (1, 8, 1), (1, 1, 2), (1, 1, 8), (1, 8, 8),
                    (3, 4, 5)):
        add("store", f"store n{n} x{x} y{y}", stores, n, x, y)
    add("store", "store x4 y4 stride 100", stores, 1, 4, 4, 100)
    for n, u, o, i in ((1, 1, 1, 1), (2, 1, 1, 1), (4, 1, 1, 1), (1, 8, 1, 1), (1, 64, 1, 1),
                       (1, 8, 4, 1), (1, 8, 4, 4), (1, 1, 4, 4), (1, 1, 16, 1), (1, 1, 1, 16),
                       (3, 16, 2, 3)):
        add("gemm", f"gemm n{n} u{u} o{o} i{i}", gemm, n, u, o, i)
        add("alu", f"alu n{n} u{u} o{o} i{i}", alu, n, u, o, i)
    add("gemm", "gemm reset u8 o4", gemm, 1, 8, 4, reset=True)
    add("alu", "alu vec u8 o4", alu, 1, 8, 4, imm=False)
    for n, u in ((2, 1), (4, 1), (2, 8), (4, 32), (8, 4)):
        add("uop", f"uop+gemm n{n} u{u} distinct", gemm, n, u, distinct=True)
        add("uop", f"uop+alu n{n} u{u} distinct", alu, n, u, distinct=True)
    for a, b in ((_C, _S), (_S, _C), (_C, _L), (_L, _C)):
        for n in (1, 5, 20):
            add("tokens", f"tokens {a.name}->{b.name} n{n}", tokens, a, b, n)
        if a < b or (a, b) == (_C, _L):
            for n in (1, 5, 20):
                add("tokens", f"pingpong {a.name}-{b.name} n{n}", tokens, a, b, n, pingpong=True)
    for n in (1, 20, 100):
        add("count", f"gemm count n{n}", gemm, n, 2)
        add("count", f"load count n{n}", loads, MemType.INP, n, 2, 1)
        add("count", f"store count n{n}", stores, n, 2, 1)
    for n, x, u, double, a in ((1, 4, 4, False, 1), (4, 4, 4, False, 1), (4, 4, 4, True, 1),
                               (8, 2, 16, True, 2), (6, 8, 8, False, 3), (8, 16, 16, True, 1)):
        add("tiles", f"tiles n{n} x{x} u{u} {'double' if double else 'single'} alu{a}", tiles,
            n, x, u, double, a)
    if quick:
        keep = {"empty", "inp n1 x8 y8", "wgt n3 x4 y5", "acc x4 y4 pads (2, 2, 2, 2)",
                "store n1 x8 y8", "gemm n1 u8 o4 i4", "alu n1 u8 o4 i4", "uop+gemm n4 u32 distinct",
                "pingpong COMPUTE-STORE n5", "tiles n4 x4 u4 double alu1"}
        out = [b for b in out if b[0] in keep]
    return out


# --------------------------------------------------------------------------- measuring
def measure(cfg: VTAConfig, latencies: Sequence[int], quick: bool = False, progress=True):
    """RTL cycles: {(name, latency): cycles}, and the benchmarks' programs."""
    from vta_ext.device import open_device, vta_hw_library

    path = vta_hw_library("rtl")
    benches = benchmarks(cfg, quick)
    programs = {name: (group, build()) for name, group, build in benches}
    cycles = {}
    total = len(programs) * len(latencies)
    done = 0
    for lat in latencies:
        dev = open_device(path, mem_latency=lat)
        try:
            for name, (_, program) in programs.items():
                cycles[name, lat] = dev.run_program(program).cycles
                done += 1
                if progress:
                    print(f"\r  RTL {done}/{total}", end="", file=sys.stderr, flush=True)
        finally:
            dev.close()
    if progress:
        print(file=sys.stderr)
    return cycles, programs


def model_cycles(cfg: VTAConfig, latency: int, program: Program) -> int:
    c = VTAConfig.from_dict({**cfg.to_dict(), "MEM_LATENCY_CYCLES": latency}, name=cfg.name)
    return CycleModel(c).run_program(program).total_cycles


# --------------------------------------------------------------------------- fitting
#: the exact solves of step 1: constant -> (benchmark a, benchmark b, what b - a is at latency 0,
#: as a function of the constants already solved) -- solved in this order
def slope_solves(rtl: Dict[Tuple[str, int], int]) -> Dict[str, int]:
    r = {k: v for (k, lat), v in rtl.items() if lat == 0}
    d = lambda a, b: r[b] - r[a]  # noqa: E731
    v: Dict[str, int] = {}
    # bandwidths: one more element per row (bytes per element / cycles)
    v["INP_BYTES_PER_CYCLE"] = round(7 * 16 / d("inp n1 x1 y1", "inp n1 x8 y1"))
    v["WGT_BYTES_PER_CYCLE"] = round(256 / d("wgt n1 x1 y1", "wgt n1 x2 y1"))
    v["ACC_BYTES_PER_CYCLE"] = round(7 * 64 / d("acc n1 x1 y1", "acc n1 x8 y1"))
    v["OUT_BYTES_PER_CYCLE"] = round(7 * 16 / d("store n1 x1 y1", "store n1 x8 y1"))
    # per micro-op: GEMM and ALU over a resident kernel, 16 iterations against 1
    v["GEMM_CYCLES_PER_UOP"] = round(d("gemm n1 u1 o1 i1", "gemm n1 u1 o4 i4") / 15)
    v["ALU_CYCLES_PER_UOP_IMM"] = round(d("alu n1 u1 o1 i1", "alu n1 u1 o4 i4") / 15)
    v["ALU_CYCLES_PER_UOP_VEC"] = v["ALU_CYCLES_PER_UOP_IMM"]   # refined below on "alu vec"
    # micro-op bytes: 7 more uops cost 7 GEMM cycles and 28 bytes of micro-op load
    v["UOP_BYTES_PER_CYCLE"] = round(28 / (d("gemm n1 u1 o1 i1", "gemm n1 u8 o1 i1")
                                           - 7 * v["GEMM_CYCLES_PER_UOP"]))
    # per row: one more row (minus its bytes)
    v["INP_ROW_CYCLES"] = d("inp n1 x1 y1", "inp n1 x1 y2") - 16 // v["INP_BYTES_PER_CYCLE"]
    v["WGT_ROW_CYCLES"] = d("wgt n1 x1 y1", "wgt n1 x1 y2") - 256 // v["WGT_BYTES_PER_CYCLE"]
    v["ACC_ROW_CYCLES"] = d("acc n1 x1 y1", "acc n1 x1 y2") - 64 // v["ACC_BYTES_PER_CYCLE"]
    v["OUT_ROW_CYCLES"] = d("store n1 x1 y1", "store n1 x1 y2") - 16 // v["OUT_BYTES_PER_CYCLE"]
    # per instruction: one more instruction of one row (minus that row)
    v["INP_INSN_CYCLES"] = d("inp n1 x1 y1", "inp n2 x1 y1") - d("inp n1 x1 y1", "inp n1 x1 y2")
    v["WGT_INSN_CYCLES"] = d("wgt n1 x1 y1", "wgt n2 x1 y1") - d("wgt n1 x1 y1", "wgt n1 x1 y2")
    v["ACC_INSN_CYCLES"] = d("acc n1 x1 y1", "acc n2 x1 y1") - d("acc n1 x1 y1", "acc n1 x1 y2")
    v["OUT_INSN_CYCLES"] = (d("store n1 x1 y1", "store n2 x1 y1")
                            - d("store n1 x1 y1", "store n1 x1 y2"))
    v["GEMM_INSN_CYCLES"] = d("gemm n1 u1 o1 i1", "gemm n2 u1 o1 i1") - v["GEMM_CYCLES_PER_UOP"]
    v["ALU_INSN_CYCLES"] = d("alu n1 u1 o1 i1", "alu n2 u1 o1 i1") - v["ALU_CYCLES_PER_UOP_IMM"]
    # a micro-op load of one uop (one row): a distinct kernel costs a uop load more than a GEMM
    uop_load = d("uop+gemm n2 u1 distinct", "uop+gemm n4 u1 distinct") // 2 - (
        v["GEMM_INSN_CYCLES"] + v["GEMM_CYCLES_PER_UOP"])
    v["UOP_ROW_CYCLES"] = 0
    v["UOP_INSN_CYCLES"] = uop_load - -(-4 // v["UOP_BYTES_PER_CYCLE"])
    # a NOP: the slope of a chain of token NOPs
    v["NOP_INSN_CYCLES"] = round(d("tokens COMPUTE->STORE n5", "tokens COMPUTE->STORE n20") / 15)
    # padding: 48 padding elements around 4 x 4 (the stride does not matter)
    v["PAD_ELEM_CYCLES"] = round(d("inp x4 y4 stride 100", "inp x4 y4 pads (2, 2, 2, 2)") / 48)
    # tokens: a compute-store ping-pong round is three NOPs in series (compute pop, compute push,
    # store pop-push) and two token hops of TOKEN_CYCLES - POP_OFFSET_CYCLES each
    hop = (d("pingpong COMPUTE-STORE n5", "pingpong COMPUTE-STORE n20") / 15
           - 3 * v["NOP_INSN_CYCLES"]) / 2
    v["TOKEN_CYCLES"], v["POP_OFFSET_CYCLES"] = max(0, round(hop)), max(0, -round(hop))
    # the start-up constants: the empty program is FETCH, then compute NOP -> store NOP ->
    # compute NOP -> FINISH, split evenly between FETCH_CYCLES and FINISH_INSN_CYCLES
    rest = r["empty"] - 3 * v["NOP_INSN_CYCLES"] - 2 * round(hop)
    v["FETCH_CYCLES"], v["FINISH_INSN_CYCLES"] = rest // 2, rest - rest // 2
    v["INSN_ISSUE_CYCLES"] = 0
    v["DMA_OVERHEAD_CYCLES"] = 0
    return v


def _config(base: VTAConfig, values: Dict[str, int], latency: int) -> VTAConfig:
    return VTAConfig.from_dict({**base.to_dict(), **values, "MEM_LATENCY_CYCLES": latency},
                               name=base.name)


def errors(base, values, rtl, programs) -> Dict[Tuple[str, int], float]:
    """Relative error model / RTL - 1 of every benchmark and latency."""
    models = {}
    out = {}
    for (name, lat), cycles in rtl.items():
        model = models.get(lat)
        if model is None:
            model = models[lat] = CycleModel(_config(base, values, lat))
        out[name, lat] = model.run_program(programs[name][1]).total_cycles / cycles - 1
    return out


#: what the descent moves: the fixed costs per instruction and the start-up constants (the
#: bandwidths, per-row and per-micro-op cycles are exact slopes and stay as solved)
DESCENT_KEYS = tuple(k for k in FITTED if k.endswith("_INSN_CYCLES")) + (
    "FETCH_CYCLES", "TOKEN_CYCLES", "POP_OFFSET_CYCLES")


def descend(base, values, rtl, programs, keys=DESCENT_KEYS, rounds=8) -> Dict[str, int]:
    """Integer coordinate descent of ``values`` on the sum of squared relative errors."""
    def cost(v):
        try:
            e = errors(base, v, rtl, programs)
        except Exception:   # an invalid configuration (a bandwidth 0, ...)
            return math.inf
        return sum(x * x for x in e.values())

    best = dict(values)
    best_cost = cost(best)
    for _ in range(rounds):
        improved = False
        for key in keys:
            for step in (1, -1, 2, -2, 4, -4):
                trial = dict(best)
                trial[key] = best[key] + step
                if trial[key] < 0:
                    continue
                c = cost(trial)
                if c < best_cost - 1e-12:
                    best, best_cost, improved = trial, c, True
        if not improved:
            break
    return best


# --------------------------------------------------------------------------- report
def write_outputs(base, before, after, rtl, programs, out_dir: Path) -> None:
    e_before = errors(base, before, rtl, programs)
    e_after = errors(base, after, rtl, programs)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "calibrate_rtl.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["benchmark", "group", "latency", "insns", "rtl_cycles", "model_before",
                    "model_after", "error_after"])
        for (name, lat), cycles in sorted(rtl.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            group, program = programs[name]
            w.writerow([name, group, lat, program.insn_count, cycles,
                        round(cycles * (1 + e_before[name, lat])),
                        round(cycles * (1 + e_after[name, lat])),
                        f"{e_after[name, lat]:+.4f}"])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, errs, title in ((axes[0], e_before, "apache constants (before)"),
                            (axes[1], e_after, "fitted pynq constants")):
        for lat, marker in zip(sorted({k[1] for k in rtl}), "ox^"):
            xs = [rtl[k] for k in rtl if k[1] == lat]
            ys = [100 * errs[k] for k in rtl if k[1] == lat]
            ax.scatter(xs, ys, marker=marker, s=18, label=f"latency {lat}")
        ax.axhline(5, color="red", lw=0.8, ls="--")
        ax.axhline(-5, color="red", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("RTL cycles")
        ax.set_ylabel("model / RTL - 1 (%)")
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f"Cycle model vs RTL on {len(programs)} micro-benchmarks")
    fig.tight_layout()
    fig.savefig(out_dir / "calibrate_rtl.png", dpi=110)
    plt.close(fig)


def summary(base, values, rtl, programs) -> str:
    e = errors(base, values, rtl, programs)
    lines = ["| group | latency | benchmarks | max abs error | geomean abs error |",
             "|---|---|---|---|---|"]
    groups = sorted({g for g, _ in programs.values()})
    for lat in sorted({k[1] for k in rtl}):
        for g in groups + ["all"]:
            errs = [abs(e[n, lat]) for n, (gg, _) in programs.items()
                    if (g == "all" or gg == g) and (n, lat) in e]
            if not errs:
                continue
            geo = math.exp(sum(math.log(max(x, 1e-6)) for x in errs) / len(errs))
            lines.append(f"| {g} | {lat} | {len(errs)} | {100 * max(errs):.2f} % | "
                         f"{100 * geo:.2f} % |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latencies", type=int, nargs="+", default=[0, 40])
    ap.add_argument("--quick", action="store_true", help="a handful of benchmarks (no fit)")
    ap.add_argument("--write", action="store_true", help="write the constants into pynq.json")
    ap.add_argument("--out", type=Path, default=FIG)
    args = ap.parse_args(argv)
    base = load_config("pynq")
    start = time.time()
    rtl, programs = measure(base, args.latencies, args.quick)
    print(f"{len(rtl)} RTL runs in {time.time() - start:.0f} s", file=sys.stderr)
    current = {k: getattr(base, k) for k in FITTED}
    if args.quick:
        print(summary(base, current, rtl, programs))
        return 0
    apache = load_config("apache")
    before = {k: getattr(apache, k) for k in FITTED}
    solved = slope_solves(rtl)
    fitted = descend(base, solved, rtl, programs)
    e = errors(base, fitted, rtl, programs)
    print("| constant | slope solve | fitted |\n|---|---|---|")
    for k in FITTED:
        print(f"| `{k}` | {solved[k]} | {fitted[k]} |")
    print()
    print(summary(base, fitted, rtl, programs))
    worst = sorted(e, key=lambda k: -abs(e[k]))[:8]
    print("\nworst:", ", ".join(f"{n} @{lat}: {100 * e[n, lat]:+.2f} %" for n, lat in worst))
    write_outputs(base, before, fitted, rtl, programs, args.out)
    if args.write:
        path = CONFIG_DIR / "pynq.json"
        data = json.loads(path.read_text())
        for k in FITTED:
            data[k] = fitted[k]
        path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
