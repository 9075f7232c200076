"""Devices: VTA programs run through the original driver ABI (vta_ext.device) on the two
libraries of ../shared/vta-hw (the original fsim and the RTL), checked against numpy, the llvm
build and the built-in simulator."""
from __future__ import annotations

import numpy as np
import pytest

from vta_ext.config import load_config
from vta_ext.device import DeviceError, open_device, vta_hw_library
from vta_ext.isa import AluOp, MemType, Stage
from vta_ext.runtime import CommandQueue, UopKernel
from vta_ext.sim import FunctionalSimulator

KINDS = ("fsim", "rtl")


@pytest.fixture(scope="module")
def libraries():
    """kind -> library path; the module is skipped when ../shared/vta-hw is not there."""
    try:
        return {kind: vta_hw_library(kind) for kind in KINDS}
    except DeviceError as err:
        pytest.skip(f"the vta-hw libraries are not available: {err}")


ROWS, SHIFT, CAP, OFFSET = 4, 3, 60, -7


def gemm_alu_program(cfg):
    """Loads ROWS input vectors and one weight matrix, resets and accumulates ROWS accumulator
    rows (one per input row: no accumulator is written twice, so the RTL's hazard does not
    apply), SHR/MIN/ADD by immediates, stores the rows."""
    q = CommandQueue(cfg)
    inp = q.alloc(ROWS * cfg.inp_elem_bytes, "inp")
    wgt = q.alloc(cfg.wgt_elem_bytes, "wgt")
    out = q.alloc(ROWS * cfg.out_elem_bytes, "out")
    q.load_2d(inp, 0, ROWS, 1, ROWS, 0, 0, 0, 0, 0, MemType.INP)
    q.load_2d(wgt, 0, 1, 1, 1, 0, 0, 0, 0, 0, MemType.WGT)
    q.dep_push(Stage.LOAD, Stage.COMPUTE)
    q.dep_pop(Stage.LOAD, Stage.COMPUTE)
    reset = UopKernel("gemm", reset=True)
    reset.loop_begin(ROWS, 1, 0, 0)
    reset.push(0, 0, 0)
    reset.loop_end()
    q.push_gemm(reset)
    gemm = UopKernel("gemm")
    gemm.loop_begin(ROWS, 1, 1, 0)
    gemm.push(0, 0, 0)
    gemm.loop_end()
    q.push_gemm(gemm)
    for op, imm in ((AluOp.SHR, SHIFT), (AluOp.MIN, CAP), (AluOp.ADD, OFFSET)):
        alu = UopKernel("alu", alu_opcode=op, use_imm=True, imm=imm)
        alu.loop_begin(ROWS, 1, 1)
        alu.push(0, 0)
        alu.loop_end()
        q.push_alu(alu)
    q.dep_push(Stage.COMPUTE, Stage.STORE)
    q.dep_pop(Stage.COMPUTE, Stage.STORE)
    q.store_2d(0, MemType.OUT, out, 0, ROWS, 1, ROWS)
    return q.synchronize()


def numpy_reference(cfg, inp, wgt):
    acc = inp.astype(np.int32) @ wgt.reshape(cfg.BLOCK_OUT, cfg.BLOCK_IN).astype(np.int32).T
    acc = np.minimum(acc >> SHIFT, CAP) + OFFSET
    return acc.astype(np.int8)  # STORE keeps the low 8 bits


def filled_program(cfg, seed=0):
    rng = np.random.default_rng(seed)
    inp = rng.integers(-128, 128, (ROWS, cfg.BLOCK_IN), dtype=np.int8)
    wgt = rng.integers(-128, 128, cfg.wgt_elem_bytes, dtype=np.int8)
    program = gemm_alu_program(cfg)
    program.write("inp", inp)
    program.write("wgt", wgt)
    return program, numpy_reference(cfg, inp, wgt)


@pytest.mark.parametrize("kind", KINDS)
def test_hand_built_program_matches_numpy(libraries, kind):
    cfg = load_config("pynq")
    program, expected = filled_program(cfg)
    reference = program.run(FunctionalSimulator(cfg))
    assert np.array_equal(program.read("out", np.int8, expected.shape), expected)
    program.write("out", np.zeros(expected.size, np.int8))
    dev = open_device(libraries[kind])
    run = dev.run_program(program)
    assert np.array_equal(program.read("out", np.int8, expected.shape), expected)
    assert run.stats == reference     # the counters from the words equal the simulator's
    if kind == "rtl":
        assert dev.reports_cycles and run.cycles > 0 and run.cycles == sum(run.segment_cycles)
    else:
        assert not dev.reports_cycles and run.cycles is None
    # a second run on the same device (its SRAMs and blocks are reused) gives the same bytes
    program.write("out", np.zeros(expected.size, np.int8))
    assert dev.run_program(program).cycles == run.cycles
    assert np.array_equal(program.read("out", np.int8, expected.shape), expected)


