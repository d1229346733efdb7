"""llama.cpp against a stored reference: the in-process engine number without a reference model loaded."""
import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed; make test-all installs the llamacpp extra")

from wkvlab import api
from wkvlab.engines.api import evaluate_llamacpp
from wkvlab.errors import ConfigError


@pytest.mark.slow
def test_engine_against_a_stored_reference_matches_the_transformers_reference(tmp_path):
    path = tmp_path / "ref.safetensors"
    work = api.prepare("default", "default", ctx=128, tokens=512)
    api.save_reference(work, path)
    stored = evaluate_llamacpp("default", "q4_0", reference=str(path), ctx=128, tokens=512, threads=1)
    direct = evaluate_llamacpp("default", "q4_0", ctx=128, tokens=512, threads=1)
    assert stored.kld_method == "stored-reference" and stored.reference["name"] == "stored-reference"
    np.testing.assert_array_equal(stored.arrays.nll_ref, direct.arrays.nll_ref)  # exact: the same reference numbers
    np.testing.assert_array_equal(stored.arrays.top1_agree, direct.arrays.top1_agree)
    assert abs(stored.kld["mean"] - direct.kld["mean"]) < 0.1 * direct.kld["mean"]  # head exact, tail sampled
    assert stored.kv_bytes_per_token == direct.kv_bytes_per_token  # from the GGUF header, no model loaded
    with pytest.raises(ConfigError, match="made for another data"):
        evaluate_llamacpp("default", "q4_0", reference=str(path), ctx=128, tokens=512, data="code", threads=1)
