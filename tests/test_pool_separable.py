"""The separable max-pool schedule (vta_ext.templates.pool, schedule="separable") and its choice
under csp-relaxed (tvm_csp_embed.pool).

References: a window-by-window numpy max pool (test_template_pool.ref_pool; ceil mode:
test_ceil_pool.ref_max_pool_ceil), the llvm build, and pass counts computed here by hand from the
schedule's definition (height in place per output row and input column with data, then the width
into the output), read back from the emitted program's ALU instructions.
"""
import dataclasses

import numpy as np
import pytest

import tvm_csp_embed  # noqa: F401 -- registers csp-relaxed's max-pool template
import vta_ext
from conftest import pack_activation as pack, unpack_nchw as unpack, vta_and_llvm
from test_ceil_pool import _pool_module, ref_max_pool_ceil
from test_template_pool import ref_pool
from vta_ext.config import load_config
from vta_ext.floor import OperatorSize, operator_floor
from vta_ext.isa import AluInsn, AluOp, MemInsn, MemType, Opcode
from vta_ext.sim.cycles import CycleModel
from vta_ext.templates.errors import AluTemplateError, AluTemplateRefusal
from vta_ext.templates.pool import PoolWorkload, build_avg_pool2d, build_max_pool2d


def alu_iterations(program):
    """``{(opcode, immediate?): micro-op iterations}`` of the program's ALU instructions."""
    out = {}
    for insn in program.insns:
        if isinstance(insn, AluInsn):
            key = (AluOp(insn.alu_opcode).name, bool(insn.use_imm))
            out[key] = out.get(key, 0) + insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
    return out


def fills(program):
    """Padding-only LOADs (no DRAM rows): the elements each writes."""
    return [(i.x_pad_0 + i.x_size + i.x_pad_1) * (i.y_pad_0 + i.y_pad_1) for i in program.insns
            if isinstance(i, MemInsn) and i.opcode == Opcode.LOAD and i.y_size == 0 and i.x_size]


CASES = [  # n, c, h, w, pool, stride, pad, knobs
    (1, 32, 56, 56, 3, 2, 1, None),                     # ResNet-18's pool, several tiles
    (1, 32, 14, 14, 3, 1, 1, None),                     # googlenet's inception pool
    (1, 16, 13, 13, 3, 2, 0, None),                     # squeezenet's pool (floor-mode size)
    (1, 48, 8, 8, 2, 2, 0, dict(tile_h=2, tile_c=2, slots=1)),   # 2x2 s2, no overlap
    (1, 16, 9, 9, 3, 2, 1, dict(tile_h=1)),             # one output row per tile
    (1, 16, 7, 7, 2, 3, 1, None),                       # stride > pool: columns skipped
    (1, 16, 10, 7, 3, 2, 0, None),                      # not square: the last column unread
]


@pytest.mark.parametrize("schedule", ["separable", "inplace"])   # inplace: test_pool_inplace.py
@pytest.mark.parametrize("preset", ["default", "pipelined"])
@pytest.mark.parametrize("n,c,h,w,pool,stride,pad,knobs", CASES)
def test_separable_max_pool_is_bit_exact(preset, n, c, h, w, pool, stride, pad, knobs, schedule):
    cfg = load_config(preset)
    wl = PoolWorkload(n, c, h, w, pool, pool, stride, stride, pad, pad)
    x = np.random.default_rng(h * c + pad).integers(-128, 128, (n, c, h, w)).astype(np.int8)
    x[0, :3] = -128                                   # windows that hold only the minimum
    op = build_max_pool2d(cfg, wl, (), knobs, schedule=schedule)
    got, _ = op.run(pack(x, cfg))
    again, _ = op.run(pack(x, cfg))                   # the program is reusable (tokens balanced)
    np.testing.assert_array_equal(got, again)
    np.testing.assert_array_equal(unpack(got), ref_pool(x, wl, "max"))
    assert op.info["schedule"] == schedule


