#!/usr/bin/env python
"""Dump one cold build's decisions per operator, to diff a build-time change before and after.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/plan_dump.py resnext50_32x4d \\
        --size 224 --config default --strategy csp-relaxed --out /tmp/before.txt
    ... (change the code) ...
    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/plan_dump.py resnext50_32x4d ... --out /tmp/after.txt
    diff /tmp/before.txt /tmp/after.txt

The model is quantised as :mod:`scripts.build_time` does (power-of-two quantiser, seed 0) and
built once with a fresh, empty ``TVM_CSP_EMBED_CACHE`` (a cold build; the directory is removed
afterwards). The dump holds, in order: the build report's table, one JSON line per placement (its
device, reason, report text, plan summary, padding, MACs; for a VTA operator also its
:meth:`~vta_ext.report.BuildReport.explain` text: floor, modelled cycles, efficiency), one JSON
line per VTA program (its operator key, instruction count, the SHA-256 prefixes of its encoded
instructions and of its DRAM image, and its cycles on the cycle model), then the build's VTA cycles, host layout bytes and CPU
MACs. A change that keeps every plan, program and report sentence leaves the dump unchanged, byte
for byte; the build's wall seconds are printed, not dumped.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "relay_examples")]

#: the placement fields the dump records
FIELDS = ("op", "device", "reason", "detail", "name", "layer", "kind", "plan", "padding", "macs",
          "elements", "packed_elements", "call")


def dump_lines(report) -> list:
    """The dump of ``report`` (the :class:`~vta_ext.report.BuildReport` of the build
    that just ran in this process: its programs are read from the executor's memo)."""
    from vta_ext import executor
    from vta_ext.isa import encode_stream
    from vta_ext.sim.cycles import CycleModel

    lines = [str(report)]
    for p in report.placements:
        lines.append(json.dumps({k: getattr(p, k) for k in FIELDS}))
        if p.device == "vta":   # its floor, modelled cycles and efficiency
            lines.append(report.explain(p.name or p.op))
    for key in report.vta_keys:
        prog = executor.compiled_op(key).program
        lines.append(json.dumps({
            "key": key, "insns": len(prog.insns),
            "insn_sha": hashlib.sha256(encode_stream(prog.config, prog.insns)).hexdigest()[:24],
            "dram_sha": hashlib.sha256(prog.dram.tobytes()).hexdigest()[:24],
            "cycles": CycleModel(prog.config).run_program(prog).total_cycles}, sort_keys=True))
    lines.append(f"vta_cycles {report.vta_cycles} layout_bytes {report.layout_bytes} "
                 f"cpu_macs {report.cpu_macs}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--config", default="default")
    ap.add_argument("--strategy", default="csp-relaxed")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    cache = Path(tempfile.mkdtemp(prefix="plan_dump_cache_"))
    os.environ["TVM_CSP_EMBED_CACHE"] = str(cache)     # before tvm_csp_embed reads it
    try:
        import tvm
        from models import quantized_example
        from tvm import relax

        import tvm_csp_embed  # noqa: F401 -- registers the CSP strategies
        import vta_ext

        _, qmodel, _, _ = quantized_example(args.model, args.size, 0)
        start = time.perf_counter()
        with vta_ext.build_options(strategy=args.strategy):
            relax.build(qmodel.mod, target=vta_ext.vta_target(args.config))
        seconds = time.perf_counter() - start
        report = vta_ext.last_build_report()
        args.out.write_text("\n".join(dump_lines(report)) + "\n")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"{args.model} {args.size} {args.config} {args.strategy}: cold build {seconds:.2f} s, "
          f"VTA cycles {report.vta_cycles:,}; dump in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
