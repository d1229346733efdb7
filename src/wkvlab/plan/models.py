"""Model descriptions: the few numbers of a config.json that decide bytes and FLOPs.

A :class:`ModelDescription` is read from any Hugging Face ``config.json`` (a path, or a dict)
or looked up by name in a built-in table of published configs (``data/models.yaml``). It knows
which layers keep a KV cache: full-attention layers keep every token, sliding-window layers keep
at most ``sliding_window`` tokens, linear-attention / state-space layers keep a fixed-size state
instead. MLA models (DeepSeek-V3) cache one compressed latent per token and layer.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import yaml

from wkvlab.errors import ConfigError
from wkvlab.plan._serde import JsonMixin

FULL = "full_attention"
SLIDING = "sliding_attention"
LINEAR = "linear_attention"
LAYER_KINDS = (FULL, SLIDING, LINEAR)

# Spellings of layer types found in config.json files (transformers `layer_types`, LFM2, Jamba-
# style hybrids). Anything without a growing per-token cache counts as LINEAR.
_LAYER_TYPE_ALIASES = {
    "full_attention": FULL, "attention": FULL, "global": FULL, "full": FULL,
    "sliding_attention": SLIDING, "sliding_window": SLIDING, "local": SLIDING,
    "chunked_attention": SLIDING,
    "linear_attention": LINEAR, "mamba": LINEAR, "mamba2": LINEAR, "conv": LINEAR,
    "ssm": LINEAR, "recurrent": LINEAR,
}

# transformers' own defaults for `tie_word_embeddings` where a config.json omits it
# (PretrainedConfig defaults to True; the Llama/Mistral/Qwen/DeepSeek classes to False).
_UNTIED_BY_DEFAULT = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                      "qwen3_next", "deepseek_v2", "deepseek_v3"}
_QK_NORM = {"qwen3", "qwen3_moe", "qwen3_next", "gemma3", "gemma3_text"}
_FOUR_NORMS = {"gemma2", "gemma3", "gemma3_text"}  # pre/post attention and pre/post MLP norms
_QKV_BIAS = {"qwen2", "qwen2_moe"}

_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16",
           # fp32 checkpoints are served in 16 bit by every engine here.
           "float32": "bf16", "float": "bf16"}


@dataclass(frozen=True)
class MoEConfig(JsonMixin):
    """Routed experts of a mixture-of-experts MLP."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_experts: int = 0  # DeepSeek: shared experts of expert_intermediate_size each
    shared_expert_intermediate_size: int = 0  # Qwen-MoE: one shared expert of this width
    dense_layers: tuple[int, ...] = ()  # layers that keep a dense MLP instead


