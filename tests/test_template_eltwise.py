"""Residual add template (vta_ext.templates.eltwise) against a numpy reference."""
import numpy as np
import pytest

from conftest import apply_epilogue, pack_activation as pack, unpack_nchw as unpack
from vta_ext.config import load_config
from vta_ext.isa import AluOp, Opcode
from vta_ext.errors import TemplateRefusal
from vta_ext.sim.cycles import CycleModel
from vta_ext.templates.eltwise import EltwiseWorkload, build_add
from vta_ext.templates.errors import AluTemplateError, AluTemplateRefusal, KnobError


def ref_add(a, b, epilogue):
    acc = a.astype(np.int64) + b.astype(np.int64)
    return apply_epilogue(acc, epilogue)


@pytest.mark.parametrize("preset", ["default", "apache", "pipelined", "2x16x16", "1x32x32"])
@pytest.mark.parametrize("n,c,hw,knobs", [
    (1, 32, 7, None),
    (2, 64, 5, dict(tile=37)),            # several tiles, last one short
    (1, 32, 6, dict(tile=16, slots=1)),
])
@pytest.mark.parametrize("epilogue", [(), (("shr", 1), ("clip", -128, 127)),
                                      (("clip", 0, 127),), (("add", -5), ("min", 100), ("max", -90))])
def test_add(preset, n, c, hw, knobs, epilogue):
    cfg = load_config(preset)
    n = max(n, cfg.BATCH)
    rng = np.random.default_rng(n * c + hw)
    a = rng.integers(-128, 128, (n, c, hw, hw)).astype(np.int8)
    b = rng.integers(-128, 128, (n, c, hw, hw)).astype(np.int8)
    op = build_add(cfg, EltwiseWorkload(n, c, hw, hw), epilogue, knobs)
    got, _ = op.run(pack(a, cfg), pack(b, cfg))
    again, _ = op.run(pack(a, cfg), pack(b, cfg))
    np.testing.assert_array_equal(got, again)
    np.testing.assert_array_equal(unpack(got), ref_add(a, b, epilogue))
    if knobs:
        assert op.info["tiles"] >= 3
    if any(st[0] == "clip" for st in epilogue):
        alu_ops = [i.alu_opcode for i in op.program.insns if i.opcode == Opcode.ALU]
        assert (AluOp.CLIP in alu_ops) == cfg.EXT_CLIP


def test_boundary_values():
    cfg = load_config("default")
    a = np.broadcast_to(np.array([-128, -128, 127, 127, -1, 0], np.int8), (1, 16, 4, 6)).copy()
    b = np.broadcast_to(np.array([-128, 127, 127, -128, 1, -128], np.int8), (1, 16, 4, 6)).copy()
    for ep in ((), (("clip", -128, 127),), (("shr", 1),)):
        got, _ = build_add(cfg, EltwiseWorkload(1, 16, 4, 6), ep).run(pack(a, cfg), pack(b, cfg))
        np.testing.assert_array_equal(unpack(got), ref_add(a, b, ep))


def test_errors():
    """Workloads the template does not implement are refusals; bad knobs are knob errors; packed
    inputs of the wrong shape are a usage error."""
    for config, wl, ep, match in (("default", EltwiseWorkload(1, 8, 4, 4), (), "BLOCK_OUT"),
                                  ("2x16x16", EltwiseWorkload(1, 16, 4, 4), (), "BATCH"),
                                  ("default", EltwiseWorkload(1, 16, 4, 4), (("bias",),), "bias")):
        with pytest.raises(AluTemplateRefusal, match=match) as err:
            build_add(config, wl, ep)
        assert isinstance(err.value, TemplateRefusal)
    # 3 regions (2 output slots + the second operand) of 1000 rows > the 2048-entry accumulator
    with pytest.raises(KnobError, match="accumulator.*valid tile: 1..682"):
        build_add("default", EltwiseWorkload(1, 16, 40, 40), knobs=dict(tile=1000))
    with pytest.raises(KnobError, match="tile=0 must be an integer >= 1"):
        build_add("default", EltwiseWorkload(1, 16, 40, 40), knobs={"tile": 0})
    op = build_add("default", EltwiseWorkload(1, 16, 4, 4))
    with pytest.raises(AluTemplateError, match="shape"):
        op.run(np.zeros((1, 1, 4, 4, 1, 16), np.int8), np.zeros((1, 1, 4, 5, 1, 16), np.int8))


@pytest.mark.parametrize("preset,path", [("pipelined", "split"), ("pipelined", "gemm"),
                                         ("default", "split"), ("pynq", "gemm")])
