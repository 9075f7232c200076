"""A layout that only reorders an operator's dims is not solved: its embeddings are the other
layout's, permuted (``Workload.permutation_of``, ``solve.permuted_solution``,
``cache.permuted_embeddings``, ``candidates.layout_solves``).

The reference is the solver itself: ``tests/data/embed_reference.json`` froze, among others, the
NCHW and the NHWC solve a build starts for ResNet-18 C1-C11, MobileNet D1-D9 and the 108
DeepBench layers under ``strict`` and ``relaxed``. Every NHWC record must equal its NCHW twin's
solutions permuted: the same bindings, bits, steps, padding, costs and optimality flags, in the
same order. A fresh solve of a grouped convolution in NHWC is compared with the candidates a
build now makes without solving it.
"""
import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from tvm_csp_embed import candidates as CA
from tvm_csp_embed.cache import CachedSolve, cached_embeddings
from tvm_csp_embed.instructions import gemm
from tvm_csp_embed.solve import CONSTRAINT_SETS, RawSolution, permuted_solution
from tvm_csp_embed.workload import conv2d, conv2d_fused, group_conv2d, matmul
from vta_ext.config import load_config

REPO = Path(__file__).resolve().parents[1]
REFERENCE = json.loads((Path(__file__).resolve().parent / "data" / "embed_reference.json")
                       .read_text())["cases"]


