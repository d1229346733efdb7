"""Bad inputs through every command: one line on stderr, a non-zero exit, no files left behind, and
no model load — torch is never imported, which is what keeps each answer under a second (asserted: 3 s each)
(benchmarks/cli_start.py measures the wall time).

All cases run in one child process (one interpreter start for the whole table): each is the real
``wkvlab`` entry point with its own argv and working folder, its stderr captured."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

OUT = "{out}"  # replaced by the case's own (empty) working folder
BINARY = "{binary}"
TEXT = "{text}"
SPEC = "{spec}"
FOREIGN_DB = "{foreign_db}"
EMPTY = "{empty}"
TRUNCATED_GGUF = "{truncated_gguf}"
FAKE_GGUF = "{fake_gguf}"
SLIDING = "{sliding}"
RANDOM_GGUF = "{random_gguf}"
SWEEP_SKIP = "{sweep_skip}"
SWEEP_HQQ = "{sweep_hqq}"

# Each answer, in the one warm interpreter; a case that loads or contacts the hub first takes far longer.
ANSWER_SECONDS = 3.0

# (argv, a fragment the one error line must contain, extra environment)
CASES = [
    (["bogus"], "No such command 'bogus'", {}),
    (["eval"], "give --weights, --kv, or both", {}),
    (["eval", "--ctx", "abc", "--kv", "int4"], "Invalid value for '--ctx'", {}),
    (["eval", "--kv", "q4_0", "--bogus"], "No such option", {}),
    (["eval", "--kv", "int9"], "unknown KV format 'int9'", {}),
    (["eval", "--kv", "q8_0/"], "bad KV pair", {}),
    (["eval", "--kv", "sglang:fp4_e2m1+recipe=nvfp8"], "is not an SGLang FP4 KV recipe", {}),
    (["eval", "--kv", "vllm@0.99:int8_per_token_head"], "vLLM version '0.99' is not modelled; use one of: 0.34, 0.27, 0.23", {}),
    (["eval", "--kv", "vllm:fp8_e4m3+scales=calculate"], "vLLM 0.34.0 has no --calculate-kv-scales", {}),
    (["eval", "--kv", "int4+recipe=nvfp4"], "applies to an fp4_e2m1 cache", {}),
    (["eval", "--weights", "int4-gx"], "unknown weight config", {}),
    (["eval", "--weights", "int4;bogus"], "cannot read option", {}),
    (["eval", "--kv", "int4-g48"], "does not divide head_dim 64", {}),
    (["eval", "--kv", "int4+skip=40"], "layer 40 does not exist", {}),
    (["eval", "--model", "/no/such/model.gguf", "--kv", "q4_0"], "model not found", {}),
    (["eval", "--model", TEXT, "--kv", "q4_0"], "is not a .gguf file", {}),
    (["eval", "--data", "/no/such/file.txt", "--kv", "q4_0"], "data file not found", {}),
    (["eval", "--data", "nosuchcorpus", "--kv", "q4_0"], "unknown data 'nosuchcorpus'", {}),
    (["eval", "--data", BINARY, "--kv", "q4_0"], "is not UTF-8 text", {}),
    (["eval", "--kv", "q4_0", "--ctx", "100000"], "maximum context 8192", {}),
    (["eval", "--kv", "q4_0", "--ctx", "512", "--tokens", "100"], "less than one window", {}),
    (["eval", "--kv", "q4_0", "--score", "third"], "unknown scoring mode", {}),
    (["eval", "--kv", "q4_0", "--json", OUT + "/missing/x.json"], "does not exist", {}),
    (["eval", "--kv", "q4_0", "--json", OUT], "is a folder", {}),
    (["eval", "--weights", "gptq-int4-g128", "--calib-samples", "0"], "calibration needs at least 1 sample", {}),
    (["eval", "--kv", "q4_0", "--threads", "0"], "--threads 0 must be at least 1", {}),
    (["eval", "--kv", "q4_0"], "WKVLAB_THREADS 'many' is not a whole number", {"WKVLAB_THREADS": "many"}),
    (["demo", "--report", TEXT], "is a file", {}),
    (["demo", "--json", OUT + "/missing/d.json"], "does not exist", {}),
    (["demo", "--ctx", "100000"], "maximum context 8192", {}),
    (["plan", "--gpu", "a100-80gb", "--batch", "1", "--ctx", "1024"], "Missing option '--model'", {}),
    (["sweep", "/no/spec.yaml"], "sweep spec not found", {}),
    (["sweep", SPEC, "--executor", "nope"], "unknown --executor", {}),
    (["sweep", SPEC, "--store", OUT + "/missing/r.db"], "does not exist", {}),
    (["sweep", SPEC, "--store", SPEC], "not a wkvlab results store", {}),
    (["results", "--store", "/no/x.db"], "no results store", {}),
    (["results", "--store", FOREIGN_DB], "not a wkvlab results store", {}),
    (["compare", "a", "b", "--store", "/no/x.db"], "no results store", {}),
    (["report", "--store", "/no/x.db"], "no results store", {}),
    (["profile", "--weights", "int4-gx"], "unknown weight config", {}),
    (["profile", "--formats", "K9V9"], "--formats", {}),
    (["profile", "--json", OUT + "/missing/p.json"], "does not exist", {}),
    (["search"], "give either --budget", {}),
    (["search", "--budget", "10"], "nothing fits --budget 10 B/token", {}),
    (["search", "--budgets", "5000,x"], "--budgets takes comma-separated", {}),
    (["search", "--budgets", "5000"], "two or more different", {}),
    (["search", "--budgets", "5000,9000", "--budget", "8000"], "give either --budget", {}),
    (["search", "--budgets", "5000,9000", "--out", OUT + "/plan.yaml"], "--out and --recipe write one plan", {}),
    (["search", "--budgets", "10,9000"], "nothing fits --budget 10 B/token", {}),
    (["search", "--budget", "9000", "--random", "-1"], "--random ≥ 0", {}),
    (["search", "--budget", "9000", "--out", OUT + "/plan.txt"], "use a file name ending in", {}),
    (["search", "--budget", "9000", "--recipe", OUT + "/missing/r.json"], "does not exist", {}),
    (["explain", "--kv", "int4"], "Missing option '--weights'", {}),
    (["explain", "--weights", "int4,int8", "--kv", "int4"], "one weight config", {}),
    (["explain", "--weights", "int4", "--kv", "int4", "--skip", "everything"], "unknown step(s) to skip", {}),
    (["explain", "--weights", "int4", "--kv", "int4", "--max-ctx", "16"], "--max-ctx 16", {}),
    (["explain", "--weights", "int4", "--kv", "int4", "--max-ctx", "100000"], "--max-ctx 100000 is longer", {}),
    (["engine", "eval", "--engine", "nope"], "unknown --engine", {}),
    (["engine", "eval", "--kv", "q9"], "unknown KV format 'q9'", {}),
    (["engine", "eval", "--kv", "q4_0", "--flash-attn", "off"], "needs flash attention", {}),
    (["engine", "eval", "--engine", "openai"], "needs --url", {}),
    (["engine", "eval", "--gguf", "/no/such.gguf"], "is not a .gguf file", {}),
    (["engine", "compare", "--kv", ","], "give at least one cache type", {}),
    (["engine", "compare", "--json", OUT + "/missing/f.json"], "does not exist", {}),
    (["findings", "bogus"], "unknown finding 'bogus'", {}),
    (["findings", "additivity", "--markdown", OUT, "--store", OUT + "/f.db"], "is a folder", {}),
    (["findings", "additivity", "--store", OUT + "/missing/f.db"], "does not exist", {}),
    (["findings", "engine", "--tokens", "256", "--store", OUT + "/f.db"], "less than one window of --ctx 1024", {}),
    (["findings", "attention", "--ctx", "8", "--store", OUT + "/f.db"], "--ctx 8 is too short", {}),
    (["findings", "additivity", "--replicates", "0", "--store", OUT + "/f.db"], "--replicates 0 must be at least 1", {}),
    (["findings", "depth", "--replicates", "2", "--store", OUT + "/f.db"], "--replicates applies to the additivity, methods", {}),
    # issue #26: each of these used to run (or load) first and fail after seconds to minutes, or not at all
    (["eval", "--kv", "q4_0", "--json", "/sys/out.json"], "folder /sys does not take new files", {}),  # root ignores mode bits; /sys refuses root
    (["eval", "--kv", "q4_0", "--json", OUT + "/out.txt"], "use a file name ending in .json", {}),
    (["demo", "--report", "/sys/report"], "cannot create report folder /sys/report", {}),
    (["sweep", SPEC, "--store", "/sys/r.db"], "folder /sys does not take new files", {}),
    (["eval", "--kv", "q4_0", "--data", EMPTY], "holds no text", {}),
    (["eval", "--kv", "q4_0", "--data", "hf:wikitext"], "the Hugging Face hub cannot be used (HF_HUB_OFFLINE is set)",
     {"HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": OUT + "/datasets"}),
    (["eval", "--model", "no-org/no-model", "--kv", "q4_0"], "is not in the local Hugging Face cache",
     {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": OUT + "/hub"}),
    (["explain", "--weights", "int4", "--kv", "int4,int8"], "explain takes one KV config, got 2", {}),
    (["eval", "--weights", "int4-g1288"], "groups of 1288 divide none of default's layer input widths (576, 1536)", {}),
    (["eval", "--weights", "int4-g3072"], "groups of 3072 are wider than every layer input of default (576, 1536)", {}),
    (["eval", "--weights", "gptq-int4-g100"], "groups of 100 divide none of default's layer input widths", {}),
    (["explain", "--weights", "int4-g1288", "--kv", "int4"], "groups of 1288 divide none", {}),
    (["tasks", "--store", OUT + "/r.db", "--tokens", "0"], "give at least one lm-eval task", {}),  # used to import torch first: 10-20 s
    (["tasks", "--tasks", "x", "--include-path", "/no/such/dir", "--store", OUT + "/r.db"], "is not a folder of lm-eval task YAMLs", {}),
    (["tasks", "--kv", "int9", "--tasks", "x", "--store", OUT + "/r.db"], "unknown KV format 'int9'", {}),
    (["tasks", "--tasks", "x", "--store", "/sys/r.db"], "folder /sys does not take new files", {}),
    # issue #42: each of these was refused only after loading the model (8 s to 78 s), or not at all
    (["eval", "--weights", "awq-int4-g128+skip=40"], "--weights awq-int4-g128+skip=40: layer 40 does not exist: the model has layers 0..29", {}),
    (["explain", "--weights", "int4+skip=30", "--kv", "int4"], "layer 30 does not exist", {}),
    (["eval", "--baseline", "engine", "--weights", "int8"], "--baseline engine simulates llama.cpp running the GGUF's own weights, and --weights int8", {}),
    (["eval", "--baseline", "engine", "--kv", "int4"], "int4 is not a llamacpp: preset", {}),
    (["eval", "--baseline", "bogus", "--kv", "int4"], "unknown --baseline 'bogus'", {}),
    (["eval", "--model", SLIDING, "--kv", "hf-hqq:int4"], "has sliding-window layers; add +skip=sliding_window", {}),
    (["explain", "--model", SLIDING, "--weights", "int8", "--kv", "hf-hqq:int2"], "has sliding-window layers", {}),
    (["eval", "--model", TRUNCATED_GGUF, "--kv", "q4_0"], TRUNCATED_GGUF + " is truncated: tensor blk.0.ffn_down.weight ends at byte", {}),
    (["eval", "--model", FAKE_GGUF, "--kv", "q4_0"], FAKE_GGUF + ": the GGUF header ends early", {}),
    (["eval", "--model", RANDOM_GGUF, "--kv", "q4_0"], "random.gguf is not a GGUF file (no GGUF magic)", {}),
    # intact but not convertible (issue 42): the file named, what to do, before transformers' converter runs for seconds
    (["eval", "--model", "{rwkv_gguf}", "--kv", "q4_0"], "{rwkv_gguf}: GGUF architecture 'rwkv7' cannot be converted", {}),
    (["eval", "--model", "{q8k_gguf}", "--kv", "q4_0"], "{q8k_gguf}: tensor blk.0.ffn_up.weight is stored as Q8_K, which gguf", {}),
    (["sweep", "{sweep_rwkv}", "--store", OUT + "/r.db"], "pass the model's Hugging Face folder", {}),
    (["eval", "--kv", "q4_0", "--device", "cuda"], "--device cuda: CUDA_VISIBLE_DEVICES='' hides every GPU", {"CUDA_VISIBLE_DEVICES": ""}),
    (["eval", "--kv", "q4_0", "--device", "cuda:0"], "hides every GPU; use --device cpu", {"CUDA_VISIBLE_DEVICES": "-1"}),
    (["eval", "--kv", "q4_0", "--device", "tpu"], "unknown --device 'tpu'", {}),
    (["eval", "--kv", "q4_0", "--device", "cpu", "--max-memory", "0.5"], "--max-memory 0.5 GiB: ", {}),
    (["eval", "--kv", "q4_0", "--max-memory", "0.5"], "--max-memory 0.5 GiB: ", {"CUDA_VISIBLE_DEVICES": ""}),  # auto: no GPU visible, so the CPU
    (["eval", "--weights", "gptq-int4-g128", "--calib", "/no/calib.txt"], "--calib file not found: /no/calib.txt; use --calib prose, code, math", {}),
    (["eval", "--weights", "gptq-int4-g128", "--calib", BINARY], "--calib: " + BINARY + " is not UTF-8 text", {}),
    (["eval", "--kv", "q4_0", "--tokens", "100000000"], "--tokens 100,000,000 needs 99,902,088 tokens of text", {}),
    (["eval", "--kv", "q4_0", "--data", TEXT, "--ctx", "64", "--tokens", "4096"], "has 24 bytes: fewer than one window of 64 tokens", {}),
    (["demo", "--tokens", "10000000"], "--tokens 10,000,000 needs", {}),
    (["explain", "--weights", "int4", "--kv", "int4", "--tokens", "100000000"], "--tokens 100,000,000 needs", {}),
    (["sweep", SWEEP_SKIP, "--store", OUT + "/r.db"], "--weights awq-int4-g128+skip=40: layer 40 does not exist", {}),
    (["sweep", SWEEP_HQQ, "--store", OUT + "/r.db"], "has sliding-window layers", {}),
    (["tasks", "--tasks", "x", "--weights", "int4+skip=40", "--store", OUT + "/r.db"], "layer 40 does not exist", {}),
    # issue 41: plan checks its inputs like eval (one grammar, one check), before any probe loads the model
    (["plan", "-m", "default", "-g", "h100", "-b", "1", "-c", "1024", "-w", "gptq-int4-g100"], "groups of 100 divide none of smollm2's", {}),
    (["plan", "-m", "default", "-g", "h100", "-b", "1", "-c", "1024", "--tp", "3"], "--tp 3 does not divide --gpus 1", {}),
    (["plan", "-m", "default", "-g", "h100", "-b", "1", "-c", "1024", "--gpus", "4", "-e", "vllm"],
     "9 attention heads are not divisible by tp 4", {}),
]

RUNNER = textwrap.dedent('''
    import contextlib, io, json, os, sys, time
    from wkvlab import cli

    cases = json.loads(sys.argv[1])
    out = []
    for case in cases:
        os.chdir(case["cwd"])
        saved = {k: os.environ.get(k) for k in case["env"]}
        os.environ.update(case["env"])
        err, std = io.StringIO(), io.StringIO()
        sys.argv = ["wkvlab", *case["args"]]
        start = time.perf_counter()
        code = 0
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
                cli.main()
        except SystemExit as exc:
            code = exc.code
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        heavy = [m for m in ("torch", "transformers", "llama_cpp") if m in sys.modules]
        out.append({"code": code, "stderr": err.getvalue(), "stdout": std.getvalue(), "heavy": heavy,
                    "seconds": time.perf_counter() - start})
    print(json.dumps(out))
''')


def _write_gguf(path: Path, arch: str = "llama", q8_k: bool = False) -> None:
    """A small intact GGUF of ``arch``; ``q8_k``: with one tensor stored as Q8_K, a type gguf-py cannot dequantize."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter

    writer = GGUFWriter(str(path), arch)
    for key, value in (("block_count", 1), ("context_length", 256), ("embedding_length", 64), ("head_count", 4), ("head_count_kv", 2)):
        getattr(writer, f"add_{key}")(value)
    writer.add_feed_forward_length(128)
    writer.add_token_list([f"t{i}" for i in range(64)])
    writer.add_tensor("token_embd.weight", np.zeros((64, 64), dtype=np.float32))
    writer.add_tensor("blk.0.ffn_down.weight", np.zeros((64, 128), dtype=np.float32))
    if q8_k:  # one block of 256 values: 292 bytes
        writer.add_tensor("blk.0.ffn_up.weight", np.zeros((1, 292), dtype=np.uint8), raw_dtype=GGMLQuantizationType.Q8_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_truncated_gguf(path: Path) -> None:
    """A small llama GGUF whose last tensor's data is cut short, as an interrupted download leaves it."""
    _write_gguf(path)
    data = path.read_bytes()
    path.write_bytes(data[:-1000])


def _fill(arg: str, paths: dict[str, str]) -> str:
    return arg.format(**paths)


def test_every_bad_input_is_one_fast_line_and_leaves_nothing(tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "random.bin").write_bytes(os.urandom(4096))
    (inputs / "notes.txt").write_text("plain text, not a model\n")
    (inputs / "empty.txt").write_text("\n  \n")
    (inputs / "grid.yaml").write_text("ctx: 64\ntokens: 128\nkv: [q4_0]\n")
    import sqlite3

    with sqlite3.connect(inputs / "other.db") as conn:
        conn.execute("CREATE TABLE notes (x)")
    (inputs / "random.gguf").write_bytes(os.urandom(4096))
    _write_truncated_gguf(inputs / "cut.gguf")
    _write_gguf(inputs / "rwkv.gguf", arch="rwkv7")
    _write_gguf(inputs / "q8k.gguf", q8_k=True)
    (inputs / "rwkv.yaml").write_text(f"models: [{inputs / 'rwkv.gguf'}]\nctx: 64\ntokens: 128\nkv: [q4_0]\n")
    (inputs / "fake.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little") + (1 << 40).to_bytes(8, "little") + b"\xff" * 64)
    (inputs / "skip.yaml").write_text("ctx: 64\ntokens: 128\nweights: [awq-int4-g128+skip=40]\nkv: [fp16]\n")
    sliding = inputs / "gemma-like"
    sliding.mkdir()
    (sliding / "config.json").write_text(json.dumps({
        "model_type": "gemma3_text", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "hidden_size": 256,
        "head_dim": 64, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 8192,
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 512}))
    (inputs / "hqq.yaml").write_text(f"models: [{sliding}]\nctx: 64\ntokens: 128\nkv: [hf-hqq:int4]\n")
    before = {p: p.read_bytes() for p in inputs.iterdir() if p.is_file()}
    cases = []
    for i, (args, fragment, env) in enumerate(CASES):
        cwd = tmp_path / f"case{i}"
        cwd.mkdir()
        paths = {"out": str(cwd), "binary": str(inputs / "random.bin"), "text": str(inputs / "notes.txt"),
                 "spec": str(inputs / "grid.yaml"), "foreign_db": str(inputs / "other.db"), "empty": str(inputs / "empty.txt"),
                 "truncated_gguf": str(inputs / "cut.gguf"), "fake_gguf": str(inputs / "fake.gguf"), "sliding": str(sliding), "random_gguf": str(inputs / "random.gguf"),
                 "sweep_skip": str(inputs / "skip.yaml"), "sweep_hqq": str(inputs / "hqq.yaml"),
                 "rwkv_gguf": str(inputs / "rwkv.gguf"), "q8k_gguf": str(inputs / "q8k.gguf"), "sweep_rwkv": str(inputs / "rwkv.yaml")}
        cases.append({"args": [_fill(a, paths) for a in args], "cwd": str(cwd), "env": {k: _fill(v, paths) for k, v in env.items()},
                      "fragment": _fill(fragment, paths)})
    cache = tmp_path / "cache"  # every case's --cache-dir: a refusal writes nothing there either
    env = {**os.environ, "WKVLAB_CACHE": str(cache), "COLUMNS": "200", "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("WKVLAB_THREADS", None)
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(cases)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    failures = []
    for (args, _, _), case, result in zip(CASES, cases, results):
        fragment = case["fragment"]
        lines = [line for line in result["stderr"].splitlines() if line.strip()]
        problems = []
        if result["code"] in (0, None):
            problems.append(f"exit {result['code']}")
        if len(lines) != 1 or not lines[0].startswith("error: "):
            problems.append(f"{len(lines)} stderr lines")
        if fragment not in result["stderr"]:
            problems.append(f"no {fragment!r}")
        if "Traceback" in result["stderr"]:
            problems.append("traceback")
        if result["heavy"]:
            problems.append(f"imported {result['heavy']}")
        if result["seconds"] > ANSWER_SECONDS:
            problems.append(f"answered after {result['seconds']:.1f} s")
        left = sorted(p.name for p in Path(case["cwd"]).rglob("*"))
        if left:
            problems.append(f"left {left}")
        if problems:
            failures.append(f"{args}: {', '.join(problems)} -> {result['stderr'].strip()[:300]!r}")
    assert not failures, "\n".join(failures)
    assert not cache.exists() or not any(cache.rglob("*")), sorted(str(p) for p in cache.rglob("*"))
    assert {p: p.read_bytes() for p in inputs.iterdir() if p.is_file()} == before  # inputs untouched (a spec given as --store included)


@pytest.mark.parametrize("args", [["--help"], ["eval", "--help"], ["engine", "eval", "--help"], ["cache", "prune", "--help"]])
def test_help_is_plain_and_has_no_bool_metavar(args):
    proc = subprocess.run([sys.executable, "-m", "wkvlab.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout and "<bool>" not in proc.stdout and "╭" not in proc.stdout


def test_importing_the_cli_does_not_import_torch():
    code = "import sys, wkvlab.cli; print(sorted(m for m in ('torch', 'transformers', 'numpy', 'matplotlib', 'plotly') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