def test_separable_with_an_epilogue_and_batch_blocks():
    """2x16x16 (BATCH 2): two images per accumulator row; an add / shift / clip epilogue."""
    cfg = load_config("2x16x16")
    wl = PoolWorkload(2, 32, 11, 11, 3, 3, 2, 2, 1, 1)
    x = np.random.default_rng(3).integers(-128, 128, (2, 32, 11, 11)).astype(np.int8)
    epilogue = (("add", 100), ("shr", 1), ("clip", -50, 60))
    op = build_max_pool2d(cfg, wl, epilogue, None, schedule="separable")
    got, _ = op.run(pack(x, cfg))
    np.testing.assert_array_equal(unpack(got), ref_pool(x, wl, "max", epilogue))


@pytest.mark.parametrize("knobs", [None, dict(tile_h=2), dict(tile_h=1, slots=1)])
def test_pass_counts_by_hand(knobs):
    """1x16x9x9 3x3 s2 p1: 5x5 outputs of one channel block. Separable: the height, 2 MAX per
    (output row, data column) = 2*5*9 = 90, the width, 3 MAX per output = 75: 165 vector
    micro-op iterations and no immediate one, whatever the tiling; the 25 output rows start
    from fills. Direct: a MUL imm and an ADD per output (25 + 25), 8 MAX per output (200)."""
    cfg = load_config("default")
    wl = PoolWorkload(1, 16, 9, 9, 3, 3, 2, 2, 1, 1)
    sep = build_max_pool2d(cfg, wl, (), knobs, schedule="separable")
    assert alu_iterations(sep.program) == {("MAX", False): 165}
    assert sum(fills(sep.program)) == 25
    assert sep.info["vector_passes"] == 165
    direct = build_max_pool2d(cfg, wl, (), knobs)
    assert alu_iterations(direct.program) == {("MUL", True): 25, ("ADD", False): 25,
                                              ("MAX", False): 200}
    assert fills(direct.program) == []


def test_pass_counts_stride_one():
    """googlenet's 3x3 s1 p1 on 1x32x6x6 (two channel blocks of 6x6 outputs): 2*6*6 = 72 along
    the height, 3*36 = 108 along the width, per block: 360 in all, against 9 * 72 = 648 vector
    (and 72 immediate) iterations of the direct schedule. Cycles on default: 6 per vector and 5
    per immediate micro-op; the separable program is the faster."""
    cfg = load_config("default")
    wl = PoolWorkload(1, 32, 6, 6, 3, 3, 1, 1, 1, 1)
    sep = build_max_pool2d(cfg, wl, (), None, schedule="separable")
    direct = build_max_pool2d(cfg, wl, (), None)
    assert alu_iterations(sep.program) == {("MAX", False): 360}
    assert alu_iterations(direct.program) == {("MUL", True): 72, ("ADD", False): 72,
                                              ("MAX", False): 576}
    model = CycleModel(cfg)
    assert model.run_program(sep.program).total_cycles < model.run_program(direct.program).total_cycles


def test_the_in_place_height_pass_keeps_its_order_under_a_hazard_distance():
    """A configuration with an ALU hazard distance of 3 (the Pynq design's, here with ACC_8BIT
    loads and pad_min): the runtime's cure must not reorder the in-place height pass (its sources
    are rows it writes); the simulator refuses any program that breaks the contract, and the
    output is still the numpy max pool."""
    cfg = dataclasses.replace(load_config("default"), ACC_DEP_DISTANCE_ALU=3)
    wl = PoolWorkload(1, 16, 9, 9, 3, 3, 1, 1, 1, 1)
    x = np.random.default_rng(9).integers(-128, 128, (1, 16, 9, 9)).astype(np.int8)
    op = build_max_pool2d(cfg, wl, (), None, schedule="separable")
    got, _ = op.run(pack(x, cfg))
    np.testing.assert_array_equal(unpack(got), ref_pool(x, wl, "max"))


