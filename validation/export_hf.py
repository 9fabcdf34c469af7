#!/usr/bin/python3
"""Export a partrain BERT/GPT-2 checkpoint as a PyTorch state dict for Hugging Face transformers.

    validation/export_hf.py CHECKPOINT.h5 OUT.bin [--check]

partrain stores every parameter whole under its Hugging Face name in /model/<name> (GPT-2's linear
weights already in HF's Conv1D [in, out] layout), so the export copies them and adds the tied
weights HF also lists (BERT: cls.predictions.decoder.weight = the word embeddings; GPT-2:
lm_head.weight = wte). Load with model.load_state_dict(torch.load("OUT.bin")) into
BertForPreTraining / GPT2LMHeadModel built from a config of the same sizes. Buffers (BatchNorm
statistics) are exported too; optimizer state is not.

--check re-reads OUT.bin with torch and compares every tensor with the checkpoint.
Needs h5py, numpy and torch; without torch it says so and exits 0 (nothing to export to).
"""
import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("output")
    parser.add_argument("--check", action="store_true", help="reload OUT.bin and compare every tensor")
    arguments = parser.parse_args()
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
    with h5py.File(arguments.checkpoint, "r") as file:
        if "model" not in file or "step" not in file.attrs:
            print(f"export_hf: {arguments.checkpoint}: not a partrain checkpoint (no /model or step)", file=sys.stderr)
            return 1

        def visit(name, item):
            if isinstance(item, h5py.Dataset):
                state[name] = torch.from_numpy(numpy.asarray(item[()], dtype=numpy.float32))

        file["model"].visititems(visit)
        step = int(file.attrs["step"])
    if "bert.embeddings.word_embeddings.weight" in state and "cls.predictions.decoder.weight" not in state:
        state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
        if "cls.predictions.bias" in state:
            state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    if "transformer.wte.weight" in state and "lm_head.weight" not in state:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    torch.save(state, arguments.output)
    count = sum(t.numel() for name, t in state.items() if not name.endswith(("running_mean", "running_var")))
    print(f"export_hf: {len(state)} tensors ({count} elements) of step {step} -> {arguments.output}")

    if arguments.check:
        loaded = torch.load(arguments.output)
        with h5py.File(arguments.checkpoint, "r") as file:
            for name, tensor in loaded.items():
                source = name
                if name == "cls.predictions.decoder.weight":
                    source = "bert.embeddings.word_embeddings.weight"
                elif name == "cls.predictions.decoder.bias":
                    source = "cls.predictions.bias"
                elif name == "lm_head.weight":
                    source = "transformer.wte.weight"
                expected = numpy.asarray(file["model"][source][()], dtype=numpy.float32)
                if not numpy.array_equal(tensor.numpy(), expected):
                    print(f"export_hf: {name} differs after reloading", file=sys.stderr)
                    return 1
        print(f"export_hf: reloaded {len(loaded)} tensors, all equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
