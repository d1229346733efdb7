"""A GPU check that can fail (issue #23 item 7): wkvlab on a CUDA device, against itself on the CPU.

Nothing is downloaded: every model is built from a transformers config with random weights, on the
device. It prints one JSON object (every check with what it measured, ``failed`` listing the ones
that did not hold) and exits 1 when any check fails.

(a) **Formats on the device equal the CPU.** Every KV format (wkvlab.kv.formats, ExLlamaV3 and
    per-channel groups included) and every weight format (wkvlab.weights.rtn.quantize_weight over
    one spec per format) on the same random tensor, on the device and on the CPU: bit-exact, except
    the formats that rotate (a Hadamard matrix product: ExLlamaV3, vLLM int4_per_token_head), whose
    products sum in another order on a GPU; those may differ in at most ``ROTATED_MISMATCH`` of the
    values (codes flipped by an ulp of the rotation).
(b) **Ten architectures** — Llama, Qwen2, Qwen3, Mistral, Gemma 2, Gemma 3 text, Phi-3, Mixtral,
    Qwen3-MoE and multimodal Gemma 3 (``Gemma3ForConditionalGeneration``) — tiny (hidden 128,
    head_dim 64, 2 layers, 4 experts), float32, through the evaluation runner
    (:func:`wkvlab.eval.runner.run_grid`, what ``wkvlab eval`` calls):
    chunked logits equal one whole pass (``CHUNKED_ATOL``); the identity config's KLD is exactly 0;
    every KV spec (:data:`KV_SPECS`) and every weight method (:data:`WEIGHT_SPECS`) runs with a
    finite mean KLD and a KLD **above 0** on some token (a hook that never fires, or a build that
    changes nothing, gives exactly 0 everywhere and fails), and on a GPU its KLD matches the same model's CPU float32 run within ``KLD_RTOL``
    relative + ``KLD_ATOL``; a refusal fails unless :data:`EXPECTED_REFUSALS` lists it for that
    architecture (a regression refusing GPTQ everywhere fails); the calibrated KV specs run twice
    against a cache directory of their own per model (the first run writes statistics there, the
    second reads them back and writes none: same KLD bit for bit); and ``int4-g32`` changes at
    least ``MIN_QUANTIZED`` of the decoder's parameters (experts included: a MoE whose fused expert
    tensors are skipped shows ~0.1 here and fails). The same in **bfloat16** for the identity and
    every KV spec (the float32-logit path of a 16-bit model: chunked vs whole within
    ``CHUNKED_ATOL``, identity KLD exactly 0, every KV spec's KLD above 0).
(m) **The meta audit** (``tests/fake_device.py``, CPU): a grid with the model on torch's ``meta``
    device and on a CPU + meta split runs without an op mixing devices, and makes no host sync
    (``.item()``, boolean mask, host<->device copy) per chunk: the same window in twice as many
    chunks makes exactly as many. The **meta build audit**: GPTQ and AWQ at Llama-3-70B's and
    Mixtral-8x7B's widths built in place on ``meta`` inside the counting audit
    (``tests/meta_memory.py``): the peak within ±15% of the estimate's build phase, flat per layer.
(c) **GPU only: a Llama-3-8B-shaped model** (random weights, bfloat16): one 32k window through the
    reference and one KV candidate, candidate/reference time ≤ ``MAX_SLOWDOWN``; the run's peak
    memory within ±``MEMORY_MARGIN`` of the preflight estimate (``api.memory_estimate``,
    :mod:`wkvlab.eval.memory`; torch's ``max_memory_allocated`` and ``max_memory_reserved``, each
    against the estimate less its fixed allowance for the CUDA context, with expandable segments as
    a run has them, wkvlab.runtime); forward calls per chunk = 1 + candidates; a 3×4 grid's peak at
    ctx 8192 within its one-model estimate; GPTQ and AWQ per-layer time and memory on a
    Llama-3-70B-shaped slice of 4 layers at AutoAWQ's calibration (128 × 512): both peaks within
    ±``BUILD_MARGIN`` of the estimate's build phase.
    The forward-call count also runs on the CPU (tiny model).

Without CUDA (or with ``--cpu``) it runs what the CPU can show — (b) on the CPU, (m), the
forward-call count — and prints one line on stderr saying the rest needs a GPU. ``--budget SECONDS``
starts no further group of checks once that much time has passed: what did not run is listed under
``skipped`` and the exit status is 2 (1 when a check failed), so a run cut short never reads as a pass.
The tolerances are stated here and in the JSON; none was tuned on a GPU (docs/gpu.md says whether
it has been run on one).

Usage: python benchmarks/gpu_check.py [--device cuda] [--cpu] [--models llama,mixtral] [--skip-8b] [--budget 540]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
try:  # an installed wkvlab or PYTHONPATH wins; else this checkout's
    import wkvlab  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "src"))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # tests.fake_device: the meta audit (m)

from wkvlab import api  # noqa: E402
from wkvlab.data.windows import make_windows  # noqa: E402
from wkvlab.errors import ConfigError  # noqa: E402
from wkvlab.eval.chunks import WindowPass, chunk_bounds  # noqa: E402
from wkvlab.eval.runner import RunOptions, forward_logits, run_grid  # noqa: E402
from wkvlab.kv.formats import KV_FORMATS, get_kv_format  # noqa: E402
from wkvlab.runtime import use_expandable_segments  # noqa: E402
from wkvlab.weights import quantize_model_weights  # noqa: E402
from wkvlab.weights.calibration import CalibrationSet, CalibrationSpec  # noqa: E402

# -- tolerances (stated, not tuned on a GPU) ---------------------------------------------------
ROTATED_MISMATCH = 0.01  # (a) fraction of values a rotating format may differ in, device vs CPU
CHUNKED_ATOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2}  # (b) chunked vs whole logits, max abs
KLD_RTOL, KLD_ATOL = 0.10, 1e-6  # (b) device KLD vs CPU float32 KLD
MIN_QUANTIZED = 0.90  # (b) fraction of decoder parameters int4-g32 must change
MAX_SLOWDOWN = 1.15  # (c) candidate / reference time of one 32k window
MEMORY_MARGIN = 0.10  # (c) measured peaks (allocated and reserved) within ±10% of the preflight estimate
BUILD_MARGIN = 0.15  # (c) a calibrated build's peaks (allocated and reserved) within ±15% of the estimate's build phase (issue #40's bound)

CTX, WINDOWS, CHUNK, VOCAB = 160, 1, 64, 256  # 160 tokens: past kivi2's 128-key residual
KV_SPECS = [
    *[name for name in KV_FORMATS if name != "fp16"], "exl3_4", "int2-c4", "int4-g32",
    "llamacpp:q8_0", "llamacpp:q4_0", "llamacpp:q4_0/q8_0", "vllm:fp8_e4m3", "vllm:int4_per_token_head", "vllm-fa3:fp8_e4m3",
    "sglang:fp4_e2m1", "exl3:k4v2", "kivi2", "kivi4", "hf-quanto:int4", "K4V2",
    "int2+residual=8", "int4+window=5+sinks=2", "int4+pastonly", "int2-c4/int2+residual=8", "int4+skip=0",
    "int2-c4/int2-g32-asym+k_residual=8+v_window=9",  # KIVI's rule at a small scale
]
CALIBRATED_KV = ["int4+smooth", "qserve:kv4", "kvquant:4", "kvquant:3-1%", "vllm@0.27:fp8_e4m3+scales=calculate",
                 "vllm:fp8_e4m3+scales=amax448-head", "int4+sinks=auto"]
WEIGHT_SPECS = ["bf16", "int8", "int4-g32", "int4-g32-sym", "q4_0", "fp8", "fp8-wo", "fp8-static", "nvfp4", "nvfp4-wo", "mxfp4",
                "llm-int8", "int8+a=int8", "w8a8-int8", "gptq-int4-g32", "awq-int4-g32"]
KLD_FLOOR = -1e-6  # a mean KLD below this is a bug; above it and below 0 is float noise (a candidate close to the reference)
# Refusals that are wkvlab's stated limits, per tiny architecture: AWQ and SmoothQuant (w8a8-int8)
# need an architecture mapping (wkvlab.weights.support.ARCH_MODEL_TYPES), and on routed experts
# static or outlier-dependent activation scales are refused (one scale cannot serve every expert).
# Any other refusal is a failure.
_MOE_REFUSED = frozenset({"awq-int4-g32", "w8a8-int8", "fp8-static", "nvfp4", "llm-int8"})
EXPECTED_REFUSALS: dict[str, frozenset[str]] = {"phi3": frozenset({"awq-int4-g32", "w8a8-int8"}), "mixtral": _MOE_REFUSED,
                                                "qwen3-moe": _MOE_REFUSED}


class Checks:
    """Every check's outcome and what it measured; the run fails when any check did."""

    def __init__(self, budget: float | None = None) -> None:
        self.rows: list[dict] = []
        self.skipped: list[str] = []
        self.started, self.budget = time.perf_counter(), budget

    def within_budget(self, group: str) -> bool:
        """Whether ``group`` may start (``--budget``); if not, it is recorded as skipped."""
        if self.budget is None or time.perf_counter() - self.started < self.budget:
            return True
        self.skipped.append(group)
        return False

    def check(self, name: str, ok: bool, **measured) -> bool:
        self.rows.append({"check": name, "ok": bool(ok), **measured})
        return bool(ok)

    def guarded(self, name: str, fn, *args, **kwargs):
        """Run one group of checks; an exception is that group's failure (one line), not the script's end."""
        if not self.within_budget(name):
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every failure is reported, the rest still runs
            self.check(name, False, error=one_line(exc), where=_where(exc))
            return None

    @property
    def failed(self) -> list[str]:
        return [r["check"] for r in self.rows if not r["ok"]]


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _where(exc: BaseException) -> str:
    """The deepest frame in wkvlab (or this script) the exception came through: file:line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "wkvlab" in f.filename or "gpu_check" in f.filename]
    frame = frames[-1] if frames else traceback.extract_tb(exc.__traceback__)[-1]
    return f"{frame.filename.split('/src/')[-1].split('/benchmarks/')[-1]}:{frame.lineno}"


# -- tiny models -------------------------------------------------------------------------------

def _dims(**extra) -> dict:
    base = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                head_dim=64, vocab_size=VOCAB, max_position_embeddings=512)
    base.update(extra)
    return base


def _gemma3_text_config():
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(**_dims(sliding_window=16, layer_types=["sliding_attention", "full_attention"]))


def _build(name: str) -> torch.nn.Module:
    import transformers as t

    if name == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(**_dims()))
    if name == "qwen2":
        return t.Qwen2ForCausalLM(t.Qwen2Config(**_dims()))
    if name == "qwen3":
        return t.Qwen3ForCausalLM(t.Qwen3Config(**_dims()))
    if name == "mistral":
        return t.MistralForCausalLM(t.MistralConfig(**_dims(sliding_window=32)))
    if name == "gemma2":
        return t.Gemma2ForCausalLM(t.Gemma2Config(**_dims(sliding_window=16)))
    if name == "gemma3-text":
        return t.Gemma3ForCausalLM(_gemma3_text_config())
    if name == "phi3":
        dims = _dims()
        dims.pop("head_dim")  # Phi-3 derives it: 128 / 2 heads = 64
        return t.Phi3ForCausalLM(t.Phi3Config(**dims, pad_token_id=0))
    if name == "mixtral":
        return t.MixtralForCausalLM(t.MixtralConfig(**_dims(num_local_experts=4, num_experts_per_tok=2)))
    if name == "qwen3-moe":
        return t.Qwen3MoeForCausalLM(t.Qwen3MoeConfig(**_dims(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128)))
    if name == "gemma3-multimodal":
        vision = t.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      image_size=28, patch_size=14)
        cfg = t.Gemma3Config(text_config=_gemma3_text_config().to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                             image_token_index=VOCAB - 1, boi_token_index=VOCAB - 2, eoi_token_index=VOCAB - 3)
        return t.Gemma3ForConditionalGeneration(cfg)
    raise ValueError(f"no tiny model named {name!r}")


MODELS = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3-text", "phi3", "mixtral", "qwen3-moe", "gemma3-multimodal"]


def tiny_model(name: str, device: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """The same random weights on every device: built on the CPU from ``seed``, then moved."""
    torch.manual_seed(seed)
    return _build(name).eval().to(device=device, dtype=dtype)


def _windows(seed: int = 1):
    ids = torch.randint(0, VOCAB - 3, (CTX * WINDOWS + 8,), generator=torch.Generator().manual_seed(seed))
    return make_windows(ids, ctx=CTX, n_tokens=CTX * WINDOWS, bos_id=None)


def _calibration(samples: int = 4, length: int = 32) -> CalibrationSet:
    tokens = torch.randint(0, VOCAB - 3, (samples, length), generator=torch.Generator().manual_seed(3))
    return CalibrationSet(CalibrationSpec(samples=samples, length=length), tokens, "gpu-check")


def _grid(model, name: str, weights: list[str], kv: list[str], **options):
    return run_grid(model, _windows(), api.parse_weights(weights), api.parse_kv(kv), model_name=f"tiny-{name}", data_name="random",
                    # per device: a GPU run must build (GPTQ, AWQ) and calibrate on the GPU, not read back what the CPU run cached
                    fingerprints={"model_sha256": f"gpu-check-{name}-seed0-{next(model.parameters()).device.type}", "data_sha256": "random-1"},
                    options=RunOptions(chunk=CHUNK, **options), calibration=_calibration())


def _decoder_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The language model's decoder-layer parameters (a vision tower's layers excluded)."""
    import re

    return {n: p for n, p in model.named_parameters() if re.search(r"(^|\.)layers\.\d+\.", n) and "vision" not in n}


