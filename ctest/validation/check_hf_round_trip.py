#!/usr/bin/python3
"""The Hugging Face / torchvision round trip of one tiny model (issue 15, item 4), end to end.

    check_hf_round_trip.py SOURCE_DIR PARTRAIN RUN_DIR MODEL [MPIEXEC FLAG...]

1. partrain trains MODEL (bert, gpt, resnet at the golden files' sizes; GPT on 4 ranks under a
   2-stage x 2-replica plan) and checkpoints it;
2. validation/export_hf.py --check exports it, loads the state dict into transformers'
   BertForPreTraining / GPT2LMHeadModel (torchvision's ResNet) with load_state_dict, evaluates it
   on the golden file's batches (ResNet: on 64 held-out samples that `partrain eval --save-batches`
   wrote) and compares with `partrain eval` on the same samples: eval_loss within 1e-4 (ResNet: and
   the same top-1 accuracy);
3. validation/import_hf.py turns the exported state dict back into a partrain checkpoint: it holds
   the same /model tensors as the original (partrain inspect), `partrain eval` gives the same
   numbers, and `partrain train --resume` accepts it (no optimizer state: a fresh optimizer);
4. GPT: the Hugging Face model directory export_hf.py --save-pretrained wrote imports to the same
   checkpoint; BERT: the
   library's own freshly initialised model (import_hf.py --from-config) evaluates alike in both.

Runs the scripts with validation/golden/.venv/bin/python (made by validation/golden/make_golden.py;
PARTRAIN_TORCH_PYTHON overrides it). Exits 77 (CTest: skipped) when that interpreter or torch,
transformers, torchvision or h5py in it is missing: CI needs none of them.
"""
import os
import re
import shutil
import subprocess
import sys

SOURCE, PARTRAIN, RUN_ROOT, MODEL = sys.argv[1:5]
MPIEXEC = sys.argv[5:]
PYTHON = os.environ.get("PARTRAIN_TORCH_PYTHON", os.path.join(SOURCE, "validation", "golden", ".venv", "bin", "python"))
RUN = os.path.join(RUN_ROOT, MODEL)
CONFIG = os.path.join(SOURCE, "configs", f"{MODEL}-tiny.toml")
GOLDEN = os.path.join(SOURCE, "validation", "golden", f"{MODEL}-tiny.h5")
DATA = os.path.join(SOURCE, "data", "prepared", "fashion_mnist.h5" if MODEL == "resnet" else "text.h5")
STEPS = 40 if MODEL == "resnet" else 3  # ResNet: enough steps that accuracy is not one class's share


def golden_settings():
    """make_golden.py's settings of MODEL (sizes, dropout 0, ...) and the data file."""
    sys.path.insert(0, os.path.join(SOURCE, "validation", "golden"))
    from make_golden import COMMON, GOLDEN_SETTINGS  # standard library only at import time
    return COMMON + GOLDEN_SETTINGS[MODEL] + [f"data.path={DATA}"]


SETTINGS = golden_settings()


def sets(settings):
    """--set options of "section.key=value" settings."""
    return [arg for setting in settings for arg in ("--set", setting)]


def run(command, name, ranks=1):
    """Runs a command (under mpiexec for ranks > 1), output to RUN/name.log; fails the test on error."""
    if ranks > 1:
        command = [MPIEXEC[0], "-n", str(ranks)] + MPIEXEC[1:] + command
    result = subprocess.run(command, capture_output=True, text=True, timeout=240)
    log = result.stdout + result.stderr
    with open(os.path.join(RUN, name + ".log"), "w") as f:
        f.write(" ".join(command) + "\n" + log)
    if result.returncode != 0:
        fail(f"{' '.join(command)} exited with {result.returncode}:\n{log}")
    return log


def fail(message):
    """Ends the test as failed with `message`."""
    print(f"FAILED: {message}")
    sys.exit(1)


def eval_numbers(checkpoint, data, name):
    """partrain eval's printed eval_loss, accuracy/perplexity and samples (as printed)."""
    log = run([PARTRAIN, "eval", CONFIG, "--resume", checkpoint, "--data", data] + sets(SETTINGS), name)
    return [line for line in log.splitlines() if re.match(r"(eval_loss|perplexity|accuracy|samples)", line)]


def model_tensors(checkpoint, name):
    """The /model tensors (name and shape) `partrain inspect` lists."""
    return [line for line in run([PARTRAIN, "inspect", checkpoint], name).splitlines() if line.startswith("model/")]


