"""The user's own measurements, as the planner's quality column.

Read from ``wkvlab eval --json`` / ``wkvlab demo --json`` files (one ``EvalResult.to_dict()`` or a
list of them) and from sweep stores (``wkvlab sweep --store``). A measurement applies to a plan row
when its weight and KV specs are the row's (compared as parsed configurations, not as strings) and
it was made on the planned model — or, labelled as a transfer, on a smaller model of the same
family (``SmolLM2-135M`` for ``SmolLM2-1.7B``): small models usually lose more to quantization than
large ones, so a transfer is a pessimistic stand-in.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from wkvlab.errors import DataError, WkvlabError
from wkvlab.kv.spec import KVSpec
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.models import ModelDescription
from wkvlab.weights.spec import WeightSpec

@dataclass(frozen=True)
class UnitValues(JsonMixin):
    """A measurement's per-unit values (documents where the text has them, windows otherwise): what a
    decision on its mean needs (:mod:`wkvlab.stats.tolerance`), without the per-token arrays."""

    unit: str  # documents | windows
    tokens: tuple[int, ...]  # tokens scored in each unit
    kld: tuple[float, ...]  # mean KLD of each unit (nats/token)
    top1: tuple[float, ...] = ()  # top-1 agreement of each unit (empty when not recorded)
    # the same config measured again on the same units (replicates 1, 2, … of a store; wkvlab.sweep.plan): every
    # decision pools them with these values (:meth:`resampled`), so the run-to-run variance is inside its interval
    replicates: tuple["UnitValues", ...] = ()

    @classmethod
    def from_arrays(cls, kld, top1, units) -> "UnitValues":
        """Per-unit means of per-token ``kld`` and ``top1`` agreement over ``units`` (labels or :class:`~wkvlab.stats.Units`)."""
        from wkvlab.eval.result import unit_means

        return cls.from_record(unit_means(kld, top1, units))

    @classmethod
    def from_record(cls, data: dict) -> "UnitValues":
        """From the ``units`` entry of an ``EvalResult.to_dict()`` (:func:`wkvlab.eval.result.unit_means`)."""
        tokens, kld, top1 = (tuple(data[k]) for k in ("tokens", "kld", "top1"))
        if not tokens or len(kld) != len(tokens) or (top1 and len(top1) != len(tokens)):
            raise ValueError(f"{len(tokens)} unit token counts, {len(kld)} KLD means, {len(top1)} top-1 means")
        return cls(str(data["unit"]), tuple(int(t) for t in tokens), tuple(float(x) for x in kld), tuple(float(x) for x in top1))

    def per_token(self, metric: str):
        """(per-token values, unit labels) whose token-weighted means are this run's (replicate 0's when it holds
        replicates: decisions pool them through :meth:`resampled`): ``kld``, or ``top1_loss`` (1 − agreement), the
        scale a tolerance is tested on."""
        import numpy as np

        from wkvlab.stats.bootstrap import Units

        means = np.asarray(self.kld if metric == "kld" else [1.0 - a for a in self.top1], dtype=np.float64)
        counts = np.asarray(self.tokens)
        return np.repeat(means, counts), Units(np.repeat(np.arange(counts.size), counts), self.unit)

    @property
    def runs(self) -> tuple["UnitValues", ...]:
        """The measurement and each replicate, one run each."""
        return (replace(self, replicates=()), *self.replicates)

    def pairs_with(self, other: "UnitValues") -> bool:
        """Whether a paired difference with ``other`` is defined: the same units and as many runs (replicate r with r)."""
        return (self.unit, self.tokens, len(self.replicates)) == (other.unit, other.tokens, len(other.replicates))

    def resampled(self, metric: str, minus: "UnitValues | None" = None):
        """The token-weighted mean of ``metric`` (minus ``minus``'s, paired per unit and per replicate: :meth:`pairs_with`)
        as a :class:`~wkvlab.stats.bootstrap.Resampled`, pooled over the replicates by the findings' rule
        (:func:`wkvlab.stats.bootstrap.pool`): one run is the units' interval, several hold the run-to-run variance too."""
        from wkvlab.stats.bootstrap import pool, resample

        if minus is not None and not self.pairs_with(minus):
            raise ValueError("paired differences need the same units and replicates")
        each = []
        for i, run in enumerate(self.runs):
            values, units = run.per_token(metric)
            if minus is not None:
                values = values - minus.runs[i].per_token(metric)[0]
            each.append(resample(lambda m: m["x"], {"x": values}, units))
        return pool(each)


_SIZE = re.compile(r"(\d+(?:\.\d+)?)([mbk])")
_NOISE = {"instruct", "chat", "it", "base", "hf", "gguf", "meta", "fp16", "bf16", "fp32", "awq", "gptq", "int4", "int8", "fp8"}
_QUANT_TAG = re.compile(r"(i?q\d(_\w+)?|[qf]\d+|w\d+a\d+.*|\d+bit|g\d+)")


@dataclass(frozen=True)
class Measurement(JsonMixin):
    model: str
    data: str
    ctx: int
    tokens: int
    weights: str
    kv: str
    kld: float
    se: float
    origin: str  # file or store (and config id) it came from
    weights_spec: dict
    kv_spec: dict
    top1: float | None = None  # top-1 agreement with the 16-bit model (None: not recorded)
    low: float | None = None  # 95% interval of the mean KLD (paired bootstrap over windows), when computed
    high: float | None = None
    kind: str = "results"  # results (an eval --json file) | store (a sweep store) | probe (plan --probe)
    units: UnitValues | None = None  # per-unit values (the probe keeps them): what plan --tolerance decides on
    replicates: int = 1  # runs pooled into it (a store's replicates of one config, :func:`pool_replicates`)
    note: str = ""  # what the label adds (a replicate used alone, and why)

    def describe(self) -> str:
        if self.kind == "probe":
            return f"probe, {self.tokens:,} tokens"
        runs = f"{self.replicates} replicates × " if self.replicates > 1 else ""
        return f"{runs}{self.tokens:,} tokens, ctx {self.ctx}, {self.data}" + (f"; {self.note}" if self.note else "")


def family_and_size(name: str) -> tuple[str, float | None]:
    """``"Meta-Llama-3-70B"`` -> ("llama-3", 7e10); ``"SmolLM2-135M-Instruct.Q4_1"`` -> ("smollm2", 1.35e8)."""
    base = name.strip().rstrip("/").split("/")[-1].lower()
    base = re.sub(r"\.gguf$", "", base)
    base = re.sub(r"[.-](i?q\d\w*|f16|bf16|f32)$", "", base)  # a GGUF file's type suffix (.Q4_1, -q4_k_m)
    words = [w for w in re.split(r"[-\s]+", base) if w]
    size: float | None = None
    family = []
    i = 0
    while i < len(words):
        word = words[i]
        m = _SIZE.fullmatch(word)
        if re.fullmatch(r"\d+x\d+(\.\d+)?[mb]", word):  # Mixtral 8x7b
            n, rest = word.split("x", 1)
            size = float(n) * float(rest[:-1]) * (1e9 if rest.endswith("b") else 1e6)
        elif re.fullmatch(r"a\d+(\.\d+)?b", word):  # active parameters of a MoE
            pass
        elif m and size is None:
            size = float(m.group(1)) * {"m": 1e6, "b": 1e9, "k": 1e3}[m.group(2)]
        elif word in _NOISE or _QUANT_TAG.fullmatch(word) and family:
            pass
        else:
            family.append(word)
        i += 1
    return "-".join(family), size


def _from_dict(data: dict, origin: str) -> Measurement:
    try:
        kld = data["kld"]
        units = UnitValues.from_record(data["units"]) if data.get("units") else None  # absent from JSON written before 2026-12
        return Measurement(model=str(data["model"]), data=str(data["data"]), ctx=int(data["ctx"]), tokens=int(data["tokens"]),
                           weights=str(data["weights"]), kv=str(data["kv"]), kld=float(kld["mean"]), se=float(kld.get("se") or 0.0),
                           origin=origin, weights_spec=dict(data["weights_spec"]), kv_spec=dict(data["kv_spec"]),
                           top1=None if data.get("top1_agreement") is None else float(data["top1_agreement"]), units=units)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{origin} is not a wkvlab result ({type(exc).__name__}: {exc}); pass the JSON of 'wkvlab eval --json'") from None


def load_results(path: str | Path) -> list[Measurement]:
    """Measurements in a ``wkvlab eval --json`` file (one result or a list)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"results file {path} does not exist; write one with 'wkvlab eval ... --json {path}'")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path} is not readable JSON ({type(exc).__name__}); pass the file 'wkvlab eval --json' wrote") from None
    items = raw if isinstance(raw, list) else [raw]
    return [_from_dict(item, f"{path}[{i}]" if isinstance(raw, list) else str(path)) for i, item in enumerate(items)]


def load_store(path: str | Path) -> list[Measurement]:
    """Measurements in a sweep store: summary columns and configs, and per-unit values from the stored per-token arrays."""
    from wkvlab.store import open_store  # sqlite and the store's schema: only when a store is given

    path = Path(path)
    if not path.exists():
        raise DataError(f"results store {path} does not exist; run 'wkvlab sweep spec.yaml --store {path}' first")
    configs: dict[str, list[tuple[int, Measurement]]] = {}  # one config's runs: the measurement and its replicates
    with open_store(path, create=False) as db:
        for row in db.rows():
            config = db.config(row.config_id)
            try:  # the per-token arrays, reduced to per-unit values for plan --tolerance
                arrays = db.get(row.config_id).arrays
                units = UnitValues.from_arrays(arrays.kld, arrays.top1_agree, arrays.units)
            except DataError:  # a row without its arrays: readable, but undecided under a tolerance
                units = None
            measured = Measurement(model=row.model, data=row.data, ctx=row.ctx, tokens=row.tokens, weights=row.weights, kv=row.kv,
                                   kld=float(row.kld_mean), se=float(row.kld_se or 0.0), origin=f"{path}#{row.config_id[:12]}",
                                   weights_spec=dict(config["weights"]), kv_spec=dict(config["kv"]),
                                   top1=None if row.top1 is None else float(row.top1), kind="store",
                                   units=units)
            configs.setdefault(_config_key(row.config_id, config), []).append((row.replicate, measured))
    return [pool_replicates(runs) for runs in configs.values()]


def _config_key(config_id: str, config: dict) -> str:
    """What a replicate shares with its measurement: the stored config's identity without its ``replicate`` entry
    (:meth:`wkvlab.sweep.plan.SweepConfig.identity`); a config stored without one is its own."""
    identity = config.get("identity")
    if not isinstance(identity, dict):
        return config_id
    return json.dumps({k: v for k, v in identity.items() if k != "replicate"}, sort_keys=True)


def pool_replicates(runs: list[tuple[int, Measurement]]) -> Measurement:
    """One config's stored runs ((replicate, measurement) pairs) as one measurement: the replicates' mean KLD with the
    run-to-run variance inside its se and 95% interval — the findings' rule (:meth:`UnitValues.resampled`). Runs without
    per-unit values cannot be pooled: the measurement (replicate 0, else the first) stands alone and its label says so."""
    runs = sorted(runs, key=lambda run: run[0])
    first = runs[0][1]
    if len(runs) == 1:
        return first if runs[0][0] == 0 else replace(first, note=f"replicate {runs[0][0]} alone")
    units = [m.units for _, m in runs]
    if any(u is None or (u.unit, u.tokens) != (units[0].unit, units[0].tokens) for u in units):
        return replace(first, note=f"replicate {runs[0][0]} alone: its {len(runs) - 1} other replicate(s) kept no per-unit "
                                   "values on the same units to pool")
    pooled = replace(units[0], replicates=tuple(units[1:]))
    kld = pooled.resampled("kld")
    interval = kld.interval(0.95)
    top1 = 1.0 - pooled.resampled("top1_loss").estimate if all(u.top1 for u in units) else first.top1
    return replace(first, kld=kld.estimate, se=kld.se, top1=top1, low=interval.low if interval.decided else None,
                   high=interval.high if interval.decided else None, units=pooled, replicates=len(runs),
                   origin=first.origin + "".join(f"+{m.origin.rsplit('#', 1)[-1]}" for _, m in runs[1:]))


def load_measurements(results: Iterable[str | Path] = (), stores: Iterable[str | Path] = ()) -> list[Measurement]:
    out: list[Measurement] = []
    for path in results:
        out += load_results(path)
    for path in stores:
        out += load_store(path)
    return out


def spec_key(weights: WeightSpec, kv: KVSpec) -> tuple:
    """What makes two measurements the same configuration: the specs without their display names."""
    return (json.dumps(replace(weights, label="").to_dict(), sort_keys=True),
            json.dumps(replace(kv, name="").to_dict(), sort_keys=True))


@dataclass(frozen=True)
class MeasuredQuality(JsonMixin):
    kld: float
    se: float
    kind: str  # measured | transfer
    label: str  # "measured (4,088 tokens, ctx 512, default)" / "measured (probe, 2,016 tokens)" / "transfer from ..."
    origin: str
    top1: float | None = None
    low: float | None = None  # 95% interval of the mean KLD, when the measurement has one
    high: float | None = None
    units: UnitValues | None = None  # per-unit values, when the measurement kept them (the probe's do)


def model_spec_key(weights: WeightSpec, kv: KVSpec, model: ModelDescription) -> tuple:
    """:func:`spec_key` with names mapped the way the plan's rows (and the engines) store them: ``none``
    weights are the checkpoint in its own 16-bit dtype (the plan's ``bf16`` row of a bf16 model), and
    the ``fp16`` cache is the engine's 16-bit cache (the row shown as the model's dtype). A plain
    ``q8_0`` cache stays its own row: llama.cpp's ``-ctk q8_0`` without its rotation
    (``LLAMA_ATTN_ROT_DISABLE=1``), not the ``llamacpp:q8_0`` preset."""
    from wkvlab.plan.weights import as_weight_spec

    return spec_key(as_weight_spec(weights, model), kv)


def index_measurements(measurements: list[Measurement], model: ModelDescription,
                       aliases: tuple[str, ...] = ()) -> tuple[dict[tuple, MeasuredQuality], list[str]]:
    """The measurements that apply to ``model`` (its name, Hub id or ``aliases``), by spec key (most tokens
    first), and notes on the rest."""
    names = {_norm(model.name), _norm(model.hf_id), *(_norm(a) for a in aliases)} - {""}
    family, size = family_and_size(model.hf_id or model.name)
    if not family:
        family, size = family_and_size(model.name)
    own: dict[tuple, Measurement] = {}
    proxy: dict[tuple, Measurement] = {}
    ignored: dict[str, str] = {}
    for m in measurements:
        try:
            key = model_spec_key(WeightSpec.from_dict(m.weights_spec), KVSpec.from_dict(m.kv_spec), model)
        except WkvlabError as exc:
            ignored[m.origin] = f"its specs do not parse ({exc})"
            continue
        if _norm(m.model) in names:
            target = own
        else:
            m_family, m_size = family_and_size(m.model)
            if m_family and m_family == family and m_size is not None and size is not None and m_size < size:
                target = proxy
            else:
                ignored[m.model] = ("a model of another family" if m_family != family else "not smaller than the planned model"
                                    if m_size and size else "its size is unknown")
                continue
        best = target.get(key)
        # the user's own runs win over the probe's; among equals, the one with more tokens, then more replicates
        if best is None or (m.kind != "probe", m.tokens, m.replicates) > (best.kind != "probe", best.tokens, best.replicates):
            target[key] = m
    out = {key: MeasuredQuality(m.kld, m.se, "measured", f"measured ({m.describe()})", m.origin, m.top1, m.low, m.high,
                                 m.units)
           for key, m in own.items()}
    for key, m in proxy.items():
        out.setdefault(key, MeasuredQuality(m.kld, m.se, "transfer", f"transfer from {m.model} ({m.describe()})", m.origin, m.top1,
                                            m.low, m.high, m.units))
    notes = [f"measurements on {name} not used for {model.name}: {why}" for name, why in ignored.items()]
    return out, notes


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", (text or "").lower().rsplit("/", 1)[-1])