def quantized_fraction(model: torch.nn.Module, spec: str) -> dict:
    """Fraction of decoder-layer parameters (elements) that ``spec``'s build changed, and the 3-D
    (fused expert) tensors it left untouched."""
    before = {n: p.detach().clone() for n, p in _decoder_parameters(model).items()}
    built = quantize_model_weights(model, api.parse_weights([spec])[0], _calibration())
    after = _decoder_parameters(built.model)
    total = sum(p.numel() for p in before.values())
    changed = sum(p.numel() for n, p in before.items() if n in after and not torch.equal(p, after[n].detach().to(p.device)))
    untouched = sorted(n for n, p in before.items() if p.dim() == 3 and n in after and torch.equal(p, after[n].detach().to(p.device)))
    reported = getattr(built, "quantized_fraction", None)
    return {"fraction": changed / total if total else 0.0, "untouched_3d": untouched[:4], "n_untouched_3d": len(untouched),
            "reported": reported, "notes": list(built.notes)[:3]}


# -- (a) formats on the device vs the CPU ------------------------------------------------------

ROTATED = ("exl3_", "int4_pth")


def format_checks(checks: Checks, device: str) -> None:
    from wkvlab.weights.rtn import quantize_weight

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2, 64, 64, generator=g)
    x[0, 0, 3, 5] = 40.0  # an outlier channel
    for name in [*KV_FORMATS, "exl3_2", "exl3_4", "exl3_8", "int2-c4", "int4-g32", "int8-g64-asym"]:
        fmt = get_kv_format(name)
        if fmt.is_identity:
            continue
        checks.guarded(f"a: kv format {name}", _compare, checks, f"a: kv format {name}", fmt.quantize, x, device, name.startswith(ROTATED))
    w = torch.randn(96, 128, generator=g) * 0.02
    for text in ["int8", "int4-g32", "int4-g32-sym", "int4", "int3-g64", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "fp8", "nvfp4",
                 "mxfp4", "bf16", "fp16"]:
        spec = api.parse_weights([text])[0]
        checks.guarded(f"a: weight format {text}", _compare, checks, f"a: weight format {text}", lambda t, s=spec: quantize_weight(t, s),
                       w, device, False)


