"""One weights × KV configuration as a scorer of token sequences: what downstream tasks run on.

This is the simulation ``wkvlab eval`` measures KLD with — the model's weights quantized by
:func:`wkvlab.weights.apply.quantize_model_weights`, every attention layer seeing K and V as the
KV spec stores them (:func:`wkvlab.kv.hook.kv_quantization`, teacher-forced) — packaged so that
lm-evaluation-harness (:mod:`wkvlab.tasks.harness`) can ask it for log-likelihoods and greedy
continuations. Each sequence runs alone (batch 1, no padding): per-channel KV groups (KIVI) span
tokens, so a pad token in a batch would change the quantization of the real ones.

Generation goes through the quantize-on-write cache (:func:`wkvlab.kv.cache.quantized_generate`),
which reproduces the teacher-forced logits token by token (tested in tests/kv).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from wkvlab.data.windows import tokenizer_wants_bos
from wkvlab.errors import ConfigError
from wkvlab.kv.calibrate import KVStats, stats_under_weights
from wkvlab.kv.hook import kv_quantization, layer_stores
from wkvlab.kv.spec import KVSpec
from wkvlab.models.loading import LoadedModel, load_model
from wkvlab.weights.apply import QuantizedWeights, quantize_model_weights
from wkvlab.weights.calibration import CalibrationSet, CalibrationSpec, calibration_set
from wkvlab.weights.spec import WeightSpec


def needs_calibration(weights: WeightSpec, kv: KVSpec) -> bool:
    return weights.needs_calibration or kv.needs_calibration


def prepare_calibration(loaded: LoadedModel, weights: WeightSpec, kv: KVSpec, spec: CalibrationSpec | None) -> CalibrationSet | None:
    """The calibration samples ``wkvlab eval`` would use (the end of the calibration text), when needed."""
    if not needs_calibration(weights, kv):
        return None
    return calibration_set(spec or CalibrationSpec(), loaded.tokenizer)


def kv_statistics(loaded: LoadedModel, built: QuantizedWeights, kv: KVSpec, calibration: CalibrationSet | None) -> KVStats | None:
    """K/V calibration statistics under the quantized weights (cached under the key the eval runner uses)."""
    if not kv.needs_calibration:
        return None
    if calibration is None:
        raise ConfigError(f"KV config {kv.label} needs calibration text; pass calib=prose (or code, math, a file)")
    return stats_under_weights(built, calibration, loaded.fingerprint)


@dataclass
class SimulatedModel:
    """A loaded model with one weight config applied and one KV config to run under."""

    loaded: LoadedModel
    built: QuantizedWeights
    kv: KVSpec
    stats: KVStats | None = None

    def __post_init__(self) -> None:
        self.stores = layer_stores(self.built.model, self.kv, self.stats)
        tokenizer = self.loaded.tokenizer
        self.bos_id = tokenizer.bos_token_id if tokenizer_wants_bos(tokenizer) else None

    @classmethod
    def build(cls, model: str | LoadedModel = "default", weights: str | WeightSpec = "none", kv: str | KVSpec = "fp16",
              calibration: CalibrationSpec | None = None, built: QuantizedWeights | None = None) -> "SimulatedModel":
        """Parse the configs, load the model and quantize its weights (``built``: reuse an already quantized copy)."""
        wspec = weights if isinstance(weights, WeightSpec) else WeightSpec.parse(weights)
        kspec = kv if isinstance(kv, KVSpec) else KVSpec.parse(kv)
        loaded = model if isinstance(model, LoadedModel) else load_model(model)
        kspec.check_model(_head_dim(loaded), loaded.model.config.get_text_config().num_hidden_layers)
        calib = prepare_calibration(loaded, wspec, kspec, calibration)
        if built is None:
            built = quantize_model_weights(loaded.model, wspec, calib, model_key=loaded.fingerprint)
        return cls(loaded, built, kspec, kv_statistics(loaded, built, kspec, calib))

    @property
    def name(self) -> str:
        return f"{self.loaded.name} · weights {self.built.spec.label} · kv {self.kv.label}"

    @property
    def max_length(self) -> int:
        return self.loaded.max_context

    @property
    def eot_token_id(self) -> int:
        tokenizer = self.loaded.tokenizer
        eos = tokenizer.eos_token_id
        return int(eos if eos is not None else tokenizer.bos_token_id)

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        """Token ids as ``wkvlab eval`` tokenizes text: no special tokens, BOS first when the model wants one."""
        ids = self.loaded.tokenizer(text, add_special_tokens=False).input_ids
        return ([self.bos_id] if bos and self.bos_id is not None else []) + list(ids)

    @torch.no_grad()
    def logprobs(self, tokens: list[int]) -> torch.Tensor:
        """Log-softmax ``[len(tokens), vocab]`` (float32) of one sequence under both configs."""
        ids = torch.tensor([tokens], dtype=torch.long)
        with kv_quantization(self.built.model, self.kv, stats=self.stats, stores=self.stores):
            logits = self.built.model(input_ids=ids, use_cache=False).logits[0]
        return torch.log_softmax(logits.float(), dim=-1)

    def score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """log p(continuation | context) and whether greedy decoding would produce it (lm-eval's loglikelihood)."""
        if not continuation:
            raise ConfigError("an lm-eval request has an empty continuation; check the task's doc_to_choice/doc_to_target")
        whole = (context + continuation)[-(self.max_length + 1):]
        n = len(continuation)
        lp = self.logprobs(whole[:-1])[-n:]
        target = torch.tensor(whole[-n:])
        total = float(lp.gather(-1, target[:, None]).sum())
        return total, bool((lp.argmax(-1) == target).all())

    @torch.no_grad()
    def generate(self, context: list[int], *, max_new_tokens: int, stop: list[str]) -> str:
        """Greedy continuation through the quantize-on-write cache, cut before the first ``stop`` string."""
        from wkvlab.kv.cache import quantized_generate

        tokenizer = self.loaded.tokenizer
        ids = torch.tensor([context[-(self.max_length - max_new_tokens):]], dtype=torch.long)
        kwargs = {"stop_strings": stop, "tokenizer": tokenizer} if stop else {}
        out = quantized_generate(self.built.model, self.kv, ids, self.stats, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=max_new_tokens, pad_token_id=self.eot_token_id, **kwargs)
        text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        for s in stop:
            text = text.split(s)[0]
        return text


def _head_dim(loaded: LoadedModel) -> int:
    from wkvlab.kv.override import model_head_dim

    return model_head_dim(loaded.model)
