import pytest
import torch

from wkvlab.data import load_corpus, make_windows
from wkvlab.errors import ConfigError, DataError


def test_windows_are_consecutive_with_bos():
    ids = torch.arange(100, 200)
    w = make_windows(ids, ctx=10, n_tokens=30, bos_id=1)
    assert w.tokens.shape == (3, 10)
    assert (w.tokens[:, 0] == 1).all()
    assert w.tokens[0, 1:].tolist() == list(range(100, 109))
    assert w.tokens[1, 1:].tolist() == list(range(109, 118))
    assert w.scored_per_window == 9 and w.n_scored == 27


def test_windows_without_bos_and_second_half():
    ids = torch.arange(50)
    w = make_windows(ids, ctx=8, n_tokens=16, bos_id=None, score="second-half")
    assert w.tokens.tolist() == [list(range(8)), list(range(8, 16))]
    # llama.cpp: first = n_ctx/2, positions first..n_ctx-2 are scored
    assert w.score_from == 4 and w.scored_per_window == 3


def test_short_text_is_refused():
    with pytest.raises(DataError, match="fewer than one window"):
        make_windows(torch.arange(5), ctx=8, n_tokens=8, bos_id=None)


def test_fewer_windows_when_text_runs_out():
    w = make_windows(torch.arange(20), ctx=8, n_tokens=64, bos_id=None)
    assert w.n_windows == 2


def test_bad_score_mode():
    with pytest.raises(ConfigError):
        make_windows(torch.arange(20), ctx=8, n_tokens=8, bos_id=None, score="middle")


def test_embedded_corpora_are_deterministic():
    a, b = load_corpus("default"), load_corpus("prose")
    assert a.text == b.text and len(a.text) > 100_000 and a.sha256 == b.sha256
    code = load_corpus("code")
    assert "def " in code.text and len(code.text) > 1_000_000


def test_text_and_jsonl_files(tmp_path):
    (tmp_path / "a.txt").write_text("hello world " * 10)
    assert load_corpus(str(tmp_path / "a.txt")).text.startswith("hello")
    (tmp_path / "b.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    assert load_corpus(str(tmp_path / "b.jsonl")).text == "one\n\ntwo"
    (tmp_path / "bad.jsonl").write_text('{"txt": 1}\n')
    with pytest.raises(DataError, match="text"):
        load_corpus(str(tmp_path / "bad.jsonl"))
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(DataError, match="no text"):
        load_corpus(str(tmp_path / "empty.txt"))
    with pytest.raises(DataError, match="unknown data"):
        load_corpus("no-such-corpus")
