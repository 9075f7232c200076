"""The build report a person reads (``vta_ext.report``).

* ``str(report)``: one line of at most 150 characters per operator (device, operator, source layer,
  strategy and embedding, padding, cycles), then the summary (operators per device, MACs, cycles,
  host layout operations, the end-to-end estimate);
* the cycles of a line are the cycle model of that operator's own VTA call (the calls' keys are
  the ones the VM runs, in order);
* the padding of a line is the extra work padding adds, checked against hand counts (stock
  channel blocks) and the CSP embedding's own padded extents;
* ``explain`` gives the full rationale, by index, variable or layer, and names the valid choices
  for a bad one; ``to_json`` round-trips the placements; ``to_csv`` has one row per operator;
* a build with several padded operators logs exactly one WARNING line; the per-operator text is
  at INFO;
* a modified preset is not reported under the preset's bare name.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import os
import re
import sys
import time

import numpy as np
import pytest
import tvm
from conftest import conv_chain, random_inputs
from tvm import relax

import vta_ext
from vta_ext import load_config, vta_target
from vta_ext.executor import config_digest, cycle_report
from vta_ext.offload import CPU_REASONS_ATTR, LAYERS_ATTR
from vta_ext.report import LINE_WIDTH, OpPlacement

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "relay_examples"))

#: an operator's line: index, device, operator, then the rest
LINE = re.compile(r"^  +(\d+)  (VTA|CPU)  (\S+) +(.*)$")


def _chain():
    """A ResNet-style block whose channel counts are not multiples of 16: conv 3->24 (stem),
    conv 24->24, the residual add of both, a 2x2 max pool, and a float sigmoid left on the CPU.

    Under ``stock`` (16x16 GEMM blocks) every VTA operator pads: the stem's input channels 3->16
    and output channels 24->32, the second conv 24->32 both ways, the add and the pool 24->32
    channels. Returns the module and its variable -> source layer map."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "int8"))
    w1 = relax.Var("w1", relax.TensorType((24, 3, 3, 3), "int8"))
    b1 = relax.Var("b1", relax.TensorType((1, 24, 1, 1), "int32"))
    w2 = relax.Var("w2", relax.TensorType((24, 24, 3, 3), "int8"))
    b2 = relax.Var("b2", relax.TensorType((1, 24, 1, 1), "int32"))
    with bb.function("main", [x, w1, b1, w2, b2]):
        with bb.dataflow():
            y1 = conv_chain(bb, x, w1, b1, padding=1, shift=6, clip=(-128, 127))
            y2 = conv_chain(bb, y1, w2, b2, padding=1, shift=8, clip=(0, 127))
            s = bb.emit(relax.op.add(relax.op.astype(y1, "int32"), relax.op.astype(y2, "int32")))
            s = bb.emit(relax.op.astype(relax.op.clip(s, -128, 127), "int8"))
            p = bb.emit(relax.op.nn.max_pool2d(s, pool_size=2, strides=2))
            out = bb.emit_output(relax.op.sigmoid(relax.op.astype(p, "float32")))
        bb.emit_func_output(out)
    mod = bb.get()
    names = {}
    for binding in mod["main"].body.blocks[0].bindings:
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
            names.setdefault(value.op.name, []).append(binding.var.name)
    (conv1, conv2), add = names["relax.nn.conv2d"], names["relax.add"][-1]  # after the biases
    (pool,), (sig,) = names["relax.nn.max_pool2d"], names["relax.sigmoid"]
    layers = {conv1: "stem.conv (aten.convolution)", conv2: "block.conv (aten.convolution)",
              add: "block (aten.add.Tensor)", pool: "pool", sig: "head.act"}
    mod["main"] = mod["main"].with_attr(LAYERS_ATTR, layers) \
                             .with_attr(CPU_REASONS_ATTR, {sig: "sigmoid: no LUT instruction"})
    return mod, layers


