"""Text sources: corpora that ship with Python itself, user files, and Hugging Face datasets.

The embedded corpora need no download, so tests and the demo run offline on any machine:

* ``prose`` (alias ``default``, ``pydoc``): the pydoc topic pages (``pydoc_data.topics``) — about
  460 kB of English technical prose, the language reference in plain text.
* ``code`` (alias ``stdlib``): the top-level ``*.py`` modules of the standard library (about 4.7 MB).
* ``code-long`` (alias ``long-code``): the eight longest top-level standard-library modules
  (``_pydecimal.py``, ``turtle.py``, ``inspect.py``, ``typing.py``, ... 80–230 kB each, 25k–75k
  tokens), longest first, each a document of its own: windows never cross from one module into the
  next, so at ctx 32,768 every position of a window is that deep into one real file. For long prose
  the ``prose`` text is already one document (the language reference, ~110k tokens, in the order
  the ``pydoc_data`` module keeps its topics).

The first two are concatenated in sorted order so the text is byte-for-byte deterministic for a given
Python version; every result records the text's SHA-256 so a change of Python version is visible.

Each embedded corpus records its **documents** (a pydoc topic, a module): evaluation windows are
spread across them (:func:`wkvlab.data.windows.cut_windows`) and intervals resample documents, not
windows (windows of one document share its difficulty; docs/explain.md, "The decision rule"). A
text made of records is a corpus of documents the same way (:func:`records_corpus`): a ``.jsonl``
file's lines, a Hugging Face dataset's rows, the continuations selfgen samples
(:mod:`wkvlab.data.selfgen`). A ``.txt`` file is one stream.
"""
from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from wkvlab.errors import DataError

_ALIASES = {"default": "prose", "pydoc": "prose", "prose": "prose", "stdlib": "code", "code": "code",
            "code-long": "code-long", "long-code": "code-long"}
EMBEDDED_CORPORA = ("prose", "code", "code-long")
LONG_MODULES = 8


@dataclass(frozen=True)
class Corpus:
    """A named text with its fingerprint.

    ``documents``: when set, the text is these documents joined by blank lines, and evaluation
    windows are cut inside documents, spread across as many as they can cover
    (:func:`wkvlab.data.windows.cut_windows`). ``documents_only``: never fall back to the stream
    (``code-long``: a position must be that deep into one real file); otherwise, when the documents
    are too short to hold the windows asked for, the windows are cut from the stream as before.
    """

    name: str
    text: str
    documents: tuple[str, ...] = ()
    documents_only: bool = False

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def _pydoc_topics() -> tuple[str, ...]:
    """The pydoc topic pages in sorted order, one document each."""
    import pydoc_data.topics as topics

    return tuple(topics.topics[key].strip() for key in sorted(topics.topics))


def _stdlib_source() -> tuple[str, ...]:
    """The top-level standard-library modules in sorted order, one document each."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    # A header line per file keeps file boundaries visible to the model, like a code dump.
    return tuple(f"# file: {path.name}\n{path.read_text(encoding='utf-8', errors='replace')}" for path in sorted(stdlib.glob("*.py")))


def _long_modules() -> tuple[str, ...]:
    """The longest top-level standard-library modules, longest first (ties by name), one document each."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(stdlib.glob("*.py"), key=lambda p: (-p.stat().st_size, p.name))[:LONG_MODULES]
    return tuple(f"# file: {p.name}\n{p.read_text(encoding='utf-8', errors='replace')}" for p in paths)


# Text is UTF-8. A few undecodable bytes (one stray Latin-1 character) are replaced and the text
# is used; past this share of undecodable bytes and control codes the file is not text at all
# (a binary, a compressed file, UTF-16) and scoring it would print numbers about noise.
NOT_TEXT_SHARE = 0.001
_CONTROL = set(range(32)) - {9, 10, 11, 12, 13}