def test_memory_latency_costs_cycles(libraries):
    cfg = load_config("pynq")
    program, expected = filled_program(cfg)
    fast = open_device(libraries["rtl"], mem_latency=0).run_program(program).cycles
    slow = open_device(libraries["rtl"], mem_latency=40).run_program(program).cycles
    assert np.array_equal(program.read("out", np.int8, expected.shape), expected)
    assert 0 < fast < slow


# ---------------------------------------------------------------------- a network through the VM
def conv_network():
    from conftest import conv_module, random_inputs

    mod = conv_module(1, 32, 32, 14, 3)   # >= 16 input channels, 3x3: clear of the pynq hazard
    return mod, random_inputs(mod, 0)


@pytest.fixture(scope="module")
def conv_built():
    """The conv network built for pynq (stock strategy) and its llvm output."""
    import tvm
    import vta_ext
    from tvm import relax

    mod, arrays = conv_network()
    with vta_ext.build_options(strategy="stock"):
        executable = relax.build(mod, target=vta_ext.vta_target("pynq"))
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    llvm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    return relax.VirtualMachine(executable, tvm.cpu()), tensors, llvm["main"](*tensors).numpy()


@pytest.mark.parametrize("kind", KINDS)
def test_conv_network_runs_on_the_device_bit_exact(libraries, conv_built, kind):
    import vta_ext

    vm, tensors, expected = conv_built
    dev = open_device(libraries[kind])
    vta_ext.clear_run_log()
    with vta_ext.run_on(dev):
        got = vm["main"](*tensors).numpy()
    calls = vta_ext.run_log()
    assert np.array_equal(got, expected)
    assert calls and all(c.device == dev.name for c in calls)
    if kind == "rtl":
        assert all(c.device_cycles > 0 for c in calls)
    else:
        assert all(c.device_cycles is None for c in calls)
    # outside run_on the built-in simulator runs again, and says so
    vta_ext.clear_run_log()
    assert np.array_equal(vm["main"](*tensors).numpy(), expected)
    assert all(c.device == "" and c.device_cycles is None for c in vta_ext.run_log())


# ---------------------------------------------------------------------- errors
def test_a_library_without_the_abi_is_refused():
    from pathlib import Path

    path = next((p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                             "/lib64/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6")
                 if Path(p).is_file()), None)
    if path is None:
        pytest.skip("no libc.so.6 file found to open as a library without the VTA ABI")
    with pytest.raises(DeviceError, match=r"libc\.so\.6: not a VTA driver library: it has no "
                                          r"symbol VTAMemAlloc"):
        open_device(path)
    with pytest.raises(DeviceError, match="no such library"):
        open_device("/nonexistent/libvta.so")


def test_mem_latency_needs_a_library_that_models_it(libraries):
    with pytest.raises(DeviceError, match="libvta_fsim.so: mem_latency=40 given, but the library "
                                          "has no VTARtlSetMemLatency"):
        open_device(libraries["fsim"], mem_latency=40)


def deadlocking_program(cfg):
    """A compute instruction that pops a token the load module never pushes."""
    q = CommandQueue(cfg)
    out = q.alloc(cfg.out_elem_bytes, "out")
    q.dep_pop(Stage.LOAD, Stage.COMPUTE)
    reset = UopKernel("gemm", reset=True)
    reset.push(0, 0, 0)
    q.push_gemm(reset)
    q.dep_push(Stage.COMPUTE, Stage.STORE)
    q.dep_pop(Stage.COMPUTE, Stage.STORE)
    q.store_2d(0, MemType.OUT, out, 0, 1, 1, 1)
    return q.synchronize()


def test_a_deadlock_on_the_rtl_is_an_error_and_the_next_run_works(libraries):
    cfg = load_config("pynq")
    dev = open_device(libraries["rtl"])
    bad = deadlocking_program(cfg)
    with pytest.raises(DeviceError, match=r"libvta_rtl\.so: VTADeviceRun returned 2 \(deadlock: "
                                          rf".*\) for a program of {bad.insn_count} instructions"):
        dev.run_program(bad)
    program, expected = filled_program(cfg)
    assert dev.run_program(program).cycles > 0       # on a freshly allocated device
    assert np.array_equal(program.read("out", np.int8, expected.shape), expected)


