"""KV-cache bytes per token of a :class:`~wkvlab.kv.spec.KVSpec` on a model the planner has not loaded.

The spec (its grammar, formats and per-layer rules) is wkvlab's one KV language; this module only
adds what a deployment decides: which layers keep a cache (sliding windows, linear-attention
layers, MLA latents) and how many KV heads one GPU holds. Bytes per token = sum over the layers
with a cache of kv_heads x (K row + V row), each row costed by the spec's own format
(``KVFormat.bytes_per_vector``: data + scales). Llama-3-70B in bf16: 2 x 80 x 8 x 128 x 2 =
327,680 B, so batch 16 x 8192 tokens = 40 GiB.

Tensor parallelism splits KV heads across ranks and replicates them when there are more ranks
than heads (vLLM ``ModelConfig.get_num_kv_heads`` and SGLang ``ModelConfig.get_num_kv_heads``:
``max(1, kv_heads // tp)``); an MLA latent is whole on every rank. See :mod:`.parallel`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.models import LINEAR, SLIDING, ModelDescription


def as_kv_spec(kv: str | KVSpec) -> KVSpec:
    """The spec of ``kv``, parsed by the one KV grammar (``wkvlab eval --kv`` reads the same strings)."""
    return kv if isinstance(kv, KVSpec) else KVSpec.parse(str(kv))


def kv_label(kv: KVSpec) -> str:
    """How a spec is shown: its preset name or canonical string."""
    return kv.label


@dataclass(frozen=True)
class LayerKV(JsonMixin):
    layer: int
    k: str
    v: str
    bytes: int  # per token, every KV head this GPU holds (K and V, scales included)
    window: int | None  # tokens kept at most (sliding window), None = all


@dataclass(frozen=True)
class KVBytes(JsonMixin):
    """KV bytes for one token in every layer that keeps one (before any sliding-window cap)."""

    kv: str
    kv_heads: int  # KV heads per layer on one GPU (all of them without tensor parallelism)
    layers_with_kv: int
    state_bytes_per_sequence: int  # linear-attention layers: fixed state, not per token
    per_layer: tuple[LayerKV, ...]

    @property
    def total_bytes(self) -> int:
        return sum(x.bytes for x in self.per_layer)


@dataclass(frozen=True)
class KVCacheSize(JsonMixin):
    """KV cache of ``batch`` sequences of ``ctx`` tokens (block-rounded per sequence)."""

    batch: int
    ctx: int
    tokens_per_sequence: int  # ctx rounded up to the engine's block size
    cache_bytes: int
    state_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.cache_bytes + self.state_bytes


def kv_bytes_per_token(model: ModelDescription, kv: str | KVSpec, *, layers: tuple[int, ...] | None = None,
                       kv_heads: int | None = None, linear_state_share: float = 1.0,
                       context: int | None = None) -> KVBytes:
    """Exact KV bytes per token of ``kv`` on ``model``.

    ``layers``: the layers this GPU holds (pipeline stage; default all); ``kv_heads``: KV heads per
    layer on this GPU (tensor parallelism; default all); ``linear_state_share``: the fraction of a
    linear-attention state this GPU keeps; ``context``: amortizes the spec's 16-bit sink/residual
    tokens over that many tokens (``KVSpec.bytes_per_token``'s rule).
    """
    spec = as_kv_spec(kv)
    spec.check_model(model.mla.cache_dim if model.mla is not None else model.head_dim, model.num_layers)
    heads = model.num_kv_heads if kv_heads is None else kv_heads
    wanted = set(range(model.num_layers) if layers is None else layers)
    per_layer: list[LayerKV] = []
    for layer in model.kv_layers:
        if layer not in wanted:
            continue
        sliding = model.layer_types[layer] == SLIDING
        k, v = spec.formats_for(layer, sliding)
        if model.mla is not None:
            # MLA caches one latent row (kv_lora_rank + rope dims) per token and layer: no separate V.
            if k.name != v.name:
                raise ConfigError(f"{model.name} caches an MLA latent, not separate K and V; use one KV format for both")
            row = spec.layer_bytes_per_token(layer, head_dim=model.mla.cache_dim, sliding=sliding, context=context) / 2
            nbytes = math.ceil(row)
        else:
            nbytes = math.ceil(heads * spec.layer_bytes_per_token(layer, head_dim=model.head_dim, sliding=sliding, context=context))
        per_layer.append(LayerKV(layer, k.name, v.name, nbytes, model.window(layer)))
    state = 0
    if model.linear_attention is not None:
        # Recurrent + conv state in the model dtype; engines may keep the SSM state in fp32
        # (vLLM `mamba_ssm_cache_dtype`), which doubles this term.
        n_linear = sum(1 for i, t in enumerate(model.layer_types) if t == LINEAR and i in wanted)
        state = math.ceil(n_linear * model.linear_attention.state_elements * 2 * linear_state_share)
    return KVBytes(kv=spec.label, kv_heads=heads, layers_with_kv=len(per_layer), state_bytes_per_sequence=state,
                   per_layer=tuple(per_layer))


def round_up(tokens: int, block: int) -> int:
    return -(-tokens // block) * block if block > 1 else tokens


def per_layer_tokens(per_token: KVBytes, tokens: int, block_size: int = 1) -> list[tuple[LayerKV, int]]:
    return [(layer, tokens if layer.window is None else min(tokens, round_up(layer.window, block_size)))
            for layer in per_token.per_layer]


def kv_cache_bytes(per_token: KVBytes, batch: int, ctx: int, block_size: int = 1) -> KVCacheSize:
    """Cache of ``batch`` sequences at ``ctx`` tokens; sliding layers keep min(ctx, window)."""
    tokens = round_up(ctx, block_size)
    cache = sum(layer.bytes * kept for layer, kept in per_layer_tokens(per_token, tokens, block_size))
    return KVCacheSize(batch, ctx, tokens, cache * batch, per_token.state_bytes_per_sequence * batch)


def sequence_bytes(per_token: KVBytes, ctx: int, block_size: int = 1) -> int:
    """Bytes one sequence of ``ctx`` tokens occupies (cache and fixed state)."""
    return kv_cache_bytes(per_token, 1, ctx, block_size).total_bytes


def min_bits(spec: KVSpec, head_dim: int = 128) -> float:
    """Bits per value of the spec's least precise format (bytes per vector at ``head_dim``, scales included)."""
    return min(f.bytes_per_vector(head_dim) * 8 / head_dim for f in spec.all_formats())


def with_name(spec: KVSpec, name: str = "") -> KVSpec:
    return replace(spec, name=name)
