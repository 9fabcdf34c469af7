#!/usr/bin/python3
"""The user-facing validation scripts (validation/*.py, validation/golden/make_golden.py and the
benchmark scripts of validation/perf/) answer bad paths, files, arguments and settings with one line
"<script>: error: ..." naming what is wrong, and exit status 2 - never a Python traceback or a shell
error (issue 30). Runs with or without h5py / torch / matplotlib: the checks come before those
imports (and before make_golden.py and cpu_training_benchmark.sh would make their venvs).

    check_script_errors.py SOURCE_DIR SCRATCH_DIR
"""
import os
import subprocess
import sys


def main():
    source, scratch = sys.argv[1], sys.argv[2]
    os.makedirs(scratch, exist_ok=True)
    not_toml = os.path.join(scratch, "not-toml.toml")
    with open(not_toml, "w") as f:
        f.write("[model\ntype = gpt\n")
    not_json = os.path.join(scratch, "run")
    os.makedirs(not_json, exist_ok=True)
    with open(os.path.join(not_json, "metrics.jsonl"), "w") as f:
        f.write('{"step": 1, "loss": 2.0}\n{"step": 2, loss\n')
    config = os.path.join(source, "configs", "gpt-tiny.toml")
    missing = os.path.join(scratch, "no-such-file.h5")
    missing_binary = os.path.join(scratch, "no-such-partrain")
    not_partrain = os.path.join(scratch, "not-partrain")  # an executable that is no partrain
    with open(not_partrain, "w") as f:
        f.write("#!/bin/sh\necho hello\n")
    os.chmod(not_partrain, 0o755)
    cases = [  # (script under validation/, arguments, text the error line must hold[, environment])
        ("export_hf.py", [missing, os.path.join(scratch, "out.bin")], f"CHECKPOINT {missing}: no such file"),
        ("export_hf.py", [config, os.path.join(scratch, "no-dir", "out.bin")], "no directory"),
        ("export_hf.py", [config, os.path.join(scratch, "out.bin"), "--check", "--data", missing], f"--data {missing}"),
        ("export_hf.py", [config, os.path.join(scratch, "out.bin"), "--config", missing], f"--config {missing}"),
        ("export_hf.py", [config, os.path.join(scratch, "out.bin"), "--partrain", missing], f"--partrain {missing}"),
        ("import_hf.py", [missing, os.path.join(scratch, "x.h5"), "--config", config], f"SOURCE {missing}"),
        ("import_hf.py", ["--from-config", os.path.join(scratch, "x.h5"), "--config", missing], f"--config {missing}"),
        ("import_hf.py", ["--from-config", os.path.join(scratch, "x.h5"), "--config", not_toml], "not TOML"),
        ("import_hf.py", ["--from-config", os.path.join(scratch, "x.h5"), "--config", config, "--set", "nodot=1"],
         "--set nodot=1"),
        ("plot_run.py", [missing], f"RUN_DIR {missing}: no such directory"),
        ("plot_run.py", [scratch], "has neither metrics.jsonl"),
        ("golden/make_golden.py", ["llama"], "unknown model 'llama'"),
        ("golden/make_golden.py", ["--partrain", missing_binary, "gpt"], f"--partrain {missing_binary}: no such executable"),
        ("golden/make_golden.py", ["--partrain", not_partrain, "gpt"], f"--partrain {not_partrain}: not a partrain binary"),
        ("golden/make_golden.py", ["--out", missing, "gpt"], f"--out {missing}: no such directory"),
        ("golden/make_golden.py", ["--frobnicate"], "unrecognized arguments: --frobnicate"),
        ("perf/plan_accuracy.py", ["--report", missing], f"--report {missing}: no such file"),
        ("perf/plan_accuracy.py", ["--report", not_toml], f"--report {not_toml}: not JSON"),
        ("perf/plan_accuracy.py", ["--ranks", "3"], "--ranks must be 2 or 4"),
        ("perf/plan_accuracy.py", ["--binary", missing_binary], f"--binary {missing_binary}: not an executable"),
        ("perf/recompute_benchmark.py", ["--rounds", "many"], "argument --rounds: invalid int value"),
        ("perf/recompute_benchmark.py", ["--binary", missing_binary], f"--binary {missing_binary}: not an executable"),
        ("perf/pytorch_reference.py", ["--model", "llama"], "argument --model: invalid choice"),
        ("perf/pytorch_reference.py", ["--model", "gpt2"], "--seq is required"),
        ("perf/ip_table1.sh", ["--frobnicate"], "unknown option --frobnicate"),
        ("perf/ip_table1.sh", ["--time-limit"], "--time-limit needs a value"),
        ("perf/ip_table1.sh", ["--threads", "two"], "--threads two"),
        ("perf/ip_table1.sh", ["--binary", missing_binary], f"--binary {missing_binary}: no partrain binary"),
        ("perf/scale_benchmark.sh", ["--frobnicate"], "unknown option --frobnicate"),
        ("perf/scale_benchmark.sh", ["--check", missing_binary], f"PARTRAIN_BINARY {missing_binary}: no partrain binary"),
        ("perf/cpu_training_benchmark.sh", ["--frobnicate"], "unknown argument '--frobnicate'"),
        ("perf/cpu_training_benchmark.sh", [], "unknown case 'bert-xl'", {"CASES": "bert-xl"}),
        ("perf/cpu_training_benchmark.sh", [], "STEPS=0", {"STEPS": "0"}),
        ("perf/cpu_training_benchmark.sh", [], f"PARTRAIN={missing_binary} not found", {"PARTRAIN": missing_binary}),
        ("perf/gpu_training_benchmark.sh", ["--frobnicate"], "unknown argument '--frobnicate'"),
        ("perf/gpu_training_benchmark.sh", [], "CASES: unknown case 'bert1024'", {"CASES": "bert1024"}),
        ("perf/gpu_training_benchmark.sh", [], "DEVICE=tpu", {"DEVICE": "tpu"}),
        ("perf/gpu_training_benchmark.sh", [], "PRECISIONS: unknown precision 'fp8'", {"PRECISIONS": "fp8"}),
        ("perf/gpu_training_benchmark.sh", [], f"TEXT_DATA={missing}: no such file", {"TEXT_DATA": missing}),
        ("perf/pytorch_reference.py", ["--model", "gpt2", "--seq", "8", "--channels-last"], "--channels-last is for --model resnet"),
        ("perf/pytorch_reference.py", ["--model", "resnet", "--depth", "20"], "argument --depth: invalid choice"),
    ]
    try:  # the metrics reader runs only where matplotlib is installed
        import matplotlib  # noqa: F401
        cases.append(("plot_run.py", [not_json], "metrics.jsonl:2: not JSON"))
    except ImportError:
        pass
    failures = 0
    for script, arguments, expected, *environment in cases:
        path = os.path.join(source, "validation", script)
        command = (["bash"] if script.endswith(".sh") else [sys.executable]) + [path] + arguments
        settings = environment[0] if environment else {}
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **settings},
                                stdin=subprocess.DEVNULL, timeout=60)
        lines = result.stderr.strip().splitlines()
        name = os.path.basename(script)
        good = (result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"{name}: error: ")
                and expected in lines[0] and "Traceback" not in result.stderr + result.stdout)
        if not good:
            failures += 1
            print(f"FAIL: {' '.join(f'{k}={v}' for k, v in settings.items())} {' '.join(command)}\n  status {result.returncode}, expected 2 and one line holding "
                  f"'{expected}'\n  stdout: {result.stdout!r}\n  stderr: {result.stderr!r}")
        else:
            print(f"ok: {script} {' '.join(arguments)}: {lines[0]}")
    print(f"{len(cases) - failures} of {len(cases)} cases answered with one error line and status 2")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