@dataclass(frozen=True)
class MLAConfig(JsonMixin):
    """Multi-head latent attention (DeepSeek-V2/V3): the cache keeps the latent, not K and V."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    @property
    def cache_dim(self) -> int:
        """Elements cached per token and layer: the latent plus the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class LinearAttentionConfig(JsonMixin):
    """Gated-DeltaNet style linear attention (Qwen3-Next): fixed-size state per sequence."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def state_elements(self) -> int:
        """Recurrent state (heads x d_k x d_v) plus the causal-conv tail (kernel - 1 steps)."""
        recurrent = self.num_value_heads * self.key_head_dim * self.value_head_dim
        conv = (2 * self.key_dim + self.value_dim) * (self.conv_kernel - 1)
        return recurrent + conv


@dataclass(frozen=True)
class ModelDescription(JsonMixin):
    """Everything the planner needs to know about a model's shapes."""

    name: str
    hf_id: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    tie_embeddings: bool
    max_position_embeddings: int
    dtype: str
    layer_types: tuple[str, ...]
    sliding_window: int | None = None
    moe: MoEConfig | None = None
    mla: MLAConfig | None = None
    linear_attention: LinearAttentionConfig | None = None
    attention_bias: bool = False
    attn_output_gate: bool = False
    qk_norm: bool = False
    norms_per_layer: int = 2
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "vocab_size", "max_position_embeddings"):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"model {self.name!r}: {name} must be positive; fix the config")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"model {self.name!r}: num_attention_heads {self.num_heads} is not a "
                              f"multiple of num_key_value_heads {self.num_kv_heads}; fix the config")
        if len(self.layer_types) != self.num_layers:
            raise ConfigError(f"model {self.name!r}: layer_types has {len(self.layer_types)} entries "
                              f"for {self.num_layers} layers; fix the config")
        bad = sorted(set(self.layer_types) - set(LAYER_KINDS))
        if bad:
            raise ConfigError(f"model {self.name!r}: unknown layer types {bad}; use {LAYER_KINDS}")
        if SLIDING in self.layer_types and not self.sliding_window:
            raise ConfigError(f"model {self.name!r}: sliding-window layers need sliding_window")

    # ---- derived views -------------------------------------------------------------------
    @property
    def kv_layers(self) -> tuple[int, ...]:
        """Indices of the layers that keep a per-token KV cache."""
        return tuple(i for i, t in enumerate(self.layer_types) if t != LINEAR)

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def window(self, layer: int) -> int | None:
        """Tokens a layer keeps at most (None: all of them)."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer not in self.moe.dense_layers

    # ---- constructors --------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: Mapping[str, Any] | str | Path, name: str | None = None,
                    hf_id: str | None = None) -> ModelDescription:
        """Read a Hugging Face config (dict, config.json path, or a directory holding one)."""
        source = "config dict"
        if isinstance(config, (str, Path)):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            if not path.is_file():
                raise ConfigError(f"no config.json at {path}; pass a model name or a config.json path")
            try:
                config = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ConfigError(f"cannot read {path} as JSON ({exc}); pass a valid config.json") from exc
            source = f"config.json at {path}"
            name = name or (path.parent.name if path.name == "config.json" else path.stem)
        if not isinstance(config, Mapping):
            raise ConfigError("a model config must be a JSON object; pass a config.json")
        return _parse_config(config, name=name, hf_id=hf_id, source=source)

    @classmethod
    def from_name(cls, name: str) -> ModelDescription:
        """Look ``name`` (or a Hugging Face id) up in the built-in table."""
        table = _builtin_table()
        key = _norm(name)
        for entry in table:
            keys = {_norm(entry["name"]), _norm(entry["hf_id"])}
            keys |= {_norm(a) for a in entry.get("aliases", [])}
            if key in keys:
                return _parse_config(entry["config"], name=entry["name"], hf_id=entry["hf_id"],
                                     source=f"built-in table: published config.json of "
                                            f"{entry['hf_id']} (from memory)")
        raise ConfigError(f"unknown model {name!r}; use a path to config.json or one of: "
                          + ", ".join(builtin_model_names()))


def builtin_model_names() -> tuple[str, ...]:
    return tuple(e["name"] for e in _builtin_table())


def resolve_model(spec: str | Path | ModelDescription) -> ModelDescription:
    """A description from a description, a config.json path/directory, or a built-in name."""
    if isinstance(spec, ModelDescription):
        return spec
    path = Path(spec)
    if path.suffix == ".json" or path.exists():
        return ModelDescription.from_config(path)
    return ModelDescription.from_name(str(spec))


def _norm(text: str) -> str:
    """Compare names without case, punctuation or the Hugging Face organisation."""
    return re.sub(r"[^a-z0-9]", "", text.lower().rsplit("/", 1)[-1])


_TABLE: list[dict[str, Any]] | None = None


def _builtin_table() -> list[dict[str, Any]]:
    global _TABLE
    if _TABLE is None:
        text = resources.files("wkvlab.plan").joinpath("data/models.yaml").read_text()
        _TABLE = list(yaml.safe_load(text)["models"])
    return _TABLE


def _get(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def _int(cfg: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    value = _get(cfg, *keys, default=default)
    if value is None:
        raise ConfigError(f"config.json lacks {keys[0]}; this planner needs it")
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config.json {keys[0]}={value!r} is not an integer; fix the config") from exc


def _parse_config(raw: Mapping[str, Any], *, name: str | None, hf_id: str | None,
                  source: str) -> ModelDescription:
    # Multimodal checkpoints nest the language model under text_config.
    cfg: dict[str, Any] = dict(raw)
    if isinstance(raw.get("text_config"), Mapping):
        cfg = {k: v for k, v in raw.items() if k != "text_config"}
        cfg.update(raw["text_config"])
    arch = str(cfg.get("model_type", "unknown"))
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    heads = _int(cfg, "num_attention_heads", "n_head")
    kv_heads = _int(cfg, "num_key_value_heads", default=1 if cfg.get("multi_query") else heads)
    head_dim = _int(cfg, "head_dim", default=hidden // heads)
    notes: list[str] = []
    dtype = _DTYPES.get(str(_get(cfg, "torch_dtype", "dtype", default="bfloat16")).lower(), "bf16")
    tie_default = arch not in _UNTIED_BY_DEFAULT
    moe = _parse_moe(cfg, layers)
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = MLAConfig(kv_lora_rank=_int(cfg, "kv_lora_rank"),
                        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim"),
                        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim"),
                        v_head_dim=_int(cfg, "v_head_dim"),
                        q_lora_rank=_get(cfg, "q_lora_rank"))
    linear = None
    if cfg.get("linear_num_value_heads"):
        linear = LinearAttentionConfig(
            num_key_heads=_int(cfg, "linear_num_key_heads"),
            num_value_heads=_int(cfg, "linear_num_value_heads"),
            key_head_dim=_int(cfg, "linear_key_head_dim"),
            value_head_dim=_int(cfg, "linear_value_head_dim"),
            conv_kernel=_int(cfg, "linear_conv_kernel_dim", default=4))
    layer_types, window = _parse_layer_types(cfg, arch, layers)
    if LINEAR in layer_types and linear is None:
        notes.append("state-space/convolution layers: their mixer weights and state are not "
                     "modelled (no shapes in config.json the planner knows)")
    return ModelDescription(
        name=name or str(cfg.get("_name_or_path") or arch), hf_id=hf_id or str(cfg.get("_name_or_path", "")),
        architecture=arch, num_layers=layers, hidden_size=hidden, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=_int(cfg, "vocab_size"),
        intermediate_size=_int(cfg, "intermediate_size", "ffn_dim", default=4 * hidden),
        tie_embeddings=bool(_get(cfg, "tie_word_embeddings", default=tie_default)),
        max_position_embeddings=_int(cfg, "max_position_embeddings", "n_positions",
                                     "max_sequence_length", default=4096),
        dtype=dtype, layer_types=layer_types, sliding_window=window, moe=moe, mla=mla,
        linear_attention=linear,
        attention_bias=bool(_get(cfg, "attention_bias", default=arch in _QKV_BIAS)),
        attn_output_gate=bool(_get(cfg, "attn_output_gate", default=arch == "qwen3_next")),
        qk_norm=arch in _QK_NORM, norms_per_layer=4 if arch in _FOUR_NORMS else 2,
        source=source, notes=tuple(notes))


def _parse_layer_types(cfg: Mapping[str, Any], arch: str, layers: int) -> tuple[tuple[str, ...], int | None]:
    window = _get(cfg, "sliding_window", "attention_chunk_size")
    explicit = cfg.get("layer_types") or cfg.get("layers_block_type")
    if explicit:
        kinds = []
        for t in explicit:
            kind = _LAYER_TYPE_ALIASES.get(str(t).lower())
            if kind is None:
                raise ConfigError(f"unknown layer type {t!r} in config.json; known: "
                                  + ", ".join(sorted(_LAYER_TYPE_ALIASES)))
            kinds.append(kind)
        return tuple(kinds), int(window) if window and SLIDING in kinds else None
    if cfg.get("full_attention_interval"):
        # Qwen3-Next: layer i is full attention when (i + 1) % interval == 0.
        every = int(cfg["full_attention_interval"])
        return tuple(FULL if (i + 1) % every == 0 else LINEAR for i in range(layers)), None
    if window and cfg.get("sliding_window_pattern"):
        # Gemma 3: five local layers, then one global (transformers Gemma3 config).
        every = int(cfg["sliding_window_pattern"])
        return tuple(FULL if (i + 1) % every == 0 else SLIDING for i in range(layers)), int(window)
    if window and arch == "gemma2":
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(layers)), int(window)
    if window and cfg.get("use_sliding_window", True) and int(window) < int(
            _get(cfg, "max_position_embeddings", default=10**9)):
        return tuple(SLIDING for _ in range(layers)), int(window)
    return tuple(FULL for _ in range(layers)), None


def _parse_moe(cfg: Mapping[str, Any], layers: int) -> MoEConfig | None:
    experts = _get(cfg, "num_local_experts", "n_routed_experts", "num_experts")
    if not experts or int(experts) <= 1:
        return None
    dense: set[int] = set(int(i) for i in cfg.get("mlp_only_layers") or [])
    dense |= set(range(int(cfg.get("first_k_dense_replace") or 0)))
    step = int(cfg.get("decoder_sparse_step") or cfg.get("moe_layer_freq") or 1)
    dense |= {i for i in range(layers) if (i + 1) % step != 0}
    return MoEConfig(
        num_experts=int(experts), experts_per_token=_int(cfg, "num_experts_per_tok", default=2),
        expert_intermediate_size=_int(cfg, "moe_intermediate_size", "intermediate_size"),
        shared_experts=int(cfg.get("n_shared_experts") or 0),
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
        dense_layers=tuple(sorted(i for i in dense if i < layers)))
