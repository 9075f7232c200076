"""Depthwise convs under csp-relaxed (tvm_csp_embed.depthwise): the ALU template or the GEMM
block-diagonal program per layer, bit-exact against an independent numpy depthwise convolution
and the llvm build, on default, pipelined and pynq (and the RTL for pynq)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_csp_embed  # noqa: F401 -- registers the CSP strategies
import vta_ext
from conftest import conv_layer_shapes, conv_module, requantize, run_one_call_on
from tvm_csp_embed.depthwise import diagonal_weight
from vta_ext.strategy import get_template

PRESETS = ("default", "pipelined", "pynq")


# ------------------------------------------------------------------------------ references
def numpy_depthwise(x, w, stride, pad):
    """Direct int64 depthwise convolution: x (N, C, H, W), w (C, 1, KH, KW)."""
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    acc = np.zeros((n, c, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            acc += win * w[None, :, 0, i, j, None, None].astype(np.int64)
    return acc


def module(c, hw, k, stride, pad, weight=None, bias=None, shift=8, clip=(-128, 127)):
    """``main(x[, w, b])``: depthwise conv2d + bias, >> shift, clip, int8. Constant weight and
    bias when given (a quantised model's), else parameters."""
    return conv_module(1, c, c, hw, k, stride=stride, padding=pad, shift=shift, clip=clip,
                       groups=c, constants=None if weight is None else (weight, bias))


def run(mod, target, arrays):
    vm = relax.VirtualMachine(relax.build(mod, target=target), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def case(c, hw, k, stride, pad, seed=0, constant=True):
    """(module, arrays, numpy reference) of one depthwise layer with random int8 data."""
    rng = np.random.default_rng(seed + c + hw + k)
    x = rng.integers(-128, 128, (1, c, hw, hw)).astype(np.int8)
    w = rng.integers(-128, 128, (c, 1, k, k)).astype(np.int8)
    b = rng.integers(-5000, 5000, (1, c, 1, 1)).astype(np.int32)
    ref = requantize(numpy_depthwise(x, w, stride, pad), b, 8, (-128, 127))
    if constant:
        return module(c, hw, k, stride, pad, w, b), [x], ref
    return module(c, hw, k, stride, pad), [x, w, b], ref


def vta_build(mod, arrays, config, **options):
    """Output and build report of ``mod`` under csp-relaxed on ``config``."""
    with vta_ext.build_options(strategy="csp-relaxed", **options):
        out = run(mod, vta_ext.vta_target(config), arrays)
    return out, vta_ext.last_build_report()


def depthwise_placement(report):
    (p,) = [p for p in report.placements if p.op == "relax.nn.conv2d"]
    return p


# ------------------------------------------------------------------------------ tests
def test_diagonal_weight_computes_the_depthwise_conv():
    """The block-diagonal grouped conv (numpy, per group) equals the depthwise conv; the padded
    channels' weights are zero."""
    rng = np.random.default_rng(1)
    c, block = 20, 16
    x = rng.integers(-128, 128, (1, 32, 6, 6)).astype(np.int8)
    x[:, c:] = 0
    w = rng.integers(-128, 128, (c, 1, 3, 3)).astype(np.int8)
    oihw = diagonal_weight(w, 32, block)
    assert not oihw[c:].any()
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    grouped = np.zeros((1, 32, 6, 6), np.int64)
    for g in range(2):
        for i in range(3):
            for j in range(3):
                grouped[:, g * block:(g + 1) * block] += np.einsum(
                    "nchw,oc->nohw", xp[:, g * block:(g + 1) * block, i:i + 6, j:j + 6],
                    oihw[g * block:(g + 1) * block, :, i, j].astype(np.int64))
    np.testing.assert_array_equal(grouped[:, :c], numpy_depthwise(x[:, :c], w, 1, 1))


#: small layers: the depthwise cases of tests/test_template_depthwise.py (strides, 5x5, all-padding
#: windows) and channels that are not whole blocks (one group: the plain conv2d program)
SMALL = [(32, 8, 3, 1, 1), (32, 9, 3, 2, 1), (48, 6, 5, 1, 2), (16, 5, 3, 1, 3), (24, 7, 3, 2, 1)]


@pytest.mark.parametrize("config", [  # pynq (no ALU MUL: the GEMM unit) stays in the default run
    pytest.param(c, marks=pytest.mark.slow) if c == "pipelined" else c for c in PRESETS])
@pytest.mark.parametrize("shape", SMALL, ids=lambda s: "c{}_hw{}_k{}_s{}_p{}".format(*s))
def test_bit_exact_small(config, shape):
    mod, arrays, ref = case(*shape)
    out, report = vta_build(mod, arrays, config, objective="cycles")
    np.testing.assert_array_equal(out, ref)
    p = depthwise_placement(report)
    assert p.device == "vta", str(report)
    if config == "default":
        np.testing.assert_array_equal(run(mod, "llvm", arrays), ref)


def test_weights_given_at_run_time():
    """A non-constant weight is expanded to the diagonal tiles by Relax code on the host."""
    mod, arrays, ref = case(40, 10, 3, 1, 1, constant=False)
    for config in ("default", "pynq"):
        out, report = vta_build(mod, arrays, config)
        np.testing.assert_array_equal(out, ref)
        assert depthwise_placement(report).plan == "csp-relaxed GEMM block-diagonal"


def _timed(report, p):
    """Both units' modelled cycles of placement ``p`` (None: refused) and the unit it runs."""
    key = report.key_of(p)
    cycles = get_template("depthwise_conv2d", "csp-relaxed").unit_cycles(key)
    return cycles, json.loads(key)["workload"]["unit"]


@pytest.mark.parametrize("gemm_cycles", [4, 64])
def test_choice_is_the_fewer_modelled_cycles(gemm_cycles):
    """The unit chosen is the one whose built program the cycle model times faster: the GEMM
    core on ``default``; the ALU template when the GEMM is made 16x slower."""
    config = dataclasses.replace(vta_ext.load_config("default"), GEMM_CYCLES_PER_UOP=gemm_cycles)
    mod, arrays, ref = case(32, 8, 3, 1, 1)
    out, report = vta_build(mod, arrays, config)
    np.testing.assert_array_equal(out, ref)
    p = depthwise_placement(report)
    cycles, unit = _timed(report, p)
    assert unit == min(cycles, key=cycles.get)
    assert unit == ("gemm" if gemm_cycles == 4 else "alu")
    assert report.cycles(p) == cycles[unit]
    assert "fewest cycles on the cycle model" in p.detail
    assert p.plan == ("csp-relaxed GEMM block-diagonal" if unit == "gemm"
                      else "stock ALU (csp-relaxed chose it)")
    assert report.floor(p).total <= report.cycles(p)


@pytest.mark.parametrize("preset", ["default", "pipelined"])
@pytest.mark.parametrize("c, hw, k, stride, pad", [
    (32, 16, 3, 1, 1), (20, 9, 3, 2, 1), (48, 7, 5, 1, 2), (16, 8, 3, 2, 1), (96, 14, 3, 2, 1),
    (144, 12, 3, 1, 1), (40, 10, 1, 1, 0)])
def test_alu_floor_never_exceeds_the_alu_program(preset, c, hw, k, stride, pad):
    """The bound that spares the ALU unit's build (:func:`~tvm_csp_embed.depthwise.alu_floor`) is
    at most the cycle model's count of the ALU program it stands for (channels padded to whole
    blocks), so a unit it prunes could not have won (the GEMM unit's cycles are below it)."""
    from types import SimpleNamespace

    from tvm_csp_embed.depthwise import alu_floor
    from vta_ext.sim.cycles import CycleModel
    from vta_ext.templates.depthwise import DepthwiseConv2dWorkload, build_depthwise_conv2d

    config = vta_ext.load_config(preset)
    epilogue = (("bias",), ("shr", 8), ("clip", -128, 127))
    padded = -(-c // config.BLOCK_OUT) * config.BLOCK_OUT
    wl = DepthwiseConv2dWorkload(batch=config.BATCH, channels=padded, height=hw, width=hw,
                                 kernel_h=k, kernel_w=k, pad_h=pad, pad_w=pad, stride_h=stride,
                                 stride_w=stride)
    op = SimpleNamespace(operands=[SimpleNamespace(ty=SimpleNamespace(shape=(1, c, hw, hw)))],
                         epilogue=epilogue)
    program = build_depthwise_conv2d(config, wl, epilogue).program
    assert 0 < alu_floor(config, op, wl) <= CycleModel(config).run_program(program).total_cycles


def test_alu_unit_pruned_by_its_floor_is_not_built(monkeypatch, tmp_path):
    """On ``default`` the GEMM unit times below the ALU unit's floor: the plan builds no ALU
    program, runs the unit that both units built and timed would choose (the GEMM, fewer cycles
    than the ALU program's count) and the report gives the floor it compared against."""
    from vta_ext.templates import depthwise as alu_template

    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))

    def forbidden(*args, **kwargs):
        raise AssertionError("the ALU unit's floor exceeds the GEMM unit's cycles: not built")
    build = alu_template.build_depthwise_conv2d
    monkeypatch.setattr(alu_template, "build_depthwise_conv2d", forbidden)
    mod, arrays, ref = case(32, 8, 3, 1, 1)
    out, report = vta_build(mod, arrays, "default")
    np.testing.assert_array_equal(out, ref)
    p = depthwise_placement(report)
    assert "its floor, so not built" in p.detail
    monkeypatch.setattr(alu_template, "build_depthwise_conv2d", build)
    cycles, unit = _timed(report, p)      # both units built and timed now
    assert unit == "gemm" and cycles["gemm"] < cycles["alu"]
    assert report.cycles(p) == cycles["gemm"]


def test_pynq_runs_depthwise_on_the_gemm_core_only():
    """pynq has neither ALU MUL nor ACC_8BIT loads: the ALU template refuses, the report says so
    and the GEMM program runs; stock keeps the operator on the CPU."""
    mod, arrays, ref = case(32, 8, 3, 1, 1)
    out, report = vta_build(mod, arrays, "pynq")
    np.testing.assert_array_equal(out, ref)
    p = depthwise_placement(report)
    assert p.device == "vta" and p.plan == "csp-relaxed GEMM block-diagonal"
    assert "the only unit that runs it" in p.detail
    assert "ALU MUL (opcode 4)" in p.detail and "ISA_ALU_MUL, ISA_ACC_8BIT_LOAD false" in p.detail
    cycles, _ = _timed(report, p)
    assert cycles["alu"] is None and cycles["gemm"] == report.cycles(p)
    with vta_ext.build_options(strategy="stock"):
        relax.build(mod, target=vta_ext.vta_target("pynq"))
    assert depthwise_placement(vta_ext.last_build_report()).device == "cpu"


def _on_rtl(rtl, shape):
    mod, arrays, ref = case(*shape)
    with vta_ext.build_options(strategy="csp-relaxed"):
        vm = relax.VirtualMachine(relax.build(mod, target=vta_ext.vta_target("pynq")), tvm.cpu())
    assert depthwise_placement(vta_ext.last_build_report()).device == "vta"
    np.testing.assert_array_equal(run_one_call_on(rtl, vm, arrays), ref)


@pytest.mark.parametrize("shape", [(32, 9, 3, 2, 1), (24, 6, 5, 1, 2)],
                         ids=lambda s: "c{}_hw{}_k{}_s{}_p{}".format(*s))
def test_pynq_rtl_bit_exact(rtl, shape):
    _on_rtl(rtl, shape)


# ------------------------------------------------------------------------------ networks (slow)
NETWORKS = ("mobilenet_v2", "mnasnet0_5", "efficientnet_b0", "shufflenet_v2_x0_5")


def network_depthwise_shapes(size=224):
    """The distinct depthwise conv2d layers ``(C, H, K, stride, pad)`` of :data:`NETWORKS` at
    ``size``, read from the torch modules with forward hooks (square inputs and kernels)."""
    return conv_layer_shapes(
        NETWORKS, size, lambda m: m.groups == m.in_channels == m.out_channels > 1,
        lambda m, x: (m.in_channels, int(x.shape[-1]), m.kernel_size[0], m.stride[0],
                      m.padding[0]))


@pytest.mark.slow
@pytest.mark.parametrize("config", PRESETS)
def test_network_depthwise_layers_bit_exact(config):
    """Every depthwise layer of MobileNetV2, MNASNet, EfficientNet-B0 and ShuffleNetV2 at 224,
    against numpy and llvm."""
    for shape in network_depthwise_shapes():
        mod, arrays, ref = case(*shape)
        out, report = vta_build(mod, arrays, config)
        assert depthwise_placement(report).device == "vta", (shape, str(report))
        np.testing.assert_array_equal(out, ref, err_msg=str(shape))
        np.testing.assert_array_equal(run(mod, "llvm", arrays), ref, err_msg=str(shape))


@pytest.mark.slow
def test_network_depthwise_layers_on_the_rtl(rtl):
    for shape in network_depthwise_shapes():
        _on_rtl(rtl, shape)


def test_the_gemm_unit_tunes_and_verifies(tmp_path):
    """The block-diagonal program is a tuning task under csp-relaxed (the conv2d knobs); its best
    point is verified against the grouped-conv numpy reference, and the tuned record is used by
    the next build."""
    from tvm_csp_embed import tune

    mod, arrays, ref = case(32, 8, 3, 1, 1)
    (task,) = tune.extract_tasks(mod, strategy="csp-relaxed")
    assert task.kind == "depthwise_conv2d" and len(task.knob_space) > 1
    path = tmp_path / "dw.json"
    best = tune.RandomTuner(task, seed=0).tune(
        4, tune.measure_option(runner=tune.LocalRunner(0)),
        callbacks=[tune.callback.log_to_file(path)])
    assert best.verified
    with vta_ext.build_options(strategy="csp-relaxed"), tune.apply_history_best(path):
        out = run(mod, vta_ext.vta_target("default"), arrays)
    np.testing.assert_array_equal(out, ref)
    p = depthwise_placement(vta_ext.last_build_report())
    assert p.plan == "csp-relaxed GEMM block-diagonal" and "tuned record from" in p.detail


def test_warm_build_loads_the_block_diagonal_program(tmp_path, monkeypatch):
    """The chosen block-diagonal program is kept on disk (``programs/``): a warm build in a new
    process state schedules, lowers and emits nothing, loads the same instructions and DRAM image
    the cold build made, times them alike and stays bit-exact against numpy."""
    from vta_ext import executor
    from vta_ext.templates import conv2d

    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    mod, arrays, ref = case(48, 9, 3, 1, 1)
    cold_out, cold = vta_build(mod, arrays, "default")
    p = depthwise_placement(cold)
    assert p.plan == "csp-relaxed GEMM block-diagonal"
    assert len(list((tmp_path / "programs").glob("*.npz"))) == 1
    built = executor.compiled_op(cold.key_of(p)).program
    cold_insns, cold_image = list(built.insns), built.dram.copy()
    executor._COMPILED.clear()
    executor._CYCLES.clear()

    def forbidden(*args, **kwargs):
        raise AssertionError("a warm build must load the block-diagonal program, not compile it")
    monkeypatch.setattr(conv2d, "compile_conv2d", forbidden)
    warm_out, warm = vta_build(mod, arrays, "default")
    np.testing.assert_array_equal(cold_out, ref)
    np.testing.assert_array_equal(warm_out, ref)
    loaded = executor.compiled_op(warm.key_of(depthwise_placement(warm))).program
    assert loaded.insns == cold_insns
    # the instructions and micro-ops as the cold build encoded them (data buffers: this run's)
    start = min(phys for phys, _ in loaded.segments) - loaded.dram_base
    np.testing.assert_array_equal(loaded.dram[start:], cold_image[start:])
    assert warm.cycles(depthwise_placement(warm)) == cold.cycles(p)


def test_unreadable_program_is_built_again(tmp_path, monkeypatch):
    """A program cache entry that does not load (here: truncated) is built again, bit-exact."""
    from vta_ext import executor

    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    mod, arrays, ref = case(48, 9, 3, 1, 1)
    vta_build(mod, arrays, "default")
    (entry,) = (tmp_path / "programs").glob("*.npz")
    entry.write_bytes(entry.read_bytes()[:100])
    executor._COMPILED.clear()
    executor._CYCLES.clear()
    out, report = vta_build(mod, arrays, "default")
    np.testing.assert_array_equal(out, ref)
    assert depthwise_placement(report).plan == "csp-relaxed GEMM block-diagonal"


def test_warm_build_times_no_unit(tmp_path, monkeypatch):
    """The chosen unit is kept on disk: a warm build (nothing in memory) builds and times
    neither unit again, places the same plan and stays bit-exact against numpy."""
    from tvm_csp_embed import depthwise
    from vta_ext import executor

    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    mod, arrays, ref = case(32, 9, 3, 2, 1)
    cold_out, cold = vta_build(mod, arrays, "pipelined")
    assert len(list((tmp_path / "units").glob("*.json"))) == 1
    executor._COMPILED.clear()
    executor._CYCLES.clear()

    def forbidden(*args, **kwargs):
        raise AssertionError("a warm build must not time the units again")
    monkeypatch.setattr(depthwise.DepthwiseTemplate, "_timed_unit", forbidden)
    warm_out, warm = vta_build(mod, arrays, "pipelined")
    np.testing.assert_array_equal(warm_out, ref)
    np.testing.assert_array_equal(cold_out, ref)
    assert depthwise_placement(warm) == depthwise_placement(cold)


def test_look_ahead_chooses_the_unit_while_a_build_waits(tmp_path, monkeypatch):
    """The idle work ``prefetch`` queues (:func:`tvm_csp_embed.cache.add_idle_work`) chooses the
    operator's unit before its plan: run at once here (as a thread waiting for a solve runs it),
    it builds and times the units, removes itself when nothing is left, and the plan then times
    no unit; the placement is the one of a build without look-ahead and bit-exact against
    numpy."""
    from tvm_csp_embed import cache, depthwise
    from vta_ext import executor

    mod, arrays, ref = case(32, 9, 3, 2, 1)
    prefetch = depthwise.DepthwiseTemplate.prefetch
    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path / "plain"))
    monkeypatch.setattr(depthwise.DepthwiseTemplate, "prefetch", lambda self, ops, config: None)
    plain_out, plain = vta_build(mod, arrays, "default")
    executor._COMPILED.clear()
    executor._CYCLES.clear()

    steps = []

    def prefetch_and_idle(self, ops, config):
        prefetch(self, ops, config)
        step = self._idle
        steps.extend([step(), step()])          # one operator: work, then nothing left
        assert step not in cache._IDLE
        monkeypatch.setattr(depthwise.DepthwiseTemplate, "_timed_unit", forbidden)

    def forbidden(*args, **kwargs):
        raise AssertionError("the look-ahead chose the unit: the plan must not time it again")
    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path / "ahead"))
    monkeypatch.setattr(depthwise.DepthwiseTemplate, "prefetch", prefetch_and_idle)
    out, report = vta_build(mod, arrays, "default")
    assert steps == [True, False]
    np.testing.assert_array_equal(plain_out, ref)
    np.testing.assert_array_equal(out, ref)
    assert depthwise_placement(report) == depthwise_placement(plain)
    assert report.cycles(depthwise_placement(report)) == plain.cycles(depthwise_placement(plain))


