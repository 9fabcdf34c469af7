#!/usr/bin/python3
"""Builds pos.h5: each WordNet 3.0 synset's definition labelled with its part of speech, a sequence
classification task for BERT ([model] task = "classification", classes = 4).

Labels: 0 noun, 1 verb, 2 adjective (WordNet's "a" and satellite "s"), 3 adverb. The text is the
gloss's definition (the part before the first quoted example), cleaned as data/prepare_text.py
cleans sentences. Split by synset: a seeded 5% of the synsets (each synset is one text) are held
out. Tokenised with the tokenizer text.h5 was made with (run after prepare_text.py into the same
OUTPUT_DIR: text.model, or text.tokenizer.json for --tokenizer), whose attributes are copied:

  /tokens             int32 [T]    every definition's token ids, concatenated (no special tokens)
  /offsets            int64 [N+1]  text n is tokens[offsets[n]:offsets[n+1]]
  /labels             int64 [N]    part of speech (0 noun, 1 verb, 2 adjective, 3 adverb)
  /split/train        int64        text indices (sorted)
  /split/heldout      int64        text indices (sorted, disjoint from train)
  attributes on "/":  format "partrain-classification-1", source, classes 4, class_names, and
                      text.h5's vocab_size, pad_id ... mask_id, tokenizer, tokenizer_type,
                      tokenizer_model, tokenizer_source, tokenizer_sha256

Read by partrain::io::ClassificationDataset (src/io/classification_dataset.h).
"""
import argparse
import os
import re
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare_text import PARTS_OF_SPEECH, WORDNET_DIR  # noqa: E402

CLASS_NAMES = ["noun", "verb", "adjective", "adverb"]
LABELS = {"n": 0, "v": 1, "a": 2, "s": 2, "r": 3}
TOKENIZER_ATTRIBUTES = ("vocab_size", "pad_id", "unk_id", "bos_id", "eos_id", "cls_id", "sep_id", "mask_id",
                        "tokenizer", "tokenizer_type", "tokenizer_model", "tokenizer_source", "tokenizer_sha256")


def definition(gloss):
    """The definition of a gloss (before the first quoted example), as one sentence; None if empty."""
    for part in gloss.split(";"):
        part = re.sub(r"\s+", " ", part).strip(" -")
        if part and '"' not in part and len(part) >= 3:
            text = part[0].upper() + part[1:]
            return text if text[-1] in ".!?" else text + "."
    return None


def read_definitions():
    """(texts, labels) of every synset with a definition, in WordNet file order."""
    texts, labels = [], []
    for pos in PARTS_OF_SPEECH:
        with open(os.path.join(WORDNET_DIR, "data." + pos), encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("  ") or " | " not in line:
                    continue  # licence header
                text = definition(line.split(" | ", 1)[1].strip())
                if text:
                    texts.append(text)
                    labels.append(LABELS[line.split(" ", 3)[2]])
    return texts, labels


def encoder(output_dir, attributes):
    """A function texts -> id lists with the tokenizer text.h5 was made with."""
    model = os.path.join(output_dir, str(attributes.get("tokenizer_model", "text.model")))
    if attributes.get("tokenizer") == "huggingface":
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_file(model)
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return lambda texts: [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    import sentencepiece as spm
    processor = spm.SentencePieceProcessor(model_file=model)
    return processor.encode


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", help="the directory holding text.h5 and its tokenizer")
    parser.add_argument("--heldout-fraction", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1234)
    arguments = parser.parse_args()
    text_path = os.path.join(arguments.output_dir, "text.h5")
    if not os.path.isfile(text_path):
        print(f"prepare_pos: {text_path} is missing (prepare_text.py makes it first)", file=sys.stderr)
        return 2
    with h5py.File(text_path, "r") as f:
        attributes = {key: f.attrs[key] for key in TOKENIZER_ATTRIBUTES if key in f.attrs}
    texts, labels = read_definitions()
    encoded = encoder(arguments.output_dir, attributes)(texts)
    lengths = np.array([len(ids) for ids in encoded], dtype=np.int64)
    tokens = np.fromiter((t for ids in encoded for t in ids), dtype=np.int32, count=int(lengths.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    order = np.random.default_rng(arguments.seed).permutation(len(texts))
    heldout_count = max(1, int(round(arguments.heldout_fraction * len(texts))))
    path = os.path.join(arguments.output_dir, "pos.h5")
    with h5py.File(path, "w") as output:
        output.create_dataset("tokens", data=tokens, compression="gzip", compression_opts=4, chunks=True)
        output.create_dataset("offsets", data=offsets, compression="gzip", chunks=True)
        output.create_dataset("labels", data=np.array(labels, dtype=np.int64), compression="gzip", chunks=True)
        output.create_dataset("split/train", data=np.sort(order[heldout_count:]).astype(np.int64))
        output.create_dataset("split/heldout", data=np.sort(order[:heldout_count]).astype(np.int64))
        output.attrs["format"] = "partrain-classification-1"
        output.attrs["source"] = "WordNet 3.0 synset definitions labelled with their part of speech (Debian wordnet-base)"
        output.attrs["classes"] = np.int64(len(CLASS_NAMES))
        output.attrs["class_names"] = ",".join(CLASS_NAMES)
        for key, value in attributes.items():
            output.attrs[key] = value
    counts = np.bincount(np.array(labels), minlength=len(CLASS_NAMES))
    print(f"prepare_pos: wrote {path}: {len(texts)} definitions ({', '.join(f'{n} {c}' for n, c in zip(CLASS_NAMES, counts))}), "
          f"{len(tokens)} tokens, {len(texts) - heldout_count} train / {heldout_count} held-out synsets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
