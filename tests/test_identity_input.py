"""The identity-GEMM input path of the ALU templates (vta_ext.templates.alu_program.IdentityInput,
``input_path="gemm"`` of the pools and the add) and its choice under csp-relaxed
(tvm_csp_embed.pool).

References: window-by-window numpy pools (test_template_pool.ref_pool; ceil mode:
test_ceil_pool.ref_max_pool_ceil), numpy adds, the llvm build, and instruction counts computed
here by hand from the programs' definitions, read back from the emitted instructions by kind.
"""
from collections import Counter

import numpy as np
import pytest

import tvm_csp_embed  # noqa: F401 -- registers csp-relaxed's pool and add templates
import vta_ext
from conftest import add_module, pack_activation as pack, unpack_nchw as unpack
from test_ceil_pool import ref_max_pool_ceil
from test_pool_separable import _on
from test_template_pool import ref_pool
from vta_ext.config import VTAConfig, load_config
from vta_ext.errors import TemplateRefusal
from vta_ext.isa import GemmInsn, MemInsn, MemType, Opcode
from vta_ext.templates.eltwise import EltwiseWorkload, build_add
from vta_ext.templates.errors import AluTemplateError, AluTemplateRefusal
from vta_ext.templates.pool import PoolWorkload, build_avg_pool2d, build_max_pool2d

PRESETS = ["default", "pipelined"]


def kinds(program):
    """``Counter`` of the program's data LOADs by memory type (``"ACC_8BIT"``, ``"INP"``, ...;
    micro-op loads and NOPs left out), of ``"GEMM"`` / ``"GEMM reset"`` instructions and of their
    micro-op iterations (``"GEMM uops"``, ``"reset uops"``)."""
    out = Counter()
    for i in program.insns:
        if isinstance(i, MemInsn) and i.opcode == Opcode.LOAD and i.x_size and \
                i.memory_type != MemType.UOP:
            out[MemType(i.memory_type).name] += 1
        elif isinstance(i, GemmInsn):
            name = "reset" if i.reset_reg else "GEMM"
            out["GEMM reset" if i.reset_reg else "GEMM"] += 1
            out[f"{name} uops"] += i.iter_out * i.iter_in * (i.uop_end - i.uop_bgn)
    return out


def _run_pool(build, cfg, wl, x, **kw):
    op = build(cfg, wl, (), None, **kw)
    out, _ = op.run(pack(x, cfg))
    return unpack(out), op


# ------------------------------------------------------------------ bit-exact against numpy
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("schedule", ["direct", "separable"])
@pytest.mark.parametrize("h,k,s,knobs", [(56, 3, 2, None),                 # several tiles
                                         (13, 3, 2, None),                 # squeezenet's
                                         (9, 2, 2, dict(tile_h=1, slots=1)),
                                         (14, 3, 1, dict(tile_c=1))])
def test_max_pool_through_the_identity_gemm(preset, schedule, h, k, s, knobs):
    cfg = load_config(preset)
    wl = PoolWorkload(1, 32, h, h, k, k, s, s, 0, 0)
    x = np.random.default_rng(h + k).integers(-128, 128, (1, 32, h, h)).astype(np.int8)
    op = build_max_pool2d(cfg, wl, (), knobs, schedule=schedule, input_path="gemm")
    got = unpack(op.run(pack(x, cfg))[0])
    np.testing.assert_array_equal(got, ref_pool(x, wl, "max"))
    assert op.info["input_path"] == "gemm"


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("schedule", ["direct", "separable"])
def test_ceil_mode_max_pool_through_the_identity_gemm(preset, schedule):
    """Ceil mode as the stock plan runs it: the input padded with -128 on the host (one more row
    and column here), the pool itself without padding."""
    cfg = load_config(preset)
    x = np.random.default_rng(5).integers(-128, 128, (1, 16, 14, 14)).astype(np.int8)
    x[0, :8, -1, :] = -128          # windows at the border that hold only the minimum
    padded = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=-128)
    wl = PoolWorkload(1, 16, 15, 15, 3, 3, 2, 2, 0, 0)
    got, _ = _run_pool(build_max_pool2d, cfg, wl, padded, schedule=schedule, input_path="gemm")
    np.testing.assert_array_equal(got, ref_max_pool_ceil(x, 3, 2, 0))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("h,k,s,p,incl", [(14, 3, 1, 1, False),   # border divisors (vector)
                                          (14, 3, 1, 1, True),
                                          (13, 13, 1, 0, False),  # squeezenet's global pool
                                          (56, 3, 2, 1, False),   # several tiles
                                          (7, 7, 1, 0, False)])
