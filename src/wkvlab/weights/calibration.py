"""Calibration text by domain, cut so it never overlaps the evaluation text.

Domains: ``prose`` (pydoc topics) and ``code`` (stdlib source) are wkvlab's embedded corpora;
``math`` is generated here — worked arithmetic, algebra, calculus and number-theory exercises from
a fixed seed, so it needs no download and is identical on every machine; any other value is a
``.txt``/``.jsonl`` file or ``hf:<dataset>`` as ``--data`` accepts.

**Disjointness.** Evaluation windows are cut from the *start* of a corpus
(:func:`wkvlab.data.make_windows`); calibration samples are cut from its *end*: ``samples``
consecutive chunks of ``length`` tokens ending at the last token. When the calibration corpus is
the evaluation corpus, the caller passes how many leading tokens evaluation uses and a corpus too
short for both raises :class:`DataError` instead of silently overlapping.

Defaults are small (16 × 512 tokens) because calibration runs on the CPU: GPTQ's paper uses
128 × 2048 C4 tokens, AutoAWQ 128 × 512 pile-val tokens, SmoothQuant 512 × 512. Pass
``--calib-samples``/``--calib-len`` to match them.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from wkvlab.data.corpora import Corpus, load_corpus
from wkvlab.errors import ConfigError, DataError
from wkvlab.specio import reject_unknown_fields

if TYPE_CHECKING:  # torch only where tokens are cut: CalibrationSpec is parsed with the options, before heavy imports
    import torch

DOMAINS = ("prose", "code", "math")


@dataclass(frozen=True)
class CalibrationSpec:
    data: str = "prose"
    samples: int = 16
    length: int = 512

    def __post_init__(self) -> None:
        if self.samples < 1 or self.length < 16:
            raise ConfigError(f"calibration needs at least 1 sample of 16 tokens, got {self.samples} × {self.length}; raise --calib-samples/--calib-len")

    @property
    def label(self) -> str:
        return f"{self.data}:{self.samples}x{self.length}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CalibrationSpec":
        reject_unknown_fields(cls, data, "calibration")
        return cls(**data)


@dataclass(frozen=True)
class CalibrationSet:
    """Token samples ``[samples, length]`` and what identifies them (for the quantized-model cache)."""

    spec: CalibrationSpec
    tokens: torch.Tensor
    corpus_sha256: str

    @property
    def key(self) -> str:
        digest = hashlib.sha256(self.tokens.numpy().tobytes()).hexdigest()
        return f"{self.spec.label}:{digest[:16]}"


def math_text(n_chars: int = 400_000, seed: int = 0) -> str:
    """Deterministic math-like text: short worked exercises in plain English and notation."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < n_chars:
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 999)
        n = rng.randint(2, 6)
        kind = rng.randrange(6)
        if kind == 0:
            text = f"Compute {a} × {b} + {c}. First {a} × {b} = {a * b}, then {a * b} + {c} = {a * b + c}."
        elif kind == 1:
            text = (f"Solve {a}x + {b} = {c}. Subtract {b} from both sides: {a}x = {c - b}. "
                    f"Divide by {a}: x = {c - b}/{a} ≈ {(c - b) / a:.4f}.")
        elif kind == 2:
            text = f"Differentiate f(x) = {a}x^{n} − {b}x. By the power rule, f'(x) = {a * n}x^{n - 1} − {b}."
        elif kind == 3:
            g = _gcd(a * c, b * c)
            text = f"Find gcd({a * c}, {b * c}). By the Euclidean algorithm the greatest common divisor is {g}, so lcm = {a * b * c * c // g}."
        elif kind == 4:
            text = (f"Let f(x) = x^2 + {a}x − {b}. Then f({n}) = {n * n} + {a * n} − {b} = {n * n + a * n - b}, "
                    f"and the vertex lies at x = −{a}/2 = {-a / 2}.")
        else:
            text = (f"The sum 1 + 2 + … + {c} equals {c}·{c + 1}/2 = {c * (c + 1) // 2}; "
                    f"the integral of {a}x from 0 to {n} is {a}·{n}^2/2 = {a * n * n / 2}.")
        parts.append(text)
        size += len(text) + 1
    return "\n".join(parts)


def _gcd(x: int, y: int) -> int:
    while y:
        x, y = y, x % y
    return x


def calibration_corpus(data: str) -> Corpus:
    """The text of a calibration domain: ``math`` here, everything else via :func:`load_corpus`."""
    if data.strip().lower() == "math":
        return Corpus(name="math", text=math_text())
    return load_corpus(data)


def calibration_set(spec: CalibrationSpec, tokenizer, *, corpus: Corpus | None = None, reserved_tokens: int = 0,
                    spare: "torch.Tensor | None" = None, replicate: int = 0) -> CalibrationSet:
    """Cut ``spec.samples`` chunks of ``spec.length`` tokens from the end of the corpus.

    ``replicate`` r > 0: the r-th such block before the end instead, disjoint from the blocks of every
    other replicate — another calibration sample of the same size from the same text, for a build whose
    run-to-run variance goes into the interval (:mod:`wkvlab.stats.replicates`).

    ``reserved_tokens`` leading tokens belong to evaluation and are never used. ``spare``: tokens
    inside the reserved part that evaluation does not score either (the remainders of documents
    whose first windows it scores, :func:`wkvlab.data.windows.unused_remainders`); they are drawn
    on, just before the text's end, only when the text after the reserved part is too short — so
    a calibration set that fits after it is the same as without them. Each chunk starts with BOS
    when the tokenizer adds one, like the evaluation windows.
    """
    import torch

    from wkvlab.data.windows import tokenize, tokenizer_wants_bos

    corpus = corpus or calibration_corpus(spec.data)
    ids = tokenize(tokenizer, corpus.text)
    bos = tokenizer.bos_token_id if tokenizer_wants_bos(tokenizer) else None
    body = spec.length - (1 if bos is not None else 0)
    if replicate < 0:
        raise ConfigError(f"calibration replicate {replicate} must be ≥ 0")
    needed = spec.samples * body * (replicate + 1)
    pool = ids[min(reserved_tokens, ids.numel()):]
    if spare is not None and spare.numel() and needed > pool.numel():
        pool = torch.cat([spare.to(pool.dtype), pool])
    if needed > pool.numel():
        where = (f"lie outside the {reserved_tokens} evaluation tokens" if spare is None or not spare.numel()
                 else "are left outside the evaluation windows")
        replicas = f" ({replicate + 1} disjoint calibration samples, one per replicate)" if replicate else ""
        raise DataError(
            f"calibration on {corpus.name} needs {needed} tokens{replicas} but only {pool.numel()} {where}; "
            f"lower --calib-samples/--calib-len{' or --replicates' if replicate else ''}, evaluate fewer --tokens, "
            "or calibrate on another --calib domain"
        )
    end = pool.numel() - replicate * spec.samples * body
    tail = pool[end - spec.samples * body : end].reshape(spec.samples, body)
    if bos is not None:
        tail = torch.cat([torch.full((spec.samples, 1), bos, dtype=torch.long), tail], dim=1)
    return CalibrationSet(spec=spec, tokens=tail.contiguous(), corpus_sha256=corpus.sha256)
