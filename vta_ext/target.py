"""The ``ext_vta`` target and the hook that makes ``tvm.relax.build(mod, target="ext_vta")`` use VTA.

Importing :mod:`vta_ext` registers the target tag ``ext_vta`` (kind ``ext_dev``, keys
``vta``/``cpu``, the configuration carried in ``model``: a preset name, or the configuration's
value as JSON, see :func:`vta_target`) and wraps TVM's ``default`` Relax
pipelines: when the target in scope is a VTA target, the VTA passes run first (offload of matched
operators, see :mod:`vta_ext.offload`), then TVM's own default pipeline, then a pass that drops
the PrimFuncs that pipeline made and left unused (:func:`drop_unused_prim_funcs`), then a pass that
gives every remaining PrimFunc the llvm host target. Other targets are untouched.
"""
from __future__ import annotations

import json
import os
from typing import Optional, Union

import tvm
from tvm import relax

from .config import ConfigError, VTAConfig, available_configs, load_config
from .host_kernels import shape_generic_host_kernels

__all__ = ["TARGET_TAG", "register_target", "vta_target", "is_vta_target", "config_of_target"]

TARGET_TAG = "ext_vta"
DEFAULT_MODEL = "default"


def register_target() -> None:
    """Register the ``ext_vta`` tag (idempotent)."""
    tvm.target.register_tag(TARGET_TAG, {
        "kind": "ext_dev", "keys": ["vta", "cpu"], "device": "vta", "model": DEFAULT_MODEL,
        "host": {"kind": "llvm"},
    }, override=True)


def _target_model(config: VTAConfig) -> str:
    """The ``model`` attribute that carries ``config``: the preset's name if ``config`` is that
    preset (same name, same value), else the configuration itself as canonical JSON (its name
    under ``"name"``), so that a configuration made in Python or read from a file reaches the
    build, and every process that reads the target, by value."""
    if config.name in available_configs() and load_config(config.name) == config:
        return config.name
    return json.dumps({"name": config.name, **config.to_dict()}, sort_keys=True)


def vta_target(config: Union[str, os.PathLike, VTAConfig] = DEFAULT_MODEL) -> tvm.target.Target:
    """The ``ext_vta`` target for a VTA configuration, validated now.

    Parameters
    ----------
    config : str, path-like or VTAConfig
        A preset name (``"default"``, ``"pipelined"``, ... :func:`vta_ext.available_configs`), the
        path of a configuration JSON file (``.json``), or a :class:`~vta_ext.config.VTAConfig`
        (e.g. ``dataclasses.replace(vta_ext.load_config("default"), LOG_INP_BUFF_SIZE=14)``).

    Returns
    -------
    tvm.target.Target
        The target; :func:`config_of_target` gives back a configuration equal to ``config``
        (name and value). A preset is carried by name in the target's ``model`` attribute,
        anything else by value, as JSON.

    Raises
    ------
    ConfigError
        For an unknown preset (the message lists the presets), a missing or malformed file, or
        an invalid configuration (the message names the key or field).
    TypeError
        For any other type of ``config``.
    """
    if not isinstance(config, (str, os.PathLike, VTAConfig)):
        raise TypeError(f"vta_target(config): expected a preset name, the path of a .json "
                        f"configuration or a VTAConfig, got {type(config).__name__} {config!r}")
    model = _target_model(load_config(config))
    if model == DEFAULT_MODEL:
        return tvm.target.Target(TARGET_TAG)
    return tvm.target.Target({"tag": TARGET_TAG, "model": model})


def is_vta_target(target: Optional[tvm.target.Target]) -> bool:
    """True for targets made from the ``ext_vta`` tag (recognised by kind and keys)."""
    return target is not None and target.kind.name == "ext_dev" and "vta" in list(target.keys)


def config_of_target(target: tvm.target.Target) -> VTAConfig:
    """The :class:`~vta_ext.config.VTAConfig` the target carries in its ``model`` attribute.

    ``model`` is a preset name, the path of a configuration JSON file, or a configuration as JSON
    (what :func:`vta_target` writes for a configuration that is not a preset).

    Raises
    ------
    ConfigError
        If ``model`` names no preset, or its configuration is invalid (the message names the key).
    """
    model = str(target.attrs.get("model", DEFAULT_MODEL)) if target.attrs else DEFAULT_MODEL
    model = model or DEFAULT_MODEL
    if not model.lstrip().startswith("{"):
        return load_config(model)
    try:
        data = json.loads(model)
    except json.JSONDecodeError as err:
        raise ConfigError(f"target {TARGET_TAG!r}: its model attribute is neither a preset name "
                          f"nor a configuration in JSON ({err}); make the target with "
                          "vta_ext.vta_target(...)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"target {TARGET_TAG!r}: its model attribute must be a JSON object of "
                          "configuration keys; make the target with vta_ext.vta_target(...)")
    return VTAConfig.from_dict({k: v for k, v in data.items() if k != "name"},
                               name=str(data.get("name", "custom")))


