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


def _rule_note(verdicts, unit: str = "windows", margin_of: str | None = None) -> str:
    """The footnote every verdict table carries: the rule, the margin, the family and its adjustment.

    ``margin_of``: what m is a share of, where it differs between rows (the first verdict's words would name only its own)."""
    verdicts = [v for v in verdicts if v is not None]
    if not verdicts:
        return ""
    v = verdicts[0]
    margin = (f"±{v.margin.value:.3g} ({v.margin.of})" if v.margin.stated
              else f"{100 * v.margin.relative:g}% of {margin_of or v.margin.of.split(' of ')[0] if not v.margin.of.startswith('the predicted') else v.margin.of}")
    if v.raw.method:  # decided under issue #38's rule: say its interval and power
        method = (f"Raw intervals are 95% {v.raw.method}, over {unit}; adjusted ones are the same interval at Holm's level; the tokens "
                  "that would decide an undecided one are for 80% power at its estimate (docs/stats.md).")
    else:  # a record stored before issue #38: what it was decided with
        method = f"Raw intervals are 95% studentized paired bootstrap over {unit}; adjusted ones are the same bootstrap at Holm's level."
    return (f"\n\nVerdicts: the one decision rule (docs/explain.md, 'The decision rule'): margin m = {margin}; {v.adjustment}; an interval "
            "beyond ±m compounds (or is higher/lower), one inside ±m is additive (or equivalent) within ±m, anything else is undecided "
            f"with the tokens that would decide it. {method}")


def replicates_note(intervals) -> str:
    """How many replicates every interval of a table pools (issue #38: run-to-run variance inside it, or not).
    Intervals stored before replicates existed (0) were one measurement each."""
    counts = sorted({max(1, iv.replicates) for iv in intervals if iv is not None})
    if not counts:
        return ""
    if counts == [1]:
        return ("\n\nReplicates: 1 replicate: run-to-run variance not included in any interval of this table "
                "(`--replicates 2` or more measures it).")
    return (f"\n\nReplicates: {' or '.join(map(str, counts))} replicates pooled into every interval of this table (each replicate "
            "the whole grid measured again on the same windows, with another disjoint calibration sample for calibrated configs "
            "and chunks of half the size, another float order): between-window plus between-replicate variance, "
            "Welch–Satterthwaite df (docs/stats.md).")


def _decision(v) -> str:
    need = v.need()
    return v.word + (f" ({need})" if need else "")


def additivity_markdown(rows: list[AdditivityRow]) -> str:
    header = ["weights", "KV", "KLD(W)", "KLD(C)", "KLD(W+C)", "interaction [raw 95%]", "Holm-adjusted", "% of KLD(C)", "% of sum",
              "margin m", "verdict"]
    body = []
    for r in rows:
        body.append([r.weights, r.kv, f"{r.w.estimate:.5f}", f"{r.c.estimate:.5f}", f"{r.wc.estimate:.5f}",
                     _iv(r.interaction, "+.5f") + _by_replicate(r.interaction, "+.5f"),
                     _iv(r.verdict.adjusted, "+.5f"), f"{100 * r.share_of_cache:+.1f}%", f"{100 * r.share:+.1f}%",
                     f"±{r.verdict.margin.value:.2g}", _decision(r.verdict)])
    return (_table(header, body) + _braces_note((r.interaction for r in rows), "interaction") + _rule_note(r.verdict for r in rows)
            + replicates_note(iv for r in rows for iv in (r.w, r.c, r.wc, r.interaction)))


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
    note = ("\n\nEach cell: KLD(W × C) − KLD(W × fp16) with its 95% interval over windows. Against the penalty under "
            "unquantized weights (the additivity interaction): ↑ larger beyond ±m, ↓ smaller beyond ±m, ≈ the same within ±m, "
            "? undecided.")
    return (_table(["KV \\ weights", *weights], body) + note + _rule_note(r.verdict for r in rows)
            + replicates_note(iv for r in rows for iv in (r.penalty, r.vs_unquantized)))


