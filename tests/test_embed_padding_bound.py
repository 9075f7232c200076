"""The model's redundant padding bound (``pad[d] >= PADDENSE[d, nb[d]]``, ``models/embed.mzn``)
changes no solve's answer, and prunes the search of the solves that were slow without it.

The reference is the same model with that one constraint removed: both must return the same
solutions in the same order (structure, padding, cost, optimality, every scalar node value), on
ResNeXt-50 32x4d's three narrow grouped convs (4 and 8 channels a group; 571-861 search nodes
before) and its 7x7 stem in the fused-reduction layouts, as a build asks them (the 16 cheapest
below the stock mapping's cost). ``scripts/embed_equivalence.py`` compares the model with an
earlier revision's on every solve of the 15 networks and the DeepBench layers.
"""
import importlib
import re

import pytest

from tvm_csp_embed.candidates import CspWorkload, layout_solves
from vta_ext.config import load_config

solve = importlib.import_module("tvm_csp_embed.solve")
BOUND = re.compile(r"^constraint c_rect -> forall\(d in DIMS\)\(pad\[d\] >= PADDENSE\[d, nb\[d\]\]\);\n",
                   re.M)


def _conv(op, c, h, k, kh, pad, stride, g=None):
    p = [("n", 1), ("c", c), ("h", h), ("w", h), ("k", k), ("kh", kh), ("kw", kh), ("pt", pad),
         ("pl", pad), ("pb", pad), ("pr", pad), ("sh", stride), ("sw", stride)]
    return CspWorkload(op, tuple(p + ([("g", g)] if g else [])))


#: (workload, layout): the grouped convs in NCHW (NHWC is its permutation), the stem fused
CASES = {
    "w4_56x56": (_conv("group_conv2d", 128, 56, 128, 3, 1, 1, 32), "NCHW"),
    "w8_56x56_s2": (_conv("group_conv2d", 256, 56, 256, 3, 1, 2, 32), "NCHW"),
    "w8_28x28": (_conv("group_conv2d", 256, 28, 256, 3, 1, 1, 32), "NCHW"),
    "stem_fused_rs": (_conv("conv2d", 3, 224, 64, 7, 3, 2), "fused-rs"),
}


def _record(res):
    return res.status, [(s.binding, s.bit_dims, s.bit_steps, s.pad, s.cost, s.optimal, s.p,
                         s.data_nodes) for s in res.solutions]


@pytest.fixture(scope="module")
def unbounded_model(tmp_path_factory):
    text = solve.MODEL.read_text()
    assert len(BOUND.findall(text)) == 1, "the padding bound is not in the model as this test reads it"
    path = tmp_path_factory.mktemp("model") / "embed.mzn"
    path.write_text(BOUND.sub("", text))
    return path


@pytest.mark.parametrize("name", list(CASES))
def test_padding_bound_keeps_the_solutions_and_prunes(name, unbounded_model, monkeypatch):
    base, layout = CASES[name]
    cfg = load_config("default")
    [(_, req, _)] = layout_solves(cfg, base, "relaxed", [layout])
    assert req.solutions == 16 and req.max_cost is not None
    got = {}
    for label, model in (("bounded", solve.MODEL), ("unbounded", unbounded_model)):
        monkeypatch.setattr(solve, "MODEL", model)
        got[label] = solve.solve(req.wl, req.instr, req.mode, solutions=req.solutions, timeout=120,
                                 max_cost=req.max_cost)
    assert got["bounded"].status == "ok" and len(got["bounded"].solutions) == 16
    assert _record(got["bounded"]) == _record(got["unbounded"])
    assert got["bounded"].stats.nodes < got["unbounded"].stats.nodes
