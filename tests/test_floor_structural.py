"""The structural floor of a GEMM operator (``vta_ext.floor.gemm_row_serial``) against every plan.

``Floor.structural`` charges each output row of a conv its initial value, the unfilled lanes of its
last micro-op and, with a leading bias, the cheapest way the bias can enter (an extra lane, an ALU
pass or an int32 ``LOAD ACC`` as the initial value). It must stay a lower bound over all plans: for
one-conv modules (int8 conv2d + bias, >> 8, clip) built under ``csp-relaxed`` with the choice's
pruning off (every candidate embedding is timed by the cycle model), the structural floor is never
above the cycles of any timed candidate nor of the stock template's program.

Layers: every conv of squeezenet1_1 at 112 (S*), ResNet-18 C1-C11 (C*), MobileNet's grouped D1-D9
(D*) and the thin DeepBench layers (DB*). The default run takes a sample on ``pipelined``;
``pytest -m slow`` the rest, on ``pipelined`` and ``default``.
"""
import shutil

import pytest
from test_choice_pruning import LAYERS as PRUNING_LAYERS
from test_csp_correctness import _module
from tvm import relax

import vta_ext
from tvm_csp_embed import choice
from tvm_csp_embed.cache import cache_dir
from vta_ext.executor import cycle_report, op_key
from vta_ext.floor import OperatorSize, gemm_row_serial

pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")

#: squeezenet1_1's convs at 112: (hw, in channels, out channels, kernel, pad, stride)
SQUEEZENET = {
    "S1": (112, 3, 64, 3, 0, 2),
    "S2": (27, 64, 16, 1, 0, 1), "S3": (27, 16, 64, 1, 0, 1), "S4": (27, 16, 64, 3, 1, 1),
    "S5": (27, 128, 16, 1, 0, 1),
    "S6": (13, 128, 32, 1, 0, 1), "S7": (13, 32, 128, 1, 0, 1), "S8": (13, 32, 128, 3, 1, 1),
    "S9": (13, 256, 32, 1, 0, 1),
    "S10": (6, 256, 48, 1, 0, 1), "S11": (6, 48, 192, 1, 0, 1), "S12": (6, 48, 192, 3, 1, 1),
    "S13": (6, 384, 48, 1, 0, 1), "S14": (6, 384, 64, 1, 0, 1), "S15": (6, 64, 256, 1, 0, 1),
    "S16": (6, 64, 256, 3, 1, 1), "S17": (6, 512, 64, 1, 0, 1), "S18": (6, 512, 1000, 1, 0, 1),
}
LAYERS = {**{name: (1, c, hw, hw, k, r, r, (pad, pad), (st, st), 1)
             for name, (hw, c, k, r, pad, st) in SQUEEZENET.items()},
          **PRUNING_LAYERS}
SAMPLE = ("S1", "S3", "S5", "S18", "C8", "D9", "DB6")


def _timed_cycles(mod, config: str, monkeypatch):
    """Build ``mod`` under csp-relaxed with every candidate timed; return the report and the
    cycles of every program the choice built (candidates and the stock contender)."""
    for sub in ("choices", "plans"):
        shutil.rmtree(cache_dir() / sub, ignore_errors=True)
    cycles, inner = [], choice._choose

    def spy(kind, strategy, mode, cfg, base, layouts, usable, op, options, contender):
        out = inner(kind, strategy, mode, cfg, base, layouts, usable, op, options, contender)
        cycles.extend((c.label, c.cycles) for c in usable if c.cycles is not None)
        if contender is not None:
            key = op_key(kind, strategy, cfg, contender.built(), op.epilogue, contender.knobs)
            cycles.append(("stock", cycle_report(key).total_cycles))
        return out
    with monkeypatch.context() as m:
        m.setattr(choice, "PRUNE_BY_BOUND", False)
        m.setattr(choice, "_choose", spy)
        with vta_ext.build_options(strategy="csp-relaxed"):
            relax.build(mod, target=vta_ext.vta_target(config))
    return vta_ext.last_build_report(), cycles


def _check(layer: str, config: str, monkeypatch) -> None:
    report, cycles = _timed_cycles(_module(*LAYERS[layer]), config, monkeypatch)
    (p,) = [q for q in report.on_vta if q.call is not None]
    floor = report.floor(p)
    assert cycles, f"{layer}: no program was timed"
    for label, count in cycles:
        assert floor.structural <= count, (layer, config, label, floor, count)
    assert floor.structural <= report.cycles(p)


@pytest.mark.parametrize("layer", SAMPLE)
def test_structural_floor_below_every_plan(layer, monkeypatch):
    _check(layer, "pipelined", monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["pipelined", "default"])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_structural_floor_below_every_plan_slow(layer, config, monkeypatch):
    if config == "pipelined" and layer in SAMPLE:
        pytest.skip("in the default run")
    _check(layer, config, monkeypatch)


@pytest.mark.parametrize("config,gemm,imm,vec", [("pipelined", 1, 1, 2), ("default", 4, 5, 6)])
def test_bias_costs_a_lane_when_the_products_fill_them(config, gemm, imm, vec):
    """Per output row, by hand: a 1x1 conv of 16 channels (16 products, one whole micro-op) with a
    leading bias: a fill (1) and the bias in a 17th lane, a second micro-op (``gemm``); an ALU ADD
    (1 + min(imm, vec)) or a LOAD ACC of 16 int32 (64 B at 8 B/cycle: 8) is no cheaper on either
    preset. Without the bias: the fill alone. With 27 products (a 3-channel 3x3): 2 micro-ops,
    0.3125 of one unfilled, and the bias fits in them."""
    cfg = vta_ext.load_config(config)
    bias = (("bias",), ("shr", 8), ("clip", -128, 127))
    one = OperatorSize("conv2d", 64 * 16, 64, 16, 16 * 64, 64, epilogue=bias)
    assert gemm_row_serial(cfg, one) == min(1 + gemm, 1 + min(imm, vec), 8)
    assert gemm_row_serial(cfg, OperatorSize("conv2d", 64 * 16, 64, 16, 16 * 64, 64)) == 1
    stem = OperatorSize("conv2d", 64 * 27, 64, 27, 27 * 64, 64, epilogue=bias)
    assert gemm_row_serial(cfg, stem) == 1 + (2 - 27 / 16) * gemm