def test_wait_cycles_stop_a_long_run_on_the_rtl(libraries):
    cfg = load_config("pynq")
    program, expected = filled_program(cfg)
    dev = open_device(libraries["rtl"], wait_cycles=50)
    with pytest.raises(DeviceError, match=r"VTADeviceRun returned 1 \(timeout"):
        dev.run_program(program)
    dev.wait_cycles = 0     # no limit: the re-allocated device runs it to the end
    assert dev.run_program(program).cycles > 50
    assert np.array_equal(program.read("out", np.int8, expected.shape), expected)


TIMEOUT_SCRIPT = """
import os, sys, time
sys.path.insert(0, {tests!r})
from test_device import deadlocking_program, filled_program
from vta_ext.config import load_config
from vta_ext.device import DeviceError, open_device
dev = open_device({path!r}, timeout=1.0)
start = time.perf_counter()
try:
    dev.run_program(deadlocking_program(load_config("pynq")))
except DeviceError as err:
    print("ERROR", err, "after", round(time.perf_counter() - start, 1))
try:
    dev.run_program(filled_program(load_config("pynq"))[0])
except DeviceError as err:
    print("AGAIN", err)
sys.stdout.flush()
os._exit(0)   # the worker thread still spins in the fsim
"""


def test_a_timeout_ends_a_run_that_loops_forever(libraries):
    """The fsim loops forever on a pop without push: the timeout raises, the process lives on
    (in a subprocess: the spinning thread would keep a core busy)."""
    import subprocess
    import sys
    from pathlib import Path

    script = TIMEOUT_SCRIPT.format(tests=str(Path(__file__).parent), path=str(libraries["fsim"]))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"ERROR {libraries['fsim']}: VTADeviceRun(") \
        and "did not return within 1.0 s" in lines[0], proc.stdout
    assert lines[1].startswith(f"AGAIN {libraries['fsim']}: device refused"), proc.stdout


