#!/usr/bin/env python
"""Co-design figures: the front of VTA configurations x the CSP strategy's embeddings, against the
front of the stock templates over the same space, budget and seed (issue 19).

For one workload (``--model``: a quantised network of ``relay_examples/models.py`` at ``--size``,
or ``deepbench-thin``, the 12 thin-channel DeepBench inference convolutions as one module),
:func:`tvm_csp_embed.codesign.explore` searches the space (``--space``) with ``--budget``
configurations per strategy on ``--parallel`` local worker processes (or ``--dask ADDRESS``).
Cycles are the cycle model's (plus the host model's cycles of operators left on the CPU); area is
the documented *proxy* of ``docs/codesign.md``, relative to ``default``; nothing is synthesised.

Writes ``<out-dir>/codesign_<workload>.csv`` (every point, preset and stock point) and ``.png``
(both fronts, the presets marked) and prints the table: the fronts, each preset with the CSP point
that dominates it, how many stock front points the CSP front dominates, configurations evaluated
per minute and the wall time.

Then (unless ``--no-verify``) every point of the CSP front is rebuilt with plain
``relax.build(mod, target=vta_ext.vta_target(point.config))`` under the strategy, run on the
functional simulator and compared bit for bit with the llvm build on the same seeded inputs; the
cycles of the programs that ran must equal the point's VTA cycles. A mismatch exits with status 1.

Example (a figure of docs/codesign.md)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/codesign.py --model resnet18 --size 224 \\
        --budget 40 --parallel 2 --space small --out-dir docs/figures
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, REPO / "relay_examples", REPO / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

#: named spaces: ``small`` keeps the GEMM shapes whose embeddings are solved once and varies the
#: memory system and timing; ``default`` is ``codesign.Space()``
SPACES = {
    "small": dict(log_batch=(0,), log_block_in=(4, 5), log_block_out=(4, 5),
                  log_inp_buff=(14, 15, 16), log_wgt_buff=(17, 18, 19, 20),
                  log_acc_buff=(16, 17, 18), log_uop_buff=(15,), mem_bytes_per_cycle=(8, 16, 32),
                  timing=("original", "pipelined")),
    "default": {},
}


def deepbench_thin_module():
    """The 12 thin-channel (C < 16) DeepBench inference convolutions as one Relax module: each its
    own input, constant int8 weights and int32 bias, ``>> 8``, clip [0, 127], int8 out."""
    import numpy as np
    from tvm import relax

    from deepbench import read_layers

    rows = [r for r in read_layers() if r["c"] < 16]
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{r['id']}", relax.TensorType((r["n"], r["c"], r["h"], r["w"]), "int8"))
              for r in rows]
    with bb.function("main", params):
        with bb.dataflow():
            outs = []
            for r, x in zip(rows, params):
                w = relax.const(rng.integers(-128, 128, (r["k"], r["c"], r["filter_h"],
                                                         r["filter_w"])).astype("int8"))
                b = relax.const(rng.integers(-1000, 1000, (1, r["k"], 1, 1)).astype("int32"))
                y = bb.emit(relax.op.nn.conv2d(x, w, strides=(r["hstride"], r["wstride"]),
                                               padding=(r["pad_h"], r["pad_w"]), out_dtype="int32"))
                y = bb.emit(relax.op.add(y, b))
                y = bb.emit(relax.op.right_shift(y, relax.const(8, "int32")))
                y = bb.emit(relax.op.clip(y, 0, 127))
                outs.append(bb.emit(relax.op.astype(y, "int8")))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get(), len(rows)


def seeded_inputs(mod, seed: int = 0):
    """Seeded arrays for ``mod["main"]``'s parameters: float32 standard normal (a quantised
    network's image), int8 full range, int32 within +-2**14."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = []
    for p in mod["main"].params:
        shape, dtype = tuple(int(d) for d in p.ty.shape), str(p.ty.dtype)
        if dtype == "float32":
            arrays.append(rng.standard_normal(shape).astype(np.float32))
        elif dtype == "int8":
            arrays.append(rng.integers(-128, 128, shape).astype(np.int8))
        elif dtype == "int32":
            arrays.append(rng.integers(-(1 << 14), 1 << 14, shape).astype(np.int32))
        else:
            raise SystemExit(f"codesign: no input generator for a {dtype} parameter {p.name_hint}")
    return arrays