def method_differences_markdown(rows: list[MethodDifference]) -> str:
    """The decided weight-method differences (every pair tested; the undecided ones counted)."""
    decided = [r for r in rows if r.verdict.decided]
    body = [[r.kv, f"{r.a} − {r.b}", _iv(r.difference, "+.5f") + _by_replicate(r.difference, "+.5f"), _iv(r.verdict.adjusted, "+.5f"),
             f"±{r.verdict.margin.value:.2g}", r.verdict.word] for r in decided]
    head = (f"**Differences between weight methods**: the KV penalty under method a minus under method b, every pair of "
            f"quantized methods for every cache ({len(rows)} tests, {len(decided)} decided; the rest undecided).\n\n")
    return (head + _table(["KV", "a − b", "difference [raw 95%]", "Holm-adjusted", "margin m", "verdict"], body)
            + _braces_note((r.difference for r in decided), "difference") + _rule_note(r.verdict for r in rows)
            + replicates_note(r.difference for r in rows))


# The attention finding measures each pair once (findings.grids.REPLICATED leaves it out: its passes are whole windows, so
# no chunk size varies the float order, and only GPTQ's and AWQ's builds have a calibration sample to vary); its tables
# say so where the other findings' say how many replicates they pool (issue #38 item 3).
ATTENTION_REPLICATES = ("\n\nReplicates: 1 replicate: run-to-run variance not included in any interval of this finding (the "
                        "attention finding measures each pair once; the additivity finding's output interactions, with "
                        "replicates, are the ones to plan on).")


def attention_markdown(rows) -> str:
    """Where the cross term sits (term shares, its weight and cache parts, the attention-level 2×2, layers), then what the
    interventions on the (W, C) run decide: ε_q·ε_k,cᵀ removed from the scores, the sinks kept at 16 bits."""
    header = ["weights", "KV", "KV term Q·ε_kᵀ", "weight term ε_q·Kᵀ", "cross term ε_q·ε_kᵀ [95%]", "its weight part ε_q·ε_k,wᵀ [95%]",
              "its cache part ε_q·ε_k,cᵀ [95%]", "2×2 interaction / score error [95%]", "layers holding most of the cross term", "attention KL"]
    body = []
    for r in rows:
        layers = ", ".join(f"L{l} {100 * m:.0f}%" for l, m in r.top_layers)
        part = lambda key: format(percent(r.shares[key]), ".1f") + " %" if key in r.shares else "—"  # noqa: E731
        body.append([r.weights, r.kv, f"{100 * r.shares['kv'].estimate:.1f}%", f"{100 * r.shares['weight'].estimate:.1f}%",
                     part("cross"), part("cross_weight"), part("cross_cache"), part("interaction"), layers, f"{r.attention_kl:.2e}"])
    windows = rows[0].windows if rows else 0
    text = _table(header, body) + (
        "\n\nShares of the summed energy of the three score-error terms over every layer, head and causal (query, key) pair. "
        "Four whole passes per window: R, W (quantized weights, 16-bit cache), C (unquantized weights, quantized cache), W+C; the "
        "cross term's weight part uses the (W, fp16) pass's key (ε_k,w = K_W − K), its cache part the rest (ε_k,c = K_stored − K_W): "
        "the parts' energies need not add to the cross term's. The 2×2 interaction is S_WC − S_W − S_C + S_R over the score "
        "error's energy; it is not a measure of compounding: the cache's rounding error on W+C's keys is a fresh draw, "
        "uncorrelated with its error on the reference's, so this energy is about twice the cache term's even when nothing "
        "compounds (and can exceed 100%) — the output and attention-KL interactions below are the ones decided. "
        "KV fp16 rows: the (W, fp16) cell, where the cross term is all weight part and the interaction 0. "
        f"95% intervals over {windows} windows resampled. Layers: share of the network's cross-term energy.")
    crossed = [r.cross for r in rows if getattr(r, "cross", None) is not None]
    if not crossed:
        return text + ATTENTION_REPLICATES
    header = ["weights", "KV", "KLD(W)", "KLD(C)", "KLD(W+C)", "output interaction → verdict", "ε_q·ε_k,cᵀ removed: KLD(W+C)′",
              "change → verdict", "share of the interaction it carries [95%]", "what remains → verdict",
              "attention-KL interaction → verdict", "sinks at 16 bits: KLD", "change → verdict"]
    body = []
    for x in crossed:
        v, k = x.verdicts, x.kld
        body.append([x.weights, x.kv, f"{k['w'].estimate:.5f}", f"{k['c'].estimate:.5f}", f"{k['wc'].estimate:.5f}",
                     f"{x.effects['interaction']:+.5f} → {_decision(v['interaction'])}", f"{k['wc_removed'].estimate:.5f}",
                     f"{x.effects['removed']:+.5f} → {_decision(v['removed'])}", x.explained_text(),
                     f"{x.effects['interaction_removed']:+.5f} → {_decision(v['interaction_removed'])}",
                     f"{x.effects['attention_interaction']:+.2e} → {_decision(v['attention_interaction'])}",
                     f"{k['wc_sinks'].estimate:.5f}", f"{x.effects['sinks']:+.5f} → {_decision(v['sinks'])}"])
    first = crossed[0].verdicts["interaction"]
    return text + "\n\n" + _table(header, body) + (
        "\n\nInterventions on the (W, C) run, same windows, output KLD against the reference over every position but the last: "
        "ε_q·ε_k,cᵀ (ε_q = Q − Q_R, ε_k,c = K_stored − K_W, from the recorded R and (W, fp16) passes) subtracted from every "
        "layer's attention scores; the first 4 tokens kept at 16 bits in the cache (+sinks=4), paired against the plain run. "
        "'change': the intervened KLD(W+C) minus the plain one (lower: the term, or the sinks' quantization, raised it); 'share "
        "it carries': (I − I′) / I, I the output interaction, I′ the same with the term removed (shown only where I's interval "
        "excludes 0: a ratio to a near-zero I says nothing); 'attention-KL interaction': "
        "KL(W+C) − KL(W) − KL(C) of the attention rows, margin "
        + (f"{first.margin.format()} for the output KLD and the same rule on the attention KLs. Intervals: 95% {first.raw.method} "
           if first.raw.method else "10% of the C cell's attention KL. Intervals: 95% studentized paired bootstrap ")
        + f"over windows; verdicts by the one rule at the Holm-adjusted level, {first.adjustment}."
        + _rule_note(v for x in crossed for v in x.verdicts.values()) + ATTENTION_REPLICATES)


