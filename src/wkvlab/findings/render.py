"""Findings as Markdown: the tables docs/findings.md shows, printed by ``wkvlab findings``."""
from __future__ import annotations

from dataclasses import replace

from wkvlab.findings.analysis import AdditivityRow, CalibrationRow, MethodDifference, PenaltyRow
from wkvlab.stats import Interval


def _iv(interval: Interval | None, spec: str = ".4f") -> str:
    return "—" if interval is None else format(interval, spec)


def percent(interval: Interval) -> Interval:
    """A share's interval in percent (the same interval, scaled; missing bounds stay missing)."""
    return replace(interval, estimate=100 * interval.estimate, low=100 * interval.low, high=100 * interval.high)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _rule_note(verdicts) -> str:
    """The footnote every verdict table carries: the rule, the margin, the family and its adjustment."""
    verdicts = [v for v in verdicts if v is not None]
    if not verdicts:
        return ""
    v = verdicts[0]
    return (f"\n\nVerdicts: the one decision rule (docs/explain.md, 'The decision rule'): margin m = {100 * v.margin.relative:g}% of "
            f"{v.margin.of.split(' of ')[0]}; {v.adjustment}; an interval beyond ±m compounds (or is higher/lower), one inside ±m is "
            "additive (or equivalent) within ±m, anything else is undecided with the tokens that would decide it. Raw intervals are "
            "95% studentized paired bootstrap over windows; adjusted ones are the same bootstrap at Holm's level.")


def _decision(v) -> str:
    need = v.need()
    return v.word + (f" ({need})" if need else "")


def additivity_markdown(rows: list[AdditivityRow]) -> str:
    header = ["weights", "KV", "KLD(W)", "KLD(C)", "KLD(W+C)", "interaction [raw 95%]", "Holm-adjusted", "% of KLD(C)", "% of sum",
              "margin m", "verdict"]
    body = []
    for r in rows:
        body.append([r.weights, r.kv, f"{r.w.estimate:.5f}", f"{r.c.estimate:.5f}", f"{r.wc.estimate:.5f}", _iv(r.interaction, "+.5f"),
                     _iv(r.verdict.adjusted, "+.5f"), f"{100 * r.share_of_cache:+.1f}%", f"{100 * r.share:+.1f}%",
                     f"±{r.verdict.margin.value:.2g}", _decision(r.verdict)])
    return _table(header, body) + _rule_note(r.verdict for r in rows)


def penalty_markdown(rows: list[PenaltyRow]) -> str:
    weights = list(dict.fromkeys(r.weights for r in rows))
    kvs = list(dict.fromkeys(r.kv for r in rows))
    cell = {(r.weights, r.kv): r for r in rows}
    marks = {"above": " ↑", "below": " ↓", "within": " ≈", "undecided": " ?"}
    body = []
    for kv in kvs:
        line = [kv]
        for w in weights:
            r = cell.get((w, kv))
            line.append("—" if r is None else format(r.penalty, ".4f") + ("" if r.verdict is None else marks[r.verdict.outcome]))
        body.append(line)
    note = ("\n\nEach cell: KLD(W × C) − KLD(W × fp16) with its 95% interval (windows resampled). Against the penalty under "
            "unquantized weights (the additivity interaction): ↑ larger beyond ±m, ↓ smaller beyond ±m, ≈ the same within ±m, "
            "? undecided.")
    return _table(["KV \\ weights", *weights], body) + note + _rule_note(r.verdict for r in rows)


def method_differences_markdown(rows: list[MethodDifference]) -> str:
    """The decided weight-method differences (every pair tested; the undecided ones counted)."""
    decided = [r for r in rows if r.verdict.decided]
    body = [[r.kv, f"{r.a} − {r.b}", _iv(r.difference, "+.5f"), _iv(r.verdict.adjusted, "+.5f"), f"±{r.verdict.margin.value:.2g}",
             r.verdict.word] for r in decided]
    head = (f"**Differences between weight methods**: the KV penalty under method a minus under method b, every pair of "
            f"quantized methods for every cache ({len(rows)} tests, {len(decided)} decided; the rest undecided).\n\n")
    return head + _table(["KV", "a − b", "difference [raw 95%]", "Holm-adjusted", "margin m", "verdict"], body) + \
        _rule_note(r.verdict for r in rows)


