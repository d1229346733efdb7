"""Fidelity check: does the simulated ``llamacpp:<type>`` preset do to the model what llama.cpp does?

For each cache type, on the same token windows:

* engine: llama.cpp's KLD with that cache against llama.cpp with its 16-bit (f16) cache — same
  weights, same kernels, only the cache differs;
* simulation: the same model (the GGUF's weights, dequantized) with llama.cpp's input rounding on
  every matmul (the engine baseline of :mod:`wkvlab.eval.baseline`, which ``wkvlab eval`` uses
  for ``llamacpp:`` presets on a GGUF too), the ``llamacpp:<type>`` preset's KLD against the same
  simulation with its 16-bit cache — both sides measured as the engine's. It is ``wkvlab eval``'s
  own run (:func:`wkvlab.api.evaluate_workload`, same chunking, same reference pass), so the two
  print the same numbers by construction: with llama.cpp's q8 activation roundings a window's KLD
  moves with anything that changes float rounding upstream — even the chunk size a window is
  prefilled in (on Gemma-3-270M q4_0, 2 chunks of 256 instead of 1 of 512 moved one window's mean
  by 11%; docs/engines.md) — so two separately written loops did not agree;
* ratio = simulation / engine on mean KLD (1.0 = the simulation reproduces the engine).

Why the activation rounding: llama.cpp quantizes each quantized linear's input to q8 blocks; a
small cache error flips those roundings downstream, so the engine pays ~0.004 KLD even for a q8_0
cache. A float-activation simulation lacks that amplification (measured ratio 0.07 for q8_0, ~1
with it; docs/engines.md).

Flash attention is on for every engine run, the f16 baseline included, so the cache type is the
only thing that changes between the engine's two sides. The noise floor is the KLD between two
correct implementations of the same model — transformers float32 and llama.cpp with an f16 cache —
on the same tokens: differences below it mean nothing.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from wkvlab.api import Workload, evaluate_workload
from wkvlab.engines.bridge import compare_window
from wkvlab.engines.llamacpp import LlamaCppEngine, parse_cache_types
from wkvlab.errors import DataError
from wkvlab.eval.baseline import Baseline, llamacpp_baseline
from wkvlab.eval.metrics import ReferenceTokens, compare_tokens, kld_summary
from wkvlab.eval.result import EvalResult, library_versions
from wkvlab.eval.runner import Progress, RunOptions, check_kv_specs, forward_logits
from wkvlab.kv.spec import KVSpec
from wkvlab.stats.bootstrap import Interval, Units, resample
from wkvlab.stats.decision import MarginRule, Verdict, decide
from wkvlab.stats.ratio import window_ratio
from wkvlab.weights.spec import WeightSpec


@dataclass
class FidelityRow:
    kv: str  # llama.cpp's name, K/V
    preset: str  # the simulated preset compared, e.g. llamacpp:q4_0
    sim_spec: str  # what that preset does, e.g. q4_0+rot+q=q8_0
    engine_kld: dict
    sim_kld: dict
    engine_top1: float
    sim_top1: float
    engine_windows: list = field(default_factory=list)  # mean KLD of each window: how much the ratio moves with the text
    sim_windows: list = field(default_factory=list)
    window_tokens: list = field(default_factory=list)  # scored tokens of each window (both sides scored the same)

    @property
    def ratio(self) -> float:
        return self.sim_kld["mean"] / self.engine_kld["mean"] if self.engine_kld["mean"] > 0 else float("nan")

    @property
    def window_ratios(self) -> list[float]:
        return [s / e if e > 0 else float("nan") for s, e in zip(self.sim_windows, self.engine_windows)]

    def ratio_interval(self, sim_windows: list | None = None, level: float = 0.95) -> Interval:
        """The ratio of means with its paired window-bootstrap interval (:func:`wkvlab.stats.ratio.window_ratio`):
        this comparison's simulated side, or ``sim_windows`` (per-window mean KLD of another run on the same windows)."""
        return window_ratio(self.sim_windows if sim_windows is None else sim_windows, self.engine_windows,
                            self.window_tokens or None, level=level)

    def to_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio, "window_ratios": self.window_ratios,
                "ratio_interval": self.ratio_interval().to_dict()}

    def ratio_draws(self):
        """What the one rule decides: the ratio of means minus 1, windows resampled jointly for both sides."""
        n = np.asarray(self.window_tokens or [1] * len(self.engine_windows), dtype=np.float64)
        sums = {"sim": np.asarray(self.sim_windows, dtype=np.float64) * n, "engine": np.asarray(self.engine_windows, dtype=np.float64) * n}
        return resample(lambda m: m["sim"] / m["engine"] - 1.0, sums, Units(np.arange(n.size), "windows"))


