"""Support matrix: no launch line an engine rejects; silent slow paths are warned about."""
from __future__ import annotations

import itertools

import pytest

from wkvlab.errors import ConfigError
from wkvlab.plan import (ENGINES, KV_FORMATS, ModelDescription, check_support, find_gpu,
                         launch_command, parse_kv, parse_weight_spec, plan)
from wkvlab.plan.engines import matrix

LLAMA8 = ModelDescription.from_name("Llama-3-8B")


def support(engine, weights, kv, gpu="H100", model=LLAMA8):
    return check_support(engine, model, parse_weight_spec(weights), parse_kv(kv), find_gpu(gpu))


@pytest.mark.parametrize("k,v", list(itertools.product(["fp16", "bf16", "q8_0", "q4_0", "q4_1",
                                                        "q5_0", "q5_1", "iq4_nl"], repeat=2)))
def test_llamacpp_quantized_v_always_gets_flash_attention(k, v):
    cmd = launch_command("llama.cpp", LLAMA8, parse_weight_spec("q4_0"), parse_kv(f"k={k},v={v}"),
                         find_gpu("RTX-4090"), 4, 4096)
    argv = list(cmd.argv)
    if v not in ("fp16",) or k != "fp16":
        assert argv[argv.index("-fa") + 1] == "on"
    assert argv[argv.index("-c") + 1] == str(4 * 4096) and argv[argv.index("-np") + 1] == "4"
    s = support("llama.cpp", "q4_0", f"k={k},v={v}")
    slow = k != v or k not in ("fp16", "bf16", "q8_0", "q4_0")
    assert s.slow_path == slow
    assert any("GGML_CUDA_FA_ALL_QUANTS" in w for w in s.warnings) == slow


def test_llamacpp_rejects_non_gguf_and_per_layer_maps():
    assert not support("llama.cpp", "awq-int4-g128", "q8_0").accepted
    assert not support("llama.cpp", "q4_0", "int8").accepted
    assert not support("llama.cpp", "q4_0", "q8_0;skip=0").accepted


def test_vllm_rules():
    assert not support("vllm", "bf16", "k=int8,v=int4").accepted  # one dtype for K and V
    assert not support("vllm", "bf16", "int4;0-3=int8").accepted  # no per-layer map
    assert support("vllm", "bf16", "int4;skip=0,1").accepted
    assert not support("vllm", "q4_0", "bf16").accepted
    assert not support("vllm", "bf16", "fp8_e4m3", gpu="A100-80GB").accepted  # vllm#26431
    assert support("vllm", "bf16", "fp8_e5m2", gpu="A100-80GB").accepted
    assert support("vllm", "bf16", "fp8_e4m3", gpu="H100").accepted
    fp8_on_ampere = support("vllm", "fp8", "bf16", gpu="A100-80GB")
    assert fp8_on_ampere.accepted and any("Marlin" in w for w in fp8_on_ampere.warnings)
    moe = ModelDescription.from_name("Mixtral-8x7B")
    assert not support("vllm", "fp8", "bf16", gpu="A100-80GB", model=moe).accepted
    assert not support("vllm", "mxfp4", "bf16").accepted  # MoE experts only
    assert support("vllm", "int8", "int8").row_scale_bytes == 4
    dsv3 = ModelDescription.from_name("DeepSeek-V3")
    assert not support("vllm", "bf16", "int8", model=dsv3).accepted


def test_sglang_and_trtllm_rules():
    assert not support("sglang", "bf16", "int8").accepted
    assert not support("sglang", "nvfp4", "bf16").accepted and support("sglang", "nvfp4", "bf16", gpu="B200").accepted
    assert not support("trtllm", "fp8", "bf16", gpu="A100-80GB").accepted
    assert support("trtllm", "w8a8-int8", "int8", gpu="A100-80GB").accepted


