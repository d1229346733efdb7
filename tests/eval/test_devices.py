"""The grid runner on a "GPU" (``meta`` under an audit that fails any op mixing devices) and on a
model split between two devices as accelerate's ``device_map`` places it (CPU + meta)."""
import pytest
import torch

from tests.conftest import tiny_llama
from tests.fake_device import fake_accelerator, on_meta, split_model
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