def test_refusals():
    wl = PoolWorkload(1, 16, 8, 8, 3, 3, 2, 2, 0, 0)
    with pytest.raises(AluTemplateRefusal, match="EXT_PAD_MIN"):
        build_max_pool2d("apache", wl, (), None, schedule="separable")
    with pytest.raises(AluTemplateError, match="schedule 'rows'"):
        build_max_pool2d("default", wl, (), None, schedule="rows")
    from vta_ext.templates.pool import _build_pool
    with pytest.raises(AluTemplateRefusal, match="average pool keeps the direct"):
        _build_pool(load_config("default"), wl, (), None, "avg", "separable")
    build_avg_pool2d("default", wl)                     # the average pool itself still builds


# ------------------------------------------------------------------------------ through relax
@pytest.mark.parametrize("preset", ["default", "pipelined"])
@pytest.mark.parametrize("h,k,s,p,ceil", [(14, 3, 1, 1, True),     # googlenet's inception pool
                                          (13, 3, 2, 0, True),     # squeezenet / googlenet
                                          (28, 3, 2, 1, False),    # ResNet-18's
                                          (7, 2, 2, 0, True)])     # googlenet's maxpool4
def test_csp_relaxed_runs_the_separable_pool(preset, h, k, s, p, ceil):
    """relax.build under csp-relaxed (the default strategy) against llvm and numpy; the report
    line says the separable schedule was chosen and by how much."""
    rng = np.random.default_rng(h + k + s)
    x = rng.integers(-128, 128, (1, 32, h, h)).astype(np.int8)
    x[0, :8, -1, :] = -128
    with vta_ext.build_options(strategy="csp-relaxed"):
        mod = _pool_module(x.shape, k, s, p, ceil)
        got, ref, report = vta_and_llvm(mod, [x]) if preset == "default" else \
            _on(preset, mod, x)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got, ref_max_pool_ceil(x, k, s, p) if ceil
                                  else ref_pool(x, PoolWorkload(1, 32, h, h, k, k, s, s, p, p),
                                                "max"))
    (op,) = report.on_vta
    assert "separable max pool" in op.detail and "chosen by csp-relaxed: fewest cycles" in op.detail
    assert report.cycles(op) >= report.floor(op).structural


def test_a_warm_build_builds_only_the_chosen_schedule(tmp_path, monkeypatch):
    """The schedule choice kept on disk (``pools/``): a second build on the cache the first
    filled, in a process that forgot the programs and cycle reports (``executor.release``),
    builds only the chosen schedule's program (the builds counted at the executor) and times
    none, with the same report line and program key; both outputs bit-exact against llvm and
    numpy."""
    from vta_ext import executor

    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    x = np.random.default_rng(7).integers(-128, 128, (1, 32, 28, 28)).astype(np.int8)
    built, cycled = [], []
    build_spec, run_program = executor.build_spec, CycleModel.run_program
    monkeypatch.setattr(executor, "build_spec", lambda spec, config: (
        built.append((spec["workload"]["schedule"], spec["workload"]["input_path"])),
        build_spec(spec, config))[1])
    monkeypatch.setattr(CycleModel, "run_program", lambda self, program: (
        cycled.append(1), run_program(self, program))[1])
    from tvm_csp_embed import depthwise, shape_cycles

    builds = []
    for _ in range(2):
        executor.release(load_config("default"))
        monkeypatch.setattr(depthwise, "_REFUSED", {})   # nor the refusals an earlier test met
        monkeypatch.setattr(shape_cycles, "_COUNTS", {})   # nor the counts it timed
        built.clear()
        cycled.clear()
        with vta_ext.build_options(strategy="csp-relaxed"):
            got, ref, report = vta_and_llvm(_pool_module(x.shape, 3, 2, 1, False), [x])
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(got, ref_pool(x, PoolWorkload(1, 32, 28, 28, 3, 3, 2, 2, 1, 1),
                                                    "max"))
        (op,) = report.on_vta
        builds.append((sorted(built), len(cycled), op.detail, report.vta_keys))
    cold, warm = builds
    # every schedule x input path is tried; the GEMM input path refuses the padded max pool
    # before it emits a program (its zero INP padding could win a MAX), so three are timed
    assert cold[:2] == (sorted((s, p) for s in ("direct", "separable", "inplace")
                               for p in ("acc8", "gemm")), 3)
    assert "pads with 0" in cold[2]
    assert warm[:2] == ([("inplace", "acc8")], 0)
    assert warm[2:] == cold[2:] and "in-place max pool" in warm[2]


