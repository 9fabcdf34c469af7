#!/usr/bin/env bash
# CPU training benchmark (issue 18, item 1; docs/validation.md §Benchmarks): partrain's single-rank
# training step on the CPU against PyTorch eager on the same machine, in the same run, with the same
# architecture, batch, optimizer (AdamW, or SGD with momentum for ResNet), dropout and thread count.
# A program, not a test: it asserts nothing.
#
# Cases (name: model, size, batch):
#   bert-s  BERT 2 layers, hidden 128, 2 heads, MLP 512, seq 64, batch 16, vocab 8000, with NSP
#   bert-m  BERT 4 layers, hidden 256, 4 heads, MLP 1024, seq 128, batch 16, vocab 8000, with NSP
#   gpt-s   GPT  2 layers, hidden 128, 4 heads, seq 64, batch 16, vocab 8000
#   gpt-m   GPT  4 layers, hidden 256, 4 heads, seq 128, batch 16, vocab 8000
#   resnet18, resnet34  torchvision's models on 1 x 28 x 28 images, 10 classes, batch 32, SGD
# each at every thread count of THREADS.
#   ours:  $PARTRAIN train configs/{bert,gpt,resnet}-tiny.toml with the case's --set overrides, one
#          rank, one stage (planner uniform), one microbatch, profiling, trace and checkpoints off,
#          OMP_NUM_THREADS = threads (OPENBLAS_NUM_THREADS=1); WARMUP + STEPS steps; the median of
#          metrics.jsonl's per-step "seconds" after the first WARMUP steps.
#   torch: validation/perf/pytorch_reference.py --device cpu --threads <threads> (its docstring says
#          what it builds), from a venv with the current PyPI `torch` and `torchvision` wheels that
#          this script creates on first use; plus, when DEBIAN_TORCH=1 and /usr/bin/python3 imports
#          torch (Debian's python3-torch), a second PyTorch column.
# Data parallel (DDP_CASES, at DDP_RANKS ranks of 1 thread each, the same global batch):
#   ours:  mpirun -np DDP_RANKS partrain train ... (one stage, DDP_RANKS replicas: the bucketed,
#          overlapped gradient all-reduce over MPI, [parallel] bucket_mb at its default 25)
#   torch: python -m torch.distributed.run --nproc_per_node DDP_RANKS pytorch_reference.py --ddp
#          (torch.nn.parallel.DistributedDataParallel on the gloo backend, its default 25 MiB buckets)
#   rows named "<case> x<ranks> ranks", threads column "1/rank".
# Printed (and written to $RESULTS_DIR/results.md): median seconds per step of each side and the
# ratio PyTorch / partrain (> 1: partrain is faster).
#
# Usage: validation/perf/cpu_training_benchmark.sh [--quick]
#   --quick: bert-s, gpt-s and resnet18 at 2 threads, STEPS 3, WARMUP 1 (a smoke run of the script).
# Environment (defaults in brackets):
#   PARTRAIN   partrain binary [build/cpu/bin/partrain]
#   VENV       the venv with the torch wheel [~/.cache/partrain-bench-venv]; PYTHON overrides it
#              (a Python that imports torch and torchvision; then no venv is made)
#   PIP_INDEX_URL is honoured by pip; when the plain install fails the script retries with
#              https://download.pytorch.org/whl/cpu
#   CASES [bert-s bert-m gpt-s gpt-m resnet18 resnet34]   THREADS [1 2]
#   DDP_CASES [bert-m gpt-m resnet18] (--quick: gpt-s; empty: none)   DDP_RANKS [2]
#   STEPS [10] timed steps   WARMUP [3] untimed steps before them
#   RUN_TIMEOUT [600] seconds for one run   RESULTS_DIR [runs/cpu-benchmark]
#   PARTRAIN_SETS extra --set overrides for partrain, space-separated
#   DEBIAN_TORCH=1 adds the Debian torch column when available [0]
#   BASELINE   a second partrain binary (e.g. one built before a change), measured in the same run
#              with the same settings: columns "baseline s/step" and "baseline/partrain" [none]
# Exit code: 0 when every run gave a figure, 1 when some failed, 2 on a bad setup.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../jobscripts/mpi-env.sh"

# Bad input (an argument, a setting, a missing file): one line "cpu_training_benchmark.sh: error: ..."
# and exit status 2 (as the validation scripts), before any venv is made or run started.
fail() { echo "cpu_training_benchmark.sh: error: $*" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root" || exit 2

quick=0
for argument in "$@"; do
  case $argument in
    --quick) quick=1 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) fail "unknown argument '$argument' (see --help)" ;;
  esac