def _by_replicate(iv: Interval | None, spec: str) -> str:
    """`` {replicates +0.0560, +0.0654}``: each replicate's own estimate, where several were pooled — with few
    replicates their spread can set the interval's width (its df), and the reader sees which."""
    if iv is None or len(iv.replicate_estimates) < 2:
        return ""
    return " {replicates " + ", ".join(format(x, spec) for x in iv.replicate_estimates) + "}"


def _any_braces(intervals) -> bool:
    """Whether any of these intervals prints its replicates' estimates (:func:`_by_replicate` decides)."""
    return any(_by_replicate(iv, ".1f") for iv in intervals)


def _braces_note(intervals, what: str) -> str:
    """The line that reads the braces, only where a row of the table prints them."""
    return f"\n\n{{replicates …}}: each replicate's own {what}." if _any_braces(intervals) else ""


def calibration_markdown(rows: list[CalibrationRow]) -> str:
    calibs = list(dict.fromkeys(c for r in rows for c in r.kld))
    header = ["method", "evaluated on", *[f"calibrated on {c}" for c in calibs], "mismatch cost [raw 95%] (Holm-adjusted; m) → verdict"]
    body = []

    def cost(c, iv, v) -> str:
        if v is None:
            return f"{c}: {format(iv, '+.4f')}{_by_replicate(iv, '+.4f')} → no verdict"
        return f"{c}: {format(iv, '+.4f')}{_by_replicate(iv, '+.4f')} ({_iv(v.adjusted, '+.4f')}; ±{v.margin.value:.2g}) → {_decision(v)}"

    for r in rows:
        verdicts = r.verdicts or {}
        costs = "; ".join(cost(c, iv, verdicts.get(c)) for c, iv in r.mismatch.items())
        body.append([r.weights, r.data, *[format(r.kld[c], ".4f") + _by_replicate(r.kld[c], ".4f") if c in r.kld else "—" for c in calibs],
                     costs or "—"])
    braces = _any_braces(iv for r in rows for iv in (*r.kld.values(), *r.mismatch.values()))
    return _table(header, body) + ("\n\nMismatch cost: KLD with that calibration text minus KLD with the evaluation's own domain "
                                   "(prose for prose, code for code), paired by window"
                                   + ("; {replicates …}: each replicate's own KLD or cost." if braces else ".")
                                   + _rule_note((v for r in rows for v in (r.verdicts or {}).values()),
                                                margin_of="the KLD calibrated on the evaluated text's own domain")
                                   + replicates_note(iv for r in rows for iv in (*r.kld.values(), *r.mismatch.values())))


