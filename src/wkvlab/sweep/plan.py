"""From a spec to configs with stable ids, and from the configs still missing to grid tasks.

**Config ids.** A config's id is the SHA-256 of the canonical JSON (sorted keys, no spaces) of
everything that determines its numbers: the model's fingerprint (the GGUF's SHA-256 or the HF
folder's, as :func:`wkvlab.models.load_model` computes it), the text's SHA-256, ctx, tokens,
score, stride, the weight and KV spec dicts without their display labels, and the calibration
spec when (and only when) the config reads calibration text. Names do not enter: ``default`` and
``smollm2`` are the same model, ``int4-g128`` and a spec file holding the same fields are the same
config. Library versions do not enter either (an upgrade would orphan every stored result); each
stored result records them instead. The chunk size does not enter a measurement's id (replicate 0);
a **replicate** r ≥ 1 (the spec's ``replicate``) is another measurement of the same config, so its id
adds ``{index: r, chunk, calibration_sample}`` — the chunk it runs with and which disjoint calibration
sample it reads (r, or none when the config reads none) — and replicate 0's ids stay what they were.

**Tasks.** Configs that share (model, data, ctx, tokens, score, stride) share windows and the
reference pass. ``grid: group`` runs each such group as one grid per distinct set of missing KV
configs — normally one grid, so the reference runs once and each weight config is built once;
``grid: weight`` runs one grid per weight config, which repeats the reference (one forward per
window) but loses at most one weight config's work to a crash.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from wkvlab.data import load_corpus, window_layout
from wkvlab.errors import ConfigError, ModelError
from wkvlab.eval.chunks import auto_chunk
from wkvlab.eval.runner import grid_steps
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.tokens import token_group_multiple
from wkvlab.stats.replicates import replicate_chunk, replicate_label
from wkvlab.sweep.spec import SweepSpec
from wkvlab.weights.spec import WeightSpec

ID_VERSION = 1  # bump when the same config would produce different numbers (a metric's definition changed)
# --dry-run prices a model whose files do not give its size (a planner inventory failed) as SmolLM2-135M
DEFAULT_PARAMETERS = 134_515_008


def canonical_json(data) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def model_vocab_size(model: str) -> int:
    """The model's vocabulary size, read from its config or GGUF header without loading weights (0 if unknown)."""
    from wkvlab.models.packaged import canonical_name, packaged_gguf

    from wkvlab.models.facts import gguf_array_length
    from wkvlab.models.hub import cached_snapshot, is_hub_id

    packaged = canonical_name(model)
    path = packaged_gguf(packaged) if packaged is not None else (cached_snapshot(model) if is_hub_id(model) else None) or Path(model).expanduser()
    try:
        if path.is_file():
            return gguf_array_length(path, "tokenizer.ggml.tokens") or 0
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        return int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or 0)
    except (OSError, ValueError, KeyError, EOFError):
        return 0


def model_fingerprint(model: str) -> str:
    """The fingerprint :func:`load_model` will report, without loading the model."""
    # The private helpers are load_model's own, so an id computed here always equals the one
    # computed from the loaded model (the executor checks that they agree).
    from wkvlab.models.loading import _folder_fingerprint, _sha256
    from wkvlab.models.packaged import canonical_name, packaged_gguf

    packaged = canonical_name(model)
    if packaged is not None:
        return _sha256(packaged_gguf(packaged))
    from wkvlab.models.hub import is_hub_id, resolve_hub_model

    path = resolve_hub_model(model) if is_hub_id(model) else Path(model).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _sha256(path)
    if path.is_dir() and (path / "config.json").is_file():
        return _folder_fingerprint(path)
    raise ModelError(f"model not found: {model!r}; use 'default', 'gemma3-270m', a .gguf file or a Hugging Face model folder")


# Spec fields added after ids were first handed out, with their defaults: a config that leaves them
# at the default hashes as it did before they existed, so stored results keep their ids.
KV_FIELDS_SINCE_V1 = {"k_residual": 0, "k_window": 0, "v_residual": 0, "v_window": 0, "pastonly": False}
WEIGHT_FIELDS_SINCE_V1 = {"checkpoint": None}


