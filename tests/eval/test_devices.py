"""The grid runner on a "GPU" (``meta`` under an audit that fails any op mixing devices) and on a
model split between two devices as accelerate's ``device_map`` places it (CPU + meta)."""
import pytest
import torch

from tests.conftest import tiny_llama
from tests.fake_device import META, fake_accelerator, on_meta, split_model
from wkvlab.data.windows import make_windows
from wkvlab.eval.runner import RunOptions, run_grid
from wkvlab.kv import KVSpec
from wkvlab.weights.calibration import CalibrationSet, CalibrationSpec
from wkvlab.weights.spec import WeightSpec

PLACEMENTS = {
    "one device": lambda: on_meta(tiny_llama()),
    # embedding and layer 0 on one device, layer 1, the final norm and lm_head on the other: the
    # logits come from another device than the input ids
    "split, head on the second device": lambda: split_model(tiny_llama(), {1}, head_on_meta=True),
    "split, head on the first device": lambda: split_model(tiny_llama(), {1}),
}


def _grid(model, plan, tmp_path, weights=("none", "int4-g32"), kv=("int2+residual=8", "qserve:kv4")):
    torch.manual_seed(0)
    windows = make_windows(torch.randint(0, 128, (106,)), ctx=48, n_tokens=96, bos_id=None)
    calibration = CalibrationSet(CalibrationSpec(), torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1)), "c")
    reference = tmp_path / f"{plan}.safetensors" if plan == "stored" else None
    options = RunOptions(chunk=16, plan="copies" if plan == "copies" else "one-model", interleave=2, reference=reference)
    return run_grid(model, windows, [WeightSpec.parse(w) for w in weights], [KVSpec.parse(k) for k in kv], model_name="tiny",
                    data_name="random", fingerprints={"model_sha256": f"devices-{plan}", "data_sha256": "d"}, options=options,
                    calibration=calibration)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("plan", ["copies", "one-model", "stored"])
def test_every_plan_keeps_each_tensor_on_its_device(placement, plan, tmp_path):
    """The reference's record is moved to where the logits are (lm_head's device), calibration
    statistics to each layer's device, caches and metrics stay where they are made."""
    with fake_accelerator() as audit:
        results = _grid(PLACEMENTS[placement](), plan, tmp_path)
    assert len(results) == 4 and audit.ops > 1000


def _audited(plan: str, chunk: int, tmp_path):
    """The audit of a grid on one "device", with a weight config that quantizes every linear's input
    (nvfp4: a calibrated global scale per linear) and a residual and a plain KV cache."""
    torch.manual_seed(0)
    windows = make_windows(torch.randint(0, 128, (106,)), ctx=48, n_tokens=48, bos_id=None)
    calibration = CalibrationSet(CalibrationSpec(), torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1)), "c")
    options = RunOptions(chunk=chunk, plan="copies" if plan == "copies" else "one-model", interleave=2,
                         reference=None)
    model = on_meta(tiny_llama())
    with fake_accelerator() as audit:
        run_grid(model, windows, [WeightSpec.parse("nvfp4")], [KVSpec.parse("int2+residual=8"), KVSpec.parse("q4_0")],
                 model_name="tiny", data_name="random", fingerprints={"model_sha256": "syncs", "data_sha256": "d"}, options=options,
                 calibration=calibration)
    return audit


@pytest.mark.parametrize("plan", ["copies", "one-model"])
def test_no_chunk_makes_the_host_wait_for_the_device(plan, tmp_path):
    """Budget: zero syncs per chunk (``.item()``, boolean masks, host<->device copies), for every
    candidate and for the reference's pass, live (copies) or recorded (one-model; a stored file is
    read back through the same comparison). The same window in chunks of 8 instead of 16 runs 3 more chunks (3 passes each): any
    per-chunk sync shows up as a difference; per-window read-backs and per-build work are the same
    in both. Before the fix: 96 more syncs in the copies plan, 32 per chunk (nvfp4's global scale
    copied per linear per forward: 2 caches × 14 linears; the ids per pass: 3; the targets: 1), and
    144 in the one-model plan, 48 per chunk (also the recorder's 11 read-backs and the stored rows'
    boolean masks)."""
    _audited(plan, 16, tmp_path)  # builds nvfp4 into the weight cache: both runs below read it back
    coarse, fine = _audited(plan, 16, tmp_path), _audited(plan, 8, tmp_path)
    assert fine.syncs == coarse.syncs, dict(fine.sync_sites - coarse.sync_sites)


def test_the_audit_counts_each_kind_of_sync():
    x = torch.ones(4, 8).to(META)
    with fake_accelerator() as audit:
        x.sum().item()
        x[x[:, 0] > 0]
        x.cpu()
        torch.ones(3).to(META)
        torch.tensor([1.0, 2.0], device=META)
        x[torch.arange(2, device=META)], x[1:3], torch.full((), 2.0, device=META) * x  # none of these waits
    assert dict(audit.sync_kinds) == {"item": 1, "boolean mask": 1, "device to host": 1, "host to device": 2}
