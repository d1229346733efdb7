"""Every --weights / --kv example the README and docs show, through every command that accepts it.

The one grammar promise (issue #16): a string a user copies from the docs means the same in eval,
explain, profile/search, sweep specs, plan and (for KV) the llama.cpp engine. Parse level for the
commands that would load a model; ``wkvlab plan`` runs end to end (it loads nothing). No model is
evaluated here.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from wkvlab import api
from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec, split_kv_list
from wkvlab.plan.cli import plan_command
from wkvlab.sweep.spec import SweepSpec
from wkvlab.weights.parse import split_weight_list
from wkvlab.weights.spec import WeightSpec

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FLAG = re.compile(r"--(weights|kv)(?:=|\s+)('[^']*'|\"[^\"]*\"|[^\s`|)]+)")
BULLET = re.compile(r"^- `--(weights|kv)`:(.*?)(?=^- `--|\Z)", re.S | re.M)
SKIP = re.compile(r"[<>$…]|\.\.\.|\|")  # grammar templates and placeholders, not examples


def _examples() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {"weights": set(), "kv": set()}
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for flag, value in FLAG.findall(text):
            value = value.strip("'\"")
            if value and not SKIP.search(value) and not value.startswith("-"):
                split = split_weight_list if flag == "weights" else split_kv_list
                found[flag].update(split(value))
        for flag, body in BULLET.findall(text):  # the README's lists of names and options
            for item in re.findall(r"`([^`]+)`", body):
                if SKIP.search(item) or " " in item or item in (";", "+", "K/V") or item.startswith("--"):
                    continue
                if item[0] in "+;":  # an option: on a base that takes every documented one
                    item = ("int4-g128" if flag == "weights" else "int4") + item
                found[flag].add(item)
    return found


EXAMPLES = _examples()
WEIGHTS = sorted(EXAMPLES["weights"])
KVS = sorted(EXAMPLES["kv"])


def test_the_docs_have_examples():
    assert {"int4-g128", "gptq-int4-g128", "int4-g128+skip=0,1", "q4_0"} <= set(WEIGHTS)
    assert {"q8_0/q4_0", "llamacpp:q4_0", "@plan.yaml", "int4+0-3,76-79=int8", "K8V4"} <= set(KVS)
    assert len(WEIGHTS) >= 20 and len(KVS) >= 30


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "plan.yaml"
    KVSpec.parse("int4+0-3=int8").save(path)
    return path


def _kv_text(text: str, plan_file: Path) -> str:
    return f"@{plan_file}" if text.startswith("@") else text


@pytest.fixture(scope="module")
def plan_app():
    app = typer.Typer()
    app.command("plan")(plan_command)

    @app.callback()
    def main() -> None:
        pass

    return app


@pytest.mark.parametrize("text", WEIGHTS)
def test_weight_examples_in_every_command(text, plan_app, tmp_path, monkeypatch):
    checkpoint = text.startswith("checkpoint:")
    if checkpoint:  # a checkpoint example names a folder the docs' export command wrote
        monkeypatch.chdir(tmp_path)
        (tmp_path / text.split(":", 1)[1]).mkdir(parents=True)
    eval_spec = api.parse_weights(split_weight_list(text))[0]  # eval (and demo's grid)
    assert WeightSpec.parse(text) == eval_spec  # explain, profile, search (--weights)
    assert SweepSpec.from_dict({"weights": [text]}).weights[0] == eval_spec  # sweep spec
    result = CliRunner().invoke(plan_app, ["plan", "-m", "Llama-3-70B", "-g", "H100", "-b", "1", "--context", "1024",
                                           "-e", "vllm", "--weights", text, "--kv", "fp16"])
    if checkpoint and result.exit_code != 0:  # the planner has no byte arithmetic for a file it has not read: one line
        assert isinstance(result.exception, ConfigError) and "\n" not in str(result.exception), result.exception
        return
    assert result.exit_code == 0, f"{text}: {result.exception}"


@pytest.mark.parametrize("text", KVS)
def test_kv_examples_in_every_command(text, plan_file, plan_app):
    from wkvlab.engines.llamacpp import parse_cache_types

    text = _kv_text(text, plan_file)
    eval_spec = api.parse_kv(split_kv_list(text))[0]  # eval
    assert KVSpec.parse(text) == eval_spec  # explain
    assert SweepSpec.from_dict({"kv": [text]}).kv[0] == eval_spec  # sweep spec
    result = CliRunner().invoke(plan_app, ["plan", "-m", "Llama-3-70B", "-g", "H100", "-b", "1", "--context", "1024",
                                           "-e", "vllm", "--weights", "bf16", "--kv", text])
    assert result.exit_code == 0, f"{text}: {result.exception}"
    try:  # engine eval/compare: llama.cpp's types, or a one-line refusal that names llama.cpp — never a grammar error
        k, v = parse_cache_types(text)
        assert (k, v) == tuple("f16" if f == "fp16" else f for f in (eval_spec.k, eval_spec.v))
    except ConfigError as exc:
        assert str(exc).startswith("llama.cpp") and "\n" not in str(exc), str(exc)


def test_lists_split_the_same_everywhere():
    assert split_weight_list("bf16,int4-g128+skip=0,1,5-7,q4_0") == ["bf16", "int4-g128+skip=0,1,5-7", "q4_0"]
    assert split_kv_list("fp16,int4+0-3,76-79=int8+skip=0,1,sliding_window,q8_0/q4_0") == [
        "fp16", "int4+0-3,76-79=int8+skip=0,1,sliding_window", "q8_0/q4_0"]
