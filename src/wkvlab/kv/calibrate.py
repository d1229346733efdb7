"""KV statistics from calibration text, for formats and transforms that need them.

Collected post-RoPE from the model's own attention calls on calibration windows (cut from the end
of a corpus, never overlapping evaluation text — see :mod:`wkvlab.weights.calibration`):

* ``k_absmax``/``v_absmax`` ``[layers, kv_heads, head_dim]``: per-channel maxima of |K| and |V|,
  for calibrated FP8 scales (amax/448 per layer or per head as llm-compressor stores them,
  or vLLM's runtime ``calculate_kv_scales``); ``q_absmax`` ``[layers, heads, head_dim]`` likewise
  for vLLM's FP8 query scale.
* ``k_pair_absmax`` ``[layers, kv_heads, head_dim/2]``: the maximum norm of each RoPE channel pair
  (i, i + head_dim/2). RoPE rotates within these pairs, so this maximum is the same before and after
  RoPE; SmoothAttention (QServe) needs a λ shared by both channels of a pair so that it can be
  folded into q_proj/k_proj before RoPE, and this statistic gives exactly such a λ.

Stats are saved as safetensors with the calibration's description in the metadata, and reloaded
bit-identically, so a calibrated config can be re-run or shipped.

Device: each layer's statistics are gathered where that layer runs. On one device they are
stacked ``[layers, ...]``; a model spread over several GPUs keeps them per layer (a tuple indexed
the same way), since stacking would mix devices. Whatever a file was read onto, a layer's
statistics are moved to the layer's device once, when its store is built (:meth:`KVStats.layer`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, Union

import torch
from safetensors.torch import load_file, save_file

from wkvlab.errors import ConfigError
from wkvlab.kv.override import attention_inputs, attention_override, undo_rope
from wkvlab.runtime import input_device

_NAMES = ("k_absmax", "v_absmax", "k_pair_absmax", "k_pre_samples", "v_samples", "hidden_peak_median", "q_absmax")
SAMPLE_TOKENS = 1024  # calibration tokens kept per layer for codebook fitting (evenly spaced)
PerLayer = Union[torch.Tensor, Sequence[torch.Tensor]]  # [layers, ...] stacked, or one tensor per layer


@dataclass(frozen=True)
class LayerStats:
    """One layer's statistics, on that layer's device (the fields of :class:`KVStats` at ``[layer]``)."""

    k_absmax: torch.Tensor
    v_absmax: torch.Tensor
    k_pair_absmax: torch.Tensor
    k_pre_samples: torch.Tensor
    v_samples: torch.Tensor
    hidden_peak_median: torch.Tensor
    q_absmax: torch.Tensor


@dataclass
class KVStats:
    k_absmax: PerLayer
    v_absmax: PerLayer
    k_pair_absmax: PerLayer
    k_pre_samples: PerLayer  # [layers, kv_heads, SAMPLE_TOKENS, head_dim], keys before RoPE
    v_samples: PerLayer  # [layers, kv_heads, SAMPLE_TOKENS, head_dim]
    hidden_peak_median: PerLayer  # [layers]: median over tokens of max |residual stream| at the layer input
    q_absmax: PerLayer  # [layers, heads, head_dim]: per-channel maxima of |Q| (post-RoPE, as attention sees it)
    source: dict = field(default_factory=dict)
    _placed: dict = field(default_factory=dict, repr=False, compare=False)

    def layer(self, index: int, device: torch.device | str | None = None) -> LayerStats:
        """Layer ``index``'s statistics on ``device`` (where they are when None); copied once per device."""
        key = (index, str(device))
        if key not in self._placed:
            self._placed[key] = LayerStats(**{n: _to(getattr(self, n)[index], device) for n in _NAMES})
        return self._placed[key]

    def save(self, path: Path) -> None:
        save_file({n: _stacked_on_cpu(getattr(self, n)) for n in _NAMES}, str(path), metadata={"source": json.dumps(self.source)})

    @classmethod
    def load(cls, path: Path) -> "KVStats":
        if not Path(path).is_file():
            raise ConfigError(f"KV stats file not found: {path}; create it with wkvlab.kv.calibrate.collect_kv_stats or drop stats=")
        from safetensors import safe_open

        with safe_open(str(path), "pt") as handle:
            meta = handle.metadata() or {}
        tensors = load_file(str(path))
        missing = [n for n in _NAMES if n not in tensors]
        if missing:
            raise ConfigError(f"{path} is not a wkvlab KV stats file (missing {', '.join(missing)})")
        return cls(**{n: tensors[n] for n in _NAMES}, source=json.loads(meta.get("source", "{}")))


def _to(x: torch.Tensor, device) -> torch.Tensor:
    return x if device is None else x.to(device)


def _stacked_on_cpu(values: PerLayer) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.contiguous().cpu()
    return torch.stack([v.cpu() for v in values]).contiguous()