def test_vllm_command_spelling():
    cmd = launch_command("vllm", LLAMA8, parse_weight_spec("awq-int4-g128"), parse_kv("int8;skip=0,31"),
                         find_gpu("H100"), 8, 4096)
    argv = list(cmd.argv)
    assert argv[:2] == ["vllm", "serve"]
    assert argv[argv.index("--quantization") + 1] == "awq_marlin"  # not the slow 'awq'
    assert argv[argv.index("--kv-cache-dtype") + 1] == "int8_per_token_head"
    i = argv.index("--kv-cache-dtype-skip-layers")
    assert argv[i + 1:i + 3] == ["0", "31"]
    assert argv[argv.index("--max-model-len") + 1] == "4096" and argv[argv.index("--max-num-seqs") + 1] == "8"
    bf16 = launch_command("vllm", LLAMA8, parse_weight_spec("bf16"), parse_kv("bf16"), find_gpu("H100"), 1, 128)
    assert "--quantization" not in bf16.argv and "--kv-cache-dtype" not in bf16.argv
    wo = launch_command("vllm", LLAMA8, parse_weight_spec("fp8-wo"), parse_kv("bf16"), find_gpu("H100"), 1, 128)
    assert wo.env == ("VLLM_TEST_FORCE_FP8_MARLIN=1",) and wo.text().startswith("VLLM_TEST_FORCE_FP8_MARLIN=1 vllm")


def test_rejected_combination_never_gets_a_command():
    with pytest.raises(ConfigError, match="rejects"):
        launch_command("vllm", LLAMA8, parse_weight_spec("bf16"), parse_kv("fp8_e4m3"),
                       find_gpu("A100-80GB"), 1, 1024)
    with pytest.raises(ConfigError, match="rejects"):
        launch_command("llama.cpp", LLAMA8, parse_weight_spec("awq-int4-g128"), parse_kv("q8_0"),
                       find_gpu("H100"), 1, 1024)


@pytest.mark.parametrize("gpu", ["A100-80GB", "RTX-3090", "L4", "H100", "B200"])
def test_plan_never_prints_a_rejected_command(gpu):
    """Every launch line in a full plan comes from an evaluation whose engine accepts it."""
    weights = ["bf16", "fp8", "fp8-wo", "w8a8-int8", "int4-g128", "gptq-int4-g128", "nvfp4", "q8_0", "q4_0"]
    kvs = ["bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "q8_0", "q4_0", "k=q8_0,v=q4_0", "int4;skip=0"]
    result = plan("Llama-3-8B", gpu, 4, 4096, weights=weights, kv=kvs)
    printed = 0
    for row in result.rows:
        for ev in row.evaluations:
            if ev.command is not None:
                printed += 1
                assert ev.support.accepted and ev.fit.fits
                argv = ev.command.argv
                if ev.engine == "llama.cpp" and "-ctv" in argv and argv[argv.index("-ctv") + 1] not in ("f16",):
                    assert argv[argv.index("-fa") + 1] == "on"
    assert printed
    for rec in result.recommendations:
        row = next(r for r in result.rows if (r.weights, r.kv) == (rec.weights, rec.kv))
        assert next(e for e in row.evaluations if e.engine == rec.engine).support.accepted


def test_matrix_covers_every_engine_and_known_formats():
    from wkvlab.plan import FORMATS
    assert set(matrix()) == set(ENGINES)
    for engine, entry in matrix().items():
        assert set(entry["weights"]) <= set(FORMATS), engine
        assert set(entry["kv"]) <= set(KV_FORMATS), engine


def test_group_sizes_that_do_not_divide_input_widths_are_refused():
    """SmolLM2's hidden size 576 is not a multiple of 128: Marlin kernels refuse int4-g128."""
    smol = ModelDescription.from_name("SmolLM2-135M")
    s = support("vllm", "int4-g128", "bf16", model=smol)
    assert not s.accepted and "576" in s.reasons[0]
    assert support("vllm", "int4-g128", "bf16").accepted  # Llama-3-8B: 4096 and 14336 divide
