"""The CSP code's accumulator initialisation (issue 18, item 3): padding-only ACC LOADs instead of
GEMM reset micro-ops.

* both initialisations give the numpy result bit for bit (stock family and a stencil-unrolled,
  fused-z thin-channel embedding; bias + shift + clip);
* the fill program has no reset micro-op, the same GEMM and ALU micro-ops, one LOAD per output
  tile that reads no DRAM byte and writes the tile's elements as padding (counted by hand);
* the knob model's DRAM bytes still equal the simulator's counters;
* the compute module is busy less by the hand-counted difference on ``default``, and the total
  is not higher on ``pipelined``.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import conv2d_nchw, requantize

from tvm_csp_embed import conv2d, embed_all, gemm
from tvm_csp_embed.codegen import build_gemm, packed_gemm
from tvm_csp_embed.codegen.knobs import evaluate
from vta_ext.config import load_config
from vta_ext.isa import AluInsn, GemmInsn, MemInsn, MemType, Opcode
from vta_ext.lower.racecheck import check_races
from vta_ext.sim.cycles import CycleModel

EPILOGUE = (("bias",), ("shr", 5), ("clip", -128, 127))
PERMS = {"data": (0, 1, 2, 3), "weight": (0, 1, 2, 3), "out": (0, 1, 2, 3)}


def _case(c, hw, k, r, pad, stride, mode):
    cfg = load_config("default")
    wl = conv2d(1, c, hw + 2 * pad, hw + 2 * pad, k, r, r, stride=(stride, stride))
    ohw = (hw + 2 * pad - r) // stride + 1
    shapes = {"data": (1, c, hw, hw), "weight": (k, c, r, r), "out": (1, k, ohw, ohw)}
    dpad = {"n": (0, 0), "c": (0, 0), "h": (pad, pad), "w": (pad, pad)}
    pads = {"data": tuple(dpad[d] for d in wl.inputs[0].dim_names)}
    rng = np.random.default_rng(18)
    x = rng.integers(-128, 128, shapes["data"]).astype(np.int8)
    w = rng.integers(-128, 128, shapes["weight"]).astype(np.int8)
    b = rng.integers(-(1 << 14), 1 << 14, (1, k, 1, 1)).astype(np.int32)
    ref = requantize(conv2d_nchw(x, w, stride, pad), b, 5, (-128, 127))
    emb = embed_all(wl, gemm(cfg), mode)[0][0]
    return cfg, packed_gemm(emb, shapes, PERMS, pads), {"data": x, "weight": w}, b, ref


def _run(cfg, pg, arrays, bias, knobs, acc_init):
    compiled = build_gemm(cfg, pg, EPILOGUE, knobs, acc_init=acc_init)
    a = pg.operands["A"].host.pack_numpy(arrays[pg.operands["A"].tensor])
    b = pg.operands["B"].host.pack_numpy(arrays[pg.operands["B"].tensor])
    out, stats = compiled.run(a, b, pg.bias_layout(bias.shape).pack_numpy(bias))
    return compiled, pg.operands["C"].host.unpack_numpy(out), stats


def _counts(program):
    """GEMM and reset uop-iterations, and the ACC loads as (x_size, y_size, pad rows)."""
    gemm_uops = resets = 0
    acc = []
    for insn in program.insns:
        if isinstance(insn, GemmInsn):
            n = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
            if insn.reset_reg:
                resets += n
            else:
                gemm_uops += n
        elif (isinstance(insn, MemInsn) and insn.opcode == Opcode.LOAD and insn.x_size
              and insn.memory_type == MemType.ACC):
            acc.append((insn.x_size, insn.y_size, insn.y_pad_0 + insn.y_pad_1))
    return gemm_uops, resets, acc


def test_fill_instead_of_reset_counted_by_hand():
    """1x32x14x14 * 32x32x3x3 pad 1 (stock family), tiles of 16 channels x 7 rows x 14 columns:
    4 output tiles of 98 accumulator elements. Reset: 4 x 98 reset micro-ops. Fill: 4 LOADs of
    one padding row of 98 elements, y_size 0. GEMM micro-ops: 4 tiles x 98 x 2 channel blocks x 9
    taps = 7056 either way; the bias is one 16-channel element per tile (1 x 1 LOAD)."""
    cfg, pg, arrays, bias, ref = _case(32, 14, 32, 3, 1, 1, "strict")
    knobs = {"tile_n": 1, "tile_k": 1, "tile_oh": 7, "tile_ow": 14, "tile_c": 2, "vt_k": 1,
             "vt_oh": 1}
    runs = {m: _run(cfg, pg, arrays, bias, knobs, m) for m in ("reset", "fill")}
    for compiled, got, stats in runs.values():
        np.testing.assert_array_equal(got, ref)
        check_races(compiled.program)   # the fill waits for the previous tile's store, as resets do
        assert stats.gemm_counter == 7056 and stats.alu_counter == 3 * 4 * 98
        assert evaluate(cfg, pg, EPILOGUE, knobs).bytes == {
            c: getattr(stats, c) for c in ("inp_load_nbytes", "wgt_load_nbytes",
                                           "acc_load_nbytes", "out_store_nbytes")}
    assert _counts(runs["reset"][0].program) == (7056, 4 * 98, [(1, 1, 0)] * 4)
    assert sorted(_counts(runs["fill"][0].program)[2]) == sorted([(98, 0, 1)] * 4 + [(1, 1, 0)] * 4)
    assert _counts(runs["fill"][0].program)[:2] == (7056, 0)
    # compute module: a reset costs GEMM_CYCLES_PER_UOP per element, a fill one cycle per element
    # (plus the reset kernel's micro-op load, which the fill does not need)
    busy = {m: CycleModel(cfg).run_program(r[0].program).modules["compute"].busy
            for m, r in runs.items()}
    assert busy["reset"] - busy["fill"] >= 4 * 98 * (cfg.GEMM_CYCLES_PER_UOP - 1)
    piped = load_config("pipelined")
    total = {m: CycleModel(piped).run_program(r[0].program).total_cycles for m, r in runs.items()}
    assert total["fill"] <= total["reset"]


def test_fill_on_a_thin_fused_z_embedding_is_bit_exact_without_resets():
    """3 input channels, 3x3, stride 2, relaxed (z fuses channels and filter rows, data
    stencil-unrolled): the TPS point, both initialisations equal numpy; the fill has no reset and
    one padding-only LOAD per output tile."""
    cfg, pg, arrays, bias, ref = _case(3, 14, 32, 3, 1, 2, "relaxed")
    assert len(pg.embedding.dims_of("z")) >= 2 and pg.embedding.unrolled
    runs = {m: _run(cfg, pg, arrays, bias, "tps", m) for m in ("reset", "fill")}
    for _, got, _ in runs.values():
        np.testing.assert_array_equal(got, ref)
    g_reset, r_reset, _ = _counts(runs["reset"][0].program)
    g_fill, r_fill, acc = _counts(runs["fill"][0].program)
    assert g_fill == g_reset and r_fill == 0 and r_reset > 0
    fills = [a for a in acc if a[1] == 0]
    # every accumulator element zeroed exactly once per output tile: as many as the resets
    assert sum(x for x, _, _ in fills) == r_reset
    assert runs["fill"][2].acc_load_nbytes == runs["reset"][2].acc_load_nbytes


def test_unknown_acc_init_is_refused():
    cfg, pg, *_ = _case(32, 14, 32, 3, 1, 1, "strict")
    with pytest.raises(ValueError, match="unknown acc_init 'zero'; use one of"):
        build_gemm(cfg, pg, EPILOGUE, "tps", acc_init="zero")


# ------------------------------------------------------------------------------ fewest ALU passes
_STAGES = [("shr", 0), ("shr", 3), ("shr", 20), ("shr", 31), ("add", 0),
           ("clip", -128, 127), ("clip", 0, 127), ("clip", 50, 60), ("min", 127), ("min", -200),
           ("max", 0), ("max", -128), ("max", 90)]


def test_simplified_epilogue_is_the_same_function():
    """Random chains of shifts, identities and bounds: the simplified epilogue gives the numpy
    reference's result on random int32 accumulators, and never has more stages."""
    from conftest import apply_epilogue

    from vta_ext.templates.epilogue import simplify_epilogue

    rng = np.random.default_rng(3)
    acc = np.concatenate([rng.integers(-(1 << 31), 1 << 31, 4000),
                          rng.integers(-300, 300, 2000), [-(1 << 31), (1 << 31) - 1, 0, -1]])
    acc = acc.astype(np.int64)
    for _ in range(400):
        ep = tuple(_STAGES[i] for i in rng.integers(0, len(_STAGES), rng.integers(1, 6)))
        simple = simplify_epilogue(ep)
        assert len(simple) <= len(ep)
        np.testing.assert_array_equal(apply_epilogue(acc, simple), apply_epilogue(acc, ep),
                                      err_msg=f"{ep} -> {simple}")
    # by hand
    assert simplify_epilogue((("shr", 0), ("min", 127), ("max", 0))) == (("clip", 0, 127),)
    assert simplify_epilogue((("shr", 20), ("shr", 20))) == (("shr", 31),)
    assert simplify_epilogue((("clip", 0, 127), ("clip", -128, 60))) == (("clip", 0, 60),)
    # disjoint bounds (a constant result) and vector stages stay as they are
    assert simplify_epilogue((("min", -200), ("max", 0))) == (("min", -200), ("max", 0))
    assert simplify_epilogue((("bias",), ("mul", 1), ("bias",))) == (("bias",), ("bias",))


