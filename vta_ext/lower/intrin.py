"""The VTA GEMM tensor intrinsic (and its reset intrinsic) as ``tvm.s_tir.TensorIntrin``.

The description is the GEMM core of one VTA instruction step::

    acc[i, j] += int32(inp[i, k]) * int32(wgt[j, k])     i < BATCH, j < BLOCK_OUT, k < BLOCK_IN

on tiles living in the on-chip scopes ``local.inp_buffer`` / ``local.wgt_buffer`` /
``local.acc_buffer`` (defined in :mod:`vta_ext.memory`, re-exported here). The implementation is a ``T.call_extern`` marker whose arguments are the data pointer and
element offset of each of the three tiles inside its (flattened) buffer; the Python lowering
(:mod:`vta_ext.lower.codegen`) turns it into a GEMM micro-op.

With ``BATCH == 1`` the unit batch loop is *not* part of the description (``blockize`` moves unit
iterators to the outer block, so such a description never matches); tensorize such schedules at the
``BLOCK_OUT`` lane loop, with the unit batch loop left outside. With ``BATCH > 1`` tensorize at the
batch lane loop.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Tuple

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ..config import VTAConfig
from ..memory import ACC_SCOPE, INP_SCOPE, WGT_SCOPE

__all__ = ["INP_SCOPE", "WGT_SCOPE", "ACC_SCOPE", "GEMM_EXTERN", "RESET_EXTERN", "ACC_FILL_PRAGMA",
           "ACC_ALIAS_PRAGMA",
           "gemm_intrin_names", "register_gemm_intrin"]

#: extern names of the markers left in the lowered TIR
GEMM_EXTERN = "VTAUopGemm"
RESET_EXTERN = "VTAUopReset"
#: loop annotation of an accumulator zero-initialisation that the lowering emits as LOADs of the
#: accumulator made only of padding (``y_size`` 0: zeros written on chip, no DRAM read) instead of
#: GEMM reset micro-ops (the alternative to tensorizing with the reset intrinsic)
ACC_FILL_PRAGMA = "vta_acc_fill"
#: loop annotation of a copy of one accumulator buffer into another at the same index (the init of
#: a reduction that continues an earlier stage's sum, e.g. a GEMM that adds to the accumulator of
#: the GEMM before it): no instruction, the destination shares the source's storage
ACC_ALIAS_PRAGMA = "vta_acc_alias"

_REGISTERED = set()


def gemm_intrin_names(cfg: VTAConfig) -> Tuple[str, str]:
    """Names of the (GEMM, reset) intrinsics for ``cfg``'s GEMM shape, e.g. ``vta.gemm_2x16x16``."""
    shape = f"{cfg.BATCH}x{cfg.BLOCK_IN}x{cfg.BLOCK_OUT}"
    return f"vta.gemm_{shape}", f"vta.gemm_reset_{cfg.BATCH}x{cfg.BLOCK_OUT}"


def _make_gemm(bi: int, bc: int, bo: int):
    if bi == 1:
        @T.prim_func(s_tir=True)
        def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
            A = T.match_buffer(a, (1, bc), "int8", offset_factor=1, scope=INP_SCOPE)
            B = T.match_buffer(b, (bo, bc), "int8", offset_factor=1, scope=WGT_SCOPE)
            C = T.match_buffer(c, (1, bo), "int32", offset_factor=1, scope=ACC_SCOPE)
            with T.sblock("root"):
                T.reads(C[0:1, 0:bo], A[0:1, 0:bc], B[0:bo, 0:bc])
                T.writes(C[0:1, 0:bo])
                for j, k in T.grid(bo, bc):
                    with T.sblock("update"):
                        vj, vk = T.axis.remap("SR", [j, k])
                        C[0, vj] = C[0, vj] + T.cast(A[0, vk], "int32") * T.cast(B[vj, vk], "int32")
    else:
        @T.prim_func(s_tir=True)
        def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
            A = T.match_buffer(a, (bi, bc), "int8", offset_factor=1, scope=INP_SCOPE)
            B = T.match_buffer(b, (bo, bc), "int8", offset_factor=1, scope=WGT_SCOPE)
            C = T.match_buffer(c, (bi, bo), "int32", offset_factor=1, scope=ACC_SCOPE)
            with T.sblock("root"):
                T.reads(C[0:bi, 0:bo], A[0:bi, 0:bc], B[0:bo, 0:bc])
                T.writes(C[0:bi, 0:bo])
                for i, j, k in T.grid(bi, bo, bc):
                    with T.sblock("update"):
                        vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                        C[vi, vj] = C[vi, vj] + T.cast(A[vi, vk], "int32") * T.cast(B[vj, vk], "int32")

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (bi, bc), "int8", offset_factor=1, scope=INP_SCOPE)
        B = T.match_buffer(b, (bo, bc), "int8", offset_factor=1, scope=WGT_SCOPE)
        C = T.match_buffer(c, (bi, bo), "int32", offset_factor=1, scope=ACC_SCOPE)
        with T.sblock("root"):
            T.reads(C[0:bi, 0:bo], A[0:bi, 0:bc], B[0:bo, 0:bc])
            T.writes(C[0:bi, 0:bo])
            T.evaluate(T.call_extern("int32", GEMM_EXTERN, C.data, C.elem_offset, A.data,
                                     A.elem_offset, B.data, B.elem_offset))

    return desc, impl


def _make_reset(bi: int, bo: int):
    if bi == 1:
        @T.prim_func(s_tir=True)
        def desc(c: T.handle) -> None:
            C = T.match_buffer(c, (1, bo), "int32", offset_factor=1, scope=ACC_SCOPE)
            with T.sblock("root"):
                T.reads()
                T.writes(C[0:1, 0:bo])
                for j in T.serial(bo):
                    with T.sblock("init"):
                        vj = T.axis.spatial(bo, j)
                        C[0, vj] = T.int32(0)
    else:
        @T.prim_func(s_tir=True)
        def desc(c: T.handle) -> None:
            C = T.match_buffer(c, (bi, bo), "int32", offset_factor=1, scope=ACC_SCOPE)
            with T.sblock("root"):
                T.reads()
                T.writes(C[0:bi, 0:bo])
                for i, j in T.grid(bi, bo):
                    with T.sblock("init"):
                        vi, vj = T.axis.remap("SS", [i, j])
                        C[vi, vj] = T.int32(0)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        C = T.match_buffer(c, (bi, bo), "int32", offset_factor=1, scope=ACC_SCOPE)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:bi, 0:bo])
            T.evaluate(T.call_extern("int32", RESET_EXTERN, C.data, C.elem_offset))

    return desc, impl


def register_gemm_intrin(cfg: VTAConfig) -> Tuple[str, str]:
    """Register (once per GEMM shape) the GEMM and reset intrinsics of ``cfg``; return their names."""
    gemm_name, reset_name = gemm_intrin_names(cfg)
    if gemm_name not in _REGISTERED:
        # TVMScript's parser reads the source of every frame of the caller's stack
        # (inspect.stack), which inside relax.build is deep: parse from a fresh thread instead
        with ThreadPoolExecutor(1) as pool:
            (desc, impl), (rdesc, rimpl) = pool.submit(
                lambda: (_make_gemm(cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT),
                         _make_reset(cfg.BATCH, cfg.BLOCK_OUT))).result()
        TensorIntrin.register(gemm_name, desc, impl, override=True)
        TensorIntrin.register(reset_name, rdesc, rimpl, override=True)
        _REGISTERED.add(gemm_name)
    return gemm_name, reset_name
