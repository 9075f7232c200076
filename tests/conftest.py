"""Helpers shared by the tests: independent numpy references, packing in numpy, building and running.

The references here are written from the operator definitions (NCHW convolution, the int8
requantisation tail), not from the code under test; tests import them with
``from conftest import ...``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"


#: the most worker processes ``-n auto`` starts (pytest.ini): each one imports TVM and holds its
#: own caches, about 1.5 GiB at the peak of the network tests
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, at most :data:`MAX_WORKERS`."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, MAX_WORKERS))


@pytest.fixture(autouse=True)
def _stock_strategy_unless_chosen():
    """Every test builds with the ``stock`` strategy unless it opens its own ``build_options``.

    ``import tvm_csp_embed`` (done when the CSP tests are collected) makes ``csp-relaxed`` the
    process default; tests of the stock path must not depend on which files were collected. A
    test's own ``with vta_ext.build_options(...)`` is innermost and wins; one without ``strategy``
    gets the process default.
    """
    import vta_ext

    with vta_ext.build_options(strategy="stock"):
        yield


# ------------------------------------------------------------------ numpy references
def conv2d_nchw(x: np.ndarray, w: np.ndarray, stride=1, padding=0, dilation=1,
                groups: int = 1) -> np.ndarray:
    """Direct NCHW x OIHW convolution in int64 (symmetric ``padding``), the definition itself."""
    sh, sw = (stride, stride) if np.isscalar(stride) else stride
    ph, pw = (padding, padding) if np.isscalar(padding) else padding
    dh, dw = (dilation, dilation) if np.isscalar(dilation) else dilation
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    acc = np.zeros((n, o, oh, ow), np.int64)
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = w[g * og:(g + 1) * og].astype(np.int64)
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + sh * oh:sh, j * dw:j * dw + sw * ow:sw]
                acc[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return acc


def requantize(acc: np.ndarray, bias: Optional[np.ndarray] = None, shift: Optional[int] = None,
               clip: Optional[Tuple[int, int]] = None, order: Sequence[str] = ("bias", "shr", "clip")
               ) -> np.ndarray:
    """The int8 requantisation tail as Relax states it: int32 wrap, then the stages in ``order``
    (``+ bias``, arithmetic ``>> shift``, ``clip``), then ``astype int8`` (keeps the low byte)."""
    out = acc.astype(np.int64).astype(np.int32)
    for stage in order:
        if stage == "bias" and bias is not None:
            out = out + bias.astype(np.int32)
        elif stage == "shr" and shift is not None:
            out = out >> shift
        elif stage == "clip" and clip is not None:
            out = np.clip(out, *clip)
    return out.astype(np.int8)


def apply_epilogue(acc: np.ndarray, epilogue: Sequence[tuple], bias: Optional[np.ndarray] = None
                   ) -> np.ndarray:
    """The template epilogue as docs/templates-api.md defines it: the int32 accumulator, then each
    stage in order (``("bias",)`` adds ``bias`` broadcast against ``acc``; ``("shr", s)`` is an
    arithmetic shift; ``("clip", lo, hi)``, ``("min", c)``, ``("max", c)``, ``("add", c)``), then the
    truncating int8 store (keeps the low byte)."""
    res = acc.astype(np.int64).astype(np.int32).astype(np.int64)
    for stage in epilogue:
        kind = stage[0]
        if kind == "bias":
            res = res + bias.astype(np.int64)
        elif kind == "shr":
            res = res >> stage[1]
        elif kind == "clip":
            res = np.clip(res, stage[1], stage[2])
        elif kind == "min":
            res = np.minimum(res, stage[1])
        elif kind == "max":
            res = np.maximum(res, stage[1])
        elif kind == "add":
            res = res + stage[1]
        else:
            raise ValueError(f"unknown epilogue stage {stage!r}")
    return res.astype(np.int8)


def max_pool_nchw(x: np.ndarray, pool: Tuple[int, int], stride: Tuple[int, int]) -> np.ndarray:
    """Max pooling of an NCHW tensor without padding (floor mode), the definition itself: the
    largest element of each window."""
    (ph, pw), (sh, sw) = pool, stride
    oh, ow = (x.shape[2] - ph) // sh + 1, (x.shape[3] - pw) // sw + 1
    out = np.empty(x.shape[:2] + (oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = x[:, :, i * sh:i * sh + ph, j * sw:j * sw + pw].max(axis=(2, 3))
    return out


def rtl_device():
    """The RTL of the original Pynq design as a device (``../shared/vta-hw``), or the calling
    test skipped, naming why, when its library is not there."""
    from vta_ext.device import DeviceError, open_device, vta_hw_library

    try:
        return open_device(vta_hw_library("rtl"))
    except DeviceError as err:
        pytest.skip(f"no RTL library: {err}")


def assert_csp_bit_exact_on(device, compiled, workload, epilogue, seed: int) -> None:
    """Run the CSP program ``compiled`` (``build_gemm``) on ``device`` with random operands of
    ``workload`` and check its output against the numpy reference of the workload
    (``tvm_csp_embed.reference``), after checking that the device ran it."""
    from tvm_csp_embed.reference import reference_for

    inputs, expected, unpack = reference_for("conv2d", "csp-relaxed")(
        compiled.config, workload, epilogue, np.random.default_rng(seed))
    sim = device.simulator(compiled.config)
    sim.take_cycles()
    out, _ = compiled.run(*inputs, simulator=sim)
    assert sum(sim.take_cycles()) > 0      # the device ran it
    np.testing.assert_array_equal(unpack(out), expected)


@pytest.fixture(scope="module")
def rtl():
    """:func:`rtl_device`, once per module."""
    return rtl_device()


def run_one_call_on(device, vm, arrays):
    """``vm["main"](*arrays)`` with its VTA calls on ``device``; the output as numpy, after
    checking that the one VTA call ran there and the device counted its cycles."""
    import tvm
    import vta_ext

    vta_ext.clear_run_log()
    with vta_ext.run_on(device):
        out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    (ran,) = vta_ext.run_log()
    assert ran.device and ran.device_cycles, ran      # the device ran it and counted its cycles
    return out


@pytest.fixture(scope="module")
def fresh_embedding_cache(tmp_path_factory):
    """A fresh on-disk embedding cache for a test module (the solver runs as a build step, so
    its results and the strategy's choices must not come from an earlier run); modules use it
    with ``pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")``."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path_factory.mktemp("csp_cache")))
    yield
    mp.undo()