def attention_markdown(rows) -> str:
    """Where the cross term sits: term shares, the cross term's weight and cache parts, the 2×2 interaction, sinks, layers."""
    header = ["weights", "KV", "KV term Q·ε_kᵀ", "weight term ε_q·Kᵀ", "cross term ε_q·ε_kᵀ [95%]", "its weight part ε_q·ε_k,wᵀ [95%]",
              "its cache part ε_q·ε_k,cᵀ [95%]", "2×2 interaction / score error [95%]", "cross term on sinks / elsewhere (RMS) [95%]",
              "layers holding most of the cross term", "attention KL"]
    body = []
    for r in rows:
        layers = ", ".join(f"L{l} {100 * m:.0f}%" for l, m in r.top_layers)
        part = lambda key: format(percent(r.shares[key]), ".1f") + " %" if key in r.shares else "—"  # noqa: E731
        body.append([r.weights, r.kv, f"{100 * r.shares['kv'].estimate:.1f}%", f"{100 * r.shares['weight'].estimate:.1f}%",
                     part("cross"), part("cross_weight"), part("cross_cache"), part("interaction"), format(r.cross_sink_ratio, ".2f"),
                     layers, f"{r.attention_kl:.2e}"])
    windows = rows[0].windows if rows else 0
    sinks = rows[0].sink_tokens if rows else 0
    return _table(header, body) + (
        "\n\nShares of the summed energy of the three score-error terms over every layer, head and causal (query, key) pair; "
        "the cross term's weight part uses the candidate's key before the cache (K_W − K), its cache part the cache's own error "
        "(K_stored − K_W): the parts' energies need not add to the cross term's. The 2×2 interaction is the layer-local "
        "S_WC − S_W − S_C + S_R over the score error's energy. KV fp16 rows: the (W, 16-bit cache) cell, where the cross term is "
        f"all weight part. 95% intervals over {windows} windows resampled. Sinks: the first {sinks} keys; 1.00 means the cross "
        "term is no larger on them than elsewhere. Layers: share of the network's cross-term energy.")


def calibration_markdown(rows: list[CalibrationRow]) -> str:
    calibs = list(dict.fromkeys(c for r in rows for c in r.kld))
    header = ["method", "evaluated on", *[f"calibrated on {c}" for c in calibs], "mismatch cost [raw 95%] → verdict"]
    body = []
    for r in rows:
        verdicts = r.verdicts or {}
        costs = "; ".join(f"{c}: {format(iv, '+.4f')} → " + (_decision(verdicts[c]) if c in verdicts else "no verdict")
                          for c, iv in r.mismatch.items())
        body.append([r.weights, r.data, *[format(r.kld[c], ".4f") if c in r.kld else "—" for c in calibs], costs or "—"])
    return _table(header, body) + ("\n\nMismatch cost: KLD with that calibration text minus KLD with the evaluation's own domain "
                                   "(prose for prose, code for code), paired by window."
                                   + _rule_note(v for r in rows for v in (r.verdicts or {}).values()))


def identical_depth_markdown(data: dict) -> str:
    """The depth finding on identical tokens (:meth:`wkvlab.findings.depth.DepthFinding.to_dict`)."""
    from wkvlab.stats.decision import Verdict

    body = []
    verdicts = []
    for r in data["rows"]:
        v = Verdict.from_dict(r["decision"]) if r.get("decision") else None
        verdicts.append(v)
        growth = Interval.from_dict(r["growth"]) if r["growth"] else None
        relative = Interval.from_dict(r["relative"]) if r["relative"] else None
        body.append([r["kv"], f"{r['length']:,}", f"{r['tokens']:,}", format(Interval.from_dict(r["penalty"]), ".5f"),
                     "—" if growth is None else format(growth, "+.5f"), "—" if relative is None else format(percent(relative), "+.1f") + " %",
                     "—" if v is None else _decision(v)])
    table = _table(["KV", "prefix tokens", "scored tokens", "penalty (KLD) [95%]", "minus the shortest prefix [raw 95%]",
                    "relative growth [95%]", "verdict"], body)
    return (f"{data['model']}, unquantized weights: the same {data['target']} target tokens of each of {data['documents']} documents "
            f"({data['data']}) scored after prefixes of {', '.join(f'{n:,}' for n in data['lengths'])} tokens; documents resampled "
            f"(paired across lengths); {data['seconds']:,.0f} s.\n\n" + table + _rule_note(verdicts))


