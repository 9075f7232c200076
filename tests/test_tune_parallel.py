"""Measurement in worker processes and on a Dask cluster: same results as in this process, and a
killed worker loses no finished record."""
from __future__ import annotations

import json

import pytest

from test_tune_helpers import DENSE, EPILOGUE
from tvm_csp_embed import tune


def dense_task(strategy: str = "stock") -> tune.Task:
    return tune.Task.create("dense", DENSE, EPILOGUE, strategy=strategy, config="default")


def records(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def key(rec) -> str:
    return json.dumps(rec["knobs"], sort_keys=True)


def tune_with(runner, path, strategy: str = "stock", n_trial: int = 8, seed: int = 5):
    tuner = tune.XGBTuner(dense_task(strategy), seed=seed, batch_size=4)
    try:
        best = tuner.tune(n_trial, tune.measure_option(runner=runner),
                          callbacks=[tune.callback.log_to_file(path)])
    finally:
        runner.close()
    return best, records(path)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """XGB tuning in this process: the reference run."""
    return tune_with(tune.LocalRunner(0), tmp_path_factory.mktemp("local") / "local.json")


def test_worker_processes_and_a_killed_worker(tmp_path, monkeypatch, local_run):
    """tune-kill: building a tile_co=4 point kills its worker once (marker file)."""
    monkeypatch.setenv("TUNE_KILL_MARKER", str(tmp_path / "killed-once"))
    runner = tune.LocalRunner(2, imports=["test_tune_helpers"])
    path = tmp_path / "workers.json"
    best, recs = tune_with(runner, path, "tune-kill")  # the first batch has TPS: tile_co=4
    assert (tmp_path / "killed-once").exists()  # a worker did die
    measured = [r for r in recs if not r["verified"]]
    assert len(measured) == 8 and all(r["error"] is None for r in measured)
    # the same points, with the same cycles, as tuning in this process, and the same best
    local_best, local_recs = local_run
    assert sorted((key(r), r["cycles"]) for r in measured) == \
        sorted((key(r), r["cycles"]) for r in local_recs if not r["verified"])
    assert best.verified and best.knobs == local_best.knobs and best.cycles == local_best.cycles


@pytest.mark.slow
def test_a_point_that_always_kills_its_worker_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv("TUNE_KILL_MARKER", raising=False)
    runner = tune.LocalRunner(2, imports=["test_tune_helpers"])
    best, recs = tune_with(runner, tmp_path / "kill.json", "tune-kill", n_trial=28)
    measured = [r for r in recs if not r["verified"]]
    killers = [r for r in measured if r["knobs"]["tile_co"] == 4]
    assert len(measured) == 28 and len(killers) == 4
    assert all(r["error"] == "the measurement worker process died" for r in killers)
    assert all(r["error"] is None for r in measured if r["knobs"]["tile_co"] != 4)
    assert best.verified and best.knobs["tile_co"] != 4


def test_dask_cluster_gives_the_same_best_record(tmp_path, local_run):
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster:
        runner = tune.DaskRunner(cluster.scheduler_address)
        best, recs = tune_with(runner, tmp_path / "dask.json")
    local_best, local_recs = local_run
    assert best.knobs == local_best.knobs and best.cycles == local_best.cycles
    assert sorted((key(r), r["cycles"]) for r in recs) == \
        sorted((key(r), r["cycles"]) for r in local_recs)
    assert recs[-1]["verified"] and recs[-1]["knobs"] == local_best.knobs


@pytest.mark.slow
def test_dask_worker_killed_loses_no_record(tmp_path, monkeypatch, local_run):
    from distributed import Client, LocalCluster

    monkeypatch.setenv("TUNE_KILL_MARKER", str(tmp_path / "killed-once"))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      preload=["test_tune_helpers"]) as cluster, Client(cluster) as client:
        best, recs = tune_with(tune.DaskRunner(client), tmp_path / "dask-kill.json", "tune-kill",
                               n_trial=28)
    assert (tmp_path / "killed-once").exists()
    measured = [r for r in recs if not r["verified"]]
    assert len(measured) == 28 and all(r["error"] is None for r in measured)
    assert best.verified


@pytest.mark.slow
def test_workers_end_when_the_tuning_process_is_killed(tmp_path):
    """A tuning process killed with SIGKILL (no cleanup runs) does not leave its measurement
    workers behind: each ends within a few seconds, also in the middle of a long job."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "job.py"
    script.write_text(
        "import time\n"
        "from tvm_csp_embed.tune import LocalRunner\n"
        "def cpu(pid):\n"
        "    with open(f'/proc/{pid}/stat') as f:\n"
        "        return sum(map(int, f.read().split(')')[-1].split()[11:13]))\n"
        "if __name__ == '__main__':\n"
        "    runner = LocalRunner(2)\n"
        "    pool = runner._executor()\n"
        "    futures = [pool.submit(time.sleep, 600) for _ in range(2)]\n"
        "    while len(runner.worker_pids()) < 2:\n"
        "        time.sleep(0.1)\n"
        "    # wait until both workers have started (imports done) and sleep in their job\n"
        "    last = None\n"
        "    while True:\n"
        "        now = [cpu(p) for p in runner.worker_pids()]\n"
        "        if now == last:\n"
        "            break\n"
        "        last = now\n"
        "        time.sleep(1.0)\n"
        "    print(' '.join(str(p) for p in runner.worker_pids()), flush=True)\n"
        "    time.sleep(600)\n")
    job = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                           env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    workers = []
    try:
        line = job.stdout.readline()
        workers = [int(p) for p in line.split()]
        assert len(workers) == 2, line

        def alive(pid):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            # a zombie (ended, not yet reaped by its new parent) counts as ended
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] != "Z"

        assert all(alive(p) for p in workers)
        job.send_signal(signal.SIGKILL)
        job.wait(10)
        deadline = time.time() + 15
        while time.time() < deadline and any(alive(p) for p in workers):
            time.sleep(0.2)
        assert not any(alive(p) for p in workers), "workers outlived the killed tuning process"
    finally:
        job.kill()
        job.wait()
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
