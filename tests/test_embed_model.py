"""The constraint model returns the same solutions, in the same order, as the model it replaced.

``tests/data/embed_reference.json`` froze, once, the solutions of the earlier model
(``scripts/embed_reference.py --out``, model sha256 in the file) on every solve a build starts
for ResNet-18 C1-C11, MobileNet D1-D9 and the 108 DeepBench layers (strict and relaxed, every
layout the strategy offers), one branch-and-bound solve per layer and mode, and small solves under
the node search order and custom constraint sets. Each case's record is its status and, per
solution in order, the binding, the dim and step of every instruction bit, the padding, the cost,
the optimality flag and a digest of every multiply and data node value. The current model must
reproduce every record, solved one at a time (:func:`~tvm_csp_embed.solve.solve`) and in batches
that share one MiniZinc flattening (:func:`~tvm_csp_embed.solve.solve_batch`, as a build solves).
The default run takes a sample (and re-checks its solutions against islpy with
:func:`~tvm_csp_embed.verify.check_raw`); ``pytest -m slow`` runs every case.
"""
import importlib.util
import json
from pathlib import Path

import pytest

from tvm_csp_embed.instructions import gemm
from tvm_csp_embed.solve import Problem, solve, solve_batch
from tvm_csp_embed.verify import check_raw
from tvm_csp_embed.workload import conv2d

REPO = Path(__file__).resolve().parents[1]
TABLE = Path(__file__).resolve().parent / "data" / "embed_reference.json"


def _script():
    path = REPO / "scripts" / "embed_reference.py"
    spec = importlib.util.spec_from_file_location("embed_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ER = _script()
REFERENCE = json.loads(TABLE.read_text())["cases"]
SAMPLE = ER.cases("sample")


def _check(case, islpy=False):
    got = []
    rec = ER.record(case, result=got)
    ref = REFERENCE[case]
    assert rec["status"] == ref["status"], case
    assert rec["solutions"] == ref["solutions"], case
    if islpy:
        wl, instr, res = got[0]
        for s in res.solutions:
            check_raw(s, wl, instr)


def test_reference_covers_every_case():
    ids = ER.cases("all")
    assert sorted(REFERENCE) == sorted(ids)
    assert len([c for c in ids if c.startswith("build/")]) > 500
    # the frozen solves found embeddings (a table of failures would prove little)
    statuses = [REFERENCE[c]["status"] for c in ids]
    assert statuses.count("ok") > 0.9 * len(ids) and "infeasible" in statuses


@pytest.mark.parametrize("case", [  # DB6 in NCHW and NHWC: slow (C11 and D9 keep those layouts)
    pytest.param(c, marks=pytest.mark.slow) if c in ("build/DB6/relaxed/NCHW", "build/DB6/relaxed/NHWC")
    else c for c in SAMPLE])
def test_same_solutions_as_the_reference_model(case):
    _check(case, islpy=True)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in ER.cases("all") if c not in SAMPLE])
def test_same_solutions_as_the_reference_model_everywhere(case):
    _check(case)


def _check_batched(cases, size, searches=None):
    got = ER.batch_records(cases, size, searches=searches)
    for case in cases:
        assert got[case]["status"] == REFERENCE[case]["status"], case
        assert got[case]["solutions"] == REFERENCE[case]["solutions"], case
    return got


def test_a_batch_gives_the_reference_solutions():
    # the sample's feasible cases in one MiniZinc flattening, cut apart: each its own solutions
    feasible = [c for c in SAMPLE if REFERENCE[c]["status"] == "ok"]
    got = _check_batched(feasible, len(feasible))
    assert {got[c]["batch"] for c in feasible} == {len(feasible)}


def test_a_batchs_searches_run_concurrently_with_the_reference_solutions():
    """The searches of a flattened batch on a pool of 2 threads (as a build runs them): each
    instance still gets its own reference solutions, in order, and both threads searched."""
    import importlib
    import threading
    from concurrent.futures import ThreadPoolExecutor

    solve_mod = importlib.import_module("tvm_csp_embed.solve")

    feasible = [c for c in SAMPLE if REFERENCE[c]["status"] == "ok"]
    threads, inner = set(), solve_mod._search

    def spy(*args):
        threads.add(threading.get_ident())
        return inner(*args)
    with ThreadPoolExecutor(2) as pool, pytest.MonkeyPatch.context() as mp:
        mp.setattr(solve_mod, "_search", spy)
        got = _check_batched(feasible, len(feasible), searches=pool)
    assert {got[c]["batch"] for c in feasible} == {len(feasible)}
    assert len(threads) == 2