def export_and_check(checkpoint, out, name, data_arguments):
    """export_hf.py --check against `partrain eval` (it exits 1 beyond 1e-4); prints its figures."""
    log = run([PYTHON, os.path.join(SOURCE, "validation", "export_hf.py"), checkpoint, out, "--check",
               "--partrain", PARTRAIN, "--config", CONFIG] + sets(SETTINGS) + data_arguments, name)
    figures = [line for line in log.splitlines() if "relative difference" in line or "accuracy:" in line]
    if not any("relative difference" in line for line in figures):
        fail(f"export_hf.py did not compare with the library model:\n{log}")
    for line in figures:
        print(f"{MODEL} {name}: {line}")


def import_state(source, out, name):
    """import_hf.py SOURCE (None: --from-config) into the partrain checkpoint `out`."""
    arguments = [source] if source else ["--from-config"]
    run([PYTHON, os.path.join(SOURCE, "validation", "import_hf.py")] + arguments + [out, "--config", CONFIG] + sets(SETTINGS), name)


def main():
    probe = "import torch, transformers, torchvision, h5py"
    if not os.path.exists(PYTHON) or subprocess.run([PYTHON, "-c", probe], capture_output=True).returncode != 0:
        print(f"{PYTHON} with torch, transformers, torchvision and h5py is not there (validation/golden/make_golden.py "
              "makes it); skipping")
        return 77
    shutil.rmtree(RUN, ignore_errors=True)
    os.makedirs(RUN)

    # 1. Train and checkpoint (GPT under a 2 x 2 pipeline on 4 ranks).
    plan = ["parallel.planner=manual", "parallel.stages=2", "parallel.replicas=[2, 2]",
            'parallel.boundaries=["h.1"]', "train.microbatches=2"] if MODEL == "gpt" and MPIEXEC else []
    run([PARTRAIN, "train", CONFIG] + sets(SETTINGS + [f"train.steps={STEPS}", f"checkpoint.every={STEPS}",
                                                        f"log.dir={RUN}/train"] + plan),
        "train", ranks=4 if plan else 1)
    checkpoint = os.path.join(RUN, "train", "checkpoints", f"step_{STEPS:06d}.h5")

    # 2. Export, load into the library model, evaluate both on the same samples.
    exported = os.path.join(RUN, "exported.bin")
    if MODEL == "resnet":  # 64 held-out samples: partrain eval saves them, the library model reads them
        data = os.path.join(RUN, "heldout.h5")
        run([PARTRAIN, "eval", CONFIG, "--resume", checkpoint, "--batches", "8", "--save-batches", data] + sets(SETTINGS),
            "save-heldout")
    else:
        data = GOLDEN
    directory = os.path.join(RUN, "hf-model")  # GPT: also as a model directory (save_pretrained)
    export_and_check(checkpoint, exported, "export", ["--data", data] + (["--save-pretrained", directory] if MODEL == "gpt" else []))

    # 3. Import the exported state dict: the same tensors and numbers; train --resume accepts it.
    imported = os.path.join(RUN, "imported.h5")
    import_state(exported, imported, "import")
    if model_tensors(imported, "inspect-imported") != model_tensors(checkpoint, "inspect-original"):
        fail("the imported checkpoint does not hold the original's /model tensors (see inspect-*.log)")
    original, reimported = eval_numbers(checkpoint, data, "eval-original"), eval_numbers(imported, data, "eval-imported")
    if original != reimported:
        fail(f"eval of the imported checkpoint {reimported} differs from the original's {original}")
    log = run([PARTRAIN, "train", CONFIG, "--resume", imported] +
              sets(SETTINGS + ["train.steps=2", f"log.dir={RUN}/resumed"]), "train-imported")
    if "holds no optimizer state" not in log or "resume: " + imported + " (step 0)" not in log:
        fail(f"train --resume {imported} did not restore it with a fresh optimizer:\n{log}")
    print(f"{MODEL}: imported checkpoint: same tensors, {original[0]}, train --resume started a fresh optimizer")

    if MODEL == "gpt":
        # 4a. The Hugging Face model directory export_hf.py wrote imports to the same checkpoint.
        from_directory = os.path.join(RUN, "imported-directory.h5")
        import_state(directory, from_directory, "import-directory")
        if eval_numbers(from_directory, data, "eval-directory") != original:
            fail("the checkpoint imported from the model directory evaluates differently")
    if MODEL == "bert":
        # 4b. The library's own initialisation (not partrain's) evaluates alike in both.
        fresh = os.path.join(RUN, "imported-fresh.h5")
        import_state(None, fresh, "import-fresh")
        export_and_check(fresh, os.path.join(RUN, "fresh.bin"), "export-fresh", ["--data", data])
    print(f"{MODEL}: Hugging Face round trip passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
