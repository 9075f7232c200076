"""The floor of a VTA operator (vta_ext.floor) and its efficiency in the build report.

Every expected floor is computed here by hand from the definition (issue 18, docs of
vta_ext.floor) with the configuration constants written out:

* ``default``:   BATCH 1, BLOCK 16x16, GEMM 4, ALU imm 5 / vec 6 cycles per micro-op, 8 B/cycle;
* ``pipelined``: BATCH 1, BLOCK 16x16, GEMM 1, ALU imm 1 / vec 2 cycles per micro-op, 8 B/cycle;
* ``2x16x16``:   BATCH 2, BLOCK 16x16, GEMM 4, ALU imm 5 / vec 6 cycles per micro-op, 8 B/cycle.

Each operator is built through ``relax.build`` (the stock template pads channels to the block,
the CSP strategy does not), so the floors also check that the report recovers the unpadded
operator from what the build knows.
"""
import pytest
from tvm import relax

import vta_ext
import tvm_csp_embed  # noqa: F401 -- registers the CSP strategies
from vta_ext.floor import Floor, OperatorSize, efficiency, operator_floor, serial_floor
from conftest import add_module
from vta_ext.config import STRUCTURE_KEYS

CONSTANTS = {"default": (4, 5, 6), "pipelined": (1, 1, 2)}  # GEMM, ALU imm, ALU vec
#: the least a tensor's DMA costs besides its bytes on default, pipelined and 2x16x16: one
#: instruction (INSN_ISSUE_CYCLES 1) of one row (DMA_OVERHEAD_CYCLES 4), structural keys 0
DMA = 1 + 4


def test_constants_are_the_presets():
    for name, (gemm, imm, vec) in CONSTANTS.items():
        cfg = vta_ext.load_config(name)
        assert (cfg.GEMM_CYCLES_PER_UOP, cfg.ALU_CYCLES_PER_UOP_IMM, cfg.ALU_CYCLES_PER_UOP_VEC,
                cfg.MEM_BYTES_PER_CYCLE, cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT) == \
            (gemm, imm, vec, 8, 1, 16, 16)
    for name in (*CONSTANTS, "2x16x16"):
        cfg = vta_ext.load_config(name)
        assert (cfg.INSN_ISSUE_CYCLES, cfg.DMA_OVERHEAD_CYCLES) == (1, 4)
        assert all(getattr(cfg, k) == 0 for k in STRUCTURE_KEYS if k not in ("PAD_ELEM_CYCLES",))


# ------------------------------------------------------------------------------ modules
def _tail(bb, y, tail, channels):
    """Apply the requantisation ``tail`` ("bias-shift-clip", "shift-bias-clip", "shift-clip",
    "none") to the int32 ``y``; returns (int8 output, extra params)."""
    params = []
    for step in tail.split("-") if tail != "none" else []:
        if step == "bias":
            b = relax.Var("b", relax.TensorType((1, channels, 1, 1) if len(y.ty.shape) == 4
                                                else (channels,), "int32"))
            params.append(b)
            y = bb.emit(relax.op.add(y, b))
        elif step == "shift":
            y = bb.emit(relax.op.right_shift(y, relax.const(6, "int32")))
        elif step == "clip":
            y = bb.emit(relax.op.clip(y, -128, 127))
    return bb.emit(relax.op.astype(y, "int8")), params


def conv_module(n, c, hw, k, kernel, stride, pad, tail, groups=1):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, hw, hw), "int8"))
    w = relax.Var("w", relax.TensorType((k, c // groups, kernel, kernel), "int8"))
    with bb.function("main"):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=pad, groups=groups,
                                           out_dtype="int32"))
            out, extra = _tail(bb, y, tail, k)
            out = bb.emit_output(out)
        bb.emit_func_output(out, params=[x, w] + extra)
    return bb.get()


def dense_module(n, k, m, tail):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, k), "int8"))
    w = relax.Var("w", relax.TensorType((m, k), "int8"))
    with bb.function("main"):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.op.permute_dims(w), out_dtype="int32"))
            out, extra = _tail(bb, y, tail, m)
            out = bb.emit_output(out)
        bb.emit_func_output(out, params=[x, w] + extra)
    return bb.get()


