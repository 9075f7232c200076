"""Exact pruning of the choice (:mod:`tvm_csp_embed.choice`): a candidate whose proven lower bound
(:func:`~tvm_csp_embed.choice.cycles_bound` plus its host layout cycles) cannot beat the best
timed one is not built, nor is the stock template's plan when its bound
(:func:`~tvm_csp_embed.choice.stock_cycles_bound` plus its host layout cycles) exceeds the best.

For one-conv modules (int8 conv2d / group conv2d + bias, >> 8, clip) under ``csp-relaxed``, built
with pruning and then exhaustively (``PRUNE_BY_BOUND = False``, with the choice and plan caches
emptied in between and the solver's embeddings kept), under the objectives ``end-to-end`` and
``cycles``:

* both builds take the same plan: the same compiled operator (kind, embedding, epilogue, knobs),
  the same VTA cycles and end-to-end estimate, the same report text but for the sentence saying
  how many embeddings were timed and the runner-up it names;
* the bound never exceeds the cycle model's count of any candidate the exhaustive build timed,
  nor the stock bound the count of the stock template's program.

The default run takes a sample; ``pytest -m slow`` runs ResNet-18 C1-C11, MobileNet D1-D9 and the
12 thin DeepBench layers (1 or 3 input channels).
"""
import re
import shutil

import pytest
from test_csp_correctness import DEEPBENCH, MOBILENET, RESNET_C1, _module
from test_resnet_layers import RESNET18
from tvm import relax

import vta_ext
from tvm_csp_embed import choice
from tvm_csp_embed.cache import cache_dir
from vta_ext.executor import cycle_report, op_key

pytestmark = pytest.mark.usefixtures("fresh_embedding_cache")


def _layers():
    out = {}
    for name, (hw, cin, cout, k, pad, st) in {"C1": RESNET_C1, **RESNET18}.items():
        out[name] = (1, cin, hw, hw, cout, k, k, (pad, pad), (st, st), 1)
    for name, (hw, ch, g, k, pad, st) in MOBILENET.items():
        out[name] = (1, ch, hw, hw, ch, k, k, (pad, pad), (st, st), g)
    for i, r in DEEPBENCH.items():
        if r["c"] in (1, 3):
            out[f"DB{i}"] = (r["n"], r["c"], r["h"], r["w"], r["k"], r["filter_h"], r["filter_w"],
                             (r["pad_h"], r["pad_w"]), (r["hstride"], r["wstride"]), 1)
    return out


LAYERS = _layers()
SAMPLE = ("C11", "D9", "DB6")
#: the sentence of the choice that depends on how many candidates were built, and the runner-up
_TIMED = re.compile(r"\d+ of \d+ embedding\(s\) timed by the cycle model [^;]*")
_NEXT = re.compile(r"; next [^;]*")
#: the stock template's score, or the sentence saying why its plan was not built
_STOCK = re.compile(r"; (stock template: |the stock template's plan not built)[^;]*")


def _build(mod, exhaustive: bool, objective: str, monkeypatch, config=None, host=None):
    """Build ``mod`` under csp-relaxed with a fresh choice and plan cache; return the report and
    every ``(config, kind, op, usable candidates)`` the choice saw."""
    for sub in ("choices", "plans"):
        shutil.rmtree(cache_dir() / sub, ignore_errors=True)
    seen, inner = [], choice._choose

    def spy(kind, strategy, mode, config, base, layouts, usable, op, options, contender):
        out = inner(kind, strategy, mode, config, base, layouts, usable, op, options, contender)
        seen.append((config, kind, op, list(usable), strategy, contender))
        return out
    with monkeypatch.context() as m:
        m.setattr(choice, "PRUNE_BY_BOUND", not exhaustive)
        m.setattr(choice, "_choose", spy)
        with vta_ext.build_options(strategy="csp-relaxed", objective=objective, host=host):
            relax.build(mod, target="ext_vta" if config is None else vta_ext.vta_target(config))
    return vta_ext.last_build_report(), seen


