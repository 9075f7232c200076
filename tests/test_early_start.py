"""Early start (:mod:`vta_ext.lower.earlystart`): the resident tile's load split along the first
GEMM's folded loop, the first tile's GEMM run chunk by chunk as the slices come in.

DeepBench layer 107 (1x1x40x151 * 32x1x5x20, stride 2 / 8, pad 8; NHWC ``x=1 y=k16 z=s16``,
weights resident and loaded once for the two row threads) is the case: its first GEMM waited
for the whole 5 KB weight tile. Checked here, against independent references:

* the chunked program is bit-exact (the functional simulator against the numpy reference of the
  workload; a Relax build of the layer against llvm), race-free under the token semantics
  (:func:`vta_ext.lower.racecheck.check_races`), and its stream is what the module says: five
  weight LOADs of one filter row each, the first GEMM in five;
* the cycle model times it below the program without the split on DB107's shape (the ranking
  that is the feature), and on two one-thread shapes where the build takes it;
* where the estimate (:func:`~vta_ext.lower.earlystart.early_start_saving`) prices the split
  slower (DB107's shape on ``pynq``), the build keeps the whole load, and the cycle model agrees;
* one chunked program runs bit-exact on the RTL of the pynq design, within its hazard contract.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_csp_bit_exact_on, rtl_device, run_module

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
import vta_ext
from tvm_csp_embed.candidates import candidates
from tvm_csp_embed.codegen.build import build_gemm
from tvm_csp_embed.reference import reference_for
from tvm_csp_embed.strategy import CspWorkload
from vta_ext.config import load_config
from vta_ext.isa import GemmInsn, MemInsn, MemType, Opcode
from vta_ext.lower.earlystart import DECLINED, EARLY
from vta_ext.lower.racecheck import check_races
from vta_ext.sim.cycles import CycleModel

EP = (("bias",), ("shr", 6), ("clip", -128, 127))
#: DeepBench layer 107's filter, strides and padding
K, R, S, SH, SW, PAD = 32, 5, 20, 2, 8, 8


def _workload(h: int, w: int) -> CspWorkload:
    p = (("n", 1), ("c", 1), ("h", h), ("w", w), ("k", K), ("kh", R), ("kw", S), ("pt", PAD),
         ("pl", PAD), ("pb", PAD), ("pr", PAD), ("sh", SH), ("sw", SW))
    return CspWorkload("conv2d", p, layout="NHWC")


def _build(config: str, h: int, w: int, threads: int, early_start=None):
    """DB107's embedding and point (one row tile per thread, the weights resident) on an
    ``h`` x ``w`` image: ``(candidate, compiled)``."""
    cfg = load_config(config)
    cands, _ = candidates(cfg, _workload(h, w), "relaxed", ["NHWC"], EP)
    cand = next(c for c in cands if c.embedding.mapping_str() == "x=1 y=k16 z=s16")
    oh = (h + 2 * PAD - R) // SH + 1
    knobs = {"tile_n": 1, "tile_oh": oh // threads, "tile_ow": 1, "tile_k": 2, "tile_s": 2,
             "vt_k": 1, "vt_oh": threads, "order": 1}
    return cand, build_gemm(cfg, cand.packed, EP, knobs, early_start=early_start)


def _cycles(compiled) -> int:
    return CycleModel(compiled.config).run_program(compiled.program).total_cycles


def _bit_exact(compiled, workload, seed: int) -> None:
    """The program on the functional simulator against the numpy reference of ``workload``."""
    inputs, expected, unpack = reference_for("conv2d", "csp-relaxed")(
        compiled.config, workload, EP, np.random.default_rng(seed))
    out, _ = compiled.run(*inputs)
    np.testing.assert_array_equal(unpack(out), expected)


def _weight_loads(program):
    return [i for i in program.insns if isinstance(i, MemInsn) and i.opcode == Opcode.LOAD
            and i.memory_type == MemType.WGT and i.x_size]


def test_db107_chunked_stream_is_bit_exact_race_free_and_faster():
    cand, chunked = _build("pipelined", 40, 151, 2)
    _, whole = _build("pipelined", 40, 151, 2, early_start=False)
    assert EARLY in chunked.generated.release, chunked.generated.release
    assert EARLY not in whole.generated.release
    # five slices of one filter row (4 of the 20 weight tiles each) instead of one LOAD
    assert [i.x_size for i in _weight_loads(whole.program)] == [20]
    assert [i.x_size for i in _weight_loads(chunked.program)] == [4] * 5
    gemms = [i for i in chunked.program.insns if isinstance(i, GemmInsn)]
    assert [g.iter_in for g in gemms[:6]] == [1] * 5 + [5]
    for compiled in (chunked, whole):
        check_races(compiled.program)
        _bit_exact(compiled, cand.workload, 3)
    assert _cycles(chunked) < _cycles(whole)


@pytest.mark.parametrize("config,h,w", [("pipelined", 16, 40), ("default", 40, 151)])
def test_one_thread_shapes_take_it_bit_exact_and_faster(config, h, w):
    cand, chunked = _build(config, h, w, 1)
    _, whole = _build(config, h, w, 1, early_start=False)
    assert EARLY in chunked.generated.release, chunked.generated.release
    check_races(chunked.program)
    _bit_exact(chunked, cand.workload, 4)
    assert _cycles(chunked) < _cycles(whole)


def test_declined_where_the_estimate_prices_it_slower():
    """On ``pynq`` (a costlier instruction, no faster bus) the split of DB107's program would
    delay its second thread: the build keeps the whole load, and the cycle model agrees."""
    _, kept = _build("pynq", 40, 151, 2)
    _, forced = _build("pynq", 40, 151, 2, early_start=True)
    assert DECLINED in kept.generated.release, kept.generated.release
    assert [i.x_size for i in _weight_loads(kept.program)] == [20]
    assert EARLY in forced.generated.release
    assert _cycles(forced) > _cycles(kept)


def test_db107_relax_build_bit_exact_against_llvm():
    """The layer as a network binds it (weights and bias constants, bias + shift + clip): the
    build on ``pipelined`` takes the split, and its output equals llvm's."""
    from tvm import relax

    rng = np.random.default_rng(107)
    x = rng.integers(-128, 128, (1, 1, 40, 151)).astype(np.int8)
    wt = rng.integers(-128, 128, (K, 1, R, S)).astype(np.int8)
    b = rng.integers(-20000, 20000, (1, K, 1, 1)).astype(np.int32)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "int8"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(xv, relax.const(wt), strides=(SH, SW),
                                           padding=(PAD, PAD), out_dtype="int32"))
            y = bb.emit(relax.op.add(y, relax.const(b)))
            y = bb.emit(relax.op.right_shift(y, relax.const(6, "int32")))
            y = bb.emit(relax.op.clip(y, -128, 127))
            out = bb.emit_output(relax.op.astype(y, "int8"))
        bb.emit_func_output(out)
    mod = bb.get()
    with vta_ext.build_options(strategy="csp-relaxed"):
        got = run_module(mod, vta_ext.vta_target("pipelined"), [x])
    report = vta_ext.last_build_report()
    (p,) = [p for p in report.on_vta if p.call is not None]
    from vta_ext.executor import compiled_op
    assert EARLY in compiled_op(report.key_of(p)).generated.release
    np.testing.assert_array_equal(got, run_module(mod, "llvm", [x]))


def test_chunked_program_bit_exact_on_the_pynq_rtl():
    """A one-thread chunked program (taken by the build's rule on ``pynq``) on the RTL of the
    pynq design, against the numpy reference, with no pair of micro-ops closer than the
    RTL's hazard distance."""
    from vta_ext.hazard import program_violations

    device = rtl_device()
    cand, compiled = _build("pynq", 16, 40, 1)
    assert EARLY in compiled.generated.release, compiled.generated.release
    check_races(compiled.program)
    assert program_violations(compiled.program, (3, 3)) == []
    assert_csp_bit_exact_on(device, compiled, cand.workload, EP, 9)
