"""wkvlab's GPTQ and AWQ against llm-compressor's, same scheme, calibration tokens and evaluation windows.

    python benchmarks/peer_quantizers.py --group-size 64 --ctx 512 --tokens 2048 \
        --calib-samples 8 --calib-len 256 --threads 1 --json peer.json

Both tools quantize the default model (SmolLM2-135M, float32) to W4A16: 4-bit symmetric integer
weights in groups of ``--group-size`` (llm-compressor's W4A16; compressed-tensors refuses groups
that do not divide a layer's input width, and SmolLM2's is 576, so groups of 128 are impossible
there), 16-bit activations, lm_head kept. The calibration samples are the token ids wkvlab cuts
from the end of its prose corpus, handed to llm-compressor as a tokenized dataset; evaluation is
the first ``--tokens`` tokens, disjoint. llm-compressor pins an older transformers, so it runs in
its own venv (``~/.cache/wkvlab/venvs/llmcompressor-<version>``, created on first use with the
CPU torch wheel; ``--dry-run`` of the install must not resolve a CUDA torch) through
``benchmarks/llmcompressor_side.py``, and writes a compressed-tensors folder that is evaluated
here through ``--weights checkpoint:<folder>``. Wall times cover quantization only (model loading,
saving and evaluation excluded), with ``--threads`` torch threads on both sides. Prints JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LLMCOMPRESSOR = "0.14.0.1"
TORCH = "2.13.0"
SIDE = Path(__file__).with_name("llmcompressor_side.py")


def venv_dir() -> Path:
    from wkvlab.models.loading import cache_dir

    return cache_dir() / "venvs" / f"llmcompressor-{LLMCOMPRESSOR}"


def ensure_venv() -> Path:
    """Create llm-compressor's venv once (reused afterwards); refuse an install that would pull a CUDA torch."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    if python.is_file() and subprocess.run([str(python), "-c", "import llmcompressor"], capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    packages = [f"torch=={TORCH}", f"llmcompressor=={LLMCOMPRESSOR}"]
    report = venv / "install-report.json"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--dry-run", "--report", str(report), *packages], check=True)
    torches = [i for i in json.loads(report.read_text())["install"] if i["metadata"]["name"] == "torch"]
    if any("+cpu" not in t["metadata"]["version"] for t in torches):
        raise SystemExit(f"pip would install torch {torches[0]['metadata']['version']} (not the CPU wheel); not installing llm-compressor")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *packages], check=True)
    return python


def model_folder(loaded) -> Path:
    """An HF folder of the reference (the safetensors copy wkvlab caches for a GGUF model)."""
    folder = Path(str(loaded.model.name_or_path))
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return folder
    target = Path(tempfile.mkdtemp(prefix="wkvlab-peer-model-"))
    loaded.model.save_pretrained(str(target))
    loaded.tokenizer.save_pretrained(str(target))
    return target


def run_llmcompressor(python: Path, folder: Path, calib: Path, method: str, args, out: Path) -> dict:
    command = [str(python), str(SIDE), "--model-dir", str(folder), "--calib-tokens", str(calib), "--method", method,
               "--group-size", str(args.group_size), "--actorder", args.lc_actorder, "--threads", str(args.threads), "--out", str(out)]
    if args.symmetric:
        command.append("--symmetric")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"llm-compressor {method} failed:\n{done.stderr[-3000:]}")
    return json.loads((out / "timing.json").read_text())


