"""The plugins of :mod:`vta_ext`, found through Python entry points.

A package adds strategies or a tuner to ``vta_ext`` by declaring entry points in its installed
metadata; ``vta_ext`` never imports it by name. Two groups:

``vta_ext.strategies`` (:data:`STRATEGY_GROUP`)
    Each entry point names a module whose import registers strategies and templates
    (:func:`vta_ext.register_strategy`, :func:`vta_ext.register_template`), or a function that
    registers them when called without arguments.
``vta_ext.tuners`` (:data:`TUNER_GROUP`)
    Each entry point names a tuner module, the API that ``vta-ext tune`` and
    ``vta-ext compile --records`` use: ``extract_tasks``, ``XGBTuner``, ``RandomTuner``,
    ``GridSearchTuner``, ``LocalRunner``, ``measure_option``, ``callback`` and
    ``apply_history_best``.

For example, ``tvm_csp_embed`` declares in its ``setup.py``::

    entry_points={"vta_ext.strategies": ["csp = tvm_csp_embed"],
                  "vta_ext.tuners": ["csp = tvm_csp_embed.tune"]}

:func:`load_strategy_plugins` loads every installed strategy plugin once per process;
:func:`available_strategies` and the command line call it. A plugin that fails to load logs one
warning line naming the entry point and the error, and the other strategies stay usable.
"""
from __future__ import annotations

import importlib.metadata
import logging
from types import ModuleType
from typing import Dict, List, Optional

from .strategy import registered_strategies

__all__ = ["STRATEGY_GROUP", "TUNER_GROUP", "MissingPluginError", "load_strategy_plugins",
           "available_strategies", "tuner_plugin"]

#: the entry-point group of strategy plugins
STRATEGY_GROUP = "vta_ext.strategies"
#: the entry-point group of tuner plugins
TUNER_GROUP = "vta_ext.tuners"

logger = logging.getLogger("vta_ext")

#: ``(group, entry point name)`` -> what loading it gave (None for a plugin that failed)
_LOADED: Dict[tuple, Optional[object]] = {}


class MissingPluginError(LookupError):
    """No installed plugin of a group (or none of the requested name) could be loaded."""


def _entry_points(group: str) -> list:
    """The installed entry points of ``group``, sorted by name."""
    return sorted(importlib.metadata.entry_points(group=group), key=lambda ep: ep.name)


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"


def _load(entry_point, call: bool) -> Optional[object]:
    """Load ``entry_point`` once per process (and call what it names if ``call`` and it is a
    function); a failure logs one warning line and gives None."""
    key = (entry_point.group, entry_point.name)
    if key in _LOADED:
        return _LOADED[key]
    try:
        obj = entry_point.load()
        if call and callable(obj) and not isinstance(obj, (ModuleType, type)):
            obj()
    except Exception as err:  # noqa: BLE001 - any error of a plugin must not stop the host
        logger.warning("vta_ext: plugin %r (entry point %s = %s) failed to load: %s: %s; it is "
                       "skipped: reinstall or fix the package that declares it",
                       entry_point.name, entry_point.group, entry_point.value,
                       type(err).__name__, _first_line(err))
        obj = None
    _LOADED[key] = obj
    return obj


def load_strategy_plugins() -> List[str]:
    """Load every installed strategy plugin (group :data:`STRATEGY_GROUP`), once per process.

    Returns
    -------
    list of str
        The names of the entry points that loaded; a broken one is left out, with a warning.
    """
    return [ep.name for ep in _entry_points(STRATEGY_GROUP) if _load(ep, call=True) is not None]


def available_strategies() -> List[str]:
    """The strategies a build can use: the registered ones after loading the installed plugins.

    Returns
    -------
    list of str
        Strategy names, sorted (e.g. ``['csp-relaxed', 'csp-strict', 'stock']`` with
        ``tvm_csp_embed`` installed).
    """
    load_strategy_plugins()
    return registered_strategies()


def tuner_plugin(name: Optional[str] = None):
    """The tuner module of an installed tuner plugin (group :data:`TUNER_GROUP`).

    Parameters
    ----------
    name : str, optional
        The entry point's name; default: the first installed one, by name, that loads.

    Returns
    -------
    module
        The tuner API (see the module docstring).

    Raises
    ------
    MissingPluginError
        If no tuner plugin (of that name) is installed or none loads.
    """
    found = _entry_points(TUNER_GROUP)
    candidates = [ep for ep in found if name is None or ep.name == name]
    for ep in candidates:
        module = _load(ep, call=False)
        if module is not None:
            return module
    installed = ", ".join(ep.name for ep in found) or "none"
    wanted = "tuner plugin" if name is None else f"tuner plugin {name!r}"
    raise MissingPluginError(
        f"no {wanted} could be loaded (entry point group {TUNER_GROUP}; installed: {installed}); "
        "install a package that declares one, e.g. pip install -e . in this project")