@pytest.fixture(scope="module")
def chain_build():
    """The chain built under ``stock`` with its logs: ``(module, layers, report, records)``."""
    mod, layers = _chain()
    handler = _Records()
    logger = logging.getLogger("vta_ext")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with vta_ext.build_options(strategy="stock"):
            executable = relax.build(mod, target="ext_vta")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    report = vta_ext.last_build_report()
    vm = relax.VirtualMachine(executable, tvm.cpu())
    vta_ext.clear_run_log()
    vm["main"](*[tvm.runtime.tensor(a) for a in random_inputs(mod, 0)])
    return mod, layers, report, handler.records, vta_ext.run_log()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record) -> None:
        self.records.append(record)


def _operator_lines(text: str):
    return [m for m in (LINE.match(line) for line in text.splitlines()) if m]


def _check_lines(report):
    """Every line at most LINE_WIDTH characters, one line per operator in order, and the cycles
    of each VTA line equal the cycle model of its own call."""
    text = str(report)
    assert max(len(line) for line in text.splitlines()) <= LINE_WIDTH, text
    lines = _operator_lines(text)
    assert [int(m.group(1)) for m in lines] == list(range(len(report.operators))), text
    assert [m.group(2) for m in lines] == [p.device.upper() for p in report.operators]
    # one call per VTA placement, in the order of report.vta_keys
    assert [p.call for p in report.on_vta] == list(range(len(report.vta_keys)))
    for m, p in zip(lines, report.operators):
        if p.device != "vta":
            continue
        key = report.vta_keys[p.call]
        assert json.loads(key)["op"] == p.kind
        printed = int(m.group(4).split()[-2].replace(",", ""))
        assert printed == cycle_report(key).total_cycles == report.cycles(p)
        # the last column: the floor over those cycles
        assert float(m.group(4).split()[-1]) == round(report.floor(p).total / printed, 2)
    assert sum(report.cycles(p) for p in report.on_vta) == report.vta_cycles
    return text, lines


# ------------------------------------------------------------------------------ the lines
def test_one_line_per_operator_with_its_own_cycles(chain_build):
    mod, layers, report, _, runs = chain_build
    text, lines = _check_lines(report)
    # the calls the VM made are the report's keys, in order
    assert [run.key for run in runs] == report.vta_keys
    assert [p.kind for p in report.on_vta] == ["conv2d", "conv2d", "add", "max_pool2d"]
    assert [m.group(3) for m in lines] == ["conv2d", "conv2d", "add", "max_pool2d", "astype",
                                           "sigmoid"]
    # the source layer (else the variable), the strategy, the CPU reason
    for m, p in zip(lines, report.operators):
        assert m.group(4).startswith(layers.get(p.name, p.name) + " "), m.group(0)
        if p.device == "vta":
            assert p.plan == "stock" and " stock " in m.group(4)
    assert lines[-1].group(4).endswith("sigmoid: no LUT instruction")
    assert text.startswith("ext_vta build (default, strategy stock): 4 operator(s) on VTA, 2 on "
                           "the CPU")
    assert "\n  " + report.cost_summary() + "\n" in text
    assert f"host layout operations: {report.host_relayouts} per inference" in text


def test_padding_is_the_extra_work_padding_adds(chain_build):
    _, _, report, _, _ = chain_build
    conv1, conv2, add, pool = report.on_vta
    assert conv1.padding == "in channels 3->16, out channels 24->32"
    # MACs the GEMM core executes over the operator's: (32 x 16) / (24 x 3), (32 x 32) / (24 x 24)
    assert conv1.macs == 24 * 8 * 8 * 3 * 3 * 3 and conv2.macs == 24 * 8 * 8 * 24 * 3 * 3
    assert report.padding_overhead(conv1) == (pytest.approx(32 * 16 / (24 * 3) - 1), "MACs")
    assert report.padding_overhead(conv2) == (pytest.approx(32 * 32 / (24 * 24) - 1), "MACs")
    # the ALU operators: packed output elements over the output's (24 channels in blocks of 16)
    for p in (add, pool):
        assert report.padding_overhead(p) == (pytest.approx(32 / 24 - 1), "elements")
    assert report.padding_overhead(report.on_cpu[0]) == (None, "")
    pads = [m.group(4).split()[-3] for m in _operator_lines(str(report))[:4]]
    assert pads == ["611%", "78%", "33%", "33%"]
    assert report.vta_macs == conv1.macs + conv2.macs and report.cpu_macs == 0
    assert f"MACs: {report.vta_macs:,} on VTA (100.0 %), 0 on the CPU" in str(report)