@pytest.mark.parametrize("c,hw", [(384, 4), (64, 14)])
def test_cycles_tile_timed(preset, path, c, hw):
    """The ``"cycles"`` knobs of an identity-GEMM add: bit-exact against numpy, and no slower on
    the cycle model than any tile of a hand-listed set (the largest that fits, i.e. the default
    knobs, and every power of two from 8 up); on these small adds the largest tile is one or two
    tiles and strictly slower."""
    from vta_ext.sim.cycles import CycleModel

    cfg = load_config(preset)
    wl = EltwiseWorkload(1, c, hw, hw)
    ep = (("shr", 1), ("clip", -128, 127))
    rng = np.random.default_rng(c + hw)
    a = rng.integers(-128, 128, (1, c, hw, hw)).astype(np.int8)
    b = rng.integers(-128, 128, (1, c, hw, hw)).astype(np.int8)
    op = build_add(cfg, wl, ep, "cycles", input_path=path)
    got, _ = op.run(pack(a, cfg), pack(b, cfg))
    np.testing.assert_array_equal(unpack(got), ref_add(a, b, ep))

    def cycles(knobs):
        prog = build_add(cfg, wl, ep, knobs, input_path=path).program
        return CycleModel(cfg).run_program(prog).total_cycles
    chosen = cycles(dict(tile=op.info["tile"]))
    largest = cycles(None)
    assert chosen < largest
    for tile in (8, 16, 32, 64, 128):
        assert chosen <= cycles(dict(tile=tile)) * 1.05, tile   # halvings need not hit every power
    if path == "split":     # (a config with LOAD ACC_8BIT) the acc8 path, the stock program,
        # keeps the largest tile under "cycles"
        assert build_add(cfg, wl, ep, "cycles").info["tile"] == build_add(cfg, wl, ep).info["tile"]