def test_avg_pool_through_the_identity_gemm(preset, h, k, s, p, incl):
    cfg = load_config(preset)
    wl = PoolWorkload(1, 32, h, h, k, k, s, s, p, p, incl)
    x = np.random.default_rng(h * k).integers(-128, 128, (1, 32, h, h)).astype(np.int8)
    x[0, :4] = -128                 # the largest negative sums
    got, op = _run_pool(build_avg_pool2d, cfg, wl, x, input_path="gemm")
    np.testing.assert_array_equal(got, ref_pool(x, wl, "avg"))
    assert op.info["input_path"] == "gemm"


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("path", ["gemm", "split"])
@pytest.mark.parametrize("shape,knobs", [((1, 64, 56, 56), None),          # 13 or 25 tiles
                                         ((1, 32, 7, 9), None),
                                         ((1, 16, 10, 10), dict(tile=7, slots=1))])
def test_add_through_the_identity_gemm(preset, path, shape, knobs):
    cfg = load_config(preset)
    rng = np.random.default_rng(sum(shape))
    a, b = (rng.integers(-128, 128, shape).astype(np.int8) for _ in range(2))
    epilogue = (("shr", 1), ("clip", -100, 100))
    op = build_add(cfg, EltwiseWorkload(*shape), epilogue, knobs, input_path=path)
    got = unpack(op.run(pack(a, cfg), pack(b, cfg))[0])
    ref = np.clip((a.astype(np.int32) + b) >> 1, -100, 100).astype(np.int8)
    np.testing.assert_array_equal(got, ref)


def test_refusals():
    wl = PoolWorkload(1, 16, 14, 14, 3, 3, 1, 1, 1, 1)
    with pytest.raises(AluTemplateRefusal, match="pads with 0"):
        build_max_pool2d("default", wl, (), None, input_path="gemm")
    with pytest.raises(AluTemplateRefusal, match="two-operand"):
        build_avg_pool2d("default", wl, (), None, input_path="split")
    with pytest.raises(AluTemplateError, match="input_path 'dma'"):
        build_avg_pool2d("default", wl, (), None, input_path="dma")
    values = load_config("default").to_dict()
    values.pop("LOG_BLOCK", None)
    narrow = VTAConfig.from_dict({**values, "LOG_BLOCK_OUT": 5})   # 16 inputs, 32 outputs
    with pytest.raises(AluTemplateRefusal, match="BLOCK_IN == BLOCK_OUT"):
        build_add(narrow, EltwiseWorkload(1, 32, 4, 4), (), None, input_path="gemm")


# ------------------------------------------------------------------ instructions by kind
def test_add_instructions_by_kind():
    """1x32x7x9: 2 x 63 = 126 rows, one tile on both paths. ``acc8``: the two operands by LOAD
    ACC_8BIT, no GEMM. ``gemm``: the identity tile (one WGT load), the two operands by LOAD
    INP, one reset GEMM of 126 iterations and one GEMM of two micro-ops x 126. ``split``: ``a``
    by LOAD ACC_8BIT (it overwrites: no reset), ``b`` by LOAD INP and one GEMM of 126."""
    wl = EltwiseWorkload(1, 32, 7, 9)
    acc8 = kinds(build_add("pipelined", wl, (), None).program)
    gemm = kinds(build_add("pipelined", wl, (), None, input_path="gemm").program)
    assert acc8 == Counter({"ACC_8BIT": 2})
    assert gemm == Counter({"WGT": 1, "INP": 2, "GEMM reset": 1, "reset uops": 126, "GEMM": 1,
                            "GEMM uops": 252})
    split = kinds(build_add("pipelined", wl, (), None, input_path="split").program)
    assert split == Counter({"WGT": 1, "ACC_8BIT": 1, "INP": 1, "GEMM": 1, "GEMM uops": 126})


def test_pool_instructions_by_kind():
    """1x32x13x13 3x3 s2 (6x6 outputs, two channel blocks), one tile. The max pool's window
    (2 x 169 rows) enters by a reset and a GEMM instead of two ACC_8BIT loads (one per channel
    block); the direct schedule's first element by a reset and a GEMM of the 2 x 36 outputs
    instead of the MUL-by-0 and ADD copy. The 13x13 global average pool sums its 169 taps of
    each block by GEMM micro-ops: 2 x 169 iterations, no ALU ADD vector."""
    wl = PoolWorkload(1, 32, 13, 13, 3, 3, 2, 2, 0, 0)
    for schedule, gemms in (("direct", {"GEMM reset": 2, "reset uops": 338 + 72, "GEMM": 2,
                                        "GEMM uops": 338 + 72}),
                            ("separable", {"GEMM reset": 1, "reset uops": 338, "GEMM": 1,
                                           "GEMM uops": 338})):
        acc8 = kinds(build_max_pool2d("pipelined", wl, (), None, schedule=schedule).program)
        gemm = kinds(build_max_pool2d("pipelined", wl, (), None, schedule=schedule,
                                      input_path="gemm").program)
        fill = 1 if schedule == "separable" else 0      # the lane-minimum fill of the outputs
        assert acc8 == Counter({"ACC_8BIT": 2 + fill}), schedule
        assert gemm == Counter({"WGT": 1, "INP": 2, "ACC_8BIT": fill, **gemms}), schedule
    glob = PoolWorkload(1, 32, 13, 13, 13, 13, 1, 1, 0, 0)
    gemm = build_avg_pool2d("pipelined", glob, (), None, input_path="gemm").program
    assert kinds(gemm) == Counter({"WGT": 1, "INP": 2, "GEMM reset": 1, "reset uops": 2,
                                   "GEMM": 1, "GEMM uops": 338})
    assert kinds(build_avg_pool2d("pipelined", glob, (), None).program) == \
        Counter({"ACC_8BIT": 2})