def test_a_batch_of_1x1_convs_is_cut_apart_with_the_reference_solutions():
    """A 1x1 filter's r and s have extent 1: under the stock mapping's cost bound no instruction
    bit can walk them (that needs padding), so the model leaves them out of the bits' domains, and
    MiniZinc fixes parts of each instance to constants that its common subexpression elimination
    then shares between instances (an element of a parameter array at a fixed index, arrays of
    constants). The batch is still cut apart, each instance with a copy of what it reads, and
    each gets its reference solutions (nodes included)."""
    cases = ([f"build/{n}/relaxed/{lay}" for n in ("C4", "C7", "DB29") for lay in ("NCHW", "NHWC")]
             + ["build/C10/strict/NCHW", "build/DB31/strict/NHWC"])
    got = _check_batched(cases, len(cases))
    assert {got[c]["batch"] for c in cases} == {len(cases)}


def _bit_domains(wl, instr, **kw):
    import re

    from tvm_csp_embed.solve import CONSTRAINT_SETS, build_data

    text = build_data(wl, instr, CONSTRAINT_SETS["relaxed"], **kw)
    sets = re.search(r"BDOM = \[(.*?)\];", text).group(1)
    return [{wl.dims[int(d) - 1] for d in x.split(",") if d} for x in re.findall(r"\{([^}]*)\}", sets)]


def test_an_extent_1_dim_leaves_the_bit_domains_only_below_the_cost_of_padding_it():
    from tvm_csp_embed.solve import padding_cost

    wl, instr = conv2d(1, 32, 7, 7, 32, 1, 1), gemm((1, 16, 16))     # n, r and s of extent 1
    walked = set().union(*_bit_domains(wl, instr))
    assert {"n", "r", "s"} <= walked                    # no cost bound: padding them may pay
    assert {"n", "r", "s"} <= set().union(*_bit_domains(wl, instr, max_cost=padding_cost(1, 1)))
    below = _bit_domains(wl, instr, max_cost=padding_cost(1, 1) - 1)
    assert set().union(*below) == walked - {"n", "r", "s"} == {"k", "oh", "ow", "c"}
    assert padding_cost(1, 1) == 1000                   # one doubling of an extent of 1


def test_a_batch_with_an_infeasible_instance_is_flattened_one_by_one():
    # MiniZinc finds conv3/strict-no-pad infeasible while flattening; which instance failed cannot
    # be told in a batch, so its batch is flattened again one instance at a time
    cases = ["misc/conv3/strict-no-pad", "misc/conv8/strict/nodes", "misc/mm/relaxed/bound"]
    got = _check_batched(cases, len(cases))
    assert REFERENCE[cases[0]]["status"] == "infeasible"
    assert {got[c]["batch"] for c in cases} == {1}


def test_a_failing_problem_fails_alone():
    ok = conv2d(1, 8, 6, 6, 8, 3, 3)
    instr = gemm((1, 4, 4))
    out = list(solve_batch([Problem(ok, instr, "strict"), Problem(ok, instr, "no-such-mode"),
                            Problem(ok, instr, "relaxed")]))
    assert isinstance(out[1], ValueError) and "no-such-mode" in str(out[1])
    for res, mode in ((out[0], "strict"), (out[2], "relaxed")):
        alone = solve(ok, instr, mode)
        assert res.status == alone.status == "ok"
        assert [s.key() for s in res.solutions] == [s.key() for s in alone.solutions]
        assert [s.p for s in res.solutions] == [s.p for s in alone.solutions]


@pytest.mark.slow
def test_batches_give_the_reference_solutions_everywhere():
    _check_batched(ER.cases("all"), 8)


def test_an_enumeration_looks_first_then_runs_under_the_bound_it_found(monkeypatch):
    """The 4 best embeddings of a 3-channel stem: ``solve_batch`` looks at the first 12 solutions,
    then enumerates again under the 4th cheapest cost of those (``solve.FIRST_LOOK``); the result
    is the single complete enumeration's (``solve``, one MiniZinc run, no first look)."""
    import importlib

    from tvm_csp_embed.solve import padding_cost

    solve_mod = importlib.import_module("tvm_csp_embed.solve")
    runs, real = [], solve_mod._gecode

    def spy(path, args, *rest):
        runs.append((path.name.endswith("_bounded.fzn"), list(args)))
        return real(path, args, *rest)
    monkeypatch.setattr(solve_mod, "_gecode", spy)
    wl, instr = conv2d(1, 3, 33, 33, 64, 3, 3, stride=(2, 2)), gemm((1, 16, 16))
    bound = padding_cost(3, 13)                          # the stock mapping's: 3 -> 16 channels
    got = list(solve_batch([Problem(wl, instr, "relaxed", solutions=4, max_cost=bound)]))[0]
    assert runs == [(False, ["-n", "12"]), (True, ["-a"])]
    whole = solve(wl, instr, "relaxed", solutions=4, max_cost=bound)
    assert got.status == whole.status == "ok" and len(whole.solutions) == 4
    assert [(s.key(), s.pad, s.cost, s.optimal) for s in got.solutions] == \
        [(s.key(), s.pad, s.cost, s.optimal) for s in whole.solutions]
    assert [s.p for s in got.solutions] == [s.p for s in whole.solutions]
