"""The plain-language verdict: a few sentences, each carrying the measured number it rests on.

Words follow the one decision rule (:mod:`wkvlab.stats.decision`), never the point estimates
alone: an interaction *compounds*, is *sub-additive* or *additive within ±m* only when its
Holm-adjusted interval says so against the stated margin m; otherwise it is *undecided*, with
the tokens that would decide it. Every verdict line names its margin, its family adjustment (Holm,
with the family's size), the replicates inside its interval and its Monte-Carlo error (none: the
interval is analytic). Interactions are decided on KLD and on NLL (mean log-loss, the log of PPL);
PPL and top-1 are described, never decided (their scales make an "interaction" of two independent
errors: issue #38). The other steps go through the same rule with their own words (a mitigation's recovered share, the cache excess a mitigation could recover); the position
table's change between buckets is described, never decided (its buckets hold different text), and the
noise-floor line is said only of an interaction the rule did not decide.

Each line starts with the windows its numbers come from (``[factorial: 16 windows of 512]``,
``[attention: 1 window of 512]``, ``[position curve: 4 documents of 1024]``): the steps run on
different text, so the same name (KLD(W+C)) has different values on different lines.
"""
from __future__ import annotations

from wkvlab.explain.factorial import NO_TOP1_VERDICT, Effects, Factorial

HEADS = {"above": "Compounds: {w} with {c} costs more than the sum of the two alone",
         "below": "Sub-additive: {w} with {c} costs less than the sum of the two alone",
         "within": "Additive within the margin: {w} and {c} cost their sum",
         "undecided": "Undecided: the data do not say whether {w} and {c} add"}


NO_PPL_VERDICT = ("described only, no interaction verdict on PPL: two independent errors that multiply it by e^b and e^c "
                  "show e^a(e^b − 1)(e^c − 1) > 0 from the exponential alone; the NLL line decides it on the log scale")


def factorial_source(f: Factorial) -> str:
    """``[factorial: 16 windows of 512, 8,176 tokens, 2 replicates]``: where the factorial's numbers come from."""
    reps = f", {f.replicates} replicate{'s' if f.replicates != 1 else ''}" if f.replicates else ""
    return f"[factorial: {f.windows} windows of {f.ctx}, {f.tokens:,} tokens{reps}]"


def additivity(f: Factorial) -> list[str]:
    k = f.kld
    parts = f"KLD(W) {k.w.estimate:.4f}, KLD(C) {k.c.estimate:.4f}, KLD(W+C) {k.wc.estimate:.4f}"
    outcome = k.verdict.outcome if k.verdict is not None else "undecided"
    head = HEADS[outcome].format(w=f.weights, c=f.kv)
    rule = k.verdict.describe(".4f") if k.verdict is not None else f"interaction {k.interaction:.4f} (stored without a verdict)"
    lines = [f"{head}; KLD interaction {rule} ({parts}, ratio {k.ratio.estimate:.3f}).",
             _nll(f.ppl), _described(f.ppl, "PPL", ".4f", NO_PPL_VERDICT), _described(f.top1, "top-1 loss", ".2%", NO_TOP1_VERDICT)]
    if f.variation:
        lines.append(f"replicates: {f.variation}; every factorial interval above pools them (between-document + "
                     "between-replicate variance, Satterthwaite df)")
    return lines


def _nll(e: Effects) -> str:
    """The interaction decided on the log scale of PPL: mean NLL in nats (``Effects`` of PPL keep it there)."""
    rule = e.verdict.describe(".4f") if e.verdict is not None else f"{e.interaction:.4f} (no verdict)"
    return f"NLL (mean log-loss, nats) interaction {rule}"


def _described(e: Effects, name: str, fmt: str, why: str) -> str:
    interaction = "" if name == "PPL" else f"; interaction {e.interaction:{fmt}}"
    return f"{name}: W {e.w.estimate:+{fmt}}, C {e.c.estimate:+{fmt}}, W+C {e.wc.estimate:+{fmt}}{interaction} ({why})"


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


def sources(report) -> dict[str, str]:
    """Where each step's numbers come from, as the prefix of its lines (see the module docstring)."""
    f, o = report.factorial, report.options
    diag = min(o.diag_windows, f.windows)
    diagnosis = f"[attention: the first {diag} window{'s' if diag != 1 else ''} of {f.ctx}, 1 replicate]"
    context = report.context
    curve = (f"[position curve: {context.documents} documents of {context.max_ctx}, 1 replicate]" if context is not None else "")
    same = f"[the factorial's {f.windows} windows of {f.ctx}, 1 replicate]"
    return {"factorial": factorial_source(f), "attention": diagnosis, "hidden": diagnosis, "context": curve, "mitigations": same,
            "noise": same, "cross_term": diagnosis, "generation": f"[generation: {o.data} prompts]",
            "retrieval": f"[retrieval: planted facts in {o.max_ctx} tokens]", "selfgen": "[the model's own samples, 1 replicate]"}


def verdict(report) -> list[str]:
    """The verdict lines for an :class:`~wkvlab.explain.run.ExplainReport`, each prefixed with its windows."""
    where = sources(report)
    lines = [(where["factorial"], line) for line in additivity(report.factorial)]
    for name, part in (("attention", report.attention), ("hidden", report.hidden), ("context", report.context),
                       ("mitigations", report.mitigations)):
        if part is not None:
            lines.extend((where[name], line) for line in part.lines())
        if part is not None and part is report.attention:
            lines.extend((where[name], line) for line in top_heads(part))
    for name, part in report.extras.items():
        if part is not None:
            lines.extend((where.get(name, ""), line) for line in part.lines())
    lines.extend((where["noise"], line) for line in noise_floor(report))
    return [f"{prefix} {line}".strip() for prefix, line in lines if line]