# ------------------------------------------------------------------ the choice under csp-relaxed
@pytest.mark.parametrize("preset", PRESETS)
def test_csp_relaxed_chooses_the_add_input_path_by_cycles(preset):
    """Compute-module cycles a row (16 int8 bytes: 2 cycles of LOAD ACC_8BIT at 8 bytes a cycle;
    the shift and clip epilogue the same on every path): ``acc8`` 2 + 2 + the vector ADD (2 on
    pipelined, 6 on default); ``gemm`` a reset and two GEMM micro-ops, 3 * (1 or 4), and the load
    module's two INP rows, 4 cycles; ``split`` 2 + one GEMM micro-op (1 or 4), and one INP row on
    the load module. pipelined: 6 / max(3, 4) / max(3, 2) -> split; default: 10 / 12 / 6 ->
    split."""
    x = np.random.default_rng(3).integers(-128, 128, (2, 1, 64, 28, 28)).astype(np.int8)
    with vta_ext.build_options(strategy="csp-relaxed"):
        got, ref, report = _on_arrays(preset, add_module(1, 64, 28), list(x))
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(
        got, np.clip((x[0].astype(np.int32) + x[1]) >> 1, -128, 127).astype(np.int8))
    (op,) = report.on_vta
    assert "; the first input by LOAD ACC_8BIT, the second by LOAD INP and an identity GEMM " \
           "chosen by csp-relaxed: fewest cycles on the cycle model" in op.detail, op.detail
    assert op.plan == "csp-relaxed add, split inputs", op.plan


def test_csp_relaxed_keeps_acc8_for_a_max_pool_on_default():
    """squeezenet's 3x3 s2 pool, 1x32x13x13, on default: an input row costs 2 cycles of LOAD
    ACC_8BIT against a reset and an identity GEMM, 2 x 4 (the MAX passes are the same on both
    paths): the ACC_8BIT loads stay."""
    from test_ceil_pool import _pool_module

    x = np.random.default_rng(8).integers(-128, 128, (1, 32, 13, 13)).astype(np.int8)
    with vta_ext.build_options(strategy="csp-relaxed"):
        got, ref, report = _on("default", _pool_module(x.shape, 3, 2, 0, False), x)
    np.testing.assert_array_equal(got, ref)
    (op,) = report.on_vta
    assert "with inputs by LOAD ACC_8BIT (compute module) chosen by csp-relaxed: fewest" \
        in op.detail, op.detail
    assert "gemm" not in op.plan, op.plan


