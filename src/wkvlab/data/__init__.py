"""Text in: embedded corpora, files, datasets; deterministic tokenization and windowing."""
from __future__ import annotations

from wkvlab.lazy import lazy_exports, names

_EXPORTS = {
    **names("corpora", "EMBEDDED_CORPORA", "Corpus", "load_corpus"),
    **names("windows", "SCORE_MODES", "WindowSet", "cut_windows", "make_document_windows", "make_windows", "tokenize",
             "tokenizer_wants_bos", "window_layout"),
}
__all__ = ["EMBEDDED_CORPORA", "Corpus", "load_corpus", "SCORE_MODES", "WindowSet", "cut_windows", "make_document_windows", "make_windows",
           "tokenize", "tokenizer_wants_bos", "window_layout"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
