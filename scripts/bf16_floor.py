"""The bf16 floor under small KLDs, before and after float32 logits (docs/scale.md, "bf16 runs").

For each packaged model it evaluates the unquantized weights with a few small-error caches, in
four ways, on the same windows of the default text:

* ``float32``: the float32 model (the reference every doc number uses);
* ``float32, logits rounded to bf16``: the same model with its logits rounded to bf16 before the
  metrics — the rounding alone, as issue #23 measured it;
* ``bfloat16, bf16 logits`` (before): the bf16 model's own logits, upcast after ``lm_head`` (what
  wkvlab did before :mod:`wkvlab.eval.logits`);
* ``bfloat16, float32 logits`` (after): the final norm and head in float32 (what it does now).

Each also gets the attention-backend noise floor (sdpa against eager, explain's ``backend`` floor):
the KLD a pure reordering of the arithmetic causes at that precision. Prints a Markdown table with
the command, commit and machine load, and writes JSON with ``--json``.

    flock /tmp/wkvlab-heavy.lock python scripts/bf16_floor.py --json out/bf16_floor.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager

import torch

VARIANTS = ("float32", "float32, logits rounded to bf16", "bfloat16, bf16 logits", "bfloat16, float32 logits")


def _load() -> str:
    return os.getloadavg().__repr__()


@contextmanager
def _logits_as(variant: str):
    """Swap the evaluation's logits for the variant's (the model's own, or rounded to bf16)."""
    from wkvlab.eval import chunks

    real = chunks.model_logits

    def own(model, input_ids, **kwargs):
        logits = model(input_ids=input_ids, **kwargs).logits[0]
        return logits.bfloat16().float() if variant.startswith("float32, logits rounded") else logits.float()

    chunks.model_logits = own if variant in VARIANTS[1:3] else real
    try:
        yield
    finally:
        chunks.model_logits = real


def measure(model: str, kv: list[str], ctx: int, tokens: int) -> list[dict]:
    from wkvlab import api
    from wkvlab.explain.compare import backend_result, other_backend

    rows = []
    for variant in VARIANTS:
        dtype = "bfloat16" if variant.startswith("bfloat16") else "float32"
        work = api.prepare(model, "default", ctx=ctx, tokens=tokens, device="cpu", dtype=dtype)
        started = time.perf_counter()
        with _logits_as(variant):
            results = api.evaluate_workload(work, api.parse_weights(["none"]), api.parse_kv(["fp16", *kv]), baseline="float")
            floor = backend_result(work.loaded.model, work.windows, results[0], other_backend(work.loaded.model))
        rows.append({"model": model, "variant": variant, "dtype": dtype, "seconds": round(time.perf_counter() - started, 1),
                     "kld": {r.kv: r.kld["mean"] for r in results[1:]}, "kld_se": {r.kv: r.kld["se"] for r in results[1:]},
                     "backend_floor": floor.kld["mean"]})
        print(f"{model} {variant}: {rows[-1]['kld']} floor {rows[-1]['backend_floor']:.2e}", file=sys.stderr)
    return rows


def markdown(rows: list[dict], kv: list[str], command: str, commit: str, before: str, after: str) -> str:
    out = [f"`{command}` at commit `{commit}`, one thread; load average (1, 5, 15 min) before {before}, after {after}.", "",
           "| model | run | " + " | ".join(f"KLD {k}" for k in kv) + " | backend floor (sdpa vs eager) |",
           "|---|---|" + "---:|" * (len(kv) + 1)]
    for row in rows:
        base = next(r for r in rows if r["model"] == row["model"] and r["variant"] == "float32")
        cells = [f"{row['kld'][k]:.5f} ({row['kld'][k] / base['kld'][k]:.2f}×)" for k in kv]
        out.append(f"| {row['model']} | {row['variant']} | " + " | ".join(cells) + f" | {row['backend_floor']:.2e} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="default,gemma3-270m")
    parser.add_argument("--kv", default="q8_0,fp8_e4m3")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    kv = args.kv.split(",")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    before = _load()
    rows = [row for model in args.models.split(",") for row in measure(model, kv, args.ctx, args.tokens)]
    command = "python scripts/bf16_floor.py " + " ".join(sys.argv[1:])
    print(markdown(rows, kv, command.strip(), commit, before, _load()))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"commit": commit, "command": command, "load_before": before, "load_after": _load(), "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
