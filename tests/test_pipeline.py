"""relax.build(mod, target="ext_vta"): offload, packing, build report, bit-exactness vs llvm."""
import numpy as np
import pytest
import tvm
from tvm import relax

import vta_ext
from conftest import conv2d_nchw, conv_chain, conv_module, random_inputs, requantize, run_module


def _conv_chain(bb, x, w, b, *, stride, padding, shift, clip):
    return conv_chain(bb, x, w, b, stride=stride, padding=padding, shift=shift, clip=clip)


def _module(n, c, o, hw, k, *, stride=1, padding=1, bias=True, shift=8, clip=(0, 127)):
    return conv_module(n, c, o, hw, k, stride=stride, padding=padding, bias=bias, shift=shift,
                       clip=clip)


_inputs = random_inputs
_run = run_module


def _numpy_reference(x, w, b, stride, padding, shift, clip):
    """Direct int64 conv2d + epilogue, wrapping to int8 like astype."""
    return requantize(conv2d_nchw(x, w, stride, padding), b, shift, clip)


@pytest.mark.parametrize("n,c,o,hw,k,stride,padding,bias,shift,clip,padded", [
    (1, 16, 32, 8, 3, 1, 1, True, 8, (0, 127), ""),                      # multiples of the block
    (1, 3, 20, 9, 3, 2, 1, True, 6, (-128, 127),                         # thin input, odd output
     "in channels 3->16, out channels 20->32"),
    (1, 24, 16, 7, 1, 1, 0, False, 4, None, "in channels 24->32"),      # 1x1, no bias, no clip
    (2, 16, 16, 6, 3, 2, 0, True, None, (-10, 90), ""),                  # batch 2 (BATCH is 1)
])
def test_conv_chain_matches_llvm_and_numpy(n, c, o, hw, k, stride, padding, bias, shift, clip,
                                           padded):
    mod = _module(n, c, o, hw, k, stride=stride, padding=padding, bias=bias, shift=shift, clip=clip)
    arrays = _inputs(mod, seed=c * 131 + o)
    vta_ext.clear_run_log()
    got = _run(mod, "ext_vta", arrays)
    assert len(vta_ext.run_log()) == 1, "the conv2d chain must run on VTA exactly once"
    cpu = _run(mod, "llvm", arrays)
    ref = _numpy_reference(arrays[0], arrays[1], arrays[2] if bias else None, stride, padding, shift, clip)
    np.testing.assert_array_equal(cpu, ref)
    np.testing.assert_array_equal(got, ref)
    report = vta_ext.last_build_report()
    assert [p.op for p in report.on_vta] == ["relax.nn.conv2d"]
    assert all(p.reason == "layout transform around a VTA operator" for p in report.on_cpu)
    if padded:
        assert report.on_vta[0].detail.endswith(f"PADDED {padded}")
    else:
        assert "PADDED" not in report.on_vta[0].detail


def test_report_names_cpu_operators_and_reasons():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "int8"))
    w = relax.Var("w", relax.TensorType((16, 16, 3, 3), "int8"))
    wg = relax.Var("wg", relax.TensorType((16, 8, 3, 3), "int8"))
    xf = relax.Var("xf", relax.TensorType((1, 16, 8, 8), "float32"))
    wf = relax.Var("wf", relax.TensorType((16, 16, 3, 3), "float32"))
    with bb.function("main", [x, w, wg, xf, wf]):
        with bb.dataflow():
            a = _conv_chain(bb, x, w, None, stride=1, padding=1, shift=8, clip=(0, 127))
            g = bb.emit(relax.op.nn.conv2d(x, wg, padding=1, groups=2, out_dtype="int32"))
            g = bb.emit(relax.op.astype(bb.emit(relax.op.clip(g, -128, 127)), "int8"))
            f = bb.emit(relax.op.nn.conv2d(xf, wf, padding=1))
            p = bb.emit(relax.op.nn.max_pool2d(a, pool_size=2))
            s = bb.emit(relax.op.nn.softmax(f))
            out = bb.emit_output(relax.Tuple([p, g, s]))
        bb.emit_func_output(out)
    relax.build(bb.get(), target="ext_vta")
    report = vta_ext.last_build_report()
    assert report.placement() == [
        ("relax.nn.conv2d", "vta"), ("relax.nn.max_pool2d", "vta"),
        ("relax.nn.conv2d", "cpu"), ("relax.clip", "cpu"), ("relax.astype", "cpu"),  # groups=2
        ("relax.nn.conv2d", "cpu"), ("relax.nn.softmax", "cpu")]                    # float32
    reasons = {p.name: p.reason for p in report.on_cpu}
    group_conv, float_conv = [p.name for p in report.on_cpu if p.op == "relax.nn.conv2d"]
    assert reasons[group_conv].startswith("groups=2: 8 input / 8 output channels per group are "
                                          "not multiples of the 16x16 GEMM block")
    assert reasons[float_conv] == "data/weight are float32/float32, VTA needs int8/int8"
    assert [p.reason for p in report.on_cpu if p.op == "relax.nn.softmax"] == [
        "no VTA template for this operator"]
    assert "VTA runs 1x relax.nn.conv2d, 1x relax.nn.max_pool2d" in report.summary()


