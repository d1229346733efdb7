"""One cost model for how long a run takes: ``sweep --dry-run``'s estimate before anything runs, and the ETA's
judgement while it runs (:class:`wkvlab.display.StepCosts`) — the same step classes at the same prior costs,
replaced by measured ones as they come (issue #42: a dry run said 12 s for a sweep of 2:59, priced from its
window passes alone; the demo's first ETA said ``0:01+`` because only a cast had been timed).

The classes are the ones the ETA times apart: a window ``pass`` (one config's forward over one window, the
reference's included), a ``cheap`` weight build (cast, round-to-nearest), a ``calibrated`` one (GPTQ, AWQ,
SmoothQuant), a ``kv-calibration`` (KV statistics for ``+scales=calculate`` and other calibrated caches), and
loading a model (``convert``: a GGUF's first load dequantizes it and writes its float copy; ``load``: a folder
or a cached copy). Priors are seconds on one thread of this project's 2-core machine, per billion parameters
(a pass: per scored token too), each from a run this project recorded:

* pass: 0.0367 s per token per 1e9 parameters — the demo record (docs/runs/demo.json, commit 2e19ad0): 277.7 s
  for 13 passes (12 configs and the reference) over 4,096 tokens of SmolLM2-135M (0.1346e9 parameters), less
  about 14 s of loading and builds, load 1.35-2.18, one thread;
* cheap: 10 s per 1e9 — about half a 512-token pass of the same model in the demo's progress lines;
* calibrated: 1,440 s per 1e9 — GPTQ of SmolLM2-135M, 194 s on one thread (issue #18, docs/threads.md);
* kv-calibration: 850 s per 1e9 — ``+scales=calculate`` statistics of Qwen2.5-Coder-0.5B, 7:03 (issue #42, load 3.6-7.5);
* convert: 200 s per 1e9 — Gemma-3-270M's first load, 54 s at load 5 (README); load: 15 s per 1e9 — its second, 4 s.

They are rough (the CPU moves them, and the load: the demo's grid took 22:10 at load 12 against the record's
4:38); what they are for is weighting: the ETA prints a number only once the steps it has timed make up most of
the work ahead by these weights. A dry run scales every prior by the pass speed a store has measured for the
model (``ResultStore.seconds_per_token``) when it has one, and otherwise by the load now (:func:`load_factor`).
"""
from __future__ import annotations

from dataclasses import dataclass

PASS_SECONDS_PER_TOKEN = 0.0367  # per 1e9 parameters, one thread
BUILD_SECONDS = {"cheap": 10.0, "calibrated": 1440.0, "kv-calibration": 850.0}  # per 1e9 parameters
LOAD_SECONDS = {"convert": 200.0, "load": 15.0}  # per 1e9 parameters
REFERENCE_TOKENS = 512  # the window the ETA's relative weights assume when a caller does not say
PRIOR_LOAD = 1.75  # the load the pass prior was measured at (the demo record: 1.35 before, 2.18 after)


def load_factor(load: float | None, cores: int, threads: int = 1) -> float:
    """How much slower than the priors a run that starts now goes: the run's threads share the cores with
    ``load`` other runnable tasks, against the share they had when the priors were measured, never below 1.
    At load 11.6 on 2 cores, 4.6: a 512-token window of SmolLM2 took 12 s there against the prior's 2.5 s."""
    if load is None or cores < 1:
        return 1.0
    crowd = lambda busy: max(1.0, (busy + threads) / cores)  # noqa: E731 - runnable tasks per core, ours included
    return max(1.0, crowd(load) / crowd(PRIOR_LOAD))


def relative_costs(tokens_per_pass: int = REFERENCE_TOKENS) -> dict[str, float]:
    """Each class's prior cost in window passes of ``tokens_per_pass`` tokens (the model's size cancels)."""
    one_pass = PASS_SECONDS_PER_TOKEN * tokens_per_pass
    return {"pass": 1.0, **{kind: seconds / one_pass for kind, seconds in BUILD_SECONDS.items()}}


@dataclass(frozen=True)
class WorkItems:
    """What a run will do, by class: window passes (and their scored tokens), builds, KV calibrations, loads."""

    pass_tokens: int = 0  # tokens over all window passes (each config's and the reference's)
    builds: tuple[tuple[str, int], ...] = ()  # (class, how many)
    kv_calibrations: int = 0
    conversions: int = 0  # GGUF first loads
    loads: int = 0  # other loads


@dataclass(frozen=True)
class Estimate:
    """Seconds by part; ``basis`` says where the pass speed came from."""

    passes: float
    builds: float
    kv_calibrations: float
    loading: float
    basis: str

    @property
    def seconds(self) -> float:
        return self.passes + self.builds + self.kv_calibrations + self.loading

    def describe(self, duration) -> str:
        """``about 3m10s (passes 1m02s, builds 1m40s, KV calibration 0m20s, loading 0m08s; priors scaled by ...)``."""
        parts = [(name, value) for name, value in (("passes", self.passes), ("builds", self.builds),
                                                    ("KV calibration", self.kv_calibrations), ("loading", self.loading)) if value > 0]
        inner = ", ".join(f"{name} {duration(value)}" for name, value in parts)
        return f"about {duration(self.seconds)}" + (f" ({inner}; {self.basis})" if parts else "")


def estimate(work: WorkItems, params: float, measured_seconds_per_token: float | None = None,
             load: float | None = None, cores: int = 2) -> Estimate:
    """The seconds ``work`` takes on a model of ``params`` parameters: the priors, all scaled by the measured pass
    speed when a store has one (a machine twice as slow is twice as slow at building too), else by the load now."""
    billions = max(params, 1.0) / 1e9
    prior_pass = PASS_SECONDS_PER_TOKEN * billions
    if measured_seconds_per_token:
        scale = measured_seconds_per_token / prior_pass
        basis = f"priors scaled by this model's measured {measured_seconds_per_token * 1000:.2f} ms per token and config"
    else:
        scale = load_factor(load, cores)
        crowded = f", ×{scale:.1f} for the load now ({load:.1f} on {cores} cores)" if scale > 1 else ""
        basis = f"priors for one thread (wkvlab/costs.py){crowded}; nothing measured on this model yet"
    return Estimate(
        passes=work.pass_tokens * prior_pass * scale,
        builds=sum(count * BUILD_SECONDS[kind] for kind, count in work.builds) * billions * scale,
        kv_calibrations=work.kv_calibrations * BUILD_SECONDS["kv-calibration"] * billions * scale,
        loading=(work.conversions * LOAD_SECONDS["convert"] + work.loads * LOAD_SECONDS["load"]) * billions * scale,
        basis=basis)
