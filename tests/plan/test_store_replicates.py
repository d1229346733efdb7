"""plan --store: a config a store holds twice (findings --replicates) is one measurement, its replicates pooled by the
findings' rule (stats.bootstrap.pool), so the run-to-run variance is inside every decision the planner makes on it."""
from __future__ import annotations

import hashlib
import json
import sqlite3

import numpy as np
import pytest

from typer.testing import CliRunner

from tests.plan.test_tolerance_plan import TAU, _app, _documented, rows_of, spread
from wkvlab.plan import load_measurements, plan
from wkvlab.plan.verdict import UNDECIDED, WITHIN, tolerance_rule
from wkvlab.store import open_store

LIN = np.linspace(-1, 1, 16)  # spread()'s shape: unit u of a config at centre c is c * (1 + 0.1 * LIN[u])


def put_run(db, weights: str, kv: str, unit_kld, replicate: int = 0, chunk: int = 0) -> str:
    """One stored run as a sweep writes it: the config with its identity, replicate r >= 1 adding its own entry."""
    result = _documented("tinyplan", weights, kv, unit_kld)
    identity = {"model_sha256": "m" * 64, "ctx": result.ctx, "weights": result.weights_spec, "kv": result.kv_spec}
    if replicate:
        identity["replicate"] = {"index": replicate, "chunk": chunk, "calibration_sample": None}
    config_id = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    config = {"weights": result.weights_spec, "kv": result.kv_spec, "score": "all", "replicate": replicate, "chunk": chunk,
              "identity": identity}
    assert db.put(config_id, config, result)
    return config_id


