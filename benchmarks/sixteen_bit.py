"""What 16-bit arithmetic changes in three caches that wkvlab quantizes in float32.

    python benchmarks/sixteen_bit.py

On one random K-like tensor ``[1, 8, 512, 128]`` (standard normal times a per-channel factor in
[0.1, 3.1], seed 0), each engine's quantizer run in the 16-bit dtype it computes in, against the same
quantizer in float32 on the same 16-bit input:

* optimum-quanto (the installed package, transformers' QuantizedCache backend): ``MaxOptimizer`` +
  ``quantize_weight`` + ``dequantize`` on a bf16 tensor (quanto computes scale, shift and codes in
  bf16) against wkvlab's ``int<b>-g64-asym`` (float32, rounded once to bf16);
* KIVI (jy-yuan/KIVI@876b4d2d quant/new_pack.py ``triton_quantize_and_pack_along_last_dim`` and its
  unpack: ``scale = (mx - mn) / (2^b - 1)``, ``(x - mn) / scale``, ``clamp``, ``round``, ``q * scale + mn``)
  evaluated with torch in fp16/bf16 against float32; keys per channel over 32 tokens, values per token;
* vLLM int4_per_token_head: the codes of float32 rotated values against those of the rotated values
  rounded to bf16 (``single_rht(key.float()).to(key.dtype)``, modelled since this measurement).

Prints JSON: shares of values / codes that differ, and of values off by half a quantization step or more.
"""
from __future__ import annotations

import json

import torch


def _data() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, 8, 512, 128, generator=g) * (torch.rand(1, 8, 1, 128, generator=g) * 3 + 0.1)


def quanto(x32: torch.Tensor) -> dict:
    from optimum.quanto import MaxOptimizer, qint2, qint4, quantize_weight

    from wkvlab.kv import get_kv_format

    out = {}
    x = x32.to(torch.bfloat16)
    groups = x.float().reshape(-1, 64)
    for bits, qtype in ((4, qint4), (2, qint2)):
        scale, shift = MaxOptimizer()(x, qtype, 0, 64)
        engine = quantize_weight(x, qtype, 0, scale, shift, 64).dequantize().float()
        ours = get_kv_format(f"int{bits}-g64-asym").quantize(x).float()
        step = ((groups.amax(-1) - groups.amin(-1)) / (2**bits - 1)).repeat_interleave(64).reshape(x.shape)
        diff = (engine - ours).abs()
        out[f"int{bits}"] = {"values_differ": round(float((diff != 0).float().mean()), 4),
                             "half_step_or_more": round(float((diff >= 0.5 * step).float().mean()), 4)}
    return out


def _kivi(x: torch.Tensor, bits: int, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    xt = x.transpose(-1, -2) if per_channel else x
    grouped = xt.reshape(*xt.shape[:-1], -1, 32)
    mn, mx = grouped.amin(-1, keepdim=True), grouped.amax(-1, keepdim=True)
    scale = (mx - mn) / (2**bits - 1)
    q = ((grouped - mn) / scale).clamp(0, 2**bits - 1).round()
    values = (q * scale + mn).reshape(xt.shape)
    return (values.transpose(-1, -2) if per_channel else values), q


def kivi(x32: torch.Tensor) -> dict:
    out = {}
    for dtype in (torch.float16, torch.bfloat16):
        x = x32.to(dtype)
        for bits in (2, 4):
            for side, per_channel in (("keys_per_channel", True), ("values_per_token", False)):
                v16, q16 = _kivi(x, bits, per_channel)
                v32, q32 = _kivi(x.float(), bits, per_channel)
                out[f"{str(dtype).split('.')[1]}_int{bits}_{side}"] = {
                    "codes_differ": round(float((q16.float() != q32).float().mean()), 4),
                    "values_differ": round(float((v16.float() != v32.to(dtype).float()).float().mean()), 4)}
    return out


def vllm_int4(x32: torch.Tensor) -> dict:
    from wkvlab.formats.hadamard import hadamard_matrix
    from wkvlab.formats.vllm_int4 import _kernel_round, rht_signs

    x = x32.to(torch.bfloat16)
    d = x.shape[-1]
    y = (x.float() * rht_signs(d)) @ (hadamard_matrix(d) * d**0.5).float()

    def codes(v: torch.Tensor) -> torch.Tensor:
        lo, hi = torch.aminmax(v, dim=-1, keepdim=True)
        scale = torch.clamp((hi - lo) / 15.0, min=1e-6)
        zp = _kernel_round(-lo / scale).clamp_(0, 15)
        return _kernel_round(v * (1.0 / scale) + zp).clamp_(0, 15)

    return {"bf16_codes_differ": round(float((codes(y) != codes(y.to(torch.bfloat16).float())).float().mean()), 4)}


def main() -> None:
    x = _data()
    print(json.dumps({"shape": list(x.shape), "quanto_bf16": quanto(x), "kivi": kivi(x), "vllm_int4": vllm_int4(x)}, indent=1))


if __name__ == "__main__":
    main()
