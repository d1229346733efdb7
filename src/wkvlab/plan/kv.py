"""KV-cache layouts and their exact bytes per token.

Bytes per token = sum over layers that keep a cache of (K bytes + V bytes), each being
``kv_heads x head_dim`` values in the layer's format plus that format's scales. For Llama-3-70B
in bf16 that is 2 x 80 x 8 x 128 x 2 = 327,680 B, so batch 16 x 8192 tokens = 40 GiB (REFERENCES).

Spec strings (one per layout):

* uniform: ``int8``, ``q8_0``, ``fp8_e4m3``, ``auto`` (the model's 16-bit dtype), and
  wkvlab's general ``int<b>[-g<G>][-sym|-asym]`` (groups of G along head_dim);
* mixed K/V: ``q8_0/q4_0`` (K format / V format — the canonical form, as ``wkvlab.kv.KVSpec``
  writes it); also accepted: ``k=q8_0,v=q4_0`` and the KVTuner shorthands ``KV8``, ``K8V4``,
  ``KV4``, ``K4V2``, ``KV2`` (8/4/2 bits -> ``int8``/``int4``/``int2``, 16 -> the model dtype);
* per-layer overrides and 16-bit layers, after ``;``: ``int4;0-3,76-79=int8;skip=0`` —
  ``skip=`` also takes ``sliding_window`` (every sliding-window layer), as vLLM's
  ``--kv-cache-dtype-skip-layers`` does.

Byte definitions follow ``wkvlab.kv.formats`` (what wkvlab simulates and measures): ``int8`` is
symmetric with an fp16 scale per token and head; ``int4``/``int2`` are asymmetric with an fp16
scale and an fp16 minimum (4 bytes) per token and head.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from wkvlab.errors import ConfigError
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.models import LINEAR, SLIDING, ModelDescription
from wkvlab.plan.weights import parse_layer_list


@dataclass(frozen=True)
class KVFormat(JsonMixin):
    """Storage of one K or V row (one token, one head)."""

    name: str
    bits: int  # data bits per value
    block: int | None  # values per scale block; None = one scale per row (token x head)
    scale_bytes: int  # per block, or per row when block is None
    description: str = ""


KV_FORMATS: Mapping[str, KVFormat] = {f.name: f for f in (
    KVFormat("fp16", 16, None, 0, "16-bit"),
    KVFormat("bf16", 16, None, 0, "16-bit"),
    # Per-tensor (or per-head) scales of FP8 caches are a few bytes per layer, not per token.
    KVFormat("fp8_e4m3", 8, None, 0, "FP8 E4M3, per-tensor scale"),
    KVFormat("fp8_e5m2", 8, None, 0, "FP8 E5M2, per-tensor scale"),
    KVFormat("int8", 8, None, 2, "INT8 symmetric, fp16 scale per token and head"),
    # Low-bit integers are asymmetric in wkvlab (symmetric 2-bit keeps only three useful levels).
    KVFormat("int4", 4, None, 4, "INT4 asymmetric, fp16 scale + fp16 minimum per token and head"),
    KVFormat("int2", 2, None, 4, "INT2 asymmetric, fp16 scale + fp16 minimum per token and head"),
    # llama.cpp blocks of 32 values (ggml-common.h): data + fp16 d (+ fp16 m for *_1).
    KVFormat("q8_0", 8, 32, 2, "34 B per 32 values"),
    KVFormat("q4_0", 4, 32, 2, "18 B per 32 values"),
    KVFormat("q4_1", 4, 32, 4, "20 B per 32 values"),
    KVFormat("q5_0", 5, 32, 2, "22 B per 32 values"),
    KVFormat("q5_1", 5, 32, 4, "24 B per 32 values"),
    KVFormat("iq4_nl", 4, 32, 2, "18 B per 32 values, non-linear codebook"),
)}

_SHORTHAND_BITS = {"16": None, "8": "int8", "4": "int4", "2": "int2"}


@dataclass(frozen=True)
class KVPair(JsonMixin):
    k: str
    v: str

    def __str__(self) -> str:
        return self.k if self.k == self.v else f"{self.k}/{self.v}"


@dataclass(frozen=True)
class LayerOverride(JsonMixin):
    layers: tuple[int, ...]
    pair: KVPair


@dataclass(frozen=True)
class KVLayout(JsonMixin):
    """K and V formats per layer; ``skip_layers`` stay in the model's 16-bit dtype."""

    default: KVPair
    overrides: tuple[LayerOverride, ...] = ()
    skip_layers: tuple[int, ...] = ()
    skip_sliding: bool = False

    def __str__(self) -> str:
        parts = [str(self.default)]
        parts += [_layers_text(o.layers) + "=" + str(o.pair) for o in self.overrides]
        skips = [_layers_text(self.skip_layers)] if self.skip_layers else []
        if self.skip_sliding:
            skips.append("sliding_window")
        if skips:
            parts.append("skip=" + ",".join(skips))
        return ";".join(parts)

    @property
    def is_uniform(self) -> bool:
        return not self.overrides and not self.skip_layers and not self.skip_sliding

    @property
    def is_mixed(self) -> bool:
        return self.default.k != self.default.v or any(o.pair.k != o.pair.v for o in self.overrides)

    def formats(self) -> set[str]:
        names = {self.default.k, self.default.v}
        for o in self.overrides:
            names |= {o.pair.k, o.pair.v}
        return names

    def min_bits(self) -> int:
        return min(kv_format(n).bits for n in self.formats())

    def pair_for(self, model: ModelDescription, layer: int) -> KVPair:
        if layer in self.skip_layers or (self.skip_sliding and model.layer_types[layer] == SLIDING):
            return KVPair(model.dtype, model.dtype)
        for o in self.overrides:
            if layer in o.layers:
                return o.pair
        return self.default


