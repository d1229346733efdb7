"""Documents: windows never cross from one document into the next, and are spread across documents."""
import torch

from types import SimpleNamespace

from wkvlab.data import Corpus, cut_windows, load_corpus, make_document_windows, window_layout
from wkvlab.errors import DataError

import pytest


def test_windows_stay_inside_documents():
    docs = [torch.arange(0, 25), torch.arange(100, 109), torch.arange(200, 221)]
    windows = make_document_windows(docs, ctx=10, n_tokens=40, bos_id=None)
    # 2 windows from the first document (5 tokens left over), none from the 9-token one, 2 from the third
    assert windows.tokens.tolist() == [list(range(0, 10)), list(range(10, 20)), list(range(200, 210)), list(range(210, 220))]
    with_bos = make_document_windows(docs, ctx=10, n_tokens=20, bos_id=7)
    # with BOS a window holds 9 text tokens, so the 9-token document holds one: spread, it is the second window
    assert with_bos.tokens[:, 0].tolist() == [7, 7] and with_bos.tokens[1, 1:].tolist() == list(range(100, 109))
    assert with_bos.documents == (0, 1)
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


def test_windows_are_spread_across_documents_round_robin():
    docs = [torch.arange(0, 25), torch.arange(100, 109), torch.arange(200, 221), torch.arange(300, 335)]
    three = make_document_windows(docs, ctx=10, n_tokens=30, bos_id=None)
    # window 1 of every document that holds one (the 9-token one holds none), before any window 2
    assert three.tokens[:, 0].tolist() == [0, 200, 300] and three.documents == (0, 2, 3)
    six = make_document_windows(docs, ctx=10, n_tokens=60, bos_id=None)
    assert six.tokens[:, 0].tolist() == [0, 10, 200, 210, 300, 310] and six.documents == (0, 0, 2, 2, 3, 3)
    seven = make_document_windows(docs, ctx=10, n_tokens=70, bos_id=None)
    assert seven.documents == (0, 0, 2, 2, 3, 3, 3)  # only the 35-token document holds a third


def test_spreading_reads_documents_only_as_far_as_it_needs():
    def lazy():
        yield torch.arange(0, 20)
        yield torch.arange(100, 120)
        pytest.fail("a third document was tokenized although two hold the windows asked for")

    assert make_document_windows(lazy(), ctx=10, n_tokens=20, bos_id=None).documents == (0, 1)


class _Chars:
    """A character-level tokenizer: one id per character, no BOS."""

    bos_token_id = None

    def __call__(self, text, add_special_tokens=False):
        return SimpleNamespace(input_ids=[ord(c) for c in text])


def test_cut_windows_records_documents_or_falls_back_to_the_stream():
    spread = Corpus("t", "a" * 25 + "\n\n" + "b" * 5 + "\n\n" + "c" * 12, ("a" * 25, "b" * 5, "c" * 12))
    w = cut_windows(spread, _Chars(), ctx=10, n_tokens=30, bos_id=None)
    assert w.documents == (0, 0, 2) and w.text_end == len(spread.text)  # calibration reserves up to the last used document
    assert cut_windows(spread, _Chars(), ctx=10, n_tokens=10, bos_id=None).text_end == 25
    # the documents hold fewer windows than asked: the stream, as before (windows are the units)
    stream = cut_windows(spread, _Chars(), ctx=10, n_tokens=40, bos_id=None)
    assert stream.documents is None and stream.n_windows == 4 and stream.tokens[2, 0].item() == ord("a")
    strict = Corpus("t", spread.text, spread.documents, documents_only=True)  # code-long: never the stream
    assert cut_windows(strict, _Chars(), ctx=10, n_tokens=40, bos_id=None).documents == (0, 0, 2)
    assert cut_windows(spread, _Chars(), ctx=10, n_tokens=30, bos_id=None, stride=10).documents is None  # a stride: the stream
    assert window_layout(spread) == "documents-spread-v1" and window_layout(spread, stride=10) == "" \
        and window_layout(Corpus("t", "x")) == ""


