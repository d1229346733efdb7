"""GPU catalog and user extension files."""
from __future__ import annotations

import json

import pytest

from wkvlab.errors import ConfigError
from wkvlab.plan import find_gpu, load_gpu_catalog

REQUIRED = ["A100-40GB", "A100-80GB", "H100-80GB", "H200", "B200", "L4", "L40S", "RTX-3090",
            "RTX-4090", "RTX-5090"]


def test_required_gpus_and_fields():
    catalog = load_gpu_catalog()
    for name in REQUIRED:
        gpu = catalog[name]
        assert gpu.memory_bytes > 0 and gpu.bandwidth_gb_s > 0 and gpu.tflops["bf16"]
        assert set(gpu.tflops) == {"bf16", "fp16", "fp8", "int8", "fp4"}


@pytest.mark.parametrize("name,native", [
    ("A100-80GB", ("bf16", "fp16", "int8")), ("RTX-3090", ("bf16", "fp16", "int8")),
    ("H100", ("bf16", "fp16", "fp8", "int8")), ("RTX-4090", ("bf16", "fp16", "fp8", "int8")),
    ("B200", ("bf16", "fp16", "fp8", "int8", "fp4")), ("RTX-5090", ("bf16", "fp16", "fp8", "int8", "fp4")),
])
def test_native_formats(name, native):
    assert find_gpu(name).native_formats == native


def test_aliases():
    assert find_gpu("a100").name == "A100-80GB"
    assert find_gpu("A100 80GB").name == "A100-80GB"
    assert find_gpu("rtx 4090").name == "RTX-4090"
    assert find_gpu("A100-80GB").memory_bytes == 80 * 2**30


def test_gpu_file_adds_and_overrides(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n"
                    "  - {name: MI300X, sm: 90, memory_gb: 192, bandwidth_gb_s: 5300,\n"
                    "     tflops: {bf16: 1307, fp8: 2615, int8: 2615}}\n"
                    "  - {name: A100-80GB, sm: 80, memory_gib: 79, bandwidth_gb_s: 1935, tflops: {bf16: 312}}\n")
    catalog = load_gpu_catalog(path)
    assert catalog["MI300X"].memory_bytes == 192 * 10**9 and catalog["MI300X"].has_native("fp8")
    assert catalog["A100-80GB"].bandwidth_gb_s == 1935 and catalog["A100-80GB"].source.startswith("GPU file")
    assert find_gpu("mi300x", catalog).name == "MI300X"
    js = tmp_path / "gpus.json"
    js.write_text(json.dumps({"gpus": [{"name": "Tiny", "sm": 75, "memory_mib": 8192,
                                        "bandwidth_gb_s": 300, "tflops": {"fp16": 65}}]}))
    tiny = load_gpu_catalog(js)["Tiny"]
    assert tiny.tflops["bf16"] == 65  # fp16 stands in for bf16 where only fp16 is given


@pytest.mark.parametrize("text", [
    "gpus: [{name: X}]",
    "gpus: [{name: X, sm: 80, memory_gb: 10, bandwidth_gb_s: 100, tflops: {bf16: 1, tf32: 2}}]",
    "gpus: [{name: X, sm: 80, memory_gb: ten, bandwidth_gb_s: 100, tflops: {bf16: 1}}]",
    "not_gpus: []",
    "gpus: [{name: X, sm: 80, memory_gb: 10, bandwidth_gb_s: 100, tflops: {}}]",
    "gpus: [ {",
])
def test_bad_gpu_files(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_gpu_catalog(path)


def test_unknown_gpu_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="unknown GPU"):
        find_gpu("V100")
    with pytest.raises(ConfigError, match="does not exist"):
        load_gpu_catalog(tmp_path / "nope.yaml")
