"""The llm-compressor half of benchmarks/peer_quantizers.py; runs inside llm-compressor's own venv.

It imports nothing from wkvlab (that venv has llm-compressor's older transformers, not the
project's): it reads a Hugging Face model folder and a JSON file of calibration token ids written
by the project side, runs llm-compressor's ``oneshot`` with GPTQ or AWQ at W4A16 (integer weights,
16-bit activations) and writes a compressed-tensors folder plus ``timing.json`` holding the wall
time of ``oneshot`` alone (model loading and saving excluded, as on the project side).

    python llmcompressor_side.py --model-dir M --calib-tokens calib.json --method gptq \
        --group-size 64 --symmetric --actorder none --threads 1 --out OUT
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _scheme(group_size: int, symmetric: bool, actorder: str | None):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    weights = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy="group", group_size=group_size,
                               actorder=actorder)
    return {"group_0": QuantizationScheme(targets=["Linear"], weights=weights)}


def _recipe(method: str, group_size: int, symmetric: bool, actorder: str | None):
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    groups = _scheme(group_size, symmetric, actorder if method == "gptq" else None)
    if method == "gptq":
        # dampening 0.01 and blocks of 128 are GPTQModifier's defaults, stated so a reader sees them
        return [GPTQModifier(config_groups=groups, ignore=["lm_head"], dampening_frac=0.01, block_size=128, actorder=actorder)]
    from llmcompressor.modifiers.transform.awq import AWQModifier

    return [AWQModifier(duo_scaling=True, n_grid=20), QuantizationModifier(config_groups=groups, ignore=["lm_head"])]


def _dump_fake_quant(model, path: Path) -> None:
    import torch
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from safetensors.torch import save_file

    out = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None or scheme.weights is None or not hasattr(module, "weight_scale"):
                continue
            # compressed-tensors 0.19's fake_quantize takes no g_idx: valid for the column-ordered groups this script makes
            out[f"{name}.weight"] = fake_quantize(module.weight, module.weight_scale, getattr(module, "weight_zero_point", None),
                                                  scheme.weights).float().contiguous()
    save_file(out, str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--calib-tokens", required=True, help="JSON list of token-id lists (equal lengths)")
    parser.add_argument("--method", choices=("gptq", "awq"), required=True)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--symmetric", action="store_true")
    parser.add_argument("--actorder", default="none", help="GPTQ: none, static, group, weight (llm-compressor's names)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dump-fake-quant", action="store_true",
                        help="also write <out>-fakequant.safetensors: each quantized weight as compressed-tensors' own "
                             "fake_quantize computes it (a reader of the checkpoint must reproduce these exactly)")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    if not torch.cuda.is_available():
        # llm-compressor 0.14's AWQ pins its cached activations (IntermediatesCache.pin_memory, called
        # unconditionally in AWQModifier._apply_smoothing) for faster host-to-GPU copies; torch refuses to
        # pin without an accelerator. Pinning moves no numbers, so on a CPU-only machine it is skipped.
        from llmcompressor.pipelines.cache import IntermediatesCache

        IntermediatesCache.pin_memory = lambda self, *a, **k: None
    tokens = json.loads(Path(args.calib_tokens).read_text())
    data = Dataset.from_dict({"input_ids": tokens, "attention_mask": [[1] * len(t) for t in tokens]})
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    actorder = None if args.actorder == "none" else args.actorder
    recipe = _recipe(args.method, args.group_size, args.symmetric, actorder)
    start = time.perf_counter()
    oneshot(model=model, dataset=data, recipe=recipe, num_calibration_samples=len(tokens),
            max_seq_length=len(tokens[0]), shuffle_calibration_samples=False)
    seconds = time.perf_counter() - start
    out = Path(args.out)
    if args.dump_fake_quant:
        _dump_fake_quant(model, out.with_name(out.name + "-fakequant.safetensors"))
    model.save_pretrained(str(out), save_compressed=True)
    import llmcompressor

    (out / "timing.json").write_text(json.dumps({
        "method": args.method, "seconds": seconds, "threads": args.threads, "group_size": args.group_size,
        "symmetric": args.symmetric, "actorder": args.actorder, "llmcompressor": llmcompressor.__version__,
        "samples": len(tokens), "tokens_per_sample": len(tokens[0]),
    }, indent=1))
    print(json.dumps({"seconds": seconds, "out": str(out)}))


if __name__ == "__main__":
    main()
