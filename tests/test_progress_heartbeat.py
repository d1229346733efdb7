"""Progress that never goes quiet (issue 42): on a fake clock, no long step leaves the log silent for
more than 10 s, and the first ETA of a build is "estimating…" rather than a projection of its setup."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.conftest import tiny_llama
from wkvlab import display, heartbeat
from wkvlab.display import PlainProgress, StepCosts

INTERVAL = 10.0


class Timeline:
    """Fake time that moves only when work happens; every heartbeat alive is polled as it moves, as
    its thread does every ``heartbeat.POLL`` seconds."""

    def __init__(self) -> None:
        self.now, self.lines, self.beats = 0.0, [], []

    def __call__(self) -> float:
        return self.now

    def work(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = min(end, self.now + heartbeat.POLL)
            for beat in list(self.beats):
                beat.beat()

    def write(self, text: str) -> None:
        self.lines.append((self.now, text))

    def longest_silence(self, start: float = 0.0) -> float:
        stamps = [start] + [t for t, _ in self.lines] + [self.now]
        return max(b - a for a, b in zip(stamps, stamps[1:]))


@pytest.fixture
def timeline(monkeypatch):
    """Heartbeats on the fake clock, polled by the timeline instead of a thread; lines stamped in fake time."""
    line = Timeline()

    def start(self):
        self.clock, self.last = line, line.now
        line.beats.append(self)
        return self

    monkeypatch.setattr(heartbeat.Heartbeat, "start", start)
    monkeypatch.setattr(heartbeat.Heartbeat, "stop", lambda self: line.beats.remove(self) if self in line.beats else None)
    monkeypatch.setattr(display, "_plain_write", line.write)
    monkeypatch.setattr(display, "time", SimpleNamespace(monotonic=line))  # status()'s own clock
    monkeypatch.setattr(display, "_interval", lambda: INTERVAL)
    assert not display.err_console.is_terminal  # pytest captures stderr: the plain lines a log gets
    return line


def test_a_silent_step_gets_a_line_every_10_s_saying_how_long_it_has_run(timeline):
    progress = PlainProgress(4, "eval", timeline.write, INTERVAL, clock=timeline)
    with progress.heartbeat:
        timeline.work(3.0)
        progress.advance("reference", 1)
        timeline.work(95.0)  # one step of 95 s with nothing inside it
        progress.advance("quantized weights gptq-int4-g128", 1)
    assert timeline.longest_silence() <= INTERVAL
    still = [text for _, text in timeline.lines if "into this step" in text]
    assert len(still) == 10  # after the line at 3 s: beats at 12.5, 22, ..., 98 s (every 9.5 s, polled every 0.5 s)
    assert still[0].endswith("working, 0:10 into this step after reference")
    assert "eval 1/4 (25%)" in still[0]


def test_status_lines_keep_coming_while_a_model_converts_or_a_folder_hashes(timeline):
    with display.status("loading model.gguf and default text"):  # GGUF conversion, fingerprints, sweep planning
        timeline.work(42.0)
    texts = [text for _, text in timeline.lines]
    assert texts[0].endswith("loading model.gguf and default text ...") and texts[-1].endswith("done in 0:42")
    assert [t.split(": ", 1)[1] for t in texts[1:-1]] == ["still working, 0:10", "still working, 0:19", "still working, 0:28",
                                                           "still working, 0:38"]
    assert timeline.longest_silence() <= INTERVAL


def test_the_heartbeat_thread_really_beats():
    import time

    said = []
    with heartbeat.Heartbeat(said.append, 0.05):
        time.sleep(1.0)
    assert 3 <= len(said) <= 20  # one per 0.05 s at most; a loaded machine may delay the thread, not silence it


class _OpsCostTime(torch.overrides.TorchFunctionMode):
    """Every torch call costs fake time: calibration forwards, GPTQ's column loop, the AWQ and SmoothQuant
    searches and the passes alike, so a step with no progress call inside it is a silence."""

    def __init__(self, timeline: Timeline, seconds: float) -> None:
        super().__init__()
        self.timeline, self.seconds = timeline, seconds

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.timeline.now += self.seconds
        if self.timeline.now - getattr(self, "polled", 0.0) >= heartbeat.POLL:  # the thread's poll
            self.polled = self.timeline.now
            for beat in list(self.timeline.beats):
                beat.beat()
        return func(*args, **(kwargs or {}))


def _grid_under_progress(timeline, weights: str, kv: str, seconds_per_op: float = 0.05):
    """run_grid on a tiny model inside progress_bar, on fake time that every torch call moves."""
    from wkvlab.data.windows import make_windows
    from wkvlab.eval.runner import RunOptions, run_grid
    from wkvlab.kv.spec import KVSpec
    from wkvlab.weights import CalibrationSet, CalibrationSpec, WeightSpec

    model = tiny_llama(vocab_size=256)
    g = torch.Generator().manual_seed(0)
    windows = make_windows(torch.randint(0, 256, (256,), generator=g), ctx=64, n_tokens=128, bos_id=None)
    calibration = CalibrationSet(CalibrationSpec("prose", 8, 64), torch.randint(0, 256, (8, 64), generator=g), "test")
    w, k = WeightSpec.parse(weights), KVSpec.parse(kv)
    with display.progress_bar(100, "eval", grid=([w], [k])) as advance, _OpsCostTime(timeline, seconds_per_op):
        run_grid(model, windows, [w], [k], model_name="m", data_name="d", progress=advance, calibration=calibration, options=RunOptions())


@pytest.mark.parametrize("weights, kv", [("gptq-int4-g32", "fp16"), ("awq-int4-g32", "fp16"), ("w8a8-int8", "fp16"),
                                         ("none", "vllm@0.27:fp8_e4m3+scales=calculate")])
def test_no_long_step_is_silent_for_more_than_10_s(timeline, monkeypatch, tmp_path, weights, kv):
    monkeypatch.setenv("WKVLAB_CACHE", str(tmp_path))  # built and calibrated now, not read back
    _grid_under_progress(timeline, weights, kv)
    assert timeline.now > 60  # the run lasted minutes of fake time
    assert timeline.lines[1][0] <= INTERVAL  # the first line after the header within 10 s
    assert timeline.longest_silence() <= INTERVAL


def test_kv_statistics_report_each_sample(timeline, monkeypatch, tmp_path):
    monkeypatch.setenv("WKVLAB_CACHE", str(tmp_path))
    reported = []
    monkeypatch.setattr(display.StepCosts, "advance", lambda self, d, s, real=display.StepCosts.advance: (reported.append((d, s)), real(self, d, s)))
    _grid_under_progress(timeline, "none", "vllm@0.27:fp8_e4m3+scales=calculate")
    samples = [(d, s) for d, s in reported if d.startswith("calibrated KV statistics under none: sample")]
    assert [d.rsplit(" ", 1)[1] for d, _ in samples] == [f"{i}/8" for i in range(1, 9)]
    assert sum(s for _, s in samples) == pytest.approx(1.0)


def test_first_build_eta_is_estimating_then_the_rate_after_the_first_layer():
    """GPTQ on 24 layers: the first 60 s (it gathers the calibration inputs), then 20 s a layer — 520 s.
    Projected from the first layer, 1440 s (the 5x of issue 42); here "estimating…", then 440 s left exactly."""
    clock = type("C", (), {"now": 0.0, "__call__": lambda self: self.now})()
    costs = StepCosts(25, {"gptq-int4-g128": "calibrated"}, clock)
    clock.now = 60.0
    costs.advance("quantizing gptq-int4-g128: GPTQ layer 1/24", 1 / 24)
    assert costs.text() == "estimating…"
    clock.now = 80.0
    costs.advance("quantizing gptq-int4-g128: GPTQ layer 2/24", 1 / 24)
    left, _ = costs.remaining()
    assert left == pytest.approx(22 * 20.0)
    assert costs.text() == "7:20+"  # the window pass after it is not timed yet: a lower bound


def test_the_build_line_says_estimating_before_its_second_layer(monkeypatch):
    from wkvlab.weights import apply

    now = [0.0]
    monkeypatch.setattr(apply.time, "monotonic", lambda: now[0])

    def fake_build(model, spec, calibration, *, progress, **kwargs):
        for layer, seconds in enumerate([60.0, 20.0, 20.0, 20.0]):
            now[0] += seconds
            progress(f"GPTQ layer {layer + 1}/4", 0.25)
        return "built"

    monkeypatch.setattr(apply, "quantize_model_weights", fake_build)
    said = []
    apply.quantize_with_progress(None, apply.WeightSpec.parse("gptq-int4-g128"), None, None, lambda d, s: said.append(d))
    assert said[0] == "quantizing gptq-int4-g128: GPTQ layer 1/4, estimating the time left in this step"
    assert said[1] == "quantizing gptq-int4-g128: GPTQ layer 2/4, about 0:40 left in this step"  # 2 layers at 20 s, not at 70 s
    assert said[-1] == "quantized weights gptq-int4-g128"
