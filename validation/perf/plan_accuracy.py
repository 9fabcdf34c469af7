#!/usr/bin/python3
"""Plan accuracy benchmark: predicted vs measured step time and peak memory over a set of plans,
and the rannc planner's regret (docs/planning.md §Predictions).

    validation/perf/plan_accuracy.py [--ranks 2|4] [--steps 12] [--models bert,gpt,resnet]
                                     [--cold] [--out runs/plan-accuracy] [--binary build/cpu/bin/partrain]

A benchmark; with --max-regret / --max-error also a check (ctest -R plan_regret). For each tiny model it trains a set of manual plans
(1-2 stages on 2 ranks; with --ranks 4 also unequal replicas and 3-4 stages; gpipe/1f1b/scp,
recompute none/selective/layers/boundaries, several microbatch counts) and the plan the default planner (rannc) picks, each
with `mpirun -np RANKS partrain train ... --set profile.enabled=true`, so every prediction comes from
costs profiled on the ranks (ProfileDB cached in --profile-cache; --cold deletes it first). From each
run's plan.json and metrics.jsonl it takes the predicted step time (plan.predicted_step_seconds) vs
the measured one (median of `seconds` over the steps after the first, as the run's own
"prediction error:" line), and each stage's predicted peak memory vs the largest measured
`rank_peak_memory_bytes` of its ranks. Prints one table row per plan, then per model the regret:
measured step time of rannc's plan / fastest measured plan of the set (rannc's included).
The "load" column is the 1-minute load average after the run: on a shared machine other processes
inflate the measured times (and the profiled costs, when the cache is cold) — compare with nproc.
Exit code 0 when every run finished, 1 when one failed (its log is named), 2 on a bad command line,
3 when a --max-regret / --max-error check fails (the regret test, ctest -R plan_regret).
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # validation/: script_errors
from script_errors import ArgumentParser, fail, read_json, require_output_directory  # noqa: E402

# Per model: config, boundaries for 2, 3 and 4 stages (ctest/validation/distributed_training.cpp).
MODELS = {
    "bert": ("configs/bert-tiny.toml", {2: ["encoder.layer.1"], 3: ["encoder.layer.0", "encoder.layer.1"],
                                         4: ["encoder.layer.0", "encoder.layer.1", "pooler"]}),
    "gpt": ("configs/gpt-tiny.toml", {2: ["h.1"], 3: ["h.0", "h.1"], 4: ["h.0", "h.1", "ln_f"]}),
    "resnet": ("configs/resnet-tiny.toml", {2: ["layer3.0"], 3: ["layer2.0", "layer3.0"],
                                             4: ["layer2.0", "layer3.0", "layer4.0"]}),
}


def plan_set(model, ranks):
    """The manual plans for one model: (name, replicas per stage, schedule, recompute, microbatches)."""
    plans = [
        ("dp", [ranks], "1f1b", "none", 1),
        ("dp", [ranks], "1f1b", "none", 2),
        ("2st", [1, 1], "gpipe", "none", 2),
        ("2st", [1, 1], "gpipe", "none", 4),
        ("2st", [1, 1], "1f1b", "none", 8),
        ("2st", [1, 1], "1f1b", "boundaries", 4),
        ("2st", [1, 1], "scp", "boundaries", 4),
        ("2st", [1, 1], "1f1b", "none", 4),  # the same plan as the next three, without recomputation
        ("2st", [1, 1], "1f1b", "selective", 4),
        ("2st", [1, 1], "1f1b", "layers", 4),
    ]
    if ranks >= 4:
        plans += [
            ("2st", [2, 2], "1f1b", "none", 4),
            ("4st", [1, 1, 1, 1], "1f1b", "boundaries", 4),
            ("4st", [1, 1, 1, 1], "gpipe", "none", 8),
        ]
        # Unequal replicas only for the transformers: the validation tests run ResNet (BatchNorm)
        # with equal replicas only.
        if model != "resnet":
            plans += [("2st", [3, 1], "1f1b", "none", 4), ("3st", [2, 1, 1], "gpipe", "boundaries", 4)]
    return plans


def placement_stages(plan):
    """Stage of every rank (Plan::placement_of: pipeline-replica-major, then stage, then replica)."""
    per_pipeline_replica = []
    for stage, entry in enumerate(plan["stages"]):
        per_pipeline_replica += [stage] * entry["replicas"]
    return per_pipeline_replica * plan["pipeline_replicas"]


def read_run(directory):
    """(plan, metrics rows) of a finished run."""
    with open(os.path.join(directory, "plan.json")) as file:
        plan = json.load(file)
    rows = []
    with open(os.path.join(directory, "metrics.jsonl")) as file:
        for line in file:
            if line.strip():
                rows.append(json.loads(line))
    return plan, rows


def measured_figures(plan, rows):
    """Measured median step seconds (steps after the first) and per-stage peak bytes."""
    seconds = [row["seconds"] for row in rows]
    if len(seconds) > 1:
        seconds = seconds[1:]
    stages = placement_stages(plan)
    peaks = [0.0] * len(plan["stages"])
    for row in rows:
        # Net of what the process held before the stage was built (runs that log it), as the
        # run's own prediction error line reports.
        baselines = row.get("rank_baseline_bytes", [])
        for rank, value in enumerate(row.get("rank_peak_memory_bytes", [])):
            net = value - (baselines[rank] if rank < len(baselines) else 0.0)
            peaks[stages[rank]] = max(peaks[stages[rank]], net)
    return statistics.median(seconds), peaks


def compute_medians(path, stages):
    """{(stage, kind): [seconds]} of the compute actions of a trace (steps after the first), and the
    optimizer Step's ms per step (slowest rank)."""
    with open(path) as file:
        events = [e for e in json.load(file)["traceEvents"] if e.get("ph") == "X" and e["args"]["step"] > 1]
    step_ms, compute = {}, {}
    for e in events:
        kind = e["name"].split(" mb ")[0]
        if kind == "Step":
            step_ms[e["args"]["step"]] = max(step_ms.get(e["args"]["step"], 0.0), e["dur"] / 1e3)
        elif kind in ("Forward", "Backward", "BackwardInput", "BackwardWeight", "Recompute"):
            compute.setdefault((stages[e["pid"]], kind), []).append(e["dur"] / 1e6)
    return compute, step_ms