def test_instructions_the_original_lacks_are_refused(libraries):
    cfg = load_config("default")   # has the extensions and the full ISA
    q = CommandQueue(cfg)
    acc = q.alloc(cfg.acc_elem_bytes, "acc")
    out = q.alloc(cfg.out_elem_bytes, "out")
    q.load_2d(acc, 0, 1, 1, 1, 0, 0, 0, 0, 0, MemType.ACC)
    mul = UopKernel("alu", alu_opcode=AluOp.MUL, use_imm=True, imm=3)
    mul.push(0, 0)
    q.push_alu(mul)
    q.dep_push(Stage.COMPUTE, Stage.STORE)
    q.dep_pop(Stage.COMPUTE, Stage.STORE)
    q.store_2d(0, MemType.OUT, out, 0, 1, 1, 1)
    program = q.synchronize()
    program.write("acc", np.arange(cfg.acc_elem_bytes // 4, dtype=np.int32))
    with pytest.raises(DeviceError, match=r"libvta_rtl\.so: cannot run this program \(instruction "
                                          r"#\d+ is an ALU MUL .*vta_target\('pynq'\)"):
        open_device(libraries["rtl"]).run_program(program)
    open_device(libraries["fsim"]).run_program(program)   # the original fsim has MUL
    assert np.array_equal(program.read("out", np.int8, (cfg.acc_elem_bytes // 4,)),
                          (np.arange(cfg.acc_elem_bytes // 4) * 3).astype(np.int8))


# ---------------------------------------------------------------------- the command line
def test_cli_run_on_a_device_prints_its_cycles(libraries, tmp_path, capsys):
    import tvm
    import vta_ext
    from conftest import bind_constants
    from tvm import relax

    from vta_ext import cli

    mod, arrays = conv_network()
    x, w, b = arrays
    mod = bind_constants(mod, w=w, b=b)
    with vta_ext.build_options(strategy="stock"):
        relax.build(mod, target=vta_ext.vta_target("pynq")).export_library(str(tmp_path / "m.so"))
    np.save(tmp_path / "x.npy", x)
    expected = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())[
        "main"](tvm.runtime.tensor(x)).numpy()
    assert cli.main(["run", str(tmp_path / "m.so"), "--inputs", str(tmp_path / "x.npy"),
                     "--output", str(tmp_path / "y.npy"), "--device", str(libraries["rtl"]),
                     "--mem-latency", "40"]) == 0
    out = capsys.readouterr().out
    assert np.array_equal(np.load(tmp_path / "y.npy"), expected)
    calls = vta_ext.run_log()
    assert calls and all(c.device == "libvta_rtl.so" for c in calls)
    total = sum(c.device_cycles for c in calls)
    assert f"device libvta_rtl.so: {total:,} cycles (the device's own count" in out
    for i, c in enumerate(calls):
        assert f"{c.cycles.total_cycles:>12,} {c.device_cycles:>13,}" in out
    # a library that is not there, a latency without a device: one line naming it
    assert cli.main(["run", str(tmp_path / "m.so"), "--inputs", str(tmp_path / "x.npy"),
                     "--device", str(tmp_path / "absent.so")]) == 1
    assert "absent.so" in capsys.readouterr().err
    assert cli.main(["run", str(tmp_path / "m.so"), "--inputs", str(tmp_path / "x.npy"),
                     "--mem-latency", "40"]) == 1
    assert "--device" in capsys.readouterr().err
    tune_args = cli.build_parser().parse_args(["tune", "m.onnx", "--records", "r.json",
                                               "--device", str(libraries["rtl"])])
    assert tune_args.device == str(libraries["rtl"])


# ---------------------------------------------------------------------- tuning on the device
def test_tuning_measures_on_the_rtl(libraries, tmp_path):
    import json

    import vta_ext
    from conftest import conv_module
    from tvm_csp_embed import tune
    from tvm_csp_embed.tune.measure import measure_point

    rtl = libraries["rtl"]
    (task,) = tune.extract_tasks(conv_module(1, 16, 16, 8, 3),
                                 target=vta_ext.vta_target("pynq"), strategy="stock")
    runner = tune.LocalRunner(0, device=rtl)
    path = tmp_path / "rtl.json"
    best = tune.RandomTuner(task, seed=0).tune(3, tune.measure_option(runner=runner),
                                               callbacks=[tune.callback.log_to_file(path)])
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 4 and all(r["device"] == "libvta_rtl.so" for r in records)
    assert best.verified and best.device == "libvta_rtl.so"      # verified on the RTL too
    # the recorded cycles are the RTL's: the program of the best point run there by hand
    compiled = task.template.build(task.config, task.workload, task.epilogue, dict(best.knobs))
    assert best.cycles == open_device(rtl).run_program(compiled.program).cycles
    assert best.cycles != measure_point(task.spec(), best.knobs).cycles   # not the model's
    assert "device" not in measure_point(task.spec(), best.knobs).to_dict()
    with pytest.raises(DeviceError, match="reports no cycles"):
        tune.LocalRunner(0, device=libraries["fsim"])


# ---------------------------------------------------------------------- a whole network (slow)
@pytest.mark.slow
def test_resnet18_56_on_both_libraries_bit_exact(libraries):
    import sys
    import time
    from pathlib import Path

    import tvm
    import vta_ext
    from tvm import relax

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "relay_examples"))
    from models import quantized_example

    _, qm, _, data = quantized_example("resnet18", 56)
    with vta_ext.build_options(strategy="stock"):
        vm = relax.VirtualMachine(relax.build(qm.mod, target=vta_ext.vta_target("pynq")),
                                  tvm.cpu())
    x = tvm.runtime.tensor(data)
    expected = relax.VirtualMachine(relax.build(qm.mod, target="llvm"), tvm.cpu())[
        "main"](x)[0].numpy()
    assert np.abs(expected).max() > 0
    for kind in KINDS:
        dev = open_device(libraries[kind])
        vta_ext.clear_run_log()
        start = time.perf_counter()
        with vta_ext.run_on(dev):
            got = vm["main"](x)[0].numpy()
        seconds = time.perf_counter() - start
        calls = vta_ext.run_log()
        np.testing.assert_array_equal(got, expected, err_msg=f"ResNet-18 56x56 on {dev.name}")
        assert calls and all(c.device == dev.name for c in calls)
        if kind == "rtl":
            cycles = [c.device_cycles for c in calls]
            assert all(c > 0 for c in cycles)
            model = sum(c.cycles.total_cycles for c in calls)
            print(f"ResNet-18 56x56 on the RTL: {len(calls)} calls, {sum(cycles):,} cycles "
                  f"(cycle model {model:,}), {seconds:.0f} s")
