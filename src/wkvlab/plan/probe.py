"""``wkvlab plan --probe [TOKENS]``: measure the plan's candidates on the user's own model before ranking.

What is measured, through ``wkvlab eval``'s own path (:func:`wkvlab.api.prepare` and
:func:`wkvlab.api.evaluate_workload`, the same windows for every pass):

* every candidate KV format of the plan with the model's own weights (``none``) — the ``llamacpp:``
  presets in a run of their own, so that on a GGUF they get the engine baseline ``eval`` gives
  them (llama.cpp's q8 activation rounding on both sides, :mod:`wkvlab.eval.baseline`);
* every weight format of the plan that an engine runs here, with the 16-bit cache — where the
  weights are the user's checkpoint (a folder with weights, a ``.gguf`` or a packaged model).

Combinations of a quantized weight format with a quantized cache are not run (their cost is the
product of the two lists); they keep their prior, and the catastrophe guard (:mod:`.guard`)
drops them when either half alone was measured unsafe. ``TOKENS`` are cut into
:data:`~wkvlab.stats.bootstrap.MIN_UNITS` or more windows of ``min(512, TOKENS / 8)`` tokens
(and at most the plan's ``--context``), so every measurement has its 95% interval (paired bootstrap
over documents where the text has them, windows otherwise, :func:`wkvlab.stats.paired_interval`). Measurements are ``Measurement`` objects of
kind ``probe``: the user's own ``--results``/``--store`` for the same configuration win.

``--probe-budget SECONDS`` (the default, no ``--probe``) counts every second from the probe's start,
the model load included: one window is timed first, and the tokens and the configurations measured
are chosen from that measured rate, re-measured after each group (:mod:`wkvlab.plan.probe_budget`).
What the budget cannot afford is named in the notes with the command that measures it, and stays
unmeasured, so it is never recommended.
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec
from wkvlab.plan.measured import Measurement, UnitValues, spec_key
from wkvlab.heartbeat import Heartbeat
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.probe_budget import MARGIN, BudgetClock
from wkvlab.plan.source import ModelSource
from wkvlab.plan.weights import as_weight_spec
from wkvlab.weights.spec import WeightSpec

if TYPE_CHECKING:
    from wkvlab.plan.planner import Combination

DEFAULT_TOKENS = 1024  # 8 windows of 128 tokens: about a CPU minute for the default grid on SmolLM2-135M (docs/planner.md)
DEFAULT_BUDGET_S = 180.0  # plan's default --probe-budget: a few CPU minutes on the packaged models
MAX_CTX = 512
MIN_CTX = 32
UNTIMED_SLOWDOWN = 2.0  # a kind of run not timed yet, when tokens are chosen: llama.cpp's baseline measured 1.8x plain passes
PILOT_CTX = 64  # tokens of the one window a budgeted probe times before sizing the rest
MAX_TOKENS = 8192  # a budget buys no more tokens than this (more configurations instead)
LOADABLE = ("packaged", "gguf", "folder")
# Forward FLOP/s of one CPU thread in wkvlab eval's path, as measured on this project's loaded 2-core
# machine (SmolLM2-135M, 1 thread: 204 s wall for 7 passes over 1,024 tokens, ~28 ms per token and pass,
# plan --probe 1024 at commit cf17fa9, load ~10 on 2 cores);
# a quieter machine is faster, so a budget sized with it is an upper bound on the time taken.
CPU_FLOPS_PER_THREAD = 10e9


def token_pass_seconds(model: ModelDescription, threads: int) -> float:
    """Estimated seconds of one forward pass over one token: 2 FLOPs per multiplied weight (the output matrix included)."""
    from wkvlab.plan.params import active_linear_params

    flops = 2 * (active_linear_params(model) + model.vocab_size * model.hidden_size)
    return flops / (CPU_FLOPS_PER_THREAD * max(1, threads))


def budget_tokens(budget_s: float, passes: int, model: ModelDescription, threads: int, context: int) -> int:
    """Tokens a probe of ``passes`` passes per token can afford in ``budget_s`` (whole windows; 0 when it cannot afford
    the fewest windows an interval needs)."""
    from wkvlab.stats.bootstrap import MIN_UNITS

    tokens = int(budget_s / (passes * token_pass_seconds(model, threads)))
    tokens = min(tokens, MAX_TOKENS)
    ctx = probe_ctx(tokens, context, model)
    return tokens // ctx * ctx if tokens >= MIN_UNITS * ctx else 0


def probe_ctx(tokens: int, context: int, model: ModelDescription) -> int:
    """Window length of a probe of ``tokens`` tokens: enough windows for an interval, none longer than served."""
    from wkvlab.stats.bootstrap import MIN_UNITS

    return max(MIN_CTX, min(MAX_CTX, context, model.max_position_embeddings, tokens // MIN_UNITS))


def weights_are_served(source: ModelSource, model_id: str | None) -> bool:
    """Whether the weights the probe loads are the ones the launch lines serve, so that a weight format
    simulated on them is the one the engine would run: a folder with weights or a .gguf the user gave,
    without a --model-id naming another checkpoint. A packaged model is a dequantized GGUF while its
    launch lines load the Hub checkpoint it was made from; requantizing the GGUF measures something else."""
    return source.kind in ("folder", "gguf") and not model_id


def candidates(model: ModelDescription, pairs: list[tuple[WeightSpec, KVSpec]], rows: list[Combination],
               with_weights: bool = True) -> tuple[list[KVSpec], list[WeightSpec]]:
    """(KV formats, weight formats) a probe measures: every quantized cache of the plan, and (``with_weights``)
    every quantized weight format some engine runs here (the others could not be served anyway)."""
    own = spec_key(as_weight_spec("none", model), KVSpec())[0]
    kv: dict[tuple, KVSpec] = {}
    weights: dict[tuple, WeightSpec] = {}
    for (w, k), row in zip(pairs, rows):
        if not k.is_identity:
            kv.setdefault(spec_key(WeightSpec(), k)[1], k)
        if with_weights and spec_key(w, KVSpec())[0] != own and row.engines_accepting:
            weights.setdefault(spec_key(w, KVSpec())[0], w)
    return list(kv.values()), list(weights.values())


@dataclass
class ProbeCost:
    seconds: float = 0.0  # wall time of the whole probe, the model load included
    passes: int = 0  # forward passes over the probe's windows (references included)
    configs: int = 0
    tokens: int = 0
    ctx: int = 0
    windows: int = 0
    threads: int = 0
    load_seconds: float = 0.0  # of ``seconds``: loading the model (a GGUF's conversion included)
    pilot_seconds: float = 0.0  # of ``seconds``: the one window timed to size the rest (its numbers are not kept)
    budget_s: float | None = None
    unmeasured: list[str] = field(default_factory=list)  # configurations the budget left unmeasured


class EvalBackend:
    """wkvlab eval's own path (:func:`wkvlab.api.prepare`, :func:`wkvlab.api.evaluate_workload`): the seam a
    fake-clock test replaces to simulate a slow machine."""

    def load(self, target: str, data: str, ctx: int, tokens: int):
        from wkvlab import api

        return api.prepare(target, data, ctx=ctx, tokens=tokens, device="cpu")  # the probe's numbers are CPU float32 (no --device)

    def recut(self, work, data: str, ctx: int, tokens: int):
        """The loaded model's windows cut again (no second load)."""
        from wkvlab import api

        return api.prepare(work.loaded, data, ctx=ctx, tokens=tokens, device="cpu")

    def windows(self, work) -> int:
        return work.windows.n_windows

    def threads(self) -> int:
        import torch

        return torch.get_num_threads()

    def check(self, work, kv: list[KVSpec]) -> None:
        from wkvlab import api

        api.check_kv_specs(work.loaded.model, kv)

    def run(self, work, model_name: str, weights: list[WeightSpec], kv: list[KVSpec], progress, title: str):
        """[(weights, KV, measurement)] of the grid, and the notes worth keeping."""
        from wkvlab import api

        options = api.run_options(work, weights)
        total = api.total_steps(work, weights, kv, options)
        with progress(total, title) if progress else nullcontext() as tick:
            results = api.evaluate_workload(work, weights, kv, tick, options=options)
        found = [(WeightSpec.from_dict(r.weights_spec), KVSpec.from_dict(r.kv_spec), measurement(r, model_name)) for r in results]
        return found, [n for r in results for n in r.notes if "baseline" in n or "KLD against" in n]


