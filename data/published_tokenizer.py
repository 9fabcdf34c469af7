"""A published model's tokenizer (Hugging Face `tokenizers`) for data/prepare_text.py --tokenizer.

    tokenizer = PublishedTokenizer(path)   # a tokenizer.json, or a directory as save_pretrained writes it
    tokenizer.special_ids                  # {"pad": 0, "unk": 100, "cls": 101, ...}; -1: not defined
    tokenizer.encode_documents(documents)  # documents (lists of sentences) -> one id list per sentence

The special tokens come from the tokenizer itself, never from fixed ids: a model directory's
special_tokens_map.json / tokenizer_config.json (their pad_token, unk_token, bos_token, eos_token,
cls_token, sep_token, mask_token) when present, else the conventional names of BERT's WordPiece
([PAD], [UNK], [CLS], [SEP], [MASK]), RoBERTa's and GPT-2's byte-level BPE (<s>, </s>, <pad>, <mask>,
<|endoftext|>) that the vocabulary holds. A tokenizer without a [CLS]/[SEP]/[MASK] (GPT-2) prepares
data for GPT only; partrain's BERT sampler refuses it.

Runs in the data venv (data/make_venv.sh: the system interpreter's h5py and numpy plus PyPI's
`tokenizers`, data/requirements.txt).
"""
import hashlib
import json
import os

ROLES = ("pad", "unk", "bos", "eos", "cls", "sep", "mask")
# Conventional token strings of each role, in order of preference.
CONVENTIONAL = {
    "pad": ("[PAD]", "<pad>", "<|pad|>"),
    "unk": ("[UNK]", "<unk>"),
    "bos": ("[BOS]", "<s>", "<|endoftext|>"),
    "eos": ("[EOS]", "</s>", "<|endoftext|>"),
    "cls": ("[CLS]", "<s>"),
    "sep": ("[SEP]", "</s>"),
    "mask": ("[MASK]", "<mask>"),
}


class TokenizerError(Exception):
    """A tokenizer path that cannot be used (message names the path and the reason)."""


def _token_string(value):
    """The token of a special_tokens_map / tokenizer_config entry ("[CLS]" or {"content": "[CLS]"})."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _declared_special_tokens(directory):
    """{role: token string} that a model directory's special_tokens_map.json / tokenizer_config.json name."""
    declared = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):  # the second wins, as in transformers
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as handle:
                entries = json.load(handle)
        except (OSError, ValueError) as error:
            raise TokenizerError(f"{path}: not readable JSON ({error})")
        for role in ROLES:
            token = _token_string(entries.get(role + "_token"))
            if token:
                declared[role] = token
    return declared


class PublishedTokenizer:
    """A Hugging Face tokenizer loaded from a tokenizer.json or a model directory, with its special ids."""

    def __init__(self, path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerError("the Hugging Face `tokenizers` library is not installed in this interpreter "
                                 "(data/prepare.sh --tokenizer makes the data venv: data/make_venv.sh)")
        directory = path if os.path.isdir(path) else None
        self.file = os.path.join(path, "tokenizer.json") if directory else path
        if not os.path.isfile(self.file):
            raise TokenizerError(f"--tokenizer {path}: no tokenizer.json there (give a tokenizer.json file or a "
                                 "model directory as save_pretrained writes it; slow-tokenizer vocab.txt / "
                                 "merges.txt alone are not read)")
        try:
            self.tokenizer = Tokenizer.from_file(self.file)
        except Exception as error:  # tokenizers raises its own Exception type for a malformed file
            raise TokenizerError(f"--tokenizer {self.file}: not a Hugging Face tokenizer.json ({error})")
        with open(self.file, "rb") as handle:
            self.sha256 = hashlib.sha256(handle.read()).hexdigest()
        with open(self.file, encoding="utf-8") as handle:
            description = json.load(handle)
        # Whole sentences go in; the sampler adds [CLS]/[SEP] and cuts to the sequence length itself.
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        model_type = (description.get("model") or {}).get("type", "unknown")
        self.byte_level = "ByteLevel" in json.dumps(description.get("pre_tokenizer"))
        self.kind = model_type + (" (byte-level)" if self.byte_level else "")
        declared = _declared_special_tokens(directory) if directory else {}
        self.special_ids = {}
        self.special_tokens = {}
        for role in ROLES:
            candidates = ((declared[role],) if role in declared else ()) + CONVENTIONAL[role]
            for token in candidates:
                token_id = self.tokenizer.token_to_id(token)
                if token_id is not None:
                    self.special_ids[role], self.special_tokens[role] = token_id, token
                    break
            else:
                if role in declared:
                    raise TokenizerError(f"--tokenizer {path}: its {role}_token {declared[role]!r} is not in the "
                                         "vocabulary")
                self.special_ids[role] = -1

    def encode_documents(self, documents):
        """Token ids of every sentence of every document, without special tokens. Sentences after a
        document's first get a leading space: byte-level BPE marks word starts with it (GPT-2's "Ġ"),
        so the concatenated sentences read as the running text; WordPiece ignores it."""
        texts = [(" " + sentence if index else sentence) for document in documents
                 for index, sentence in enumerate(document)]
        return [encoding.ids for encoding in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
