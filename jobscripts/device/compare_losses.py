#!/usr/bin/env python3
"""Compares the per-step losses of two partrain runs (their metrics.jsonl), for the GPU device checks.

  compare_losses.py ACTUAL.jsonl EXPECTED.jsonl --tolerance 1e-4 [--steps N] [--from-step S]

Passes when both runs have the same steps (at least N, from step S on) and every step's loss agrees
within `tolerance` relative to the expected one: |actual - expected| <= tolerance * |expected|.
Prints one line: "ok" or "FAILED", the worst step and its relative difference. Exit code 0 / 1.
Python standard library only (the GPU machine's interpreter and a bare rehearsal root both have it).
"""
import argparse
import json
import sys


def losses(path):
    rows = {}
    with open(path) as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                rows[int(row["step"])] = float(row["loss"])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("actual")
    parser.add_argument("expected")
    parser.add_argument("--tolerance", type=float, required=True)
    parser.add_argument("--steps", type=int, default=1, help="at least this many steps compared")
    parser.add_argument("--from-step", type=int, default=1, help="compare the steps from this one on")
    arguments = parser.parse_args()
    try:
        actual, expected = losses(arguments.actual), losses(arguments.expected)
    except (OSError, ValueError, KeyError) as error:
        print(f"FAILED: cannot read the losses: {error}")
        return 1
    steps = sorted(step for step in expected if step >= arguments.from_step)
    missing = [step for step in steps if step not in actual]
    if len(steps) < arguments.steps or missing:
        print(f"FAILED: {len(steps)} expected steps (need {arguments.steps}); missing in {arguments.actual}: "
              f"{missing[:5]}")
        return 1
    worst_step, worst = steps[0], -1.0
    for step in steps:
        difference = abs(actual[step] - expected[step]) / max(abs(expected[step]), 1e-30)
        if difference != difference or difference > worst:  # NaN counts as the worst
            worst_step, worst = step, difference
            if difference != difference:
                break
    ok = worst == worst and worst <= arguments.tolerance
    print(f"{'ok' if ok else 'FAILED'}: {len(steps)} steps, worst step {worst_step}: "
          f"{actual[worst_step]:.8g} vs {expected[worst_step]:.8g} (relative {worst:.3g}, tolerance "
          f"{arguments.tolerance:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
