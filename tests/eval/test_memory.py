"""The preflight memory estimate: byte counts by hand, the planner's shapes, and ``wkvlab eval --dry-run``."""
import json
import re

import pytest
import torch

from tests.conftest import tiny_gemma3, tiny_llama
from wkvlab.errors import ConfigError, OutOfMemory
from wkvlab.eval.memory import CPU_PROCESS_BYTES, LIVE_LOGITS, RUNTIME_BYTES, TOKENIZER_BYTES_PER_ENTRY, GridShape, estimate_memory, measured_reserve
from wkvlab.kv.spec import KVSpec
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.params import parameter_count
from wkvlab.units import GIB
from wkvlab.weights.spec import WeightSpec

TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, vocab_size=128, max_position_embeddings=256, tie_word_embeddings=False)


def _grid(weights=("none", "int8"), kv=("fp16", "int4+residual=8"), **kw):
    return GridShape(tuple(WeightSpec.parse(w) for w in weights), tuple(KVSpec.parse(k) for k in kv), **{"ctx": 48, "tokens": 94, "chunk": 16, **kw})


def _part(plan, name):
    return next(p.bytes for p in plan.parts if p.name.startswith(name))


def test_parts_by_hand():
    desc = ModelDescription.from_config(TINY, name="tiny")
    est = estimate_memory(desc, _grid())
    # per layer q (64 -> 4 × 32), k and v (64 -> 2 × 32), o, gate/up/down; embeddings and head untied; 2 norms per layer + the final
    params = 2 * (64 * 128 + 2 * 64 * 64 + 128 * 64 + 3 * 64 * 128) + 2 * 128 * 64 + (2 * 2 + 1) * 64
    assert parameter_count(desc) == params
    copies, one = est.plan("copies"), est.plan("one-model", 1)
    assert _part(copies, "weights") == params * 4 and _part(copies, "weight copies (1)") == params * 4
    per_token = 2 * 2 * 32 * 2 * 4  # layers × kv heads × head_dim × (K, V) × float32
    # reference + (fp16, residual) per weight config; the residual spec keeps full-precision copies too
    assert _part(copies, "KV caches") == per_token * 48 * (1 + 2 * (1 + 2))
    assert _part(one, "KV caches") == per_token * 48 * 2  # the residual spec's cache alone
    assert _part(copies, "logits") == LIVE_LOGITS["copies"] * 16 * 128 * 4
    assert _part(one, "logits") == LIVE_LOGITS["one-model"] * 16 * 128 * 4
    # a CPU run's device is the process: the interpreter with its libraries and the tokenizer, measured; a GPU's, a fixed allowance
    assert _part(one, "process") == CPU_PROCESS_BYTES and _part(one, "tokenizer") == 128 * TOKENIZER_BYTES_PER_ENTRY
    gpu = estimate_memory(desc, _grid(device="cuda")).plan("one-model", 1)
    assert _part(gpu, "runtime") == RUNTIME_BYTES and not any(p.name.startswith(("process", "tokenizer")) for p in gpu.parts)
    assert one.device_bytes - gpu.device_bytes == CPU_PROCESS_BYTES + 128 * TOKENIZER_BYTES_PER_ENTRY - RUNTIME_BYTES
    assert next(p for p in one.parts if p.name.startswith("original weights")).where == "disk"  # a CPU model: originals on disk
    assert copies.device_bytes > one.device_bytes


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_the_planners_description_of_a_loaded_model_counts_its_parameters(make):
    model = make()
    desc = ModelDescription.from_config(model.config.to_dict(), name="tiny")
    assert parameter_count(desc) == sum(p.numel() for p in model.parameters())