# ------------------------------------------------------------------ packing in numpy
def pack_nchw(x: np.ndarray, b: int, c: int) -> np.ndarray:
    """NCHW -> ``(N/b, C/c, H, W, b, c)`` (shapes must divide)."""
    n, ch, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n // b, b, ch // c, c, h, w).transpose(0, 2, 4, 5, 1, 3))


def unpack_nchw(p: np.ndarray) -> np.ndarray:
    """``(N/b, C/c, H, W, b, c)`` -> NCHW."""
    nb, cb, h, w, b, c = p.shape
    return p.transpose(0, 4, 1, 5, 2, 3).reshape(nb * b, cb * c, h, w)


def pack_activation(x: np.ndarray, cfg) -> np.ndarray:
    """NCHW -> the ALU templates' ``(N/b, C/co, H, W, b, co)`` of ``cfg``."""
    return pack_nchw(x, cfg.BATCH, cfg.BLOCK_OUT)


def unpack_oihw(k: np.ndarray) -> np.ndarray:
    """``(O/co, I/ci, KH, KW, co, ci)`` -> OIHW."""
    ob, cb, kh, kw, o, c = k.shape
    return k.transpose(0, 4, 1, 5, 2, 3).reshape(ob * o, cb * c, kh, kw)


def pack_matrix(x: np.ndarray, r: int, c: int) -> np.ndarray:
    """``(R, C)`` -> ``(R/r, C/c, r, c)``."""
    rows, cols = x.shape
    return np.ascontiguousarray(x.reshape(rows // r, r, cols // c, c).transpose(0, 2, 1, 3))


def unpack_matrix(x: np.ndarray) -> np.ndarray:
    """``(R/r, C/c, r, c)`` -> ``(R, C)``."""
    a, b, r, c = x.shape
    return x.transpose(0, 2, 1, 3).reshape(a * r, b * c)


# ------------------------------------------------------------------ Relax modules and running
def random_inputs(mod, seed: int, int32_range: int = 1 << 14):
    """Random int8 (full range) / int32 (``±int32_range``) arrays for ``mod["main"]``'s params."""
    rng = np.random.default_rng(seed)
    arrays = []
    for p in mod["main"].params:
        shape = tuple(int(d) for d in p.ty.shape)
        if str(p.ty.dtype) == "int8":
            arrays.append(rng.integers(-128, 128, shape).astype(np.int8))
        else:
            arrays.append(rng.integers(-int32_range, int32_range, shape).astype(np.int32))
    return arrays


def bind_constants(mod, **arrays):
    """``mod`` with ``main``'s parameters named in ``arrays`` bound as Relax constants (as a
    frontend binds a quantised network's weights and biases)."""
    import tvm
    from tvm import relax

    return relax.transform.BindParams("main", {k: tvm.runtime.tensor(np.ascontiguousarray(v))
                                               for k, v in arrays.items()})(mod)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty plan cache, and nothing compiled in this process (a new process's state)."""
    from vta_ext import executor

    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    executor._COMPILED.clear()
    executor._CYCLES.clear()
    yield tmp_path
    executor._COMPILED.clear()
    executor._CYCLES.clear()


def conv_bb(bb, x, rng, cin, cout, k, shift, lo=-128):
    """Emit into ``bb`` an int8 conv ``cin`` -> ``cout`` (``k`` x ``k``, same padding, random
    small weights and biases from ``rng``) on ``x``, requantised by ``>> shift`` and a clip to
    ``[lo, 127]``; its int8 output."""
    from tvm import relax

    w = relax.const(rng.integers(-8, 9, (cout, cin, k, k)).astype(np.int8))
    b = relax.const(rng.integers(-64, 65, (1, cout, 1, 1)).astype(np.int32))
    a = bb.emit(relax.op.nn.conv2d(x, w, padding=k // 2, out_dtype="int32"))
    a = bb.emit(relax.op.add(a, b))
    a = bb.emit(relax.op.right_shift(a, relax.const(shift, "int32")))
    a = bb.emit(relax.op.clip(a, lo, 127))
    return bb.emit(relax.op.astype(a, "int8"))


def run_module(mod, target, arrays):
    """``relax.build`` for ``target``, run ``main`` once on ``arrays``, return numpy output(s)."""
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(relax.build(mod, target=target), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return out.numpy() if hasattr(out, "numpy") else [o.numpy() for o in out]


def vta_and_llvm(mod, arrays):
    """Build and run ``mod`` for ``ext_vta`` and for ``llvm``: ``(VTA output, llvm output, the
    ext_vta build report)``."""
    import vta_ext

    got = run_module(mod, "ext_vta", arrays)
    report = vta_ext.last_build_report()
    return got, run_module(mod, "llvm", arrays), report


def conv_chain(bb, x, w, b, *, stride=1, padding=0, shift=None, clip=None, groups=1,
               dilation=1, order=("bias", "shr", "clip")):
    """Emit ``conv2d(int8) -> stages in order -> astype int8`` into BlockBuilder ``bb``."""
    from tvm import relax

    y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=padding, dilation=dilation,
                                   groups=groups, out_dtype="int32"))
    for stage in order:
        if stage == "bias" and b is not None:
            y = bb.emit(relax.op.add(y, b))
        elif stage == "shr" and shift is not None:
            y = bb.emit(relax.op.right_shift(y, relax.const(shift, "int32")))
        elif stage == "clip" and clip is not None:
            y = bb.emit(relax.op.clip(y, *clip))
    return bb.emit(relax.op.astype(y, "int8"))


def add_module(n, c, hw):
    """A one-add Relax module ``main(a, b)``: a residual add of two int8 tensors ``(n, c, hw, hw)``
    in int32, then ``>> 1``, clip to int8."""
    from tvm import relax

    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((n, c, hw, hw), "int8"))
    b = relax.Var("b", relax.TensorType((n, c, hw, hw), "int8"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(relax.op.astype(a, "int32"), relax.op.astype(b, "int32")))
            y = bb.emit(relax.op.right_shift(y, relax.const(1, "int32")))
            y = bb.emit(relax.op.clip(y, -128, 127))
            out = bb.emit_output(bb.emit(relax.op.astype(y, "int8")))
        bb.emit_func_output(out)
    return bb.get()


def conv_module(n, c, o, hw, k, *, stride=1, padding=1, bias=True, shift=8, clip=(0, 127),
                groups=1, dilation=1, order=("bias", "shr", "clip"), constants=None):
    """A one-conv Relax module ``main(x, w[, b])`` with the requantisation tail; with
    ``constants = (weight, bias)`` (numpy arrays, a quantised model's) ``main(x)`` binds them as
    Relax constants."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, hw, hw), "int8"))
    params = [x]
    if constants is not None:
        w, b = (relax.const(a) for a in constants)
    else:
        w = relax.Var("w", relax.TensorType((o, c // groups, k, k), "int8"))
        params.append(w)
        b = None
        if bias:
            b = relax.Var("b", relax.TensorType((1, o, 1, 1), "int32"))
            params.append(b)
    with bb.function("main", params):
        with bb.dataflow():
            y = conv_chain(bb, x, w, b, stride=stride, padding=padding, shift=shift, clip=clip,
                           groups=groups, dilation=dilation, order=order)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def conv_layer_shapes(names, size, keep, shape_of):
    """The distinct ``shape_of(module, input)`` of the torch ``Conv2d`` modules for which
    ``keep(module)`` holds, over the networks ``names`` of ``relay_examples/models.py`` run once
    at a ``size`` x ``size`` input (forward hooks), sorted."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "relay_examples"))
    from models import make_model

    shapes = set()
    for name in names:
        model = make_model(name, size=size)
        handles = [m.register_forward_hook(lambda m, inputs, _: shapes.add(shape_of(m, inputs[0])))
                   for m in model.modules() if isinstance(m, torch.nn.Conv2d) and keep(m)]
        with torch.no_grad():
            model(torch.zeros(1, 3, size, size))
        for h in handles:
            h.remove()
    return sorted(shapes)


class RecordingPacker:
    """The offload pass's packer interface on a BlockBuilder ``bb``; appends ``(op name, elements
    written)`` of each bound op that copies (not a :data:`vta_ext.host.VIEW_OPS` op) to
    ``written``."""

    def __init__(self, bb, written: list):
        self.bb, self.written = bb, written

    def operand(self, expr):
        return expr

    def add_func(self, func, name):
        return self.bb.add_func(func, name)

    def emit(self, expr, name):
        from vta_ext.host import VIEW_OPS

        var = self.bb.emit(expr, name)
        if expr.op.name not in VIEW_OPS:
            self.written.append((expr.op.name, int(np.prod([int(d) for d in var.ty.shape]))))
        return var

    emit_unpack = emit


def emitted_packing(layout):
    """The Relax ops ``layout.pack`` emits through the offload pass's packer interface (on a
    BlockBuilder): ``([(op name, elements written) of each op that copies], pack)``, ``pack``
    running the llvm build of the packing on a numpy array."""
    import tvm
    from tvm import relax

    written = []
    Packer = lambda bb: RecordingPacker(bb, written)  # noqa: E731

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(layout.src_shape, "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(layout.pack(Packer(bb), x))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(relax.build(bb.get(), target="llvm"), tvm.cpu())
    return written, lambda src: vm["main"](tvm.runtime.tensor(src)).numpy()
