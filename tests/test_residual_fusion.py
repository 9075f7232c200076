"""A residual add fused into the conv that produces one of its operands (the ``("residual",)``
epilogue stage, :mod:`tvm_csp_embed.codegen.residual`).

* the fused program equals numpy's ``int8(add_epilogue(int8(conv_epilogue(conv)) + r))`` bit for
  bit (``pipelined``, ``default``, ``pynq``: no ACC_8BIT LOAD needed; 16 and 40 channels, the
  latter padded to the block);
* it differs from the conv alone by the hand-counted residual work: one GEMM micro-op per
  accumulator row more, and the residual's int8 bytes more read into the input buffer;
* the fusion is refused, with a reason, where the conv's value in the accumulator is not the
  int8 it stores (its epilogue does not end in a clip inside int8);
* the stock templates and the TE stages take no residual stage (a refusal, not a wrong result).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import conv2d_nchw, conv_bb, requantize

from tvm_csp_embed import conv2d, embed_all, gemm
from tvm_csp_embed.codegen import build_gemm, packed_gemm
from tvm_csp_embed.codegen.residual import fused_epilogue, knob_view, residual_refusal
from vta_ext.config import load_config
from vta_ext.isa import GemmInsn, Opcode
from vta_ext.templates.epilogue import RESIDUAL_STAGE, emit_epilogue, split_residual
from vta_ext.templates.errors import EpilogueRefusal

PERMS = {"data": (0, 1, 2, 3), "weight": (0, 1, 2, 3), "out": (0, 1, 2, 3)}
CONV_EP = (("bias",), ("shr", 5), ("clip", -128, 127))
#: the add's requantisation: a rounding shift and a ReLU clip
ADD_EP = (("add", 1), ("shr", 1), ("clip", 0, 127))


def _plan(cfg, c, hw, k):
    wl = conv2d(1, c, hw, hw, k, 1, 1)
    shapes = {"data": (1, c, hw, hw), "weight": (k, c, 1, 1), "out": (1, k, hw, hw)}
    emb = embed_all(wl, gemm(cfg), "relaxed")[0][0]
    return packed_gemm(emb, shapes, PERMS, {"data": ((0, 0),) * 4}), shapes


def _gemm_uops(program) -> int:
    return sum(i.iter_out * i.iter_in * (i.uop_end - i.uop_bgn) for i in program.insns
               if isinstance(i, GemmInsn) and not i.reset_reg)


@pytest.mark.parametrize("preset,c,hw,k", [("pipelined", 16, 6, 16), ("default", 24, 5, 40),
                                          ("pynq", 16, 6, 16)])
def test_fused_conv_add_is_bit_exact_against_numpy(preset, c, hw, k):
    cfg = load_config(preset)
    pg, shapes = _plan(cfg, c, hw, k)
    rng = np.random.default_rng(32)
    x = rng.integers(-128, 128, shapes["data"]).astype(np.int8)
    w = rng.integers(-128, 128, shapes["weight"]).astype(np.int8)
    b = rng.integers(-(1 << 14), 1 << 14, (1, k, 1, 1)).astype(np.int32)
    r = rng.integers(-128, 128, shapes["out"]).astype(np.int8)
    conv = requantize(conv2d_nchw(x, w, 1, 0), b, 5, (-128, 127)).astype(np.int32)
    ref = requantize(conv + r.astype(np.int32) + 1, None, 1, (0, 127))
    compiled = build_gemm(cfg, pg, fused_epilogue(CONV_EP, ADD_EP), "cycles")
    A, B, C = (pg.operands[t] for t in "ABC")
    out, _ = compiled.run(A.host.pack_numpy(x), B.host.pack_numpy(w),
                          pg.bias_layout(b.shape).pack_numpy(b),
                          residual_packed=C.host.pack_numpy(r))
    np.testing.assert_array_equal(C.host.unpack_numpy(out), ref)


def test_residual_work_counted_by_hand():
    """1x16x6x6 * 16x16, one output block: 36 accumulator rows of 16 lanes. With the same knobs
    the fused program runs 36 GEMM micro-ops more (the identity GEMM, one a row) and reads the
    residual's 36 x 16 bytes more into the input buffer (and the 16 x 16 identity tile, once per
    output tile, into the weight buffer)."""
    cfg = load_config("pipelined")
    pg, _ = _plan(cfg, 16, 6, 16)
    plain = build_gemm(cfg, pg, CONV_EP, "cycles")
    fused = build_gemm(cfg, pg, fused_epilogue(CONV_EP, ADD_EP), "cycles")
    knobs = {f: getattr(fused.knobs, f) for f in fused.knobs.__dataclass_fields__}
    plain = build_gemm(cfg, pg, CONV_EP, knobs)
    assert _gemm_uops(fused.program) - _gemm_uops(plain.program) == 36
    from vta_ext.sim.cycles import CycleModel
    model = CycleModel(cfg)
    p, f = (model.run_program(c.program).dram_bytes for c in (plain, fused))
    assert f["inp"] - p["inp"] == 36 * 16
    tiles = sum(1 for i in fused.program.insns if getattr(i, "opcode", None) == Opcode.STORE)
    assert f["wgt"] - p["wgt"] in [16 * 16 * n for n in range(1, tiles + 1)]
    assert f["out"] == p["out"] == 36 * 16


def test_refusal_when_the_conv_value_is_not_its_int8():
    assert residual_refusal(CONV_EP) is None
    assert residual_refusal((("shr", 5), ("max", -128), ("min", 127))) is None
    for ep in ((("bias",), ("shr", 5)), (("shr", 5), ("clip", -128, 300)),
               (("clip", 0, 127), ("shr", 1))):
        reason = residual_refusal(ep)
        assert reason is not None and "int8" in reason and "\n" not in reason


def test_knob_view_keeps_the_residual_tile_room():
    cfg = load_config("pipelined")
    view, ep = knob_view(cfg, fused_epilogue(CONV_EP, ADD_EP))
    assert RESIDUAL_STAGE not in ep and ep == CONV_EP + ADD_EP
    assert view.inp_depth * 2 == cfg.inp_depth and view.acc_depth <= view.inp_depth
    assert knob_view(cfg, CONV_EP) == (cfg, CONV_EP)
    assert split_residual(fused_epilogue(CONV_EP, ADD_EP)) == (CONV_EP, ADD_EP)


@pytest.mark.parametrize("point,fits", [
    (dict(tile_k=4, tile_oh=2, tile_ow=56, tile_c=4, vt_k=1, vt_oh=2), True),
    (dict(tile_k=1, tile_oh=7, tile_ow=56, tile_c=1, vt_k=2, vt_oh=2), False),
    (dict(tile_k=2, tile_oh=7, tile_ow=28, tile_c=2, vt_k=2, vt_oh=2), False)])
def test_residual_overflow_agrees_with_the_lowering(point, fits):
    """The static check the fusion runs before lowering a point says what the lowering's
    allocation of the input buffer says (it refuses an overflow with a KnobError)."""
    from tvm_csp_embed.codegen.residual import residual_overflow
    from vta_ext.templates.errors import KnobError

    cfg = load_config("default")
    pg, _ = _plan(cfg, 64, 56, 64)
    ep, point = fused_epilogue(CONV_EP, ADD_EP), dict(point, tile_n=1, order=0)
    why = residual_overflow(cfg, pg, ep, point)
    if fits:
        assert why is None
        build_gemm(cfg, pg, ep, point)
    else:
        assert "does not fit" in why
        with pytest.raises(KnobError, match="inp_buffer needs"):
            build_gemm(cfg, pg, ep, point)


def test_hand_written_templates_refuse_the_residual_stage():
    with pytest.raises(EpilogueRefusal, match="second tensor"):
        emit_epilogue(None, load_config("pipelined"), (RESIDUAL_STAGE,), 0, 1)


# ---------------------------------------------------------------- in the offload pass

def _residual_module(c: int = 32, hw: int = 14, also_return_conv: bool = False):
    """conv 3x3 16->c (y), conv 1x1 c->c (z), ``int8(clip((z + y + 1) >> 1, 0, 127))``; with
    ``also_return_conv`` z is returned too (a second user: no fusion)."""
    from tvm import relax

    x = relax.Var("x", relax.TensorType((1, 16, hw, hw), "int8"))
    bb = relax.BlockBuilder()
    rng = np.random.default_rng(3)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = conv_bb(bb, x, rng, 16, c, 3, 6)
            z = conv_bb(bb, y, rng, c, c, 1, 5)
            s = bb.emit(relax.op.add(relax.op.astype(z, "int32"), relax.op.astype(y, "int32")))
            s = bb.emit(relax.op.add(s, relax.const(1, "int32")))
            s = bb.emit(relax.op.right_shift(s, relax.const(1, "int32")))
            s = bb.emit(relax.op.clip(s, 0, 127))
            s = bb.emit(relax.op.astype(s, "int8"))
            out = bb.emit_output(relax.Tuple([s, z]) if also_return_conv else s)
        bb.emit_func_output(out)
    return bb.get()


def _build_and_run(mod, preset, fuse_residual: bool = True, hw: int = 14,
                   strategy: str = "csp-relaxed"):
    import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
    import vta_ext
    from conftest import run_module
    from vta_ext.executor import clear_run_log, run_log
    from vta_ext.target import vta_target

    x = np.random.default_rng(1).integers(-128, 128, (1, 16, hw, hw)).astype(np.int8)
    clear_run_log()
    with vta_ext.build_options(strategy=strategy, fuse_residual=fuse_residual):
        got = run_module(mod, vta_target(preset), [x])
    return got, run_module(mod, "llvm", [x]), vta_ext.last_build_report(), \
        [r.op for r in run_log()]


@pytest.mark.parametrize("preset", ["pipelined", "default"])
def test_offload_fuses_the_add_bit_exact_against_llvm(preset):
    got, ref, report, runs = _build_and_run(_residual_module(), preset)
    np.testing.assert_array_equal(got, ref)
    assert [p.op for p in report.on_vta] == ["relax.nn.conv2d"] * 2
    assert runs == ["conv2d", "conv2d"]         # no add program, the unfused conv not run
    fused = report.on_vta[1]
    assert "residual add" in fused.detail and "fused" in fused.detail
    assert "+residual+" in fused.detail
    # the floor of the fused operator stays below its modelled cycles
    assert report.floor(fused).total <= report.cycles(fused)


def test_offload_says_why_an_add_is_not_fused():
    got, ref, report, runs = _build_and_run(_residual_module(also_return_conv=True), "pipelined")
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)
    adds = [p for p in report.on_vta if p.op == "relax.add"]
    assert len(adds) == 1 and runs.count("add") == 1
    line = adds[0].detail.split("; not fused into its conv: ")[1].split(";")[0]
    assert "other users than the add" in line


def test_fusion_off_by_the_build_option_says_so():
    got, ref, report, runs = _build_and_run(_residual_module(), "pipelined", fuse_residual=False)
    np.testing.assert_array_equal(got, ref)
    assert runs == ["conv2d", "conv2d", "add"]
    (add,) = [p for p in report.on_vta if p.op == "relax.add"]
    assert "not fused into its conv: off (build_options(fuse_residual=True) turns it on)" in add.detail


def test_a_fused_point_without_room_for_the_residual_tile_is_not_a_failed_build(monkeypatch,
                                                                              fresh_cache):
    """The first knob choice of the fusion is a point where the conv fits but not the residual
    tile beside it (the resnext50_32x4d 224 ``default`` crash): the build goes on with the next
    choice, the fused program bit-exact against llvm (on an empty cache: no kept decision)."""
    from tvm_csp_embed.codegen import build_gemm
    from vta_ext.executor import compiled_op
    from vta_ext.offload.fusion import ResidualFusion
    from vta_ext.templates.errors import KnobError

    own_choices, tried = ResidualFusion.knob_choices, []

    def choices(conv, epilogue, config):
        rest = list(own_choices(conv, epilogue, config))
        # 14x56 pixels x 1 input block (784 rows) + the 14x56 x 2 blocks residual tile (1568)
        # overflow default's 2048-row input buffer; the conv alone fits
        big = dict(rest[0], tile_oh=14, tile_ow=56, tile_c=1, tile_k=2, vt_k=1, vt_oh=1)
        tried.append((conv, epilogue, config, big))
        return iter([big] + rest)

    monkeypatch.setattr(ResidualFusion, "knob_choices", staticmethod(choices))
    got, ref, report, runs = _build_and_run(_residual_module(hw=56), "default", hw=56)
    np.testing.assert_array_equal(got, ref)
    assert runs == ["conv2d", "conv2d"]
    assert "residual add" in report.on_vta[1].detail
    (conv, epilogue, cfg, big), = tried
    plan = compiled_op(conv.key).plan
    build_gemm(cfg, plan, compiled_op(conv.key).epilogue, big)     # the conv alone fits
    with pytest.raises(KnobError, match="do not fit"):
        build_gemm(cfg, plan, epilogue, big)


def test_fused_program_bit_exact_on_the_pynq_rtl():
    """The fused conv + add needs no LOAD ACC_8BIT: on the RTL of the pynq design (when its
    library is there) the offloaded module equals the llvm build to the bit, every VTA call run
    and counted by the RTL."""
    import tvm
    import tvm_csp_embed  # noqa: F401
    import vta_ext
    from conftest import rtl_device, run_module
    from tvm import relax
    from vta_ext.target import vta_target

    device = rtl_device()
    mod = _residual_module()
    x = np.random.default_rng(1).integers(-128, 128, (1, 16, 14, 14)).astype(np.int8)
    with vta_ext.build_options(strategy="csp-relaxed", fuse_residual=True):
        vm = relax.VirtualMachine(relax.build(mod, target=vta_target("pynq")), tvm.cpu())
    assert any("residual add" in p.detail for p in vta_ext.last_build_report().on_vta)
    vta_ext.clear_run_log()
    with vta_ext.run_on(device):
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    runs = vta_ext.run_log()
    assert len(runs) == 2 and all(r.device and r.device_cycles for r in runs)
    np.testing.assert_array_equal(got, run_module(mod, "llvm", [x]))


# ---------------------------------------------------------------- the kept decisions

def _counted_build(monkeypatch, preset="pipelined"):
    """A build and run of :func:`_residual_module` as a new process on the same cache would do
    it (nothing compiled in memory): the output, llvm's, the report, the programs compiled
    (``conv2d``, ``conv2d+residual``, ``add``) and the cycle-model runs during the build."""
    from vta_ext import executor

    executor._COMPILED.clear()
    executor._CYCLES.clear()
    built, timed = [], []
    build_spec, cycle_report = executor.build_spec, executor.cycle_report

    def counting_build(spec, config):
        residual = any(stage[0] == "residual" for stage in spec["epilogue"])
        built.append(spec["op"] + ("+residual" if residual else ""))
        return build_spec(spec, config)

    def counting_cycles(key):
        timed.append(json.loads(key)["op"])
        return cycle_report(key)

    monkeypatch.setattr(executor, "build_spec", counting_build)
    monkeypatch.setattr(executor, "cycle_report", counting_cycles)
    try:
        got, ref, report, runs = _build_and_run(_residual_module(), preset)
    finally:
        monkeypatch.setattr(executor, "cycle_report", cycle_report)
    return got, ref, report, sorted(built), timed


def _decision_files(cache):
    return sorted((cache / "fusions").glob("*.json"))


def test_warm_build_compiles_the_fused_program_alone(fresh_cache, monkeypatch):
    """Cold: the add's own program is compiled and timed against the fused one; the decision is
    kept. Warm (a new process on the same cache): the fused program is
    compiled at the kept knobs, neither the fused conv's own program nor the add's, and the
    cycle model does not run; the output is llvm's to the bit and the report the same."""
    got, ref, cold, built, timed = _counted_build(monkeypatch)
    np.testing.assert_array_equal(got, ref)
    # (the cold build also compiles and times the candidates its choice compares)
    assert "add" in built and built.count("conv2d+residual") == 1 and "add" in timed
    (record,) = _decision_files(fresh_cache)
    (decision,) = json.loads(record.read_text())["adds"].values()
    assert decision["fused"] and decision["by"] == "cycle model" and decision["chosen"]
    fused, conv, add = decision["cycles"]
    assert fused < conv + add and f"{fused:,} cycles against conv {conv:,}" in decision["words"]

    got, ref, warm, built, timed = _counted_build(monkeypatch)
    np.testing.assert_array_equal(got, ref)
    assert built == ["conv2d", "conv2d+residual"]   # the first conv (two users), the fused one
    assert timed == []
    assert [p.detail for p in warm.on_vta] == [p.detail for p in cold.on_vta]
    assert "decided by the cycle model" in warm.on_vta[1].detail