def test_calibrated_builds_add_their_capture():
    """By hand for TINY (float32, 2 × 32 calibration tokens): what wkvlab.weights holds while it builds.
    Whether these terms are what a build really holds is tested on meta (tests/weights/test_build_memory.py)."""
    desc = ModelDescription.from_config(TINY, name="tiny")

    def capture(weights, calibration=(2, 32)):
        plan = estimate_memory(desc, _grid(weights=weights, calibration=calibration)).plan("one-model", 1)
        return next(p.bytes for p in plan.build_parts if p.name == "calibration capture")

    tokens, d = 2 * 32, 4
    hidden = tokens * 64 * d  # one layer's hidden states
    forward = 4 * 32 * (6 * 64 + 3 * 128) * d + 2 * 4 * (4 * 32) * 32 * d  # one chunk of 4 samples: activations, repeat_kv's K/V of 4 × 32 keys
    # GPTQ's largest group: q/k/v stacked (in 64, out 128 + 64 + 64): the 16-bit stack, then in the column loop
    # the inverse factor (in²) and three [out, in] float32 copies — more than 3 × in² + one copy while inverting
    gptq = hidden + 64 * 256 * d + max(3 * 64 * 64 * 4 + 64 * 256 * 4, 64 * 64 * 4 + 3 * 64 * 256 * 4)
    # AWQ: the outputs, every inspected module's recorded inputs and outputs (attention 64 + 64, the MLP 64 + 64,
    # down_proj 128 + 64 features per token) and four float32 copies of q_proj beside k and v's candidates
    awq = hidden + (128 + 128 + 192) * tokens * d + 4 * 128 * 64 * 4 + 2 * 64 * 64 * d
    assert capture(("gptq-int4-g32",)) == max(hidden + forward, gptq)
    assert capture(("awq-int4-g32",)) == max(hidden + forward, awq)
    many = 64 * 32 * 64 * d  # 64 samples: the hidden states grow, the Hessian part does not
    assert capture(("gptq-int4-g32",), calibration=(64, 32)) == max(many + forward, many + gptq - hidden)
    assert capture(("int4-g32",)) == 0


def test_llama_3_8b_grid_fits_24_gib_in_one_model():
    """The issue's case: Llama-3-8B, 3 weight × 4 KV configs at ctx 8192 in bf16 — ~75 GiB as
    copies, under 24 GiB with one model (its parts are the weights and one cache, plus one chunk's logits)."""
    desc = ModelDescription.from_name("llama-3-8b")
    grid = GridShape(tuple(WeightSpec.parse(w) for w in ("bf16", "int8", "int4-g128")),
                     tuple(KVSpec.parse(k) for k in ("fp16", "fp8_e4m3", "int8", "int4")), ctx=8192, tokens=8191, dtype="bfloat16", device="cuda")
    est = estimate_memory(desc, grid, budget_bytes=24 * GIB)
    assert est.plan("copies").device_bytes > 70 * GIB
    assert est.plan("one-model", 1).device_bytes < 20 * GIB
    assert est.chosen.plan == "one-model" and est.chosen.device_bytes <= 24 * GIB


def _llama_8b_grid():
    return GridShape(tuple(WeightSpec.parse(w) for w in ("bf16", "int8")), (KVSpec.parse("fp16"),), ctx=2048, tokens=2047,
                     dtype="bfloat16", device="cuda")


def test_a_measured_budget_keeps_a_reserve():
    """15% of the measured free memory, at least 0.5 GiB (the estimates' worst error was 1.11×)."""
    assert measured_reserve(1 * GIB) == GIB // 2
    assert measured_reserve(20 * GIB) == 3 * GIB
    desc = ModelDescription.from_name("llama-3-8b")
    copies = estimate_memory(desc, _llama_8b_grid(), choose=False).plan("copies").device_bytes

    def chosen(fraction, reserved):
        free = int(copies / fraction)  # the copies plan needs `fraction` of the free memory
        return estimate_memory(desc, _llama_8b_grid(), budget_bytes=free, reserve_bytes=measured_reserve(free) if reserved else 0)

    # measured free memory: the copies plan at 96% of it is not chosen (the 1.5B dry run's 7.7 of 8.0 GiB), at 80% it is
    tight, roomy = chosen(0.96, True), chosen(0.80, True)
    assert tight.chosen.plan == "one-model" and tight.chosen.device_bytes <= 0.85 * tight.budget_bytes
    assert roomy.chosen.plan == "copies"
    free = int(copies / 0.96)
    assert tight.one_line().startswith(f"memory: one-model (1 cache at once) plan, about {tight.chosen.device_bytes / GIB:.1f} GiB "
                                       f"of {free / GIB:.1f} GiB available on cuda, {0.15 * free / GIB:.1f} kept in reserve (")
    assert f"{0.15 * free / GIB:.2f} kept in reserve (a plan may use {0.85 * free / GIB:.2f})" in "\n".join(tight.lines())
    # --max-memory is the user's own number: the whole of it, no reserve
    given = chosen(0.96, False)
    assert given.chosen.plan == "copies" and "reserve" not in given.one_line()
    with pytest.raises(ConfigError, match=rf"the copies plan needs about {copies / GIB:.1f} GiB, {free / GIB:.1f} GiB available on cuda, "
                                          rf"{0.15 * free / GIB:.1f} kept in reserve; --memory-plan one-model fits"):
        estimate_memory(desc, _llama_8b_grid(), budget_bytes=free, reserve_bytes=measured_reserve(free), requested="copies")


