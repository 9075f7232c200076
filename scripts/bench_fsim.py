#!/usr/bin/env python
"""Benchmark the functional simulator on an int8 GEMM and report simulated MAC/s.

The program computes ``out = clip((A @ W^T) >> 8, -128, 127)`` for int8 ``A`` (M x K) and ``W``
(N x K) as the original VTA GEMM tests do: the weights are loaded once, then for every tile of rows
the input rows are loaded, the accumulators reset, one GEMM instruction runs the whole tile
(K reduction in the inner loop, output column blocks in the micro-ops), three ALU instructions
requantise (SHR 8, MAX -128, MIN 127) and a STORE writes the int8 result. The result is checked
against numpy before timing.

Three program shapes are measured: ``cols-in-uops`` (one GEMM instruction per tile; micro-ops
enumerate the output column blocks, the shape a matrix-multiply template produces),
``rows-in-uops`` (micro-ops enumerate the rows of the tile, as in convolution templates where
micro-ops walk the output pixels) and ``block-per-insn`` (one GEMM instruction per output block,
16,384 GEMMs of 32 micro-op executions: measures the per-instruction overhead of fine-grained
programs).

Each BLAS thread count is measured in its own child process (``OPENBLAS_NUM_THREADS`` must be
set before numpy is imported). On the shared 2-core machine one thread is both faster and far more
stable than two for these matrix sizes (64 x 512 x 512 per instruction).

Usage::

    python scripts/bench_fsim.py [--size 512] [--repeats 7] [--blas-threads 1 2]
                                 [--csv docs/figures/bench_fsim.csv]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

if "--child" in sys.argv:  # pin BLAS threads before numpy loads OpenBLAS
    _threads = sys.argv[sys.argv.index("--child") + 1]
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = _threads

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vta_ext.config import VTAConfig, load_config  # noqa: E402
from vta_ext.isa import AluOp, MemType, Stage  # noqa: E402
from vta_ext.runtime import CommandQueue, Program, UopKernel  # noqa: E402
from vta_ext.sim import FunctionalSimulator  # noqa: E402


def build_gemm_program(cfg: VTAConfig, m: int, k: int, n: int, layout: str) -> Tuple[Program, int]:
    """Build the tiled GEMM program; returns the program and the rows per tile.

    Parameters
    ----------
    cfg : VTAConfig
        Configuration with ``BATCH == 1``.
    m, k, n : int
        Matrix sizes; ``k`` and ``n`` must be multiples of the block sizes.
    layout : {"cols-in-uops", "rows-in-uops", "block-per-insn"}
        Which loop the micro-ops enumerate, or one GEMM instruction per output block (see the
        module docstring).
    """
    if cfg.BATCH != 1:
        raise ValueError("the benchmark program assumes BATCH == 1")
    kb, nb = k // cfg.BLOCK_IN, n // cfg.BLOCK_OUT
    if kb * cfg.BLOCK_IN != k or nb * cfg.BLOCK_OUT != n or nb * kb > cfg.wgt_depth:
        raise ValueError(f"K={k}, N={n} must be block multiples with all weights in the buffer")
    rows = min(cfg.inp_depth // kb, cfg.acc_depth // nb, m, cfg.uop_depth)
    if m % rows:
        raise ValueError(f"M={m} must be a multiple of the tile of {rows} rows")
    q = CommandQueue(cfg)
    a_buf = q.alloc(m * k, "a")
    w_buf = q.alloc(n * k, "w")
    o_buf = q.alloc(m * n, "out")
    q.load_2d(w_buf, 0, nb * kb, 1, nb * kb, 0, 0, 0, 0, 0, MemType.WGT)

    reset = UopKernel("gemm", reset=True)
    reset.loop_begin(rows, nb, 0, 0)
    for j in range(nb):
        reset.push(j, 0, 0)
    reset.loop_end()
    gemm = UopKernel("gemm")
    gemms = [gemm]
    if layout == "cols-in-uops":
        gemm.loop_begin(rows, nb, kb, 0)   # rows of the tile
        gemm.loop_begin(kb, 0, 1, 1)       # reduction over K blocks
        for j in range(nb):                # output column blocks
            gemm.push(j, 0, j * kb)
    elif layout == "rows-in-uops":
        gemm.loop_begin(nb, 1, 0, kb)      # output column blocks
        gemm.loop_begin(kb, 0, 1, 1)       # reduction over K blocks
        for r in range(rows):              # rows of the tile
            gemm.push(r * nb, r * kb, 0)
    elif layout == "block-per-insn":
        gemms = []
        for r in range(rows):
            for j in range(nb):
                one = UopKernel("gemm")
                one.loop_begin(kb, 0, 1, 1)    # reduction over K blocks
                one.push(r * nb + j, r * kb, j * kb)
                one.loop_end()
                gemms.append(one)
    else:
        raise ValueError(f"unknown layout {layout!r}")
    if layout != "block-per-insn":
        gemm.loop_end()
        gemm.loop_end()
    requant = []
    for op, imm in ((AluOp.SHR, 8), (AluOp.MAX, -128), (AluOp.MIN, 127)):
        alu = UopKernel("alu", alu_opcode=op, use_imm=True, imm=imm)
        alu.loop_begin(rows * nb, 1, 1)
        alu.push(0, 0)
        alu.loop_end()
        requant.append(alu)

    for t in range(m // rows):
        if t:
            q.dep_pop(Stage.COMPUTE, Stage.LOAD)       # inputs of the last tile consumed
        q.load_2d(a_buf, t * rows * kb, rows * kb, 1, rows * kb, 0, 0, 0, 0, 0, MemType.INP)
        q.dep_push(Stage.LOAD, Stage.COMPUTE)
        q.dep_pop(Stage.LOAD, Stage.COMPUTE)
        if t:
            q.dep_pop(Stage.STORE, Stage.COMPUTE)      # accumulators of the last tile stored
        q.push_gemm(reset)
        for kernel in gemms:
            q.push_gemm(kernel)
        if t + 1 < m // rows:
            q.dep_push(Stage.COMPUTE, Stage.LOAD)
        for alu in requant:
            q.push_alu(alu)
        q.dep_push(Stage.COMPUTE, Stage.STORE)
        q.dep_pop(Stage.COMPUTE, Stage.STORE)
        q.store_2d(0, MemType.OUT, o_buf, t * rows * nb, rows * nb, 1, rows * nb)
        if t + 1 < m // rows:
            q.dep_push(Stage.STORE, Stage.COMPUTE)
    return q.synchronize(), rows


def pack_operands(cfg: VTAConfig, a: np.ndarray, w: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """DRAM layouts: A as (M, K/BI, BI); W as (N/BO, K/BI, BO, BI)."""
    m, k = a.shape
    n = w.shape[0]
    bi, bo = cfg.BLOCK_IN, cfg.BLOCK_OUT
    return (a.reshape(m, k // bi, bi),
            w.reshape(n // bo, bo, k // bi, bi).transpose(0, 2, 1, 3))


def reference(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``clip((A @ W^T) >> 8, -128, 127)`` as int8, computed in int64."""
    acc = (a.astype(np.int64) @ w.astype(np.int64).T).astype(np.int32)
    return np.clip(acc >> 8, -128, 127).astype(np.int8)


