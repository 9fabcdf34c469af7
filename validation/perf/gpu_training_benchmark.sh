#!/usr/bin/env bash
# GPU training benchmark (issue 7, item 6; docs/validation.md §Benchmarks): partrain's training step
# against plain PyTorch (eager and torch.compile) on the same machine in the same run, with the same
# model, precision, batch and optimizer settings. A program, not a test: it asserts nothing.
#
# Cases: {bert-base seq 128, bert-base seq 512, gpt2 (124M) seq 1024, resnet50 at 224 x 224 x 3} x
# {fp32, bf16}. For each:
#   ours:    $PARTRAIN train configs/bert-base.toml|gpt2.toml|resnet50.toml on one rank, one stage, one
#            microbatch (planner uniform, stages 1), profiling and checkpoints off; WARMUP + STEPS
#            steps; the median of the per-step "seconds" of metrics.jsonl after the first WARMUP steps.
#            resnet50 reads synthetic images ([data] synthetic: no ImageNet needed; PyTorch's are random
#            too) and trains with SGD (momentum 0.9), as partrain's resnet configs and the reference.
#   eager / compile: validation/perf/pytorch_reference.py with the same settings (see its docstring).
# Printed (and written to $RESULTS_DIR/results.md, records in results.jsonl): tokens/s of each
# (images/s for resnet50), the ratios ours/eager and ours/compile, and MFU:
#   resnet50: F per image = 3 x 2 x the forward's multiply-adds (4.09 G at 224: 24.5 GFLOP), the
#     convention of the published counts; otherwise FLOPs per token:
#   FLOPs per token F = 6 N + 12 L d S   (Kaplan et al. 2020; PaLM appendix B; Megatron-LM)
#     N = parameters taking part in the per-token matmuls: all parameters less the position and
#         token-type embeddings (lookups); the word embedding stays in N because the tied LM / MLM
#         decoder multiplies by it at every position. bert-base: N = 109,711,676; gpt2: 123,653,376.
#     12 L d S: QK^T and PV, forward and backward, the full S x S (also for causal GPT-2).
#   MFU = F x tokens/s (images/s) / peak, peak = 989e12 (H100 SXM bf16 dense) for every row, fp32 rows included;
#   fp32 rows also against 67e12 (H100 SXM fp32 without tensor cores: IEEE fp32, TF32 off, as ours).
# One formula for all implementations, so the MFU ratio equals the tokens/s ratio.
#
# Usage (on the GPU machine, see validation/perf/README.md):
#   source .devdeps/env.sh && PYTHON=/opt/torch/.venv/bin/python validation/perf/gpu_training_benchmark.sh
# Environment (defaults in brackets):
#   PARTRAIN     partrain binary [build/cuda/bin/partrain, else `partrain` on PATH; SMOKE: build/cpu/bin/partrain]
#   PARTRAIN_LAUNCHER  command put before it, e.g. "mpirun -np 1 --bind-to none" [none: MPI singleton]
#   PYTHON       Python with torch [/opt/torch/.venv/bin/python, python3 or /usr/bin/python3: the first with torch]
#   DEVICE       cuda | cpu [cuda; SMOKE: cpu]
#   CASES        [bert128 bert512 gpt1024 resnet50]    PRECISIONS [fp32 bf16]    MODES [eager compile]
#   BATCH_BERT128 [64]  BATCH_BERT512 [16]  BATCH_GPT1024 [8]  BATCH_RESNET50 [128]   samples per step
#                (one microbatch)
#   TEXT_DATA    a prepared text file for the bert and gpt2 cases (data.path) [the config's default]
#   TORCH_RESNET_ARGS  extra pytorch_reference.py arguments for resnet50 only (e.g. "--channels-last")
#   STEPS [20] timed steps, WARMUP [5] untimed steps before them (torch.compile compiles there)
#   RUN_TIMEOUT [240] seconds for one run (ours, eager or compile); a run past it is recorded as failed
#   RESULTS_DIR [runs/gpu-benchmark; SMOKE: runs/gpu-benchmark-smoke]; APPEND=1 keeps its results.jsonl
#                (to split the cases over several commands: later records replace earlier ones)
#   COPY_TO      folder that gets results.md, results.jsonl and the logs after every run [$OUT if set]
#   TORCH_ARGS   extra pytorch_reference.py arguments (e.g. "--adamw-impl fused")
#   PARTRAIN_SETS extra partrain `--set` overrides, space-separated (e.g. "model.fused_attention=true")
#   SMOKE=1      CPU smoke test of the script itself: tiny models (2 layers, hidden 64, vocab 8000),
#                seq 32/64/64, resnet50 at 64 x 64, batch 2, STEPS 3, WARMUP 1, device cpu. Its
#                figures mean nothing.
# A failing run (error, timeout, missing binary) is recorded with its error line; the others go on.
# Exit code: 0 when every run gave a figure, 1 when some failed, 2 on a bad setup.
set -uo pipefail