@tvm.transform.module_pass(opt_level=0, name="VTAStampHostTarget")
def stamp_host_target(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Give every PrimFunc without a target the llvm host target (there is no ext_dev device API;
    all tensors live on the CPU and VTA programs run through packed calls)."""
    llvm = tvm.target.Target("llvm")
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, tvm.tirx.PrimFunc) and "target" not in (func.attrs or {}):
            mod[gvar] = func.with_attr("target", llvm)
    return mod


def drop_unused_prim_funcs(keep) -> tvm.transform.Pass:
    """A pass that removes every PrimFunc no Relax function of the module refers to, except those
    named in ``keep`` (the input module's own). The PrimFuncs TVM's pipeline makes (legalized
    operators) call no other PrimFunc, so an unreferenced one is dead.

    TVM's default Relax pipeline legalizes every ``relax.reshape`` into a PrimFunc, then rewrites
    the call into a view (``RewriteDataflowReshape``) and leaves the PrimFunc in the module, where
    ``relax.build`` lowers and LLVM-compiles it all the same. The host relayouts around VTA
    operators are mostly reshapes (RegNetX-1.6GF at 224: 65 of the 129 PrimFuncs of a
    ``csp-relaxed`` build, 20 of 76 under ``stock``), so this is a good share of a warm build.
    """
    keep = frozenset(keep)

    @tvm.transform.module_pass(opt_level=0, name="VTADropUnusedPrimFuncs")
    def drop(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        live = set(keep)
        for gv, func in mod.functions.items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                live.add(gv.name_hint)
                if isinstance(func, relax.Function):
                    live |= {g.name_hint for g in relax.analysis.all_global_vars(func)}
        dead = [gv for gv in mod.functions if gv.name_hint not in live]
        if not dead:
            return mod
        return tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv.name_hint in live},
                            attrs=mod.attrs)

    return drop


def _vta_passes(target: tvm.target.Target) -> tvm.transform.Pass:
    from .offload import OffloadToVTA

    return tvm.transform.Sequential([
        OffloadToVTA(config_of_target(target)),
        relax.transform.DeadCodeElimination(),
    ], name="VTAOffload")


_ORIGINAL_PIPELINES = {}


def _dispatching(name: str):
    original = _ORIGINAL_PIPELINES[name]

    def factory(**kwargs):
        inner = original(**kwargs)

        @tvm.transform.module_pass(opt_level=0, name=f"VTADispatch_{name}")
        def dispatch(mod, _ctx):
            target = tvm.target.Target.current(allow_none=True)
            if is_vta_target(target):
                own = [gv.name_hint for gv, f in mod.functions.items()
                       if isinstance(f, tvm.tirx.PrimFunc)]
                return tvm.transform.Sequential([_vta_passes(target), shape_generic_host_kernels,
                                                 inner,
                                                 drop_unused_prim_funcs(own),
                                                 stamp_host_target])(mod)
            return inner(mod)

        return dispatch

    factory._vta_hooked = True
    return factory


#: the TVM Relax pipelines that ``relax.build`` resolves by name and that we wrap
HOOKED_PIPELINES = ("default", "default_build")


def install_pipeline_hook(pipeline_map: Optional[dict] = None) -> None:
    """Wrap the ``default`` and ``default_build`` Relax pipelines (idempotent).

    Raises
    ------
    RuntimeError
        If TVM no longer has one of these pipelines (renamed in a newer TVM): without the hook,
        ``relax.build(mod, target="ext_vta")`` would silently leave everything on the CPU.
    """
    pipeline_map = relax.pipeline.PIPELINE_MAP if pipeline_map is None else pipeline_map
    missing = [name for name in HOOKED_PIPELINES if name not in pipeline_map]
    if missing:
        raise RuntimeError(f"TVM {tvm.__version__} has no Relax pipeline(s) {missing} (it has "
                           f"{sorted(pipeline_map)}); vta_ext cannot hook relax.build, so nothing "
                           "would run on VTA. Use apache-tvm==0.27.0.post1 or update "
                           "vta_ext.target.HOOKED_PIPELINES.")
    for name in HOOKED_PIPELINES:
        if getattr(pipeline_map[name], "_vta_hooked", False):
            continue
        _ORIGINAL_PIPELINES[name] = pipeline_map[name]
        pipeline_map[name] = _dispatching(name)
