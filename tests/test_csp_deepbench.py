"""DeepBench sweep: a fast smoke test of the script and the full sweep (``pytest -m slow``)."""
import csv
import importlib.util
import statistics
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = REPO / "data" / "deepbench_conv_inference.csv"


def _script():
    spec = importlib.util.spec_from_file_location("embed_deepbench", REPO / "scripts" / "embed_deepbench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod



def test_script_smoke(tmp_path):
    mod = _script()
    out = tmp_path / "db.csv"
    assert mod.main(["--mode", "relaxed", "--ids", "0,11", "--solutions", "2", "--out", str(out), "--check"]) == 0
    rows = list(csv.DictReader(open(out)))
    assert {r["id"] for r in rows} == {"0", "11"} and all(r["status"] == "ok" for r in rows)
    for col in ("solve_seconds", "cpu_seconds", "flatten_seconds", "nodes", "x_dims", "y_dims", "z_dims", "padding",
                "footprint_bytes"):
        assert all(r[col] != "" for r in rows), col
    l0 = [r for r in rows if r["id"] == "0"]
    assert len(l0) == 2 and float(l0[0]["padded_volume"]) < float(l0[0]["stock_padded_volume"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "relaxed"])
def test_full_deepbench_sweep(mode, tmp_path):
    mod = _script()
    out = tmp_path / f"db_{mode}.csv"
    assert mod.main(["--mode", mode, "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 108
    bad = [(r["id"], r["status"], r["message"]) for r in rows if r["status"] != "ok"]
    assert not bad, bad
    t = [float(r["solve_seconds"]) for r in rows]
    assert statistics.median(t) < 1.0 and max(t) < 30.0, (statistics.median(t), max(t))
    if mode == "strict":
        assert all(r["y_dims"] == "k16" and r["z_dims"] == "c16" for r in rows)


def test_effort_plot_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("plot_embed_effort", REPO / "scripts" / "plot_embed_effort.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--out-dir", str(tmp_path), "--channels", "16", "--layouts", "NCHW",
                     "--searches", "struct", "--variants=-,B"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "embed_effort.csv")))
    assert [r["variant"] for r in rows] == ["-", "B"] and all(r["status"] == "ok" for r in rows)
    assert (tmp_path / "embed_effort.png").stat().st_size > 10000
