"""The residual and max pool stages as the CSP conv template offers them to ``vta_ext``'s offload
pass.

``vta_ext.offload.fusion`` fuses a residual add into the conv that produces one of its operands
only through the conv's template: :attr:`tvm_csp_embed.strategy.CspGemmTemplate.residual` is a
:class:`ResidualSupport`, so ``vta_ext`` never imports this plugin (``tests/test_imports.py``).
The stage itself: :mod:`tvm_csp_embed.codegen.residual`; the design: ``docs/csp-strategy.md``.
A max pool fused into its conv (``build_options(fuse_pool=True)``) goes the same way
(:class:`PoolSupport`, the stage :mod:`tvm_csp_embed.codegen.poolstage`), its decisions kept in
the same records (by the pool's program key).

The fusion's decisions (fused or not, the knobs the fused program built at, the three cycle
counts and the report's words) are kept on disk beside the plan cache (:class:`FusionDecisions`),
so that a warm build compiles the fused program alone: neither the conv's nor the add's own
program, no knob point tried, no cycle model run.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Any, Dict, Iterator, Optional

from vta_ext.executor import compiled_op

from .cache import _write, cache_dir, source_digest
from .candidates import packed_of, program_epilogue
from .codegen.build import residual_points
from .codegen.poolstage import PoolStage, pool_epilogue, pool_refusal, pooled_shape
from .codegen.residual import fused_epilogue, residual_refusal

__all__ = ["ResidualSupport", "PoolSupport", "fused_knob_choices", "FusionDecisions",
           "FUSION_VERSION"]

logger = logging.getLogger("tvm_csp_embed")

#: the fusion decision records' format: bump it when a record's fields change meaning (a change
#: of the code that decides needs no bump: the key holds :func:`~.cache.source_digest`)
FUSION_VERSION = 1


class ResidualSupport:
    """What a CSP conv template gives the offload pass's residual fusion: its refusal, the fused
    epilogue and the knob points to try (the functions of :mod:`.codegen.residual` and
    :func:`fused_knob_choices`)."""

    @staticmethod
    def refusal(conv_epilogue) -> Optional[str]:
        """Why a conv with ``conv_epilogue`` takes no residual stage, or None
        (:func:`~.codegen.residual.residual_refusal`)."""
        return residual_refusal(conv_epilogue)

    @staticmethod
    def fused_epilogue(conv_epilogue, add_epilogue):
        """The fused program's epilogue (:func:`~.codegen.residual.fused_epilogue`)."""
        return fused_epilogue(conv_epilogue, add_epilogue)

    @staticmethod
    def knob_choices(conv, epilogue, config) -> Iterator[Any]:
        """:func:`fused_knob_choices`."""
        return fused_knob_choices(conv, epilogue, config)

    @staticmethod
    def decisions(conv_key: str) -> "FusionDecisions":
        """The kept fusion decisions of the conv program ``conv_key`` (:class:`FusionDecisions`)."""
        return FusionDecisions(conv_key)

    #: what the fused stage is called in the report's words
    label = "add"

    def __repr__(self) -> str:
        return "ResidualSupport()"


class PoolSupport:
    """What a CSP conv template gives the offload pass's pool fusion: its refusal, the fused
    program's epilogue (the pool as its last stage, :func:`~.codegen.poolstage.pool_epilogue`)
    and the knobs to try (the conv's own policy: under a preset,
    :func:`~.codegen.build.pool_points` are tried by the build itself)."""

    #: what the fused stage is called in the report's words
    label = "pool"

    @staticmethod
    def refusal(conv, window, out_shape, config) -> Optional[str]:
        """Why the max pool ``window`` (``(pool_h, pool_w, stride_h, stride_w)``, no padding)
        cannot be fused into ``conv`` (a :class:`vta_ext.offload.fusion.FusableConv`) so that
        the fused program stores the pool's packed output of shape ``out_shape`` (one line), or
        None (:func:`~.codegen.poolstage.pool_refusal`)."""
        pg = packed_of(conv.plan.workload, config)
        pool = PoolStage(*window)
        refused = pool_refusal(pg, program_epilogue(conv.plan.workload, conv.op.epilogue), pool)
        if refused:
            return refused
        if tuple(pooled_shape(pg, pool)) != tuple(out_shape):
            return (f"the fused program's pooled output {tuple(pooled_shape(pg, pool))} is not "
                    f"the pool's packed layout {tuple(out_shape)}")
        return None

    @staticmethod
    def fused_epilogue(conv_epilogue, window):
        """The fused program's epilogue in its key: the conv's, then the pool
        (:func:`~.codegen.poolstage.pool_epilogue`)."""
        return pool_epilogue(conv_epilogue, PoolStage(*window))

    @staticmethod
    def knob_choices(conv, epilogue, config) -> Iterator[Any]:
        """The conv's own knobs (a preset: the build tries :func:`~.codegen.build.pool_points`
        from its point)."""
        yield conv.knobs

    #: the same records as the residual's (:class:`FusionDecisions`, by the pool's program key)
    decisions = staticmethod(ResidualSupport.decisions)

    def __repr__(self) -> str:
        return "PoolSupport()"


