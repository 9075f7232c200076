"""Tests of the TIR -> VTA lowering: intrinsics, DMA/ALU/GEMM recognition, micro-op folding,
dependency tokens (race freedom under the token semantics), virtual threads."""
from __future__ import annotations

import numpy as np
import pytest

from vta_ext.config import CONFIG_DIR, load_config
from vta_ext.isa import AluInsn, AluOp, GemmInsn, MemInsn, MemType, Opcode

pytest.importorskip("tvm")

from vta_ext.lower.codegen import LoweringError, lower_to_runtime  # noqa: E402
from vta_ext.lower.intrin import gemm_intrin_names, register_gemm_intrin  # noqa: E402
from vta_ext.lower.passes import lower_schedule  # noqa: E402
from vta_ext.lower.racecheck import RaceError, check_races  # noqa: E402
from vta_ext.runtime import CommandQueue  # noqa: E402
from vta_ext.templates.conv2d import (EPILOGUE_ORIGINAL, EPILOGUE_PIPELINE, Conv2dKnobs,  # noqa: E402
                                      Conv2dWorkload, build_conv2d)

CONFIGS = ["default"] + [c for c in ("2x16x16", "1x32x32") if (CONFIG_DIR / f"{c}.json").exists()]


@pytest.mark.parametrize("name", CONFIGS)
def test_gemm_intrinsic_registered_per_shape(name):
    from tvm.s_tir import TensorIntrin
    cfg = load_config(name)
    gemm, reset = register_gemm_intrin(cfg)
    assert (gemm, reset) == gemm_intrin_names(cfg)
    assert gemm == f"vta.gemm_{cfg.BATCH}x{cfg.BLOCK_IN}x{cfg.BLOCK_OUT}"
    desc = TensorIntrin.get(gemm).desc
    loops = [x for x in desc.script().splitlines() if " in T.grid(" in x or " in range(" in x]
    # with BATCH == 1 the unit batch loop is not part of the description
    assert len(loops) == 1
    assert ("T.grid(%d, %d, %d)" % (cfg.BATCH, cfg.BLOCK_OUT, cfg.BLOCK_IN) in loops[0]) \
        if cfg.BATCH > 1 else ("T.grid(%d, %d)" % (cfg.BLOCK_OUT, cfg.BLOCK_IN) in loops[0])
    assert register_gemm_intrin(cfg) == (gemm, reset)   # idempotent


def _small(cfg, knobs=Conv2dKnobs(), epilogue=EPILOGUE_ORIGINAL, **kw):
    args = dict(batch=cfg.BATCH, height=6, width=6, in_channels=2 * cfg.BLOCK_IN,
                out_channels=2 * cfg.BLOCK_OUT, kernel_h=3, kernel_w=3, pad_h=1, pad_w=1,
                stride_h=1, stride_w=1)
    args.update(kw)
    return build_conv2d(cfg, Conv2dWorkload(**args), epilogue, knobs)


def apache_config():
    """The original stack's configuration: default shape, no ISA extensions."""
    from vta_ext.config import VTAConfig
    if (CONFIG_DIR / "apache.json").exists():
        return load_config("apache")
    return VTAConfig.from_dict({**load_config("default").to_dict(), "EXT_CLIP": False,
                                "EXT_PAD_MIN": False}, name="apache")


