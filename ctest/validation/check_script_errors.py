#!/usr/bin/python3
"""The user-facing validation scripts (validation/*.py) answer bad paths and files with one line
"<script>: error: ..." naming the path, and exit status 2 - never a Python traceback (issue 30).
Runs with or without h5py / torch / matplotlib: the checks come before those imports.

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
    cases = [  # (script, arguments, text the error line must hold)
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
    ]
    try:  # the metrics reader runs only where matplotlib is installed
        import matplotlib  # noqa: F401
        cases.append(("plot_run.py", [not_json], "metrics.jsonl:2: not JSON"))
    except ImportError:
        pass
    failures = 0
    for script, arguments, expected in cases:
        command = [sys.executable, os.path.join(source, "validation", script)] + arguments
        result = subprocess.run(command, capture_output=True, text=True)
        lines = result.stderr.strip().splitlines()
        good = (result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"{script}: error: ")
                and expected in lines[0] and "Traceback" not in result.stderr + result.stdout)
        if not good:
            failures += 1
            print(f"FAIL: {' '.join(command)}\n  status {result.returncode}, expected 2 and one line holding "
                  f"'{expected}'\n  stdout: {result.stdout!r}\n  stderr: {result.stderr!r}")
        else:
            print(f"ok: {script} {' '.join(arguments)}: {lines[0]}")
    print(f"{len(cases) - failures} of {len(cases)} cases answered with one error line and status 2")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
