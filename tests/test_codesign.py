"""Co-design search (issue 19): the space, the area proxy, the lower bound, the search and its
front, records, Dask, bad input, and every front point rebuilt through the ordinary target.

References: the preset JSON files read directly, the co-design paper's unit areas and the Intel
paper's relative figures (written out here), brute-force Pareto dominance over the evaluated points,
hand-computed floors, the build report and run log of a plain ``relax.build`` for the point's
configuration, and the llvm build of the same module (bit for bit).
"""
from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import tvm
from tvm import relax

import vta_ext
from conftest import REPO, conv_module, random_inputs, run_module
from tvm_csp_embed import codesign, tune
from tvm_csp_embed.codesign.bound import lower_bound, matched_operators, operator_floor
from tvm_csp_embed.codesign.evaluate import Records, evaluate_config, save_module
from vta_ext.config import ConfigError, VTAConfig, load_config

CONFIGS = REPO / "vta_ext" / "configs"


def preset(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def tiny_space(**kw) -> codesign.Space:
    """32 points: two GEMM shapes, small/large INP and WGT, two bandwidths, both timings."""
    ranges = dict(log_batch=(0,), log_block_in=(4, 5), log_block_out=(4, 5), log_inp_buff=(13, 15),
                  log_wgt_buff=(16, 18), log_acc_buff=(17,), log_uop_buff=(15,),
                  mem_bytes_per_cycle=(8, 32), timing=("original", "pipelined"))
    ranges.update(kw)
    return codesign.Space(**ranges)


@pytest.fixture(scope="module")
def tiny_mod():
    return conv_module(1, 32, 32, 8, 3)


def explore_tiny(mod, tmp_path, runner=None, name="r", **kw):
    kw.setdefault("budget", 6)
    kw.setdefault("strategy", "stock")
    kw.setdefault("baseline", None)
    kw.setdefault("presets", ["default", "pipelined"])
    return codesign.explore(mod, kw.pop("space", tiny_space()), runner=runner or tune.LocalRunner(0),
                            records=tmp_path / f"{name}.jsonl", progress=False, seed=3, **kw)


# ------------------------------------------------------------------ the space
def test_space_sets_every_key_and_takes_timings_from_the_presets():
    space = codesign.Space(log_batch=(1,), log_block_in=(5,), log_block_out=(5,),
                           log_inp_buff=(14,), log_wgt_buff=(19,), log_acc_buff=(16,),
                           log_uop_buff=(14,), mem_bytes_per_cycle=(16,), timing=("pipelined",))
    (point,) = list(space.points())
    cfg = space.config(point)
    pipelined = preset("pipelined")
    assert (cfg.LOG_BATCH, cfg.LOG_BLOCK_IN, cfg.LOG_BLOCK_OUT) == (1, 5, 5)
    assert (cfg.LOG_INP_BUFF_SIZE, cfg.LOG_WGT_BUFF_SIZE, cfg.LOG_ACC_BUFF_SIZE,
            cfg.LOG_UOP_BUFF_SIZE) == (14, 19, 16, 14)
    assert cfg.MEM_BYTES_PER_CYCLE == 16 and cfg.BUS_WIDTH == 128  # bus tied: 8 bits per byte
    for key in ("GEMM_CYCLES_PER_UOP", "ALU_CYCLES_PER_UOP_IMM", "ALU_CYCLES_PER_UOP_VEC"):
        assert getattr(cfg, key) == pipelined[key]
    untied = codesign.Space(log_bus_width=(7, 9), mem_bytes_per_cycle=(8,), log_batch=(0,),
                            log_block_in=(4,), log_block_out=(4,), timing=("original",),
                            log_inp_buff=(15,), log_wgt_buff=(18,), log_acc_buff=(17,),
                            log_uop_buff=(15,))
    assert {space_cfg.BUS_WIDTH for space_cfg in map(untied.config, untied.points())} == {128, 512}
    assert codesign.Space().size == 2 * 2 * 3 * 4 * 3 * 2 * 3 * 2  # square blocks: 2 shapes


def test_neighbours_move_one_axis_one_step():
    space = tiny_space()
    point = next(iter(space.points()))
    values = space.values(point)
    for n in space.neighbours(point):
        diff = {k for k, v in space.values(n).items() if v != values[k]}
        assert diff in ({"log_block_in", "log_block_out"}, {"log_inp_buff"}, {"log_wgt_buff"},
                        {"mem_bytes_per_cycle"}, {"timing"})
    assert len(space.neighbours(point)) == 5  # the first point: one step up along each axis


def test_configurations_that_do_not_fit_are_rejected_naming_the_field(tmp_path, tiny_mod):
    # a 2^23-byte weight buffer of 16x16 blocks has 2^15 entries: the LOAD sram field overflows
    space = tiny_space(log_block_in=(4,), log_block_out=(4,), log_wgt_buff=(18, 23))
    valid, rejected = space.validate()
    assert len(valid) == len(rejected) == 8
    for point, why in rejected:
        assert space.values(point)["log_wgt_buff"] == 23
        with pytest.raises(ConfigError) as err:  # the configuration's own validation says so
            space.config(point)
        assert why == str(err.value) and "GEMM.wgt_factor_in" in why
    front = explore_tiny(tiny_mod, tmp_path, space=space, budget=20, presets=False)
    assert len(front.rejected) == 8
    assert all("GEMM.wgt_factor_in" in why for _, why in front.rejected)
    assert all(p.config.LOG_WGT_BUFF_SIZE == 18 for p in front.points)  # never evaluated
    assert len(front.points) + front.pruned <= 8


# ------------------------------------------------------------------ the area proxy
def test_area_proxy_of_default_by_hand():
    # the co-design paper's Table I: MAC 1239.5 um^2, 16-bit register 19.874, 16-bit SRAM word 6.806
    mac, reg_bit, sram_bit = 1239.5, 19.874 / 16, 6.806 / 16
    sram_bits = 8 * (2**15 + 2**18 + 2**17 + 2**15)  # INP, WGT, ACC, UOP of default
    bus = 64 * (128 * sram_bit + 4 * reg_bit)
    expected = mac * (256 + 16) + sram_bit * sram_bits + bus
    assert codesign.AREA_PROXY.area(load_config("default")) == pytest.approx(expected)
    assert codesign.area_proxy("default") == pytest.approx(1.0)


def test_area_proxy_matches_the_intel_paper_relative_figures():
    # "~4.9x fewer cycles with minimal area increase": pipelining costs little area
    extra = codesign.area_proxy("pipelined") - 1.0
    assert 0 < extra < 0.05
    # "scratchpad size is the main contributor to scaled area"
    terms = codesign.AREA_PROXY.breakdown(load_config("default"))
    assert terms["sram"] > terms["macs"] + terms["bus"] + terms["pipeline"]
    # its points span MAC shapes 4x4 to 6x6 (16x16 to 64x64 blocks), memory widths and
    # scratchpads: "scaled area varies by an order of magnitude", x12 for x11.5 fewer cycles.
    # The largest: 64x64 blocks, pipelined, 64 B/cycle, scratchpads of default's depths.
    big = VTAConfig.from_dict({**preset("pipelined"), "LOG_BLOCK_IN": 6, "LOG_BLOCK_OUT": 6,
                               "LOG_INP_BUFF_SIZE": 17, "LOG_WGT_BUFF_SIZE": 22,
                               "LOG_ACC_BUFF_SIZE": 19, "MEM_BYTES_PER_CYCLE": 64,
                               "LOG_BUS_WIDTH": 9}, name="big")
    assert (big.inp_depth, big.wgt_depth, big.acc_depth) == (2048, 1024, 2048)  # as default
    assert 8 <= codesign.area_proxy(big) <= 16
    assert "proxy" in repr(codesign.AREA_PROXY)


# ------------------------------------------------------------------ the lower bound
def test_lower_bound_is_the_floor_by_hand_and_below_the_cycles(tmp_path, tiny_mod):
    (op,) = matched_operators(tiny_mod, load_config("default"))
    macs = 32 * 8 * 8 * 32 * 9  # out elements x reduction
    assert op.kind == "conv2d" and op.macs == macs
    default = load_config("default")
    assert operator_floor(op, default) == math.ceil(macs / 256) * 4  # compute-bound
    wide = dataclasses_replace(default, MEM_BYTES_PER_CYCLE=1, GEMM_CYCLES_PER_UOP=1)
    assert operator_floor(op, wide) == 32 * 32 * 9  # weight bytes at 1 B/cycle
    path, _ = save_module(tiny_mod, tmp_path)
    for cfg in (default, load_config("pipelined"), load_config("1x32x32")):
        result = evaluate_config(str(path), cfg.to_dict(), cfg.name, "stock")
        assert result["error"] is None and result["cpu_macs"] == 0 and not result["cpu_ops"]
        assert lower_bound([op], cfg) <= result["cycles"] == result["vta_cycles"]


def test_an_evaluation_leaves_no_program_of_its_configuration_behind(tmp_path, tiny_mod):
    """A worker evaluates each configuration once: its compiled programs are released after, and
    the same figures come back when it is evaluated again (everything is rebuilt from the keys)."""
    from vta_ext import executor

    path, _ = save_module(tiny_mod, tmp_path)
    cfg = load_config("pipelined")
    first = evaluate_config(str(path), cfg.to_dict(), cfg.name, "csp-relaxed")
    held = [k for k in list(executor._COMPILED) + list(executor._CYCLES)
            if json.loads(k)["config_value"] == cfg.to_dict()]
    assert first["error"] is None and first["vta_ops"] == 1 and held == []
    again = evaluate_config(str(path), cfg.to_dict(), cfg.name, "csp-relaxed")
    assert (again["cycles"], again["dram_bytes"]) == (first["cycles"], first["dram_bytes"])


def dataclasses_replace(cfg, **kw):
    import dataclasses

    return dataclasses.replace(cfg, **kw)


# ------------------------------------------------------------------ the search and its front
@pytest.fixture(scope="module")
def stock_front(tiny_mod, tmp_path_factory):
    return explore_tiny(tiny_mod, tmp_path_factory.mktemp("front"), budget=8)


def test_front_is_the_pareto_set_of_the_evaluated_points(stock_front):
    front = stock_front
    points = front.points
    assert 0 < len(points) <= 8 and front.evaluated == len(points) + 2  # + the two presets
    for p in points:  # brute force
        dominated = any(q.cycles <= p.cycles and q.area <= p.area and
                        (q.cycles < p.cycles or q.area < p.area) for q in points)
        assert p.on_front == (not dominated)
        assert p.lower_bound <= p.cycles
    assert {p.config.name for p in front.presets} == {"default", "pipelined"}
    by_name = {p.config.name: p for p in front.presets}
    assert by_name["default"].area == pytest.approx(1.0)
    assert by_name["pipelined"].cycles < by_name["default"].cycles
    assert len({p.config for p in points}) == len(points)  # no configuration twice


def test_best_respects_the_area_budget(stock_front):
    front = stock_front
    budget = sorted(p.area for p in front.points)[len(front.points) // 2]
    best = front.best(area_budget=budget)
    assert best.area <= budget
    assert best.cycles == min(p.cycles for p in front.points if p.area <= budget)
    with pytest.raises(ValueError, match="area_budget=0.01.*smallest found"):
        front.best(area_budget=0.01)


def test_csv_plot_and_reprs(stock_front, tmp_path):
    front = stock_front
    text = front.to_csv(tmp_path / "front.csv")
    rows = text.strip().splitlines()
    assert len(rows) == 1 + len(front.points) + len(front.presets)
    assert "area_proxy" in rows[0] and (tmp_path / "front.csv").read_text() == text
    front.plot(tmp_path / "front.png")
    assert (tmp_path / "front.png").read_bytes()[:4] == b"\x89PNG"
    assert "area proxy" in repr(front.points[0]) and "proxy" in front.table()
    assert "evaluated" in repr(front)


def test_records_make_a_resumed_run_free(tiny_mod, tmp_path):
    first = explore_tiny(tiny_mod, tmp_path, budget=5)
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(lines) == first.evaluated  # one line per evaluation, as it arrived
    # a run killed while writing leaves a cut-off line; it is skipped, the others are kept
    (tmp_path / "r.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40])
    again = explore_tiny(tiny_mod, tmp_path, budget=5)
    assert again.evaluated == 1 and again.cached == first.evaluated - 1
    assert [(p.config, p.cycles) for p in again.points] == \
        [(p.config, p.cycles) for p in first.points]
    assert len(Records(tmp_path / "r.jsonl")) == first.evaluated


def test_dask_cluster_gives_the_same_front(tiny_mod, tmp_path, stock_front):
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster:
        runner = tune.DaskRunner(cluster.scheduler_address)
        try:
            front = explore_tiny(tiny_mod, tmp_path, runner=runner, name="dask", budget=8)
        finally:
            runner.close()
    assert front.evaluated == stock_front.evaluated and front.cached == 0
    assert [(p.config, p.cycles, p.on_front) for p in front.points] == \
        [(p.config, p.cycles, p.on_front) for p in stock_front.points]


@pytest.mark.slow  # two fresh worker processes import TVM: ~25 s
def test_local_workers_give_the_same_front(tiny_mod, tmp_path, stock_front):
    runner = tune.LocalRunner(n_parallel=2)
    try:
        front = explore_tiny(tiny_mod, tmp_path, runner=runner, name="local", budget=8)
    finally:
        runner.close()
    assert [(p.config, p.cycles, p.on_front) for p in front.points] == \
        [(p.config, p.cycles, p.on_front) for p in stock_front.points]


class WaveRunner(tune.LocalRunner):
    """In this process; records the GEMM shapes of each ``map`` call (one wave of jobs)."""

    def __init__(self):
        super().__init__(0)
        self.waves = []

    def map(self, fn, jobs, lost):
        self.waves.append([VTAConfig.from_dict(job[1]).BLOCK_IN for job in jobs])
        return super().map(fn, jobs, lost)


def test_a_new_gemm_shape_is_evaluated_once_before_its_other_configurations(tiny_mod, tmp_path):
    """Two workers on the same new GEMM shape at once would both solve its workloads: one
    configuration per new shape runs first, the others of the batch after it."""
    runner = WaveRunner()
    front = explore_tiny(tiny_mod, tmp_path, runner=runner, budget=8)
    first, *later = runner.waves
    assert sorted(first) == [16, 32]  # the first batch spans both shapes: one scout each
    assert sum(map(len, runner.waves)) == front.evaluated
    seen = set(first)
    for wave in later:  # after the scouts, no wave holds a shape not evaluated before
        assert set(wave) <= seen
        seen |= set(wave)


# ------------------------------------------------------------------ the caller's build options
ONE_POINT = dict(log_block_in=(4,), log_block_out=(4,), log_inp_buff=(15,), log_wgt_buff=(18,),
                 mem_bytes_per_cycle=(8,), timing=("original",))


def test_build_options_reach_every_evaluation(tiny_mod, tmp_path):
    """The options around explore apply in this process and on a Dask worker thread (which does
    not see the caller's context), and are part of the records key."""
    from distributed import LocalCluster

    run = dict(budget=1, space=tiny_space(**ONE_POINT), presets=False)
    (plain,) = explore_tiny(tiny_mod, tmp_path, **run).points
    with vta_ext.build_options(knobs="fallback"):
        here = explore_tiny(tiny_mod, tmp_path, **run)
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                          dashboard_address=None) as cluster:
            runner = tune.DaskRunner(cluster.scheduler_address)
            try:
                there = explore_tiny(tiny_mod, tmp_path, runner=runner, name="dask", **run)
            finally:
                runner.close()
    assert here.evaluated == 1 and here.cached == 0  # the default options' evaluation not reused
    assert there.evaluated == 1 and there.cached == 0
    (point,), (remote,) = here.points, there.points
    # the reference: a plain relax.build of the configuration under the same options
    with vta_ext.build_options(strategy="stock", knobs="fallback"):
        relax.build(tiny_mod, target=vta_ext.vta_target(point.config))
    assert point.vta_cycles == vta_ext.last_build_report().vta_cycles
    assert point.cycles != plain.cycles  # the fallback schedule is not the default knobs'
    assert (remote.config, remote.cycles, remote.dram_bytes) == \
        (point.config, point.cycles, point.dram_bytes)
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [line["options_value"]["knobs"] for line in lines] == ["cycles", "fallback"]


@pytest.mark.slow  # a fresh worker process imports TVM: ~15 s
def test_worker_processes_get_the_build_options(tiny_mod, tmp_path):
    run = dict(budget=1, space=tiny_space(**ONE_POINT), presets=False, strategy="csp-relaxed")
    (plain,) = explore_tiny(tiny_mod, tmp_path, name="plain", **run).points
    with vta_ext.build_options(objective="footprint", knobs="tps"):
        (here,) = explore_tiny(tiny_mod, tmp_path, name="here", **run).points
        runner = tune.LocalRunner(n_parallel=1)
        try:
            (there,) = explore_tiny(tiny_mod, tmp_path, runner=runner, name="there", **run).points
        finally:
            runner.close()
        relax.build(tiny_mod, target=vta_ext.vta_target(here.config))
    assert here.vta_cycles == vta_ext.last_build_report().vta_cycles
    assert here.cycles != plain.cycles
    assert (there.cycles, there.dram_bytes) == (here.cycles, here.dram_bytes)


# ------------------------------------------------------------------ bad input
def test_bad_input_gives_clear_errors(tiny_mod, tmp_path):
    with pytest.raises(ValueError, match="budget=0"):
        explore_tiny(tiny_mod, tmp_path, budget=0)
    with pytest.raises(ValueError, match="log_inp_buff is empty"):
        codesign.Space(log_inp_buff=())
    with pytest.raises(ValueError, match="none of the 2 configurations"):  # all overflow
        explore_tiny(tiny_mod, tmp_path, space=tiny_space(
            log_block_in=(4,), log_block_out=(4,), log_wgt_buff=(23,), log_inp_buff=(15,),
            mem_bytes_per_cycle=(8,)))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.add(x, x)))
    with pytest.raises(ValueError, match="matches no operator"):
        explore_tiny(bb.get(), tmp_path)
    assert not list(tmp_path.glob("*.jsonl"))  # nothing was evaluated or recorded


