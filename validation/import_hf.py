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


def load_config(path, settings):
    """partrain's experiment file as a dict, with section.key=value settings applied."""
    import tomllib
    config = read_toml(path, "--config")
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


def source_state(source, model, config):
    """The state dict of SOURCE: a file (torch.save or .safetensors) or a Hugging Face model directory."""
    import torch
    if os.path.isdir(source):
        if model == "resnet":
            fail(f"SOURCE {source}: a directory is a Hugging Face model; give torchvision's state dict file")
        from transformers import BertForPreTraining, GPT2LMHeadModel
        cls = BertForPreTraining if model == "bert" else GPT2LMHeadModel
        try:
            return cls.from_pretrained(source, local_files_only=True).state_dict()
        except (OSError, ValueError) as error:
            fail(f"SOURCE {source}: not a Hugging Face model directory ({error})")
    if not os.path.isfile(source):
        fail(f"SOURCE {source}: no such file or directory")
    if source.endswith(".safetensors"):
        from safetensors.torch import load_file
        try:
            return load_file(source)
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
    return state


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
    arguments = parser.parse_args()
    if (arguments.source is None) == (not arguments.from_config):
        parser.error("give either SOURCE or --from-config")
    # Paths first (one line, exit 2), before the libraries: a wrong path is reported everywhere.
    config = load_config(arguments.config, arguments.set)
    if arguments.source is not None and not os.path.exists(arguments.source):
        fail(f"SOURCE {arguments.source}: no such file or directory")
    require_output_directory(arguments.output, "OUT.h5")
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
    net = hf_models.build_model(model, config)
    if not arguments.from_config:
        state = with_model_prefix(source_state(arguments.source, model, config), model)
        try:
            missing, unexpected = net.load_state_dict(state, strict=False)
        except RuntimeError as error:  # shapes: the library names the tensor
            raise SystemExit(f"import_hf: {arguments.source} does not fit {arguments.config}'s model: {error}")
        missing = [name for name in missing if not name.endswith(hf_models.IGNORED_BUFFERS)]
        unexpected = [name for name in unexpected if not name.endswith(hf_models.IGNORED_BUFFERS)]
        if missing or unexpected:
            raise SystemExit(f"import_hf: {arguments.source} does not fit {arguments.config}'s model: "
                             f"missing {missing}, unexpected {unexpected}")
    tensors = hf_models.partrain_tensors(net)
    write_checkpoint(arguments.output, tensors, config, to_toml(config))
    count = sum(t.numel() for name, t in tensors.items() if not name.endswith(("running_mean", "running_var")))
    source = arguments.source or f"a fresh {type(net).__name__}"
    print(f"import_hf: {len(tensors)} tensors ({count} parameters) of {source} -> {arguments.output} "
          f"(step 0, no optimizer state)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
