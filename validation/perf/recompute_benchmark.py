#!/usr/bin/python3
"""Recompute policy benchmark: the step time each activation recomputation policy costs against no
recomputation, measured in the same run (docs/parallelism.md §Activation recomputation).

    validation/perf/recompute_benchmark.py [--models gpt,bert] [--rounds 3] [--steps 20]
                                           [--binary build/cpu/bin/partrain] [--out runs/recompute-benchmark]

A benchmark, not a test: it asserts nothing. For each tiny model it trains one stage on one rank
(`partrain train CONFIG --set parallel.planner=uniform --set parallel.stages=1`, 4 microbatches, so
the recomputation is the only difference) under recompute = none, selective, layers and boundaries,
the policies interleaved round by round so that a change in the machine's load hits all of them, and
prints per policy the median step seconds (steps after the first, over every round) and the ratio to
none. The goal it reports against (issue 24): selective costs ≤ 5 % of a step where whole-stage
recomputation costs about a quarter (one more forward pass).
Exit code 0 when every run finished, 1 when one failed (its log is named), 2 on a bad command line.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # validation/: script_errors
from script_errors import ArgumentParser, fail  # noqa: E402
CONFIGS = {"gpt": "configs/gpt-tiny.toml", "bert": "configs/bert-tiny.toml"}
POLICIES = ["none", "selective", "layers", "boundaries"]


def step_seconds(args, model, policy, directory):
    """Seconds of each step after the first of one run (None when the run failed)."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    command = [args.binary, "train", CONFIGS[model], "--set", f"train.steps={args.steps}", "--set", f"log.dir={directory}",
               "--set", "checkpoint.every=0", "--set", f"log.every={args.steps}", "--set", "profile.enabled=false",
               "--set", "parallel.planner=uniform", "--set", "parallel.stages=1", "--set", "train.microbatches=4",
               "--set", f"parallel.recompute={policy}"]
    log_path = directory + ".log"
    with open(log_path, "w") as log:
        status = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
    if status != 0:
        with open(log_path) as log:
            print(f"recompute_benchmark: {model} {policy} failed (exit {status}); log {log_path}:\n" + log.read()[-1500:],
                  file=sys.stderr)
        return None
    with open(os.path.join(directory, "metrics.jsonl")) as file:
        rows = [json.loads(line) for line in file if line.strip()]
    return [row["seconds"] for row in rows[1:]]


def main():
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt,bert", help="comma-separated subset of gpt,bert")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the policies (default 3)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (default 20; the first is not counted)")
    parser.add_argument("--binary", default=os.path.join(ROOT, "build/cpu/bin/partrain"))
    parser.add_argument("--out", default=os.path.join(ROOT, "runs/recompute-benchmark"), help="run directories and logs")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per run before it is killed (default 300)")
    args = parser.parse_args()
    models = args.models.split(",")
    if args.rounds < 1 or args.steps < 2 or any(m not in CONFIGS for m in models):
        parser.error("--rounds at least 1, --steps at least 2, --models from gpt,bert")
    if not os.access(args.binary, os.X_OK):
        parser.error(f"--binary {args.binary}: not an executable; build it: cmake --build --preset cpu --target partrain")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as error:
        fail(f"--out {args.out}: cannot make the directory ({error.strerror})")
    print(f"recompute_benchmark: 1 rank, {args.steps} steps x {args.rounds} rounds per policy, load average before "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    failed = 0
    for model in models:
        seconds = {policy: [] for policy in POLICIES}
        for round_index in range(args.rounds):
            for policy in POLICIES:
                measured = step_seconds(args, model, policy, os.path.join(args.out, f"{model}-{policy}-{round_index}"))
                if measured is None:
                    failed += 1
                else:
                    seconds[policy] += measured
        if not seconds["none"]:
            continue
        reference = statistics.median(seconds["none"])
        print(f"\n| {model} policy | median step ms | vs none |\n|---|---|---|")
        for policy in POLICIES:
            if seconds[policy]:
                median = statistics.median(seconds[policy])
                print(f"| {policy} | {1e3 * median:.1f} | {100 * (median / reference - 1):+.1f} % |")
    print("\nload average after " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
