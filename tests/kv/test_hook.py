"""The attention hook: identity is bit-exact, quantization reaches every layer, registries are restored."""
import pytest
import torch
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import AttentionInterface

from tests.conftest import tiny_gemma3, tiny_llama, tiny_mistral, tiny_qwen3
from wkvlab.kv import KVSpec, kv_quantization

BUILDERS = {"llama": tiny_llama, "gemma3": tiny_gemma3, "qwen3": tiny_qwen3, "mistral": tiny_mistral}


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_identity_hook_is_bit_exact_and_quantization_changes_logits(arch):
    model = BUILDERS[arch]()
    ids = torch.randint(0, 128, (1, 40))
    ref = _logits(model, ids)
    before = (set(AttentionInterface._global_mapping), set(AttentionMaskInterface._global_mapping), model.config._attn_implementation)
    with kv_quantization(model, KVSpec("fp16")):
        assert torch.equal(_logits(model, ids), ref)
    with kv_quantization(model, KVSpec("int2")):
        assert not torch.allclose(_logits(model, ids), ref)
    after = (set(AttentionInterface._global_mapping), set(AttentionMaskInterface._global_mapping), model.config._attn_implementation)
    assert before == after
    assert torch.equal(_logits(model, ids), ref)


def test_sliding_window_mask_survives_the_hook():
    # With a window of 8, changing token 0 must not change logits at position 30 in a model whose
    # layers are all sliding: only if the hook kept the sliding mask.
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=64, vocab_size=128, max_position_embeddings=256,
                           sliding_window=8, layer_types=["sliding_attention", "sliding_attention"])
    model = Gemma3ForCausalLM(cfg).eval()
    a = torch.randint(0, 128, (1, 32))
    b = a.clone()
    b[0, 0] = (a[0, 0] + 1) % 128
    with kv_quantization(model, KVSpec("int8")):
        la, lb = _logits(model, a), _logits(model, b)
    assert torch.equal(la[0, 30], lb[0, 30])
    assert not torch.equal(la[0, 1], lb[0, 1])


def test_hook_restores_on_error():
    model = tiny_llama()
    with pytest.raises(RuntimeError):
        with kv_quantization(model, KVSpec("int4")):
            raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
    assert not any(k.startswith("wkvlab_kv_") for k in AttentionInterface._global_mapping)


def test_mixed_pair_quantizes_only_values():
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 24))
    with kv_quantization(model, KVSpec("fp16", "int2")):
        out_pair = _logits(model, ids)
    with kv_quantization(model, KVSpec("int2", "int2")):
        out_both = _logits(model, ids)
    ref = _logits(model, ids)
    assert not torch.equal(out_pair, ref) and not torch.equal(out_pair, out_both)
