"""Engine support and flags for WeightSpec x KVSpec: no launch line an engine rejects; versions decide flags."""
from __future__ import annotations

import itertools

import pytest

from wkvlab.errors import ConfigError
from wkvlab.kv.formats import get_kv_format
from wkvlab.plan import ENGINES, ModelDescription, check_support, find_gpu, launch_command, parallel_for, plan
from wkvlab.plan.engines import matrix, parse_engine_versions
from wkvlab.plan.source import ModelSource
from wkvlab.weights import WeightSpec

LLAMA8 = ModelDescription.from_name("Llama-3-8B")
SRC = ModelSource("Llama-3-8B", "builtin", hub_id="meta-llama/Meta-Llama-3-8B")


def support(engine, weights, kv, gpu="H100", model=LLAMA8, version=None, gpus=1):
    return check_support(engine, model, weights, kv, find_gpu(gpu), parallel_for(engine, gpus), version)


def line(engine, weights, kv, gpu="H100", batch=4, ctx=4096, version=None, model_id=None):
    s = support(engine, weights, kv, gpu, version=version)
    return launch_command(engine, SRC, WeightSpec.parse(weights), s, batch, ctx, model_id=model_id)


@pytest.mark.parametrize("k,v", list(itertools.product(["fp16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"], repeat=2)))
def test_llamacpp_quantized_cache_gets_flash_attention(k, v):
    argv = list(line("llama.cpp", "q4_0", f"{k}/{v}+rot", gpu="RTX-4090").argv)
    if (k, v) != ("fp16", "fp16"):
        assert argv[argv.index("-fa") + 1] == "on"
        assert argv[argv.index("-ctk") + 1] == ("f16" if k == "fp16" else k)
    assert argv[argv.index("-c") + 1] == str(4 * 4096) and argv[argv.index("-np") + 1] == "4"
    s = support("llama.cpp", "q4_0", f"{k}/{v}+rot")
    slow = k != v or k not in ("fp16", "q8_0", "q4_0")
    assert s.slow_path == slow and any("GGML_CUDA_FA_ALL_QUANTS" in w for w in s.warnings) == slow


def test_llamacpp_rotation_is_its_default():
    """llama.cpp rotates quantized caches (PR #21038): a spec without +rot needs LLAMA_ATTN_ROT_DISABLE=1."""
    assert line("llama.cpp", "q4_0", "llamacpp:q4_0").env == ()
    plain = line("llama.cpp", "q4_0", "q4_0")
    assert plain.env == ("LLAMA_ATTN_ROT_DISABLE=1",) and plain.text().startswith("LLAMA_ATTN_ROT_DISABLE=1 llama-server")


def test_llamacpp_refusals():
    assert not support("llama.cpp", "awq-int4-g128", "q8_0").accepted  # not a GGUF type
    assert not support("llama.cpp", "q4_0", "int8").accepted  # no per-vector int8 cache type
    assert not support("llama.cpp", "q4_0", "q8_0+skip=0").accepted  # no per-layer types
    assert not support("llama.cpp", "q4_0", "q4_0+sinks=4").accepted  # a wkvlab-only option


def test_vllm_rules():
    assert not support("vllm", "bf16", "int8/int4").accepted  # one dtype for K and V
    assert support("vllm", "bf16", "int4+skip=0,1").accepted
    assert not support("vllm", "q4_0", "bf16").accepted
    assert not support("vllm", "bf16", "fp8_e4m3", gpu="A100-80GB").accepted  # vllm#26431
    assert support("vllm", "bf16", "fp8_e5m2", gpu="A100-80GB").accepted
    fp8_on_ampere = support("vllm", "fp8", "bf16", gpu="A100-80GB")
    assert fp8_on_ampere.accepted and any("Marlin" in w for w in fp8_on_ampere.warnings)
    assert not support("vllm", "fp8", "bf16", gpu="A100-80GB", model=ModelDescription.from_name("Mixtral-8x7B")).accepted
    assert not support("vllm", "mxfp4", "bf16").accepted  # MoE experts only
    assert not support("vllm", "bf16", "int8", model=ModelDescription.from_name("DeepSeek-V3")).accepted
    asym = support("vllm", "gptq-int4-g128", "bf16")  # gptq_marlin is symmetric only
    assert asym.accepted and asym.slow_path and asym.weight_arg == "gptq"
    assert support("vllm", "gptq-int4-g128-sym", "bf16").weight_arg == "gptq_marlin"
    assert support("vllm", "int4-g128", "bf16").weight_arg == "awq_marlin"  # never the slow 'awq'
    assert not support("vllm", "int3-g64", "bf16").accepted and "no kernel" in support("vllm", "int3-g64", "bf16").reasons[0]