def test_a_refused_program_is_not_built_again(monkeypatch):
    """A block-diagonal program whose tiles overflow a buffer refuses with the lowering's words;
    asked again (another layer of the same shape and epilogue), it refuses with the same words
    and nothing is scheduled or lowered."""
    from tvm_csp_embed import depthwise
    from vta_ext.config import load_config
    from vta_ext.errors import TemplateRefusal
    from vta_ext.templates import conv2d

    cfg = load_config("default")
    # 16 x 64 x 64 pixels of one thread: 65,536 input elements, far over the input buffer
    wl = depthwise.DepthwiseUnitWorkload(batch=1, channels=32, height=64, width=64, kernel_h=3,
                                         kernel_w=3, pad_h=1, pad_w=1, stride_h=1, stride_w=1,
                                         unit="gemm", knobs=(("tile_h", 64), ("tile_w", 64)))
    epilogue = (("bias",), ("shr", 8), ("clip", -128, 127))
    builds = []
    compile_conv2d = conv2d.compile_conv2d
    monkeypatch.setattr(conv2d, "compile_conv2d",
                        lambda *a, **k: builds.append(1) or compile_conv2d(*a, **k))
    words = []
    for _ in range(2):
        with pytest.raises(TemplateRefusal) as err:
            depthwise.modelled_cycles("depthwise_conv2d", "csp-relaxed", cfg, wl, epilogue, "cycles")
        words.append(str(err.value))
    assert "local.inp_buffer" in words[0] and words[0] == words[1]
    assert builds == [1]