def test_a_config_stored_twice_is_one_measurement_with_the_replicates_pooled(model_dir, tmp_path):
    path = tmp_path / "findings.db"
    with open_store(path) as db:
        put_run(db, "none", "int8", spread(0.001))
        put_run(db, "none", "int8", spread(0.009), replicate=1, chunk=32)
        put_run(db, "none", "int4", spread(0.05))  # measured once: as before
    measured = load_measurements(stores=[path])
    assert [(m.kv, m.replicates) for m in measured] == [("int8", 2), ("int4", 1)]
    pooled = measured[0]
    # by hand (stats/replicates.py): mean of the replicates' means; se² = Σψ²/(U(U−1)) + Σ(θ_r−θ̄)²/(R(R−1)),
    # ψ_u the unit's deviation averaged over replicates: (0.0001 + 0.0009) / 2 * LIN[u]
    unit_var = float(((0.0005 * LIN) ** 2).sum()) / (16 * 15)
    replicate_var = 2 * 0.004 ** 2 / (2 * 1)
    assert pooled.kld == pytest.approx(0.005, abs=1e-12) and pooled.se == pytest.approx(np.sqrt(unit_var + replicate_var), rel=1e-9)
    assert pooled.low < 0.001 and pooled.high > 0.009  # two replicates that disagree leave ~1 df: a wide interval
    assert pooled.units.kld == pytest.approx(tuple(spread(0.001))) and pooled.units.replicates[0].kld == pytest.approx(tuple(spread(0.009)))
    rows = rows_of(plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", measurements=measured))
    row = rows[("bf16", "int8")]
    assert row.quality.kld == pytest.approx(0.005) and row.quality.label == "measured (2 replicates × 1,024 tokens, ctx 65, default)"
    assert rows[("bf16", "int4")].quality.label == "measured (1,024 tokens, ctx 65, default)"


def test_a_tolerance_decides_on_the_pooled_replicates_not_on_the_first(model_dir, tmp_path):
    """Replicate 0 alone is far within 0.01; replicate 1 measured 0.009: one config whose runs disagree is undecided."""
    path = tmp_path / "findings.db"
    with open_store(path) as db:
        put_run(db, "none", "int8", spread(0.001))
        put_run(db, "none", "int8", spread(0.009), replicate=1, chunk=32)
    rows = rows_of(plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", measurements=load_measurements(stores=[path]),
                        verdict=tolerance_rule(TAU)))
    verdict = rows[("bf16", "int8")].verdict
    assert verdict.state == UNDECIDED and not verdict.recommendable
    assert "2 replicates (between-replicate variance inside the interval" in verdict.reason
    # more documents shrink only the units' share; more replicates shrink the between-replicate one (as 1/R, df R − 1):
    # at 0.001 and 0.009 against 0.01 it takes ~21 of them (the skew-robust t at 16 units plus z(0.8) on the 0.005 gap)
    assert verdict.reason.endswith("more documents alone would not decide it: the replicates disagree; ~21 replicates would decide "
                                   "it with 80% power if it is what was measured")
    out = CliRunner().invoke(_app(), ["plan", "-m", str(model_dir), "-g", "rtx-4090", "-b", "4", "-c", "1024", "--tolerance", "0.01",
                                      "--store", str(path)], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "measured (2 replicates × 1,024 tokens, ctx 65, default)" in out.output


def test_replicates_that_agree_stay_within_and_one_without_arrays_leaves_replicate_0_alone(model_dir, tmp_path):
    path = tmp_path / "findings.db"
    with open_store(path) as db:
        put_run(db, "none", "int8", spread(0.001))
        put_run(db, "none", "int8", spread(0.0011), replicate=1, chunk=32)
        put_run(db, "none", "int4", spread(0.002))
        lost = put_run(db, "none", "int4", spread(0.004), replicate=1, chunk=32)
    with sqlite3.connect(path) as conn:  # a replicate whose arrays are gone: its summary reads, its units do not
        conn.execute("DELETE FROM arrays WHERE config_id = ?", (lost,))
    measured = {m.kv: m for m in load_measurements(stores=[path])}
    assert len(measured) == 2 and measured["int8"].kld == pytest.approx(0.00105, abs=1e-12)
    alone = measured["int4"]
    assert (alone.replicates, alone.kld) == (1, pytest.approx(0.002, abs=1e-12))
    assert alone.describe() == ("1,024 tokens, ctx 65, default; replicate 0 alone: its 1 other replicate(s) kept no per-unit "
                                "values on the same units to pool")
    rows = rows_of(plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", measurements=list(measured.values()),
                        verdict=tolerance_rule(TAU)))
    assert rows[("bf16", "int8")].verdict.state == WITHIN and "2 replicates" in rows[("bf16", "int8")].verdict.reason
    assert rows[("bf16", "int4")].verdict.state == WITHIN and "replicate 0 alone" in rows[("bf16", "int4")].quality.label


def test_a_paired_difference_pairs_replicate_r_with_r_and_pools_them():
    """What plan's speed ties decide on: b − a per unit within each replicate, pooled over the replicates."""
    from wkvlab.plan.measured import UnitValues

    def runs(*centres):
        first, *rest = (UnitValues("documents", (64,) * 16, tuple(spread(c))) for c in centres)
        return first if not rest else UnitValues(first.unit, first.tokens, first.kld, replicates=tuple(rest))

    a, b = runs(0.010, 0.012), runs(0.011, 0.017)
    diff = b.resampled("kld", minus=a)
    # per replicate: b_r − a_r = (0.001, 0.005) at unit u times (1 + 0.1 LIN[u]); ψ_u = 0.1 × mean(0.001, 0.005) × LIN[u]
    unit_var = float(((0.0003 * LIN) ** 2).sum()) / (16 * 15)
    assert diff.estimate == pytest.approx(0.003, abs=1e-12) and diff.replicates == 2
    assert diff.se == pytest.approx(np.sqrt(unit_var + 2 * 0.002 ** 2 / 2), rel=1e-9)
    assert not b.pairs_with(runs(0.011)) and not b.pairs_with(runs(0.011, 0.012, 0.013))
    with pytest.raises(ValueError, match="same units and replicates"):
        b.resampled("kld", minus=runs(0.011))
