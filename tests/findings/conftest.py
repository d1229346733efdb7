"""A tiny random Llama saved with the default model's tokenizer: the findings run on real texts, in seconds, with no download."""
import pytest


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory, default_model):
    from tests.conftest import tiny_llama

    folder = tmp_path_factory.mktemp("tiny-findings")
    tiny_llama(vocab_size=len(default_model.tokenizer), num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
               head_dim=32, max_position_embeddings=512).save_pretrained(folder)
    default_model.tokenizer.save_pretrained(folder)
    return str(folder)
