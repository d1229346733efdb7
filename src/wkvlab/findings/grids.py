"""What each finding measures: its sweeps, sized per model (pure data, no model is loaded here).

Sizes are chosen so that a finding runs in about an hour on a 2-core CPU for the packaged models;
the additivity finding prints, for each interaction whose interval is too wide to settle the
question, how many tokens would (intervals shrink with the square root of the tokens).
``--tokens`` overrides the size.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec
from wkvlab.sweep.spec import SweepSpec
from wkvlab.weights.calibration import CalibrationSpec
from wkvlab.weights.parse import parse_weight_spec

# The seed's weight methods and the caches people deploy, as issue #17 lists them.
ADDITIVITY_WEIGHTS = ("none", "int4-g128", "gptq-int4-g128", "awq-int4-g128", "w8a8-int8", "fp8", "nvfp4")
ADDITIVITY_KV = ("fp16", "vllm:fp8_e4m3", "vllm:fp8_e4m3+scales=amax448", "int8", "int4", "llamacpp:q4_0", "kivi4", "kvquant:4-1%")
CALIBRATED_WEIGHTS = ("gptq-int4-g128", "awq-int4-g128", "w8a8-int8")
CALIBRATION_TEXTS = ("prose", "code", "math")
EVALUATION_TEXTS = ("default", "code")
DEPTH_KV = ("q8_0", "q4_0", "int4")
# Where the cross term sits: the weight methods and the caches that compound in the additivity finding.
ATTENTION_WEIGHTS = ("none", "int4-g128", "gptq-int4-g128", "awq-int4-g128", "fp8", "nvfp4")
ATTENTION_KV = ("int4", "llamacpp:q4_0", "kivi4")
ATTENTION_WINDOWS = 8  # the statistical rule's minimum number of resampling units (wkvlab.stats.MIN_UNITS)
# The additivity, methods and calibration grids are measured this many times by default (another calibration
# sample, another chunk size), pooled with their run-to-run variance inside every interval (stats.replicates), as
# explain's factorial (explain.options.DEFAULT_REPLICATES): a claim about a method or a config is about every build
# and run of it (issue #38: two runs moved GPTQ×KIVI-4 by 4.7 SE). 2 doubles the grids' cost, the least that
# estimates the between-replicate variance at all; a store that holds replicate 0 measures only replicate 1.
DEFAULT_REPLICATES = 2
REPLICATED = ("additivity", "methods", "calibration")  # the findings --replicates applies to


def replicate_count(name: str, replicates: int | None) -> int:
    """The number of replicates finding ``name`` measures (None: its default; 1 for a finding without replicates),
    or a one-line error before any model loads."""
    if replicates is None:
        return DEFAULT_REPLICATES if name in REPLICATED else 1
    if not isinstance(replicates, int) or isinstance(replicates, bool) or replicates < 1:
        raise ConfigError(f"--replicates {replicates} must be at least 1 (1: one measurement, without run-to-run variance; "
                          f"default {DEFAULT_REPLICATES})")
    if name not in REPLICATED and replicates != 1:
        raise ConfigError(f"--replicates applies to the additivity, methods and calibration findings; leave it out for {name}")
    return replicates


@dataclass(frozen=True)
class Size:
    """Windows of a finding on one model: short ones for the grids, long ones for depth."""

    ctx: int = 512
    tokens: int = 16384
    depth_ctx: int = 8192
    depth_tokens: int = 32768


# Measured rates on the 2-core machine set these: SmolLM2 runs ~350 token-passes/s, Gemma-3-270M
# (its 262k-vocabulary head) about a third of that; depth windows go to each model's limit.
SIZES = {
    "smollm2": Size(ctx=512, tokens=16384, depth_ctx=8192, depth_tokens=32768),
    "gemma3-270m": Size(ctx=512, tokens=8192, depth_ctx=32768, depth_tokens=65536),
}
DEFAULT_SIZE = Size(ctx=1024, tokens=32768, depth_ctx=32768, depth_tokens=65536)


def size_for(model: str, *, tokens: int | None = None, ctx: int | None = None, depth: bool = False) -> Size:
    """The packaged models' sizes (any other model gets the defaults), with ``--ctx``/``--tokens``
    overriding the grids' windows — or, for the depth finding (``depth``), the long windows."""
    from wkvlab.models.packaged import canonical_name

    size = SIZES.get(canonical_name(model) or "", DEFAULT_SIZE)
    names = ("depth_ctx", "depth_tokens") if depth else ("ctx", "tokens")
    ctx = ctx if ctx is not None else getattr(size, names[0])
    tokens = tokens if tokens is not None else max(getattr(size, names[1]), ctx)
    check_windows(ctx, tokens)
    return replace(size, **dict(zip(names, (ctx, tokens))))


