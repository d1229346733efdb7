"""JSON over HTTP with timeouts and retries, for OpenAI-compatible servers (stdlib only).

Retried, with exponential backoff: connection failures (a server still starting), timeouts, 429
and 5xx. Not retried: other 4xx — the request itself is wrong, and sending it again cannot help;
the server's message is passed on so the caller can say what to change.
"""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable

from wkvlab.errors import ConfigError

RETRY_STATUS = (408, 429, 500, 502, 503, 504)


class ServerRefused(Exception):
    """A 4xx answer: ``status`` and the server's own message."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class RetryPolicy:
    timeout: float = 120.0  # seconds per request
    retries: int = 4  # attempts after the first
    backoff: float = 0.5  # seconds before the first retry; doubles each time


def server_message(body: bytes) -> str:
    """The error text of an OpenAI-style error body (``{"error": {"message": ...}}``, ``{"detail": ...}``)."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(data, dict):
        error = data.get("error", data.get("detail", data.get("message", data)))
        if isinstance(error, dict):
            error = error.get("message", error)
        return str(error)[:300]
    return text[:300]


def post_json(url: str, payload: dict, policy: RetryPolicy, sleep: Callable[[float], None] = time.sleep) -> dict:
    """POST ``payload``; the decoded JSON answer. Raises :class:`ServerRefused` on 4xx."""
    body = json.dumps(payload).encode("utf-8")
    last = ""
    for attempt in range(policy.retries + 1):
        if attempt:
            sleep(policy.backoff * 2 ** (attempt - 1))
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=policy.timeout) as response:
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            message = server_message(exc.read())
            if exc.code not in RETRY_STATUS:
                raise ServerRefused(exc.code, message) from None
            last = f"HTTP {exc.code}: {message}"
        except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            last = f"{type(reason).__name__}: {reason}"
        except ValueError as exc:  # a 200 whose body is not JSON: not an OpenAI server
            raise ConfigError(f"{url} answered with something that is not JSON ({exc}); is it an OpenAI-compatible server?") from None
    raise ConfigError(f"no answer from {url} after {policy.retries + 1} attempts ({last}); check the server is up, or raise --timeout/--retries")