def _chain_module(c: int, hw: int):
    """Two 3x3 convs ``c -> c`` (pad 1) in a row, each + bias, >> 8, clip: the second one's input
    comes from a VTA operator, so layout agreement (``AGREEMENT_SLACK``) applies to its choice."""
    from conftest import conv_chain

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, hw, hw), "int8"))
    ws = [relax.Var(f"w{i}", relax.TensorType((c, c, 3, 3), "int8")) for i in range(2)]
    bs = [relax.Var(f"b{i}", relax.TensorType((1, c, 1, 1), "int32")) for i in range(2)]
    with bb.function("main", [x, *ws, *bs]):
        with bb.dataflow():
            y = x
            for w, b in zip(ws, bs):
                y = conv_chain(bb, y, w, b, padding=1, shift=8, clip=(-128, 127))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _case(layer, objective: str, monkeypatch, config=None, host=None):
    mod = _module(*LAYERS[layer]) if isinstance(layer, str) else layer
    pruned, seen_p = _build(mod, False, objective, monkeypatch, config, host)
    full, seen_f = _build(mod, True, objective, monkeypatch, config, host)
    assert seen_p and seen_f, f"{layer}: the choice did not run"
    assert pruned.vta_keys == full.vta_keys
    assert pruned.vta_cycles == full.vta_cycles
    assert pruned.end_to_end_cycles == full.end_to_end_cycles
    strip = lambda text: _STOCK.sub("", _NEXT.sub("", _TIMED.sub("", text)))  # noqa: E731
    assert [(p.op, p.device, strip(p.detail)) for p in pruned.placements] == \
        [(p.op, p.device, strip(p.detail)) for p in full.placements]
    timed = 0
    for config, kind, op, usable, strategy, contender in seen_f:
        for c in usable:
            if c.cycles is not None:
                timed += 1
                assert choice.cycles_bound(config, kind, op, c) <= c.cycles, (layer, c.label)
        if contender is not None:
            key = op_key(kind, strategy, config, contender.built(), op.epilogue, contender.knobs)
            bound = (choice.stock_cycles_bound(config, kind, op, contender.plan, contender.knobs)
                     if contender.search is None else contender.search.bound())
            assert bound <= cycle_report(key).total_cycles, (layer, "stock")
    assert timed, f"{layer}: no candidate was timed"
    def built(seen):
        return sum(c.cycles is not None for *_, usable, _, _ in seen for c in usable)
    return built(seen_p), built(seen_f)


@pytest.mark.parametrize("layer", SAMPLE)
def test_pruned_choice_is_exhaustive_choice(layer, monkeypatch):
    _case(layer, "end-to-end", monkeypatch)


@pytest.mark.parametrize("layer", ("C11", pytest.param("DB6", marks=pytest.mark.slow),
                                   pytest.param("C4", marks=pytest.mark.slow)))
def test_pruned_choice_is_exhaustive_choice_pynq(layer, monkeypatch):
    """On pynq (per-kind DMA bandwidth, fixed cycles per instruction and per row): the bounds
    stay below every timed program and the pruned choice is the exhaustive one."""
    _case(layer, "cycles", monkeypatch, "pynq")


def test_pynq_bound_counts_the_weights_at_their_bandwidth(monkeypatch):
    """C11 on pynq: 512x512x3x3 = 2,359,296 B of weights moved once at WGT's 4 B/cycle (589,824
    cycles) + one WGT DMA (5 + 15) + the input 512x7x7 = 25,088 B at INP's 8 (3,136 + 9 + 19) +
    the fetch (10 + 0): 592,998 cycles, above the micro-op work (7x7x512x512x9 MACs / 256 = 451,584
    GEMM cycles, 25,088 / 16 = 1,568 fill pad elements, 1,568 x (4 ALU passes x 2) = 12,544 ALU
    cycles): every candidate that binds the data to INP gets that bound, at most the cycles of
    its program."""
    from vta_ext.config import load_config

    _, seen = _build(_module(*LAYERS["C11"]), True, "cycles", monkeypatch, "pynq")
    cfg = load_config("pynq")
    assert (cfg.WGT_BYTES_PER_CYCLE, cfg.INP_BYTES_PER_CYCLE, cfg.FETCH_CYCLES) == (4, 8, 10)
    load = 2359296 / 4 + 5 + 15 + 25088 / 8 + 9 + 19 + 10
    checked = 0
    for config, kind, op, usable, _, _ in seen:
        for c in usable:
            pg = c.packed
            if pg.operands["A"].tensor != pg.embedding.workload.inputs[0].name:
                continue
            bound = choice.cycles_bound(config, kind, op, c)
            assert bound == load, (c.label, bound)
            if c.cycles is not None:
                assert bound <= c.cycles
                checked += 1
    assert checked


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["end-to-end", "cycles"])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_pruned_choice_is_exhaustive_choice_slow(layer, objective, monkeypatch):
    _case(layer, objective, monkeypatch)


