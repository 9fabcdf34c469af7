"""partrain's models as the libraries build them, shared by the validation scripts.

partrain names every parameter and BatchNorm statistic as Hugging Face transformers
(BertForPreTraining, GPT2LMHeadModel) or torchvision (ResNet with BasicBlock) do, in the same
layout (GPT-2's linear weights in HF's Conv1D [in, out] layout), and stores each tied tensor once:
that is the whole mapping between a partrain checkpoint's /model group and a library state dict.

    build_model(model, config)         the library model for partrain's [model] section
    TIED                               library aliases of tensors partrain stores once
    partrain_tensors(net)              {partrain name: tensor} of a library model
    read_batches(path)                 the /batch/<name> datasets of a batch file (numpy)
    evaluate(model, net, batch, ...)   eval_loss as `partrain eval` defines it, with the library model

Imports torch, transformers or torchvision only inside the functions that need them.
"""

# Library state dict names of tensors that partrain stores once, under the name on the right:
# BERT's MLM decoder is the word embedding matrix (tied) and its bias cls.predictions.bias; GPT-2's
# lm_head is wte.
TIED = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
    "lm_head.weight": "transformer.wte.weight",
}

# Library buffers partrain does not keep: BERT's position/token-type id ranges, GPT-2's causal mask
# (older checkpoints) and BatchNorm's step counter (unused with momentum 0.1).
IGNORED_BUFFERS = ("position_ids", "token_type_ids", "attn.bias", "attn.masked_bias", "num_batches_tracked")


def layer_norm_eps(m, default):
    """[model] layer_norm_eps, or the type's default where it is unset or negative (as partrain reads it)."""
    value = m.get("layer_norm_eps", -1)
    return value if value >= 0 else default


def build_model(model, config):
    """The library model for partrain's experiment config (a dict from its TOML; [model] is read)."""
    m = config["model"]
    if model == "bert":
        from transformers import BertConfig, BertForPreTraining, BertForSequenceClassification
        cfg = BertConfig(vocab_size=m["vocab"], hidden_size=m["hidden"], num_hidden_layers=m["layers"],
                         num_attention_heads=m["heads"], intermediate_size=m.get("intermediate", 4 * m["hidden"]),
                         hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                         max_position_embeddings=m["max_position"], type_vocab_size=m.get("type_vocab", 2),
                         layer_norm_eps=layer_norm_eps(m, 1e-12), tie_word_embeddings=True)
        cfg._attn_implementation = "eager"
        if m.get("task") == "classification":  # [model] task: the pooled [CLS] -> dropout -> classifier
            cfg.num_labels = m["classes"]
            return BertForSequenceClassification(cfg)
        return BertForPreTraining(cfg)
    if model == "gpt":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=m["vocab"], n_embd=m["hidden"], n_layer=m["layers"], n_head=m["heads"],
                         n_positions=m["max_position"], n_inner=None, activation_function="gelu_new",
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=layer_norm_eps(m, 1e-5),
                         tie_word_embeddings=True)
        cfg._attn_implementation = "eager"
        return GPT2LMHeadModel(cfg)
    # torchvision's ResNet and BasicBlock (resnet18: [2, 2, 2, 2]) with resnet18's stem and stage
    # layout at base width `w` (torchvision fixes 64) and `channels` input channels.
    from torch import nn
    from torchvision.models.resnet import BasicBlock, ResNet
    assert m.get("depth", 50) == 18, "only ResNet-18's BasicBlock layout is mapped"
    w, classes = m["base_width"] * m.get("width_factor", 1), m["classes"]
    net = ResNet(BasicBlock, [2, 2, 2, 2], num_classes=classes)
    net.inplanes = w
    net.conv1 = nn.Conv2d(m["channels"], w, kernel_size=7, stride=2, padding=3, bias=False)
    net.bn1 = nn.BatchNorm2d(w)
    net.layer1 = net._make_layer(BasicBlock, w, 2)
    net.layer2 = net._make_layer(BasicBlock, 2 * w, 2, stride=2)
    net.layer3 = net._make_layer(BasicBlock, 4 * w, 2, stride=2)
    net.layer4 = net._make_layer(BasicBlock, 8 * w, 2, stride=2)
    net.fc = nn.Linear(8 * w, classes)
    return net


def partrain_tensors(net):
    """{partrain name: tensor} of a library model: every parameter once (tied ones under partrain's
    name) and the BatchNorm running statistics."""
    tensors = {}
    for name, p in net.named_parameters(remove_duplicate=False):
        tensors.setdefault(TIED.get(name, name), p)
    for name, b in net.named_buffers():
        if name.endswith(("running_mean", "running_var")):
            tensors[name] = b
    return tensors


