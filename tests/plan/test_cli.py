"""`wkvlab plan` through a local Typer app (the main CLI registers the same function)."""
from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from wkvlab.errors import ConfigError, DataError
from wkvlab.plan.cli import plan_command


@pytest.fixture(scope="module")
def app():
    app = typer.Typer()
    app.command("plan")(plan_command)

    @app.callback()
    def main() -> None:  # keeps "plan" a subcommand, as in the main CLI
        pass

    return app


def test_llama3_70b_on_one_a100(app, tmp_path):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, ["plan", "--model", "Llama-3-70B", "--gpu", "A100-80GB", "--batch", "16", "--ctx", "8192",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    for needle in ("weights GB", "KV GB", "total GB", "fits", "max batch", "decode tok/s", "KLD", "int4-g128", "fp8_e5m2",
                   "vllm serve", "--kv-cache-dtype", "--max-model-len 8192", "--max-num-seqs 16", "sglang.launch_server",
                   "llama-server", "-np 16", "-c 131072", "GiB", "estimate", "prior (extrapolated)", "flags checked against"):
        assert needle in result.output, needle
    data = json.loads(out.read_text())
    assert data["model"]["name"] == "Llama-3-70B" and data["gpu"]["name"] == "A100-80GB"
    assert data["recommendations"][0]["command"]["argv"][0] == "vllm"


def test_context_is_the_name_and_ctx_its_alias(app):
    a = CliRunner().invoke(app, ["plan", "-m", "Llama-3-8B", "-g", "H100", "-b", "4", "--context", "4096", "-e", "vllm"])
    b = CliRunner().invoke(app, ["plan", "-m", "Llama-3-8B", "-g", "H100", "-b", "4", "--ctx", "4096", "-e", "vllm"])
    assert a.exit_code == b.exit_code == 0 and a.output == b.output


def test_gpu_counts_side_by_side(app, tmp_path):
    out = tmp_path / "counts.json"
    result = CliRunner().invoke(app, ["plan", "-m", "Llama-3-70B", "-g", "A100-80GB", "-b", "16", "-c", "8192", "--gpus", "1,2,4",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "--tensor-parallel-size 2" in result.output and "--tensor-parallel-size 4" in result.output and "-ts 1,1" in result.output
    assert [p["layout"]["gpus"] for p in json.loads(out.read_text())] == [1, 2, 4]


def test_options_weights_kv_engine_and_gpu_file(app, tmp_path):
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("gpus:\n  - {name: MyCard, sm: 89, memory_gib: 48, bandwidth_gb_s: 900, tflops: {bf16: 180, fp8: 360, int8: 360}}\n")
    result = CliRunner().invoke(app, ["plan", "-m", "Llama-3-8B", "--gpu", "MyCard", "-b", "4", "-c", "4096", "-w", "q8_0,q4_0",
                                      "--kv", "q8_0/q4_0+rot", "--kv", "llamacpp:q8_0", "--engine", "llama.cpp", "--gpu-file", str(gpus)])
    assert result.exit_code == 0, result.output
    assert "MyCard" in result.output and "-ctk q8_0 -ctv q8_0" in result.output and "vllm serve" not in result.output


@pytest.mark.parametrize("args,error,match", [
    (["--gpu", "TPU-v5"], ConfigError, "unknown GPU"),
    (["--gpus", "two"], ConfigError, "--gpus"),
    (["--tp", "3", "--gpus", "4"], ConfigError, "--tp 3 does not divide --gpus 4"),
    (["--results", "missing.json"], DataError, "does not exist"),
    (["--engine-version", "vllm"], ConfigError, "<engine>=<version>"),
])
def test_bad_input_raises_one_line(app, args, error, match):
    base = {"--model": "Llama-3-70B", "--gpu": "A100-80GB", "--batch": "16", "--ctx": "8192"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    result = CliRunner().invoke(app, ["plan", *[x for kv in base.items() for x in kv]])
    assert result.exit_code != 0 and isinstance(result.exception, error), result.output
    assert match in str(result.exception) and "\n" not in str(result.exception)


def test_small_confusions_of_issue_26(app):
    """A too-long context names the plan's option; --help lists the built-in names; the breakdown says why the spec's
    bytes and the engine's differ."""
    from wkvlab.plan.models import builtin_model_names

    long = CliRunner().invoke(app, ["plan", "-m", "default", "-g", "RTX-4090", "-b", "8", "--context", "32768"])
    assert long.exit_code != 0 and "plan at --context 8192 or less" in str(long.exception) and "--ctx" not in str(long.exception)
    helptext = " ".join(CliRunner().invoke(app, ["plan", "--help"], terminal_width=400).output.split())
    assert all(name in helptext for name in builtin_model_names()) and "gemma3-270m" in helptext
    out = CliRunner().invoke(app, ["plan", "-m", "default", "-g", "RTX-4090", "-b", "8", "--context", "8192", "--kv", "int8", "-e", "vllm",
                                   "--no-probe"])
    assert out.exit_code == 0, out.output
    spec = int(out.output.split("measures it): ")[1].split(" B")[0].replace(",", ""))
    engine = int(out.output.split("vllm allocates ")[1].split(" B")[0].replace(",", ""))
    assert (spec, engine) == (11880, 12240) and "its own storage int8_pth" in out.output  # fp16 vs fp32 scales per token and head
    assert f"KV per token on this GPU: {engine:,} B" in out.output
