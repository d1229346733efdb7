"""--weights none reports the model as it is stored: a GGUF at its file's size, a folder at its dtype (issue #26)."""
import pytest
import torch

from tests.conftest import tiny_llama
from wkvlab.weights import WeightSpec
from wkvlab.weights.apply import model_weight_bytes


def test_the_untouched_model_counts_at_its_own_dtype():
    model = tiny_llama()
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    none = WeightSpec.parse("none")
    assert model_weight_bytes(model, none) == 4 * params
    assert model_weight_bytes(model.to(torch.bfloat16), none) == 2 * params  # a bfloat16 run: bf16 sizes
    assert model_weight_bytes(model, WeightSpec.parse("bf16")) == 2 * params


def test_a_gguf_s_own_weights_are_the_file():
    model = tiny_llama()
    model.wkvlab_stored_bytes = 12_345  # what the loader sets for a GGUF
    assert model_weight_bytes(model, WeightSpec.parse("none")) == 12_345
    assert model_weight_bytes(model, WeightSpec.parse("int8")) != 12_345  # a quantized build counts its own codes


@pytest.mark.slow
def test_the_packaged_gguf_reports_its_file_size(default_model):
    from wkvlab.models.packaged import packaged_gguf

    size = packaged_gguf("smollm2").stat().st_size
    assert model_weight_bytes(default_model.model, WeightSpec.parse("none")) == size