@dataclass
class Probe:
    """The measuring step the planner calls (``plan(..., probe=Probe(2048))``); measurements are kept,
    so plans for several GPU counts probe once. With ``budget_s`` the probe is sized while it runs, on
    measured costs (:mod:`wkvlab.plan.probe_budget`)."""

    tokens: int | None = DEFAULT_TOKENS  # None: as many as ``budget_s`` affords
    data: str = "default"
    budget_s: float | None = None  # seconds the whole probe may take, the model load included
    explicit: bool = True  # asked for (--probe): a model it cannot load is an error; else (the default) priors, said so
    progress: Callable[[float, str], AbstractContextManager] | None = None  # (total steps, title) -> a bar yielding advance
    say: Callable[[str], None] = print
    status: Callable[[str], AbstractContextManager] | None = None  # (message) -> lines while the model loads (display.status)
    clock: Callable[[], float] = time.monotonic
    backend: EvalBackend = field(default_factory=EvalBackend)
    interval: float = 30.0  # seconds between the budget's own lines (elapsed, ETA) while it runs; 0: none
    cost: ProbeCost = field(default_factory=ProbeCost)
    done: dict[tuple, Measurement] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    work: object = None  # the loaded model and its windows, kept between calls
    target: str = ""
    budget: BudgetClock | None = None
    doing: str = "starting"
    left: list = field(default_factory=list)  # (weights, KV) the budget left unmeasured

    def applies(self, source: ModelSource) -> bool:
        """Whether this model can be measured here; an explicit probe of one that cannot is refused."""
        if source.kind in LOADABLE:
            return True
        if self.explicit:
            raise ConfigError(f"--probe runs the model, and {source.given} is {_what(source)}: pass a packaged model, a .gguf "
                              "or a folder with weights (or drop --probe)")
        return False

    def __call__(self, model: ModelDescription, source: ModelSource, kv: list[KVSpec], weights: list[WeightSpec],
                 context: int) -> list[Measurement]:
        if self.tokens is not None and self.tokens < 1:
            raise ConfigError(f"--probe {self.tokens}: give a positive number of tokens (default {DEFAULT_TOKENS})")
        self.applies(source)
        none = WeightSpec.parse("none")
        groups = [([none], [k for k in kv if not k.name.startswith("llamacpp:")]),
                  ([none], [k for k in kv if k.name.startswith("llamacpp:")]),  # on a GGUF: eval's engine baseline
                  (weights, [KVSpec()])]
        return self._measure(model, source, groups, context)

    def pairs(self, model: ModelDescription, source: ModelSource, pairs: list[tuple[WeightSpec, KVSpec]],
              context: int) -> list[Measurement]:
        """Measure these (weights, KV) combinations, one run each, while the budget lasts."""
        return self._measure(model, source, [([w], [k]) for w, k in pairs], context, combinations=True)

    def _measure(self, model: ModelDescription, source: ModelSource, groups: list, context: int,
                 combinations: bool = False) -> list[Measurement]:
        none = WeightSpec.parse("none")
        todo = []
        for w_list, k_list in groups:  # only what an earlier call (another GPU count) did not measure
            if w_list == [none]:
                k_list = [k for k in k_list if not self._has(model, none, k)]
            else:
                w_list = [w for w in w_list if not all(self._has(model, w, k) for k in k_list)]
            if w_list and k_list:
                todo.append((w_list, k_list))
        if todo:
            self._run(model, source, todo, context, combinations)
        return [m for key, m in self.done.items() if key in {self._key(model, w, k) for w_list, k_list in groups
                                                             for w in w_list for k in k_list}]

    def _key(self, model: ModelDescription, w: WeightSpec, k: KVSpec) -> tuple:
        return spec_key(as_weight_spec(w, model), k)

    def _has(self, model: ModelDescription, w: WeightSpec, k: KVSpec) -> bool:
        return self._key(model, w, k) in self.done

    def _run(self, model: ModelDescription, source: ModelSource, todo: list, context: int, combinations: bool) -> None:
        if self.budget_s is not None and self.budget is None:
            self.budget = BudgetClock(self.budget_s, self.clock)
            self.cost.budget_s = self.budget_s
        began = self.clock()
        if self.budget is not None:
            self.budget.start()
        beat = Heartbeat(lambda now: self.say(self.budget.line(self.doing)), self.interval if self.budget else 0, self.clock)
        skipped_before, configs_before = len(self.left), self.cost.configs
        with beat:
            if self.work is None:
                self._load(model, source, todo, context)
            for _, k_list in todo:
                self.backend.check(self.work, k_list)
            if self.budget is not None and self.budget.left <= 0:  # the load alone spent it
                self.left += [(w, k) for w_list, k_list in todo for w in w_list for k in k_list]
                self.cost.unmeasured += [f"{w.label} x {k.label}" for w, k in self.left[skipped_before:]]
            else:
                if self.budget is not None and not self.budget.rates:
                    self._pilot(model, *next((g for g in todo if g[0] == [WeightSpec.parse("none")]), todo[0]))
                if self.budget is not None and self.tokens is None:
                    self._size(model, todo, context)
                self._groups(model, todo, combinations)
        seconds = self.clock() - began
        self.cost.seconds += seconds
        self.cost.threads = self.backend.threads()
        self.say(f"probe: {self.cost.configs - configs_before} configuration(s) measured in {seconds:.0f} s on {self.cost.threads} CPU thread(s) "
                 f"({self.cost.windows} windows x {self.cost.ctx} tokens, model load {self.cost.load_seconds:.0f} s included"
                 + (f"; budget {self.budget_s:g} s)" if self.budget else ")"))
        if self.left[skipped_before:]:
            self.notes.append(self._unmeasured_note(self.left[skipped_before:], combinations))

    def _load(self, model: ModelDescription, source: ModelSource, todo: list, context: int) -> None:
        """Load the model (timed: it counts in the budget); a budgeted probe cuts one window to time first."""
        self.target = str(source.folder or source.gguf if source.kind != "packaged" else source.given)
        if self.budget is None:
            tokens = self.tokens or DEFAULT_TOKENS
            ctx = probe_ctx(tokens, context, model)
        else:  # the window length from the prior; the number of windows from what the pilot measures
            prior = budget_tokens(self.budget.left, sum(1 + len(w) * len(k) for w, k in todo), model, self.backend.threads(), context)
            ctx = min(PILOT_CTX, probe_ctx(prior or self.tokens or 0, context, model))  # short: its cost is spent blind
            tokens = ctx
            self.say(f"probe: budget {self.budget_s:g} s, the model load counted in it; eta estimating… until a window is timed")
        self.doing = f"loading {model.name}"
        start = self.clock()
        with self.status(f"probe: loading {model.name}") if self.status else nullcontext():  # a GGUF's first load converts it: not silence
            self.work = self.backend.load(self.target, self.data, ctx, tokens)
        self.cost.load_seconds = self.clock() - start
        self.cost.ctx = ctx
        if self.budget is not None:
            self.budget.load_s = self.cost.load_seconds
            self.say(f"probe: {model.name} loaded in {self.cost.load_seconds:.0f} s ({self.budget.left:.0f} s of the budget left)")

    def _pilot(self, model: ModelDescription, w_list: list[WeightSpec], k_list: list[KVSpec]) -> None:
        """Time one window of this group (its numbers are not kept): the rate every estimate of its kind uses."""
        kind = _kind(k_list)
        self.doing = f"timing one window ({kind} passes)"
        work = self.work
        if self.backend.windows(work) != 1:  # after sizing: one window of the plan's length
            work = self.backend.recut(work, self.data, self.cost.ctx, self.cost.ctx)
        start = self.clock()
        first = FirstStep(self.clock)
        self.backend.run(work, model.name, w_list, k_list, first.progress, "probe: timing one window")
        seconds = self.clock() - start
        self.cost.pilot_seconds += seconds
        configs = len(w_list) * len(k_list)
        self.budget.measured(seconds, self.cost.ctx, configs, kind=kind, setup=first.since(start))
        setup = self.budget.setups.get(kind, 0.0)
        self.say(f"probe: one window of {self.cost.ctx} tokens x {1 + configs} passes ({kind}) took {seconds:.1f} s "
                 f"({self.budget.rates[kind] * 1e3:.1f} ms per token and pass on this machine now"
                 + (f", after {setup:.1f} s of setup per run)" if setup >= 1 else ")"))

    def _size(self, model: ModelDescription, todo: list, context: int) -> None:
        """Tokens for every measurement of the plan, from the measured rate: all configurations at the fewest windows
        an interval needs before more tokens for some."""
        from wkvlab.stats.bootstrap import MIN_UNITS

        base = self.budget.rates.get("float") or self.budget.rates["engine"]
        slower = lambda k: self.budget.rates[_kind(k)] / base if _kind(k) in self.budget.rates else UNTIMED_SLOWDOWN  # noqa: E731
        passes = sum((1 + len(w) * len(k)) * slower(k) for w, k in todo)
        affordable = int(self.budget.left / (MARGIN * passes * base))
        ctx = probe_ctx(min(affordable, MAX_TOKENS), context, model)
        tokens = max(MIN_UNITS, min(affordable, MAX_TOKENS) // ctx) * ctx
        self.tokens, self.cost.ctx = tokens, ctx
        self.work = self.backend.recut(self.work, self.data, ctx, tokens)

    def _groups(self, model: ModelDescription, todo: list, combinations: bool) -> None:
        none = WeightSpec.parse("none")
        queue = list(todo)
        while queue:
            w_list, k_list = queue.pop(0)
            weights = w_list != [none]
            tokens = self.cost.ctx * self.backend.windows(self.work)
            kind = _kind(k_list)
            if self.budget is not None:
                least = self.budget.estimate(tokens, 1, 0, "float")  # one configuration at the plain rate: the least it can cost
                if kind not in self.budget.rates and self.budget.left > 0 and (least is None or least <= self.budget.left):
                    self._pilot(model, w_list, k_list)  # else not even timed: a pilot is spent blind (llama.cpp's: ~13 s)
                if weights and self.budget.build_s is None and len(w_list) > 1:  # time one build before planning the others
                    queue.insert(0, (w_list[1:], k_list))
                    w_list = w_list[:1]
                n = self.budget.affordable(tokens, len(w_list) * len(k_list), weights, kind)
                if weights:
                    kept, left = w_list[:n], [(w, k) for w in w_list[n:] for k in k_list]
                    w_list = kept
                else:
                    kept, left = k_list[:n], [(w, k) for w in w_list for k in k_list[n:]]
                    k_list = kept
                self.cost.unmeasured += [f"{w.label} x {k.label}" for w, k in left]
                self.left += left
                if not n:
                    continue
                self.budget.planned_end = self.budget.elapsed + self.budget.ahead(tokens, [(n, weights, kind)] + self._shapes(queue))
            configs = len(w_list) * len(k_list)
            title = f"probe {', '.join(w.label for w in w_list)} x {', '.join(k.label for k in k_list)}"
            self.doing = title
            self.say(f"probe: {configs} configuration(s) of {model.name} on {tokens:,} tokens of '{self.data}' "
                     f"({self.backend.windows(self.work)} windows of {self.cost.ctx}) through wkvlab eval's path"
                     + (f"; eta {self.budget.eta_text()}" if self.budget else ""))
            start = self.clock()
            first = FirstStep(self.clock, self.progress)
            found, notes = self.backend.run(self.work, model.name, w_list, k_list, first.progress, title)
            seconds = self.clock() - start
            for w, k, m in found:
                self.done[self._key(model, w, k)] = m
            self.notes += notes
            self.cost.passes += self.backend.windows(self.work) * (1 + configs)
            self.cost.configs += configs
            self.cost.tokens, self.cost.windows = tokens, self.backend.windows(self.work)
            if self.budget is not None:
                self.budget.measured(seconds, tokens, configs, len(w_list) if weights else 0, kind, first.since(start))
                self.budget.planned_end = self.budget.elapsed + self.budget.ahead(tokens, self._shapes(queue))
                self.say(f"probe: {self.cost.configs} configuration(s) measured, {self.budget.elapsed:.0f} s of the "
                         f"{self.budget_s:g} s budget used (model load {self.cost.load_seconds:.0f} s); eta {self.budget.eta_text()}")

    @staticmethod
    def _shapes(groups: list) -> list[tuple[int, bool]]:
        none = WeightSpec.parse("none")
        return [(len(w) * len(k), w != [none], _kind(k)) for w, k in groups]

    def _unmeasured_note(self, left: list[tuple[WeightSpec, KVSpec]], combinations: bool) -> str:
        """What the budget left unmeasured, and the commands that measure it on the probe's windows."""
        by_weights: dict[str, list[str]] = {}
        for w, k in left:
            by_weights.setdefault(w.label, []).append("" if k.is_identity else f" --kv {k.label}")
        by_kv: dict[str, list[str]] = {}  # weight formats with the same caches: one command
        for w, kv in by_weights.items():
            by_kv.setdefault("".join(kv), []).append(f" --weights {w}")
        commands = "; ".join(f"'wkvlab eval --model {self.target} --ctx {self.cost.ctx} --tokens {self.tokens or DEFAULT_TOKENS}"
                             f"{''.join(w)}{kv} --json more.json'" for kv, w in by_kv.items())
        return (f"--probe-budget {self.budget_s:g} s left no time to measure these {'combinations' if combinations else 'configurations'} "
                f"(estimated on this machine's measured speed): "
                f"{', '.join(f'{w.label} x {k.label}' for w, k in left)} — they stay unmeasured and are not recommended; "
                f"measure them with {commands} and rerun plan with --results more.json, or raise --probe-budget")


class FirstStep:
    """A progress bar's stand-in that notes when the first step ended (what came before it is a run's setup),
    passing every step on to the real bar when there is one."""

    def __init__(self, clock: Callable[[], float], bar: Callable[[float, str], AbstractContextManager] | None = None) -> None:
        self.clock, self.bar, self.at = clock, bar, None

    @contextmanager
    def progress(self, total: float, title: str):
        with self.bar(total, title) if self.bar else nullcontext() as tick:
            def advance(description: str, steps: float) -> None:
                if self.at is None:
                    self.at = self.clock()
                if tick is not None:
                    tick(description, steps)

            yield advance

    def since(self, start: float) -> float | None:
        return None if self.at is None else self.at - start


def _kind(kv: list[KVSpec]) -> str:
    """Runs with costs of their own: llama.cpp's presets (on a GGUF, eval's engine baseline rounds activations to q8)."""
    return "engine" if any(k.name.startswith("llamacpp:") for k in kv) else "float"


def _what(source: ModelSource) -> str:
    return {"builtin": "a built-in description (shapes only, no weights)",
            "config": "a config file without weights", "description": "a description without weights"}.get(source.kind, source.kind)


def measurement(result, model_name: str) -> Measurement:
    """A probe's :class:`~wkvlab.eval.result.EvalResult` as the planner's measurement, with its interval."""
    from wkvlab.stats import paired_interval

    arrays = result.arrays
    kld = paired_interval(lambda m: m["kld"], {"kld": arrays.kld}, arrays.units)  # documents where the text has them
    low, high = (kld.low, kld.high) if kld.decided else (None, None)
    summary = result.kld
    return Measurement(model_name, result.data, result.ctx, result.tokens, result.weights, result.kv, summary["mean"],
                       summary["se"], f"plan --probe ({result.tokens:,} tokens of {result.data}, ctx {result.ctx})",
                       result.weights_spec, result.kv_spec, top1=result.top1_agreement, low=low, high=high, kind="probe",
                       units=UnitValues.from_arrays(arrays.kld, arrays.top1_agree, arrays.units))
