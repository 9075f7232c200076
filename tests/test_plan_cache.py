"""The persistent plan cache of the CSP strategies (``tvm_csp_embed.strategy.PlanCache``).

* a warm build (same cache, nothing in memory) plans nothing: no solve, no candidate, no timing;
  the plan, the report and the output (bit-exact against numpy) are the cold build's;
* a corrupt or foreign entry is ignored with a one-line warning and rewritten;
* two processes building the same model on one fresh cache at the same time both succeed,
  bit-exact, and neither meets a half-written entry.
"""
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tvm
from conftest import conv2d_nchw, conv_module, requantize
from tvm import relax

import tvm_csp_embed  # noqa: F401  (registers the CSP strategies)
import vta_ext
from tvm_csp_embed import strategy as S

REPO = Path(__file__).resolve().parents[1]
#: a thin-channel conv whose chosen plan is an embedding (stencil-unrolled) under the default objective
SHAPE = dict(n=1, c=3, o=16, hw=12, k=3, stride=1, padding=1)


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (1, 3, 12, 12)).astype(np.int8)
    w = rng.integers(-128, 128, (16, 3, 3, 3)).astype(np.int8)
    b = rng.integers(-3000, 3000, (1, 16, 1, 1)).astype(np.int32)
    return x, w, b


def _reference(x, w, b):
    return requantize(conv2d_nchw(x, w, 1, 1), b, 8, (0, 127))


def _forget_in_memory():
    """What a new process would not have: compiled operators, packed programs, cycle reports,
    searched stock points."""
    from tvm_csp_embed import stock_knobs
    from vta_ext import executor

    executor._COMPILED.clear()
    executor._CYCLES.clear()
    S._packed.cache_clear()
    stock_knobs._MEMO.clear()
    stock_knobs._NEIGHBOURHOODS.clear()
    stock_knobs._BOUNDS.clear()


def _build_and_run():
    mod = conv_module(**SHAPE)
    with vta_ext.build_options(strategy="csp-relaxed"):
        ex = relax.build(mod, target="ext_vta")
    report = vta_ext.last_build_report()
    x, w, b = _inputs()
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in (x, w, b)])
    np.testing.assert_array_equal(got.numpy(), _reference(x, w, b))
    return report


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_CSP_EMBED_CACHE", str(tmp_path))
    _forget_in_memory()
    yield tmp_path
    _forget_in_memory()


def _entries(cache: Path):
    return sorted((cache / "plans").glob("*.json"))


def test_warm_build_plans_nothing(cache, monkeypatch):
    cold = _build_and_run()
    entries = _entries(cache)
    assert len(entries) == 1
    data = json.loads(entries[0].read_text())
    assert data["key"] == entries[0].stem and data["plan"] == "embedding"
    # the entry holds the chosen embedding and the default policy's point (fewest estimated
    # cycles): the exhaustive search's best
    from tvm_csp_embed.codegen import knobs as K
    from vta_ext.config import load_config

    cfg = load_config("default")
    pg = S.packed_of(S.CspWorkload(**data["workload"]), cfg)
    epilogue = (("bias",), ("shr", 8), ("clip", 0, 127))
    best = min((r for _, r in K.enumerate_points(cfg, pg, epilogue) if isinstance(r, K.KnobPoint)),
               key=lambda r: K._rank(r, "cycles"))
    assert data["policy"] == "cycles" and data["knobs"] == best.knobs
    _forget_in_memory()

    def forbidden(*args, **kwargs):
        raise AssertionError("a warm build must not plan again")
    monkeypatch.setattr(S, "candidates", forbidden)
    monkeypatch.setattr(S.CspGemmTemplate, "_choose", forbidden)
    monkeypatch.setattr(K, "search", forbidden)
    warm = _build_and_run()
    assert warm.placements == cold.placements


@pytest.mark.parametrize("damage", ["truncated", "foreign", "not a plan"])
def test_corrupt_or_foreign_entry_is_ignored_warned_and_rewritten(cache, caplog, damage):
    _build_and_run()
    (entry,) = _entries(cache)
    good = json.loads(entry.read_text())
    text = {"truncated": entry.read_text()[: len(entry.read_text()) // 2],
            "foreign": json.dumps({**good, "key": "0" * 32}),
            "not a plan": json.dumps({"key": good["key"], "version": good["version"], "plan": "?"})}[damage]
    entry.write_text(text)
    _forget_in_memory()
    with caplog.at_level(logging.WARNING, logger="tvm_csp_embed"):
        _build_and_run()
    warnings = [r.getMessage() for r in caplog.records if "plan cache" in r.getMessage()]
    assert len(warnings) == 1 and str(entry) in warnings[0] and "\n" not in warnings[0]
    assert json.loads(entry.read_text()) == good


_CHILD = textwrap.dedent("""
    import sys
    sys.path[:0] = [{tests!r}]
    import numpy as np, tvm
    from tvm import relax
    import tvm_csp_embed, vta_ext
    from test_plan_cache import SHAPE, _inputs, _reference
    from conftest import conv_module
    for seed in range(3):
        with vta_ext.build_options(strategy="csp-relaxed"):
            ex = relax.build(conv_module(**SHAPE), target="ext_vta")
        x, w, b = _inputs(seed)
        got = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in (x, w, b)])
        np.testing.assert_array_equal(got.numpy(), _reference(x, w, b))
        vta_ext.executor._COMPILED.clear()
    print("OK", vta_ext.last_build_report().placement())
""")


def test_two_processes_build_the_same_model_at_once(tmp_path):
    env = dict(os.environ, TVM_CSP_EMBED_CACHE=str(tmp_path), OPENBLAS_NUM_THREADS="1")
    code = _CHILD.format(tests=str(REPO / "tests"))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert "OK [('relax.nn.conv2d', 'vta')]" in out
        assert "plan cache" not in err, err       # no half-written entry was ever read
    (entry,) = _entries(tmp_path)
    assert json.loads(entry.read_text())["key"] == entry.stem


def test_other_code_plans_again(cache, monkeypatch):
    """A plan chosen by other code is not served: the key holds the source digest, so a build
    after a code change (here: another digest) plans again, into a second entry."""
    from tvm_csp_embed import choice

    _build_and_run()
    assert len(_entries(cache)) == 1
    _forget_in_memory()
    calls = []
    real = S.candidates
    monkeypatch.setattr(S, "candidates", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(choice, "source_digest", lambda: "another code")
    _build_and_run()
    assert calls and len(_entries(cache)) == 2


def test_source_digest_follows_every_source_file(monkeypatch):
    from tvm_csp_embed.cache import source_digest

    source_digest.cache_clear()
    before = source_digest()
    changed = Path(vta_ext.__file__).resolve().parent / "sim" / "cycles.py"
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes",
                        lambda self: real(self) + (b"#" if self == changed else b""))
    source_digest.cache_clear()
    try:
        assert source_digest() != before
    finally:
        monkeypatch.undo()
        source_digest.cache_clear()
    assert source_digest() == before
