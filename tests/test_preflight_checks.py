"""Preflight checks of issue #42 that the fuzz table cannot vary: torch's build, a GGUF's tensor
extents, the note a run prints when the text is shorter than --tokens."""
from __future__ import annotations

import pytest

from wkvlab import preflight
from wkvlab.errors import ConfigError, DataError
from wkvlab.plan.gguf import check_gguf_file


def _gguf(path, rows=64):
    np = pytest.importorskip("numpy")
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("a", np.zeros((rows, 32), dtype=np.float32))
    writer.add_tensor("b", np.zeros((16,), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_integrity_counts_tensor_bytes_and_names_the_file(tmp_path):
    path = tmp_path / "ok.gguf"
    _gguf(path)
    assert check_gguf_file(path) == 64 * 32 * 4 + 16 * 2
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-8])  # the last 8 bytes of "b", the last tensor
    with pytest.raises(ConfigError, match=rf"cut.gguf is truncated: tensor b ends at byte {len(data):,} and the file has {len(data) - 8:,} bytes"):
        check_gguf_file(tmp_path / "cut.gguf")
    (tmp_path / "head.gguf").write_bytes(data[:40])
    with pytest.raises(ConfigError, match=r"head.gguf: the GGUF header ends early"):
        check_gguf_file(tmp_path / "head.gguf")


def test_cuda_refusal_without_importing_torch(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(preflight, "_torch_gpu_build", lambda: False)
    with pytest.raises(ConfigError, match=r"--device cuda:1: this torch build has no CUDA \(a CPU-only build\); use --device cpu"):
        preflight.check_device("cuda:1")
    assert preflight.resolved_device("auto") == "cpu"
    preflight.check_device("cpu")
    with pytest.raises(ConfigError, match="unknown --device 'gpu'"):
        preflight.check_device("gpu")
    monkeypatch.setattr(preflight, "_torch_gpu_build", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert preflight.cuda_refusal() == "CUDA_VISIBLE_DEVICES='-1' hides every GPU"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(preflight.sys, "platform", "darwin")  # no /dev rule off Linux: only torch can say
    assert preflight.cuda_refusal() is None and preflight.resolved_device("auto") is None


def test_torch_build_is_read_from_its_version_file():
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch not installed")
    import torch

    assert preflight._torch_gpu_build() is (torch.version.cuda is not None or torch.version.hip is not None)


def test_text_shortfall_says_what_runs():
    assert preflight.text_shortfall(8192, 1024, 8) is None
    assert preflight.text_shortfall(200_000, 1024, 109) == ("the text holds 109 window(s) of 1024 tokens, not the 195 that --tokens 200,000 "
                                                            "asks for: evaluating 111,616 tokens")


def test_calibration_text_refusals_name_calib(tmp_path):
    with pytest.raises(DataError, match=r"^--calib file not found: .*nope.txt; use --calib prose, code, math"):
        preflight.check_calibration(str(tmp_path / "nope.txt"))
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(DataError, match=r"^--calib: .*empty.txt holds no text"):
        preflight.check_calibration(str(tmp_path / "empty.txt"))
    preflight.check_calibration("code")
    preflight.check_calibration("default")  # any text --data names is calibration text too


def test_a_gguf_the_converter_rejects_is_named_by_its_file_not_its_folder(tmp_path):
    # the header checks pass a file the converter then fails on (an architecture added to the list by name only):
    # the one line names the file and what to do, not "<folder> could not be loaded" (issue 42)
    import torch

    from wkvlab.errors import ModelError
    from wkvlab.models.loading import _from_pretrained

    (tmp_path / "m.gguf").write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ModelError, match=rf"^{tmp_path}/m.gguf could not be loaded .*pass the model's Hugging Face folder$"):
        _from_pretrained(tmp_path, torch.float32, gguf_file="m.gguf")
