"""The tuner (tvm_csp_embed.tune): knob spaces through the strategy interface, tasks, tuners,
records, apply_history_best and bad input.

The tasks are small (a 128 -> 64 dense layer, 28 valid points) so that whole spaces are measured
in seconds, in this process (``LocalRunner(0)``); worker processes and Dask are in
``test_tune_parallel.py``. Expected values are hand-derived (space sizes from the divisors of the
axes) or come from independent measurements (each point measured on its own).
"""
from __future__ import annotations

import json
import logging
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

import vta_ext
from vta_ext.config import VTAConfig, load_config
from vta_ext.strategy import get_template

from conftest import conv_module
from test_tune_helpers import DENSE, EPILOGUE, WRONG
from tvm_csp_embed import tune
from tvm_csp_embed.tune.measure import measure_point
from tvm_csp_embed.tune.records import RecordWarning

LOCAL = tune.measure_option(runner=tune.LocalRunner(0))


def dense_task(strategy: str = "stock", config: str = "default") -> tune.Task:
    return tune.Task.create("dense", DENSE, EPILOGUE, strategy=strategy, config=config)


def lines(path):
    return [json.loads(line) for line in open(path) if line.strip()]


# ------------------------------------------------------------------ knob spaces
def test_knob_space_of_dense_counts_every_point_once():
    space = dense_task().knob_space
    # tile_b in div(1), tile_ci in div(128/16=8) (4 values), tile_co in div(64/16=4) (3 values),
    # oc_nthread in {1, 2}: 24 points, plus the 12 two-thread points with reuse=True: 36
    assert len(space.points) + len(space.pruned) == 36
    # pruned: oc_nthread=2 with tile_co=4 leaves one output tile, which two threads cannot split
    assert len(space.pruned) == 8
    assert all(p["oc_nthread"] == 2 and p["tile_co"] == 4 for p, _ in space.pruned)
    assert all("oc_nthread" in reason for _, reason in space.pruned)
    assert space.names == ("tile_b", "tile_ci", "tile_co", "oc_nthread", "reuse")
    assert space.fallback == {"tile_b": 1, "tile_ci": 1, "tile_co": 1, "oc_nthread": 1,
                              "reuse": False}
    assert space.tps in space and space.fallback in space
    assert len({json.dumps(p, sort_keys=True) for p in space.points}) == len(space.points)


def test_knob_space_of_conv2d_and_templates_without_knobs():
    cfg = load_config("default")
    conv = get_template("conv2d", "stock")
    wl = conv.workload_from_dict(dict(batch=1, height=8, width=8, in_channels=32, out_channels=32,
                                      kernel_h=3, kernel_w=3, pad_h=1, pad_w=1, stride_h=1,
                                      stride_w=1))
    space = conv.knob_space(cfg, wl, EPILOGUE)
    # div(8) = 4 values for tile_h and tile_w, div(2) = 2 for tile_ci and tile_co, 4 thread pairs:
    # 256 points, plus 2 x 64 two-thread points with reuse
    assert len(space.points) + len(space.pruned) == 256 + 128
    assert all(reason for _, reason in space.pruned)
    pool = get_template("max_pool2d", "stock")
    assert len(pool.knob_space(cfg, None, ())) == 0 and not pool.knob_space(cfg, None, ()).names


def test_a_pruned_point_does_not_build():
    """A point pruned for its scratchpad footprint fails in the lowering too (independent check)."""
    cfg = load_config("default")
    conv = get_template("conv2d", "stock")
    wl = conv.workload_from_dict(dict(batch=1, height=48, width=48, in_channels=16,
                                      out_channels=16, kernel_h=3, kernel_w=3, pad_h=1, pad_w=1,
                                      stride_h=1, stride_w=1))
    space = conv.knob_space(cfg, wl, EPILOGUE)
    big = min((p for p, reason in space.pruned if "inp scratchpad" in reason),
              key=lambda p: p["tile_h"] * p["tile_w"] * p["tile_ci"] * p["tile_co"])
    with pytest.raises(Exception, match="inp|input"):
        conv.build(cfg, wl, EPILOGUE, big)