def identical_depth_markdown(data: dict) -> str:
    """The depth finding on identical tokens (:meth:`wkvlab.findings.depth.DepthFinding.to_dict`): penalty, growth and the
    sharpening-adjusted growth per cache and prefix, the reference's NLL (the control), verdicts at the longest prefix."""
    from wkvlab.stats.decision import Verdict

    def iv(r, key, spec):
        return format(Interval.from_dict(r[key]), spec) if r.get(key) else "—"

    def rel(r, key):
        return format(percent(Interval.from_dict(r[key])), "+.1f") + " %" if r.get(key) else "—"

    body, verdicts = [], []
    for r in data["rows"]:
        raw = Verdict.from_dict(r["decision"]) if r.get("decision") else None
        adj = Verdict.from_dict(r["adjusted_decision"]) if r.get("adjusted_decision") else None
        verdicts += [v for v in (raw, adj) if v is not None]
        words = "—" if raw is None else f"raw: {_decision(raw)}" + (f"; adjusted: {_decision(adj)}" if adj else "")
        body.append([r["kv"], f"{r['length']:,}", f"{r['tokens']:,}", iv(r, "penalty", ".5f"), iv(r, "growth", "+.5f"), rel(r, "relative"),
                     iv(r, "adjusted", "+.5f"), iv(r, "reference", ".4f"), rel(r, "sharpening"), words])
    table = _table(["KV", "prefix tokens", "scored tokens", "penalty (KLD) [95%]", "minus the shortest prefix [raw 95%]",
                    "relative growth [95%]", "adjusted for the reference's sharpening [95%]", "reference NLL [95%]",
                    "reference NLL change [95%]", "verdict (longest prefix)"], body)
    reach = data.get("reach") or {}
    # by length: a record written with sorted keys holds them as text ("16384" before "2048")
    reached = ", ".join(f"{int(k):,}: {v}" for k, v in sorted(reach.items(), key=lambda kv: int(kv[0])))
    minimum = data.get("minimum_documents")
    design = (f" The longest prefix is the longest that at least {minimum} documents reach with their targets within the model's "
              f"limit, and the first {minimum} of those that reach it are used (documents holding each prefix plus the targets: {reached})."
              if minimum else "")
    return (f"{data['model']}, unquantized weights: the same {data['target']} target tokens of each of {data['documents']} documents "
            f"({data['data']}) scored after prefixes of {', '.join(f'{n:,}' for n in data['lengths'])} tokens; documents resampled "
            f"(paired across lengths); {data['seconds']:,.0f} s.{design}\n\n" + table
            + ("\n\nDecided: at the longest prefix only (the pre-declared contrast; intermediate lengths are described by their "
               "intervals), the growth and the growth adjusted for the reference's sharpening, KLD(L) · NLL_ref(S) / NLL_ref(L) − "
               "KLD(S), every cache in one family; the reference NLL column is the control: a longer prefix that lowers it sharpens "
               "the reference, which can lower the KLD without any change in the cache's damage. The margin is a share of the "
               "penalty at the shortest prefix, estimated on the same documents (its uncertainty is inside the test)."
               if verdicts and any(r.get("adjusted_decision") for r in data["rows"]) else "")
            # the rule's note right after "Decided:" (its margin and family qualify that paragraph), the text's limit after both
            + _rule_note(verdicts, "documents") + _beyond_the_text(data, verdicts))