def test_llvm_target_is_untouched():
    mod = _module(1, 16, 16, 6, 3)
    vta_ext.clear_run_log()
    _run(mod, "llvm", _inputs(mod, 0))
    assert vta_ext.run_log() == []


def test_streams_are_built_at_build_time_not_at_run_time(monkeypatch):
    """After relax.build, running must not compile anything: make compiling impossible, then run."""
    from vta_ext import strategy

    mod = _module(1, 16, 16, 5, 3, stride=1, padding=1, shift=7)
    executable = relax.build(mod, target="ext_vta")

    def no_compiling(*args, **kwargs):
        raise AssertionError("a VTA operator was compiled at run time")

    monkeypatch.setattr(strategy, "get_template", no_compiling)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    arrays = _inputs(mod, 3)
    vta_ext.clear_run_log()
    for _ in range(2):
        got = vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    assert len(vta_ext.run_log()) == 2
    np.testing.assert_array_equal(got, _numpy_reference(*arrays, 1, 1, 7, (0, 127)))


def test_consecutive_vta_convs_keep_packed_layout():
    """conv -> conv: no unpack/pack pair in between, and still bit-exact. clip lo = 3 makes the
    producer's padded channels non-zero, so they must be cancelled by zero-padded weights."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 5, 8, 8), "int8"))
    w1 = relax.Var("w1", relax.TensorType((20, 5, 3, 3), "int8"))
    w2 = relax.Var("w2", relax.TensorType((12, 20, 1, 1), "int8"))
    with bb.function("main", [x, w1, w2]):
        with bb.dataflow():
            y = _conv_chain(bb, x, w1, None, stride=1, padding=1, shift=5, clip=(3, 100))
            y = _conv_chain(bb, y, w2, None, stride=2, padding=0, shift=4, clip=(-128, 127))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    arrays = _inputs(mod, 11)
    vta_ext.clear_run_log()
    got = _run(mod, "ext_vta", arrays)
    report = vta_ext.last_build_report()
    assert len(vta_ext.run_log()) == 2
    assert report.placement() == [("relax.nn.conv2d", "vta")] * 2
    assert "kept in the packed layout" in report.on_vta[1].detail
    transposes = [p for p in report.on_cpu if p.op == "relax.permute_dims"]
    assert len(transposes) == 4  # pack data + 2 weights, one final unpack: none between the convs
    y1 = _numpy_reference(arrays[0], arrays[1], None, 1, 1, 5, (3, 100))
    np.testing.assert_array_equal(got, _numpy_reference(y1, arrays[2], None, 2, 0, 4, (-128, 127)))
    np.testing.assert_array_equal(got, _run(mod, "llvm", arrays))


def test_unused_prim_funcs_of_the_pipeline_are_dropped_before_codegen(monkeypatch):
    """TVM's pipeline legalizes a reshape into a PrimFunc, rewrites the call into a view and leaves
    the PrimFunc behind; the ext_vta pipeline drops such dead PrimFuncs before LLVM sees them, keeps
    every PrimFunc the Relax code calls and the input module's own, and the build stays bit-exact."""
    from tvm import te

    import vta_ext.target as target_mod

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "int8"))
    w = relax.Var("w", relax.TensorType((16, 16, 3, 3), "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = conv_chain(bb, x, w, None, stride=1, padding=1, shift=4, clip=(0, 127))
            y = bb.emit(relax.op.reshape(y, (1, 16, 64)))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    src = te.placeholder((4,), "int8", name="src")          # a user PrimFunc that nothing calls
    user = te.create_prim_func([src, te.compute((4,), lambda i: src[i], name="dst")])
    bb.add_func(user.with_attr("global_symbol", "user_kernel"), "user_kernel")
    mod = bb.get()

    seen = {}
    stamp = target_mod.stamp_host_target

    @tvm.transform.module_pass(opt_level=0, name="Spy")
    def spy(m, ctx):
        seen["names"] = {gv.name_hint for gv, f in m.functions.items()
                         if isinstance(f, tvm.tirx.PrimFunc)}
        seen["called"] = {gv.name_hint for f in m.functions.values() if isinstance(f, relax.Function)
                          for gv in relax.analysis.all_global_vars(f)}
        return stamp(m)

    monkeypatch.setattr(target_mod, "stamp_host_target", spy)
    arrays = random_inputs(mod, 0)
    with vta_ext.build_options(strategy="stock"):
        got = run_module(mod, "ext_vta", arrays)
    np.testing.assert_array_equal(got, run_module(mod, "llvm", arrays))
    assert "user_kernel" in seen["names"]
    assert not any("reshape" in n for n in seen["names"]), seen["names"]
    assert seen["names"] - {"user_kernel"} <= seen["called"], seen

    # the pass alone, on the legalized module where the reshape's PrimFunc is dead
    legal = relax.transform.RewriteDataflowReshape()(relax.transform.LegalizeOps()(mod))
    names = {gv.name_hint for gv, f in legal.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    reshapes = {n for n in names if "reshape" in n}
    assert reshapes, names
    kept = target_mod.drop_unused_prim_funcs(["user_kernel"])(legal)
    left = {gv.name_hint for gv, f in kept.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert left == names - reshapes, (names, left)
    assert "user_kernel" not in {gv.name_hint for gv in
                                 target_mod.drop_unused_prim_funcs([])(legal).functions}




def test_host_copies_of_one_kind_share_one_shape_generic_function():
    """One permutation on three shapes and one pad width on three shapes: after
    ``shape_generic_host_kernels`` one shape-generic PrimFunc each; a permutation met on one
    shape only, a pad of another value met on two shapes and the concats stay Relax operators
    (static functions are cheaper to compile unless shared, ``SHARED_SHAPES``). The llvm build
    gives numpy's results."""
    from vta_ext.host_kernels import SHARED_SHAPES, shape_generic_host_kernels

    assert SHARED_SHAPES == 3
    shapes = [(1, 4, 3, 5, 16), (1, 8, 3, 5, 16), (2, 3, 4), (1, 2, 3, 5, 16), (1, 3, 3, 5, 16)]
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(s, "int8")) for i, s in enumerate(shapes)]
    widths = [0, 0, 0, 0, 1, 2, 0, 3, 0, 0]
    other = [0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    perm = [0, 2, 3, 1, 4]
    with bb.function("main", xs):
        with bb.dataflow():
            outs = [bb.emit(relax.op.permute_dims(xs[i], perm)) for i in (0, 1, 3)]
            outs += [bb.emit(relax.op.permute_dims(xs[2])),
                     bb.emit(relax.op.concat([xs[0], xs[3], xs[1]], axis=1))]
            outs += [bb.emit(relax.op.nn.pad(xs[i], widths, pad_value=-5)) for i in (0, 1, 4)]
            outs += [bb.emit(relax.op.nn.pad(xs[i], other)) for i in (3, 4)]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod = shape_generic_host_kernels(bb.get())
    prims = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(prims) == 2
    text = mod.script()
    assert text.count("R.call_tir") == 6
    assert text.count("R.permute_dims") == 1 and text.count("R.nn.pad") == 2 and "R.concat" in text
    rng = np.random.default_rng(0)
    a = [rng.integers(-128, 128, s).astype(np.int8) for s in shapes]
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(x) for x in a])
    pads = list(zip(widths[0::2], widths[1::2]))
    want = ([a[i].transpose(perm) for i in (0, 1, 3)] + [a[2].T, np.concatenate([a[0], a[3], a[1]], 1)]
            + [np.pad(a[i], pads, constant_values=-5) for i in (0, 1, 4)]
            + [np.pad(a[i], list(zip(other[0::2], other[1::2]))) for i in (3, 4)])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w)
