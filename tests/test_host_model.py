"""The host model (``vta_ext.host``), the build report's end-to-end figures and the default
``end-to-end`` objective.

Layout traffic and MACs are checked against hand counts; VTA cycles against the cycle model of
the executed program; outputs against numpy.
"""
import numpy as np
import pytest
import tvm
from conftest import REPO, conv2d_nchw, conv_chain, conv_module, emitted_packing, requantize
from tvm import relax

import tvm_csp_embed  # noqa: F401
import vta_ext
from vta_ext.host import PYNQ_Z1, VIEW_OPS, HostModel, layout_traffic
from vta_ext.packing import BlockedActivation, BlockedMatrix, FlatActivation


@pytest.mark.parametrize("field", ["layout_bytes_per_cycle", "cpu_macs_per_cycle"])
@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "6.5"])
def test_host_model_rejects_bad_rates_naming_the_field(field, bad):
    with pytest.raises(ValueError, match=f"HostModel.{field}=.*positive number"):
        HostModel(**{field: bad})


def test_build_options_take_a_host_model_or_its_fields():
    with vta_ext.build_options(host={"layout_bytes_per_cycle": 16.0}) as opts:
        assert opts.host == HostModel(16.0, PYNQ_Z1.cpu_macs_per_cycle, "custom")
        assert "host=HostModel(custom" in repr(opts)
    assert vta_ext.build_options().host is PYNQ_Z1
    with pytest.raises(ValueError, match="unknown host model field.*bandwidth.*valid: "
                                         "cpu_macs_per_cycle, layout_bytes_per_cycle, name"):
        vta_ext.build_options(host={"bandwidth": 1})
    with pytest.raises(ValueError, match="host must be a vta_ext.HostModel"):
        vta_ext.build_options(host=6.5)
    assert PYNQ_Z1.layout_cycles(13) == 2.0 and PYNQ_Z1.cpu_cycles(26) == 2.0


def test_layout_traffic_counts_copies_not_views():
    # 3 channels padded to 16: the zero pad writes 1x16x4x4, the transpose writes it again
    assert layout_traffic(BlockedActivation(1, 3, 4, 4, 1, 16)) == 2 * 16 * 16
    # 32 channels: no padding step, one transpose of 512 elements (the reshape is a view)
    assert layout_traffic(BlockedActivation(1, 32, 4, 4, 1, 16)) == 32 * 16
    # a classifier's (1, 1000) features: 1000 -> 1008 channels, padded then transposed
    assert layout_traffic(FlatActivation(1, 1000, 1, 16)) == 2 * 1008
    assert layout_traffic(BlockedMatrix(1, 1024, 1, 16)) == 1024
    assert layout_traffic(None) == 0


def test_report_end_to_end_figures_by_hand():
    """One stock conv (16 -> 32 channels, 10x10, no channel padding) whose weight and bias are
    function parameters, so the host packs them per inference too: the 1x16x10x10 input (one
    transpose: 1,600 B), the 32x16x3x3 weight (one transpose: 4,608 B), the 32 int32 bias words
    (128 B), and it unpacks the 1x32x10x10 output (one transpose: 3,200 B). VTA cycles are the
    executed program's."""
    mod = conv_module(1, 16, 32, 10, 3)
    with vta_ext.build_options(strategy="stock"):
        ex = relax.build(mod, target="ext_vta")
    report = vta_ext.last_build_report()
    assert report.layout_bytes == 1600 + 4608 + 128 + 3200 and report.cpu_macs == 0
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (1, 16, 10, 10)).astype(np.int8)
    w = rng.integers(-128, 128, (32, 16, 3, 3)).astype(np.int8)
    b = rng.integers(-3000, 3000, (1, 32, 1, 1)).astype(np.int32)
    vta_ext.clear_run_log()
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in (x, w, b)])
    np.testing.assert_array_equal(got.numpy(), requantize(conv2d_nchw(x, w, 1, 1), b, 8, (0, 127)))
    (run,) = vta_ext.run_log()
    assert report.vta_cycles == run.cycles.total_cycles > 0
    assert report.end_to_end_cycles == pytest.approx(run.cycles.total_cycles + 9536 / 6.5)
    assert "end to end" in str(report) and "host layout 9,536 B" in str(report)


def test_report_counts_macs_left_on_the_cpu():
    """A dilated conv2d stays on the CPU under stock: its MACs (1x8x8x8 outputs x 8x3x3) are
    priced at the host model's MAC rate."""
    mod = conv_module(1, 8, 8, 12, 3, padding=2, dilation=2)
    with vta_ext.build_options(strategy="stock", host={"cpu_macs_per_cycle": 4.0}):
        relax.build(mod, target="ext_vta")
    report = vta_ext.last_build_report()
    assert ("relax.nn.conv2d", "cpu") in report.placement()
    macs = 1 * 8 * 12 * 12 * 8 * 3 * 3
    assert report.cpu_macs == macs
    assert report.host_cycles == pytest.approx(report.layout_bytes / 6.5 + macs / 4.0)


def _chain(c, k, hw):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, hw, hw), "int8"))
    w1 = relax.Var("w1", relax.TensorType((k, c, 1, 1), "int8"))
    w2 = relax.Var("w2", relax.TensorType((c, k, 1, 1), "int8"))
    with bb.function("main", [x, w1, w2]):
        with bb.dataflow():
            y = conv_chain(bb, x, w1, None, shift=8, clip=(-128, 127))
            y = conv_chain(bb, y, w2, None, shift=8, clip=(-128, 127))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("rate", [0.05, 6.5])
