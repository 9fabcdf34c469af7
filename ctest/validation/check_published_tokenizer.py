#!/usr/bin/python3
"""CTest published_tokenizer (issue 28, item 1): data/prepare.sh --tokenizer with a published model's
Hugging Face tokenizer, and partrain's check of the model's tokenizer against the data's.

    check_published_tokenizer.py SOURCE_DIR PARTRAIN RUN_DIR

No published GPT-2 tokenizer.json can be had offline (none is on this machine or in a PyPI package
the project uses), so the test trains its two tokenizers on the WordNet glosses that data/prepare.sh
reads, with the libraries' published recipes:
  - BERT's WordPiece (BertNormalizer lowercasing, BertPreTokenizer, "##" continuations), its special
    tokens in an order of its own ([UNK] 0, [SEP] 1, [PAD] 2, [MASK] 3, [CLS] 4: not SentencePiece's
    pad 0 / [CLS] 4 / [SEP] 5 / [MASK] 6), saved as a tokenizer.json file;
  - GPT-2's byte-level BPE (ByteLevel pre-tokenizer without prefix space, <|endoftext|> appended as
    the last id as in GPT-2's 50256), saved as a model directory with special_tokens_map.json (as
    save_pretrained writes it).
Then, for each: data/prepare.sh OUT --tokenizer PATH; text.h5 must record the tokenizer, its
vocabulary and its special ids as the library reports them, and its tokens must decode back to the
WordNet sentences (byte-level BPE: every document exactly; WordPiece: lower-cased, spaces aside);
`partrain train` must train a model that declares the tokenizer's ids (BERT on WordPiece, GPT on
byte-level BPE) and refuse, before profiling, one whose [model] cls_id or vocab differs (naming both)
and a BERT on data without [CLS].

Runs in the data venv (data/make_venv.sh: the system interpreter's h5py and numpy, PyPI's
tokenizers); exits 77 (CTest: skipped) when that venv cannot be made (no PyPI).
"""
import os
import re
import shutil
import subprocess
import sys

SOURCE, PARTRAIN, RUN = sys.argv[1:4]
VOCAB = 3000


def fail(message):
    """Ends the test as failed."""
    print(f"FAILED: {message}")
    sys.exit(1)


def in_data_venv():
    """Re-runs this script in the data venv (made by data/make_venv.sh); exits 77 without it."""
    venv = os.path.join(SOURCE, "data", ".venv")
    if os.path.abspath(sys.prefix) == os.path.abspath(venv):
        return
    made = subprocess.run([os.path.join(SOURCE, "data", "make_venv.sh"), venv], capture_output=True, text=True)
    if made.returncode != 0:
        print(f"the data venv (data/make_venv.sh) cannot be made here; skipping:\n{made.stderr}")
        sys.exit(77)
    python = made.stdout.strip().splitlines()[-1]
    os.execv(python, [python] + sys.argv)


def wordnet_sentences():
    """The documents (lists of sentences) data/prepare_text.py reads."""
    sys.path.insert(0, os.path.join(SOURCE, "data"))
    from prepare_text import read_documents
    return read_documents(8)


def train_wordpiece(documents, path):
    """BERT's WordPiece recipe, special tokens in an order of its own; writes tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=["[UNK]", "[SEP]", "[PAD]", "[MASK]", "[CLS]"])
    tokenizer.train_from_iterator((s for d in documents for s in d), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))])
    tokenizer.save(path)
    return tokenizer


def train_byte_level_bpe(documents, directory):
    """GPT-2's byte-level BPE recipe, <|endoftext|> the last id; writes a model directory."""
    import json
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((s for d in documents for s in d), trainer)
    tokenizer.add_special_tokens(["<|endoftext|>"])
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}, f)
    return tokenizer