FIDELITY_WORDS = ("higher (the simulation's KLD above the engine's)", "lower (the simulation's KLD below the engine's)",
                  "equivalent within ±m")


def fidelity_verdicts(rows: list[FidelityRow]) -> list[Verdict]:
    """Each row's simulated/engine KLD ratio against 1 ± the recorded fidelity band (``kv/fidelity_checks.json``,
    the band an ``engine-checked`` label needs), by the one rule: Holm over the rows of the comparison."""
    from wkvlab.kv.presets import CHECKS_FILE, recorded_checks

    rule = MarginRule("absolute", recorded_checks()[0], source=f"the fidelity band of {CHECKS_FILE.name}")
    effects = [rule.difference_effect(f"{r.kv}: simulated / engine KLD − 1", r.ratio_draws(), 0.0, "", sum(r.window_tokens),
                                      words=FIDELITY_WORDS) for r in rows]
    return decide(effects, family=f"llama.cpp vs simulation: {len(rows)} cache type{'s' if len(rows) != 1 else ''}")


@dataclass
class FidelityReport:
    model: str
    gguf: str
    data: str
    ctx: int
    tokens: int
    rotation: bool
    sim_activations: str  # what the simulated side does to matmul inputs
    noise_floor: dict  # transformers float32 vs llama.cpp f16 cache
    rows: list[FidelityRow]
    seconds: float
    engine: dict = field(default_factory=dict)
    versions: dict = field(default_factory=library_versions)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["rows"] = [r.to_dict() for r in self.rows]
        return out


def sim_preset(kv: str, rotation: bool = True) -> KVSpec:
    """The simulated preset that stands for llama.cpp's ``-ctk k -ctv v`` as the engine runs it."""
    k, v = parse_cache_types(kv)
    return KVSpec.parse(f"llamacpp:{k}/{v}" + ("" if rotation else "+norot"))


def compare_steps(n_windows: int, n_kv: int, chunks: int = 1) -> int:
    """Progress steps of :func:`compare_engine`: per window the engine's, then the simulation's —
    ``wkvlab eval``'s run (one weight build, then per window and chunk the reference and each preset)."""
    return n_windows * (2 + n_kv) + 1 + n_windows * chunks * (1 + n_kv)


def _top1(values: list[np.ndarray]) -> float:
    return float(np.concatenate(values).mean())


def simulate(work: Workload, specs: list[KVSpec], baseline: Baseline, *, options: RunOptions | None = None,
             progress: Progress | None = None) -> list[EvalResult]:
    """The simulated side: ``wkvlab eval --weights none --kv <specs>`` with ``baseline`` — the same
    function, so the same windows, chunks, reference pass and per-token numbers."""
    return evaluate_workload(work, [WeightSpec()], specs, progress=progress, options=options, baseline=baseline)


