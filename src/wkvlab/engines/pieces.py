"""The text of each token as servers print it, to map string-keyed logprobs back to token ids.

OpenAI's legacy ``echo`` + ``logprobs`` API (llama-cpp-python's server, SGLang) reports top-k
log-probs keyed by the token's *text*, not its id. Servers print a token as its raw bytes decoded
with UTF-8, dropping incomplete sequences (llama-cpp-python: ``token_to_piece(...).decode("utf-8",
errors="ignore")``). We rebuild those bytes from the reference tokenizer's vocabulary:

* byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen): each character of the token stands for one byte
  through GPT-2's byte↔unicode table;
* SentencePiece (Llama 2, Gemma): ``▁`` is a space and ``<0xHH>`` is the byte HH.

Special/control tokens print as nothing. A text that several ids share (e.g. all partial UTF-8
byte tokens print as "") cannot be mapped back; those entries are dropped, which keeps the KLD
bound valid (their mass stays in the "rest" bucket on both sides).
"""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode`` table, inverted (character → byte)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None) if backend is not None else None
    return decoder is not None and "ByteLevel" in type(decoder).__name__


def token_bytes(tokenizer) -> list[bytes | None]:
    """Raw bytes of every token id (None where the vocabulary entry cannot be read as bytes)."""
    vocab_size = len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(vocab_size)))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    byte_level = _is_byte_level(tokenizer)
    table = _byte_decoder()
    out: list[bytes | None] = []
    for index, token in enumerate(tokens):
        if token is None:
            out.append(None)
        elif index in special:
            out.append(b"")
        elif byte_level:
            try:
                out.append(bytes(table[ch] for ch in token))
            except KeyError:  # an added (non-byte-level) token: its text is itself
                out.append(token.encode("utf-8"))
        elif token.startswith("<0x") and token.endswith(">") and len(token) == 6:
            out.append(bytes([int(token[3:5], 16)]))
        else:
            out.append(token.replace("▁", " ").encode("utf-8"))
    return out


def token_texts(tokenizer) -> list[str | None]:
    """Each token as a server prints it: its bytes decoded as UTF-8, incomplete sequences dropped."""
    return [None if b is None else b.decode("utf-8", errors="ignore") for b in token_bytes(tokenizer)]


def unique_text_ids(texts: list[str | None]) -> dict[str, int]:
    """Text → id for texts exactly one token prints as (the only ones a string key identifies)."""
    seen: dict[str, int] = {}
    shared: set[str] = set()
    for index, text in enumerate(texts):
        if text is None:
            continue
        if text in seen:
            shared.add(text)
        else:
            seen[text] = index
    return {text: index for text, index in seen.items() if text not in shared}