def test_embedded_corpora_record_their_documents_and_keep_their_text(tmp_path):
    import pydoc_data.topics as topics

    prose = load_corpus("prose")
    assert len(prose.documents) == len(topics.topics) and prose.text == "\n\n".join(prose.documents)
    assert prose.documents[0] == topics.topics[sorted(topics.topics)[0]].strip() and not prose.documents_only
    code = load_corpus("code")
    assert code.text == "\n\n".join(code.documents) and code.documents[0].startswith("# file: ")
    assert load_corpus("code-long").documents_only
    records = tmp_path / "r.jsonl"
    records.write_text('{"text": "one"}\n{"text": "two"}\n', encoding="utf-8")
    assert load_corpus(str(records)).documents == ("one", "two")
    plain = tmp_path / "p.txt"
    plain.write_text("one stream of text", encoding="utf-8")
    assert load_corpus(str(plain)).documents == ()


def test_unused_remainders_are_what_follows_each_touched_documents_windows():
    from wkvlab.data.windows import unused_remainders

    spread = Corpus("t", "a" * 25 + "\n\n" + "b" * 5 + "\n\n" + "c" * 12 + "\n\n" + "d" * 30,
                    ("a" * 25, "b" * 5, "c" * 12, "d" * 30))
    w = cut_windows(spread, _Chars(), ctx=10, n_tokens=30, bos_id=None)
    assert w.documents == (0, 2, 3)  # one window from each document that holds one
    # a: 15 after its window; b: none taken, all 5; c: 2 after its window; d (the last touched) 20 after it
    assert unused_remainders(spread, _Chars(), w).tolist() == [ord("a")] * 15 + [ord("b")] * 5 + [ord("c")] * 2 + [ord("d")] * 20
    stream = cut_windows(spread, _Chars(), ctx=10, n_tokens=70, bos_id=None)  # the documents hold 6 windows
    assert stream.documents is None and unused_remainders(spread, _Chars(), stream).numel() == 0


def _offline_hf_dataset(tmp_path, monkeypatch, name: str, rows: list[str]) -> None:
    """``rows`` as Hugging Face dataset ``name`` in a temporary datasets cache, the hub switched off:
    ``load_dataset(name)`` then finds it where it finds a dataset downloaded before."""
    import glob
    import json
    import shutil

    datasets = pytest.importorskip("datasets")
    from datasets.packaged_modules.json.json import Json

    cache = tmp_path / "datasets"
    for var, value in (("HF_DATASETS_CACHE", str(cache)), ("HF_HOME", str(tmp_path / "home")), ("HF_HUB_OFFLINE", "1"),
                       ("HF_DATASETS_OFFLINE", "1")):
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)  # read at import: another test may have imported it
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in rows), encoding="utf-8")
    Json(cache_dir=str(tmp_path / "build"), dataset_name=name, data_files={"test": str(source)}).download_and_prepare()
    built, = glob.glob(str(tmp_path / "build" / name / "*" / "0.0.0"))
    (cache / name / "default" / "0.0.0").mkdir(parents=True)  # the cache's layout: <name>/<config>/<version>/<hash>
    shutil.move(built, cache / name / "default" / "0.0.0" / "0")


def test_a_hugging_face_datasets_rows_are_its_documents(tmp_path, monkeypatch):
    rows = ["a" * 25, "b" * 5 + "\n\n" + "b" * 5, "c" * 12]  # a blank line inside a row does not split it
    _offline_hf_dataset(tmp_path, monkeypatch, "toyrows", rows)
    corpus = load_corpus("hf:toyrows")
    assert corpus.documents == tuple(rows) and corpus.text == "\n\n".join(rows)  # the text (and its sha) as before
    assert window_layout(corpus) == "documents-spread-v1"
    assert cut_windows(corpus, _Chars(), ctx=10, n_tokens=30, bos_id=None).documents == (0, 1, 2)
    # the rows hold fewer windows than asked (4 of 10 characters): the stream, as for every corpus
    stream = cut_windows(corpus, _Chars(), ctx=10, n_tokens=50, bos_id=None)
    assert stream.documents is None and stream.tokens.reshape(-1).tolist() == [ord(c) for c in corpus.text[:50]]
