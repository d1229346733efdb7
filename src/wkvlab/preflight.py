"""Checks that run before any model loads: every refusal that can be known from the options,
the model's files and the output paths is given in one line, in well under a second, instead of
after minutes of loading and evaluating (or, worse, after the results are computed).

Nothing here imports torch. The API re-checks what it can only know later (the loaded model's
tokenizer, the text's length); a check that lives here is called from there too, so each refusal
is worded in one place.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from wkvlab.data.corpora import check_data
from wkvlab.data.windows import check_window_options
from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec, split_kv_list
from wkvlab.models.facts import ModelFacts, check_model_source, model_facts
from wkvlab.weights.parse import split_weight_list
from wkvlab.weights.spec import WeightSpec


def check_context_fits(ctx: int, tokens: int | None, max_context: int, model_name: str, option: str = "--ctx") -> None:
    """A window longer than the model allows, or fewer tokens than one window."""
    if ctx > max_context:
        raise ConfigError(f"{option} {ctx} is longer than {model_name}'s maximum context {max_context}; use {option} {max_context} or less")
    if tokens is not None and tokens < ctx:
        raise ConfigError(f"--tokens {tokens} is less than one window of {option} {ctx}; ask for at least {ctx} tokens")


def check_model(model: str, ctx: int, tokens: int | None = None, score: str = "all") -> ModelFacts | None:
    """The model exists, and (when its files say) the windows fit its context."""
    check_window_options(ctx, score)
    check_model_source(model)
    facts = model_facts(model)
    check_context_fits(ctx, tokens, facts.max_context if facts else 1 << 30, model)
    return facts


def check_weights_for_model(specs: Iterable[WeightSpec], model: str) -> None:
    """Weight configs the model's config.json already rules out (MoE experts under AWQ, an
    architecture without an AWQ/SmoothQuant mapping), refused before loading."""
    from wkvlab.models.facts import folder_config
    from wkvlab.weights.support import check_config

    config = folder_config(model)
    if config is not None:
        check_config(specs, config, Path(model).name)


def check_kv_for_model(specs: Iterable[KVSpec], facts: ModelFacts | None) -> None:
    """KV formats this model's head_dim and layer count cannot hold (when its files say)."""
    if facts is not None:
        for spec in specs:
            spec.check_model(facts.head_dim, facts.layers)


def parse_configs(weights: Iterable[str], kv: Iterable[str]) -> tuple[list[WeightSpec], list[KVSpec]]:
    """Weight and KV configs from option values (repeated and/or comma-separated), parsed with the
    one grammar each: a typo is refused here."""
    weight_specs = [WeightSpec.parse(w) for value in weights for w in split_weight_list(value)]
    kv_specs = [KVSpec.parse(k) for value in kv for k in split_kv_list(value)]
    return weight_specs, kv_specs


def check_calibration(calib: str, samples: int | None = None, length: int | None = None) -> None:
    """The calibration text (a domain or a file) and its sample shape, before any model loads."""
    from wkvlab.weights.calibration import DOMAINS, CalibrationSpec

    if samples is not None and length is not None:
        CalibrationSpec(calib, samples, length)
    if calib not in DOMAINS:
        check_data(calib)


def require_store(path: Path, create: bool = False) -> None:
    """A results store that exists (reading commands never create one), or with ``create`` one
    that may be created; a folder or a file that is not SQLite is refused (wkvlab.store.schema)."""
    from wkvlab.store.schema import check_store

    check_store(Path(path), create)