def test_fallback_instruction_shapes():
    """Fallback schedule: per ci block one padded 3x3 input load and one 9-element weight load; the
    3x3 window GEMM is one micro-op with both kernel loops folded into the instruction."""
    cfg = apache_config()
    conv = _small(cfg)
    insns = conv.program.insns
    gemms = [i for i in insns if isinstance(i, GemmInsn) and not i.reset_reg]
    resets = [i for i in insns if isinstance(i, GemmInsn) and i.reset_reg]
    assert len(gemms) == 6 * 6 * 2 * 2 and len(resets) == 6 * 6 * 2
    for g in gemms:
        assert (g.uop_end - g.uop_bgn, g.iter_out, g.iter_in) == (1, 3, 3)
        assert (g.src_factor_out, g.src_factor_in) == (1, 3)      # d_j then d_i over a 3x3 tile
        assert (g.wgt_factor_out, g.wgt_factor_in) == (1, 3)
    inp = [i for i in insns if isinstance(i, MemInsn) and i.opcode == Opcode.LOAD
           and i.memory_type == MemType.INP and i.x_size]
    first = inp[0]      # output pixel (0, 0): one row and one column of padding before
    assert (first.y_size, first.x_size, first.y_pad_0, first.x_pad_0, first.y_pad_1,
            first.x_pad_1, first.x_stride) == (2, 2, 1, 1, 0, 0, 6)
    interior = [i for i in inp if not (i.x_pad_0 or i.x_pad_1 or i.y_pad_0 or i.y_pad_1)]
    assert interior and all((i.x_size, i.y_size) == (3, 3) for i in interior)
    alus = [i for i in insns if isinstance(i, AluInsn)]
    ops = [(AluOp(a.alu_opcode).name, a.use_imm, a.imm) for a in alus[:4]]
    assert ops == [("SHR", True, 8), ("ADD", False, 0), ("MIN", True, 127), ("MAX", True, 0)]
    acc_loads = [i for i in insns if isinstance(i, MemInsn) and i.memory_type == MemType.ACC
                 and i.x_size]
    assert len(acc_loads) == 6 * 6 * 2
    stores = [i for i in insns if isinstance(i, MemInsn) and i.opcode == Opcode.STORE and i.x_size]
    assert len(stores) == 6 * 6 * 2


def test_pipeline_epilogue_order():
    conv = _small(apache_config(), epilogue=EPILOGUE_PIPELINE)
    alus = [i for i in conv.program.insns if isinstance(i, AluInsn)]
    assert [AluOp(a.alu_opcode).name for a in alus[:4]] == ["ADD", "SHR", "MIN", "MAX"]


def test_clip_uses_the_clip_extension_when_available():
    from vta_ext.isa import clip_bounds
    cfg = load_config("default")
    if not cfg.EXT_CLIP:
        pytest.skip("the default preset has no EXT_CLIP")
    conv = _small(cfg, epilogue=EPILOGUE_PIPELINE)
    alus = [i for i in conv.program.insns if isinstance(i, AluInsn)]
    assert [AluOp(a.alu_opcode).name for a in alus[:3]] == ["ADD", "SHR", "CLIP"]
    assert clip_bounds(alus[2].imm) == (0, 127) and alus[2].use_imm
    # bounds outside int8 cannot be packed into a CLIP immediate: MIN + MAX
    conv = _small(cfg, epilogue=(("clip", -1000, 1000),))
    alus = [i for i in conv.program.insns if isinstance(i, AluInsn)]
    assert [(AluOp(a.alu_opcode).name, a.imm) for a in alus[:2]] == [("MIN", 1000), ("MAX", -1000)]


