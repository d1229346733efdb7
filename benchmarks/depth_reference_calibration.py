"""The reference-sharpening calibration of the depth power simulation (src/wkvlab/findings/depth_power.py). Prints JSON.

    python benchmarks/depth_reference_calibration.py     # SmolLM2, one thread

Per-document change of the reference's NLL (and entropy) on the same 512 target tokens after a 512- and a
4,096-token prefix: SmolLM2, 8 standard-library modules (every 6th of those with at least 4,608 tokens, in the
text's order). Measured once for depth_power.REFERENCE_SD / SHARPENING: 2,495 s at a load of about 12 on the
2-core machine, one torch thread.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> None:
    import numpy as np
    import torch

    from wkvlab.data import load_corpus, tokenize
    from wkvlab.models.loading import load_model

    started = time.time()
    torch.set_num_threads(1)
    loaded = load_model("default")
    docs = [tokenize(loaded.tokenizer, d) for d in load_corpus("code").documents]
    target, short, long = 512, 512, 4096
    eligible = [d for d in docs if d.numel() >= long + target]
    picked = eligible[:: max(1, len(eligible) // 8)][:8]
    out = {"S": [], "L": [], "HS": [], "HL": []}
    with torch.no_grad():
        for d in picked:
            end = long + target
            for key, hkey, prefix in (("S", "HS", short), ("L", "HL", long)):
                ids = d[end - target - prefix: end][None]
                logprobs = torch.log_softmax(loaded.model(ids).logits[0].float()[prefix - 1: prefix - 1 + target], -1)
                nll = -logprobs.gather(-1, ids[0, prefix: prefix + target][:, None])[:, 0]
                out[key].append(float(nll.mean()))
                out[hkey].append(float(-(logprobs.exp() * logprobs).sum(-1).mean()))
    change = np.array(out["L"]) / np.array(out["S"]) - 1
    entropy = np.array(out["HL"]) / np.array(out["HS"]) - 1
    print(json.dumps({"docs": len(picked), "nll_S": out["S"], "nll_L": out["L"], "rel_change_mean": float(change.mean()),
                      "rel_change_sd": float(change.std(ddof=1)), "ent_rel_mean": float(entropy.mean()),
                      "ent_rel_sd": float(entropy.std(ddof=1)), "seconds": time.time() - started}))


if __name__ == "__main__":
    main()
