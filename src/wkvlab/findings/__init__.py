"""The seeds' questions answered by measurement, one finding at a time (docs/findings.md).

Each finding is a set of sweeps into one results store (resumable: a finished config is never run
again) and an analysis of the stored per-token arrays that prints its tables with paired
intervals. ``wkvlab findings <name> [--model M]`` runs one on any model; ``make findings`` runs
them all on the packaged models:

* ``additivity``: weight methods × KV configs — does their KLD add or compound?
* ``methods``: the KV penalty under each weight method;
* ``attention``: where inside attention the weight × cache cross term sits (layers, sinks);
* ``calibration``: GPTQ, AWQ and SmoothQuant calibrated on prose, code or math, evaluated on prose and code;
* ``depth``: the KV penalty on the same target tokens after prefixes of increasing length, up to the longest
  prefix that at least 32 standard-library modules reach; ``depth-long``: the eight longest modules to the model's limit;
* ``search``: weight-aware vs weight-unaware per-layer KV plans;
* ``engine``: llama.cpp's own KLD for the llama.cpp rows.
"""
from __future__ import annotations

FINDINGS = ("additivity", "methods", "attention", "calibration", "depth", "depth-long", "search", "engine")

__all__ = ["FINDINGS"]
