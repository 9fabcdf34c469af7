#!/usr/bin/env python3
"""Plain-PyTorch peer of partrain's training step, for validation/perf/gpu_training_benchmark.sh and
cpu_training_benchmark.sh.

The models copy what src/models/{bert,gpt,layers}.cpp build, so that both sides do the same work:

* bert (configs/bert-base.toml): word + position + token-type embeddings, LayerNorm, dropout; post-LN
  encoder layers (Q, K, V linears; explicit attention: QK^T, scale 1/sqrt(head), + additive mask
  [B,1,1,S], softmax, attention dropout, PV; output dense, dropout, residual, LayerNorm; intermediate
  dense, exact (erf) GELU, output dense, dropout, residual, LayerNorm); LayerNorm eps 1e-12; MLM head
  (dense, GELU, LayerNorm, decoder tied to the word embeddings with its own bias) over EVERY position
  (the masked-LM loss ignores the unmasked positions with label -100, as in partrain and Hugging Face);
  with NSP (default, as bert-base.toml): pooler (dense + tanh on token 0) and a 2-way classifier;
  loss = MLM cross-entropy + NSP cross-entropy.
* gpt2 (configs/gpt2.toml): wte + wpe, dropout; pre-LN blocks (ln_1, c_attn (hidden -> 3 hidden),
  split, explicit causal attention, attention dropout, c_proj, dropout, residual; ln_2, c_fc,
  tanh-GELU, c_proj, dropout, residual); ln_f; LM head = x @ wte^T (tied, no bias); LayerNorm eps 1e-5.
  The loss is the cross-entropy of every position against the next token.
* resnet (configs/resnet18.toml ... resnet152.toml; default the Fashion-MNIST shape of resnet-tiny.toml):
  torchvision's own resnet18/34/50/101/152 (--depth; v1.5, as partrain's) with conv1 taking --channels
  inputs (7x7, stride 2, padding 3, no bias, as partrain's) and --classes outputs; 1 x 28 x 28, 10
  classes: 11,175,370 parameters for depth 18; ResNet-50 at 3 x 224 x 224, 1000 classes: 25,557,032,
  as partrain's graph. BatchNorm in training mode; loss = cross-entropy. Optimizer SGD by default
  (partrain's resnet configs): momentum 0.9, L2 weight decay on parameters of rank > 1. Throughput in
  images/s; FLOPs per image = 3 x the forward's convolution and linear FLOPs (2 per multiply-add; the
  backward counted as twice the forward, the convention of Kaplan et al. and of torchvision's GFLOPS
  table, which lists multiply-adds: ResNet-50 at 224 is 4.09 G of them, so 24.5 GFLOP per image).
  --channels-last runs the model and images in NHWC, the layout NVIDIA's own ResNet-50 recipes use.

Optimizer as partrain's [train] defaults: AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01
on parameters of rank > 1 only), global gradient-norm clipping at 1.0, cosine learning-rate decay to
min_lr 0 over --warmup + --steps steps. Data: random token ids made on the device before timing (the
data source does not matter for speed; partrain's timed step also includes its host-side batch
preparation and copy).

Precision: fp32 is IEEE fp32 (TF32 turned off for matmuls and cuDNN, as partrain's CUBLAS_COMPUTE_32F);
bf16 is torch.autocast(bfloat16) around the forward and the loss, with fp32 parameters, gradients and
AdamW state (partrain: bf16 activations and GEMM inputs, fp32 accumulation, fp32 master weights).
Modes: eager (the explicit attention math above, op by op) or compile (torch.compile of the model's
forward + loss; Inductor may fuse the attention's elementwise ops and picks its own kernels; the
optimizer and clipping stay eager in both modes).

Data parallel (--ddp, under `python -m torch.distributed.run --nproc_per_node N`): the model wrapped
in torch.nn.parallel.DistributedDataParallel (gloo on the CPU, nccl on GPUs) with its default 25 MiB
gradient buckets, each rank training on its 1/N of --batch; rank 0 reports (step times measured on
rank 0; the all-reduce keeps the ranks in step).

Prints ONE JSON line on stdout (everything else goes to stderr): tokens_per_second (bert, gpt2),
samples_per_second (images/s for resnet), step_seconds (median of the timed steps; each step is
bracketed by device synchronisation), and the run's settings. --count-only prints the parameter counts
and FLOPs per token (per image for resnet) without importing torch.
"""

