"""The Python API of the engines: evaluate llama.cpp or a server, and the fidelity check.

    >>> from wkvlab.engines import api
    >>> r = api.evaluate_llamacpp("default", kv="q4_0", ctx=512, tokens=2048)
    >>> r.kld["mean"], r.to_dict()["engine"]
    >>> report = api.fidelity("default", ["q8_0", "q4_0", "q8_0/q4_0"], ctx=512, tokens=4096)
"""
from __future__ import annotations

from pathlib import Path

from wkvlab.engines.compare import FidelityReport, compare_engine
from wkvlab.engines.llamacpp import LlamaCppEngine, import_llama_cpp, parse_cache_types
from wkvlab.engines.openai import OpenAIEngine, ServerSpec
from wkvlab.engines.run import EngineEvalResult, engine_workload, evaluate_engine
from wkvlab.errors import ModelError
from wkvlab.eval.runner import Progress
from wkvlab.models.packaged import canonical_name, packaged_gguf


def resolve_gguf(gguf: str) -> Path:
    """A packaged model name (``default``, ``gemma3-270m``) or a path to a ``.gguf`` file."""
    if canonical_name(gguf) is not None:
        return packaged_gguf(gguf)
    path = Path(gguf).expanduser()
    if not path.is_file() or path.suffix.lower() != ".gguf":
        raise ModelError(f"--gguf {gguf!r} is not a .gguf file; give a GGUF path or 'default'")
    return path


def _reference_for(gguf: str, path: Path, reference: str | None) -> str:
    """The transformers reference: given, or the same checkpoint (packaged name keeps its short name)."""
    return reference or (gguf if canonical_name(gguf) is not None else str(path))


def evaluate_llamacpp(gguf: str = "default", kv: str = "f16", *, reference: str | None = None, data: str = "default",
                      ctx: int = 512, tokens: int = 4096, score: str = "all", flash_attn: str = "auto", threads: int = 2,
                      rotation: bool = True, progress: Progress | None = None) -> EngineEvalResult:
    """llama.cpp with cache ``kv`` (``q4_0`` or ``q8_0/q4_0``) against the float32 reference.

    ``reference`` defaults to the same GGUF dequantized by transformers, so both sides run the
    same weights and the result measures the engine (its cache, its kernels), not a checkpoint.
    """
    path = resolve_gguf(gguf)
    engine = LlamaCppEngine(path, kv, ctx=ctx, flash_attn=flash_attn, threads=threads, rotation=rotation)  # first: fails fast
    try:
        work = engine_workload(_reference_for(gguf, path, reference), data, ctx=ctx, tokens=tokens, score=score)
        return evaluate_engine(engine, work, progress=progress)
    finally:
        engine.close()


def evaluate_server(spec: ServerSpec, *, reference: str = "default", data: str = "default", ctx: int = 512,
                    tokens: int = 4096, score: str = "all", progress: Progress | None = None) -> EngineEvalResult:
    """An OpenAI-compatible server serving the reference's model, scored by its prompt log-probs."""
    work = engine_workload(reference, data, ctx=ctx, tokens=tokens, score=score, bos=spec.needs_bos)
    engine = OpenAIEngine(spec, work.loaded.tokenizer)
    # The first prompt token has no prediction in either API; with a BOS the server strips, neither has the second.
    return evaluate_engine(engine, work, progress=progress, score_from=1 if spec.needs_bos else 0)


def fidelity(gguf: str = "default", kv: list[str] | tuple[str, ...] = ("q8_0", "q4_0", "q4_1", "q5_0", "q8_0/q4_0"), *,
             reference: str | None = None, data: str = "default", ctx: int = 512, tokens: int = 4096, score: str = "all",
             rotation: bool = True, threads: int = 2, progress: Progress | None = None) -> FidelityReport:
    """Engine KLD vs simulated KLD per cache type, and the noise floor (see :mod:`wkvlab.engines.compare`)."""
    path = resolve_gguf(gguf)
    import_llama_cpp()  # before the reference model loads
    for kv_type in kv:
        parse_cache_types(kv_type)
    work = engine_workload(_reference_for(gguf, path, reference), data, ctx=ctx, tokens=tokens, score=score)
    return compare_engine(work, str(path), list(kv), rotation=rotation, threads=threads, progress=progress)


__all__ = ["ServerSpec", "EngineEvalResult", "FidelityReport", "resolve_gguf", "evaluate_llamacpp", "evaluate_server", "fidelity"]
