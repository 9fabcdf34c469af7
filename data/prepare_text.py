#!/usr/bin/python3
"""Builds text.h5 from the WordNet 3.0 glosses of Debian's wordnet-base package.

Steps: parse /usr/share/wordnet/data.{noun,verb,adj,adv}; turn each synset's gloss into sentences
(the definition, then each quoted example); group consecutive synsets of the same lexicographer file
into documents; train a SentencePiece unigram model with spm_train; encode; write text.h5:

  /tokens             int32 [T]    every sentence's token ids, concatenated (no special tokens)
  /sentence_offsets   int64 [S+1]  sentence s is tokens[sentence_offsets[s]:sentence_offsets[s+1]]
  /document_offsets   int64 [D+1]  document d is tokens[document_offsets[d]:document_offsets[d+1]]
                                   (every document boundary is also a sentence boundary)
  /split/train        int64 [Dt]   indices of the training documents (sorted)
  /split/heldout      int64 [Dh]   indices of the held-out documents (sorted, disjoint from train)
  attributes on "/": format, source, vocab_size, pad_id, unk_id, bos_id, eos_id, cls_id, sep_id,
                     mask_id, tokenizer_model (file name of the .model beside text.h5)

Run by data/prepare.sh with the system interpreter (python3-h5py, python3-numpy,
python3-sentencepiece).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import sentencepiece as spm

WORDNET_DIR = "/usr/share/wordnet"
PARTS_OF_SPEECH = ["noun", "verb", "adj", "adv"]
SPECIAL_SYMBOLS = ["[CLS]", "[SEP]", "[MASK]"]


def gloss_sentences(gloss):
    """Definition and quoted examples of one gloss, each as a sentence starting upper-case."""
    sentences = []
    for part in gloss.split(";"):
        part = part.strip()
        if not part:
            continue
        quoted = re.findall(r'"([^"]+)"', part)
        if quoted:
            candidates = [q.strip() for q in quoted]
        else:
            candidates = [part.strip('"').strip()]
        for text in candidates:
            text = re.sub(r"\s+", " ", text).strip(" -")
            if len(text) < 3:
                continue
            text = text[0].upper() + text[1:]
            if text[-1] not in ".!?":
                text += "."
            sentences.append(text)
    return sentences


def read_documents(synsets_per_document):
    """List of documents, each a list of sentences, in WordNet file order."""
    documents = []
    for pos in PARTS_OF_SPEECH:
        path = os.path.join(WORDNET_DIR, "data." + pos)
        current, current_lexfile, count = [], None, 0
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("  ") or " | " not in line:
                    continue  # licence header
                fields = line.split(" ", 2)
                lexfile = fields[1]
                gloss = line.split(" | ", 1)[1].strip()
                sentences = gloss_sentences(gloss)
                if not sentences:
                    continue
                if current and (lexfile != current_lexfile or count >= synsets_per_document):
                    documents.append(current)
                    current, count = [], 0
                current_lexfile = lexfile
                current.extend(sentences)
                count += 1
        if current:
            documents.append(current)
    return documents


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--synsets-per-document", type=int, default=8)
    parser.add_argument("--heldout-fraction", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1234)
    arguments = parser.parse_args()
    os.makedirs(arguments.output_dir, exist_ok=True)

    documents = read_documents(arguments.synsets_per_document)
    sentence_count = sum(len(d) for d in documents)
    print(f"prepare_text: {len(documents)} documents, {sentence_count} sentences from WordNet glosses")

    model_prefix = os.path.join(arguments.output_dir, "text")
    with tempfile.TemporaryDirectory() as scratch:
        corpus = os.path.join(scratch, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as handle:
            for document in documents:
                for sentence in document:
                    handle.write(sentence + "\n")
        # The same flags as partrain::io::train_tokenizer (src/io/tokenizer.cpp).
        command = ["spm_train", f"--input={corpus}", f"--model_prefix={model_prefix}",
                   f"--vocab_size={arguments.vocab_size}", "--model_type=unigram",
                   "--character_coverage=1.0", "--pad_id=0", "--unk_id=1", "--bos_id=2", "--eos_id=3",
                   "--user_defined_symbols=" + ",".join(SPECIAL_SYMBOLS),
                   f"--num_threads={os.cpu_count() or 1}", "--minloglevel=1"]
        subprocess.run(command, check=True)

    processor = spm.SentencePieceProcessor(model_file=model_prefix + ".model")
    flat = [sentence for document in documents for sentence in document]
    encoded = processor.encode(flat)
    lengths = np.array([len(ids) for ids in encoded], dtype=np.int64)
    tokens = np.fromiter((t for ids in encoded for t in ids), dtype=np.int32, count=int(lengths.sum()))
    sentence_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    sentences_per_document = np.array([len(d) for d in documents], dtype=np.int64)
    document_sentence_starts = np.concatenate([[0], np.cumsum(sentences_per_document)])
    document_offsets = sentence_offsets[document_sentence_starts].astype(np.int64)

    generator = np.random.default_rng(arguments.seed)
    order = generator.permutation(len(documents))
    heldout_count = max(1, int(round(arguments.heldout_fraction * len(documents))))
    heldout = np.sort(order[:heldout_count]).astype(np.int64)
    train = np.sort(order[heldout_count:]).astype(np.int64)

    path = os.path.join(arguments.output_dir, "text.h5")
    with h5py.File(path, "w") as output:
        output.create_dataset("tokens", data=tokens, compression="gzip", compression_opts=4, chunks=True)
        output.create_dataset("sentence_offsets", data=sentence_offsets, compression="gzip", chunks=True)
        output.create_dataset("document_offsets", data=document_offsets, compression="gzip", chunks=True)
        output.create_dataset("split/train", data=train)
        output.create_dataset("split/heldout", data=heldout)
        output.attrs["format"] = "partrain-text-1"
        output.attrs["source"] = "WordNet 3.0 glosses (Debian wordnet-base)"
        output.attrs["tokenizer_model"] = "text.model"
        output.attrs["vocab_size"] = np.int64(processor.get_piece_size())
        output.attrs["pad_id"] = np.int64(processor.pad_id())
        output.attrs["unk_id"] = np.int64(processor.unk_id())
        output.attrs["bos_id"] = np.int64(processor.bos_id())
        output.attrs["eos_id"] = np.int64(processor.eos_id())
        for symbol, name in zip(SPECIAL_SYMBOLS, ["cls_id", "sep_id", "mask_id"]):
            output.attrs[name] = np.int64(processor.piece_to_id(symbol))
    print(f"prepare_text: wrote {path}: {len(tokens)} tokens, vocab {processor.get_piece_size()}, "
          f"{len(train)} train / {len(heldout)} held-out documents")
    return 0


if __name__ == "__main__":
    sys.exit(main())
