#!/usr/bin/python3
"""Plots a partrain run: loss and throughput curves from metrics.jsonl, the pipeline timeline from
the Chrome trace.

    validation/plot_run.py RUN_DIR [--out DIR] [--trace FILE] [--steps FIRST:LAST]

RUN_DIR is a run's [log] dir (runs/<config name>/ by default). Writes DIR/curves.png (loss, and
eval_loss when the run evaluated; samples/s) and DIR/timeline.png (one row per rank, one bar per
action coloured by category: compute, communication, optimizer); DIR defaults to RUN_DIR. Without
matplotlib (Debian: python3-matplotlib) it prints a message and exits 0.
"""
import argparse
import json
import os
import sys


def read_metrics(path):
    records = []
    with open(path) as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise SystemExit(f"plot_run: {path}:{number}: not JSON: {error}")
            if not isinstance(record, dict) or "step" not in record:
                raise SystemExit(f"plot_run: {path}:{number}: not an object with a step")
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


CATEGORY_COLOURS = {"compute": "tab:blue", "communication": "tab:orange", "optimizer": "tab:green"}


def plot_timeline(plt, trace, out_path, title, step_range):
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {e["pid"]: e.get("args", {}).get("name", f"pid {e['pid']}")
             for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    complete = [e for e in events if e.get("ph") == "X"]
    if step_range is not None:
        first, last = step_range
        complete = [e for e in complete if first <= e.get("args", {}).get("step", 0) <= last]
    if not complete:
        print("plot_run: the trace has no complete events to draw")
        return False
    origin = min(e["ts"] for e in complete)
    pids = sorted({e["pid"] for e in complete})
    row = {pid: index for index, pid in enumerate(pids)}
    figure, axes = plt.subplots(figsize=(12, 1.2 + 0.6 * len(pids)))
    by_category = {}
    for e in complete:
        by_category.setdefault(e.get("cat", "other"), []).append(e)
    order = list(CATEGORY_COLOURS) + sorted(set(by_category) - set(CATEGORY_COLOURS))
    for category in [c for c in order if c in by_category]:
        group = by_category[category]
        colour = CATEGORY_COLOURS.get(category, "tab:gray")
        label = category   # one legend entry per category
        for pid in pids:
            bars = [((e["ts"] - origin) / 1000.0, e["dur"] / 1000.0) for e in group if e["pid"] == pid]
            if bars:
                axes.broken_barh(bars, (row[pid] - 0.4, 0.8), facecolors=colour, edgecolor="black",
                                 linewidth=0.3, label=label)
                label = None
    # Short names on the bars when there is room (few events).
    if len(complete) <= 150:
        span = max(e["ts"] + e["dur"] for e in complete) - origin
        for e in complete:
            if e["dur"] > 0.04 * span:
                axes.text((e["ts"] - origin + e["dur"] / 2) / 1000.0, row[e["pid"]], short_name(e["name"]),
                          ha="center", va="center", fontsize=6, clip_on=True)
    axes.set_yticks(range(len(pids)))
    axes.set_yticklabels([names.get(pid, f"rank {pid}") for pid in pids])
    axes.invert_yaxis()
    axes.set_xlabel("ms since the run started on each rank")
    axes.set_title(title)
    axes.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, borderaxespad=0)
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    figure.savefig(out_path, dpi=110)
    plt.close(figure)
    return True


def short_name(name):
    words = name.split()
    if len(words) >= 3 and words[-2] == "mb":   # "Forward mb 3" -> "F3"
        return words[0][0] + words[-1]
    return name if len(name) <= 12 else name[:11] + "…"


def parse_steps(text):
    try:
        first, last = text.split(":")
        return int(first), int(last)
    except ValueError:
        raise argparse.ArgumentTypeError("expected FIRST:LAST, e.g. 2:3")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's [log] dir (metrics.jsonl, trace.json)")
    parser.add_argument("--out", help="where to write the PNGs (default: RUN_DIR)")
    parser.add_argument("--trace", default="trace.json", help="trace file name in RUN_DIR (default trace.json)")
    parser.add_argument("--steps", type=parse_steps, help="timeline only for steps FIRST:LAST (the trace's args.step)")
    args = parser.parse_args()

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

    if os.path.exists(trace_path):
        with open(trace_path) as file:
            trace = json.load(file)
        path = os.path.join(out_dir, "timeline.png")
        label = f"{title}: pipeline timeline" + (f", steps {args.steps[0]}-{args.steps[1]}" if args.steps else "")
        if plot_timeline(plt, trace, path, label, args.steps):
            print(f"plot_run: wrote {path}")
    else:
        print(f"plot_run: no {trace_path} (set [log] trace = \"trace.json\"); no timeline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