def run_executable(executable, arrays):
    """Run ``main`` once; its outputs as a list of numpy arrays."""
    import tvm
    from tvm import relax

    out = relax.VirtualMachine(executable, tvm.cpu())["main"](
        *[tvm.runtime.tensor(a) for a in arrays])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def verify_front(mod, points, strategy: str):
    """Rebuild each point with plain ``relax.build`` on its target, run it on the functional
    simulator and compare with llvm; ``[(point, bit-exact, run cycles == point's VTA cycles)]``."""
    import numpy as np
    from tqdm.auto import tqdm
    from tvm import relax

    import vta_ext

    arrays = seeded_inputs(mod)
    ref = run_executable(relax.build(mod, target="llvm"), arrays)
    out = []
    for point in tqdm(points, desc="verify front", unit="point"):
        with vta_ext.build_options(strategy=strategy):
            executable = relax.build(mod, target=vta_ext.vta_target(point.config))
        report = vta_ext.last_build_report()
        vta_ext.clear_run_log()
        got = run_executable(executable, arrays)
        ran = sum(r.cycles.total_cycles for r in vta_ext.run_log())
        exact = len(got) == len(ref) and all(np.array_equal(g, r) for g, r in zip(got, ref))
        out.append((point, exact, ran == point.vta_cycles == report.vta_cycles))
    return out


def workload(model: str, size: int):
    """``(module, label)`` of the workload."""
    if model == "deepbench-thin":
        mod, n = deepbench_thin_module()
        return mod, f"deepbench-thin ({n} layers)"
    from models import quantized_example

    _, qmodel, _, _ = quantized_example(model, size, 0)
    return qmodel.mod, f"{model} {size}x{size}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18",
                    help="a model of relay_examples/models.py (resnet18, mobilenet_v2, ...) or "
                         "deepbench-thin")
    ap.add_argument("--size", type=int, default=224, help="input height and width")
    ap.add_argument("--budget", type=int, default=40, help="configurations per strategy")
    ap.add_argument("--parallel", type=int, default=2, help="local worker processes")
    ap.add_argument("--dask", default=None, help="a Dask scheduler address instead of local workers")
    ap.add_argument("--strategy", default="csp-relaxed")
    ap.add_argument("--baseline", default="stock", help="'none' for no baseline")
    ap.add_argument("--space", default="small", choices=sorted(SPACES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--records", default=None, help="JSON-lines records (default: in the cache)")
    ap.add_argument("--out-dir", default=str(REPO / "docs" / "figures"))
    ap.add_argument("--no-verify", dest="verify", action="store_false",
                    help="skip rebuilding every CSP front point through its target (bit-exact "
                         "against llvm on the functional simulator)")
    args = ap.parse_args(argv)

    import tvm_csp_embed  # noqa: F401
    from tvm_csp_embed import codesign, tune

    start = time.perf_counter()
    mod, label = workload(args.model, args.size)
    runner = (tune.DaskRunner(args.dask) if args.dask
              else tune.LocalRunner(n_parallel=args.parallel))
    space = codesign.Space(**SPACES[args.space])
    print(f"{label}: {space}; strategy {args.strategy}, baseline {args.baseline}, budget "
          f"{args.budget}, {runner!r}", flush=True)
    try:
        front = codesign.explore(mod, space, budget=args.budget, strategy=args.strategy,
                                 runner=runner, seed=args.seed,
                                 baseline=None if args.baseline == "none" else args.baseline,
                                 records=args.records)
    finally:
        runner.close()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"codesign_{args.model}" + ("" if args.model == "deepbench-thin" else f"_{args.size}")
    front.to_csv(out / f"{stem}.csv")
    front.plot(out / f"{stem}.png", title=f"{label}: {args.strategy} vs "
               f"{args.baseline} over the same space (area is a proxy)")
    print(front.table())
    if front.baseline is not None:
        print(front.baseline.counts() + f"  [{front.baseline.strategy}]")
    wall = time.perf_counter() - start
    print(f"wall time {wall:.0f} s on {runner!r} (workload preparation included); wrote "
          f"{out / stem}.csv/.png")
    if not args.verify:
        return 0
    t0 = time.perf_counter()
    checked = verify_front(mod, front.front, args.strategy)
    for point, exact, cycles in checked:
        print(f"  {point.config.name}: {'bit-exact' if exact else 'DIFFERS from llvm'}, run "
              f"cycles {'=' if cycles else '!='} the search's {point.vta_cycles:,}")
    good = sum(exact and cycles for _, exact, cycles in checked)
    print(f"verified {good} of {len(checked)} {args.strategy} front points: plain relax.build on "
          f"vta_target(point.config), functional simulator = llvm bit for bit, run cycles = the "
          f"search's ({time.perf_counter() - t0:.0f} s)")
    return 0 if good == len(checked) else 1


if __name__ == "__main__":
    sys.exit(main())