# ------------------------------------------------------------------ tasks
def two_conv_module():
    """conv A, conv A' (same shape, other shift), conv B, then a float add (stays on the CPU)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "int8"))
    w1 = relax.Var("w1", relax.TensorType((16, 16, 3, 3), "int8"))
    w2 = relax.Var("w2", relax.TensorType((16, 16, 3, 3), "int8"))
    w3 = relax.Var("w3", relax.TensorType((32, 16, 1, 1), "int8"))

    def conv(y, w, shift, pad):
        y = bb.emit(relax.op.nn.conv2d(y, w, padding=pad, out_dtype="int32"))
        y = bb.emit(relax.op.right_shift(y, relax.const(shift, "int32")))
        y = bb.emit(relax.op.clip(y, -128, 127))
        return bb.emit(relax.op.astype(y, "int8"))

    with bb.function("main", [x, w1, w2, w3]):
        with bb.dataflow():
            y = conv(x, w1, 6, 1)
            y = conv(y, w2, 7, 1)
            y = conv(y, w3, 5, 0)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def test_extract_tasks_one_per_distinct_workload():
    tasks = tune.extract_tasks(two_conv_module(), target="ext_vta", strategy="stock")
    assert [t.kind for t in tasks] == ["conv2d", "conv2d"]
    assert [t.count for t in tasks] == [2, 1]
    assert tasks[0].workload_dict["kernel_h"] == 3 and tasks[1].workload_dict["out_channels"] == 32
    assert tasks[0].config.name == "default" and tasks[0].strategy == "stock"
    assert "conv2d 1x16x8x8 -> 16 k3x3 s1 p1" in repr(tasks[0])
    piped = tune.extract_tasks(two_conv_module(), target=vta_ext.vta_target("pipelined"),
                               strategy="stock")
    assert piped[0].config.name == "pipelined"


def test_extract_tasks_of_a_model_with_nothing_offloadable_warns(caplog):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(out)
    with caplog.at_level(logging.WARNING, logger="tvm_csp_embed.tune"):
        assert tune.extract_tasks(bb.get()) == []
    assert "nothing to tune" in caplog.text


# ------------------------------------------------------------------ tuning
@pytest.fixture(scope="module")
def exhaustive():
    """Cycles of every valid point of the dense task, each measured on its own."""
    task = dense_task()
    return {json.dumps(p, sort_keys=True): measure_point(task.spec(), p).cycles
            for p in task.knob_space.points}


def test_grid_search_stops_at_the_space_size(tmp_path, caplog, exhaustive):
    task = dense_task()
    path = tmp_path / "grid.json"
    with caplog.at_level(logging.WARNING, logger="tvm_csp_embed.tune"):
        best = tune.GridSearchTuner(task).tune(1000, LOCAL,
                                               callbacks=[tune.callback.log_to_file(path)])
    assert "larger than the knob space" in caplog.text
    records = lines(path)
    measured = [r for r in records if not r["verified"]]
    assert len(measured) == 28 == len(exhaustive)
    assert best.verified and best.cycles == min(exhaustive.values())
    assert [r for r in records if r["verified"]] == [records[-1]]
    assert records[-1]["knobs"] == best.knobs and records[-1]["config_hash"] == \
        vta_ext.executor.config_digest(load_config("default"))


def test_xgb_is_seeded_with_tps_and_deterministic(exhaustive):
    task = dense_task()
    runs = []
    for _ in range(2):
        tuner = tune.XGBTuner(task, seed=3, batch_size=4)
        tuner.tune(8, tune.measure_option(runner=tune.LocalRunner(0), verify=False))
        runs.append([task.knob_space.points[i] for i in tuner.results])
    assert runs[0] == runs[1]
    assert task.knob_space.tps in runs[0][:4]
    assert len(runs[0]) == 8 and len({json.dumps(p) for p in runs[0]}) == 8


def test_random_tuner_visits_distinct_points():
    task = dense_task()
    tuner = tune.RandomTuner(task, seed=1, batch_size=5)
    tuner.tune(11, tune.measure_option(runner=tune.LocalRunner(0), verify=False))
    assert len(tuner.visited) == 11 == len(tuner.results)


def test_failing_measurement_and_failing_verification_are_never_best(tmp_path, exhaustive):
    """tune-test: tile_ci=1 points raise in build; the fastest point is compiled wrongly."""
    import test_tune_helpers  # noqa: F401  (registers tune-test)

    task = dense_task("tune-test")
    path = tmp_path / "faulty.json"
    best = tune.GridSearchTuner(task).tune(28, LOCAL, callbacks=[tune.callback.log_to_file(path)])
    records = lines(path)
    raised = [r for r in records if r["knobs"]["tile_ci"] == 1]
    # tile_ci=1: tile_co in {1, 2, 4} x oc_nthread in {1, 2} less (4, 2), plus 2 reuse points
    assert len(raised) == 7 and all("injected build failure" in r["error"] for r in raised)
    assert all(r["cycles"] is None for r in raised)
    wrong = [r for r in records if r["knobs"] == WRONG]
    assert wrong[0]["cycles"] < min(exhaustive.values())  # faster: one ALU stage less
    assert "verification failed" in wrong[-1]["error"]
    assert best.knobs != WRONG and best.knobs["tile_ci"] != 1
    ok = {k: v for k, v in exhaustive.items() if json.loads(k) != WRONG
          and json.loads(k)["tile_ci"] != 1}
    assert best.cycles == min(ok.values())
    knobs, origin = tune.apply_history_best(path).best_knobs(
        "dense", "tune-test", DENSE, load_config("default"))
    assert knobs == best.knobs
    assert origin == f"tuned record from {path}:{len(records)}"


def test_ctrl_c_keeps_finished_records_and_a_restart_resumes(tmp_path):
    task = dense_task()
    path = tmp_path / "interrupted.json"

    def interrupt_after_five(tuner, inputs, results):
        if len(tuner.results) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune.RandomTuner(task, seed=0, batch_size=4).tune(
            12, LOCAL, callbacks=[tune.callback.log_to_file(path), interrupt_after_five])
    first = lines(path)
    assert len(first) == 5 and all(r["cycles"] for r in first)
    tuner = tune.RandomTuner(task, seed=7, batch_size=4)
    tuner.tune(12, LOCAL, callbacks=[tune.callback.log_to_file(path)])
    measured = [json.dumps(r["knobs"], sort_keys=True) for r in lines(path) if not r["verified"]]
    assert len(measured) == 12 and len(set(measured)) == 12  # 5 resumed + 7 new, none twice
    assert tuner.best_knobs is not None
    resumed = {json.dumps(r["knobs"], sort_keys=True): r for r in first}
    for i, result in tuner.results.items():
        if json.dumps(result.knobs, sort_keys=True) in resumed:  # read back, not measured again
            assert result.dram_bytes == resumed[json.dumps(result.knobs, sort_keys=True)][
                "dram_bytes"] > 0


# ------------------------------------------------------------------ records
@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A records file of the dense task (12 random trials, verified best)."""
    path = tmp_path_factory.mktemp("records") / "dense.json"
    best = tune.RandomTuner(dense_task(), seed=2).tune(
        12, LOCAL, callbacks=[tune.callback.log_to_file(path)])
    return path, best