def bench(cfg: VTAConfig, size: int, layout: str, repeats: int, seed: int) -> Dict[str, object]:
    """Build, check and time one GEMM program; returns a row of the report."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (size, size), dtype=np.int8)
    w = rng.integers(-128, 128, (size, size), dtype=np.int8)
    prog, rows = build_gemm_program(cfg, size, size, size, layout)
    a_packed, w_packed = pack_operands(cfg, a, w)
    prog.write("a", a_packed)
    prog.write("w", w_packed)
    sim = FunctionalSimulator(cfg)
    stats = prog.run(sim)
    out = prog.read("out", np.int8, (size, size // cfg.BLOCK_OUT, cfg.BLOCK_OUT))
    out = out.reshape(size, size)
    if not np.array_equal(out, reference(a, w)):
        raise SystemExit(f"{layout}: simulator result differs from numpy")
    macs = size ** 3
    if stats.gemm_counter * cfg.BATCH * cfg.BLOCK_IN * cfg.BLOCK_OUT != macs:
        raise SystemExit(f"{layout}: gemm_counter {stats.gemm_counter} does not match {macs} MACs")
    times: List[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        prog.run(sim)
        times.append(time.perf_counter() - t0)
    best, median = min(times), statistics.median(times)
    return {"workload": f"gemm {size}x{size}x{size} int8", "uop_layout": layout,
            "tile_rows": rows, "instructions": prog.insn_count, "macs": macs,
            "time_min_s": round(best, 5), "time_median_s": round(median, 5),
            "mac_per_s_min_time": f"{macs / best:.3e}",
            "mac_per_s_median_time": f"{macs / median:.3e}",
            "repeats": repeats, "correct": True}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=512, help="M = K = N (default 512)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0xDEADB)
    parser.add_argument("--config", default="default")
    parser.add_argument("--layouts", nargs="+",
                        default=["cols-in-uops", "rows-in-uops", "block-per-insn"])
    parser.add_argument("--blas-threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--csv", default=str(ROOT / "docs" / "figures" / "bench_fsim.csv"))
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    if args.child is not None:  # measure in this process, report JSON rows
        rows = [dict(bench(cfg, args.size, layout, args.repeats, args.seed),
                     blas_threads=args.child) for layout in args.layouts]
        print(json.dumps(rows))
        return 0
    rows = []
    for threads in args.blas_threads:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(threads),
               "--size", str(args.size), "--repeats", str(args.repeats), "--seed", str(args.seed),
               "--config", args.config, "--layouts", *args.layouts]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            sys.stderr.write(done.stdout + done.stderr)
            return done.returncode
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    header = ["blas_threads", "uop_layout", "instructions", "time_min_s", "time_median_s",
              "mac_per_s_min_time", "mac_per_s_median_time"]
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in header]
    print(f"functional simulator, {rows[0]['workload']} ({rows[0]['macs']} MACs, checked against "
          f"numpy), config {cfg.name}, {args.repeats} repeats")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(str(r[h]).ljust(w) for h, w in zip(header, widths)))
    if args.csv:
        path = Path(args.csv)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
