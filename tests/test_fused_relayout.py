"""A host relayout chain with two or more copying steps is emitted as one fused kernel
(``tvm_csp_embed.codegen.fusedcopy``), and its price (``HostLayout.copied`` /
``HostLayout.unpack_copied``) is what the emitted ops write.

``relax.build``'s default pipeline fuses nothing: a permute and a slice are two PrimFuncs that each
write their whole output (checked here on the llvm build), so a chain emitted op by op costs one
pass per copying step. References: numpy (``np.transpose``/``np.pad``/slicing, written here), the
llvm build of the emitted Relax, the ext_vta build run on the functional simulator against llvm.
"""
import numpy as np
import pytest
from conftest import RecordingPacker, emitted_packing

from tvm_csp_embed.codegen.relayout import HostLayout


def _prim_funcs(mod):
    """The PrimFuncs ``main`` calls after relax.build's default pipeline (the host kernels; a
    reshape the pipeline made a view is not called)."""
    import tvm
    from tvm import relax

    with tvm.target.Target("llvm"):
        lowered = relax.get_pipeline("default")(mod)
    called = {gv.name_hint for gv in relax.analysis.all_global_vars(lowered["main"])}
    return sorted(gv.name_hint for gv, f in lowered.functions.items()
                  if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint in called)


def _unpack_module(layout):
    """A Relax module that unpacks ``layout``'s packed tensor through the packer interface; the
    ops it emits (name, elements written) of those that copy."""
    from tvm import relax

    from vta_ext.host import VIEW_OPS

    written = []
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(layout.shape, "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = layout.unpack(RecordingPacker(bb, written), x)
            n = int(np.prod([int(d) for d in layout.src_shape]))
            if out.op.name not in VIEW_OPS:          # the last op is returned unbound
                written.append((out.op.name, n))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get(), written


def _run(mod, array):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(array)).numpy()