import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # validation/: script_errors
from script_errors import ArgumentParser, fail  # noqa: E402

DEFAULTS = {
    # hidden, layers, heads, intermediate (0: 4 * hidden), vocab, max_position, layer-norm eps, as
    # configs/bert-base.toml (intermediate = 3072 written out) and configs/gpt2.toml (none: 4 * hidden).
    "bert": dict(hidden=768, layers=12, heads=12, intermediate=3072, vocab=30522, max_position=512, eps=1e-12),
    "gpt2": dict(hidden=768, layers=12, heads=12, intermediate=0, vocab=50257, max_position=1024, eps=1e-5),
}


def log(message):
    print(f"pytorch_reference: {message}", file=sys.stderr, flush=True)


def parse_arguments(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["bert", "gpt2", "resnet"], required=True)
    parser.add_argument("--seq", type=int, default=0, help="tokens per sample (bert, gpt2: required)")
    # ResNet shape (the Fashion-MNIST shape of configs/resnet-tiny.toml).
    parser.add_argument("--depth", type=int, choices=[18, 34, 50, 101, 152], default=18,
                        help="resnet: torchvision resnet18, 34, 50, 101 or 152")
    parser.add_argument("--image-size", type=int, default=28, help="resnet: image height and width")
    parser.add_argument("--channels", type=int, default=1, help="resnet: input channels")
    parser.add_argument("--classes", type=int, default=10, help="resnet: output classes")
    parser.add_argument("--channels-last", action="store_true", help="resnet: NHWC model and images")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], help="default: sgd for resnet, adamw otherwise")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--batch", type=int, default=8, help="samples per step (one microbatch)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--mode", choices=["eager", "compile"], default="eager")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them (compilation happens here)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--seed", type=int, default=1234)
    # Architecture overrides (defaults: bert-base / GPT-2 124M, as configs/bert-base.toml and gpt2.toml).
    parser.add_argument("--layers", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--intermediate", type=int, help="MLP inner size; 0: 4 * hidden")
    parser.add_argument("--vocab", type=int)
    parser.add_argument("--max-position", type=int)
    parser.add_argument("--type-vocab", type=int, default=2, help="bert: token-type vocabulary")
    parser.add_argument("--layer-norm-eps", type=float)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--attention-dropout", type=float, default=-1.0, help="negative: same as --dropout")
    parser.add_argument("--no-nsp", action="store_true", help="bert: no pooler / NSP head (bert-base.toml has nsp = true)")
    parser.add_argument("--mask-probability", type=float, default=0.15, help="bert: share of positions with an MLM label")
    # Optimizer ([train] defaults of partrain).
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--min-lr", type=float, default=0.0)
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.999)
    parser.add_argument("--eps", type=float, default=1e-8)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--grad-clip", type=float, default=1.0, help="0: no clipping")
    parser.add_argument("--adamw-impl", choices=["default", "foreach", "fused"], default="default",
                        help="torch.optim.AdamW implementation (default: PyTorch's own choice, foreach on CUDA)")
    parser.add_argument("--compile-mode", default="default",
                        help="torch.compile mode: default, reduce-overhead, max-autotune, ...")
    parser.add_argument("--threads", type=int, default=0, help="CPU: torch.set_num_threads (0: leave)")
    parser.add_argument("--ddp", action="store_true",
                        help="data parallel: run under torch.distributed.run; DistributedDataParallel over the "
                             "gloo backend (CPU), --batch is the global batch, split evenly over the ranks")
    parser.add_argument("--count-only", action="store_true",
                        help="print the parameter counts and FLOPs per token and exit (no torch needed)")
    args = parser.parse_args(argv)

    if args.optimizer is None:
        args.optimizer = "sgd" if args.model == "resnet" else "adamw"
    if args.channels_last and args.model != "resnet":
        parser.error("--channels-last is for --model resnet")
    if args.model == "resnet":
        if args.image_size < 1 or args.channels < 1 or args.classes < 1:
            parser.error("--image-size, --channels and --classes must be positive")
        if args.steps < 1 or args.warmup < 0 or args.batch < 1:
            parser.error("--steps and --batch must be positive, --warmup non-negative")
        return args
    if args.seq < 1:
        parser.error(f"--seq is required for --model {args.model}")
    defaults = DEFAULTS[args.model]
    for key in ("hidden", "layers", "heads", "intermediate", "vocab", "max_position"):
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    if args.intermediate == 0:
        args.intermediate = 4 * args.hidden
    if args.layer_norm_eps is None:
        args.layer_norm_eps = defaults["eps"]
    if args.attention_dropout < 0:
        args.attention_dropout = args.dropout
    args.nsp = args.model == "bert" and not args.no_nsp
    if args.hidden % args.heads:
        parser.error(f"--heads {args.heads} does not divide --hidden {args.hidden}")
    if args.seq > args.max_position:
        parser.error(f"--seq {args.seq} exceeds --max-position {args.max_position}")
    if args.steps < 1 or args.warmup < 0 or args.batch < 1:
        parser.error("--steps and --batch must be positive, --warmup non-negative")
    return args


