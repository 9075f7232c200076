"""The trace of VTA runs (issue 30, item 2), checked against the rules of the Chrome Trace Event
Format that Perfetto and ``chrome://tracing`` read, on a real build: a small two-conv network built
for ``ext_vta`` with the stock strategy and run by the VM."""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
import torch
import tvm

import vta_ext
from vta_ext.executor import compiled_op

#: float tolerance of times in microseconds (cycles / MHz)
EPS = 1e-6


@pytest.fixture(scope="module")
def runs():
    """The VTA calls of one inference of conv3x3-ReLU-conv1x1-ReLU (16 -> 32 -> 16 channels)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(32, 16, 1), torch.nn.ReLU()).eval()
    x = np.random.default_rng(0).standard_normal((1, 16, 8, 8)).astype("float32")
    qm = vta_ext.quantize_torch(model, x)
    with vta_ext.build_options(strategy="stock"):
        executable = tvm.relax.build(qm.mod, target="ext_vta")
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    vta_ext.clear_run_log()
    vm["main"](tvm.runtime.tensor(x))
    calls = vta_ext.run_log()
    assert [c.op for c in calls] == ["conv2d", "conv2d"]
    return calls


@pytest.fixture(scope="module")
def trace(runs, tmp_path_factory):
    """The file :func:`vta_ext.export_trace` writes for the run log, read back."""
    path = vta_ext.export_trace(tmp_path_factory.mktemp("trace") / "trace.json")
    return json.loads(path.read_text())


def _by_ph(trace, ph):
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def test_every_event_has_the_required_keys(trace):
    assert set(trace) == {"traceEvents", "displayTimeUnit", "otherData"}
    events = trace["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X", "s", "f", "C"}
    for e in events:
        missing = {"name", "ph", "ts", "pid", "tid"} - set(e)
        assert not missing, f"{e} lacks {missing}"
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        if e["ph"] in "sf":
            assert "id" in e, e


def test_one_process_per_call_one_thread_per_module(trace, runs):
    names = {e["pid"]: e["args"]["name"] for e in _by_ph(trace, "M")
             if e["name"] == "process_name"}
    assert names == {1: "conv2d #1 (1x16x8x8 -> 32, stock)",
                     2: "conv2d #2 (1x32x8x8 -> 16, stock)"}
    threads = defaultdict(dict)
    for e in _by_ph(trace, "M"):
        if e["name"] == "thread_name":
            threads[e["pid"]][e["tid"]] = e["args"]["name"].split()[0]
    for pid in names:
        assert threads[pid] == {0: "fetch", 1: "load", 2: "compute", 3: "store"}
    # every instruction of each program is one complete event, on the module that runs it
    for pid, run in enumerate(runs, start=1):
        program = compiled_op(run.key).program
        slices = [e for e in _by_ph(trace, "X") if e["pid"] == pid]
        assert sorted(e["args"]["index"] for e in slices) == list(range(len(program.insns)))
        for e in slices:
            insn = program.insns[e["args"]["index"]]
            stage = vta_ext.isa.insn_stage(insn).name.lower()
            assert e["tid"] == {"load": 1, "compute": 2, "store": 3}[stage]
            assert e["args"]["insn"] == str(insn)
            assert e["args"]["opcode"] == vta_ext.Opcode(insn.opcode).name
            if e["args"]["opcode"] == "GEMM":
                assert e["args"]["uop_end"] == insn.uop_end
                assert e["args"]["uops"] > 0


def test_complete_events_are_well_nested_on_each_thread(trace):
    """No two slices of a thread overlap partially (here: they do not overlap at all, since a
    module runs one instruction at a time)."""
    by_thread = defaultdict(list)
    for e in _by_ph(trace, "X"):
        by_thread[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    assert set(t for _, t in by_thread) == {1, 2, 3}
    for key, spans in by_thread.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for start, end in spans:
            while stack and start >= stack[-1] - EPS:
                stack.pop()
            assert not stack or end <= stack[-1] + EPS, f"partial overlap on {key} at {start}"
            stack.append(end)


def test_flows_pair_up_forward_in_time_inside_their_slices(trace):
    starts = {e["id"]: e for e in _by_ph(trace, "s")}
    ends = {e["id"]: e for e in _by_ph(trace, "f")}
    assert len(starts) == len(_by_ph(trace, "s")) and len(ends) == len(_by_ph(trace, "f"))
    assert starts and set(starts) == set(ends)
    slices = defaultdict(list)
    for e in _by_ph(trace, "X"):
        slices[e["pid"], e["tid"]].append(e)

    def enclosing(event):
        return [x for x in slices[event["pid"], event["tid"]]
                if x["ts"] - EPS <= event["ts"] <= x["ts"] + x["dur"] + EPS]

    for flow_id, s in starts.items():
        f = ends[flow_id]
        assert s["name"] == f["name"] and s["pid"] == f["pid"]
        assert s["ts"] <= f["ts"], (s, f)
        assert f.get("bp") == "e"
        [pusher], [popper] = enclosing(s), enclosing(f)
        # the pusher pushes on the flow's queue, the popper pops it, and the popper starts once
        # the token is there
        queue = s["name"]
        assert pusher["args"]["push_prev_dep"] or pusher["args"]["push_next_dep"]
        assert popper["args"]["pop_prev_dep"] or popper["args"]["pop_next_dep"]
        assert queue in vta_ext.isa.TOKEN_QUEUES
        assert popper["ts"] >= pusher["ts"] + pusher["dur"] - EPS


def test_the_last_event_of_each_call_ends_at_its_cycles(trace, runs):
    clock = trace["otherData"]["clock_mhz"]["default"]
    assert clock == runs[0].cycles.config.CLOCK_MHZ
    assert "microseconds" in trace["otherData"]["time_unit"]
    offset = 0.0
    for pid, run in enumerate(runs, start=1):
        slices = [e for e in _by_ph(trace, "X") if e["pid"] == pid]
        assert min(e["ts"] for e in slices) == pytest.approx(offset)
        end = max(e["ts"] + e["dur"] for e in slices)
        assert end == pytest.approx(offset + run.cycles.total_cycles / clock, abs=EPS)
        # the DMA counter ends at the bytes the cycle model counts
        counters = sorted((e for e in _by_ph(trace, "C") if e["pid"] == pid),
                          key=lambda e: e["ts"])
        assert counters[0]["args"] == {k: 0 for k in counters[-1]["args"]}
        assert counters[-1]["args"] == dict(run.cycles.dram_bytes)
        offset = end


class _DeviceRun:
    """A run as a hardware device reports it: the run plus its own total cycles."""

    def __init__(self, run, device, cycles):
        self._run, self.device, self.device_cycles = run, device, cycles

    def __getattr__(self, name):
        return getattr(self._run, name)


def test_a_device_total_is_a_marker_on_the_call(runs):
    data = vta_ext.trace.trace_events([runs[0], _DeviceRun(runs[1], "fake-rtl", 1234)])
    [marker] = _by_ph(data, "i")
    clock = runs[0].cycles.config.CLOCK_MHZ
    assert marker["pid"] == 2 and marker["s"] == "p" and "fake-rtl" in marker["name"]
    assert marker["ts"] == pytest.approx((runs[0].cycles.total_cycles + 1234) / clock)
    assert marker["args"]["model_cycles"] == runs[1].cycles.total_cycles


def test_no_run_is_an_error_naming_the_file(tmp_path):
    with pytest.raises(ValueError, match="empty.json.*no VTA call"):
        vta_ext.export_trace(tmp_path / "empty.json", runs=[])
    assert not (tmp_path / "empty.json").exists()