def test_records_are_keyed_by_the_configuration_value(tuned):
    path, best = tuned
    history = tune.apply_history_best(path)
    default = load_config("default")
    assert history.best_knobs("dense", "stock", DENSE, default)[0] == best.knobs
    assert history.best_knobs("dense", "stock", DENSE, load_config("pipelined")) is None
    values = default.to_dict()
    values["GEMM_CYCLES_PER_UOP"] = 2
    same_name = VTAConfig.from_dict(values, name="default")
    assert history.best_knobs("dense", "stock", DENSE, same_name) is None
    assert history.best_knobs("dense", "csp-none", DENSE, default) is None
    other = dict(DENSE, out_features=128)
    assert history.best_knobs("dense", "stock", other, default) is None


def test_corrupt_and_foreign_lines_warn_with_file_and_line(tuned, tmp_path):
    path, best = tuned
    text = open(path).read().splitlines()
    mixed = tmp_path / "mixed.json"
    foreign_autotvm = {"input": ["llvm -device=arm_cpu", "conv2d_nchw_spatial_pack.arm_cpu",
                                 [], {}], "config": {"entity": []}, "result": [[1.0], 0, 1, 1],
                       "version": 0.2}
    bad = ["{not json", json.dumps({"hello": "world"}), json.dumps(foreign_autotvm)]
    mixed.write_text("\n".join(bad[:2] + text + bad[2:]) + "\n")
    with pytest.warns(RecordWarning) as caught:
        history = tune.apply_history_best(mixed)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 3
    for number in (1, 2, len(text) + 3):
        assert any(f"{mixed}:{number}: skipped" in m for m in messages), messages
    assert "conv2d_nchw_spatial_pack.arm_cpu" in messages[2]
    knobs, origin = history.best_knobs("dense", "stock", DENSE, load_config("default"))
    assert knobs == best.knobs and origin.startswith(f"tuned record from {mixed}:")


