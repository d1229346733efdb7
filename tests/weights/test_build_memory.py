"""Calibrated builds at the floor, and an estimate that says so (issue #40): GPTQ and AWQ built in
place on a ``meta`` model inside the counting audit (tests/meta_memory.py, what CUDA's
``max_memory_allocated`` would report) peak within ±15% of the estimate's build phase.

The fast tier runs the issue's widths with a small vocabulary and 8 × 512 calibration; the slow
tier runs the issue's shapes (a 4-layer Llama-3-70B slice, one Mixtral-8x7B layer, 128 × 512
calibration), as ``benchmarks/build_memory.py`` prints them."""
import pytest
import torch

from tests.meta_memory import MemoryAudit

MARGIN = 0.15
# The issue's widths with a small vocabulary and few calibration samples: what a build adds is most
# of the peak, and on meta (no values, ~1 ms per op) a case takes seconds. AWQ runs 2 layers (the
# next layer's inputs are held), 4 scale candidates and no clipping search (its buffers are smaller
# than the scale search's; the slow tier runs the full preset).
FAST = dict(vocab_size=1024, max_position_embeddings=1024)
CASES = {"llama-gptq": ("llama-70b-slice", 1, "gptq-int4-g128"), "llama-awq": ("llama-70b-slice", 2, "awq-int4-g128;grid=4;noclip"),
         "mixtral-gptq": ("mixtral-8x7b-layer", 1, "gptq-int4-g128")}


@pytest.fixture(scope="module")
def bench():
    from benchmarks import build_memory  # the repository root is on the path (tests.meta_memory imports from it too)

    return build_memory


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def test_the_audit_counts_live_storages_once_and_frees_them():
    with MemoryAudit(slack=0) as audit:
        a = torch.empty(1024, 256, device="meta")  # 1 MiB
        view = a[:512]
        b = a + 1  # 2 MiB alive
        del b
        c = torch.empty(100, device="meta")  # rounded up to one 512-byte block
        assert audit.live() == (1 << 20) + 512
        del a, view, c
        assert audit.live() == 0
    assert audit.peak == 2 << 20


@pytest.mark.parametrize("case", CASES)
def test_build_peak_is_within_15_percent_of_the_estimate(bench, case):
    shape, layers, spec = CASES[case]
    got = bench.emulate_build({**bench.SHAPES[shape], **FAST, "num_hidden_layers": layers}, spec, samples=8, length=512)
    assert abs(got["ratio"] - 1) <= MARGIN, got
    assert got["build_peak_gib"] >= 0.4 * got["peak_gib"]  # the build's own part is much of the peak: the ratio tests it


def test_a_planted_extra_hessian_breaks_the_bound(bench, monkeypatch):
    """The check can fail: one more Hessian kept per input group (what a linear keeping its own
    Hessian did) puts the emulated GPTQ build past +15% of the estimate."""
    from wkvlab.weights import gptq

    real, kept = gptq.hessian_of, []

    def keeping_a_copy(layer, hidden, kwargs, module):
        hessian = real(layer, hidden, kwargs, module)
        kept.append(hessian.clone())
        return hessian

    monkeypatch.setattr(gptq, "hessian_of", keeping_a_copy)
    shape, layers, spec = CASES["llama-gptq"]
    got = bench.emulate_build({**bench.SHAPES[shape], **FAST, "num_hidden_layers": layers}, spec, samples=8, length=512)
    assert got["ratio"] > 1 + MARGIN, got


@pytest.mark.slow
@pytest.mark.parametrize("case", ["llama-70b-slice:gptq-int4-g128", "llama-70b-slice:awq-int4-g128", "mixtral-8x7b-layer:gptq-int4-g128"])
def test_the_issues_shapes_peak_within_15_percent_of_the_estimate(bench, case):
    shape, spec = case.split(":")
    got = bench.emulate_build({"num_hidden_layers": 4, **bench.SHAPES[shape]}, spec, samples=128, length=512)
    assert abs(got["ratio"] - 1) <= MARGIN, got
