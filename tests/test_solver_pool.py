"""The distinct workloads of a module are solved concurrently by a bounded pool of MiniZinc
batches, in the background (``OpTemplate.prefetch`` -> ``tvm_csp_embed.cache.solve_concurrently``
with ``wait=False``, each batch one ``tvm_csp_embed.solve.solve_batch``): an operator is planned as
soon as its own solves are done, while the later operators' solves run.

A five-conv chain (four distinct conv workloads, one repeated) with a fresh cache: every distinct
solve runs once, in the pool, at most ``TVM_CSP_EMBED_SOLVERS`` batches at a time and at least two
at once; each operator is planned after all of its own layouts are solved (NHWC is not solved: its
embeddings are NCHW's, permuted), and planning overlaps the later solves; planning itself solves
nothing; the output is bit-exact against numpy.
"""
import threading
import time

import numpy as np
import pytest
import tvm
from conftest import conv2d_nchw, conv_chain, requantize
from tvm import relax

import tvm_csp_embed  # noqa: F401
import vta_ext
from tvm_csp_embed import cache as C
from tvm_csp_embed import strategy as S


#: the weights of the chain: four distinct conv workloads (the third repeats the second)
SHAPES = [(32, 16, 3, 3), (32, 32, 3, 3), (32, 32, 3, 3), (48, 32, 3, 3), (16, 48, 3, 3)]


