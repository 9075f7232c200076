"""Cycles of the operators without a stock template (batched matmul, conv1d, dilated conv2d) on VTA
under the CSP strategies, against what ``stock`` can do with the model rewritten for it.

For one realistic shape of each operator (attention heads 12x64x64 @ 12x64x64, plain and with
``permute_dims`` on B; conv1d 1x64x256 * 64x64x3 p1; dilated 3x3 d2 on 1x64x28x28) the script
builds the Relax module with ``relax.build(mod, target=ext_vta)`` under each CSP strategy, runs it
on the functional simulator, checks it bit for bit against the llvm build of the same module, and
reads the cycles of the VTA program from the cycle model. The stock rewrites are
``stock`` builds of equivalent modules: the dilated conv2d as a conv2d with the zero-dilated 5x5
filter (25/9 the multiply-accumulates), the conv1d as a conv2d of height 1 (1x3 filter), one
attention head as a dense layer (x12 for the heads, one VTA program each).

Writes ``docs/figures/new_ops.csv`` (``--out``) and prints a table::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/new_ops_figures.py --configs default pipelined
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np
from tvm import relax

REPO = Path(__file__).resolve().parents[1]


def _tail(bb, y, bias=None, shift=6, clip=(-128, 127)):
    if bias is not None:
        y = bb.emit(relax.op.add(y, bias))
    y = bb.emit(relax.op.right_shift(y, relax.const(shift, "int32")))
    return bb.emit(relax.op.astype(bb.emit(relax.op.clip(y, *clip)), "int8"))


def _module(params, body):
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, dtype)) for name, shape, dtype in params]
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *args))
        bb.emit_func_output(out)
    return bb.get()


def bmm(b, n, k, m, transpose):
    def body(bb, a, w):
        rhs = bb.emit(relax.op.permute_dims(w, [0, 2, 1])) if transpose else w
        return _tail(bb, bb.emit(relax.op.matmul(a, rhs, out_dtype="int32")))
    return _module([("a", (b, n, k), "int8"), ("w", (b, m, k) if transpose else (b, k, m), "int8")],
                   body)


def dense(n, k, m):
    def body(bb, x, w):
        return _tail(bb, bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w)),
                                                 out_dtype="int32")))
    return _module([("x", (n, k), "int8"), ("w", (m, k), "int8")], body)


def conv(x_shape, w_shape, padding, dilation=1):
    """conv1d (3-D shapes) or conv2d (4-D) + bias + ``>> 8``, clip [0, 127]."""
    one_d = len(x_shape) == 3
    bias = (1, w_shape[0], 1) if one_d else (1, w_shape[0], 1, 1)

    def body(bb, x, w, b):
        op = relax.op.nn.conv1d if one_d else relax.op.nn.conv2d
        y = bb.emit(op(x, w, padding=padding, dilation=dilation, out_dtype="int32"))
        return _tail(bb, y, b, 8, (0, 127))
    return _module([("x", x_shape, "int8"), ("w", w_shape, "int8"), ("b", bias, "int32")], body)


#: (operator, module, strategies, repeat): repeat = how many VTA programs of the module the
#: operator takes (the stock rewrite of the attention heads: one dense per head)
CASES = [
    ("batched matmul 12x64x64 @ 12x64x64", lambda: bmm(12, 64, 64, 64, False), "csp", 1),
    ("batched matmul 12x64x64 @ (12x64x64)^T", lambda: bmm(12, 64, 64, 64, True), "csp", 1),
    ("  stock rewrite: 12 x dense 64x64 @ (64x64)^T", lambda: dense(64, 64, 64), "stock", 12),
    ("conv1d 1x64x256 * 64x64x3 p1", lambda: conv((1, 64, 256), (64, 64, 3), 1), "csp", 1),
    ("  stock rewrite: conv2d 1x64x1x256 * 64x64x1x3", lambda: conv((1, 64, 1, 256), (64, 64, 1, 3),
                                                                     (0, 1, 0, 1)), "stock", 1),
    ("dilated conv2d 1x64x28x28 * 64x64x3x3 d2 p2", lambda: conv((1, 64, 28, 28), (64, 64, 3, 3), 2, 2),
     "csp", 1),
    ("  stock rewrite: conv2d, zero-dilated 5x5 filter", lambda: conv((1, 64, 28, 28), (64, 64, 5, 5), 2),
     "stock", 1),
]


def _shape(expr):
    return tuple(int(d) for d in expr.ty.shape)


def run_module(mod, target, arrays):
    """Build ``mod`` for ``target`` and run ``main`` once on ``arrays`` (numpy output)."""
    import tvm

    vm = relax.VirtualMachine(relax.build(mod, target=target), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def measure(mod, config: str, strategy: str):
    """``(cycles, bit-exact vs llvm, report reason)`` of ``mod``'s one VTA operator."""
    import vta_ext
    from vta_ext.executor import cycle_report
    from vta_ext.target import vta_target

    rng = np.random.default_rng(1)
    arrays = [rng.integers(-128, 128, _shape(p)).astype(np.int8) if str(p.ty.dtype) == "int8" else
              rng.integers(-(1 << 14), 1 << 14, _shape(p)).astype(np.int32) for p in mod["main"].params]
    vta_ext.clear_run_log()
    with vta_ext.build_options(strategy=strategy):
        got = run_module(mod, vta_target(config), arrays)
    report = vta_ext.last_build_report()
    keys = [r.key for r in vta_ext.run_log()]
    if len(report.on_vta) != 1 or len(keys) != 1:
        raise RuntimeError(f"expected one VTA operator, got {report}")
    exact = bool(np.array_equal(got, run_module(mod, "llvm", arrays)))
    return cycle_report(keys[0]).total_cycles, exact, report.on_vta[0].reason


def main(argv=None) -> int:
    import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=["default", "pipelined"])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "figures" / "new_ops.csv")
    args = ap.parse_args(argv)
    rows = []
    for config in args.configs:
        for name, make, family, repeat in CASES:
            strategies = ["csp-relaxed", "csp-strict"] if family == "csp" else ["stock"]
            for strategy in strategies:
                cycles, exact, reason = measure(make(), config, strategy)
                rows.append(dict(config=config, operator=name.strip(), strategy=strategy,
                                 programs=repeat, cycles=cycles * repeat, bit_exact=exact,
                                 placement=reason))
                print(f"{config:10s} {name:50s} {strategy:12s} {cycles * repeat:>11,} cycles"
                      f"{f' ({repeat} x {cycles:,})' if repeat > 1 else ''}  bit-exact {exact}",
                      flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out}")
    return 0 if all(r["bit_exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