CASES = [
    ("default", Conv2dKnobs(), {}),
    ("default", Conv2dKnobs(tile_h=3, tile_w=2, tile_ci=2, tile_co=2), {}),
    ("default", Conv2dKnobs(oc_nthread=2), {}),
    ("default", Conv2dKnobs(h_nthread=2, oc_nthread=2, tile_w=3), {"out_channels": 64}),
    ("default", Conv2dKnobs(), {"in_channels": 16, "kernel_h": 1, "kernel_w": 1, "pad_h": 0,
                                "pad_w": 0}),
    ("2x16x16", Conv2dKnobs(oc_nthread=2, tile_h=2), {"batch": 4}),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_race_free_and_balanced(case):
    name, knobs, kw = CASES[case]
    if name not in CONFIGS:
        pytest.skip(f"no {name} preset")
    cfg = load_config(name)
    conv = _small(cfg, knobs, **kw)
    report = check_races(conv.program)
    assert report.checked_accesses > 0
    assert all(v == 0 for v in report.leftover_tokens[-1].values())


def test_racecheck_detects_missing_token():
    cfg = load_config("default")
    conv = _small(cfg, Conv2dKnobs(oc_nthread=2))
    prog = conv.program
    # drop the pop that makes the first GEMM wait for its input/weight loads
    g = next(i for i in prog.insns if isinstance(i, GemmInsn) and not i.reset_reg
             and i.pop_prev_dep)
    g.pop_prev_dep = False
    with pytest.raises(RaceError):
        check_races(prog)


def test_virtual_threads_use_separate_sram_regions():
    cfg = load_config("default")
    conv = _small(cfg, Conv2dKnobs(oc_nthread=2))
    wgt_bases = {i.sram_base for i in conv.program.insns if isinstance(i, MemInsn)
                 and i.memory_type == MemType.WGT and i.x_size}
    assert len(wgt_bases) == 2                   # double-buffered weight tiles
    assert conv.generated.nthreads == 2
    # thread 0's and thread 1's loads are interleaved inside the shared reduction loop
    src = conv.generated.source
    body = src[src.index("for v"):]
    assert body.count("load_2d(B_kernel") == 2


def _alu_only_program(cfg, shift):
    """acc tile loaded by DMA, ALU SHR, truncating store -- a non-conv use of the lowering."""
    import tvm
    from tvm import te, tirx
    from tvm.s_tir import Schedule
    shape = (4, 6, cfg.BATCH, cfg.BLOCK_OUT)
    a = te.placeholder(shape, "int32", name="a")
    r = te.compute(shape, lambda *i: a(*i) >> tirx.const(shift, "int32"), name="r")
    out = te.compute(shape, lambda *i: r(*i).astype("int8"), name="out")
    sch = Schedule(te.create_prim_func([a, out]))
    ob = sch.get_sblock("out")
    i0, i1, _, _ = sch.get_loops(ob)
    rb = sch.get_sblock("r")
    sch.set_scope(rb, 0, "local.acc_buffer")
    sch.compute_at(rb, i0)
    ab = sch.cache_read(rb, 0, "local.acc_buffer")
    sch.compute_at(ab, i0)
    return lower_to_runtime(cfg, lower_schedule(sch.mod)["main"]), shape


def test_lowering_alu_only_function():
    cfg = load_config("default")
    gen, shape = _alu_only_program(cfg, 3)
    q = CommandQueue(cfg)
    bufs = {"a": q.alloc(int(np.prod(shape)) * 4, "a"), "out": q.alloc(int(np.prod(shape)), "out")}
    gen.emit(q, bufs)
    prog = q.synchronize()
    check_races(prog)
    rng = np.random.default_rng(3)
    a = rng.integers(-5000, 5000, shape).astype(np.int32)
    prog.write("a", a)
    stats = prog.run()
    np.testing.assert_array_equal(prog.read("out", np.int8, shape), (a >> 3).astype(np.int8))
    assert stats.alu_counter == 4 * 6 and stats.acc_load_nbytes == a.nbytes


def test_emit_requires_all_buffers():
    cfg = load_config("default")
    gen, shape = _alu_only_program(cfg, 1)
    q = CommandQueue(cfg)
    with pytest.raises(LoweringError, match="no DRAM buffer given"):
        gen.emit(q, {"a": q.alloc(64, "a")})


def test_in_place_alias_guard():
    """ALU stages run in place; reading a value that an earlier stage overwrote is rejected."""
    from tvm import te, tirx
    from tvm.s_tir import Schedule
    cfg = load_config("default")
    shape = (2, 3, 1, 16)
    a = te.placeholder(shape, "int32", name="a")
    r1 = te.compute(shape, lambda *i: a(*i) >> tirx.const(2, "int32"), name="r1")
    r2 = te.compute(shape, lambda *i: r1(*i) + a(*i), name="r2")   # reads a after r1 overwrote it
    out = te.compute(shape, lambda *i: r2(*i).astype("int8"), name="out")
    sch = Schedule(te.create_prim_func([a, out]))
    i0 = sch.get_loops(sch.get_sblock("out"))[0]
    for name in ("r2", "r1"):
        blk = sch.get_sblock(name)
        sch.set_scope(blk, 0, "local.acc_buffer")
        sch.compute_at(blk, i0)
    ab = sch.cache_read(sch.get_sblock("r1"), 0, "local.acc_buffer")
    sch.compute_at(ab, i0)
    with pytest.raises(LoweringError, match="overwritten in place"):
        lower_to_runtime(cfg, lower_schedule(sch.mod)["main"])


def test_generated_code_is_fast():
    """The generated Python replays ResNet-18 C2's fallback loops (~250k runtime calls' worth of
    instructions) without touching TVM: with a no-op queue it takes a fraction of a second."""
    import time
    from vta_ext.templates.conv2d import schedule_conv2d

    cfg = load_config("default")
    wl = Conv2dWorkload(1, 56, 56, 64, 64, 3, 3, 1, 1, 1, 1)
    sch, _ = schedule_conv2d(cfg, wl, EPILOGUE_ORIGINAL, Conv2dKnobs())
    gen = lower_to_runtime(cfg, lower_schedule(sch.mod)["main"])
    calls = {"n": 0}

    class CountingQueue:
        def __getattr__(self, name):
            def call(*args):
                calls["n"] += 1
            return call

    t0 = time.perf_counter()
    gen.emit(CountingQueue(), {n: None for n in ("data", "kernel", "bias", "out")})
    elapsed = time.perf_counter() - t0
    # 12544 store points x (reset, 4 x (2 loads + GEMM), bias load, 4 ALU, store) + tokens
    assert calls["n"] > 12544 * 14
    assert elapsed < 3.0, f"generation loop took {elapsed:.2f} s"


def test_pad_min_load():
    """``if_then_else(cond, x, INT_MIN)`` is a LOAD with the pad-min extension (max pooling);
    rows entirely in the padding are filled by a y-padding-only load."""
    from tvm import te, tirx
    from tvm.s_tir import Schedule
    cfg = load_config("default")
    if not cfg.EXT_PAD_MIN:
        pytest.skip("the default preset has no EXT_PAD_MIN")
    H, W = 4, 5
    a = te.placeholder((H, W, 1, 16), "int32", name="a")
    p = te.compute((H + 2, W + 2, 1, 16), lambda y, x, b, c: tirx.if_then_else(
        tirx.all(y >= 1, y < H + 1, x >= 1, x < W + 1), a[y - 1, x - 1, b, c],
        tirx.const(-(1 << 31), "int32")), name="p")
    r = te.compute(p.shape, lambda *i: te.max(p(*i), tirx.const(-5, "int32")), name="r")
    out = te.compute(p.shape, lambda *i: r(*i).astype("int8"), name="out")
    sch = Schedule(te.create_prim_func([a, out]))
    y = sch.get_loops(sch.get_sblock("out"))[0]
    for name in ("r", "p"):
        blk = sch.get_sblock(name)
        sch.set_scope(blk, 0, "local.acc_buffer")
        sch.compute_at(blk, y)
    gen = lower_to_runtime(cfg, lower_schedule(sch.mod)["main"])
    q = CommandQueue(cfg)
    bufs = {"a": q.alloc(H * W * 64, "a"), "out": q.alloc((H + 2) * (W + 2) * 16, "out")}
    gen.emit(q, bufs)
    prog = q.synchronize()
    check_races(prog)
    loads = [i for i in prog.insns if isinstance(i, MemInsn) and i.memory_type == MemType.ACC
             and i.x_size]
    assert all(i.pad_min for i in loads) and any(i.y_size == 0 for i in loads)
    rng = np.random.default_rng(5)
    av = rng.integers(-100, 100, (H, W, 1, 16)).astype(np.int32)
    prog.write("a", av)
    prog.run()
    ref = np.full((H + 2, W + 2, 1, 16), -5, np.int64)
    ref[1:H + 1, 1:W + 1] = np.maximum(av, -5)
    np.testing.assert_array_equal(prog.read("out", np.int8, ref.shape), ref.astype(np.int8))


def _acc_program(cfg, func_builder, decompose=None):
    from tvm import te
    from tvm.s_tir import Schedule
    args, stages, caches = func_builder()
    sch = Schedule(te.create_prim_func(args))
    y = sch.get_loops(sch.get_sblock("out"))[0]
    for name in stages:
        blk = sch.get_sblock(name)
        sch.set_scope(blk, 0, "local.acc_buffer")
        sch.compute_at(blk, y)
    for name, idx in caches:
        c = sch.cache_read(sch.get_sblock(name), idx, "local.acc_buffer")
        sch.compute_at(c, y)
    if decompose:
        name, n_red = decompose
        blk = sch.get_sblock(name)
        sch.decompose_reduction(blk, sch.get_loops(blk)[-n_red])
    return lower_to_runtime(cfg, lower_schedule(sch.mod)["main"])


def _run(cfg, gen, inputs, out_shape):
    q = CommandQueue(cfg)
    bufs = {n: q.alloc(v.nbytes, n) for n, v in inputs.items()}
    bufs["out"] = q.alloc(int(np.prod(out_shape)), "out")
    gen.emit(q, bufs)
    prog = q.synchronize()
    check_races(prog)
    for n, v in inputs.items():
        prog.write(n, v)
    stats = prog.run()
    return prog.read("out", np.int8, out_shape), prog, stats


def test_residual_add_of_int8_tensors():
    """int8 tensors loaded into the accumulator (LOAD ACC_8BIT, sign-extending), ALU ADD vector,
    clip and truncating store."""
    from tvm import te, tirx
    cfg = apache_config()
    shape = (3, 5, 1, 16)

    def build():
        a = te.placeholder(shape, "int8", name="a")
        b = te.placeholder(shape, "int8", name="b")
        r = te.compute(shape, lambda *i: a(*i).astype("int32") + b(*i).astype("int32"), name="r")
        c = te.compute(shape, lambda *i: te.max(te.min(r(*i), tirx.const(127, "int32")),
                                                tirx.const(-128, "int32")), name="c")
        out = te.compute(shape, lambda *i: c(*i).astype("int8"), name="out")
        return [a, b, out], ["c", "r"], [("r", 0), ("r", 1)]

    gen = _acc_program(cfg, build)
    rng = np.random.default_rng(11)
    a = rng.integers(-128, 128, shape).astype(np.int8)
    b = rng.integers(-128, 128, shape).astype(np.int8)
    out, prog, stats = _run(cfg, gen, {"a": a, "b": b}, shape)
    np.testing.assert_array_equal(out, np.clip(a.astype(np.int32) + b, -128, 127).astype(np.int8))
    loads = [i for i in prog.insns if isinstance(i, MemInsn) and i.x_size
             and i.opcode == Opcode.LOAD and i.memory_type != MemType.UOP]
    assert {MemType(i.memory_type) for i in loads} == {MemType.ACC_8BIT}
    assert stats.acc_load_nbytes == 2 * 15 * 64       # fsim counts the 64-byte acc element


@pytest.mark.parametrize("name", [c for c in CONFIGS if load_config(c).EXT_PAD_MIN])
def test_max_pool_reduction_with_pad_min(name):
    """A 3x3/stride-2 max pooling: pad-min load, constant init (MIN+MAX or CLIP), ALU MAX
    reduction loops with destination stride 0."""
    from tvm import te, tirx
    cfg = load_config(name)
    L = cfg.BATCH * cfg.BLOCK_OUT
    H, W, P, S, K = 5, 6, 1, 2, 3
    OH, OW = (H + 2 * P - K) // S + 1, (W + 2 * P - K) // S + 1

    def build():
        a = te.placeholder((H, W, L), "int8", name="a")
        p = te.compute((H + 2 * P, W + 2 * P, L), lambda y, x, c: tirx.if_then_else(
            tirx.all(y >= P, y < H + P, x >= P, x < W + P), a[y - P, x - P, c],
            tirx.const(-128, "int8")), name="p")
        ky = te.reduce_axis((0, K), "ky")
        kx = te.reduce_axis((0, K), "kx")
        mx = te.comm_reducer(lambda u, v: te.max(u, v), lambda t: tirx.const(-128, t), name="mx")
        r = te.compute((OH, OW, L), lambda y, x, c: mx(
            p[y * S + ky, x * S + kx, c].astype("int32"), axis=[ky, kx]), name="r")
        out = te.compute((OH, OW, L), lambda *i: r(*i).astype("int8"), name="out")
        return [a, out], ["r", "p"], []

    gen = _acc_program(cfg, build, decompose=("r", 4))   # at the output-column loop
    rng = np.random.default_rng(12)
    a = rng.integers(-128, 128, (H, W, L)).astype(np.int8)
    out, prog, _ = _run(cfg, gen, {"a": a}, (OH, OW, L))
    pad = np.full((H + 2 * P, W + 2 * P, L), -128, np.int8)
    pad[P:P + H, P:P + W] = a
    ref = np.full((OH, OW, L), -128, np.int8)
    for i in range(K):
        for j in range(K):
            ref = np.maximum(ref, pad[i:i + S * (OH - 1) + 1:S, j:j + S * (OW - 1) + 1:S])
    np.testing.assert_array_equal(out, ref)
    assert any(isinstance(i, MemInsn) and i.pad_min for i in prog.insns)
