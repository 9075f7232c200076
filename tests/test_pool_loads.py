"""A pool's window loads as few DMA rows as the data allow, and an average pool with more window
elements than outputs loops its GEMM over the window (vta_ext.templates.pool.window_loads,
_tap_sums): bit-exact against numpy, and the load module's cycles counted by hand.

Every DMA row costs ``DMA_OVERHEAD_CYCLES`` (4 on ``default`` and ``pipelined``) besides its bytes
(8 a cycle) and the instruction's issue (1): rows that follow each other in DRAM and in the
on-chip window go as one.
"""
import numpy as np
import pytest

from conftest import pack_activation as pack, unpack_nchw as unpack
from test_template_pool import ref_pool
from vta_ext.config import load_config
from vta_ext.isa import GemmInsn, MemInsn, MemType, Opcode
from vta_ext.offload.rewrite import _tiling_text
from vta_ext.sim.cycles import CycleModel
from vta_ext.templates.pool import PoolWorkload, build_avg_pool2d, build_max_pool2d, window_loads


def test_window_loads_by_hand():
    # padded: one 2-D load per channel block
    assert window_loads(3, 5, 7, 1, 0, 9, 45) == [(0, 1, 7, 5), (1, 1, 7, 5), (2, 1, 7, 5)]
    assert window_loads(2, 5, 7, 0, 1, 9, 42) == [(0, 1, 7, 5), (1, 1, 7, 5)]
    # part of the plane, unpadded: one row of 5 * 7 per block
    assert window_loads(2, 5, 7, 0, 0, 9, 35) == [(0, 1, 35, 1), (1, 1, 35, 1)]
    # the whole 6x6 plane of 4 blocks: one row of 4 * 36
    assert window_loads(4, 6, 6, 0, 0, 6, 36) == [(0, 4, 144, 1)]
    # whole planes of 128x128 (16,384 elements): 3 to a row under the 16-bit size field
    assert window_loads(7, 128, 128, 0, 0, 128, 128 * 128) == \
        [(0, 3, 3 * 16384, 1), (3, 3, 3 * 16384, 1), (6, 1, 16384, 1)]
    # a row of more than 65,535 elements stays 2-D
    assert window_loads(1, 300, 300, 0, 0, 300, 90000) == [(0, 1, 300, 300)]


CASES = [  # (channels, hw, pool, stride, knobs): whole planes, several tiles, taps > outputs
    (48, 6, 6, 1, None), (48, 6, 6, 1, dict(tile_c=2)), (32, 8, 7, 1, None),
    (32, 9, 3, 2, dict(tile_h=2)), (64, 13, 3, 2, dict(tile_c=3)), (48, 6, 6, 1, "cycles"),
    (64, 13, 3, 2, "cycles")]


@pytest.mark.parametrize("preset", ["default", "pipelined"])
@pytest.mark.parametrize("path", ["acc8", "gemm"])
@pytest.mark.parametrize("c,hw,k,s,knobs", CASES)
def test_pools_bit_exact(preset, path, c, hw, k, s, knobs):
    cfg = load_config(preset)
    wl = PoolWorkload(1, c, hw, hw, k, k, s, s, 0, 0)
    x = np.random.default_rng(c + hw + k).integers(-128, 128, (1, c, hw, hw)).astype(np.int8)
    for mode, build in (("avg", build_avg_pool2d), ("max", build_max_pool2d)):
        op = build(cfg, wl, (), knobs, input_path=path, lean=True)
        np.testing.assert_array_equal(unpack(op.run(pack(x, cfg))[0]), ref_pool(x, wl, mode),
                                      err_msg=f"{mode} {path} {knobs}")


def test_global_pool_loads_and_micro_ops_by_hand():
    """squeezenet1_1's 1x1008x6x6 global average pool (1000 channels padded) on ``pipelined``,
    gemm path, tile_c 28 (3 tiles: 28, 28, 7 blocks): one LOAD INP per tile of one row, 36,288 B
    in all: 4,536 cycles + 3 x (1 + 4); the identity tile, 256 B: 32 + 5. Was 63 loads of 6 rows
    (+ 63 x 1 + 378 x 4 = 1,575 cycles). Its sums: one micro-op per block over the 36 taps."""
    cfg = load_config("pipelined")
    wl = PoolWorkload(1, 1008, 6, 6, 6, 6, 1, 1, 0, 0)
    op = build_avg_pool2d(cfg, wl, (), dict(tile_c=28), input_path="gemm", lean=True)
    loads = [i for i in op.program.insns if isinstance(i, MemInsn) and i.x_size
             and i.opcode == Opcode.LOAD and i.memory_type in (MemType.INP, MemType.WGT)]
    assert [(i.y_size, i.x_size) for i in loads if i.memory_type == MemType.INP] == \
        [(1, 28 * 36), (1, 28 * 36), (1, 7 * 36)]
    report = CycleModel(cfg, record_timeline=True).run_program(op.program)
    busy = sum(e - s for m, s, e, what in report.timeline if m == "load" and what == "load")
    assert busy == 36288 / 8 + 3 * (1 + 4) + 256 / 8 + (1 + 4)
    sums = [i for i in op.program.insns if isinstance(i, GemmInsn) and not i.reset_reg]
    assert [(i.uop_end - i.uop_bgn, i.iter_out, i.iter_in) for i in sums] == \
        [(28, 6, 6), (28, 6, 6), (7, 6, 6)]


