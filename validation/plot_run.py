#!/usr/bin/python3
"""Plots a partrain run: loss and throughput curves from metrics.jsonl, and one step of the pipeline
as a per-rank Gantt chart, measured (the Chrome trace) above predicted (the simulator).

    validation/plot_run.py RUN_DIR [--out DIR] [--trace FILE] [--step N] [--predicted FILE] [--partrain BINARY]

RUN_DIR is a run's [log] dir (runs/<config name>/ by default). Writes to DIR (default RUN_DIR):
  curves.png     loss (and eval_loss when the run evaluated) and samples/s per step;
  timeline.png   step N (default: the step of median duration in metrics.jsonl, not the first) as a
                 Gantt chart, one row per rank, time on x, one bar per action: forward, backward,
                 recompute (labelled by microbatch), send, receive, all-reduce, optimizer step; below
                 it the predicted timeline of the same step, when there is one;
  predicted.png  the predicted timeline alone: `partrain simulate RUN_DIR/plan.json --trace-out
                 DIR/predicted-trace.json` (the plan's schedule simulated with its predicted stage
                 costs), or the trace given with --predicted.
Without matplotlib (Debian: python3-matplotlib) it prints a message and exits 0.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_errors import fail, require_file  # noqa: E402


def read_metrics(path):
    records = []
    with open(path) as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                fail(f"{path}:{number}: not JSON: {error}")
            if not isinstance(record, dict) or "step" not in record:
                fail(f"{path}:{number}: not an object with a step")
            records.append(record)
    return records


def series(records, key):
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [p[0] for p in points], [p[1] for p in points]


def plot_curves(plt, records, out_path, title):
    figure, (loss_axes, speed_axes) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    steps, loss = series(records, "loss")
    loss_axes.plot(steps, loss, label="train loss", color="tab:blue", marker="." if len(steps) < 50 else None)
    eval_steps, eval_loss = series(records, "eval_loss")
    if eval_steps:
        loss_axes.plot(eval_steps, eval_loss, label="eval loss", color="tab:orange", marker="o")
    loss_axes.set_ylabel("loss")
    loss_axes.grid(alpha=0.3)
    loss_axes.legend()
    loss_axes.set_title(title)
    steps, speed = series(records, "samples_per_second")
    speed_axes.plot(steps, speed, color="tab:green", marker="." if len(steps) < 50 else None)
    speed_axes.set_ylabel("samples/s")
    speed_axes.set_xlabel("step")
    speed_axes.grid(alpha=0.3)
    speed_axes.xaxis.get_major_locator().set_params(integer=True)
    figure.tight_layout()
    figure.savefig(out_path, dpi=110)
    plt.close(figure)


# Action kinds (the executor's event names: "Forward mb 3", "AllReduce", "Step") and their colours.
KIND_COLOURS = {
    "Forward": "#4c78a8", "Backward": "#54a24b", "Recompute": "#b279a2",
    "BackwardInput": "#54a24b", "BackwardWeight": "#9ecf8a",
    "SendActivation": "#f58518", "SendGradient": "#f58518",
    "ReceiveActivation": "#bab0ac", "ReceiveGradient": "#bab0ac",
    "AllReduce": "#e45756", "Step": "#222222",
}
KIND_LEGEND = [("forward", "Forward"), ("backward (zero bubble: its input half)", "Backward"),
               ("weight gradients (zero bubble)", "BackwardWeight"), ("recompute", "Recompute"),
               ("send", "SendActivation"), ("receive (wait)", "ReceiveActivation"),
               ("all-reduce", "AllReduce"), ("optimizer step", "Step")]


def read_trace(path):
    """The complete events of the Chrome trace file `path`; one error line when it is not one."""
    try:
        with open(path) as file:
            trace = json.load(file)
    except (OSError, UnicodeDecodeError) as error:
        fail(f"{path}: cannot read it ({error})")
    except json.JSONDecodeError as error:
        fail(f"{path}: not JSON: {error}")
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        fail(f"{path}: not a Chrome trace (a list of event objects, or an object with traceEvents)")
    return trace_events(trace)


def trace_events(trace):
    """The complete ("X") events of a Chrome trace (object or bare list form)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    # tid 0: the schedule's actions (the bucketed gradient all-reduces overlap them on tid 1)
    return [e for e in events if e.get("ph") == "X" and e.get("tid", 0) == 0]


