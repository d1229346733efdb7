"""Regenerate the fidelity tables of docs/engines.md: llama.cpp's own KLD against `wkvlab eval`'s.

For each llama.cpp cache type, on the same token windows:

* engine: llama.cpp with that cache against llama.cpp with its f16 cache (``wkvlab engine compare``);
* eval: ``wkvlab eval --kv llamacpp:<t>`` as a user runs it (the engine baseline is chosen
  automatically for llamacpp: presets on a GGUF), and the same with ``--baseline float`` (the
  cache alone, what the presets measured before);
* ratio = eval / engine on mean KLD (the ratio of means over identical windows), with its 95%
  interval, both sides' windows together (:func:`wkvlab.stats.ratio.window_ratio`: the analytic
  interval of wkvlab.stats; no interval below 8 windows);
* verdict: ratio − 1 against the band of src/wkvlab/kv/fidelity_checks.json by the one rule, Holm
  over the cache types of the run (:func:`wkvlab.engines.compare.fidelity_verdicts`, what
  ``wkvlab engine compare`` prints): *equivalent within ±band* is what an ``engine-checked``
  label needs (:func:`wkvlab.kv.presets.supports_label`).

The caption states the command, the commit, the load average and the wall time.

Usage (heavy: run under the shared lock):
    heavy python scripts/fidelity_table.py --model default --ctx 512 --tokens 4096 --json fidelity.json   # 8 windows
    ... --preset llamacpp-x86 --kv q8_0,q8_0/q4_0    # the simulated side with the x86 q8_0 writer
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from wkvlab import api
from wkvlab.engines.api import fidelity
from wkvlab.engines.compare import fidelity_verdicts
from wkvlab.stats.bootstrap import METHOD

DEFAULT_TYPES = "q8_0,q4_0,q4_1,q5_0,q8_0/q4_0"


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return head + ("+uncommitted changes" if dirty else "")


def window_means(result, window_tokens: list[int]) -> list[float]:
    """Mean KLD of each window of an eval result, checked to be the windows the engine scored."""
    kld, window = result.arrays.kld, result.arrays.window
    counts = np.bincount(window, minlength=len(window_tokens)).tolist()
    if counts != list(window_tokens):
        sys.exit(f"fidelity_table: {result.kv} scored {counts} tokens per window but the engine {window_tokens}: not the same windows")
    return (np.bincount(window, weights=kld) / np.maximum(counts, 1)).tolist()


def _ratio_cell(interval) -> str:
    return f"**{interval.estimate:.2f}** [{interval.low:.2f}, {interval.high:.2f}]" if interval.decided else f"**{interval:.2f}**"


def _verdict_cell(verdict) -> str:
    """The Holm-adjusted ratio (1 + the adjusted interval of ratio − 1) and the rule's word, with what would decide it."""
    adj = verdict.adjusted
    bounds = f"[{1 + adj.low:.2f}, {1 + adj.high:.2f}]" if adj.decided else "no interval"
    need = verdict.need()
    return f"{bounds} → {verdict.word}" + (f" ({need})" if need else "")


MODEL_NAMES = {"default": "SmolLM2-135M (packaged default)", "gemma3-270m": "Gemma-3-270M (packaged gemma3-270m)"}
DOCS = {"default": "docs/engines.md, Fidelity on the default model", "gemma3-270m": "docs/engines.md, Fidelity on Gemma-3-270M"}


