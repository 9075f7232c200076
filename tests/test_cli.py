"""The ``vta-ext`` command line (issue 20, part 1), end to end in subprocesses.

A small conv block (conv-BN-ReLU-conv-ReLU, 3x8x8 input) is exported as a float ONNX file, a float
``.pt2`` and a PT2E-converted ``.pt2``. ``vta-ext compile`` + ``vta-ext run`` must give the output
of the Python API for the same input: the same model quantised in this process by the README's
functions (from the in-memory torch model where the CLI reads a file), built with
``relax.build`` for the same target and strategy, run by the VM; and that equals the llvm build
of the same int8 module bit for bit. Errors: exit status 1, one line on stderr naming the thing,
no traceback.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import tvm_csp_embed  # noqa: F401 - the CLI imports it: csp-relaxed is the default strategy
import vta_ext
from conftest import REPO
from vta_ext import cli

pytest.importorskip("onnx")
pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")

SHAPE = (1, 3, 8, 8)


class Block(nn.Module):
    """conv-BN-ReLU-conv-ReLU, 3 -> 16 -> 16 channels."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        with torch.no_grad():  # a BatchNorm that is not the identity
            self.body[1].running_mean.uniform_(-0.5, 0.5)
            self.body[1].running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return self.body(x)


def vta_ext_cli(*args, cwd=None, check=True) -> subprocess.CompletedProcess:
    """``python -m vta_ext ARGS`` in a subprocess (the environment of this process, so the
    fresh embedding cache too)."""
    proc = subprocess.run([sys.executable, "-m", "vta_ext", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, f"vta-ext {args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The model files, the calibration and input arrays, and the in-memory torch models."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from vta_ext.quantize import symmetric_quantizer

    tmp = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    cal = rng.standard_normal((4,) + SHAPE).astype(np.float32)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    np.save(tmp / "cal.npy", cal)
    np.save(tmp / "x.npy", x)
    model = Block().eval()
    example = (torch.from_numpy(cal[0]),)
    torch.onnx.export(model, example, str(tmp / "block.onnx"), input_names=["x"], dynamo=False)
    exported = torch.export.export(model, example)
    torch.export.save(exported, str(tmp / "block.pt2"))
    prepared = prepare_pt2e(torch.export.export(model, example).module(),
                            symmetric_quantizer(per_channel=True))
    for c in cal:
        prepared(torch.from_numpy(c))
    converted = convert_pt2e(prepared)
    torch.export.save(torch.export.export(converted, example), str(tmp / "block_pt2e.pt2"))
    return {"dir": tmp, "cal": cal, "x": x, "exported": exported, "converted": converted}


def python_api(qmod, target, strategy, x):
    """The Python API: ``relax.build`` in ``build_options`` and the VM; ``(output, report,
    llvm output of the same module)``."""
    with vta_ext.build_options(strategy=strategy):
        executable = relax.build(qmod, target=target)
    report = vta_ext.last_build_report()

    def run(ex):  # the one output, returned as a tensor or a 1-tuple by the importers
        out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
        return out.numpy() if hasattr(out, "numpy") else out[0].numpy()

    return run(executable), report, run(relax.build(qmod, target="llvm"))


def compile_and_run(d: Path, model: str, name: str, *options):
    """``vta-ext compile`` then ``vta-ext run``: ``(compile, run, output array, report dict)``."""
    built = vta_ext_cli("compile", d / model, "-o", d / f"{name}.so", *options)
    ran = vta_ext_cli("run", d / f"{name}.so", "--inputs", d / "x.npy", "--output",
                      d / f"{name}_y.npy", "--repeat", 2)
    report = json.loads((d / f"{name}.report.json").read_text())
    return built, ran, np.load(d / f"{name}_y.npy"), report


def check_against_python_api(ran, out, report, reference):
    """The CLI's output, run summary and report against the Python API's."""
    api_out, api_report, llvm = reference
    np.testing.assert_array_equal(api_out, llvm)  # the Python API itself: bit-exact vs llvm
    np.testing.assert_array_equal(out, api_out)
    assert f"output 0: shape {api_out.shape} float32" in ran.stdout
    calls = vta_ext.run_log()
    assert len(calls) == len(api_report.on_vta)
    cycles = sum(c.cycles.total_cycles for c in calls)
    assert f"VTA: {len(calls)} operator call(s), {cycles:,} cycles" in ran.stdout
    # the run log's efficiency: the floors of the Python API's report over the same cycles
    assert (f"cycles (cycle model, one inference); floor {api_report.vta_floor:,.0f} cycles, "
            f"efficiency {api_report.vta_floor / cycles:.2f}") in ran.stdout
    assert re.search(r"wall time over 2 runs: min [\d.]+ ms, median [\d.]+ ms", ran.stdout)
    assert report["summary"] == api_report.summary()
    assert report["strategy"] == api_report.strategy
    placements = report["build_report"]["placements"]
    assert [(p["op"], p["device"]) for p in placements] == \
        [(p.op, p.device) for p in api_report.placements]


@pytest.mark.slow  # the ONNX path stays in the default run: test_frontends.py::test_onnx_float_model
def test_onnx_float_model_default_strategy(models, capsys):
    from vta_ext.quantize import quantize_onnx
    from vta_ext.strategy import default_strategy

    d = models["dir"]
    built, ran, out, report = compile_and_run(d, "block.onnx", "onnx", "--calibration",
                                              d / "cal.npy")
    assert "warning" not in built.stderr  # calibrated on the file, not on a random input
    qm = quantize_onnx(str(d / "block.onnx"), list(models["cal"]))
    vta_ext.clear_run_log()
    reference = python_api(qm.mod, "ext_vta", default_strategy(), models["x"])
    assert reference[1].strategy == "csp-relaxed"  # the CLI's default is the Python API's
    check_against_python_api(ran, out, report, reference)
    assert report["config"]["value"] == vta_ext.load_config("default").to_dict()
    assert report["input"] == {"name": "x", "shape": list(SHAPE), "dtype": "float32"}
    # vta-ext report prints the same report, from OUT.so or from the JSON
    shown = vta_ext_cli("report", d / "onnx.so").stdout
    assert str(reference[1]) in shown and "block.onnx" in shown
    assert cli.main(["report", str(d / "onnx.report.json")]) == 0
    assert capsys.readouterr().out == shown


@pytest.mark.slow
def test_pt2e_model_on_another_preset_with_stock(models):
    from vta_ext.quantize import quantize_pt2e

    d = models["dir"]
    built, ran, out, report = compile_and_run(d, "block_pt2e.pt2", "pt2e", "--config",
                                              "pipelined", "--strategy", "stock")
    # no --calibration: one warning line, saying what to do
    warnings = [line for line in built.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "own scales" in warnings[0], built.stderr
    # the Python API on the in-memory converted model (the CLI read the saved file)
    qm = quantize_pt2e(models["converted"], list(models["cal"]))
    vta_ext.clear_run_log()
    reference = python_api(qm.mod, vta_ext.vta_target("pipelined"), "stock", models["x"])
    check_against_python_api(ran, out, report, reference)
    assert report["config"]["name"] == "pipelined" and report["model_kind"] == \
        "PT2E-quantised .pt2"


@pytest.mark.slow  # the float .pt2 import and a configuration file; the others cover the rest
def test_float_pt2_model_with_a_custom_configuration_file(models, tmp_path):
    from vta_ext.quantize import import_exported_program, quantize_relax

    d = models["dir"]
    config = dict(vta_ext.load_config("default").to_dict(), LOG_INP_BUFF_SIZE=12)
    (tmp_path / "small_inp.json").write_text(json.dumps(config))
    built, ran, out, report = compile_and_run(d, "block.pt2", "pt2", "--config",
                                              tmp_path / "small_inp.json", "--calibration",
                                              d / "cal.npy", "--strategy", "stock")
    qm = quantize_relax(import_exported_program(models["exported"]), list(models["cal"]))
    vta_ext.clear_run_log()
    reference = python_api(qm.mod, vta_ext.vta_target(str(tmp_path / "small_inp.json")),
                           "stock", models["x"])
    check_against_python_api(ran, out, report, reference)
    assert report["config"] == {"name": "small_inp", "value": config}


def test_random_calibration_warns_in_one_line(models, tmp_path):
    d = models["dir"]
    built = vta_ext_cli("compile", d / "block.onnx", "-o", tmp_path / "r.so", "--strategy",
                        "stock", "--report", tmp_path / "elsewhere.json")
    warnings = [line for line in built.stderr.splitlines() if "vta-ext: warning" in line]
    assert len(warnings) == 1 and "random" in warnings[0] and "--calibration" in warnings[0]
    assert (tmp_path / "elsewhere.json").is_file() and not (tmp_path / "r.report.json").exists()


@pytest.mark.slow  # tuning and its records in this process: test_tune.py (apply_history_best)
def test_tune_then_compile_with_the_records(models, tmp_path):
    from vta_ext.quantize import quantize_onnx

    d = models["dir"]
    records = tmp_path / "block.json"
    tuned = vta_ext_cli("tune", d / "block.onnx", "--records", records, "--trials", 4,
                        "--parallel", 1, "--strategy", "stock", "--calibration", d / "cal.npy")
    tasks = int(re.search(r"(\d+) task\(s\)", tuned.stdout).group(1))
    assert tasks >= 1 and "4/4" in tuned.stderr  # the progress bars
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert sum(r["verified"] for r in lines) == tasks  # the best of each, verified
    assert sum(not r["verified"] and r["error"] is None for r in lines) == 4 * tasks
    assert f"--records {records}" in tuned.stdout
    # compile and run in this process (the other tests run them in subprocesses)
    assert cli.main(["compile", str(d / "block.onnx"), "-o", str(tmp_path / "tuned.so"),
                     "--records", str(records), "--strategy", "stock", "--calibration",
                     str(d / "cal.npy")]) == 0
    assert cli.main(["run", str(tmp_path / "tuned.so"), "--inputs", str(d / "x.npy"),
                     "--output", str(tmp_path / "y.npy")]) == 0
    out = np.load(tmp_path / "y.npy")
    report = json.loads((tmp_path / "tuned.report.json").read_text())
    convs = [p["detail"] for p in report["build_report"]["placements"]
             if p["device"] == "vta" and p["op"] == "relax.nn.conv2d"]
    # every conv is one of the tuned workloads (two convs may share one: a padded 3 -> 16 conv)
    assert len(convs) == 2 and all(f"tuned record from {records}" in t for t in convs)
    qm = quantize_onnx(str(d / "block.onnx"), list(models["cal"]))
    vta_ext.clear_run_log()
    api_out, _, llvm = python_api(qm.mod, "ext_vta", "stock", models["x"])
    np.testing.assert_array_equal(out, api_out)  # tuned knobs change cycles, never results
    np.testing.assert_array_equal(out, llvm)


# ------------------------------------------------------------------ errors: one line each
def assert_one_line_error(code, stderr, *names):
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 1, stderr
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and lines[0].startswith("vta-ext ")
    for name in names:
        assert str(name) in lines[0], (name, lines[0])


@pytest.fixture(scope="module")
def library(models):
    """A library compiled by the CLI (stock, in this process: the subprocess tests made theirs)."""
    d = models["dir"]
    assert cli.main(["compile", str(d / "block.onnx"), "-o", str(d / "errors.so"),
                     "--calibration", str(d / "cal.npy"), "--strategy", "stock"]) == 0
    return d / "errors.so"


def test_run_writes_a_trace_of_its_vta_calls(models, library, tmp_path, capsys):
    """``run --trace``: the first run's VTA calls as a Chrome trace (the format's rules are
    checked in tests/test_trace.py); one process per call, named by operator and strategy."""
    path = tmp_path / "out" / "trace.json"
    assert cli.main(["run", str(library), "--inputs", str(models["dir"] / "x.npy"), "--repeat", "2",
                     "--trace", str(path)]) == 0
    both = vta_ext.run_log()  # the two runs' calls
    calls = both[:len(both) // 2]
    assert [c.key for c in calls] == [c.key for c in both[len(calls):]]
    assert f"wrote {path} (the first run's {len(calls)} VTA call(s)" in capsys.readouterr().out
    data = json.loads(path.read_text())
    names = [e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"]
    assert len(names) == len(calls) > 0
    assert all(n.startswith(f"{c.op} #{i}") and n.endswith(", stock)")
               for i, (c, n) in enumerate(zip(calls, names), start=1))


@pytest.mark.slow  # the same cases in this process: test_every_error_is_one_line_naming_the_thing
def test_errors_in_a_subprocess_are_one_line(models, library, tmp_path):
    """The process as a user runs it: a bad model file, a wrong input shape, an unknown preset."""
    d = models["dir"]
    (tmp_path / "bad.onnx").write_bytes(b"\x00\x93not a protobuf" * 10)
    np.save(tmp_path / "small.npy", np.zeros((1, 3, 4, 4), np.float32))
    for args, names in (
            (("compile", tmp_path / "bad.onnx", "-o", tmp_path / "a.so"), ["bad.onnx", ".onnx"]),
            (("run", library, "--inputs", tmp_path / "small.npy"),
             ["small.npy", "(1, 3, 4, 4)", "(1, 3, 8, 8)"]),
            (("compile", d / "block.onnx", "-o", tmp_path / "a.so", "--config", "nope"),
             ["'nope'", "pipelined", "default"])):
        proc = vta_ext_cli(*args, check=False)
        assert_one_line_error(proc.returncode, proc.stderr, *names)
    # --debug: the exception itself (Python prints its traceback)
    with pytest.raises(vta_ext.ConfigError, match="nope"):
        cli.main(["compile", str(d / "block.onnx"), "-o", str(tmp_path / "a.so"), "--config",
                  "nope", "--debug"])


def _error_cases(d: Path, library: Path, tmp: Path):
    (tmp / "bad.onnx").write_bytes(b"\x00\x93not a protobuf" * 10)
    (tmp / "bad.pt2").write_bytes(b"not a zip archive")
    (tmp / "model.tflite").write_bytes(b"")
    (tmp / "bad.so").write_bytes(b"not an ELF file")
    (tmp / "text.npy").write_text("not numpy")
    np.save(tmp / "x64.npy", np.zeros(SHAPE, np.float64))
    np.save(tmp / "small.npy", np.zeros((1, 3, 4, 4), np.float32))
    np.save(tmp / "cal_int.npy", np.zeros(SHAPE, np.int8))
    np.save(tmp / "cal_wrong.npy", np.zeros((2, 3, 4, 4), np.float32))
    onnx, out = str(d / "block.onnx"), str(tmp / "a.so")
    return [
        # bad files
        (["compile", str(tmp / "absent.onnx"), "-o", out], ["absent.onnx", ".pt2"]),
        (["compile", str(tmp / "bad.onnx"), "-o", out], ["bad.onnx", "ONNX"]),
        (["compile", str(tmp / "bad.pt2"), "-o", out], ["bad.pt2", "torch.export.save"]),
        (["compile", str(tmp / "model.tflite"), "-o", out], ["model.tflite", ".onnx"]),
        (["compile", onnx, "-o", str(tmp / "a.dll")], ["a.dll", ".so"]),
        (["run", str(tmp / "bad.so"), "--inputs", str(d / "x.npy")], ["bad.so", "compile"]),
        (["run", str(tmp / "absent.so"), "--inputs", str(d / "x.npy")], ["absent.so"]),
        (["run", str(library), "--inputs", str(tmp / "text.npy")], ["text.npy", "numpy.save"]),
        (["report", str(tmp / "absent.so")], ["absent.so"]),
        (["report", str(d / "x.npy")], ["x.npy", "REPORT.json"]),
        # wrong input shape, dtype, count
        (["run", str(library), "--inputs", str(tmp / "small.npy")],
         ["small.npy", "(1, 3, 4, 4)", "(1, 3, 8, 8)"]),
        (["run", str(library), "--inputs", str(tmp / "x64.npy")], ["x64.npy", "float64",
                                                                  "float32"]),
        (["run", str(library), "--inputs", str(d / "x.npy"), str(d / "x.npy")],
         ["2 file(s)", "1 input(s)"]),
        (["run", str(library), "--inputs", str(d / "x.npy"), "--trace", str(tmp / "t.txt")],
         ["--trace", "t.txt", ".json"]),
        # unknown preset, bad configuration file, unknown strategy, missing records
        (["compile", onnx, "-o", out, "--config", "nope"], ["'nope'", "pipelined", "2x16x16"]),
        (["compile", onnx, "-o", out, "--config", str(tmp / "absent.json")], ["absent.json"]),
        (["compile", onnx, "-o", out, "--strategy", "bogus"], ["'bogus'", "csp-relaxed"]),
        (["compile", onnx, "-o", out, "--records", str(tmp / "absent_records.json")],
         ["absent_records.json", "vta-ext tune"]),
        # calibration: missing, wrong dtype, wrong shape
        (["compile", onnx, "-o", out, "--calibration", str(tmp / "absent_cal.npy")],
         ["absent_cal.npy", "--calibration"]),
        (["compile", onnx, "-o", out, "--calibration", str(tmp / "cal_int.npy")],
         ["cal_int.npy", "int8", "float32"]),
        (["compile", onnx, "-o", out, "--calibration", str(tmp / "cal_wrong.npy")],
         ["cal_wrong.npy", "(2, 3, 4, 4)", "(1, 3, 8, 8)"]),
        (["tune", onnx, "--records", str(tmp / "r.json"), "--trials", "0"], ["--trials 0"]),
    ]


def test_every_error_is_one_line_naming_the_thing(models, library, tmp_path, capfd):
    """Each error case through ``vta_ext.cli.main`` (the subprocess test above shows that the
    process behaves the same): exit status 1, one line on stderr (the file descriptor, so
    anything a library prints counts too), naming the file, input, preset or option."""
    for argv, names in _error_cases(models["dir"], library, tmp_path):
        code = cli.main(argv)
        captured = capfd.readouterr()
        assert_one_line_error(code, captured.err, *names)
    assert not (tmp_path / "a.so").exists()


def test_every_command_has_help(capsys):
    for argv in ([], ["compile"], ["run"], ["tune"], ["report"]):
        with pytest.raises(SystemExit) as done:
            cli.main(argv + ["--help"])
        assert done.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith("usage: vta-ext") and "--debug" in text
    assert cli.main([]) == 2  # no command: the overview, exit status 2


def test_console_script_is_declared_and_runs():
    setup = (REPO / "setup.py").read_text()
    assert re.search(r'"vta-ext\s*=\s*vta_ext\.cli:main"', setup)
    script = shutil.which("vta-ext") or (Path(sys.executable).parent / "vta-ext")
    if not Path(script).is_file():
        pytest.skip("the vta-ext console script is not installed in this environment yet "
                    "(setup.py declares it): run scripts/setup_env.sh")
    proc = subprocess.run([str(script), "report", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: vta-ext report")
