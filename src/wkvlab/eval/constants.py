"""Defaults the command line shows in its help; here so that importing them does not load torch."""
from __future__ import annotations

DEFAULT_TOPK = 256  # top-k log-probs a stored reference keeps per token (wkvlab.eval.reference)
DEFAULT_SAMPLES = 64  # tail tokens it samples per token
