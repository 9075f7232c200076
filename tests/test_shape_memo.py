"""Work shared across epilogue immediates (:mod:`tvm_csp_embed.shape_cycles`, the knob search's
memo key in :mod:`tvm_csp_embed.codegen.knobs`): two epilogues of one shape (other shifts and
clips) give the same cycle-model count and the same knob point as each one computed alone, and
the second one is neither built nor searched again."""
import dataclasses

import pytest

from tvm_csp_embed import shape_cycles
from tvm_csp_embed.candidates import CspWorkload, DEFAULT_SOLUTIONS, candidates
from tvm_csp_embed.codegen import knobs as K
from vta_ext import executor
from vta_ext.config import load_config

pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")

#: two epilogues of one shape (bias, one shift, one clip) and one of another (no shift)
EP_A = (("bias",), ("shr", 7), ("clip", -128, 127))
EP_B = (("bias",), ("shr", 9), ("clip", -128, 127))
EP_C = (("bias",), ("clip", -128, 127))


def _candidate():
    """The best-estimated candidate of a 64 -> 64 1x1 conv at 14x14 under csp-relaxed."""
    cfg = load_config("default")
    base = CspWorkload("conv2d", (("n", 1), ("c", 64), ("h", 14), ("w", 14), ("k", 64),
                                  ("kh", 1), ("kw", 1), ("pt", 0), ("pl", 0), ("pb", 0),
                                  ("pr", 0), ("sh", 1), ("sw", 1)))
    cands, _ = candidates(cfg, base, "relaxed", ["NCHW"], EP_A, solutions=DEFAULT_SOLUTIONS)
    return cfg, min((c for c in cands if not c.refused), key=lambda c: c.estimate)


def _built_cycles(cfg, wl, ep) -> int:
    key = executor.op_key("conv2d", "csp-relaxed", cfg, wl, ep, "cycles")
    executor.compiled_op(key, config=cfg)
    return executor.cycle_report(key).total_cycles


def test_one_count_per_epilogue_shape(monkeypatch):
    cfg, c = _candidate()
    shape_cycles.forget()
    built = []
    real = executor.compiled_op
    monkeypatch.setattr(executor, "compiled_op", lambda key, config=None: built.append(key) or
                        real(key, config=config))
    a = shape_cycles.modelled_cycles("conv2d", "csp-relaxed", cfg, c.workload, EP_A, "cycles")
    b = shape_cycles.modelled_cycles("conv2d", "csp-relaxed", cfg, c.workload, EP_B, "cycles")
    assert len(set(built)) == 1                # B's count came from A's program
    cc = shape_cycles.modelled_cycles("conv2d", "csp-relaxed", cfg, c.workload, EP_C, "cycles")
    assert len(set(built)) == 2                # another shape: built and timed
    monkeypatch.setattr(executor, "compiled_op", real)
    # the reference: each program built and timed by the cycle model on its own
    assert a == _built_cycles(cfg, c.workload, EP_A)
    assert b == _built_cycles(cfg, c.workload, EP_B)
    assert cc == _built_cycles(cfg, c.workload, EP_C) != a   # one shift pass fewer


def test_knob_search_shared_across_immediates():
    cfg, c = _candidate()
    pg = c.packed
    served_a = K.cycle_point(cfg, pg, EP_A)
    served_b = K.cycle_point(cfg, pg, EP_B)       # from A's search
    alone = dataclasses.replace(pg, derived={})  # the same program, no memo
    assert alone.derived == {}
    assert served_b == K.search(cfg, alone, EP_B, objective="cycles") == served_a
    assert K.tps_point(cfg, pg, EP_B) == K.search(cfg, alone, EP_B, objective="bytes")
