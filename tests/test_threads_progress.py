"""Thread choice (option, environment, load-aware default) and the plain progress lines a log gets."""
from __future__ import annotations

import os
from pathlib import Path

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


@pytest.mark.parametrize("load, threads", [(0.0, 2), (0.3, 2), (0.5, 2), (0.6, 1), (1.0, 1), (1.4, 1), (3.9, 1), (40.0, 1)])
def test_default_leaves_busy_cores_alone(monkeypatch, load, threads):
    # idle cores rounded to nearest: load 0.3 on 2 cores leaves 1.7 idle, so 2 threads (issue #26); 0.6 leaves 1.4, so 1
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


def _grid_events(builds, windows, reference, cells, one_model=False):
    """(seconds, description, steps) the runner reports for a grid: builds are (label, seconds, layers),
    a calibrated build reporting per-layer fractions as wkvlab.weights.apply does; cells are per-KV seconds."""
    def build(label, seconds, layers):
        if layers == 1:
            return [(seconds, f"quantized weights {label}", 1.0)]
        return [(seconds / layers, f"quantizing {label}: layer {i + 1}/{layers}, about 1:00 left in this step", 1 / layers)
                for i in range(layers)] + [(0.0, f"quantized weights {label}", 0.0)]

    def passes(labels):
        return [(c, f"{w} × kv{k}", 1.0) for _ in range(windows) for w in labels for k, c in enumerate(cells)]

    events = []
    if one_model:  # the per-token reference first, then each weight config built in place and run
        events += [(reference, "reference", 1.0)] * windows
        for label, seconds, layers in builds:
            events += build(label, seconds, layers) + passes([label])
        return events
    for label, seconds, layers in builds:  # copies: every build first, then the windows (reference + cells)
        events += build(label, seconds, layers)
    for _ in range(windows):
        events += [(reference, "reference", 1.0)] + [(c, f"{w} × kv{k}", 1.0) for w, _, _ in builds for k, c in enumerate(cells)]
    return events


def _worst_eta_error(events, classes):
    from wkvlab.display import StepCosts

    clock = Clock()
    costs = StepCosts(sum(steps for _, _, steps in events), classes, clock)
    finish = sum(seconds for seconds, _, _ in events)
    worst, marked = 1.0, []
    for seconds, description, steps in events:
        clock.now += seconds
        costs.advance(description, steps)
        left, untimed = costs.remaining()
        truth = finish - clock.now
        if clock.now < 60 or truth < 5:
            continue
        ratio = left / truth
        marked.append(untimed)
        if untimed:  # something ahead is not timed yet: never an overestimate past 2x; the line says '+' (a lower bound)
            worst = max(worst, ratio)  # or, while the untimed steps may be most of what is left, 'estimating…' (issue 42)
            rest = costs.untimed_seconds()
            assert costs.text() == ("estimating…" if left < 1 or rest is None or rest > left else costs.text().rstrip("+") + "+")
        else:
            worst = max(worst, ratio, 1 / ratio)
    return worst, marked


DEMO = dict(builds=[("bf16", 0.3, 1), ("int8", 1.5, 1), ("int4-g128", 2.0, 1)], windows=8, reference=2.5, cells=[2.6, 3.2, 3.0, 3.1])
METHODS = dict(builds=[("none", 0.1, 1), ("int8", 2.0, 1), ("gptq-int4-g128", 300.0, 24), ("awq-int4-g128", 200.0, 24)],
               windows=8, reference=6.0, cells=[6.0, 6.5, 7.0])
CLASSES = {"bf16": "cheap", "int8": "cheap", "int4-g128": "cheap", "none": "cheap", "gptq-int4-g128": "calibrated", "awq-int4-g128": "calibrated"}


