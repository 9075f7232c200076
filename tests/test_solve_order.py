"""The background solves of a build start in the module's operator order, every template's
together (``OpTemplate.prefetch`` queues them, ``OpTemplate.start_prefetched`` starts them:
``tvm_csp_embed.cache.queue_solves`` / ``start_queued``), not template by template; the order
decides when a solve runs, never its outcome.
"""
import json

import tvm
from conftest import conv_chain
from tvm import relax

import tvm_csp_embed  # noqa: F401
import vta_ext
from tvm_csp_embed import cache as C
from tvm_csp_embed import strategy as S
from tvm_csp_embed.candidates import CspWorkload, layout_solves
from vta_ext.config import load_config


def _mixed_module():
    """A conv2d, a narrow grouped conv2d (8 groups of 4 channels) and a second conv2d: two
    templates whose operators interleave in the module."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 8, 8), "int8"))
    ws = [relax.Var("w0", relax.TensorType((32, 32, 1, 1), "int8")),
          relax.Var("w1", relax.TensorType((32, 4, 3, 3), "int8")),
          relax.Var("w2", relax.TensorType((16, 32, 1, 1), "int8"))]
    with bb.function("main", [x] + ws):
        with bb.dataflow():
            y = conv_chain(bb, x, ws[0], None, shift=8, clip=(-128, 127))
            y = conv_chain(bb, y, ws[1], None, padding=1, shift=8, clip=(-128, 127), groups=8)
            y = conv_chain(bb, y, ws[2], None, shift=8, clip=(-128, 127))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def test_queued_solves_start_in_operator_order(monkeypatch):
    started = []
    monkeypatch.setattr(C, "solve_concurrently", lambda reqs, wait=True: started.extend(reqs))
    monkeypatch.setattr(C, "_QUEUED", [])
    C.queue_solves("conv_b", ["b1"])            # the first template's operators...
    C.queue_solves("conv_d", ["d1", "d2"])
    C.queue_solves("group_a", ["a1"])           # ...then the second template's
    C.queue_solves("group_c", ["c1", "c2"])
    C.queue_solves("unnamed", ["u1"])
    C.start_queued(["group_a", "conv_b", "group_c", "conv_d"])
    assert started == ["a1", "b1", "c1", "c2", "d1", "d2", "u1"]
    assert C._QUEUED == []


def test_a_build_solves_in_module_order_across_templates(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    S._packed.cache_clear()
    calls = []
    real = C.solve_concurrently

    def record(requests, workers=None, wait=True):
        calls.append([r.wl.name for r in requests])
        return real(requests, workers, wait)
    monkeypatch.setattr(C, "solve_concurrently", record)
    with vta_ext.build_options(strategy="csp-relaxed"):
        relax.build(_mixed_module(), target="ext_vta")
    started = [names for names in calls if names]
    assert len(started) == 1        # every template's solves, started together
    names = started[0]
    kinds = [n.split("_")[0] for n in names]
    first_group = kinds.index("group")
    # the first conv2d's solves, then the grouped conv2d's, then the last conv2d's (its input
    # has 32 channels, its output 16)
    assert set(kinds[:first_group]) == {"conv2d"} and all("_k32_" in n for n in names[:first_group])
    last = [i for i, n in enumerate(names) if n.startswith("conv2d") and "_k16_" in n]
    assert last and min(last) > max(i for i, k in enumerate(kinds) if k == "group")


def _requests(config):
    out = []
    for params in (dict(n=1, c=32, h=8, w=8, k=16, kh=3, kw=3, pt=1, pl=1, pb=1, pr=1, sh=1, sw=1),
                   dict(n=1, c=16, h=6, w=6, k=32, kh=1, kw=1, pt=0, pl=0, pb=0, pr=0, sh=1, sw=1)):
        base = CspWorkload("conv2d", tuple(params.items()))
        out += [req for _, req, src in layout_solves(config, base, "relaxed", ["NCHW", "fused-rs"])
                if src is None]
    return out


def _stored(directory) -> dict:
    return {p.name: json.loads(p.read_text())["solutions"] for p in directory.glob("*.json")}


def test_solve_order_does_not_change_the_solutions(tmp_path, monkeypatch):
    """The same requests solved in the pool in opposite orders (other batches, other completion
    order) store the same solutions under the same keys."""
    config = load_config("default")
    reqs = _requests(config)
    assert len(reqs) >= 3
    stores = []
    for name, order in (("forward", reqs), ("reversed", reqs[::-1])):
        monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path / name))
        assert C.solve_concurrently(order, workers=2) == len({r.key for r in reqs})
        stores.append(_stored(tmp_path / name))
    assert stores[0] == stores[1] and len(stores[0]) == len({r.key for r in reqs})


def test_queued_solves_start_when_an_embedding_is_looked_up(tmp_path, monkeypatch):
    """A queue nobody started (no ``start_prefetched``) starts at the first lookup: nothing
    waits for a solve that never runs."""
    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    monkeypatch.setattr(C, "_QUEUED", [])
    req = _requests(load_config("default"))[0]
    C.queue_solves("op", [req])
    got = C.cached_embeddings(req.wl, req.instr, req.mode, solutions=req.solutions,
                              timeout=req.timeout, cfg=req.cfg, max_cost=req.max_cost)
    assert got.status == "ok" and got.embeddings and C._QUEUED == []
    assert (tmp_path / f"{req.key}.json").exists()