def test_an_add_of_many_tiles_keeps_its_largest_tile_untimed(monkeypatch):
    """An add whose largest tile's half would make more than ``MAX_TIMED_TILES`` tiles has no
    second candidate: the ``"cycles"`` knobs keep the default tile and time nothing (a
    1x256x56x56 add: 50,176 accumulator rows, at most 1,024 a tile: 49 tiles, 98 at 512)."""
    from vta_ext.sim import cycles as cycles_module
    from vta_ext.templates import eltwise

    cfg = load_config("pipelined")
    wl = EltwiseWorkload(1, 256, 56, 56)
    ep = (("shr", 1), ("clip", -128, 127))
    default_tile = build_add(cfg, wl, ep, input_path="split").info["tile"]
    assert -(-50_176 // (default_tile // 2)) > eltwise.MAX_TIMED_TILES
    monkeypatch.setattr(cycles_module.CycleModel, "run_program",
                        lambda *a, **k: pytest.fail("a large add must not be timed"))
    assert build_add(cfg, wl, ep, "cycles", input_path="split").info["tile"] == default_tile


@pytest.mark.parametrize("preset,path", [("pipelined", "split"), ("default", "gemm")])
def test_cycles_add_is_its_timed_build(monkeypatch, preset, path):
    """The ``"cycles"`` add returns the program it timed for the winning tile: the same
    instructions and DRAM image as a fresh build with that tile, and each candidate tile built
    once (no second build of the winner)."""
    from vta_ext.isa import encode_stream
    from vta_ext.templates import eltwise

    cfg = load_config(preset)
    wl = EltwiseWorkload(1, 384, 4, 4)
    ep = (("shr", 3), ("clip", -100, 90))
    tiles = eltwise.tile_candidates(cfg, 384 // cfg.BLOCK_OUT * 16, 1 if path == "split" else 2)
    assert len(tiles) > 1
    queues = []

    class Counted(eltwise.CommandQueue):
        def __init__(self, *args, **kwargs):
            queues.append(1)
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(eltwise, "CommandQueue", Counted)
    op = build_add(cfg, wl, ep, "cycles", input_path=path)
    assert len(queues) == len(tiles)       # one program per candidate tile, none after
    fresh = build_add(cfg, wl, ep, dict(tile=op.info["tile"]), input_path=path)
    assert encode_stream(cfg, op.program.insns) == encode_stream(cfg, fresh.program.insns)
    np.testing.assert_array_equal(op.program.dram, fresh.program.dram)
    assert {k: v for k, v in op.info.items() if k != "tiling"} == fresh.info
    # the report names the timed tiles: the winner first, with the cycles the model gives it
    cycles = CycleModel(cfg).run_program(fresh.program).total_cycles
    assert op.info["tiling"].startswith(f"tile={op.info['tile']}, the fastest of {len(tiles)} "
                                        f"timed tiles ({cycles:,} cycles")


@pytest.mark.parametrize("preset,c,hw,ep,per_row", [
    # per padded accumulator row on the compute module: the first operand in by LOAD ACC_8BIT
    # (16 int8 at the bus's 8 B/cycle: 2), the second by one identity-GEMM micro-op
    # (GEMM_CYCLES_PER_UOP), then each epilogue pass (ALU_CYCLES_PER_UOP_IMM)
    ("pipelined", 80, 56, (("clip", 0, 127),), 2 + 1 + 1),
    ("pipelined", 64, 56, (("shr", 1), ("clip", -128, 127)), 2 + 1 + 1 + 1),
    ("default", 64, 56, (("clip", 0, 127),), 2 + 4 + 5),
])
def test_add_runs_at_its_structural_floor(preset, c, hw, ep, per_row):
    """The add's cycles go to the compute module's serial work, not to a lack of overlap:
    the fastest input path with the ``"cycles"`` knobs (csp-relaxed's choice) is within 2 % of
    the hand count of its padded rows, which is also the padded operator's
    ``Floor.structural`` (:func:`vta_ext.floor.serial_floor`: the first operand must enter the
    accumulator through the compute module), i.e. about twice ``Floor.total`` on ``pipelined``:
    the efficiency of 0.5 there is structural (docs/efficiency.md)."""
    from vta_ext.floor import OperatorSize, operator_floor
    from vta_ext.sim.cycles import CycleModel

    cfg = load_config(preset)
    rows = c // cfg.BLOCK_OUT * hw * hw
    n = c * hw * hw
    floor = operator_floor(cfg, OperatorSize("add", 0, n, 2 * n, epilogue=ep))
    assert floor.structural == rows * per_row
    best = min(CycleModel(cfg).run_program(
        build_add(cfg, EltwiseWorkload(1, c, hw, hw), ep, "cycles", input_path=p).program
    ).total_cycles for p in ("acc8", "gemm", "split"))
    assert rows * per_row <= best <= 1.02 * rows * per_row


def test_pynq_gemm_add_keeps_the_hazard_contract_without_unrolling(rtl):
    """On ``pynq`` (accumulator hazard distance 3) the identity-GEMM add's sum is one GEMM
    micro-op over (operand, row) loops, not a micro-op list of two a row: no GEMM of a tile of
    ``t >= 3`` rows has more than one micro-op (two a row would write each row twice in a row
    and need the cure's unrolled list, 2*t micro-ops loaded per output slot); tiles of 37 rows
    and a last tile of 2 rows (there the runtime's cure applies), bit-exact against numpy on the
    functional simulator and on the RTL of the Pynq design."""
    import vta_ext
    from vta_ext.hazard import program_violations

    cfg = load_config("pynq")
    ep = (("shr", 1), ("clip", 0, 127))
    rng = np.random.default_rng(37)
    a = rng.integers(-128, 128, (1, 32, 6, 6)).astype(np.int8)   # 72 rows: 37 + 35
    b = rng.integers(-128, 128, (1, 32, 6, 6)).astype(np.int8)
    a2 = rng.integers(-128, 128, (1, 16, 6, 5)).astype(np.int8)  # 30 rows: 28 + 2
    b2 = rng.integers(-128, 128, (1, 16, 6, 5)).astype(np.int8)
    for (x, y), tile in (((a, b), 37), ((a2, b2), 28)):
        op = build_add(cfg, EltwiseWorkload(*x.shape), ep, dict(tile=tile), input_path="gemm")
        assert op.info["tiles"] == 2
        assert not program_violations(op.program)
        gemms = [i for i in op.program.insns if i.opcode == Opcode.GEMM and not i.reset_reg]
        assert max(i.uop_end - i.uop_bgn for i in gemms) <= 2
        big = [i for i in gemms if i.iter_out * i.iter_in * (i.uop_end - i.uop_bgn) >= 2 * 3]
        assert big and all(i.uop_end - i.uop_bgn == 1 for i in big)
        packed = (pack(x, cfg), pack(y, cfg))
        np.testing.assert_array_equal(unpack(op.run(*packed)[0]), ref_add(x, y, ep))
        with vta_ext.run_on(rtl):
            np.testing.assert_array_equal(unpack(op.run(*packed)[0]), ref_add(x, y, ep))
