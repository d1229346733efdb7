"""hf-hqq presets against transformers' own QuantizedCache (hqq backend), replayed on a tiny model.

hqq is not a wkvlab dependency, so the test builds its own venv under a temp dir that sees this
environment's packages (torch, transformers) through a .pth file and pip-installs only hqq 0.2.8.post1
(from its sdist, pure Python; ``DISABLE_CUDA=1`` skips its optional CUDA extension) and termcolor,
which hqq imports, into it — as tests/kv/test_quantized_cache_replay.py does for optimum-quanto;
without a reachable package index it skips, saying so. Slow (a venv, a download): marked ``slow``.
"""
from __future__ import annotations


import pytest

from tests.kv._replay_common import run_replay, side_venv

HQQ = ("hqq==0.2.8.post1", "termcolor==3.3.0")


@pytest.fixture(scope="module")
def hqq_python(tmp_path_factory) -> str:
    return side_venv(tmp_path_factory, "hqq", HQQ, env={"DISABLE_CUDA": "1"})


@pytest.mark.slow
@pytest.mark.parametrize("nbits", [4, 2, 8])
def test_hf_hqq_preset_replays_quantized_cache(hqq_python, nbits):
    # prompt 13, residual 8, 40 decoded tokens: the prompt quantized at prefill, five flushes at 13 + 8m,
    # each re-quantizing the whole (dequantized) cache with hqq's length-dependent axis-0 groups
    result = run_replay(hqq_python, "_hqq_cache_replay.py", nbits, 13, 8, 40)
    assert result["kernel"] == 0.0, result  # wkvlab's HQQ kernel is hqq's Quantizer, bit for bit (1-8 bits, fp32 and bf16)
    assert result["prompt_vs_ref"] < 1e-5  # the prompt attends unquantized, as QuantizedCache returns it
    assert result["quantized_effect"] > 1e-3  # the cache does change the decoded tokens' logits
    assert result["sim"] < 1e-5, result  # wkvlab's hf-hqq:int<b>+residual=8+prefill=13 is the same computation
    # neither quanto's per-token groups nor quantizing each flush from the full-precision keys (no chain) is
    assert result["per_token_groups"] > 100 * result["sim"] and result["no_chain"] > 100 * result["sim"], result
