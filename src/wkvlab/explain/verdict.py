"""The plain-language verdict: a few sentences, each carrying the measured number it rests on.

Words follow the one decision rule (:mod:`wkvlab.stats.decision`), never the point estimates
alone: an interaction *compounds*, is *sub-additive* or *additive within ±m* only when its
Holm-adjusted interval says so against the stated margin m; otherwise it is *undecided*, with
the tokens that would decide it. Every verdict line names its margin and its family adjustment.
The other steps go through the same rule with their own words (a mitigation's recovered share, the
cache excess a mitigation could recover); the position table's change between buckets is described,
never decided (its buckets hold different text), and the noise-floor line is said only of an
interaction the rule did not decide.
"""
from __future__ import annotations

from wkvlab.explain.factorial import NO_TOP1_VERDICT, Effects, Factorial

HEADS = {"above": "Compounds: {w} with {c} costs more than the sum of the two alone",
         "below": "Sub-additive: {w} with {c} costs less than the sum of the two alone",
         "within": "Additive within the margin: {w} and {c} cost their sum",
         "undecided": "Undecided: the data do not say whether {w} and {c} add"}


def additivity(f: Factorial) -> list[str]:
    k = f.kld
    parts = f"KLD(W) {k.w.estimate:.4f}, KLD(C) {k.c.estimate:.4f}, KLD(W+C) {k.wc.estimate:.4f}"
    outcome = k.verdict.outcome if k.verdict is not None else "undecided"
    head = HEADS[outcome].format(w=f.weights, c=f.kv)
    rule = k.verdict.describe(".4f") if k.verdict is not None else f"interaction {k.interaction:.4f} (stored without a verdict)"
    return [f"{head}; KLD interaction {rule} ({parts}, ratio {k.ratio.estimate:.3f}).",
            _others(f.ppl, "PPL", f.tokens, f.windows), _others(f.top1, "top-1 loss", f.tokens, f.windows)]


def _others(e: Effects, name: str, tokens: int, windows: int) -> str:
    fmt = ".4f" if name == "PPL" else ".2%"
    if name == "PPL":  # decided on the log scale: the interaction is in nats of NLL
        scale = "interaction on log PPL (mean NLL, nats) "
        rule = e.verdict.describe(".4f") if e.verdict is not None else f"{e.interaction:.4f} (no verdict)"
    else:
        scale, rule = "interaction ", f"{e.interaction:{fmt}} ({NO_TOP1_VERDICT})"
    return (f"{name}: W {e.w.estimate:+{fmt}}, C {e.c.estimate:+{fmt}}, W+C {e.wc.estimate:+{fmt}}; {scale}{rule} "
            f"({tokens} tokens, {windows} windows)")


def noise_floor(report) -> list[str]:
    noise = report.noise
    if noise is None:
        return []
    lines = list(noise.lines())
    if noise.backend is not None:
        floor = abs(noise.backend.kld.estimate)
        inter = abs(report.factorial.kld.interaction.estimate)
        decided = report.factorial.kld.verdict is not None and report.factorial.kld.verdict.outcome in ("above", "below")
        # a claim about the interaction follows its verdict: one decided beyond ±m is not called noise
        if inter and floor >= inter and not decided:
            lines.append(f"the interaction ({inter:.2e}, not decided beyond its margin) is no larger than the attention-backend "
                         f"noise ({floor:.2e}): it may be arithmetic noise")
    return lines


def top_heads(attention, n: int = 3) -> list[str]:
    """The heads carrying most of the network's cross-term energy (attention.py's decomposition)."""
    heads = [(layer, head, share) for layer, head, share in attention.top_heads(n) if share > 0]
    if not heads:
        return []
    return ["the heads carrying most of it: " + ", ".join(f"L{l}H{h} ({s:.0%})" for l, h, s in heads)
            + f" of the cross-term energy ({attention.layers} layers × {attention.heads} heads)"]


def verdict(report) -> list[str]:
    """The verdict lines for an :class:`~wkvlab.explain.run.ExplainReport`."""
    lines = additivity(report.factorial)
    for part in (report.attention, report.hidden, report.context, report.mitigations):
        if part is not None:
            lines.extend(part.lines())
        if part is not None and part is report.attention:
            lines.extend(top_heads(part))
    for part in report.extras.values():
        if part is not None:
            lines.extend(part.lines())
    lines.extend(noise_floor(report))
    return [line for line in lines if line]