def _per_layer(values: list[torch.Tensor]) -> PerLayer:
    """Stacked when every layer's tensor is on one device (one model on one GPU), else kept per layer."""
    return torch.stack(values) if len({v.device for v in values}) == 1 else tuple(values)


def _pair_norm(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.sqrt(x[..., :half] ** 2 + x[..., half:] ** 2)


@torch.no_grad()
def collect_kv_stats(model: torch.nn.Module, tokens: torch.Tensor, source: dict | None = None,
                     progress: Callable[[int, int], None] | None = None) -> KVStats:
    """Run ``tokens`` ``[samples, length]`` through ``model`` and record per-channel K/V maxima;
    ``progress(done, samples)`` after each sample (minutes on a big model: the ETA needs the steps)."""
    n_layers = model.config.get_text_config().num_hidden_layers
    seen: dict[int, list[torch.Tensor]] = {}
    samples: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    peaks: dict[int, list[torch.Tensor]] = {}
    per_row = max(1, SAMPLE_TOKENS // tokens.shape[0])

    with attention_inputs(model) as inputs:

        def record(backend, module, query, key, value, attention_mask, **kwargs):
            layer = module.layer_idx
            k, v = key.float().abs(), value.float().abs()
            stats = [k.amax(dim=(0, 2)), v.amax(dim=(0, 2)), _pair_norm(key.float()).amax(dim=(0, 2)), query.float().abs().amax(dim=(0, 2))]
            old = seen.get(layer)
            seen[layer] = stats if old is None else [torch.maximum(a, b) for a, b in zip(old, stats)]
            cos, sin = inputs[layer]["position_embeddings"]
            pick = torch.linspace(0, key.shape[2] - 1, min(per_row, key.shape[2]), device=key.device).long()
            samples.setdefault(layer, []).append((undo_rope(key.float(), cos, sin)[0][:, pick], value.float()[0][:, pick]))
            peaks.setdefault(layer, []).append(inputs[layer]["residual"].float().abs().amax(-1).flatten())
            return backend(module, query, key, value, attention_mask, **kwargs)

        with attention_override(model, record):
            for done, row in enumerate(tokens, 1):
                model(input_ids=row[None].to(input_device(model)), use_cache=False)
                if progress is not None:
                    progress(done, tokens.shape[0])
    if len(seen) != n_layers:
        raise ConfigError(f"calibration saw {len(seen)} of {n_layers} attention layers; this architecture is not supported for KV calibration")
    stacked = [_per_layer([seen[i][j] for i in range(n_layers)]) for j in range(4)]
    k_pre = _per_layer([torch.cat([k for k, _ in samples[i]], dim=1) for i in range(n_layers)])
    v_all = _per_layer([torch.cat([v for _, v in samples[i]], dim=1) for i in range(n_layers)])
    # the residual is recorded where the previous layer left it (before accelerate moves it): the
    # layer's own keys say where the layer runs
    peak = _per_layer([torch.cat(peaks[i]).median().to(seen[i][0].device) for i in range(n_layers)])
    info = dict(source or {}, tokens=int(tokens.numel()))
    return KVStats(*stacked[:3], k_pre_samples=k_pre, v_samples=v_all, hidden_peak_median=peak, q_absmax=stacked[3], source=info)


def cached_kv_stats(model: torch.nn.Module, tokens: torch.Tensor, key: str, source: dict | None = None,
                    progress: Callable[[int, int], None] | None = None) -> KVStats:
    """:func:`collect_kv_stats`, saved under the wkvlab cache by ``key`` and reloaded when present.

    ``key`` must identify the model weights (reference fingerprint and weight config) and the
    calibration tokens: the statistics of a weight-quantized model differ from the reference's.
    """
    import hashlib

    from wkvlab.models.loading import cache_dir

    versioned = f"kv-stats-v4|{key}"  # bump when KVStats gains fields: old files are then never read
    path = cache_dir() / "kv-stats" / (hashlib.sha256(versioned.encode()).hexdigest()[:24] + ".safetensors")
    if path.is_file():
        from wkvlab.models.cache import mark_used

        mark_used(path)
        return KVStats.load(path)
    stats = collect_kv_stats(model, tokens, dict(source or {}, key=key), progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    stats.save(tmp)
    tmp.replace(path)  # atomic: a half-written stats file is never read back
    return stats


def stats_under_weights(built, calibration, model_key: str, progress: Callable[[int, int], None] | None = None) -> KVStats:
    """K/V statistics of a weight-quantized model (``built``: ``.model`` and ``.spec``) on the
    calibration tokens, cached under one key shape for every command: quantized weights change
    the keys and values they produce, so the key names the reference, the weight config and the
    calibration."""
    key = f"{model_key}|{json.dumps(built.spec.to_dict(), sort_keys=True)}|{calibration.key}"
    return cached_kv_stats(built.model, calibration.tokens, key, {"calibration": calibration.spec.label}, progress)
