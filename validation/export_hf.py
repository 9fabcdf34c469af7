#!/usr/bin/python3
"""Export a partrain checkpoint as a PyTorch state dict for Hugging Face transformers / torchvision.

    validation/export_hf.py CHECKPOINT.h5 OUT.bin [--save-pretrained DIR]
                            [--check [--data FILE.h5] [--batches N] [--partrain BINARY | --eval-loss X]
                                     [--config CONFIG.toml] [--set k=v ...]]

partrain stores every parameter whole under its Hugging Face / torchvision name in /model/<name>
(GPT-2's linear weights already in HF's Conv1D [in, out] layout), so the export copies them and adds
the tied weights HF also lists (BERT: cls.predictions.decoder.weight = the word embeddings, its bias
= cls.predictions.bias; GPT-2: lm_head.weight = wte). Load with
model.load_state_dict(torch.load("OUT.bin")) into BertForPreTraining / GPT2LMHeadModel (or
torchvision's ResNet) built from a config of the same sizes. Buffers (BatchNorm statistics) are
exported too; optimizer state is not. --save-pretrained DIR also writes the transformers model
(built from the checkpoint's config_toml) as a model directory for from_pretrained.

--check re-reads OUT.bin and compares every tensor with the checkpoint; then, where transformers
(BERT, GPT) or torchvision (ResNet) is installed, loads OUT.bin with load_state_dict into the
library's model built from the checkpoint's config (its config_toml attribute), evaluates it on a
batch file (--data; or, without one, on the samples `partrain eval` evaluated and saved with
--save-batches) and compares eval_loss (and ResNet's top-1 accuracy) with `partrain eval` on the
same samples: run with --partrain BINARY (on the checkpoint's config, or --config, plus --set
options, on one rank), or given as --eval-loss. They must agree within --tolerance (1e-4 relative).
Needs h5py, numpy and torch; without them it says so and exits 0 (nothing to export to).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models  # noqa: E402
from script_errors import fail, open_hdf5, require_file, require_output_directory  # noqa: E402

# One-rank plan for `partrain eval` on the checkpoint's own config (which may name a plan for more ranks).
ONE_RANK = ["parallel.world_size=0", "parallel.planner=manual", "parallel.stages=1", "parallel.replicas=[1]",
            "parallel.boundaries=[]", "profile.enabled=false"]


def run_partrain_eval(arguments, config_text, tmp):
    """Runs `partrain eval` on the checkpoint (one rank); returns ({eval_loss, accuracy, samples}, batch file)."""
    config = arguments.config
    settings = list(arguments.set)
    if config is None:
        config = os.path.join(tmp, "checkpoint-config.toml")
        with open(config, "w") as f:
            f.write(config_text)
        settings = ONE_RANK + settings
    batches = os.path.join(tmp, "batches.h5")
    command = [arguments.partrain, "eval", config, "--resume", arguments.checkpoint, "--save-batches", batches]
    for setting in settings + [f"log.dir={tmp}/run"]:
        command += ["--set", setting]
    if arguments.data:
        command += ["--data", arguments.data]
    if arguments.batches:
        command += ["--batches", str(arguments.batches)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"export_hf: partrain eval failed ({' '.join(command)}):\n{result.stdout}{result.stderr}")
    values = {key: float(value) for key, value in re.findall(r"^(eval_loss|accuracy|samples): (\S+)$", result.stdout, re.M)}
    return values, batches


def library_model(state, config):
    """The library model of `config` with `state` loaded by load_state_dict; None when the library is
    not installed. Exits with a message when the state dict does not fit it."""
    try:
        net = hf_models.build_model(config["model"]["type"], config)
    except ImportError as error:
        print(f"export_hf: {error.name} is not installed; skipping the library model")
        return None
    missing, unexpected = net.load_state_dict(state, strict=False)
    missing = [name for name in missing if not name.endswith(hf_models.IGNORED_BUFFERS)]
    if missing or unexpected:
        raise SystemExit(f"export_hf: the library model does not take the export: missing {missing}, "
                         f"unexpected {unexpected}")
    return net


def compare_with_partrain(arguments, net, config, config_text):
    """Evaluates the library model `net` like `partrain eval` and compares. Returns 0 or 1."""
    model = config["model"]["type"]
    with tempfile.TemporaryDirectory() as tmp:
        if arguments.eval_loss is not None:
            if not arguments.data:
                fail("--eval-loss needs --data (the batch file it was measured on)")
            partrain, batch_file = {"eval_loss": arguments.eval_loss}, arguments.data
        elif arguments.partrain:
            partrain, batch_file = run_partrain_eval(arguments, config_text, tmp)
        else:
            print("export_hf: give --partrain BINARY or --eval-loss X to compare with partrain eval")
            return 0
        batch = hf_models.read_batches(batch_file, hf_models.batch_fields(config))
        batch_size = config["train"].get("global_batch", 1)
        rows = len(next(iter(batch.values())))
        batches = int(partrain["samples"]) // batch_size if "samples" in partrain else (arguments.batches or rows // batch_size)
        library = hf_models.evaluate(model, net, batch, batch_size, batches)
    difference = abs(library["eval_loss"] - partrain["eval_loss"]) / abs(partrain["eval_loss"])
    library_name = "torchvision" if model == "resnet" else "transformers"
    print(f"export_hf: eval_loss over {library['samples']} samples: partrain {partrain['eval_loss']:.9g}, "
          f"{library_name} {library['eval_loss']:.9g}, relative difference {difference:.3g} "
          f"(tolerance {arguments.tolerance:g})")
    failed = difference > arguments.tolerance
    if "accuracy" in partrain and library["accuracy"] is not None:
        print(f"export_hf: accuracy: partrain {partrain['accuracy']:.6f}, {library_name} {library['accuracy']:.6f}")
        failed = failed or abs(partrain["accuracy"] - library["accuracy"]) > 0.5 / library["samples"]
    if failed:
        print("export_hf: the library model does not evaluate like partrain", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("output")
    parser.add_argument("--check", action="store_true",
                        help="reload OUT.bin, compare every tensor, and evaluate it with the library model")
    parser.add_argument("--data", help="batch file (/batch/<input>) or data/prepare.sh file to evaluate on")
    parser.add_argument("--batches", type=int, help="global batches to evaluate (default: all the data holds)")
    parser.add_argument("--partrain", help="partrain binary: run `partrain eval` for the comparison")
    parser.add_argument("--eval-loss", type=float, help="partrain eval's eval_loss on --data (instead of --partrain)")
    parser.add_argument("--config", help="experiment file for partrain eval (default: the checkpoint's config_toml)")
    parser.add_argument("--set", action="append", default=[], help="section.key=value for partrain eval")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="relative eval_loss tolerance (1e-4)")
    parser.add_argument("--save-pretrained", metavar="DIR",
                        help="also write a Hugging Face model directory (config.json + weights) of the export")
    arguments = parser.parse_args()
    if arguments.batches is not None and arguments.batches <= 0:
        parser.error(f"--batches must be positive, not {arguments.batches}")
    # Paths first (one line, exit 2), before the libraries: a wrong path is reported everywhere.
    require_file(arguments.checkpoint, "CHECKPOINT")
    require_output_directory(arguments.output, "OUT")
    if arguments.data:
        require_file(arguments.data, "--data")
    if arguments.config:
        require_file(arguments.config, "--config")
    if arguments.partrain and not (os.path.isfile(arguments.partrain) and os.access(arguments.partrain, os.X_OK)):
        fail(f"--partrain {arguments.partrain}: no such executable")
    try:
        import h5py
        import numpy
    except ImportError as error:
        print(f"export_hf: {error.name} is not installed (Debian: python3-h5py python3-numpy); skipping")
        return 0
    try:
        import torch
    except ImportError:
        print("export_hf: torch is not installed; skipping")
        return 0

    state = {}
    with open_hdf5(h5py, arguments.checkpoint, "CHECKPOINT") as file:
        if "model" not in file or not isinstance(file["model"], h5py.Group) or "step" not in file.attrs:
            fail(f"CHECKPOINT {arguments.checkpoint}: not a partrain checkpoint (no /model group or step attribute)")

        def visit(name, item):
            if isinstance(item, h5py.Dataset):
                state[name] = torch.from_numpy(numpy.asarray(item[()], dtype=numpy.float32))

        file["model"].visititems(visit)
        step = int(file.attrs["step"])
        config_text = file.attrs.get("config_toml", b"")
        config_text = config_text.decode() if isinstance(config_text, bytes) else str(config_text)
    pretraining_heads = any(name.startswith("cls.predictions.") for name in state)  # not a classifier's
    for alias, name in hf_models.TIED.items():  # the library lists tied tensors under both names
        if name in state and alias not in state and (pretraining_heads or not alias.startswith("cls.")):
            state[alias] = state[name]
    torch.save(state, arguments.output)
    count = sum(t.numel() for name, t in state.items() if not name.endswith(("running_mean", "running_var")))
    print(f"export_hf: {len(state)} tensors ({count} elements) of step {step} -> {arguments.output}")

    if arguments.check:
        loaded = torch.load(arguments.output)
        with h5py.File(arguments.checkpoint, "r") as file:
            for name, tensor in loaded.items():
                expected = numpy.asarray(file["model"][hf_models.TIED.get(name, name)][()], dtype=numpy.float32)
                if not numpy.array_equal(tensor.numpy(), expected):
                    print(f"export_hf: {name} differs after reloading", file=sys.stderr)
                    return 1
        print(f"export_hf: reloaded {len(loaded)} tensors, all equal")
    if not (arguments.check or arguments.save_pretrained):
        return 0
    if not config_text:
        print("export_hf: the checkpoint has no config_toml; no library model to load it into")
        return 1 if arguments.save_pretrained else 0
    import tomllib
    try:
        config = tomllib.loads(config_text)
    except tomllib.TOMLDecodeError as error:
        fail(f"CHECKPOINT {arguments.checkpoint}: its config_toml attribute is not TOML: {error}")
    if not isinstance(config.get("model"), dict) or "type" not in config["model"]:
        fail(f"CHECKPOINT {arguments.checkpoint}: its config_toml has no [model] type")
    net = library_model(torch.load(arguments.output), config)  # what a user loads: the file
    if net is None:
        return 1 if arguments.save_pretrained else 0
    if arguments.save_pretrained:
        if not hasattr(net, "save_pretrained"):
            raise SystemExit("export_hf: --save-pretrained: torchvision models have no model directory; use OUT.bin")
        net.save_pretrained(arguments.save_pretrained)
        print(f"export_hf: {type(net).__name__} -> {arguments.save_pretrained} (from_pretrained reads it)")
    return compare_with_partrain(arguments, net, config, config_text) if arguments.check else 0


if __name__ == "__main__":
    sys.exit(main())
