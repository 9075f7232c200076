"""A max pool fused into its conv by the offload pass (``build_options(fuse_pool=True)``):
:mod:`vta_ext.offload.poolsplit` (a pool of a channel concat split into one pool per part) and
``Offloader._fuse_pool`` (decided by the cycle model, :mod:`vta_ext.offload.fusion`).

* the split module equals the original on llvm to the bit, and holds one pool per part;
* a squeezenet-like fire (a squeeze conv, two expand convs, their concat, a 3x3 s2 max pool),
  built on ``pipelined`` with the fusion, equals the llvm build to the bit; each pool is fused
  into its expand conv (the report names it) or says in one line why not;
* a padded pool is not fused, and says so; with the option off no pool is fused;
* a warm build (a new process on the same plan cache) compiles only the programs it calls: the
  kept decisions spare the pools' and the fused convs' own programs.
The whole network (squeezenet1_1): ``tests/test_networks.py``.
"""
from __future__ import annotations

import json

import numpy as np
from conftest import conv_bb, run_module


def _fire_module(hw: int = 13, padding: int = 0):
    """x (1x32xhwxhw int8) -> squeeze 1x1 32->16 -> expand 1x1 16->32 and 3x3 16->32 -> concat
    -> max pool 3x3 s2 (``padding`` on each side)."""
    from tvm import relax

    x = relax.Var("x", relax.TensorType((1, 32, hw, hw), "int8"))
    bb = relax.BlockBuilder()
    rng = np.random.default_rng(7)
    with bb.function("main", [x]):
        with bb.dataflow():
            s = conv_bb(bb, x, rng, 32, 16, 1, 6, lo=0)
            e1 = conv_bb(bb, s, rng, 16, 32, 1, 5, lo=0)
            e3 = conv_bb(bb, s, rng, 16, 32, 3, 7, lo=0)
            c = bb.emit(relax.op.concat([e1, e3], axis=1))
            p = bb.emit(relax.op.nn.max_pool2d(c, pool_size=3, strides=2, padding=padding))
            out = bb.emit_output(p)
        bb.emit_func_output(out)
    return bb.get()


def _input(hw: int = 13):
    return np.random.default_rng(1).integers(-128, 128, (1, 32, hw, hw)).astype(np.int8)


def _build(mod, fuse_pool: bool = True, preset: str = "pipelined", hw: int = 13):
    import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
    import vta_ext
    from vta_ext.target import vta_target

    with vta_ext.build_options(strategy="csp-relaxed", fuse_pool=fuse_pool):
        got = run_module(mod, vta_target(preset), [_input(hw)])
    return got, run_module(mod, "llvm", [_input(hw)]), vta_ext.last_build_report()


def _pool_calls(mod) -> int:
    return mod.script().count("R.nn.max_pool2d(")


def test_split_of_a_pooled_concat_is_bit_exact_on_llvm():
    from vta_ext.offload.poolsplit import split_pooled_concats

    mod = _fire_module()
    split = split_pooled_concats(mod)
    assert _pool_calls(mod) == 1 and _pool_calls(split) == 2
    np.testing.assert_array_equal(run_module(split, "llvm", [_input()]),
                                  run_module(mod, "llvm", [_input()]))


def test_fire_pools_fused_bit_exact_against_llvm():
    got, ref, report = _build(_fire_module())
    np.testing.assert_array_equal(got, ref)
    assert np.abs(ref).max() > 0
    fused = [p for p in report.on_vta if p.reason.startswith("conv2d + max pool")]
    alone = [p for p in report.on_vta if p.op == "relax.nn.max_pool2d"]
    assert len(fused) + len(alone) == 2     # the pool split in two, each fused or not
    assert fused, "neither expand conv fused its pool on pipelined"
    for p in fused:
        assert "; max pool " in p.detail and "(3x3 stride 2x2) fused (" in p.detail
        assert "decided by the cycle model" in p.detail and "+maxpool" in p.detail
        assert report.floor(p).total <= report.cycles(p)
    for p in alone:
        assert "not fused into its conv: " in p.detail


def test_padded_pool_is_not_fused_and_says_why():
    got, ref, report = _build(_fire_module(padding=1))
    np.testing.assert_array_equal(got, ref)
    pools = [p for p in report.on_vta if p.op == "relax.nn.max_pool2d"]
    assert len(pools) == 2
    assert all("not fused into its conv: the pool is padded ([1, 1, 1, 1])" in p.detail
               for p in pools)


def test_no_pool_fused_with_the_option_off():
    got, ref, report = _build(_fire_module(), fuse_pool=False)
    np.testing.assert_array_equal(got, ref)
    assert not [p for p in report.on_vta if p.reason.startswith("conv2d + max pool")]
    assert len([p for p in report.on_vta if p.op == "relax.nn.max_pool2d"]) == 1


def test_warm_build_compiles_only_the_programs_it_calls(fresh_cache):
    from vta_ext import executor
    from vta_ext.templates.epilogue import POOL_EPILOGUE

    def compiled():
        return [json.loads(k) for k in executor._COMPILED]

    got, ref, cold = _build(_fire_module())
    calls = len([p for p in cold.on_vta if p.call is not None])
    fused = [p for p in cold.on_vta if p.reason.startswith("conv2d + max pool")]
    assert fused and len(compiled()) > calls     # cold: the own programs compiled to compare
    executor._COMPILED.clear()
    executor._CYCLES.clear()
    got, ref, warm = _build(_fire_module())
    np.testing.assert_array_equal(got, ref)
    assert len(compiled()) == calls
    assert sum(k["epilogue"][-1][0] == POOL_EPILOGUE for k in compiled() if k["epilogue"]) \
        == len(fused)
    assert [p.detail for p in warm.on_vta] == [p.detail for p in cold.on_vta]


def test_fused_floor_counts_only_the_conv_outputs_the_pool_reads():
    """A 2x2 stride-2 pool of a 7x7 conv output reads its first 6 rows and columns only, and the
    fused program computes only those: the fused operator's floor is that of 6x6 outputs (hand
    count: 32 x 32 x 9 MACs an output x 36 outputs / 256 MACs a GEMM micro-op = 1,296 micro-ops,
    one cycle each on ``pipelined``), not the 7x7 conv's 1,764, and stays below the cycles."""
    from tvm import relax

    x = relax.Var("x", relax.TensorType((1, 32, 7, 7), "int8"))
    bb = relax.BlockBuilder()
    rng = np.random.default_rng(3)
    with bb.function("main", [x]):
        with bb.dataflow():
            c = conv_bb(bb, x, rng, 32, 32, 3, 6, lo=0)
            out = bb.emit_output(bb.emit(relax.op.nn.max_pool2d(c, pool_size=2, strides=2)))
        bb.emit_func_output(out)
    mod = bb.get()
    x_np = np.random.default_rng(1).integers(-128, 128, (1, 32, 7, 7)).astype(np.int8)
    import tvm_csp_embed  # noqa: F401
    import vta_ext
    from vta_ext.target import vta_target

    with vta_ext.build_options(strategy="csp-relaxed", fuse_pool=True):
        got = run_module(mod, vta_target("pipelined"), [x_np])
    report = vta_ext.last_build_report()
    np.testing.assert_array_equal(got, run_module(mod, "llvm", [x_np]))
    fused = [p for p in report.on_vta if p.reason.startswith("conv2d + max pool")]
    assert len(fused) == 1, [p.detail for p in report.on_vta]
    floor = report.floor(fused[0])
    assert floor.compute_gemm == 1296
    assert floor.total <= report.cycles(fused[0])
