"""Which baseline a run may have, decided from the option values and the model's file type alone
(no torch): the preflight refuses ``--baseline engine --weights int8`` in a second with the same
words :func:`wkvlab.eval.baseline.choose_baseline` uses once the model is loaded.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from wkvlab.errors import ConfigError

BASELINE_CHOICES = ("auto", "float", "engine")
LLAMACPP_PRESETS = ("llamacpp:", "llamacpp-x86:")  # the reference and the x86-writer variants (wkvlab.kv.presets)


def is_llamacpp(kv) -> bool:
    """A ``llamacpp:`` preset or the 16-bit cache: what the engine baseline can run."""
    return kv.name.startswith(LLAMACPP_PRESETS) or kv.is_identity


def baseline_kind(requested: str, source: str, weights: Iterable, kv: Iterable) -> str:
    """``engine`` or ``float``: what ``requested`` (auto, float, engine) means for a grid on the
    model file ``source``; refuses an engine baseline the run cannot make faithful."""
    if requested not in BASELINE_CHOICES:
        raise ConfigError(f"unknown --baseline {requested!r}; use one of {', '.join(BASELINE_CHOICES)}")
    weights, kv = list(weights), list(kv)
    is_gguf = Path(source).suffix.lower() == ".gguf"
    own_weights = all(w.is_identity for w in weights)
    all_llamacpp = all(is_llamacpp(k) for k in kv)
    any_llamacpp = any(k.name.startswith(LLAMACPP_PRESETS) for k in kv)
    if requested == "engine":
        if not is_gguf:
            raise ConfigError("--baseline engine simulates llama.cpp running a GGUF; this model is not a GGUF, use --baseline float")
        if not own_weights:
            other = next(w.label for w in weights if not w.is_identity)
            raise ConfigError(f"--baseline engine simulates llama.cpp running the GGUF's own weights, and --weights {other} replaces them; "
                              "use --weights none or --baseline float")
        if not all_llamacpp:
            other = next(k.label for k in kv if not is_llamacpp(k))
            raise ConfigError(f"--baseline engine simulates llama.cpp, and {other} is not a llamacpp: preset; run it with --baseline float")
        return "engine"
    if requested == "auto" and is_gguf and own_weights and all_llamacpp and any_llamacpp:
        return "engine"
    return "float"
