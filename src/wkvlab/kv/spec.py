"""The KV-cache configuration as data: formats, which tokens and layers they apply to, rotation.

String form (what ``--kv`` accepts)::

    <K format>[/<V format>][+option]...      e.g.  int4   q8_0/q4_0   q4_0+rot   int4+sinks=4+skip=0,29
    <preset>[+option]...                     e.g.  llamacpp:q4_0   vllm:fp8_e4m3   exl3:k4v4+sinks=1   K8V4
    <engine>@<release>:<dtype>[+option]...   e.g.  vllm@0.23:int8_per_token_head   sglang@0.5.20:fp4_e2m1+recipe=nvfp4-sm100
    @spec.yaml | @spec.json                  a file holding ``KVSpec.to_dict()``

Options follow ``+`` (``;`` is read as an alias). ``<layers>=<K>[/<V>]`` gives listed layers their
own formats: ``int4+0-3,76-79=int8`` keeps layers 0-3 and 76-79 at int8 — the string form of
:attr:`KVSpec.layers`, which :meth:`KVSpec.canonical` writes, so every spec reads back from its text.

Options: ``rot`` / ``rot=<block>`` / ``rot=full`` (Hadamard rotation of Q/K/V along head_dim:
llama.cpp's rule — K in blocks of the largest power of two ≥ 64 dividing head_dim, V in blocks of
64, none when head_dim is not a multiple of 64 —, in blocks of ``<block>``, or over the whole
head_dim; see :meth:`KVSpec.rotation_blocks`), ``norot``, ``sinks=<N>`` (first N
positions kept at model precision), ``residual=<R>`` (KIVI/HF QuantizedCache: full-precision
tokens accumulate and are quantized all at once when R have piled up), ``window=<W>`` (SKVQ: the W
most recent tokens of every query kept at model precision), ``k_residual=``, ``k_window=``,
``v_residual=``, ``v_window=`` (the same for one side only: KIVI flushes keys and slides values;
see :mod:`wkvlab.kv.tokens`), ``prefill=<L>`` (with ``residual``: transformers' ``QuantizedCache``
after an L-token prompt, which attends unquantized while the cache quantizes it), ``pastonly`` (WKVQuant: the current token attends to its own K/V at
model precision), ``skip=<i,j,...|sliding_window>`` (layers kept at model precision, as vLLM's
``--kv-cache-dtype-skip-layers``), ``q=<fp8_e4m3|q8_0|q8_0-x86>`` (queries quantized too, where K is;
``q=fp16``: rounded to fp16 where K or V is quantized, llama.cpp's conversion for an f16 K),
``sinks=auto`` / ``sinkratio=<τ>`` (KVSink: tokens whose residual-stream activation peak exceeds τ
times the layer's calibrated median — 8 for ``auto`` — stay at model precision, wherever they are),
``smooth[=α]`` (QServe's SmoothAttention, α = 0.5 by default; calibrated), ``scales=amax448``
/ ``scales=amax448-head`` (calibrated FP8 scales amax/448 per layer or per KV head, the checkpoint
convention of llm-compressor (compressed-tensors ``calculate_qparams``); ``tensor``/``head`` are older names for them) and
``scales=calculate`` (vLLM's ``--calculate-kv-scales``: amax/200 for K and Q, amax/100 for V on
the first batch) instead of vLLM's default 1.0, ``prerope``
(keys quantized before RoPE, RoPE re-applied after dequantization), ``outliers=<f>`` (a fraction
of values kept in fp16, KVQuant's dense-and-sparse), ``recipe=<mxfp4|blockfp4|nvfp4|nvfp4-sm100>``
(SGLang's FP4 recipe for an ``fp4_e2m1`` cache — older main's ``--fp4-kv-cache-recipe``, SGLang
0.5.20+'s ``--kv-cache-dtype fp4_mx_block16 | nvfp4``: mxfp4/blockfp4 keep ``fp4_e2m1``, nvfp4
``nvfp4``, nvfp4-sm100 ``nvfp4-sm100`` (k_scale 6) up to SGLang 0.5.20 and ``nvfp4`` from 0.5.21,
the release's ``kv_formats``: the cache as SGLang's decode reads it; see
:data:`wkvlab.kv.formats.FP4_KV_RECIPES`).

Engine presets name a release after ``@`` (``vllm@0.23:int8_per_token_head``; without one, the newest
the table models: :mod:`wkvlab.engine_releases`). ``scales=calculate`` on a vLLM preset needs a release
with ``--calculate-kv-scales`` (0.27 and older).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from wkvlab.errors import ConfigError
from wkvlab.specio import reject_unknown_fields
from wkvlab.kv.formats import FP4_KV_RECIPES, KVFormat, get_kv_format
from wkvlab.kv.tokens import TokenPolicy, side_policy

# fp16: llama.cpp's Q conversion for an f16 K (vec_dot_type of f16); q8_0-x86: its x86 q8_0 writer
Q_FORMATS = ("none", "fp8_e4m3", "q8_0", "q8_0-x86", "fp16")
# FP8 KV scales: 1.0; amax/448 per layer or per layer and KV head (checkpoint convention); vLLM's runtime rule
SCALES = ("static", "amax448", "amax448-head", "calculate")
_SCALE_ALIASES = {"tensor": "amax448", "head": "amax448-head", "calc": "calculate"}
SLIDING = "sliding_window"
# KVSink-style detection: a token whose residual-stream peak exceeds this many times the calibrated
# median peak of its layer is a sink. Measured on the packaged models (docs/kv.md): sinks stand at
# 10-40x the median, ordinary tokens below 3x.
AUTO_SINK_RATIO = 8.0


def _format_name(name: str) -> str:
    return get_kv_format(name).name


@dataclass(frozen=True)
class KVSpec:
    """How the cache stores keys and values, and where quantization applies.

    ``rotate``: 0 = no rotation; B > 0 = orthonormal Hadamard in blocks of B along head_dim applied
    to Q and K (when K is quantized) and to V with its inverse on the output (when V is quantized);
    scores and outputs are unchanged without quantization. ``-1`` = one block of head_dim;
    ``-2`` = llama.cpp's rule (:meth:`rotation_blocks`).
    ``layers``: per-layer overrides as ``((layer, k, v), ...)`` — a tuple so the spec stays hashable.
    ``residual``/``window`` apply to keys and values; ``k_*``/``v_*`` to one side. They are stored
    normalized: equal sides as the shared fields, different sides as the ``k_*``/``v_*`` fields.
    """

    k: str = "fp16"
    v: str = "fp16"
    rotate: int = 0
    sinks: int = 0
    residual: int = 0
    window: int = 0
    skip: tuple = ()
    layers: tuple = ()
    q: str = "none"
    smooth: float = 0.0
    scales: str = "static"
    prerope: bool = False
    outliers: float = 0.0
    sink_ratio: float = 0.0
    k_residual: int = 0
    k_window: int = 0
    v_residual: int = 0
    v_window: int = 0
    pastonly: bool = False
    prefill: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", _format_name(self.k))
        object.__setattr__(self, "v", _format_name(self.v))
        skip = tuple(sorted({s for s in self.skip if s != SLIDING}) + ([SLIDING] if SLIDING in self.skip else []))
        for item in skip:
            if item != SLIDING and (not isinstance(item, int) or item < 0):
                raise ConfigError(f"skip entries are layer indices or '{SLIDING}', got {item!r}")
        object.__setattr__(self, "skip", skip)
        layers = tuple(sorted((int(i), _format_name(k), _format_name(v)) for i, k, v in self.layers))
        object.__setattr__(self, "layers", layers)
        for what in ("sinks", "residual", "window", "k_residual", "k_window", "v_residual", "v_window", "prefill"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{what} must be a non-negative integer, got {value!r}")
        if not isinstance(self.rotate, int) or self.rotate < -2 or (self.rotate > 0 and self.rotate & (self.rotate - 1)):
            raise ConfigError(f"rotate must be 0 (off), -1 (whole head_dim), -2 (llama.cpp rule) or a power-of-two block, got {self.rotate!r}")
        self._normalize_token_policies()
        object.__setattr__(self, "pastonly", bool(self.pastonly))
        if self.prefill and not (self._side("k")[0] and self._side("v")[0]):
            raise ConfigError("prefill=L is transformers' QuantizedCache prompt length; it needs residual=R (both sides flushed)")
        for side, names in (("k", {self.k} | {k for _, k, _ in self.layers}), ("v", {self.v} | {v for *_, v in self.layers})):
            residual, window = self._side(side)
            for group in {get_kv_format(n).token_group for n in names} - {None}:
                if window:
                    raise ConfigError("per-channel formats (-c<G>) quantize closed groups of tokens; combine them with residual=, not window=")
                if residual % group:
                    raise ConfigError(f"residual {residual} must be a multiple of the token group {group} (KIVI flushes whole groups)")

        if not isinstance(self.smooth, (int, float)) or not 0 <= self.smooth <= 1:
            raise ConfigError(f"smooth (SmoothAttention's α) must lie in [0, 1], got {self.smooth!r}")
        object.__setattr__(self, "smooth", float(self.smooth))
        if not isinstance(self.outliers, (int, float)) or not 0 <= self.outliers < 0.5:
            raise ConfigError(f"outliers is the fraction kept in fp16, in [0, 0.5); got {self.outliers!r}")
        object.__setattr__(self, "outliers", float(self.outliers))
        if not isinstance(self.sink_ratio, (int, float)) or self.sink_ratio < 0:
            raise ConfigError(f"sink_ratio must be >= 0 (0 = no detected sinks), got {self.sink_ratio!r}")
        object.__setattr__(self, "sink_ratio", float(self.sink_ratio))
        if self.outliers and not any(f.calibrated for f in self.all_formats()):
            raise ConfigError("outliers= applies to KVQuant's non-uniform formats (nuq<b>); use k=nuq<b>-c / v=nuq<b>")
        if self.prerope and self.rotate:
            raise ConfigError("prerope and rot cannot be combined: a Hadamard rotation acts on post-RoPE keys; drop one")
        if any(get_kv_format(k).calibrated for _, k, _ in self.layers) or get_kv_format(self.k).calibrated:
            if not self.prerope:
                raise ConfigError("nuq keys are calibrated before RoPE (KVQuant); add +prerope")
        object.__setattr__(self, "scales", _SCALE_ALIASES.get(self.scales, self.scales))
        if self.scales not in SCALES:
            raise ConfigError(f"unknown FP8 scale mode {self.scales!r}; use one of {', '.join(SCALES)}")
        if self.q not in Q_FORMATS:
            raise ConfigError(f"unknown query format {self.q!r}; use one of {', '.join(Q_FORMATS)}")

    def check_whole_cache(self) -> None:
        """A format that re-quantizes the whole cache (HQQ) needs its side flushed: residual=R, and
        nothing QuantizedCache lacks. Checked once the options are applied (parse, load, check_model):
        ``hqq4`` alone is a valid step on the way to ``hqq4+residual=128``."""
        for side, names in (("k", {self.k} | {k for _, k, _ in self.layers}), ("v", {self.v} | {v for *_, v in self.layers})):
            residual, window = self._side(side)
            whole = sorted(n for n in names if get_kv_format(n).requantizes)
            if whole and (window or not residual or self.pastonly):
                raise ConfigError(f"{whole[0]} quantizes the whole cache at each flush, as transformers' QuantizedCache does; "
                                  "give it residual=R (no window= or pastonly)")
            if whole and (self.sinks or self.sink_ratio or self.prerope):
                raise ConfigError(f"{whole[0]} is transformers' QuantizedCache's HQQ backend, which has no sinks or pre-RoPE keys; drop them")

    def _normalize_token_policies(self) -> None:
        if self.residual and self.window:
            raise ConfigError("use either residual= (flushed in blocks, KIVI) or window= (sliding, SKVQ), not both")
        sides = {}
        for side in ("k", "v"):
            residual, window = getattr(self, f"{side}_residual"), getattr(self, f"{side}_window")
            if residual and window:
                raise ConfigError(f"use either {side}_residual= or {side}_window= for one side, not both")
            sides[side] = (residual, window) if (residual or window) else (self.residual, self.window)
        shared = sides["k"] if sides["k"] == sides["v"] else (0, 0)
        per_side = {"k": (0, 0), "v": (0, 0)} if sides["k"] == sides["v"] else sides
        for name, value in (("residual", shared[0]), ("window", shared[1]), ("k_residual", per_side["k"][0]),
                            ("k_window", per_side["k"][1]), ("v_residual", per_side["v"][0]), ("v_window", per_side["v"][1])):
            object.__setattr__(self, name, value)

    def _side(self, side: str) -> tuple[int, int]:
        """(residual, window) of the keys (``"k"``) or values (``"v"``)."""
        residual, window = getattr(self, f"{side}_residual"), getattr(self, f"{side}_window")
        return (residual, window) if (residual or window) else (self.residual, self.window)

    def token_policies(self, k_fmt: KVFormat, v_fmt: KVFormat) -> tuple[TokenPolicy, TokenPolicy]:
        """The key and value policies of a layer holding these formats (see :mod:`wkvlab.kv.tokens`)."""
        return tuple(  # type: ignore[return-value]
            side_policy(*self._side(side), self.pastonly, fmt.token_group, self.prefill) for side, fmt in (("k", k_fmt), ("v", v_fmt))
        )

    # ---- what applies where -------------------------------------------------------------

    def formats_for(self, layer: int, sliding: bool = False) -> tuple[KVFormat, KVFormat]:
        """K and V formats of one layer (skipped layers stay at model precision)."""
        if layer in self.skip or (sliding and SLIDING in self.skip):
            return get_kv_format("fp16"), get_kv_format("fp16")
        for index, k, v in self.layers:
            if index == layer:
                return get_kv_format(k), get_kv_format(v)
        return get_kv_format(self.k), get_kv_format(self.v)

    @property
    def k_format(self) -> KVFormat:
        return get_kv_format(self.k)

    @property
    def v_format(self) -> KVFormat:
        return get_kv_format(self.v)

    @property
    def is_identity(self) -> bool:
        formats = [(self.k, self.v)] + [(k, v) for _, k, v in self.layers]
        return all(get_kv_format(k).is_identity and get_kv_format(v).is_identity for k, v in formats)

    @property
    def needs_calibration(self) -> bool:
        return bool(self.smooth) or self.scales != "static" or bool(self.sink_ratio) or any(f.calibrated for f in self.all_formats())

    def selection(self):
        """The key-side per-(query, key) selection when it depends on the query, else None (the
        scores' view; :meth:`token_policies` gives both sides of a layer)."""
        groups = [get_kv_format(n).token_group for n in {self.k} | {k for _, k, _ in self.layers}]
        return side_policy(*self._side("k"), self.pastonly, max((g for g in groups if g), default=None), self.prefill).selection()

    def all_formats(self) -> list[KVFormat]:
        names = {self.k, self.v} | {k for _, k, _ in self.layers} | {v for *_, v in self.layers}
        return [get_kv_format(n) for n in sorted(names)]

    def check_model(self, head_dim: int, n_layers: int) -> None:
        """Fail before any work on a spec this model cannot hold."""
        self.check_whole_cache()
        for fmt in self.all_formats():
            fmt.check_head_dim(head_dim)
        for block in self.rotation_blocks(head_dim):
            if block and (head_dim % block or block & (block - 1)):
                raise ConfigError(f"rotation block {block} must be a power of two dividing head_dim {head_dim}; use rot=<a power of two dividing {head_dim}>")
        for index in [i for i in self.skip if i != SLIDING] + [i for i, _, _ in self.layers]:
            if index >= n_layers:
                raise ConfigError(f"layer {index} does not exist: the model has layers 0..{n_layers - 1}")

    def rotation_blocks(self, head_dim: int) -> tuple[int, int]:
        """The Hadamard blocks (K/Q, V) this spec uses on a model with ``head_dim`` (0: none).

        ``rotate=-2`` is llama.cpp's rule (``build_input_k_rot``/``build_input_v_rot`` in
        ``src/llama-kv-cache.cpp``, ggml-org/llama.cpp@0c1e57098 as vendored by llama-cpp-python
        0.3.36): rotation only when head_dim is a multiple of 64; K (and Q) in blocks of the largest
        power of two ≥ 64 dividing head_dim — 64, 128, 256 for head_dim 64, 128, 256 —, V in
        blocks of 64 ("using smaller rotation matrices for V seems beneficial"). llama.cpp also
        requires ``n_embd_head_k_all > 0`` — one head size across the layers of a cache — which
        holds for every model here (one head_dim per model).
        """
        if self.rotate == -2:
            if head_dim % 64:
                return 0, 0
            k_block = 64
            while head_dim % (2 * k_block) == 0:
                k_block *= 2
            return k_block, 64
        block = head_dim if self.rotate == -1 else self.rotate
        return block, block

    # ---- memory -------------------------------------------------------------------------

    def bytes_per_token(self, *, layers: int, kv_heads: int, head_dim: int, sliding: tuple[bool, ...] = (), context: int | None = None) -> float:
        """Average bytes one token occupies across all layers' K and V caches.

        Skipped layers count at 16 bits. Sink tokens and the residual window are held at 16 bits
        too; at a stated ``context`` their extra cost is amortized over it (without one they are
        ignored, i.e. the long-context limit).
        """
        total = 0.0
        for layer in range(layers):
            total += self.layer_bytes_per_token(layer, head_dim=head_dim, sliding=bool(sliding[layer]) if layer < len(sliding) else False,
                                                context=context)
        return total * kv_heads

    def layer_bytes_per_token(self, layer: int, *, head_dim: int, sliding: bool = False, context: int | None = None) -> float:
        """Bytes one token costs in one layer's K and V caches for one KV head (see :meth:`bytes_per_token`)."""
        full = 2.0 * head_dim  # one side of one head at 16 bits
        total = 0.0
        for side, fmt in zip("kv", self.formats_for(layer, sliding)):
            packed = fmt.bytes_per_vector(head_dim)
            # dense-and-sparse outliers: an fp16 value and a 16-bit position each, on quantized sides
            packed += self.outliers * head_dim * 4 * (not fmt.is_identity)
            residual, window = self._side(side)
            if context and (self.sinks or residual or window):
                # a flushed residual is allocated at its full length R; a window at W
                held = min(context, self.sinks + residual + window) / context
                packed = held * full + (1 - held) * packed
            total += packed
        return total

    # ---- text and JSON ------------------------------------------------------------------

    @property
    def label(self) -> str:
        return self.name or self.canonical()

    def canonical(self) -> str:
        text = self.k if self.k == self.v else f"{self.k}/{self.v}"
        if self.rotate:
            text += {-2: "+rot", -1: "+rot=full"}.get(self.rotate, f"+rot={self.rotate}")
        if self.sinks:
            text += f"+sinks={self.sinks}"
        if self.sink_ratio:
            text += "+sinks=auto" if self.sink_ratio == AUTO_SINK_RATIO else f"+sinkratio={self.sink_ratio:g}"
        if self.residual:
            text += f"+residual={self.residual}"
        if self.window:
            text += f"+window={self.window}"
        for name in ("k_residual", "k_window", "v_residual", "v_window"):
            if getattr(self, name):
                text += f"+{name}={getattr(self, name)}"
        if self.pastonly:
            text += "+pastonly"
        if self.prefill:
            text += f"+prefill={self.prefill}"
        if self.skip:
            text += "+skip=" + ",".join(str(s) for s in self.skip)
        if self.q != "none":
            text += f"+q={self.q}"
        if self.smooth:
            text += f"+smooth={self.smooth:g}"
        if self.scales != "static":
            text += f"+scales={self.scales}"
        if self.prerope:
            text += "+prerope"
        if self.outliers:
            text += f"+outliers={self.outliers:g}"
        for pair, indices in _layer_groups(self.layers):
            text += f"+{_layer_ranges(indices)}={pair}"
        return text

    def to_dict(self) -> dict:
        data = asdict(self)
        data["skip"] = list(self.skip)
        data["layers"] = {str(i): (k if k == v else f"{k}/{v}") for i, k, v in self.layers}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "KVSpec":
        reject_unknown_fields(cls, data, "KV spec")
        data = dict(data)
        layers = data.get("layers") or {}
        if isinstance(layers, dict):
            pairs = []
            for index, text in layers.items():
                k, _, v = str(text).partition("/")
                pairs.append((int(index), k, v or k))
            data["layers"] = tuple(pairs)
        data["skip"] = tuple(data.get("skip") or ())
        spec = cls(**data)
        spec.check_whole_cache()
        return spec

    @classmethod
    def parse(cls, text: str) -> "KVSpec":
        text = text.strip()
        if text.startswith("@"):
            return cls.load(Path(text[1:]))
        # "+" separates options, as in --weights; ";" is read as an alias (specs written before they shared one)
        base, *options = re.split(r"[+;]", text)
        from wkvlab.kv.presets import lookup_preset  # presets build KVSpecs: import here, not at module load

        spec = lookup_preset(base)
        if spec is None:
            # nuq keys only validate with prerope set: a canonical string such as "nuq4-c/nuq4+prerope" must read back
            prerope = any(o.strip().lower() == "prerope" for o in options)
            if "/" in base:
                k, _, v = base.partition("/")
                if not k or not v or "/" in v:
                    raise ConfigError(f"bad KV pair {base!r}; write <K format>/<V format>, e.g. q8_0/q4_0")
                spec = cls(k=k, v=v, prerope=prerope)
            else:
                spec = cls(k=base, v=base, prerope=prerope)
        for option in options:
            spec = _apply_option(spec, option.strip())
        spec.check_whole_cache()
        return replace(spec, name=text) if (options and spec.name) else spec

    @classmethod
    def load(cls, path: Path) -> "KVSpec":
        if not path.is_file():
            raise ConfigError(f"KV spec file not found: {path}")
        raw = path.read_text(encoding="utf-8")
        try:
            if path.suffix.lower() in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(raw)
            else:
                data = json.loads(raw)
        except Exception as exc:  # yaml and json raise different types; the fix is the same
            raise ConfigError(f"{path} is not valid {path.suffix.lstrip('.').upper() or 'JSON'} ({type(exc).__name__}); write KVSpec fields as a mapping") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping of KV spec fields (k, v, sinks, skip, layers, ...)")
        return cls.from_dict(data)

    def save(self, path: Path) -> None:
        import yaml

        text = yaml.safe_dump(self.to_dict(), sort_keys=False) if path.suffix.lower() in (".yaml", ".yml") else json.dumps(self.to_dict(), indent=2)
        path.write_text(text, encoding="utf-8")


def _int_option(key: str, value: str) -> int:
    if not re.fullmatch(r"\d+", value):
        raise ConfigError(f"KV option {key}= needs a non-negative integer, got {value!r}")
    return int(value)


_LAYER_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")


def _layer_items(key: str, part: str) -> list[int]:
    """``"5"`` -> [5], ``"0-3"`` -> [0, 1, 2, 3]."""
    if re.fullmatch(r"\d+-\d+", part):
        lo, hi = map(int, part.split("-"))
        if hi < lo:
            raise ConfigError(f"layer range {part!r} runs backwards; write low-high, e.g. 0-3")
        return list(range(lo, hi + 1))
    return [_int_option(key, part)]


def _layer_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> ``"0-2,5"``."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and runs[-1][1] == index - 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _layer_groups(layers: tuple) -> list[tuple[str, list[int]]]:
    """Per-layer overrides grouped by pair, in order of their first layer."""
    groups: dict[str, list[int]] = {}
    for index, k, v in layers:
        groups.setdefault(k if k == v else f"{k}/{v}", []).append(index)
    return list(groups.items())


def _apply_option(spec: KVSpec, option: str) -> KVSpec:
    key, _, value = option.partition("=")
    key = key.lower()
    if key == "rot":
        if value == "full":
            return replace(spec, rotate=-1)
        if not value:
            return replace(spec, rotate=-2)
        block = _int_option(key, value)
        if block == 0 or block & (block - 1):
            raise ConfigError(f"rot={value} is not a power-of-two block; use rot, rot=<32|64|128...>, rot=full or norot")
        return replace(spec, rotate=block)
    if key == "norot" and not value:
        return replace(spec, rotate=0)
    if key == "sinks":
        if value == "auto":
            return replace(spec, sink_ratio=AUTO_SINK_RATIO)
        return replace(spec, sinks=_int_option(key, value))
    if key == "sinkratio":
        try:
            return replace(spec, sink_ratio=float(value))
        except ValueError:
            raise ConfigError(f"sinkratio= needs a number (how many times the typical activation peak), got {value!r}") from None
    if key == "residual":
        return replace(spec, residual=_int_option(key, value))
    if key == "window":
        return replace(spec, window=_int_option(key, value))
    if key in ("k_residual", "k_window", "v_residual", "v_window"):
        return replace(spec, **{key: _int_option(key, value)})
    if key == "pastonly" and not value:
        return replace(spec, pastonly=True)
    if key == "prefill":
        return replace(spec, prefill=_int_option(key, value))
    if key == "skip":
        items: list = []
        for part in filter(None, value.split(",")):
            items.extend([SLIDING] if part == SLIDING else _layer_items(key, part))
        return replace(spec, skip=tuple(items))
    if _LAYER_LIST.fullmatch(key) and value:
        # "<layers>=<K>[/<V>]": those layers' own formats; a later entry for a layer replaces an earlier one
        k, _, v = value.partition("/")
        chosen = {index: (lk, lv) for index, lk, lv in spec.layers}
        for part in key.split(","):
            chosen.update((index, (k, v or k)) for index in _layer_items(key, part))
        return replace(spec, layers=tuple((index, lk, lv) for index, (lk, lv) in chosen.items()))
    if key == "q":
        return replace(spec, q=value)
    if key == "smooth":
        try:
            return replace(spec, smooth=float(value) if value else 0.5)
        except ValueError:
            raise ConfigError(f"smooth= needs a number in [0, 1] (QServe uses 0.5), got {value!r}") from None
    if key == "scales":
        from wkvlab.kv.presets import check_release_scales  # presets build KVSpecs: import here, not at module load

        check_release_scales(spec.name, _SCALE_ALIASES.get(value, value))
        return replace(spec, scales=value)
    if key == "prerope" and not value:
        return replace(spec, prerope=True)
    if key == "recipe":
        from wkvlab.kv.presets import release_format

        target = FP4_KV_RECIPES.get(value.lower())
        if target is None:
            raise ConfigError(f"recipe={value} is not an SGLang FP4 KV recipe; use {', '.join(FP4_KV_RECIPES)}")
        if (spec.k, spec.v) != ("fp4_e2m1", "fp4_e2m1") or spec.layers:
            raise ConfigError("recipe= selects SGLang's FP4 KV recipe and applies to an fp4_e2m1 cache; write sglang:fp4_e2m1+recipe=" + value)
        target = release_format(spec.name, target)  # SGLang 0.5.21 on: no x6 on SM100 without checkpoint scales
        return replace(spec, k=target, v=target)
    if key == "outliers":
        try:
            return replace(spec, outliers=float(value.rstrip("%")) / (100 if value.endswith("%") else 1))
        except ValueError:
            raise ConfigError(f"outliers= needs a fraction such as 0.01 or 1%, got {value!r}") from None
    raise ConfigError(f"unknown KV option {option!r}; use rot[=B|full], norot, sinks=N, residual=R, window=W, skip=i,j|sliding_window, q=fp8_e4m3|q8_0|q8_0-x86|fp16, smooth[=α], scales=amax448|amax448-head|calculate, prerope, outliers=1%, recipe=nvfp4|mxfp4|blockfp4, sinks=auto, sinkratio=τ, k_residual=R, v_window=W, pastonly, prefill=L, <layers>=<K>[/<V>] (e.g. 0-3,76-79=int8)")


def split_kv_list(text: str) -> list[str]:
    """Split a comma-separated list of KV specs, keeping the commas of layer lists (``skip=0,1``,
    ``0-3,76-79=int8``): no KV spec starts with a digit, so a piece that does continues the previous one."""
    parts: list[str] = []
    for piece in text.split(","):
        piece = piece.strip()
        joins = parts and (piece[:1].isdigit() or (piece == SLIDING and re.search(r"[+;]skip=[^+;]*$", parts[-1])))
        if joins:
            parts[-1] += "," + piece
        elif piece:
            parts.append(piece)
    return parts