def split_name(name):
    """("Forward", 3) for "Forward mb 3" (and "Forward mb 3 chunk 1": several model chunks per rank);
    ("AllReduce", None) for "AllReduce"."""
    words = name.split()
    if len(words) in (3, 5) and words[1] == "mb" and (len(words) == 3 or words[3] == "chunk"):
        return words[0], int(words[2])
    return name, None


def step_events(events, step):
    """Per rank: the events of one step, times in ms from that rank's first event of the step.

    Ranks' trace clocks start when each rank's executor was built (not synchronised), but every step
    begins right after the previous step's global-norm all-reduce, which all ranks leave together:
    aligning each rank's step at its first action is closer than the raw clocks."""
    by_rank = {}
    for e in events:
        if e.get("args", {}).get("step") == step:
            by_rank.setdefault(e["pid"], []).append(e)
    result = {}
    for pid, group in by_rank.items():
        origin = min(e["ts"] for e in group)
        result[pid] = [((e["ts"] - origin) / 1000.0, e["dur"] / 1000.0, e["name"]) for e in group]
    return result


def draw_gantt(axes, bars_by_rank, title):
    """One row per rank, one bar per action coloured by kind, compute bars labelled by microbatch."""
    ranks = sorted(bars_by_rank)
    span = max((start + duration for bars in bars_by_rank.values() for start, duration, _ in bars), default=0.0)
    for row, rank in enumerate(ranks):
        for start, duration, name in bars_by_rank[rank]:
            kind, microbatch = split_name(name)
            colour = KIND_COLOURS.get(kind, "tab:gray")
            height = 0.8 if kind in ("Forward", "Backward", "BackwardInput", "BackwardWeight", "Recompute", "Step", "AllReduce") else 0.35
            axes.broken_barh([(start, max(duration, span * 1e-3))], (row - height / 2, height), facecolors=colour,
                             edgecolor="black", linewidth=0.3)
            if microbatch is not None and kind in ("Forward", "Backward", "BackwardInput", "BackwardWeight", "Recompute") and duration > 0.015 * span:
                axes.text(start + duration / 2, row, str(microbatch), ha="center", va="center", fontsize=7,
                          color="white", clip_on=True)
    axes.set_yticks(range(len(ranks)))
    axes.set_yticklabels([f"rank {rank}" for rank in ranks])
    axes.set_ylim(len(ranks) - 0.5, -0.5)
    axes.set_xlim(0, span * 1.01 if span > 0 else 1)
    axes.set_title(title, fontsize=10)
    axes.grid(axis="x", alpha=0.3)


def plot_gantt(plt, panels, out_path):
    """panels: [(title, bars_by_rank)], drawn one above the other on a shared time axis."""
    from matplotlib.patches import Patch
    rows = sum(len(bars) for _, bars in panels)
    figure, axes_list = plt.subplots(len(panels), 1, figsize=(12, 1.0 + 0.55 * rows + 0.6 * len(panels)),
                                     sharex=True, squeeze=False)
    for axes, (title, bars) in zip(axes_list[:, 0], panels):
        draw_gantt(axes, bars, title)
    span = max(start + duration for _, bars in panels for b in bars.values() for start, duration, _ in b)
    axes_list[-1, 0].set_xlim(0, span * 1.01)
    axes_list[-1, 0].set_xlabel("ms from the step's start (bars: microbatch number)")
    axes_list[0, 0].legend(handles=[Patch(facecolor=KIND_COLOURS[kind], edgecolor="black", label=label)
                                    for label, kind in KIND_LEGEND],
                           loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, borderaxespad=0)
    figure.tight_layout()
    figure.savefig(out_path, dpi=110)
    plt.close(figure)


