"""llama.cpp in-process through llama-cpp-python: real GGUF weights, real quantized KV caches.

Each window is evaluated from an empty cache in one call (``Llama.eval``), with ``logits_all`` so
every position's logits come back, exactly the teacher-forced pass the simulation makes. The
prompt is processed in micro-batches of ``n_ubatch`` tokens: each writes its K/V into the
(quantized) cache before attending to it, so every key the engine attends to, the current token's
included, went through the cache format — the same thing the simulation assumes.

What the vendored llama.cpp does with a quantized cache (read in llama-cpp-python 0.3.36's
``vendor/llama.cpp``: ``src/llama-kv-cache.cpp``, ``src/llama-graph.cpp``, ``ggml-cpu/ops.cpp``):

* Q and K are multiplied by an orthonormal Walsh-Hadamard matrix when K is quantized, V (and the
  attention output, by the inverse) when V is quantized, if head_dim is a multiple of 64
  (``LLAMA_ATTN_ROT_DISABLE=1`` turns it off). V's block is 64; K's is the largest power of two
  (≥ 64) dividing head_dim — 64 on the default model (head_dim 64), 256 on Gemma-3 (head_dim 256).
* CPU flash attention converts each query row to K's dot-product type (q8_0 for q8_0/q4_0/q5_0/
  iq4_nl keys, q8_1 — the same values plus a block sum — for q4_1/q5_1, f16 for an f16 cache)
  and accumulates V in f32 (f16 when the V cache is f16).
"""
from __future__ import annotations

import contextlib
import os
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from wkvlab.engines.base import EngineInfo, WindowScores
from wkvlab.errors import ConfigError, ModelError

if TYPE_CHECKING:  # torch and numpy load with the engine, not with option checking (parse_cache_types)
    import torch

INSTALL_HINT = "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install 'llama-cpp-python[server]==0.3.36' (what make test-all does; it compiles llama.cpp)"
# ggml type ids (ggml.h); llama-cpp-python exposes the same numbers as llama_cpp.GGML_TYPE_*.
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
FLASH_ATTN = ("auto", "on", "off")


def import_llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise ConfigError(f"the llama.cpp engine needs llama-cpp-python: {INSTALL_HINT}") from None
    return llama_cpp


def parse_cache_types(kv: str) -> tuple[str, str]:
    """A ``--kv`` spec (wkvlab's one KV grammar: ``q8_0``, ``q8_0/q4_0``, ``fp16``/``f16``,
    ``llamacpp:q4_0``) as llama.cpp's ``-ctk``/``-ctv`` names. Options llama.cpp has no flag for are
    refused; its rotation is the engine's own (``--no-rotation`` turns it off)."""
    from wkvlab.kv.spec import KVSpec

    spec = KVSpec.parse(kv or "fp16")
    simulated = [name for name, on in (("sinks", spec.sinks or spec.sink_ratio), ("residual", spec.residual), ("window", spec.window),
                                       ("skip", spec.skip), ("per-layer formats", spec.layers), ("smooth", spec.smooth),
                                       ("prerope", spec.prerope), ("scales", spec.scales != "static")) if on]
    if simulated:
        raise ConfigError(f"llama.cpp's cache takes one type for K and one for V; {', '.join(simulated)} in {kv!r} "
                          "exist only in wkvlab's simulation (wkvlab eval --kv)")
    names = tuple("f16" if n == "fp16" else n for n in (spec.k, spec.v))
    for name in names:
        if name not in GGML_TYPES:
            raise ConfigError(f"llama.cpp has no KV cache type {name!r}; use one of {', '.join(t for t in GGML_TYPES if t not in ('f32', 'bf16'))} (K/V pairs as q8_0/q4_0)")
    return names  # type: ignore[return-value]


def flash_attention_on(mode: str, v_type: str) -> bool:
    """``auto``: on when V is quantized (llama.cpp refuses a quantized V cache without it)."""
    if mode not in FLASH_ATTN:
        raise ConfigError(f"unknown flash attention mode {mode!r}; use one of {', '.join(FLASH_ATTN)}")
    if mode == "off" and v_type not in ("f16", "f32", "bf16"):
        raise ConfigError(f"a quantized V cache ({v_type}) needs flash attention; use --flash-attn on or auto")
    return mode == "on" or (mode == "auto" and v_type not in ("f16", "f32", "bf16"))


@contextlib.contextmanager
def quiet_stderr():
    """Silence fd 2 (C libraries and subprocesses write there): llama.cpp logs model loading even with
    verbose=False in places, lm-eval runs `git describe` whose error lands there; keep the CLI clean."""
    try:
        saved = os.dup(2)
    except OSError:  # no real stderr (some test runners): nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class LlamaCppEngine:
    """One GGUF with one cache type pair; ``score_window`` returns full logits."""

    def __init__(self, gguf: str | Path, kv: str = "f16", *, ctx: int, flash_attn: str = "auto",
                 threads: int = 2, ubatch: int = 512, seed: int = 0, rotation: bool = True):
        llama_cpp = import_llama_cpp()
        path = Path(gguf).expanduser()
        if not path.is_file():
            raise ModelError(f"GGUF file not found: {path}")
        self.k_type, self.v_type = parse_cache_types(kv)
        self.flash = flash_attention_on(flash_attn, self.v_type)
        self.ctx = ctx
        # The rotation switch is read when the context is created; set it only around that.
        previous = os.environ.get("LLAMA_ATTN_ROT_DISABLE")
        os.environ["LLAMA_ATTN_ROT_DISABLE"] = "0" if rotation else "1"
        try:
            with quiet_stderr():
                self.llm = llama_cpp.Llama(
                    model_path=str(path), n_ctx=ctx, n_batch=ctx, n_ubatch=min(ubatch, ctx), logits_all=True,
                    type_k=GGML_TYPES[self.k_type], type_v=GGML_TYPES[self.v_type], flash_attn=self.flash,
                    n_threads=threads, n_threads_batch=threads, seed=seed, n_gpu_layers=0, verbose=False,
                )
        except ValueError as exc:  # llama-cpp-python raises ValueError("Failed to create llama_context") etc.
            raise ModelError(f"llama.cpp could not load {path.name} with cache {self.k_type}/{self.v_type} ({exc})") from None
        finally:
            if previous is None:
                os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
            else:
                os.environ["LLAMA_ATTN_ROT_DISABLE"] = previous
        self.n_vocab = self.llm.n_vocab()
        kv_name = self.k_type if self.k_type == self.v_type else f"{self.k_type}/{self.v_type}"
        self.info = EngineInfo("llamacpp", metadata.version("llama-cpp-python"), kv_name, {
            "gguf": str(path), "type_k": self.k_type, "type_v": self.v_type, "flash_attn": self.flash,
            "n_ubatch": min(ubatch, ctx), "threads": threads, "rotation": rotation,
        })

    def score_window(self, tokens: torch.Tensor, score_from: int) -> WindowScores:
        import numpy as np
        import torch

        ids = [int(t) for t in tokens]
        if len(ids) > self.ctx:
            raise ConfigError(f"a window of {len(ids)} tokens does not fit the engine's context {self.ctx}")
        self.llm.reset()  # n_past = 0: eval() then clears the cache from position 0 on
        self.llm.eval(ids)
        logits = np.array(self.llm.scores[score_from : len(ids) - 1], dtype=np.float32, copy=True)
        return WindowScores(positions=torch.arange(score_from, len(ids) - 1), logits=torch.from_numpy(logits))

    def close(self) -> None:
        self.llm.close()