# Bad input (an argument, a setting): one line "gpu_training_benchmark.sh: error: ..." and exit
# status 2 (as the validation scripts), before anything runs; a missing binary is a failed run instead.
fail() { echo "gpu_training_benchmark.sh: error: $*" >&2; exit 2; }
case ${1-} in
  "") ;;
  -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) fail "unknown argument '$1': the settings are environment variables (see --help)" ;;
esac
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root" || exit 2

SMOKE=${SMOKE:-0}
if [ "$SMOKE" = 1 ]; then
  DEVICE=${DEVICE:-cpu}
  STEPS=${STEPS:-3}
  WARMUP=${WARMUP:-1}
  RESULTS_DIR=${RESULTS_DIR:-runs/gpu-benchmark-smoke}
  default_batch=2
  seq_bert128=32 seq_bert512=64 seq_gpt1024=64 image_resnet50=64
  arch_sets=(model.layers=2 model.hidden=64 model.heads=2 model.intermediate=256 model.vocab=8000)
  arch_args=(--layers 2 --hidden 64 --heads 2 --intermediate 256 --vocab 8000)
else
  DEVICE=${DEVICE:-cuda}
  STEPS=${STEPS:-20}
  WARMUP=${WARMUP:-5}
  RESULTS_DIR=${RESULTS_DIR:-runs/gpu-benchmark}
  default_batch=
  seq_bert128=128 seq_bert512=512 seq_gpt1024=1024 image_resnet50=224
  arch_sets=()
  arch_args=()
fi
BATCH_BERT128=${BATCH_BERT128:-${default_batch:-64}}
BATCH_BERT512=${BATCH_BERT512:-${default_batch:-16}}
BATCH_GPT1024=${BATCH_GPT1024:-${default_batch:-8}}
BATCH_RESNET50=${BATCH_RESNET50:-${default_batch:-128}}
CASES=${CASES:-bert128 bert512 gpt1024 resnet50}
PRECISIONS=${PRECISIONS:-fp32 bf16}
MODES=${MODES:-eager compile}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
COPY_TO=${COPY_TO:-${OUT:-}}
PARTRAIN_LAUNCHER=${PARTRAIN_LAUNCHER:-}
read -r -a torch_extra <<<"${TORCH_ARGS:-}"
read -r -a partrain_extra <<<"${PARTRAIN_SETS:-}"
read -r -a torch_resnet_extra <<<"${TORCH_RESNET_ARGS:-}"
TEXT_DATA=${TEXT_DATA:-}
PEAK_BF16=989e12
PEAK_FP32=67e12
for case in $CASES; do case $case in bert128 | bert512 | gpt1024 | resnet50) ;; *) fail "CASES: unknown case '$case' (bert128 bert512 gpt1024 resnet50)" ;; esac; done
for precision in $PRECISIONS; do case $precision in fp32 | bf16) ;; *) fail "PRECISIONS: unknown precision '$precision' (fp32 bf16)" ;; esac; done
for mode in $MODES; do case $mode in eager | compile) ;; *) fail "MODES: unknown mode '$mode' (eager compile)" ;; esac; done
[[ $DEVICE =~ ^(cpu|cuda(:[0-9]+)?)$ ]] || fail "DEVICE=$DEVICE: expected cuda, cuda:N or cpu"
for setting in STEPS RUN_TIMEOUT BATCH_BERT128 BATCH_BERT512 BATCH_GPT1024 BATCH_RESNET50; do
  [[ ${!setting} =~ ^[1-9][0-9]*$ ]] || fail "$setting=${!setting}: expected a positive integer"
