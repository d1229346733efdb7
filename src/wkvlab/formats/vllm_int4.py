"""vLLM's ``int4_per_token_head`` KV cache: a randomized Hadamard transform, then asymmetric INT4.

Read in vllm-project/vllm @a7f284a2e24b86c171ef714c5ff492acf0baee6d (the write path is the same at
@055e47c28003156421365af985d676fc921cb075), ``vllm/v1/attention/ops/int4_per_token_head.py``:

* ``reshape_and_cache_int4`` first applies ``single_rht``: ``H · (D₁ ⊙ x)`` with the unnormalized
  Sylvester Hadamard ``H`` over the whole head (head_dim a power of two) and ±1 signs ``D₁`` drawn by
  ``torch.bernoulli(torch.full((d,), 0.5), generator=Generator().manual_seed(0x9E3779B9))``;
* ``_reshape_cache_int4_kernel``, per (token, head): ``scale = max((max − min) / 15, 1e-6)``,
  zero point ``zp = clamp(round(−min / scale), 0, 15)``, codes ``clamp(round(y / scale + zp), 0, 15)``
  with ``(v ± 0.5).to(int32)`` (half away from zero, after a float32 addition), two codes per byte; the float32
  scale's four low mantissa bits are overwritten with ``zp`` ("zero-point steganography"), so the
  attention kernel dequantizes with the scale truncated to ``bits & ~0xF``: ``(q − zp) · scale'``;
* attention rotates Q the same way, divides the softmax scale by head_dim and un-rotates the
  output (``unified_attention_int4``) — equivalent to storing ``D₁ · H · ŷ / d``, which is what this
  function returns (orthonormal rotation, so scores and outputs are the engine's).

Storage per (token, head): head_dim / 2 bytes + one float32 (scale and zero point), as
``KVQuantMode.INT4_PER_TOKEN_HEAD`` allocates. Re-read at @055e47c2 for issue #25: the RHT is still
applied (``reshape_and_cache_int4`` → ``single_rht``). Re-read again at
@1882959479bb377c897b99315dd829ae3314ff63, where the mode moved to
``vllm/v1/attention/ops/triton_quant_kv/int4_per_token_head.py``: the same ``single_rht`` (signs seeded
``0x9E3779B9 + round_idx · 0x517CC1B7``, round 0), the same ``_reshape_cache_int4_kernel`` lines and
zero point in the scale's low bits, the same Q rotation and ``softmax_scale / head_size`` on read.
``single_rht(key.float())`` casts its result back to the model dtype before the INT4 kernel: a 16-bit
input's rotated values are rounded to that dtype here too, then quantized in float32 as the kernel
does (on random bf16 heads of 128 this moves 1.3% of the codes against float32 rotated values; a float32
run is unchanged). Not modelled: on CUDA sm80+ the transform itself runs through hadacore in bf16
("fp32 → bf16 round-trip; precision loss is irrelevant before INT4 quantization"), whose summation
order was not read; here the rotation is one float32 matrix product.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from wkvlab.errors import ConfigError
from wkvlab.formats._checks import check_float_tensor, device_constant
from wkvlab.formats.hadamard import hadamard_matrix
from wkvlab.formats.sizes import vllm_int4_bytes_per_vector  # noqa: F401 - sizes live torch-free

_RHT_SEED = 0x9E3779B9  # round 0 of vLLM's _get_rht_signs


@functools.lru_cache(maxsize=8)
def rht_signs(d: int) -> Tensor:
    """vLLM's deterministic ±1 signs for head_dim ``d`` (float32, CPU)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(_RHT_SEED)
    return 2.0 * torch.bernoulli(torch.full((d,), 0.5), generator=generator) - 1.0


def _kernel_round(v: Tensor) -> Tensor:
    """The kernel's ``where(v >= 0, (v + 0.5).to(int32), (v - 0.5).to(int32))``, literally (the
    float32 addition can carry v just below k + 0.5 up to k + 1, and that is what vLLM stores)."""
    return torch.where(v >= 0, torch.trunc(v + 0.5), torch.trunc(v - 0.5))


def _truncated_scale(scale: Tensor) -> Tensor:
    """The float32 scale with its four low mantissa bits cleared (they carry the zero point)."""
    return (scale.contiguous().view(torch.int32) & -16).view(torch.float32)


def fake_quant_vllm_int4(x: Tensor) -> Tensor:
    """``x`` (``[..., D]``, D a power of two) as vLLM's int4_per_token_head cache returns it."""
    check_float_tensor(x)
    d = x.shape[-1]
    if d & (d - 1):
        raise ConfigError(f"vLLM's int4_per_token_head rotates the whole head with a Hadamard transform; head_dim {d} is not a power of two")
    # on x's device, made once per device (they were CPU tensors: a crash on CUDA)
    signs = device_constant(("vllm_rht_signs", d), x.device, lambda device: rht_signs(d).to(device))
    h = device_constant(("hadamard_pm1", d), x.device, lambda device: (hadamard_matrix(d) * d**0.5).to(torch.float32).to(device))  # entries ±1
    y = (x.float() * signs) @ h
    if x.dtype in (torch.float16, torch.bfloat16):  # single_rht(key.float()).to(key.dtype): the kernel reads 16-bit values
        y = y.to(x.dtype).float()
    lo, hi = torch.aminmax(y, dim=-1, keepdim=True)
    scale = torch.clamp((hi - lo) / 15.0, min=1e-6)
    zp = _kernel_round(-lo / scale).clamp_(0, 15)
    q = _kernel_round(y * (1.0 / scale) + zp).clamp_(0, 15)
    y_hat = (q - zp) * _truncated_scale(scale)
    return ((y_hat @ h) * signs / d).to(x.dtype)


