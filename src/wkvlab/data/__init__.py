"""Text in: embedded corpora, files, datasets; deterministic tokenization and windowing."""
from __future__ import annotations

from wkvlab.data.corpora import EMBEDDED_CORPORA, Corpus, load_corpus
from wkvlab.data.windows import SCORE_MODES, WindowSet, make_document_windows, make_windows, tokenize, tokenizer_wants_bos

__all__ = ["EMBEDDED_CORPORA", "Corpus", "load_corpus", "SCORE_MODES", "WindowSet", "make_windows", "make_document_windows", "tokenize", "tokenizer_wants_bos"]
