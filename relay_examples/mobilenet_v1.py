"""MobileNet-1.0 (v1), quantised VTA-style to int8, built for ``ext_vta`` and ``llvm``: bit-exact check.

The float PyTorch model (:mod:`models`, random deterministic weights) has its BatchNorms folded,
is imported with ``torch.export``, calibrated on one random input and quantised with power-of-two
scales (:mod:`vta_ext.quantize`). The int8 Relax module is built with ``tvm.relax.build`` for
``ext_vta`` (VTA operators run on the functional simulator), once with the ``stock`` strategy and
once with ``csp-relaxed`` (``--strategies``), and for ``llvm``. The script prints the
quantisation accuracy against the float model, the build report, the fraction of MACs that ran on
VTA, the cycle-model totals of both strategies side by side and the wall times, and exits non-zero
unless every ``ext_vta`` output equals the llvm output to the bit.

Run: ``.venv/bin/python relay_examples/mobilenet_v1.py [--config default,pipelined] [--size 224]
[--seed 0] [--strategies stock,csp-relaxed]``
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from models import run_example  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_example("mobilenet_v1", __doc__.splitlines()[0]))
