"""Long documents: windows never cross from one document into the next."""
import torch

from wkvlab.data import load_corpus, make_document_windows
from wkvlab.errors import DataError

import pytest


def test_windows_stay_inside_documents():
    docs = [torch.arange(0, 25), torch.arange(100, 109), torch.arange(200, 221)]
    windows = make_document_windows(docs, ctx=10, n_tokens=40, bos_id=None)
    # 2 windows from the first document (5 tokens left over), none from the 9-token one, 2 from the third
    assert windows.tokens.tolist() == [list(range(0, 10)), list(range(10, 20)), list(range(200, 210)), list(range(210, 220))]
    with_bos = make_document_windows(docs, ctx=10, n_tokens=20, bos_id=7)
    assert with_bos.tokens[:, 0].tolist() == [7, 7] and with_bos.tokens[1, 1:].tolist() == list(range(9, 18))
    with pytest.raises(DataError, match="no document holds one window of 30"):
        make_document_windows(docs, ctx=30, n_tokens=30, bos_id=None)


def test_code_long_is_the_longest_stdlib_modules_one_document_each():
    corpus = load_corpus("code-long")
    assert len(corpus.documents) == 8
    sizes = [len(d) for d in corpus.documents]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] > 60_000
    assert corpus.documents[0].startswith("# file: _pydecimal.py")
    assert corpus.text == "\n\n".join(corpus.documents)
    assert load_corpus("long-code").sha256 == corpus.sha256
