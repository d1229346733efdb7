"""Token windows without a transformers model: what engine-against-engine runs are scored on.

When the reference is an engine too (a served bf16 model, or llama.cpp with a 16-bit GGUF), the
reference never has to fit in this process's memory: only its tokenizer is loaded, to cut the text
into the same windows ``wkvlab eval`` would cut. A packaged name or a ``.gguf`` file gives the
tokenizer stored in the GGUF (read by transformers without dequantizing any tensor), a Hugging Face
folder its own tokenizer files.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wkvlab.data.corpora import Corpus, load_corpus
from wkvlab.data.windows import WindowSet, cut_windows, tokenizer_wants_bos
from wkvlab.errors import ConfigError, ModelError
from wkvlab.models.loading import _folder_fingerprint, _sha256, cache_dir
from wkvlab.models.packaged import canonical_name, packaged_gguf


@dataclass
class TokenWorkload:
    """A tokenizer, the text and its windows, and what identifies the tokenizer's model."""

    name: str
    tokenizer: object
    fingerprint: str
    corpus: Corpus
    windows: WindowSet


def load_tokenizer(spec: str) -> tuple[str, object, str]:
    """(name, tokenizer, fingerprint) of a packaged name, a ``.gguf`` file or a Hugging Face folder."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    packaged = canonical_name(spec)
    path = packaged_gguf(packaged) if packaged is not None else Path(spec).expanduser()
    name = packaged or (path.stem if path.is_file() else path.name)
    try:
        if path.is_file():
            if path.suffix.lower() != ".gguf":
                raise ModelError(f"--tokenizer {spec!r} is not a .gguf file; give 'default', a .gguf file or a Hugging Face folder")
            fingerprint = _sha256(path)
            # A model load already converted this GGUF's tokenizer and kept it (seconds saved on every run).
            cached = cache_dir() / "models" / f"{fingerprint[:16]}-float32"
            if (cached / "wkvlab-source.json").is_file():
                return name, AutoTokenizer.from_pretrained(str(cached)), fingerprint
            return name, AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name), fingerprint
        if path.is_dir():
            return name, AutoTokenizer.from_pretrained(str(path)), _folder_fingerprint(path)
    except ModelError:
        raise
    except Exception as exc:  # transformers raises many types for an unreadable tokenizer; all mean the same
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelError(f"could not load a tokenizer from {spec!r} ({first[:160]}); give 'default', a .gguf file or a Hugging Face folder") from None
    raise ModelError(f"tokenizer {spec!r} not found; give 'default', a .gguf file or a Hugging Face folder with tokenizer files")


def token_workload(tokenizer_spec: str, data: str, *, ctx: int, tokens: int, score: str = "all", bos: bool = False) -> TokenWorkload:
    """The windows ``wkvlab eval`` would cut, from the tokenizer alone; ``bos`` forces a BOS first."""
    if tokens < ctx:
        raise ConfigError(f"--tokens {tokens} is less than one window of --ctx {ctx}; ask for at least {ctx} tokens")
    corpus = load_corpus(data)  # first: a typo in --data should not cost a tokenizer load
    name, tokenizer, fingerprint = load_tokenizer(tokenizer_spec)
    bos_id = tokenizer.bos_token_id
    if bos and bos_id is None:
        raise ConfigError(f"{name}'s tokenizer has no BOS token, which the llama-cpp-python server needs to align its echo; use --flavor vllm or sglang")
    wants = bos or tokenizer_wants_bos(tokenizer)
    windows = cut_windows(corpus, tokenizer, ctx=ctx, n_tokens=tokens, bos_id=bos_id if wants else None, score=score)  # type: ignore[arg-type]
    return TokenWorkload(name, tokenizer, fingerprint, corpus, windows)
