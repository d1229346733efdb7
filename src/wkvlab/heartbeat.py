"""A progress line at least every ``interval`` seconds, even inside one step that takes minutes.

Progress lines used to come only when a step ended: a step with no steps inside it (KV statistics
for ``+scales=calculate``, the first layer of GPTQ, a SmoothQuant or AWQ search, a GGUF conversion,
the fingerprint of a big folder) left a log silent for minutes. A :class:`Heartbeat` watches the
time since its owner last wrote and, once ``interval`` has passed, asks the owner for a line saying
what is still running and for how long. A daemon thread polls it (every ``POLL`` seconds at most,
so a silence lasts at most ``interval + POLL``); tests call :meth:`Heartbeat.beat` themselves with
a fake clock. Torch-free: the display imports it before any model loads.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

POLL = 0.5  # seconds between the thread's checks


class Heartbeat:
    """Calls ``say(now)`` whenever nothing was written for ``interval`` seconds (0: never)."""

    def __init__(self, say: Callable[[float], None], interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.say, self.interval, self.clock = say, interval, clock
        self.lock = threading.RLock()  # the owner's lines and the beats never interleave
        self.last = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def spoke(self) -> None:
        """The owner just wrote a line: the next beat is due ``interval`` from now."""
        self.last = self.clock()

    def beat(self) -> bool:
        """Write a line if one is due; True when it did."""
        with self.lock:
            now = self.clock()
            if not self.interval or now - self.last < self.interval:
                return False
            self.last = now
            self.say(now)
            return True

    def start(self) -> "Heartbeat":
        if self.interval and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="wkvlab-heartbeat", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(min(POLL, self.interval)):
            self.beat()

    def __enter__(self) -> "Heartbeat":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