def _chain():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 12, 12), "int8"))
    ws = [relax.Var(f"w{i}", relax.TensorType(s, "int8"))
          for i, s in enumerate(SHAPES)]
    with bb.function("main", [x] + ws):
        with bb.dataflow():
            y = x
            for w in ws:
                y = conv_chain(bb, y, w, None, padding=1, shift=8, clip=(-128, 127))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _check_bit_exact(ex, seed: int) -> None:
    """The chain built into ``ex`` on random inputs equals the numpy reference bit for bit."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (1, 16, 12, 12)).astype(np.int8)
    ws = [rng.integers(-128, 128, s).astype(np.int8) for s in SHAPES]
    ref = x
    for w in ws:
        ref = requantize(conv2d_nchw(ref, w, 1, 1), None, 8, (-128, 127))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in [x] + ws]).numpy()
    np.testing.assert_array_equal(got, ref)


def test_distinct_workloads_solved_concurrently_before_planning(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    monkeypatch.setenv(C.SOLVERS_ENV, "2")
    S._packed.cache_clear()
    active, peak, solved, planned, solved_in_plan = [0], [0], [], [], []
    lock = threading.Lock()
    real_batch, real_plan = C.solve_batch, S.CspGemmTemplate.plan

    done = []             # (workload name, thread name) of each finished solve, in order
    while_planning = []   # solves that finished after the first operator's planning began
    started = []
    permuted = set()      # workloads whose embeddings are another layout's, permuted

    def solve_batch(problems, searches=None):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            solved.extend(p.wl.name for p in problems)
        try:
            time.sleep(0.2)  # hold the slot long enough that a second batch must overlap it
            for p, res in zip(problems, real_batch(problems, searches)):
                with lock:
                    done.append((p.wl.name, threading.current_thread().name))
                    if started:
                        while_planning.append(p.wl.name)
                yield res
        finally:
            with lock:
                active[0] -= 1

    def solve(wl, *args, **kwargs):
        solved_in_plan.append(wl.name)
        raise AssertionError(f"planning solved {wl.name}")

    def plan(self, op, config):
        base = self._base(op)
        solves = S.layout_solves(config, base, self.mode, self._layouts("auto", base, config))
        # NHWC is NCHW with its dims permuted: its embeddings are NCHW's, permuted, not solved
        assert [(lay, src and src[0]) for lay, _, src in solves][:2] == [("NCHW", None), ("NHWC", "NCHW")]
        names = {req.wl.name for _, req, src in solves if src is None}
        with lock:
            permuted.update(req.wl.name for _, req, src in solves if src is not None)
        with lock:
            started.append(op.name)
        result = real_plan(self, op, config)
        with lock:
            planned.append(op.name)
            # every layout of this operator was solved before it was planned
            assert names <= {n for n, _ in done}, (names, done)
        return result
    monkeypatch.setattr(C, "solve_batch", solve_batch)
    monkeypatch.setattr(C, "solve", solve)
    monkeypatch.setattr(S.CspGemmTemplate, "plan", plan)
    with vta_ext.build_options(strategy="csp-relaxed"):
        ex = relax.build(_chain(), target="ext_vta")
    # NCHW and the fused variants of two distinct workloads; each once, in the pool; no NHWC
    assert len(solved) >= 4 and len(set(solved)) == len(solved) and not solved_in_plan
    assert len(permuted) == 4 and not permuted & set(solved)
    assert all(thread.startswith("minizinc") for _, thread in done)
    assert peak[0] == 2
    assert len(planned) == 5 and while_planning, "planning did not overlap the later solves"
    assert vta_ext.last_build_report().placement() == [("relax.nn.conv2d", "vta")] * 5
    _check_bit_exact(ex, seed=0)


@pytest.mark.parametrize("value,message", [("two", "not a number"), ("0", "1 or more")])
def test_solver_pool_size_names_the_variable(monkeypatch, value, message):
    monkeypatch.setenv(C.SOLVERS_ENV, value)
    with pytest.raises(ValueError, match=f"{C.SOLVERS_ENV}.*{message}"):
        C.solver_pool_size()


def test_a_build_waiting_for_a_solve_prepares_the_operators_whose_solves_are_done(tmp_path,
                                                                                    monkeypatch):
    """While the first operator waits for its (slowed) solve, the build computes the candidates
    of later operators whose solves are done (``cache.add_idle_work``); their plans, and the
    output, are those of a build that does not (its idle work switched off)."""
    monkeypatch.setenv(C.SOLVERS_ENV, "2")
    real_batch, real_plan, real_candidates = C.solve_batch, S.CspGemmTemplate.plan, S.candidates
    planning, early = [], []
    prepared, holding = threading.Event(), [True]

    def slow_batch(problems, searches=None):
        if holding[0] and any("_c16_" in p.wl.name for p in problems):   # the first operator's
            # solve is held until the build has prepared the later operators (at most a minute:
            # not a fixed sleep, which a loaded machine can outlast before their solves are done)
            prepared.wait(timeout=60)
        return real_batch(problems, searches)

    def plan(self, op, config):
        planning.append(self._base(op))
        try:
            return real_plan(self, op, config)
        finally:
            planning.pop()

    def spy(config, base, *args, **kwargs):
        if planning and base != planning[-1]:
            early.append(base)                # another operator's candidates, during a plan
            if {dict(b.params)["k"] for b in early} >= {48, 16}:
                prepared.set()
        return real_candidates(config, base, *args, **kwargs)
    monkeypatch.setattr(C, "solve_batch", slow_batch)
    monkeypatch.setattr(S.CspGemmTemplate, "plan", plan)
    monkeypatch.setattr(S, "candidates", spy)
    reports = []
    for idle in (True, False):
        monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path / str(idle)))
        S._packed.cache_clear()
        if not idle:
            holding[0] = False        # nothing would prepare them: do not hold the solve
            monkeypatch.setattr(C, "add_idle_work", lambda step: None)
            monkeypatch.setattr(S, "add_idle_work", lambda step: None)
        with vta_ext.build_options(strategy="csp-relaxed"):
            ex = relax.build(_chain(), target="ext_vta")
        reports.append(vta_ext.last_build_report())
        if idle:
            # the later operators' workloads (48 and 16 output channels) were prepared early
            assert {dict(b.params)["k"] for b in early} >= {48, 16}
            early.clear()
        else:
            assert not early
    with_idle, without = ([(p.plan, p.detail) for p in r.placements if p.op == "relax.nn.conv2d"]
                          for r in reports)
    assert with_idle == without and len(with_idle) == 5
    _check_bit_exact(ex, seed=1)


def test_the_worker_process_gives_the_solvers_own_results_and_its_end_is_an_error():
    """``cache.solve_batch`` runs ``solve.solve_batch`` in the solver's worker process: the same
    solutions in the same order as in this process; a worker that ends fails its open batch with
    a clear error, and the next batch starts a new worker."""
    import importlib

    from tvm_csp_embed import solve_worker as W
    from tvm_csp_embed.instructions import gemm
    from tvm_csp_embed.workload import conv2d

    solve_mod = importlib.import_module("tvm_csp_embed.solve")
    problems = [solve_mod.Problem(conv2d(1, c, 6, 6, 16, 3, 3, pad=(1, 1)), gemm((1, 16, 16)),
                                  "relaxed", solutions=4, max_cost=4000) for c in (3, 8, 16)]
    here = list(solve_mod.solve_batch(problems))
    there = list(C.solve_batch(problems))
    assert [r.status for r in there] == [r.status for r in here] == ["ok"] * 3
    assert [[s.key() + (s.pad, s.cost) for s in r.solutions] for r in there] == \
        [[s.key() + (s.pad, s.cost) for s in r.solutions] for r in here]
    assert any(len(r.solutions) > 1 for r in here)
    first = W._worker()
    batch = C.solve_batch(problems)
    first.proc.kill()
    first.proc.wait()
    with pytest.raises(RuntimeError, match="solver worker"):
        list(batch)
    again = list(C.solve_batch(problems[:1]))          # a new worker
    assert W._worker() is not first and again[0].status == "ok"


@pytest.mark.parametrize("value,message", [("low", "not a number"), ("25", "0 to 19")])
def test_solver_nice_names_the_variable(monkeypatch, value, message):
    from tvm_csp_embed import solve_worker as W

    monkeypatch.setenv(W.NICE_ENV, value)
    with pytest.raises(ValueError, match=f"{W.NICE_ENV}.*{message}"):
        W.solver_nice()