def trace_figures(plan, directory, simulated_trace=None):
    """From the run's trace (steps after the first): the optimizer Step's ms (slowest rank, median
    over steps) and measured / predicted compute of one microbatch (forward + backward + recompute
    over the stages; each action kind's median). Predicted: each action's duration in
    `simulated_trace` (partrain simulate's trace of the plan: where ranks share their node's cores,
    the work stretched by the ranks computing beside it), else the plan's per-stage costs."""
    path = os.path.join(directory, "trace.json")
    if not os.path.exists(path):
        return float("nan"), float("nan")
    stages = placement_stages(plan)
    compute, step_ms = compute_medians(path, stages)
    simulated = {}
    if simulated_trace and os.path.exists(simulated_trace):
        with open(simulated_trace) as file:
            for e in json.load(file)["traceEvents"]:
                kind = e.get("name", "").split(" mb ")[0]
                if e.get("ph") == "X" and kind in ("Forward", "Backward", "BackwardInput", "BackwardWeight", "Recompute"):
                    simulated.setdefault((stages[e["pid"]], kind), []).append(e["dur"] / 1e6)
    # The simulator's per-action costs (TimelineCosts::from_plan): a recomputing stage's backward
    # is the plan's backward minus one forward, its Recompute one forward; only the (stage, kind)
    # pairs the schedule runs count (scp's last stage never recomputes).
    def predicted_cost(stage, kind):
        if (stage, kind) in simulated:
            return statistics.median(simulated[(stage, kind)])
        entry = plan["stages"][stage]
        # Per-layer and selective recomputation run inside the Backward (no Recompute action).
        recomputes = entry["recompute"] in ("boundaries", "stage_aware")
        backward = entry["backward_seconds"]
        if recomputes:
            backward = max(0.0, backward - entry["forward_seconds"])
        weight = min(entry.get("weight_gradient_seconds", 0.0), backward)  # zero bubble: W's share
        if kind == "Backward":
            return backward
        if kind == "BackwardInput":
            return backward - weight
        if kind == "BackwardWeight":
            return weight
        return entry["forward_seconds"]
    measured = sum(statistics.median(v) for v in compute.values())
    predicted = sum(predicted_cost(stage, kind) for stage, kind in compute)
    return (statistics.median(step_ms.values()) if step_ms else float("nan"),
            measured / predicted if predicted > 0 else float("nan"))


def error(measured, predicted):
    return (measured - predicted) / predicted if predicted > 0 else float("nan")


def describe(plan):
    replicas = ",".join(str(stage["replicas"]) for stage in plan["stages"])
    policies = sorted({stage["recompute"] for stage in plan["stages"]} - {"none"})
    recompute = ",".join("rc" if p == "boundaries" else p for p in policies) or "-"
    copies = f" x{plan['pipeline_replicas']}" if plan["pipeline_replicas"] > 1 else ""
    return f"{len(plan['stages'])}st [{replicas}]{copies} {plan['schedule']} M={plan['microbatches']} {recompute}"


