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
