"""End to end, engine against engine: two real llama-cpp-python servers on loopback.

The reference server runs the packaged GGUF with an f16 cache, the candidate the same GGUF with a
q4_0 cache. ``wkvlab engine eval --engine openai --url CAND --reference-url REF`` scores both
sides' top-k log-probs on the same tokens; in-process, the same llama.cpp gives both sides' full
logits, so the full-vocabulary KLD is known exactly and the served number must sit under it by no
more than what the bound merged.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] is not installed; make test-all installs the llamacpp extra")

from tests.engines.scores import reported_topk  # noqa: E402
from wkvlab.engines import api  # noqa: E402
from wkvlab.engines.llamacpp import LlamaCppEngine  # noqa: E402
from wkvlab.engines.local_server import llama_cpp_server  # noqa: E402
from wkvlab.engines.pair import compare_pair  # noqa: E402
from wkvlab.engines.tokens import token_workload  # noqa: E402
from wkvlab.models.packaged import packaged_gguf  # noqa: E402

CTX = 48  # one short window: the server sorts the whole vocabulary in Python for every echoed position
TOPK = 20


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    logs = tmp_path_factory.mktemp("llama-servers")
    gguf = packaged_gguf("default")
    with llama_cpp_server(gguf, n_ctx=2 * CTX, log=logs / "ref.log") as ref, \
         llama_cpp_server(gguf, n_ctx=2 * CTX, cache="q4_0", log=logs / "cand.log") as cand:  # flash attention: on for a quantized V
        yield ref, cand


@pytest.mark.slow
def test_served_pair_agrees_with_the_in_process_full_vocabulary_kld(servers, tmp_path):
    ref_url, cand_url = servers
    out = tmp_path / "pair.json"
    cmd = [sys.executable, "-m", "wkvlab.cli", "engine", "eval", "--engine", "openai", "--url", cand_url, "--model", "smollm2",
           "--flavor", "llama-cpp-python", "--topk", str(TOPK), "--timeout", "300", "--reference-url", ref_url,
           "--ctx", str(CTX), "--tokens", str(CTX), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    served = json.loads(out.read_text())
    assert served["kld_method"] == "topk-bound" and served["reference"]["name"] == "openai"
    assert served["reference"]["server"]["url"] == ref_url and served["tokens"] == CTX - 2

    # The same windows, in-process: both caches' full logits from the same llama.cpp.
    work = token_workload("default", "default", ctx=CTX, tokens=CTX, bos=True)
    tokens = work.windows.tokens[0]
    ref_engine = LlamaCppEngine(packaged_gguf("default"), "f16", ctx=2 * CTX, flash_attn="off")  # the server's defaults
    cand_engine = LlamaCppEngine(packaged_gguf("default"), "q4_0", ctx=2 * CTX, flash_attn="on")
    try:
        ref_full, cand_full = ref_engine.score_window(tokens, 1), cand_engine.score_window(tokens, 1)
    finally:
        ref_engine.close()
        cand_engine.close()
    exact = compare_pair(ref_full, cand_full, tokens).metrics
    bound = compare_pair(reported_topk(ref_full.logits, tokens, ref_full.positions, TOPK),
                         reported_topk(cand_full.logits, tokens, cand_full.positions, TOPK), tokens)
    print(f"served bound {served['kld']['mean']:.6f}, tail {served['tail_mass']:.4f}; in-process same-k bound "
          f"{bound.metrics.kld.mean():.6f}, tail {bound.tail_mass.mean():.4f}; in-process full KLD {exact.kld.mean():.6f}")
    # The bound holds: the served KLD never exceeds the full one, and is what the same buckets give in-process.
    assert served["kld"]["mean"] <= exact.kld.mean() + 1e-4
    assert served["kld"]["mean"] == pytest.approx(bound.metrics.kld.mean(), rel=0.05, abs=2e-4)
    assert served["tail_mass"] == pytest.approx(float(bound.tail_mass.mean()), abs=0.01)
    # The numbers that need no bound agree with the full-vocabulary run.
    assert served["ppl"] == pytest.approx(float(np.exp(exact.nll.mean())), rel=2e-3)
    assert served["ppl_ref"] == pytest.approx(float(np.exp(exact.nll_ref.mean())), rel=2e-3)
    assert served["top1_agreement"] == pytest.approx(float(exact.top1_agree.mean()), abs=0.05)

    # The same pair with llama.cpp in-process as reference (--reference-gguf) and two served candidates
    # (the f16 server first: the q4_0 server's KV delta is paired against it, prompt by prompt).
    results = api.evaluate_engines("default", servers=[api.ServerSpec(url=u, model="smollm2", flavor="llama-cpp-python", topk=TOPK, timeout=300)
                                                       for u in (ref_url, cand_url)], ctx=CTX, tokens=CTX, flash_attn="off")
    f16, q4 = results
    assert f16.reference["name"] == "llamacpp" and f16.reference["type_k"] == "f16"
    assert f16.kld["mean"] < 0.05 * q4.kld["mean"]  # the same engine and cache on both sides: only the server's own noise
    delta = q4.kv_delta
    assert delta["baseline"] == f16.kv and delta["tokens"] == CTX - 2 and len(delta["per_prompt"]) == 1
    assert delta["kld"]["estimate"] == pytest.approx(q4.kld["mean"] - f16.kld["mean"], abs=1e-9)
