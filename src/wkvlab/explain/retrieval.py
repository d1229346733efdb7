"""A synthetic long-context retrieval task, generated offline and deterministically.

Each item plants one fact, "The secret code of <name> is <4 digits>.", at a depth (0 = the start,
1 = just before the question) of filler text cut from an embedded corpus, then asks for it:

    <filler …> The secret code of Mira is 4721. <… filler>

    Question: What is the secret code of Mira?
    Answer: The secret code of Mira is 4721

Pieces are tokenized separately and joined as token ids, so the fact and the answer occupy known
positions whatever the filler is. One teacher-forced forward per item gives both measures:

* **correct**: every answer token is the argmax given the correct prefix — exactly the condition
  for greedy decoding to produce the answer, without running a generation loop;
* **answer log-prob**: Σ log p(answer token), which separates configs even where a small model
  cannot retrieve reliably (its drop from the reference is paired, item by item).

Random 4-digit codes cannot be guessed from the filler, so a correct answer means the model read
the fact. The candidate's KV cache is simulated teacher-forced (:func:`kv_quantization`), which
equals the quantize-on-write cache on every causal format (docs/kv.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from wkvlab.runtime import input_device
from wkvlab.data.windows import tokenize
from wkvlab.errors import ConfigError, DataError
from wkvlab.kv.calibrate import KVStats
from wkvlab.kv.hook import kv_quantization
from wkvlab.kv.spec import KVSpec

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
NAMES = ("Mira", "Tobias", "Anika", "Rafael", "Selma", "Oskar", "Lena", "Dario", "Ines", "Viktor",
         "Nadia", "Hugo", "Elif", "Marek", "Greta", "Yusuf", "Clara", "Emil", "Sofia", "Jonas")
Progress = Callable[[str, int], None]


@dataclass(frozen=True, eq=False)
class RetrievalItem:
    depth: float
    name: str
    code: str
    ids: torch.Tensor  # [tokens] the whole sequence, answer included
    answer_start: int  # index of the first answer token in ids

    @property
    def answer_len(self) -> int:
        return int(self.ids.numel()) - self.answer_start


def build_items(tokenizer, text: str, *, ctx: int = 1024, depths=DEPTHS, per_depth: int = 4, seed: int = 0,
                bos_id: int | None = None) -> list[RetrievalItem]:
    """``per_depth`` items at each depth, each about ``ctx`` tokens long, from ``text``'s tokens."""
    if any(not 0.0 <= d <= 1.0 for d in depths):
        raise ConfigError(f"retrieval depths must lie in [0, 1], got {list(depths)}")
    filler = tokenize(tokenizer, text)
    rng = np.random.default_rng(seed)
    items = []
    for d in depths:
        for _ in range(per_depth):
            name = NAMES[int(rng.integers(len(NAMES)))]
            code = str(int(rng.integers(1000, 10000)))
            fact = tokenize(tokenizer, f" The secret code of {name} is {code}. ")
            question = tokenize(tokenizer, f"\n\nQuestion: What is the secret code of {name}?\nAnswer: The secret code of {name} is")
            answer = tokenize(tokenizer, f" {code}")
            n_filler = ctx - fact.numel() - question.numel() - answer.numel() - (1 if bos_id is not None else 0)
            if n_filler < 16:
                raise ConfigError(f"--max-ctx {ctx} leaves the retrieval step no room for filler; use --max-ctx {ctx - n_filler + 64} or more, or --skip retrieval")
            if filler.numel() <= n_filler:
                raise DataError(f"the filler text has {filler.numel()} tokens, fewer than the {n_filler} one item needs; use a smaller context")
            start = int(rng.integers(0, filler.numel() - n_filler))
            body = filler[start : start + n_filler]
            cut = int(round(d * n_filler))
            parts = [body[:cut], fact, body[cut:], question]
            if bos_id is not None:
                parts.insert(0, torch.tensor([bos_id]))
            prefix = torch.cat(parts)
            items.append(RetrievalItem(d, name, code, torch.cat([prefix, answer]), int(prefix.numel())))
    return items


