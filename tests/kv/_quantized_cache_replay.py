"""Run in a venv that has optimum-quanto (tests/kv/test_quantized_cache_replay.py builds it):
transformers' QuantizedCache(backend="quanto") driven as generate drives it — one prefill of the
prompt, then one token per step — against wkvlab's teacher-forced hf-quanto preset on the same
tiny model. Prints a JSON line with the largest logit differences."""
from __future__ import annotations

import json
import sys

import torch
from transformers import QuantizedCache

from tests.kv._replay_common import decode, tiny_model_and_tokens
from wkvlab.kv import KVSpec
from wkvlab.kv.hook import kv_quantization


def main(nbits: int, prompt: int, residual: int, steps: int) -> None:
    model, ids = tiny_model_and_tokens(prompt, steps)
    with torch.no_grad():
        engine = decode(model, ids, prompt, QuantizedCache(backend="quanto", config=model.config, nbits=nbits, q_group_size=64, residual_length=residual))
        ref = model(ids).logits[0]
        with kv_quantization(model, KVSpec.parse(f"hf-quanto:int{nbits}+residual={residual}+prefill={prompt}")):
            sim = model(ids).logits[0]
        with kv_quantization(model, KVSpec.parse(f"int{nbits}-g64-asym+residual={residual}")):
            old = model(ids).logits[0]  # the previous preset: no prefill, flush counted from position 0
    diff = lambda a, b: float((a - b).abs().max())  # noqa: E731
    print(json.dumps({"sim": diff(sim, engine), "old": diff(old, engine), "quantized_effect": diff(ref, engine),
                      "prompt_vs_ref": diff(engine[:prompt], ref[:prompt])}))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]))
