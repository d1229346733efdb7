"""The configurations a searched plan must beat, built from the same allowed formats and budget.

* uniform: every layer in one allowed pair (fp16 included, as the reference point);
* skip first/last N: one quantized pair, the first and last N layers at fp16, with the largest N
  that fits the budget — the rule of thumb engines expose (vLLM ``--kv-cache-dtype-skip-layers``,
  llama.cpp users keeping the ends at higher precision) and the seed's "errors concentrate at both
  ends" in its simplest form;
* sinks-only: a uniform pair that fits, with the first 4 positions at fp16 (StreamingLLM /
  KVSink's observation that sink tokens carry the outliers); its bytes are the long-context limit
  (the sinks' extra 4 tokens amortize to nothing).

The KVTuner-style weight-unaware plan needs a second profile and is built in :mod:`wkvlab.search.api`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from wkvlab.kv.spec import KVSpec
from wkvlab.search.choices import FP16, Choice, choice_label

SINK_TOKENS = 4


@dataclass(frozen=True)
class Candidate:
    """A configuration to measure: its KV spec, and its per-layer plan when it has one."""

    name: str
    kind: str  # plan | uniform | skip-ends | sinks | unaware | reference
    spec: KVSpec
    plan: tuple | None = None  # per-layer choices (None: not a per-layer plan, e.g. sinks)
    keep_16bit: tuple = ()
    method: str = ""
    notes: tuple = field(default_factory=tuple)


def uniform_plan(choice: Choice, n_layers: int) -> tuple[Choice, ...]:
    return tuple([choice] * n_layers)


def skip_ends_plan(choice: Choice, n_layers: int, ends: int) -> tuple[Choice, ...]:
    return tuple(FP16 if i < ends or i >= n_layers - ends else choice for i in range(n_layers))


def baseline_candidates(choices: tuple[Choice, ...], n_layers: int, budget: float,
                        plan_bytes: Callable[[tuple[Choice, ...]], float]) -> list[Candidate]:
    out = []
    for choice in choices:
        plan = uniform_plan(choice, n_layers)
        kind = "reference" if choice == FP16 else "uniform"
        out.append(Candidate(f"uniform {choice_label(choice)}", kind, KVSpec(k=choice[0], v=choice[1]), plan))
    for choice in choices:
        if choice == FP16:
            continue
        best = 0
        for ends in range(1, n_layers // 2):
            if plan_bytes(skip_ends_plan(choice, n_layers, ends)) <= budget + 1e-9:
                best = ends
        if best:
            plan = skip_ends_plan(choice, n_layers, best)
            skip = tuple(i for i, c in enumerate(plan) if c == FP16)
            out.append(Candidate(f"{choice_label(choice)} + first/last {best} at fp16", "skip-ends",
                                 KVSpec(k=choice[0], v=choice[1], skip=skip), plan))
    for choice in choices:
        if choice != FP16 and plan_bytes(uniform_plan(choice, n_layers)) <= budget + 1e-9:
            out.append(Candidate(f"{choice_label(choice)} + sinks={SINK_TOKENS}", "sinks",
                                 KVSpec(k=choice[0], v=choice[1], sinks=SINK_TOKENS)))
    return out
