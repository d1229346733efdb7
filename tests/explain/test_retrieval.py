"""The synthetic retrieval task: deterministic items, facts where they are said to be, paired scores."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import tiny_llama
from wkvlab.errors import ConfigError
from wkvlab.explain.retrieval import build_items, retrieval_eval, score_items
from wkvlab.kv.spec import KVSpec


class _CharTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return type("Out", (), {"input_ids": [ord(ch) % 128 for ch in text]})()


TEXT = "".join(chr(97 + (i * 7) % 26) for i in range(5000))


def _ids(text):
    return [ord(ch) % 128 for ch in text]


def test_items_are_deterministic_and_plant_the_fact_at_its_depth():
    tok = _CharTokenizer()
    a = build_items(tok, TEXT, ctx=200, depths=(0.0, 0.5, 1.0), per_depth=2, seed=3, bos_id=1)
    b = build_items(tok, TEXT, ctx=200, depths=(0.0, 0.5, 1.0), per_depth=2, seed=3, bos_id=1)
    assert [torch.equal(x.ids, y.ids) for x, y in zip(a, b)] == [True] * 6
    for item in a:
        assert item.ids.numel() == 200 and item.ids[0] == 1
        fact = _ids(f" The secret code of {item.name} is {item.code}. ")
        seq = item.ids.tolist()
        at = next(i for i in range(len(seq)) if seq[i : i + len(fact)] == fact)
        question = _ids(f"\n\nQuestion: What is the secret code of {item.name}?\nAnswer: The secret code of {item.name} is")
        n_filler = 200 - 1 - len(fact) - len(question) - len(item.code) - 1
        assert at == 1 + round(item.depth * n_filler)
        assert seq[item.answer_start :] == _ids(f" {item.code}")
    with pytest.raises(ConfigError):
        build_items(tok, TEXT, ctx=60)


def test_scores_by_hand_and_identity_has_no_drop():
    model = tiny_llama(max_position_embeddings=512)
    items = build_items(_CharTokenizer(), TEXT, ctx=160, depths=(0.0, 1.0), per_depth=2)
    logprob, correct = score_items(model, items)
    item = items[0]
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=item.ids[None]).logits[0], -1)
    expected = sum(float(lp[p - 1, item.ids[p]]) for p in range(item.answer_start, item.ids.numel()))
    assert logprob[0] == pytest.approx(expected, abs=1e-4)
    same = retrieval_eval(model, model, KVSpec.parse("fp16"), items)
    assert np.array_equal(same.logprob, same.ref_logprob) and same.to_dict()["logprob_drop"] == 0
    coarse = retrieval_eval(model, model, KVSpec.parse("int2"), items, reference_scores=(logprob, correct))
    assert [r["items"] for r in coarse.per_depth()] == [2, 2] and np.abs(coarse.logprob - logprob).max() > 0
    assert len(coarse.lines()) == 2
