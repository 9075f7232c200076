"""Strategy and tuner plugins found through entry points (issue 30, item 1): ``vta_ext`` loads
``tvm_csp_embed`` as an installed plugin, a broken plugin costs one warning line and nothing
else."""
from __future__ import annotations

import importlib.metadata
import logging
import subprocess
import sys
import textwrap

import pytest

import vta_ext
from conftest import REPO
from vta_ext import plugins
from vta_ext import strategy as strategy_module

#: a strategy registered by the fake plugin below
FAKE = "fake-plugin-strategy"


def register_fake_strategy():
    """The fake plugin's registration function (the value of its entry point)."""
    vta_ext.register_strategy(vta_ext.Strategy(FAKE, "a test plugin's strategy", fallback="stock"))


def raising_registration():
    """A plugin's registration function that fails."""
    raise RuntimeError("the fake plugin cannot register\nsecond line of the message")


@pytest.fixture
def fake_entry_points(monkeypatch):
    """Install ``entry_points`` of a group as the test says, with fresh plugin and strategy state."""
    monkeypatch.setattr(plugins, "_LOADED", {})
    monkeypatch.setattr(strategy_module, "_STRATEGIES", dict(strategy_module._STRATEGIES))
    installed = {}

    def entry_points(group=None, **_):
        return installed.get(group, [])

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)

    def install(group, **values):
        installed[group] = [importlib.metadata.EntryPoint(name, value, group)
                            for name, value in values.items()]
    return install


def test_a_broken_plugin_warns_in_one_line_and_the_others_still_load(fake_entry_points, caplog):
    fake_entry_points(plugins.STRATEGY_GROUP, broken="no_such_module_for_vta_ext_test",
                      good="test_plugins:register_fake_strategy")
    with caplog.at_level(logging.WARNING, logger="vta_ext"):
        names = vta_ext.available_strategies()
    assert FAKE in names and "stock" in names
    assert plugins.load_strategy_plugins() == ["good"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "\n" not in warnings[0]
    assert "'broken'" in warnings[0] and "no_such_module_for_vta_ext_test" in warnings[0]
    assert "ModuleNotFoundError" in warnings[0]
    # the fake strategy builds: its templates fall back to stock
    with vta_ext.build_options(strategy=FAKE):
        pass


def test_a_plugin_whose_registration_raises_is_named(fake_entry_points, caplog):
    fake_entry_points(plugins.STRATEGY_GROUP, raising="test_plugins:raising_registration")
    with caplog.at_level(logging.WARNING, logger="vta_ext"):
        assert plugins.load_strategy_plugins() == []
        plugins.load_strategy_plugins()  # loaded once: no second warning
    [message] = [r.getMessage() for r in caplog.records]
    assert "'raising'" in message and "RuntimeError: the fake plugin cannot register" in message
    assert "\n" not in message


def test_no_tuner_plugin_is_an_error_naming_the_group(fake_entry_points):
    fake_entry_points(plugins.TUNER_GROUP, broken="no_such_module_for_vta_ext_test")
    with pytest.raises(plugins.MissingPluginError, match="vta_ext.tuners; installed: broken"):
        plugins.tuner_plugin()


def test_tvm_csp_embed_is_an_installed_plugin():
    """The project's metadata declares it (setup.py; ``scripts/setup_env.sh`` installs it)."""
    strategies = {ep.name: ep.value for ep in
                  importlib.metadata.entry_points(group=plugins.STRATEGY_GROUP)}
    tuners = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=plugins.TUNER_GROUP)}
    assert strategies.get("csp") == "tvm_csp_embed", "re-run scripts/setup_env.sh"
    assert tuners.get("csp") == "tvm_csp_embed.tune", "re-run scripts/setup_env.sh"
    tune = plugins.tuner_plugin("csp")
    assert callable(tune.extract_tasks) and callable(tune.apply_history_best)


CHILD = textwrap.dedent("""
    import sys, vta_ext
    before = vta_ext.registered_strategies()
    assert "tvm_csp_embed" not in sys.modules
    print(before, vta_ext.available_strategies(), vta_ext.strategy.default_strategy())
""")


def test_available_strategies_loads_the_csp_plugin_in_a_fresh_process():
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[0] == ("['stock'] ['csp-relaxed', 'csp-strict', 'stock'] "
                                          "csp-relaxed"), proc.stdout
