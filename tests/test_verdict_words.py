"""Every verdict a command prints names its margin and its family (issue #38 item 7).

The commands' outputs — explain, eval, plan, the report's text, the findings tables — are rendered on
tiny random models and small records, and every line holding a verdict word (compounds, additive,
grows, better, equivalent, tie, ...) must carry the margin it was decided against (±m, a stated
margin, the user's tolerance) and its family (Holm over k) on that line, or, for a row of a table,
in the table's caption or footnote. A verdict word printed without them is a verdict made outside
the one rule (``wkvlab.stats.decision``): on main before this test, ``plan`` printed "its penalty
grows with context" and "within 2 standard errors counts as a tie" (token-level SEs), and
``explain`` decided "grows with context" from buckets of different text.
"""
from __future__ import annotations

import functools
import io
import json
import os
import re

import numpy as np
import pytest
from typer.testing import CliRunner

ENV = {**os.environ, "COLUMNS": "250"}

VERDICT = re.compile(r"\b(compounds?|compounding|sub-additive|additive|grows?|growth|shrinks?|better|worse|equivalent|ties?|tied|"
                     r"higher|lower|within|flat)\b", re.IGNORECASE)
MARGIN = re.compile(r"±|\bmargin\b|tolerance|[≤≥]")
FAMILY = re.compile(r"\bHolm\b")
# words that are not verdicts where they stand: hints, definitions, names, the absence of a verdict
NOT_A_VERDICT = re.compile("|".join((
    r"\b(?:lower|raise) (?:--|it\b|the\b|your\b)",  # a hint to the user
    r"no (?:\w+ )?verdict|not a (?:\w+ )?verdict|never decided|described,? (?:and )?not decided|undecided",
    r"tie_word_embeddings|tied to the embedding|tied output",
    r"speeds? within \d+%",  # the roofline's stated resolution, not a statistical claim (the planner's docstring)
    r"no speed tie-break",
    r"lower bounds?|upper bounds?|the lower bound|lower is better",
    r"higher is worse|larger is worse",
    r"both less memory and a lower mean KLD",  # the report's Pareto definition
    r"more bytes, lower KLD",  # the search finding's ranking by bytes alone: its direction, not a finding
    r"within one layer-format step|within the stated tolerance of the budget",  # memory accounting of the search finding
    r"not a measure of compounding|even when nothing compounds",  # the attention finding defining its energy share
    r"within the model's limit",  # the depth finding's longest prefix: a length, not a statistical claim
)), re.IGNORECASE)
# claims no margin or family can qualify: a change between position buckets that hold different text is not a
# statement about context (explain's position table, the planner's note on caches below 8 bits)
NEVER = re.compile(r"\b(?:grows|shrinks) with context\b", re.IGNORECASE)
HEADING = re.compile(r"^\s*#")  # a section title: its table and footnote follow
TABLE_ROW = re.compile(r"^\s*[│|┃]")
HEADER_RULE = re.compile(r"^\s*\|(?:\s*:?-+:?\s*\|)+\s*$")  # the line under a markdown table's header


def _items(block: str) -> list[str]:
    """The block's lines, a bullet ("• ...") and the lines the console wrapped it onto joined into one."""
    out: list[str] = []
    for line in block.splitlines():
        if out and out[-1].lstrip().startswith("•") and not re.match(r"\s*[•│|┃┏┡└╇#]", line):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


def unqualified(text: str) -> list[str]:
    """Lines holding a verdict word without a margin and a family beside it (a table row: in its table's caption or
    the footnote after it)."""
    blocks = re.split(r"\n\s*\n", text)
    bad = []
    for i, block in enumerate(blocks):
        around = "\n".join(blocks[max(0, i - 1): i + 2])  # a table's caption before it, its footnote after it
        items = _items(block)
        for k, line in enumerate(items):
            if k + 1 < len(items) and HEADER_RULE.match(items[k + 1]):
                continue  # a markdown table's header: column names ("relative growth"), not verdicts
            words = NOT_A_VERDICT.sub(" ", line)
            if NEVER.search(words):
                bad.append(line.strip())
                continue
            if not VERDICT.search(words) or HEADING.match(line):
                continue
            if MARGIN.search(line) and FAMILY.search(line):
                continue
            # a table row, or a legend that names ±m: the table's caption or footnote states the family
            if (TABLE_ROW.match(line) and MARGIN.search(around) or MARGIN.search(line)) and FAMILY.search(around):
                continue
            bad.append(line.strip())
    return bad


