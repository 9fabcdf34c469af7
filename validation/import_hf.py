#!/usr/bin/python3
"""Import a Hugging Face / torchvision model as a partrain checkpoint (to fine-tune a published model).

    validation/import_hf.py SOURCE OUT.h5 --config CONFIG.toml [--set section.key=value ...]
    validation/import_hf.py --from-config OUT.h5 --config CONFIG.toml [--set ...]

SOURCE is a state dict (a torch.save file such as pytorch_model.bin, or a .safetensors file) or a
Hugging Face model directory (config.json and weights, as save_pretrained writes; read offline).
--from-config imports the library's own freshly initialised model instead. CONFIG.toml is the
partrain experiment file to train with: the library model of its [model] sizes (transformers'
BertForPreTraining or GPT2LMHeadModel, torchvision's ResNet, validation/hf_models.py) takes the
state dict with load_state_dict (so shapes and names are checked by the library; GPT2Model and
BertModel keys without the "transformer." / "bert." prefix are accepted), and every parameter
(tied ones once, under partrain's name) and BatchNorm running statistic is written as
/model/<name> (fp32, Fletcher32), with the checkpoint attributes partrain reads: format_version 1,
step 0 (and consumed_samples, data_cursor, lr_step 0), seed and optimizer from CONFIG, config_toml
(CONFIG with the --set options applied), plan_json empty. There is no /optim group:
`partrain train CONFIG --resume OUT.h5` restores the parameters and starts the optimizer fresh
(it says so), `partrain eval CONFIG --resume OUT.h5` evaluates the imported model.

A published model (docs/published-models.md): `--write-config OUT.toml` takes the model's shape from
the directory's config.json (BERT: BertModel / BertFor*; GPT-2) instead of CONFIG's [model] keys,
and its tokenizer's special ids (the directory's tokenizer.json, read as data/prepare.sh --tokenizer
reads it) as [model] pad_id ... mask_id, so that partrain trains it only on data made by that
tokenizer; it writes the resulting experiment file (CONFIG's other sections, --set applied last) to
OUT.toml and into the checkpoint. Parameters the source lacks that partrain's model has (a bare
BertModel's MLM and NSP heads, or the classifier of [model] task = "classification") are newly initialised by the library under [train] seed and listed as
such; any other missing or unexpected parameter is an error.

Needs torch, h5py and transformers (BERT, GPT) or torchvision (ResNet): validation/golden/.venv
(made by validation/golden/make_golden.py) has them.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models  # noqa: E402
from script_errors import fail, read_toml, require_output_directory  # noqa: E402

PREFIXES = {"bert": ("bert.", ("embeddings.", "encoder.", "pooler.")), "gpt": ("transformer.", ("wte.", "wpe.", "h.", "ln_f."))}
# Task heads a published checkpoint may lack (a bare BertModel): newly initialised, reported as such.
HEADS = {"bert": ("cls.", "classifier."), "gpt": (), "resnet": ()}


def load_config(path, settings):
    """partrain's experiment file as a dict, with section.key=value settings applied."""
    return load_config_dict(read_toml(path, "--config"), settings)


def load_config_dict(config, settings):
    """An experiment config dict with section.key=value settings applied."""
    import tomllib
    for setting in settings:
        key, _, value = setting.partition("=")
        section, _, name = key.partition(".")
        if not name or not section:
            fail(f"--set {setting}: expected section.key=value")
        try:
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            parsed = value  # a bare string, as partrain's --set takes it
        config.setdefault(section, {})[name] = parsed
    return config


