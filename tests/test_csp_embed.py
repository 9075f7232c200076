"""Embeddings: strict/relaxed mappings, padding, binding, options; every solution is proven
independently (islpy scalar re-check + numpy execution against the direct operator)."""
import pytest

from tvm_csp_embed import (EmbeddingNotFound, alu_muladd, conv2d, dense, depthwise_conv2d, embed, embed_all,
                           gemm, matmul, solve)
from tvm_csp_embed.solve import CONSTRAINT_SETS
from tvm_csp_embed.verify import ProofError, check_numeric, check_scalar

G = gemm((1, 16, 16))


def prove(embs):
    assert embs, "no embedding"
    for e in embs:
        check_scalar(e)
        check_numeric(e)
    return embs


@pytest.mark.parametrize("wl,y,z", [
    (matmul(16, 32, 48), "j16", "k16"),
    pytest.param(matmul(16, 32, 48, transpose_b=True), "j16", "k16", marks=pytest.mark.slow),
    (dense(2, 40, 20), "o16", "i16"),
])
def test_strict_matmul_dense(wl, y, z):
    embs, res = embed_all(wl, G, "strict", solutions=2)
    prove(embs)
    e = embs[0]
    assert (str(e.axis("y")), str(e.axis("z"))) == (y, z)
    assert e.binding["C"] == wl.output.name
    assert res.stats.flatten_seconds > 0 and res.stats.nodes >= 1
    assert embs[0].cost <= embs[1].cost and embs[0].raw.key() != embs[1].raw.key()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "HWNC"])
def test_strict_conv_is_the_stock_mapping(layout):
    wl = conv2d(1, 16, 7, 7, 32, 3, 3, pad=(1, 1), stride=(2, 2), layout=layout)
    e = prove([embed(wl, G, "strict")])[0]
    assert e.dims_of("x") == () and e.dims_of("y") == ("k",) and e.dims_of("z") == ("c",)
    assert e.binding == {"A": "data", "B": "weight", "C": "out"}
    assert e.padding == {} and e.unrolled == {}
    # free loops: everything but the channel blocks
    assert e.free_dims["k"] == 2 and e.free_dims["c"] == 1 and e.free_dims["oh"] == 4


def test_strict_conv_batch_maps_to_x_and_thin_channels_are_padded():
    wl = conv2d(2, 3, 6, 6, 8, 3, 3, pad=(1, 1), layout="NHWC")
    e = prove([embed(wl, gemm((2, 4, 4)), "strict")])[0]
    assert (e.dims_of("x"), e.dims_of("y"), e.dims_of("z")) == (("n",), ("k",), ("c",))
    assert e.padding == {"c": 1}


