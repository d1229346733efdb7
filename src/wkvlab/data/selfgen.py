"""Evaluation text written by the reference model itself (``--data selfgen`` or ``selfgen:<tokens>``).

KLD on human text measures the candidate where the reference is often unsure; on the model's own
samples it measures the distribution the model actually serves — the seed study evaluated on
full-precision agentic transcripts for the same reason. Prompts are cut from an embedded corpus
at evenly spaced offsets; the unquantized reference continues each by ancestral sampling
(temperature 1, no top-k/top-p by default: the model's own distribution, nothing trimmed) with a
fixed seed. Instruct models with a chat template get the prompt as a user turn ("Continue this
text: …") and the rendered conversation — special tokens included — is the document, so the
evaluation sees what a chat deployment sees. Documents are generated until the text holds the
requested number of tokens (a reply can end early at end-of-turn). Each sample (its prompt with
its continuation, as scored) is one document of the corpus (:func:`wkvlab.data.corpora.records_corpus`):
windows are spread across samples and intervals resample samples, whose windows share a prompt
and a sampling path; samples too short for the windows asked for fall back to the stream, as
the embedded corpora do (:func:`wkvlab.data.windows.cut_windows`).

Sampling takes minutes on a CPU, so the text is cached on disk, content-addressed by the model's
fingerprint, the seed, the token count and every generation setting (and the torch version,
since sampling streams may differ between versions). The cache keeps the samples one by one; an
entry written before it did (the joined text only) is sampled again, the same text, so its
document boundaries are known rather than guessed from blank lines a sample may contain.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from wkvlab.data.corpora import Corpus, load_corpus, records_corpus
from wkvlab.data.windows import tokenize
from wkvlab.errors import DataError
from wkvlab.io import write_json_atomic
from wkvlab.models.loading import LoadedModel, cache_dir

PREFIX = "selfgen"
Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class SelfGenSpec:
    n_tokens: int = 8192
    seed: int = 0
    source: str = "prose"  # the embedded corpus prompts are cut from
    prompt_tokens: int = 64
    continuation_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.n_tokens < 16:
            raise DataError(f"selfgen needs at least 16 tokens, got {self.n_tokens}; use e.g. --data selfgen:4096")
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise DataError("selfgen samples: temperature must be > 0 and top_p in (0, 1]")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "SelfGenSpec":
        return cls(**data)


def parse_selfgen(data: str, default_tokens: int = 8192) -> SelfGenSpec | None:
    """``selfgen`` → a spec for ``default_tokens``; ``selfgen:<n>`` → n tokens; anything else → None."""
    key = data.strip()
    if key.lower() != PREFIX and not key.lower().startswith(PREFIX + ":"):
        return None
    _, _, count = key.partition(":")
    if not count:
        return SelfGenSpec(n_tokens=default_tokens)
    if not count.isdigit():
        raise DataError(f"--data {data!r}: write selfgen or selfgen:<tokens>, e.g. selfgen:4096")
    return SelfGenSpec(n_tokens=int(count))


def cache_key(fingerprint: str, spec: SelfGenSpec) -> str:
    payload = {"model": fingerprint, "spec": spec.to_dict(), "torch": torch.__version__, "format": 1}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _prompt_ids(tokenizer, prompt_text: str) -> torch.Tensor:
    """The prompt as a chat user turn when the tokenizer has a template, else the plain text."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": f"Continue this text:\n\n{prompt_text}"}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return torch.tensor(ids, dtype=torch.long).reshape(-1)
    return tokenize(tokenizer, prompt_text)


@torch.no_grad()
def generate_documents(loaded: LoadedModel, spec: SelfGenSpec, progress: Progress | None = None) -> list[str]:
    """Sampled documents (prompt + continuation, chat-rendered when the model has a template)."""
    tick = progress or (lambda _d, _n: None)
    tokenizer, model = loaded.tokenizer, loaded.model
    source = tokenize(tokenizer, load_corpus(spec.source).text)
    n_docs_guess = math.ceil(spec.n_tokens / spec.continuation_tokens) + 1
    step = max((source.numel() - spec.prompt_tokens) // n_docs_guess, 1)
    eos = model.generation_config.eos_token_id or model.config.eos_token_id
    pad = eos[0] if isinstance(eos, (list, tuple)) else eos
    documents, total = [], 0
    threads = torch.get_num_threads()
    # Batch-1 decoding is a long chain of tiny ops: with two intra-op threads on a loaded 2-core
    # machine they spin-wait on each other (measured on SmolLM2: 0.32-0.43 s/token with 2 threads,
    # 0.09 s/token with 1). One thread while sampling; the caller's setting is restored.
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng():  # sampling must not disturb the caller's random state
            torch.manual_seed(spec.seed)
            i = 0
            while total < spec.n_tokens:
                offset = (i * step) % max(source.numel() - spec.prompt_tokens, 1)
                prompt_text = tokenizer.decode(source[offset : offset + spec.prompt_tokens])
                ids = _prompt_ids(tokenizer, prompt_text)[None]
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=spec.temperature,
                                     top_p=spec.top_p, top_k=0, max_new_tokens=spec.continuation_tokens,
                                     pad_token_id=pad if pad is not None else 0)
                documents.append(tokenizer.decode(out[0], skip_special_tokens=False))
                total += len(tokenize(tokenizer, documents[-1]))
                tick("self-generated document", 1)
                i += 1
    finally:
        torch.set_num_threads(threads)
    return documents


def selfgen_corpus(loaded: LoadedModel, spec: SelfGenSpec, progress: Progress | None = None) -> Corpus:
    """The self-generated text for ``loaded`` (from the disk cache when it was made before)."""
    key = cache_key(loaded.fingerprint, spec)
    path = cache_dir() / "selfgen" / f"{key}.json"
    name = f"{PREFIX}:{spec.n_tokens}"
    if path.is_file():
        try:
            samples = json.loads(path.read_text(encoding="utf-8"))["samples"]
            if isinstance(samples, list) and samples and all(isinstance(t, str) for t in samples):
                return records_corpus(name, samples)
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError, TypeError):
            pass  # a damaged (or pre-samples) cache entry is regenerated, never trusted
    documents = generate_documents(loaded, spec, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"model": loaded.name, "model_sha256": loaded.fingerprint, "spec": spec.to_dict(),
                             "torch": torch.__version__, "documents": len(documents), "samples": documents})
    return records_corpus(name, documents)
