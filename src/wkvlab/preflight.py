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
import re
import sys
import tempfile
from pathlib import Path
from typing import Iterable

from wkvlab.data.corpora import check_data
from wkvlab.data.windows import check_window_options
from wkvlab.errors import ConfigError, DataError
from wkvlab.kv.spec import SLIDING, KVSpec, split_kv_list
from wkvlab.models.facts import ModelFacts, _existing_file, check_model_source, model_facts
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
    """The calibration text (a domain or a file) and its sample shape, before any model loads; a
    missing file is named as ``--calib``'s (not told to pass ``--data``)."""
    from wkvlab.data.corpora import is_named_text
    from wkvlab.weights.calibration import DOMAINS, CalibrationSpec

    if samples is not None and length is not None:
        CalibrationSpec(calib, samples, length)
    if calib in DOMAINS:
        return
    if not is_named_text(calib) and not Path(calib).expanduser().exists():
        raise DataError(f"--calib file not found: {calib}; use --calib {', '.join(DOMAINS)}, or an existing UTF-8 .txt/.jsonl file")
    try:
        check_data(calib)
    except DataError as exc:
        raise DataError(f"--calib: {exc}") from None


def check_tokens_in_text(data: str, ctx: int, tokens: int) -> None:
    """Refuse ``--tokens`` the text cannot hold, from its length alone (no tokenizer): a token covers
    at least one byte, so a text of B bytes holds at most B tokens (plus one per document for a
    tokenizer's leading marker). Texts that hold more bytes than that but fewer tokens are cut after
    tokenizing, and the run says so before its first pass (:func:`text_shortfall`)."""
    from wkvlab.data.corpora import text_size

    size = text_size(data)
    if size is None:
        return
    nbytes, documents = size
    needed = max(1, tokens // ctx) * (ctx - 1)  # the windows' text tokens (a BOS may take one place each)
    if ctx - 1 > nbytes + documents:  # the words of wkvlab.data.windows.make_windows, which says it after tokenizing
        raise DataError(f"the text {data!r} has {nbytes:,} bytes: fewer than one window of {ctx} tokens; use a longer text or a smaller --ctx")
    if needed > nbytes + documents:
        raise ConfigError(f"--tokens {tokens:,} needs {needed:,} tokens of text in windows of {ctx}, and {data!r} has {nbytes:,} bytes, "
                          f"so fewer than {nbytes + documents:,} tokens; ask for fewer --tokens or give a longer --data")


def text_shortfall(asked: int, ctx: int, windows: int) -> str | None:
    """The line a run prints when the text held fewer windows than ``--tokens`` asked for (None when it held them)."""
    wanted = max(1, asked // ctx)
    if windows >= wanted:
        return None
    return (f"the text holds {windows} window(s) of {ctx} tokens, not the {wanted} that --tokens {asked:,} asks for: "
            f"evaluating {windows * ctx:,} tokens")


# torch's build facts, read from torch/version.py without importing torch (a second of start-up)
_TORCH_BUILD = re.compile(r"^(cuda|hip)\s*(?::[^=]*)?=\s*(.+)$", re.M)


def _torch_gpu_build() -> bool | None:
    """Whether the installed torch was built with CUDA or ROCm (None when its files do not say)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return None
    found = dict(_TORCH_BUILD.findall(text))
    if not found:
        return None
    return any(value.strip() not in ("None", "''", '""') for value in found.values())


def cuda_refusal() -> str | None:
    """Why no CUDA device can be visible to torch, known without importing it (None: maybe one is)."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU"
    if _torch_gpu_build() is False:
        return "this torch build has no CUDA (a CPU-only build)"
    if sys.platform.startswith("linux") and Path("/dev").is_dir() and not any(Path("/dev").glob("nvidia[0-9]*")) \
            and not Path("/dev/dxg").exists() and not Path("/dev/kfd").exists():
        return "no GPU device is present (/dev has no nvidia<N>, dxg or kfd)"
    return None


def check_device(device: str) -> None:
    """``--device``: a known name, and for ``cuda``/``cuda:N`` a GPU torch could see — refused in a
    second where torch's own check (:func:`wkvlab.models.loading.resolve_device`) comes after its import."""
    key = device.strip().lower()
    if key in ("auto", "cpu"):
        return
    if not (key == "cuda" or (key.startswith("cuda:") and key[5:].isdigit())):
        raise ConfigError(f"unknown --device {device!r}; use auto, cpu, cuda or cuda:<N>")
    refusal = cuda_refusal()
    if refusal is not None:
        raise ConfigError(f"--device {device}: {refusal}; use --device cpu (or auto)")


def resolved_device(device: str) -> str | None:
    """``--device`` as the run will resolve it, where that is known without torch (``auto`` on a
    machine that cannot have CUDA: ``cpu``); None when only torch can say."""
    key = device.strip().lower()
    if key == "auto":
        return "cpu" if cuda_refusal() is not None else None
    return key


def resolved_dtype(dtype: str, device: str) -> str | None:
    """``--dtype`` as the run will resolve it (wkvlab.models.loading.resolve_dtype's rule: auto is
    bfloat16 on a GPU, float32 on the CPU); None when that needs torch to say where ``auto`` runs."""
    key = dtype.strip().lower()
    if key != "auto":
        return key
    where = resolved_device(device)
    return None if where is None else "bfloat16" if where.startswith("cuda") else "float32"


def check_memory_budget(model: str, weight_specs: list[WeightSpec], kv_specs: list[KVSpec], *, ctx: int, tokens: int, score: str,
                        dtype: str, device: str, chunk: int | None, stored_reference: bool, plan: str, max_memory: int | None,
                        calibration: tuple[int, int], topk: int) -> None:
    """``--max-memory`` below what every plan needs, refused before torch is imported, in the words
    of :func:`wkvlab.eval.memory.choose_plan` (the run re-checks with the device's own numbers)."""
    from wkvlab.eval.memory import grid_estimate

    where, resolved = resolved_device(device), resolved_dtype(dtype, device)
    if max_memory is None or where is None or resolved is None:
        return
    from wkvlab.plan.source import resolve_source

    try:
        resolve_source(model)
    except ConfigError:  # shapes the planner cannot read: the run goes on without an estimate (cli.memory_preflight)
        return
    try:
        grid_estimate(model, weight_specs, kv_specs, ctx=ctx, tokens=tokens, score=score, dtype=resolved, device=where, chunk=chunk,
                      stored_reference=stored_reference, plan=plan, budget=max_memory, calibration=calibration, topk=topk)
    except ConfigError as exc:
        raise ConfigError(f"--max-memory {max_memory / 2**30:g} GiB: {exc}") from None


def check_grid(model: str, weight_specs: list[WeightSpec], kv_specs: list[KVSpec], facts: ModelFacts | None,
               baseline: str = "float") -> None:
    """Everything a weights × KV grid on ``model`` can be refused for from the model's files:
    KV formats and layers, weight ``skip=`` layers, architecture support, group sizes, and the baseline."""
    from wkvlab.eval.baseline_rules import baseline_kind

    check_kv_for_model(kv_specs, facts)
    if facts is not None:
        for spec in weight_specs:
            spec.check_layers(facts.layers)
    check_weights_for_model(weight_specs, model)
    check_weight_groups(weight_specs, model)
    source = _existing_file(model)
    baseline_kind(baseline, str(source) if source is not None else model, weight_specs, kv_specs)


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

    from wkvlab.models.facts import gguf_metadata

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


def check_sweep(spec, device: bool = True) -> None:
    """A sweep spec's models, grids, texts, device and calibration text, checked as ``wkvlab eval``
    checks its options (:func:`check_grid` per model, ``--tokens`` per text), before the store opens."""
    from wkvlab.data.corpora import is_selfgen

    weights, kv = list(spec.weights), list(spec.kv)
    for model in spec.models:
        facts = None
        for ctx in spec.ctx:
            for tokens in spec.tokens:
                for score in spec.score:
                    facts = check_model(model, ctx, tokens, score)
        check_grid(model, weights, kv, facts)
    for data in spec.data:
        if not is_selfgen(data):
            check_data(data)
            for ctx in spec.ctx:
                for tokens in spec.tokens:
                    check_tokens_in_text(data, ctx, tokens)
    if device:
        check_device(spec.device)
    if any(w.needs_calibration for w in weights):
        check_calibration(spec.calibration.data)