done
[[ $WARMUP =~ ^[0-9]+$ ]] || fail "WARMUP=$WARMUP: expected a non-negative integer"
[ -z "$TEXT_DATA" ] || [ -f "$TEXT_DATA" ] || fail "TEXT_DATA=$TEXT_DATA: no such file"

# Python and torch must not see the carried MPI/HDF5 libraries that .devdeps/env.sh puts first on
# LD_LIBRARY_PATH: run Python with the library path from before env.sh.
if [ -n "${DEVDEPS_ORIG_LD_LIBRARY_PATH+x}" ]; then python_ld=$DEVDEPS_ORIG_LD_LIBRARY_PATH; else python_ld=${LD_LIBRARY_PATH:-}; fi
py() { env LD_LIBRARY_PATH="$python_ld" "$PYTHON" "$@"; }

if [ -z "${PYTHON:-}" ]; then
  for candidate in /opt/torch/.venv/bin/python python3 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      env LD_LIBRARY_PATH="$python_ld" "$candidate" -c "import torch" >/dev/null 2>&1; then
      PYTHON=$candidate
      break
    fi
  done
  PYTHON=${PYTHON:-python3}  # no torch anywhere: the PyTorch runs fail and say so, ours still run
fi
if [ -z "${PARTRAIN:-}" ]; then
  if [ "$SMOKE" = 1 ]; then
    PARTRAIN=build/cpu/bin/partrain
  elif [ -x build/cuda/bin/partrain ]; then
    PARTRAIN=build/cuda/bin/partrain
  else
    PARTRAIN=$(command -v partrain || echo build/cuda/bin/partrain)
  fi
fi
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  fail "PYTHON=$PYTHON not found"
fi

mkdir -p "$RESULTS_DIR" || exit 2
results="$RESULTS_DIR/results.jsonl"
if [ "${APPEND:-0}" != 1 ]; then  # a fresh run: drop the records and logs of earlier runs (only ours)
  rm -rf "$RESULTS_DIR"/results.md "$RESULTS_DIR"/{bert128,bert512,gpt1024,resnet50}-{fp32,bf16}
  : >"$results"
fi
helper=$(mktemp "${TMPDIR:-/tmp}/gpu_benchmark_helper.XXXXXX.py") || exit 2
trap 'rm -f "$helper"' EXIT

# ---- the helper: reads metrics and outputs, appends records, writes the tables ----
cat >"$helper" <<'PY'
import datetime, json, os, re, statistics, sys

def arguments():
    return dict(item.split("=", 1) for item in sys.argv[2:])

def error_line(path, rc, timeout):
    if rc in (124, 137):
        return f"timed out after {timeout} s (RUN_TIMEOUT)"
    lines = []
    if os.path.exists(path):
        with open(path, errors="replace") as handle:
            lines = [line.strip() for line in handle if line.strip()]
    for line in reversed(lines):
        if re.search(r"error|exception|not found|no such|killed|abort", line, re.IGNORECASE):
            return line[:300]
    return (lines[-1][:300] if lines else "no output") + f" (exit code {rc})"

def append(results, record):
    record["time"] = datetime.datetime.now().isoformat(timespec="seconds")
    with open(results, "a") as handle:
        handle.write(json.dumps(record) + "\n")

IMAGE_CASES = ("resnet50",)  # throughput in images/s; the others in tokens/s

def common(a):
    counts = json.loads(a["counts"]) if a.get("counts") else {}
    images = a["case"] in IMAGE_CASES
    # flops_per_unit: FLOPs per token, or per image for the image cases
    return dict(case=a["case"], precision=a["precision"], batch=int(a["batch"]), seq=int(a["seq"]),
                unit="images" if images else "tokens",
                flops_per_unit=counts.get("flops_per_image" if images else "flops_per_token"),
                flop_parameters=counts.get("flop_parameters"))

