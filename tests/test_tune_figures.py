"""Helpers of ``scripts/tune_figures.py``: the DeepBench layers the original records cover, the
compulsory bytes (every tensor once), the one-operator Relax module of a layer.

References are independent of the script: the TopHub log read with plain ``json`` (workload from
the packed shapes, as ``tests/test_tune_tophub.py`` does), byte counts computed by hand, the
conv2d output of the module's llvm build against numpy.
"""
from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def figures():
    spec = importlib.util.spec_from_file_location("tune_figures", REPO / "scripts" / "tune_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tophub_conv_shapes():
    """(n, c, h, w, k, kh, kw, stride_h, stride_w, pad_h, pad_w) of the conv2d_packed.vta lines,
    from the packed NCHWnc / OIHWoi shapes."""
    shapes = set()
    for line in open(REPO / "data" / "tophub_vta_v0.10.log"):
        if not line.strip() or line.startswith("#"):
            continue
        obj = json.loads(line)
        if obj["input"][1] != "conv2d_packed.vta":
            continue
        data, kernel = obj["input"][2][0][1], obj["input"][2][1][1]
        strides, padding = obj["input"][2][2], obj["input"][2][3]
        shapes.add((data[0] * data[4], data[1] * data[5], data[2], data[3], kernel[0] * kernel[4],
                    kernel[2], kernel[3], strides[0], strides[1], padding[0], padding[1]))
    return shapes


def test_deepbench_record_layers_are_the_rows_the_log_covers(figures):
    shapes = _tophub_conv_shapes()
    with open(REPO / "data" / "deepbench_conv_inference.csv") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    expected = []
    for r in rows:
        g = lambda k: int(r[k])
        if (g("n"), g("c"), g("h"), g("w"), g("k"), g("filter_h"), g("filter_w"), g("hstride"),
                g("wstride"), g("pad_h"), g("pad_w")) in shapes:
            expected.append(f"DB{r['id']}")
    layers = figures.deepbench_record_layers()
    assert list(layers) == expected
    # the 20 layers of issue 10 (ResNet-50 / VGG shapes at batch 1)
    assert [int(n[2:]) for n in layers] == [16, 17, 18, 19, 20, 41, 43, 46, 76, 77, 79, 80, 82,
                                            83, 84, 85, 87, 88, 89, 90]
    kind, wl = layers["DB83"]
    assert kind == "conv2d"
    assert wl == dict(batch=1, height=28, width=28, in_channels=512, out_channels=1024,
                      kernel_h=1, kernel_w=1, pad_h=0, pad_w=0, stride_h=2, stride_w=2)


def test_layer_group(figures):
    assert [figures.layer_group(n) for n in ("C10", "D3", "DB16", "dense")] == \
        ["C", "D", "DB", "dense"]


def test_compulsory_bytes_by_hand(figures, monkeypatch):
    # C2: 56x56x64 in, 64x64x3x3 weights, int32 bias, 56x56x64 out
    assert figures.compulsory_bytes("C2") == 64 * 56 * 56 + 64 * 64 * 9 + 4 * 64 + 64 * 56 * 56
    # C4 (1x1, stride 2): only the even rows and columns are read; 28x28 outputs
    assert figures.compulsory_bytes("C4") == 64 * 28 * 28 + 128 * 64 + 4 * 128 + 128 * 28 * 28
    # not square: 5x8 input, 3x1 kernel, stride (1, 2), pad (1, 0): all 5 rows, columns 0 2 4 6
    monkeypatch.setitem(figures.LAYERS, "X", ("conv2d", dict(
        batch=1, height=5, width=8, in_channels=2, out_channels=4, kernel_h=3, kernel_w=1,
        pad_h=1, pad_w=0, stride_h=1, stride_w=2)))
    assert figures.compulsory_bytes("X") == 2 * 5 * 4 + 4 * 2 * 3 + 4 * 4 + 4 * 5 * 4


def test_layer_module_not_square_matches_numpy(figures, monkeypatch):
    import tvm
    from tvm import relax

    monkeypatch.setitem(figures.LAYERS, "X", ("conv2d", dict(
        batch=1, height=5, width=8, in_channels=2, out_channels=4, kernel_h=3, kernel_w=1,
        pad_h=1, pad_w=0, stride_h=1, stride_w=2)))
    mod = figures.layer_module("X")
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (1, 2, 5, 8), dtype=np.int8)
    w = rng.integers(-128, 128, (4, 2, 3, 1), dtype=np.int8)
    b = rng.integers(-2000, 2000, (1, 4, 1, 1), dtype=np.int32)
    ex = relax.build(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm["main"](*(tvm.runtime.tensor(a) for a in (x, w, b))).numpy()
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (0, 0)))
    ref = np.zeros((1, 4, 5, 4), np.int64)
    for oy in range(5):
        for ox in range(4):
            win = xp[0, :, oy:oy + 3, 2 * ox:2 * ox + 1]
            ref[0, :, oy, ox] = np.tensordot(w.astype(np.int64), win, axes=([1, 2, 3], [0, 1, 2]))
    ref = np.clip((ref + b) >> 8, 0, 127).astype(np.int8)
    np.testing.assert_array_equal(got, ref)


def test_layers_csv_per_strategy(figures):
    base = Path("/x/tune_layers.csv")
    assert figures.layers_csv(base, "stock") == base
    assert figures.layers_csv(base, "csp-relaxed") == Path("/x/tune_layers_csp-relaxed.csv")
    assert figures.layers_csv(base, "csp-strict:NCHW") == Path("/x/tune_layers_csp-strict_NCHW.csv")


def test_c1_real_has_three_input_channels(figures):
    # facts §7.2: ResNet-18's stem reads the 3 RGB channels; LAYERS pads them to 16 for stock
    kind, wl = figures.C1_REAL
    assert (kind, wl["in_channels"], figures.LAYERS["C1"][1]["in_channels"]) == ("conv2d", 3, 16)
    assert {k: v for k, v in wl.items() if k != "in_channels"} == \
        {k: v for k, v in figures.LAYERS["C1"][1].items() if k != "in_channels"}


def test_measured_or_measure_reuses_the_tuners_measurement(figures, monkeypatch):
    from types import SimpleNamespace

    from tvm_csp_embed.tune import measure
    from tvm_csp_embed.tune.measure import MeasureResult

    points = [{"a": 1}, {"a": 2}]
    space = SimpleNamespace(index=lambda k: points.index(k) if k in points else None)
    task = SimpleNamespace(knob_space=space, spec=lambda: {"task": "t"})
    done = MeasureResult({"a": 1}, 100)
    tuner = SimpleNamespace(results={0: done, 1: MeasureResult({"a": 2}, None, "boom")})
    compiled = []
    monkeypatch.setattr(measure, "measure_point",
                        lambda spec, knobs: compiled.append(knobs) or MeasureResult(knobs, 7))
    assert figures.measured_or_measure(task, tuner, {"a": 1}) is done
    assert compiled == []
    # a failed or unmeasured point is measured anew
    assert figures.measured_or_measure(task, tuner, {"a": 2}).cycles == 7
    assert figures.measured_or_measure(task, tuner, {"a": 3}).cycles == 7
    assert compiled == [{"a": 2}, {"a": 3}]
