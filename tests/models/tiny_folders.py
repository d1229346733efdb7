"""Tiny random models of the architectures users bring (MoE, multimodal, Gemma 2), in memory or
saved as Hugging Face folders with a word-level tokenizer, so the CLI can load them offline."""
from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 256
WORDS = [f"w{i}" for i in range(VOCAB)]
_TEXT = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=32, vocab_size=VOCAB, max_position_embeddings=256)


def tiny_mixtral(seed: int = 0):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    return MixtralForCausalLM(MixtralConfig(**_TEXT, num_local_experts=4, num_experts_per_tok=2)).eval()


def tiny_qwen3_moe(seed: int = 0):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**_TEXT, moe_intermediate_size=128, num_experts=4, num_experts_per_tok=2,
                                              decoder_sparse_step=1, mlp_only_layers=[])).eval()


def tiny_qwen2_moe(seed: int = 0):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(seed)
    return Qwen2MoeForCausalLM(Qwen2MoeConfig(**_TEXT, moe_intermediate_size=128, shared_expert_intermediate_size=256,
                                              num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[])).eval()


def tiny_gemma2(seed: int = 0):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(seed)
    return Gemma2ForCausalLM(Gemma2Config(**{**_TEXT, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64},
                                          sliding_window=16)).eval()


def tiny_gemma3_multimodal(seed: int = 0):
    """Gemma3ForConditionalGeneration: a SigLIP vision tower (its own ``layers``) before the language model."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(seed)
    text = {**_TEXT, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"]}
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=28, patch_size=14)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=VOCAB - 1,
                       boi_token_index=VOCAB - 3, eoi_token_index=VOCAB - 2)
    return Gemma3ForConditionalGeneration(cfg).eval()


def word_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="w0"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0")


def save_folder(model, folder: Path) -> Path:
    model.save_pretrained(str(folder))
    word_tokenizer().save_pretrained(str(folder))
    return folder


def word_text(path: Path, words: int = 2048, seed: int = 0) -> Path:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB - 4, (words,), generator=g).tolist()
    path.write_text(" ".join(WORDS[i] for i in ids) + "\n")
    return path


def tiny_qwen25_vl(seed: int = 0):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    text = {**_TEXT, "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]}, "bos_token_id": 1, "eos_token_id": 2}
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, fullatt_block_indexes=[1])
    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision)).eval()


def tiny_qwen2_vl(seed: int = 0):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    torch.manual_seed(seed)
    text = {**_TEXT, "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]}, "bos_token_id": 1, "eos_token_id": 2}
    vision = dict(depth=2, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=2)
    return Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=vision)).eval()


def tiny_mistral3(seed: int = 0):
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    torch.manual_seed(seed)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=28, patch_size=14, head_dim=16)
    return Mistral3ForConditionalGeneration(Mistral3Config(text_config={**_TEXT, "model_type": "mistral"},
                                                           vision_config=vision)).eval()


def tiny_llama4(seed: int = 0):
    """Llama 4: multimodal, and its experts (Llama4TextExperts) are fused tensors transformers does not declare."""
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    torch.manual_seed(seed)
    text = {**_TEXT, "intermediate_size_mlp": 128, "num_local_experts": 2}
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=28, patch_size=14,
                  vision_output_dim=64, projector_input_dim=64, projector_output_dim=64)
    return Llama4ForConditionalGeneration(Llama4Config(text_config=text, vision_config=vision)).eval()


def tiny_gpt_oss(seed: int = 0):
    """gpt-oss: experts stored transposed ([experts, in, out]), gate/up interleaved, with biases and its own gate."""
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(seed)
    cfg = GptOssConfig(**{**_TEXT, "intermediate_size": 128}, num_local_experts=4, num_experts_per_tok=2,
                       layer_types=["sliding_attention", "full_attention"], sliding_window=16)
    return GptOssForCausalLM(cfg).eval()