def _without_defaults(spec: dict, newer: dict) -> dict:
    return {k: v for k, v in spec.items() if not (k in newer and v == newer[k])}


@dataclass(frozen=True)
class SweepConfig:
    """One point of a sweep: enough to run it anywhere and to recognise it in a store."""

    model: str
    model_sha256: str
    data: str
    data_sha256: str
    ctx: int
    tokens: int
    score: str
    stride: int | None
    weights: dict
    kv: dict
    calibration: dict | None  # None unless the weight or KV config reads calibration text
    dtype: str = "float32"  # the reference's precision (resolved: never "auto")
    device: str = "cpu"  # where it runs (resolved); not part of the identity
    chunk: int = 0  # queries per prefill chunk (0: automatic); not part of the identity
    vocab: int = 0  # the model's vocabulary, for the automatic chunk (progress counts chunks)
    reference: str | None = None  # folder of stored references; None: the reference in memory
    windows: str = ""  # how the text is cut beyond its sha (wkvlab.data.window_layout); "": one stream
    replicate: int = 0  # r ≥ 1: measured again (the r-th calibration sample, ``chunk`` halved r times); 0: the measurement
    config_id: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config_id", hashlib.sha256(canonical_json(self.identity()).encode()).hexdigest())

    def identity(self) -> dict:
        """What the id hashes: the inputs of the numbers, not their names."""
        identity = {
            "id_version": ID_VERSION, "dtype": self.dtype, "model_sha256": self.model_sha256, "data_sha256": self.data_sha256,
            "ctx": self.ctx, "tokens": self.tokens, "score": self.score, "stride": self.stride,
            "weights": _without_defaults({**self.weights, "label": None}, WEIGHT_FIELDS_SINCE_V1),
            "kv": _without_defaults({**self.kv, "name": None}, KV_FIELDS_SINCE_V1), "calibration": self.calibration,
        }
        if self.reference is not None:  # KLD against a stored reference is an estimate: another measurement
            identity["kld"] = "stored-reference"
        if self.windows:  # windows spread across documents score other tokens than the stream did
            identity["windows"] = self.windows
        if self.replicate:  # another measurement of the same config: its calibration sample and float order are its inputs
            identity["replicate"] = {"index": self.replicate, "chunk": self.chunk,
                                     "calibration_sample": self.replicate if self.calibration is not None else None}
        return identity

    def reference_file(self) -> Path | None:
        """The stored reference of this config's group of windows (in the sweep's reference folder)."""
        if self.reference is None:
            return None
        key = hashlib.sha256(canonical_json([self.model_sha256, self.data_sha256, self.ctx, self.tokens, self.score,
                                             self.stride, self.dtype] + ([self.windows] if self.windows else [])).encode()).hexdigest()[:16]
        return Path(self.reference).expanduser() / f"reference-{key}.safetensors"

    @property
    def group(self) -> tuple:
        """Configs with the same group share windows and the reference pass."""
        return (self.model, self.model_sha256, self.data, self.data_sha256, self.ctx, self.tokens, self.score, self.stride,
                self.dtype, self.device, self.reference)

    @property
    def label(self) -> str:
        return (f"{self.model} {self.data} ctx {self.ctx} × {self.tokens}: {self.weight_spec.label} × {self.kv_spec.label}"
                f"{replicate_label(self.replicate, self.chunk)}")

    @property
    def weight_spec(self) -> WeightSpec:
        return WeightSpec.from_dict(self.weights)

    @property
    def kv_spec(self) -> KVSpec:
        return KVSpec.from_dict(self.kv)

    def to_dict(self) -> dict:
        return {**{k: v for k, v in self.__dict__.items()}, "identity": self.identity()}

    @classmethod
    def from_dict(cls, data: dict) -> "SweepConfig":
        data = {k: v for k, v in data.items() if k not in ("identity", "config_id")}
        return cls(**data)


def replicate_chunk_for(spec: SweepSpec, vocab: int, ctx: int) -> int:
    """The chunk replicate ``spec.replicate`` runs windows of ``ctx`` with: the measurement's own (``chunk``, or the
    automatic chunk of the spec's caches, as the runner chooses it) halved that many times within their token groups
    (:func:`wkvlab.stats.replicates.replicate_chunk`). Fixed by the spec, not by which configs are still missing,
    so a resumed replicate runs with the chunk its config ids name."""
    multiple = math.lcm(*(token_group_multiple(k) for k in spec.kv))
    base = min(spec.chunk or auto_chunk(vocab or 32000, ctx, list(spec.kv)), ctx)
    return replicate_chunk(base, spec.replicate, multiple)


