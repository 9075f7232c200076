#!/usr/bin/env python
"""Embed the VTA GEMM into the DeepBench inference convolutions; one CSV row per layer and solution.

Example::

    .venv/bin/python scripts/embed_deepbench.py --mode strict --out docs/figures/deepbench_strict.csv
    .venv/bin/python scripts/embed_deepbench.py --mode relaxed --solutions 3 --timeout 30
    .venv/bin/python scripts/embed_deepbench.py --mode relaxed --no-compat --check   # COMPAT off
    .venv/bin/python scripts/embed_deepbench.py --mode relaxed --compare-compat --out x.csv
    .venv/bin/python scripts/embed_deepbench.py --network resnet18 --size 224   # a build's solves
    .venv/bin/python scripts/embed_deepbench.py --mode relaxed --flatten-batch 16  # 16 per flattening

``solve_seconds`` is end to end per layer (workload build, MiniZinc flattening, Gecode, for
all requested solutions); ``cpu_seconds`` is the CPU time (user + system) of the solver processes
(MiniZinc and Gecode) of that solve, which machine load inflates far less than wall time;
``flatten_seconds``, ``gecode_seconds`` and ``nodes`` come from MiniZinc's statistics. The summary
gives the medians of all four.

``--flatten-batch N`` solves N layers per MiniZinc flattening (:func:`tvm_csp_embed.solve.solve_batch`,
as a build does; 0: in the build's batches, :func:`tvm_csp_embed.cache.batches`): a layer's
``solve_seconds`` is then its share of the flattening plus its own search, and ``cpu_seconds`` the
group's solver CPU divided evenly among its layers.

``--network NAME --size N`` solves, one after another and without the disk cache, the distinct
solves a cold ``csp-relaxed`` build of ``relay_examples/models.py``'s network at N x N starts
(``tvm_csp_embed.candidates.solve_request``: the 4 best embeddings below the stock mapping's cost,
every layout), as the build's own prefetch lists them (the build is stopped there).
"""
from __future__ import annotations

import argparse
import csv
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tvm_csp_embed.embedding import decode  # noqa: E402
from tvm_csp_embed.instructions import gemm  # noqa: E402
from tvm_csp_embed.cache import batches  # noqa: E402
from tvm_csp_embed.solve import Problem, SolverError, solve, solve_batch  # noqa: E402
from tvm_csp_embed.workload import conv2d  # noqa: E402

DEFAULT_LAYERS = REPO / "data" / "deepbench_conv_inference.csv"
FIELDS = ["id", "mode", "layout", "solution", "status", "solve_seconds", "cpu_seconds", "flatten_seconds",
          "gecode_seconds",
          "nodes", "failures", "x_dims", "y_dims", "z_dims", "binding", "padding", "padded_volume",
          "stock_padded_volume", "padding_saved", "footprint_bytes", "instruction_count", "cost", "asset", "message"]


def read_layers(path: Path):
    """DeepBench rows (comment lines starting with ``#`` skipped)."""
    with open(path) as f:
        rows = [line for line in f if not line.startswith("#")]
    return list(csv.DictReader(rows))


def layer_workload(r, layout: str):
    """conv2d workload of one DeepBench row."""
    g = lambda k: int(r[k])
    return conv2d(g("n"), g("c"), g("h"), g("w"), g("k"), g("filter_h"), g("filter_w"),
                  pad=(g("pad_h"), g("pad_w")), stride=(g("hstride"), g("wstride")), layout=layout,
                  name=f"deepbench{r['id']}_{layout}")


