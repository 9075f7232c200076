"""Co-design: search the VTA configuration and the strategy's embeddings together.

.. code-block:: python

    from tvm_csp_embed import codesign, tune

    front = codesign.explore(mod, space=codesign.Space(), budget=200, strategy="csp-relaxed",
                             runner=tune.LocalRunner(n_parallel=2))   # or tune.DaskRunner(address)
    front.points        # DesignPoint(config, cycles, area, dram_bytes, on_front)
    front.presets       # the shipped presets, evaluated the same way
    front.to_csv("front.csv"); front.plot("front.png")
    best = front.best(area_budget=2.0)                      # area proxy relative to `default`
    ex = tvm.relax.build(mod, target=vta_ext.vta_target(best.config))

One concept per module: :mod:`.space` (the ranges), :mod:`.area` (the area proxy), :mod:`.bound`
(the lower bound that prunes), :mod:`.evaluate` (one configuration, and the records),
:mod:`.explore` (the search), :mod:`.front` (the result). See ``docs/codesign.md``.
"""
from .area import AREA_PROXY, AreaModel, area_proxy
from .explore import explore
from .front import DesignPoint, Front
from .space import Space

__all__ = ["explore", "Space", "Front", "DesignPoint", "AreaModel", "AREA_PROXY", "area_proxy"]