def test_one_warning_line_per_build_the_operators_at_info(chain_build):
    _, _, report, records, _ = chain_build
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert message == ("ext_vta build: 4 of 4 VTA operators pad their operands (max 611 % extra "
                       "MACs, 33 % extra elements): print(vta_ext.last_build_report()) for "
                       "details")
    assert "\n" not in message
    info = [r.getMessage() for r in records if r.levelno == logging.INFO and " pads " in
            r.getMessage()]
    assert len(info) == 4 and "in channels 3->16, out channels 24->32" in info[0]


def test_one_warning_line_with_caplog(caplog):
    """The same through pytest's ``caplog``, on a second build of the chain."""
    mod, _ = _chain()
    with caplog.at_level(logging.INFO, logger="vta_ext"):
        with vta_ext.build_options(strategy="stock"):
            relax.build(mod, target="ext_vta")
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "4 of 4 VTA operators pad" in warnings[0].getMessage()
    assert sum(" pads " in r.getMessage() for r in caplog.records
               if r.levelno == logging.INFO) == 4


def _unpadded_conv():
    """One 16 -> 16 channel 3x3 conv on 8x8 with shift + clip: nothing padded."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "int8"))
    w = relax.Var("w", relax.TensorType((16, 16, 3, 3), "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(conv_chain(bb, x, w, None, padding=1, shift=6, clip=(-128, 127)))
        bb.emit_func_output(out)
    return bb.get()


def test_no_padding_no_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="vta_ext"):
        relax.build(_unpadded_conv(), target="ext_vta")
    assert not caplog.records
    report = vta_ext.last_build_report()
    assert report.padded == [] and "padding:" not in str(report)
    assert report.padding_overhead(report.on_vta[0]) == (0.0, "MACs")


# ------------------------------------------------------------------------------ explain
def test_explain_gives_the_full_rationale(chain_build):
    _, layers, report, _, _ = chain_build
    ops = report.operators
    for i, p in enumerate(ops):
        expected = p.reason
        if p.device == "vta":  # the rationale, then the floor and the efficiency
            expected = report.explain(i)
            floor = report.floor(p)
            assert expected.startswith(p.detail + f"; floor {floor.total:,.0f} cycles ")
            assert expected.endswith(f"{report.cycles(p):,} modelled cycles, efficiency "
                                     f"{floor.total / report.cycles(p):.2f}")
        assert report.explain(i) == expected
        assert report.explain(p.name) == expected
        if p.layer:
            assert report.explain(p.layer) == expected
    assert report.explain(-1) == "sigmoid: no LUT instruction"
    # the layer without the frontend's "(aten....)" suffix
    assert report.explain("stem.conv") == report.explain(0)
    assert "PADDED in channels 3->16, out channels 24->32" in report.explain("stem.conv")
    assert len(report.explain(0)) > len(_operator_lines(str(report))[0].group(0))


def test_explain_names_the_valid_choices(chain_build):
    _, _, report, _, _ = chain_build
    n = len(report.operators)
    with pytest.raises(IndexError, match=rf"index {n} out of range: .* {n} operator line\(s\), "
                                         rf"0\.\.{n - 1}"):
        report.explain(n)
    with pytest.raises(KeyError) as err:
        report.explain("stem.cnv")
    message = err.value.args[0]
    assert "'stem.cnv'" in message and "close: stem.conv" in message
    assert all(name in message for name in ("stem.conv", "block.conv", "block", "pool",
                                            "head.act", report.operators[0].name))
    with pytest.raises(TypeError, match="index or a layer"):
        report.explain(1.5)


def test_explain_a_layer_of_several_operators_asks_which():
    report = vta_ext.BuildReport("default")
    report.add("relax.nn.conv2d", "vta", "conv2d (stock template)", "the conv", "lv1", "features.0",
               kind="conv2d", call=0)
    report.add("relax.clip", "cpu", "no VTA template for this operator", "lv2", "lv2", "features.0")
    with pytest.raises(KeyError, match=r"layer 'features.0' has 2 operators: .*\[0, 1\]"):
        report.explain("features.0")
    assert report.explain("lv1") == "the conv" and report.explain("lv2").startswith("no VTA")


# ------------------------------------------------------------------------------ export
def test_json_round_trips_the_placements(chain_build):
    _, _, report, _, _ = chain_build
    data = json.loads(report.to_json())
    names = [f.name for f in dataclasses.fields(OpPlacement)]
    assert [OpPlacement(**{k: d[k] for k in names}) for d in data["placements"]] \
        == report.placements
    index = {id(p): i for i, p in enumerate(report.operators)}
    for d, p in zip(data["placements"], report.placements):
        assert d["index"] == index.get(id(p))
        assert d["cycles"] == report.cycles(p)
        assert d["efficiency"] == report.efficiency(p)
        if p.device == "vta":
            assert d["floor_parts"] == report.floor(p).as_dict() and d["floor"] > 0
        fraction, unit = report.padding_overhead(p)
        assert d["padding_of"] == (unit or None)
        assert d["padding_pct"] == (None if fraction is None else pytest.approx(100 * fraction))
    assert (data["config"], data["strategy"]) == (report.config, report.strategy)
    assert data["vta_keys"] == report.vta_keys and data["timings"] == report.timings
    assert (data["layout_bytes"], data["cpu_macs"]) == (report.layout_bytes, report.cpu_macs)
    summary = data["summary"]
    assert summary["operators_on_vta"] == 4 and summary["operators_on_cpu"] == 2
    assert summary["vta_cycles"] == report.vta_cycles
    assert summary["vta_floor"] == report.vta_floor and summary["vta_floor"] > 0
    assert summary["vta_efficiency"] == report.vta_floor / report.vta_cycles
    assert summary["vta_macs"] == report.vta_macs
    assert summary["host_relayouts"] == report.host_relayouts
    assert summary["end_to_end_cycles"] == pytest.approx(report.end_to_end_cycles)
    assert summary["padded_operators"] == 4 and summary["line"] == report.summary()
    assert set(report.timings) and json.loads(report.to_json(indent=1)) == data


def test_csv_has_one_row_per_operator(chain_build, tmp_path):
    _, _, report, _, _ = chain_build
    path = tmp_path / "report.csv"
    text = report.to_csv(path)
    assert path.read_text() == text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(report.operators) == 6
    for row, p in zip(rows, report.operators):
        assert (row["device"], row["op"], row["name"], row["layer"]) == (p.device, p.op, p.name,
                                                                          p.layer)
        assert row["cycles"] == ("" if p.device == "cpu" else str(report.cycles(p)))
        assert row["efficiency"] == ("" if p.device == "cpu" else str(report.efficiency(p)))
        assert row["floor"] == ("" if p.device == "cpu" else str(report.floor(p).total))
        assert row["detail"] == p.detail
    assert report.to_csv() == text


# ------------------------------------------------------------------------------ config
def test_a_modified_preset_is_not_reported_as_the_preset():
    mod = _unpadded_conv()
    config = dataclasses.replace(load_config("default"), LOG_INP_BUFF_SIZE=12)
    relax.build(mod, target=vta_target(config))
    report = vta_ext.last_build_report()
    label = f"default (modified, {config_digest(config)[:8]})"
    assert report.config == label
    assert str(report).startswith(f"ext_vta build ({label}, strategy stock)")
    relax.build(mod, target=vta_target("default"))
    assert vta_ext.last_build_report().config == "default"
    assert vta_ext.report.config_label(load_config("pipelined")) == "pipelined"


def test_executed_macs_are_the_cycle_models_without_timing(chain_build, monkeypatch):
    """The padding figure's MAC count (:func:`vta_ext.report.executed_macs`) equals the full cycle
    model's count of every VTA call, and needs no cycle-model run: with the model's run broken,
    the padding figures and the report's padding line stay the same."""
    from vta_ext.report import executed_macs
    from vta_ext.sim.cycles import CycleModel

    _, _, report, _, _ = chain_build
    programs = {k: vta_ext.executor.compiled_op(k).program for k in report.vta_keys}
    fresh = {k: CycleModel(p.config).run_program(p).macs for k, p in programs.items()}
    assert [executed_macs(k) for k in report.vta_keys] == [fresh[k] for k in report.vta_keys]
    assert fresh[report.vta_keys[0]] == 32 * 16 * 8 * 8 * 3 * 3   # conv1, padded: by hand
    figures = [report.padding_overhead(p) for p in report.on_vta]
    line = report.padding_text()

    def broken(*args, **kwargs):
        raise AssertionError("the padding figure ran the cycle model")

    monkeypatch.setattr(CycleModel, "run_program", broken)
    monkeypatch.setattr(vta_ext.executor, "_CYCLES", {})
    assert [report.padding_overhead(p) for p in report.on_vta] == figures
    assert report.padding_text() == line