def _avg_module(shape, k, s, p):
    from tvm import relax

    x = relax.Var("x", relax.TensorType(shape, "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.avg_pool2d(relax.op.astype(x, "int32"), k, s, p))
            out = bb.emit_output(bb.emit(relax.op.astype(relax.op.clip(y, -128, 127), "int8")))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("preset", PRESETS)
def test_csp_relaxed_avg_pool_against_llvm(preset):
    """A 3x3 s1 p1 average pool: the GEMM window sum (reset + 9 micro-ops an output) against the
    copy and 8 ALU ADD passes after the window's ACC_8BIT load, so the GEMM path on both."""
    x = np.random.default_rng(11).integers(-128, 128, (1, 32, 14, 14)).astype(np.int8)
    with vta_ext.build_options(strategy="csp-relaxed"):
        got, ref, report = _on(preset, _avg_module(x.shape, 3, 1, 1), x)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got, ref_pool(x, PoolWorkload(1, 32, 14, 14, 3, 3, 1, 1, 1, 1),
                                                "avg"))
    (op,) = report.on_vta
    assert op.plan == "csp-relaxed avg pool, gemm inputs", (op.plan, op.detail)


@pytest.mark.parametrize("preset", PRESETS)
def test_csp_relaxed_padded_max_pool_keeps_acc8_and_says_why(preset):
    from test_ceil_pool import _pool_module

    x = np.random.default_rng(2).integers(-128, 128, (1, 32, 14, 14)).astype(np.int8)
    with vta_ext.build_options(strategy="csp-relaxed"):
        got, ref, report = _on(preset, _pool_module(x.shape, 3, 1, 1, False), x)
    np.testing.assert_array_equal(got, ref)
    (op,) = report.on_vta
    assert "inputs by LOAD ACC_8BIT (compute module) chosen" in op.detail
    assert "pads with 0 (LOAD INP), which can win a MAX" in op.detail


# ------------------------------------------------------------------ pynq: no ACC_8BIT loads
def _pynq_cases():
    """The add and an unpadded max pool on ``pynq`` (which has neither ACC_8BIT loads nor ALU
    MUL nor pad_min): only the GEMM input path and the direct schedule can run them."""
    rng = np.random.default_rng(9)
    a, b = (rng.integers(-128, 128, (1, 32, 9, 9)).astype(np.int8) for _ in range(2))
    add = (lambda cfg: build_add(cfg, EltwiseWorkload(1, 32, 9, 9), (("shr", 1),), None,
                                 input_path="gemm"),
           (a, b), ((a.astype(np.int32) + b) >> 1).astype(np.int8))
    wl = PoolWorkload(1, 32, 13, 13, 3, 3, 2, 2, 0, 0)
    x = rng.integers(-128, 128, (1, 32, 13, 13)).astype(np.int8)
    pool = (lambda cfg: build_max_pool2d(cfg, wl, (), None, input_path="gemm"), (x,),
            ref_pool(x, wl, "max"))
    inplace = (lambda cfg: build_max_pool2d(cfg, wl, (), None, schedule="inplace",
                                            input_path="gemm"), (x,), ref_pool(x, wl, "max"))
    return {"add": add, "max_pool": pool, "max_pool_inplace": inplace}


@pytest.mark.parametrize("case", ["add", "max_pool", "max_pool_inplace"])
def test_pynq_through_the_identity_gemm(case, rtl):
    """Bit-exact on the functional simulator and on the RTL of the Pynq design; the stock
    program (ACC_8BIT loads) refuses."""
    cfg = load_config("pynq")
    build, arrays, ref = _pynq_cases()[case]
    op = build(cfg)
    packed = [pack(a, cfg) for a in arrays]
    np.testing.assert_array_equal(unpack(op.run(*packed)[0]), ref)
    with vta_ext.run_on(rtl):
        np.testing.assert_array_equal(unpack(op.run(*packed)[0]), ref)
    with pytest.raises(TemplateRefusal, match="ACC_8BIT"):
        (build_add(cfg, EltwiseWorkload(1, 32, 9, 9)) if case == "add" else
         build_max_pool2d(cfg, PoolWorkload(1, 32, 13, 13, 3, 3, 2, 2, 0, 0)))


def test_pynq_ceil_pool_and_add_run_on_vta_under_csp_relaxed():
    """squeezenet's ceil-mode pool and a residual add, which stayed on the CPU on ``pynq``, run
    on VTA under csp-relaxed (the GEMM input path, the only one that runs them), bit-exact
    against llvm; the stock strategy keeps them on the CPU."""
    from test_ceil_pool import _pool_module

    x = np.random.default_rng(3).integers(-128, 128, (1, 32, 13, 13)).astype(np.int8)
    ab = np.random.default_rng(4).integers(-128, 128, (2, 1, 32, 9, 9)).astype(np.int8)
    for mod, arrays in ((_pool_module(x.shape, 3, 2, 0, True), [x]),
                        (add_module(1, 32, 9), list(ab))):
        with vta_ext.build_options(strategy="csp-relaxed"):
            got, ref, report = _on_arrays("pynq", mod, arrays)
        np.testing.assert_array_equal(got, ref)
        (op,) = report.on_vta
        # the add has one variant that runs; the pool two (direct and in-place, both by GEMM)
        assert ("identity GEMMs chosen by csp-relaxed: the only variant that runs it" in op.detail
                or "identity GEMMs chosen by csp-relaxed: fewest cycles" in op.detail)
        assert "inputs by LOAD ACC_8BIT" not in op.detail.split(" chosen by ")[0]
        with vta_ext.build_options(strategy="stock"):
            _, _, report = _on_arrays("pynq", mod, arrays)
        assert not report.on_vta


def _on_arrays(preset, mod, arrays):
    """Build ``mod`` for ``preset``'s VTA target and for llvm, run both on ``arrays``."""
    import tvm
    from tvm import relax

    from conftest import run_module

    vm = relax.VirtualMachine(relax.build(mod, target=vta_ext.vta_target(preset)), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    report = vta_ext.last_build_report()
    return got, run_module(mod, "llvm", arrays), report
