"""The sweep driver with a stand-in executor: what runs, what is skipped, what an interruption keeps."""
from __future__ import annotations

import pytest

from tests.store.helpers import fake_result
from wkvlab import api
from wkvlab.store import open_store
from wkvlab.sweep import SweepSpec, TaskOutcome, plan_sweep, run_sweep

SPEC = SweepSpec.from_dict({"ctx": 64, "tokens": 128, "weights": ["none", "int8", "int4-g128"], "kv": ["fp16", "fp8_e4m3", "int8", "int4"]})


class FakeExecutor:
    """Deterministic results per config id; records what it was asked to run; can stop midway."""

    def __init__(self, stop_after: int | None = None, on_task=None):
        self.ran: list[str] = []
        self.stop_after, self.on_task = stop_after, on_task

    def run(self, tasks, progress=None):
        for n, task in enumerate(tasks):
            if n == self.stop_after:
                raise KeyboardInterrupt  # what a crash looks like to the driver: the generator stops
            if self.on_task:
                self.on_task(n, task)
            self.ran += [c.config_id for c in task.configs]
            yield TaskOutcome(task, tuple(fake_result(int(c.config_id[:6], 16), windows=2) for c in task.configs))


def _snapshot(path):
    with open_store(path, create=False) as store:
        return {r.config_id: store.get(r.config_id).to_dict() for r in store.rows()}


@pytest.mark.parametrize("grid, ctx, kept, total", [("weight", (64,), 4, 12), ("group", (32, 64), 12, 24)])
def test_interrupted_sweep_resumes_to_the_uninterrupted_result(tmp_path, grid, ctx, kept, total):
    spec = SweepSpec(**{**SPEC.__dict__, "grid": grid, "ctx": ctx})
    full = FakeExecutor()
    run_sweep(spec, tmp_path / "full.db", executor=full)
    first = FakeExecutor(stop_after=1)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path / "resumed.db", executor=first)
    assert len(first.ran) == kept  # the first grid was stored before the interruption
    second = FakeExecutor()
    report = run_sweep(spec, tmp_path / "resumed.db", executor=second)
    assert not set(first.ran) & set(second.ran) and report.skipped == kept and report.written == total - kept
    assert _snapshot(tmp_path / "resumed.db") == _snapshot(tmp_path / "full.db")


def test_configs_finished_by_another_sweep_meanwhile_are_not_run(tmp_path):
    spec = SweepSpec(**{**SPEC.__dict__, "grid": "weight"})
    path = tmp_path / "r.db"

    def other_sweep_writes(n, task):  # before our second grid, "another sweep" stores half of the third
        if n == 1:
            with open_store(path) as other:
                for c in plan.tasks[2].configs[:2]:
                    other.put(c.config_id, c.to_dict(), fake_result(0))

    with open_store(path) as store:
        plan = plan_sweep(spec, store)
        executor = FakeExecutor(on_task=other_sweep_writes)
        report = run_sweep(spec, store, executor=executor, plan=plan)
    assert report.written == 10 and len(executor.ran) == 10 and report.raced == 0


def test_dry_run_plans_without_creating_the_store(tmp_path):
    plan = api.sweep(SPEC, tmp_path / "new.db", dry_run=True)
    assert len(plan.missing) == 12 and len(plan.tasks) == 1 and plan.seconds > 0
    assert not (tmp_path / "new.db").exists()
    run_sweep(SPEC, tmp_path / "new.db", executor=FakeExecutor())
    again = api.sweep(SPEC, tmp_path / "new.db", dry_run=True)
    assert len(again.done) == 12 and again.tasks == () and again.seconds == 0


def test_dry_run_prices_builds_calibrations_and_loading_from_the_cost_model(tmp_path, monkeypatch):
    """issue 42: a dry run said 12 s for a sweep of 2:59, pricing the window passes alone. Now every class the
    run's ETA times apart (wkvlab.costs, the weights display.StepCosts judges by) is priced, by hand here:
    2 windows x 64 tokens x (6 configs + the reference), 1 cheap and 2 calibrated builds, 3 KV calibrations
    (one per weight config) and the GGUF's first load (no float copy in this empty cache)."""
    from wkvlab import costs
    from wkvlab.plan import parameter_count, resolve_source

    from wkvlab import threads

    monkeypatch.setenv("WKVLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(threads, "busy_cores", lambda: 0.5)  # a quiet machine: the priors as they are
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    spec = SweepSpec.from_dict({"ctx": 64, "tokens": 128, "weights": ["int8", "gptq-int4-g128", "awq-int4-g128"],
                                "kv": ["fp16", "vllm@0.27:fp8_e4m3+scales=calculate"]})
    billions = parameter_count(resolve_source("default")[0]) / 1e9
    assert 0.13 < billions < 0.14  # SmolLM2-135M, from its GGUF header
    by_hand = billions * (2 * 64 * 7 * 0.0367 + 10.0 + 2 * 1440.0 + 3 * 850.0 + 200.0)
    plan = api.sweep(spec, tmp_path / "new.db", dry_run=True)
    assert plan.seconds == pytest.approx(by_hand, rel=1e-9)
    assert plan.cost.builds == pytest.approx(billions * 2890.0) and plan.cost.loading == pytest.approx(billions * 200.0)
    text = plan.estimate(lambda s: f"{s:.0f}s")
    assert text.startswith(f"about {by_hand:.0f}s (passes ") and "builds" in text and "KV calibration" in text and "loading" in text
    # the ETA weighs the same classes by the same priors: one model, one table
    assert costs.relative_costs()["calibrated"] == pytest.approx(1440.0 / (0.0367 * 512))

    # on a crowded machine the priors stretch with the load: 12.6 runnable tasks per 2 cores against 2.75 when measured
    monkeypatch.setattr(threads, "busy_cores", lambda: 11.6)
    crowded = api.sweep(spec, tmp_path / "new.db", dry_run=True)
    assert crowded.seconds == pytest.approx(by_hand * (12.6 / 2) / (2.75 / 2), rel=1e-9)
    assert "×4.6 for the load now (11.6 on 2 cores)" in crowded.estimate(str)

    # a store that has timed this model's passes scales every prior by the measured speed
    run_sweep(SPEC, tmp_path / "new.db", executor=FakeExecutor())
    assert api.sweep(SPEC, tmp_path / "new.db", dry_run=True).estimate(str) == "about 0"  # nothing left to run or load
    with open_store(tmp_path / "new.db") as store:  # one result of this model (the fakes carry another fingerprint)
        timed = fake_result(1)
        timed.fingerprints = {**timed.fingerprints, "model_sha256": plan.configs[0].model_sha256}
        store.put("timed", plan.configs[0].to_dict(), timed)
        measured = store.seconds_per_token(plan.configs[0].model_sha256)
    assert measured == pytest.approx(0.5 / timed.tokens)
    again = api.sweep(spec, tmp_path / "new.db", dry_run=True)
    assert again.seconds == pytest.approx(by_hand * measured / (0.0367 * billions), rel=1e-9)
    assert "measured" in again.estimate(str)
