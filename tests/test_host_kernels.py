"""vta_ext.host_kernels: canonical forms of host copies and their shape-generic functions, against
numpy (the canonical forms) and numpy through the llvm build (the rewritten modules)."""
import numpy as np
import pytest
import tvm
from tvm import relax

from vta_ext.host_kernels import (SHARED_SHAPES, canonical_permutation, canonical_window,
                                  shape_generic_host_kernels)


def _random_shape(rng, ndim):
    # about a third of the axes of extent 1, as in packed layouts
    return tuple(int(rng.choice([1, 1, 2, 3, 5])) for _ in range(ndim))


def test_a_canonical_permutation_moves_the_bytes_numpy_moves():
    """On 300 random shapes (many unit axes) and permutations: the input read row-major in the
    canonical shape, transposed by the canonical axes, gives numpy's transpose byte for byte; no
    two neighbouring canonical input axes stay neighbours in the output (nothing left to merge);
    no canonical axis has extent 1."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        ndim = int(rng.integers(1, 9))
        shape = _random_shape(rng, ndim)
        axes = tuple(int(a) for a in rng.permutation(ndim))
        x = rng.integers(-128, 128, shape).astype(np.int8)
        merged, perm = canonical_permutation(shape, axes)
        assert int(np.prod(merged)) == x.size and 1 not in merged
        got = x.reshape(merged).transpose(perm).ravel()
        np.testing.assert_array_equal(got, x.transpose(axes).ravel())
        assert all(perm[i] + 1 != perm[i + 1] for i in range(len(perm) - 1))


def test_identity_permutations_are_one_axis():
    """A permutation that only moves axes of extent 1 is the identity in canonical form."""
    assert canonical_permutation((1, 63, 1, 16), (0, 1, 3, 2)) == ((1008,), (0,))
    assert canonical_permutation((1, 17, 24, 14, 1, 1, 16), (0, 1, 2, 3, 4, 6, 5))[1] == (0,)
    assert canonical_permutation((1, 1), (1, 0)) == ((), ())
    assert canonical_permutation((5, 16, 1, 7, 7), (0, 3, 4, 2, 1)) == ((5, 16, 49), (0, 2, 1))


@pytest.mark.parametrize("crop", [False, True])
def test_a_canonical_window_places_the_bytes_numpy_places(crop):
    """On 300 random shapes with random pad widths (or crop windows): numpy's pad (slice) of the
    input equals the pad (slice) of the input read in the canonical shape at the canonical
    offsets, read row-major; every canonical axis but the first is padded or cropped."""
    rng = np.random.default_rng(1 + crop)
    for _ in range(300):
        ndim = int(rng.integers(1, 7))
        shape = _random_shape(rng, ndim)
        x = rng.integers(-128, 128, shape).astype(np.int8)
        changed = rng.random(ndim) < 0.4
        if crop:
            lo = [int(rng.integers(0, n)) if c else 0 for n, c in zip(shape, changed)]
            out = [int(rng.integers(1, n - l + 1)) if c else n
                   for n, l, c in zip(shape, lo, changed)]
            want = x[tuple(slice(l, l + m) for l, m in zip(lo, out))]
        else:
            lo = [int(rng.integers(0, 3)) if c else 0 for c in changed]
            hi = [int(rng.integers(0, 3)) if c else 0 for c in changed]
            out = [n + l + h for n, l, h in zip(shape, lo, hi)]
            want = np.pad(x, list(zip(lo, hi)), constant_values=-7)
        n, clo, m = canonical_window(shape, lo, out)
        assert int(np.prod(n)) == x.size and int(np.prod(m)) == want.size
        assert all(not (l == 0 and a == b) for l, a, b in zip(clo[1:], n[1:], m[1:]))
        if not n:  # a single element, kept where it is
            assert x.size == want.size == 1 and want.ravel()[0] == x.ravel()[0]
            continue
        src = x.reshape(n)
        if crop:
            got = src[tuple(slice(l, l + e) for l, e in zip(clo, m))]
        else:
            got = np.pad(src, [(l, e - a - l) for l, a, e in zip(clo, n, m)], constant_values=-7)
        np.testing.assert_array_equal(got.ravel(), want.ravel())


def _build(mod, args):
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return [g.numpy() for g in got]


def test_canonical_kinds_share_one_function_and_match_numpy():
    """Three permutations of different ranks that are one canonical transpose (0, 2, 1), three
    pads of different widths and ranks that are one canonical rank-2 pad, three crops of
    different ranks that are one rank-1 crop, three takes of rows and three along the last axis
    , three wheres of different broadcasts and an identity permutation: one shape-generic
    PrimFunc per kind (of the kind's highest canonical rank), the identity a reshape, a
    permutation met once left to TVM; the llvm build of the rewritten module gives numpy's
    results, and the same as the llvm build of the module as it was."""
    rng = np.random.default_rng(3)
    shapes = [(1, 5, 16, 1, 6, 6), (1, 3, 16, 7, 7), (2, 3, 1, 4), (1, 7, 5, 5), (1, 2, 3, 4, 5),
              (1, 9, 8, 8), (1, 6), (4, 7, 3), (1, 1, 2, 1, 16), (2, 3, 4, 5)]
    idx = rng.integers(-2, 9, (3, 2)).astype(np.int32)   # out-of-range indices: take clips them
    bcast = [(1, 5, 1, 1, 1, 6), (1, 1, 3, 1, 1), (2, 1, 4, 1)]
    mask = [rng.random(b) < 0.5 for b in bcast]
    vals = [rng.integers(-128, 128, b).astype(np.int8) for b in bcast]
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(s, "int8")) for i, s in enumerate(shapes)]
    calls = [
        (relax.op.permute_dims(xs[0], [0, 1, 4, 5, 3, 2]),
         lambda a: a[0].transpose(0, 1, 4, 5, 3, 2)),
        (relax.op.permute_dims(xs[1], [0, 1, 3, 4, 2]), lambda a: a[1].transpose(0, 1, 3, 4, 2)),
        (relax.op.permute_dims(xs[2], [0, 3, 2, 1]), lambda a: a[2].transpose(0, 3, 2, 1)),
        (relax.op.permute_dims(xs[9], [2, 0, 3, 1]), lambda a: a[9].transpose(2, 0, 3, 1)),
        (relax.op.permute_dims(xs[8], [0, 3, 2, 1, 4]), lambda a: a[8].transpose(0, 3, 2, 1, 4)),
        (relax.op.nn.pad(xs[3], [0, 0, 0, 0, 1, 1, 0, 0]),
         lambda a: np.pad(a[3], [(0, 0), (0, 0), (1, 1), (0, 0)])),
        (relax.op.nn.pad(xs[4], [0, 0, 0, 0, 0, 2, 0, 0, 0, 0]),
         lambda a: np.pad(a[4], [(0, 0), (0, 0), (0, 2), (0, 0), (0, 0)])),
        (relax.op.nn.pad(xs[5], [0, 0, 0, 7, 1, 0, 0, 0]),
         lambda a: np.pad(a[5], [(0, 0), (0, 7), (1, 0), (0, 0)])),
        (relax.op.strided_slice(xs[5], axes=[1], begin=[2], end=[8]), lambda a: a[5][:, 2:8]),
        (relax.op.strided_slice(xs[6], axes=[1], begin=[1], end=[5]), lambda a: a[6][:, 1:5]),
        (relax.op.strided_slice(xs[9], axes=[0], begin=[1], end=[2]), lambda a: a[9][1:2]),
        (relax.op.take(xs[7], relax.const(idx), axis=1, mode="clip"),
         lambda a: np.take(a[7], idx, axis=1, mode="clip")),
        (relax.op.take(xs[9], relax.const(idx), axis=3, mode="clip"),
         lambda a: np.take(a[9], idx, axis=3, mode="clip")),
        (relax.op.take(xs[4], relax.const(idx[:, :1]), axis=0, mode="clip"),
         lambda a: np.take(a[4], idx[:, :1], axis=0, mode="clip")),
        (relax.op.take(xs[5], relax.const(idx), axis=2, mode="clip"),
         lambda a: np.take(a[5], idx, axis=2, mode="clip")),
        (relax.op.take(xs[6], relax.const(idx), axis=1, mode="clip"),
         lambda a: np.take(a[6], idx, axis=1, mode="clip")),
        (relax.op.take(xs[3], relax.const(idx[:2]), axis=3, mode="clip"),
         lambda a: np.take(a[3], idx[:2], axis=3, mode="clip")),
        # promoted to the kinds' highest canonical rank: a rank-1 pad, a rank-2 crop
        (relax.op.nn.pad(xs[3], [0, 0, 0, 9, 0, 0, 0, 0]),
         lambda a: np.pad(a[3], [(0, 0), (0, 9), (0, 0), (0, 0)])),
        (relax.op.strided_slice(xs[9], axes=[2], begin=[1], end=[3]), lambda a: a[9][:, :, 1:3]),
        # three broadcasts of a constant mask and values: one where (canonical ranks 3 and 4)
        (relax.op.where(relax.const(mask[0]), relax.const(vals[0]), xs[0]),
         lambda a: np.where(mask[0], vals[0], a[0])),
        (relax.op.where(relax.const(mask[1]), relax.const(vals[1]), xs[4]),
         lambda a: np.where(mask[1], vals[1], a[4])),
        (relax.op.where(relax.const(mask[2]), relax.const(vals[2]), xs[9]),
         lambda a: np.where(mask[2], vals[2], a[9])),
    ]
    with bb.function("main", xs):
        with bb.dataflow():
            outs = [bb.emit(c) for c, _ in calls]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    before = bb.get()
    mod = shape_generic_host_kernels(before)
    prims = sorted(str(gv.name_hint) for gv, f in mod.functions.items()
                   if isinstance(f, tvm.tirx.PrimFunc))
    assert prims == ["vta_host_crop2_int8", "vta_host_pad2_v0_int8",
                     "vta_host_take_fast_int8_int32", "vta_host_take_fast_rows_int8_int32",
                     "vta_host_transpose_0_2_1_int8",
                     "vta_host_where4_f_bool_int8"], prims
    text = mod.script()
    assert text.count("R.permute_dims") == 1 and "R.nn.pad" not in text  # (2, 0, 3, 1) met once
    assert "R.take" not in text and "R.strided_slice" not in text and "R.where" not in text
    args = [rng.integers(-128, 128, s).astype(np.int8) for s in shapes]
    got, ref = _build(mod, args), _build(before, args)
    assert len(got) == len(calls)
    for g, r, (_, want) in zip(got, ref, calls):
        np.testing.assert_array_equal(g, want(args))
        np.testing.assert_array_equal(g, r)


def test_kinds_met_on_fewer_shapes_stay_tvm_operators():
    """A canonical kind met on fewer than SHARED_SHAPES canonical shapes is left as it was."""
    assert SHARED_SHAPES == 3
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(s, "int8")) for i, s in enumerate([(3, 4), (5, 6)])]
    with bb.function("main", xs):
        with bb.dataflow():
            outs = [bb.emit(relax.op.permute_dims(x)) for x in xs]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod = shape_generic_host_kernels(bb.get())
    assert not [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert mod.script().count("R.permute_dims") == 2