def _script():
    spec = importlib.util.spec_from_file_location("embed_reference",
                                                  REPO / "scripts" / "embed_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ER = _script()
STRUCTURE = ("binding", "bit_dims", "bit_steps", "pad", "cost", "optimal")


def _raw(d) -> RawSolution:
    return RawSolution(d["binding"], tuple(d["bit_dims"]), tuple(d["bit_steps"]), tuple(d["pad"]),
                       d["cost"], d["optimal"], [], {})


def _record(s: RawSolution):
    return {"binding": s.binding, "bit_dims": list(s.bit_dims), "bit_steps": list(s.bit_steps),
            "pad": list(s.pad), "cost": s.cost, "optimal": s.optimal}


def test_every_nhwc_reference_solve_is_its_nchw_solve_permuted():
    pairs = sorted(c for c in REFERENCE if c.startswith("build/") and c.endswith("/NHWC"))
    assert len(pairs) == 2 * 128          # 128 layers, strict and relaxed
    solutions, ordered = 0, 0
    for case in pairs:
        twin = case[:-len("NHWC")] + "NCHW"
        wl, instr, _ = ER._problem(case)
        src_wl, _, _ = ER._problem(twin)
        order = wl.permutation_of(src_wl)
        assert order is not None, case
        assert REFERENCE[case]["status"] == REFERENCE[twin]["status"], case
        got = [_record(permuted_solution(_raw(d), order, instr))
               for d in REFERENCE[twin]["solutions"]]
        want = [{k: d[k] for k in STRUCTURE} for d in REFERENCE[case]["solutions"]]
        assert got == want, case
        solutions += len(want)
        ordered += len(want) > 1
    # a table of empty solves would prove little; 13 layers have several solutions to order
    assert solutions >= 290 and ordered >= 13


def test_permuted_solution_reorders_the_factor_runs_by_hand():
    # NCHW conv dims (n, k, oh, ow, c, r, s); NHWC (n, oh, ow, k, r, s, c). One NCHW solution of a
    # gemm (1, 4, 4): x walks nothing, y = k (2 bits), z = s (the inner bit) then c (the outer):
    # the symmetry breaking puts the later dim inner, s (6) before c (4)
    nchw, nhwc = conv2d(1, 2, 6, 6, 4, 3, 3), conv2d(1, 2, 6, 6, 4, 3, 3, layout="NHWC")
    order = nhwc.permutation_of(nchw)
    assert order == (0, 2, 3, 1, 5, 6, 4)
    s = RawSolution(1, (1, 1, 6, 4), (1, 2, 1, 1), (0, 0, 0, 0, 0, 0, 1), 7, True, [], {})
    got = permuted_solution(s, order, gemm((1, 4, 4)))
    # in NHWC: k is dim 3; c (6) is now later than s (5), so c is the inner run of z
    assert got.bit_dims == (3, 3, 6, 5) and got.bit_steps == (1, 2, 1, 1)
    assert got.pad == (0, 0, 0, 0, 0, 1, 0)             # s's padding moved with s
    assert (got.binding, got.cost, got.optimal) == (1, 7, True)


def test_permutation_of_recognises_only_reordered_dims():
    g = group_conv2d(1, 8, 6, 6, 8, 3, 3, 4, pad=(1, 1))
    assert group_conv2d(1, 8, 6, 6, 8, 3, 3, 4, pad=(1, 1), layout="NHWC").permutation_of(g) is not None
    c = conv2d(1, 8, 6, 6, 16, 3, 3)
    assert c.permutation_of(c) == tuple(range(7))
    for other in (conv2d(1, 8, 6, 6, 16, 3, 3, stride=(2, 2)),       # other extents
                  conv2d(1, 8, 6, 6, 16, 3, 1),                     # other dims' extents
                  conv2d_fused(1, 8, 6, 6, 16, 3, 3),               # other dims
                  g, matmul(4, 8, 8)):
        assert c.permutation_of(other) is None and other.permutation_of(c) is None
    # the same dims and extents, the data read one row lower: another operator
    lower = dataclasses.replace(c, inputs=(dataclasses.replace(c.inputs[0], const=(0, 0, 1, 0)),
                                           c.inputs[1]))
    assert lower.permutation_of(c) is None and c.permutation_of(lower) is None
    # the weight's tensor dims in another order (a transposed read): the same scalar dataflow
    t = dataclasses.replace(c, inputs=(c.inputs[0], dataclasses.replace(
        c.inputs[1], coef=c.inputs[1].coef[::-1], const=c.inputs[1].const[::-1],
        shape=c.inputs[1].shape[::-1])))
    assert t.permutation_of(c) == tuple(range(7))


def test_layout_solves_permutes_only_under_the_symmetry_breaking():
    cfg = load_config("default")
    base = CA.CspWorkload("conv2d", (("n", 1), ("c", 16), ("h", 8), ("w", 8), ("k", 16), ("kh", 3),
                                     ("kw", 3), ("pt", 1), ("pl", 1), ("pb", 1), ("pr", 1),
                                     ("sh", 1), ("sw", 1)))
    for mode in CONSTRAINT_SETS:
        got = [(lay, src and src[0]) for lay, _, src in
               CA.layout_solves(cfg, base, mode, ["NCHW", "NHWC", "fused-rs"])]
        assert got == [("NCHW", None), ("NHWC", "NCHW"), ("fused-rs", None)]
    # a constraint list without the symmetry breaking orders the factor runs freely: solve each
    no_sym = tuple(c for c in CONSTRAINT_SETS["relaxed"] if c != "symmetry")
    assert all(src is None for _, _, src in CA.layout_solves(cfg, base, no_sym, ["NCHW", "NHWC"]))


GROUPED = CA.CspWorkload("group_conv2d", (("n", 1), ("c", 32), ("h", 14), ("w", 14), ("k", 32),
                                          ("kh", 3), ("kw", 3), ("pt", 1), ("pl", 1), ("pb", 1),
                                          ("pr", 1), ("sh", 2), ("sw", 2), ("g", 8)))


def test_candidates_in_nhwc_equal_a_fresh_nhwc_solve(fresh_embedding_cache):
    cfg = load_config("default")
    cands, notes = CA.candidates(cfg, GROUPED, "relaxed", ["NCHW", "NHWC"], ())
    assert not notes
    nhwc = [c for c in cands if c.workload.layout == "NHWC"]
    req = CA.solve_request(cfg, dataclasses.replace(GROUPED, layout="NHWC", mode="relaxed"))
    fresh = cached_embeddings(req.wl, req.instr, "relaxed", solutions=req.solutions,
                              max_cost=req.max_cost, cfg=cfg, use_cache=False)
    assert fresh.status == "ok" and len(fresh.embeddings) >= 2
    assert [c.embedding.raw.key() + (c.embedding.raw.pad,) for c in nhwc] == \
        [e.raw.key() + (e.raw.pad,) for e in fresh.embeddings]
    assert [c.embedding.mapping_str() for c in nhwc] == [e.mapping_str() for e in fresh.embeddings]
    assert [c.footprint for c in nhwc] == [CA._footprint(CA.packed_of(CA._record(
        dataclasses.replace(GROUPED, mode="relaxed"), "NHWC", e), cfg)) for e in fresh.embeddings]


def test_a_layout_whose_source_timed_out_is_solved_itself(monkeypatch, fresh_embedding_cache):
    cfg = load_config("default")
    real, asked = CA.cached_embeddings, []

    def cached(wl, *args, **kwargs):
        asked.append(wl.layout)
        if wl.layout == "NCHW":
            return CachedSolve("timeout", [], "no solution within the time limit", False)
        return real(wl, *args, **kwargs)
    monkeypatch.setattr(CA, "cached_embeddings", cached)
    cands, notes = CA.candidates(cfg, GROUPED, "relaxed", ["NCHW", "NHWC"], ())
    assert asked == ["NCHW", "NHWC"]
    assert notes == ["NCHW: no solution within the time limit"]
    assert cands and all(c.workload.layout == "NHWC" for c in cands)


def test_permuted_embeddings_refuses_an_indefinite_source():
    from tvm_csp_embed.cache import permuted_embeddings

    wl = conv2d(1, 8, 6, 6, 16, 3, 3, layout="NHWC")
    with pytest.raises(ValueError, match="timeout.*solve this workload itself"):
        permuted_embeddings(CachedSolve("timeout", [], "", False), tuple(range(7)), wl,
                            gemm((1, 16, 16)), "relaxed")


#: the 15 networks of ``relay_examples/models.py`` at the sizes of the build-time figures
NETWORKS = ([(n, 224) for n in ("resnet18", "mobilenet_v2", "resnext50_32x4d", "regnet_x_1_6gf")]
            + [(n, 112) for n in ("resnet50", "mobilenet_v3_small", "squeezenet1_1",
                                  "shufflenet_v2_x0_5", "mnasnet0_5", "efficientnet_b0",
                                  "regnet_x_400mf", "googlenet", "vgg11", "densenet121", "alexnet")])


@pytest.mark.slow
@pytest.mark.parametrize("name,size", NETWORKS)
def test_every_nhwc_solve_of_a_network_is_its_nchw_solve_permuted(name, size, monkeypatch,
                                                                   tmp_path):
    """Every distinct conv a cold csp-relaxed build of the network plans: a fresh NHWC solve
    equals the NCHW solve (the build's, from the cache) permuted, solutions and order."""
    import sys

    from tvm import relax

    import vta_ext
    from tvm_csp_embed import strategy as S

    sys.path.insert(0, str(REPO / "relay_examples"))
    from models import quantized_example

    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    bases, real = {}, S.candidates

    def recorded(config, base, mode, layouts, *args, **kwargs):
        if "NHWC" in layouts:
            bases[base, mode] = config
        return real(config, base, mode, layouts, *args, **kwargs)
    monkeypatch.setattr(S, "candidates", recorded)
    _, qm, _, _ = quantized_example(name, size)
    with vta_ext.build_options(strategy="csp-relaxed"):
        relax.build(qm.mod, target=vta_ext.vta_target("default"))
    assert len(bases) >= 5
    several = 0
    for (base, mode), cfg in bases.items():
        src, req = (CA.solve_request(cfg, dataclasses.replace(base, layout=lay, mode=mode))
                    for lay in ("NCHW", "NHWC"))
        nchw = cached_embeddings(src.wl, src.instr, mode, solutions=src.solutions,
                                 max_cost=src.max_cost, cfg=cfg)
        nhwc = cached_embeddings(req.wl, req.instr, mode, solutions=req.solutions,
                                 max_cost=req.max_cost, cfg=cfg, use_cache=False)
        assert nchw.cached and nhwc.status == nchw.status, base
        order = req.wl.permutation_of(src.wl)
        assert [_record(permuted_solution(e.raw, order, req.instr)) for e in nchw.embeddings] == \
            [_record(e.raw) for e in nhwc.embeddings], base
        several += len(nhwc.embeddings) > 1
    assert several >= 1
