"""hf-quanto presets against transformers' own QuantizedCache (quanto backend), replayed on a tiny model.

optimum-quanto is not a wkvlab dependency, so the test builds its own venv under a temp dir that
sees this environment's packages (torch, transformers) through a .pth file and pip-installs only
optimum-quanto into it; without a reachable package index it skips, saying so. Slow (a venv and a
download): marked ``slow``.
"""
from __future__ import annotations


import pytest

from tests.kv._replay_common import run_replay, side_venv

QUANTO = "optimum-quanto==0.2.7"


@pytest.fixture(scope="module")
def quanto_python(tmp_path_factory) -> str:
    return side_venv(tmp_path_factory, "quanto", (QUANTO,))


@pytest.mark.slow
@pytest.mark.parametrize("nbits", [4, 2])
def test_hf_quanto_preset_replays_quantized_cache(quanto_python, nbits):
    # prompt 13, residual 8, 40 decoded tokens: the prompt quantized at prefill, five flushes at 13 + 8m
    result = run_replay(quanto_python, "_quantized_cache_replay.py", nbits, 13, 8, 40)
    assert result["prompt_vs_ref"] < 1e-5  # the prompt attends unquantized, as QuantizedCache returns it
    assert result["quantized_effect"] > 1e-2  # the cache does change the decoded tokens' logits
    assert result["sim"] < 1e-5, result  # wkvlab's hf-quanto:int<b>+residual=8+prefill=13 is the same computation
    assert result["old"] > 100 * result["sim"]  # the previous preset (flushes counted from position 0) was not