def test_bound_prunes_something(monkeypatch):
    """C11 (512 -> 512, 3x3 at 7x7): the NHWC embedding's host layout traffic puts its bound
    above the NCHW embedding's score, so the pruned build times fewer candidates. On a host that
    moves 2 layout bytes per VTA cycle: at the Zynq's 6.5, since the packing chains are one
    fused kernel each, the traffic no longer separates them."""
    built_pruned, built_full = _case("C11", "end-to-end", monkeypatch,
                                     host={"layout_bytes_per_cycle": 2.0})
    assert built_pruned < built_full


def test_stock_bound_skips_the_stock_plan_of_a_thin_layer(monkeypatch):
    """DB6 (one input channel): the stock template pads the channel to a whole block, so its
    micro-op bound is above the best embedding's score and its plan is not built; the choice is
    the exhaustive one (``_case``)."""
    _case("DB6", "end-to-end", monkeypatch)
    report, seen = _build(_module(*LAYERS["DB6"]), False, "end-to-end", monkeypatch)
    assert [c for *_, c in seen] and all(c is not None for *_, c in seen)
    assert any("the stock template's plan not built" in p.detail for p in report.placements)


def test_stock_plan_agreeing_no_better_is_not_built(monkeypatch):
    """Two 64 -> 64 3x3 convs at 28x28 in a row. The second takes its input from VTA, so a plan
    within ``AGREEMENT_SLACK`` of the best could still be taken for agreeing better with its
    neighbours. Its stock plan's bound (GEMM and reset micro-ops, ALU passes, host bytes) is above
    the best embedding's score but within that slack; the best embedding takes the input over
    and keeps the stock arrangement, as the stock plan would, so the stock plan cannot be taken
    and is not built. The choice is still the exhaustive one."""
    mod = _chain_module(64, 28)
    _case(mod, "end-to-end", monkeypatch)
    report, seen = _build(mod, False, "end-to-end", monkeypatch)
    assert len(seen) == 2 and seen[1][2].input_layout is not None
    second = report.placements[[p.op for p in report.placements].index("relax.nn.conv2d") + 1]
    assert second.op == "relax.nn.conv2d"
    best = re.search(r"fewest cycles end to end: ([\d,]+) cycles", second.detail)
    bound = re.search(r"the stock template's plan not built: a lower bound on its score, "
                      r"([\d,]+)", second.detail)
    assert best and bound, second.detail
    best, bound = (int(m.group(1).replace(",", "")) for m in (best, bound))
    assert best < bound <= best * (1 + choice.AGREEMENT_SLACK)


def _uop_cycles(config, program):
    """From ``program``'s instruction stream: the cycles of its GEMM micro-ops, of its resets
    and of its fill LOADs' padding (one per accumulator entry written), and of its ALU micro-ops,
    at the configuration's cycles per micro-op (``docs/isa.md``)."""
    from vta_ext.isa import AluInsn, GemmInsn, MemInsn, MemType

    gemm = init = alu = 0
    for insn in program.insns:
        if isinstance(insn, GemmInsn):
            uops = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
            if insn.reset_reg:
                init += uops * config.GEMM_CYCLES_PER_UOP
            else:
                gemm += uops * config.GEMM_CYCLES_PER_UOP
        elif isinstance(insn, AluInsn):
            uops = insn.iter_out * insn.iter_in * (insn.uop_end - insn.uop_bgn)
            alu += uops * (config.ALU_CYCLES_PER_UOP_IMM if insn.use_imm
                           else config.ALU_CYCLES_PER_UOP_VEC)
        elif (isinstance(insn, MemInsn) and insn.memory_type == MemType.ACC and insn.y_size == 0
              and insn.x_size):
            init += (insn.x_pad_0 + insn.x_size + insn.x_pad_1) * (insn.y_pad_0 + insn.y_pad_1)
    return {"gemm": gemm, "init": init, "alu": alu}