def published_model_config(source, model):
    """partrain [model] keys of the Hugging Face model directory `source` (its config.json) and its
    tokenizer's special ids. Fails naming the file and key when partrain's model differs from it."""
    import json
    path = os.path.join(source, "config.json")
    if not os.path.isdir(source) or not os.path.isfile(path):
        fail(f"SOURCE {source}: --write-config needs a Hugging Face model directory with a config.json")
    with open(path, encoding="utf-8") as f:
        c = json.load(f)
    kind = c.get("model_type")
    if (model, kind) not in (("bert", "bert"), ("gpt", "gpt2")):
        fail(f"{path}: model_type {kind!r} is not partrain's [model] type {model!r} (bert: \"bert\", gpt: \"gpt2\")")

    def require(key, allowed, default=None):
        value = c.get(key, default)
        if value not in allowed:
            fail(f"{path}: {key} = {value!r}, but partrain's {model} has {allowed[0]!r} (not importable)")

    if model == "bert":
        require("hidden_act", ("gelu",))  # partrain's BERT GELU is the exact (erf) one
        require("position_embedding_type", ("absolute",), "absolute")
        require("is_decoder", (False,), False)
        keys = {"layers": c["num_hidden_layers"], "hidden": c["hidden_size"], "heads": c["num_attention_heads"],
                "intermediate": c["intermediate_size"], "vocab": c["vocab_size"],
                "max_position": c["max_position_embeddings"], "type_vocab": c.get("type_vocab_size", 2),
                "layer_norm_eps": c.get("layer_norm_eps", 1e-12), "dropout": c.get("hidden_dropout_prob", 0.1),
                "attention_dropout": c.get("attention_probs_dropout_prob", 0.1),
                "initializer_range": c.get("initializer_range", 0.02)}
    else:
        require("activation_function", ("gelu_new",), "gelu_new")  # partrain's GPT GELU is the tanh one
        require("scale_attn_weights", (True,), True)
        require("scale_attn_by_inverse_layer_idx", (False,), False)
        require("reorder_and_upcast_attn", (False,), False)
        if c.get("embd_pdrop", 0.1) != c.get("resid_pdrop", 0.1):
            fail(f"{path}: embd_pdrop {c.get('embd_pdrop')} differs from resid_pdrop {c.get('resid_pdrop')} "
                 "(partrain's [model] dropout is both)")
        keys = {"layers": c["n_layer"], "hidden": c["n_embd"], "heads": c["n_head"], "intermediate": c.get("n_inner") or 0,
                "vocab": c["vocab_size"], "max_position": c["n_positions"],
                "layer_norm_eps": c.get("layer_norm_epsilon", 1e-5), "dropout": c.get("resid_pdrop", 0.1),
                "attention_dropout": c.get("attn_pdrop", 0.1), "initializer_range": c.get("initializer_range", 0.02)}
    tokenizer_path = os.path.join(source, "tokenizer.json")
    if os.path.isfile(tokenizer_path):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data"))
        from published_tokenizer import PublishedTokenizer, TokenizerError
        try:
            tokenizer = PublishedTokenizer(source)
        except TokenizerError as error:
            fail(str(error))
        if tokenizer.vocab_size != keys["vocab"]:
            fail(f"{tokenizer_path}: vocabulary {tokenizer.vocab_size}, but config.json's vocab_size is {keys['vocab']}")
        keys.update({role + "_id": token_id for role, token_id in tokenizer.special_ids.items()})
        described = f"{tokenizer.kind} tokenizer, " + ", ".join(
            f"{role}_id {token_id}" for role, token_id in tokenizer.special_ids.items())
    else:
        described = "no tokenizer.json: special ids not declared"
    print(f"import_hf: {path}: {model} {keys['layers']} layers, hidden {keys['hidden']}, {keys['heads']} heads, "
          f"vocab {keys['vocab']}; {described}")
    return keys


