"""The search on the packaged default model with very few tokens, and the CLI's one-line errors."""
import os
import subprocess
import sys

import pytest

from wkvlab.kv.spec import KVSpec
from wkvlab.search import api


@pytest.mark.slow
def test_search_on_default_model(default_model, tmp_path):
    result = api.search(default_model, budget=8000, weights="int4-g128", formats="K4V4", ctx=32, profile_tokens=32,
                        heldout_tokens=64, candidates=2, unaware=False, weight_profile=False, use_cache=False)
    assert result.chosen is not None and result.chosen.fits and result.chosen.kv_bytes_per_token <= 8000
    reference = next(r for r in result.rows if r.kind == "reference")
    assert reference.kv_bytes_per_token == 30 * 3 * 2 * 64 * 2  # SmolLM2: 30 layers, 3 KV heads, head_dim 64, fp16
    # every rival spends the budget within one layer-format step (fp16 768 − K4V4 216 = 552 B here)
    assert all(0 <= r.gap < 552 for r in result.rows if r.kind != "reference"), [(r.name, r.gap) for r in result.rows]
    # the plan spends the spare bytes on fp16 layers; the spec it writes is what wkvlab eval reads
    spec = KVSpec.from_dict(result.spec)
    assert sum(spec.formats_for(i)[0].name == "fp16" for i in range(30)) >= 1
    # SmolLM2's 576-wide inputs hold no whole groups of 128: vLLM gets the cache flags but no launch line, and says why
    vllm = result.exports["vllm"]
    assert vllm["argv"] == [] and vllm["kv_args"] and any("no launch line for int4-g128" in n for n in vllm["notes"]), vllm
    assert -1.0 <= result.rank_correlation <= 1.0


def test_cli_errors_are_one_line():
    proc = subprocess.run([sys.executable, "-m", "wkvlab.cli", "search", "--weights", "int4-g128"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 2 and "either --budget" in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1