def analytic_counts(args):
    """Parameter counts of the architecture (as partrain's graph: Hugging Face names and shapes).

    flop_parameters N: every parameter that multiplies each token's activations. It is the total less
    the position (and token-type) embeddings, which are lookups; the word embedding stays in N because
    the tied LM / MLM decoder multiplies by it at every position (nanoGPT's and llm.c's convention).
    flops_per_token = 6 N + 12 L d S: the standard training estimate (Kaplan et al. 2020; PaLM,
    Chowdhery et al. 2022, appendix B; Megatron-LM): 2 N forward + 4 N backward for the weight
    matmuls, and 12 L d S for QK^T and PV (forward + backward, full S x S, causal or not).
    """
    d, inner, vocab, positions, layers = args.hidden, args.intermediate, args.vocab, args.max_position, args.layers
    if args.model == "bert":
        embeddings = vocab * d + positions * d + args.type_vocab * d + 2 * d
        layer = 4 * (d * d + d) + (d * inner + inner) + (inner * d + d) + 2 * 2 * d
        head = (d * d + d) + 2 * d + vocab
        nsp = (d * d + d) + (2 * d + 2) if args.nsp else 0
        total = embeddings + layers * layer + head + nsp
        lookups = positions * d + args.type_vocab * d
    else:
        embeddings = vocab * d + positions * d
        layer = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * inner + inner) + (inner * d + d)
        total = embeddings + layers * layer + 2 * d
        lookups = positions * d
    flop_parameters = total - lookups
    flops_per_token = 6 * flop_parameters + 12 * layers * d * args.seq
    return dict(parameters=total, flop_parameters=flop_parameters, flops_per_token=flops_per_token)


RESNET_BLOCKS = {18: (False, [2, 2, 2, 2]), 34: (False, [3, 4, 6, 3]), 50: (True, [3, 4, 6, 3]),
                 101: (True, [3, 4, 23, 3]), 152: (True, [3, 8, 36, 3])}  # (bottleneck, blocks per stage)


