#!/usr/bin/python3
"""Zero-bubble benchmark: the measured step and bubble of zb_h1 and zb_v against 1f1b and interleaved,
in the same run, beside the simulator's predictions (docs/parallelism.md §Pipeline schedules).

    validation/perf/zero_bubble_benchmark.py [--ranks 2] [--layers 8] [--microbatches 4]
                                             [--rounds 3] [--steps 12] [--binary build/cpu/bin/partrain]
                                             [--out runs/zero-bubble-benchmark]

A benchmark, not a test: it asserts nothing. It trains gpt-tiny with `--layers` layers on `--ranks`
ranks (one pipeline stage each; interleaved and zb_v with 2 model chunks per rank; the default 8
layers on 2 ranks cut by hand into balanced stages, other sizes by the uniform planner) under each schedule, the schedules interleaved round by round so that a change in the
machine's load hits all of them, one thread per rank. Per schedule it prints the median step seconds
(steps after the first, every round), the ratio to 1f1b, the measured bubble (from trace.json: 1 −
Σ over ranks of compute time / (ranks × the span from the step's first compute action to its last),
median over steps), the bubble's ratio to 1f1b's, the peak memory of the busiest rank, and the plan's
predicted step and bubble (profiled on this machine: [profile] enabled). Run it on a machine with at
least `--ranks` idle cores: ranks sharing a core fill each other's bubbles.
Exit code 0 when every run finished, 1 when one failed (its log is named), 2 on a bad command line.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEDULES = {"1f1b": [], "interleaved": ["parallel.virtual_stages=2"], "zb_h1": [], "zb_v": []}
# The default case (8 layers on 2 ranks) cut by hand into stages of about equal forward + backward
# time, so that the comparison measures the schedules' bubbles, not an imbalance no schedule removes:
# profiled on gpt-tiny, the LM head and loss cost about 1.8 layers. One stage each: embeddings and
# h.0-4 | h.5-7 and the head; interleaved (chunk c on rank c mod 2): h.0-2 | h.3-4 | h.5-6 | h.7 and
# the head; zb_v (rank 0 holds chunks 0 and 3): h.0-1 | h.2-4 | h.5-6 | h.7 and the head.
BALANCED_BOUNDARIES = {"1f1b": '["h.5"]', "zb_h1": '["h.5"]', "interleaved": '["h.3","h.5","h.7"]',
                       "zb_v": '["h.2","h.5","h.7"]'}


def measured_bubbles(trace_path):
    """Per step after the first: 1 − busy / (ranks × span) over the compute events of trace.json."""
    with open(trace_path) as file:
        document = json.load(file)
    events = document["traceEvents"] if isinstance(document, dict) else document
    steps = {}
    for event in events:
        if event.get("ph") != "X" or event.get("cat") != "compute":
            continue
        step = event.get("args", {}).get("step", 0)
        steps.setdefault(step, []).append(event)
    bubbles = []
    for step, compute in sorted(steps.items()):
        if step == 0:
            continue
        ranks = {event["pid"] for event in compute}
        start = min(event["ts"] for event in compute)
        end = max(event["ts"] + event["dur"] for event in compute)
        busy = sum(event["dur"] for event in compute)
        if end > start:
            bubbles.append(1 - busy / (len(ranks) * (end - start)))
    return bubbles


def run(args, schedule, directory):
    """(step seconds after the first, measured bubbles, peak bytes, predicted step, predicted bubble) or None."""
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    settings = [f"train.steps={args.steps}", f"log.dir={directory}", "checkpoint.every=0", f"log.every={args.steps}",
                f"parallel.stages={args.ranks}", f"parallel.schedule={schedule}",
                f"train.microbatches={args.microbatches}", f"train.global_batch={2 * args.microbatches}",
                f"model.layers={args.layers}"] + SCHEDULES[schedule]
    if args.ranks == 2 and args.layers == 8:
        settings += ["parallel.planner=manual", f"parallel.boundaries={BALANCED_BOUNDARIES[schedule]}"]
    else:
        settings += ["parallel.planner=uniform"]
    command = ["mpiexec", "-n", str(args.ranks), "--oversubscribe", "-x", "OMP_NUM_THREADS=1", "-x",
               "OPENBLAS_NUM_THREADS=1", args.binary, "train", "configs/gpt-tiny.toml"]
    for setting in settings:
        command += ["--set", setting]
    log_path = directory + ".log"
    with open(log_path, "w") as log:
        status = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
    if status != 0:
        with open(log_path) as log:
            print(f"zero_bubble_benchmark: {schedule} failed (exit {status}); log {log_path}:\n" + log.read()[-1500:],
                  file=sys.stderr)
        return None
    with open(os.path.join(directory, "metrics.jsonl")) as file:
        rows = [json.loads(line) for line in file if line.strip()]
    with open(os.path.join(directory, "plan.json")) as file:
        plan = json.load(file)
    steps = [row["seconds"] for row in rows if "seconds" in row][1:]
    peak = max(row.get("peak_memory_bytes", 0) for row in rows)
    return (steps, measured_bubbles(os.path.join(directory, "trace.json")), peak,
            plan.get("predicted_step_seconds", 0.0), plan.get("predicted_bubble_fraction", 0.0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="pipeline stages = MPI ranks (default 2)")
    parser.add_argument("--layers", type=int, default=8, help="GPT layers (default 8)")
    parser.add_argument("--microbatches", type=int, default=4, help="microbatches per step (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the schedules (default 3)")
    parser.add_argument("--steps", type=int, default=12, help="training steps per run (default 12; the first is not counted)")
    parser.add_argument("--binary", default=os.path.join(ROOT, "build/cpu/bin/partrain"))
    parser.add_argument("--out", default=os.path.join(ROOT, "runs/zero-bubble-benchmark"), help="run directories and logs")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per run before it is killed (default 600)")
    args = parser.parse_args()
    if args.ranks < 1 or args.layers < 2 * args.ranks or args.microbatches < 1 or args.rounds < 1 or args.steps < 2:
        parser.error("need ranks >= 1, layers >= 2 x ranks (two chunks per rank), microbatches >= 1, rounds >= 1, steps >= 2")
    if not os.path.exists(args.binary):
        parser.error(f"no partrain binary at {args.binary} (build the cpu preset first)")
    results = {schedule: ([], [], 0.0, 0.0, 0.0) for schedule in SCHEDULES}
    for round_index in range(args.rounds):
        for schedule in SCHEDULES:
            outcome = run(args, schedule, os.path.join(args.out, f"{schedule}-{round_index}"))
            if outcome is None:
                return 1
            steps, bubbles, peak, predicted_step, predicted_bubble = outcome
            kept = results[schedule]
            results[schedule] = (kept[0] + steps, kept[1] + bubbles, max(kept[2], peak), predicted_step, predicted_bubble)
    base_step = statistics.median(results["1f1b"][0])
    base_bubble = statistics.median(results["1f1b"][1])
    print(f"gpt-tiny, {args.layers} layers, {args.ranks} ranks, M = {args.microbatches}, {args.rounds} rounds x "
          f"{args.steps - 1} steps")
    print("| schedule | step s (median) | vs 1f1b | measured bubble | vs 1f1b's | peak MiB | predicted step s | predicted bubble |")
    print("|---|---|---|---|---|---|---|---|")
    for schedule, (steps, bubbles, peak, predicted_step, predicted_bubble) in results.items():
        step, bubble = statistics.median(steps), statistics.median(bubbles)
        print(f"| {schedule} | {step:.4f} | {step / base_step:.3f} | {bubble * 100:.1f}% | "
              f"{bubble / base_bubble if base_bubble > 0 else float('nan'):.2f} | {peak / 2**20:.1f} | "
              f"{predicted_step:.4f} | {predicted_bubble * 100:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
