"""A scripted OpenAI-compatible server on loopback, and a tiny tokenizer, for adapter tests.

The "model" is a bigram table: the distribution after token t is softmax(TABLE[t]). The server
answers vLLM's ``prompt_logprobs`` or OpenAI's ``echo`` format from it, so tests know the exact
numbers the adapter must recover.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

VOCAB = 40
torch.manual_seed(123)
TABLE = torch.randn(VOCAB, VOCAB).double() * 2


def bigram_logits(tokens: list[int], table: torch.Tensor | None = None) -> torch.Tensor:
    """Logits at every position of ``tokens`` (``[len, VOCAB]``), position i predicting token i + 1."""
    return (TABLE if table is None else table)[torch.tensor(tokens)]


class TinyTokenizer:
    """SentencePiece-like vocabulary: id 0 is BOS (special), id i prints as " w<i>"; ids 38 and 39 print alike."""

    bos_token_id = 0
    all_special_ids = [0]

    def __len__(self):
        return VOCAB

    def convert_ids_to_tokens(self, ids):
        return ["<s>" if i == 0 else ("▁dup" if i >= VOCAB - 2 else f"▁w{i}") for i in ids]

    def decode(self, ids, **_kwargs):
        return "".join("<s>" if i == 0 else (" dup" if i >= VOCAB - 2 else f" w{i}") for i in ids)


def text_of(i: int) -> str:
    return "" if i == 0 else (" dup" if i >= VOCAB - 2 else f" w{i}")


def prompt_logprobs_answer(prompt: list[int], k: int, shift_token: int | None = None, table: torch.Tensor | None = None) -> dict:
    lp = torch.log_softmax(bigram_logits(prompt, table), -1)
    entries = [None]
    for j in range(1, len(prompt)):
        row = lp[j - 1]
        actual = prompt[j] if shift_token is None or j != 3 else shift_token  # server "tokenized" differently
        top = row.topk(k).indices.tolist()
        entry = {str(t): {"logprob": float(row[t]), "rank": 1} for t in top}
        entry[str(actual)] = {"logprob": float(row[actual]), "rank": 99}
        entries.append(entry)
    return {"choices": [{"index": 0, "text": "x", "prompt_logprobs": entries}]}


def echo_answer(prompt: list[int], k: int, strip_bos: bool = False, rename: dict | None = None) -> dict:
    """OpenAI echo: entry j = prediction of prompt token j (first null); top-k keyed by text."""
    lp = torch.log_softmax(bigram_logits(prompt), -1)
    start = 1 if strip_bos and prompt[0] == 0 else 0
    tokens, token_lps, tops = [], [], []
    for j in range(start, len(prompt)):
        text = (rename or {}).get(j, text_of(prompt[j]))
        tokens.append(text)
        if j == start:
            token_lps.append(None)
            tops.append(None)
            continue
        row = lp[j - 1]
        top = {text_of(t): float(row[t]) for t in row.topk(k).indices.tolist()}
        top[text] = float(row[prompt[j]])
        token_lps.append(float(row[prompt[j]]))
        tops.append(top)
    return {"choices": [{"index": 0, "text": " w1", "logprobs": {"tokens": tokens + [" w1"], "token_logprobs": token_lps + [-1.0],
                                                                "top_logprobs": tops + [{" w1": -1.0}], "text_offset": []}}]}


class FakeServer:
    """``handler(payload) -> (status, body dict, delay seconds)``; records every payload."""

    def __init__(self, handler):
        self.handler = handler
        self.payloads: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.payloads.append(payload)
                status, body, delay = outer.handler(payload)
                time.sleep(delay)
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out first
                    pass

            def do_GET(self):  # noqa: N802
                data = json.dumps({"data": [{"id": "tiny"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_exc):
        self.httpd.shutdown()
        self.httpd.server_close()
