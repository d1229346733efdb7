"""OpenAI-compatible servers (vLLM, SGLang, llama-cpp-python's server): prompt log-probs with top-k.

Two ways a completions endpoint scores a prompt:

* ``prompt_logprobs`` (vLLM): ``{"prompt": [ids], "prompt_logprobs": k, "max_tokens": 1}``; the
  choice carries ``prompt_logprobs``, one dict per prompt token (the first is null) keyed by token
  id, holding the server's top-k and the prompt token itself.
* ``echo`` (OpenAI's legacy API; llama-cpp-python, SGLang): ``{"echo": true, "logprobs": k}``;
  ``choices[].logprobs`` lists the prompt's tokens as text, each one's log-prob and a top-k dict
  keyed by token *text* (mapped back to ids through :mod:`wkvlab.engines.pieces`).

Entry ``j`` of either list is the distribution that predicted prompt token ``j`` (query position
``j - 1``). Prompts go as token ids where the server takes them (vLLM, SGLang), so both sides
score the very same tokens; llama-cpp-python's server takes text only, so the window is decoded,
the server re-tokenizes it and the adapter checks, token by token, that the server's tokens are
the reference's — and refuses the window loudly when they are not.

llama-cpp-python (0.3.36) quirk: its echo log-probs are shifted one position when the prompt does
not start with BOS (entry j then describes the prediction of token j + 1, and the scored token's
log-prob is not reported). The ``llama-cpp-python`` flavour therefore starts every window with
the model's BOS token — the reference sees the same windows — and the server strips that BOS from
its echo, which puts its entries on OpenAI's convention.
"""
from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass

import torch

from wkvlab.engines.base import PAD_ID, EngineInfo, WindowScores
from wkvlab.engines.flavors import FLAVORS
from wkvlab.engines.http import RetryPolicy, ServerRefused, post_json
from wkvlab.engines.pieces import token_texts, unique_text_ids
from wkvlab.errors import ConfigError, DataError

APIS = ("prompt_logprobs", "echo")
PROMPTS = ("ids", "text")
# How servers word "you asked for more log-probs than I allow" (vLLM: "Requested prompt logprobs of
# 200, which is greater than max allowed: 20"; others: "max_logprobs", "top_logprobs ... <= 20").
_CAP_PATTERN = re.compile(r"(max(imum)?[ _]?(allowed|logprobs)|greater than|at most|less than or equal|<=)", re.IGNORECASE)


@dataclass(frozen=True)
class ServerSpec:
    """Where the server is and how to ask it; round-trips through JSON like every config."""

    url: str
    model: str
    flavor: str = "vllm"
    topk: int = 20
    batch: int = 1  # windows per request
    timeout: float = 120.0
    retries: int = 4
    backoff: float = 0.5

    def __post_init__(self) -> None:
        if self.flavor not in FLAVORS:
            raise ConfigError(f"unknown server flavour {self.flavor!r}; use one of {', '.join(FLAVORS)}")
        if not re.match(r"^https?://", self.url):
            raise ConfigError(f"--url {self.url!r} must start with http:// or https://, e.g. http://127.0.0.1:8000/v1")
        if not self.model:
            raise ConfigError("give the served model's name with --model (what the server lists under /v1/models)")
        if self.topk < 1:
            raise ConfigError(f"--topk must be at least 1, got {self.topk}")
        if self.batch < 1:
            raise ConfigError(f"--batch must be at least 1, got {self.batch}")
        if self.timeout <= 0 or self.retries < 0 or self.backoff < 0:
            raise ConfigError("--timeout must be positive, --retries and --backoff non-negative")

    @property
    def api(self) -> str:
        return FLAVORS[self.flavor][0]

    @property
    def prompt(self) -> str:
        return FLAVORS[self.flavor][1]

    @property
    def needs_bos(self) -> bool:
        return FLAVORS[self.flavor][2]

    @property
    def endpoint(self) -> str:
        return self.url.rstrip("/") + "/completions"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ServerSpec":
        return cls(**data)