def stock_volume(wl, instr) -> float:
    """Padded volume of the stock mapping (batch->x, out channels->y, in channels->z)."""
    v = 1.0
    sizes = dict(zip(instr.axes, instr.sizes))
    for d, x in zip(wl.dims, wl.extents):
        blk = {"n": sizes["x"], "k": sizes["y"], "c": sizes["z"]}.get(d, 1)
        v *= (-(-x // blk) * blk) / x
    return v


def _children_cpu() -> float:
    """User + system seconds of this process's finished child processes (and theirs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _groups(items: list, size: int) -> list:
    """``items`` in groups of ``size`` (0: the batches a build flattens together,
    :func:`tvm_csp_embed.cache.batches`)."""
    if size == 0:
        return batches(items)
    return [items[i:i + size] for i in range(0, len(items), size)]


def run(args) -> list:
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = lambda x, **k: x
    instr = gemm((args.batch, args.block_in, args.block_out))
    layers = read_layers(Path(args.layers_file))
    if args.ids:
        keep = {int(x) for x in args.ids.split(",")}
        layers = [r for r in layers if int(r["id"]) in keep]
    rows = []
    bar = tqdm(total=len(layers), desc=f"DeepBench {args.mode}", unit="layer")
    for group in _groups(layers, 1 if args.portfolio else args.flatten_batch):
        t0, c0 = time.perf_counter(), _children_cpu()
        problems, wls = [], []
        for r in group:
            try:
                wls.append(layer_workload(r, args.layout))
                problems.append(Problem(wls[-1], instr, args.mode, solutions=args.solutions,
                                        timeout=args.timeout, bound=args.bound, search=args.search,
                                        compat=not args.no_compat))
            except ValueError as e:
                wls.append(None)
                problems.append(e)
        if args.portfolio:
            try:
                results = [solve(wls[0], instr, args.mode, solutions=args.solutions, timeout=args.timeout,
                                 portfolio=True, bound=args.bound, search=args.search, jobs=args.jobs,
                                 compat=not args.no_compat)]
            except (SolverError, ValueError) as e:
                results = [e]
        else:
            todo = [p for p in problems if not isinstance(p, Exception)]
            solved = iter(list(solve_batch(todo)))
            results = [p if isinstance(p, Exception) else next(solved) for p in problems]
        # with several layers per flattening, a layer's wall time is its share of the flattening plus
        # its own search, and its CPU time the group's solver CPU divided evenly
        cpu = (_children_cpu() - c0) / len(group)
        for r, wl, res in zip(group, wls, results):
            base = {"id": r["id"], "mode": args.mode, "layout": args.layout}
            if isinstance(res, Exception):
                rows.append({**base, "solution": 0, "status": "error",
                             "solve_seconds": round(time.perf_counter() - t0, 4), "message": str(res)[:300]})
                continue
            wall = time.perf_counter() - t0 if len(group) == 1 else res.stats.wall_seconds
            rows += _layer_rows(args, base, wl, instr, res, wall, cpu)
        bar.update(len(group))
    bar.close()
    return rows


def _layer_rows(args, base: dict, wl, instr, res, wall: float, cpu: float) -> list:
    st = res.stats
    common = {**base, "solve_seconds": round(wall, 4), "cpu_seconds": round(cpu, 4),
              "flatten_seconds": round(st.flatten_seconds, 4),
              "gecode_seconds": round(st.solve_seconds, 4), "nodes": st.nodes, "failures": st.failures,
              "asset": st.asset, "stock_padded_volume": round(stock_volume(wl, instr), 4)}
    if res.status != "ok":
        return [{**common, "solution": 0, "status": res.status, "message": res.message}]
    rows = []
    for i, raw in enumerate(res.solutions):
        emb = decode(raw, wl, instr, args.mode)
        if args.check:
            from tvm_csp_embed.verify import check_scalar
            check_scalar(emb)
        rows.append({**common, "solution": i, "status": "ok",
                     "x_dims": str(emb.axis("x")), "y_dims": str(emb.axis("y")), "z_dims": str(emb.axis("z")),
                     "binding": "A<-" + emb.binding["A"],
                     "padding": " ".join(f"{d}+{p}" for d, p in emb.padding.items()) or "none",
                     "padded_volume": round(emb.padded_volume_ratio, 4),
                     "padding_saved": round(stock_volume(wl, instr) / emb.padded_volume_ratio, 4),
                     "footprint_bytes": emb.footprint_bytes, "instruction_count": emb.instruction_count,
                     "cost": emb.cost, "message": "optimal" if raw.optimal else "best found"})
    return rows


COMPAT_FIELDS = ["id", "mode", "solutions", "compat_seconds", "nocompat_seconds", "compat_gecode_seconds",
                 "nocompat_gecode_seconds", "compat_nodes", "nocompat_nodes", "same_solutions", "checked"]


def compare_compat(args) -> list:
    """Per layer, the same solve with and without the COMPAT table, back to back (so machine load
    hits both alike): times, Gecode nodes, whether the solutions are the same; every solution of
    the run without COMPAT is re-checked against islpy (``check_raw``)."""
    from tvm_csp_embed.verify import check_raw
    instr = gemm((args.batch, args.block_in, args.block_out))
    layers = read_layers(Path(args.layers_file))
    if args.ids:
        keep = {int(x) for x in args.ids.split(",")}
        layers = [r for r in layers if int(r["id"]) in keep]
    rows = []
    for r in layers:
        wl = layer_workload(r, args.layout)
        res = {}
        for compat in (True, False):
            t0 = time.perf_counter()
            out = solve(wl, instr, args.mode, solutions=args.solutions, timeout=args.timeout, compat=compat)
            res[compat] = (time.perf_counter() - t0, out)
        for s in res[False][1].solutions:
            check_raw(s, wl, instr)
        key = lambda out: [(s.cost, s.key()) for s in out.solutions]
        rows.append({"id": r["id"], "mode": args.mode, "solutions": args.solutions,
                     "compat_seconds": round(res[True][0], 4), "nocompat_seconds": round(res[False][0], 4),
                     "compat_gecode_seconds": round(res[True][1].stats.solve_seconds, 4),
                     "nocompat_gecode_seconds": round(res[False][1].stats.solve_seconds, 4),
                     "compat_nodes": res[True][1].stats.nodes, "nocompat_nodes": res[False][1].stats.nodes,
                     "same_solutions": int(key(res[True][1]) == key(res[False][1])),
                     "checked": len(res[False][1].solutions)})
    return rows


def summarize(rows, mode: str) -> str:
    """One-line summary: ok count, median and max end-to-end seconds per layer, and the medians of
    the solver's CPU, flattening and Gecode seconds."""
    per_layer = {}
    for r in rows:
        per_layer.setdefault(r["id"], r)
    ok = sum(1 for r in per_layer.values() if r["status"] == "ok")
    t = [float(r["solve_seconds"]) for r in per_layer.values()]
    med = lambda k: statistics.median(float(r.get(k) or 0.0) for r in per_layer.values())
    return (f"{mode}: {ok}/{len(per_layer)} layers ok; end-to-end per layer median {statistics.median(t):.3f} s, "
            f"max {max(t):.3f} s, total {sum(t):.1f} s; median solver CPU {med('cpu_seconds'):.3f} s "
            f"(flatten {med('flatten_seconds'):.3f} s, Gecode {med('gecode_seconds'):.3f} s)")


class _Stop(Exception):
    """Raised to stop a build once its solves are listed (:func:`network_requests`)."""


def network_requests(name: str, size: int, config: str = "default") -> list:
    """The distinct solve requests a cold ``csp-relaxed`` build of ``name`` at ``size`` starts.

    The build runs until its planning asks for the first embedding: the strategy's prefetch has
    listed every solve by then (captured in place of starting them)."""
    sys.path.insert(0, str(REPO / "relay_examples"))
    from models import quantized_example
    from tvm import relax

    import tvm_csp_embed.candidates as candidates
    import tvm_csp_embed.strategy as strategy
    import vta_ext

    _, qmodel, _, _ = quantized_example(name, size, 0)
    requests, stopped = [], []

    def capture(reqs, workers=None, wait=True):
        requests.extend(reqs)
        return 0

    def stop(*args, **kw):
        stopped.append(True)
        raise _Stop()
    saved = strategy.solve_concurrently, candidates.cached_embeddings
    strategy.solve_concurrently, candidates.cached_embeddings = capture, stop
    try:
        with vta_ext.build_options(strategy="csp-relaxed"):
            relax.build(qmodel.mod, target=vta_ext.vta_target(config))
    except Exception:  # noqa: BLE001 -- ours (the build wraps it in its own error), else re-raised
        if not stopped:
            raise
    finally:
        strategy.solve_concurrently, candidates.cached_embeddings = saved
    if not requests:
        raise SystemExit(f"embed_deepbench: the csp-relaxed build of {name} at {size} started no solve")
    unique = {}
    for r in requests:
        unique.setdefault(r.key, r)
    return list(unique.values())


def run_network(args) -> list:
    """Solve every request of :func:`network_requests`, one row per request (``--flatten-batch``
    requests per MiniZinc flattening; 0: as the build batches them)."""
    rows = []
    reqs = network_requests(args.network, args.size)
    for group in _groups(list(enumerate(reqs)), args.flatten_batch):
        t0, c0 = time.perf_counter(), _children_cpu()
        problems = [Problem(r.wl, r.instr, r.mode, solutions=r.solutions, timeout=args.timeout,
                            max_cost=r.max_cost) for _, r in group]
        results = list(solve_batch(problems))
        cpu = (_children_cpu() - c0) / len(group)
        for (i, r), res in zip(group, results):
            if isinstance(res, Exception):
                raise res
            st = res.stats
            wall = time.perf_counter() - t0 if len(group) == 1 else st.wall_seconds
            rows.append({"id": i, "mode": r.mode, "layout": r.wl.name, "solution": 0, "status": res.status,
                         "solve_seconds": round(wall, 4), "cpu_seconds": round(cpu, 4),
                         "flatten_seconds": round(st.flatten_seconds, 4),
                         "gecode_seconds": round(st.solve_seconds, 4),
                         "nodes": st.nodes, "failures": st.failures, "message": res.message})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers-file", default=str(DEFAULT_LAYERS), help="DeepBench CSV (default: %(default)s)")
    ap.add_argument("--mode", choices=("strict", "relaxed"), default="strict")
    ap.add_argument("--solutions", type=int, default=1, help="best distinct solutions per layer")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per layer")
    ap.add_argument("--out", default=None, help="output CSV (default: stdout summary only)")
    ap.add_argument("--layout", choices=("NCHW", "NHWC", "HWNC"), default="NCHW")
    ap.add_argument("--search", choices=("struct", "nodes"), default="struct")
    ap.add_argument("--portfolio", action="store_true", help="dimension-order portfolio (eq. 12)")
    ap.add_argument("--bound", action="store_true", help="per-group domain bound (eq. 11)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel processes of the portfolio")
    ap.add_argument("--check", action="store_true", help="re-check every solution against islpy")
    ap.add_argument("--no-compat", action="store_true",
                    help="switch off the precomputed COMPAT table (the model's edge constraints alone)")
    ap.add_argument("--ids", default="", help="comma-separated layer ids (default: all)")
    ap.add_argument("--batch", type=int, default=1, help="the GEMM's BATCH")
    ap.add_argument("--flatten-batch", type=int, default=1,
                    help="solves per MiniZinc flattening (tvm_csp_embed.solve.solve_batch; 0: as a build "
                         "batches them, tvm_csp_embed.cache.batches; default: one each)")
    ap.add_argument("--block-in", type=int, default=16)
    ap.add_argument("--block-out", type=int, default=16)
    ap.add_argument("--network", default="", help="solve the solves of a cold build of this network "
                    "(relay_examples/models.py) instead of the DeepBench layers")
    ap.add_argument("--size", type=int, default=224, help="input size of --network")
    ap.add_argument("--compare-compat", action="store_true",
                    help="per layer, solve with and without COMPAT back to back (writes --out)")
    args = ap.parse_args(argv)
    if args.compare_compat:
        rows = compare_compat(args)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.out, "w", newline="") as f:
                w = csv.DictWriter(f, COMPAT_FIELDS)
                w.writeheader()
                w.writerows(rows)
        med = lambda k: statistics.median(float(r[k]) for r in rows)
        print(f"{args.mode}: {len(rows)} layers; median s with COMPAT {med('compat_seconds'):.3f}, without "
              f"{med('nocompat_seconds'):.3f}; median Gecode nodes {med('compat_nodes'):.0f} / "
              f"{med('nocompat_nodes'):.0f}; same solutions on {sum(r['same_solutions'] for r in rows)}; "
              f"{sum(r['checked'] for r in rows)} solutions without COMPAT checked by check_raw")
        return 0
    rows = run_network(args) if args.network else run(args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, FIELDS)
            w.writeheader()
            for r in rows:
                w.writerow({k: r.get(k, "") for k in FIELDS})
    print(summarize(rows, f"{args.network} {args.size}" if args.network else args.mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
