"""Power of the depth finding's design: how often it says "grows" for a true +15% growth. Prints JSON.

    python benchmarks/depth_power.py                       # the designs below, 1,000 simulated findings each
    python benchmarks/depth_power.py --runs 200 --documents 48 --target 1024

The simulation and its calibration (the two committed SmolLM2 depth records, 64 and 512 target tokens on the
same 8 documents) are :mod:`wkvlab.findings.depth_power`; the decision path is the finding's own
(:func:`wkvlab.findings.depth.depth_table`). Designs: the main run at its minimum size (32 documents, 2,048
target tokens, m = 5% of the penalty at the shortest prefix), the same at the rule's 10% margin, the
eight-document long run (``depth-long``) at 512 and 2,048 targets, and the design before issue #38
(8 documents, 512 targets, every length decided at m = 10%: here its primary contrast only, which is kinder).
Each line: per test (cache × raw / adjusted for the reference's sharpening) the share of runs that said
"grows", with its binomial SE.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

DESIGNS = [
    ("main run (depth), minimum size", 32, 2048, "5%"),
    ("main run at the rule's 10% margin", 32, 2048, "10%"),
    ("main run, 48 documents (SmolLM2's 8k windows reach 48 modules)", 48, 2048, "5%"),
    ("long run (depth-long), 8 documents, 2,048 targets", 8, 2048, "5%"),
    ("long run (depth-long), 8 documents, 512 targets", 8, 512, "5%"),
    ("before issue #38: 8 documents, 512 targets, m = 10%", 8, 512, "10%"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--documents", type=int, help="one design of this many documents (with --target, --margin)")
    parser.add_argument("--target", type=int, default=2048)
    parser.add_argument("--margin", default="5%")
    parser.add_argument("--growth", type=float, default=0.15)
    parser.add_argument("--sharpening", type=float, default=None, help="mean relative change of the reference NLL (default: the measured -0.083)")
    parser.add_argument("--adjusted-truth", action="store_true", help="the growth is +15%% after adjusting for the sharpening (the raw one smaller)")
    parser.add_argument("--shape", default="right", help="right, left, heavy, normal, right-strong (wkvlab.stats.simulate)")
    args = parser.parse_args()
    from wkvlab.findings.depth_power import SHARPENING, calibration, power

    cal = calibration()
    designs = DESIGNS if args.documents is None else [("asked", args.documents, args.target, args.margin)]
    print(json.dumps({"calibration": cal}), flush=True)
    sharpening = SHARPENING if args.sharpening is None else args.sharpening
    growth = (1 + args.growth) * (1 + sharpening) - 1 if args.adjusted_truth else args.growth
    for name, documents, target, margin in designs:
        started = time.perf_counter()
        out = power(documents=documents, target=target, margin=margin, runs=args.runs, growth=growth, sharpening=sharpening,
                    shape=args.shape, cal=cal)
        print(json.dumps({"design": name, **out, "seconds": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
