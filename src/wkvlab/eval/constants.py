"""Defaults the command line shows in its help; here so that importing them does not load torch."""
from __future__ import annotations

# A stored reference's KLD is the exact top-k head plus a sampled tail: unbiased, with a sampling
# error that shrinks with the tail's mass (larger k) and the samples. On SmolLM2 (q4_0 cache, ctx
# 512, 1,022 tokens) k = 256 with 64 samples left a standard error of 1.5e-4 on a KLD of 0.119 —
# the stored run was 1.7e-4 off the exact one, from sampling alone; k = 1,024 with 256 samples
# brings it to 3.0e-5, so a 1e-4 bar holds at 3.3 standard errors, for 10.2 kB per token
# (llama.cpp's 16-bit full-vocabulary file: 98 kB for SmolLM2). docs/scale.md has the table.
DEFAULT_TOPK = 1024  # top-k log-probs a stored reference keeps per token (wkvlab.eval.reference)
DEFAULT_SAMPLES = 256  # tail tokens it samples per token