# The /batch datasets evaluate() reads, per model type (BERT's nsp_labels only with [model] nsp;
# "bert-classification": BERT with [model] task = "classification", batch_fields() picks it).
BATCH_FIELDS = {"bert": ("input_ids", "token_type_ids", "attention_mask", "mlm_labels"),
                "bert-classification": ("input_ids", "token_type_ids", "attention_mask", "labels"),
                "gpt": ("input_ids", "labels"), "resnet": ("images", "labels")}


def batch_fields(config):
    """The /batch datasets evaluate() needs for partrain's experiment config dict."""
    m = config["model"]
    classification = m["type"] == "bert" and m.get("task") == "classification"
    return BATCH_FIELDS["bert-classification" if classification else m["type"]]


def read_batches(path, required=()):
    """{name: numpy array} of the /batch group of a batch file (see README "Evaluating a checkpoint").
    A file that is not HDF5, has no /batch group, lacks one of `required` or whose datasets' row
    counts differ is one error line naming the file and dataset (exit 2)."""
    import h5py
    from script_errors import fail, open_hdf5
    with open_hdf5(h5py, path, "batch file") as f:
        if "batch" not in f or not isinstance(f["batch"], h5py.Group):
            fail(f"batch file {path}: not a batch file (no /batch group)")
        for name in required:
            if name not in f["batch"]:
                fail(f"batch file {path}: no dataset /batch/{name}")
        batch = {name: f["batch"][name][()] for name in f["batch"] if isinstance(f["batch"][name], h5py.Dataset)}
    if not batch:
        fail(f"batch file {path}: /batch holds no datasets")
    rows = {name: (len(value) if value.ndim else 0) for name, value in batch.items()}
    if len(set(rows.values())) != 1:
        fail(f"batch file {path}: the /batch datasets' row counts differ: {rows}")
    return batch


def evaluate(model, net, batch, batch_size, batches):
    """`partrain eval`'s numbers with the library model in evaluation mode on batch rows
    [0, batches * batch_size), batch by batch: each cross-entropy term as a sum over the positions
    that count (label != -100) divided by their count, eval_loss the sum of the terms' means (BERT:
    MLM + NSP; sequence classification: its one term), top-1 accuracy for ResNet and BERT's sequence
    classification. Returns {"eval_loss", "terms", "accuracy", "samples"}."""
    import torch
    import torch.nn.functional as F
    net.eval()
    sums, counts, correct = {}, {}, 0

    def add(term, logits, labels):
        nonlocal correct
        logits, labels = logits.reshape(-1, logits.shape[-1]).double(), labels.reshape(-1)
        counted = labels != -100
        sums[term] = sums.get(term, 0.0) + F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum").item()
        counts[term] = counts.get(term, 0) + int(counted.sum())
        correct += int((logits.argmax(-1) == labels)[counted].sum())

    with torch.no_grad():
        for b in range(batches):
            t = {k: torch.from_numpy(v[b * batch_size:(b + 1) * batch_size]) for k, v in batch.items()}
            if model == "bert" and "mlm_labels" not in t:  # sequence classification
                mask = (t["attention_mask"].reshape(t["input_ids"].shape) == 0).long()
                out = net(input_ids=t["input_ids"], token_type_ids=t["token_type_ids"], attention_mask=mask)
                add("loss", out.logits, t["labels"])
            elif model == "bert":
                mask = (t["attention_mask"].reshape(t["input_ids"].shape) == 0).long()  # partrain: additive 0 / -1e4
                out = net(input_ids=t["input_ids"], token_type_ids=t["token_type_ids"], attention_mask=mask)
                add("cls.predictions.loss", out.prediction_logits, t["mlm_labels"])
                if "nsp_labels" in t:
                    add("cls.seq_relationship.loss", out.seq_relationship_logits, t["nsp_labels"])
            elif model == "gpt":
                add("loss", net(input_ids=t["input_ids"]).logits, t["labels"])  # labels already shifted
            else:
                add("loss", net(t["images"]), t["labels"])
    terms = {term: sums[term] / counts[term] if counts[term] else 0.0 for term in sums}
    samples = batches * batch_size
    return {"eval_loss": sum(terms.values()), "terms": terms, "samples": samples,
            "accuracy": correct / counts["loss"] if model == "resnet" or (model == "bert" and "loss" in counts) else None}