# ------------------------------------------------------------------------------ CSP, networks
@pytest.mark.usefixtures("fresh_embedding_cache")
def test_csp_line_names_the_embedding_and_its_padding():
    """A thin-channel conv under csp-relaxed in NHWC: the line reads ``csp-relaxed NHWC x=1 y=k16
    z=...``, and its padding equals the embedding's own padded volume."""
    import tvm_csp_embed  # noqa: F401 - registers the CSP strategies
    from tvm_csp_embed.strategy import CspWorkload, packed_of

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 16, 16), "int8"))
    w = relax.Var("w", relax.TensorType((32, 3, 3, 3), "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(conv_chain(bb, x, w, None, stride=2, padding=1, shift=6,
                                            clip=(-128, 127)))
        bb.emit_func_output(out)
    with vta_ext.build_options(strategy="csp-relaxed", layout="NHWC"):
        relax.build(bb.get(), target="ext_vta")
    report = vta_ext.last_build_report()
    (p,) = report.on_vta
    _check_lines(report)
    embedding = packed_of(CspWorkload(**json.loads(report.vta_keys[0])["workload"]),
                          load_config("default")).embedding
    assert p.plan == f"csp-relaxed NHWC {embedding.mapping_str()}"
    assert p.plan.startswith("csp-relaxed NHWC x=1 y=k16 z=") and f" {p.plan} " in str(report)
    assert p.padding and report.padding_overhead(p) == (
        pytest.approx(embedding.padded_volume_ratio - 1), "MACs")