def test_the_default_pipeline_makes_a_permute_and_a_slice_two_kernels():
    """Why the fusion is needed: a permute_dims then a strided_slice, emitted as two Relax ops,
    are two PrimFuncs after relax.build's default pipeline (each writes its whole output)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 6, 8), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(relax.op.permute_dims(x, [2, 0, 1]))
            out = bb.emit_output(relax.op.strided_slice(t, axes=[2], begin=[0], end=[5]))
        bb.emit_func_output(out)
    assert len(_prim_funcs(bb.get())) == 2


# a padded-column unpack whose column blocks move, a channel-padded one, and one whose permute
# moves only unit axes (a view: the slice alone, as in DB0's padded-output-column twin)
UNPACKS = [
    ((1, 4, 3, 11), (("pad", ((0, 0), (0, 0), (0, 0), (0, 5))), ("reshape", (1, 4, 3, 2, 8)),
                     ("permute", (0, 3, 1, 2, 4)))),
    ((1, 5, 3, 4), (("pad", ((0, 0), (0, 3), (0, 0), (0, 0))), ("reshape", (1, 1, 8, 3, 4)),
                    ("permute", (0, 1, 3, 4, 2)))),
    ((1, 4, 3, 11), (("pad", ((0, 0), (0, 0), (0, 0), (0, 5))), ("reshape", (1, 4, 3, 1, 16, 1)),
                     ("permute", (0, 1, 2, 3, 5, 4)))),
]


@pytest.mark.parametrize("src,steps", UNPACKS)
def test_an_unpack_with_a_crop_is_one_kernel_priced_as_one_copy(src, steps):
    layout = HostLayout(src, steps, "out")
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, src).astype(np.int8)
    packed = layout.pack_numpy(x)
    # the numpy reference, written from the steps' meaning: pad, reshape, transpose
    ref = np.transpose(np.pad(x, steps[0][1]).reshape(steps[1][1]), steps[2][1])
    np.testing.assert_array_equal(packed, ref)
    mod, written = _unpack_module(layout)
    np.testing.assert_array_equal(_run(mod, packed), x)
    moves = [p for p in steps[2][1] if steps[1][1][p] != 1] != sorted(
        p for p in steps[2][1] if steps[1][1][p] != 1)
    # one op writes the unpacked tensor once; a view permute leaves the slice alone
    assert written == [("relax.call_tir" if moves else "relax.strided_slice", x.size)]
    assert layout.unpack_copied == x.size
    assert len(_prim_funcs(mod)) == 1


def test_a_pack_chain_of_pad_concat_unroll_and_transpose_is_one_kernel():
    """pad + concat + stencil unroll (affine and redirected) + transpose: one call_tir; the set
    after them stays its own ``where`` (``relayout.UNFUSED_KINDS``); bit-exact against numpy,
    priced as the two outputs."""
    src = (1, 2, 9)
    steps = (("pad", ((0, 0), (0, 1), (1, 2))),                    # (1, 3, 12)
             ("concat", 2, (7, -3), "int8"),                         # (1, 3, 14)
             ("unroll", 2, (4, 3), (3, 1), 0, (((1, 2), 13),)),      # (1, 3, 4, 3)
             ("permute", (0, 2, 1, 3)),                              # (1, 4, 3, 3)
             ("set", (1, 1, 3, 1), ((0, 0, 1, 0),), (5,), "int8"),
             ("reshape", (4, 9)))
    layout = HostLayout(src, steps, "data")
    rng = np.random.default_rng(2)
    x = rng.integers(-128, 128, src).astype(np.int8)
    # numpy reference from the steps' meaning
    a = np.concatenate([np.pad(x, steps[0][1]), np.broadcast_to(
        np.array([7, -3], np.int8), (1, 3, 2))], axis=2)
    idx = np.array([[3 * i + j for j in range(3)] for i in range(4)])
    idx[1, 2] = 13
    a = np.transpose(a[:, :, idx], (0, 2, 1, 3)).copy()
    a[:, :, 1, :] = 5
    ref = a.reshape(4, 9)
    np.testing.assert_array_equal(layout.pack_numpy(x), ref)
    written, pack = emitted_packing(layout)
    np.testing.assert_array_equal(pack(x), ref)
    assert written == [("relax.call_tir", ref.size), ("relax.where", ref.size)]
    assert layout.copied == 2 * ref.size


def test_a_lone_copying_step_stays_a_plain_op():
    layout = HostLayout((2, 3, 4), (("permute", (2, 0, 1)), ("reshape", (4, 6))), "d")
    written, pack = emitted_packing(layout)
    x = np.arange(24, dtype=np.int8).reshape(2, 3, 4)
    np.testing.assert_array_equal(pack(x), np.transpose(x, (2, 0, 1)).reshape(4, 6))
    assert written == [("relax.permute_dims", 24)]
    assert layout.copied == 24


@pytest.mark.slow
def test_db0_padded_twin_runs_bit_exact_with_its_fused_host_kernels():
    """DB0 (1x1x161x700 * 32x1x5x20, s2) on ``pipelined`` with the plan of fewest VTA cycles (the
    padded-output-column twin, output columns 341 -> 352, filter rows x columns 100 -> 112):
    bit-exact against llvm, and the host writes the packed input once (22 column blocks x 79
    rows x 7 rs blocks x 16 x 16) and the cropped output once (32 x 79 x 341), where op by op it
    wrote six intermediate tensors."""
    import sys
    from pathlib import Path

    import vta_ext
    from conftest import random_inputs, run_module

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import tune_figures as tf

    row = dict(id=0, n=1, c=1, h=161, w=700, k=32, filter_h=5, filter_w=20, pad_h=0, pad_w=0,
               hstride=2, wstride=2)
    mod = tf.deepbench_module(row, "bias-shift-clip", True)
    arrays = random_inputs(mod, 0)
    with vta_ext.build_options(strategy="csp-relaxed", objective="cycles"):
        got = run_module(mod, vta_ext.vta_target("pipelined"), arrays)
        report = vta_ext.last_build_report()
    np.testing.assert_array_equal(got, run_module(mod, "llvm", arrays))
    (p,) = [p for p in report.on_vta if p.call is not None]
    assert "PADDED output columns 341->352" in report.explain(report.operators.index(p))
    assert report.layout_bytes == 22 * 79 * 7 * 16 * 16 + 32 * 79 * 341