def search_markdown(data: dict) -> str:
    """The search finding (:meth:`wkvlab.findings.search.SearchFinding.to_dict`): plans, rank correlations, layer agreement."""
    from wkvlab.findings.search import search_rows_from_dict

    body = []
    rows = search_rows_from_dict(data)
    for r in rows:
        said = lambda key: f" → {_decision(r.verdicts[key])}" if key in r.verdicts else ""  # noqa: E731
        body.append([r.profile_text, f"{r.budget:,.0f} ({100 * r.share:.0f}%)", r.heldout_text, f"{r.aware:.5f}", f"{r.unaware:.5f}",
                     _iv(r.aware_minus_unaware, "+.5f") + said("unaware"), f"{r.uniform_name} {r.uniform:.5f}",
                     _iv(r.aware_minus_uniform, "+.5f") + said("uniform")])
    table = _table(["profiled on", "budget B/token (of 16-bit)", "held-out text", "aware plan KLD", "unaware plan KLD",
                    "aware − unaware [raw 95%] → verdict", "best fitting uniform", "aware − uniform [raw 95%] → verdict"], body)
    table += _rule_note(v for r in rows for v in r.verdicts.values())
    rho = _table(["profile text → held-out text", "Spearman (predicted vs held-out KLD)"],
                 [[k, f"{v:.3f}"] for k, v in data["rank_correlation"].items()])
    agree = _table(["per-layer delta", "Spearman between the two profile texts"],
                   [[k, f"{v:.3f}"] for k, v in data["layer_agreement"].items()])
    return (table + "\n\nDifferences are paired by held-out window (the same windows for every plan), 95% bootstrap intervals; "
            "'aware' allocates from a profile measured under the quantized weights, 'unaware' from one measured with 16-bit "
            "weights (KVTuner-style), both evaluated under the quantized weights. The best fitting uniform is any uniform format at or "
            "under the budget, so it may use less memory than the plan: not a comparison at equal memory.\n\n" + rho + "\n\n" + agree)


def engine_markdown(data: dict) -> str:
    """The engine finding (:class:`wkvlab.engines.compare.FidelityReport` as a dict): llama.cpp's KLD next to the preset's."""
    body = []
    for r in data["rows"]:
        windows = [x for x in r["window_ratios"] if x == x]
        spread = f"{min(windows):.2f}–{max(windows):.2f}" if windows else "—"
        body.append([r["kv"], r["preset"], f"{r['engine_kld']['mean']:.6f} ± {r['engine_kld']['se']:.6f}",
                     f"{r['sim_kld']['mean']:.6f} ± {r['sim_kld']['se']:.6f}", f"**{r['ratio']:.2f}**", spread,
                     f"{100 * r['engine_top1']:.1f}% / {100 * r['sim_top1']:.1f}%"])
    floor = data["noise_floor"]
    return (_table(["llama.cpp cache", "preset", "llama.cpp KLD (vs its f16)", "wkvlab KLD (engine baseline)", "ratio",
                    "per-window ratios", "top-1 engine / wkvlab"], body)
            + f"\n\n{data['model']}, {data['tokens']:,} scored tokens in windows of {data['ctx']:,} ({data['data']}); noise floor "
              f"(transformers vs llama.cpp f16 cache) {floor['mean']:.6f} ± {floor['se']:.6f}; {data['seconds']:,.0f} s.")