def _decode_text(data: bytes, path: Path) -> str:
    """``data`` as UTF-8, or a one-line refusal when it is not text (see ``NOT_TEXT_SHARE``)."""
    text = data.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") + sum(text.count(chr(c)) for c in _CONTROL)
    if text and bad > NOT_TEXT_SHARE * len(text):
        raise DataError(f"{path} is not UTF-8 text ({bad / len(text):.1%} of its characters are undecodable bytes or control codes); "
                        "give a UTF-8 .txt file or a .jsonl file with a 'text' field per line")
    return text


def check_text_file(path: Path, sample_bytes: int = 1 << 20) -> None:
    """Refuse a missing or binary data file from its first ``sample_bytes``, before any model loads."""
    if not path.is_file():
        raise DataError(f"data file not found: {path} (pass --data default, --data code, or an existing .txt/.jsonl file)")
    with open(path, "rb") as handle:
        head = handle.read(sample_bytes)
    text = _decode_text(head[: len(head) - 3] if len(head) == sample_bytes else head, path)  # a cut multi-byte character is not binary
    if not text.strip():
        raise DataError(f"{path} holds no text; give a file with at least a few thousand words")


def records_corpus(name: str, records: Iterable[str]) -> Corpus:
    """A text made of records, each record one document: a ``.jsonl`` file's lines, a Hugging Face
    dataset's rows, selfgen's samples. The text is the records joined by blank lines (what it always
    was, so stream windows cut from it score the same tokens); a single record is one stream, there
    being nothing to spread windows across."""
    texts = tuple(records)
    return Corpus(name=name, text="\n\n".join(texts), documents=texts if len(texts) > 1 else ())


def _read_file(path: Path) -> Corpus:
    """The file as a corpus: a ``.jsonl`` file's records are its documents, a ``.txt`` file is one stream."""
    if not path.is_file():
        raise DataError(f"data file not found: {path} (pass --data default, --data code, or an existing .txt/.jsonl file)")
    raw = _decode_text(path.read_bytes(), path)
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        texts = []
        for line_no, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise DataError(f"{path}:{line_no} is not valid JSON; each line of a .jsonl file must be an object with a 'text' field") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise DataError(f"{path}:{line_no} has no string 'text' field; each JSONL record needs one")
            texts.append(record["text"])
        return records_corpus(str(path), texts)
    return Corpus(name=str(path), text=raw)


def _hf_dataset(spec: str) -> list[str]:
    """The rows' texts of ``hf:<name>[:<config>][:<split>]`` — only when the hub is reachable or the dataset cached."""
    parts = spec.split(":")[1:]
    if not parts or not parts[0]:
        raise DataError("hf data needs a dataset name: --data hf:<name>[:<config>][:<split>]")
    name, config, split = parts[0], (parts[1] if len(parts) > 1 and parts[1] else None), (parts[2] if len(parts) > 2 else "test")
    try:
        import datasets  # optional: not a dependency, the embedded corpora need nothing
    except ImportError:
        raise DataError("--data hf:... needs the 'datasets' package (pip install datasets); offline, use --data default, --data code or a text file") from None
    _check_hub_dataset(name)
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # the hub raises many types; all mean the same to the user
        raise DataError(f"could not load Hugging Face dataset {name!r} ({type(exc).__name__}); offline, use --data default, --data code or a text file") from None
    column = "text" if "text" in ds.column_names else ds.column_names[0]
    return [str(t) for t in ds[column]]


def _hub_dataset_cached(name: str) -> bool:
    """Whether ``datasets`` has ``name`` cached locally (its own cache, or the hub cache's download)."""
    from wkvlab.models.hub import hf_home, hub_cache

    own = Path(os.environ.get("HF_DATASETS_CACHE") or os.path.join(hf_home(), "datasets"))
    return (own / name.replace("/", "___")).is_dir() or (Path(hub_cache()) / f"datasets--{name.replace('/', '--')}").is_dir()


