"""Findings as Markdown: the tables docs/findings.md shows, printed by ``wkvlab findings``."""
from __future__ import annotations

from dataclasses import replace

from wkvlab.findings.analysis import AdditivityRow, CalibrationRow, PenaltyRow
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


def additivity_markdown(rows: list[AdditivityRow]) -> str:
    header = ["weights", "KV", "KLD(W)", "KLD(C)", "KLD(W+C)", "interaction [95%]", "share of sum", "verdict", "resolved?"]
    body = []
    for r in rows:
        need = "yes" if r.resolved else (f"no: ~{r.tokens_needed:,} tokens" if r.tokens_needed else "no")
        body.append([r.weights, r.kv, f"{r.w.estimate:.5f}", f"{r.c.estimate:.5f}", f"{r.wc.estimate:.5f}", _iv(r.interaction, "+.5f"),
                     f"{100 * r.share:+.1f}%", r.verdict, need])
    return _table(header, body)


def penalty_markdown(rows: list[PenaltyRow]) -> str:
    weights = list(dict.fromkeys(r.weights for r in rows))
    kvs = list(dict.fromkeys(r.kv for r in rows))
    cell = {(r.weights, r.kv): r for r in rows}
    body = []
    for kv in kvs:
        line = [kv]
        for w in weights:
            r = cell.get((w, kv))
            line.append("—" if r is None else (format(r.penalty, ".4f") + ("" if r.vs_unquantized is None or not r.vs_unquantized.excludes_zero
                                                                             else (" ↑" if r.vs_unquantized.low > 0 else " ↓"))))
        body.append(line)
    note = ("\n\nEach cell: KLD(W × C) − KLD(W × fp16) with its 95% interval (windows resampled); ↑/↓: the penalty under these "
            "weights is larger/smaller than under unquantized weights, interval excluding 0.")
    return _table(["KV \\ weights", *weights], body) + note


def attention_markdown(rows) -> str:
    """Where the cross term sits: term shares, the cross term on the sinks, the layers that hold it."""
    header = ["weights", "KV", "KV term Q·ε_kᵀ", "weight term ε_q·Kᵀ", "cross term ε_q·ε_kᵀ [95%]", "cross term on sinks / elsewhere (RMS) [95%]",
              "layers holding most of the cross term", "attention KL"]
    body = []
    for r in rows:
        layers = ", ".join(f"L{l} {100 * m:.0f}%" for l, m in r.top_layers)
        body.append([r.weights, r.kv, f"{100 * r.shares['kv'].estimate:.1f}%", f"{100 * r.shares['weight'].estimate:.1f}%",
                     format(percent(r.shares["cross"]), ".1f") + " %", format(r.cross_sink_ratio, ".2f"), layers, f"{r.attention_kl:.2e}"])
    windows = rows[0].windows if rows else 0
    sinks = rows[0].sink_tokens if rows else 0
    return _table(header, body) + (
        "\n\nShares of the summed energy of the three score-error terms over every layer, head and causal (query, key) pair; "
        f"95% intervals over {windows} windows resampled. Sinks: the first {sinks} keys; 1.00 means the cross term is no "
        "larger on them than elsewhere. Layers: share of the network's cross-term energy.")


def calibration_markdown(rows: list[CalibrationRow]) -> str:
    calibs = list(dict.fromkeys(c for r in rows for c in r.kld))
    header = ["method", "evaluated on", *[f"calibrated on {c}" for c in calibs], "mismatch cost [95%]"]
    body = []
    for r in rows:
        costs = "; ".join(f"{c}: {format(iv, '+.4f')}" for c, iv in r.mismatch.items())
        body.append([r.weights, r.data, *[format(r.kld[c], ".4f") if c in r.kld else "—" for c in calibs], costs or "—"])
    return _table(header, body) + ("\n\nMismatch cost: KLD with that calibration text minus KLD with the evaluation's own domain "
                                   "(prose for prose, code for code), paired by window.")


def depth_markdown(tables: list[dict]) -> str:
    parts = []
    for t in tables:
        rows = []
        for row in t["rows"]:
            penalty = Interval.from_dict(row["penalty"])
            growth = Interval.from_dict(row["growth"]) if row["growth"] else None
            rel = row["relative_growth"]
            rows.append([f"{row['start']:,}–{row['end']:,}", f"{row['tokens']:,}", format(penalty, ".5f"),
                         "—" if growth is None else format(growth, "+.5f"), "—" if rel is None else f"{100 * rel:+.1f}%"])
        parts.append(f"**{t['weights']} × {t['kv']}** (minus {t['paired_with']}; unit: {t['unit']}, {t['units']} units, "
                     f"decorrelation lag {t['decorrelation_lag']})\n\n"
                     + _table(["positions", "tokens", "penalty [95%]", "minus first bucket [95%]", "relative"], rows))
    return "\n\n".join(parts)


def search_markdown(data: dict) -> str:
    """The search finding (:meth:`wkvlab.findings.search.SearchFinding.to_dict`): plans, rank correlations, layer agreement."""
    from wkvlab.findings.search import search_rows_from_dict

    body = []
    for r in search_rows_from_dict(data):
        body.append([r.profile_text, f"{r.budget:,.0f} ({100 * r.share:.0f}%)", r.heldout_text, f"{r.aware:.5f}", f"{r.unaware:.5f}",
                     _iv(r.aware_minus_unaware, "+.5f"), f"{r.uniform_name} {r.uniform:.5f}", _iv(r.aware_minus_uniform, "+.5f")])
    table = _table(["profiled on", "budget B/token (of 16-bit)", "held-out text", "aware plan KLD", "unaware plan KLD",
                    "aware − unaware [95%]", "best fitting uniform", "aware − uniform [95%]"], body)
    rho = _table(["profile text → held-out text", "Spearman (predicted vs held-out KLD)"],
                 [[k, f"{v:.3f}"] for k, v in data["rank_correlation"].items()])
    agree = _table(["per-layer delta", "Spearman between the two profile texts"],
                   [[k, f"{v:.3f}"] for k, v in data["layer_agreement"].items()])
    return (table + "\n\nDifferences are paired by held-out window (the same windows for every plan), 95% bootstrap intervals; "
            "'aware' allocates from a profile measured under the quantized weights, 'unaware' from one measured with 16-bit "
            "weights (KVTuner-style), both evaluated under the quantized weights.\n\n" + rho + "\n\n" + agree)


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
