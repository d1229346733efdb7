"""``engine compare``'s simulated side is ``wkvlab eval``'s run: the same per-token numbers.

The two were separate loops until the Gemma-3-270M fidelity run showed them apart (docs/engines.md):
compare scored each window in one pass, eval in chunks of 256 (its auto chunk on a 262k vocabulary).
Here the engine is a stand-in (no llama.cpp needed); the simulated side must equal
``evaluate_workload`` with the same engine baseline bit for bit, per token, on a sliding-window
model (Gemma-3, window 8 < ctx) and on Llama, with eval's chunk smaller than the window (compare
used to pass each window whole; on these tiny models that happens to match, on Gemma-3-270M it did not).
"""
from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from tests.conftest import tiny_gemma3, tiny_llama
from tests.engines.test_ggml_acts import _tiny_gguf
from wkvlab import api
from wkvlab.data.corpora import Corpus
from wkvlab.data.windows import WindowSet
from wkvlab.engines import compare
from wkvlab.engines.base import EngineInfo, WindowScores
from wkvlab.eval.baseline import llamacpp_baseline
from wkvlab.eval.runner import RunOptions, forward_logits
from wkvlab.models.loading import LoadedModel
from wkvlab.weights.spec import WeightSpec

CTX, CHUNK = 32, 16
TYPES = ["q8_0", "q4_0", "q8_0/q4_0"]


@pytest.fixture(autouse=True)
def _threads(one_torch_thread):
    pass


class _StandIn:
    """Scores a window with the float model: only the simulated side is under test here."""

    def __init__(self, model):
        self.model = model

    def __call__(self, gguf, kv, **_options):
        self.info = EngineInfo("llamacpp", "stand-in", kv, {})
        return self

    def score_window(self, tokens: torch.Tensor, score_from: int) -> WindowScores:
        positions = torch.arange(score_from, len(tokens) - 1)
        return WindowScores(positions=positions, logits=forward_logits(self.model, tokens)[positions])

    def close(self) -> None:
        pass


def _work(model) -> api.Workload:
    torch.manual_seed(1)
    windows = WindowSet(tokens=torch.randint(0, 128, (3, CTX)), score_from=0, bos=False)
    loaded = LoadedModel(name="tiny", model=model, tokenizer=None, source="memory", fingerprint="t" * 64)
    return api.Workload(loaded=loaded, corpus=Corpus("text", "x"), windows=windows)


@pytest.mark.parametrize("make", [tiny_gemma3, tiny_llama], ids=["gemma3", "llama"])
def test_compare_simulation_is_evals_run_token_for_token(make, tmp_path, monkeypatch):
    model = make()
    gguf = str(tmp_path / "tiny.gguf")
    # q8 inputs on every layer's projections, as llama.cpp rounds them (no K-quants: width 64 < 256)
    _tiny_gguf(gguf, {"token_embd.weight": Q.Q8_0, **{f"blk.{i}.{t}.weight": Q.Q5_0 for i in range(2)
                                                      for t in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down")}})
    baseline = llamacpp_baseline(model, gguf)
    assert baseline.activations  # the amplifying activation path is on
    monkeypatch.setattr(compare, "LlamaCppEngine", _StandIn(model))
    work, options = _work(model), RunOptions(chunk=CHUNK)
    report = compare.compare_engine(work, gguf, TYPES, options=options)
    evals = api.evaluate_workload(work, [WeightSpec()], [compare.sim_preset(t) for t in TYPES], options=options, baseline=baseline)
    for row, result in zip(report.rows, evals):
        assert row.preset == result.kv
        per_window = [float(result.arrays.kld[result.arrays.window == w].mean()) for w in range(3)]
        assert row.sim_windows == per_window  # exact, not close: one code path
        assert row.sim_kld == result.kld and row.sim_top1 == result.top1_agreement
        assert row.window_tokens == [CTX - 1] * 3