def test_unreachable_dask_scheduler_fails_fast_naming_the_address():
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match="tcp://127.0.0.1:9"):
        tune.DaskRunner("tcp://127.0.0.1:9", timeout=2)
    assert time.perf_counter() - start < 20


# ------------------------------------------------------------------ every front point is real
def check_front_point(mod, point, strategy: str) -> None:
    arrays = random_inputs(mod, seed=7)
    with vta_ext.build_options(strategy=strategy):
        executable = relax.build(mod, target=vta_ext.vta_target(point.config))
    report = vta_ext.last_build_report()
    vta_ext.clear_run_log()
    out = relax.VirtualMachine(executable, tvm.cpu())["main"](
        *[tvm.runtime.tensor(a) for a in arrays])
    out = out.numpy() if hasattr(out, "numpy") else [o.numpy() for o in out]
    np.testing.assert_array_equal(out, run_module(mod, "llvm", arrays))
    runs = vta_ext.run_log()
    assert runs and all(json.loads(r.key)["config_value"] == point.config.to_dict() for r in runs)
    # the cycles the search reported are the cycles of the programs that ran
    assert sum(r.cycles.total_cycles for r in runs) == point.vta_cycles == report.vta_cycles


def test_front_points_rebuild_through_the_target_bit_exact(tiny_mod, tmp_path):
    front = explore_tiny(tiny_mod, tmp_path, strategy="csp-relaxed", budget=4,
                         space=tiny_space(log_block_in=(4,), log_block_out=(4,)))
    assert front.front
    for point in front.front:
        check_front_point(tiny_mod, point, "csp-relaxed")


@pytest.mark.slow
def test_csp_front_of_a_conv_chain_rebuilds_and_meets_the_stock_front(tmp_path):
    from conftest import conv_chain

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 28, 28), "int8"))
    rng = np.random.default_rng(0)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for cin, cout in ((3, 32), (32, 64), (64, 64)):
                w = relax.const(rng.integers(-128, 128, (cout, cin, 3, 3)).astype("int8"))
                b = relax.const(rng.integers(-999, 999, (1, cout, 1, 1)).astype("int32"))
                y = conv_chain(bb, y, w, b, padding=1, shift=9, clip=(0, 127))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    front = explore_tiny(mod, tmp_path, strategy="csp-relaxed", baseline="stock", budget=12,
                         presets=True)
    for point in front.front:
        check_front_point(mod, point, "csp-relaxed")
    # csp-relaxed never loses to stock on a configuration both evaluated
    stock = {p.config: p.cycles for p in front.baseline.points}
    for p in front.points:
        if p.config in stock:
            assert p.cycles <= stock[p.config]
