"""Outlier screen from the weights: which layers' keys a per-token grid cannot represent (no forward pass).

A per-token key cache (``int4``, ``q4_0``, ``llamacpp:q4_0``) stores each token's key of one head
(or one block of 32 channels) on one grid whose step is set by its largest channel. When one
channel is far larger than the rest in every token — a large ``k_proj`` bias is the known cause
(Qwen2/Qwen2.5) — the step is too coarse for every other channel, they round to a few levels or
to zero, and the attention scores those channels carry are lost.

From the weights alone: the key of channel ``c`` is ``k_c = W_c · (γ ⊙ x̂) + b_c``, where ``x̂`` is
the RMS-normalized hidden state (unit mean square) and ``γ`` the layer's input norm. Taking the
components of ``x̂`` as uncorrelated with unit variance, ``E[k_c²] ≈ b_c² + Σ_j W_cj² γ_j²``.
With a per-head key norm (Gemma 3, Qwen3: ``k_norm``) each head's key is normalized and scaled by
its weight, so a channel's size is its share of the head's mean square times ``|k_norm_c|``. RoPE
rotates channel pairs ``(i, i + d/2)`` (interleaved ``(2i, 2i+1)`` in a llama-architecture GGUF,
whose Q/K rows ``convert_hf_to_gguf.py`` permutes), so the screen compares pair magnitudes
``sqrt((m_i² + m_pair²)/2)``. A head's **spread** is its largest pair over the median pair;
a layer is flagged when a head's spread exceeds :data:`SPREAD_LIMIT`.

The rule's limit: a symmetric 4-bit grid has 7 positive levels; a channel at 1/8 of the largest
keeps less than one level (it rounds to 0 or ±1 step), so spread > 8 means the typical channel of
that head is not represented. Calibrated on (docs/planner.md, ``scripts/probe_planner.py``): the
planted-outlier Qwen2 of ``tests/plan`` (bias 60 on one RoPE pair: spread in the hundreds; probe:
per-token ``int4`` KLD 0.39, top-1 14%, ``kivi4`` KLD 0.0002) and the two packaged models
(docs/planner.md): Gemma-3-270M, whose ``k_norm`` weights give layers 5, 11 and 15 spreads of 21x,
16x and 12x, loses 1.55 nat (top-1 39%) with a per-token ``int4`` cache; SmolLM2-135M (at most
5.3x, nothing flagged) loses 0.13 — over the guard's 0.1, but from 4-bit noise, not an outlier. It is a screen, not a measurement: hidden-state outlier
dimensions (massive activations) are not modelled; ``--probe`` measures.

Formats that avoid it: per-channel keys (``kivi4``, ``int4-c32``, KVQuant's ``kvquant:4``), a
rotation that spreads the outlier over its block (``+rot``, llama.cpp's default since PR #21038),
or an 8-bit or floating-point cache (``int8``, ``q8_0``, ``fp8_e4m3``).
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where a screen runs: the planner imports this module, and `wkvlab` starts without numpy
    import numpy as np

from wkvlab.errors import ConfigError
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.source import ModelSource

SPREAD_LIMIT = 8.0  # 2^(4-1): beyond it the median channel keeps < 1 level of a symmetric 4-bit per-token grid
AVOID = ("per-channel keys (kivi4, int4-c32, kvquant:4), a rotation (+rot; llama.cpp rotates by default since PR #21038), "
         "or an 8-bit / FP8 cache (int8, q8_0, fp8_e4m3)")
_GEMMA = re.compile(r"gemma")


@dataclass(frozen=True)
class LayerScreen(JsonMixin):
    layer: int
    spread: float  # the largest head's max pair magnitude / median pair magnitude
    head: int  # that head
    channels: tuple[int, ...]  # its largest pair (channel indices in the checkpoint's layout)
    bias_share: float  # share of that pair's mean square that comes from the bias

    @property
    def flagged(self) -> bool:
        return self.spread > SPREAD_LIMIT


@dataclass(frozen=True)
class ScreenResult(JsonMixin):
    model: str
    source: str  # which file was read
    layers: tuple[LayerScreen, ...]
    limit: float = SPREAD_LIMIT
    avoid: str = AVOID

    @property
    def flagged(self) -> tuple[int, ...]:
        return tuple(s.layer for s in self.layers if s.flagged)

    def summary(self) -> str:
        worst = max(self.layers, key=lambda s: s.spread)
        if not self.flagged:
            return (f"outlier screen ({self.source}): no layer flagged — key-channel spread at most {worst.spread:.1f}x "
                    f"(layer {worst.layer}; flagged above {self.limit:g}x)")
        return (f"outlier screen ({self.source}): {len(self.flagged)} of {len(self.layers)} layers flagged "
                f"({_ranges(self.flagged)}): key-channel spread up to {worst.spread:.0f}x (layer {worst.layer}, head {worst.head}, "
                f"channels {', '.join(map(str, worst.channels))}, {worst.bias_share:.0%} from the bias) > {self.limit:g}x — "
                f"a per-token key cache below 8 bits cannot represent these keys; formats that avoid it: {self.avoid}")


def _ranges(layers: tuple[int, ...]) -> str:
    out, start = [], None
    for i, x in enumerate(layers):
        if start is None:
            start = x
        if i + 1 == len(layers) or layers[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)


def layer_spread(layer: int, weight: np.ndarray, bias: np.ndarray | None, norm: np.ndarray | None, k_norm: np.ndarray | None,
                 kv_heads: int, interleaved: bool) -> LayerScreen:
    """The spread of one layer from its k_proj ``weight`` [out, in], ``bias`` [out], input ``norm`` [in] and per-head ``k_norm`` [head_dim]."""
    import numpy as np

    w = weight.astype(np.float64)
    gamma2 = np.ones(w.shape[1]) if norm is None else norm.astype(np.float64) ** 2
    from_weights = (w**2) @ gamma2
    from_bias = np.zeros_like(from_weights) if bias is None else bias.astype(np.float64) ** 2
    raw = (from_weights + from_bias).reshape(kv_heads, -1)
    power, hd = raw, raw.shape[1]
    if k_norm is not None:  # normalized per head, then scaled per channel
        power = power / power.mean(axis=1, keepdims=True) * k_norm.astype(np.float64)[None, :hd] ** 2
    if interleaved:
        first, second = np.arange(0, hd, 2), np.arange(1, hd, 2)
    else:
        first, second = np.arange(hd // 2), np.arange(hd // 2, hd)
    pairs = np.sqrt((power[:, first] + power[:, second]) / 2)
    spreads = pairs.max(axis=1) / np.maximum(np.median(pairs, axis=1), 1e-30)
    head = int(spreads.argmax())
    i = int(pairs[head].argmax())
    channels = (int(first[i]), int(second[i]))
    picked = list(channels)
    bias_share = float(from_bias.reshape(kv_heads, -1)[head, picked].sum() / max(raw[head, picked].sum(), 1e-30))
    return LayerScreen(layer, float(spreads[head]), head, channels, bias_share)


def screen_model(model: ModelDescription, source: ModelSource) -> ScreenResult:
    """Screen the checkpoint ``source`` names (a folder with safetensors, a .gguf or a packaged model)."""
    if source.gguf:
        tensors, arch = _gguf_tensors(Path(source.gguf))
        interleaved = arch in ("llama", "mistral", "granite")  # convert_hf_to_gguf.py permutes their Q/K rows
        gemma = False
        where = Path(source.gguf).name
    elif source.folder:
        tensors = _safetensors(Path(source.folder))
        interleaved, gemma = False, bool(_GEMMA.search(model.architecture))
        where = f"{Path(source.folder).name}/*.safetensors"
    else:
        raise ConfigError(f"--screen reads the key projections, and {source.given} has no weights here: pass a packaged model, "
                          "a .gguf or a folder with safetensors")
    layers = []
    for layer in model.kv_layers:
        found = tensors(layer)
        if found is None:
            continue
        weight, bias, norm, k_norm = found
        if gemma:  # HF Gemma norms multiply by (1 + weight); GGUF files store the sum
            norm = None if norm is None else 1.0 + norm
            k_norm = None if k_norm is None else 1.0 + k_norm
        layers.append(layer_spread(layer, weight, bias, norm, k_norm, model.num_kv_heads, interleaved))
    if not layers:
        raise ConfigError(f"--screen found no key projection in {where}; it reads k_proj (HF) or attn_k (GGUF) tensors")
    return ScreenResult(model.name, where, tuple(layers))


def _gguf_tensors(path: Path):
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    by_name = {t.name: t for t in reader.tensors}

    def get(name: str) -> np.ndarray | None:
        t = by_name.get(name)
        return None if t is None else np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)

    def tensors(layer: int):
        weight = get(f"blk.{layer}.attn_k.weight")
        if weight is None:
            return None
        return (weight, get(f"blk.{layer}.attn_k.bias"), get(f"blk.{layer}.attn_norm.weight"), get(f"blk.{layer}.attn_k_norm.weight"))

    return tensors, arch


_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bf16", "F64": "float64"}  # safetensors dtype -> numpy's name


def _safetensors(folder: Path):
    """The layer's k_proj weight/bias, input norm and k_norm from a folder's *.safetensors (read by the
    format's header: 8-byte length, JSON directory, raw little-endian data; bf16 widened to float32)."""
    import numpy as np

    index: dict[str, tuple[Path, dict]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, entry in header.items():
            if name != "__metadata__":
                index[name] = (file, {**entry, "base": 8 + n})
    if not index:
        raise ConfigError(f"--screen reads safetensors and {folder} has none; convert the checkpoint or pass a .gguf")

    def get(name: str) -> np.ndarray | None:
        if name not in index:
            return None
        file, entry = index[name]
        kind = _DTYPES.get(entry["dtype"])
        if kind is None:
            raise ConfigError(f"--screen: {name} in {file.name} is {entry['dtype']}; it reads F32, F16 and BF16 tensors")
        start, end = entry["data_offsets"]
        with file.open("rb") as f:
            f.seek(entry["base"] + start)
            raw = f.read(end - start)
        if kind == "bf16":
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(raw, dtype=np.dtype(kind).newbyteorder("<")).astype(np.float32)
        return values.reshape(entry["shape"])

    def tensors(layer: int):
        prefix = next((p for p in (f"model.layers.{layer}.", f"model.language_model.layers.{layer}.") if f"{p}self_attn.k_proj.weight" in index), None)
        if prefix is None:
            return None
        return (get(prefix + "self_attn.k_proj.weight"), get(prefix + "self_attn.k_proj.bias"), get(prefix + "input_layernorm.weight"),
                get(prefix + "self_attn.k_norm.weight"))

    return tensors
