#!/usr/bin/python3
"""CTest plot_run_gantt: a real 2-rank run's plots and the simulated trace.

    check_plot_run.py SOURCE_DIR PARTRAIN WORK_DIR MPIEXEC [MPIEXEC_FLAG ...]

Trains gpt-tiny for 3 steps on 2 ranks (2 stages, gpipe, 2 microbatches, analytic costs) with a
trace; checks that `partrain simulate plan.json --trace-out` writes one event per action of the
plan's schedule (the same (rank, action) multiset as one step of the executor's trace, which holds
one event per executed action); runs validation/plot_run.py and checks curves.png, timeline.png and
predicted.png exist and are real images (PNG signature, size, several distinct colours).
Exits 77 (CTest SKIP_RETURN_CODE) when matplotlib is missing, 1 on a failure (with the reason).
"""
import collections
import json
import os
import shutil
import subprocess
import sys


def fail(message):
    print(f"check_plot_run: FAIL: {message}")
    sys.exit(1)


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        fail(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def events_of(path):
    with open(path) as file:
        document = json.load(file)
    return [e for e in document["traceEvents"] if e.get("ph") == "X"]


def distinct_colours(path):
    import matplotlib.image
    pixels = matplotlib.image.imread(path)
    return len({tuple(p) for p in (pixels[::4, ::4, :3] * 255).astype(int).reshape(-1, 3).tolist()})


def colour_share(path, hex_colour):
    """Share of the image's pixels within a few levels of hex_colour (e.g. the forward bars')."""
    import matplotlib.image
    import numpy
    pixels = (matplotlib.image.imread(path)[:, :, :3] * 255).astype(int)
    target = numpy.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])
    return float((numpy.abs(pixels - target).max(axis=2) <= 3).mean())


def main():
    if len(sys.argv) < 5:
        print(__doc__)
        return 2
    source, partrain, work, mpiexec = sys.argv[1:5]
    mpiexec_flags = [flag for flag in sys.argv[5:] if flag]
    try:
        import matplotlib  # noqa: F401
        import numpy  # noqa: F401
    except ImportError:
        print(f"check_plot_run: matplotlib is not installed for {sys.executable} (Debian: python3-matplotlib); skipping")
        return 77
    shutil.rmtree(work, ignore_errors=True)
    run_dir, plots = os.path.join(work, "run"), os.path.join(work, "plots")
    run([mpiexec, "-np", "2", *mpiexec_flags, partrain, "train", os.path.join(source, "configs/gpt-tiny.toml"),
         "--set", "train.steps=3", "--set", "train.microbatches=2", "--set", "parallel.planner=manual",
         "--set", "parallel.stages=2", "--set", "parallel.replicas=[1,1]", "--set", 'parallel.boundaries=["h.1"]',
         "--set", "parallel.schedule=gpipe", "--set", "profile.enabled=false", "--set", f"log.dir={run_dir}",
         "--set", "log.trace=trace.json", "--set", "checkpoint.every=0",
         "--set", f"data.path={os.path.join(source, 'data/prepared/text.h5')}"])

    simulated = os.path.join(work, "simulated.json")
    output = run([partrain, "simulate", os.path.join(run_dir, "plan.json"), "--trace-out", simulated, "--step", "2"])
    if "simulated:" not in output:
        fail(f"partrain simulate printed no 'simulated:' line:\n{output}")
    predicted_events = events_of(simulated)
    measured_step = collections.Counter((e["pid"], e["name"]) for e in events_of(os.path.join(run_dir, "trace.json"))
                                        if e["args"]["step"] == 2)
    predicted = collections.Counter((e["pid"], e["name"]) for e in predicted_events)
    if not measured_step or predicted != measured_step:
        fail(f"the simulated trace's actions differ from one executed step's: simulated {sorted(predicted.items())}, "
             f"executed {sorted(measured_step.items())}")
    if any(e["args"]["step"] != 2 or e["dur"] < 0 or e["ts"] < 0 for e in predicted_events):
        fail("a simulated event has another step, a negative start or a negative duration")

    print(run(["/usr/bin/python3", os.path.join(source, "validation/plot_run.py"), run_dir, "--out", plots,
               "--partrain", partrain]), end="")
    for name, minimum_colours in (("curves.png", 3), ("timeline.png", 6), ("predicted.png", 5)):
        path = os.path.join(plots, name)
        if not os.path.exists(path):
            fail(f"plot_run.py wrote no {path}")
        with open(path, "rb") as file:
            if file.read(8) != b"\x89PNG\r\n\x1a\n":
                fail(f"{path} is not a PNG")
        size, colours = os.path.getsize(path), distinct_colours(path)
        if size < 10_000 or colours < minimum_colours:
            fail(f"{path} looks empty: {size} bytes, {colours} distinct colours")
        print(f"check_plot_run: {name}: {size} bytes, {colours} distinct colours")
        if name != "curves.png":
            # The Gantt charts must show forward and backward bars (plot_run.KIND_COLOURS), not just axes.
            for kind, colour in (("forward", "#4c78a8"), ("backward", "#54a24b")):
                share = colour_share(path, colour)
                if share < 0.005:
                    fail(f"{path}: {kind} bars cover {100 * share:.2f}% of the image (expected at least 0.5%)")
                print(f"check_plot_run: {name}: {kind} bars cover {100 * share:.1f}% of the image")
    print(f"check_plot_run: simulated trace: {len(predicted_events)} events, one per action of the schedule")
    return 0


if __name__ == "__main__":
    sys.exit(main())
