"""Downstream tasks: lm-evaluation-harness on the simulation (docs/tasks.md).

``simulation`` (a weights × KV config as a scorer), ``harness`` (the lm-eval model ``wkvlab``; imports
lm_eval), ``run`` (a grid into the results store), ``cli`` (``wkvlab tasks``), ``lm_eval_cli``
(lm-eval's own command line with ``wkvlab`` registered). Nothing is imported here, so the command
line stays fast and lm_eval stays optional.
"""