@pytest.mark.parametrize("damage", ["not json", "foreign", "malformed decision", "stale knobs"])
def test_a_damaged_decision_is_ignored_and_decided_again(fresh_cache, monkeypatch, caplog,
                                                         damage):
    """A record that is not JSON, holds another key, a decision without its fields, or knobs
    that no longer build: the pair is decided again (the own programs compiled and timed), the
    output stays llvm's to the bit, a warning names it, and the record is rewritten whole."""
    import logging

    _counted_build(monkeypatch)
    (record,) = _decision_files(fresh_cache)
    data = json.loads(record.read_text())
    (name,) = data["adds"]
    if damage == "not json":
        record.write_text(record.read_text()[:25])
    elif damage == "foreign":
        record.write_text(json.dumps(dict(data, key="0" * 32)))
    elif damage == "malformed decision":
        record.write_text(json.dumps(dict(data, adds={name: {"fused": True, "words": "x"}})))
    else:
        decision = dict(data["adds"][name], knobs=dict(data["adds"][name]["knobs"], tile_k=4096))
        record.write_text(json.dumps(dict(data, adds={name: decision})))
    with caplog.at_level(logging.WARNING):
        got, ref, report, built, timed = _counted_build(monkeypatch)
    np.testing.assert_array_equal(got, ref)
    assert "fusion decisions" in caplog.text
    assert "add" in built and built.count("conv2d") == 2 and "conv2d+residual" in built
    assert "residual add" in report.on_vta[1].detail
    assert json.loads(record.read_text()) == data       # decided again the same way


def test_csp_strict_fuses_bit_exact_against_llvm():
    """``csp-strict``'s conv template offers the residual stage too (which strategies fuse is
    the template's ``residual`` attribute alone): its fused build equals llvm to the bit."""
    got, ref, report, runs = _build_and_run(_residual_module(), "pipelined",
                                            strategy="csp-strict")
    np.testing.assert_array_equal(got, ref)
    assert runs == ["conv2d", "conv2d"]
    assert "residual add" in report.on_vta[1].detail


def test_stock_builds_say_nothing_of_fusion():
    """The stock conv template takes no residual stage: fusion on, the add is its own program
    and its report line says nothing of fusion."""
    got, ref, report, runs = _build_and_run(_residual_module(), "pipelined", strategy="stock")
    np.testing.assert_array_equal(got, ref)
    assert runs.count("add") == 1
    assert not any("fused" in p.detail for p in report.on_vta)