def ours(a):
    record = dict(common(a), impl="ours")
    rc, warmup = int(a["rc"]), int(a["warmup"])
    steps = []
    metrics = os.path.join(a["logdir"], "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics) as handle:
            steps = [json.loads(line) for line in handle if line.strip()]
    timed = [s for s in steps if s["step"] > warmup]
    log_text = open(a["log"], errors="replace").read() if os.path.exists(a["log"]) else ""
    match = re.search(r"\((?:bert|gpt|resnet), (\d+) parameters\)", log_text)
    if match:
        record["parameters"] = int(match.group(1))
    if rc != 0 or not timed:
        record["error"] = error_line(a["log"], rc, a["timeout"]) if rc != 0 else \
            f"no step after the {warmup} warm-up steps in {metrics}"
    else:
        seconds = statistics.median(s["seconds"] for s in timed)
        # seq is 1 for the image cases: the units are then images
        record.update(step_seconds=seconds, per_second=record["batch"] * record["seq"] / seconds,
                      steps=len(timed), first_step_seconds=steps[0]["seconds"],
                      first_loss=steps[0]["loss"], last_loss=steps[-1]["loss"],
                      peak_memory_bytes=max(s.get("peak_memory_bytes", 0) for s in steps),
                      own_tflops=statistics.median(s["tflops"] for s in timed))
    append(a["results"], record)
    return record

def torch_run(a):
    record = dict(common(a), impl=a["mode"])
    rc = int(a["rc"])
    result = None
    if os.path.exists(a["out"]):
        for line in reversed(open(a["out"], errors="replace").read().splitlines()):
            if line.startswith("{"):
                try:
                    result = json.loads(line)
                    break
                except ValueError:
                    pass
    rate_key = "samples_per_second" if record["unit"] == "images" else "tokens_per_second"
    if rc != 0 or result is None or not result.get(rate_key):
        record["error"] = error_line(a["err"], rc, a["timeout"])
    else:
        record["per_second"] = result[rate_key]
        for key in ("step_seconds", "first_step_seconds", "first_loss", "last_loss",
                    "peak_memory_bytes", "parameters", "device_name", "torch"):
            record[key] = result.get(key)
        record["steps"] = result.get("steps")
    append(a["results"], record)
    return record

def say(record):
    head = f"[{record['case']} {record['precision']}] {record['impl']}:"
    if "error" in record:
        print(f"{head} FAILED: {record['error']}", flush=True)
    else:
        print(f"{head} {record['per_second']:,.0f} {record['unit']}/s ({record['step_seconds']:.4f} s/step, median of "
              f"{record['steps']}; first step {record['first_step_seconds']:.2f} s; loss "
              f"{record['first_loss']:.3f} -> {record['last_loss']:.3f})", flush=True)

def table(a):
    peak_bf16, peak_fp32 = float(a["peak_bf16"]), float(a["peak_fp32"])
    latest = {}
    with open(a["results"]) as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                latest[(record["case"], record["precision"], record["impl"])] = record
    order_cases = a["cases"].split()
    cases = []
    for case, precision, _ in latest:
        if (case, precision) not in cases:
            cases.append((case, precision))
    rank = {"fp32": 0, "bf16": 1}
    cases.sort(key=lambda c: (order_cases.index(c[0]) if c[0] in order_cases else 99, rank.get(c[1], 9)))
    names = {"bert128": "bert-base seq 128", "bert512": "bert-base seq 512", "gpt1024": "gpt2 124M seq 1024",
             "resnet50": "resnet50 224x224x3"}

    def tps(record):
        return record.get("per_second") if record and "error" not in record else None

    def mfu(record, peak):
        value = tps(record)
        if value is None or not record.get("flops_per_unit"):
            return "-"
        share = 100 * value * record["flops_per_unit"] / peak
        return f"{share:.1f}%" if share >= 1 else f"{share:.2g}%"

    def number(value):
        return "-" if value is None else f"{value:,.0f}"

    def ratio(a_value, b_value):
        return "-" if a_value is None or b_value is None else f"{a_value / b_value:.2f}"

    out = []
    device = next((r.get("device_name") for r in latest.values() if r.get("device_name")), None)
    version = next((r.get("torch") for r in latest.values() if r.get("torch")), None)
    out.append(f"Device: {device or a.get('device', '?')}; torch {version or '?'}; partrain: {a['partrain']}; "
               f"{a['steps']} timed steps after {a['warmup']} warm-up steps (medians).")
    out.append("")
    out.append("MFU = (6 N + 12 L d S) x tokens/s / peak, or 3 x forward FLOPs per image x images/s / peak; "
               "peak 989 TFLOP/s (H100 bf16 dense) for every row; fp32 rows also vs 67 TFLOP/s (H100 fp32, "
               "no tensor cores).")
    out.append("")
    out.append("| case | precision | batch | unit | ours | torch eager | torch compile | "
               "ours/eager | ours/compile | MFU ours | MFU eager | MFU compile | MFU ours vs fp32 peak 67T |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case, precision in cases:
        o, e, c = (latest.get((case, precision, impl)) for impl in ("ours", "eager", "compile"))
        any_record = o or e or c
        out.append(f"| {names.get(case, case)} | {precision} | {any_record['batch']} | {any_record['unit']}/s | "
                   f"{number(tps(o))} | "
                   f"{number(tps(e))} | {number(tps(c))} | {ratio(tps(o), tps(e))} | {ratio(tps(o), tps(c))} | "
                   f"{mfu(o, peak_bf16)} | {mfu(e, peak_bf16)} | {mfu(c, peak_bf16)} | "
                   f"{mfu(o, peak_fp32) if precision == 'fp32' else '-'} |")
    out.append("")
    out.append("Details (step s: median; first step includes cuBLAS/allocator warm-up, and compilation for compile):")
    out.append("")
    out.append("| case | precision | impl | step s | first step s | peak memory GiB | loss first -> last | "
               "parameters | note |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for case, precision in cases:
        for impl in ("ours", "eager", "compile"):
            r = latest.get((case, precision, impl))
            if r is None:
                continue
            if "error" in r:
                note = "FAILED: " + r["error"].replace("|", "/")
                out.append(f"| {names.get(case, case)} | {precision} | {impl} | - | - | - | - | "
                           f"{r.get('parameters', '-')} | {note} |")
                continue
            memory = f"{r['peak_memory_bytes'] / 2**30:.2f}" if r.get("peak_memory_bytes") else "-"
            note = f"partrain's own graph count: {r['own_tflops']:.1f} TFLOP/s" if impl == "ours" else ""
            out.append(f"| {names.get(case, case)} | {precision} | {impl} | {r['step_seconds']:.4f} | "
                       f"{r['first_step_seconds']:.2f} | {memory} | {r['first_loss']:.3f} -> {r['last_loss']:.3f} | "
                       f"{r.get('parameters', '-')} | {note} |")
    text = "\n".join(out) + "\n"
    with open(a["md"], "w") as handle:
        handle.write("# GPU training benchmark: partrain vs PyTorch\n\n")
        handle.write(text)
    if a.get("print") == "1":
        print(text, flush=True)

command = sys.argv[1]
a = arguments()
if command == "ours":
    say(ours(a))
elif command == "torch":
    say(torch_run(a))
elif command == "table":
    table(a)
PY

copy_results() {
  [ -n "$COPY_TO" ] || return 0
  mkdir -p "$COPY_TO/gpu-benchmark" &&
    cp -r "$RESULTS_DIR"/. "$COPY_TO/gpu-benchmark/" 2>/dev/null || true
}
write_table() {  # $1: 1 to print it
  py "$helper" table results="$results" md="$RESULTS_DIR/results.md" cases="$CASES" \
    peak_bf16="$PEAK_BF16" peak_fp32="$PEAK_FP32" steps="$STEPS" warmup="$WARMUP" partrain="$PARTRAIN" \
    device="$DEVICE" print="${1:-0}"
  copy_results
}

echo "gpu_training_benchmark: partrain $PARTRAIN${PARTRAIN_LAUNCHER:+ (launched with $PARTRAIN_LAUNCHER)}, python $PYTHON, device $DEVICE"
echo "  cases: $CASES; precisions: $PRECISIONS; torch modes: $MODES; $STEPS timed + $WARMUP warm-up steps; results in $RESULTS_DIR${COPY_TO:+ (copied to $COPY_TO/gpu-benchmark)}"
if [ "$DEVICE" != cpu ] && command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; fi

failures=0
started=$SECONDS
text_sets=("${arch_sets[@]+"${arch_sets[@]}"}")
[ -z "$TEXT_DATA" ] || text_sets+=(data.path="$TEXT_DATA")
for case in $CASES; do
  # case_sets: partrain --set overrides of the case; case_args: pytorch_reference.py's shape arguments
  case $case in
    bert128) config=configs/bert-base.toml model=bert seq=$seq_bert128 batch=$BATCH_BERT128 ;;
    bert512) config=configs/bert-base.toml model=bert seq=$seq_bert512 batch=$BATCH_BERT512 ;;
    gpt1024) config=configs/gpt2.toml model=gpt2 seq=$seq_gpt1024 batch=$BATCH_GPT1024 ;;
    resnet50) config=configs/resnet50.toml model=resnet seq=1 batch=$BATCH_RESNET50 ;;
    *) echo "gpu_training_benchmark: unknown case '$case' (bert128, bert512, gpt1024, resnet50)" >&2; failures=$((failures + 1)); continue ;;
  esac
  if [ "$model" = resnet ]; then
    case_sets=(model.image_size="$image_resnet50" data.synthetic=true train.optimizer=sgd)
    case_args=(--depth 50 --image-size "$image_resnet50" --channels 3 --classes 1000)
  else
    case_sets=(model.seq_len="$seq" "${text_sets[@]+"${text_sets[@]}"}")
    case_args=(--seq "$seq" "${arch_args[@]+"${arch_args[@]}"}")
  fi
  counts=$(py "$here/pytorch_reference.py" --model "$model" "${case_args[@]}" --count-only 2>&1 | tail -n 1)
  case $counts in "{"*) ;; *) echo "[$case] cannot count FLOPs: $counts" >&2; counts= ;; esac
  for precision in $PRECISIONS; do
    dir="$RESULTS_DIR/$case-$precision"
    rm -rf "$dir" && mkdir -p "$dir"
    common=(case="$case" precision="$precision" batch="$batch" seq="$seq" counts="$counts" results="$results" timeout="$RUN_TIMEOUT")

    # ---- ours ----
    sets=("${case_sets[@]}" train.global_batch="$batch" train.microbatches=1 train.steps=$((STEPS + WARMUP))
      train.precision="$precision" train.device="$DEVICE" train.eval_every=0 parallel.planner=uniform parallel.stages=1
      parallel.device_memory=80GiB profile.enabled=false checkpoint.every=0 log.every=5 log.dir="$dir/ours"
      "${partrain_extra[@]+"${partrain_extra[@]}"}")
    set_args=()
    for s in "${sets[@]}"; do set_args+=(--set "$s"); done
    read -r -a launcher <<<"$PARTRAIN_LAUNCHER"
    echo "[$case $precision] ours: $PARTRAIN train $config (batch $batch$([ "$model" = resnet ] || echo ", seq $seq")) ..."
    timeout --kill-after=10 "$RUN_TIMEOUT" "${launcher[@]+"${launcher[@]}"}" "$PARTRAIN" train "$config" \
      "${set_args[@]}" >"$dir/ours.log" 2>&1
    rc=$?
    py "$helper" ours "${common[@]}" warmup="$WARMUP" logdir="$dir/ours" log="$dir/ours.log" rc="$rc" || rc=1
    [ "$rc" = 0 ] || failures=$((failures + 1))
    write_table

    # ---- PyTorch ----
    for mode in $MODES; do
      echo "[$case $precision] torch $mode ..."
      extra=("${torch_extra[@]+"${torch_extra[@]}"}")
      [ "$model" != resnet ] || extra+=("${torch_resnet_extra[@]+"${torch_resnet_extra[@]}"}")
      timeout --kill-after=10 "$RUN_TIMEOUT" env LD_LIBRARY_PATH="$python_ld" "$PYTHON" "$here/pytorch_reference.py" \
        --model "$model" "${case_args[@]}" --batch "$batch" --precision "$precision" --mode "$mode" --steps "$STEPS" \
        --warmup "$WARMUP" --device "$DEVICE" "${extra[@]+"${extra[@]}"}" >"$dir/torch-$mode.json" 2>"$dir/torch-$mode.log"
      rc=$?
      py "$helper" torch "${common[@]}" mode="$mode" out="$dir/torch-$mode.json" err="$dir/torch-$mode.log" rc="$rc" || rc=1
      [ "$rc" = 0 ] || failures=$((failures + 1))
      write_table
    done
  done
done

echo
echo "==== results ($((SECONDS - started)) s; $RESULTS_DIR/results.md) ===="
write_table 1
if [ "$failures" -gt 0 ]; then
  echo "gpu_training_benchmark: $failures run(s) failed; see the FAILED rows and the logs in $RESULTS_DIR/<case>-<precision>/"
  exit 1
fi
exit 0
