"""What every pass of an evaluation runs with, and therefore what its KLD is measured against.

The float baseline is the checkpoint run in its run dtype (float32 on the CPU, bfloat16 by default on
a GPU; the label names it): a KV config's KLD is the cost of the cache alone. An engine does more than store its cache: llama.cpp rounds the input of every
quantized matmul to 8-bit blocks (q8_0/q8_1, or q8_K for K-quants), and those roundings amplify a
small cache error downstream — llama.cpp pays ~0.004 KLD for a q8_0 cache on SmolLM2 where the
float simulation shows 0.0003 (docs/engines.md). "What does llama.cpp's cache cost me" is the KLD of
llama.cpp with cache X against llama.cpp with its f16 cache, so the engine baseline attaches the
engine's activation path to the reference pass AND to every candidate pass; only the cache differs.

The same object generalizes to other engines' activation paths (vLLM's W8A8 / FP8 dynamic per-token
activation scales are kinds of :mod:`wkvlab.weights.activations` too): a baseline is a named,
frozen list of (module, activation rounding) pairs plus the label every table and JSON prints.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch

from wkvlab.eval.baseline_rules import LLAMACPP_PRESETS, baseline_kind
from wkvlab.weights.activations import ActivationQuant, attach_activation_quantizers

LLAMACPP_LABEL = "llama.cpp's own f16 cache (ggml q8 activations)"


def float_label(dtype: str = "float32") -> str:
    """What the KLD is against when nothing is attached: the model's own compute dtype, named."""
    return f"the float reference ({dtype} activations, 16-bit cache)"


FLOAT_LABEL = float_label()


@dataclass(frozen=True)
class Baseline:
    """Attached around the reference pass and every candidate pass alike."""

    kind: str  # "float" or "engine"
    label: str  # what the KLD is against, as tables and notes say it
    engine: str = ""
    activations: tuple[tuple[str, ActivationQuant], ...] = ()  # (module name, input rounding)
    outputs: tuple[tuple[str, str], ...] = ()  # (module name, how the engine computes its output)
    description: str = ""  # e.g. "ggml-q8 on 210 linears, ggml-q8k on 27"

    @contextmanager
    def attached(self, model: torch.nn.Module) -> Iterator[None]:
        """Within the block ``model``'s planned linears see their inputs rounded as the engine does
        (and planned activation functions compute as the engine does)."""
        handles = attach_activation_quantizers(model, dict(self.activations)) if self.activations else []
        if self.outputs:
            from wkvlab.engines.ggml_acts import attach_output_replacements

            handles += attach_output_replacements(model, dict(self.outputs))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def to_dict(self) -> dict:
        return {"kind": self.kind, "label": self.label, "engine": self.engine, "activations": self.description or "float inputs"}


FLOAT_BASELINE = Baseline("float", FLOAT_LABEL)


def float_baseline(model: torch.nn.Module) -> Baseline:
    """The float baseline labelled with ``model``'s compute dtype (a bfloat16 run is not "float32 activations")."""
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    return FLOAT_BASELINE if dtype == "float32" else Baseline("float", float_label(dtype))


def llamacpp_baseline(model: torch.nn.Module, gguf: str | Path) -> Baseline:
    """llama.cpp's CPU activation path for ``model`` (loaded from ``gguf``): the input rounding of
    every matmul as the GGUF's weight types imply (:mod:`wkvlab.engines.ggml_acts`)."""
    from wkvlab.engines.ggml_acts import describe_plan, ggml_activation_plan, ggml_output_plan

    plan, outputs = ggml_activation_plan(model, gguf), ggml_output_plan(model)
    description = describe_plan(plan) + (f", ggml-gelu-f16 on {len(outputs)} activations" if outputs else "")
    return Baseline("engine", LLAMACPP_LABEL, "llamacpp", tuple(sorted(plan.items())), tuple(sorted(outputs.items())), description)


def choose_baseline(requested: str, *, model: torch.nn.Module, source: str, weights: Iterable, kv: Iterable) -> tuple[Baseline, list[str]]:
    """The baseline for a run, and notes for the user.

    ``auto``: the engine baseline when the model is a GGUF, every weight config is ``none`` (the
    GGUF's own weights, as llama.cpp runs them) and every KV config is a ``llamacpp:`` preset (or
    the 16-bit cache); otherwise the float reference, with a note when a ``llamacpp:`` preset is
    measured against it. ``engine`` refuses a run it cannot make faithful; ``float`` never attaches
    anything. The rule itself is :func:`wkvlab.eval.baseline_rules.baseline_kind` (the preflight's too).
    """
    weights, kv = list(weights), list(kv)
    if baseline_kind(requested, source, weights, kv) == "engine":
        notes = [] if requested == "engine" else [
            f"KLD against {LLAMACPP_LABEL}: llamacpp: presets on a GGUF are measured the way llama.cpp runs them "
            "(--baseline float measures the cache alone)"]
        return llamacpp_baseline(model, source), notes
    any_llamacpp = any(k.name.startswith(LLAMACPP_PRESETS) for k in kv)
    notes = []
    if any_llamacpp and requested == "auto":
        notes.append("llamacpp: presets measured against the float reference: the cache alone. llama.cpp's own KLD also includes "
                     "its q8 activation rounding; run the llamacpp: presets alone on the GGUF with --weights none, or add --baseline engine")
    return float_baseline(model), notes
