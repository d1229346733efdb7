"""search --gpu ... --out plan.yaml, then plan --kv @plan.yaml: the same bytes and the same launch flags (issue #16, item 5)."""
import pytest
import torch
import yaml

from tests.conftest import tiny_llama
from wkvlab.data.windows import WindowSet
from wkvlab.kv.spec import KVSpec
from wkvlab.plan import ModelDescription, plan
from wkvlab.search import api
from wkvlab.search.choices import parse_choices
from wkvlab.weights.spec import WeightSpec


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    model = tiny_llama(num_hidden_layers=4)
    g = torch.Generator().manual_seed(1)
    prof = WindowSet(torch.randint(0, 128, (1, 24), generator=g), 0, False)
    held = WindowSet(torch.randint(0, 128, (1, 24), generator=g), 0, False)
    # a budget between uniform int8 (4 layers x 2 heads x 2 x 36 B = 576 B/token) and fp16 (1024): some layers stay 16-bit
    result = api.search_windows(model, prof, held, WeightSpec.parse("bf16"), parse_choices("vllm-int8"), 700.0, candidates=1,
                                unaware=False, weight_profile=False, use_cache=False, gpu="rtx-4090", batch=4, context=128)
    path = tmp_path_factory.mktemp("plan") / "plan.yaml"
    path.write_text(yaml.safe_dump(result.spec, sort_keys=False))  # what `wkvlab search --out plan.yaml` writes
    desc = ModelDescription.from_config(model.config.to_dict(), name=result.model)
    return result, path, desc


def test_same_bytes(searched):
    result, path, desc = searched
    planned = plan(desc, "rtx-4090", 4, 128, weights=["bf16"], kv=[f"@{path}"])
    row = planned.rows[0]
    assert row.kv_bytes.total_bytes == result.chosen.kv_bytes_per_token  # the spec's own bytes, every layer
    assert KVSpec.parse(f"@{path}").layers  # a real per-layer plan (some layers 16-bit, the rest int8_pth)


def test_same_launch_flags(searched):
    result, path, desc = searched
    planned = plan(desc, "rtx-4090", 4, 128, weights=["bf16"], kv=[f"@{path}"])
    row = planned.rows[0]
    for engine in ("vllm", "llama.cpp"):
        exported = result.exports[engine]
        ev = row.evaluation(engine)
        assert list(ev.support.kv.args) == exported["kv_args"], engine
        assert list(ev.support.kv.env) == exported["env"], engine
        if exported["command"] is not None:
            assert ev.command is not None and list(ev.command.argv) == exported["argv"], engine
    vllm = result.exports["vllm"]["kv_args"]
    assert vllm[:2] == ["--kv-cache-dtype", "int8_per_token_head"] and "--kv-cache-dtype-skip-layers" in vllm
    assert result.exports["vllm"]["exact"]  # one dtype + 16-bit layers is exactly what vLLM runs