def _compare(checks: Checks, name: str, fn, x: torch.Tensor, device: str, rotated: bool) -> None:
    cpu = fn(x)
    dev = fn(x.to(device)).cpu()
    differ = float((cpu != dev).float().mean())
    ok = differ == 0.0 or (rotated and differ <= ROTATED_MISMATCH)
    checks.check(name, ok, bit_exact=differ == 0.0, mismatched_fraction=differ, max_abs_diff=float((cpu - dev).abs().max()),
                 allowed="bit-exact" + (f" or ≤{ROTATED_MISMATCH:.0%} mismatched (rotation)" if rotated else ""))


# -- (b) ten architectures through the runner --------------------------------------------------

def model_checks(checks: Checks, name: str, device: str, kv: list[str], weights: list[str], cpu_reference: dict | None) -> dict:
    """(b) for one architecture on ``device``; returns the KLDs by config (the CPU's, on a CPU run)."""
    model = tiny_model(name, device)
    tag = f"b: {name}" if device == "cpu" else f"b: {name} on {device}"
    tokens = _windows().tokens[0]
    whole = forward_logits(model, tokens)
    step = WindowPass(model)
    chunked = torch.cat([step.step(tokens[lo:hi]) for lo, hi in chunk_bounds(CTX, CHUNK)])
    diff = float((whole - chunked).abs().max())
    checks.check(f"{tag}: chunked logits == whole", diff <= CHUNKED_ATOL[torch.float32], max_abs_diff=diff, atol=CHUNKED_ATOL[torch.float32])

    identity = _grid(model, name, ["none"], ["fp16"], plan="copies")[0]
    checks.check(f"{tag}: identity KLD exactly 0", identity.kld["max"] == 0.0 and identity.kld["mean"] == 0.0, kld_max=identity.kld["max"])

    klds: dict[str, float] = {}
    largest: dict[str, float] = {}  # each config's largest per-token KLD
    started = time.perf_counter()
    for result in checks.guarded(f"{tag}: every KV spec runs", _grid, model, name, ["none"], kv) or []:
        klds[f"kv {result.kv}"], largest[f"kv {result.kv}"] = result.kld["mean"], result.kld["max"]
    refused, crashed = {}, {}
    for r in _weight_results(model, name, weights, refused, crashed):
        klds[f"weights {r.weights}"], largest[f"weights {r.weights}"] = r.kld["mean"], r.kld["max"]
    unexpected = {w: why for w, why in refused.items() if w not in EXPECTED_REFUSALS.get(name, ())}
    checks.check(f"{tag}: every weight method runs (or is refused where wkvlab states it cannot)", not crashed and not unexpected,
                 crashed=crashed, refused_unexpectedly=unexpected, refused_as_stated=sorted(set(refused) - set(unexpected)))
    ok, measured = _klds_above_zero(klds, largest, len(kv) + len(weights) - len(refused) - len(crashed))
    checks.check(f"{tag}: {len(klds)} KV/weight configs give a finite KLD above 0", ok, **measured, seconds=round(time.perf_counter() - started, 2))
    if cpu_reference is not None:
        off = {k: (v, cpu_reference[k]) for k, v in klds.items() if k in cpu_reference
               and abs(v - cpu_reference[k]) > KLD_RTOL * abs(cpu_reference[k]) + KLD_ATOL}
        checks.check(f"{tag}: device KLD == CPU float32 KLD", not off, rtol=KLD_RTOL, atol=KLD_ATOL,
                     differing={k: [float(a), float(b)] for k, (a, b) in list(off.items())[:6]})

    checks.guarded(f"{tag}: calibrated KV specs twice", _calibrated_twice, checks, tag, model, name)
    if device == "cpu" or cpu_reference is not None:  # once per device: the bf16 float32-logit path
        checks.guarded(f"{tag}: bfloat16", bf16_checks, checks, tag, name, device, kv)
    found = checks.guarded(f"{tag}: int4-g32 quantizes the decoder", quantized_fraction, model, "int4-g32")
    if found is not None:
        checks.check(f"{tag}: int4-g32 quantizes the decoder", found["fraction"] >= MIN_QUANTIZED, minimum=MIN_QUANTIZED, **found)
    return klds