def test_vllm_storage_is_what_it_allocates():
    """int8 runs as int8_per_token_head, whose rows keep an fp32 scale: the planner counts that, not wkvlab's fp16 one."""
    kv = support("vllm", "bf16", "int8").kv
    assert kv.args == ("--kv-cache-dtype", "int8_per_token_head") and kv.storage == "int8_pth" and kv.exact
    assert get_kv_format("int8_pth").bytes_per_vector(128) == 132


def test_versions_decide_flags():
    """vLLM 0.34.0 (the newest modelled) has per-token-head dtypes and skip layers, but no --calculate-kv-scales (0.27.1
    is the last release with it); vLLM 0.11 had --calculate-kv-scales and neither of the others."""
    main = line("vllm", "bf16", "fp8_e4m3+scales=tensor")
    assert "--calculate-kv-scales" not in main.argv and any("k_scale" in n for n in main.notes)
    assert main.version == "vLLM 0.34.0" and "62d4bc3c7" in main.checked
    # a runtime scale calculation (wkvlab's scales=calculate) is refused where the flag does not exist, printed where it does
    calc = support("vllm", "bf16", "fp8_e4m3+scales=calculate")
    assert not calc.accepted and any("no --calculate-kv-scales" in r and "vllm=0.27" in r for r in calc.reasons)
    assert "--calculate-kv-scales" in line("vllm", "bf16", "fp8_e4m3+scales=calculate", version="0.27").argv
    assert "--calculate-kv-scales" in line("vllm", "bf16", "vllm@0.27:fp8_e4m3+scales=calculate", version="0.27.1").argv
    old = line("vllm", "bf16", "fp8_e4m3+scales=tensor", version="0.11")
    assert "--calculate-kv-scales" in old.argv and old.version == "vLLM 0.11"
    assert not support("vllm", "bf16", "int8", version="0.11").accepted
    assert not support("vllm", "bf16", "fp8_e4m3+skip=0", version="0.11").accepted
    assert parse_engine_versions(["vllm=0.11"]) == {"vllm": "0.11"}
    with pytest.raises(ConfigError, match="version"):
        parse_engine_versions(["vllm=0.1"])


def test_vllm_runs_a_per_layer_plan_as_its_closest_line():
    """A search plan mixing pairs: one dtype (the plan's most precise) for every quantized layer, 16-bit layers skipped."""
    s = support("vllm", "bf16", "int4+0=fp16+1-2=int8/int4")
    assert s.accepted and not s.kv.exact
    assert s.kv.args == ("--kv-cache-dtype", "int8_per_token_head", "--kv-cache-dtype-skip-layers", "0")
    exact = support("vllm", "bf16", "fp8_e4m3+0,31=fp16")
    assert exact.kv.exact and exact.kv.args[-3:] == ("--kv-cache-dtype-skip-layers", "0", "31")
    llama = support("llama.cpp", "q4_0", "int4+0=fp16+1-2=int8/int4")
    assert llama.accepted and not llama.kv.exact and llama.kv.args == ("-ctk", "q4_0", "-ctv", "q4_0")