def build_ours(work, text: str, calibration, threads: int) -> float:
    """Build (and cache, so the evaluation reloads it) one of wkvlab's configs; returns build seconds.

    Configs that read no calibration (RTN) are not cached by wkvlab; the evaluation rebuilds them.
    """
    import torch

    from wkvlab.weights.apply import build_quantized
    from wkvlab.weights.cache import cache_key, entry_dir, save_entry
    from wkvlab.weights.spec import WeightSpec

    spec = WeightSpec.parse(text)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        built = build_quantized(work.loaded.model, spec, calibration)
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(before)
    target = entry_dir(cache_key(work.loaded.fingerprint, spec, calibration))
    if spec.needs_calibration and not (target / "meta.json").is_file():
        save_entry(target, work.loaded.model, built)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--asymmetric", dest="symmetric", action="store_false", help="asymmetric grids on both sides")
    parser.add_argument("--methods", default="gptq,awq")
    parser.add_argument("--lc-actorder", default="none", help="llm-compressor GPTQ actorder (none matches wkvlab's default; its own default is static)")
    parser.add_argument("--ours-extra", default="", help="more wkvlab configs to evaluate, '|'-separated")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--calib", default="prose")
    parser.add_argument("--calib-samples", type=int, default=8)
    parser.add_argument("--calib-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", default=None, help="where llm-compressor's checkpoints go (kept); default a temp folder")
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args()

    from wkvlab import api
    from wkvlab.weights.calibration import CalibrationSpec
    from wkvlab.weights.spec import WeightSpec

    python = ensure_venv()
    work = api.prepare(args.model, "default", ctx=args.ctx, tokens=args.tokens)
    cspec = CalibrationSpec(args.calib, args.calib_samples, args.calib_len)
    suffix = "-sym" if args.symmetric else ""
    ours = {m: f"{m}-int4-g{args.group_size}{suffix}" for m in args.methods.split(",")}
    calibration = api.prepare_calibration(work, [WeightSpec.parse(t) for t in ours.values()], cspec)
    assert calibration is not None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="wkvlab-peer-"))
    workdir.mkdir(parents=True, exist_ok=True)
    calib_file = workdir / "calibration.json"
    calib_file.write_text(json.dumps(calibration.tokens.tolist()))
    folder = model_folder(work.loaded)
    rows = []
    for method, text in ours.items():
        print(f"wkvlab {text} ...", file=sys.stderr, flush=True)
        rows.append({"tool": "wkvlab", "method": method, "weights": text, "seconds": build_ours(work, text, calibration, args.threads)})
        print(f"  {rows[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
        out = workdir / f"llmcompressor-{method}"
        if not (out / "timing.json").is_file():
            print(f"llm-compressor {method} ...", file=sys.stderr, flush=True)
            run_llmcompressor(python, folder, calib_file, method, args, out)
        timing = json.loads((out / "timing.json").read_text())
        rows.append({"tool": f"llm-compressor {timing['llmcompressor']}", "method": method, "weights": f"checkpoint:{out}",
                     "seconds": timing["seconds"], "actorder": timing["actorder"]})
        print(f"  llm-compressor {method}: {timing['seconds']:.1f} s", file=sys.stderr, flush=True)
    for text in filter(None, args.ours_extra.split("|")):
        print(f"wkvlab {text} ...", file=sys.stderr, flush=True)
        rows.append({"tool": "wkvlab", "method": "extra", "weights": text, "seconds": build_ours(work, text, calibration, args.threads)})
        print(f"  {rows[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
    results = api.evaluate_workload(work, [WeightSpec.parse(r["weights"]) for r in rows], api.parse_kv(["fp16"]), None, cspec)
    for row, result in zip(rows, results):
        row.update(kld=result.kld["mean"], kld_se=result.kld.get("se"), kld_p99=result.kld.get("p99"), top1=result.top1_agreement,
                   weight_bytes=result.weight_bytes, notes=[n for n in result.notes if "checkpoint:" in n][:1])
    payload = {"model": work.loaded.name, "scheme": f"W4A16 int4 group {args.group_size} {'symmetric' if args.symmetric else 'asymmetric'}",
               "calibration": calibration.key, "eval": {"ctx": args.ctx, "tokens": results[0].tokens, "windows": work.windows.n_windows},
               "threads": args.threads, "load_average": os.getloadavg(), "rows": rows}
    text = json.dumps(payload, indent=1)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")


if __name__ == "__main__":
    main()