def test_csp_build_runs_min_max_as_one_clip():
    """``shr 0, min 127, max 0`` (the original tests' two-stage clip after a no-op shift) runs as
    one CLIP pass on the CSP path: a third of the ALU micro-ops, bit-exact."""
    from conftest import apply_epilogue

    cfg, pg, arrays, bias, _ = _case(32, 14, 32, 3, 1, 1, "strict")
    ep = (("shr", 0), ("min", 127), ("max", 0))
    compiled = build_gemm(cfg, pg, ep, "tps")
    a = pg.operands["A"].host.pack_numpy(arrays[pg.operands["A"].tensor])
    b = pg.operands["B"].host.pack_numpy(arrays[pg.operands["B"].tensor])
    out, stats = compiled.run(a, b)
    got = pg.operands["C"].host.unpack_numpy(out)
    ref = apply_epilogue(conv2d_nchw(arrays["data"], arrays["weight"], 1, 1), ep)
    np.testing.assert_array_equal(got, ref)
    assert stats.alu_counter == 32 * 14 * 14 // 16    # one pass over the 392 output elements


# ------------------------------------------------------------------------------ the lowering
@pytest.mark.parametrize("strided", [False, True])
def test_fill_pragma_lowering_contiguous_and_strided(strided):
    """``r[i, j] = sum_k a[i, j, k]`` in the accumulator (ALU ADD reduction), 4 x 3 elements,
    zeroed under ``ACC_FILL_PRAGMA``: above both loops, one LOAD of one padding row of 12
    elements; under the j loop (i strides by 3 elements), one LOAD per element (12). Equal to
    numpy on two runs of one simulator (the accumulator holds the first run's sums when the second
    starts); no DRAM byte is read by the fills; no GEMM reset."""
    from tvm import te
    from tvm.s_tir import Schedule

    from vta_ext.lower.codegen import lower_to_runtime
    from vta_ext.lower.intrin import ACC_FILL_PRAGMA
    from vta_ext.lower.passes import lower_schedule
    from vta_ext.runtime import CommandQueue

    cfg = load_config("default")
    L, K = cfg.BATCH * cfg.BLOCK_OUT, 5
    a = te.placeholder((4, 3, K, L), "int32", name="a")
    k = te.reduce_axis((0, K), "k")
    r = te.compute((4, 3, L), lambda i, j, c: te.sum(a[i, j, k, c], axis=k), name="r")
    out = te.compute((4, 3, L), lambda *i: r(*i).astype("int8"), name="out")
    sch = Schedule(te.create_prim_func([a, out]))
    rb = sch.get_sblock("r")
    sch.set_scope(rb, 0, "local.acc_buffer")
    sch.cache_read(rb, 0, "local.acc_buffer")
    i, j, c, kk = sch.get_loops(rb)
    if strided:
        sch.reorder(j, i, kk, c)
        init = sch.decompose_reduction(rb, i)
        sch.annotate(sch.get_loops(init)[1], ACC_FILL_PRAGMA, 1)
    else:
        sch.reorder(i, j, kk, c)
        init = sch.decompose_reduction(rb, i)
        sch.annotate(sch.get_loops(init)[0], ACC_FILL_PRAGMA, 1)
    gen = lower_to_runtime(cfg, lower_schedule(sch.mod)["main"])
    q = CommandQueue(cfg)
    av = np.random.default_rng(5).integers(-1000, 1000, (4, 3, K, L)).astype(np.int32)
    bufs = {"a": q.alloc(av.nbytes, "a"), "out": q.alloc(4 * 3 * L, "out")}
    gen.emit(q, bufs)
    prog = q.synchronize()
    check_races(prog)
    prog.write("a", av)
    from vta_ext.sim import FunctionalSimulator

    sim = FunctionalSimulator(cfg)
    for _ in range(2):   # the scratchpads persist: the second run starts from the first's sums
        stats = prog.run(sim)
        np.testing.assert_array_equal(prog.read("out", np.int8, (4, 3, L)),
                                      av.astype(np.int64).sum(axis=2).astype(np.int8))
    fills = [(x.x_size, x.y_pad_0) for x in prog.insns if isinstance(x, MemInsn)
             and x.opcode == Opcode.LOAD and x.x_size and x.y_size == 0]
    assert fills == ([(1, 1)] * 12 if strided else [(12, 1)])
    assert stats.acc_load_nbytes == av.nbytes          # the operand only
    assert not any(isinstance(x, GemmInsn) for x in prog.insns)