def _klds_above_zero(klds: dict[str, float], largest: dict[str, float], expected: int) -> tuple[bool, dict]:
    """Every config measured, each mean KLD finite and not below ``KLD_FLOOR``, and some token's KLD
    above 0: a quantizer that never ran leaves every token's distribution as it was (all exactly 0).
    The mean alone can round to just below 0 where a spec changes little (kivi4 on the tiny Mistral:
    its 32-key window sees mostly KIVI's 128 full-precision keys; mean −2.9e-9, largest 4.6e-7)."""
    bad = sorted(k for k, v in klds.items() if not math.isfinite(v) or v < KLD_FLOOR or not largest.get(k, 0.0) > 0.0)
    return not bad and len(klds) == expected, {"configs": len(klds), "expected": expected, "not_above_zero": bad,
                                               "smallest": min(klds.items(), key=lambda kv: kv[1]) if klds else None}


def bf16_checks(checks: Checks, tag: str, name: str, device: str, kv: list[str]) -> None:
    """(b) in bfloat16: the decoder in bf16, the final norm and head in float32 (wkvlab.eval.logits)."""
    model = tiny_model(name, device, torch.bfloat16)
    tokens = _windows().tokens[0]
    whole = forward_logits(model, tokens)
    step = WindowPass(model)
    chunked = torch.cat([step.step(tokens[lo:hi]) for lo, hi in chunk_bounds(CTX, CHUNK)])
    diff = float((whole - chunked).abs().max())
    atol = CHUNKED_ATOL[torch.bfloat16]
    checks.check(f"{tag}: bfloat16: logits are float32, chunked == whole", whole.dtype == torch.float32 and diff <= atol,
                 dtype=str(whole.dtype), max_abs_diff=diff, atol=atol)
    identity = _grid(model, f"{name}-bf16", ["none"], ["fp16"], plan="copies")[0]
    checks.check(f"{tag}: bfloat16: identity KLD exactly 0", identity.kld["max"] == 0.0, kld_max=identity.kld["max"])
    results = _grid(model, f"{name}-bf16", ["none"], kv)
    ok, measured = _klds_above_zero({f"kv {r.kv}": r.kld["mean"] for r in results}, {f"kv {r.kv}": r.kld["max"] for r in results}, len(kv))
    checks.check(f"{tag}: bfloat16: {len(results)} KV configs give a finite KLD above 0", ok, **measured)