def _beyond_the_text(data: dict, verdicts) -> str:
    """The sample-size advice checked against the text: how many of its documents hold the longest prefix and the
    targets (a record that counted them), and whether an undecided verdict asks for more than that."""
    longest = data["lengths"][-1]
    reach = data.get("reach") or {}
    held = reach.get(str(longest), reach.get(longest))  # text keys from a record, numbers from a run
    undecided = [v for v in verdicts if not v.decided]
    beyond = [v for v in undecided if v.units_needed and v.units_needed > (held or 0)]
    if held is None or not beyond:
        return ""
    which = "every undecided verdict asks" if len(beyond) == len(undecided) else f"{len(beyond)} of the {len(undecided)} undecided verdicts ask"
    return (f"\n\nThe text ({data['data']}) has {held} documents that hold the longest prefix ({longest:,} tokens) and the "
            f"{data['target']:,} targets, and {which} for more: on this text no run decides {'it' if len(beyond) == 1 else 'them'}.")


def search_markdown(data: dict) -> str:
    """The search finding (:meth:`wkvlab.findings.search.SearchFinding.to_dict`): every plan against its rivals at equal memory,
    the Pareto curve, rank correlations, layer agreement. A finding stored before equal-memory rivals renders labelled."""
    from wkvlab.findings.search import RIVALS, is_unequal_memory, search_rows_from_dict

    if is_unequal_memory(data):
        return _search_unequal_memory(data)
    rows = search_rows_from_dict(data)
    body = []
    for r in rows:
        cells = []
        for rival in RIVALS:
            if rival not in r.differences:
                cells.append("no uniform at this budget" if rival == "uniform" else "—")
                continue
            v = r.verdicts.get(rival)
            name = f"{r.uniform_name} " if rival == "uniform" else ""
            if rival in r.identical:
                cells.append(f"{name}{getattr(r, rival):.5f}; the same plans as aware in every replicate: no test")
                continue
            cells.append(f"{name}{getattr(r, rival):.5f}; {_iv(r.differences[rival], '+.5f')}"
                         + (f"; Holm {_iv(v.adjusted, '+.5f')} → {_decision(v)} (m ±{v.margin.value:.3g})" if v is not None else ""))
        spent = ", ".join(f"{k} {lo:,.0f}" + (f"–{hi:,.0f}" if hi != lo else "") for k, (lo, hi) in r.bytes.items())
        body.append([r.profile_text, f"{r.budget:,.0f} ({100 * r.share:.0f}%)", r.heldout_text, f"{r.aware:.5f}", *cells, spent])
    table = _table(["profiled on", "budget B/token (of 16-bit)", "held-out text", "aware plans KLD",
                    *(f"{k} KLD; aware − {k} [raw 95%]; Holm-adjusted → verdict" for k in RIVALS), "bytes/token spent"], body)
    by_document = data.get("version", 2) >= 3
    unit = "replicated profiles × held-out documents (two-stage)" if by_document else "replicated profiles × held-out windows (two-stage)"
    table += _rule_note((v for r in rows for v in r.verdicts.values()), unit=unit, margin_of="the rival's own KLD in that row")
    table += "\n\n" + search_counts(rows) if by_document else ""
    replicates = rows[0].replicates if rows else 0
    curves = []
    for key, points in (data.get("curve") or {}).items():
        front = [p["name"] for p in points if p["front"]]
        curves.append([key, ", ".join(front)])
    if by_document:
        plans, by_bytes = data.get("distinct_plans") or {}, data.get("bytes_rank_correlation") or {}
        rho = _table(["profile text → held-out text", "distinct plans", "Spearman: predicted vs held-out KLD (replicate 0)",
                      "Spearman: bytes alone vs held-out KLD"],
                     [[k, f"{plans.get(k, 0):,}", f"{v:.3f}", f"{by_bytes.get(k, float('nan')):.3f}"] for k, v in data["rank_correlation"].items()])
        rho += ("\n\nThe same distinct plans (every plan of the finding, each once) ranked by the profile's predictor and by their bytes per "
                "token alone (more bytes, lower KLD): what the predictor adds is the difference between the two.")
    else:
        rho = _table(["profile text → held-out text", "Spearman (predicted vs held-out KLD, replicate 0)"],
                     [[k, f"{v:.3f}"] for k, v in data["rank_correlation"].items()])
    agree = _table(["per-layer delta", f"Spearman between {data.get('agreement_between') or 'the two profiles'}"],
                   [[k, f"{v:.3f}"] for k, v in data["layer_agreement"].items()])
    step = rows[0].step if rows else 0.0
    return (table + f"\n\nAll rivals at equal memory: each per-layer plan (aware and unaware DP plans, KVTuner's rule approximated "
            f"on the unaware profile, the greedy allocator's mix on the same aware profile, random mixes) spends the budget within one layer-format step ({step:,.0f} B/token); a "
            "uniform format is compared only where it is within the stated tolerance of the budget. KLDs are means over "
            f"{replicates} replicated profiles, each on its own disjoint windows of the profile text (random mix r paired with "
            f"replicate r); intervals cross the profiles with the held-out {'documents' if by_document else 'windows'} (two-stage: both "
            "spreads are in every interval; its method is the Verdicts line's). 'aware' allocates from "
            "a profile measured under the quantized weights, 'unaware' from one with 16-bit weights (KVTuner-style profile, "
            "wkvlab's allocator), all evaluated under the quantized weights; 'kvtuner' is KVTuner's pair pruning, layer grouping and "
            "constrained search on the unaware profile, approximate because KVTuner's pruning and grouping code is unpublished "
            "(src/wkvlab/search/kvtuner.py; github.com/cmd2001/KVTuner@babe775). A finding stored before it has '—' there.\n\n"
            + _table(["profile text → held-out text", "on the Pareto front (memory vs held-out KLD, every budget and uniform)"], curves)
            + "\n\n" + rho + "\n\n" + agree)


