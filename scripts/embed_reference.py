#!/usr/bin/env python
"""Freeze the embedding solver's solutions on a fixed set of solves, to prove a model rewrite exact.

Usage::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/embed_reference.py \
        --out tests/data/embed_reference.json
    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/embed_reference.py \
        --compare tests/data/embed_reference.json
    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/embed_reference.py \
        --compare tests/data/embed_reference.json --batch 8     # 8 cases per MiniZinc flattening

The cases (:func:`cases`):

* ``build``: the solves a build starts (:func:`tvm_csp_embed.candidates.solve_request`: the 4 best
  embeddings below the stock mapping's cost) for ResNet-18 C1-C11, MobileNet D1-D9 and the 108
  DeepBench layers, on the ``default`` configuration, under ``strict`` (NCHW, NHWC) and ``relaxed``
  (NCHW, NHWC and the fused-reduction variants the strategy offers);
* ``bnb``: one branch-and-bound solve (the single best embedding, no cost bound) per layer and
  mode in NCHW, as ``scripts/embed_deepbench.py`` runs them;
* ``misc``: small workloads under the paper's node search order and custom constraint sets
  (no rectangle, no symmetry breaking, no padding, the domain bound), other GEMM shapes, and two
  infeasible solves.

A case's record (:func:`record`) is its status and, per solution in order, the structure (binding,
the dim and step of every bit, padding), the cost, the optimality flag and a digest of the scalar
node values (every multiply node and every data node). ``--out`` solves every case with the
current model and writes the table; ``--compare`` solves them again and lists the cases whose
record differs (exit status 1 if any). ``tests/test_embed_model.py`` runs the comparison.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from tvm_csp_embed.instructions import gemm  # noqa: E402
from tvm_csp_embed.solve import CONSTRAINT_SETS, MODEL, Problem, solve, solve_batch  # noqa: E402
from tvm_csp_embed.workload import conv2d, matmul  # noqa: E402

#: configuration of the ``build`` cases
CONFIG = "default"


def _layers():
    from test_knob_search import LAYERS  # ResNet-18 C1-C11, MobileNet D1-D9, DeepBench DB1-DB108
    return LAYERS


def _without(mode: str, name: str) -> tuple:
    """The constraint set ``mode`` without the constraint ``name``."""
    return tuple(x for x in CONSTRAINT_SETS[mode] if x != name)


def _misc() -> Dict[str, Dict[str, Any]]:
    """Small solves off the build's path: (workload, instruction sizes, solve keyword arguments)."""
    c = conv2d(1, 8, 6, 6, 8, 3, 3)
    cs = conv2d(1, 4, 9, 9, 8, 3, 3, stride=(2, 2))
    mm = matmul(6, 20, 12)
    out = {}
    for name, wl, sizes in (("conv8", c, (1, 4, 4)), ("conv_s2", cs, (1, 4, 4)),
                            ("mm", mm, (2, 4, 4)), ("conv8_b2", c, (2, 4, 4))):
        for mode in ("strict", "relaxed"):
            out[f"{name}/{mode}/nodes"] = dict(wl=wl, sizes=sizes,
                                               kw=dict(mode=mode, search="nodes"))
            out[f"{name}/{mode}/all"] = dict(wl=wl, sizes=sizes,
                                             kw=dict(mode=mode, solutions=10_000))
            out[f"{name}/{mode}/bound"] = dict(wl=wl, sizes=sizes, kw=dict(mode=mode, bound=True))
        # (the larger enumerations without symmetry breaking or the origin take minutes)
        offs = {"mm": ("symmetry", "pad", "origin"),
                "conv8_b2": ("pad",)}.get(name, ("symmetry", "pad"))
        for off in offs:
            out[f"{name}/relaxed-no-{off}"] = dict(
                wl=wl, sizes=sizes, kw=dict(mode=_without("relaxed", off), solutions=6))
    # infeasible: no padding for 3 input channels; a cost bound below every embedding
    out["conv3/strict-no-pad"] = dict(wl=conv2d(1, 3, 6, 6, 16, 3, 3), sizes=(1, 4, 4),
                                      kw=dict(mode=_without("strict", "pad")))
    out["conv8/relaxed/below-every-cost"] = dict(wl=c, sizes=(1, 4, 4),
                                                 kw=dict(mode="relaxed", solutions=4, max_cost=-1))
    # without the rectangle: lattices (a larger enumeration takes minutes)
    no_rect = _without("relaxed", "rect")
    mm_t = matmul(4, 8, 8, transpose_b=True)
    out["mm_t/relaxed-no-rect/best"] = dict(wl=mm_t, sizes=(1, 4, 4), kw=dict(mode=no_rect))
    out["mm_t/relaxed-no-rect/six"] = dict(wl=mm_t, sizes=(1, 2, 2),
                                           kw=dict(mode=no_rect, solutions=6))
    return out


def cases(subset: str = "all") -> List[str]:
    """Every case id (``build/<layer>/<mode>/<layout>``, ``bnb/<layer>/<mode>``, ``misc/<name>``).

    ``subset="sample"`` is the default test run's few cases."""
    import dataclasses as dc

    from tvm_csp_embed.strategy import fused_variants
    from vta_ext.config import load_config

    cfg = load_config(CONFIG)
    out = []
    for name, base in _layers().items():
        for mode in ("strict", "relaxed"):
            layouts = ["NCHW", "NHWC"] + (fused_variants(dc.replace(base, mode=mode), cfg)
                                          if mode == "relaxed" else [])
            out += [f"build/{name}/{mode}/{lay}" for lay in layouts]
            out.append(f"bnb/{name}/{mode}")
    out += [f"misc/{k}" for k in _misc()]
    if subset == "sample":
        keep = ("build/C11/relaxed/NHWC", "build/D9/strict/NCHW", "build/DB6/relaxed/", "bnb/C7/",
                "misc/conv8/strict/nodes", "misc/conv8/relaxed/all",
                "misc/mm_t/relaxed-no-rect/best", "misc/mm/relaxed/bound",
                "misc/conv3/strict-no-pad")
        out = [c for c in out if c.startswith(keep)]
    return out


