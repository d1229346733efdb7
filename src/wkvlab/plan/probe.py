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
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec
from wkvlab.plan.measured import Measurement, UnitValues, spec_key
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.source import ModelSource
from wkvlab.plan.weights import as_weight_spec
from wkvlab.weights.spec import WeightSpec

if TYPE_CHECKING:
    from wkvlab.plan.planner import Combination

DEFAULT_TOKENS = 1024  # 8 windows of 128 tokens: about a CPU minute for the default grid on SmolLM2-135M (docs/planner.md)
DEFAULT_BUDGET_S = 180.0  # plan's default --probe-budget: a few CPU minutes on the packaged models
MAX_CTX = 512
MIN_CTX = 32
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
    seconds: float = 0.0
    passes: int = 0  # forward passes over the probe's windows (references included)
    configs: int = 0
    tokens: int = 0
    ctx: int = 0
    windows: int = 0
    threads: int = 0


@dataclass
class Probe:
    """The measuring step the planner calls (``plan(..., probe=Probe(2048))``); measurements are kept,
    so plans for several GPU counts probe once."""

    tokens: int | None = DEFAULT_TOKENS  # None: as many as ``budget_s`` affords
    data: str = "default"
    budget_s: float | None = None  # seconds the whole probe may take (estimated before it runs)
    explicit: bool = True  # asked for (--probe): a model it cannot load is an error; else (the default) priors, said so
    progress: Callable[[float, str], AbstractContextManager] | None = None  # (total steps, title) -> a bar yielding advance
    say: Callable[[str], None] = print
    status: Callable[[str], AbstractContextManager] | None = None  # (message) -> lines while the model loads (display.status)
    cost: ProbeCost = field(default_factory=ProbeCost)
    done: dict[tuple, Measurement] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

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
        return self._measure(model, source, [([w], [k]) for w, k in pairs], context, optional=True)

    def _measure(self, model: ModelDescription, source: ModelSource, groups: list, context: int,
                 optional: bool = False) -> list[Measurement]:
        none = WeightSpec.parse("none")
        todo = []
        for w_list, k_list in groups:  # only what an earlier call (another GPU count) did not measure
            if w_list == [none]:
                k_list = [k for k in k_list if not self._has(model, none, k)]
            else:
                w_list = [w for w in w_list if not all(self._has(model, w, k) for k in k_list)]
            if w_list and k_list:
                todo.append((w_list, k_list))
        todo = self._afford(model, todo, context, optional)
        if todo:
            self._run(model, source, todo, context)
        return [m for key, m in self.done.items() if key in {self._key(model, w, k) for w_list, k_list in groups
                                                             for w in w_list for k in k_list}]

    def _afford(self, model: ModelDescription, todo: list, context: int, optional: bool) -> list:
        """The groups the budget affords at no fewer tokens than an interval needs; the rest are said to stay unmeasured.
        The token count is fixed by the first run, so that every measurement of a plan has the same windows."""
        if self.budget_s is None:
            return todo
        import torch

        threads = torch.get_num_threads()
        left = self.budget_s - self.cost.seconds
        passes = lambda groups: sum(1 + len(w) * len(k) for w, k in groups)  # noqa: E731 - a reference pass per group
        kept = list(todo)
        while kept:
            if self.tokens is not None and self.cost.tokens:
                afford = self.tokens * passes(kept) * token_pass_seconds(model, threads) <= left
                tokens = self.tokens if afford else 0
            else:
                tokens = budget_tokens(left, passes(kept), model, threads, context)
            if tokens:
                self.tokens = tokens
                break
            kept.pop()  # the last group: weight formats, then llama.cpp's caches
        skipped = [f"{w.label} x {k.label}" for w_list, k_list in todo[len(kept):] for w in w_list for k in k_list]
        if skipped:
            self.notes.append(f"--probe-budget {self.budget_s:g} s does not afford measuring {', '.join(skipped)} "
                              f"({'combinations, ' if optional else ''}at least {_min_tokens(context, model)} tokens each): they stay "
                              "unmeasured and are not recommended; raise --probe-budget to measure them")
        if kept:
            estimate = self.tokens * passes(kept) * token_pass_seconds(model, threads)
            self.say(f"probe: budget {self.budget_s:g} s ({left:.0f} s left) affords {self.tokens:,} tokens for "
                     f"{sum(len(w) * len(k) for w, k in kept)} configuration(s): estimated {estimate:.0f} s on {threads} thread(s) "
                     "(model load and weight builds not included)")
        return kept

    def _key(self, model: ModelDescription, w: WeightSpec, k: KVSpec) -> tuple:
        return spec_key(as_weight_spec(w, model), k)

    def _has(self, model: ModelDescription, w: WeightSpec, k: KVSpec) -> bool:
        return self._key(model, w, k) in self.done

    def _run(self, model: ModelDescription, source: ModelSource, groups: list[tuple[list[WeightSpec], list[KVSpec]]],
             context: int) -> None:
        from wkvlab import api

        if self.tokens is None:
            self.tokens = DEFAULT_TOKENS
        ctx = probe_ctx(self.tokens, context, model)
        target = source.folder or source.gguf if source.kind != "packaged" else source.given
        configs = sum(len(w) * len(k) for w, k in groups)
        self.say(f"probe: {configs} configuration(s) of {model.name} on {self.tokens:,} tokens of '{self.data}' "
                 f"(windows of {ctx}), {len(groups)} reference pass(es), through wkvlab eval's path")
        began = time.perf_counter()
        with self.status(f"probe: loading {model.name}") if self.status else nullcontext():  # a GGUF's first load converts it: not silence
            work = api.prepare(target, self.data, ctx=ctx, tokens=self.tokens, device="cpu")  # the probe's numbers are CPU float32 (no --device)
        for w_list, k_list in groups:
            api.check_kv_specs(work.loaded.model, k_list)
        import torch

        for w_list, k_list in groups:
            options = api.run_options(work, w_list)
            total = api.total_steps(work, w_list, k_list, options)
            title = f"probe {', '.join(w.label for w in w_list)} x {', '.join(k.label for k in k_list)}"
            with self.progress(total, title) if self.progress else nullcontext() as tick:
                results = api.evaluate_workload(work, w_list, k_list, tick, options=options)
            for result in results:
                m = measurement(result, model.name)
                self.done[self._key(model, WeightSpec.from_dict(result.weights_spec), KVSpec.from_dict(result.kv_spec))] = m
            self.notes += [n for r in results for n in r.notes if "baseline" in n or "KLD against" in n]
            self.cost.passes += work.windows.n_windows * (1 + len(w_list) * len(k_list))
        seconds = time.perf_counter() - began
        self.cost = ProbeCost(self.cost.seconds + seconds, self.cost.passes, self.cost.configs + configs, self.tokens, ctx,
                              work.windows.n_windows, torch.get_num_threads())
        self.say(f"probe: {configs} configuration(s) measured in {seconds:.0f} s on {torch.get_num_threads()} CPU thread(s) "
                 f"({work.windows.n_windows} windows x {ctx} tokens, model load included)")


def _min_tokens(context: int, model: ModelDescription) -> int:
    from wkvlab.stats.bootstrap import MIN_UNITS

    return MIN_UNITS * probe_ctx(0, context, model)


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
