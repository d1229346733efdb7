"""llm-compressor's own GPTQ on one matrix; runs inside llm-compressor's venv (no wkvlab there).

Reads ``weight`` [rows, cols] and ``hessian`` [cols, cols] from a safetensors file and writes
``quantized`` the way ``GPTQModifier.compress_module_list`` (llmcompressor 0.14.0.1,
modifiers/gptq/base.py) makes it: the weight observer (``initialize_observer``'s default for
weights, ``memoryless_minmax``) watches the original weight, its ``get_qparams()`` are handed to
``modifiers/gptq/gptq_quantize.py quantize_weight`` with the scheme's QuantizationArgs.

    python _llmcompressor_gptq_side.py IN.safetensors OUT.safetensors GROUP SYMMETRIC ACTORDER
"""
import sys

import torch
from compressed_tensors.quantization import QuantizationArgs
from safetensors.torch import load_file, save_file

from llmcompressor.modifiers.gptq.gptq_quantize import quantize_weight
from llmcompressor.observers import Observer


def main() -> None:
    source, target, group, symmetric, actorder = sys.argv[1:6]
    tensors = load_file(source)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric == "1", strategy="group",
                            group_size=int(group), actorder=None if actorder == "none" else actorder)
    observer = Observer.load_from_registry("memoryless_minmax", base_name="weight", args=args)
    observer(tensors["weight"])
    qparams = observer.get_qparams()
    quantized, _, fallback = quantize_weight(tensors["weight"][None], tensors["hessian"][None], qparams["scale"][None],
                                             qparams["zero_point"][None], None, args, blocksize=128, percdamp=0.01)
    assert not bool(fallback.any()), "llm-compressor fell back to round-to-nearest"
    save_file({"quantized": quantized[0].contiguous(), "scale": qparams["scale"].float().contiguous(),
               "zero_point": qparams["zero_point"].float().contiguous()}, target)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