def max_pool_module(c, hw, pool, stride, pad):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, hw, hw), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.max_pool2d(x, pool, stride, pad)))
        bb.emit_func_output(out)
    return bb.get()


def avg_pool_module(c, hw):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, hw, hw), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.avg_pool2d(relax.op.astype(x, "int32"), (hw, hw)))
            y = bb.emit(relax.op.clip(y, -128, 127))
            out = bb.emit_output(bb.emit(relax.op.astype(y, "int8")))
        bb.emit_func_output(out)
    return bb.get()


def built(mod, config, strategy="stock"):
    """The one VTA placement of ``mod`` built for ``config``, and the report."""
    with vta_ext.build_options(strategy=strategy):
        relax.build(mod, target=vta_ext.vta_target(config))
    report = vta_ext.last_build_report()
    assert len(report.on_vta) == 1, str(report)
    return report.on_vta[0], report


def check(report, p, gemm, alu, memory):
    floor = report.floor(p)
    assert (floor.compute_gemm, floor.compute_alu, floor.memory) == \
        (pytest.approx(gemm), pytest.approx(alu), pytest.approx(memory))
    total = max(gemm + alu, memory)
    assert floor.total == pytest.approx(total)
    assert floor.bound == ("compute" if gemm + alu >= memory else "memory")
    # no plan beats the floor: the cycle model agrees
    cycles = report.cycles(p)
    assert cycles >= floor.total and report.efficiency(p) == pytest.approx(total / cycles)
    return floor


# ------------------------------------------------------------------------------ GEMM operators
# conv 1x24x14x14 * 40x24x3x3 s1 p1 (the stock template pads 24 -> 32 and 40 -> 48 channels):
# out 40*14*14 = 7840 elements = 490 blocks of 16; MACs 7840 * 24 * 9 = 1,693,440
# memory: the busiest DMA master: the load module's input 24*196 = 4704 B + weights 40*24*9 = 8640 B,
# one DMA each (1,678 cycles), against the store module's output 7840 B (985) and the bias 40*4 =
# 160 B, which the compute module's LOAD ACC may take
CONV_MACS = 7840 * 24 * 9
CONV_BLOCKS = 7840 // 16


def conv_expected(config, tail):
    gemm, imm, vec = CONSTANTS[config]
    passes = {"bias-shift-clip": 2 * imm,       # the leading bias is the accumulator's start
              "shift-clip": 2 * imm,
              "shift-bias-clip": imm + vec + imm,  # a bias after the shift is a vector ADD
              "none": 0}[tail]
    memory = (4704 + 8640) / 8 + 2 * DMA
    return CONV_MACS / 256 * gemm, CONV_BLOCKS * passes, memory


@pytest.mark.parametrize("config", ["default", pytest.param("pipelined", marks=pytest.mark.slow)])
@pytest.mark.parametrize("tail", ["bias-shift-clip", "shift-bias-clip", "shift-clip", "none"])
def test_conv2d_floor_by_epilogue_stock(config, tail):
    p, report = built(conv_module(1, 24, 14, 40, 3, 1, 1, tail), config)
    assert p.padding  # channels padded by the stock template; the floor is the unpadded one's
    floor = check(report, p, *conv_expected(config, tail))
    assert floor.bound == "compute"


@pytest.mark.parametrize("config", ["default", pytest.param("pipelined", marks=pytest.mark.slow)])
@pytest.mark.parametrize("tail", ["bias-shift-clip", "none"])
def test_conv2d_floor_csp_equals_stock(config, tail):
    p, report = built(conv_module(1, 24, 14, 40, 3, 1, 1, tail), config, "csp-relaxed")
    check(report, p, *conv_expected(config, tail))


