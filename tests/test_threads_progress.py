"""Thread choice (option, environment, load-aware default) and the plain progress lines a log gets."""
from __future__ import annotations

import os

import pytest

from wkvlab.display import PlainProgress
from wkvlab.errors import ConfigError
from wkvlab.threads import ThreadChoice, choose_threads


def test_option_beats_environment_beats_load(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr("wkvlab.threads.runnable_now", lambda: 0.0)
    monkeypatch.setattr("wkvlab.threads.available_cores", lambda: 2)
    assert choose_threads(3, {"WKVLAB_THREADS": "1"}) == ThreadChoice(3, "--threads", 2)
    assert choose_threads(None, {"WKVLAB_THREADS": " 1 "}) == ThreadChoice(1, "WKVLAB_THREADS", 2)
    assert choose_threads(None, {}) == ThreadChoice(2, "auto", 2, 0.0)


@pytest.mark.parametrize("load, threads", [(0.0, 2), (0.2, 2), (0.3, 1), (1.0, 1), (3.9, 1), (40.0, 1)])
def test_default_leaves_busy_cores_alone(monkeypatch, load, threads):
    # idle cores = int(cores - load + 0.25): a core more than a quarter busy gets no thread of ours
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr("wkvlab.threads.runnable_now", lambda: 0.0)
    monkeypatch.setattr("wkvlab.threads.available_cores", lambda: 2)
    choice = choose_threads(None, {})
    assert choice.threads == threads and choice.source == "auto"
    assert f"load {load:.1f} on 2 cores" in choice.describe() and "WKVLAB_THREADS" in choice.describe()


def test_a_job_that_just_started_counts_before_the_average_sees_it(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.0, 0.0))  # the average still says idle
    monkeypatch.setattr("wkvlab.threads.available_cores", lambda: 2)
    monkeypatch.setattr("wkvlab.threads.runnable_now", lambda: 1.0)  # but one other process runs now
    assert choose_threads(None, {}) == ThreadChoice(1, "auto", 2, 1.0)


def test_runnable_now_reads_the_running_count(monkeypatch, tmp_path):
    from wkvlab import threads

    reads = iter(["0.00 0.00 0.00 3/100 7\n", "0.00 0.00 0.00 1/100 7\n", "0.00 0.00 0.00 2/100 7\n"])
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: __import__("io").StringIO(next(reads)) if path == "/proc/loadavg" else real_open(path, *a, **k))
    assert threads.runnable_now(samples=3, pause=0.0) == 1.0  # median of 2, 0, 1 others


@pytest.mark.parametrize("option, env, message", [(0, {}, "--threads 0 must be at least 1"),
                                                  (None, {"WKVLAB_THREADS": "two"}, "WKVLAB_THREADS 'two' is not a whole number")])
def test_bad_thread_counts_are_refused(option, env, message):
    with pytest.raises(ConfigError, match=message):
        choose_threads(option, env)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_plain_progress_prints_at_most_one_line_per_interval_with_a_real_eta():
    clock, lines = Clock(), []
    progress = PlainProgress(10, "eval", lines.append, interval=10.0, clock=clock)
    for step in range(1, 11):
        clock.now = 4.0 * step  # 4 s per step
        progress.advance(f"window {step}", 1)
    # the first step, then one line per 10 s (steps 4, 7, 10: 16 s, 28 s, 40 s), and the last
    assert [line.split(" · ")[1] for line in lines] == ["window 1", "window 4", "window 7", "window 10"]
    assert "eval 1/10 (10%) elapsed 0:04 eta 0:36" in lines[0]  # 9 steps left at 4 s each
    assert "eval 4/10 (40%) elapsed 0:16 eta 0:24" in lines[1]
    assert "10/10 (100%) elapsed 0:40 eta 0:00" in lines[-1]


def test_plain_progress_counts_fractional_layer_steps_and_finishes_an_upper_bound():
    clock, lines = Clock(), []
    progress = PlainProgress(4, "explain", lines.append, interval=0.0, clock=clock)
    for layer in range(1, 5):
        clock.now = float(layer)
        progress.advance(f"GPTQ layer {layer}/4", 0.25)
    assert "explain 1/4 (25%) elapsed 0:04 eta 0:12" in lines[-1]
    progress.finish()  # the planned total was an upper bound: the last line says done
    assert "explain 4/4 (100%)" in lines[-1] and lines[-1].endswith("done")