def _check_hub_dataset(name: str) -> None:
    """Offline (HF_HUB_OFFLINE, or the hub not answering within a second), a dataset that is not
    cached is refused in one line now, instead of after ``datasets``' retries (14 lines over 55 s,
    issue #26); a cached one then loads with the offline switches set, so nothing is retried."""
    from wkvlab.models.hub import hub_unreachable

    why = hub_unreachable()
    if why is None:
        return
    if not _hub_dataset_cached(name):
        raise DataError(f"--data hf:{name}: the Hugging Face hub cannot be used ({why}) and the dataset is not cached; "
                        "use --data default, --data code or a .txt/.jsonl file, or run once where the hub is reachable")
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"


def is_selfgen(spec: str) -> bool:
    """``selfgen[:<tokens>]``: text the evaluated model writes (:mod:`wkvlab.data.selfgen`)."""
    return spec.strip().lower().split(":")[0] == "selfgen"


def is_named_text(spec: str) -> bool:
    """An embedded corpus name, ``hf:<dataset>`` or ``selfgen``: text that is not a file path."""
    key = spec.strip()
    return key.lower() in _ALIASES or key.startswith("hf:") or is_selfgen(key)


def text_size(spec: str) -> tuple[int, int] | None:
    """(UTF-8 bytes, documents) of the text ``spec`` names, without a tokenizer: an embedded corpus
    is read (0.02–0.2 s), a file is measured by its size (a .jsonl file's keys make that an upper
    bound); None for hub datasets and self-generated text, whose length only loading tells."""
    key = spec.strip()
    if key.lower() in _ALIASES:
        corpus = load_corpus(key)
        return len(corpus.text.encode("utf-8")), max(1, len(corpus.documents))
    if key.startswith("hf:") or is_selfgen(key):
        return None
    path = Path(key).expanduser()
    return (path.stat().st_size, 1) if path.is_file() else None


def _data_path(spec: str) -> Path:
    """The file ``spec`` names (after the embedded names, ``hf:`` and ``selfgen`` are ruled out)."""
    key = spec.strip()
    if is_selfgen(key):  # data/selfgen.py: the model writes it, so it needs the model
        raise DataError(f"--data {spec} is generated by the evaluated model; use it with --data (wkvlab eval/explain), not here")
    path = Path(key).expanduser()
    if not path.exists() and ("/" in key or path.suffix):
        raise DataError(f"data file not found: {path} (pass --data default, --data code, or an existing .txt/.jsonl file)")
    if not path.exists():
        raise DataError(f"unknown data {spec!r}: use one of {', '.join(EMBEDDED_CORPORA)} (or 'default'), a .txt/.jsonl path, or hf:<dataset>")
    return path


def check_data(spec: str) -> None:
    """Refuse data ``load_corpus`` would refuse for its name, existence or not being text, cheaply (no
    corpus is read whole, no hub is contacted): the CLI calls it before any model loads."""
    key = spec.strip()
    if key.lower() in _ALIASES:
        return
    if key.startswith("hf:"):
        import importlib.util

        if not key[3:].split(":")[0]:
            raise DataError("hf data needs a dataset name: --data hf:<name>[:<config>][:<split>]")
        if importlib.util.find_spec("datasets") is None:
            raise DataError("--data hf:... needs the 'datasets' package (pip install datasets); offline, use --data default, --data code or a text file")
        _check_hub_dataset(key[3:].split(":")[0])
        return
    check_text_file(_data_path(spec))


def load_corpus(spec: str) -> Corpus:
    """Resolve ``spec`` (an embedded corpus name, a file path, or ``hf:...``) to its text."""
    key = spec.strip()
    if key.lower() in _ALIASES:
        name = _ALIASES[key.lower()]
        documents = {"code-long": _long_modules, "prose": _pydoc_topics, "code": _stdlib_source}[name]()
        return Corpus(name=name, text="\n\n".join(documents), documents=documents, documents_only=name == "code-long")
    if key.startswith("hf:"):
        return records_corpus(key, _hf_dataset(key))  # each row one document, as a .jsonl file's records
    path = _data_path(spec)
    corpus = _read_file(path)
    if not corpus.text.strip():
        raise DataError(f"{path} holds no text; give a file with at least a few thousand words")
    return corpus