done
if [ "$quick" = 1 ]; then
  CASES=${CASES:-bert-s gpt-s resnet18}
  THREADS=${THREADS:-2}
  STEPS=${STEPS:-3}
  WARMUP=${WARMUP:-1}
  DDP_CASES=${DDP_CASES-gpt-s}
else
  CASES=${CASES:-bert-s bert-m gpt-s gpt-m resnet18 resnet34}
  THREADS=${THREADS:-1 2}
  STEPS=${STEPS:-10}
  WARMUP=${WARMUP:-3}
  DDP_CASES=${DDP_CASES-bert-m gpt-m resnet18}
fi
DDP_RANKS=${DDP_RANKS:-2}
PARTRAIN=${PARTRAIN:-build/cpu/bin/partrain}
VENV=${VENV:-$HOME/.cache/partrain-bench-venv}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
RESULTS_DIR=${RESULTS_DIR:-runs/cpu-benchmark}
DEBIAN_TORCH=${DEBIAN_TORCH:-0}
BASELINE=${BASELINE:-}
read -r -a partrain_extra <<<"${PARTRAIN_SETS:-}"

for name in $CASES $DDP_CASES; do
  case $name in bert-s | bert-m | gpt-s | gpt-m | resnet18 | resnet34) ;; *) fail "unknown case '$name' in CASES or DDP_CASES (bert-s bert-m gpt-s gpt-m resnet18 resnet34)" ;; esac
done
for threads in $THREADS; do [[ $threads =~ ^[1-9][0-9]*$ ]] || fail "THREADS=$THREADS: expected positive integers"; done
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || fail "STEPS=$STEPS: expected a positive integer"
[[ $WARMUP =~ ^[0-9]+$ ]] || fail "WARMUP=$WARMUP: expected a non-negative integer"
[[ $DDP_RANKS =~ ^[1-9][0-9]*$ ]] || fail "DDP_RANKS=$DDP_RANKS: expected a positive integer"
[[ $RUN_TIMEOUT =~ ^[1-9][0-9]*$ ]] || fail "RUN_TIMEOUT=$RUN_TIMEOUT: expected positive seconds"
[ -x "$PARTRAIN" ] && [ -f "$PARTRAIN" ] || fail "PARTRAIN=$PARTRAIN not found: build it (cmake --build --preset cpu)"
if [ -n "$BASELINE" ] && ! { [ -x "$BASELINE" ] && [ -f "$BASELINE" ]; }; then fail "BASELINE=$BASELINE is not an executable"; fi
for data in data/prepared/text.h5 data/prepared/fashion_mnist.h5; do
  [ -f "$data" ] || fail "$data missing: run data/prepare.sh"
done

# ---- the PyTorch side: a venv with the current CPU wheels (made once, reused) ----
if [ -z "${PYTHON:-}" ]; then
  PYTHON=$VENV/bin/python
  if ! "$PYTHON" -c "import torch, torchvision" >/dev/null 2>&1; then
    echo "cpu_training_benchmark: installing torch and torchvision into $VENV (once) ..."
    { [ -x "$PYTHON" ] || python3 -m venv "$VENV"; } || exit 2
    if ! "$PYTHON" -m pip install -q torch torchvision; then
      echo "cpu_training_benchmark: plain PyPI failed; trying the PyTorch CPU index" >&2
      "$PYTHON" -m pip install -q --index-url https://download.pytorch.org/whl/cpu torch torchvision || exit 2
    fi
  fi
fi
"$PYTHON" -c "import torch, torchvision" 2>/dev/null || { echo "cpu_training_benchmark: $PYTHON cannot import torch and torchvision" >&2; exit 2; }
torch_version=$("$PYTHON" -c "import torch; print(torch.__version__)")
debian_python=
if [ "$DEBIAN_TORCH" = 1 ] && /usr/bin/python3 -c "import torch" >/dev/null 2>&1; then
  debian_python=/usr/bin/python3
  debian_version=$($debian_python -c "import torch; print(torch.__version__)")
fi