def resnet_counts(args):
    """Parameters and training FLOPs per image of torchvision's ResNet (v1.5) at --image-size.

    Walks the architecture (He et al. 2016, Table 1; torchvision's resnet.py): conv1 7x7/2, max pool
    3x3/2, four stages of basic (18, 34) or bottleneck (50, 101, 152; expansion 4, the stride on the
    3x3) blocks of widths 64..512, a 1x1 projection where a block changes shape, global average pool,
    fc. Parameters: convolution weights, BatchNorm weight and bias, fc weight and bias (the BatchNorm
    running statistics are buffers). flops_per_image = 3 x 2 x the multiply-adds of the convolutions
    and fc (the backward as twice the forward; BatchNorm, ReLU and pooling left out, as in the
    published counts: 4.09 G multiply-adds for ResNet-50 at 224).
    """
    bottleneck, blocks = RESNET_BLOCKS[args.depth]
    parameters, multiply_adds, size = 0, 0, args.image_size

    def conv(inputs, outputs, kernel, stride, padding):
        nonlocal parameters, multiply_adds, size
        size = (size + 2 * padding - kernel) // stride + 1
        parameters += kernel * kernel * inputs * outputs + 2 * outputs  # weight, BatchNorm
        multiply_adds += size * size * kernel * kernel * inputs * outputs

    conv(args.channels, 64, 7, 2, 3)
    size = (size + 2 - 3) // 2 + 1  # max pool 3x3/2, padding 1
    expansion = 4 if bottleneck else 1
    channels = 64
    for stage, count in enumerate(blocks):
        planes = 64 << stage
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            block_input = size
            if bottleneck:
                conv(channels, planes, 1, 1, 0)
                conv(planes, planes, 3, stride, 1)
                conv(planes, planes * expansion, 1, 1, 0)
            else:
                conv(channels, planes, 3, stride, 1)
                conv(planes, planes, 3, 1, 1)
            if stride != 1 or channels != planes * expansion:  # the projection shortcut
                after = size
                size = block_input
                conv(channels, planes * expansion, 1, stride, 0)
                assert size == after
            channels = planes * expansion
    parameters += channels * args.classes + args.classes
    multiply_adds += channels * args.classes
    return dict(parameters=parameters, flop_parameters=None, flops_per_image=6 * multiply_adds,
                multiply_adds_per_image=multiply_adds)


def build_resnet(args, torch):
    """torchvision's resnet18/34/50/101/152 with conv1 for --channels inputs and --classes outputs."""
    import torchvision

    model = getattr(torchvision.models, f"resnet{args.depth}")(weights=None, num_classes=args.classes)
    model.conv1 = torch.nn.Conv2d(args.channels, 64, kernel_size=7, stride=2, padding=3, bias=False)

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, images, labels):
            return torch.nn.functional.cross_entropy(self.model(images), labels)

    return WithLoss()


