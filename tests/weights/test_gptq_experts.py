"""GPTQ of MoE experts batched through one column loop (issue #40, "Speed on a GPU"): the experts
of one layer that share a shape and spec are quantized together, bit-identical to one expert at a
time, and the Python column loop (and its kernel launches) runs once per batch instead of once
per expert."""
from unittest import mock

import pytest
import torch

from tests.fake_device import fake_accelerator
from tests.models.tiny_folders import VOCAB, tiny_gpt_oss, tiny_mixtral, tiny_qwen3_moe
from wkvlab.weights import CalibrationSet, CalibrationSpec, WeightSpec, quantize_model_weights
from wkvlab.weights import gptq
from wkvlab.weights.apply import all_experts
from wkvlab.weights.gptq import affine_quantizer, gptq_quantize
from wkvlab.weights.gptq_batch import EXPERT_BATCH_BYTES, experts_per_batch, gptq_working_bytes

SPECS = ["gptq-int4-g32", "gptq-int4-g32+grid-from=original", "gptq-int4-g32;actorder", "gptq-int4-g32;actorder+grid-from=original",
         "gptq-int8"]


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def _calibration(samples=8, length=32) -> CalibrationSet:
    g = torch.Generator().manual_seed(1)
    return CalibrationSet(CalibrationSpec("prose", samples, length), torch.randint(0, VOCAB, (samples, length), generator=g), "test")


def _hessians(experts: int, columns: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(experts, 200, columns, generator=g) * torch.linspace(0.2, 3, columns)
    x[0, :, 3:7] = 0  # dead inputs of one expert (its Hessian's diagonal is zero there)
    x[-1] = 0  # an expert whose every input is zero: its Hessian is all zero, GPTQ zeroes it
    return 2 * x.transpose(1, 2) @ x / 200


@pytest.mark.parametrize("text", SPECS)
def test_batched_experts_are_bit_identical_to_one_expert_at_a_time(text):
    spec = WeightSpec.parse(text)
    qparams, fake = affine_quantizer(spec)
    w = torch.randn(5, 24, 160, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    h = _hessians(5, 160)
    kw = dict(group_size=spec.group_size, block_size=64, act_order=spec.act_order, grid=spec.grid_from)
    one_by_one = [gptq_quantize(w[e], h[e], qparams, fake, **kw) for e in range(5)]
    batched = gptq_quantize(w, h.clone(), qparams, fake, consume=True, **kw)
    for e, q in enumerate(one_by_one):
        assert torch.equal(batched[e], q), (text, e)
    assert torch.equal(one_by_one[-1], torch.zeros_like(one_by_one[-1]))  # the all-zero Hessian: every input dead, as alone
    assert torch.equal(one_by_one[0][:, 3:7], torch.zeros(24, 4, dtype=torch.bfloat16))
    assert not torch.equal(one_by_one[1], one_by_one[2])  # the experts are not copies of each other


def _build(make, text, per_batch):
    model = make()
    calls = []
    real = gptq_quantize

    def counted(weight, *args, **kwargs):
        calls.append(weight.shape[0] if weight.dim() == 3 else 0)
        return real(weight, *args, **kwargs)

    with mock.patch.object(gptq, "experts_per_batch", per_batch), mock.patch.object(gptq, "gptq_quantize", counted):
        quantize_model_weights(model, WeightSpec.parse(text), _calibration(), in_place=True)
    return dict(all_experts(model)), calls


@pytest.mark.parametrize("make", [tiny_mixtral, tiny_qwen3_moe, tiny_gpt_oss])  # gpt-oss: transposed, biased experts
@pytest.mark.parametrize("text", ["gptq-int4-g32", "gptq-int4-g32;actorder+grid-from=original"])
def test_a_moe_build_batched_equals_the_build_one_expert_at_a_time(make, text):
    batched, batch_calls = _build(make, text, experts_per_batch)
    single, single_calls = _build(make, text, lambda *args: 1)
    # tiny experts fit the budget: per layer one call for every gate/up and one for every down
    # (4 experts each), against one call per expert
    assert [c for c in batch_calls if c] == [4] * 4 and [c for c in single_calls if c] == [1] * 16, (batch_calls, single_calls)
    for name, matrix in single.items():
        assert torch.equal(batched[name].get(), matrix.get()), name


def test_batches_are_bounded_by_the_budget():
    one = gptq_working_bytes(2048, 1536, 2, stacked=True)  # a Qwen3-30B-A3B expert's gate/up in bfloat16
    assert one == 2 * 2048 * 1536 + 3 * 2048 * 2048 * 4 + 2048 * 1536 * 4
    assert experts_per_batch(2048, 1536, 128, 2) == EXPERT_BATCH_BYTES // one == 31
    assert experts_per_batch(2048, 1536, 128, 2, budget=one - 1) == 1  # too large alone: one at a time, never none
    assert experts_per_batch(768, 2048, 8, 2) == 8  # never more than there are


def test_the_column_loop_launches_once_per_batch_not_per_expert():
    """Counted on the meta device: a batch of 6 experts launches as many kernels as one expert."""
    spec = WeightSpec.parse("gptq-int4-g32;actorder+grid-from=original")
    qparams, fake = affine_quantizer(spec)
    kw = dict(group_size=32, block_size=32, act_order=True, grid="original")

    def launches(experts: int) -> int:
        w = torch.empty(experts, 16, 96, device="meta", dtype=torch.bfloat16)
        h = torch.empty(experts, 96, 96, device="meta")
        with fake_accelerator() as audit:
            gptq_quantize(w, h, qparams, fake, **kw)
        return audit.ops

    one, six = launches(1), launches(6)
    assert one > 96 * 5  # the column loop dominates: several kernels per column
    assert six <= one + 10, (one, six)  # a handful more for the per-expert grid lookup, not 6×
