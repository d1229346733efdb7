"""Run in a venv that has optimum-quanto (tests/kv/test_quantized_cache_replay.py builds it):
transformers' QuantizedCache(backend="quanto") driven as generate drives it — one prefill of the
prompt, then one token per step — against wkvlab's teacher-forced hf-quanto preset on the same
tiny model. Prints a JSON line with the largest logit differences."""
from __future__ import annotations

import json
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, QuantizedCache

from wkvlab.kv import KVSpec
from wkvlab.kv.hook import kv_quantization


def main(nbits: int, prompt: int, residual: int, steps: int) -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=64, vocab_size=128, max_position_embeddings=256)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (1, prompt + steps), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = QuantizedCache(backend="quanto", config=model.config, nbits=nbits, q_group_size=64, residual_length=residual)
        out = model(ids[:, :prompt], past_key_values=cache, use_cache=True)
        engine = [out.logits[0]]
        for t in range(prompt, prompt + steps):
            out = model(ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)
            engine.append(out.logits[0])
        engine = torch.cat(engine)
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