def test_conv2d_floor_figures_on_default():
    """The numbers themselves, once: 26,460 GEMM + 4,900 ALU cycles against 1,668 + 2 * 5 of
    memory (the load module's); 490 output blocks, each initialised by a 1-cycle fill at the
    least, and each output's 24 * 9 = 216 products fill 13.5 micro-ops of 16 lanes: 14 whole
    ones, the half micro-op 2 more cycles (GEMM 4), with room for the bias's lane (serial 490 * 3)."""
    p, report = built(conv_module(1, 24, 14, 40, 3, 1, 1, "bias-shift-clip"), "default")
    assert report.floor(p) == Floor(26460, 4900, 1678, serial=490 * (1 + 0.5 * 4))


@pytest.mark.parametrize("config,total,bound", [("default", 512, "compute"),
                                                ("pipelined", 261, "memory")])
def test_strided_1x1_conv_reads_only_the_rows_it_touches(config, total, bound):
    """1x16x16x16 * 32x16x1x1 s2: out 32*8*8 = 2048, MACs 2048 * 16 = 32,768 (GEMM 512 cycles on
    default, 128 pipelined); memory: the load module's 16*8*8 = 1024 input elements the windows
    touch (not all 4096) + weights 512 B = 192 cycles + 2 DMAs of 5 = 202, below the store
    module's output 2048 B = 256 + 5 = 261."""
    p, report = built(conv_module(1, 16, 16, 32, 1, 2, 0, "none"), config)
    gemm = CONSTANTS[config][0]
    floor = check(report, p, 32768 / 256 * gemm, 0, 2048 / 8 + DMA)
    assert (floor.total, floor.bound) == (total, bound)


@pytest.mark.parametrize("config,strategy", [("default", "stock"), ("pipelined", "stock"),
                                             ("pipelined", "csp-relaxed")])
def test_dense_floor_is_memory_bound(config, strategy):
    """1x512 * 100x512 + bias, >> 6, clip: MACs 51,200 (GEMM 800 / 200 cycles); ALU 100 / 16 =
    6.25 blocks x 2 imm passes; memory: the load module's 512 + 51,200 B = 6,464 cycles, + 2 DMAs
    (the bias 400 B may go by the compute module's LOAD ACC, the output 100 B by the store's)."""
    p, report = built(dense_module(1, 512, 100, "bias-shift-clip"), config, strategy)
    gemm, imm, _ = CONSTANTS[config]
    floor = check(report, p, 51200 / 256 * gemm, 6.25 * 2 * imm, 51712 / 8 + 2 * DMA)
    assert floor.bound == "memory"


def test_batch_of_two_blocks():
    """2x16x16 (BATCH 2): dense 3x100 * 40x100 + bias, >> 6, clip (batch 3 -> 4, out 40 -> 48
    padded): MACs 12,000 / (2*16*16) * 4 = 93.75; ALU 120 / 32 = 3.75 blocks x 2 x 5 = 37.5;
    memory: the load module's 300 + 4,000 = 4,300 B = 537.5 cycles, + 2 DMAs."""
    p, report = built(dense_module(3, 100, 40, "bias-shift-clip"), "2x16x16")
    check(report, p, 93.75, 37.5, 537.5 + 2 * DMA)


