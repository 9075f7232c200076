#!/usr/bin/env python
"""The epilogue off the GEMM path (issue 18, item 3): instruction counts and cycles, before/after.

**Per layer** (one run, both programs built from the same plan): each layer is planned as
``csp-relaxed`` with ``objective="cycles"`` would plan it (the chosen embedding and the default
``"cycles"`` knob point), then compiled twice with :func:`tvm_csp_embed.codegen.build_gemm`:

* ``reset`` (before): every output tile's accumulator zeroed by GEMM reset micro-ops (the stock
  templates' rule, what the CSP code did before);
* ``fill`` (after): zeroed by LOADs of the accumulator made only of padding (one cycle per element
  on the compute module, no micro-op, no DRAM byte).

Both run once on the functional simulator with random int8 data / weights and an int32 bias; their
outputs are compared with a numpy convolution + requantisation (bias, shift 8, clip [-128, 127]).
The table gives the GEMM micro-ops, reset micro-ops, ALU micro-ops, data loads (INP/WGT/ACC),
padding-only ACC fills, micro-op loads and the cycle model's total and compute-module busy cycles,
on ``default`` and ``pipelined``. Layers: the 3-channel stem (ResNet-18 C1 at 224, 7x7 s2, fused
(c, r, s) 147 -> 160), ResNet-18 C5 (3x3, 128 -> 128 at 28x28) and two thin DeepBench layers
(id 6: 1 channel, 3x3; id 10: 3 channels, 3x3 s2, fused 27 -> 32).

**Network** (``--network OUT.json``): the quantised ResNet-18 224 (``models.quantized_example``)
built for ``ext_vta`` under ``csp-relaxed`` with ``objective="cycles"`` on ``default`` and
``pipelined``, run once and compared with the llvm build bit for bit; the VTA calls' cycles summed
(``scripts/resnet_cycles.py``'s ``build_and_run``, the cycle model per call). Run it with this tree and
with the tree before the change (the code it compares against has no switch) and pass both JSON
files to ``--compare BEFORE.json AFTER.json``.

Usage::

    OPENBLAS_NUM_THREADS=1 python scripts/epilogue_counts.py            # layers: CSV, PNG, table
    OPENBLAS_NUM_THREADS=1 python scripts/epilogue_counts.py --network after.json
    python scripts/epilogue_counts.py --compare before.json after.json

Writes ``docs/figures/epilogue_counts.csv`` and ``epilogue_counts.png``.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# resnet_cycles puts the repository, relay_examples and scripts on the path when imported
from resnet_cycles import FIG, build_and_run  # noqa: E402

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
CONFIGS = ("default", "pipelined")
EPILOGUE = (("bias",), ("shr", 8), ("clip", -128, 127))
#: name -> (n, c, h, w, k, r, s, stride, pad)
LAYERS = {
    "ResNet-18 C1 (stem)": (1, 3, 224, 224, 64, 7, 7, 2, 3),
    "ResNet-18 C5": (1, 128, 28, 28, 128, 3, 3, 1, 1),
    "DeepBench 6 (c=1)": (1, 1, 48, 480, 16, 3, 3, 1, 1),
    "DeepBench 10 (c=3)": (1, 3, 108, 108, 64, 3, 3, 2, 1),
}
MODES = ("reset", "fill")
FIELDS = ["layer", "config", "mode", "embedding", "knobs", "gemm_uops", "reset_uops", "alu_uops",
          "inp_loads", "wgt_loads", "acc_loads", "acc_fills", "uop_loads", "insns", "cycles",
          "compute_busy", "bit_exact"]


def _matched(n, c, h, w, k, r, s, stride, pad):
    from tvm import relax

    from vta_ext.strategy import MatchedOp

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, h, w), "int8"))
    wt = relax.Var("w", relax.TensorType((k, c, r, s), "int8"))
    b = relax.Var("b", relax.TensorType((1, k, 1, 1), "int32"))
    core = bb.normalize(relax.op.nn.conv2d(x, wt, strides=stride, padding=pad, out_dtype="int32"))
    return MatchedOp("conv2d", core, [x, wt], b, EPILOGUE, "conv")


def reference(x, w, b, stride, pad):
    """Direct NCHW convolution (int64, one einsum per filter tap), + bias, >> 8, clip, int8."""
    import numpy as np

    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - s) // stride + 1
    acc = np.zeros((n, k, oh, ow), np.int64)
    for i in range(r):
        for j in range(s):
            patch = xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            acc += np.einsum("nchw,kc->nkhw", patch, w[:, :, i, j].astype(np.int64))
    out = acc.astype(np.int32).astype(np.int64) + b.astype(np.int64)
    return np.clip(out >> 8, -128, 127).astype(np.int8)


def counts(program) -> dict:
    """Micro-op iterations and load instructions of a program."""
    from vta_ext.isa import AluInsn, GemmInsn, MemInsn, MemType, Opcode

    out = {f: 0 for f in ("gemm_uops", "reset_uops", "alu_uops", "inp_loads", "wgt_loads",
                          "acc_loads", "acc_fills", "uop_loads")}
    for insn in program.insns:
        if isinstance(insn, (GemmInsn, AluInsn)):
            n = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
            key = "alu_uops" if isinstance(insn, AluInsn) else (
                "reset_uops" if insn.reset_reg else "gemm_uops")
            out[key] += n
        elif isinstance(insn, MemInsn) and insn.opcode == Opcode.LOAD and insn.x_size:
            mem = MemType(insn.memory_type)
            if mem == MemType.ACC and insn.y_size == 0:
                out["acc_fills"] += 1
            else:
                out[f"{mem.name.lower()}_loads"] += 1
    out["insns"] = program.insn_count
    return out


def layer_rows(name, shape) -> list:
    import numpy as np

    import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
    import vta_ext
    from tvm_csp_embed.codegen import build_gemm
    from tvm_csp_embed.codegen.build import resolve_knobs
    from tvm_csp_embed.strategy import packed_of
    from vta_ext.config import load_config
    from vta_ext.sim.cycles import CycleModel
    from vta_ext.strategy import get_template

    n, c, h, w, k, r, s, stride, pad = shape
    rng = np.random.default_rng(18)
    x = rng.integers(-128, 128, (n, c, h, w)).astype(np.int8)
    wt = rng.integers(-128, 128, (k, c, r, s)).astype(np.int8)
    b = rng.integers(-(1 << 14), 1 << 14, (1, k, 1, 1)).astype(np.int32)
    ref = reference(x, wt, b, stride, pad)
    rows = []
    for cname in CONFIGS:
        cfg = load_config(cname)
        template = get_template("conv2d", "csp-relaxed")
        with vta_ext.build_options(strategy="csp-relaxed", objective="cycles"):
            plan = template.plan(_matched(n, c, h, w, k, r, s, (stride, stride), (pad, pad)), cfg)
        if plan.workload.stock:
            print(f"{name} on {cname}: the stock template's plan is chosen; not a CSP program")
            continue
        pg = packed_of(plan.workload, cfg)
        arrays = {"data": x, "weight": wt}
        a = pg.operands["A"].host.pack_numpy(arrays[pg.operands["A"].tensor])
        bb = pg.operands["B"].host.pack_numpy(arrays[pg.operands["B"].tensor])
        bias = pg.bias_layout(b.shape).pack_numpy(b)
        point, _ = resolve_knobs(cfg, pg, EPILOGUE, "cycles")   # one point for both programs
        for mode in MODES:
            compiled = build_gemm(cfg, pg, EPILOGUE, point, acc_init=mode)
            out, _ = compiled.run(a, bb, bias)
            got = pg.operands["C"].host.unpack_numpy(out)
            rep = CycleModel(cfg).run_program(compiled.program)
            rows.append({"layer": name, "config": cname, "mode": mode,
                         "embedding": f"{pg.embedding.mapping_str()} ({plan.workload.layout})",
                         "knobs": " ".join(f"{kk}={v}" for kk, v in vars(compiled.knobs).items()),
                         **counts(compiled.program), "cycles": rep.total_cycles,
                         "compute_busy": rep.modules["compute"].busy,
                         "bit_exact": bool(np.array_equal(got, ref))})
    return rows


def table(rows) -> str:
    lines = ["| layer | config | embedding | init | GEMM uops | reset uops | ALU uops | INP/WGT/ACC "
             "loads | ACC fills | UOP loads | cycles | compute busy | after/before | bit-exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    before = {(r["layer"], r["config"]): r for r in rows if r["mode"] == "reset"}
    for r in rows:
        ratio = r["cycles"] / before[(r["layer"], r["config"])]["cycles"]
        lines.append(f"| {r['layer']} | {r['config']} | {r['embedding']} | {r['mode']} | "
                     f"{r['gemm_uops']:,} | {r['reset_uops']:,} | {r['alu_uops']:,} | "
                     f"{r['inp_loads']:,}/{r['wgt_loads']:,}/{r['acc_loads']:,} | "
                     f"{r['acc_fills']:,} | {r['uop_loads']:,} | {r['cycles']:,} | "
                     f"{r['compute_busy']:,} | {ratio:.3f} | {'yes' if r['bit_exact'] else 'NO'} |")
    return "\n".join(lines)


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['layer']}\n{r['config']}" for r in rows if r["mode"] == "reset"]
    fill = {(r["layer"], r["config"]): r["cycles"] for r in rows if r["mode"] == "fill"}
    ratios = [fill[(r["layer"], r["config"])] / r["cycles"] for r in rows if r["mode"] == "reset"]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.bar(range(len(ratios)), ratios, color="tab:blue")
    ax.axhline(1, color="k", lw=0.5)
    ax.set_xticks(range(len(ratios)), labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("cycles, fill / reset")
    ax.set_title("Accumulator zeroed by padding-only LOADs vs GEMM resets (cycle model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def network(out_path: Path) -> dict:
    """ResNet-18 224 under csp-relaxed, objective cycles: total cycles per config (and equality)."""
    import tvm
    from tvm import relax

    import tvm_csp_embed  # noqa: F401
    import vta_ext
    from models import quantized_example
    from vta_ext.executor import cycle_report

    _, qmodel, _, data = quantized_example("resnet18", 224, 0)
    ref = relax.VirtualMachine(relax.build(qmodel.mod, target="llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(data))[0].numpy()
    result = {}
    for cname in CONFIGS:
        t = time.perf_counter()
        with vta_ext.build_options(strategy="csp-relaxed", objective="cycles"):
            calls, equal, build_s, run_s = build_and_run(qmodel.mod, cname, data, ref)
        total = sum(cycle_report(key).total_cycles for _, _, key in calls)
        result[cname] = {"cycles": total, "bit_exact": equal, "calls": len(calls),
                         "seconds": round(time.perf_counter() - t, 1)}
        print(f"{cname}: {total:,} cycles, {len(calls)} VTA calls, output "
              f"{'equals' if equal else 'DIFFERS FROM'} llvm", flush=True)
    out_path.write_text(json.dumps(result, indent=1))
    return result


def compare(before: Path, after: Path) -> str:
    b, a = json.loads(before.read_text()), json.loads(after.read_text())
    lines = ["| ResNet-18 224, csp-relaxed, objective cycles | before | after | after/before | "
             "bit-exact |", "|---|---|---|---|---|"]
    for cname in CONFIGS:
        lines.append(f"| {cname} | {b[cname]['cycles']:,} | {a[cname]['cycles']:,} | "
                     f"{a[cname]['cycles'] / b[cname]['cycles']:.4f} | "
                     f"{'yes' if b[cname]['bit_exact'] and a[cname]['bit_exact'] else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--network", type=Path, help="build and time ResNet-18 224; write JSON here")
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"),
                    help="print the network table of two --network JSON files")
    args = ap.parse_args(argv)
    if args.compare:
        print(compare(*args.compare))
        return 0
    if args.network:
        network(args.network)
        return 0
    rows = []
    from tqdm import tqdm

    for name, shape in tqdm(LAYERS.items(), desc="layers"):
        rows += layer_rows(name, shape)
    FIG.mkdir(parents=True, exist_ok=True)
    with open(FIG / "epilogue_counts.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=FIELDS)
        wr.writeheader()
        wr.writerows(rows)
    plot(rows, FIG / "epilogue_counts.png")
    print(table(rows))
    return 0 if all(r["bit_exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
