"""End to end: a real llama-cpp-python server on loopback, scored through the OpenAI adapter."""
import numpy as np
import pytest
import torch

pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] is not installed; make test-all installs the llamacpp extra")

from wkvlab.engines.bridge import compare_window  # noqa: E402
from wkvlab.engines.llamacpp import LlamaCppEngine  # noqa: E402
from wkvlab.engines.local_server import llama_cpp_server  # noqa: E402
from wkvlab.engines.openai import OpenAIEngine, ServerSpec  # noqa: E402
from wkvlab.engines.run import engine_workload, evaluate_engine  # noqa: E402
from wkvlab.errors import DataError  # noqa: E402
from wkvlab.eval.runner import forward_logits  # noqa: E402
from wkvlab.models.packaged import packaged_gguf  # noqa: E402

CTX = 48  # one short window: the server sorts the whole vocabulary in Python for every position


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    with llama_cpp_server(packaged_gguf("default"), n_ctx=2 * CTX, log=tmp_path_factory.mktemp("llama-server") / "server.log") as url:
        yield url


@pytest.mark.slow
def test_server_scores_match_the_same_engine_in_process(server_url, default_model):
    spec = ServerSpec(url=server_url, model="smollm2", flavor="llama-cpp-python", topk=20, timeout=300)
    work = engine_workload(default_model, "default", ctx=CTX, tokens=CTX, score="all", bos=True)
    assert work.windows.bos and int(work.windows.tokens[0, 0]) == default_model.tokenizer.bos_token_id
    result = evaluate_engine(OpenAIEngine(spec, default_model.tokenizer), work, score_from=1)
    assert result.kld_method == "topk-bound" and result.tokens == CTX - 2
    assert 0 < result.tail_mass < 0.5
    out = result.to_dict()
    assert out["engine"]["name"] == "openai" and out["kld"]["mean"] == result.kld["mean"]

    # The server runs llama.cpp with an f16 cache and no flash attention: in-process, the same
    # engine gives full logits. The server's bound must not exceed their full KLD, and the
    # numbers that need no bound (NLL, top-1) must agree.
    engine = LlamaCppEngine(packaged_gguf("default"), "f16", ctx=CTX, flash_attn="off")
    try:
        full = [compare_window(forward_logits(default_model.model, w), w, engine.score_window(w, 1)).metrics for w in work.windows.tokens]
    finally:
        engine.close()
    full_kld = np.concatenate([m.kld for m in full])
    assert np.all(result.arrays.kld <= full_kld + 1e-3)
    assert result.arrays.kld.mean() > 0.3 * full_kld.mean()  # top-20 holds most of the difference
    np.testing.assert_allclose(result.arrays.nll, np.concatenate([m.nll for m in full]), atol=2e-3)
    assert result.top1_agreement == pytest.approx(np.concatenate([m.top1_agree for m in full]).mean(), abs=0.02)


@pytest.mark.slow
def test_server_tokenizing_differently_is_refused(server_url, default_model):
    tokenizer = default_model.tokenizer
    # "Hello" spelled letter by letter: a valid id sequence the server cannot reproduce from text
    letters = tokenizer.convert_tokens_to_ids(list("Hello"))
    rest = tokenizer(" world, this is a test of alignment.", add_special_tokens=False).input_ids
    window = torch.tensor([tokenizer.bos_token_id, *letters, *rest])
    engine = OpenAIEngine(ServerSpec(url=server_url, model="smollm2", flavor="llama-cpp-python", topk=5), tokenizer)
    with pytest.raises(DataError, match=r"differ from the reference's at token 1 \(server 'Hello', reference 'H'\)"):
        engine.score_window(window, 1)