def test_vllm_command_spelling():
    cmd = line("vllm", "awq-int4-g128", "int8+skip=0,31", batch=8, model_id="org/awq-checkpoint")
    argv = list(cmd.argv)
    assert argv[:3] == ["vllm", "serve", "org/awq-checkpoint"] and cmd.ready
    assert argv[argv.index("--quantization") + 1] == "awq_marlin"
    i = argv.index("--kv-cache-dtype-skip-layers")
    assert argv[i + 1:i + 3] == ["0", "31"]
    assert argv[argv.index("--max-model-len") + 1] == "4096" and argv[argv.index("--max-num-seqs") + 1] == "8"
    bf16 = line("vllm", "bf16", "bf16")
    assert "--quantization" not in bf16.argv and "--kv-cache-dtype" not in bf16.argv and bf16.argv[2] == "meta-llama/Meta-Llama-3-8B"
    wo = line("vllm", "fp8-wo", "bf16")
    assert wo.env == ("VLLM_TEST_FORCE_FP8_MARLIN=1",) and wo.text().startswith("VLLM_TEST_FORCE_FP8_MARLIN=1 vllm")


def test_sglang_and_trtllm_rules():
    assert not support("sglang", "bf16", "int8").accepted
    assert not support("sglang", "nvfp4", "bf16").accepted and support("sglang", "nvfp4", "bf16", gpu="B200").accepted
    assert not support("trtllm", "fp8", "bf16", gpu="A100-80GB").accepted
    assert support("trtllm", "w8a8-int8", "int8", gpu="A100-80GB").accepted


def test_rejected_combination_never_gets_a_command():
    with pytest.raises(ConfigError, match="rejects"):
        line("vllm", "bf16", "fp8_e4m3", gpu="A100-80GB")
    with pytest.raises(ConfigError, match="rejects"):
        line("llama.cpp", "awq-int4-g128", "q8_0")


