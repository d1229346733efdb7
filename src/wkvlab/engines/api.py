"""The Python API of the engines: evaluate llama.cpp or a server, and the fidelity check.

    >>> from wkvlab.engines import api
    >>> r = api.evaluate_llamacpp("default", kv="q4_0", ctx=512, tokens=2048)
    >>> r.kld["mean"], r.to_dict()["engine"]
    >>> ref = api.ServerSpec(url="http://127.0.0.1:8001/v1", model="bf16", flavor="vllm", topk=200)
    >>> results = api.evaluate_engines(ref, servers=[api.ServerSpec(url="http://127.0.0.1:8002/v1", model="awq", topk=200)])
    >>> report = api.fidelity("default", ["q8_0", "q4_0", "q8_0/q4_0"], ctx=512, tokens=4096)
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from wkvlab.engines.compare import FidelityReport, compare_engine
from wkvlab.engines.llamacpp import LlamaCppEngine, import_llama_cpp, parse_cache_types
from wkvlab.engines.openai import OpenAIEngine, ServerSpec
from wkvlab.engines.pair_run import evaluate_pair
from wkvlab.engines.run import EngineEvalResult, engine_workload, evaluate_engine
from wkvlab.engines.stored_run import evaluate_against_stored
from wkvlab.engines.tokens import token_workload
from wkvlab.eval.reference import StoredReference
from wkvlab.models.facts import model_facts
from wkvlab.errors import ConfigError, ModelError
from wkvlab.eval.runner import ModelShape, Progress
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
        if is_stored_reference(reference):
            work = token_workload(gguf, data, ctx=ctx, tokens=tokens, score=score)
            facts = model_facts(gguf)  # the cache's bytes per token, from the GGUF header (no model is loaded)
            shape = ModelShape(facts.layers, facts.kv_heads, facts.head_dim, ()) if facts else None
            return evaluate_against_stored(engine, StoredReference.load(Path(reference)), work, progress=progress, shape=shape)
        work = engine_workload(_reference_for(gguf, path, reference), data, ctx=ctx, tokens=tokens, score=score)
        return evaluate_engine(engine, work, progress=progress)
    finally:
        engine.close()


def is_stored_reference(reference: str | None) -> bool:
    """``--reference`` names a stored-reference file (``wkvlab reference save``) rather than a model."""
    return reference is not None and reference.lower().endswith(".safetensors")


def evaluate_server(spec: ServerSpec, *, reference: str = "default", data: str = "default", ctx: int = 512,
                    tokens: int = 4096, score: str = "all", progress: Progress | None = None, tokenizer: str = "default") -> EngineEvalResult:
    """An OpenAI-compatible server serving the reference's model, scored by its prompt log-probs.

    ``reference``: the transformers model, or a stored-reference file (then ``tokenizer`` cuts the windows).
    """
    if is_stored_reference(reference):
        work = token_workload(tokenizer, data, ctx=ctx, tokens=tokens, score=score, bos=spec.needs_bos)
        engine = OpenAIEngine(spec, work.tokenizer)
        return evaluate_against_stored(engine, StoredReference.load(Path(reference)), work, progress=progress,
                                       score_from=1 if spec.needs_bos else 0)
    work = engine_workload(reference, data, ctx=ctx, tokens=tokens, score=score, bos=spec.needs_bos)
    engine = OpenAIEngine(spec, work.loaded.tokenizer)
    # The first prompt token has no prediction in either API; with a BOS the server strips, neither has the second.
    return evaluate_engine(engine, work, progress=progress, score_from=1 if spec.needs_bos else 0)


def evaluate_engines(reference: ServerSpec | str, *, servers: Sequence[ServerSpec] = (), gguf: str | None = None,
                     kv: Sequence[str] = (), reference_kv: str = "f16", tokenizer: str | None = None, data: str = "default",
                     ctx: int = 512, tokens: int = 4096, score: str = "all", flash_attn: str = "auto", threads: int = 2,
                     rotation: bool = True, progress: Progress | None = None) -> list[EngineEvalResult]:
    """Engine against engine: every candidate against a reference engine, both scoring the same token ids.

    ``reference``: a :class:`ServerSpec` (e.g. the bf16 model served by vLLM) or a GGUF (packaged name or
    path) that llama.cpp runs in-process with cache ``reference_kv`` (full logits). Candidates: llama.cpp
    on ``gguf`` with each cache type of ``kv``, then each of ``servers``; the first candidate is the
    baseline of the others' paired ``kv_delta``. ``tokenizer`` cuts the windows (default: the reference
    GGUF, else the candidate GGUF, else ``default``); no transformers model is loaded.
    """
    cache_types = [parse_cache_types(k) for k in kv]  # fail fast on a typo, before anything loads
    if cache_types and gguf is None:
        raise ConfigError("llama.cpp candidates need a GGUF: pass --gguf")
    if not cache_types and not servers:
        raise ConfigError("give at least one candidate: --kv for llama.cpp in-process or --url for a server")
    parse_cache_types(reference_kv)
    ref_path = None if isinstance(reference, ServerSpec) else resolve_gguf(reference)
    cand_path = resolve_gguf(gguf) if gguf is not None else None
    if ref_path is not None or cache_types:
        import_llama_cpp()
    specs = list(servers) + ([reference] if isinstance(reference, ServerSpec) else [])
    bos = any(s.needs_bos for s in specs)
    source = tokenizer or (reference if ref_path is not None else None) or gguf or "default"
    work = token_workload(str(source), data, ctx=ctx, tokens=tokens, score=score, bos=bos)
    engines: list = []
    try:
        if ref_path is not None:
            ref_engine = LlamaCppEngine(ref_path, reference_kv, ctx=ctx, flash_attn=flash_attn, threads=threads, rotation=rotation)
            engines.append(ref_engine)
        else:
            ref_engine = OpenAIEngine(reference, work.tokenizer)  # type: ignore[arg-type]
        candidates: list = []
        for k in kv:
            engine = LlamaCppEngine(cand_path, k, ctx=ctx, flash_attn=flash_attn, threads=threads, rotation=rotation)  # type: ignore[arg-type]
            engines.append(engine)
            candidates.append(engine)
        candidates += [OpenAIEngine(spec, work.tokenizer) for spec in servers]
        # The first prompt token has no prediction in either API; with a BOS the server strips, neither has the second.
        return evaluate_pair(ref_engine, candidates, work, score_from=1 if bos else 0, progress=progress)
    finally:
        for engine in engines:
            engine.close()


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


__all__ = ["ServerSpec", "EngineEvalResult", "FidelityReport", "resolve_gguf", "evaluate_llamacpp", "evaluate_server", "evaluate_engines", "fidelity"]
