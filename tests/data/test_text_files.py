"""Data files must be text: a binary is refused in one line, a stray undecodable byte is not."""
from __future__ import annotations

import os

import pytest

from wkvlab.data.corpora import check_data, load_corpus
from wkvlab.errors import DataError


def test_binary_file_is_refused_before_and_at_loading(tmp_path):
    path = tmp_path / "random.txt"
    path.write_bytes(os.urandom(8192))
    for read in (check_data, load_corpus):
        with pytest.raises(DataError, match=r"is not UTF-8 text \(\d+\.\d% of its characters"):
            read(str(path))


def test_utf16_and_nul_padded_files_are_not_text(tmp_path):
    utf16 = tmp_path / "utf16.txt"
    utf16.write_text("hello world " * 200, encoding="utf-16")
    with pytest.raises(DataError, match="is not UTF-8 text"):
        load_corpus(str(utf16))


def test_a_few_latin1_bytes_in_long_text_are_replaced_not_refused(tmp_path):
    path = tmp_path / "mostly.txt"
    path.write_bytes(("plain words " * 2000).encode() + "café".encode("latin-1"))
    corpus = load_corpus(str(path))
    assert corpus.text.endswith("caf\ufffd") and corpus.text.startswith("plain words")
    check_data(str(path))


def test_check_data_knows_embedded_names_without_reading_them():
    for name in ("default", "prose", "code", "stdlib"):
        check_data(name)
    with pytest.raises(DataError, match="unknown data 'nope'"):
        check_data("nope")