def run_one(args, model, label, settings, out_dir):
    """Trains one plan; returns a result dict (or None on failure, after printing the log's tail)."""
    config, _ = MODELS[model]
    directory = os.path.join(out_dir, f"{model}-{label}")
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    log_path = directory + ".log"
    command = ["mpirun", "-np", str(args.ranks)] + (["--oversubscribe"] if args.ranks > os.cpu_count() else []) + [
        args.binary, "train", config, "--set", f"train.steps={args.steps}", "--set", f"log.dir={directory}",
        "--set", "log.trace=trace.json", "--set", "checkpoint.every=0", "--set", f"log.every={args.steps}",
        "--set", "profile.enabled=true", "--set", f"profile.cache_dir={args.profile_cache}",
        "--set", "profile.replan_threshold=0"]  # the plan's own prediction, not a corrected one
    for setting in settings:
        command += ["--set", setting]
    start = time.monotonic()
    with open(log_path, "w") as log:
        status = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
    wall = time.monotonic() - start
    with open(log_path) as log:
        text = log.read()
    if status != 0:
        print(f"plan_accuracy: {model} {label} failed (exit {status}); log {log_path}:\n" + text[-1500:], file=sys.stderr)
        return None
    plan, rows = read_run(directory)
    measured, peaks = measured_figures(plan, rows)
    _, first_peaks = measured_figures(plan, rows[:1])
    # The plan's own timeline (partrain simulate): the durations the prediction gave each action.
    simulated_trace = os.path.join(directory, "simulated-trace.json")
    subprocess.run([args.binary, "simulate", os.path.join(directory, "plan.json"), "--trace-out", simulated_trace,
                    "--step", "2"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    optimizer_ms, compute_ratio = trace_figures(plan, directory, simulated_trace)
    profiled = re.search(r"profile: measured (\d+) task sets", text)
    line = re.search(r"^prediction error: .*$", text, re.MULTILINE)
    return {"model": model, "label": label, "plan": describe(plan), "planner": plan["planner"],
            "predicted_s": plan["predicted_step_seconds"], "measured_s": measured,
            "time_error": error(measured, plan["predicted_step_seconds"]),
            "predicted_mem": [s["memory_bytes"] for s in plan["stages"]], "measured_mem": peaks,
            "mem_errors": [error(m, s["memory_bytes"]) for m, s in zip(peaks, plan["stages"])],
            "first_step_mem_errors": [error(m, s["memory_bytes"]) for m, s in zip(first_peaks, plan["stages"])],
            "optimizer_ms": optimizer_ms, "compute_ratio": compute_ratio,
            "profiled_sets": int(profiled.group(1)) if profiled else 0, "wall_s": wall, "load": os.getloadavg()[0],
            "error_line": line.group(0) if line else ""}


def rescaled_error(r):
    """Step-time error once the prediction is given the run's own compute speed and optimizer step:
    predicted × (measured / predicted compute) + optimizer ms. What is left is the schedule model's
    error (transfers, waits, overheads), not the profile's."""
    return error(r["measured_s"], r["predicted_s"] * r["compute_ratio"] + r["optimizer_ms"] / 1e3)


def percent(value):
    return "n/a" if value != value else f"{100 * value:+.1f}%"


def print_table(results):
    print("| model | plan | planner | predicted ms | measured ms | time error | peak MiB per stage (measured/predicted) "
          "| memory error per stage (step 1) | compute meas/pred | optimizer ms | time error, rescaled | profiled sets "
          "| wall s | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        memory = " ".join(f"{m / 2**20:.1f}/{p / 2**20:.1f}" for m, p in zip(r["measured_mem"], r["predicted_mem"]))
        memory_errors = " ".join(f"{percent(e)} ({percent(f)})" for e, f in zip(r["mem_errors"], r.get("first_step_mem_errors", r["mem_errors"])))
        print(f"| {r['model']} | {r['plan']} | {r['planner']} | {1e3 * r['predicted_s']:.1f} | {1e3 * r['measured_s']:.1f} "
              f"| {percent(r['time_error'])} | {memory} | {memory_errors} | {r['compute_ratio']:.2f} | {r['optimizer_ms']:.1f} "
              f"| {percent(rescaled_error(r))} "
              f"| {r['profiled_sets']} | {r['wall_s']:.0f} "
              f"| {r['load']:.1f} |")


def print_summary(results):
    print("\n| model | rannc's plan | rannc measured ms | fastest plan of the set | fastest ms | regret |")
    print("|---|---|---|---|---|---|")
    for model in dict.fromkeys(r["model"] for r in results):
        mine = [r for r in results if r["model"] == model]
        rannc = [r for r in mine if r["label"] == "rannc"]
        fastest = min(mine, key=lambda r: r["measured_s"])
        if rannc:
            regret = rannc[0]["measured_s"] / fastest["measured_s"]
            print(f"| {model} | {rannc[0]['plan']} | {1e3 * rannc[0]['measured_s']:.1f} | {fastest['plan']} "
                  f"({fastest['planner']}) | {1e3 * fastest['measured_s']:.1f} | {regret:.3f} |")
    time_errors = [abs(r["time_error"]) for r in results]
    mem_errors = [abs(e) for r in results for e in r["mem_errors"]]
    within = lambda values: sum(v < 0.10 for v in values)
    print(f"\nstep time: |error| median {100 * statistics.median(time_errors):.1f}%, max {100 * max(time_errors):.1f}%, "
          f"{within(time_errors)} of {len(time_errors)} plans within 10%")
    rescaled = [abs(rescaled_error(r)) for r in results if rescaled_error(r) == rescaled_error(r)]
    if rescaled:
        print(f"step time rescaled (measured compute speed + optimizer step): |error| median "
              f"{100 * statistics.median(rescaled):.1f}%, max {100 * max(rescaled):.1f}%, {within(rescaled)} of "
              f"{len(rescaled)} plans within 10%")
    print(f"peak memory: |error| median {100 * statistics.median(mem_errors):.1f}%, max {100 * max(mem_errors):.1f}%, "
          f"{within(mem_errors)} of {len(mem_errors)} stages within 10%")


def check_goals(args, results, cases_by_model):
    """--max-regret / --max-error: the planner's choice (rannc) must measure within max_regret of the
    fastest plan of its model's set, and every plan's step-time prediction within max_error. A check
    that fails is measured again once (the plans concerned run again, rannc's and the fastest
    interleaved; each keeps its faster measurement): one slow minute of a shared machine is not a
    planner's regret. Returns the failures (empty when every check holds)."""
    failures = []
    for model, cases in cases_by_model.items():
        mine = {r["label"]: r for r in results if r["model"] == model}
        if "rannc" not in mine:
            failures.append(f"{model}: rannc's plan did not run")
            continue
        def regret():
            # A layout measured more than once (rannc's plan is often one of the manual ones) counts
            # with its fastest run: the same plan, minutes apart on a shared machine.
            fastest = min(mine.values(), key=lambda r: r["measured_s"])
            rannc = min((r["measured_s"] for r in mine.values() if r["plan"] == mine["rannc"]["plan"]))
            return rannc / fastest["measured_s"], fastest
        def remeasure(label):
            again = run_one(args, model, label, cases[label], args.out)
            if again is not None and again["measured_s"] < mine[label]["measured_s"]:
                mine[label] = again
        value, fastest = regret()
        if value > args.max_regret:
            print(f"plan_accuracy: {model} regret {value:.3f} > {args.max_regret}: measuring rannc's plan and "
                  f"{fastest['plan']} again", flush=True)
            remeasure("rannc")
            remeasure(fastest["label"])
            value, fastest = regret()
        print(f"plan_accuracy: {model} regret {value:.3f} (rannc {mine['rannc']['plan']} against {fastest['plan']})")
        if value > args.max_regret:
            failures.append(f"{model}: rannc's plan {mine['rannc']['plan']} measures {value:.3f} x the fastest "
                            f"({fastest['plan']}), more than {args.max_regret}")
        for label, result in list(mine.items()):
            if abs(result["time_error"]) > args.max_error:
                print(f"plan_accuracy: {model} {result['plan']}: step-time error {percent(result['time_error'])}: "
                      "measuring it again", flush=True)
                again = run_one(args, model, label, cases[label], args.out)
                if again is not None and abs(again["time_error"]) < abs(result["time_error"]):
                    mine[label] = result = again
            if abs(result["time_error"]) > args.max_error:
                failures.append(f"{model}: {result['plan']} ({label}) predicted {1e3 * result['predicted_s']:.1f} ms, "
                                f"measured {1e3 * result['measured_s']:.1f} ms ({percent(result['time_error'])}), "
                                f"beyond {100 * args.max_error:.0f}%")
    return failures


def main():
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="MPI ranks (default 2; 4 oversubscribes a 2-core machine)")
    parser.add_argument("--steps", type=int, default=12, help="training steps per plan (default 12; the first is not counted)")
    parser.add_argument("--models", default="bert,gpt,resnet", help="comma-separated subset of bert,gpt,resnet")
    parser.add_argument("--out", default=os.path.join(ROOT, "runs/plan-accuracy"), help="run directories and logs")
    parser.add_argument("--binary", default=os.path.join(ROOT, "build/cpu/bin/partrain"))
    parser.add_argument("--profile-cache", default=os.path.join(ROOT, "runs/profile-cache"),
                        help="ProfileDB cache directory (default runs/profile-cache)")
    parser.add_argument("--cold", action="store_true", help="delete the profile cache first (every model profiles again)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per run before it is killed (default 300)")
    parser.add_argument("--json", help="also write every result as JSON here")
    parser.add_argument("--plans", default="", help="only the plans whose label contains this (e.g. -1f1b-), and rannc's")
    parser.add_argument("--report", metavar="JSON", help="only print the tables of a --json file written before")
    parser.add_argument("--max-regret", type=float, default=0,
                        help="check: exit 3 when rannc's plan measures more than this times the fastest plan of "
                             "its set (e.g. 1.10; 0: no check)")
    parser.add_argument("--max-error", type=float, default=0,
                        help="check: exit 3 when a step-time prediction is off by more than this share "
                             "(e.g. 0.25; 0: no check)")
    args = parser.parse_args()
    if args.report:
        saved = read_json(args.report, "--report")
        if not isinstance(saved, dict) or not {"environment", "results"} <= saved.keys():
            fail(f"--report {args.report}: not a --json file of plan_accuracy.py (no environment and results)")
        print(f"plan_accuracy: {saved['environment']}\n")
        print_table(saved["results"])
        print_summary(saved["results"])
        return 0
    models = args.models.split(",")
    if args.ranks not in (2, 4) or args.steps < 2 or any(m not in MODELS for m in models):
        parser.error("--ranks must be 2 or 4, --steps at least 2, --models from bert,gpt,resnet")
    if not os.access(args.binary, os.X_OK):
        parser.error(f"--binary {args.binary}: not an executable; build it: cmake --build --preset cpu --target partrain")
    if args.json:
        require_output_directory(args.json, "--json")
    if args.cold:
        shutil.rmtree(args.profile_cache, ignore_errors=True)
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as error:
        fail(f"--out {args.out}: cannot make the directory ({error.strerror})")
    env_note = f"{args.ranks} ranks on {os.cpu_count()} cores, {args.steps} steps per plan, load average before " + \
               " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"plan_accuracy: {env_note}", flush=True)

    results, failed = [], 0
    cases_by_model = {}
    start = time.monotonic()
    for model in models:
        _, boundaries = MODELS[model]
        cases = [("rannc", ["parallel.planner=rannc"])]
        for name, replicas, schedule, recompute, microbatches in plan_set(model, args.ranks):
            stages = len(replicas)
            label = f"{name}{''.join(map(str, replicas))}-{schedule}-{recompute}-m{microbatches}"
            if args.plans not in label:
                continue
            bounds = ",".join(f'"{b}"' for b in boundaries.get(stages, []))
            cases.append((label, ["parallel.planner=manual", f"parallel.stages={stages}",
                                  f"parallel.replicas=[{','.join(map(str, replicas))}]", f"parallel.boundaries=[{bounds}]",
                                  f"parallel.schedule={schedule}", f"parallel.recompute={recompute}",
                                  f"train.microbatches={microbatches}"]))
        cases_by_model[model] = dict(cases)
        for label, settings in cases:
            result = run_one(args, model, label, settings, args.out)
            if result is None:
                failed += 1
                continue
            results.append(result)
            print(f"  {model:6s} {result['plan']:32s} predicted {1e3 * result['predicted_s']:8.1f} ms, measured "
                  f"{1e3 * result['measured_s']:8.1f} ms ({percent(result['time_error'])}), memory "
                  f"{' '.join(percent(e) for e in result['mem_errors'])}, {result['wall_s']:.0f} s", flush=True)
    print(f"\nplan_accuracy: {len(results)} runs in {time.monotonic() - start:.0f} s, load average after "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()) + "\n")
    if results:
        print_table(results)
        print_summary(results)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"environment": env_note, "results": results}, file, indent=1)
    if failed:
        return 1
    if args.max_regret > 0 or args.max_error > 0:
        if args.max_regret <= 0:
            args.max_regret = float("inf")
        if args.max_error <= 0:
            args.max_error = float("inf")
        failures = check_goals(args, results, cases_by_model)
        for failure in failures:
            print(f"plan_accuracy: FAILED: {failure}")
        if failures:
            return 3
        print("plan_accuracy: every check holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