def source_state(source, model, config, seed):
    """(state dict, names the source lacked) of SOURCE: a file (torch.save or .safetensors) or a
    Hugging Face model directory (parameters it lacks, such as a bare BertModel's heads, are
    initialised by the library under `seed`)."""
    import torch
    if os.path.isdir(source):
        if model == "resnet":
            fail(f"SOURCE {source}: a directory is a Hugging Face model; give torchvision's state dict file")
        from transformers import BertForPreTraining, BertForSequenceClassification, GPT2LMHeadModel
        classification = model == "bert" and config["model"].get("task") == "classification"
        cls = BertForSequenceClassification if classification else BertForPreTraining if model == "bert" else GPT2LMHeadModel
        options = {"num_labels": config["model"]["classes"]} if classification else {}
        torch.manual_seed(seed)
        try:
            net, info = cls.from_pretrained(source, local_files_only=True, output_loading_info=True, **options)
        except (OSError, ValueError) as error:
            fail(f"SOURCE {source}: not a Hugging Face model directory ({error})")
        if info.get("mismatched_keys"):
            fail(f"SOURCE {source}: shapes differ from its config.json: {info['mismatched_keys']}")
        lacked = [name for name in info.get("missing_keys", ()) if not name.endswith(hf_models.IGNORED_BUFFERS)]
        return net.state_dict(), sorted(lacked)
    if not os.path.isfile(source):
        fail(f"SOURCE {source}: no such file or directory")
    if source.endswith(".safetensors"):
        from safetensors.torch import load_file
        try:
            return load_file(source), []
        except Exception as error:  # safetensors raises its own error types
            fail(f"SOURCE {source}: not a safetensors file ({error})")
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as error:  # pickle, zip and torch's own errors: all mean "not a state dict file"
        fail(f"SOURCE {source}: not a torch.save state dict file ({type(error).__name__}: {error})")
    if not isinstance(state, dict):
        fail(f"SOURCE {source}: not a state dict (a {type(state).__name__})")
    if isinstance(state.get("state_dict"), dict):  # a training framework's checkpoint around the state dict
        state = state["state_dict"]
    return state, []


def with_model_prefix(state, model):
    """Keys of a bare GPT2Model / BertModel state dict get the *LMHead / *ForPreTraining prefix."""
    if model not in PREFIXES:
        return state
    prefix, bare = PREFIXES[model]
    return {(prefix + k if k.startswith(bare) else k): v for k, v in state.items()}


def to_toml(config):
    """TOML text of an experiment config dict (sections of strings, numbers, booleans and lists)."""
    import json

    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(str(v))  # a TOML basic string

    lines = []
    for section, table in config.items():
        lines += [f"[{section}]"] + [f"{key} = {value(v)}" for key, v in table.items()] + [""]
    return "\n".join(lines)