@pytest.mark.parametrize("grid, one_model", [(DEMO, False), (DEMO, True), (METHODS, False), (METHODS, True)])
def test_eta_weighs_steps_by_their_measured_cost_and_is_never_2x_off_after_a_minute(grid, one_model):
    events = _grid_events(**grid, one_model=one_model)
    worst, marked = _worst_eta_error(events, {label: CLASSES[label] for label, _, _ in grid["builds"]})
    assert worst <= 2.0, worst
    assert not any(marked[len(marked) // 2:])  # by the second half of the run everything ahead has been timed


def test_the_old_per_step_average_was_many_times_off_on_a_gptq_grid():
    # issue #26: "eta 3:12:50" four minutes into a grid that needed well under an hour
    events = _grid_events(**METHODS)
    clock = Clock()
    progress = PlainProgress(sum(s for _, _, s in events), "eval", lambda _: None, interval=0.0, clock=clock)  # no builds: the old rule
    for seconds, description, steps in events:
        clock.now += seconds
        progress.advance(description, steps)
        if clock.now >= 240:
            break
    old, _ = progress.costs.remaining()
    truth = sum(s for s, _, _ in events) - clock.now
    assert old > 5 * truth
    worst, _ = _worst_eta_error(events, {label: CLASSES[label] for label, _, _ in METHODS["builds"]})
    assert worst <= 2.0


def _specs(grid):
    from types import SimpleNamespace

    weights = [SimpleNamespace(label=label, needs_calibration=CLASSES[label] == "calibrated") for label, _, _ in grid["builds"]]
    return weights, [SimpleNamespace(needs_calibration=False)]


@pytest.mark.parametrize("one_model", [False, True])
def test_a_run_of_several_grids_counts_every_build_of_every_grid(one_model):
    """A sweep over two models (or explain's factorial, then its context grid) builds the same labels once per
    grid: the ETA counts each build (display.grids_classes), so it stays within 2x; counted once, it was not."""
    from wkvlab.display import grids_classes

    events = _grid_events(**METHODS, one_model=one_model) * 2
    pairs, calibrations = grids_classes([_specs(METHODS), _specs(METHODS)])
    assert calibrations == 0 and len(pairs) == 2 * len(METHODS["builds"])
    worst, _ = _worst_eta_error(events, pairs)
    assert worst <= 2.0, worst
    once, _ = _worst_eta_error(events, dict(pairs))  # each label counted once: the second grid's builds not foreseen
    assert once > 2.0, once


def test_every_long_running_command_passes_its_grids_to_the_eta():
    """eval/demo (cli.py), sweep, findings' sweeps and explain hand their grids to progress_bar."""
    root = Path(__file__).parents[1] / "src" / "wkvlab"
    for path in ["cli.py", "sweep/cli.py", "findings/run.py", "explain/cli.py"]:
        assert "grid=" in (root / path).read_text(), path


def test_a_command_that_cannot_list_its_builds_still_times_a_build_apart(monkeypatch):
    """search's profile (one GPTQ build, then passes) goes through progress_bar without a grid: the build is
    timed at its own rate when it comes and the passes at theirs, so after the first minute the ETA is never
    under half nor over twice the truth; the old per-step average put the build's cost on every pass."""
    from wkvlab import display

    events = _grid_events([("gptq-int4-g128", 300.0, 24)], windows=25, reference=2.0, cells=[2.0], one_model=True)
    events = [e for e in events if e[1] != "reference"][:25] + [(2.0, "K int4 layer 0", 1.0)] * 100
    seen = {}

    class Recorder(display.PlainProgress):
        def __init__(self, *args, builds=None, **kwargs):
            seen["builds"] = builds
            super().__init__(*args, builds=builds, **kwargs)

    monkeypatch.setattr(display, "PlainProgress", Recorder)
    with display.progress_bar(len(events), "profile") as _:
        pass
    clock = Clock()
    costs = display.StepCosts(sum(s for _, _, s in events), seen["builds"], clock)
    finish, ratios = sum(s for s, _, _ in events), []
    for seconds, description, steps in events:
        clock.now += seconds
        costs.advance(description, steps)
        left, untimed = costs.remaining()
        if clock.now < 60 or finish - clock.now < 5:
            continue
        if costs.current[0] is not None:  # building (the passes not timed yet: a lower bound, '+'): the build's own rest
            ratios.append(left / (300.0 - clock.now))
            assert untimed and costs.text() in ("estimating…", costs.text().rstrip("+") + "+")
            assert costs.text() == "estimating…" or costs.untimed_seconds() <= left  # a number only on a basis
        elif not untimed:
            ratios.append(left / (finish - clock.now))
    assert 0.5 <= min(ratios) and max(ratios) <= 2.0, (min(ratios), max(ratios))
    old, _ = _worst_eta_error(events, None)
    assert old > 10, old


def test_a_builds_float_remainder_tick_is_not_a_new_build():
    """quantize_with_progress ends with tick(1 − Σ fractions): float dust after the layers closed the build.
    Timed as a build of its own (seconds / 3e-7), it projected 160,042 hours for the rest of a findings grid."""
    from wkvlab.display import StepCosts

    clock = Clock()
    classes = {"none": "cheap", "gptq-int4-g128": "calibrated", "awq-int4-g128": "calibrated"}
    layers, build_seconds, pass_seconds, passes = 30, 120.0, 2.0, 64
    events = [(pass_seconds, "none × kv0", 1.0)] * passes
    fractions = [0.0333333] * layers  # the per-layer shares a real build reports: they sum to 1 − 1e-5, not 1
    for label in ("gptq-int4-g128", "awq-int4-g128"):
        events += [(build_seconds / layers, f"quantizing {label}: layer {i + 1}/{layers}", f) for i, f in enumerate(fractions)]
        events += [(0.5, f"quantized weights {label}", max(0.0, 1.0 - sum(fractions))), (20.0, f"calibrated KV statistics under {label}", 1.0)]
        events += [(pass_seconds, f"{label} × kv0", 1.0)] * passes
    costs = StepCosts(sum(s for _, _, s in events), classes, clock, kv_calibrations=3)
    finish = sum(s for s, _, _ in events)
    for seconds, description, steps in events:
        clock.now += seconds
        costs.advance(description, steps)
        left, _ = costs.remaining()
        truth = finish - clock.now
        if truth > 60:
            assert left < 2.5 * truth, (description, left, truth)


def test_the_demo_grids_first_eta_is_estimating_then_a_number_within_2x():
    """The demo's own log (make demo at load 12, 2026-12-06): bf16's cast 2 s, int8's and int4-g128's RTN 7 s each,
    the reference 13 s a window (the first window's text prepared with it), the cells 10, 10, 14 and 10 s. Its first line said 'eta 0:04+' — the two RTN builds priced at the
    cast's 2 s, the 104 passes left out — for a run of 17 minutes. Weighted by the cost model (wkvlab.costs), the
    timed cast is no basis for what is left: 'estimating…' until a pass is timed, then a number within 2x."""
    events = _grid_events(builds=[("bf16", 2.0, 1), ("int8", 7.0, 1), ("int4-g128", 7.0, 1)], windows=8, reference=13.0,
                          cells=[10.0, 10.0, 14.0, 10.0])
    clock, lines, times = Clock(), [], []
    progress = PlainProgress(sum(s for *_, s in events), "demo", lines.append, interval=0.0, clock=clock,
                             builds={"bf16": "cheap", "int8": "cheap", "int4-g128": "cheap"})
    finish = sum(e[0] for e in events)
    for seconds, description, steps in events:
        clock.now += seconds
        progress.advance(description, steps)
        times.append(clock.now)
    etas = [line.split(" eta ")[1].split(" · ")[0] for line in lines]
    assert etas[:3] == ["estimating…"] * 3  # before: '0:04+', '0:07+', '0:00+' read as almost done
    for eta, now in list(zip(etas, times))[3:-1]:  # from the first pass (the reference's) on: a number, never 2x off
        minutes, seconds = eta.rstrip("+").split(":")
        assert 0.5 <= (60 * int(minutes) + int(seconds)) / (finish - now) <= 2.0, (eta, finish - now)


def test_a_grid_with_nothing_left_to_run_says_so_in_one_line(capsys):
    """A resumed finding's finished grid has 0 steps: it used to print '0 steps' and '1e-09/1e-09 (100%) ... done'."""
    from wkvlab import display

    with display.progress_bar(0, "calibration-prose-default: 0 of 4 configs to run") as tick:
        tick("never", 1)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith("calibration-prose-default: 0 of 4 configs to run: nothing left to run"), lines