@pytest.mark.parametrize("gpu", ["A100-80GB", "RTX-3090", "L4", "H100", "B200"])
def test_plan_never_prints_a_rejected_command(gpu):
    weights = ["bf16", "fp8", "fp8-wo", "w8a8-int8", "int4-g128", "gptq-int4-g128", "nvfp4", "q8_0", "q4_0"]
    kvs = ["bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "llamacpp:q8_0", "q4_0", "q8_0/q4_0", "int4+skip=0"]
    result = plan("Llama-3-8B", gpu, 4, 4096, weights=weights, kv=kvs)
    printed = 0
    for row in result.rows:
        for ev in row.evaluations:
            if ev.command is not None:
                printed += 1
                assert ev.support.accepted and ev.fit.fits
                argv = ev.command.argv
                if ev.engine == "llama.cpp" and "-ctv" in argv:
                    assert argv[argv.index("-fa") + 1] == "on"
    assert printed


def test_matrix_names_real_formats():
    assert set(matrix()) == set(ENGINES)
    for engine, entry in matrix().items():
        for name, kv in entry["kv"].items():
            get_kv_format(name), get_kv_format(kv["storage"])  # every key and storage is a wkvlab KV format
        assert entry["default_version"] in entry["versions"], engine


def test_marlin_shapes():
    """SmolLM2's hidden size 576 is not a multiple of 128: Marlin refuses int4-g128 there."""
    smol = ModelDescription.from_name("SmolLM2-135M")
    s = support("vllm", "int4-g128", "bf16", model=smol)
    assert not s.accepted and "576" in s.reasons[0]
    assert support("vllm", "int4-g128", "bf16").accepted


def test_int8_weight_only_and_whole_groups():
    """Per-channel INT8 (no groups) takes compressed-tensors W8A16 on SmolLM2, whose widths Marlin would refuse;
    a group size that does not divide a per-GPU input width is refused by every GPU engine."""
    smol = ModelDescription.from_name("SmolLM2-135M")
    int8 = support("vllm", "int8", "bf16", model=smol)
    assert int8.accepted and int8.weight_arg == "compressed-tensors"
    ragged = support("sglang", "int8-g128", "bf16", model=smol)
    assert not ragged.accepted and any("576" in r and "group size" in r for r in ragged.reasons)


def test_vllm_int8_store_and_dtypes_follow_the_release():
    """vLLM 0.23.0 stores int8_per_token_head truncated (int8_pth-trunc), 0.24.0 on rounded (int8_pth); 0.23.0 has no
    int4_per_token_head: each release takes only its own store and dtypes."""
    assert support("vllm", "bf16", "vllm:int8_per_token_head").kv.args == ("--kv-cache-dtype", "int8_per_token_head")
    assert not support("vllm", "bf16", "vllm@0.23:int8_per_token_head").accepted  # 0.34 rounds: not its store
    old = line("vllm", "bf16", "vllm@0.23:int8_per_token_head", version="0.23")
    assert old.version == "vLLM 0.23.0" and "--kv-cache-dtype" in old.argv and "int8_per_token_head" in old.argv
    assert not support("vllm", "bf16", "vllm:int8_per_token_head", version="0.23").accepted
    assert not support("vllm", "bf16", "int4_pth", version="0.23").accepted and support("vllm", "bf16", "int4_pth", version="0.27").accepted


def test_nvfp4_kv_caches_get_their_engine_flags():
    """vLLM --kv-cache-dtype nvfp4 / nvfp4_4over6 and SGLang 0.5.23's --kv-cache-dtype nvfp4 | fp4_mx_block16 (no
    --fp4-kv-cache-recipe: gone): Blackwell only, storage = the format whose bytes the engine allocates (head_dim/2 +
    head_dim/16 per token and head)."""
    for fmt in ("nvfp4", "nvfp4_4over6"):
        s = support("vllm", "bf16", fmt, gpu="B200")
        assert s.accepted and s.kv.args == ("--kv-cache-dtype", fmt) and s.kv.storage == fmt
        assert not support("vllm", "bf16", fmt).accepted  # H100: no NVFP4 KV kernels
        assert not support("vllm", "bf16", fmt, gpu="B200", version="0.11").accepted
    for spec in ("sglang:fp4_e2m1+recipe=nvfp4", "sglang:nvfp4", "sglang:fp4_e2m1+recipe=nvfp4-sm100"):
        s = support("sglang", "bf16", spec, gpu="B200")
        assert s.accepted and s.kv.args == ("--kv-cache-dtype", "nvfp4") and s.kv.storage == "nvfp4", spec
        assert any("workspace" in w for w in s.warnings)
    for spec in ("fp4_e2m1", "sglang:fp4_mx_block16", "sglang:fp4_e2m1"):
        assert support("sglang", "bf16", spec, gpu="B200").kv.args == ("--kv-cache-dtype", "fp4_mx_block16")
    sglang_line = line("sglang", "bf16", "sglang:nvfp4", gpu="B200")
    assert "--fp4-kv-cache-recipe" not in sglang_line.argv and sglang_line.version == "SGLang 0.5.23"
    # SGLang 0.5.20's x6 on SM100 without checkpoint scales: its own release only
    assert not support("sglang", "bf16", "sglang@0.5.20:fp4_e2m1+recipe=nvfp4-sm100", gpu="B200").accepted
    old = support("sglang", "bf16", "sglang@0.5.20:fp4_e2m1+recipe=nvfp4-sm100", gpu="B200", version="0.5.20")
    assert old.accepted and old.kv.args == ("--kv-cache-dtype", "nvfp4") and old.kv.storage == "nvfp4-sm100"
    assert not support("vllm", "bf16", "nvfp4-fp8read", gpu="B200").accepted  # SGLang's read path, not a vLLM dtype
    assert get_kv_format("nvfp4").bytes_per_vector(128) == 72


def test_sglang_fp8_e5m2_preset_launches_sglangs_own_dtype():
    """sglang:fp8_e5m2 stores fp8_e5m2-nosat (torch's cast, memory_pool.py set_kv_buffer): SGLang's
    --kv-cache-dtype fp8_e5m2, D bytes; the format is SGLang's store, not a vLLM dtype."""
    s = support("sglang", "bf16", "sglang:fp8_e5m2")
    assert s.accepted and s.kv.args == ("--kv-cache-dtype", "fp8_e5m2") and s.kv.storage == "fp8_e5m2-nosat"
    assert not support("vllm", "bf16", "fp8_e5m2-nosat").accepted