def test_the_reserve_applies_to_measured_free_memory_only(monkeypatch):
    from wkvlab import api

    desc = ModelDescription.from_name("llama-3-8b")
    copies = estimate_memory(desc, _llama_8b_grid(), choose=False).plan("copies").device_bytes
    free = int(copies / 0.96)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("wkvlab.runtime.available_memory", lambda device: free)
    kwargs = dict(ctx=2048, tokens=2048, dtype="bfloat16", device="cuda")
    weights, kv = [WeightSpec.parse(w) for w in ("bf16", "int8")], [KVSpec.parse("fp16")]
    measured = api.memory_estimate("llama-3-8b", weights, kv, **kwargs)
    assert measured.budget_bytes == free and measured.reserve_bytes == measured_reserve(free) and measured.chosen.plan == "one-model"
    given = api.memory_estimate("llama-3-8b", weights, kv, max_memory=free, **kwargs)
    assert given.reserve_bytes == 0 and given.chosen.plan == "copies"


def test_dry_run_prints_the_estimate_without_loading(tmp_path):
    from typer.testing import CliRunner

    from wkvlab.cli import app

    result = CliRunner().invoke(app, ["eval", "--model", "llama-3-8b", "--weights", "bf16,int8,int4-g128", "--kv", "fp16,fp8_e4m3,int8,int4",
                                      "--ctx", "8192", "--tokens", "8192", "--dtype", "bfloat16", "--device", "cuda", "--max-memory", "24",
                                      "--dry-run", "--threads", "1"])
    assert result.exit_code == 0, result.output
    one = float(re.search(r"one-model \(1 cache at once\): ([\d.]+) GiB", result.output).group(1))
    chosen = float(re.search(r"one-model \(\d caches? at once\): ([\d.]+) GiB on the device  <- chosen", result.output).group(1))
    assert one <= 24 and chosen <= 24
    assert "memory: one-model" in result.output


def test_dry_run_refuses_in_one_line_naming_what_fits():
    from typer.testing import CliRunner

    from wkvlab.cli import app

    result = CliRunner().invoke(app, ["eval", "--model", "llama-3-8b", "--weights", "int8", "--kv", "fp16", "--ctx", "32768", "--tokens", "32768",
                                      "--dtype", "float32", "--device", "cuda", "--max-memory", "36", "--dry-run", "--threads", "1"])
    # the entry point prints a WkvlabError as its one line and exits 2 (tests/test_cli_fuzz.py)
    assert isinstance(result.exception, ConfigError) and "\n" not in str(result.exception)
    assert "--dtype bfloat16 with --memory-plan one-model fits" in str(result.exception)
    assert "one-model (1 cache at once)" in result.output  # the table came first


@pytest.mark.slow
def test_out_of_memory_mid_run_keeps_the_finished_results_in_the_json(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from wkvlab.cli import app
    from wkvlab.eval.chunks import WindowPass

    calls, original = [], WindowPass.step

    def step(self, tokens, rows=None):
        calls.append(1)
        if len(calls) > 4:  # the reference's two windows, then none × fp16; int8 runs out
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, tokens, rows)

    monkeypatch.setattr(WindowPass, "step", step)
    out = tmp_path / "out.json"
    result = CliRunner().invoke(app, ["eval", "--ctx", "64", "--tokens", "128", "--weights", "none,int8", "--kv", "fp16", "--memory-plan",
                                      "one-model", "--threads", "1", "--json", str(out)])
    assert isinstance(result.exception, OutOfMemory) and "1 of 2 result(s) had finished" in str(result.exception)
    assert "none" in result.output  # the finished result's table was printed
    saved = json.loads(out.read_text())
    assert saved["weights"] == "none" and saved["kv"] == "fp16"


def test_a_16_bit_run_holds_llamacpp_layers_in_float32():
    # kv/readprec.py: in a bf16 run the quantized layers of a llama.cpp preset keep K/V in float32 (what
    # its CPU attention reads), ExLlamaV3's in fp16; a float32 run is the same for every spec
    desc = ModelDescription.from_config(TINY, name="tiny")

    def cache(kv, dtype):
        return _part(estimate_memory(desc, _grid(weights=("none",), kv=(kv,), dtype=dtype)).plan("one-model", 1), "KV caches")

    per_token16 = 2 * 2 * 32 * 2 * 2  # layers × kv heads × head_dim × (K, V) × 2 bytes
    assert cache("q8_0", "bfloat16") == per_token16 * 48
    assert cache("llamacpp:q8_0", "bfloat16") == 2 * per_token16 * 48
    assert cache("exl3:k4v4", "bfloat16") == per_token16 * 48
    assert cache("llamacpp:q8_0", "float32") == cache("q8_0", "float32") == 2 * per_token16 * 48


