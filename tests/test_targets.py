"""``vta_ext.vta_target``: validates at once, and carries a configuration object by value through
the target, the build (cache keys) and the exported module (issue 20, part 3).

References: the preset files in ``vta_ext/configs`` listed independently, ``VTAConfig.from_json``
of the file given, the llvm build of the same int8 module (bit for bit).
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

import vta_ext
from conftest import REPO, conv_module, random_inputs, run_module
from vta_ext import ConfigError, VTAConfig, load_config, vta_target
from vta_ext.target import config_of_target

PRESETS = sorted(p.stem for p in (REPO / "vta_ext" / "configs").glob("*.json"))


def small_inputs_config() -> VTAConfig:
    """The default design with a 4 KiB input buffer (256 entries instead of 2,048)."""
    return dataclasses.replace(load_config("default"), LOG_INP_BUFF_SIZE=12)


# ------------------------------------------------------------------ validation at once
def test_unknown_preset_raises_at_once_and_lists_the_presets():
    with pytest.raises(ConfigError) as err:
        vta_target("nope")
    message = str(err.value)
    assert "'nope'" in message and ".json" in message
    assert all(name in message for name in PRESETS), message


@pytest.mark.parametrize("content, field", [
    ('{"LOG_INP_BUFF_SIZE": "big"}', "LOG_INP_BUFF_SIZE"),
    ('{"LOG_BACTH": 1}', "LOG_BACTH"),
    ('{"LOG_WGT_BUFF_SIZE": 30}', "LOG_WGT_BUFF_SIZE"),
    ('{"EXT_CLIP": 1}', "EXT_CLIP"),
])
def test_invalid_json_configuration_names_the_field(tmp_path, content, field):
    path = tmp_path / "mine.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=field):
        vta_target(str(path))


def test_malformed_or_missing_file_names_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"LOG_BATCH": 0,,}')
    with pytest.raises(ConfigError, match="broken.json.*not valid JSON"):
        vta_target(path)
    with pytest.raises(ConfigError, match="absent.json: no such file"):
        vta_target(tmp_path / "absent.json")
    with pytest.raises(TypeError, match="preset name"):
        vta_target(16)


# ------------------------------------------------------------------ presets as before
def test_presets_by_name_and_by_tag_work_as_before():
    assert str(vta_target("default")) == str(tvm.target.Target("ext_vta"))
    assert config_of_target(tvm.target.Target("ext_vta")) == load_config("default")
    assert vta_target("pipelined").attrs["model"] == "pipelined"
    for name in PRESETS:
        by_tag = tvm.target.Target({"tag": "ext_vta", "model": name})
        assert config_of_target(by_tag) == VTAConfig.from_json(REPO / "vta_ext" / "configs"
                                                               / f"{name}.json")
        assert config_of_target(vta_target(name)) == config_of_target(by_tag)


# ------------------------------------------------------------------ configuration objects
def test_configuration_object_and_file_round_trip_through_the_target(tmp_path):
    custom = small_inputs_config()
    named = VTAConfig.from_dict({**custom.to_dict(), "GEMM_CYCLES_PER_UOP": 2}, name="mine")
    for cfg in (custom, named):
        target = vta_target(cfg)
        assert config_of_target(target) == cfg  # name and value
        # the target survives its own serialisation (e.g. a target string in a config file)
        assert config_of_target(tvm.target.Target(json.loads(str(target)))) == cfg
    path = tmp_path / "mydesign.json"
    path.write_text(json.dumps(named.to_dict()))
    assert config_of_target(vta_target(str(path))) == VTAConfig.from_json(path)
    assert config_of_target(vta_target(path)).name == "mydesign"
    # a configuration equal to a preset is carried by the preset's name
    assert vta_target(load_config("2x16x16")).attrs["model"] == "2x16x16"


@pytest.fixture(scope="module")
def custom_build():
    """The one-conv module built for the custom configuration and for ``default``, run once."""
    mod = conv_module(1, 16, 16, 8, 3)
    arrays = random_inputs(mod, seed=3)
    runs = {}
    for name, cfg in (("custom", small_inputs_config()), ("default", load_config("default"))):
        with vta_ext.build_options(strategy="stock"):
            executable = relax.build(mod, target=vta_target(cfg))
        vta_ext.clear_run_log()
        out = relax.VirtualMachine(executable, tvm.cpu())["main"](
            *[tvm.runtime.tensor(a) for a in arrays]).numpy()
        runs[name] = (executable, out, vta_ext.run_log(), vta_ext.last_build_report())
    return mod, arrays, runs


def test_custom_configuration_builds_runs_bit_exact_and_keys_by_value(custom_build):
    mod, arrays, runs = custom_build
    llvm = run_module(mod, "llvm", arrays)
    custom, default = small_inputs_config(), load_config("default")
    for name, cfg in (("custom", custom), ("default", default)):
        _, out, calls, report = runs[name]
        np.testing.assert_array_equal(out, llvm)
        assert [p.op for p in report.on_vta] == ["relax.nn.conv2d"]
        assert len(calls) == 1
        # the program that ran was built for this configuration's value
        assert json.loads(calls[0].key)["config_value"] == cfg.to_dict()
        assert calls[0].cycles.config == cfg
    # same name ("default"), different value: different operators, different simulators
    assert runs["custom"][2][0].key != runs["default"][2][0].key


def test_exported_module_for_a_custom_configuration_runs_in_a_fresh_process(custom_build,
                                                                          tmp_path):
    mod, arrays, runs = custom_build
    executable = runs["custom"][0]
    library = tmp_path / "conv_custom.so"
    executable.export_library(str(library))
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"in{i}.npy", a)
    script = (
        "import json, sys\n"
        "import numpy as np, tvm, vta_ext\n"
        "from tvm import relax\n"
        "d = sys.argv[1]\n"
        f"vm = relax.VirtualMachine(tvm.runtime.load_module(d + '/{library.name}'), tvm.cpu())\n"
        f"args = [tvm.runtime.tensor(np.load(f'{{d}}/in{{i}}.npy'))\n"
        f"        for i in range({len(arrays)})]\n"
        "np.save(d + '/out.npy', vm['main'](*args).numpy())\n"
        "print(json.dumps([json.loads(r.key)['config_value'] for r in vta_ext.run_log()]))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    values = json.loads(proc.stdout.strip().splitlines()[-1])
    assert values == [small_inputs_config().to_dict()]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), run_module(mod, "llvm", arrays))
