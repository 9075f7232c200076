"""The constraint model returns the same solutions, in the same order, as the model it replaced.

``tests/data/embed_reference.json`` froze, once, the solutions of the earlier model
(``scripts/embed_reference.py --out``, model sha256 in the file) on every solve a build starts
for ResNet-18 C1-C11, MobileNet D1-D9 and the 108 DeepBench layers (strict and relaxed, every
layout the strategy offers), one branch-and-bound solve per layer and mode, and small solves under
the node search order and custom constraint sets. Each case's record is its status and, per
solution in order, the binding, the dim and step of every instruction bit, the padding, the cost,
the optimality flag and a digest of every multiply and data node value. The current model must
reproduce every record. The default run takes a sample (and re-checks its solutions against
islpy with :func:`~tvm_csp_embed.verify.check_raw`); ``pytest -m slow`` runs every case.
"""
import importlib.util
import json
from pathlib import Path

import pytest

from tvm_csp_embed.verify import check_raw

REPO = Path(__file__).resolve().parents[1]
TABLE = Path(__file__).resolve().parent / "data" / "embed_reference.json"


def _script():
    path = REPO / "scripts" / "embed_reference.py"
    spec = importlib.util.spec_from_file_location("embed_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ER = _script()
REFERENCE = json.loads(TABLE.read_text())["cases"]
SAMPLE = ER.cases("sample")


def _check(case, islpy=False):
    got = []
    rec = ER.record(case, result=got)
    ref = REFERENCE[case]
    assert rec["status"] == ref["status"], case
    assert rec["solutions"] == ref["solutions"], case
    if islpy:
        wl, instr, res = got[0]
        for s in res.solutions:
            check_raw(s, wl, instr)


def test_reference_covers_every_case():
    ids = ER.cases("all")
    assert sorted(REFERENCE) == sorted(ids)
    assert len([c for c in ids if c.startswith("build/")]) > 500
    # the frozen solves found embeddings (a table of failures would prove little)
    statuses = [REFERENCE[c]["status"] for c in ids]
    assert statuses.count("ok") > 0.9 * len(ids) and "infeasible" in statuses


@pytest.mark.parametrize("case", SAMPLE)
def test_same_solutions_as_the_reference_model(case):
    _check(case, islpy=True)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in ER.cases("all") if c not in SAMPLE])
def test_same_solutions_as_the_reference_model_everywhere(case):
    _check(case)