def check_windows(ctx: int, tokens: int) -> None:
    """Every finding's windows: at least 16 tokens each, and at least one of them."""
    if ctx < 16:
        raise ConfigError(f"--ctx {ctx} is too short; use --ctx 16 or more")
    if tokens < ctx:
        raise ConfigError(f"--tokens {tokens} is less than one window of --ctx {ctx}; ask for at least {ctx}")


def check_size(name: str, model: str, *, ctx: int | None, tokens: int | None) -> None:
    """Refuse a finding's ``--ctx``/``--tokens`` before anything heavy is loaded (each finding's own windows)."""
    if name == "search":
        search_grid(model, tokens=tokens, ctx=ctx)
    elif name == "engine":
        check_windows(ctx or ENGINE_CTX, tokens or ENGINE_TOKENS)
    elif name in ("depth", "depth-long"):  # --tokens: target tokens per document; --ctx: the longest window (prefix + target)
        from wkvlab.findings.depth import DEPTH_SHORTEST, DEPTH_TARGET

        if tokens is not None and tokens < 16:
            raise ConfigError(f"--tokens {tokens} (the depth finding's target tokens per document) is too few; use 16 or more")
        target = tokens or DEPTH_TARGET
        least = target + 4 * min(target, DEPTH_SHORTEST) + 1  # prefixes S, 2S, 4S and a longer one
        if ctx is not None and ctx < least:
            raise ConfigError(f"--ctx {ctx} leaves fewer than 4 prefix lengths for {target} target tokens; "
                              f"use --ctx {least} or more, or a smaller --tokens")
    else:
        size_for(model, tokens=tokens, ctx=ctx)


def _spec(name: str, model: str, *, data: str = "default", ctx: int, tokens: int, weights, kv, calibration: CalibrationSpec | None = None,
          device: str = "auto", dtype: str = "auto", replicate: int = 0) -> SweepSpec:
    # replicate r ≥ 1: the same configs measured again, each its own config id (wkvlab.sweep.plan); 0 keeps the ids of
    # findings measured before replicates existed, so their stores are reused
    return SweepSpec(models=(model,), data=(data,), ctx=(ctx,), tokens=(tokens,), weights=tuple(parse_weight_spec(w) for w in weights),
                     kv=tuple(KVSpec.parse(k) for k in kv), calibration=calibration or CalibrationSpec(),
                     name=name if not replicate else f"{name} (replicate {replicate})", device=device, dtype=dtype, replicate=replicate,
                     # one task per weight config: its results are stored as soon as its KV grid is done (an
                     # interrupted finding resumes there), and only that config's copy is in memory — one task of
                     # 7 weight copies held SmolLM2's additivity grid at 15 GB and stored nothing for 45 minutes
                     grid="weight")


def additivity_sweeps(model: str, size: Size, **where) -> list[SweepSpec]:
    """Every weight method × every cache, fp16 and none included (the factorial's four cells for each pair)."""
    return [_spec("additivity", model, ctx=size.ctx, tokens=size.tokens, weights=ADDITIVITY_WEIGHTS, kv=ADDITIVITY_KV, **where)]


def calibration_sweeps(model: str, size: Size, **where) -> list[SweepSpec]:
    """Calibrated weight methods × calibration text × evaluation text, 16-bit cache."""
    return [
        _spec(f"calibration-{calib}-{data}", model, data=data, ctx=size.ctx, tokens=size.tokens, weights=("none", *CALIBRATED_WEIGHTS),
              kv=("fp16",), calibration=CalibrationSpec(calib), **where)
        for calib in CALIBRATION_TEXTS for data in EVALUATION_TEXTS
    ]


def search_grid(model: str, *, tokens: int | None = None, ctx: int | None = None):
    """The search finding's grid: ``--tokens`` sets the profile tokens per text (held-out: four times
    as many, and at least 16 windows, so every paired interval has 16 units), ``--ctx`` the window."""
    from wkvlab.findings.search import SearchGrid

    grid = SearchGrid()
    ctx = ctx if ctx is not None else grid.ctx
    profile = tokens if tokens is not None else grid.profile_tokens
    check_windows(ctx, profile)
    return replace(grid, ctx=ctx, profile_tokens=profile, heldout_tokens=max(4 * profile, 16 * ctx))


# The engine finding: llama.cpp's own cache types on the model's GGUF, on the windows docs/engines.md uses.
ENGINE_KV = ("q8_0", "q4_0", "q4_1", "q5_0", "q8_0/q4_0")
ENGINE_CTX, ENGINE_TOKENS = 1024, 4096