def fused_knob_choices(conv, epilogue, config) -> Iterator[Any]:
    """The knobs a fused program of ``conv`` (a :class:`vta_ext.offload.fusion.FusableConv`) with
    ``epilogue`` is built with on ``config``, in the order tried, each computed only when the one
    before did not build (the first that builds is kept, ``Offloader._fuse``): where the conv's
    policy is a preset, :func:`~.codegen.build.residual_points` from the point the conv's own
    program was built at (on regnet_x_1_6gf 224 ``pipelined`` and ``default`` never slower than
    the preset searched again with the add's stages); else the conv's explicit knobs."""

    compiled = compiled_op(conv.key) if isinstance(conv.knobs, str) else None
    if not dataclasses.is_dataclass(getattr(compiled, "knobs", None)):
        yield conv.knobs
        return
    yield from residual_points(config, compiled.plan, program_epilogue(conv.plan.workload, epilogue),
                               conv.knobs, own=dataclasses.asdict(compiled.knobs))


class FusionDecisions:
    """The fusion decisions kept for one conv program: per residual add (by its program's key),
    whether it fused, the knobs the fused program was built at, the three cycle counts (fused,
    conv, add) and the words of the report line, and what decided (the cycle model).

    The key is a digest of the conv's compiled-operator key (:func:`vta_ext.executor.op_key`),
    :func:`~.cache.source_digest` and :data:`FUSION_VERSION`: a decision made by other code is
    never served. A record also says that the conv's own program built with this key (the
    comparison compiled it), which lets a warm build defer that program until it is known to be
    needed. Files live in ``<cache_dir>/fusions/<key>.json``, written atomically
    (:func:`~.cache._write`); a record that cannot be read, is not JSON, holds another key or
    format, or a decision with missing or wrongly typed fields is ignored with a warning (the pair
    is decided again and the record rewritten)."""

    def __init__(self, conv_key: str) -> None:
        text = json.dumps([conv_key, source_digest(), FUSION_VERSION])
        self.key = hashlib.sha256(text.encode()).hexdigest()[:32]
        self.path = cache_dir() / "fusions" / f"{self.key}.json"

    def __repr__(self) -> str:
        return f"FusionDecisions({self.key}, {'present' if self.path.exists() else 'absent'})"

    @staticmethod
    def add_id(add_key: str) -> str:
        """The name of the add's decision in a record (a digest of its program's key)."""
        return hashlib.sha256(add_key.encode()).hexdigest()[:24]

    def _load(self) -> Dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            logger.warning("fusion decisions: ignoring the unreadable record %s (%s); deciding "
                           "again", self.path, err)
            return {}
        if not (isinstance(data, dict) and data.get("key") == self.key
                and data.get("version") == FUSION_VERSION and isinstance(data.get("adds"), dict)):
            logger.warning("fusion decisions: ignoring the corrupt or foreign record %s; deciding "
                           "again", self.path)
            return {}
        return data["adds"]

    def any_fused(self) -> bool:
        """Whether an add was fused into this conv, the fastest of its fusing convs (then the
        conv's own program may not be needed)."""
        return any(_valid(d) and d["fused"] and d.get("chosen", True)
                   for d in self._load().values())

    def get(self, add_key: str) -> Optional[Dict[str, Any]]:
        """The decision for the add ``add_key``, or None (none kept, or unusable: warned)."""
        decision = self._load().get(self.add_id(add_key))
        if decision is not None and not _valid(decision):
            logger.warning("fusion decisions: ignoring the malformed decision %s in %s; deciding "
                           "again", self.add_id(add_key), self.path)
            return None
        return decision

    def put(self, add_key: str, decision: Dict[str, Any]) -> None:
        """Keep ``decision`` for the add ``add_key`` (the record rewritten atomically)."""
        adds = dict(self._load(), **{self.add_id(add_key): decision})
        _write(self.path, {"key": self.key, "version": FUSION_VERSION, "adds": adds})


def _valid(decision: Any) -> bool:
    """Whether a kept decision has the fields a build reads, of the right types."""
    if not isinstance(decision, dict) or not isinstance(decision.get("fused"), bool) \
            or not isinstance(decision.get("words"), str):
        return False
    if decision["fused"]:
        return isinstance(decision.get("knobs"), (dict, str)) and isinstance(
            decision.get("cycles"), list) and len(decision["cycles"]) == 3
    return True
