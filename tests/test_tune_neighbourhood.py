"""tune.NeighbourhoodTuner: hill climbing over the valid points near the best one.

The task is the small stock dense layer of the tuner tests (128 -> 64 on ``default``: 28 valid
points, measured in this process). The reference is independent of the tuner: every point is
measured on its own with ``measure_point``, and Hamming distances, neighbourhoods and the expected
centres are recomputed here from ``task.knob_space.points``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from test_tune_helpers import DENSE, EPILOGUE
from tvm_csp_embed import tune
from tvm_csp_embed.tune.measure import measure_point

LOCAL = tune.measure_option(runner=tune.LocalRunner(0))
NO_VERIFY = tune.measure_option(runner=tune.LocalRunner(0), verify=False)


def dense_task(config: str = "default") -> tune.Task:
    return tune.Task.create("dense", DENSE, EPILOGUE, strategy="stock", config=config)


def key(point) -> str:
    return json.dumps(dict(point), sort_keys=True)


def hamming(a, b) -> int:
    return sum(a.get(k) != b.get(k) for k in set(a) | set(b))


@pytest.fixture(scope="module")
def cycles():
    """Cycles of every valid point of the dense task, each measured on its own."""
    task = dense_task()
    return {key(p): measure_point(task.spec(), p).cycles for p in task.knob_space.points}


class Trace:
    """A callback keeping each measured point with the centre the tuner had when measuring it."""

    def __init__(self):
        self.steps = []  # (centre point, measured point)

    def __call__(self, tuner, inputs, results):
        for knobs, result in zip(inputs, results):
            if not result.verified:
                self.steps.append((dict(tuner.space.points[tuner.centre]), dict(knobs)))


def check_climb(task, trace, cycles, radius, start, resumed=()):
    """Replay the climb from the reference: each round measures exactly the unmeasured valid points
    within ``radius`` of its centre, in index order; the next centre is the best point so far and
    strictly better than the previous centre. Returns the centres."""
    points = [dict(p) for p in task.knob_space.points]
    seen = {key(p) for p in resumed}
    centres, steps = [start], list(trace.steps)
    while True:
        centre = centres[-1]
        expected = [p for p in points if hamming(p, centre) <= radius and key(p) not in seen]
        got, steps = steps[:len(expected)], steps[len(expected):]
        assert [c for c, _ in got] == [centre] * len(expected)
        assert [p for _, p in got] == expected
        assert all(hamming(p, c) <= radius for c, p in got)
        seen |= {key(p) for p in expected}
        best = min(seen, key=lambda k: (cycles[k], points.index(json.loads(k))))
        if cycles[best] >= cycles[key(centre)]:
            break
        centres.append(json.loads(best))
    assert steps == []  # nothing measured after the local optimum
    return centres


def test_from_the_tps_point_it_climbs_to_a_local_optimum(cycles):
    task = dense_task()
    tps = dict(task.knob_space.tps)
    runs = []
    for _ in range(2):  # deterministic
        trace = Trace()
        tuner = tune.NeighbourhoodTuner(task, radius=1, batch_size=4)
        best = tuner.tune(len(task.knob_space), LOCAL, callbacks=[trace])
        runs.append(trace.steps)
    assert trace.steps[0][0] == tps  # the first centre, nothing measured before
    centres = check_climb(task, trace, cycles, 1, tps)
    # the TPS point is a local optimum at radius 1 here: one neighbourhood, 6 points
    assert centres == [tps] and len(trace.steps) == 6 == len(tuner.visited)
    assert tuner.stop_reason == "local optimum" and len(tuner.history) == 1
    assert best.verified and best.knobs == tps and best.cycles == cycles[key(tps)]
    assert runs[0] == runs[1]


def test_resumed_records_set_the_centre_and_the_climb_stops_at_a_local_optimum(tmp_path, cycles):
    task = dense_task()
    points = [dict(p) for p in task.knob_space.points]
    path = tmp_path / "dense.json"
    log = tune.callback.log_to_file(path)
    tune.GridSearchTuner(task).tune(3, NO_VERIFY, callbacks=[log])  # points 0, 1, 2 measured
    resumed = points[:3]
    start = min(resumed, key=lambda p: cycles[key(p)])
    assert start != task.knob_space.tps

    trace = Trace()
    tuner = tune.NeighbourhoodTuner(task, radius=1, batch_size=3)
    best = tuner.tune(1000, LOCAL, callbacks=[log, trace])  # n_trial beyond the climb: ends cleanly
    assert trace.steps[0][0] == start
    centres = check_climb(task, trace, cycles, 1, start, resumed)
    assert len(centres) >= 3 and tuner.stop_reason == "local optimum"
    assert [tuner.space.points[h.centre] for h in tuner.history] == centres
    # no point measured twice, resumed ones included
    measured = [key(r["knobs"]) for r in map(json.loads, open(path)) if not r["verified"]]
    assert len(measured) == len(set(measured)) == 3 + len(trace.steps) < len(points)
    # a local optimum: no valid point within radius 1 of the final best is better (each measured
    # here on its own)
    final = centres[-1]
    assert best.verified and best.knobs == final
    near = [p for p in points if hamming(p, final) <= 1]
    assert len(near) > 1
    assert all(measure_point(task.spec(), p).cycles >= best.cycles for p in near)


def test_rounds_limit_the_re_centrings(cycles):
    task = dense_task()
    tps = dict(task.knob_space.tps)
    full = Trace()
    tune.NeighbourhoodTuner(task, radius=2).tune(len(task.knob_space), NO_VERIFY, callbacks=[full])
    centres = check_climb(task, full, cycles, 2, tps)
    assert len(centres) >= 2
    for rounds in range(len(centres) - 1):
        trace = Trace()
        tuner = tune.NeighbourhoodTuner(task, radius=2, rounds=rounds)
        tuner.tune(len(task.knob_space), NO_VERIFY, callbacks=[trace])
        assert len(tuner.history) == rounds + 1 and tuner.stop_reason == "rounds exhausted"
        assert trace.steps == full.steps[:len(trace.steps)]  # the same climb, cut short
        assert {json.dumps(c, sort_keys=True) for c, _ in trace.steps} == \
            {key(c) for c in centres[:rounds + 1]}


def test_n_trial_caps_the_measurements():
    task = dense_task()
    tps = dict(task.knob_space.tps)
    trace = Trace()
    tuner = tune.NeighbourhoodTuner(task, radius=2, batch_size=3)
    tuner.tune(5, NO_VERIFY, callbacks=[trace])
    assert len(trace.steps) == 5 == len(tuner.visited)
    assert all(c == tps and hamming(p, tps) <= 2 for c, p in trace.steps)
    assert tuner.stop_reason is None and "radius 2" in repr(tuner)


def test_bad_arguments():
    with pytest.raises(ValueError, match="radius"):
        tune.NeighbourhoodTuner(dense_task(), radius=-1)
    with pytest.raises(ValueError, match="rounds"):
        tune.NeighbourhoodTuner(dense_task(), rounds=-1)


DENSE_MODEL = """
from tvm import relax
bb = relax.BlockBuilder()
x = relax.Var("x", relax.TensorType((1, 128), "int8"))
w = relax.Var("w", relax.TensorType((64, 128), "int8"))
b = relax.Var("b", relax.TensorType((64,), "int32"))
with bb.function("main", [x, w, b]):
    with bb.dataflow():
        y = bb.emit(relax.op.matmul(x, relax.op.permute_dims(w), out_dtype="int32"))
        y = bb.emit(relax.op.right_shift(relax.op.add(y, b), relax.const(8, "int32")))
        y = bb.emit(relax.op.clip(y, 0, 127))
        out = bb.emit_output(bb.emit(relax.op.astype(y, "int8")))
    bb.emit_func_output(out)
