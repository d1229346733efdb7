"""Refuse a candidate checkpoint that is not the reference model quantized: one line naming what differs.

Architecture: the config fields that fix the computation (model type, widths, layer and head
counts, vocabulary size) must agree; then every reference parameter must be in the checkpoint
with the same shape. Tokenizer: the vocabulary (token → id) and the BOS/EOS ids must agree — a
checkpoint with another tokenizer scores other tokens, so its KLD against the reference would be
meaningless. GGUF files carry their vocabulary as a token list, checked the same way.
"""
from __future__ import annotations

from pathlib import Path

import torch

from wkvlab.errors import ConfigError
from wkvlab.weights.checkpoints.base import CheckpointContents

ARCH_FIELDS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "vocab_size", "head_dim")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
_MODEL_TYPE_ALIASES = {"gemma3": "gemma3_text"}


def _norm(key: str, value):
    if key == "model_type":
        return _MODEL_TYPE_ALIASES.get(value, value)
    return value


def check_architecture(label: str, reference: dict, candidate: dict) -> None:
    text = candidate.get("text_config") if isinstance(candidate.get("text_config"), dict) else candidate
    diffs = [f"{k} {_norm(k, text[k])} (checkpoint) vs {_norm(k, reference[k])} (reference)" for k in ARCH_FIELDS
             if k in text and reference.get(k) is not None and _norm(k, text[k]) != _norm(k, reference[k])]
    if diffs:
        raise ConfigError(f"{label} is not a quantized copy of the reference model: {'; '.join(diffs)}; "
                          "pass the model it was quantized from as --model")


def check_tensors(label: str, model: torch.nn.Module, names: set[str], tied: bool) -> None:
    """Every parameter of ``model`` has a tensor in the checkpoint (a tied head may share the embedding's)."""
    for name in model.state_dict():
        if name not in names and not (tied and name.endswith("lm_head.weight")):
            raise ConfigError(f"{label} has no tensor for {name}; it is not a checkpoint of the reference architecture")


def check_shape(label: str, name: str, stored: torch.Tensor, param: torch.Tensor) -> None:
    if tuple(stored.shape) != tuple(param.shape):
        raise ConfigError(f"{label}: {name} has shape {tuple(stored.shape)} in the checkpoint and {tuple(param.shape)} "
                          "in the reference; pass the model it was quantized from as --model")


def reference_tokenizer(model: torch.nn.Module):
    """The reference's tokenizer from the folder it was loaded from, when that folder holds one."""
    folder = Path(str(getattr(model, "name_or_path", "") or ""))
    if not folder.is_dir() or not any((folder / f).is_file() for f in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception:  # an unreadable tokenizer means "cannot compare", reported by the caller as a note
        return None


def _vocabulary(tokenizer) -> list[str]:
    vocab = tokenizer.get_vocab()
    out = [""] * (max(vocab.values()) + 1 if vocab else 0)
    for token, index in vocab.items():
        out[index] = token
    return out


def _first_difference(a: list[str], b: list[str]) -> str:
    """SentencePiece vocabularies spell a space "▁" in HF tokenizers and " " in GGUF token lists: equal here."""
    a, b = [t.replace("\u2581", " ") for t in a], [t.replace("\u2581", " ") for t in b]
    if len(a) != len(b):
        return f"{len(a)} tokens (checkpoint) vs {len(b)} (reference)"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"token {i} is {x!r} (checkpoint) vs {y!r} (reference)"
    return ""


def check_tokenizer(label: str, contents: CheckpointContents, reference) -> str | None:
    """Raise on a different vocabulary; returns a note when nothing could be compared."""
    if reference is None:
        return f"{label}: the reference tokenizer was not available, so only vocabulary sizes were compared"
    expected = _vocabulary(reference)
    if contents.vocabulary is not None:
        got = contents.vocabulary
    elif contents.tokenizer_dir is not None and any((contents.tokenizer_dir / f).is_file() for f in _TOKENIZER_FILES):
        from transformers import AutoTokenizer

        candidate = AutoTokenizer.from_pretrained(str(contents.tokenizer_dir))
        got = _vocabulary(candidate)
        for attr in ("bos_token_id", "eos_token_id"):
            mine, theirs = getattr(candidate, attr), getattr(reference, attr)
            if mine is not None and theirs is not None and mine != theirs:
                raise ConfigError(f"{label} has another tokenizer than the reference: {attr} {mine} (checkpoint) vs {theirs} (reference)")
    else:
        return f"{label} ships no tokenizer, so only vocabulary sizes were compared"
    difference = _first_difference(got, expected)
    if difference:
        raise ConfigError(f"{label} has another tokenizer than the reference: {difference}; evaluate it against the model it was quantized from")
    return None