class OpenAIEngine:
    """Scores windows through a completions endpoint; returns top-k log-probs per position."""

    def __init__(self, spec: ServerSpec, tokenizer, sleep=None):
        self.spec = spec
        self.tokenizer = tokenizer
        self.texts = token_texts(tokenizer)
        self.text_ids = unique_text_ids(self.texts)
        self.bos_id = tokenizer.bos_token_id
        self.policy = RetryPolicy(spec.timeout, spec.retries, spec.backoff)
        self._sleep = sleep
        # The client cannot see the server's cache type: the label names the served model and where it runs,
        # so several servers in one engine-vs-engine run stay apart.
        self.info = EngineInfo("openai", _server_version(spec.url), f"{spec.model}@{urllib.parse.urlsplit(spec.url).netloc}", {"server": spec.to_dict()})

    # ---- requests ------------------------------------------------------------------------

    def _payload(self, windows: list[list[int]]) -> dict:
        prompts: list = windows if self.spec.prompt == "ids" else [self.tokenizer.decode(w, skip_special_tokens=False, clean_up_tokenization_spaces=False) for w in windows]
        payload = {"model": self.spec.model, "prompt": prompts if len(prompts) > 1 else prompts[0], "max_tokens": 1, "temperature": 0.0}
        if self.spec.api == "prompt_logprobs":
            payload["prompt_logprobs"] = self.spec.topk
        else:
            payload.update(echo=True, logprobs=self.spec.topk)
        return payload

    def _post(self, payload: dict) -> dict:
        kwargs = {"sleep": self._sleep} if self._sleep else {}
        try:
            return post_json(self.spec.endpoint, payload, self.policy, **kwargs)
        except ServerRefused as exc:
            if "logprob" in exc.message.lower() and _CAP_PATTERN.search(exc.message):
                raise ConfigError(f"the server caps top-k log-probs below --topk {self.spec.topk} ({exc.message}); "
                                  "pass a smaller --topk, or raise the server's limit (vLLM: --max-logprobs)") from None
            raise ConfigError(f"the server refused the scoring request ({exc}); check --model, --flavor and that it serves completions with log-probs") from None

    def score_windows(self, windows: torch.Tensor, score_from: int) -> list[WindowScores]:
        """Score every window, ``batch`` per request, in order."""
        out: list[WindowScores] = []
        rows = [[int(t) for t in w] for w in windows]
        for start in range(0, len(rows), self.spec.batch):
            chunk = rows[start : start + self.spec.batch]
            answer = self._post(self._payload(chunk))
            choices = sorted(answer.get("choices") or [], key=lambda c: c.get("index", 0))
            if len(choices) != len(chunk):
                raise ConfigError(f"the server answered {len(choices)} choices for {len(chunk)} prompts; use --batch 1")
            for offset, (window, choice) in enumerate(zip(chunk, choices)):
                out.append(self._parse(choice, window, start + offset, score_from))
        return out

    def score_window(self, tokens: torch.Tensor, score_from: int) -> WindowScores:
        return self.score_windows(tokens[None], score_from)[0]

    # ---- answers -------------------------------------------------------------------------

    def _parse(self, choice: dict, window: list[int], index: int, score_from: int) -> WindowScores:
        if self.spec.api == "prompt_logprobs":
            entries = self._prompt_logprobs_entries(choice, window, index)
        else:
            entries = self._echo_entries(choice, window, index)
        # entries: {prompt token index j: {token id: logprob}}; j predicts token j from position j - 1
        positions = [j - 1 for j in sorted(entries) if j - 1 >= score_from]
        if not positions:
            raise DataError(f"window {index}: the server returned no usable prompt log-probs; it cannot score prompts with the {self.spec.api} API")
        width = max(len(entries[p + 1]) for p in positions)
        ids = torch.full((len(positions), width), PAD_ID, dtype=torch.long)
        logprobs = torch.zeros((len(positions), width), dtype=torch.float64)
        for row, p in enumerate(positions):
            items = list(entries[p + 1].items())
            ids[row, : len(items)] = torch.tensor([i for i, _ in items])
            logprobs[row, : len(items)] = torch.tensor([lp for _, lp in items], dtype=torch.float64)
        return WindowScores(positions=torch.tensor(positions), ids=ids, logprobs=logprobs, topk=self.spec.topk)

    def _prompt_logprobs_entries(self, choice: dict, window: list[int], index: int) -> dict[int, dict[int, float]]:
        raw = choice.get("prompt_logprobs")
        if not isinstance(raw, list):
            raise ConfigError("the server's answer has no prompt_logprobs: it cannot score prompts this way; try --flavor sglang or llama-cpp-python (echo)")
        if len(raw) != len(window):
            raise DataError(f"window {index}: the server scored {len(raw)} prompt tokens, the reference has {len(window)}; the server must use the same tokenizer")
        entries = {}
        for j in range(1, len(window)):
            entry = raw[j]
            if not entry:
                continue
            table = {int(t): float(v["logprob"] if isinstance(v, dict) else v) for t, v in entry.items()}
            if window[j] not in table:
                raise DataError(f"window {index}: prompt token {j} is not the reference's token {window[j]} ({self.texts[window[j]]!r}) on the server; "
                                "the server's tokens differ from the reference's — serve the same model and tokenizer")
            entries[j] = table
        return entries

    def _echo_entries(self, choice: dict, window: list[int], index: int) -> dict[int, dict[int, float]]:
        raw = choice.get("logprobs")
        if not isinstance(raw, dict) or not isinstance(raw.get("top_logprobs"), list):
            raise ConfigError("the server's answer has no echoed logprobs: it cannot score prompts with echo; try --flavor vllm (prompt_logprobs)")
        texts, token_lps, tops = raw.get("tokens") or [], raw.get("token_logprobs") or [], raw["top_logprobs"]
        skip = self._echo_offset(texts, window, index)
        entries = {}
        for e in range(1, len(window) - skip):
            j = e + skip  # prompt token index in the window
            if e >= len(tops) or tops[e] is None or token_lps[e] is None:
                continue
            table = {window[j]: float(token_lps[e])}
            for text, lp in tops[e].items():
                tid = self.text_ids.get(text)
                if tid is not None and tid not in table:
                    table[tid] = float(lp)
            entries[j] = table
        return entries

    def _echo_offset(self, texts: list[str], window: list[int], index: int) -> int:
        """0, or 1 when the server left a leading BOS out of its echo; refuses misaligned tokens."""
        starts = [0] + ([1] if window and window[0] == self.bos_id else [])
        best = (-1, 0, [], [])
        for skip in starts:
            expected = [self.texts[t] for t in window[skip:]]
            got = texts[: len(expected)]
            if got == expected:
                return skip
            where = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            # the reading that matched longest; on a tie, the one with BOS stripped (what servers do)
            best = max(best, (where, skip, got, expected), key=lambda b: (b[0], b[1]))
        where, skip, got, expected = best
        there = got[where] if where < len(got) else "<end>"
        here = expected[where] if where < len(expected) else "<end>"
        raise DataError(f"window {index}: the server's tokens differ from the reference's at token {where + skip} "
                        f"(server {there!r}, reference {here!r}); serve the same model and tokenizer, or use a flavour that sends token ids")


def _server_version(url: str) -> str:
    """Best effort: what /v1/models says it serves (for the result's record only)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=5) as response:
            data = json.loads(response.read().decode("utf-8"))
        return ",".join(str(m.get("id")) for m in data.get("data", [])) or "unknown"
    except Exception:  # noqa: BLE001 - informational only; scoring reports real failures
        return "unknown"