@pytest.mark.parametrize("preset", ["default", "pipelined"])
def test_cycles_policy_times_channel_tiles(preset):
    """On the gemm path with whole planes a tile, the ``"cycles"`` policy times the largest
    tile and its tile_c halvings: squeezenet1_1's global pool takes a smaller tile, and no
    fewer cycles than the largest (28 blocks a tile, 3 tiles) is left on the table."""
    cfg = load_config(preset)
    wl = PoolWorkload(1, 1008, 6, 6, 6, 6, 1, 1, 0, 0)
    cycles = {}
    for tile_c in (28, 14, 7, 3, 1):
        op = build_avg_pool2d(cfg, wl, (), dict(tile_c=tile_c), input_path="gemm", lean=True)
        cycles[tile_c] = CycleModel(cfg).run_program(op.program).total_cycles
    chosen = build_avg_pool2d(cfg, wl, (), "cycles", input_path="gemm", lean=True)
    best = min(cycles, key=lambda t: (cycles[t], -t))
    assert chosen.info["tile_c"] == best < 28
    assert CycleModel(cfg).run_program(chosen.program).total_cycles == min(cycles.values())
    # the build report says which tiles were timed and what each took
    text = _tiling_text(chosen)
    assert text.startswith(f", tiling tile_c={best}, the fastest of 5 timed tiles "
                           f"({cycles[best]:,} cycles; ")
    assert all(f"tile_c={t}: {c:,}" in text for t, c in cycles.items() if t != best)


def test_untimed_pool_tile_says_why():
    """Where a tile splits the output planes the largest tile is built untimed, and the report's
    tiling words say so: the 1x64x55x55 3x3 s2 max pool of squeezenet1_1 at 112 on `pipelined`
    holds fewer than its 27 output rows a tile."""
    cfg = load_config("pipelined")
    wl = PoolWorkload(1, 64, 55, 55, 3, 3, 2, 2, 0, 0)
    op = build_max_pool2d(cfg, wl, (), "cycles", input_path="gemm", lean=True)
    th = op.info["tile_h"]
    assert th < 27
    assert _tiling_text(op) == (f", tiling tile_h={th} tile_c={op.info['tile_c']}, the largest "
                                f"tile, untimed: a tile holds {th} of 27 output rows")


def test_whole_planes_one_load_lean_only():
    """1x32x13x13 3x3 s2, one tile: the window is both blocks' whole planes, 2 x 169 rows that
    follow each other in DRAM and in the window: with ``lean`` one LOAD of one row (ACC_8BIT, or
    INP on the gemm path); the stock program (not lean) keeps one 13-row LOAD per block. The
    13x13 global average pool's sums: 2 x 169 iterations from 2 micro-ops (one per block looping
    over the 13 x 13 window) instead of 338."""
    wl = PoolWorkload(1, 32, 13, 13, 3, 3, 2, 2, 0, 0)

    def loads(program, kind):
        return [(i.y_size, i.x_size) for i in program.insns if isinstance(i, MemInsn)
                and i.x_size and i.opcode == Opcode.LOAD and i.memory_type == kind]
    for path, kind in (("acc8", MemType.ACC_8BIT), ("gemm", MemType.INP)):
        lean = build_max_pool2d("pipelined", wl, (), None, input_path=path, lean=True).program
        stock = build_max_pool2d("pipelined", wl, (), None, input_path=path).program
        assert loads(lean, kind) == [(1, 2 * 169)], path
        assert loads(stock, kind) == [(13, 13), (13, 13)], path
    glob = PoolWorkload(1, 32, 13, 13, 13, 13, 1, 1, 0, 0)
    gemm = build_avg_pool2d("pipelined", glob, (), None, input_path="gemm", lean=True).program
    (sums,) = [i for i in gemm.insns if isinstance(i, GemmInsn) and not i.reset_reg]
    assert (sums.uop_end - sums.uop_bgn, sums.iter_out, sums.iter_in) == (2, 13, 13)


@pytest.mark.parametrize("schedule,hw", [("direct", 13), ("inplace", 13), ("inplace", 27)])
def test_merged_window_loads_on_the_rtl(schedule, hw, rtl):
    """``pynq`` (GEMM input path only): the lean max pool's merged LOAD INP rows (whole planes
    of the 13x13 input; one row per block of the 27x27 input's tiles) bit-exact on the
    functional simulator and on the RTL of the Pynq design."""
    import vta_ext

    cfg = load_config("pynq")
    wl = PoolWorkload(1, 32, hw, hw, 3, 3, 2, 2, 0, 0)
    x = np.random.default_rng(hw).integers(-128, 128, (1, 32, hw, hw)).astype(np.int8)
    op = build_max_pool2d(cfg, wl, (), None, schedule=schedule, input_path="gemm", lean=True)
    assert all(i.y_size == 1 for i in op.program.insns if isinstance(i, MemInsn) and i.x_size
               and i.opcode == Opcode.LOAD and i.memory_type == MemType.INP)
    np.testing.assert_array_equal(unpack(op.run(pack(x, cfg))[0]), ref_pool(x, wl, "max"))
    with vta_ext.run_on(rtl):
        np.testing.assert_array_equal(unpack(op.run(pack(x, cfg))[0]), ref_pool(x, wl, "max"))
