#!/usr/bin/env python
"""Check that the embedding model returns what another version of it returns, on every solve the
builds of the networks start, and on the DeepBench layers.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/embed_equivalence.py --against main
    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/embed_equivalence.py --against main \\
        --networks resnext50_32x4d --no-deepbench

The solves (:func:`requests`): per network of ``models.ISSUE11_MODELS`` at issue 32's input size
(``scripts/efficiency.py``'s ``network_size``), those a ``csp-relaxed`` build of it on
``--config`` starts (the offload pass's prefetch, :func:`vta_ext.offload.transform._prefetch`,
with the solves recorded instead of run); per DeepBench layer (``tests/test_knob_search.py``'s
``LAYERS``, ResNet-18 C1-C11 and MobileNet D1-D9 with them), the solves of its layouts
(:func:`tvm_csp_embed.candidates.layout_solves`) under ``relaxed`` and ``strict``. Each is solved
with the model of git revision ``--against`` and with the working tree's, in batches as a build
solves (:func:`tvm_csp_embed.solve.solve_batch`), and their records compared
(``scripts/embed_reference.py``'s ``result_record``: status, and per solution in order its
structure, padding, cost, optimality and a digest of every scalar node value). Prints the search
nodes of both per differing or slow solve and in total; exit status 1 if any record differs.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "relay_examples"), str(REPO / "scripts")]

#: a solve whose search takes more nodes than this (either model) is listed
LISTED_NODES = 50


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def network_requests(name: str, config_name: str) -> list:
    """The solve requests (:class:`~tvm_csp_embed.cache.SolveRequest`) a ``csp-relaxed`` build of
    network ``name`` (issue 32's size) for ``config_name`` starts, in order, none solved."""
    import vta_ext
    from vta_ext.config import load_config
    from vta_ext.offload import transform

    import tvm_csp_embed.strategy as strategy
    eff = _script("efficiency")
    mod = eff.network_module(name, eff.network_size(name, "issue32"))
    seen: list = []
    real = strategy.solve_concurrently
    strategy.solve_concurrently = lambda reqs, **kw: seen.extend(reqs) or 0
    try:
        with vta_ext.build_options(strategy="csp-relaxed"):
            transform._prefetch(mod, load_config(config_name))
    finally:
        strategy.solve_concurrently = real
        for op_template in {id(t): t for t in _templates()}.values():
            strategy.remove_idle_work(getattr(op_template, "_idle", None))
    return seen


def _templates():
    from vta_ext.strategy import get_template
    from vta_ext.errors import TemplateRefusal
    for kind in ("conv2d", "group_conv2d", "dense"):
        try:
            yield get_template(kind, "csp-relaxed")
        except TemplateRefusal:
            pass


def deepbench_requests(config_name: str) -> list:
    """The solve requests of every layout of every DeepBench layer (with ResNet-18 C1-C11 and
    MobileNet D1-D9) under ``relaxed`` and ``strict``, as a build asks them."""
    from test_knob_search import LAYERS
    from vta_ext.config import load_config

    from tvm_csp_embed.candidates import layout_solves
    from tvm_csp_embed.strategy import fused_variants
    cfg = load_config(config_name)
    out = []
    for base in LAYERS.values():
        for mode in ("relaxed", "strict"):
            layouts = ["NCHW", "NHWC"] + (fused_variants(dataclasses.replace(base, mode=mode), cfg)
                                          if mode == "relaxed" else [])
            out += [r for _, r, src in layout_solves(cfg, base, mode, layouts) if src is None]
    return out


def requests(networks: Sequence[str], deepbench: bool, config_name: str) -> List[Tuple[str, object]]:
    """``(label, request)`` of every distinct solve (by cache key), networks first."""
    out: Dict[str, Tuple[str, object]] = {}
    for name in networks:
        t = time.perf_counter()
        reqs = network_requests(name, config_name)
        for r in reqs:
            out.setdefault(r.key, (name, r))
        print(f"{name}: {len(reqs)} solves ({time.perf_counter() - t:.1f} s to collect)", flush=True)
    if deepbench:
        for r in deepbench_requests(config_name):
            out.setdefault(r.key, ("deepbench", r))
    return list(out.values())


def solve_all(items: Sequence[Tuple[str, object]], model: Path, batch: int) -> list:
    """``(record, nodes, seconds)`` of every request solved with the model at ``model``."""
    solve = importlib.import_module("tvm_csp_embed.solve")
    er = _script("embed_reference")
    saved = solve.MODEL
    solve.MODEL = model
    out = []
    try:
        for at in range(0, len(items), batch):
            chunk = [r for _, r in items[at:at + batch]]
            problems = [solve.Problem(r.wl, r.instr, r.mode, solutions=r.solutions, timeout=120.0,
                                      max_cost=r.max_cost) for r in chunk]
            for res in solve.solve_batch(problems):
                if isinstance(res, Exception):
                    raise res
                out.append((er.result_record(res), res.stats.nodes, res.stats.solve_seconds))
    finally:
        solve.MODEL = saved
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", default="main", help="git revision of the reference model")
    ap.add_argument("--networks", nargs="*", default=None, help="default: all 15")
    ap.add_argument("--no-deepbench", action="store_true")
    ap.add_argument("--config", default="default")
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args(argv)
    import models
    import tvm_csp_embed  # noqa: F401 -- registers the strategies
    names = list(models.ISSUE11_MODELS) if args.networks is None else args.networks
    items = requests(names, not args.no_deepbench, args.config)
    text = subprocess.run(["git", "-C", str(REPO), "show", f"{args.against}:tvm_csp_embed/models/embed.mzn"],
                          capture_output=True, text=True, check=True).stdout
    solve = importlib.import_module("tvm_csp_embed.solve")
    with tempfile.TemporaryDirectory() as tmp:
        ref_model = Path(tmp) / "embed.mzn"
        ref_model.write_text(text)
        t = time.perf_counter()
        ref = solve_all(items, ref_model, args.batch)
        t_ref = time.perf_counter() - t
        t = time.perf_counter()
        new = solve_all(items, solve.MODEL, args.batch)
        t_new = time.perf_counter() - t
    bad = 0
    for (label, r), (a, na, _), (b, nb, _) in zip(items, ref, new):
        same = a["status"] == b["status"] and a["solutions"] == b["solutions"]
        bad += not same
        if not same or max(na, nb) > LISTED_NODES:
            print(f"{'DIFFERS' if not same else 'same':8s} {label:16s} {r.wl.name} {r.mode} "
                  f"n={r.solutions} max_cost={r.max_cost}: nodes {na} -> {nb}")
    print(f"{len(items)} solves ({sum(1 for _, r in items if r.solutions > 1)} enumerations), "
          f"{bad} differ; search nodes {sum(x[1] for x in ref)} -> {sum(x[1] for x in new)}; "
          f"wall {t_ref:.1f} -> {t_new:.1f} s (model of {args.against} -> working tree)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
