"""`wkvlab plan` through a local Typer app (the main CLI registers the same function)."""
from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from wkvlab.errors import ConfigError
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
    result = CliRunner().invoke(app, ["plan", "--model", "Llama-3-70B", "--gpu", "A100-80GB",
                                      "--batch", "16", "--ctx", "8192", "--json", str(out)])
    assert result.exit_code == 0, result.output
    text = result.output
    for needle in ("weights GB", "KV GB", "total GB", "fits", "max batch", "decode tok/s", "KLD",
                   "int4-g128", "fp8_e5m2", "vllm serve", "--kv-cache-dtype", "--max-model-len 8192",
                   "--max-num-seqs 16", "sglang.launch_server", "llama-server", "-np 16", "-c 131072",
                   "GiB", "estimate", "prior (extrapolated)"):
        assert needle in text, needle
    data = json.loads(out.read_text())
    assert data["model"]["name"] == "Llama-3-70B" and data["gpu"]["name"] == "A100-80GB"
    assert data["recommendations"][0]["command"]["argv"][0] == "vllm"


def test_options_weights_kv_engine_and_gpu_file(app, tmp_path):
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("gpus:\n  - {name: MyCard, sm: 89, memory_gib: 48, bandwidth_gb_s: 900,"
                    " tflops: {bf16: 180, fp8: 360, int8: 360}}\n")
    result = CliRunner().invoke(app, ["plan", "-m", "Llama-3-8B", "--gpu", "MyCard", "-b", "4", "-c", "4096",
                                      "-w", "q8_0", "-w", "q4_0", "--kv", "k=q8_0,v=q4_0", "--kv", "q8_0",
                                      "--engine", "llama.cpp", "--gpu-file", str(gpus)])
    assert result.exit_code == 0, result.output
    assert "MyCard" in result.output and "-ctk q8_0 -ctv q8_0" in result.output
    assert "vllm serve" not in result.output


def test_bad_input_raises_config_error(app):
    result = CliRunner().invoke(app, ["plan", "--model", "Llama-3-70B", "--gpu", "TPU-v5",
                                      "--batch", "16", "--ctx", "8192"])
    assert result.exit_code != 0 and isinstance(result.exception, ConfigError)
    assert "unknown GPU" in str(result.exception) and "\n" not in str(result.exception)