mod = bb.get()
"""


def test_tune_network_refines_after_the_tuner(tmp_path):
    """scripts/tune_network.py --refine: one grid-search trial (the first point), then
    neighbourhoods of radius 1 around
    the best recorded point; one line per neighbourhood, the refined best verified, recorded and
    used by the whole-model build."""
    model, path = tmp_path / "dense_model.py", tmp_path / "records.json"
    model.write_text(DENSE_MODEL)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "scripts/tune_network.py", "--model", str(model),
                          "--config", "pipelined", "--strategy", "stock", "--tuner", "grid",
                          "--trials", "1",
                          "--refine", "2", "--radius", "1", "--records", str(path),
                          "--no-fallback", "--parallel", "0"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    task = dense_task("pipelined")
    rounds = [line for line in out.stdout.splitlines() if f"{task.name} refine " in line]
    assert len(rounds) == 2  # --refine 2: at most two neighbourhoods; this one improves once
    records = [json.loads(line) for line in open(path)]
    # the first neighbourhood: the valid points within Hamming distance 1 of the one XGB trial
    first = records[0]["knobs"]
    near = sum(hamming(p, first) <= 1 for p in task.knob_space.points)
    assert f"refine 1/2: {near} points within radius 1, {near - 1} new; " in rounds[0]
    measured = [r for r in records if not r["verified"]]
    best = min(r["cycles"] for r in measured)
    assert best < measured[0]["cycles"]  # the neighbourhood found a better point
    assert records[-1]["verified"] and records[-1]["cycles"] == best
    assert f"-> {best:,} cycles" in "\n".join(rounds)
    assert "refined: " in out.stdout and "1 operators from records" in out.stdout
