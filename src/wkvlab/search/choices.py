"""What a layer may store: K/V format pairs, the named sets of them, and their bytes.

A choice is a ``(k, v)`` pair of KV element formats (:mod:`wkvlab.kv.formats`). The CLI takes
``--kv`` spec strings without options — ``fp16``, KVTuner's ``K8V4`` shorthand (integer per token
and head: ``int8``/``int4``/``int2``), any format or ``K/V`` pair (``q8_0/q4_0``, ``fp8_e4m3``) — or
a named set.
"""
from __future__ import annotations

import re

from wkvlab.errors import ConfigError
from wkvlab.kv.formats import get_kv_format

Choice = tuple[str, str]
FP16: Choice = ("fp16", "fp16")

# KVTuner's search space (Li et al., ICML 2025): K and V bits in {8, 4, 2}, K at least as precise as V,
# plus 16-bit. Engine subsets: vLLM takes one dtype and keeps listed layers at the model dtype.
NAMED_SETS: dict[str, tuple[str, ...]] = {
    "kvtuner": ("fp16", "K8V8", "K8V4", "K4V4", "K4V2", "K2V2"),
    "vllm-fp8": ("fp16", "fp8_e4m3"),
    "vllm-int8": ("fp16", "int8_pth"),
    "vllm-int4": ("fp16", "int4_pth"),
}
DEFAULT_SET = "kvtuner"


def parse_choice(text: str) -> Choice:
    """``K8V4`` → (int8, int4); ``q8_0/q4_0`` → (q8_0, q4_0); ``fp8_e4m3`` → (fp8_e4m3, fp8_e4m3) — KV spec strings
    (the grammar of ``--kv``) without options: a layer's choice is a pair of element formats."""
    from wkvlab.kv.spec import KVSpec

    try:
        spec = KVSpec.parse(text.strip())
    except ConfigError as exc:
        raise ConfigError(f"--formats: {exc}") from None
    if spec.canonical() != (spec.k if spec.k == spec.v else f"{spec.k}/{spec.v}"):
        raise ConfigError(f"--formats: {text!r} carries options; a layer's choice is a K/V format pair such as K8V4 or q8_0/q4_0")
    for fmt in (get_kv_format(spec.k), get_kv_format(spec.v)):
        if fmt.token_group or fmt.calibrated:
            raise ConfigError(f"--formats: {fmt.name} depends on other tokens or calibration; the search takes per-vector formats (int8, int4, q8_0, fp8_e4m3, ...)")
    return spec.k, spec.v


def parse_choices(text: str | None) -> tuple[Choice, ...]:
    """A comma list of choices and/or named sets; fp16 is always allowed (the layer left alone)."""
    items: list[str] = []
    for part in filter(None, (p.strip() for p in (text or DEFAULT_SET).split(","))):
        items.extend(NAMED_SETS.get(part.lower(), (part,)))
    choices = [FP16] + [parse_choice(item) for item in items]
    unique = tuple(dict.fromkeys(choices))
    if len(unique) < 2:
        raise ConfigError("--formats needs at least one quantized choice besides fp16, e.g. --formats K8V8,K8V4,K4V4")
    return unique


def choice_label(choice: Choice) -> str:
    k, v = choice
    match_k, match_v = re.fullmatch(r"int([248])", k), re.fullmatch(r"int([248])", v)
    if match_k and match_v:
        return f"K{match_k.group(1)}V{match_v.group(1)}"
    return k if k == v else f"{k}/{v}"


def choice_bytes(choice: Choice, *, kv_heads: int, head_dim: int) -> float:
    """Bytes one token costs in one layer's K and V caches under ``choice``."""
    k, v = (get_kv_format(name) for name in choice)
    return kv_heads * (k.bytes_per_vector(head_dim) + v.bytes_per_vector(head_dim))


def smallest_plan_bytes(choices: tuple[Choice, ...], *, layers: int, kv_heads: int, head_dim: int) -> float:
    """KV bytes per token of the cheapest plan: every layer in the smallest allowed choice."""
    return layers * min(choice_bytes(c, kv_heads=kv_heads, head_dim=head_dim) for c in choices)


def check_budget_options(budget: float | None, gpu: str | None, batch: int, context: int | None,
                         budgets: list[float] | None = None) -> None:
    """How the budget is given: bytes per token, a list of them (a curve) or a GPU — one of the three — and positive sizes."""
    if sum(x is not None for x in (budget, gpu, budgets or None)) != 1:
        raise ConfigError("give either --budget <bytes per token>, --budgets <b1,b2,...> or --gpu <name> (with --batch and --context)")
    if budget is not None and budget <= 0:
        raise ConfigError(f"--budget must be a positive number of bytes per token, got {budget}")
    if budgets:
        if len(budgets) < 2 or any(not b > 0 for b in budgets) or len(set(budgets)) != len(budgets):
            raise ConfigError(f"--budgets takes two or more different positive bytes per token (a curve: 8 or more), got {list(budgets)}")
    if batch < 1 or (context is not None and context < 1):
        raise ConfigError("--batch and --context must be positive")


def parse_budgets(text: str | None) -> list[float] | None:
    """``--budgets 5000,6000,8000`` → [5000.0, 6000.0, 8000.0] (None when not given)."""
    if text is None:
        return None
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--budgets takes comma-separated bytes per token such as 5000,6500,8000, got {text!r}") from None


def nothing_fits(budget: float, smallest: float) -> ConfigError:
    return ConfigError(f"nothing fits --budget {budget:,.0f} B/token: the smallest allowed format needs {smallest:,.0f} B/token on this model; "
                       "raise --budget or allow smaller --formats")


def single_formats(choices: tuple[Choice, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The distinct quantized K formats and V formats the choices use (what a profile must measure)."""
    ks = tuple(dict.fromkeys(k for k, _ in choices if not get_kv_format(k).is_identity))
    vs = tuple(dict.fromkeys(v for _, v in choices if not get_kv_format(v).is_identity))
    return ks, vs