@pytest.mark.parametrize("config", ["default", "pipelined"])
def test_dilated_conv2d_floor_from_the_csp_parameters(config):
    """A kind only the CSP strategies build: 1x16x12x12 * 16x16x3x3, dilation 2, pad 2: out
    16*12*12 = 2304, MACs 2304 * 16 * 9 = 331,776 (GEMM 5,184 cycles on default, 1,296
    pipelined); memory: the load module's 2304 + 2304 B = 576 cycles, + 2 DMAs."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 12, 12), "int8"))
    w = relax.Var("w", relax.TensorType((16, 16, 3, 3), "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=2, dilation=2, out_dtype="int32"))
            out = bb.emit_output(bb.emit(relax.op.astype(y, "int8")))
        bb.emit_func_output(out)
    p, report = built(bb.get(), config, "csp-relaxed")
    assert p.kind == "dilated_conv2d"
    check(report, p, 331776 / 256 * CONSTANTS[config][0], 0, 576 + 2 * DMA)


# ------------------------------------------------------------------------------ ALU operators
@pytest.mark.parametrize("config", ["default", "pipelined"])
def test_depthwise_floor(config):
    """1x32x8x8 depthwise 3x3 s1 p1 + bias, >> 6, clip: out 2048 = 128 blocks. The floor is the
    smaller of two units' (both compute bound here):

    * ALU taps: per block 2*9-1 = 17 vector passes, 1 vector ADD for the bias, 2 immediate
      (shift, clip); memory: the store module's output 2048 B, + 1 DMA (the input 2048 B, taps
      288 B and bias 128 B, + 3 DMAs, split between the load module's LOAD INP and the compute
      module's LOAD ACC(_8BIT) at best: 302 / 2 cycles);
    * GEMM block-diagonal: per block 9 GEMM micro-ops and 2 immediate passes (the bias is the
      accumulator's initial value); memory: the load module's input 2048 + diagonal weights
      32*9*16 = 6,656 B, + 2 DMAs (above the output's 2048 B and the bias's 128 B).
    """
    c, hw = 32, 8
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, hw, hw), "int8"))
    w = relax.Var("w", relax.TensorType((c, 1, 3, 3), "int8"))
    with bb.function("main"):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1, groups=c, out_dtype="int32"))
            out, extra = _tail(bb, y, "bias-shift-clip", c)
            out = bb.emit_output(out)
        bb.emit_func_output(out, params=[x, w] + extra)
    gemm, imm, vec = CONSTANTS[config]
    alu_unit = (0, 128 * (18 * vec + 2 * imm), 2048 / 8 + DMA)
    gemm_unit = (128 * 9 * gemm, 128 * 2 * imm, 6656 / 8 + 2 * DMA)
    expected = min(alu_unit, gemm_unit, key=lambda u: max(u[0] + u[1], u[2]))
    assert expected is gemm_unit      # on both presets the GEMM core is the faster unit
    for strategy in ("stock", "csp-relaxed"):   # the floor is the operator's, not the plan's
        p, report = built(bb.get(), config, strategy)
        assert p.kind == "depthwise_conv2d"
        check(report, p, *expected)


def test_depthwise_floor_without_alu_mul():
    """On a configuration without ALU MUL only the GEMM unit counts, even when the ALU's floor
    would be lower (here: GEMM at 40 cycles per micro-op)."""
    import dataclasses

    base = vta_ext.load_config("default")
    size = OperatorSize("depthwise_conv2d", 0, 2048, 2048, 32 * 9, 32, 9, (("shr", 6),))
    slow = dataclasses.replace(base, GEMM_CYCLES_PER_UOP=40)
    with_mul = operator_floor(slow, size)
    assert with_mul.compute_gemm == 0 and with_mul.compute_alu == 128 * (17 * 6 + 5)
    no_mul = operator_floor(dataclasses.replace(slow, ISA_ALU_MUL=False), size)
    assert (no_mul.compute_gemm, no_mul.compute_alu) == (128 * 9 * 40, 128 * 5)
    assert no_mul.memory == (2048 + 32 * 9 * 16) / 8 + 2 * DMA   # the load module's


@pytest.mark.parametrize("config", ["default", "pipelined"])
def test_max_pool_floor(config):
    """1x24x9x9 max pool 3x3 s2 p1 (channels padded 24 -> 32 by the template): out 24*5*5 = 600
    = 37.5 blocks x the fewer vector MAX passes of the two plans: direct 8, separable 2 per
    (output row, input column) + 3 per output, less the initial value: (2*5*9 + 3*25) / 25 - 1
    = 5.6; memory: the input 24*81 = 1,944 B, + 1 DMA, split at best between the load module
    (LOAD INP, identity GEMM) and the compute module (LOAD ACC_8BIT), above the output's 600 B."""
    p, report = built(max_pool_module(24, 9, 3, 2, 1), config)
    assert p.kind == "max_pool2d" and p.padding
    check(report, p, 0, 37.5 * 5.6 * CONSTANTS[config][2], (1944 / 8 + DMA) / 2)


@pytest.mark.parametrize("config", ["default", "pipelined"])
def test_global_avg_pool_floor(config):
    """1x32x7x7 global average pool, clip: out 32 = 2 blocks x (48 vector ADDs + the division's
    multiply and shift + the clip), or the 49 taps as identity GEMM micro-ops instead of the
    ADDs, whichever computes less: the GEMMs on both (49 * 4 < 48 * 6, 49 * 1 < 48 * 2); memory
    the input 32*49 = 1,568 B = 196 cycles, + 1 DMA, split at best between the two load modules,
    below the compute (104 cycles on pipelined)."""
    p, report = built(avg_pool_module(32, 7), config)
    gemm, imm, vec = CONSTANTS[config]
    floor = check(report, p, 2 * 49 * gemm, 2 * 3 * imm, (196 + DMA) / 2)
    assert floor.bound == "compute"


@pytest.mark.parametrize("config", ["default", "pipelined"])
def test_residual_add_floor(config):
    """1x32x7x7 + 1x32x7x7, >> 1, clip: 98 blocks x (1 vector ADD, or the second operand by an
    identity GEMM micro-op, whichever is cheaper: the GEMM, 4 < 6 and 1 < 2, + 2 immediate);
    memory: the two inputs 2 * 1568 B, + 2 DMAs, split at best between the load and the compute
    module, 201 cycles, as much as the store module's output 1568 B, + 1 DMA."""
    p, report = built(add_module(1, 32, 7), config)
    gemm, imm, vec = CONSTANTS[config]
    check(report, p, 98 * gemm, 98 * 2 * imm, 1568 / 8 + DMA)


@pytest.mark.parametrize("config,per_row", [("default", 2), ("pipelined", 2)])
def test_alu_inputs_enter_through_the_compute_module(config, per_row):
    """The structural floor adds the compute module's own serial work. An ALU operator's input
    rows' way into the accumulator:
    a LOAD ACC_8BIT of 16 int8 lanes at 8 B/cycle (2 cycles) or an identity GEMM into a row
    initialised first (a GEMM adds): a 1-cycle fill + 4 cycles on default, 1 + 1 on pipelined;
    the cheaper per row. Max pool 1x24x9x9 3x3 s2 p1: 24*81 = 1,944
    input elements = 121.5 rows; the residual add of two 1x32x7x7: 196 rows, of which the second
    operand's 98 may enter by the GEMM that adds them (counted as compute): 98 rows. Both plans
    take at least that many cycles on the cycle model."""
    p, report = built(max_pool_module(24, 9, 3, 2, 1), config)
    floor = report.floor(p)
    assert floor.serial == 121.5 * per_row
    assert floor.structural == max(floor.compute + 121.5 * per_row, floor.memory)
    assert floor.structural > floor.total and report.cycles(p) >= floor.structural
    p, report = built(add_module(1, 32, 7), config)
    floor = report.floor(p)
    assert floor.serial == 98 * per_row and report.cycles(p) >= floor.structural
    # a GEMM operator's loads overlap on the load module; its 32*14*14 / 16 = 392 output rows
    # each start from a 1-cycle fill at the least (a reset GEMM takes 4 / 1, an ALU pass 5 / 1),
    # and its 32 * 9 = 288 products an output fill 18 micro-ops: the bias takes a 19th (4 / 1
    # cycles), cheaper than an ALU ADD (5 / 1 imm, 6 / 2 vector) or a LOAD ACC of 64 B (8)
    gemm = CONSTANTS[config][0]
    p, report = built(conv_module(1, 32, 14, 32, 3, 1, 1, "bias-shift-clip"), config)
    floor = report.floor(p)
    assert floor.serial == 392 * (1 + gemm)
    assert floor.structural == max(floor.compute + 392 * (1 + gemm), floor.memory)
    assert report.cycles(p) >= floor.structural


def test_pynq_alu_inputs_take_the_identity_gemm():
    """pynq has no ACC_8BIT load: only the identity GEMM, 1 cycle per row, into a row
    initialised first (a fill, 1 cycle a row, PAD_ELEM_CYCLES)."""
    cfg = vta_ext.load_config("pynq")
    assert (cfg.PAD_ELEM_CYCLES, cfg.GEMM_CYCLES_PER_UOP) == (1, 1)
    size = OperatorSize("add", 0, 1568, 3136)
    assert serial_floor(cfg, size) == 196 * (1 + 1)


# ------------------------------------------------------------------------------ never above
@pytest.mark.parametrize("config,strategy", [  # default run: each strategy on one preset
    ("default", "stock"), ("pynq", "csp-relaxed"),
    *(pytest.param(c, s, marks=pytest.mark.slow) for c, s in [("pipelined", "stock"), ("pynq", "stock"),
                                                          ("default", "csp-relaxed"),
                                                          ("pipelined", "csp-relaxed")])])
def test_no_plan_beats_the_floor(config, strategy):
    """A 3-channel 7x7 s2 stem, a 3x3, a 1x1 s2, a thin-channel and a grouped conv: every
    efficiency in (0, 1]. A floor above the modelled cycles is a bug in one of them."""
    layers = [conv_module(1, 3, 32, 16, 7, 2, 3, "bias-shift-clip"),
              conv_module(1, 32, 14, 32, 3, 1, 1, "bias-shift-clip"),
              conv_module(1, 32, 14, 64, 1, 2, 0, "bias-shift-clip"),
              conv_module(1, 8, 20, 24, 3, 1, 1, "shift-clip"),
              conv_module(1, 64, 8, 64, 3, 1, 1, "bias-shift-clip", groups=4)]
    # and a residual add: csp-relaxed loads one operand by the compute module's LOAD ACC_8BIT and
    # the other by the load module's LOAD INP at once, while the store module writes
    if not (config == "pynq" and strategy == "stock"):   # (the stock add needs ACC_8BIT loads)
        layers.append(add_module(1, 64, 28))
    for mod in layers:
        p, report = built(mod, config, strategy)
        assert 0 < report.efficiency(p) <= 1, report.explain(0)
        assert report.floor(p).structural <= report.cycles(p), report.explain(0)


def test_pynq_memory_term_by_kind():
    """pynq moves each memory kind at its own rate and pays per DMA instruction and row (INP 8
    B/cycle + 9 + 19, WGT 4 + 5 + 15, ACC 8 + 10 + 19, OUT 8 + 4 + 14; no issue, overhead or
    latency). The dense layer of test_dense_floor_is_memory_bound: the input 512 B and the
    weights 51,200 B the cheaper way round, weights as INP (6,400 + 28) and input as WGT
    (128 + 20), not 64 + 28 + 12,800 + 20, on the load module: 6,576 cycles, the busiest master
    (the bias 400 B at the cheapest load kind, INP, 50 + 28, ACC would be 50 + 29, may go either
    way; the output 100 B as OUT, 12.5 + 18, on the store module)."""
    cfg = vta_ext.load_config("pynq")
    size = OperatorSize("dense", 51200, 100, 512, 51200, 100,
                        epilogue=(("bias",), ("shr", 6), ("clip", -128, 127)))
    assert operator_floor(cfg, size).memory == 6400 + 28 + 128 + 20


# ------------------------------------------------------------------------------ the API
def test_floor_parts_and_sums():
    a, b = Floor(100, 20, 50), Floor(10, 0, 300)
    assert (a.compute, a.total, a.bound) == (120, 120, "compute")
    assert (b.total, b.bound) == (300, "memory")
    s = a + b
    assert (s.compute_gemm, s.compute_alu, s.memory, s.total) == (110, 20, 350, 350)
    assert a.as_dict() == {"compute_gemm": 100, "compute_alu": 20, "memory": 50, "total": 120,
                           "bound": "compute", "serial": 0.0, "structural": 120}
    c = Floor(0, 20, 50, serial=40)
    assert (c.total, c.structural, (a + c).serial) == (50, 60, 40)
    assert "120 cycles, compute bound" in repr(a)
    assert efficiency(a, 240) == 0.5
    with pytest.raises(ValueError, match="cycles 0 must be positive"):
        efficiency(a, 0)


def test_operator_size_checks_its_fields():
    with pytest.raises(ValueError, match="kind 'softmax': no floor"):
        OperatorSize("softmax", 0, 16, 16)
    with pytest.raises(ValueError, match="macs 0 of a conv2d"):
        OperatorSize("conv2d", 0, 16, 16)
    # a clip without EXT_CLIP is MIN + MAX: the apache preset counts two passes for it
    size = OperatorSize("dense", 256 * 16, 16, 256, 256 * 16, 16,
                        epilogue=(("shr", 6), ("clip", -128, 127)))
    apache, default = vta_ext.load_config("apache"), vta_ext.load_config("default")
    assert not apache.EXT_CLIP and default.EXT_CLIP
    assert operator_floor(apache, size).compute_alu == 1 * 3 * apache.ALU_CYCLES_PER_UOP_IMM
    assert operator_floor(default, size).compute_alu == 1 * 2 * 5


# ------------------------------------------------------------------------------ the hardware
def test_the_dma_masters_overlap_on_the_rtl(rtl):
    """Why the memory term is the busiest master's, not a sum: on the RTL of the Pynq design a
    LOAD INP of 1,024 rows, a STORE of 1,024 rows and a LOAD ACC of 256 int32 rows, independent
    in one program, take no longer than the slowest of them alone (each module drives its own
    AXI master); the cycle model agrees within 1 %."""
    from vta_ext.isa import MemType
    from vta_ext.runtime import CommandQueue
    from vta_ext.sim.cycles import CycleModel

    cfg = vta_ext.load_config("pynq")

    def program(inp=0, out=0, acc=0):
        q = CommandQueue(cfg)
        bufs = {m: q.alloc(1 << 16, m) for m in ("inp", "acc", "out")}
        if inp:
            q.load_2d(bufs["inp"], 0, inp, 1, inp, 0, 0, 0, 0, 0, MemType.INP)
        if acc:
            q.load_2d(bufs["acc"], 0, acc, 1, acc, 0, 0, 0, 0, 0, MemType.ACC)
        if out:
            q.store_2d(0, MemType.OUT, bufs["out"], 0, out, 1, out)
        return q.synchronize()

    alone = [program(inp=1024), program(out=1024), program(acc=256)]
    together = program(inp=1024, out=1024, acc=256)
    rtl_alone = [rtl.run_program(p).cycles for p in alone]
    rtl_together = rtl.run_program(together).cycles
    assert min(rtl_alone) > 2000                       # each alone is DMA-bound ...
    assert rtl_together <= max(rtl_alone) + 50         # ... together no longer than the slowest
    assert rtl_together < 0.5 * sum(rtl_alone)
    model = CycleModel(cfg).run_program(together).total_cycles
    assert model == pytest.approx(rtl_together, rel=0.01)