def test_the_check_itself():
    assert unqualified("int4: compounds: +0.01 [0.005, 0.02] adjusted (margin ±0.003; Holm over 2 tests)") == []
    assert unqualified("KV below 8 bits (long context: its penalty grows with context)") == [
        "KV below 8 bits (long context: its penalty grows with context)"]
    assert unqualified("KLD 0.00105 (lowest fitting: 0.00100; within 2 standard errors counts as a tie, broken by speed)")
    assert unqualified("| a | b | compounds |\n\nVerdicts: margin m = 10% of the predicted total; Holm over 42 tests") == []
    assert unqualified("| a | b | compounds |\n\nVerdicts: margin m = 10%") == ["| a | b | compounds |"]
    assert unqualified("| a | b | compounds |\n\nsome other table\n\nVerdicts: margin ±m; Holm over 2 tests") == ["| a | b | compounds |"]
    assert unqualified("| KV | relative growth |\n|---|---|\n| int4 | grows |\n\nsome words") == ["| int4 | grows |"]
    assert unqualified("the texts hold 10 tokens; lower --max-ctx or --context-docs") == []
    assert unqualified("a position table, not a context verdict: the buckets hold different text") == []
    assert unqualified("change grows with context: +0.01 [0.005, 0.02] adjusted (margin ±0.003; Holm over 1 test)")
    assert unqualified("• interaction compounds: +0.01 [0.005, 0.02] adjusted (raw 95% [0.006, 0.02];\nmargin ±0.003; Holm over 2 tests)") == []
    assert unqualified("• interaction compounds: +0.01 [0.005, 0.02] adjusted\n• margin ±0.003; Holm over 2 tests")


def _eval_results():
    """Four configs on 16 documents: one clearly within a 0.05 tolerance, one clearly over it."""
    from tests.findings.test_analysis import _grid

    return [r for r in _grid(interaction=0.05) if r.weights == "none" or r.kv == "fp16"]


def test_eval_output(monkeypatch):
    """What ``wkvlab eval`` prints for its results (table, position tables, --tolerance), on results of the shape it makes."""
    import wkvlab.cli as cli
    import wkvlab.display as display
    from rich.console import Console
    from wkvlab.stats.tolerance import Tolerance

    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, width=250))
    monkeypatch.setattr(display, "console", Console(file=out, width=250))
    cli.print_results(_eval_results(), Tolerance.parse("0.2"))
    text = out.getvalue()
    assert "within tolerance" in text and "exceeds it" in text  # the check saw verdicts
    assert unqualified(text) == []


def _measured(kv: str, per_unit, tmp_path):
    """An eval --json result with per-document values for the planner (Llama-3.1-8B, 16 documents of 256 tokens)."""
    from wkvlab.kv.spec import KVSpec
    from wkvlab.weights.spec import WeightSpec

    per_unit = [float(x) for x in per_unit]
    return {"model": "Meta-Llama-3.1-8B", "data": "default", "ctx": 512, "tokens": 4096, "weights": "bf16", "kv": kv,
            "kld": {"mean": sum(per_unit) / len(per_unit), "se": 1e-4}, "weights_spec": WeightSpec.parse("bf16").to_dict(),
            "kv_spec": KVSpec.parse(kv).to_dict(), "top1_agreement": 0.99}