MAPPED_METHODS = ("awq", "smoothquant")  # need an architecture mapping: refused on the architectures without one


def _weight_results(model, name: str, weights: list[str], refused: dict, crashed: dict) -> list:
    """The weight configs' results, the whole list in one grid when it runs; else the configs that
    need an architecture mapping one at a time (a refusal of one must not hide the others)."""
    try:
        return _grid(model, name, weights, ["fp16"])
    except Exception:  # noqa: BLE001 - split below, and every failure recorded
        pass
    mapped = [w for w in weights if api.parse_weights([w])[0].method in MAPPED_METHODS]
    rest = [w for w in weights if w not in mapped]
    groups = [rest] + [[w] for w in mapped]
    results = []
    while groups:
        group = groups.pop(0)
        try:
            results += _grid(model, name, group, ["fp16"])
        except ConfigError as exc:  # a one-line refusal (architecture not mapped): recorded, not a crash
            if len(group) > 1:
                groups += [[w] for w in group]
            else:
                refused[group[0]] = one_line(exc)
        except Exception as exc:  # noqa: BLE001
            if len(group) > 1:
                groups += [[w] for w in group]
            else:
                crashed[group[0]] = f"{one_line(exc)} at {_where(exc)}"
    return results


@contextlib.contextmanager
def fresh_cache(prefix: str):
    """WKVLAB_CACHE pointed at a new empty folder while the block runs, then put back as it was: the check runs
    in-process in the tests too, where a changed environment would follow every later test."""
    previous = os.environ.get("WKVLAB_CACHE")
    os.environ["WKVLAB_CACHE"] = folder = tempfile.mkdtemp(prefix=prefix)
    try:
        yield folder
    finally:
        if previous is None:
            os.environ.pop("WKVLAB_CACHE", None)
        else:
            os.environ["WKVLAB_CACHE"] = previous


def _calibrated_twice(checks: Checks, tag: str, model, name: str) -> None:
    """Against a cache directory of this model's own: the first run calibrates and writes the
    statistics, the second reads them back (CPU tensors from safetensors) — on a GPU the crash #23
    found — and writes nothing (files counted in this folder only, not over every model's)."""
    with fresh_cache(f"wkvlab-gpu-check-{name}-") as folder:
        first = [r.kld["mean"] for r in _grid(model, name, ["none"], CALIBRATED_KV)]
        written = sorted(str(p) for p in Path(folder).rglob("*.safetensors"))
        again = [r.kld["mean"] for r in _grid(model, name, ["none"], CALIBRATED_KV)]
        after = sorted(str(p) for p in Path(folder).rglob("*.safetensors"))
    checks.check(f"{tag}: calibrated KV specs twice", first == again and bool(written) and after == written, specs=CALIBRATED_KV,
                 first=first, second=again, cache_files_first=len(written), cache_files_second=len(after))


# -- (m) the meta audit (CPU) -------------------------------------------------------------------

