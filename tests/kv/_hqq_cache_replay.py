"""Run in a venv that has hqq (tests/kv/test_hqq_cache_replay.py builds it): transformers'
QuantizedCache(backend="hqq") driven as generate drives it — one prefill of the prompt, then one
token per step — against wkvlab's teacher-forced, chunked and streamed hf-hqq presets on the same
tiny model, and wkvlab's HQQ kernel against hqq's Quantizer on random caches. Prints a JSON line."""
from __future__ import annotations

import json
import sys

import torch
from hqq.core.quantize import Quantizer
from transformers import QuantizedCache

from wkvlab.formats.hqq import fake_quant_hqq
from tests.kv._replay_common import decode, tiny_model_and_tokens
from wkvlab.kv import KVSpec
from wkvlab.kv.hook import kv_quantization
from wkvlab.kv.requant import FlushChain


def _from_scratch(self, raw, point):
    """FlushChain._advance without the chain: each flush quantizes the full-precision keys anew."""
    self.state, self.point = self.quantize(raw[..., :point, :]).to(raw.dtype), point


def kernel_worst() -> float:
    """Largest |wkvlab - hqq| over bit widths, dtypes and cache lengths (axis 0, group 64)."""
    worst = 0.0
    gen = torch.Generator().manual_seed(2)
    for dtype in (torch.float32, torch.bfloat16):
        for nbits in (1, 2, 3, 4, 8):
            for tokens in (1, 13, 40):
                x = (torch.randn(1, 2, tokens, 64, generator=gen) * torch.rand(1, 2, 1, 64, generator=gen) * 3).to(dtype)
                q, meta = Quantizer.quantize(x.contiguous(), axis=0, device=x.device, compute_dtype=dtype, nbits=nbits, group_size=64)
                meta["compute_dtype"] = dtype  # as HQQQuantizedLayer._quantize does
                Quantizer.cuda(q, meta=meta, device=x.device)
                ref = Quantizer.dequantize(q, meta)
                worst = max(worst, float((ref.float() - fake_quant_hqq(x, nbits, 64).float()).abs().max()))
    return worst


def main(nbits: int, prompt: int, residual: int, steps: int) -> None:
    model, ids = tiny_model_and_tokens(prompt, steps)
    spec = KVSpec.parse(f"hf-hqq:int{nbits}+residual={residual}+prefill={prompt}")
    with torch.no_grad():
        engine = decode(model, ids, prompt, QuantizedCache(backend="hqq", config=model.config, nbits=nbits, q_group_size=64, residual_length=residual))
        ref = model(ids).logits[0]
        with kv_quantization(model, spec):
            sim = model(ids).logits[0]
        # quantize-once: each token quantized once, at the flush that first covers it (no re-quantization), as hf-quanto:* treat quanto
        with kv_quantization(model, KVSpec.parse(f"int{nbits}-g64-asym+residual={residual}+prefill={prompt}")):
            per_token = model(ids).logits[0]
        chained, FlushChain._advance = FlushChain._advance, _from_scratch
        try:
            with kv_quantization(model, spec):
                scratch = model(ids).logits[0]
        finally:
            FlushChain._advance = chained
    diff = lambda a, b: float((a - b).abs().max())  # noqa: E731
    print(json.dumps({"sim": diff(sim, engine), "per_token_groups": diff(per_token, engine), "no_chain": diff(scratch, engine), "quantized_effect": diff(ref, engine),
                      "prompt_vs_ref": diff(engine[:prompt], ref[:prompt]), "kernel": kernel_worst()}))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]))
