"""A config.json-only model folder for plans that read measurements (no weights: shapes only)."""
from __future__ import annotations

import json

import pytest

CONFIG = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}


@pytest.fixture()
def model_dir(tmp_path):
    """A folder named ``tinyplan`` holding :data:`CONFIG` as its config.json."""
    folder = tmp_path / "tinyplan"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


PLANTED_BIAS = 60.0  # on one RoPE pair of KV head 0, in every layer
PLANTED_PAIR = (3, 19)  # channels i and i + head_dim/2 (head_dim 32)


def build_planted(folder, tokenizer, bias: float = PLANTED_BIAS):
    """A tiny Qwen2 (QKV bias) with a planted key outlier: k_proj bias ``bias`` on one RoPE pair of KV head 0
    in every layer, and the query rows that read that pair zeroed — so the float model does not see the bias
    at all (q·k over the pair is 0 at every rotation), while a per-token key grid is stretched by it.
    Queries/keys are scaled (x4) so attention is peaked, lm_head (x6) so predictions are; ``tokenizer`` (the
    default model's), so it reads the packaged text."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=len(tokenizer), max_position_embeddings=1024, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).eval()
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.q_proj.weight.mul_(4.0)
            attn.k_proj.weight.mul_(4.0)
            attn.q_proj.bias.zero_()
            attn.k_proj.bias.zero_()
            for c in PLANTED_PAIR:
                attn.k_proj.bias[c] = bias
                for q_head in (0, 1):  # the query heads of KV head 0 (GQA 4:2)
                    attn.q_proj.weight[q_head * head_dim + c].zero_()
        model.lm_head.weight.mul_(6.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def planted_folder(tmp_path_factory, default_model):
    """:func:`build_planted` with :data:`PLANTED_BIAS`: per-token 4-bit keys collapse, 8-bit ones do not."""
    return build_planted(tmp_path_factory.mktemp("planted") / "planted-qwen2", default_model.tokenizer)


LARGE_BIAS = 3000.0  # large enough that one int8 step per token and head (amax/127) swallows every other channel


@pytest.fixture(scope="session")
def large_outlier_folder(tmp_path_factory, default_model):
    """:func:`build_planted` with :data:`LARGE_BIAS`: 8-bit per-token caches collapse too (the Qwen2.5 case of issue 41)."""
    return build_planted(tmp_path_factory.mktemp("planted") / "outlier-qwen2", default_model.tokenizer, LARGE_BIAS)