# ---- the cases: partrain --set overrides and pytorch_reference.py arguments ----
case_settings() {  # sets config, sets (array) and torch_args (array) for case $1
  local text="model.vocab=8000 model.dropout=0.1"
  case $1 in
    bert-s) config=configs/bert-tiny.toml model=bert batch=16
      sets=(model.layers=2 model.hidden=128 model.heads=2 model.intermediate=512 model.seq_len=64 model.max_position=64 $text)
      torch_args=(--model bert --layers 2 --hidden 128 --heads 2 --intermediate 512 --seq 64 --max-position 64 --vocab 8000 --lr 2e-3) ;;
    bert-m) config=configs/bert-tiny.toml model=bert batch=16
      sets=(model.layers=4 model.hidden=256 model.heads=4 model.intermediate=1024 model.seq_len=128 model.max_position=128 $text)
      torch_args=(--model bert --layers 4 --hidden 256 --heads 4 --intermediate 1024 --seq 128 --max-position 128 --vocab 8000 --lr 2e-3) ;;
    gpt-s) config=configs/gpt-tiny.toml model=gpt batch=16
      sets=(model.layers=2 model.hidden=128 model.heads=4 model.seq_len=64 model.max_position=64 $text)
      torch_args=(--model gpt2 --layers 2 --hidden 128 --heads 4 --intermediate 0 --seq 64 --max-position 64 --vocab 8000 --lr 2e-3) ;;
    gpt-m) config=configs/gpt-tiny.toml model=gpt batch=16
      sets=(model.layers=4 model.hidden=256 model.heads=4 model.seq_len=128 model.max_position=128 $text)
      torch_args=(--model gpt2 --layers 4 --hidden 256 --heads 4 --intermediate 0 --seq 128 --max-position 128 --vocab 8000 --lr 2e-3) ;;
    resnet18 | resnet34) config=configs/resnet-tiny.toml model=resnet batch=32
      local depth=${1#resnet}
      sets=(model.depth="$depth" model.base_width=64 model.classes=10 model.image_size=28 model.channels=1)
      torch_args=(--model resnet --depth "$depth" --classes 10 --image-size 28 --channels 1 --lr 0.05) ;;
    *) return 1 ;;
  esac
}

mkdir -p "$RESULTS_DIR" || exit 2
results=$RESULTS_DIR/results.txt  # one line per run: case;threads;ours;torch;debian;baseline
: >"$results"
failures=0
started=$SECONDS

median_seconds() {  # median of metrics.jsonl "seconds" after the warm-up steps
  "$PYTHON" - "$1" "$WARMUP" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1] + "/metrics.jsonl") if line.strip()]
timed = [row["seconds"] for row in rows[int(sys.argv[2]):]]
print(f"{statistics.median(timed):.4f}" if timed else "")
PY
}

torch_seconds() {  # $1 python, $2 threads, $3 output prefix[, $4 ranks]: median step seconds of pytorch_reference.py
  local python=$1 threads=$2 prefix=$3 ranks=${4:-1}
  local launch=("$python")
  [ "$ranks" -gt 1 ] && launch=("$python" -m torch.distributed.run --standalone --nproc_per_node "$ranks")
  timeout --kill-after=10 "$RUN_TIMEOUT" env OMP_NUM_THREADS="$threads" "${launch[@]}" "$here/pytorch_reference.py" \
    "${torch_args[@]}" --batch "$batch" --device cpu --threads "$threads" --steps "$STEPS" --warmup "$WARMUP" \
    $([ "$ranks" -gt 1 ] && echo --ddp) >"$prefix.json" 2>"$prefix.log" || return 1
  "$PYTHON" -c "import json,sys; print('%.4f' % json.loads(open(sys.argv[1]).read().splitlines()[-1])['step_seconds'])" "$prefix.json"
}

partrain_seconds() {  # $1 binary, $2 log directory[, $3 ranks]: median step seconds (uses set_args, config, threads)
  local binary=$1 directory=$2 ranks=${3:-1}
  local launch=()
  [ "$ranks" -gt 1 ] && launch=(mpirun -np "$ranks" -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS)
  timeout --kill-after=10 "$RUN_TIMEOUT" env OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS=1 \
    "${launch[@]+"${launch[@]}"}" "$binary" train "$config" "${set_args[@]}" --set log.dir="$directory" >"$directory.log" 2>&1 || return 1
  local median
  median=$(median_seconds "$directory") && [ -n "$median" ] && echo "$median"
}

ratio() { "$PYTHON" -c "import sys; a, b = sys.argv[1:]; print('%.2f' % (float(a) / float(b)) if a and b else '')" "$1" "$2"; }