def _on(preset, mod, x):
    """Build ``mod`` for the VTA target of ``preset`` and for llvm, run both on ``x``."""
    import tvm
    from tvm import relax

    from conftest import run_module

    vm = relax.VirtualMachine(relax.build(mod, target=vta_ext.vta_target(preset)), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    return got, run_module(mod, "llvm", [x]), vta_ext.last_build_report()


def test_stock_keeps_the_direct_pool_and_csp_relaxed_says_why_it_cannot_use_the_other():
    """The stock strategy builds the direct program; csp-relaxed on apache (no EXT_PAD_MIN)
    keeps the direct schedule and the report line names the refusal."""
    x = np.random.default_rng(1).integers(-128, 128, (1, 16, 9, 9)).astype(np.int8)
    mod = _pool_module(x.shape, 3, 2, 0, False)
    with vta_ext.build_options(strategy="stock"):
        got, ref, report = vta_and_llvm(mod, [x])
    np.testing.assert_array_equal(got, ref)
    (op,) = report.on_vta
    assert "separable" not in op.detail
    with vta_ext.build_options(strategy="csp-relaxed"):
        got, ref, report = _on("apache", mod, x)
    np.testing.assert_array_equal(got, ref)
    (op,) = report.on_vta
    assert op.detail.count("the separable max pool") == 2 and "EXT_PAD_MIN" in op.detail
    assert "; the direct max pool" in op.detail and "chosen by csp-relaxed" in op.detail


# ------------------------------------------------------------------------------ the floor
def test_the_floor_is_the_fewer_passes_of_the_plans():
    """ResNet-18's pool, 1x64x112x112 3x3 s2 p1: 56x56 outputs, 112 columns read. Direct: 8 MAX
    passes per output block; separable: 2*112/56 + 3 = 7 per output, in place (the first window
    element the initial value): 6. 4 blocks x 3136 outputs x 6 passes x 6 cycles on default.
    Without the window (unknown geometry), the direct plan's 8; without EXT_PAD_MIN (apache) the
    in-place plan still runs an unpadded pool: 6 (tests/test_pool_inplace.py builds it)."""
    cfg = load_config("default")
    outputs = 64 * 56 * 56
    size = OperatorSize("max_pool2d", 0, outputs, 64 * 112 * 112, channels=64, taps=9,
                        window=(3, 3, 56, 56, 112))
    assert operator_floor(cfg, size).compute_alu == outputs / 16 * 6 * 6
    no_window = dataclasses.replace(size, window=())
    assert operator_floor(cfg, no_window).compute_alu == outputs / 16 * 8 * 6
    apache = load_config("apache")
    assert operator_floor(apache, size).compute_alu == outputs / 16 * 6 * apache.ALU_CYCLES_PER_UOP_VEC
    # 2x2 s2 (no overlap): separable 1*8/4 + 2 - 1 = 3 = the direct plan's taps - 1
    small = OperatorSize("max_pool2d", 0, 16 * 16, 16 * 64, channels=16, taps=4,
                         window=(2, 2, 4, 4, 8))
    assert operator_floor(cfg, small).compute_alu == 16 * 3 * 6