# ------------------------------------------------------------------------------ epilogue shape
def _alu_free(program):
    """The instruction stream with the ALU immediates left out."""
    return [dataclasses.replace(i, imm=0) if isinstance(i, AluInsn) else i for i in program.insns]


def test_epilogues_of_one_shape_run_the_same_program_but_their_immediates():
    """The choice is made once per epilogue shape (``epilogue_shape``), so two epilogues of one
    shape must give programs that differ only in ALU immediates and time the same: a CSP
    embedding and the stock template, shift 5 clip [-128, 127] against shift 7 clip [0, 127].
    A clip beyond int8 (MIN + MAX, one more ALU pass) and a zero shift (no pass) change the shape."""
    from vta_ext.templates.conv2d import build_conv2d
    from vta_ext.templates.epilogue import epilogue_shape
    from vta_ext.templates.workload import Conv2dWorkload

    cfg, pg, *_ = _case(3, 14, 32, 3, 1, 2, "relaxed")
    one, two = EPILOGUE, (("bias",), ("shr", 7), ("clip", 0, 127))
    wide, unshifted = (("bias",), ("shr", 5), ("clip", -300, 300)), (("bias",), ("shr", 0),
                                                                      ("clip", 0, 127))
    assert epilogue_shape(cfg, one) == epilogue_shape(cfg, two)
    assert len({epilogue_shape(cfg, e) for e in (one, wide, unshifted)}) == 3
    wl = Conv2dWorkload(1, 14, 14, 32, 32, 3, 3, 1, 1, 1, 1)
    for build in (lambda e: build_gemm(cfg, pg, e, "tps").program,
                  lambda e: build_conv2d(cfg, wl, e, "tps").program):
        a, b, c = (build(e) for e in (one, two, wide))
        assert _alu_free(a) == _alu_free(b) and a.insns != b.insns
        assert CycleModel(cfg).run_program(a) == CycleModel(cfg).run_program(b)
        alu = [sum(isinstance(i, AluInsn) for i in p.insns) for p in (a, c)]
        assert alu[1] > alu[0]          # the wide clip is MIN and MAX
