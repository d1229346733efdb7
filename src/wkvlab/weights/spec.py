"""The weight (and activation) configuration as data.

A :class:`WeightSpec` says *which method* produces the weights (``rtn``, ``gptq``, ``awq``,
``smoothquant``, ``llm-int8``), *which format* stores them (integer affine, FP8 E4M3, NVFP4,
MXFP4, a 16-bit cast), *how activations run* at inference (not quantized, INT8 or FP8 per token,
a static per-tensor scale, FP4 blocks), *which layers stay at 16 bits* (embeddings and lm_head by
default, as engines do; layer indices, first/last N layers, a module-name regex) and *per-layer
overrides* (a module-name regex → another config, e.g. NVIDIA's NVFP4 checkpoints run attention
in FP8). It is frozen, compares by value and round-trips through JSON and YAML
(:meth:`to_dict`/:meth:`from_dict`, :meth:`from_file`). The short string form the CLI accepts is
parsed in :mod:`wkvlab.weights.parse` (``WeightSpec.parse``).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from wkvlab.errors import ConfigError
from wkvlab.specio import reject_unknown_fields

# "checkpoint": the weights (and activation rules) come from a quantized checkpoint on disk
# (compressed-tensors, GPTQ/AWQ, GGUF) named by ``checkpoint``; see wkvlab.weights.checkpoints.
METHODS = ("none", "cast", "rtn", "gptq", "awq", "smoothquant", "llm-int8", "checkpoint")
# llama.cpp block types as weight formats: blocks of 32 along the input, scales inside the block
# (ggml-common.h), bit-exact with gguf.quants (wkvlab.formats.ggml).
GGML_FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
FORMATS = ("fp32", "bf16", "fp16", "int", "fp8_e4m3", "nvfp4", "mxfp4", *GGML_FORMATS)
# Activation quantization at inference. "-token" scales are dynamic per token (vLLM's W8A8 INT8
# and FP8 paths); "-tensor" scales are static per tensor, calibrated (absmax over calibration
# data, as llm-compressor's static observers and TensorRT-LLM's SmoothQuant "per-tensor" mode);
# nvfp4/mxfp4 quantize activations in the same blocks as the weights.
ACTIVATIONS = ("none", "int8-token", "int8-tensor", "fp8-token", "fp8-tensor", "nvfp4", "mxfp4")
STATIC_ACTIVATIONS = ("int8-tensor", "fp8-tensor", "nvfp4")  # need calibration data for their scale
CALIBRATED_METHODS = ("gptq", "awq", "smoothquant")


@dataclass(frozen=True)
class WeightSpec:
    method: str = "none"
    format: str = "fp32"
    bits: int = 32
    group_size: int | None = None  # None: per output channel
    symmetric: bool = True
    zero_point: str = "int"  # "int" (engine checkpoints) or "float" (llama.cpp q4_1 style minimum)
    activations: str = "none"
    label: str = "none"
    per_tensor: bool = False  # one weight scale per matrix (int / fp8) instead of per channel/group
    # Layers left at 16 bits.
    quantize_embeddings: bool = False
    quantize_lm_head: bool = False
    skip_layers: tuple[int, ...] = ()
    skip_first: int = 0
    skip_last: int = 0
    skip_regex: str | None = None
    # (module-name regex, weight config string): the first match decides; "none" keeps it at 16 bits.
    overrides: tuple[tuple[str, str], ...] = ()
    # Method parameters (ignored by methods that do not use them).
    damp: float = 0.01  # GPTQ: dampening, fraction of mean(diag H) (IST-DASLab/gptq percdamp)
    block_size: int = 128  # GPTQ: columns per lazy-update block (IST-DASLab/gptq blocksize)
    act_order: bool = False  # GPTQ: columns in order of decreasing Hessian diagonal (desc_act)
    # GPTQ: where group grids come from — "updated" (IST-DASLab: each group's grid from the
    # error-updated weights when the loop reaches it) or "original" (llm-compressor 0.14: all grids
    # from the weights before the loop); wkvlab.weights.gptq
    grid_from: str = "updated"
    alpha: float = 0.5  # SmoothQuant migration strength (Xiao et al. 2023; 0.5 for most models)
    grid: int = 20  # AWQ: scale-search grid points (AutoAWQ n_grid)
    clip: bool = True  # AWQ: weight clipping search (AutoAWQ apply_clip)
    threshold: float = 6.0  # LLM.int8(): outlier magnitude (Dettmers et al. 2022; bitsandbytes default)
    checkpoint: str | None = None  # method "checkpoint": the folder or file holding the quantized weights

    def __post_init__(self) -> None:
        for name in ("skip_layers", "overrides"):
            value = getattr(self, name)
            if isinstance(value, list):  # JSON/YAML give lists; keep the dataclass hashable
                value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
                object.__setattr__(self, name, value)
        if self.method not in METHODS:
            raise ConfigError(f"unknown weight method {self.method!r}; use one of {', '.join(METHODS)}")
        if self.format not in FORMATS:
            raise ConfigError(f"unknown weight format {self.format!r}; use one of {', '.join(FORMATS)}")
        if self.format == "int" and not 2 <= self.bits <= 8:
            raise ConfigError(f"integer weights need 2..8 bits, got {self.bits}")
        if self.group_size is not None and self.group_size < 1:
            raise ConfigError(f"group size must be positive, got {self.group_size}")
        if self.activations not in ACTIVATIONS:
            raise ConfigError(f"unknown activation quantization {self.activations!r}; use one of {', '.join(ACTIVATIONS)}")
        if self.zero_point not in ("int", "float"):
            raise ConfigError(f"zero_point must be 'int' or 'float', got {self.zero_point!r}")
        self._check_method()
        self._check_checkpoint()
        if any(i < 0 for i in self.skip_layers) or self.skip_first < 0 or self.skip_last < 0:
            raise ConfigError("layer indices and counts to skip must be >= 0; layers count from 0")
        for pattern in [self.skip_regex or ""] + [p for p, _ in self.overrides]:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"bad module-name regex {pattern!r} ({exc}); escape special characters") from None
        for _, text in self.overrides:
            if ";" in text or "+" in text:
                raise ConfigError(f"override config {text!r} cannot carry options; give a plain config such as fp8 or int8")

    def _check_method(self) -> None:
        if self.method in ("gptq", "awq") and self.format != "int":
            raise ConfigError(f"{self.method} produces integer weights; use e.g. {self.method}-int4-g128")
        if self.method in ("smoothquant", "llm-int8") and (self.format, self.bits) != ("int", 8):
            raise ConfigError(f"{self.method} is INT8 W8A8; use the preset w8a8-int8 or llm-int8")
        if self.format in GGML_FORMATS and (self.method != "rtn" or self.group_size != 32 or self.activations != "none"):
            raise ConfigError(f"{self.format} is llama.cpp's block format (round to nearest, blocks of 32, 16-bit activations); use the preset {self.format}")
        if self.format in ("nvfp4", "mxfp4") and self.group_size not in (None, 16 if self.format == "nvfp4" else 32):
            raise ConfigError(f"{self.format} has a fixed block size; drop the group size")
        if self.activations in ("nvfp4", "mxfp4") and self.activations != self.format:
            raise ConfigError(f"{self.activations} activations go with {self.activations} weights; use the preset {self.activations}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"SmoothQuant alpha must be in [0, 1], got {self.alpha}")
        if self.grid_from not in ("updated", "original"):
            raise ConfigError(f"grid-from must be 'updated' (IST-DASLab GPTQ) or 'original' (llm-compressor GPTQ), got {self.grid_from!r}")
        if self.grid_from != "updated" and self.method != "gptq":
            raise ConfigError(f"grid-from chooses how GPTQ finds its group grids; {self.method} has no such choice (use it with gptq-int<b>-g<G>)")
        if not 0.0 <= self.damp < 1.0 or self.block_size < 1 or self.grid < 1 or self.threshold <= 0:
            raise ConfigError("GPTQ damp must be in [0, 1), block size and AWQ grid positive, LLM.int8() threshold positive")

    def _check_checkpoint(self) -> None:
        if (self.method == "checkpoint") != (self.checkpoint is not None):
            raise ConfigError("a checkpoint spec needs both method 'checkpoint' and a path; write checkpoint:<folder or .gguf file>")
        if self.method == "checkpoint" and (self.overrides or self.skip_layers or self.skip_first or self.skip_last or self.skip_regex
                                             or self.quantize_embeddings or self.quantize_lm_head):
            raise ConfigError("a checkpoint carries its own layout; skips, overrides, emb and head do not apply to checkpoint:<path>")

    def check_layers(self, n_layers: int) -> None:
        """Refuse ``skip=`` layers the model does not have (the same words as the KV grammar's
        :meth:`wkvlab.kv.spec.KVSpec.check_model`): called from the preflight with the layer count
        the model's files give, and again on the loaded model."""
        bad = [i for i in self.skip_layers if i >= n_layers]
        if bad:
            raise ConfigError(f"--weights {self.label}: layer {bad[0]} does not exist: the model has layers 0..{n_layers - 1}")

    @property
    def is_checkpoint(self) -> bool:
        return self.method == "checkpoint"

    @property
    def is_identity(self) -> bool:
        return self.method == "none" and not self.overrides

    @property
    def needs_calibration(self) -> bool:
        """True when building these weights reads calibration text (the method or a static scale)."""
        if self.method in CALIBRATED_METHODS or self.activations in STATIC_ACTIVATIONS:
            return True
        return any(self.override_spec(text).needs_calibration for _, text in self.overrides)

    def for_linear(self, name: str, layer: int, n_layers: int) -> "WeightSpec | None":
        """The spec a decoder linear ``name`` in ``layer`` gets, or None when it stays at 16 bits.

        Skips first (a skipped layer stays at 16 bits whatever overrides say), then the first
        override whose regex matches the module name, else this spec. One rule for the model
        that is quantized (:mod:`wkvlab.weights.apply`) and the one that is only planned.
        """
        if layer in self.skip_layers or layer < self.skip_first or layer >= n_layers - self.skip_last:
            return None
        if self.skip_regex and re.search(self.skip_regex, name):
            return None
        for pattern, text in self.overrides:
            if re.search(pattern, name):
                sub = self.override_spec(text)
                return None if sub.method == "none" else sub
        return None if self.method == "none" else self

    def for_embeddings(self) -> "WeightSpec":
        """What ``emb``/``head`` quantize the embedding and lm_head with: the same grid by round to nearest."""
        return replace(self, method="rtn" if self.method not in ("none", "cast") else self.method, activations="none", overrides=())

    def override_spec(self, text: str) -> "WeightSpec":
        from wkvlab.weights.parse import parse_weight_spec

        return parse_weight_spec(text)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["skip_layers"] = list(self.skip_layers)
        data["overrides"] = [list(pair) for pair in self.overrides]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "WeightSpec":
        reject_unknown_fields(cls, data, "weight spec")
        return cls(**data)

    @classmethod
    def from_file(cls, path: str | Path) -> "WeightSpec":
        """Read a spec from a .json or .yaml/.yml file holding the fields of :meth:`to_dict`."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"weight spec file not found: {path}")
        text = path.read_text(encoding="utf-8")
        try:
            if path.suffix.lower() == ".json":
                data = json.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text)
        except Exception as exc:  # json and yaml raise different types; both mean "not readable"
            raise ConfigError(f"{path} is not valid {path.suffix[1:].upper()} ({type(exc).__name__}); write the fields of WeightSpec.to_dict()") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping of WeightSpec fields")
        data.setdefault("label", path.stem)
        return cls.from_dict(data)

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def with_label(self, label: str) -> "WeightSpec":
        return replace(self, label=label)

    @classmethod
    def parse(cls, text: str) -> "WeightSpec":
        from wkvlab.weights.parse import parse_weight_spec

        return parse_weight_spec(text)