def median_step(records, trace_steps):
    """The step (among those in the trace) whose measured seconds is the median; the first step
    (warm-up) only when it is the only one."""
    candidates = [r for r in records if r.get("step") in trace_steps and isinstance(r.get("seconds"), (int, float))]
    if len(candidates) > 1:
        candidates = [r for r in candidates if r["step"] != min(trace_steps)] or candidates
    if not candidates:
        return min(trace_steps)
    candidates.sort(key=lambda r: r["seconds"])
    return candidates[(len(candidates) - 1) // 2]["step"]


def simulate_plan(partrain, plan_path, out_path, step):
    """Runs `partrain simulate PLAN --trace-out OUT --step N`; returns OUT or None with a message."""
    try:
        result = subprocess.run([partrain, "simulate", plan_path, "--trace-out", out_path, "--step", str(step)],
                                capture_output=True, text=True)
    except OSError as error:
        print(f"plot_run: cannot run {partrain}: {error}; no predicted timeline")
        return None
    if result.returncode != 0:
        print(f"plot_run: {partrain} simulate failed: {result.stderr.strip()}; no predicted timeline")
        return None
    return out_path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's [log] dir (metrics.jsonl, trace.json, plan.json)")
    parser.add_argument("--out", help="where to write the PNGs (default: RUN_DIR)")
    parser.add_argument("--trace", default="trace.json", help="trace file name in RUN_DIR (default trace.json)")
    parser.add_argument("--step", type=int, help="the step to draw (the trace's args.step; default: the median-duration step)")
    parser.add_argument("--predicted", help="a predicted trace (partrain simulate --trace-out); default: simulate RUN_DIR/plan.json")
    parser.add_argument("--partrain", default=os.path.join(ROOT, "build/cpu/bin/partrain"),
                        help="partrain binary for the simulation (default: build/cpu/bin/partrain)")
    args = parser.parse_args()
    # Paths first (one line, exit 2), before matplotlib: a wrong path is reported everywhere.
    if not os.path.isdir(args.run_dir):
        fail(f"RUN_DIR {args.run_dir}: no such directory")
    if not os.path.exists(os.path.join(args.run_dir, "metrics.jsonl")) and not os.path.exists(os.path.join(args.run_dir, args.trace)):
        fail(f"RUN_DIR {args.run_dir} has neither metrics.jsonl nor {args.trace}")
    if args.predicted:
        require_file(args.predicted, "--predicted")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy  # noqa: F401  (matplotlib needs it; a missing one is reported the same way)
    except ImportError:
        print("plot_run: matplotlib is not installed; skipping")
        return 0

    metrics_path = os.path.join(args.run_dir, "metrics.jsonl")
    trace_path = os.path.join(args.run_dir, args.trace)
    if not os.path.exists(metrics_path) and not os.path.exists(trace_path):
        print(f"plot_run: {args.run_dir} has neither metrics.jsonl nor {args.trace}", file=sys.stderr)
        return 1
    out_dir = args.out or args.run_dir
    os.makedirs(out_dir, exist_ok=True)
    title = os.path.basename(os.path.normpath(args.run_dir))

    records = []
    if os.path.exists(metrics_path):
        records = read_metrics(metrics_path)
        if records:
            path = os.path.join(out_dir, "curves.png")
            plot_curves(plt, records, path, f"{title}: {len(records)} steps")
            print(f"plot_run: wrote {path}")
        else:
            print(f"plot_run: {metrics_path} is empty")
    else:
        print(f"plot_run: no {metrics_path}; no curves")

    if not os.path.exists(trace_path):
        print(f"plot_run: no {trace_path} (set [log] trace = \"trace.json\"); no timeline")
        return 0
    events = read_trace(trace_path)
    trace_steps = sorted({e.get("args", {}).get("step") for e in events} - {None})
    if not trace_steps:
        print("plot_run: the trace has no complete events to draw")
        return 0
    step = args.step if args.step is not None else median_step(records, trace_steps)
    if step not in trace_steps:
        print(f"plot_run: step {step} is not in {trace_path} (steps {trace_steps[0]}..{trace_steps[-1]})", file=sys.stderr)
        return 1
    measured = step_events(events, step)
    seconds = {r["step"]: r.get("seconds") for r in records}
    measured_title = f"{title}: measured step {step}" + (f" ({1e3 * seconds[step]:.1f} ms)" if seconds.get(step) else "")
    panels = [(measured_title, measured)]

    predicted_path = args.predicted
    plan_path = os.path.join(args.run_dir, "plan.json")
    if predicted_path is None and os.path.exists(plan_path):
        if os.access(args.partrain, os.X_OK):
            predicted_path = simulate_plan(args.partrain, plan_path, os.path.join(out_dir, "predicted-trace.json"), step)
        else:
            print(f"plot_run: no partrain binary at {args.partrain} (--partrain); no predicted timeline")
    if predicted_path:
        predicted_events = read_trace(predicted_path)
        predicted_steps = sorted({e.get("args", {}).get("step") for e in predicted_events} - {None})
        if predicted_steps:
            predicted = step_events(predicted_events, predicted_steps[0])
            span = max(s + d for bars in predicted.values() for s, d, _ in bars)
            panels.append((f"{title}: predicted step (simulated schedule, plan's stage costs; {span:.1f} ms)", predicted))
            path = os.path.join(out_dir, "predicted.png")
            plot_gantt(plt, panels[1:], path)
            print(f"plot_run: wrote {path}")
    path = os.path.join(out_dir, "timeline.png")
    plot_gantt(plt, panels, path)
    print(f"plot_run: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