@pytest.mark.parametrize("c", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_relaxed_thin_channels_fold_filter_dims_with_less_padding(c):
    wl = conv2d(1, c, 9, 12, 16, 3, 5, pad=(1, 1), stride=(2, 1))
    embs, _ = embed_all(wl, G, "relaxed", solutions=2, baseline="strict")
    prove(embs)
    e = embs[0]
    assert set(e.dims_of("z")) & {"r", "s"}, e.mapping_str()
    assert e.baseline["mapping"] == "x=1 y=k16 z=c16"
    assert e.baseline["padding"] == {"c": 16 - c}
    assert e.padding_saved > 1.5
    assert e.padded_volume_ratio < e.baseline["padded_volume"]
    assert "data" in e.unrolled  # stencil unrolling of the input
    assert "padding saved" in str(e)


def test_depthwise_conv_with_alu():
    wl = depthwise_conv2d(1, 8, 6, 5, 3, 3, pad=(1, 1), stride=(1, 2))
    e = prove([embed(wl, alu_muladd((1, 16, 16)), "strict")])[0]
    assert e.dims_of("l") == ("c",) and e.padding == {"c": 8}


def test_commutativity_binds_weights_to_A_when_better():
    # matrix-vector: only binding the matrix to B (y walks i) avoids padding j from 1 to 16
    wl = matmul(32, 1, 16)
    e = prove([embed(wl, G, "strict")])[0]
    assert e.binding["A"] == "B" and e.dims_of("y") == ("i",) and e.padding == {}
    r = solve(wl, G, "strict", commutative=False)
    assert r.solutions[0].pad[1] == 15


def test_relaxed_without_symmetry_breaking_enumerates_strided_factors():
    wl = matmul(4, 8, 8, transpose_b=True)
    embs, _ = embed_all(wl, gemm((1, 4, 4)), "relaxed", solutions=6, disable=("symmetry",))
    prove(embs)
    assert len({e.raw.key() for e in embs}) == 6
    assert any(f.stride > 1 for e in embs for f in e.walked.values())


def test_strict_and_relaxed_constraint_sets():
    assert set(CONSTRAINT_SETS["strict"]) - set(CONSTRAINT_SETS["relaxed"]) == {"dense", "linear"}
    with pytest.raises(ValueError, match="unknown constraint"):
        solve(matmul(16, 16, 16), G, ["iso", "nope"])


def test_infeasible_without_padding_names_the_constraints():
    wl = conv2d(1, 3, 6, 6, 16, 3, 3)
    r = solve(wl, G, "strict", disable=("pad",))
    assert r.status == "infeasible" and "no embedding" in r.message
    assert "constraints iso alldiff rect origin dense linear symmetry;" in r.message
    with pytest.raises(EmbeddingNotFound) as ei:
        embed(wl, G, "strict", disable=("pad",))
    assert ei.value.status == "infeasible"


def test_timeout_is_reported_clearly():
    wl = conv2d(1, 1, 64, 64, 32, 5, 5)
    r = solve(wl, G, "relaxed", timeout=0.01)
    assert r.status == "timeout" and "no embedding" in r.message and "within 0.01 s" in r.message
    with pytest.raises(EmbeddingNotFound, match="within 0.01 s"):
        embed(wl, G, "relaxed", timeout=0.01)


def test_portfolio_and_bound_agree_with_default():
    wl = conv2d(1, 16, 6, 6, 16, 3, 3, pad=(1, 1), layout="HWNC")
    base = solve(wl, G, "strict")
    bnd = solve(wl, G, "strict", bound=True)
    assert base.solutions[0].cost == bnd.solutions[0].cost == 0
    assert base.solutions[0].key() == bnd.solutions[0].key()
    mm = matmul(16, 32, 32)
    port = solve(mm, G, "strict", portfolio=True, jobs=2)
    assert port.stats.runs >= 2 and port.stats.asset != "default"
    assert port.solutions[0].key() == solve(mm, G, "strict").solutions[0].key()


def test_proofs_catch_a_corrupted_embedding():
    import dataclasses
    e = embed(matmul(16, 32, 32, True), G, "strict")
    bad_raw = dataclasses.replace(e.raw, data_nodes={**e.raw.data_nodes,
                                                     "A": [(0, (z + 1) % 16) for _, z in e.raw.data_nodes["A"]]})
    with pytest.raises(ProofError, match="not an operator edge"):
        check_scalar(dataclasses.replace(e, raw=bad_raw))
    plan = e.relayout["B"]
    swapped = dataclasses.replace(plan, steps=[s for s in plan.steps if s.kind != "transpose"])
    with pytest.raises(ProofError):
        check_numeric(dataclasses.replace(e, relayout={**e.relayout, "B": swapped}))


def test_embedding_record_is_printable_and_consistent():
    wl = conv2d(1, 32, 5, 5, 16, 3, 3, pad=(1, 1))
    e = embed(wl, G, "strict")
    s = str(e)
    for key in ("mapping", "binding", "padding", "free", "calls", "footprint", "relayout"):
        assert key in s
    assert e.instruction_count == 1 * 1 * 5 * 5 * 2 * 3 * 3
    assert e.footprint_bytes == 1 * 2 * 7 * 7 * 16 + 1 * 2 * 3 * 3 * 256 + 1 * 5 * 5 * 16
    assert "x=1 y=k16 z=c16" in repr(e)


def test_footprint_objective_ranks_by_packed_bytes():
    wl = conv2d(1, 1, 10, 10, 16, 3, 3, pad=(1, 1))
    by_vol, _ = embed_all(wl, G, "relaxed", solutions=4)
    best_fp = embed(wl, G, "relaxed", objective="footprint", footprint_candidates=4)
    assert best_fp.footprint_bytes == min(e.footprint_bytes for e in by_vol)
    prove([best_fp])
    with pytest.raises(ValueError, match="objective"):
        embed(wl, G, "relaxed", objective="speed")


def test_without_rect_lattices_are_found_and_proven_but_not_tiled():
    from tvm_csp_embed.embedding import EmbeddingError, decode
    from tvm_csp_embed.verify import check_raw
    # small enough that the enumeration of every structure completes (about 3 s of search; with
    # K = 8 it ran into the 30 s timeout, and which 4 solutions came back depended on the machine)
    wl, instr = matmul(4, 8, 4, transpose_b=True), gemm((1, 4, 4))
    r = solve(wl, instr, "relaxed", disable=("rect",), solutions=4)
    assert r.status == "ok" and len(r.solutions) == 4
    non_rect = 0
    for s in r.solutions:
        check_raw(s, wl, instr)  # a valid scalar embedding, rectangle or not
        try:
            prove([decode(s, wl, instr)])
        except EmbeddingError as e:
            assert "not a hyper-rectangle" in str(e)
            non_rect += 1
    assert non_rect >= 1



def test_a_factor_that_does_not_tile_its_extent_is_an_embedding_error():
    """Without ``rect``, a 2x2x2 GEMM in a 2x4x4 matmul has solutions whose walk strides (3) do not
    tile the extents: decoding one says which tensor, dim, size and stride, as an
    :class:`EmbeddingError` (it was a numpy reshape error); the others are proven embeddings."""
    from tvm_csp_embed.embedding import EmbeddingError, decode

    wl, instr = matmul(2, 4, 4), gemm((1, 2, 2))
    r = solve(wl, instr, "relaxed", disable=("rect",), solutions=20)
    assert r.status == "ok"
    refused = 0
    for s in r.solutions:
        try:
            prove([decode(s, wl, instr)])
        except EmbeddingError as e:
            assert "does not tile its extent" in str(e) and "not a hyper-rectangle" in str(e)
            refused += 1
    assert 0 < refused < len(r.solutions)

def test_pooling_like_max_reduction_is_rejected():
    tvm = pytest.importorskip("tvm")
    from tvm import te
    from tvm_csp_embed import ConformabilityError, from_te
    A = te.placeholder((8, 8), "int8", "A")
    k = te.reduce_axis((0, 8), "k")
    C = te.compute((8,), lambda i: te.max(A[i, k], axis=k), "C")
    with pytest.raises(ConformabilityError) as ei:
        from_te(C)
    assert ei.value.rule == "multiply-accumulate body"


def test_deterministic_and_config_driven():
    cfgmod = pytest.importorskip("vta_ext.config")
    cfg = cfgmod.load_config("2x16x16")
    wl = conv2d(4, 3, 5, 5, 16, 3, 3, pad=(1, 1), layout="NHWC")
    a = embed(wl, gemm(cfg), "relaxed", cfg=cfg)
    b = embed(wl, gemm(cfg), "relaxed", cfg=cfg)
    assert a.raw.key() == b.raw.key() and a.raw.p == b.raw.p
    assert a.dims_of("x") == ("n",) and a.axis("x").size == cfg.BATCH == 2
    prove([a])