def test_end_to_end_objective_weighs_host_traffic(tmp_path, monkeypatch, rate):
    """A 1x1 expand / project pair (MobileNetV2's shape): priced by the host model, the plans the
    end-to-end objective picks cost no more end to end than the VTA-cycles objective's or the
    stock templates', and when host copies are dear (0.05 B/cycle) it leaves no more host
    relayouts than the cycles objective. Outputs are bit-exact either way."""
    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    mod = _chain(24, 96, 28)
    host = HostModel(layout_bytes_per_cycle=rate)
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (1, 24, 28, 28)).astype(np.int8)
    w1 = rng.integers(-128, 128, (96, 24, 1, 1)).astype(np.int8)
    w2 = rng.integers(-128, 128, (24, 96, 1, 1)).astype(np.int8)
    ref = requantize(conv2d_nchw(requantize(conv2d_nchw(x, w1), None, 8, (-128, 127)), w2),
                     None, 8, (-128, 127))
    reports = {}
    for name, opts in {"stock": dict(strategy="stock"),
                       "cycles": dict(strategy="csp-relaxed", objective="cycles"),
                       "end-to-end": dict(strategy="csp-relaxed")}.items():
        with vta_ext.build_options(host=host, **opts):
            ex = relax.build(mod, target="ext_vta")
        reports[name] = vta_ext.last_build_report()
        got = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in (x, w1, w2)])
        np.testing.assert_array_equal(got.numpy(), ref)
    e2e = {k: r.end_to_end_cycles for k, r in reports.items()}
    assert e2e["end-to-end"] <= min(e2e["cycles"], e2e["stock"]), e2e
    if rate < 1:
        assert reports["end-to-end"].layout_bytes <= reports["cycles"].layout_bytes


def test_copied_counts_what_the_pack_emits_for_a_stencil_unrolled_layout():
    """The choice prices an input's packing by ``layout.copied``; the build report counts the
    output of every non-view Relax op the packing emits. For a stencil-unrolled input the two
    must agree, or the end-to-end choice misjudges it. The packing (a pad and stencil unrolls,
    two or more copying steps) is one fused host kernel (``call_tir``), not a slice per stencil
    point nor an op per step, and the compiled packing equals the numpy packing."""
    import tvm
    from tvm import relax

    from tvm_csp_embed.strategy import CspWorkload, candidates
    from vta_ext.config import load_config

    cfg = load_config("default")
    p = (("n", 1), ("c", 8), ("h", 16), ("w", 16), ("k", 24), ("kh", 3), ("kw", 3), ("pt", 1),
         ("pl", 1), ("pb", 1), ("pr", 1), ("sh", 1), ("sw", 1))
    cands, _ = candidates(cfg, CspWorkload("conv2d", p), "relaxed", ["fused-rs"], ())
    layouts = [o.host for c in cands for o in (c.packed.operands["A"], c.packed.operands["B"])
               if o.tensor == c.embedding.workload.inputs[0].name and o.host.unrolled]
    assert layouts, "no stencil-unrolled input among the fused-rs embeddings"

    rng = np.random.default_rng(0)
    for layout in layouts:
        written, pack = emitted_packing(layout)
        assert sum(n for _, n in written) == layout.copied == layout_traffic(layout), layout
        assert [op for op, _ in written] == ["relax.call_tir"], written
        src = rng.integers(-128, 128, layout.src_shape).astype(np.int8)
        np.testing.assert_array_equal(pack(src), layout.pack_numpy(src))


def test_operands_that_are_function_inputs_are_priced_as_the_report_counts_them(tmp_path,
                                                                               monkeypatch):
    """Weights and biases that are function inputs (the README example) are packed on the host
    at every inference. The choice prices that packing (``choice.operand_pack_bytes``) for the
    stock plan as the report counts it: the report's layout bytes with them as inputs, less with
    them bound as constants (relayouted at build time). And the README example's plan costs no
    more end to end than stock's."""
    import sys

    from tvm_csp_embed import choice

    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    mod = conv_module(1, 8, 24, 16, 3)
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (24, 8, 3, 3)).astype(np.int8)
    b = rng.integers(-1000, 1000, (1, 24, 1, 1)).astype(np.int32)
    bound = relax.transform.BindParams("main", {"w": tvm.runtime.tensor(w),
                                                "b": tvm.runtime.tensor(b)})(mod)
    layout = {}
    for name, m in (("inputs", mod), ("constants", bound)):
        with vta_ext.build_options(strategy="stock"):
            relax.build(m, target="ext_vta")
        layout[name] = vta_ext.last_build_report().layout_bytes
    priced = []
    real = choice.operand_pack_bytes

    def spy(op, inputs):
        n = real(op, inputs)
        if not inputs.__module__.startswith("tvm_csp_embed"):   # the stock template's plan
            priced.append(n)
        return n

    monkeypatch.setattr(choice, "operand_pack_bytes", spy)
    with vta_ext.build_options(strategy="csp-relaxed"):
        relax.build(mod, target="ext_vta")
    assert priced and set(priced) == {layout["inputs"] - layout["constants"]} != {0}, \
        (priced, layout)
    monkeypatch.setattr(choice, "operand_pack_bytes", real)

    sys.path.insert(0, str(REPO / "relay_examples"))
    try:
        from conv_block import build_model
    finally:
        sys.path.remove(str(REPO / "relay_examples"))
    example = build_model()[0]
    e2e = {}
    for strategy in ("stock", "csp-relaxed"):
        with vta_ext.build_options(strategy=strategy):
            relax.build(example, target="ext_vta")
        e2e[strategy] = vta_ext.last_build_report().end_to_end_cycles
    assert e2e["csp-relaxed"] <= e2e["stock"], e2e
