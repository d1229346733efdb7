"""Issue 41 item 1: --probe-budget holds as a user runs it, on a fake clock with a slow (loaded) machine.

A 180 s budget became 466-690 s of wall time on a machine with load 13-15, the model load not
counted: the probe was sized on a FLOP prior. Here every second from the probe's start counts, the
rest is sized on measured time, and what the budget cannot afford is named and never recommended.
"""
from __future__ import annotations

import pytest

from tests.test_progress_heartbeat import Timeline, timeline  # noqa: F401 - the fake-clock fixture, heartbeats polled by it
from wkvlab.kv.spec import KVSpec
from wkvlab.plan import plan
from wkvlab.plan.measured import Measurement
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.probe import Probe, token_pass_seconds
from wkvlab.plan.source import resolve_source
from wkvlab.weights.spec import WeightSpec

BUDGET = 120.0


class SlowMachine:
    """wkvlab eval's path on a fake clock: a load of ``load_s``, each token and pass ``slowdown`` times the prior's
    estimate (a loaded machine), each weight build ``build_s``; every pass of a probe is recorded."""

    def __init__(self, line: Timeline, model: ModelDescription, slowdown: float, load_s: float, build_s: float = 0.0) -> None:
        self.line, self.load_s, self.build_s = line, load_s, build_s
        self.rate = slowdown * token_pass_seconds(model, 1)
        self.runs: list[tuple[int, list[str], list[str]]] = []

    def load(self, target, data, ctx, tokens):
        self.line.work(self.load_s)
        return {"ctx": ctx, "windows": tokens // ctx}

    def recut(self, work, data, ctx, tokens):
        return {"ctx": ctx, "windows": tokens // ctx}

    def windows(self, work):
        return work["windows"]

    def threads(self):
        return 1

    def check(self, work, kv):
        pass

    def run(self, work, model_name, weights, kv, progress, title):
        builds = 0 if weights == [WeightSpec.parse("none")] else len(weights)
        tokens = work["ctx"] * work["windows"]
        engine = any(k.name.startswith("llamacpp:") for k in kv)  # llama.cpp's baseline: a setup of its own, slower passes
        with progress(1, title) as tick:
            self.line.work(10.0 if engine else 0.0)
            tick("quantized weights", 1)
            self.line.work(tokens * (1 + len(weights) * len(kv)) * self.rate * (1.5 if engine else 1.0) + builds * self.build_s)
        self.runs.append((work["windows"], [w.label for w in weights], [k.label for k in kv]))
        return [(w, k, _measurement(model_name, w, k, tokens)) for w in weights for k in kv], []


def _measurement(model: str, w: WeightSpec, k: KVSpec, tokens: int) -> Measurement:
    return Measurement(model, "default", 64, tokens, w.label, k.label, 0.001, 0.0001, "fake probe", w.to_dict(), k.to_dict(),
                       top1=0.99, low=0.0008, high=0.0012, kind="probe")


def _probe(line: Timeline, machine: SlowMachine, said: list[str]) -> Probe:
    probe = Probe(None, budget_s=BUDGET, explicit=False, say=said.append, clock=line, backend=machine, interval=10.0)
    probe.applies = lambda source: True  # the folder of the test has no weights: the fake machine "loads" it
    return probe


def test_the_budget_holds_when_every_step_is_five_times_slower_than_the_prior(model_dir, timeline):
    line = timeline
    desc, source = resolve_source(str(model_dir))
    machine = SlowMachine(line, desc, slowdown=5.0, load_s=25.0, build_s=8.0)
    said: list[str] = []
    probe = _probe(line, machine, said)
    kv = [KVSpec.parse(s) for s in ("int8", "fp8_e4m3", "int4", "kivi4", "llamacpp:q8_0")]
    weights = [WeightSpec.parse(s) for s in ("int8", "int4-g128", "int4-g32")]
    found = probe(desc, source, kv, weights, 4096)
    assert line.now <= 1.15 * BUDGET  # the load (25 s) counted; the old prior would have planned ~5x the budget
    assert probe.cost.seconds == pytest.approx(line.now) and probe.cost.load_seconds == 25.0
    pilot, *measured = machine.runs
    assert pilot == (1, ["none"], ["int8", "fp8_e4m3", "int4", "kivi4"])  # one window timed first, its numbers dropped
    assert (1, ["none"], ["llamacpp:q8_0"]) in measured  # llama.cpp's setup and slower passes: timed on a window of their own first
    assert any("after 10.0 s of setup per run" in s for s in said)
    measured = [run for run in measured if run[0] > 1]
    assert all(windows == measured[0][0] >= 8 for windows, _, _ in measured)  # every kept measurement on the same windows, 8+
    done = {(m.weights, m.kv) for m in found}
    assert probe.cost.configs == len(done) < 8 and probe.cost.unmeasured  # it could not afford everything
    left = [tuple(s.split(" x ")) for s in probe.cost.unmeasured]
    assert not set(left) & done and len(left) + len(done) == 8  # every config either measured or named as left
    note = next(n for n in probe.notes if "--probe-budget 120 s left no time to measure these configurations" in n)
    assert all(f"{w} x {k}" in note for w, k in left) and "not recommended" in note and "wkvlab eval --model" in note
    assert said[0].endswith("eta estimating… until a window is timed")  # no ETA before anything is timed
    assert any("ms per token and pass on this machine now" in s for s in said)
    beats = [s for s in said if "of the 120 s budget used (" in s]
    assert beats and "eta estimating…" in beats[0] and any(s.split("eta ")[1][0].isdigit() for s in beats[1:])


def test_a_machine_that_slows_down_mid_probe_shrinks_what_is_planned_next(model_dir, timeline):
    line = timeline
    """The rate is re-measured after each group: load rising after the pilot does not carry the probe past the budget."""
    desc, source = resolve_source(str(model_dir))
    machine = SlowMachine(line, desc, slowdown=2.0, load_s=5.0, build_s=2.0)
    original = machine.run

    def slower(*args):
        found = original(*args)
        machine.rate *= 1.5  # the machine gets busier after every run
        return found

    machine.run = slower
    said: list[str] = []
    probe = _probe(line, machine, said)
    weights = [WeightSpec.parse(s) for s in ("int8", "int4-g128", "int4-g64", "int4-g32", "int3-g128")]
    probe(desc, source, [KVSpec.parse("int8")], weights, 4096)
    assert line.now <= 1.15 * BUDGET
    assert probe.cost.unmeasured  # the weight formats it could no longer afford


def test_configs_the_budget_left_unmeasured_are_not_recommended(model_dir, timeline):
    line = timeline
    desc, _ = resolve_source(str(model_dir))
    machine = SlowMachine(line, desc, slowdown=40.0, load_s=30.0)
    said: list[str] = []
    probe = _probe(line, machine, said)
    result = plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", probe=probe)
    assert line.now <= 1.15 * BUDGET
    measured = {m.kv for m in probe.done.values()}
    left = {s.split(" x ")[1] for s in probe.cost.unmeasured}
    assert measured and left and not measured & left
    rows = {r.kv: r for r in result.rows if r.weights == "bf16"}
    for kv in left:
        assert not rows[kv].quality.is_measured and not rows[kv].recommendable, kv
        assert not any(rec.kv == kv for rec in result.recommendations)
    assert all(rows[kv].quality.is_measured and rows[kv].recommendable for kv in measured)  # what was measured may be recommended
    assert any("left no time to measure these configurations" in n and all(kv in n for kv in left) for n in result.notes)
    assert result.probe_cost["unmeasured"] == probe.cost.unmeasured and result.probe_cost["load_seconds"] == 30.0


def test_a_kind_of_run_that_cannot_fit_is_not_even_timed(model_dir, timeline):
    """A 30 s budget after a 21 s load: llama.cpp's pilot (a setup of its own) would have run the probe 50% over."""
    desc, source = resolve_source(str(model_dir))
    machine = SlowMachine(timeline, desc, slowdown=5.0, load_s=21.0)
    probe = Probe(None, budget_s=30.0, explicit=False, say=[].append, clock=timeline, backend=machine, interval=10.0)
    probe.applies = lambda source: True
    probe(desc, source, [KVSpec.parse("int8"), KVSpec.parse("llamacpp:q8_0")], [], 4096)
    assert timeline.now <= 1.15 * 30.0
    assert not any("llamacpp:q8_0" in kv for _, _, kv in machine.runs) and "none x llamacpp:q8_0" in probe.cost.unmeasured
