"""lm-eval's own command line with the ``wkvlab`` model registered.

lm-eval 0.4.13 has no plugin discovery for models (its registry is filled by ``@register_model`` at
import time; ``lm_eval/api/registry.py``), so ``lm-eval run --model wkvlab`` cannot find us by
itself. This module imports :mod:`wkvlab.tasks.harness` and then hands the arguments to lm-eval:

    python -m wkvlab.tasks.lm_eval_cli run --model wkvlab --model_args model=default,weights=int4-g128,kv=q4_0 --tasks arc_easy

A wkvlab error (a bad spec in --model_args) is one line and exit status 2, as in ``wkvlab``.
"""
from __future__ import annotations

import sys


def main() -> None:
    from wkvlab.errors import WkvlabError

    try:
        import wkvlab.tasks.harness  # noqa: F401 - registers "wkvlab"
        from lm_eval.__main__ import cli_evaluate

        cli_evaluate()
    except WkvlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