@pytest.mark.parametrize("layer", ("C11", "DB6"))
def test_compute_work_is_the_programs_micro_op_cycles(layer, monkeypatch):
    """The knob-free compute work a candidate's bound sums (``codegen.knobs.compute_work``: GEMM
    micro-ops, accumulator initialisation, ALU passes) is what its built program's instructions
    run, counted from the stream, for every candidate the exhaustive choice timed (DB6 folds its
    bias into spare lanes, so its candidates come with and without the bias ADD pass)."""
    from vta_ext.executor import compiled_op
    from vta_ext.templates.epilogue import simplify_epilogue

    from tvm_csp_embed.candidates import program_epilogue
    from tvm_csp_embed.codegen.knobs import compute_work

    _, seen = _build(_module(*LAYERS[layer]), True, "end-to-end", monkeypatch)
    checked = 0
    for config, kind, op, usable, strategy, _ in seen:
        for c in usable:
            if c.cycles is None:
                continue
            key = op_key(kind, strategy, config, c.workload, op.epilogue, "tps")
            got = _uop_cycles(config, compiled_op(key).program)
            ep = simplify_epilogue(program_epilogue(c.workload, op.epilogue))
            work = compute_work(config, c.packed, ep)
            # a bias added by a GEMM (``bias``) runs GEMM micro-ops in the stream
            work["gemm"] += work.pop("bias")
            assert work == got, (layer, c.label)
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("layer,config", [("C11", "default"),
                                          pytest.param("C6", "default", marks=pytest.mark.slow),
                                          pytest.param("C2", "default", marks=pytest.mark.slow),
                                          ("C11", "pynq"),
                                          pytest.param("C2", "pynq", marks=pytest.mark.slow)])
def test_stock_bound_with_the_tiling_is_below_the_programs_cycles(layer, config):
    """``stock_cycles_bound`` with the knobs: below the cycle model's count of the stock program
    for every sampled knob point (TPS, the fallback, and valid points of one and of two virtual
    threads); with one thread it adds the load bytes' cycles to the micro-op cycles, which on C11
    (weights of 2.4 MB, loaded between the GEMMs) puts it within 3 % of the count, where the
    micro-op bound alone is more than 10 % under."""
    import random
    import types

    from vta_ext.config import load_config
    from vta_ext.sim.cycles import CycleModel
    from vta_ext.stock import _gemm_knob_space
    from vta_ext.templates.conv2d import build_conv2d
    from vta_ext.templates.workload import Conv2dWorkload

    cfg = load_config(config)
    n, c, h, w, k, kh, kw, pad, st, _ = LAYERS[layer]
    wl = Conv2dWorkload(n, h, w, c, k, kh, kw, pad[0], pad[1], st[0], st[1])
    epilogue = (("bias",), ("shr", 8), ("clip", -128, 127))
    op = types.SimpleNamespace(epilogue=epilogue)
    plan = types.SimpleNamespace(workload=wl)
    space = _gemm_knob_space(cfg, wl, epilogue)
    rng = random.Random(0)
    one = [p for p in space.points if p["oc_nthread"] * p["h_nthread"] == 1]
    two = [p for p in space.points if p["oc_nthread"] * p["h_nthread"] > 1]
    points = ["tps", "fallback"] + rng.sample(one, min(2, len(one))) + rng.sample(two, min(2, len(two)))
    ratios = {}
    for knobs in points:
        cycles = CycleModel(cfg).run_program(build_conv2d(cfg, wl, epilogue, knobs).program).total_cycles
        bound = choice.stock_cycles_bound(cfg, "conv2d", op, plan, knobs)
        assert bound <= cycles, (layer, knobs, bound, cycles)
        ratios[str(knobs)] = (bound / cycles, choice.stock_cycles_bound(cfg, "conv2d", op, plan) / cycles)
    if (layer, config) == ("C11", "default"):
        tps = space.tps
        assert tps["oc_nthread"] * tps["h_nthread"] == 1
        new, old = ratios["tps"]
        assert new >= 0.97 and old < 0.9, ratios["tps"]