def search_counts(rows) -> str:
    """Per rival: how many cells were tested (distinct plans), identical (not tested), and what was decided — "equivalent"
    counted on distinct plans only — and in how many the adjusted interval excludes 0, on which side."""
    from wkvlab.findings.search import RIVALS

    body = []
    for rival in RIVALS:
        present = [r for r in rows if rival in r.differences]
        if not present:
            continue
        tested = [r.verdicts[rival] for r in present if rival in r.verdicts]
        count = lambda outcome: sum(v.outcome == outcome for v in tested)  # noqa: E731
        higher = sum(v.adjusted.decided and v.adjusted.low > 0 for v in tested)
        lower = sum(v.adjusted.decided and v.adjusted.high < 0 for v in tested)
        body.append([rival, f"{len(present)}", f"{sum(rival in r.identical for r in present)}", f"{len(tested)}", f"{count('below')}",
                     f"{count('above')}", f"{count('within')}", f"{count('undecided')}", f"{higher} / {lower}"])
    return ("Counts over the cells (profile text × budget × held-out text):\n\n"
            + _table(["rival", "cells", "same plans (no test)", "tested", "aware better", "aware worse", "equivalent within ±m",
                      "undecided", "Holm-adjusted interval excludes 0: aware higher / lower"], body))


def _search_unequal_memory(data: dict) -> str:
    """A search finding stored before version 2, labelled: its uniform rival could spend less than the plan."""
    body = [[r["profile_text"], f"{r['budget']:,.0f} ({100 * r['share']:.0f}%)", r["heldout_text"], f"{r['aware']:.5f}", f"{r['unaware']:.5f}",
             _iv(Interval.from_dict(r["aware_minus_unaware"]) if r.get("aware_minus_unaware") else None, "+.5f"),
             f"{r['uniform_name']} {r['uniform']:.5f}",
             _iv(Interval.from_dict(r["aware_minus_uniform"]) if r.get("aware_minus_uniform") else None, "+.5f")] for r in data["rows"]]
    return ("**Stored before plans were compared at equal memory: not a comparison at equal memory.** The 'best fitting uniform' "
            "here is any uniform format at or under the budget (it may spend less than the plan), and each profile text had one "
            "profile (its variation never resampled); rerun `wkvlab findings search` for the equal-memory comparison.\n\n"
            + _table(["profiled on", "budget B/token (of 16-bit)", "held-out text", "aware plan KLD", "unaware plan KLD",
                      "aware − unaware [raw 95%]", "best fitting uniform (at or under the budget)", "aware − uniform [raw 95%]"], body))


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
