"""The bias fold's form decided lazily (:func:`tvm_csp_embed.candidates.fold_candidate`,
:func:`~tvm_csp_embed.candidates.settle`): the choice looks for the lane subset a stencil gather
writes (:func:`~tvm_csp_embed.codegen.biasfold._gathered_lanes`) only on candidates that could
still be built, bounding the others' host bytes without it.

On thin layers with a constant bias (the ResNet-18 stem, DeepBench's 1- and 3-channel layers),
built under ``csp-relaxed`` once as the strategy does it and once with every candidate's form
decided up front (the eager choice), with the choice and plan caches emptied in between:

* both builds take the same plans: the same compiled operators, VTA cycles, end-to-end estimate
  and report text, word for word;
* for every folded candidate of either build, the host-byte bound the choice uses before the
  form is decided (:func:`~tvm_csp_embed.codegen.biasfold.fold_copied_bound`, through
  :func:`~tvm_csp_embed.choice.folded_host_bytes_bound`) is at most the elements every form's data
  layout copies, and at most :func:`~tvm_csp_embed.choice.plan_host_bytes` of the form the fold
  takes;
* on the ResNet-18 stem the lazy build looks for fewer subsets than the eager one.

``pytest -m slow`` runs every thin DeepBench layer.
"""
import shutil

import numpy as np
import pytest
from test_bias_fold import _rect_conv
from test_csp_correctness import DEEPBENCH
from tvm import relax

import vta_ext
from tvm_csp_embed import candidates as cands_mod
from tvm_csp_embed import choice, strategy
from tvm_csp_embed.cache import cache_dir
from tvm_csp_embed.candidates import data_layout, settle
from tvm_csp_embed.codegen import biasfold

pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")

#: (c, h, w, k, kh, kw, pad, stride)
STEM = (3, 224, 224, 64, 7, 7, (3, 3), (2, 2))
THIN = {f"DB{i}": (r["c"], r["h"], r["w"], r["k"], r["filter_h"], r["filter_w"],
                   (r["pad_h"], r["pad_w"]), (r["hstride"], r["wstride"]))
        for i, r in DEEPBENCH.items() if r["c"] in (1, 3) and r["n"] == 1}


def _module(c, h, w, k, kh, kw, pad, stride):
    bias = np.random.default_rng(1).integers(-20000, 20000, k)
    mod, _ = _rect_conv(c, h, w, kh, kw, stride=stride, padding=pad, bias=bias, o=k)
    return mod


def _build(mod, eager: bool, monkeypatch, config: str):
    """Build ``mod`` (fresh choice and plan caches); return the report, what each choice saw
    ``(config, kind, op, usable, contender)`` and how many lane subsets were looked for."""
    for sub in ("choices", "plans"):
        shutil.rmtree(cache_dir() / sub, ignore_errors=True)
    seen, looked, inner = [], [], choice._choose
    fold, gathered = cands_mod.fold_candidate, biasfold._gathered_lanes

    def spy(kind, strategy_, mode, config, base, layouts, usable, op, options, contender):
        out = inner(kind, strategy_, mode, config, base, layouts, usable, op, options, contender)
        seen.append((config, kind, op, list(usable), contender))
        return out

    def count(pg, lanes):
        looked.append(pg)
        return gathered(pg, lanes)

    with monkeypatch.context() as m:
        m.setattr(choice, "_choose", spy)
        m.setattr(biasfold, "_gathered_lanes", count)
        if eager:
            m.setattr(strategy, "fold_candidate", lambda op, c, kind: settle(fold(op, c, kind)))
        with vta_ext.build_options(strategy="csp-relaxed", objective="end-to-end"):
            relax.build(mod, target=vta_ext.vta_target(config))
    return vta_ext.last_build_report(), seen, len(looked)


def _check_bounds(seen) -> int:
    """Assert the fold's host-byte bound on every folded candidate ``seen``; how many."""
    n = 0
    for config, kind, op, usable, contender in seen:
        stock_out = (contender[0].out_layout if contender is not None
                     else choice.blocked_output(op, config))
        for c in usable:
            if not c.workload.bias_lanes:
                continue
            bound = biasfold.fold_copied_bound(c.packed)
            settle(c)
            forms = biasfold.fold_forms(c.packed)
            assert all(bound <= layout.copied for _, layout in forms), (c.label, bound)
            out = c.packed.operands["C"].host
            exact = choice.plan_host_bytes(op, data_layout(c), out, stock_out)
            assert choice.folded_host_bytes_bound(op, bound, out, stock_out) <= exact, c.label
            n += 1
    return n


def _case(layer, monkeypatch, config="default"):
    mod = _module(*layer)
    lazy, seen_l, looked_l = _build(mod, False, monkeypatch, config)
    eager, seen_e, looked_e = _build(mod, True, monkeypatch, config)
    assert seen_l and seen_e
    assert lazy.vta_keys == eager.vta_keys
    assert lazy.vta_cycles == eager.vta_cycles
    assert lazy.end_to_end_cycles == eager.end_to_end_cycles
    assert [(p.op, p.device, p.detail) for p in lazy.placements] == \
        [(p.op, p.device, p.detail) for p in eager.placements]
    assert _check_bounds(seen_e) > 0, "no candidate folds its bias"
    _check_bounds(seen_l)
    return looked_l, looked_e


def test_resnet18_stem_lazy_choice_is_the_eager_one_and_looks_for_fewer_subsets(monkeypatch):
    looked_lazy, looked_eager = _case(STEM, monkeypatch)
    assert looked_eager > 0 and looked_lazy < looked_eager


@pytest.mark.parametrize("config", [pytest.param("pipelined", marks=pytest.mark.slow)])  # default: above
def test_resnet18_stem_lazy_choice_is_the_eager_one_pipelined(config, monkeypatch):
    _case(STEM, monkeypatch, config)


@pytest.mark.parametrize("layer", ["DB6"])
def test_thin_layer_lazy_choice_is_the_eager_one(layer, monkeypatch):
    _case(THIN[layer], monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("layer", sorted(THIN))
def test_thin_layers_lazy_choice_is_the_eager_one_slow(layer, monkeypatch):
    _case(THIN[layer], monkeypatch)