def test_csp_plan_bounded_above_the_cpu_is_not_built(monkeypatch):
    """ResNeXt-50's layer1 grouped conv (128 -> 128, 3x3, 32 groups of 4 channels, 56x56) alone:
    the stock template refuses it, and every embedding's lower bound (its cycles bound plus the
    host layout of its relayouts) is above leaving it on the CPU, so the pruned choice builds no
    embedding and gives the CSP plan up for the CPU, as the exhaustive choice (every considered
    embedding built and timed) does: the same programs, cycles and placements; the CPU's score is
    its MACs (128 x 56 x 56 x 4 x 9 = 14,450,688, by hand) priced by the host model, and every
    timed embedding scores above it and at least its bound."""
    mod = _module(1, 128, 56, 56, 128, 3, 3, (1, 1), (1, 1), 32)
    pruned, seen_p = _build(mod, False, "end-to-end", monkeypatch)
    full, seen_f = _build(mod, True, "end-to-end", monkeypatch)
    assert pruned.vta_keys == full.vta_keys and pruned.vta_cycles == full.vta_cycles
    assert pruned.end_to_end_cycles == full.end_to_end_cycles
    assert [(p.op, p.device, p.plan) for p in pruned.placements] == \
        [(p.op, p.device, p.plan) for p in full.placements]
    grouped = [s for s in seen_p if s[1] == "group_conv2d"]
    assert grouped and all(c.cycles is None for c in grouped[0][3])       # none built
    text = next(p.reason + p.detail for p in pruned.placements if p.op == "relax.nn.conv2d")
    assert "none built: a lower bound on each one's score exceeds the CPU's" in text, text
    from vta_ext.options import current_options

    with vta_ext.build_options(strategy="csp-relaxed", objective="end-to-end"):
        host = current_options().host
    on_cpu = host.cpu_cycles(128 * 56 * 56 * 4 * 9)
    assert f"cheaper on the CPU: {on_cpu:,.0f} cycles (14,450,688 MACs" in text, text
    timed = 0
    for config, kind, op, usable, _, _ in seen_f:
        if kind != "group_conv2d":
            continue
        for c in usable:
            if c.cycles is None:
                continue
            score = c.cycles + host.layout_cycles(c.host_bytes)
            assert on_cpu < choice.cycles_bound(config, kind, op, c) + host.layout_cycles(
                c.host_bytes) <= score, c.label
            timed += 1
    assert timed


def test_cpu_bar_computes_a_dearer_bound_only_when_needed():
    """``cpu_bound_exceeded`` with hand-made bounds: a candidate's next (dearer, tighter) bound is
    asked for only while the ones before it do not exceed the CPU's score; the lowest deciding
    bound is returned, or None as soon as one candidate has no bound above the CPU's score."""
    calls = []

    def bounds_of(table):
        return [lambda c, i=i: calls.append((c, i)) or table[c][i] for i in range(3)]
    table = {"a": (120, 130, 140), "b": (90, 110, 150), "c": (50, 80, 101)}
    assert choice.cpu_bound_exceeded(list(table), 100, bounds_of(table)) == 101
    assert calls == [("a", 0), ("b", 0), ("b", 1), ("c", 0), ("c", 1), ("c", 2)]
    calls.clear()
    table["b"] = (90, 95, 100)        # b's tightest bound is not above 100: b could beat the CPU
    assert choice.cpu_bound_exceeded(list(table), 100, bounds_of(table)) is None
    assert calls == [("a", 0), ("b", 0), ("b", 1), ("b", 2)]
