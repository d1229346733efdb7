"""Checks that run before any model loads: every refusal that can be known from the options,
the model's files and the output paths is given in one line, in well under a second, instead of
after minutes of loading and evaluating (or, worse, after the results are computed).

Nothing here imports torch. The API re-checks what it can only know later (the loaded model's
tokenizer, the text's length); a check that lives here is called from there too, so each refusal
is worded in one place.
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Iterable

from wkvlab.data.corpora import check_data
from wkvlab.data.windows import check_window_options
from wkvlab.errors import ConfigError
from wkvlab.kv.spec import SLIDING, KVSpec, split_kv_list
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
            if facts.sliding and SLIDING not in spec.skip and any(f.requantizes for f in spec.all_formats()):
                raise ConfigError(f"{spec.label}: transformers' QuantizedCache supports only full-attention models and this one has "
                                  "sliding-window layers; add +skip=sliding_window to keep those layers at model precision")


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
    folder = Path(path).parent if str(Path(path).parent) else Path(".")
    if create and (refusal := folder_refusal(folder)) is not None:  # SQLite writes its journal beside the store
        raise ConfigError(f"folder {folder} does not take new files ({refusal}); choose another --store path")


def folder_refusal(folder: Path) -> str | None:
    """Why a new file cannot be created in ``folder`` (None when it can), found by creating and
    removing one: mode bits say nothing for root, and /sys, /proc or a read-only mount refuse even root."""
    try:
        fd, name = tempfile.mkstemp(prefix=".wkvlab-probe-", dir=folder)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(name)
    return None


# The suffix an output option's file must have when the caller does not say (docs/cli.md).
DEFAULT_SUFFIXES = {"--json": (".json",)}


def check_output_file(path: Path | None, option: str = "--json", suffixes: tuple[str, ...] = ()) -> None:
    """Refuse an output file that could not be written, before the work that produces it.

    The folder must exist and take a new file (tried, not read from its mode bits), the path must
    not be a folder, and the name must end in one of ``suffixes`` (``--json``: ``.json``). Nothing is
    left behind. Writing is still atomic and re-checked (:func:`wkvlab.io.write_json_atomic`)."""
    if path is None:
        return
    path = Path(path)
    suffixes = suffixes or DEFAULT_SUFFIXES.get(option, ())
    example = f"results{suffixes[0] if suffixes else '.json'}"
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a folder; give a file name such as {path / example}")
    if suffixes and path.suffix.lower() not in suffixes:
        raise ConfigError(f"{option} {path}: use a file name ending in {' or '.join(suffixes)}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"folder {parent} does not exist; create it or choose another {option} path")
    refusal = folder_refusal(parent)
    if refusal is not None:
        raise ConfigError(f"folder {parent} does not take new files ({refusal}); choose another {option} path")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{option} {path} exists and is not writable; choose another path")


def check_one_config(weight_specs: list[WeightSpec], kv_specs: list[KVSpec], command: str) -> None:
    """Commands that explain one weights × KV pair refuse a list up front (each names the grid command)."""
    if len(weight_specs) != 1:
        raise ConfigError(f"{command} takes one weight config, got {len(weight_specs)}; to evaluate a grid use 'wkvlab eval'")
    if len(kv_specs) != 1:
        raise ConfigError(f"{command} takes one KV config, got {len(kv_specs)} ({', '.join(k.canonical() for k in kv_specs)}); "
                          "to evaluate a grid use 'wkvlab eval'")


def layer_input_widths(model: str) -> tuple[int, ...]:
    """The input widths of the model's quantized linear layers, from its files (empty when unknown):
    hidden size (q/k/v, gate/up), attention output (heads × head_dim into o_proj), MLP width (down_proj)."""
    import json

    from wkvlab.models.facts import _existing_file, gguf_metadata

    source = _existing_file(model)
    try:
        if source is None:
            return ()
        if source.is_dir():
            cfg = json.loads((source / "config.json").read_text())
            cfg = cfg.get("text_config", cfg)
            hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            head_dim = int(cfg.get("head_dim") or hidden // heads)
            mlp = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
        else:
            meta = gguf_metadata(source, ("{arch}.embedding_length", "{arch}.attention.head_count", "{arch}.attention.key_length",
                                          "{arch}.feed_forward_length"))
            hidden, heads = int(meta["{arch}.embedding_length"]), int(meta["{arch}.attention.head_count"])
            head_dim = int(meta.get("{arch}.attention.key_length") or hidden // heads)
            mlp = int(meta["{arch}.feed_forward_length"])
    except (OSError, KeyError, TypeError, ValueError, ZeroDivisionError, EOFError):
        return ()
    return tuple(sorted({hidden, heads * head_dim, mlp}))


def check_weight_groups(specs: Iterable[WeightSpec], model: str) -> None:
    """Integer weight groups that fit no layer, refused with the group sizes that fit: wider than
    every layer's input (no layer would be grouped: each falls back to one scale per row, so the
    name would lie), or dividing none of the widths (every row of every layer would end in a
    shorter group). A group that fits some layers runs, with a note for the others (weights/rtn.py:
    ragged_group_note), as GPTQ's reference allows: int4-g128 on SmolLM2 (1536 fits, 576 does not)."""
    checked = [s for s in specs if s.format == "int" and s.group_size is not None and s.method in ("rtn", "gptq", "awq")]
    check_group_widths(checked, layer_input_widths(model) if checked else (), model)


def check_group_widths(specs: Iterable[WeightSpec], widths: tuple[int, ...], model: str) -> None:
    """:func:`check_weight_groups` against known layer input ``widths`` (sorted; from the files, or from a
    planner's description of a model known by name): the one check eval and plan share."""
    checked = [s for s in specs if s.format == "int" and s.group_size is not None and s.method in ("rtn", "gptq", "awq")]
    if not widths or not checked:
        return
    common = math.gcd(*widths)
    fits = [g for g in range(8, common + 1, 8) if common % g == 0] or [common]
    hint = f"group sizes that divide every width: {', '.join(map(str, fits[-6:]))}"
    listed = ", ".join(map(str, widths))
    for spec in checked:
        group = spec.group_size
        if group > widths[-1]:
            raise ConfigError(f"--weights {spec.label}: groups of {group} are wider than every layer input of {model} ({listed}); {hint}")
        if all(w % group for w in widths):
            raise ConfigError(f"--weights {spec.label}: groups of {group} divide none of {model}'s layer input widths ({listed}); {hint}")