def build_model(args, torch):
    if args.model == "resnet":
        return build_resnet(args, torch)
    nn = torch.nn
    F = torch.nn.functional
    head_size = args.hidden // args.heads
    scale = 1.0 / math.sqrt(head_size)

    def attention(q, k, v, batch, seq, additive_mask, causal_mask, p_dropout, training):
        # [B, S, d] -> [B, h, S, hd]; explicit QK^T, scale, mask, softmax, dropout, PV (partrain's
        # layers::attention with fused_attention = false).
        def heads(x):
            return x.view(batch, seq, args.heads, head_size).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        if additive_mask is not None:
            scores = scores + additive_mask
        if causal_mask is not None:
            scores = scores.masked_fill(causal_mask, float("-inf"))
        probabilities = torch.softmax(scores, dim=-1)
        probabilities = F.dropout(probabilities, p_dropout, training)
        context = torch.matmul(probabilities, v)
        return context.transpose(1, 2).reshape(batch, seq, args.hidden)

    class BertLayer(nn.Module):
        def __init__(self):
            super().__init__()
            d, inner, eps = args.hidden, args.intermediate, args.layer_norm_eps
            self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
            self.attention_output = nn.Linear(d, d)
            self.attention_norm = nn.LayerNorm(d, eps=eps)
            self.intermediate = nn.Linear(d, inner)
            self.output = nn.Linear(inner, d)
            self.output_norm = nn.LayerNorm(d, eps=eps)

        def forward(self, x, mask):
            batch, seq, _ = x.shape
            context = attention(self.query(x), self.key(x), self.value(x), batch, seq, mask, None,
                                args.attention_dropout, self.training)
            y = F.dropout(self.attention_output(context), args.dropout, self.training)
            attended = self.attention_norm(y + x)
            z = self.output(F.gelu(self.intermediate(attended)))
            z = F.dropout(z, args.dropout, self.training)
            return self.output_norm(z + attended)

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            d, eps = args.hidden, args.layer_norm_eps
            self.word_embeddings = nn.Embedding(args.vocab, d)
            self.position_embeddings = nn.Embedding(args.max_position, d)
            self.token_type_embeddings = nn.Embedding(args.type_vocab, d)
            self.embedding_norm = nn.LayerNorm(d, eps=eps)
            self.layers = nn.ModuleList([BertLayer() for _ in range(args.layers)])
            self.transform = nn.Linear(d, d)
            self.transform_norm = nn.LayerNorm(d, eps=eps)
            self.decoder_bias = nn.Parameter(torch.zeros(args.vocab))
            if args.nsp:
                self.pooler = nn.Linear(d, d)
                self.seq_relationship = nn.Linear(d, 2)
            self.register_buffer("position_ids", torch.arange(args.seq), persistent=False)

        def forward(self, input_ids, token_type_ids, attention_mask, mlm_labels, nsp_labels):
            x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
            x = x + self.position_embeddings(self.position_ids)
            x = F.dropout(self.embedding_norm(x), args.dropout, self.training)
            for layer in self.layers:
                x = layer(x, attention_mask)
            # .float(): what CUDA autocast does before layer_norm anyway (fp32 list); old CPU autocast
            # (torch 1.13) would hand LayerNorm a bf16 input with fp32 weights and fail.
            t = self.transform_norm(F.gelu(self.transform(x)).float())
            logits = F.linear(t, self.word_embeddings.weight, self.decoder_bias)  # every position
            loss = F.cross_entropy(logits.view(-1, args.vocab).float(), mlm_labels.view(-1), ignore_index=-100)
            if args.nsp:
                pooled = torch.tanh(self.pooler(x[:, 0]))
                loss = loss + F.cross_entropy(self.seq_relationship(pooled).float(), nsp_labels)
            return loss

    class GptBlock(nn.Module):
        def __init__(self):
            super().__init__()
            d, inner, eps = args.hidden, args.intermediate, args.layer_norm_eps
            self.ln_1 = nn.LayerNorm(d, eps=eps)
            self.c_attn = nn.Linear(d, 3 * d)
            self.attn_c_proj = nn.Linear(d, d)
            self.ln_2 = nn.LayerNorm(d, eps=eps)
            self.c_fc = nn.Linear(d, inner)
            self.mlp_c_proj = nn.Linear(inner, d)

        def forward(self, x, causal_mask):
            batch, seq, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(args.hidden, dim=2)
            a = attention(q, k, v, batch, seq, None, causal_mask, args.attention_dropout, self.training)
            x = x + F.dropout(self.attn_c_proj(a), args.dropout, self.training)
            m = self.mlp_c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
            return x + F.dropout(m, args.dropout, self.training)

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            d = args.hidden
            self.wte = nn.Embedding(args.vocab, d)
            self.wpe = nn.Embedding(args.max_position, d)
            self.h = nn.ModuleList([GptBlock() for _ in range(args.layers)])
            self.ln_f = nn.LayerNorm(d, eps=args.layer_norm_eps)
            self.register_buffer("position_ids", torch.arange(args.seq), persistent=False)
            causal = torch.ones(args.seq, args.seq, dtype=torch.bool).triu(1)  # True above the diagonal
            self.register_buffer("causal_mask", causal, persistent=False)

        def forward(self, input_ids, labels):
            x = F.dropout(self.wte(input_ids) + self.wpe(self.position_ids), args.dropout, self.training)
            for block in self.h:
                x = block(x, self.causal_mask)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied LM head
            return F.cross_entropy(logits.view(-1, args.vocab).float(), labels.view(-1))

    model = Bert() if args.model == "bert" else Gpt()
    # partrain's initialisation (src/models/model.cpp): normal(0, 0.02) for matrices, GPT-2's
    # residual projections scaled by 1/sqrt(2 L), zero biases, unit LayerNorm weights.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1:
                parameter.fill_(1.0 if ("norm" in name or "ln_" in name) and name.endswith("weight") else 0.0)
            elif name.endswith("c_proj.weight"):
                parameter.normal_(0.0, 0.02 / math.sqrt(2.0 * args.layers))
            else:
                parameter.normal_(0.0, 0.02)
    return model