def _problem(case: str):
    """(workload, instruction, keyword arguments of :func:`~tvm_csp_embed.solve.solve`)."""
    kind, rest = case.split("/", 1)
    if kind == "misc":
        m = _misc()[rest]
        kw = dict(m["kw"])
        return m["wl"], gemm(m["sizes"]), kw
    from tvm_csp_embed.candidates import operator_workload, solve_request
    from vta_ext.config import load_config

    cfg = load_config(CONFIG)
    parts = rest.split("/")
    name, mode = parts[0], parts[1]
    base = _layers()[name]
    if kind == "build":
        cw = dataclasses.replace(base, layout=parts[2], mode=mode)
        r = solve_request(cfg, cw)
        return r.wl, r.instr, dict(mode=mode, solutions=r.solutions, max_cost=r.max_cost)
    if kind == "bnb":
        cw = dataclasses.replace(base, layout="NCHW", mode=mode)
        instr = gemm((cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT))
        return operator_workload(cw)[0], instr, dict(mode=mode)
    raise ValueError(f"case {case!r}: unknown kind {kind!r}; use build/, bnb/ or misc/")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def record(case: str, timeout: float = 120.0, result: Optional[list] = None) -> Dict[str, Any]:
    """Solve one case with the current model: its record (module docstring) and MiniZinc's
    flattening time. ``result``, if given, receives ``(workload, instruction, SolveResult)``."""
    wl, instr, kw = _problem(case)
    mode = kw.pop("mode")
    res = solve(wl, instr, mode, timeout=timeout, **kw)
    if result is not None:
        result.append((wl, instr, res))
    return result_record(res)


def result_record(res) -> Dict[str, Any]:
    """The record of one :class:`~tvm_csp_embed.solve.SolveResult` (module docstring)."""
    sols = [{"binding": s.binding, "bit_dims": list(s.bit_dims), "bit_steps": list(s.bit_steps),
             "pad": list(s.pad), "cost": s.cost, "optimal": s.optimal,
             "nodes": _digest({"p": [list(x) for x in s.p],
                               "data": {k: [list(x) for x in v]
                                        for k, v in sorted(s.data_nodes.items())}})}
            for s in res.solutions]
    return {"status": res.status, "solutions": sols,
            "flatten_seconds": round(res.stats.flatten_seconds, 4)}


def batch_records(ids: List[str], size: int, timeout: float = 120.0, searches=None
                  ) -> Dict[str, Dict[str, Any]]:
    """The records of the cases ``ids`` solved ``size`` at a time by
    :func:`~tvm_csp_embed.solve.solve_batch` (one MiniZinc flattening per batch; its searches on
    the executor ``searches`` if given), with each record's ``batch``: the instances flattened
    together with it (1 if its batch was flattened one by one)."""
    out = {}
    for at in range(0, len(ids), size):
        chunk = ids[at:at + size]
        problems = []
        for c in chunk:
            wl, instr, kw = _problem(c)
            kw = {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}
            problems.append(Problem(wl, instr, timeout=timeout, **kw))
        for c, res in zip(chunk, solve_batch(problems, searches)):
            if isinstance(res, Exception):
                raise res
            out[c] = {**result_record(res), "batch": res.stats.batch}
    return out


def write_table(records: Dict[str, Dict[str, Any]]) -> str:
    """The JSON table: the model's sha256, the configuration and one case per line."""
    head = json.dumps({"model_sha256": hashlib.sha256(MODEL.read_bytes()).hexdigest(),
                       "config": CONFIG})
    body = ",\n".join(f"{json.dumps(c)}: {json.dumps(records[c], sort_keys=True)}"
                       for c in sorted(records))
    return head[:-1] + ', "cases": {\n' + body + "\n}}\n"


def same(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    """Two records agree (status, and every solution in order); timings are ignored."""
    return a["status"] == b["status"] and a["solutions"] == b["solutions"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", help="solve every case and write the table (JSON) here")
    g.add_argument("--compare", help="solve every case and compare with this table")
    ap.add_argument("--subset", choices=("all", "sample"), default="all")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per solve")
    ap.add_argument("--batch", type=int, default=1,
                    help="solve this many cases per MiniZinc flattening (solve_batch; default: one each)")
    args = ap.parse_args(argv)
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = lambda x, **k: x
    ids = cases(args.subset)
    ref = json.loads(Path(args.compare).read_text())["cases"] if args.compare else None
    got, bad = {}, []
    t0 = time.perf_counter()
    batched = batch_records(ids, args.batch, args.timeout) if args.batch > 1 else {}
    for c in tqdm(ids, desc="embed reference", unit="solve"):
        got[c] = ({k: v for k, v in batched.pop(c).items() if k != "batch"} if batched
                  else record(c, args.timeout))
        if got[c]["status"] == "timeout":
            print(f"{c}: timeout", file=sys.stderr)
        if ref is not None and (c not in ref or not same(ref[c], got[c])):
            bad.append(c)
            print(f"DIFFERS {c}", file=sys.stderr)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(write_table(got))
    print(f"{len(ids)} cases in {time.perf_counter() - t0:.0f} s"
          + (f"; {len(bad)} differ from {args.compare}" if ref is not None
             else f"; written to {args.out}"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