def test_resnet18_32_report():
    """ResNet-18 at 32x32 (stock): every line fits, the cycles are each call's, the MACs on VTA
    are the network's conv / matmul MACs (``mac_placement``), the stem and the classifier pad."""
    from models import mac_placement, quantized_example

    from vta_ext.quantize import op_macs

    start = time.perf_counter()
    _, qm, _, _ = quantized_example("resnet18", 32)
    with vta_ext.build_options(strategy="stock"):
        relax.build(qm.mod, target="ext_vta")
    report = vta_ext.last_build_report()
    text, lines = _check_lines(report)
    assert len(report.on_vta) == 31 and len(lines) == len(report.operators)
    macs = mac_placement(op_macs(qm.mod), report)
    assert macs["consistent"] and report.vta_macs == macs["vta"] and report.cpu_macs == macs["cpu"]
    stem, fc = report.on_vta[0], report.on_vta[-1]
    assert report.padded == [stem, fc]
    assert report.padding_overhead(stem) == (pytest.approx(16 / 3 - 1), "MACs")  # 3 -> 16 in
    assert report.padding_overhead(fc) == (pytest.approx(1008 / 1000 - 1), "MACs")  # 1000 -> 1008
    assert report.explain("conv1").startswith(stem.detail + "; floor ")
    assert report.explain("fc").startswith(fc.detail + "; floor ")
    # no operator (conv, dense, pools, adds) beats its floor; the totals are the sums
    assert all(0 < report.efficiency(p) <= 1 for p in report.on_vta)
    assert report.vta_floor == pytest.approx(sum(report.floor(p).total for p in report.on_vta))
    assert f"({report.floor_text()})" in text and 0 < report.vta_efficiency <= 1
    assert "padding: 2 of 31 VTA operators pad their operands (max 433 % extra MACs)" in text
    assert time.perf_counter() - start < 120
