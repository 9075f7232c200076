"""Drop-in fidelity of the stock conv2d template against the original VTA stack.

Builds ResNet-18 C2 (56x56, 64->64, 3x3, pad 1, stride 1) with the original fallback schedule and
the original integration test's compute (conv >> 8, + bias, clip [0,127], int8) on the ``apache``
preset (the original design, no extensions), runs it once on the functional simulator, checks it
against numpy, and prints our counters next to those the original stack measured (TVM v0.18 +
apache fsim). Writes ``docs/figures/conv2d_fidelity.csv``.

Run: ``.venv/bin/python scripts/conv2d_fidelity.py``
"""
from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np

from vta_ext.config import load_config
from vta_ext.sim import FunctionalSimulator
from vta_ext.templates.conv2d import build_conv2d
from vta_ext.templates.epilogue import EPILOGUE_ORIGINAL
from vta_ext.templates.workload import Conv2dWorkload

#: counters of one C2 call measured on the original stack (issue text)
ORIGINAL = {"inp_load_nbytes": 7_054_336, "wgt_load_nbytes": 115_605_504, "acc_load_nbytes": 802_816,
            "out_store_nbytes": 200_704, "gemm_counter": 451_584, "alu_counter": 50_176}


def numpy_reference(data, kernel, bias):
    """Packed-layout conv2d (int64) -> >> 8 -> + bias -> clip [0,127] -> int8."""
    n, cb, h, w, b, ci = data.shape
    ob, _, kh, kw, co, _ = kernel.shape
    x = data.transpose(0, 4, 1, 5, 2, 3).reshape(n * b, cb * ci, h, w).astype(np.int64)
    wt = kernel.transpose(0, 4, 1, 5, 2, 3).reshape(ob * co, cb * ci, kh, kw).astype(np.int64)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((n * b, ob * co, h, w), np.int64)
    for i in range(kh):
        for j in range(kw):
            acc += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + w], wt[:, :, i, j])
    acc = (acc.astype(np.int32) >> 8) + bias.transpose(0, 4, 1, 5, 2, 3).reshape(1, ob * co, 1, 1)
    out = np.clip(acc, 0, 127).astype(np.int8)
    return out.reshape(n, b, ob, co, h, w).transpose(0, 2, 4, 5, 1, 3)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default="docs/figures/conv2d_fidelity.csv")
    args = parser.parse_args(argv)
    cfg = load_config("apache")
    wl = Conv2dWorkload(1, 56, 56, 64, 64, 3, 3, 1, 1, 1, 1)
    start = time.perf_counter()
    conv = build_conv2d(cfg, wl, EPILOGUE_ORIGINAL, knobs="fallback")
    build_s = time.perf_counter() - start
    rng = np.random.default_rng(0xDEADB)
    data = rng.integers(-128, 128, (1, 4, 56, 56, 1, 16)).astype(np.int8)
    kernel = rng.integers(-128, 128, (4, 4, 3, 3, 16, 16)).astype(np.int8)
    bias = rng.integers(-(1 << 14), 1 << 14, (1, 4, 1, 1, 1, 16)).astype(np.int32)
    start = time.perf_counter()
    out, stats = conv.run(data, kernel, bias, simulator=FunctionalSimulator(cfg))
    sim_s = time.perf_counter() - start
    exact = np.array_equal(out, numpy_reference(data, kernel, bias))
    rows = []
    print(f"ResNet-18 C2, fallback schedule, {conv.program.insn_count:,} instructions; "
          f"build {build_s:.2f} s, simulation {sim_s:.2f} s; bit-exact vs numpy: {exact}")
    print(f"{'counter':<18} {'original':>14} {'ours':>14}  equal")
    for name, value in stats.as_dict().items():
        original = ORIGINAL.get(name)
        rows.append({"counter": name, "original": original if original is not None else "",
                     "ours": value, "equal": "" if original is None else value == original})
        print(f"{name:<18} {original if original is not None else '-':>14,} {value:>14,}  "
              f"{'' if original is None else ('yes' if value == original else 'NO')}"
              if original is not None else f"{name:<18} {'-':>14} {value:>14,}  (may differ)")
    Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    matched = all(row["equal"] for row in rows if row["original"] != "")
    return 0 if exact and matched else 1


if __name__ == "__main__":
    raise SystemExit(main())
