"""What determines an explain run and how many steps it takes: plain data, no torch, so the
CLI can check options (and draw the progress total) before any model loads. See :mod:`.run`."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

from wkvlab.errors import ConfigError
from wkvlab.specio import reject_unknown_fields
from wkvlab.stats.replicates import replicate_chunk  # noqa: F401 - the replicates' chunk rule, re-exported for explain.run

STEPS = ("noise", "attention", "hidden", "context", "mitigations", "generation", "retrieval", "selfgen")
CANDIDATE_STEPS = ("attention", "hidden", "generation", "retrieval")  # steps that run the weight-quantized model directly
GENERATION_PROMPTS = 4
GENERATION_PROMPT_TOKENS = 64
GENERATION_NEW_TOKENS = 32
RETRIEVAL_PER_DEPTH = 2  # × 5 depths, each item one pass of max_ctx tokens per model
# A retrieval item is a planted fact, filler and a question of about 50 tokens together; below this
# there is no filler left to hide the fact in (explain.retrieval.build_items checks it exactly).
RETRIEVAL_MIN_CTX = 128
CONTEXT_MIN_CTX = 10  # the position curve needs buckets past the 4 sink positions (explain.context.long_windows)
# The factorial measured this many times (another calibration sample, another chunk size), pooled with its
# run-to-run variance inside every interval (stats.replicates). 2 doubles the factorial's cost, the least that
# estimates the between-replicate variance at all; its 1 df widens intervals where replicates disagree.
DEFAULT_REPLICATES = 2


@dataclass(frozen=True)
class ExplainOptions:
    """Everything that determines an explain run (round-trips through JSON)."""

    weights: str
    kv: str
    model: str = "default"
    data: str = "default"
    ctx: int = 512
    tokens: int = 2048
    max_ctx: int = 1024
    context_docs: int = 4
    diag_windows: int = 1
    skip: tuple = ()
    seed: int = 0  # the retrieval step's planted facts (no interval draws anything: they are analytic)
    margin: "float | str" = "10%"  # the decision rule's m (wkvlab.stats.decision.MarginRule: 10%, 0.002, cache:10%)
    replicates: int = DEFAULT_REPLICATES  # factorial runs pooled (replicate_chunk, weights.calibration's replicate)

    def __post_init__(self) -> None:
        skip = tuple(sorted({s.strip() for s in self.skip if s.strip()}))
        unknown = [s for s in skip if s not in STEPS]
        if unknown:
            raise ConfigError(f"unknown step(s) to skip: {', '.join(unknown)}; use any of {', '.join(STEPS)}")
        object.__setattr__(self, "skip", skip)
        for name in ("ctx", "tokens", "max_ctx", "context_docs", "diag_windows", "replicates"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        from wkvlab.stats.decision import MarginRule

        MarginRule.parse(self.margin)  # a bad --margin is a one-line error before any model loads
        # Known before any model loads: the steps that use --max-ctx need room (the model's own limit
        # is checked by the CLI from the model's files, and again after loading).
        if self.runs("retrieval") and self.max_ctx < RETRIEVAL_MIN_CTX:
            raise ConfigError(f"--max-ctx {self.max_ctx} is too short for the retrieval step (a planted fact, filler and a question); "
                              f"use --max-ctx {RETRIEVAL_MIN_CTX} or more, or --skip retrieval")
        if self.runs("context") and self.ctx < self.max_ctx < CONTEXT_MIN_CTX:
            raise ConfigError(f"--max-ctx {self.max_ctx} is too short to show a position effect; use --max-ctx 256 or more, "
                              f"--max-ctx {self.ctx} or less (reuses the --ctx windows), or --skip context")

    def runs(self, step: str) -> bool:
        return step not in self.skip

    def to_dict(self) -> dict:
        data = asdict(self)
        data["skip"] = list(self.skip)
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> "ExplainOptions":
        data = {k: v for k, v in data.items() if k != "n_resamples"}  # runs stored before issue #38 recorded the bootstrap's count
        reject_unknown_fields(cls, dict(data), "explain options")
        return cls(**{**data, "skip": tuple(data.get("skip") or ())})


def planned_steps(options: ExplainOptions, n_windows: int) -> int:
    """Progress-bar units (window passes) the run will take; an upper bound for mitigations."""
    grid = lambda windows, n_w, n_kv: windows * (1 + n_w * n_kv) + n_w  # noqa: E731 - as runner.grid_steps
    steps = grid(n_windows, 2, 2)
    for r in range(1, options.replicates):  # each replicate's chunks are half the last one's: twice the passes
        steps += grid(n_windows * 2 ** r, 2, 2)
    if options.runs("noise"):
        steps += grid(n_windows, 1, 1) + n_windows
    diag = min(options.diag_windows, n_windows)
    steps += diag * (options.runs("attention") + options.runs("hidden"))
    if options.runs("context") and options.max_ctx > options.ctx:
        steps += grid(options.context_docs, 2, 2)
    if options.runs("mitigations"):
        steps += grid(n_windows, 1, 5)
    if options.runs("generation"):
        steps += 2
    if options.runs("retrieval"):
        steps += 2 * 5 * RETRIEVAL_PER_DEPTH
    if options.runs("selfgen"):
        n = selfgen_tokens(options)
        steps += -(-n // 256) + 1 + grid(max(1, n // options.ctx), 2, 2)  # sampled documents (if not cached), then the grid
    return steps


def planned_grids(options: ExplainOptions, weights, kv) -> list[tuple[list, list]]:
    """The weights × KV grids the run evaluates, in order, as (weight specs, KV specs) — what the progress
    ETA times apart (wkvlab.display.grids_classes): each one builds its weight configs again. The
    mitigations' candidate caches are counted as the cache itself (their calibrations are alike)."""
    from wkvlab.explain.factorial import factorial_specs

    factorial = factorial_specs(weights, kv)
    grids = [factorial] * options.replicates
    if options.runs("noise"):
        grids.append(([weights], [kv]))
    if options.runs("context") and options.max_ctx > options.ctx:
        grids.append(factorial)
    if options.runs("mitigations"):
        grids.append(([weights], [kv]))
    if options.runs("selfgen"):
        grids.append(factorial)
    return grids


def selfgen_tokens(options: ExplainOptions) -> int:
    """Tokens of self-generated text: half the evaluation's, at least one window (sampling is slow)."""
    return max(options.ctx, options.tokens // 2)
