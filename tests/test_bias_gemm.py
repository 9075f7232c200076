"""The bias added by one GEMM of a constant block instead of the vector ALU ADD
(``tvm_csp_embed.codegen.biasfold``: ``gemm_bias_decision``, ``gemm_bias_epilogue``).

A program without spare reduction lanes (64 -> 64 3x3: the reduction is whole 16-lane blocks; a
dense of 256 inputs) adds its bias by one GEMM per output tile: the constant row
``(1, -128, ..., -128)`` in the input buffer times one weight tile of the bias's int8 digits per
output channel block. Checked here:

* bit-exact against numpy on ``default``, ``pipelined`` and ``pynq`` (functional simulator), with
  biases over the whole range and at both of its ends, and on the RTL of the pynq design when its
  library is there;
* the instructions by kind, counted from the emitted programs against a hand count: the vector
  ADD micro-ops that disappear, the GEMM micro-ops that appear, the bias rows no longer loaded
  into the accumulator, the constant row and digit tiles loaded instead; the compute module's
  busy cycles fall by exactly the cycle model's durations of what left it minus what came;
* the knob model's DRAM bytes equal the simulator's counters;
* the range limits (and one value outside: the ALU ADD stays, the report says why);
* a Relax build: bit-exact against llvm, the report's sentence, the tuner's numpy reference of
  its workload; a runtime bias keeps the ADD.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import (bind_constants, conv2d_nchw, conv_module, requantize, rtl_device,
                      run_module)

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
import vta_ext
from tvm_csp_embed import conv2d, dense, embed_all, gemm
from tvm_csp_embed.codegen import build_gemm, packed_gemm
from tvm_csp_embed.codegen.biasfold import (gemm_bias_decision, gemm_bias_epilogue,
                                            gemm_bias_operands)
from tvm_csp_embed.codegen.knobs import compute_work, evaluate
from vta_ext.config import load_config
from vta_ext.isa import AluInsn, AluOp, GemmInsn, MemInsn, MemType, Opcode
from vta_ext.sim.cycles import CycleModel, insn_cycles

EPILOGUE = (("bias",), ("shr", 9), ("clip", -128, 127))
PERMS = {"data": (0, 1, 2, 3), "weight": (0, 1, 2, 3), "out": (0, 1, 2, 3)}
#: what 16 lanes hold with the constants (1, -128, ...): by hand, 127 + 15 * 128 * 128 and
#: -128 - 15 * 127 * 128
HI, LO = 127 + 15 * 128 * 128, -128 - 15 * 127 * 128


def _conv_case(cfg, bias, c=64, hw=14, k=64):
    """The 64 -> 64 3x3 pad 1 conv of random data, its numpy reference and packed program."""
    wl = conv2d(1, c, hw + 2, hw + 2, k, 3, 3, stride=(1, 1))
    shapes = {"data": (1, c, hw, hw), "weight": (k, c, 3, 3), "out": (1, k, hw, hw)}
    pads = {"data": tuple({"n": (0, 0), "c": (0, 0), "h": (1, 1), "w": (1, 1)}[d]
                          for d in wl.inputs[0].dim_names)}
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, shapes["data"]).astype(np.int8)
    w = rng.integers(-128, 128, shapes["weight"]).astype(np.int8)
    b = np.asarray(bias, np.int32).reshape(1, k, 1, 1)
    ref = requantize(conv2d_nchw(x, w, 1, 1), b, 9, (-128, 127))
    emb = embed_all(wl, gemm(cfg), "relaxed")[0][0]
    return packed_gemm(emb, shapes, PERMS, pads), {"data": x, "weight": w}, b, ref


def _dense_case(cfg, bias, n_in=256, n_out=64):
    wl = dense(1, n_in, n_out)
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, (1, n_in)).astype(np.int8)
    w = rng.integers(-128, 128, (n_out, n_in)).astype(np.int8)
    b = np.asarray(bias, np.int32).reshape(n_out)
    ref = requantize(x.astype(np.int64) @ w.astype(np.int64).T, b, 9, (-128, 127))
    emb = embed_all(wl, gemm(cfg), "relaxed")[0][0]
    pg = packed_gemm(emb, {"data": (1, n_in), "weight": (n_out, n_in), "out": (1, n_out)}, {}, {})
    return pg, {"data": x, "weight": w}, b, ref


def _run(cfg, pg, arrays, bias, epilogue, knobs="cycles", device=None):
    compiled = build_gemm(cfg, pg, epilogue, knobs)
    a = pg.operands["A"].host.pack_numpy(arrays[pg.operands["A"].tensor])
    b = pg.operands["B"].host.pack_numpy(arrays[pg.operands["B"].tensor])
    packed_bias = pg.bias_layout(bias.shape).pack_numpy(bias)
    if device is not None:      # on the device itself, which must count its cycles
        sim = device.simulator(cfg)
        out, stats = compiled.run(a, b, packed_bias, simulator=sim)
        cycles = sim.take_cycles()
        assert cycles and all(cycles), cycles
    else:
        out, stats = compiled.run(a, b, packed_bias)
    return compiled, pg.operands["C"].host.unpack_numpy(out), stats


def _biases(n, seed):
    """``n`` biases over the whole range, its two ends among them."""
    b = np.random.default_rng(seed).integers(LO, HI + 1, n)
    b[:2] = LO, HI
    return b


# ------------------------------------------------------------------------------ bit-exact
@pytest.mark.parametrize("config", ["default", "pipelined", "pynq"])
@pytest.mark.parametrize("case", [_conv_case, _dense_case])
def test_bias_by_gemm_bit_exact(config, case):
    cfg = load_config(config)
    pg, arrays, bias, ref = case(cfg, _biases(64, 11))
    assert gemm_bias_decision(pg, "conv2d" if case is _conv_case else "dense", EPILOGUE, bias)[0]
    compiled, got, _ = _run(cfg, pg, arrays, bias, gemm_bias_epilogue(EPILOGUE))
    np.testing.assert_array_equal(got, ref)
    assert_no_vector_pass(compiled, config)


def assert_no_vector_pass(compiled, config):
    """``compiled`` adds its bias by a GEMM: no vector ALU pass is left; on ``pynq`` the program
    keeps the hazard distance."""
    assert compiled.gemm_bias and not any(
        isinstance(i, AluInsn) and not i.use_imm for i in compiled.program.insns)
    if config == "pynq":
        from vta_ext.hazard import program_violations

        assert program_violations(compiled.program, (3, 3)) == []


def test_bias_by_gemm_bit_exact_on_the_pynq_rtl():
    device = rtl_device()
    cfg = load_config("pynq")
    pg, arrays, bias, ref = _conv_case(cfg, _biases(32, 12), c=32, hw=8, k=32)
    _, got, _ = _run(cfg, pg, arrays, bias, gemm_bias_epilogue(EPILOGUE), device=device)
    np.testing.assert_array_equal(got, ref)


# ------------------------------------------------------------------------------ hand count
def _by_kind(program):
    """Micro-op executions of the vector ALU ADDs and of the GEMMs (resets apart), and the
    LOADs that read DRAM, by memory type."""
    out = {"vector_add": 0, "gemm": 0, "ACC": 0, "INP": 0, "WGT": 0}
    for insn in program.insns:
        n = getattr(insn, "iter_out", 0) * getattr(insn, "iter_in", 0) * (
            getattr(insn, "uop_end", 0) - getattr(insn, "uop_bgn", 0))
        if isinstance(insn, AluInsn) and not insn.use_imm and insn.alu_opcode == AluOp.ADD:
            out["vector_add"] += n
        elif isinstance(insn, GemmInsn) and not insn.reset_reg:
            out["gemm"] += n
        elif isinstance(insn, MemInsn) and insn.opcode == Opcode.LOAD and insn.y_size:
            name = MemType(insn.memory_type).name
            if name in out:
                out[name] += 1
    return out


def test_instructions_counted_by_hand_and_the_compute_saving():
    """64 -> 64 3x3 on 14x14, tiles of 2 channel blocks x 7 rows x 14 columns: 4 store points of
    2 x 98 = 196 accumulator entries, 784 in all. The ALU program adds the bias by 784 vector ADD
    micro-ops after loading 4 bias rows into the accumulator; the GEMM program has none of
    either and 784 more GEMM micro-ops (one per entry), and loads 4 pairs of digit tiles (WGT,
    one LOAD per store point) and one constant row (INP): the four threads have one store point
    each and the same row, which thread 0 loads for all (``build_gemm``'s ``share_resident``). On the compute module the difference
    is exactly what left it minus what came, by the cycle model's durations of those
    instructions: on ``default`` 784 x (6 - 4) = 1,568 micro-op cycles plus the fixed cycles."""
    cfg = load_config("default")
    pg, arrays, bias, ref = _conv_case(cfg, _biases(64, 13))
    knobs = dict(tile_n=1, tile_k=2, tile_oh=7, tile_ow=14, tile_c=1, vt_k=2, vt_oh=2, order=0)
    alu, got_alu, _ = _run(cfg, pg, arrays, bias, EPILOGUE, knobs)
    gem, got_gem, stats = _run(cfg, pg, arrays, bias, gemm_bias_epilogue(EPILOGUE), knobs)
    np.testing.assert_array_equal(got_alu, ref)
    np.testing.assert_array_equal(got_gem, ref)
    a, g = _by_kind(alu.program), _by_kind(gem.program)
    assert (a["vector_add"], g["vector_add"]) == (784, 0)
    assert g["gemm"] - a["gemm"] == 784
    assert (a["ACC"], g["ACC"]) == (4, 0)
    assert (g["INP"] - a["INP"], g["WGT"] - a["WGT"]) == (1, 4)

    def compute(insns):
        return sum(insn_cycles(cfg, i) for i in insns)
    gone = compute(i for i in alu.program.insns
                   if (isinstance(i, AluInsn) and not i.use_imm)
                   or (isinstance(i, MemInsn) and i.memory_type == MemType.ACC and i.y_size))
    bias_gemms = [i for i in gem.program.insns if isinstance(i, GemmInsn) and not i.reset_reg
                  and i.iter_out * i.iter_in * (i.uop_end - i.uop_bgn) == 196]
    assert len(bias_gemms) == 4
    came = compute(bias_gemms)

    def uop_loads(program):
        return compute(i for i in program.insns
                       if isinstance(i, MemInsn) and i.memory_type == MemType.UOP and i.y_size)
    busy = {name: CycleModel(cfg).run_program(r.program).modules["compute"].busy
            for name, r in (("alu", alu), ("gemm", gem))}
    # (the micro-op kernels are loaded on the compute module too: the bias GEMM's is new)
    assert busy["alu"] - busy["gemm"] == (gone + uop_loads(alu.program)) - (
        came + uop_loads(gem.program))
    # the micro-op part by hand: 784 entries, an ADD of ALU_CYCLES_PER_UOP_VEC each against a
    # GEMM micro-op of GEMM_CYCLES_PER_UOP
    vec_adds = [i for i in alu.program.insns if isinstance(i, AluInsn) and not i.use_imm]
    fixed = compute(vec_adds) - 784 * 6 - (came - 784 * 4)
    assert (cfg.ALU_CYCLES_PER_UOP_VEC, cfg.GEMM_CYCLES_PER_UOP) == (6, 4)
    assert compute(vec_adds) - came == 784 * 2 + fixed
    # the knob-free compute work of the choice's bound: the bias GEMM's micro-ops, as counted
    assert compute_work(cfg, pg, gemm_bias_epilogue(EPILOGUE))["bias"] == 784 * 4 == \
        sum(i.iter_out * i.iter_in * (i.uop_end - i.uop_bgn) for i in bias_gemms) * 4
    # the knob model's DRAM bytes are the simulator's
    point = evaluate(cfg, pg, gemm_bias_epilogue(EPILOGUE), knobs)
    for counter in ("inp_load_nbytes", "wgt_load_nbytes", "acc_load_nbytes", "out_store_nbytes"):
        assert point.bytes[counter] == getattr(stats, counter), counter
    # constant row: 4 x 16 bytes; digit tiles: 4 x 2 x 256 bytes, over the ALU program's loads
    assert point.bytes["wgt_load_nbytes"] - evaluate(cfg, pg, EPILOGUE, knobs).bytes[
        "wgt_load_nbytes"] == 4 * 2 * 256


# ------------------------------------------------------------------------------ range
def test_range_limits_and_one_outside():
    cfg = load_config("default")
    pg, arrays, bias, ref = _dense_case(cfg, _biases(64, 14))
    ok, note = gemm_bias_decision(pg, "dense", EPILOGUE, bias)
    assert ok and f"holds {LO:,}..{HI:,}" in note
    for bad in (LO - 1, HI + 1):
        out = bias.copy()
        out[5] = bad
        ok, note = gemm_bias_decision(pg, "dense", EPILOGUE, out)
        assert not ok and "outside" in note, note
        with pytest.raises(ValueError, match="outside"):
            gemm_bias_operands(pg.bias_layout(out.shape).pack_numpy(out.astype(np.int32)), 16)
    assert gemm_bias_decision(pg, "dense", EPILOGUE, None) == (
        False, "not by a GEMM: bias is runtime data")
    assert not gemm_bias_decision(pg, "dense", (("shr", 2), ("bias",)), bias)[0]


def test_operands_by_hand():
    """The constant row is (1, -128 x 15); a bias of 1000 is 104 + (-128) x (-7)."""
    bias = np.zeros((1, 1, 1, 1, 1, 16), np.int32)
    bias[..., 3] = 1000
    row, digits = gemm_bias_operands(bias, 16)
    assert row.tolist() == [[1] + [-128] * 15]
    assert digits.shape == (1, 1, 1, 1, 16, 16)
    assert digits[0, 0, 0, 0, 3].tolist() == [104, -7] + [0] * 14
    assert not digits[0, 0, 0, 0, :3].any()


# ------------------------------------------------------------------------------ Relax
def _module(bias, seed=5, c=64, o=64, hw=14):
    rng = np.random.default_rng(seed)
    mod = conv_module(1, c, o, hw, 3, padding=1, shift=9, clip=(-128, 127))
    w = rng.integers(-128, 128, (o, c, 3, 3)).astype(np.int8)
    x = rng.integers(-128, 128, (1, c, hw, hw)).astype(np.int8)
    if bias is None:
        return bind_constants(mod, w=w), [x, rng.integers(-5000, 5000, (1, o, 1, 1)).astype(np.int32)]
    return bind_constants(mod, w=w, b=np.asarray(bias, np.int32).reshape(1, o, 1, 1)), [x]


@pytest.mark.usefixtures("fresh_embedding_cache")
def test_relax_build_chooses_the_gemm_bias_and_says_why_not_otherwise():
    mod, arrays = _module(_biases(64, 15))
    with vta_ext.build_options(strategy="csp-relaxed"):
        got = run_module(mod, "ext_vta", arrays)
    (p,) = [p for p in vta_ext.last_build_report().on_vta if p.call is not None]
    np.testing.assert_array_equal(got, run_module(mod, "llvm", arrays))
    assert "bias added by one GEMM per output tile" in p.detail, p.detail
    assert "bias by GEMM" in p.plan
    # 64 -> 64 channels, 3x3, 14x14: nothing padded, so no extra MACs in the padding figure;
    # the bias GEMM's micro-ops (one a packed output row: 12,544 x 16 MACs here) are the epilogue's
    report = vta_ext.last_build_report()
    assert p.padding == "" and report.padding_overhead(p) == (0.0, "MACs")
    from vta_ext.report import executed_macs
    assert executed_macs(report.key_of(p)) == 64 * 64 * 9 * 14 * 14 + 64 * 14 * 14 * 16
    # the tuner's numpy reference (csp_reference) of that workload: the bias drawn in range
    from tvm_csp_embed.reference import reference_for
    from vta_ext.executor import compiled_op

    report = vta_ext.last_build_report()
    spec = json.loads(report.key_of(p))
    cw = vta_ext.strategy.get_template("conv2d", "csp-relaxed").workload_from_dict(spec["workload"])
    assert cw.bias_gemm
    compiled = compiled_op(report.key_of(p))
    inputs, expected, unpack = reference_for("conv2d", "csp-relaxed")(
        compiled.program.config, cw, [tuple(s) for s in spec["epilogue"]], np.random.default_rng(6))
    out, _ = compiled.run(*inputs)
    np.testing.assert_array_equal(unpack(out), expected)
    mod, arrays = _module(None)
    with vta_ext.build_options(strategy="csp-relaxed"):
        got = run_module(mod, "ext_vta", arrays)
    (p,) = [p for p in vta_ext.last_build_report().on_vta if p.call is not None]
    np.testing.assert_array_equal(got, run_module(mod, "llvm", arrays))
    assert "not by a GEMM: bias is runtime data" in p.detail, p.detail
