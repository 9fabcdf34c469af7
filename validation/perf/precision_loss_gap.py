#!/usr/bin/python3
"""fp16 and bf16 against fp32 on one loss curve (validation/perf/README.md §Mixed precision).

    validation/perf/precision_loss_gap.py [--partrain build/cpu/bin/partrain] [--steps 200] [--out DIR]

Trains configs/gpt-tiny.toml for STEPS steps on one rank in fp32, bf16 and fp16 (same seed, same
data, dropout as configured, the single-rank dpl plan) and prints, per 16-bit precision, the largest
and the final gap between its loss and fp32's at the same step (absolute and relative), the fp16 run's
skipped steps and loss scales, as a Markdown table. A run directory under --out whose metrics.jsonl
already has STEPS rows is read, not rerun. Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train(partrain, precision, steps, out):
    """Runs partrain train; returns its metrics rows."""
    directory = os.path.join(out, precision)
    metrics_path = os.path.join(directory, "metrics.jsonl")
    if os.path.exists(metrics_path):  # a finished run of the same length (e.g. the three run in parallel)
        with open(metrics_path) as metrics:
            rows = [json.loads(line) for line in metrics]
        if len(rows) == steps:
            return rows
    settings = [f"train.precision={precision}", f"train.steps={steps}", f"log.dir={directory}", "log.every=50",
                "log.trace=", "checkpoint.every=0", "profile.enabled=false", "parallel.planner=dpl",
                "train.microbatches=1", f"data.path={os.path.join(ROOT, 'data', 'prepared', 'text.h5')}"]
    command = [partrain, "train", os.path.join(ROOT, "configs", "gpt-tiny.toml")]
    for setting in settings:
        command += ["--set", setting]
    if subprocess.run(command, stdout=subprocess.DEVNULL).returncode != 0:
        sys.exit(f"precision_loss_gap: {' '.join(command)} failed")
    with open(metrics_path) as metrics:
        return [json.loads(line) for line in metrics]


def gaps(rows, reference):
    """(largest |gap|, its step, its relative size, final |gap|, final relative, largest |gap| of the
    first 10 steps, mean signed gap) against fp32."""
    pairs = [(abs(r["loss"] - f["loss"]), r["step"], abs(r["loss"] - f["loss"]) / abs(f["loss"])) for r, f in zip(rows, reference)]
    worst = max(pairs)
    mean = sum(r["loss"] - f["loss"] for r, f in zip(rows, reference)) / len(rows)
    return worst[0], worst[1], worst[2], pairs[-1][0], pairs[-1][2], max(p[0] for p in pairs[:10]), mean


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partrain", default=os.path.join(ROOT, "build", "cpu", "bin", "partrain"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", "precision-loss-gap"))
    args = parser.parse_args()
    runs = {precision: train(args.partrain, precision, args.steps, args.out) for precision in ("fp32", "bf16", "fp16")}
    fp32 = runs["fp32"]
    print(f"gpt-tiny, {args.steps} steps, 1 rank; fp32 loss {fp32[0]['loss']:.4f} -> {fp32[-1]['loss']:.4f}\n")
    print("| precision | largest gap to fp32 (step) | relative | final gap | relative | largest gap, steps 1-10 | "
          "mean gap (signed) | skipped steps | loss scales |")
    print("|---|---|---|---|---|---|---|---|---|")
    for precision in ("bf16", "fp16"):
        rows = runs[precision]
        worst, step, worst_relative, final, final_relative, early, mean = gaps(rows, fp32)
        skipped = sum(1 for r in rows if r.get("skipped"))
        scales = sorted({r["loss_scale"] for r in rows if "loss_scale" in r})
        print(f"| {precision} | {worst:.2e} ({step}) | {worst_relative:.2e} | {final:.2e} | {final_relative:.2e} | "
              f"{early:.2e} | {mean:+.2e} | "
              f"{skipped if precision == 'fp16' else '-'} | {', '.join('%g' % s for s in scales) or '-'} |")


if __name__ == "__main__":
    main()