def test_plan_output(tmp_path):
    """``wkvlab plan`` at a long context with two measured caches 5% apart (a tie under the old 2-SE rule) and the priors:
    the console and every ranking note in its JSON."""
    from wkvlab.cli import app

    docs = np.random.default_rng(0).lognormal(np.log(0.001), 0.3, 16)
    results = tmp_path / "measured.json"
    results.write_text(json.dumps([_measured("int8", docs, tmp_path), _measured("fp8_e4m3", docs * 1.05, tmp_path)]))
    plan_json = tmp_path / "plan.json"
    run = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpu", "h100", "--batch", "48", "--context", "32768",
                                   "--kv", "int8", "--kv", "fp8_e4m3", "--kv", "int4", "--weights", "bf16", "--results", str(results),
                                   "--json", str(plan_json)], env=ENV)
    assert run.exit_code == 0, run.output
    data = json.loads(plan_json.read_text())
    notes = [note for row in data["rows"] for note in row.get("ranking_notes") or ()]
    assert any("KV below 8 bits" in n for n in notes)  # the prior rows' notes were looked at
    assert unqualified(run.output) == [] and unqualified("\n\n".join(notes)) == []


def _tiny_explain(tmp_path, monkeypatch, *extra):
    import wkvlab.explain.run as explain_run
    from tests.explain.tiny_loaded import tiny_loaded
    from wkvlab.cli import app
    from wkvlab.explain.run import explain

    monkeypatch.setattr(explain_run, "explain", functools.partial(explain, loaded=tiny_loaded()))
    out = tmp_path / "explain.json"
    args = ["explain", "--weights", "int4-g32", "--kv", "int2", "--ctx", "32", "--tokens", "288", "--max-ctx", "128",
            "--context-docs", "8", "--skip", "generation,retrieval,selfgen",
            "--json", str(out), *extra]
    run = CliRunner().invoke(app, args, env=ENV)
    assert run.exit_code == 0, run.output
    return run.output, json.loads(out.read_text())


def test_explain_output(tmp_path, monkeypatch):
    """``wkvlab explain`` on a tiny random model: factorial, noise floor, cross terms, hidden states, position table,
    mitigations, verdict (main printed "hidden-state relative error grows from ..." here)."""
    text, data = _tiny_explain(tmp_path, monkeypatch)
    assert "KLD by query position" in text and "mitigations" in text and "hidden-state relative error" in text
    assert unqualified(text) == []
    assert unqualified("\n\n".join(data["verdict"])) == []


def test_explain_position_table_where_the_excess_rises():
    """explain's position table and its verdict line on cells whose cache excess rises with position on every window
    (the buckets hold different text, so no verdict; on main this printed "grows with context")."""
    from rich.console import Console

    from tests.explain.test_context import _cells
    from wkvlab.explain.cli import context_table
    from wkvlab.explain.context import context_curve

    curve = context_curve(_cells())
    out = io.StringIO()
    Console(file=out, width=250).print(context_table(curve))
    text = out.getvalue() + "\n\n" + "\n".join(curve.lines())
    assert "cache excess" in text
    assert unqualified(text) == []


def test_engine_compare_output():
    """``wkvlab engine compare``'s table: each simulated/engine ratio decided against the recorded fidelity band by the one
    rule (it coloured the point ratio green inside 0.75–1.25 before, a verdict with no interval, margin or family)."""
    from rich.console import Console

    from wkvlab.engines.cli import fidelity_table
    from wkvlab.engines.compare import FidelityReport, FidelityRow

    rng = np.random.default_rng(2)
    engine = rng.lognormal(np.log(0.05), 0.3, 16)

    def row(kv, factor):
        sim = engine * factor * (1 + rng.normal(0, 0.01, 16))
        return FidelityRow(kv, f"llamacpp:{kv}", kv, {"mean": float(engine.mean()), "se": 0.001}, {"mean": float(sim.mean()), "se": 0.001},
                           0.9, 0.9, list(engine), list(sim), [255] * 16)

    report = FidelityReport("tiny", "tiny.gguf", "default", 256, 4080, True, "float", {"mean": 1e-5, "se": 1e-6},
                            [row("q8_0", 1.0), row("q4_0", 1.5)], 1.0)
    out = io.StringIO()
    Console(file=out, width=250).print(fidelity_table(report))
    text = out.getvalue()
    assert "equivalent within ±0.15" in text and "higher (the simulation's KLD above the engine's)" in text
    assert "Holm over 2 tests" in text and "the fidelity band of fidelity_checks.json" in text
    assert unqualified(text) == []


