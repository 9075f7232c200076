"""Per-build choices, in the AutoTVM habit: a context manager around a plain ``relax.build``.

.. code-block:: python

    with vta_ext.build_options(strategy="stock", knobs="fallback"):
        ex = tvm.relax.build(mod, target="ext_vta")

* ``strategy``: a registered strategy (:func:`vta_ext.strategy.registered_strategies`); by default
  :func:`vta_ext.strategy.default_strategy`.
* ``knobs``: ``"cycles"`` (default: the point of fewest estimated cycles that fits, ties broken by
  DRAM bytes, for templates with a cycle estimate of their knob points, the CSP templates; the
  stock templates build their TPS point for it, see :mod:`vta_ext.templates.knobs`, except the
  stock-template programs ``csp-relaxed`` keeps, which it builds at a point searched on the cycle
  model, :mod:`tvm_csp_embed.stock_knobs`), ``"tps"``
  (the Tiling Parameter Search, fewest DRAM bytes that fit), ``"fallback"`` (the original stack's
  fallback schedule) or an explicit knob dict, either flat (applied to every operator; each
  template validates it) or keyed by operator kind (``{"conv2d": {...}, "dense": {...}}``; kinds
  not named get ``"cycles"``).
* ``layout`` (``"NCHW"``, ``"NHWC"`` or ``"auto"``) and ``objective`` (``"end-to-end"``,
  ``"cycles"``, ``"combined"`` or ``"footprint"``): how strategies that choose a data layout and an
  embedding (the CSP strategies of :mod:`tvm_csp_embed`) order the free dimensions and rank their
  candidates; the ``stock`` strategy has one fixed layout and ignores them.
* ``host``: the :class:`~vta_ext.host.HostModel` that prices host work in VTA cycles (default
  :data:`~vta_ext.host.PYNQ_Z1`, the original board's Cortex-A9): the ``end-to-end`` objective and
  the build report's end-to-end estimate use it.
* ``fuse_residual``: whether a residual add may be fused into the conv that produces one of its
  operands (default False; :mod:`vta_ext.offload.fusion`).
* ``fuse_pool``: whether a max pool may be fused into the conv that produces its input (default
  False; :mod:`vta_ext.offload.fusion`, :mod:`vta_ext.offload.poolsplit`).
* ``records``: tuned records (see :mod:`tvm_csp_embed.tune`), any object with
  ``best_knobs(kind, strategy, workload, config) -> (knobs dict, origin text) or None``. A record
  that applies overrides ``knobs`` for its workload.

Options nest; the innermost ``with`` wins. They are context-local (threads and asyncio tasks see
their own).
"""
from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from .host import PYNQ_Z1, HostModel, host_model
from .strategy import default_strategy, get_strategy

__all__ = ["BuildOptions", "build_options", "current_options", "KNOB_POLICIES", "DEFAULT_KNOBS", "LAYOUTS",
           "OBJECTIVES"]

#: the named knob policies every template understands
KNOB_POLICIES = ("cycles", "tps", "fallback")
#: the knob policy of a build that names none
DEFAULT_KNOBS = "cycles"
#: data layouts of the free dimensions a layout-choosing strategy may use
LAYOUTS = ("auto", "NCHW", "NHWC")
#: how a strategy with several candidate embeddings ranks them: VTA cycles plus the host layout
#: traffic the plan adds, priced by the host model (default); VTA cycles only; cycles plus the host
#: relayout time measured on this machine; packed bytes
OBJECTIVES = ("end-to-end", "cycles", "combined", "footprint")

Knobs = Union[str, Mapping[str, Any]]


@dataclass(frozen=True)
class BuildOptions:
    """The choices in effect for one ``relax.build`` (see :func:`build_options`)."""

    strategy: Optional[str] = None
    knobs: Knobs = DEFAULT_KNOBS
    records: Any = None
    layout: str = "auto"
    objective: str = "end-to-end"
    host: HostModel = PYNQ_Z1
    fuse_residual: bool = False
    fuse_pool: bool = False

    @property
    def strategy_name(self) -> str:
        """The strategy to use: the one given, else the registered default."""
        return self.strategy or default_strategy()

    def knobs_for(self, kind: str, strategy: str, workload, config) -> Tuple[Knobs, str]:
        """``(knobs, origin)`` for one operator: a tuned record if one applies, else the option.

        ``origin`` is the text of the build report: ``"tps knobs"``, ``"fallback knobs"``,
        ``"explicit knobs"`` or the record's own text (``"tuned record from net.json:12"``).
        """
        if self.records is not None:
            found = self.records.best_knobs(kind, strategy, workload, config)
            if found is not None:
                return found
        knobs = self.knobs
        if isinstance(knobs, str):
            return knobs, f"{knobs} knobs"
        if knobs and all(isinstance(v, Mapping) for v in knobs.values()):
            if kind not in knobs:
                return DEFAULT_KNOBS, f"{DEFAULT_KNOBS} knobs"
            return dict(knobs[kind]), "explicit knobs"
        return dict(knobs), "explicit knobs"

    def __enter__(self) -> "BuildOptions":
        tokens = self.__dict__.setdefault("_tokens", [])  # frozen: keep the reset tokens aside
        tokens.append(_CURRENT.set(self))
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.reset(self.__dict__["_tokens"].pop())

    def __repr__(self) -> str:
        extra = "" if self.records is None else f", records={self.records!r}"
        if (self.layout, self.objective) != ("auto", "end-to-end"):
            extra += f", layout={self.layout!r}, objective={self.objective!r}"
        if self.host != PYNQ_Z1:
            extra += f", host={self.host!r}"
        if self.fuse_residual:
            extra += ", fuse_residual=True"
        if self.fuse_pool:
            extra += ", fuse_pool=True"
        return f"build_options(strategy={self.strategy_name!r}, knobs={self.knobs!r}{extra})"