def make_batches(args, torch, device, count):
    """`count` random batches on the device (cycled through during the run)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(args.seed)
    batches = []
    for _ in range(count):
        if args.model == "resnet":
            images = torch.randn(args.batch, args.channels, args.image_size, args.image_size, generator=generator)
            labels = torch.randint(0, args.classes, (args.batch,), generator=generator)
            images = images.to(device)
            if args.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            batches.append((images, labels.to(device)))
            continue
        shape = (args.batch, args.seq)
        ids = torch.randint(0, args.vocab, shape, generator=generator)
        if args.model == "bert":
            token_types = (torch.arange(args.seq) >= args.seq // 2).long().expand(shape).contiguous()
            mask = torch.zeros(args.batch, 1, 1, args.seq)  # additive: 0 for tokens (no padding here)
            selected = torch.rand(shape, generator=generator) < args.mask_probability
            mlm_labels = torch.where(selected, torch.randint(0, args.vocab, shape, generator=generator),
                                     torch.full(shape, -100, dtype=torch.long))
            nsp_labels = torch.randint(0, 2, (args.batch,), generator=generator)
            batch = (ids, token_types, mask, mlm_labels, nsp_labels)
        else:
            labels = torch.randint(0, args.vocab, shape, generator=generator)
            batch = (ids, labels)
        batches.append(tuple(t.to(device) for t in batch))
    return batches


def tf32_matmul(torch):
    try:
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except Exception:  # noqa: BLE001
        return None


def run(args):
    import torch

    rank, world = 0, 1
    if args.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo" if args.device == "cpu" else "nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
        if args.batch % world:
            raise SystemExit(f"pytorch_reference: --batch {args.batch} does not split over {world} ranks")
        args.batch //= world  # this rank's share of the global batch
        args.seed += rank     # each rank draws its own samples
    device = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    # fp32 means IEEE fp32, as partrain (no TF32 anywhere). Only the legacy flags are written: recent
    # torch refuses a mix of these and the newer fp32_precision API, and Inductor reads the legacy ones.
    for flags in (torch.backends.cuda.matmul, torch.backends.cudnn):
        try:
            flags.allow_tf32 = False
        except Exception as error:  # noqa: BLE001 - say so, and go on with whatever the default is
            log(f"WARNING: cannot turn TF32 off on {flags.__name__ if hasattr(flags, '__name__') else flags}: {error}")
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)

    model = build_model(args, torch).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    parameters = sum(p.numel() for p in model.parameters())  # tied weights counted once
    counts = resnet_counts(args) if args.model == "resnet" else analytic_counts(args)
    if parameters != counts["parameters"]:
        log(f"WARNING: the model has {parameters} parameters, the analytic count says {counts['parameters']}")

    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum)
    else:
        options = dict(lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
        if args.adamw_impl == "foreach":
            options["foreach"] = True
        elif args.adamw_impl == "fused":
            options["fused"] = True
        optimizer = torch.optim.AdamW(groups, **options)
    total_steps = args.warmup + args.steps

    def lr_at(step):  # partrain's cosine schedule without warm-up: lr -> min_lr over the run
        progress = min(1.0, step / max(1, total_steps))
        return args.min_lr + (args.lr - args.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))

    forward = model
    if args.ddp:  # DDP's defaults: 25 MiB buckets, each all-reduced as soon as its gradients are ready
        forward = torch.nn.parallel.DistributedDataParallel(model)
    if args.mode == "compile":
        if not hasattr(torch, "compile"):
            raise RuntimeError(f"torch.compile is not available in torch {torch.__version__}")
        forward = torch.compile(model, mode=None if args.compile_mode == "default" else args.compile_mode)
    autocast_dtype = torch.bfloat16 if args.precision == "bf16" else None

    def step(batch, step_index):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step_index)
        optimizer.zero_grad(set_to_none=True)
        if autocast_dtype is not None:
            with torch.autocast(device_type=device.type, dtype=autocast_dtype):
                loss = forward(*batch)
        else:
            loss = forward(*batch)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        return loss.detach()

    def synchronize():
        if cuda:
            torch.cuda.synchronize(device)

    batches = make_batches(args, torch, device, 4)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    seconds, losses = [], []
    for index in range(total_steps):
        synchronize()
        start = time.perf_counter()
        losses.append(step(batches[index % len(batches)], index))
        synchronize()
        seconds.append(time.perf_counter() - start)
        if index == 0:
            log(f"first step {seconds[0]:.2f} s ({args.mode}{', includes compilation' if args.mode == 'compile' else ''})")
    timed = seconds[args.warmup:]
    step_seconds = statistics.median(timed)
    if args.ddp:
        torch.distributed.destroy_process_group()
        args.batch *= world  # report the global batch, as partrain's figures
        if rank != 0:
            return None
    loss_values = [float(loss) for loss in losses]
    if not all(math.isfinite(value) for value in loss_values):
        raise RuntimeError(f"non-finite loss: {loss_values}")
    result = dict(
        model=args.model, seq=args.seq, batch=args.batch, precision=args.precision, mode=args.mode,
        device=str(device), device_name=torch.cuda.get_device_name(device) if cuda else "cpu",
        torch=torch.__version__, tf32_matmul=tf32_matmul(torch), parameters=parameters, flop_parameters=counts["flop_parameters"],
        flops_per_token=counts.get("flops_per_token"), flops_per_image=counts.get("flops_per_image"),
        layers=args.layers, hidden=args.hidden, heads=args.heads,
        intermediate=args.intermediate, vocab=args.vocab, steps=args.steps, warmup=args.warmup,
        step_seconds=step_seconds, step_seconds_min=min(timed), step_seconds_max=max(timed),
        first_step_seconds=seconds[0],
        tokens_per_second=args.batch * args.seq / step_seconds if args.model != "resnet" else None,
        samples_per_second=args.batch / step_seconds, optimizer=args.optimizer, channels_last=args.channels_last,
        depth=args.depth if args.model == "resnet" else None,
        image_size=args.image_size if args.model == "resnet" else None,
        threads=torch.get_num_threads(),
        first_loss=loss_values[0], last_loss=loss_values[-1], ranks=world,
        peak_memory_bytes=torch.cuda.max_memory_allocated(device) if cuda else None,
    )
    return result


def main():
    args = parse_arguments()
    if args.count_only:
        if args.model == "resnet":
            result = dict(model=args.model, depth=args.depth, image_size=args.image_size, **resnet_counts(args))
        else:
            result = dict(model=args.model, seq=args.seq, **analytic_counts(args))
    else:
        result = run(args)
    if result is not None:  # under --ddp only rank 0 reports
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
