#!/usr/bin/env python
"""Share of a model's conv/matmul MACs placed on VTA, per strategy, and bit-exactness vs llvm.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/mac_share.py regnet_x_1_6gf resnext50_32x4d

Each model of ``relay_examples/models.py`` is quantised (power-of-two quantiser, 32x32 input, seed
0), built for llvm and for ``ext_vta`` under ``stock`` and ``csp-relaxed``, and run once; the MACs
are attributed from the build report (``models.mac_placement``).
"""
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "relay_examples")]

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_csp_embed  # noqa: E402,F401  (registers the CSP strategies)
import vta_ext  # noqa: E402
from vta_ext.quantize import op_macs  # noqa: E402
from models import mac_placement, quantized_example  # noqa: E402


def _first(out):
    return out if hasattr(out, "numpy") else out[0]


def main(names) -> int:
    print(f"{'model':<20} {'strategy':<12} {'MACs on VTA':>11} {'CPU ops':>7} {'bit-exact':>9} {'build+run':>9}")
    for name in names:
        _, qmodel, _, data = quantized_example(name, 32, 0)
        mod = qmodel.mod
        macs = op_macs(mod)
        ref = _first(relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())["main"](
            tvm.runtime.tensor(data))).numpy()
        for strategy in ("stock", "csp-relaxed"):
            start = time.time()
            with vta_ext.build_options(strategy=strategy):
                executable = relax.build(mod, target="ext_vta")
            share = mac_placement(macs, vta_ext.last_build_report())
            out = _first(relax.VirtualMachine(executable, tvm.cpu())["main"](
                tvm.runtime.tensor(data))).numpy()
            print(f"{name:<20} {strategy:<12} {100 * share['vta'] / share['total']:>10.1f}% "
                  f"{len(share['cpu_ops']):>7} {str(np.array_equal(out, ref)):>9} "
                  f"{time.time() - start:>8.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["regnet_x_1_6gf", "resnext50_32x4d"]))
