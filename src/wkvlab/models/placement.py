"""Where a model's weights go on the GPUs (``--device cuda``), decided before a weight is read.

accelerate's ``device_map="auto"`` balances a model over every visible GPU even when one holds it,
and puts what does not fit on the CPU or the disk without a word; an offloaded model copies every
offloaded layer to the GPU on each forward, so a grid that should take minutes takes hours. Here:

* ``auto`` (the default): the whole model on the first GPU whose free memory holds it; otherwise
  split over the visible GPUs in order (accelerate's sequential fill);
* ``balanced``: split evenly over the visible GPUs (accelerate's ``balanced``), even when one holds it;
* ``sequential``: fill GPU 0, then GPU 1, ... (accelerate's ``sequential``).

No choice offloads: when the GPUs together cannot hold the weights the run is refused in one line
that says how much is missing. ``--device cuda:N`` puts all of it on GPU N (refused the same way).
The plan needs only the model's shapes: it is computed on a ``meta`` copy built from the config.
Imports no torch at module level (the CLI checks ``--device-map`` before torch loads).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from wkvlab.errors import ConfigError, ModelError
from wkvlab.units import GIB

if TYPE_CHECKING:
    import torch

DEVICE_MAPS = ("auto", "balanced", "sequential")
# Of each GPU's free memory, the part weights may take: the rest is for activations, the KV cache
# and the float32 logits of a chunk (accelerate keeps the same 10% for its buffers).
WEIGHT_SHARE = 0.9


def check_device_map(device_map: str) -> str:
    key = device_map.strip().lower()
    if key not in DEVICE_MAPS:
        raise ConfigError(f"unknown --device-map {device_map!r}; use one of {', '.join(DEVICE_MAPS)}")
    return key


def gpu_budgets(device: str) -> dict[int, int]:
    """Bytes of weights each GPU the run may use can take: ``WEIGHT_SHARE`` of its free memory."""
    import torch

    indices = range(torch.cuda.device_count()) if device == "cuda" else [int(device.split(":")[1])]
    return {i: int(torch.cuda.mem_get_info(i)[0] * WEIGHT_SHARE) for i in indices}


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers (tied tensors once): what the GPUs must hold."""
    from accelerate.utils import compute_module_sizes

    return int(compute_module_sizes(model)[""])


def plan_device_map(model: torch.nn.Module, budgets: Mapping[int, int], mode: str = "auto", *, name: str = "the model") -> dict[str, int]:
    """A device map for ``model`` (real or on ``meta``) over the GPUs in ``budgets`` (index -> bytes
    its weights may take): ``{"": i}`` for one GPU, else module name -> GPU index. Never CPU or disk."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    mode = check_device_map(mode)
    size = weight_bytes(model)
    if mode == "auto" or len(budgets) == 1:
        holder = next((i for i, free in budgets.items() if size <= free), None)
        if holder is not None:
            return {"": holder}
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    memory = dict(budgets)
    if mode == "balanced" and len(budgets) > 1:  # its shares already include that headroom
        memory = get_balanced_memory(model, max_memory=memory, no_split_module_classes=no_split)
    else:  # accelerate keeps room for its largest block on the first GPU, where it would bring offloaded
        # layers back one at a time; nothing is offloaded here, so that room is the model's.
        first = next(iter(memory))
        memory[first] += _largest_block(model, no_split)
    mapping = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split) if size <= sum(budgets.values()) else {}
    if not mapping or any(not isinstance(d, int) for d in mapping.values()):
        gpus = ", ".join(f"cuda:{i} {free / GIB:.1f}" for i, free in budgets.items())
        raise ModelError(f"{name} needs {size / GIB:.1f} GiB of weights and the GPUs can take {sum(budgets.values()) / GIB:.1f} GiB "
                         f"({gpus}; {WEIGHT_SHARE:.0%} of what is free); wkvlab does not offload layers to the CPU or disk "
                         "(every forward would copy them back): free GPU memory, use --dtype bfloat16, or --device cpu")
    return mapping


def _largest_block(model: torch.nn.Module, no_split: list[str]) -> int:
    """Bytes of the largest block accelerate will not split (a decoder layer)."""
    from accelerate.utils import compute_module_sizes

    sizes = compute_module_sizes(model)
    return max((sizes[name] for name, module in model.named_modules() if type(module).__name__ in no_split), default=0)


def describe_device_map(mapping: Mapping[str, int | str]) -> str:
    """``cuda:0`` or ``cuda:0 (14 modules), cuda:1 (13 modules)``: what the run header says."""
    if set(mapping) == {""}:
        return f"cuda:{mapping['']}"
    counts: dict[int | str, int] = {}
    for device in mapping.values():
        counts[device] = counts.get(device, 0) + 1
    return ", ".join(f"cuda:{d} ({n} modules)" for d, n in counts.items())