def expand(spec: SweepSpec) -> list[SweepConfig]:
    """Every config of the spec, in axis order (model, data, ctx, tokens, score, weights, kv), without duplicates."""
    for ctx in spec.ctx:
        for tokens in spec.tokens:
            if tokens < ctx:
                raise ConfigError(f"sweep spec: tokens {tokens} is less than one window of ctx {ctx}; ask for at least {ctx} tokens")
    from wkvlab.models.loading import resolve_device, resolve_dtype

    models = {m: model_fingerprint(m) for m in spec.models}
    vocab = {m: model_vocab_size(m) for m in spec.models}
    corpora = {d: load_corpus(d) for d in spec.data}
    texts = {d: c.sha256 for d, c in corpora.items()}
    device = resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    chunks = {(m, ctx): replicate_chunk_for(spec, vocab[m], ctx) if spec.replicate else spec.chunk or 0 for m in spec.models for ctx in spec.ctx}
    configs: dict[str, SweepConfig] = {}
    for model in spec.models:
        for data in spec.data:
            for ctx in spec.ctx:
                for tokens in spec.tokens:
                    for score in spec.score:
                        for w in spec.weights:
                            for kv in spec.kv:
                                calib = spec.calibration.to_dict() if (w.needs_calibration or kv.needs_calibration) else None
                                config = SweepConfig(model, models[model], data, texts[data], ctx, tokens, score, spec.stride,
                                                     w.to_dict(), kv.to_dict(), calib, dtype=dtype, device=device,
                                                     chunk=chunks[(model, ctx)], vocab=vocab[model], reference=spec.reference,
                                                     windows=window_layout(corpora[data], spec.stride), replicate=spec.replicate)
                                configs.setdefault(config.config_id, config)
    return list(configs.values())


