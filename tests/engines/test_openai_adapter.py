"""The OpenAI-compatible adapter against a scripted loopback server: parsing, alignment, retries, caps."""
import numpy as np
import pytest
import torch

from tests.engines.fake_server import FakeServer, TinyTokenizer, bigram_logits, echo_answer, prompt_logprobs_answer
from wkvlab.engines.base import PAD_ID
from wkvlab.engines.bridge import compare_window
from wkvlab.engines.openai import OpenAIEngine, ServerSpec
from wkvlab.errors import ConfigError, DataError

WINDOW = torch.tensor([0, 5, 9, 12, 3, 38, 7, 21, 39, 4])


def _engine(server, flavor="vllm", topk=5, sleep=None, **kw):
    spec = ServerSpec(url=server.url, model="tiny", flavor=flavor, topk=topk, **kw)
    return OpenAIEngine(spec, TinyTokenizer(), sleep=sleep)


def test_vllm_prompt_logprobs_recovered_exactly():
    with FakeServer(lambda p: (200, prompt_logprobs_answer(p["prompt"], p["prompt_logprobs"]), 0)) as server:
        engine = _engine(server, topk=5)
        scores = engine.score_window(WINDOW, 0)
        payload = server.payloads[0]
    assert payload["prompt"] == WINDOW.tolist() and payload["prompt_logprobs"] == 5 and payload["max_tokens"] == 1
    assert scores.positions.tolist() == list(range(len(WINDOW) - 1))
    lp = torch.log_softmax(bigram_logits(WINDOW.tolist()), -1)
    for row, p in enumerate(scores.positions.tolist()):
        ids = scores.ids[row][scores.ids[row] != PAD_ID]
        assert int(WINDOW[p + 1]) in ids.tolist()
        torch.testing.assert_close(scores.logprobs[row, : len(ids)], lp[p, ids])
    # the same "model" on both sides: the bound is 0 and NLL is the reference's
    got = compare_window(bigram_logits(WINDOW.tolist()).float(), WINDOW, scores)
    np.testing.assert_allclose(got.metrics.kld, 0, atol=1e-6)
    np.testing.assert_allclose(got.metrics.nll, got.metrics.nll_ref, atol=1e-5)
    assert got.metrics.top1_agree.all()


def test_echo_text_keys_map_back_to_ids_and_shared_texts_are_dropped():
    with FakeServer(lambda p: (200, echo_answer(p["prompt"], p["logprobs"], strip_bos=True), 0)) as server:
        scores = _engine(server, flavor="sglang", topk=8).score_window(WINDOW, 0)
        assert server.payloads[0]["echo"] is True and server.payloads[0]["logprobs"] == 8
    # the server stripped BOS: token 1's prediction (from BOS) is the null first entry
    assert scores.positions.tolist() == list(range(1, len(WINDOW) - 1))
    lp = torch.log_softmax(bigram_logits(WINDOW.tolist()), -1)
    for row, p in enumerate(scores.positions.tolist()):
        ids = scores.ids[row][scores.ids[row] != PAD_ID].tolist()
        assert 38 not in ids or int(WINDOW[p + 1]) == 38  # " dup" is two ids: only the scored token is kept
        assert 39 not in ids or int(WINDOW[p + 1]) == 39
        torch.testing.assert_close(scores.logprobs[row, : len(ids)], lp[p, ids])


def test_misaligned_server_tokens_are_refused():
    with FakeServer(lambda p: (200, prompt_logprobs_answer(p["prompt"], 3, shift_token=17), 0)) as server:
        with pytest.raises(DataError, match="prompt token 3 is not the reference's token 12"):
            _engine(server).score_window(WINDOW, 0)
    with FakeServer(lambda p: (200, echo_answer(p["prompt"], 3, rename={4: " w3w"}), 0)) as server:
        with pytest.raises(DataError, match=r"differ from the reference's at token 4 \(server ' w3w', reference ' w3'\)"):
            _engine(server, flavor="sglang").score_window(WINDOW, 0)


def test_retries_with_exponential_backoff_then_success():
    calls = []

    def flaky(payload):
        calls.append(1)
        if len(calls) <= 2:
            return 503, {"error": {"message": "loading model"}}, 0
        return 200, prompt_logprobs_answer(payload["prompt"], 2), 0

    slept = []
    with FakeServer(flaky) as server:
        scores = _engine(server, topk=2, sleep=slept.append, backoff=0.25).score_window(WINDOW, 0)
    assert len(calls) == 3 and slept == [0.25, 0.5]
    assert scores.positions.numel() == len(WINDOW) - 1


def test_timeouts_are_retried_then_reported():
    with FakeServer(lambda p: (200, {}, 0.6)) as server:
        engine = _engine(server, timeout=0.2, retries=1, sleep=lambda s: None)
        with pytest.raises(ConfigError, match="no answer from .* after 2 attempts"):
            engine.score_window(WINDOW, 0)


def test_k_cap_and_no_prompt_scoring_are_clear_errors():
    cap = {"error": {"message": "Requested prompt logprobs of 200, which is greater than max allowed: 20"}}
    with FakeServer(lambda p: (400, cap, 0)) as server:
        with pytest.raises(ConfigError, match="caps top-k log-probs below --topk 200.*--max-logprobs"):
            _engine(server, topk=200).score_window(WINDOW, 0)
    with FakeServer(lambda p: (200, {"choices": [{"index": 0, "text": "x"}]}, 0)) as server:
        with pytest.raises(ConfigError, match="cannot score prompts"):
            _engine(server).score_window(WINDOW, 0)
    with FakeServer(lambda p: (404, {"detail": "model 'tiny' not found"}, 0)) as server:
        with pytest.raises(ConfigError, match="refused the scoring request.*not found"):
            _engine(server).score_window(WINDOW, 0)


def test_batched_requests_keep_window_order():
    def batch(payload):
        prompts = payload["prompt"]
        prompts = [prompts] if isinstance(prompts[0], int) else prompts  # one prompt goes unwrapped
        choices = [dict(prompt_logprobs_answer(p, 2)["choices"][0], index=i) for i, p in enumerate(prompts)]
        return 200, {"choices": choices[::-1]}, 0  # answered out of order

    windows = torch.stack([WINDOW, WINDOW.roll(1), WINDOW.roll(2)])
    with FakeServer(batch) as server:
        out = _engine(server, topk=2, batch=2).score_windows(windows, 0)
        assert len(server.payloads) == 2
    for w, scores in enumerate(out):
        assert int(windows[w][1]) in scores.ids[0].tolist()


def test_server_spec_round_trips_and_rejects_bad_input():
    spec = ServerSpec(url="http://127.0.0.1:8000/v1", model="m", flavor="llama-cpp-python", topk=50)
    assert ServerSpec.from_dict(spec.to_dict()) == spec
    assert (spec.api, spec.prompt, spec.needs_bos) == ("echo", "text", True)
    with pytest.raises(ConfigError, match="must start with http"):
        ServerSpec(url="127.0.0.1:8000", model="m")
    with pytest.raises(ConfigError, match="unknown server flavour"):
        ServerSpec(url="http://x/v1", model="m", flavor="tgi")