@torch.no_grad()
def score_items(model: torch.nn.Module, items: list[RetrievalItem], kv: KVSpec | None = None,
                stats: KVStats | None = None, progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(answer log-prob, greedy-correct) per item, teacher-forced, under ``kv`` when given."""
    tick = progress or (lambda _d, _n: None)
    spec = kv or KVSpec.parse("fp16")
    logprob, correct = np.zeros(len(items)), np.zeros(len(items), dtype=bool)
    with kv_quantization(model, spec, stats=stats):
        for i, item in enumerate(items):
            logits = model(input_ids=item.ids[None].to(input_device(model)), use_cache=False).logits[0]
            rows = logits[item.answer_start - 1 : -1].float()  # the positions that predict the answer tokens
            targets = item.ids[item.answer_start :].to(rows.device)
            lp = torch.log_softmax(rows, -1).gather(-1, targets[:, None])[:, 0]
            logprob[i] = float(lp.sum())
            correct[i] = bool((rows.argmax(-1) == targets).all())
            tick("retrieval item", 1)
    return logprob, correct


@dataclass(frozen=True, eq=False)
class RetrievalResult:
    weights: str
    kv: str
    ctx: int
    depths: np.ndarray  # per item
    ref_logprob: np.ndarray
    ref_correct: np.ndarray
    logprob: np.ndarray
    correct: np.ndarray

    def per_depth(self) -> list[dict]:
        rows = []
        for d in sorted(set(self.depths.tolist())):
            m = self.depths == d
            rows.append({
                "depth": d,
                "items": int(m.sum()),
                "reference_accuracy": float(self.ref_correct[m].mean()),
                "accuracy": float(self.correct[m].mean()),
                "reference_answer_logprob": float(self.ref_logprob[m].mean()),
                "answer_logprob": float(self.logprob[m].mean()),
                "logprob_drop": float((self.ref_logprob[m] - self.logprob[m]).mean()),
            })
        return rows

    def to_dict(self) -> dict:
        return {
            "weights": self.weights,
            "kv": self.kv,
            "ctx": self.ctx,
            "items": int(self.depths.size),
            "reference_accuracy": float(self.ref_correct.mean()),
            "accuracy": float(self.correct.mean()),
            "logprob_drop": float((self.ref_logprob - self.logprob).mean()),
            "per_depth": self.per_depth(),
        }

    def lines(self) -> list[str]:
        rows = self.per_depth()
        worst = max(rows, key=lambda r: r["logprob_drop"])
        acc = " / ".join(f"{r['accuracy']:.0%}" for r in rows)
        depths = ", ".join(f"{r['depth']:g}" for r in rows)
        return [
            f"retrieval at {self.ctx} tokens (depths {depths}): accuracy {acc} "
            f"(reference {self.ref_correct.mean():.0%} overall, candidate {self.correct.mean():.0%})",
            f"answer log-prob falls by {(self.ref_logprob - self.logprob).mean():.3f} nats on average, most at depth "
            f"{worst['depth']:g} ({worst['logprob_drop']:.3f})",
        ]


def retrieval_eval(
    reference: torch.nn.Module,
    candidate: torch.nn.Module,
    kv: KVSpec,
    items: list[RetrievalItem],
    *,
    weights_label: str = "none",
    stats: KVStats | None = None,
    reference_scores: tuple[np.ndarray, np.ndarray] | None = None,
    progress: Progress | None = None,
) -> RetrievalResult:
    """Score ``items`` with the reference (or reuse ``reference_scores``) and the candidate under ``kv``."""
    ref_lp, ref_ok = reference_scores if reference_scores is not None else score_items(reference, items, progress=progress)
    lp, ok = score_items(candidate, items, kv, stats, progress)
    return RetrievalResult(weights_label, kv.label, int(max(i.ids.numel() for i in items)),
                           np.array([i.depth for i in items]), ref_lp, ref_ok, lp, ok)