def _per_window(result: EvalResult, positions: list[torch.Tensor]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-token KLD and top-1 agreement of each window, checked to be the positions the engine scored."""
    arrays, kld, top1 = result.arrays, [], []
    for w, expected in enumerate(positions):
        mask = arrays.window == w
        if not np.array_equal(arrays.position[mask], expected.numpy()):
            raise DataError(f"window {w}: the simulation scored other positions than the engine ({int(mask.sum())} vs {len(expected)} tokens)")
        kld.append(arrays.kld[mask])
        top1.append(arrays.top1_agree[mask])
    return kld, top1


@torch.no_grad()
def compare_engine(work: Workload, gguf: str, kv_types: list[str], *, rotation: bool = True, threads: int = 2,
                   progress: Progress | None = None, options: RunOptions | None = None) -> FidelityReport:
    """The fidelity table for ``kv_types`` (llama.cpp names, ``k`` or ``k/v``) on ``work``'s windows;
    ``options``: how the simulated side runs, as ``wkvlab eval``'s (default: its defaults)."""
    tick = progress or (lambda _d, _n: None)
    started = time.perf_counter()
    names = ["/".join(dict.fromkeys(parse_cache_types(t))) for t in kv_types]  # "q4_0/q4_0" → "q4_0"
    specs = [sim_preset(t, rotation) for t in kv_types]
    windows, model = work.windows, work.loaded.model

    # Simulation: llama.cpp's matmul-input rounding on the GGUF's quantized linears, its 16-bit cache as baseline.
    check_kv_specs(model, specs)
    baseline = llamacpp_baseline(model, gguf)
    positions: list[torch.Tensor] = []

    # Engine: one context per cache type, all alive so each window is processed once.
    ctx = windows.ctx
    base = LlamaCppEngine(gguf, "f16", ctx=ctx, flash_attn="on", threads=threads, rotation=rotation)
    engines = [LlamaCppEngine(gguf, t, ctx=ctx, flash_attn="on", threads=threads, rotation=rotation) for t in kv_types]
    floor_kld, floor_top1 = [], []
    eng_kld: list[list[np.ndarray]] = [[] for _ in engines]
    eng_top1: list[list[np.ndarray]] = [[] for _ in engines]
    try:
        for w in range(windows.n_windows):
            tokens = windows.tokens[w]
            e0 = base.score_window(tokens, windows.score_from)
            floor = compare_window(forward_logits(model, tokens), tokens, e0).metrics
            floor_kld.append(floor.kld)
            floor_top1.append(floor.top1_agree)
            tick("llama.cpp f16 and noise floor", 2)
            ref = ReferenceTokens.from_logits(e0.logits, tokens[e0.positions + 1])
            for i, engine in enumerate(engines):
                metrics = compare_tokens(ref, engine.score_window(tokens, windows.score_from).logits)
                eng_kld[i].append(metrics.kld)
                eng_top1[i].append(metrics.top1_agree)
                tick(f"llama.cpp {names[i]}", 1)
            positions.append(e0.positions)
    finally:
        for engine in [base, *engines]:
            engine.close()
    sim = [_per_window(result, positions) for result in simulate(work, specs, baseline, options=options, progress=tick)]
    sim_kld, sim_top1 = [k for k, _ in sim], [t for _, t in sim]

    rows = [
        FidelityRow(kv=names[i], preset=specs[i].label, sim_spec=specs[i].canonical(), engine_kld=kld_summary(np.concatenate(eng_kld[i])),
                    sim_kld=kld_summary(np.concatenate(sim_kld[i])), engine_top1=_top1(eng_top1[i]), sim_top1=_top1(sim_top1[i]),
                    engine_windows=[float(w.mean()) for w in eng_kld[i]], sim_windows=[float(w.mean()) for w in sim_kld[i]],
                    window_tokens=[int(w.size) for w in eng_kld[i]])
        for i in range(len(kv_types))
    ]
    noise = {**kld_summary(np.concatenate(floor_kld)), "top1_agreement": _top1(floor_top1)}
    return FidelityReport(
        model=work.loaded.name, gguf=str(gguf), data=work.corpus.name, ctx=ctx, tokens=int(sum(len(k) for k in floor_kld)),
        rotation=rotation, sim_activations=baseline.description, noise_floor=noise, rows=rows, seconds=time.perf_counter() - started,
        engine={"name": "llamacpp", "version": base.info.version, "flash_attn": True, "threads": threads},
    )