def _meta_grid(model, chunk: int, plan: str):
    """One window, nvfp4 weights (a calibrated activation scale per linear) and two KV configs, on
    the audit; returns it."""
    from tests.fake_device import fake_accelerator

    windows = make_windows(torch.arange(CTX + 8) % (VOCAB - 3), ctx=CTX, n_tokens=CTX, bos_id=None)
    with fake_accelerator() as audit:
        run_grid(model, windows, api.parse_weights(["nvfp4"]), api.parse_kv(["int2+residual=8", "q4_0"]), model_name="meta", data_name="random",
                 fingerprints={"model_sha256": f"gpu-check-meta-{plan}", "data_sha256": "random"},
                 options=RunOptions(chunk=chunk, plan=plan, interleave=2), calibration=_calibration())
    return audit


def meta_audit(checks: Checks, plans: tuple[str, ...] = ("copies", "one-model")) -> None:
    """(m): the grid on ``meta`` (a GPU stood in for) and split over CPU + meta (two devices, as
    accelerate places them); a cross-device op raises there. Syncs per chunk: the same window in
    chunks of CHUNK and CHUNK / 2 (twice as many chunks) must make exactly as many syncs."""
    from tests.fake_device import on_meta, split_model

    def llama():
        return tiny_model("llama", "cpu")

    for plan in plans:
        _meta_grid(on_meta(llama()), CHUNK, plan)  # builds nvfp4 into the weight cache: both runs below read it back
        coarse, fine = (_meta_grid(on_meta(llama()), chunk, plan) for chunk in (CHUNK, CHUNK // 2))
        extra = len(chunk_bounds(CTX, CHUNK // 2)) - len(chunk_bounds(CTX, CHUNK))
        checks.check(f"m: meta audit, {plan} plan: no host sync per chunk", fine.syncs == coarse.syncs, syncs=coarse.syncs,
                     syncs_with_more_chunks=fine.syncs, extra_chunks=extra, per_chunk=(fine.syncs - coarse.syncs) / extra,
                     sites=dict(fine.sync_sites - coarse.sync_sites))
    split = _meta_grid(split_model(llama(), {1}, head_on_meta=True), CHUNK, "one-model")
    checks.check("m: meta audit, model split over CPU + meta: no op mixes devices", split.ops > 0, ops=split.ops)


def meta_build_audit(checks: Checks, cases: tuple[str, ...] = ("llama-gptq", "llama-awq", "mixtral-gptq")) -> None:
    """(m): GPTQ and AWQ built in place on a ``meta`` model of Llama-3-70B's and Mixtral-8x7B's widths
    inside the counting audit (``benchmarks/build_memory.py``'s quick cases: what CUDA's
    ``max_memory_allocated`` would report): the peak within ±15% of the estimate's build phase, and
    no layer's build peak above the first's (+1%): a second Hessian kept, inputs kept for every layer
    or a statistic outliving its layer shows here without a GPU."""
    from benchmarks import build_memory

    for case in cases:
        got = build_memory.quick_case(case)
        layers = got["layer_build_peaks_gib"]
        checks.check(f"m: meta build audit, {case}: peak within ±{build_memory.MARGIN:.0%} of the estimate, flat per layer",
                     abs(got["ratio"] - 1) <= build_memory.MARGIN and bool(layers) and max(layers) <= 1.01 * layers[0], **got)


# -- forward calls per chunk (CPU and GPU) -----------------------------------------------------

def forward_calls(checks: Checks, model: torch.nn.Module, name: str, kv: list[str], ctx: int, chunk: int) -> dict:
    """The copies plan runs the reference and each candidate once per chunk: 1 + configs calls."""
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    ids = torch.randint(0, model.config.get_text_config().vocab_size, (ctx + 8,), generator=torch.Generator().manual_seed(5))
    windows = make_windows(ids, ctx=ctx, n_tokens=ctx, bos_id=None)
    try:
        started = time.perf_counter()
        run_grid(model, windows, api.parse_weights(["none"]), api.parse_kv(kv), model_name=name, data_name="random",
                 options=RunOptions(chunk=chunk, plan="copies"))
        seconds = time.perf_counter() - started
    finally:
        handle.remove()
    chunks = len(chunk_bounds(ctx, chunk))
    per_chunk = len(calls) / chunks
    checks.check(f"forward calls per chunk ({name})", per_chunk == 1 + len(kv), per_chunk=per_chunk, expected=1 + len(kv), chunks=chunks)
    return {"seconds": seconds, "chunks": chunks}


# -- (c) GPU only: 8B- and 70B-shaped models ---------------------------------------------------

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 vocab_size=128256, max_position_embeddings=32768, rope_theta=500000.0)
LLAMA3_70B_SLICE = dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=4, num_attention_heads=64, num_key_value_heads=8,
                        vocab_size=1024, max_position_embeddings=8192, rope_theta=500000.0)


def _random_llama(shape: dict, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """A Llama with ``shape``'s dimensions and random weights, built on ``device`` directly in ``dtype``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(LlamaConfig(**shape))
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def _config_folder(shape: dict) -> str:
    """A folder holding only the config.json of ``shape``: what the preflight estimate reads."""
    from transformers import LlamaConfig

    folder = tempfile.mkdtemp(prefix="wkvlab-gpu-check-config-")
    LlamaConfig(**shape).save_pretrained(folder)
    return folder


def _peaks(device: str) -> tuple[int, int] | None:
    """Torch's peak allocated and peak reserved bytes since :func:`_reset_peak` (None off CUDA). The
    reserved peak is what the device had to give: allocated plus the allocator's cached, fragmented
    blocks (kept small by expandable segments, wkvlab.runtime)."""
    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


def _gib(value: int | None) -> float | None:
    return round(value / 2**30, 2) if value is not None else None


def _peaks_within(peaks: tuple[int, int] | None, estimate: int, margin: float) -> tuple[bool, dict]:
    """Both peaks — allocated and reserved — within ±``margin`` of ``estimate``, and what was measured."""
    allocated, reserved = peaks if peaks is not None else (None, None)
    ok = peaks is not None and all(abs(value - estimate) <= margin * estimate for value in peaks)
    return ok, {"measured_gib": _gib(allocated), "reserved_gib": _gib(reserved)}


def _reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _timed_pass(model, tokens: torch.Tensor, spec: str | None, chunk: int, device: str) -> float:
    from wkvlab.kv import KVSpec
    from wkvlab.kv.hook import layer_stores

    kv = KVSpec.parse(spec) if spec else None
    window = WindowPass(model, kv, layer_stores(model, kv)) if kv else WindowPass(model)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    for lo, hi in chunk_bounds(len(tokens), chunk):
        torch.log_softmax(window.step(tokens[lo:hi]), dim=-1)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started


def _allocatable(estimate_bytes: int) -> int:
    """The part of an estimate torch's allocator can see: ``max_memory_allocated`` and
    ``max_memory_reserved`` count no CUDA context, which the estimate's fixed runtime allowance is for."""
    from wkvlab.eval.memory import RUNTIME_BYTES

    return estimate_bytes - RUNTIME_BYTES


def big_model_checks(checks: Checks, device: str, shape: dict = LLAMA3_8B, ctx: int = 32768, grid_ctx: int = 8192,
                     candidate: str = "q4_0", slice_shape: dict = LLAMA3_70B_SLICE, samples: int = 128, length: int = 512) -> dict:
    """(c): one 32k window, its time and peak against the estimate, forward calls, a 3×4 grid's
    peak, then GPTQ/AWQ on a 70B-shaped slice. On the CPU (the test's small shapes) the same code
    runs; only CUDA measures peaks, so the memory checks there say ``measured_gib: null`` and fail."""
    out: dict = {}
    where = "cuda" if device.startswith("cuda") else "cpu"
    config = _config_folder(shape)  # the estimate reads the same config.json a user's folder has
    model = _random_llama(shape, device, torch.bfloat16)
    tokens = torch.randint(0, shape["vocab_size"], (ctx,), generator=torch.Generator().manual_seed(7)).to(device)
    chunk = RunOptions().chunk_for(model, ctx, [])
    _timed_pass(model, tokens[: 2 * chunk], None, chunk, device)  # warm-up: kernels, allocator
    _timed_pass(model, tokens[: 2 * chunk], candidate, chunk, device)
    reference = min(_timed_pass(model, tokens, None, chunk, device) for _ in range(2))
    cand = min(_timed_pass(model, tokens, candidate, chunk, device) for _ in range(2))
    checks.check(f"c: {candidate} / reference time, one {ctx}-token window", cand / reference <= MAX_SLOWDOWN,
                 reference_s=round(reference, 3), candidate_s=round(cand, 3), ratio=round(cand / reference, 3), maximum=MAX_SLOWDOWN,
                 chunk=chunk)
    ids = torch.randint(0, shape["vocab_size"], (ctx + 8,), generator=torch.Generator().manual_seed(8))
    for label, c, weights, kv in [("one window", ctx, ["none"], ["fp16", candidate]),
                                  ("3x4 grid", grid_ctx, ["none", "int8", "int4-g128"], ["fp16", "q8_0", "q4_0", "int4+residual=128"])]:
        windows = make_windows(ids[: c + 8], ctx=c, n_tokens=c, bos_id=None)
        estimate = api.memory_estimate(config, api.parse_weights(weights), api.parse_kv(kv), ctx=c, tokens=c, dtype="bfloat16",
                                       device=where, plan="auto" if label == "one window" else "one-model")
        plan = estimate.chosen
        _reset_peak(device)
        started = time.perf_counter()
        run_grid(model, windows, api.parse_weights(weights), api.parse_kv(kv), model_name="llama-shaped", data_name="random",
                 options=RunOptions(plan=plan.plan, interleave=plan.interleave))
        ok, measured = _peaks_within(_peaks(device), _allocatable(plan.device_bytes), MEMORY_MARGIN)
        checks.check(f"c: {label} peak memory (allocated and reserved) within ±{MEMORY_MARGIN:.0%} of the estimate", ok,
                     plan=plan.label(), estimate_gib=_gib(plan.device_bytes), allocatable_gib=_gib(_allocatable(plan.device_bytes)),
                     **measured, seconds=round(time.perf_counter() - started, 1))
    out["forward_calls"] = forward_calls(checks, model, "llama-shaped", ["fp16", candidate], 4 * chunk, chunk)
    del model
    _reset_peak(device)
    out["calibrated_build"] = layer_build_checks(checks, device, slice_shape, samples, length)
    return out


def layer_build_checks(checks: Checks, device: str, shape: dict = LLAMA3_70B_SLICE, samples: int = 128, length: int = 512) -> dict:
    """GPTQ and AWQ on a 70B-shaped slice (AutoAWQ's 128 × 512 calibration): seconds per decoder
    layer and the build's peak against the preflight estimate's build phase (within ±BUILD_MARGIN)."""
    out = {}
    config = _config_folder(shape)
    where = "cuda" if device.startswith("cuda") else "cpu"
    calibration = CalibrationSet(CalibrationSpec(samples=samples, length=length),
                                 torch.randint(0, shape["vocab_size"], (samples, length), generator=torch.Generator().manual_seed(9)), "random")
    for spec in ("gptq-int4-g128", "awq-int4-g128"):
        estimate = api.memory_estimate(config, api.parse_weights([spec]), api.parse_kv(["fp16"]), ctx=length, tokens=length, dtype="bfloat16",
                                       device=where, calibration=calibration.spec, plan="one-model")
        build_bytes = _allocatable(sum(p.bytes for p in estimate.chosen.build_parts if p.where == "device"))
        model = _random_llama(shape, device, torch.bfloat16)
        _reset_peak(device)
        started = time.perf_counter()
        quantize_model_weights(model, api.parse_weights([spec])[0], calibration, in_place=True)
        seconds = time.perf_counter() - started
        ok, peaks = _peaks_within(_peaks(device), build_bytes, BUILD_MARGIN)
        measured = {"seconds_per_layer": round(seconds / shape["num_hidden_layers"], 2), "layers": shape["num_hidden_layers"],
                    "peak_gib": peaks["measured_gib"], "reserved_gib": peaks["reserved_gib"], "estimate_gib": _gib(build_bytes)}
        checks.check(f"c: {spec} build on a 70B-shaped slice (allocated and reserved) within its estimate (±{BUILD_MARGIN:.0%})", ok, **measured)
        out[spec] = measured
        del model
        _reset_peak(device)
    return out


# -- main ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cpu", action="store_true", help="only the CPU-possible parts, even with a GPU")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--skip-8b", action="store_true", help="skip (c) (the 8B/70B-shaped models)")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="start no group of checks after this many seconds (what did not run is listed; exit 2)")
    args = parser.parse_args(argv)
    with fresh_cache("wkvlab-gpu-check-"):  # a fresh cache: calibrated specs read back what they wrote
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    gpu = not args.cpu and args.device.startswith("cuda") and torch.cuda.is_available()
    device = args.device if gpu else "cpu"
    use_expandable_segments(device)  # as a run on that GPU has it, before anything below starts CUDA
    checks = Checks(args.budget)
    report: dict = {"device": device, "cuda": gpu, "torch": torch.__version__,
                    "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"),
                    "gpu_name": torch.cuda.get_device_name(0) if gpu else None,
                    "tolerances": {"rotated_mismatch": ROTATED_MISMATCH, "chunked_atol_float32": CHUNKED_ATOL[torch.float32],
                                   "kld_rtol": KLD_RTOL, "kld_atol": KLD_ATOL, "min_quantized": MIN_QUANTIZED,
                                   "max_slowdown": MAX_SLOWDOWN, "memory_margin": MEMORY_MARGIN,
                                   "build_margin": BUILD_MARGIN}}
    if gpu and checks.within_budget("a: formats"):
        format_checks(checks, device)
    checks.guarded("m: meta audit", meta_audit, checks)
    checks.guarded("m: meta build audit", meta_build_audit, checks)
    models = [m for m in args.models.split(",") if m]
    report["models"] = {}
    kv, weights = KV_SPECS, WEIGHT_SPECS
    for name in models:
        if not checks.within_budget(f"b: {name}"):
            continue
        cpu_klds = checks.guarded(f"b: {name}", model_checks, checks, name, "cpu", kv, weights, None) if gpu else None
        t0 = time.perf_counter()
        checks.guarded(f"b: {name}", model_checks, checks, name, device, kv, weights, cpu_klds)
        report["models"][name] = {"seconds": round(time.perf_counter() - t0, 2)}
    report["kv_specs"], report["weight_specs"] = kv, weights
    checks.guarded("forward calls per chunk (tiny llama)", forward_calls, checks, tiny_model("llama", device), "tiny-llama", ["fp16", "q4_0", "int4"],
                   CTX, 16)
    if gpu and not args.skip_8b:
        report["llama_3_8b_shaped"] = checks.guarded("c: Llama-3-8B-shaped", big_model_checks, checks, device)
    report["checks"] = checks.rows
    report["failed"] = checks.failed
    report["skipped"] = checks.skipped
    report["budget_s"] = args.budget
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=1, default=str))
    if not gpu:
        print(f"gpu_check: ran the CPU-possible parts on the CPU in {report['seconds']} s; (a) formats on the device, the CPU-vs-device KLDs and (c) "
              "the 8B/70B-shaped time and memory checks need a CUDA GPU (run it there: python benchmarks/gpu_check.py)", file=sys.stderr)
    if checks.skipped:
        print(f"gpu_check: --budget {args.budget:g} s left {len(checks.skipped)} group(s) unrun: {', '.join(checks.skipped)}", file=sys.stderr)
    return 1 if checks.failed else 2 if checks.skipped else 0


if __name__ == "__main__":
    sys.exit(main())
