"""--model org/name through the local Hugging Face cache, offline: a tiny random model written into a
temporary cache in the hub's own layout (models--org--name/refs/main, snapshots/<commit>/), no network."""
from __future__ import annotations

import json

import pytest

from tests.conftest import tiny_llama
from wkvlab.errors import ModelError
from wkvlab.models import hub
from wkvlab.models.facts import check_model_source, model_facts

HUB_ID = "tiny-org/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _char_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    vocab = {"<unk>": 0, "<s>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hf-hub")
    repo = cache / f"models--{HUB_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    tiny_llama(vocab_size=128).save_pretrained(snapshot)
    _char_tokenizer().save_pretrained(snapshot)
    return cache, snapshot


@pytest.fixture
def offline(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache[0]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_cache


def test_an_id_in_the_cache_resolves_offline_to_its_snapshot(offline):
    _, snapshot = offline
    assert hub.is_hub_id(HUB_ID) and not hub.is_hub_id("models/missing.gguf") and not hub.is_hub_id("default")
    assert hub.resolve_hub_model(HUB_ID) == snapshot
    check_model_source(HUB_ID)  # no refusal
    facts = model_facts(HUB_ID)
    assert facts is not None and (facts.layers, facts.kv_heads, facts.head_dim) == (2, 2, 32)


def test_an_id_not_cached_is_one_line_saying_what_to_do(offline, monkeypatch):
    with pytest.raises(ModelError, match=r"not in the local Hugging Face cache .* HF_HUB_OFFLINE is set; run 'hf download no-org/none'") as err:
        check_model_source("no-org/none")
    assert "\n" not in str(err.value)
    # online switch on, but the hub does not answer: the probe's reason, and no download attempted
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub, "hub_unreachable", lambda timeout=1.0: "huggingface.co is not reachable")
    monkeypatch.setattr("huggingface_hub.snapshot_download", _no_network)
    with pytest.raises(ModelError, match="huggingface.co is not reachable"):
        hub.resolve_hub_model("no-org/none")


def _no_network(*_args, local_files_only=False, **_kwargs):
    from huggingface_hub.errors import LocalEntryNotFoundError

    if local_files_only:
        raise LocalEntryNotFoundError("not cached")
    raise AssertionError("tried to download")


def test_the_probe_says_why_the_hub_cannot_be_used(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.hub_unreachable() == "HF_HUB_OFFLINE is set"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)

    def refused(*_a, **_k):
        raise OSError("no route")

    monkeypatch.setattr(hub.socket, "create_connection", refused)
    assert hub.hub_unreachable() == "huggingface.co is not reachable"


def test_eval_runs_on_a_cached_id_offline(offline, tmp_path):
    from typer.testing import CliRunner

    from wkvlab.cli import app

    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "out.json"
    result = CliRunner().invoke(app, ["eval", "--model", HUB_ID, "--data", str(text), "--ctx", "32", "--tokens", "64", "--kv", "int8",
                                      "--threads", "1", "--json", str(out)])
    assert result.exit_code == 0, (result.output, result.exception)
    row = json.loads(out.read_text())
    assert row["model"] == HUB_ID and row["kv"] == "int8" and row["kld"]["mean"] > 0