def test_report_text():
    """The report's markdown (results, cross terms, findings sections) on a demo-like grid and small findings records."""
    from tests.report.helpers import demo_like_grid
    from tests.report.test_findings_section import _findings
    from wkvlab.report.build import render_report
    from wkvlab.report.data import build_report_data

    files = render_report(build_report_data(demo_like_grid(), source="synthetic"), findings=_findings())
    text = "\n\n".join(v.decode() if isinstance(v, bytes) else v for k, v in files.items() if k.endswith(".md"))
    assert VERDICT.search(text.split("## Additive or compounding")[1])  # the cross terms' verdicts were looked at
    assert unqualified(text) == []


def _findings_records():
    """Small records of every finding the render module draws, made by the analyses themselves on a synthetic grid."""
    from tests.findings.test_analysis import _grid
    from wkvlab.findings.analysis import additivity, method_differences, penalties

    grid = _grid(interaction=0.05)
    return additivity(grid), penalties(grid), method_differences(grid)


def test_findings_render_on_small_records():
    from wkvlab.findings import render

    add, pen, meth = _findings_records()
    text = "\n\n".join((render.additivity_markdown(add), render.penalty_markdown(pen), render.method_differences_markdown(meth)))
    assert "compounds" in text or "additive" in text
    assert unqualified(text) == []



def _records():
    from pathlib import Path

    runs = Path(__file__).parent.parent / "docs" / "runs"
    for path in sorted(runs.glob("findings-*.json")) + sorted(runs.glob("output-explain-*.json")):
        yield pytest.param(path, id=path.name)


def _shown(path) -> str:
    """A record's block as its doc shows it (tests/test_doc_tables.py holds the block to the record's rendering: for a
    finding whose record keeps per-unit values, decided again by today's rule, not the markdown the run printed)."""
    from tests.test_doc_tables import _load

    tables = _load()
    assert path.stem in tables.TABLES, f"{path.name} is not shown in any doc"
    return tables.documented(tables.TABLES[path.stem])


@pytest.mark.parametrize("path", list(_records()))
def test_the_committed_records_as_the_docs_show_them(path):
    """Every committed findings record and explain output record as docs/findings.md and docs/explain.md show it."""
    text = _shown(path)
    assert text
    assert unqualified(text) == []


@pytest.mark.parametrize("record, draw", [("findings-depth-default.json", "identical_depth_markdown"),
                                          ("findings-search-default.json", "search_markdown")])
def test_findings_render_of_the_depth_and_search_records(record, draw):
    """The committed depth and search records as docs/findings.md renders them (issue #38 items 8 and 9 rewrite both)."""
    from pathlib import Path

    from wkvlab.findings import render

    data = json.loads((Path(__file__).parent.parent / "docs" / "runs" / record).read_text())
    text = getattr(render, draw)(data["data"])
    assert text
    assert unqualified(text) == []


def _wkvlab(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "wkvlab.cli", *args], capture_output=True, text=True, timeout=900, env=ENV)


@pytest.mark.slow
def test_the_packaged_model_eval_and_explain(tmp_path):
    """The commands as a user runs them on the packaged default model (minutes on 2 cores): eval with a tolerance, and
    explain's factorial (its other steps are covered on the tiny model above)."""
    ev = _wkvlab("eval", "--ctx", "64", "--tokens", "1024", "--kv", "int4", "--kv", "q8_0", "--tolerance", "0.01", "--threads", "1")
    assert ev.returncode == 0, ev.stderr
    assert "against your tolerance" in ev.stdout and unqualified(ev.stdout) == []
    ex = _wkvlab("explain", "--weights", "int4-g128", "--kv", "int4", "--ctx", "64", "--tokens", "1024", "--threads", "1",
                 "--skip", "noise,attention,hidden,context,mitigations,generation,retrieval,selfgen")
    assert ex.returncode == 0, ex.stderr
    assert "2×2 factorial" in ex.stdout and unqualified(ex.stdout) == []