@dataclass(frozen=True)
class GridTask:
    """One grid: weight configs × KV configs on one group's windows. Configs in grid order
    (weight-major, as :func:`wkvlab.eval.runner.run_grid` returns its results). JSON-able, so an
    executor can ship it to another process or machine."""

    configs: tuple[SweepConfig, ...]

    @property
    def first(self) -> SweepConfig:
        return self.configs[0]

    @property
    def weights(self) -> list[dict]:
        return list({canonical_json(c.weights): c.weights for c in self.configs}.values())

    @property
    def kv(self) -> list[dict]:
        return list({canonical_json(c.kv): c.kv for c in self.configs}.values())

    @property
    def calibration(self) -> dict | None:
        return next((c.calibration for c in self.configs if c.calibration is not None), None)

    @property
    def grid(self) -> tuple[list[WeightSpec], list[KVSpec]]:
        """(weight specs, KV specs): what the progress ETA times apart (wkvlab.display.grids_classes)."""
        return [WeightSpec.from_dict(w) for w in self.weights], [KVSpec.from_dict(k) for k in self.kv]

    @property
    def n_windows(self) -> int:
        return max(1, self.first.tokens // self.first.ctx)  # what make_windows cuts when the text is long enough

    @property
    def steps(self) -> int:
        """Progress steps the runner will report for this grid."""
        first = self.first
        kv_calibrated = any(KVSpec.from_dict(k).needs_calibration for k in self.kv)
        # the runner's automatic chunk needs only the vocabulary size and the grid's token groups
        chunk = first.chunk or auto_chunk(first.vocab or 32000, first.ctx, [KVSpec.from_dict(k) for k in self.kv])
        reference_runs = first.reference is None or not first.reference_file().exists()
        return grid_steps(SimpleNamespace(n_windows=self.n_windows, ctx=first.ctx), len(self.weights), len(self.kv), kv_calibrated,
                          chunk, reference_pass=reference_runs)

    def to_dict(self) -> dict:
        return {"configs": [c.to_dict() for c in self.configs]}

    @classmethod
    def from_dict(cls, data: dict) -> "GridTask":
        return cls(tuple(SweepConfig.from_dict(c) for c in data["configs"]))


def make_tasks(configs: list[SweepConfig], done: set[str] | frozenset[str] = frozenset(), grid: str = "group") -> list[GridTask]:
    """Grids covering exactly the configs not in ``done``; each grid a full weights × KV rectangle."""
    groups: dict[tuple, dict[str, list[SweepConfig]]] = {}
    for c in configs:
        if c.config_id not in done:
            groups.setdefault(c.group, {}).setdefault(canonical_json(c.weights), []).append(c)
    tasks = []
    for by_weight in groups.values():
        if grid == "weight":
            tasks.extend(GridTask(tuple(cells)) for cells in by_weight.values())
            continue
        # weights whose missing KV configs are the same set form one rectangle
        rectangles: dict[tuple[str, ...], list[SweepConfig]] = {}
        for cells in by_weight.values():
            rectangles.setdefault(tuple(canonical_json(c.kv) for c in cells), []).extend(cells)
        tasks.extend(GridTask(tuple(cells)) for cells in rectangles.values())
    return tasks


def model_parameters(model: str) -> int:
    """The model's parameter count from its files (the planner's inventory: no torch); 0 when they cannot tell."""
    from wkvlab.errors import WkvlabError
    from wkvlab.plan import parameter_count, resolve_source

    try:
        return parameter_count(resolve_source(model)[0])
    except (WkvlabError, OSError, ValueError, KeyError):
        return 0


def task_work(tasks: list[GridTask]) -> dict[str, "WorkItems"]:
    """What the tasks do, per model fingerprint, in the classes of the cost model (wkvlab.costs), which are the
    ETA's (display.grids_classes): window passes and their tokens, weight builds by class, KV calibrations, and
    each model load — a GGUF not yet in the cache is converted first (models/cache_writes.py tells)."""
    from wkvlab.costs import WorkItems
    from wkvlab.display import grids_classes
    from wkvlab.models.cache_writes import copy_pending

    work: dict[str, dict] = {}
    loaded = None
    for task in tasks:
        first = task.first
        item = work.setdefault(first.model_sha256, {"pass_tokens": 0, "builds": {}, "kv_calibrations": 0, "conversions": 0, "loads": 0})
        reference = first.reference is None or not first.reference_file().exists()
        item["pass_tokens"] += task.n_windows * first.ctx * (len(task.configs) + reference)
        pairs, calibrations = grids_classes([task.grid])
        for _, kind in pairs:
            item["builds"][kind] = item["builds"].get(kind, 0) + 1
        item["kv_calibrations"] += calibrations
        key = (first.model, first.model_sha256, first.device, first.dtype)
        if key != loaded:  # the executor loads a model when the task's differs from the one before (sweep.executor)
            first_load = not item["conversions"] and not item["loads"] and copy_pending(first.model, first.dtype)
            item["conversions" if first_load else "loads"] += 1
            loaded = key
    return {fp: WorkItems(i["pass_tokens"], tuple(sorted(i["builds"].items())), i["kv_calibrations"], i["conversions"], i["loads"])
            for fp, i in work.items()}


def estimate_tasks(tasks: list[GridTask], seconds_per_token: dict[str, float | None]) -> "Estimate | None":
    """The cost model's estimate (wkvlab.costs) of every task: passes, builds, KV calibrations and loading, each
    model's priors scaled by its measured seconds per token when the store has some, else by the load now;
    None when nothing runs."""
    from wkvlab.costs import Estimate, estimate

    from wkvlab.threads import available_cores, busy_cores

    if not tasks:
        return None
    names = {t.first.model_sha256: t.first.model for t in tasks}
    load, cores = busy_cores(), available_cores()
    parts = [estimate(work, model_parameters(names[fp]) or DEFAULT_PARAMETERS, seconds_per_token.get(fp), load, cores)
             for fp, work in task_work(tasks).items()]
    bases = sorted({p.basis for p in parts})
    return Estimate(sum(p.passes for p in parts), sum(p.builds for p in parts), sum(p.kv_calibrations for p in parts),
                    sum(p.loading for p in parts), "; ".join(bases))