def _layers_text(layers: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> "0-2,5"."""
    runs: list[str] = []
    for i in layers:
        if runs and runs[-1].split("-")[-1] == str(i - 1):
            runs[-1] = runs[-1].split("-")[0] + f"-{i}"
        else:
            runs.append(str(i))
    return ",".join(runs)


def kv_format_names() -> tuple[str, ...]:
    return tuple(KV_FORMATS)


def parse_kv(spec: str | KVLayout, model_dtype: str = "bf16") -> KVLayout:
    """Parse a KV spec string (see the module docstring) into a :class:`KVLayout`."""
    if isinstance(spec, KVLayout):
        for name in spec.formats():
            _fmt(name)
        return spec
    items = [p.strip() for p in str(spec).split(";") if p.strip()]
    if not items:
        raise ConfigError("empty KV spec; use e.g. 'fp8_e4m3', 'q8_0/q4_0' or 'int4;skip=0'")
    default = _parse_pair(items[0], model_dtype)
    overrides: list[LayerOverride] = []
    skip: tuple[int, ...] = ()
    skip_sliding = False
    for item in items[1:]:
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise ConfigError(f"cannot read {item!r} in KV spec {spec!r}; write '0-3=int8' or 'skip=0,1'")
        if key.strip() == "skip":
            words = [w.strip() for w in value.split(",")]
            skip_sliding = "sliding_window" in words
            numbers = ",".join(w for w in words if w != "sliding_window")
            skip = parse_layer_list(numbers) if numbers else ()
        else:
            overrides.append(LayerOverride(parse_layer_list(key), _parse_pair(value, model_dtype)))
    return KVLayout(default, tuple(overrides), skip, skip_sliding)


def _parse_pair(text: str, model_dtype: str) -> KVPair:
    text = text.strip()
    m = re.fullmatch(r"(?i)k(\d+)v(\d+)|kv(\d+)", text)
    if m:
        kb, vb = (m.group(3), m.group(3)) if m.group(3) else (m.group(1), m.group(2))
        if kb not in _SHORTHAND_BITS or vb not in _SHORTHAND_BITS:
            raise ConfigError(f"KV shorthand {text!r} needs bits in 16/8/4/2, e.g. K8V4")
        return KVPair(_SHORTHAND_BITS[kb] or model_dtype, _SHORTHAND_BITS[vb] or model_dtype)
    if "/" in text:
        k, _, v = text.partition("/")
        if not k.strip() or not v.strip() or "/" in v:
            raise ConfigError(f"bad KV pair {text!r}; write <K format>/<V format>, e.g. q8_0/q4_0")
        return KVPair(_name(k, model_dtype), _name(v, model_dtype))
    if "=" in text:
        fields = dict(_kv_field(f, text) for f in text.split(","))
        if set(fields) != {"k", "v"}:
            raise ConfigError(f"mixed KV spec {text!r} needs both k= and v=, e.g. k=q8_0,v=q4_0 "
                              "(or write q8_0/q4_0)")
        return KVPair(_name(fields["k"], model_dtype), _name(fields["v"], model_dtype))
    name = _name(text, model_dtype)
    return KVPair(name, name)


def _kv_field(item: str, whole: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep:
        raise ConfigError(f"cannot read {whole!r}; write mixed K/V as q8_0/q4_0")
    return key.strip().lower(), value.strip()


_ALIASES = {"f16": "fp16", "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "fp8": "fp8_e4m3",
            "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}


def _name(text: str, model_dtype: str) -> str:
    name = text.strip().lower()
    if name in ("auto", "none"):
        return model_dtype
    name = _ALIASES.get(name, name)
    return kv_format(name).name


_GENERIC = re.compile(r"int([2-8])(?:-g(\d+))?(?:-(sym|asym))?")


def kv_format(name: str) -> KVFormat:
    """A registered format, or wkvlab's general ``int<b>[-g<G>][-sym|-asym]``."""
    if name in KV_FORMATS:
        return KV_FORMATS[name]
    m = _GENERIC.fullmatch(name)
    if not m or (m.group(2) is not None and int(m.group(2)) < 1):
        raise ConfigError(f"unknown KV format {name!r}; use one of: " + ", ".join(KV_FORMATS)
                          + ", int<b>[-g<G>][-sym|-asym], auto, or K/V pairs like q8_0/q4_0")
    bits, group = int(m.group(1)), int(m.group(2)) if m.group(2) else None
    symmetric = m.group(3) == "sym" if m.group(3) else bits == 8  # wkvlab.kv.formats defaults
    canonical = f"int{bits}" + (f"-g{group}" if group else "") + ("-sym" if symmetric else "-asym")
    return KVFormat(canonical, bits, group, 2 if symmetric else 4,
                    f"INT{bits} {'symmetric' if symmetric else 'asymmetric'}"
                    + (f", groups of {group} along head_dim" if group else ", per token and head"))


_fmt = kv_format


def with_16bit_as(layout: KVLayout, dtype: str) -> KVLayout:
    """The layout with every 16-bit cache named ``dtype`` (fp16 and bf16 cost the same)."""
    def fix(pair: KVPair) -> KVPair:
        return KVPair(dtype if pair.k in ("fp16", "bf16") else pair.k,
                      dtype if pair.v in ("fp16", "bf16") else pair.v)
    return KVLayout(fix(layout.default), tuple(LayerOverride(o.layers, fix(o.pair)) for o in layout.overrides),
                    layout.skip_layers, layout.skip_sliding)


# ---- bytes ------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerKV(JsonMixin):
    layer: int
    k: str
    v: str
    data_bytes: int  # per token
    scale_bytes: int  # per token
    window: int | None  # tokens kept at most (sliding window), None = all


@dataclass(frozen=True)
class KVBytes(JsonMixin):
    """KV bytes for one token in every layer that keeps one (before any sliding-window cap)."""

    kv: str
    data_bytes: int
    scale_bytes: int
    layers_with_kv: int
    state_bytes_per_sequence: int  # linear-attention layers: fixed state, not per token
    per_layer: tuple[LayerKV, ...]

    @property
    def total_bytes(self) -> int:
        return self.data_bytes + self.scale_bytes


@dataclass(frozen=True)
class KVCacheSize(JsonMixin):
    """KV cache of ``batch`` sequences of ``ctx`` tokens (block-rounded per sequence)."""

    batch: int
    ctx: int
    tokens_per_sequence: int  # ctx rounded up to the engine's block size
    data_bytes: int
    scale_bytes: int
    state_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.data_bytes + self.scale_bytes + self.state_bytes


def row_bytes(fmt: KVFormat, values: int, row_scale_bytes: int | None = None) -> tuple[int, int]:
    """(data, scale) bytes of one row of ``values`` values (one token of one head)."""
    if fmt.block:
        if values % fmt.block:
            raise ConfigError(f"KV format {fmt.name} needs head_dim divisible by {fmt.block}; "
                              f"this model's is {values}: choose another KV format")
        return values * fmt.bits // 8, values // fmt.block * fmt.scale_bytes
    scale = fmt.scale_bytes if row_scale_bytes is None or fmt.scale_bytes == 0 else row_scale_bytes
    return -(-values * fmt.bits // 8), scale


def kv_bytes_per_token(model: ModelDescription, kv: str | KVLayout,
                       row_scale_bytes: int | None = None) -> KVBytes:
    """Exact KV bytes per token; ``row_scale_bytes`` overrides per-row scale size (vLLM: 4)."""
    layout = parse_kv(kv, model.dtype)
    known = set(range(model.num_layers))
    for layers in [layout.skip_layers] + [o.layers for o in layout.overrides]:
        bad = sorted(set(layers) - known)
        if bad:
            raise ConfigError(f"KV spec names layers {bad}; {model.name} has layers 0..{model.num_layers - 1}")
    per_layer: list[LayerKV] = []
    for layer in model.kv_layers:
        pair = layout.pair_for(model, layer)
        kf, vf = _fmt(pair.k), _fmt(pair.v)
        if model.mla is not None:
            # MLA caches one latent row (kv_lora_rank + rope dims) per token: no separate V.
            if pair.k != pair.v:
                raise ConfigError(f"{model.name} caches an MLA latent, not separate K and V; "
                                  "use one KV format for both")
            data, scale = row_bytes(kf, model.mla.cache_dim, row_scale_bytes)
        else:
            kd, ks = row_bytes(kf, model.head_dim, row_scale_bytes)
            vd, vs = row_bytes(vf, model.head_dim, row_scale_bytes)
            data, scale = model.num_kv_heads * (kd + vd), model.num_kv_heads * (ks + vs)
        per_layer.append(LayerKV(layer, pair.k, pair.v, data, scale, model.window(layer)))
    state = 0
    if model.linear_attention is not None:
        # Recurrent + conv state in the model dtype; engines may keep the SSM state in fp32
        # (vLLM `mamba_ssm_cache_dtype`), which doubles this term.
        n_linear = sum(1 for t in model.layer_types if t == LINEAR)
        state = n_linear * model.linear_attention.state_elements * 2
    return KVBytes(kv=str(layout), data_bytes=sum(x.data_bytes for x in per_layer),
                   scale_bytes=sum(x.scale_bytes for x in per_layer), layers_with_kv=len(per_layer),
                   state_bytes_per_sequence=state, per_layer=tuple(per_layer))


def round_up(tokens: int, block: int) -> int:
    return -(-tokens // block) * block if block > 1 else tokens


def kv_cache_bytes(per_token: KVBytes, batch: int, ctx: int, block_size: int = 1) -> KVCacheSize:
    """Cache of ``batch`` sequences at ``ctx`` tokens; sliding layers keep min(ctx, window)."""
    tokens = round_up(ctx, block_size)
    data = scale = 0
    for lay in per_layer_tokens(per_token, tokens, block_size):
        layer, kept = lay
        data += layer.data_bytes * kept
        scale += layer.scale_bytes * kept
    return KVCacheSize(batch, ctx, tokens, data * batch, scale * batch,
                       per_token.state_bytes_per_sequence * batch)


def per_layer_tokens(per_token: KVBytes, tokens: int, block_size: int = 1) -> list[tuple[LayerKV, int]]:
    return [(layer, tokens if layer.window is None else min(tokens, round_up(layer.window, block_size)))
            for layer in per_token.per_layer]


def sequence_bytes(per_token: KVBytes, ctx: int, block_size: int = 1) -> int:
    """Bytes one sequence of ``ctx`` tokens occupies (data, scales and fixed state)."""
    size = kv_cache_bytes(per_token, 1, ctx, block_size)
    return size.total_bytes