def prepare(tokenizer_path, out):
    """data/prepare.sh OUT --tokenizer PATH; returns text.h5's datasets and attributes."""
    import h5py
    result = subprocess.run([os.path.join(SOURCE, "data", "prepare.sh"), out, "--tokenizer", tokenizer_path],
                            capture_output=True, text=True)
    print("\n".join(line for line in result.stdout.splitlines() if line.startswith("prepare_text: ")))
    if result.returncode != 0:
        fail(f"data/prepare.sh --tokenizer {tokenizer_path} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    with h5py.File(os.path.join(out, "text.h5"), "r") as f:
        return ({name: f[name][()] for name in ("tokens", "sentence_offsets", "document_offsets")},
                {key: (value.decode() if isinstance(value, bytes) else value) for key, value in f.attrs.items()})


def check_attributes(attributes, tokenizer, expected_tokens, kind, source):
    """text.h5 records the tokenizer, its vocabulary and every special id as the library has them."""
    if attributes["tokenizer"] != "huggingface" or attributes["tokenizer_type"] != kind:
        fail(f"tokenizer attributes {attributes['tokenizer']!r} / {attributes['tokenizer_type']!r}, expected {kind}")
    if attributes["tokenizer_source"] != os.path.abspath(source):
        fail(f"tokenizer_source {attributes['tokenizer_source']!r}, expected {source}")
    if int(attributes["vocab_size"]) != tokenizer.get_vocab_size():
        fail(f"vocab_size {attributes['vocab_size']}, the tokenizer has {tokenizer.get_vocab_size()}")
    for role in ("pad", "unk", "bos", "eos", "cls", "sep", "mask"):
        token = expected_tokens.get(role)
        expected = tokenizer.token_to_id(token) if token else -1
        if int(attributes[role + "_id"]) != expected:
            fail(f"{role}_id is {attributes[role + '_id']}, the tokenizer's {token} is {expected}")
    print(f"{kind}: text.h5 records vocabulary {attributes['vocab_size']} and "
          + ", ".join(f"{r}_id {attributes[r + '_id']}" for r in ("pad", "unk", "bos", "eos", "cls", "sep", "mask")))


def check_decoding(data, tokenizer, documents, exact):
    """Every document's tokens decode back to its sentences (exact: byte for byte, joined by spaces;
    else lower-cased with whitespace removed, as BERT's uncased WordPiece normalises)."""
    offsets, tokens = data["document_offsets"], data["tokens"]
    for index, document in enumerate(documents):
        decoded = tokenizer.decode(tokens[offsets[index]:offsets[index + 1]].tolist(), skip_special_tokens=False)
        expected = " ".join(document)
        if not exact:
            decoded, expected = re.sub(r"\s+", "", decoded), re.sub(r"\s+", "", expected.lower())
        if decoded != expected:
            fail(f"document {index} decodes to {decoded[:200]!r}, expected {expected[:200]!r}")
    print(f"all {len(documents)} documents ({len(tokens)} tokens) decode back to the WordNet sentences")


def partrain(config, settings, name):
    """Runs `partrain train` for 2 steps; returns (exit code, output)."""
    command = [PARTRAIN, "train", os.path.join(SOURCE, "configs", config), "--set", "train.steps=2",
               "--set", "profile.enabled=false", "--set", "checkpoint.every=0", "--set", f"log.dir={RUN}/{name}"]
    for setting in settings:
        command += ["--set", setting]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    return result.returncode, result.stdout + result.stderr


def expect_trains(config, settings, name):
    code, log = partrain(config, settings, name)
    if code != 0 or "first loss" not in log:
        fail(f"partrain train {config} {settings} exited {code}:\n{log}")
    print(f"{name}: {[line for line in log.splitlines() if line.startswith('first loss')][0]}")


def expect_refused(config, settings, name, *parts):
    """partrain train exits 1 with one error line holding every part, before profiling or planning."""
    code, log = partrain(config, settings, name)
    errors = [line for line in log.splitlines() if line.startswith("partrain: error:")]
    if code != 1 or len(errors) != 1 or any(part not in errors[0] for part in parts):
        fail(f"partrain train {config} {settings}: expected one error naming {parts}, got exit {code}:\n{log}")
    if re.search(r"profil|plan table|step 1", log.replace(errors[0], "")):
        fail(f"partrain train {config} {settings} did work before refusing the data:\n{log}")
    print(f"{name}: refused: {errors[0]}")


def main():
    in_data_venv()
    shutil.rmtree(RUN, ignore_errors=True)
    os.makedirs(RUN)
    documents = wordnet_sentences()

    # BERT: WordPiece from a tokenizer.json file.
    wordpiece_file = os.path.join(RUN, "wordpiece.json")
    wordpiece = train_wordpiece(documents, wordpiece_file)
    bert_data, bert_attributes = prepare(wordpiece_file, os.path.join(RUN, "wordpiece-data"))
    check_attributes(bert_attributes, wordpiece, {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]",
                                                  "mask": "[MASK]"}, "WordPiece", wordpiece_file)
    check_decoding(bert_data, wordpiece, documents, exact=False)
    ids = {role: int(bert_attributes[role + "_id"]) for role in ("pad", "unk", "bos", "eos", "cls", "sep", "mask")}
    declared = [f"model.{role}_id={value}" for role, value in ids.items()]
    bert = ["model.vocab=%d" % VOCAB, f"data.path={RUN}/wordpiece-data/text.h5"]
    expect_trains("bert-tiny.toml", bert + declared, "bert-wordpiece")
    expect_refused("bert-tiny.toml", bert + [f"model.cls_id={ids['cls'] + 1}"], "bert-other-cls",
                   f"the data's cls_id is {ids['cls']}", f"the model's is {ids['cls'] + 1}", "[model] cls_id",
                   "WordPiece tokenizer " + os.path.abspath(wordpiece_file))
    expect_refused("bert-tiny.toml", bert[1:] + ["model.vocab=30522", f"model.cls_id={ids['cls']}"], "bert-other-vocab",
                   f"the data's vocabulary ({VOCAB}) differs from the model's", "[model] vocab = 30522")
    expect_refused("bert-tiny.toml", bert[1:] + ["model.vocab=2000"], "bert-small-vocab",
                   f"the data's vocabulary ({VOCAB}) exceeds the model's", "[model] vocab = 2000")

    # GPT: byte-level BPE from a model directory (special_tokens_map.json names <|endoftext|>).
    bpe_directory = os.path.join(RUN, "byte-level-bpe")
    bpe = train_byte_level_bpe(documents, bpe_directory)
    if bpe.token_to_id("<|endoftext|>") != VOCAB - 1:
        fail(f"<|endoftext|> is {bpe.token_to_id('<|endoftext|>')}, expected the last id {VOCAB - 1}")
    gpt_data, gpt_attributes = prepare(bpe_directory, os.path.join(RUN, "bpe-data"))
    check_attributes(gpt_attributes, bpe, {"unk": "<|endoftext|>", "bos": "<|endoftext|>", "eos": "<|endoftext|>"},
                     "BPE (byte-level)", bpe_directory)
    check_decoding(gpt_data, bpe, documents, exact=True)
    gpt = ["model.vocab=%d" % VOCAB, f"data.path={RUN}/bpe-data/text.h5"]
    expect_trains("gpt-tiny.toml", gpt + [f"model.eos_id={VOCAB - 1}", f"model.bos_id={VOCAB - 1}", "model.cls_id=-1"],
                  "gpt-byte-level-bpe")
    expect_refused("bert-tiny.toml", gpt, "bert-on-bpe", "has no [CLS] token")
    print("published tokenizers: prepared, recorded and checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