write_table() {
  local header rule line name threads ours torch debian baseline
  {
    echo "CPU training benchmark, $(date -u +%Y-%m-%dT%H:%MZ), $(env -u OMP_NUM_THREADS nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
    echo "partrain: $PARTRAIN; PyTorch $torch_version (PyPI wheel, eager)${debian_python:+; Debian torch $debian_version}; $STEPS timed steps after $WARMUP, median s/step"
    echo
    header="| case | threads | partrain s/step | PyTorch s/step | PyTorch/partrain |"
    rule="|---|---|---|---|---|"
    [ -n "$debian_python" ] && header="$header Debian torch s/step | Debian/partrain |" rule="$rule---|---|"
    [ -n "$BASELINE" ] && header="$header baseline s/step | baseline/partrain | PyTorch/baseline |" rule="$rule---|---|---|"
    echo "$header"
    echo "$rule"
    while IFS=';' read -r name threads ours torch debian baseline; do
      line="| $name | $threads | ${ours:-FAILED} | ${torch:-FAILED} | $(ratio "$torch" "$ours") |"
      [ -n "$debian_python" ] && line="$line ${debian:-FAILED} | $(ratio "$debian" "$ours") |"
      [ -n "$BASELINE" ] && line="$line ${baseline:-FAILED} | $(ratio "$baseline" "$ours") | $(ratio "$torch" "$baseline") |"
      echo "$line"
    done <"$results"
  } >"$RESULTS_DIR/results.md"
}

run_case() {  # $1 case, $2 threads (per rank), $3 ranks: one row of the table
  local name=$1 ranks=$3 row=$1 threads_label=$2 dir
  threads=$2
  [ "$ranks" -gt 1 ] && row="$name x$ranks ranks" threads_label="$threads/rank"
  dir=$RESULTS_DIR/$name-t$threads-r$ranks
  rm -rf "$dir" && mkdir -p "$dir"
  set_args=()
  for s in "${sets[@]}" train.global_batch="$batch" train.microbatches=1 train.steps=$((STEPS + WARMUP)) \
    train.eval_every=0 parallel.planner=uniform parallel.stages=1 profile.enabled=false checkpoint.every=0 \
    log.trace= log.every=1000 "${partrain_extra[@]+"${partrain_extra[@]}"}"; do
    set_args+=(--set "$s")
  done
  echo "[$row, $threads_label threads] partrain ..."
  ours=$(partrain_seconds "$PARTRAIN" "$dir/ours" "$ranks") || { ours=; failures=$((failures + 1)); echo "  FAILED: see $dir/ours.log"; }
  baseline=
  if [ -n "$BASELINE" ]; then
    echo "[$row, $threads_label threads] baseline $BASELINE ..."
    baseline=$(partrain_seconds "$BASELINE" "$dir/baseline" "$ranks") || { baseline=; failures=$((failures + 1)); echo "  FAILED: see $dir/baseline.log"; }
  fi
  echo "[$row, $threads_label threads] PyTorch $torch_version ..."
  torch=$(torch_seconds "$PYTHON" "$threads" "$dir/torch" "$ranks") || { torch=; failures=$((failures + 1)); echo "  FAILED: see $dir/torch.log"; }
  debian=
  if [ -n "$debian_python" ]; then
    echo "[$row, $threads_label threads] Debian torch $debian_version ..."
    debian=$(torch_seconds "$debian_python" "$threads" "$dir/debian" "$ranks") || { debian=; failures=$((failures + 1)); echo "  FAILED: see $dir/debian.log"; }
  fi
  echo "  partrain ${ours:-FAILED} s/step, PyTorch ${torch:-FAILED} s/step, PyTorch/partrain $(ratio "$torch" "$ours")"
  printf '%s;%s;%s;%s;%s;%s\n' "$row" "$threads_label" "$ours" "$torch" "$debian" "$baseline" >>"$results"
  write_table
}

for name in $CASES; do
  case_settings "$name" || { echo "cpu_training_benchmark: unknown case '$name'" >&2; exit 2; }
  for threads in $THREADS; do run_case "$name" "$threads" 1; done
done
# Data parallel: DDP_RANKS ranks of one thread each (the machine's cores), the same global batch.
for name in $DDP_CASES; do
  case_settings "$name" || { echo "cpu_training_benchmark: unknown case '$name'" >&2; exit 2; }
  run_case "$name" 1 "$DDP_RANKS"
done

echo
echo "==== results ($((SECONDS - started)) s; $RESULTS_DIR/results.md) ===="
cat "$RESULTS_DIR/results.md"
[ "$failures" = 0 ] || { echo "cpu_training_benchmark: $failures run(s) failed" >&2; exit 1; }
exit 0
