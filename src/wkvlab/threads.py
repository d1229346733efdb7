"""How many CPU threads a run uses, chosen on purpose and reported.

torch's default is one intra-op thread per core, and its OpenMP threads spin-wait for each other
between operations. On a machine whose cores are shared with another busy process, a thread that
lost its core holds up the others at every barrier, and the small, sequential operations of a
forward pass or of GPTQ's column loop then run many times slower than on one thread (measured:
docs/threads.md, ``benchmarks/threads.py``). So the default is one thread unless the machine looks
free: the number of cores that other work leaves idle — by the 1-minute load average, or by what
runs right now when that is more — at least 1. ``--threads`` (every command that computes) or
``WKVLAB_THREADS`` overrides it.

The choice is printed in each run's header and recorded in its JSON (``threads``).
This module imports no torch at load time: the CLI parses and checks options before heavy imports.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

from wkvlab.errors import ConfigError

ENV = "WKVLAB_THREADS"


@dataclass(frozen=True)
class ThreadChoice:
    """The number of intra-op threads and why."""

    threads: int
    source: str  # "--threads", "WKVLAB_THREADS" or "auto"
    cores: int
    load: float | None = None  # 1-minute load average seen when choosing automatically

    def describe(self) -> str:
        if self.source == "auto":
            seen = f"load {self.load:.1f} on {self.cores} cores" if self.load is not None else f"{self.cores} cores"
            return f"{self.threads} thread{'s' * (self.threads != 1)} (auto: {seen}; set --threads or {ENV})"
        return f"{self.threads} thread{'s' * (self.threads != 1)} ({self.source})"

    def to_dict(self) -> dict:
        return asdict(self)


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _parse(value: str | int, where: str, cores: int) -> int:
    try:
        threads = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} {value!r} is not a whole number; give a thread count such as 1 or {cores}") from None
    if threads < 1:
        raise ConfigError(f"{where} {threads} must be at least 1 (this machine has {cores} cores)")
    return threads


def choose_threads(option: int | None = None, environ: dict[str, str] | None = None) -> ThreadChoice:
    """``--threads`` if given, else ``WKVLAB_THREADS``, else the idle cores the load average leaves."""
    cores = available_cores()
    if option is not None:
        return ThreadChoice(_parse(option, "--threads", cores), "--threads", cores)
    env = os.environ if environ is None else environ
    if env.get(ENV, "").strip():
        return ThreadChoice(_parse(env[ENV].strip(), ENV, cores), ENV, cores)
    load = busy_cores()
    if load is None:
        return ThreadChoice(1, "auto", cores)
    # Cores left idle by everything else, to the nearest core (halves up): a core less than half busy
    # counts as idle (load 0.3 on 2 cores: 2 threads), one more than half busy is not worth a spinning thread.
    idle = int(cores - load + 0.5)
    return ThreadChoice(max(1, min(cores, idle)), "auto", cores, round(load, 2))


def runnable_now(samples: int = 5, pause: float = 0.02) -> float | None:
    """Other processes running right now: the median over a few reads of /proc/loadavg's
    running-task count, less this process (Linux only; None elsewhere)."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg", encoding="ascii") as handle:
                counts.append(int(handle.read().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            return None
        if i + 1 < samples:
            time.sleep(pause)
    return float(sorted(counts)[len(counts) // 2])


def busy_cores() -> float | None:
    """How many cores other work keeps busy: the 1-minute load average, or what is running right now
    when that is more (the average lags a minute behind a job that has just started)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    now = runnable_now()
    if load is None:
        return now
    return load if now is None else max(load, now)


def apply_threads(choice: ThreadChoice) -> ThreadChoice:
    """Set torch's intra-op threads (imports torch: call it once options are checked)."""
    import torch

    torch.set_num_threads(choice.threads)
    return choice
