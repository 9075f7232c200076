#!/usr/bin/env python
"""Could the offload patterns be declared with ``tvm.relax.dpl`` and TVM's backend pattern
registry, as TVM's own BYOC backends (cutlass, dnnl) declare theirs? The evidence behind the note
in ``docs/templates-api.md`` ("Declaring the patterns with tvm.relax.dpl").

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/dpl_patterns.py

1. A conv2d core and its requantisation tail of *any* order and length up to ``--depth`` stages
   (bias / scalar or per-channel add and multiply, right shift, clip, int32 casts), declared as one
   dpl pattern, registered with ``pattern_registry.register_patterns`` and applied with
   ``FuseOpsByPattern``; the constraints dpl cannot state (at most one per-channel add) in the
   pattern's check function. Each tail is also matched by the offload pass's own matcher
   (``vta_ext.offload.match``): the table prints both.
2. The hardswish core ``x * clip(x + c, lo, hi)``: dpl requires the two ``x`` to be one expression.
3. ResNet-18 (32x32, power-of-two quantiser): conv2d cores found by each, and the time.
"""
import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "relay_examples")]

import numpy as np  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.backend.pattern_registry import get_patterns_with_prefix, register_patterns  # noqa: E402
from tvm.relax.dpl import is_const, is_op, wildcard  # noqa: E402

from vta_ext.config import load_config  # noqa: E402
from vta_ext.offload.rewrite import Offloader  # noqa: E402

PREFIX = "vta_dpl_demo"
#: tails of the quantisers (power of two; PT2E / QDQ fixed point) and one the pass refuses
TAILS = {
    "bias, >> 6, clip": ["bias", ("shr", 6), ("clip", 0, 127)],
    "bias, >> 4, * 77, + 2^7, >> 8, clip": ["bias", ("shr", 4), ("mul", 77), ("add", 128), ("shr", 8),
                                           ("clip", -128, 127)],
    "bias, >> 4, * M[c], + 2^7, >> 8, clip": ["bias", ("shr", 4), "mulv", ("add", 128), ("shr", 8),
                                             ("clip", -128, 127)],
    "bias, bias, >> 6 (refused)": ["bias", "bias", ("shr", 6)],
}


def conv_module(tail, seed=0):
    """``conv2d(int8) -> tail -> astype int8`` with constant weights and per-channel tensors."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "int8"))

    def per_channel(lo, hi):
        return relax.const(rng.integers(lo, hi, (1, 16, 1, 1)).astype("int32"))

    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.integers(-128, 128, (16, 16, 3, 3)).astype("int8"))
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1, out_dtype="int32"))
            for st in tail:
                if st == "bias":
                    y = bb.emit(relax.op.add(y, per_channel(-99, 99)))
                elif st == "mulv":
                    y = bb.emit(relax.op.multiply(y, per_channel(1, 99)))
                elif st[0] == "clip":
                    y = bb.emit(relax.op.clip(y, st[1], st[2]))
                else:
                    op = {"shr": relax.op.right_shift, "mul": relax.op.multiply, "add": relax.op.add}
                    y = bb.emit(op[st[0]](y, relax.const(st[1], "int32")))
            out = bb.emit_output(bb.emit(relax.op.astype(y, "int8")))
        bb.emit_func_output(out)
    return bb.get()


def any_tail(start, depth: int):
    """``start`` followed by up to ``depth`` tail stages in any order: each level is the level
    before or one stage applied to it (shared sub-patterns: linear in ``depth``)."""
    level = start
    for _ in range(depth):
        stage = (is_op("relax.add")(level, is_const()) | is_op("relax.multiply")(level, is_const())
                 | is_op("relax.right_shift")(level, is_const())
                 | is_op("relax.clip")(level, wildcard(), wildcard())
                 | is_op("relax.astype")(level))
        level = stage | level
    return level


def one_vector_add(ctx) -> bool:
    """What the pattern cannot say: int8 out, at most one per-channel add."""
    root = ctx.annotated_expr["root"]
    adds = [e for e in ctx.matched_bindings.values() if isinstance(e, relax.Call)
            and e.op.name == "relax.add" and e.args[1].value.numpy().size > 1]
    return str(root.attrs.dtype) == "int8" and len(adds) <= 1


def composites(mod, patterns):
    fused = relax.transform.FuseOpsByPattern(patterns, bind_constants=True)(mod)
    return [f for f in fused.functions.values()
            if isinstance(f, relax.Function) and f.attrs and "Composite" in f.attrs]


def matched(mod):
    matcher = Offloader(mod, load_config("default"), match_only=True)
    matcher.visit_expr(mod["main"])
    return matcher


def hswish_module(shared: bool):
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((1, 16, 4, 4), "int8"))
    b = relax.Var("b", relax.TensorType((1, 16, 4, 4), "int8"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            xa = bb.emit(relax.op.astype(a, "int32"))
            xb = xa if shared else bb.emit(relax.op.astype(b, "int32"))
            added = bb.emit(relax.op.add(xb, relax.const(3, "int32")))
            t = bb.emit(relax.op.clip(added, 0, 6))
            out = bb.emit_output(bb.emit(relax.op.multiply(xa, t)))
        bb.emit_func_output(out)
    return bb.get()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=8, help="most tail stages the pattern takes")
    args = parser.parse_args(argv)
    tail = is_op("relax.astype")(any_tail(is_op("relax.nn.conv2d")(wildcard(), is_const()), args.depth))
    register_patterns([(f"{PREFIX}.conv2d_tail", tail, {"root": tail}, one_vector_add)])
    patterns = get_patterns_with_prefix(PREFIX)

    print(f"| tail (conv2d int8, depth {args.depth}) | dpl composite (bindings) | offload pass: epilogue or reason |")
    print("|---|---|---|")
    for name, stages in TAILS.items():
        mod = conv_module(stages)
        found = composites(mod, patterns)
        size = sum(len(b.bindings) for b in found[0].body.blocks) if found else 0
        m = matched(mod)
        ours = (" ".join(s[0] for s in m.matched[0].epilogue) if m.matched
                else next(iter(m.rejected.values()), "no match"))
        print(f"| {name} | {'yes (%d)' % size if found else 'no'} | {ours} |")

    x = is_op("relax.astype")(wildcard())
    hswish = is_op("relax.multiply")(x, is_op("relax.clip")(is_op("relax.add")(x, is_const()),
                                                            wildcard(), wildcard()))
    for shared in (True, False):
        n = len(composites(hswish_module(shared), [(f"{PREFIX}.hswish", hswish)]))
        print(f"hswish, x {'one expression' if shared else 'two different casts'}: {n} composite(s)")

    from models import quantized_example
    _, qm, _, _ = quantized_example("resnet18", 32)
    start = time.perf_counter()
    n_dpl = len(composites(qm.mod, patterns))
    mid = time.perf_counter()
    m = matched(qm.mod)
    end = time.perf_counter()
    convs = sum(1 for op in m.matched if op.kind == "conv2d")
    print(f"resnet18 32x32: dpl {n_dpl} conv2d composites in {mid - start:.3f} s; offload pass "
          f"{convs} conv2d of {len(m.matched)} matches in {end - mid:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
