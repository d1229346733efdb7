"""scripts/doc_tables.py: the demo table in docs/results.md against a fresh run (slow: the demo takes minutes),
and its comparison rule on hand-made tables (fast)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "doc_tables.py"


def _load():
    spec = importlib.util.spec_from_file_location("doc_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["doc_tables"] = module
    spec.loader.exec_module(module)
    return module


def _row(kld=0.14418, weight_bytes=269.0 * 2**20):
    return {"weights": "bf16", "kv": "int4", "ppl": 17.303, "ppl_ref": 14.693, "kld": {"mean": kld, "se": 0.00369, "p99": 1.0245},
            "top1_agreement": 0.8048, "weight_bytes": weight_bytes, "kv_bytes_per_token": 6480.0}


def test_a_number_off_by_more_than_the_tolerance_is_listed():
    tables = _load()
    doc = tables.render([_row()], "caption")
    assert tables.differences(doc, tables.render([_row(kld=0.14418 * 1.01)], "other caption")) == []  # within 2%
    assert tables.differences(doc, tables.render([_row(kld=0.14153)], "c")) == []  # 1.8%: within
    diffs = tables.differences(doc, tables.render([_row(weight_bytes=256.6 * 2**20)], "c"))
    assert diffs == ["bf16 × int4 weights MiB: doc 269.0, fresh 256.6"]  # issue #26: "weights MB 269.0" vs 256.6
    assert tables.differences(doc, tables.render([], "c")) == ["bf16 × int4: only in the doc"]


@pytest.mark.slow
def test_the_documented_demo_table_matches_a_fresh_demo():
    tables = _load()
    assert tables.main(["demo", "--check"]) == 0