def test_a_record_whose_knobs_no_longer_validate_is_skipped(tuned, tmp_path):
    path, best = tuned
    records = lines(path)
    verified = records[-1]
    assert verified["verified"]
    stale = dict(verified, knobs=dict(verified["knobs"], tile_ci=3), cycles=1)
    pruned = dict(verified, knobs={"tile_b": 1, "tile_ci": 2, "tile_co": 4, "oc_nthread": 2,
                                   "reuse": False}, cycles=2)
    edited = tmp_path / "stale.json"
    edited.write_text("\n".join(json.dumps(r) for r in records + [stale, pruned]) + "\n")
    history = tune.apply_history_best(edited)
    with pytest.warns(RecordWarning) as caught:
        knobs, origin = history.best_knobs("dense", "stock", DENSE, load_config("default"))
    assert knobs == best.knobs and origin == f"tuned record from {edited}:{len(records)}"
    messages = [str(w.message) for w in caught]
    assert f"{edited}:{len(records) + 1}" in messages[0] and "not a point" in messages[0]
    assert f"{edited}:{len(records) + 2}" in messages[1] and "pruned: oc_nthread" in messages[1]


def test_missing_records_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tune.apply_history_best(tmp_path / "nope.json")


def test_apply_history_best_in_relax_build_keeps_the_user_options(tmp_path):
    mod = conv_module(1, 16, 16, 8, 1, padding=0)
    task, = tune.extract_tasks(mod, strategy="stock")
    path = tmp_path / "conv.json"
    best = tune.GridSearchTuner(task).tune(3, LOCAL, callbacks=[tune.callback.log_to_file(path)])
    with vta_ext.build_options(strategy="stock", knobs="fallback", objective="footprint"):
        with tune.apply_history_best(path) as history:
            options = vta_ext.options.current_options()
            assert options.strategy == "stock" and options.knobs == "fallback"
            assert options.objective == "footprint"
            assert options.records is history
            relax.build(mod, target="ext_vta")
        assert vta_ext.options.current_options().records is None
    report = vta_ext.last_build_report()
    (placement,) = report.on_vta
    lines_ = len(open(path).read().splitlines())
    assert f"tuned record from {path}:{lines_}" in placement.detail
    if best.knobs["tile_h"] != 1:
        assert f"tile_h={best.knobs['tile_h']}" in placement.detail


