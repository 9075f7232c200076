"""The persistent plan cache: the plan chosen for an operator (an embedding and its knob point, or
stock / fallback / CPU with why), so that a warm build plans nothing (:class:`PlanCache`)."""
from __future__ import annotations

import json
import logging
from typing import Any, Dict, Optional

from .cache import _write, cache_dir
from .codegen.knobs import cycle_point, tps_point

__all__ = ["PLAN_VERSION", "PlanCache"]

logger = logging.getLogger("tvm_csp_embed")

#: the plan cache entries' format: bump it when an entry's fields change meaning (a change of the
#: code that chooses needs no bump: the key holds :func:`~.cache.source_digest`)
PLAN_VERSION = 10  # 10: csp-relaxed's stock plans at their searched point (stock_knobs)
#                    9: the folded bias's lane constants written by the gather (end-to-end choice)
#                    8: the knob estimate's RTL structure, the depthwise GEMM candidate

#: the knob search behind each searching knob policy (the point a plan cache entry keeps)
_SEARCHES = {"tps": tps_point, "cycles": cycle_point}


class PlanCache:
    """One entry of the persistent plan cache: the plan chosen for an operator instance.

    The key is the choice cache's (:func:`_choice_key`: configuration value, operator, constraint
    set, layouts, objective, epilogue, knobs option, the stock contender, the producer's layout, the
    source digest of the code) with :data:`PLAN_VERSION`. An entry records the chosen embedding's workload (from which the packed
    program is rebuilt without the solver) and its TPS knob point (under the ``tps`` knobs option),
    or that the stock template was chosen or fallen back to, with the sentence saying why. A warm build reads it instead of solving, building the candidates
    and timing them; only the chosen plan's code is generated.

    Files live in ``<cache_dir>/plans/<key>.json`` and are written atomically (a temporary file,
    then a rename), so a concurrent build reads a whole entry or none. An entry that cannot be read,
    is not JSON, or holds another key or format is ignored with a warning and rewritten.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self.path = cache_dir() / "plans" / f"{key}.json"

    def __repr__(self) -> str:
        return f"PlanCache({self.key}, {'present' if self.path.exists() else 'absent'})"

    def load(self) -> Optional[Dict[str, Any]]:
        """The entry, or None when there is none or it is unusable (warned)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as err:
            logger.warning("plan cache: cannot read %s (%s); planning again", self.path, err)
            return None
        try:
            data = json.loads(text)
            ok = (isinstance(data, dict) and data.get("key") == self.key
                  and data.get("version") == PLAN_VERSION
                  and data.get("plan") in ("embedding", "stock", "fallback", "cpu") and "why" in data
                  and (data["plan"] != "embedding"
                       or {"workload", "usable", "notes"} <= set(data)))
        except ValueError:
            ok = False
        if not ok:
            logger.warning("plan cache: ignoring the corrupt or foreign entry %s; planning again "
                           "and rewriting it", self.path)
            return None
        return data

    def store(self, entry: Dict[str, Any]) -> None:
        """Write ``entry`` (atomically)."""
        _write(self.path, {"key": self.key, "version": PLAN_VERSION, **entry})


