"""A replicate's stored row says it is one: listings show " (replicate r, chunk c)" where its labels are the measurement's."""
from __future__ import annotations

from typer.testing import CliRunner

from tests.store.helpers import fake_result
from wkvlab.store import open_store
from wkvlab.sweep import SweepSpec, expand

SPEC = {"models": ["default"], "ctx": 64, "tokens": 128, "weights": ["int8"], "kv": ["q4_0"]}

def replicate_store(path, *, replicates=(0, 1)):
    """One config (int8 × q4_0) measured as replicate 0 and again as each later replicate, as ``findings --replicates`` writes it."""
    configs = {r: expand(SweepSpec.from_dict({**SPEC, "replicate": r}))[0] for r in replicates}
    with open_store(path) as db:
        for r, config in configs.items():
            assert db.put(config.config_id, config.to_dict(), fake_result(r, weights="int8", kv="q4_0"))
    return configs

def test_rows_carry_the_replicate_and_chunk_from_the_stored_config(tmp_path):
    configs = replicate_store(tmp_path / "r.db")
    with open_store(tmp_path / "r.db", create=False) as db:
        rows = db.rows()
        db.put("plain", {"score": "all"}, fake_result(7))  # a writer without SweepConfig fields: replicate 0
        plain = db.rows()[-1]
    assert [(r.config_id, r.replicate, r.chunk) for r in rows] == [(configs[0].config_id, 0, 0), (configs[1].config_id, 1, 32)]
    assert [r.replicate_label for r in rows] == ["", " (replicate 1, chunk 32)"]
    assert (plain.replicate, plain.chunk, plain.replicate_label) == (0, 0, "")
    assert rows[1].to_dict()["replicate"] == 1

def test_results_lists_a_replicate_with_the_label_its_sweep_config_has(tmp_path):
    from wkvlab.cli import app

    configs = replicate_store(tmp_path / "r.db")
    out = CliRunner().invoke(app, ["results", "--store", str(tmp_path / "r.db")], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    lines = [line for line in out.output.splitlines() if "int8" in line]
    assert len(lines) == 2
    assert "q4_0 (replicate 1, chunk 32)" in lines[1] and "replicate" not in lines[0]
    assert configs[1].label.endswith("int8 × q4_0 (replicate 1, chunk 32)")

def test_a_dry_run_of_a_replicate_sweep_names_the_replicate(tmp_path):
    from wkvlab.sweep.cli import plan_table
    from wkvlab.sweep.run import plan_sweep
    from rich.console import Console

    console = Console(width=250, record=True)
    console.print(plan_table(plan_sweep(SweepSpec.from_dict({**SPEC, "replicate": 2}), None)))
    text = console.export_text()
    assert "q4_0 (replicate 2, chunk 16)" in text