def write_checkpoint(path, tensors, config, config_text):
    """Writes a partrain checkpoint with /model/<name> and the attributes, via a temporary name."""
    import h5py
    import numpy as np
    temporary = path + ".tmp"
    with h5py.File(temporary, "w") as f:
        for name, tensor in sorted(tensors.items()):
            data = tensor.detach().cpu().float().numpy()
            f.create_dataset(f"model/{name}", data=data, fletcher32=True, chunks=data.shape if data.ndim else None)
        train = config.get("train", {})
        for name in ("format_version", "step", "consumed_samples", "data_cursor", "lr_step"):
            f.attrs[name] = np.int64(1 if name == "format_version" else 0)
        f.attrs["seed"] = np.uint64(train.get("seed", 1234))
        f.attrs["optimizer"] = train.get("optimizer", "adamw")
        f.attrs["config_toml"] = config_text
        f.attrs["plan_json"] = ""
    os.replace(temporary, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="state dict file (.bin/.pt/.safetensors) or Hugging Face model directory")
    parser.add_argument("output", help="the partrain checkpoint to write (.h5)")
    parser.add_argument("--from-config", action="store_true", help="import the library's freshly initialised model")
    parser.add_argument("--config", required=True, help="partrain experiment file (TOML) of the model")
    parser.add_argument("--set", action="append", default=[], help="section.key=value override of --config")
    parser.add_argument("--write-config", metavar="OUT.toml",
                        help="a published model: its shape (config.json) and tokenizer's special ids as [model], "
                             "the experiment file written here")
    arguments = parser.parse_args()
    if (arguments.source is None) == (not arguments.from_config):
        parser.error("give either SOURCE or --from-config")
    # Paths first (one line, exit 2), before the libraries: a wrong path is reported everywhere.
    config = load_config(arguments.config, arguments.set)
    if arguments.source is not None and not os.path.exists(arguments.source):
        fail(f"SOURCE {arguments.source}: no such file or directory")
    require_output_directory(arguments.output, "OUT.h5")
    if arguments.write_config:
        require_output_directory(arguments.write_config, "--write-config")
        if arguments.source is None:
            fail("--write-config takes the shape from SOURCE's config.json: give SOURCE, not --from-config")
    try:
        import h5py  # noqa: F401
        import torch  # noqa: F401
    except ImportError as error:
        print(f"import_hf: {error.name} is not installed (validation/golden/.venv has it: "
              f"validation/golden/make_golden.py makes it)", file=sys.stderr)
        return 2
    model = config["model"].get("type") if isinstance(config.get("model"), dict) else None
    if model not in ("bert", "gpt", "resnet"):
        fail(f"--config {arguments.config}: [model] type must be bert, gpt or resnet, not {model!r}")
    if arguments.write_config:  # the published model's shape and special ids; --set still wins
        published = published_model_config(arguments.source, model)
        config["model"] = {**config["model"], **published}
        config["model"]["seq_len"] = min(config["model"].get("seq_len", 128), published["max_position"])
        for key in list(config["model"]):  # special ids of CONFIG's own tokenizer do not apply
            if key.endswith("_id") and key not in published:
                del config["model"][key]
        config = load_config_dict(config, arguments.set)
    seed = int(config.get("train", {}).get("seed", 1234))
    import torch
    torch.manual_seed(seed)  # the library's initialisation of whatever the source lacks
    net = hf_models.build_model(model, config)
    initialised = []
    if not arguments.from_config:
        state, lacked = source_state(arguments.source, model, config, seed)
        state = with_model_prefix(state, model)
        try:
            missing, unexpected = net.load_state_dict(state, strict=False)
        except RuntimeError as error:  # shapes: the library names the tensor
            raise SystemExit(f"import_hf: {arguments.source} does not fit {arguments.config}'s model: {error}")
        missing = [name for name in missing if not name.endswith(hf_models.IGNORED_BUFFERS)]
        unexpected = [name for name in unexpected if not name.endswith(hf_models.IGNORED_BUFFERS)]
        # Task heads a published encoder lacks keep the library's fresh initialisation (reported).
        initialised = sorted({name for name in (hf_models.TIED.get(n, n) for n in missing + lacked)
                              if name.startswith(HEADS[model])})
        missing = [name for name in missing if not name.startswith(HEADS[model])]
        if missing or unexpected:
            raise SystemExit(f"import_hf: {arguments.source} does not fit {arguments.config}'s model: "
                             f"missing {missing}, unexpected {unexpected}")
    tensors = hf_models.partrain_tensors(net)
    text = to_toml(config)
    write_checkpoint(arguments.output, tensors, config, text)
    if arguments.write_config:
        with open(arguments.write_config, "w", encoding="utf-8") as f:
            f.write(f"# Written by validation/import_hf.py from {os.path.abspath(arguments.source)} "
                    f"and {arguments.config}.\n" + text)
    count = sum(t.numel() for name, t in tensors.items() if not name.endswith(("running_mean", "running_var")))
    source = arguments.source or f"a fresh {type(net).__name__}"
    initialised = [name for name in initialised if name in tensors]
    from_source = len(tensors) - len(initialised)
    print(f"import_hf: {len(tensors)} tensors ({count} parameters) of {source} -> {arguments.output} "
          f"(step 0, no optimizer state)" + (f"; config -> {arguments.write_config}" if arguments.write_config else ""))
    if initialised:
        print(f"import_hf: {from_source} tensors from the checkpoint; {len(initialised)} newly initialised "
              f"(task heads the checkpoint lacks; the library's initialisation, seed {seed}): {', '.join(initialised)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
