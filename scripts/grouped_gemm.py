#!/usr/bin/env python
"""Narrow grouped convolutions (channels per group < BLOCK_IN) on the GEMM block-diagonal unit
against the CSP plan alone (:mod:`tvm_csp_embed.grouped`).

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/grouped_gemm.py [resnext50_32x4d] \\
        [--size 224] [--configs default pipelined pynq] [--objectives end-to-end cycles]

For each configuration and objective the network (``relay_examples/models.py``, quantised) is built
under ``csp-relaxed`` twice:

* **before**: the ``group_conv2d`` template of ``csp-relaxed`` is the CSP plan alone
  (:class:`~tvm_csp_embed.strategy.CspGemmTemplate`, registered back for the run);
* **after**: the default build, where each narrow grouped conv takes the CSP plan or the
  block-diagonal program, whichever the objective scores better.

Nothing is run: the cycles of a program do not depend on the data. Prints per narrow grouped
layer of the *after* build the device, modelled cycles and the report's sentence of the choice,
and per build the VTA cycles, floor / cycles, the grouped conv2d share of the VTA cycles and the
end-to-end estimate (:meth:`vta_ext.BuildReport.cost_summary`).
"""
import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "relay_examples")]

import tvm  # noqa: E402

import tvm_csp_embed  # noqa: E402,F401  (registers the CSP strategies)
import vta_ext  # noqa: E402
from tvm_csp_embed.grouped import NarrowGroupTemplate  # noqa: E402
from tvm_csp_embed.strategy import CspGemmTemplate  # noqa: E402
from vta_ext.strategy import register_template  # noqa: E402
from models import quantized_example  # noqa: E402

KIND, STRATEGY = "group_conv2d", "csp-relaxed"
#: the report's sentence of the choice between the units
CHOICE = re.compile(r"; ([^;]*) chosen by csp-relaxed over the other unit: (.*?)(, epilogue|$)")


def build(mod, config: str, objective: str, before: bool):
    """The build report of ``mod`` (``before``: the CSP plan alone for grouped convs)."""
    register_template(KIND, STRATEGY, CspGemmTemplate(KIND, STRATEGY) if before
                      else NarrowGroupTemplate(STRATEGY))
    try:
        with vta_ext.build_options(strategy=STRATEGY, objective=objective):
            tvm.relax.build(mod, target=vta_ext.vta_target(config))
    finally:
        register_template(KIND, STRATEGY, NarrowGroupTemplate(STRATEGY))
    return vta_ext.last_build_report()


def totals(report) -> str:
    grouped = sum(report.cycles(p) for p in report.on_vta if p.kind == KIND and p.call is not None)
    return (f"VTA {report.vta_cycles:,} cycles, floor / cycles {report.vta_efficiency:.3f}, "
            f"grouped share {grouped / report.vta_cycles:.1%}; {report.cost_summary()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="resnext50_32x4d")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--configs", nargs="+", default=["default", "pipelined", "pynq"])
    parser.add_argument("--objectives", nargs="+", default=["end-to-end", "cycles"])
    args = parser.parse_args()
    mod = quantized_example(args.model, args.size)[1].mod
    for objective in args.objectives:
        for config in args.configs:
            old = build(mod, config, objective, before=True)
            print(f"## {args.model} {args.size} {config} objective {objective}")
            print(f"before: {totals(old)}")
            new = build(mod, config, objective, before=False)
            print(f"after:  {totals(new)}")
            for p in new.placements:
                text = (p.detail if p.device == "vta" else p.reason) or ""
                found = CHOICE.search(text)
                if not found and "block-diagonal" not in text:
                    continue
                cycles = f"{new.cycles(p):,}" if p.device == "vta" else "-"
                why = f"{found.group(1)}: {found.group(2)}" if found else text
                shape = text.split(";")[0] if p.device == "vta" else ""
                print(f"  {p.name} {p.device} {shape} | {cycles} | {why}")

if __name__ == "__main__":
    main()
