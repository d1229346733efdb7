"""profile's and search's memory estimates (wkvlab.search.memory), printed before the model loads, and
the weight swap that holds no second copy of what it swaps (issue 40)."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.conftest import tiny_llama
from wkvlab.eval.memory import CPU_PROCESS_BYTES, LIVE_LOGITS, TOKENIZER_BYTES_PER_ENTRY
from wkvlab.plan.params import parameter_count
from wkvlab.plan.source import resolve_source
from wkvlab.search.memory import REFERENCE_CACHE_BYTES, profile_estimate, search_estimate
from wkvlab.weights.spec import WeightSpec


@pytest.fixture(scope="module")
def smollm2():
    return resolve_source("default")[0]  # the packaged GGUF's header: 576 hidden, 30 layers, 49,152 vocabulary


def _part(estimate, name):
    return sum(p.bytes for p in estimate.chosen.parts if p.name.startswith(name))


def test_profile_counts_the_reference_its_copy_and_the_swap_copy(smollm2):
    model = parameter_count(smollm2) * 4
    est = profile_estimate(smollm2, WeightSpec.parse("int4-g128"), ctx=128, tokens=256)
    scored = 2 * 127  # two windows of 128, every position but the last
    assert _part(est, "weights") == model and _part(est, "quantized copy") == model and _part(est, "weight-swap copy") == model
    assert _part(est, "reference log-probs") == scored * 49152 * 4
    assert _part(est, "logits") == LIVE_LOGITS["copies"] * 128 * 49152 * 4
    assert _part(est, "process") == CPU_PROCESS_BYTES and _part(est, "tokenizer") == 49152 * TOKENIZER_BYTES_PER_ENTRY
    assert est.one_line().startswith("memory: profile plan, about 2.2 GiB")
    # 16-bit weights: no copy, no swap; the profile's reference pass is the whole model
    plain = profile_estimate(smollm2, WeightSpec(), ctx=128, tokens=256)
    assert plain.chosen.device_bytes == est.chosen.device_bytes - 2 * model


def test_reference_log_probs_beyond_the_cap_are_not_kept(smollm2):
    ctx = 512
    tokens = ctx * (REFERENCE_CACHE_BYTES // (511 * 49152 * 4) + 1)  # one window more than the cap keeps
    est = profile_estimate(smollm2, WeightSpec(), ctx=ctx, tokens=tokens)
    assert _part(est, "reference log-probs") == 0


def test_search_is_its_largest_phase(smollm2):
    model = parameter_count(smollm2) * 4
    int4 = WeightSpec.parse("int4-g128")
    # the profile's swap phase (3 models) is the peak; the held-out phase (2 models and 8 windows' kept
    # log-probs, 8 × 255 × 49,152 × 4 B = 401 MB, less than a model's 538 MB) is below it
    est = search_estimate(smollm2, int4, ctx=256, profile_tokens=256, heldout_tokens=2048)
    assert est.chosen.device_bytes == profile_estimate(smollm2, int4, ctx=256, tokens=256).chosen.device_bytes
    # with --joint-weights the held-out phase keeps a third model and its log-probs: it is the peak
    joint = search_estimate(smollm2, int4, ctx=256, profile_tokens=256, heldout_tokens=2048, joint_weights=True)
    assert _part(joint, "copy with 16-bit layers") == model
    assert _part(joint, "reference log-probs") == 8 * 255 * 49152 * 4
    assert joint.chosen.device_bytes > est.chosen.device_bytes


class _Allocations(TorchDispatchMode):
    """Bytes of every tensor an op creates (in-place ops and views create none)."""

    VIEWS = {"detach", "alias", "view", "_unsafe_view", "t", "transpose", "expand", "select", "slice", "as_strided"}

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not name.endswith("_") and name not in self.VIEWS:
            for tensor in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(tensor, torch.Tensor):
                    self.bytes += tensor.numel() * tensor.element_size()
        return out


def test_weight_swap_copies_in_place_and_undoes_from_the_reference():
    """The swap writes the quantized tensors into its copy and undoes them from the reference's own
    tensors: it used to clone every swapped tensor first (every MLP weight held twice while the
    profile's "mlp" group was scored: +0.3 GiB at the peak of a SmolLM2 profile)."""
    from wkvlab.search.measure import WeightSwap
    from wkvlab.weights.apply import quantize_model_weights

    model = tiny_llama()
    qw = quantize_model_weights(model, WeightSpec.parse("int4-g32"))
    swap = WeightSwap(model, qw.model)
    before = {n: t.clone() for n, t in swap.model.state_dict().items()}
    mode = _Allocations()
    with mode:
        with swap.only(lambda n: ".mlp." in n) as swapped:
            inside = {n: t.clone() for n, t in swapped.state_dict().items() if ".mlp." in n}
            mode.bytes -= sum(t.numel() * t.element_size() for t in inside.values())  # the test's own clones
    assert mode.bytes == 0
    assert inside and all(torch.equal(t, qw.model.state_dict()[n]) for n, t in inside.items())
    assert all(torch.equal(t, before[n]) for n, t in swap.model.state_dict().items())


@pytest.mark.parametrize("command", ["profile", "search"])
def test_profile_and_search_print_the_estimate_before_loading(command, monkeypatch):
    from typer.testing import CliRunner

    from wkvlab.cli import app
    from wkvlab.search import api

    def no_load(*_args, **_kwargs):
        raise RuntimeError("the model would load here")

    monkeypatch.setattr(api, command, no_load)
    extra = ["--budget", "12000", "--profile-tokens", "128", "--heldout-tokens", "1024"] if command == "search" else ["--tokens", "128"]
    result = CliRunner().invoke(app, [command, "--model", "default", "--weights", "int4-g128", "--ctx", "128", *extra, "--threads", "1"])
    assert isinstance(result.exception, RuntimeError), result.output
    assert f"memory: {command} plan, about 2.1 GiB of " in result.output