#: MobileNetV2's 1x384x14x14 block-diagonal bias GEMM twin at its searched point, and its layers'
#: shifts (the epilogues differ only in the immediate)
_TWIN_384 = dict(batch=1, channels=384, height=14, width=14, kernel_h=3, kernel_w=3, pad_h=1,
                 pad_w=1, stride_h=1, stride_w=1, unit="gemm", bias_gemm=True,
                 knobs=(("h_nthread", 1), ("oc_nthread", 2), ("reuse", False), ("tile_b", 1),
                        ("tile_ci", 1), ("tile_co", 4), ("tile_h", 14), ("tile_w", 14)))
_SHIFTS_384 = (5, 6, 7)


def _refusal(cfg, wl, epilogue) -> str:
    """The words a build of ``wl`` (from nothing: no refusal kept) refuses with ("" if it builds)."""
    from tvm_csp_embed import depthwise
    from vta_ext.errors import TemplateRefusal

    try:
        depthwise.modelled_cycles("depthwise_conv2d", "csp-relaxed", cfg, wl, epilogue, "cycles")
    except TemplateRefusal as err:
        return str(err)
    return ""


def test_refusal_memo_by_epilogue_shape_refuses_what_a_build_does(monkeypatch):
    """The refusal memo keys a block-diagonal program by its epilogue's shape: each of the three
    1x384 twins (shr 5, 6, 7), built from nothing, refuses with the same words (the input buffer
    overflow does not depend on the shift); with the memo, only the first is lowered and the
    other two refuse with the words their own build gives. An epilogue of another shape (a
    vector multiplier: one more buffer) is built, not refused from the memo."""
    from tvm_csp_embed import depthwise
    from vta_ext.config import load_config
    from vta_ext.templates import conv2d

    cfg = load_config("default")
    wl = depthwise.DepthwiseUnitWorkload(**_TWIN_384)
    epilogues = [(("bias",), ("shr", s), ("clip", 0, 96)) for s in _SHIFTS_384]
    built = []
    for ep in epilogues:     # each built from nothing: the reference words
        monkeypatch.setattr(depthwise, "_REFUSED", {})
        built.append(_refusal(cfg, wl, ep))
    assert built[0] and "buffer" in built[0] and len(set(built)) == 1, built

    monkeypatch.setattr(depthwise, "_REFUSED", {})
    lowered = []
    compile_conv2d = conv2d.compile_conv2d
    monkeypatch.setattr(conv2d, "compile_conv2d",
                        lambda *a, **k: lowered.append(a[2]) or compile_conv2d(*a, **k))
    assert [_refusal(cfg, wl, ep) for ep in epilogues] == built
    assert len(lowered) == 1
    # another shape: its own build (it refuses too here, but only after being lowered)
    _refusal(cfg, wl, (("bias",), ("mulv",), ("shr", 5), ("clip", 0, 96)))
    assert len(lowered) == 2


def test_refusal_key_keeps_immediates_outside_block_diagonal_programs():
    """Only the depthwise block-diagonal programs share a refusal across immediates: the ALU
    unit's key (its own template) still differs by the shift."""
    import dataclasses

    from tvm_csp_embed import depthwise
    from vta_ext.config import load_config

    cfg = load_config("default")
    gemm = depthwise.DepthwiseUnitWorkload(**_TWIN_384)
    alu = dataclasses.replace(gemm, unit="alu", knobs=(), bias_gemm=False)
    keys = {u: {depthwise.refusal_key("depthwise_conv2d", "csp-relaxed", cfg, w,
                                      (("bias",), ("shr", s), ("clip", 0, 96)), "cycles")
                for s in _SHIFTS_384} for u, w in (("gemm", gemm), ("alu", alu))}
    assert len(keys["gemm"]) == 1 and len(keys["alu"]) == 3