def record_checks(report, rows: list[dict], verdicts: list, presets: list[str], args, wall: float, engine_seconds: float,
                  load: tuple) -> None:
    """This run's checks into :data:`wkvlab.kv.presets.CHECKS_FILE`, replacing the same model's checks of the same presets:
    the ratio, its 95% interval and the rule's verdict (Holm over this run's cache types), the numbers the labels read."""
    from wkvlab.kv.presets import CHECKS_FILE, LLAMACPP_SOURCE

    if args.model not in MODEL_NAMES:
        sys.exit(f"fidelity_table --record: only the packaged models' checks are recorded (--model {'|'.join(MODEL_NAMES)})")
    model = MODEL_NAMES[args.model]
    data = json.loads(CHECKS_FILE.read_text(encoding="utf-8"))
    argv = sys.argv[1:]
    if "--json" in argv:  # where this machine kept its JSON copy: not part of what measured the numbers
        del argv[argv.index("--json"):argv.index("--json") + 2]
    command = (f"{' '.join(['python', 'scripts/fidelity_table.py', *argv])} (at {_commit()}; {wall:.0f} s wall, "
               f"{engine_seconds:.0f} s of it engine compare; load average {load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)")
    source = LLAMACPP_SOURCE.split(", ", 1)[1].split(" (")[0]  # ggml-org/llama.cpp@<commit>
    windows = (f"{len(report.rows[0].window_tokens)} x {args.ctx} tokens of the default text spread across its documents "
               f"({report.tokens} scored), 95% interval over windows, both sides together ({METHOD})")
    new = []
    for preset, row, entry, verdict in zip(presets, report.rows, rows, verdicts):
        interval, adj = entry["ratio_interval"], verdict.adjusted
        new.append({"command": command, "doc": DOCS[args.model],
                    "engine": f"llama-cpp-python {report.engine.get('version')} ({source}), flash attention, GGML_NATIVE=OFF, "
                              f"{args.threads} threads",
                    "engine_kld": round(row.engine_kld["mean"], 6), "interval": [round(interval["low"], 3), round(interval["high"], 3)],
                    "model": model, "preset": preset, "ratio": round(entry["ratio"], 2), "sim_kld": round(row.sim_kld["mean"], 6),
                    "spec": row.sim_spec, "windows": windows, "verdict": verdict.word, "outcome": verdict.outcome,
                    "adjusted": [round(1 + adj.low, 3), round(1 + adj.high, 3)] if adj.decided else None,
                    "family": f"{verdict.adjustment}; margin {verdict.margin.format('.2g')}"})
    replaced = {(c["preset"], c["model"]) for c in new}
    data["checks"] = [c for c in data["checks"] if (c["preset"], c["model"]) not in replaced] + new
    CHECKS_FILE.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"recorded {len(new)} check(s) of {model} in {CHECKS_FILE}; `python scripts/doc_tables.py --write engine-confirmation` "
          "renders them into docs/findings.md")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="default", help="packaged model name or .gguf path (the GGUF llama.cpp runs)")
    parser.add_argument("--kv", default=DEFAULT_TYPES, help="llama.cpp cache types, comma-separated")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-float", action="store_true", help="skip the --baseline float column")
    parser.add_argument("--preset", default="llamacpp", choices=("llamacpp", "llamacpp-x86"),
                        help="the simulated presets: llama.cpp's reference q8_0 writer or its x86 AVX/AVX2 one")
    parser.add_argument("--json")
    parser.add_argument("--record", action="store_true",
                        help="replace this model's checks of these presets in src/wkvlab/kv/fidelity_checks.json with this run's "
                             "(what the engine-checked labels read)")
    args = parser.parse_args()
    types = [t for t in args.kv.split(",") if t]
    presets = [f"{args.preset}:{t}" for t in types]

    started, load = time.perf_counter(), os.getloadavg()
    report = fidelity(args.model, types, ctx=args.ctx, tokens=args.tokens, threads=args.threads)
    engine_seconds = time.perf_counter() - started
    work = api.prepare(args.model, "default", ctx=args.ctx, tokens=args.tokens)
    evals = api.evaluate_workload(work, api.parse_weights(["none"]), api.parse_kv(presets), baseline="auto")
    floats = [] if args.no_float else api.evaluate_workload(work, api.parse_weights(["none"]), api.parse_kv(presets), baseline="float")

    wall = time.perf_counter() - started
    n_windows = len(report.rows[0].window_tokens) if report.rows else 0
    verdicts = fidelity_verdicts(report.rows)  # the one rule on ratio − 1, as `wkvlab engine compare` prints it
    verdict_rule = (f"ratio − 1 against margin {verdicts[0].margin.format('.2g')}; {verdicts[0].adjustment}; "
                    f"{verdicts[0].resampling}") if verdicts else "none (no cache type)"
    print(f"{report.model}, {report.tokens} scored tokens ({n_windows} windows of {args.ctx}), default text; "
          f"llama-cpp-python {report.engine.get('version')}, {args.threads} threads; "
          f"noise floor (transformers fp32 vs llama.cpp f16) {report.noise_floor['mean']:.6f} ± {report.noise_floor['se']:.6f}; "
          f"engine baseline: {evals[0].fidelity['baseline']['activations']}. "
          f"Ratio: eval / engine mean KLD with its 95% interval over windows, both sides together ({METHOD}); "
          f"verdict: {verdict_rule}.\n"
          f"`{' '.join(['python', 'scripts/fidelity_table.py', *sys.argv[1:]])}` at {_commit()}; "
          f"{wall:.0f} s wall ({engine_seconds:.0f} s engine compare); load average {load[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end\n")
    header = "| KV | llama.cpp KLD (vs its f16) | `wkvlab eval` KLD (engine baseline) | ratio [95%] | ratio [Holm-adjusted] → verdict |"
    if floats:
        header += " `--baseline float` KLD | ratio [95%] |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    rows = []
    for i, row in enumerate(report.rows):
        engine, sim = row.engine_kld, evals[i].kld
        eval_windows = window_means(evals[i], row.window_tokens)
        if not np.allclose(eval_windows, row.sim_windows, rtol=1e-12, atol=0):  # engine compare's simulated side is eval's run
            sys.exit(f"fidelity_table: {row.kv}: engine compare's simulated side {row.sim_windows} differs from wkvlab eval's {eval_windows}")
        interval = row.ratio_interval(eval_windows)
        verdict = verdicts[i]
        line = (f"| {row.kv} | {engine['mean']:.6f} ± {engine['se']:.6f} | {sim['mean']:.6f} ± {sim['se']:.6f} | {_ratio_cell(interval)} "
                f"| {_verdict_cell(verdict)} |")
        entry = {"kv": row.kv, "engine_kld": engine, "eval_kld": sim, "ratio": interval.estimate, "ratio_interval": interval.to_dict(),
                 "verdict": verdict.to_dict(), "engine_windows": row.engine_windows, "window_tokens": row.window_tokens,
                 "eval_windows": eval_windows, "compare_sim_kld": row.sim_kld, "engine_top1": row.engine_top1,
                 "eval_top1": evals[i].top1_agreement}
        if floats:
            flt = floats[i].kld
            float_interval = row.ratio_interval(window_means(floats[i], row.window_tokens))
            line += f" {flt['mean']:.6f} ± {flt['se']:.6f} | {_ratio_cell(float_interval)} |"
            entry.update(float_kld=flt, float_ratio=float_interval.estimate, float_ratio_interval=float_interval.to_dict())
        print(line)
        rows.append(entry)
    if args.record:
        record_checks(report, rows, verdicts, presets, args, wall, engine_seconds, load)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"compare": report.to_dict(), "rows": rows, "ctx": args.ctx, "tokens": args.tokens, "command": sys.argv,
                       "commit": _commit(), "wall_s": wall, "load_start": load}, handle, indent=1)


if __name__ == "__main__":
    main()