def test_objective_dram_bytes_picks_the_fewest_bytes():
    """objective="dram_bytes": the best (and verified) point is the one of fewest DRAM bytes among
    the measured ones (ties: fewer cycles), each point measured on its own here."""
    task = dense_task()
    measured = {json.dumps(p, sort_keys=True): measure_point(task.spec(), p)
                for p in task.knob_space.points}
    fewest = min((r.dram_bytes, r.cycles) for r in measured.values())
    best = tune.GridSearchTuner(task, objective="dram_bytes").tune(1000, LOCAL)
    assert best.verified and (best.dram_bytes, best.cycles) == fewest
    assert best.cycles > min(r.cycles for r in measured.values())   # not the cycles objective
    xgb = tune.XGBTuner(task, seed=1, batch_size=4, objective="dram_bytes")
    found = xgb.tune(12, LOCAL)
    assert found.dram_bytes == min(r.dram_bytes for i, r in xgb.results.items() if r.ok)
    with pytest.raises(ValueError, match="objective"):
        tune.RandomTuner(task, objective="bytes")


def test_csp_group_conv2d_tunes_and_verifies(tmp_path):
    """A group conv2d under csp-strict (NCHW): its numpy reference (grouped convolution in int64)
    verifies the best point, also with a loop order other than the stock one."""
    mod = conv_module(1, 32, 32, 8, 3, groups=2)
    with vta_ext.build_options(layout="NCHW"):
        task, = tune.extract_tasks(mod, strategy="csp-strict")
    assert task.kind == "group_conv2d" and "stock" not in task.name
    space = task.knob_space
    other = [p for p in space.points if p["order"] != 0][:2]
    option = tune.measure_option(runner=tune.LocalRunner(0))
    for point in other:
        assert option.runner.verify(task.spec(), point, 0) is None, point
    best = tune.XGBTuner(task, seed=0, batch_size=4).tune(8, LOCAL)
    assert best.verified


@pytest.mark.slow
def test_a_csp_strategy_tunes_through_the_same_interface(tmp_path):
    """csp-relaxed embeds the 3 input channels without padding them to 16; its knob space, build
    and numpy reference plug into the same tuner and records."""
    mod = conv_module(1, 3, 16, 16, 3)
    task, = tune.extract_tasks(mod, strategy="csp-relaxed")
    assert task.strategy == "csp-relaxed" and "1x3x16x16 -> 16 k3x3" in task.name
    space = task.knob_space
    assert len(space) > 0 and space.tps in space and all(r for _, r in space.pruned)
    path = tmp_path / "csp.json"
    best = tune.XGBTuner(task, seed=0, batch_size=4).tune(
        8, LOCAL, callbacks=[tune.callback.log_to_file(path)])
    assert best.verified
    with vta_ext.build_options(strategy="csp-relaxed"), tune.apply_history_best(path):
        relax.build(mod, target="ext_vta")
    (placement,) = vta_ext.last_build_report().on_vta
    assert "tuned record from" in placement.detail


def test_tune_network_cli_with_nothing_to_tune(tmp_path, capsys):
    import sys
    from pathlib import Path

    scripts = str(Path(__file__).resolve().parents[1] / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import tune_network

    model = tmp_path / "float_model.py"
    model.write_text(
        "from tvm import relax\n"
        "bb = relax.BlockBuilder()\n"
        "x = relax.Var('x', relax.TensorType((4, 4), 'float32'))\n"
        "with bb.function('main', [x]):\n"
        "    with bb.dataflow():\n"
        "        out = bb.emit_output(relax.op.add(x, x))\n"
        "    bb.emit_func_output(out)\n"
        "mod = bb.get()\n")
    assert tune_network.main(["--model", str(model), "--records", str(tmp_path / "r.json")]) == 1
    assert "nothing to tune" in capsys.readouterr().out
    assert not (tmp_path / "r.json").exists()
