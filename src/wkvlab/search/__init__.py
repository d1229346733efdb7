"""Per-layer sensitivity profiles and mixed-precision search for the KV cache (and 16-bit weight layers).

``profile`` measures what each layer's K, V and weights cost in KLD; ``predict`` turns a profile
into an additive predictor with a measured correction; ``allocate`` finds the per-layer assignment
under a memory budget (exact knapsack DP, and greedy); ``baselines``, ``pareto`` and ``export``
put the plan next to uniform formats, on the quality/memory frontier, and into engine syntax.
``wkvlab.search.api`` runs it all; see docs/search.md.
"""