def build_options(strategy: Optional[str] = None, knobs: Knobs = DEFAULT_KNOBS, records: Any = None,
                  layout: str = "auto", objective: str = "end-to-end",
                  host: Union[None, HostModel, Mapping[str, Any]] = None,
                  fuse_residual: bool = False, fuse_pool: bool = False) -> BuildOptions:
    """Choose the strategy, knobs and tuned records of the ``relax.build`` calls in a ``with``.

    Parameters
    ----------
    strategy : str, optional
        A registered strategy name (``"stock"``, and ``"csp-strict"`` / ``"csp-relaxed"`` once
        :mod:`tvm_csp_embed` is imported). Default: the registered default strategy.
    knobs : {"cycles", "tps", "fallback"} or dict
        The knob policy, or explicit knob values (flat, or keyed by operator kind).
    records : object, optional
        Tuned records with a ``best_knobs(kind, strategy, workload, config)`` method, e.g.
        ``tvm_csp_embed.tune.apply_history_best(...)``.
    layout : {"auto", "NCHW", "NHWC"}
        Layout of the free dimensions for strategies that choose one (``auto``: the strategy picks).
    objective : {"end-to-end", "cycles", "combined", "footprint"}
        Ranking of candidate embeddings: VTA cycles plus the modelled cycles of the host layout
        traffic the plan adds (``host``); VTA cycles only; cycles plus the host relayout time
        measured on this machine; or packed bytes.
    host : HostModel or dict, optional
        The host model (:mod:`vta_ext.host`); default the original board's.
    fuse_residual : bool
        Whether a residual add may be fused into the conv that produces one of its operands
        (:mod:`vta_ext.offload.fusion`; where it is faster on the cycle model, a decision kept
        in the plan cache so that a warm build compiles the fused program alone). Off by default:
        a cold build must still compile and time each fused program, which takes it past the
        fast-builds bar (resnet18 224 ``default`` cold 3.47 s -> 5.02 s, x2.7 -> x3.9 of stock;
        bar x3).
    fuse_pool : bool
        Whether a max pool (no padding) may be fused into the conv that produces its input, a
        pool of a channel concat of conv outputs split into one pool per part first
        (:mod:`vta_ext.offload.poolsplit`); kept where the cycle model says the fused program is
        faster than the conv's and the pool's (decided per configuration, kept in the plan
        cache like ``fuse_residual``'s). Off by default, as ``fuse_residual``.

    Raises
    ------
    ValueError
        For an unknown strategy or knob policy; the message lists the valid ones.
    """
    if strategy is not None:
        get_strategy(strategy)
    if isinstance(knobs, str):
        if knobs not in KNOB_POLICIES:
            raise ValueError(f"unknown knob policy {knobs!r}; use one of {list(KNOB_POLICIES)} or "
                             "a dict of knob values")
    elif not isinstance(knobs, Mapping):
        raise ValueError(f"knobs must be one of {list(KNOB_POLICIES)} or a dict of knob values, "
                         f"got {type(knobs).__name__}")
    if records is not None and not callable(getattr(records, "best_knobs", None)):
        raise ValueError(f"records must have a best_knobs(kind, strategy, workload, config) method "
                         f"(e.g. tvm_csp_embed.tune.apply_history_best(...)), got {records!r}")
    for name, value, valid in (("layout", layout, LAYOUTS), ("objective", objective, OBJECTIVES)):
        if value not in valid:
            raise ValueError(f"unknown {name} {value!r}; use one of {list(valid)}")
    return BuildOptions(strategy, knobs if isinstance(knobs, str) else dict(knobs), records,
                        layout, objective, host_model(host), bool(fuse_residual),
                        bool(fuse_pool))


_CURRENT: contextvars.ContextVar = contextvars.ContextVar("vta_ext_build_options",
                                                          default=BuildOptions())


def current_options() -> BuildOptions:
    """The options in effect (the defaults outside any ``with build_options(...)``)."""
    return _CURRENT.get()
