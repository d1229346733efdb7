"""hf-quanto against optimum-quanto itself, in the fast tier (optimum-quanto 0.2.7 is pinned in the
``test`` extra; it installs beside torch 2.13 and transformers 5.24 without changing them).

The kernel: optimum-quanto's ``MaxOptimizer`` + ``quantize_weight`` + ``dequantize`` with axis 0 and
groups of 64 — what transformers 5.24's ``QuantoQuantizedLayer._quantize`` calls — against the
``int<b>-g64-asym`` format the ``hf-quanto:`` presets store, on random, outlier-heavy and boundary
caches. The cache: transformers' ``QuantizedCache(backend="quanto")`` decoding a one-token prompt on
one KV head of 64 (Falcon-7B's shape), where quanto stores the prompt through its single-group path.
The longer replay (prompt 13, residual 8, 40 tokens) stays in tests/kv/test_quantized_cache_replay.py (slow)."""
from __future__ import annotations

import pytest
import torch

quanto = pytest.importorskip("optimum.quanto", reason="optimum-quanto is in the test extra: pip install -e '.[test]'")

from tests.kv._replay_common import decode, tiny_model_and_tokens  # noqa: E402
from wkvlab.kv import KVSpec, get_kv_format  # noqa: E402
from wkvlab.kv.hook import kv_quantization  # noqa: E402


def quanto_cache_roundtrip(x: torch.Tensor, bits: int) -> torch.Tensor:
    """What QuantoQuantizedLayer stores for ``x`` and returns on read (transformers 5.24 cache_utils.py)."""
    qtype = quanto.qint4 if bits == 4 else quanto.qint2
    scale, shift = quanto.MaxOptimizer()(x, qtype, 0, 64)
    return quanto.quantize_weight(x, qtype, 0, scale, shift, 64).dequantize()


def caches() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    normal = torch.randn(1, 2, 9, 64, generator=g) * torch.rand(1, 2, 1, 64, generator=g) * 3
    outliers = torch.randn(1, 2, 9, 64, generator=g)
    outliers[..., 5] *= 80  # one channel far above the rest
    boundary = torch.randn(1, 2, 6, 64, generator=g)
    boundary[0, 0, 0] = 1.5  # a constant group: scale 0 (quanto: round(0/0) -> code 0, value 0*0 + min = x)
    boundary[0, 0, 1] = 0.0  # a zero group
    boundary[0, 1, 0] = torch.arange(64) % 16 * 0.25  # exact 4-bit grid, min 0, scale 0.25: codes exact
    boundary[0, 1, 1] = (torch.arange(64) % 16 * 0.25).flip(0)
    boundary[0, 1, 1, 3:7] = torch.tensor([13, 5, 17, 15]) * 0.125  # ties on the 4-bit grid: 6.5, 2.5, 8.5, 7.5 steps (half to even)
    boundary[0, 1, 2] = torch.randn(64, generator=g) * 1e-30  # tiny groups
    boundary[0, 1, 3] = torch.randn(64, generator=g) * 1e4  # large groups (within fp16's range)
    return {"normal": normal, "outliers": outliers, "boundary": boundary}


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("name", ["normal", "outliers", "boundary"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kernel_bit_exact_with_quanto(bits, name, dtype):
    # the hf-quanto presets' format (quanto<b>) computes in the cache's dtype, as quanto does
    x = caches()[name].to(dtype)
    ref = quanto_cache_roundtrip(x, bits)
    got = KVSpec.parse(f"hf-quanto:int{bits}").k_format.quantize(x)
    assert ref.dtype == got.dtype == dtype
    assert torch.equal(got, ref), f"{int((got != ref).sum())} of {got.numel()} values differ"
    if dtype == torch.float32:  # in float32, wkvlab's plain int<b>-g64-asym is the same computation
        assert torch.equal(get_kv_format(f"int{bits}-g64-asym").quantize(x), ref)


@pytest.mark.parametrize("nbits", [4, 2])
def test_one_token_prompt_on_one_kv_head_of_64(nbits):
    # one KV head of 64, a one-token prompt: the prompt tensor [1, 1, 1, 64] is one group, which
    # optimum-quanto stores exactly (AffineOptimizer: base.shape[0] == 1 -> axis None -> scale 0,
    # shift -x); the hf-quanto preset must leave it unquantized until the first flush at 1 + 8
    prompt, residual = 1, 8
    model, ids = tiny_model_and_tokens(prompt, 12)
    with torch.no_grad():
        engine = decode(model, ids, prompt, __import__("transformers").QuantizedCache(
            backend="quanto", config=model.config, nbits=nbits, q_group_size=64, residual_length=residual))
        ref = model(ids).logits[0]
        with kv_quantization(model, KVSpec.parse(f"hf-quanto:int{nbits}+residual={residual}+prefill={prompt}")):
            sim = model(ids).logits[0]
        # the same formats and flushes without quanto's single-group rule (a plain spec names no engine)
        with kv_quantization(model, KVSpec.parse(f"int{nbits}-g64-asym+residual={residual}+prefill={prompt}")):
            plain = model(ids).logits[0]
    diff = lambda a, b: float((a - b).abs().max())  # noqa: E731
    assert diff(ref, engine) > 1e-2  # the cache does change the logits after the first flush
    assert diff(sim, engine) < 1e-5
    assert diff(plain, engine) > 100 * max(diff(sim, engine), 1e-7)
