"""wkvlab's ``gptq-...+grid-from=original`` against llm-compressor's own GPTQ (its observer and
``quantize_weight``, llmcompressor 0.14.0.1), run in llm-compressor's venv — it pins an older
transformers, so it never enters the project's (benchmarks/peer_quantizers.py creates it)."""
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.weights.test_checkpoint_files import _venv_python
from tests.weights.test_gptq import _correlated_inputs
from wkvlab.weights import WeightSpec, gptq_quantize
from wkvlab.weights.capture import accumulate_hessian
from wkvlab.weights.gptq import affine_quantizer

SIDE = Path(__file__).with_name("_llmcompressor_gptq_side.py")


def _llmcompressor(tmp_path, w, h, group: int, actorder: str) -> torch.Tensor:
    from safetensors.torch import load_file, save_file

    python = _venv_python()
    if python is None:
        pytest.skip("llm-compressor's venv is not there (python benchmarks/peer_quantizers.py creates it)")
    save_file({"weight": w.contiguous(), "hessian": h.contiguous()}, str(tmp_path / "in.safetensors"))
    done = subprocess.run([str(python), str(SIDE), str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors"),
                           str(group), "0", actorder], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "LLMCOMPRESSOR_DISABLE_GPTQ_TRITON": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return load_file(str(tmp_path / "out.safetensors"))["quantized"]


@pytest.mark.slow
@pytest.mark.parametrize("group,actorder", [(64, "none"), (128, "none"), (64, "static"), (32, "weight")])
def test_original_grid_is_llmcompressors_gptq(tmp_path, group, actorder):
    g = torch.Generator().manual_seed(group)
    w, x = torch.randn(48, 256, generator=g), _correlated_inputs(512, 256, seed=group)
    w[:5, :3] *= 20  # outliers that set some groups' range
    x[:, 11] = 0  # a dead input: the observer saw its weights, GPTQ zeroes them
    h, _ = accumulate_hessian(torch.zeros(256, 256), 0, x)
    spec = WeightSpec.parse(f"gptq-int4-g{group}+grid-from=original" + ("" if actorder == "none" else "+actorder"))
    qparams, fake = affine_quantizer(spec)
    ours = gptq_quantize(w, h, qparams, fake, group_size=group, act_order=spec.act_order, grid=spec.grid_from)
    theirs = _llmcompressor(tmp_path, w, h, group, actorder)
    assert torch.equal(ours, theirs)
    ist = gptq_quantize(w, h, qparams, fake, group_size=group, act_order=spec.act_order)
    assert (ist != theirs).float().mean() > 0.2  # IST-DASLab's rule is a different GPTQ
