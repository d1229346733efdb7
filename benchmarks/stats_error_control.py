"""Family-wise rate of wrong verdicts of the decision rule, on simulated families with a known truth. Prints JSON.

    python benchmarks/stats_error_control.py                        # today's rule, every kind × shape × 8/16 units
    python benchmarks/stats_error_control.py --families 400 --rule cache-margin
    python benchmarks/stats_error_control.py --against /tmp/old/src  # an older checkout's rule (m = 10% of KLD(C))

The simulation (designs, calibration from docs/runs/findings-additivity-default.json, truths at the
least favourable value for each verdict kind) is :mod:`wkvlab.stats.simulate`; this script runs all
of it. ``--against DIR`` imports ``wkvlab`` from DIR (say ``git archive bddcf85 src | tar -x -C /tmp/old``)
and runs this checkout's simulation on that version's ``resample``/``decide``, with the margin that
version used. Each line: the share of families with any wrong verdict, and ``limit`` = 5% + 2
binomial SEs (the Monte-Carlo tolerance the tests use).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _simulate(against: str | None):
    if against:
        sys.path.insert(0, against)
    else:
        sys.path.insert(0, str(HERE / "src"))
    spec = importlib.util.spec_from_file_location("simulate", HERE / "src" / "wkvlab" / "stats" / "simulate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["simulate"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", type=int, default=200)
    parser.add_argument("--rule", default="default", help="default, cache-margin (today's interval, m = 10%% of KLD(C)), or old")
    parser.add_argument("--against", help="an older checkout's src/ folder: run its decision path (implies --rule old)")
    parser.add_argument("--units", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--shapes", nargs="+", default=None)
    parser.add_argument("--designs", nargs="+", default=["interaction", "difference"])
    parser.add_argument("--kinds", nargs="+", default=None)
    args = parser.parse_args()
    sim = _simulate(args.against)
    rule = sim.old_rule() if args.against or args.rule == "old" else sim.rules()[args.rule]
    load = os.getloadavg()[0]
    start = time.time()
    rows = []
    for design in args.designs:
        for kind in args.kinds or sim.KINDS[design]:
            if kind not in sim.KINDS[design]:
                continue
            for shape in args.shapes or sim.SHAPES:
                for units in args.units:
                    row = sim.family_wise_rate(rule, design, kind, shape, units, args.families)
                    row["promised"] = shape in sim.PROMISED_SHAPES
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"rule": rule.name, "against": args.against, "families": args.families, "wall_s": round(time.time() - start, 1),
                      "load_before": load, "rows": rows,
                      "worst_promised": max((r["rate"] for r in rows if r["promised"]), default=None)}, indent=1))


if __name__ == "__main__":
    main()
