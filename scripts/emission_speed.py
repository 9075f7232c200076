#!/usr/bin/env python
"""CPU per instruction of emitting and of timing the VTA programs a cold build makes.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/emission_speed.py resnet18 mobilenet_v2 \\
        [--size 224] [--json module.json ...] [--strategy csp-relaxed] [--repeat 5] \\
        [--csv docs/figures/emission_speed.csv] [--png docs/figures/emission_speed.png]

Each network (a model of ``relay_examples/models.py``, quantised with seed 0, or a saved Relax
module given with ``--json``) is built once for ``ext_vta`` under a fresh, empty
``TVM_CSP_EMBED_CACHE`` (a cold build), and every lowered program the build emits (candidates and
contenders alike) is kept with the buffers it was emitted into. Then, ``--repeat`` times, all of
them are emitted again into new command queues (``GeneratedProgram.emit`` and ``synchronize``) and
timed on the cycle model (``CycleModel.run_program``). The table gives CPU seconds
(``time.process_time``, min and median over the repeats) and microseconds per instruction. It
measures the ``vta_ext`` on ``PYTHONPATH`` (``PYTHONPATH=$PWD`` in a worktree): to compare two
trees, run it with each, back to back.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# after PYTHONPATH: ``PYTHONPATH=<tree>`` chooses the tree to measure
sys.path += [str(REPO), str(REPO / "relay_examples")]

FIELDS = ("network", "strategy", "programs", "insns", "emit_min_s", "emit_median_s",
          "emit_us_per_insn", "cycles_min_s", "cycles_median_s", "cycles_us_per_insn")


def _module(name: str, size: int):
    from models import quantized_example

    return quantized_example(name, size, 0)[1].mod


def measure(label: str, mod, strategy: str, repeat: int) -> dict:
    """Build ``mod`` cold, keep its emitted programs, then time re-emitting and re-timing them."""
    from tvm import relax

    import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
    import vta_ext
    from vta_ext.lower import codegen
    from vta_ext.runtime import CommandQueue
    from vta_ext.sim.cycles import CycleModel

    kept = []
    emit = codegen.GeneratedProgram.emit

    def keep(self, q, buffers):
        kept.append((self, q.config, [(n, b.nbytes) for n, b in q.buffers.items()],
                     list(buffers)))
        emit(self, q, buffers)

    with tempfile.TemporaryDirectory() as cache:
        old = os.environ.get("TVM_CSP_EMBED_CACHE")
        os.environ["TVM_CSP_EMBED_CACHE"] = cache
        codegen.GeneratedProgram.emit = keep
        try:
            with vta_ext.build_options(strategy=strategy):
                relax.build(mod, target=vta_ext.vta_target("default"))
        finally:
            codegen.GeneratedProgram.emit = emit
            if old is None:
                del os.environ["TVM_CSP_EMBED_CACHE"]
            else:
                os.environ["TVM_CSP_EMBED_CACHE"] = old

    def emit_all():
        programs = []
        for gen, config, allocs, names in kept:
            q = CommandQueue(config)
            buffers = {n: q.alloc(nbytes, n) for n, nbytes in allocs}
            gen.emit(q, {n: buffers[n] for n in names})
            programs.append(q.synchronize())
        return programs

    emit_s, cycles_s = [], []
    for _ in range(repeat):
        start = time.process_time()
        programs = emit_all()
        emit_s.append(time.process_time() - start)
        start = time.process_time()
        for p in programs:
            CycleModel(p.config).run_program(p)
        cycles_s.append(time.process_time() - start)
    insns = sum(p.insn_count for p in programs)
    return {"network": label, "strategy": strategy, "programs": len(programs), "insns": insns,
            "emit_min_s": round(min(emit_s), 4), "emit_median_s": round(statistics.median(emit_s), 4),
            "emit_us_per_insn": round(1e6 * min(emit_s) / max(insns, 1), 3),
            "cycles_min_s": round(min(cycles_s), 4),
            "cycles_median_s": round(statistics.median(cycles_s), 4),
            "cycles_us_per_insn": round(1e6 * min(cycles_s) / max(insns, 1), 3)}


def _plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(rows)), 3.8))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["emit_us_per_insn"] for r in rows], 0.4, label="emission")
    ax.bar([x + 0.2 for x in xs], [r["cycles_us_per_insn"] for r in rows], 0.4,
           label="cycle model")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{r['network']}\n{r['programs']} programs" for r in rows], fontsize=8)
    ax.set_ylabel("CPU µs per instruction (min)")
    ax.set_title("Emitting and timing the programs of a cold build")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", help="models of relay_examples/models.py")
    parser.add_argument("--json", nargs="*", default=[], help="saved Relax modules (tvm.ir.save_json)")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--strategy", default="csp-relaxed")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--csv", type=Path)
    parser.add_argument("--png", type=Path)
    args = parser.parse_args(argv)
    if not args.models and not args.json:
        parser.error("name at least one model or --json module")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    import tvm

    rows = []
    for name in args.models:
        rows.append(measure(f"{name} {args.size}", _module(name, args.size), args.strategy,
                            args.repeat))
    for path in args.json:
        rows.append(measure(Path(path).stem, tvm.ir.load_json(Path(path).read_text()),
                            args.strategy, args.repeat))
    print(f"{'network':<22}{'programs':>9}{'insns':>9}{'emit s':>9}{'µs/insn':>9}"
          f"{'cycles s':>10}{'µs/insn':>9}")
    for r in rows:
        print(f"{r['network']:<22}{r['programs']:>9}{r['insns']:>9}{r['emit_min_s']:>9.3f}"
              f"{r['emit_us_per_insn']:>9.2f}{r['cycles_min_s']:>10.3f}{r['cycles_us_per_insn']:>9.2f}")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, FIELDS)
            writer.writeheader()
            writer.writerows(rows)
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        _plot(rows, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
