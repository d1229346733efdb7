"""Evaluation: reference and candidate runs, per-token metrics, results."""
from __future__ import annotations

from wkvlab.eval.result import EvalResult, TokenArrays
from wkvlab.eval.runner import run_grid

__all__ = ["EvalResult", "TokenArrays", "run_grid"]
