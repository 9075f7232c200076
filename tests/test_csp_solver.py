"""The solver as a build step: soundness without the COMPAT table, N best solutions from one
MiniZinc process, the on-disk embedding cache, and the instruction graph against vta_ext's GEMM."""
import pytest

from tvm_csp_embed import cache as csp_cache
from tvm_csp_embed import conv2d, dense, gemm, solve
from tvm_csp_embed.instructions import InstructionGraph
from tvm_csp_embed.verify import ProofError, check_instruction, check_raw
from tvm_csp_embed.workload import Workload, _acc
from vta_ext.config import load_config


def batched_matmul(b, m, n, k) -> Workload:
    """``C[b,i,k] += A[b,i,j] * B[b,j,k]`` (``bij,bjk->bik``): the batch dim is seen by all three
    tensors, so no GEMM axis may walk it."""
    dims = ("b", "i", "k", "j")
    A = _acc("A", ("b", "i", "j"), (b, m, k), [{"b": 1}, {"i": 1}, {"j": 1}], dims)
    B = _acc("B", ("b", "j", "k"), (b, k, n), [{"b": 1}, {"j": 1}, {"k": 1}], dims)
    C = _acc("C", ("b", "i", "k"), (b, m, n), [{"b": 1}, {"i": 1}, {"k": 1}], dims)
    return Workload("bmm", dims, (b, m, n, k), (False, False, False, True), (A, B), C)


CASES = [
    (batched_matmul(2, 8, 8, 8), gemm((1, 4, 4)), "strict"),
    (batched_matmul(2, 8, 8, 8), gemm((1, 4, 4)), "relaxed"),
    (batched_matmul(4, 4, 8, 8), gemm((2, 4, 4)), "relaxed"),
    (dense(2, 24, 12), gemm((2, 4, 4)), "relaxed"),
    (conv2d(1, 3, 6, 6, 8, 3, 3, pad=(1, 1)), gemm((1, 4, 4)), "relaxed"),
    (conv2d(2, 4, 5, 5, 4, 3, 3, layout="NHWC"), gemm((2, 4, 4)), "strict"),
]


@pytest.mark.parametrize("wl,instr,mode", CASES, ids=lambda v: getattr(v, "name", v))
def test_without_compat_every_solution_is_sound_and_compat_is_redundant(wl, instr, mode):
    off = solve(wl, instr, mode, solutions=64, compat=False)
    on = solve(wl, instr, mode, solutions=64)
    assert off.status == on.status == "ok"
    for sol in off.solutions:
        check_raw(sol, wl, instr)          # raises ProofError naming the broken edge
    assert sorted((s.cost, s.key()) for s in off.solutions) == sorted((s.cost, s.key()) for s in on.solutions)
    assert all(s.optimal for s in off.solutions), "the enumeration must complete"


def test_batched_matmul_batch_dim_is_never_walked():
    wl, instr = batched_matmul(2, 8, 8, 8), gemm((1, 4, 4))
    res = solve(wl, instr, "relaxed", solutions=64, compat=False)
    assert res.solutions and all(wl.dims[d] != "b" for s in res.solutions for d in s.bit_dims)


def test_n_best_from_one_process():
    wl, instr = conv2d(1, 3, 8, 8, 8, 3, 3, pad=(1, 1), stride=(2, 2)), gemm((1, 4, 4))
    every = solve(wl, instr, "relaxed", solutions=10_000)
    best = solve(wl, instr, "relaxed", solutions=4)
    assert best.stats.runs == 1 and len(best.solutions) == 4
    assert [(s.cost, s.key()) for s in best.solutions] == [(s.cost, s.key()) for s in every.solutions[:4]]
    assert len({s.key() for s in every.solutions}) == len(every.solutions) > 4
    one = solve(wl, instr, "relaxed", solutions=1)
    assert one.solutions[0].cost == best.solutions[0].cost
    # fewer solutions than asked: all of them, proven, from the same single process
    strict = solve(conv2d(1, 8, 6, 6, 8, 3, 3), instr, "strict", solutions=5)
    assert strict.stats.runs == 1 and len(strict.solutions) == 2 and all(s.optimal for s in strict.solutions)
    # a cost bound keeps the solutions no worse than it
    bounded = solve(wl, instr, "relaxed", solutions=10_000, max_cost=best.solutions[1].cost)
    assert [s.cost for s in bounded.solutions] == [s.cost for s in every.solutions
                                                    if s.cost <= best.solutions[1].cost]


def test_embedding_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(csp_cache.CACHE_ENV, str(tmp_path))
    wl, instr = conv2d(1, 3, 8, 8, 16, 3, 3, pad=(1, 1)), gemm((1, 16, 16))
    first = csp_cache.cached_embeddings(wl, instr, "relaxed", solutions=2)
    assert first.status == "ok" and not first.cached and len(list(tmp_path.glob("*.json"))) == 1

    def no_solver(*args, **kw):
        raise AssertionError("the solver must not run for a cached workload")
    monkeypatch.setattr(csp_cache, "solve", no_solver)
    again = csp_cache.cached_embeddings(wl, instr, "relaxed", solutions=2)
    assert again.cached and [e.mapping_str() for e in again.embeddings] == \
        [e.mapping_str() for e in first.embeddings]
    assert [e.padding for e in again.embeddings] == [e.padding for e in first.embeddings]
    keys = {csp_cache.cache_key(wl, instr, "relaxed", 2), csp_cache.cache_key(wl, instr, "strict", 2),
            csp_cache.cache_key(wl, gemm((2, 16, 16)), "relaxed", 2),
            csp_cache.cache_key(conv2d(1, 3, 8, 8, 16, 3, 3, pad=(1, 1), stride=(2, 2)), instr, "relaxed", 2)}
    assert len(keys) == 4
    assert csp_cache.clear_cache() == 1


def test_timeout_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(csp_cache.CACHE_ENV, str(tmp_path))
    res = csp_cache.cached_embeddings(conv2d(1, 3, 30, 30, 16, 3, 3, pad=(1, 1)), gemm((1, 16, 16)),
                                      "relaxed", solutions=2, timeout=0.01)
    assert res.status == "timeout" and not res.embeddings and "no embedding found within" in res.message
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("preset", ["default", "2x16x16", "1x32x32"])
def test_gemm_graph_matches_vta_gemm(preset):
    cfg = load_config(preset)
    out = check_instruction(gemm(cfg), cfg)
    assert out.shape == (cfg.BATCH, cfg.BLOCK_OUT) and (out != 0).mean() > 0.5


def test_gemm_graph_without_transposed_b_fails_against_vta():
    cfg = load_config("default")
    g = gemm(cfg)
    not_transposed = InstructionGraph("gemm_b_not_transposed", "gemm", g.axes, g.sizes, g.reduction,
                                      {"A": ("x", "z"), "B": ("z", "y"), "C": ("x", "y")})
    with pytest.raises(ProofError, match="do not match the hardware"):
        check_instruction(not_transposed, cfg)
    swapped_sizes = InstructionGraph("gemm_swapped", "gemm", g.axes, (1, 16, 8), g.reduction, g.operand_axes)
    with pytest.raises(ProofError, match="operand A has 8 elements"):
        check_instruction(swapped_sizes, cfg)