def test_the_attention_term_is_repeat_kvs_expanded_keys_and_values_not_a_score_block():
    """sdpa runs a chunk of queries against the cache without a score matrix (a mask rules out only
    flash on CUDA; the memory-efficient kernel takes it); what grouped-query attention allocates is
    repeat_kv's K and V expanded to every query head. Llama-3-8B, bf16, 32k keys: 2 × 32 heads ×
    32,768 × 128 × 2 bytes = 512 MiB, where the old float32 score block (32 × 512 × 32,768 × 4) said
    2 GiB. A spec that runs the mixed-precision attention counts it where it is larger (by hand, 512
    queries: the float32 K and V, 2 × 8 × 32,768 × 128 × 4 = 256 MiB; two score tensors of a 64-query
    group, 2 × 32 × 64 × 32,768 × 4 = 512 MiB; the group's mask, 8 MiB, and the float32 output, 8 MiB)."""
    from wkvlab.eval.memory import _attention, _query_dependent

    desc = ModelDescription.from_name("llama-3-8b")
    assert _attention(desc, 32768, 2, mixed=False) == 2 * 32 * 32768 * 128 * 2 == 512 << 20
    assert _attention(desc, 32768, 2, mixed=True, chunk=512) == (256 + 512 + 8 + 8) << 20
    mha = ModelDescription.from_config({**TINY, "num_key_value_heads": TINY["num_attention_heads"]}, name="mha")
    assert _attention(mha, 4096, 4, mixed=False) == 0  # repeat_kv returns K and V as they are
    assert _query_dependent(KVSpec.parse("int2+residual=8")) and not _query_dependent(KVSpec.parse("q4_0"))
    grid = GridShape((WeightSpec.parse("none"),), (KVSpec.parse("q4_0"),), ctx=32768, tokens=32767, dtype="bfloat16", device="cuda", chunk=512)
    parts = {p.name: p.bytes for p in estimate_memory(desc, grid).plan("one-model", 1).parts}
    assert parts["activations (one chunk)"] == 512 * (6 * 4096 + 3 * 14336) * 2 + (512 << 20)


def test_one_window_of_the_per_token_reference_is_counted_on_the_device():
    """The recorder keeps a window's record on the device until it reads it back, and the
    comparison moves a window's record there: ctx × (8 (k + samples) + 12) bytes plus every 256th
    token's full distribution."""
    desc = ModelDescription.from_name("llama-3-8b")
    grid = GridShape((WeightSpec.parse("none"),), (KVSpec.parse("q4_0"),), ctx=32768, tokens=65534, dtype="bfloat16", device="cuda", chunk=512)
    parts = {(p.name, p.where): p.bytes for p in estimate_memory(desc, grid).plan("one-model", 1).parts}
    assert parts[("per-token reference (one window)", "device")] == 32768 * (8 * (1024 + 256) + 12) + 128 * 128256 * 4
    assert parts[("per-token reference", "host")] == 65534 * (8 * (1024 + 256) + 12) + 256 * 128256 * 4


def test_a_grid_no_preflight_planned_announces_its_estimate(monkeypatch):
    """explain, plan --probe, sweep, tasks and findings run grids without eval's preflight: the grid's
    own estimate goes to the listeners (the CLI prints it in the header); a plan a preflight decided is not repeated."""
    from wkvlab.data.windows import make_windows
    from wkvlab.eval import memory
    from wkvlab.eval.runner import RunOptions, run_grid

    heard = []
    monkeypatch.setattr(memory, "_LISTENERS", [])
    memory.listen(heard.append)
    memory.listen(heard.append)  # once per callback
    model = tiny_llama()
    windows = make_windows(torch.randint(0, 128, (60,)), ctx=48, n_tokens=48, bos_id=None)
    specs = dict(model_name="tiny", data_name="random")
    run_grid(model, windows, [WeightSpec.parse("none")], [KVSpec.parse("fp16"), KVSpec.parse("q8_0")], **specs)
    assert len(heard) == 1 and heard[0].chosen.plan == "copies" and heard[0].one_line().startswith("memory: copies plan, about ")
    run_grid(model, windows, [WeightSpec.parse("none")], [KVSpec.parse("fp16")], options=RunOptions(plan="copies", interleave=1), **specs)
    assert len(heard) == 1
