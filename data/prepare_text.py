#!/usr/bin/python3
"""Builds text.h5 from the WordNet 3.0 glosses of Debian's wordnet-base package.

Steps: parse /usr/share/wordnet/data.{noun,verb,adj,adv}; turn each synset's gloss into sentences
(the definition, then each quoted example); group consecutive synsets of the same lexicographer file
into documents; train a SentencePiece unigram model with spm_train (the default) or take a published
model's Hugging Face tokenizer (--tokenizer: a tokenizer.json or a save_pretrained directory; WordPiece,
byte-level BPE, ...; data/published_tokenizer.py); encode; write text.h5:

  /tokens             int32 [T]    every sentence's token ids, concatenated (no special tokens)
  /sentence_offsets   int64 [S+1]  sentence s is tokens[sentence_offsets[s]:sentence_offsets[s+1]]
  /document_offsets   int64 [D+1]  document d is tokens[document_offsets[d]:document_offsets[d+1]]
                                   (every document boundary is also a sentence boundary)
  /split/train        int64 [Dt]   indices of the training documents (sorted)
  /split/heldout      int64 [Dh]   indices of the held-out documents (sorted, disjoint from train)
  attributes on "/": format, source, vocab_size, pad_id, unk_id, bos_id, eos_id, cls_id, sep_id,
                     mask_id (-1: the tokenizer has no such token), tokenizer ("sentencepiece" or
                     "huggingface"), tokenizer_type ("Unigram", "WordPiece", "BPE (byte-level)", ...),
                     tokenizer_model (file name of the tokenizer beside text.h5: text.model, or
                     text.tokenizer.json, a copy of the published one), tokenizer_source (the path
                     given to --tokenizer; "spm_train" for the default), tokenizer_sha256 (of that file)

Run by data/prepare.sh with the system interpreter (python3-h5py, python3-numpy,
python3-sentencepiece), with --tokenizer in the data venv (data/make_venv.sh: the same plus PyPI's
`tokenizers`).
"""
import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

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


def sentencepiece_tokenizer(documents, output_dir, vocab_size):
    """Trains text.model on the sentences; returns (one id list per sentence, attributes of text.h5)."""
    import sentencepiece as spm
    model_prefix = os.path.join(output_dir, "text")
    with tempfile.TemporaryDirectory() as scratch:
        corpus = os.path.join(scratch, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as handle:
            for document in documents:
                for sentence in document:
                    handle.write(sentence + "\n")
        # The same flags as partrain::io::train_tokenizer (src/io/tokenizer.cpp).
        command = ["spm_train", f"--input={corpus}", f"--model_prefix={model_prefix}",
                   f"--vocab_size={vocab_size}", "--model_type=unigram",
                   "--character_coverage=1.0", "--pad_id=0", "--unk_id=1", "--bos_id=2", "--eos_id=3",
                   "--user_defined_symbols=" + ",".join(SPECIAL_SYMBOLS),
                   f"--num_threads={os.cpu_count() or 1}", "--minloglevel=1"]
        subprocess.run(command, check=True)

    processor = spm.SentencePieceProcessor(model_file=model_prefix + ".model")
    encoded = processor.encode([sentence for document in documents for sentence in document])
    with open(model_prefix + ".model", "rb") as handle:
        sha256 = hashlib.sha256(handle.read()).hexdigest()
    attributes = {"tokenizer": "sentencepiece", "tokenizer_type": "Unigram", "tokenizer_model": "text.model",
                  "tokenizer_source": "spm_train", "tokenizer_sha256": sha256,
                  "vocab_size": processor.get_piece_size(), "pad_id": processor.pad_id(),
                  "unk_id": processor.unk_id(), "bos_id": processor.bos_id(), "eos_id": processor.eos_id()}
    for symbol, name in zip(SPECIAL_SYMBOLS, ["cls_id", "sep_id", "mask_id"]):
        attributes[name] = processor.piece_to_id(symbol)
    return encoded, attributes


def published_tokenizer(documents, output_dir, path):
    """Encodes with a published Hugging Face tokenizer (copied beside text.h5 as text.tokenizer.json);
    returns (one id list per sentence, attributes of text.h5). Exits 2 with one line naming the path
    when it cannot be used."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from published_tokenizer import PublishedTokenizer, TokenizerError
    try:
        tokenizer = PublishedTokenizer(path)
    except TokenizerError as error:
        print(f"prepare_text: {error}", file=sys.stderr)
        sys.exit(2)
    copy = os.path.join(output_dir, "text.tokenizer.json")
    shutil.copyfile(tokenizer.file, copy)
    for stale in ("text.model", "text.vocab"):  # an earlier SentencePiece run's: not this data's tokenizer
        if os.path.exists(os.path.join(output_dir, stale)):
            os.remove(os.path.join(output_dir, stale))
    encoded = tokenizer.encode_documents(documents)
    attributes = {"tokenizer": "huggingface", "tokenizer_type": tokenizer.kind,
                  "tokenizer_model": os.path.basename(copy), "tokenizer_source": os.path.abspath(path),
                  "tokenizer_sha256": tokenizer.sha256, "vocab_size": tokenizer.vocab_size}
    for role, token_id in tokenizer.special_ids.items():
        attributes[role + "_id"] = token_id
    named = ", ".join(f"{role} {tokenizer.special_tokens[role]}={token_id}"
                      for role, token_id in tokenizer.special_ids.items() if token_id >= 0)
    print(f"prepare_text: {tokenizer.kind} tokenizer {tokenizer.file}: vocabulary {tokenizer.vocab_size}; {named}")
    return encoded, attributes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    parser.add_argument("--vocab-size", type=int, default=8000, help="SentencePiece vocabulary (not with --tokenizer)")
    parser.add_argument("--tokenizer", help="a published model's tokenizer.json or save_pretrained directory")
    parser.add_argument("--synsets-per-document", type=int, default=8)
    parser.add_argument("--heldout-fraction", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--documents", type=int, default=0,
                        help="write only the first N documents (0: all); the tokenizer still learns from all")
    arguments = parser.parse_args()
    if arguments.documents < 0:
        print(f"prepare_text: --documents {arguments.documents}: expected 0 (all) or a positive count", file=sys.stderr)
        return 2
    if arguments.tokenizer is not None and not os.path.exists(arguments.tokenizer):
        print(f"prepare_text: --tokenizer {arguments.tokenizer}: no such file or directory", file=sys.stderr)
        return 2
    os.makedirs(arguments.output_dir, exist_ok=True)

    documents = read_documents(arguments.synsets_per_document)
    sentence_count = sum(len(d) for d in documents)
    print(f"prepare_text: {len(documents)} documents, {sentence_count} sentences from WordNet glosses")

    if arguments.tokenizer is None:
        encoded, attributes = sentencepiece_tokenizer(documents, arguments.output_dir, arguments.vocab_size)
    else:
        encoded, attributes = published_tokenizer(documents, arguments.output_dir, arguments.tokenizer)
    if 0 < arguments.documents < len(documents):
        documents = documents[:arguments.documents]
        encoded = encoded[:sum(len(d) for d in documents)]  # one id list per sentence, in document order
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
        for name, value in attributes.items():
            output.attrs[name] = np.int64(value) if isinstance(value, int) else value
    print(f"prepare_text: wrote {path}: {len(tokens)} tokens, vocab {attributes['vocab_size']} "
          f"({attributes['tokenizer_type']}), {len(train)} train / {len(heldout)} held-out documents")
    return 0


if __name__ == "__main__":
    sys.exit(main())
