"""Greedy generation agreement through the quantize-on-write cache."""
from __future__ import annotations

import numpy as np
import torch

from tests.conftest import tiny_llama
from wkvlab.explain.generation import GenerationAgreement, corpus_prompts, first_divergence, generation_agreement
from wkvlab.kv.spec import KVSpec


class _CharTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return type("Out", (), {"input_ids": [ord(ch) % 128 for ch in text]})()


def test_first_divergence_and_match_rate_by_hand():
    assert first_divergence(np.array([1, 2, 3]), np.array([1, 2, 3])) == 3
    assert first_divergence(np.array([1, 2, 3]), np.array([1, 5, 3])) == 1
    g = GenerationAgreement("w", "c", 4, 4, np.array([[1, 2, 3, 4], [5, 6, 7, 8]]), np.array([[1, 2, 3, 4], [5, 0, 7, 8]]))
    assert g.divergence.tolist() == [4, 1] and g.match_rate.tolist() == [1.0, 0.75]
    s = g.summary()
    assert s["identical_fraction"] == 0.5 and s["match_rate"] == 0.875 and s["mean_tokens_to_divergence"] == 2.5


def test_prompts_are_deterministic_evenly_spaced_cuts():
    text = "".join(chr(65 + i % 26) for i in range(100))
    p = corpus_prompts(_CharTokenizer(), text, n_prompts=3, prompt_tokens=5, bos_id=1)
    assert p.shape == (3, 5) and (p[:, 0] == 1).all()
    assert p[0, 1:].tolist() == [65, 66, 67, 68] and p[2, 1:].tolist() == [ord(text[96 + i]) for i in range(4)]


def test_identity_matches_and_greedy_equals_step_by_step_argmax():
    model = tiny_llama()
    prompts = torch.randint(0, 128, (3, 8), generator=torch.Generator().manual_seed(0))
    same = generation_agreement(model, model, KVSpec.parse("fp16"), prompts, new_tokens=12)
    assert same.summary()["identical_fraction"] == 1.0 and same.reference.shape == (3, 12)
    # independent check of the reference continuation: argmax of full forwards, token by token
    seq = prompts[:1]
    for _ in range(12):
        with torch.no_grad():
            nxt = model(input_ids=seq, use_cache=False).logits[0, -1].argmax()
        seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    assert seq[0, 8:].tolist() == same.reference[0].tolist()
    coarse = generation_agreement(model, model, KVSpec.parse("int2"), prompts, new_tokens=12, reference_tokens=same.reference)
    assert coarse.summary()["match_rate"] < 1.0 and len(coarse.lines()) == 2
