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


def test_fallback_instruction_shapes():
    """Fallback schedule: per ci block one padded 3x3 input load and one 9-element weight load; the
    3x3 window GEMM is one micro-op with both kernel loops folded into the instruction."""
    cfg = load_config("default")
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
    cfg = load_config("default")
    conv = _small(cfg, epilogue=EPILOGUE_PIPELINE)
    alus = [i for i in conv.program.insns if isinstance(i, AluInsn)]
    assert [AluOp(a.alu_opcode).name for a in alus[:4]] == ["ADD", "SHR", "MIN", "MAX"]


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
