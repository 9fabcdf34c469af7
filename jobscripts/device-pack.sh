#!/usr/bin/env bash
# Prepares everything the GPU device command (jobscripts/device-checks.sh) needs, here on the build
# machine (issue 23 item 1): builds the cuda preset's partrain, test_cuda (every cuda-labelled test in
# one binary) and test_gpu_communicators; packs them with their MPI/HDF5/runtime libraries
# (../shared/device/pack.sh -> .devdeps/); prepares a small data set (data/prepare.sh --images) and the
# CPU reference losses of the training checks (-> .devdata/); prints the size of what will travel.
#
#   jobscripts/device-pack.sh [--skip-build] [--skip-references]
# Then, on the GPU machine (a device `run` with carry [".devdeps", ".devdata"]):
#   bash jobscripts/device-checks.sh
# Environment: DEVICE_SHARED (the shared/device folder; default ../shared/device or shared/device),
#   IMAGES (training images kept, 1000: the ResNet checks read 16 a step), DOCUMENTS (text documents
#   kept, 3000: 0.42 M tokens, 4x what the largest benchmark case reads), PACK_FAST=1 (pack.sh --fast: quicker, larger).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=1 references=1
for argument in "$@"; do
  case $argument in
    --skip-build) build=0 ;;
    --skip-references) references=0 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "device-pack.sh: unknown option $argument" >&2; exit 2 ;;
  esac
done
shared=${DEVICE_SHARED:-}
for candidate in ../shared/device shared/device; do
  [ -z "$shared" ] && [ -f "$candidate/pack.sh" ] && shared=$candidate
done
[ -n "$shared" ] || { echo "device-pack.sh: no shared/device/pack.sh (set DEVICE_SHARED)" >&2; exit 2; }
started=$SECONDS
bin=build/cuda/bin

if [ "$build" = 1 ]; then
  echo "== building the cuda preset (partrain and the CUDA test binaries)"
  source jobscripts/mpi-env.sh
  cmake --preset cuda >/dev/null
  cmake --build build/cuda -j"$(nproc)" --target partrain test_cuda test_gpu_communicators
fi
for program in partrain test_cuda test_gpu_communicators; do
  [ -x "$bin/$program" ] || { echo "device-pack.sh: $bin/$program missing (build the cuda preset)" >&2; exit 2; }
done
built=$SECONDS

echo "== data: text.h5 (${DOCUMENTS:-3000} documents) and ${IMAGES:-1000} Fashion-MNIST training images -> .devdata/data"
mkdir -p .devdata
printf '/*\n' > .devdata/.gitignore   # never committed, like .devdeps/
# 3,000 of the 14,727 documents (0.42 M tokens, 4x what the benchmark's largest case reads):
# 0.8 MiB instead of 3.6.
bash data/prepare.sh .devdata/data --images "${IMAGES:-1000}" --documents "${DOCUMENTS:-3000}" >/dev/null
# Only what the checks read travels (the POS dataset and the tokenizer files are 3.8 MiB).
find .devdata/data -type f ! -name text.h5 ! -name fashion_mnist.h5 -delete
prepared=$SECONDS

if [ "$references" = 1 ]; then
  # The CPU reference losses of the training checks, by the binary that travels (its CPU backend),
  # so the GPU window does not spend minutes on CPU training.
  source jobscripts/device/training_cases.sh
  rm -rf .devdata/reference && mkdir -p .devdata/reference
  for model in $TRAINING_MODELS; do
    for precision in $TRAINING_PRECISIONS; do
      directory=.devdata/reference/$model-$precision
      mapfile -t arguments < <(training_arguments "$model" "$precision" cpu "$directory" .devdata/data)
      echo "== reference: $model-tiny $precision on the CPU ($TRAINING_STEPS steps)"
      if ! OMP_NUM_THREADS=$(nproc) "$bin/partrain" "${arguments[@]}" > "$directory.log" 2>&1; then
        tail -5 "$directory.log" >&2
        echo "device-pack.sh: the CPU reference run failed ($directory.log)" >&2
        exit 1
      fi
      # Keep the losses, drop the rest (traces, plans) to keep the carried folder small.
      find "$directory" -type f ! -name metrics.jsonl -delete
    done
  done
fi
referenced=$SECONDS

echo "== packing (pack.sh)"
grep -qx '/.devdeps/' .git/info/exclude 2>/dev/null || echo '/.devdeps/' >> .git/info/exclude
pack_options=()
[ "${PACK_FAST:-0}" = 1 ] && pack_options+=(--fast)
# Stripped copies travel (symbol tables are 1 MiB per binary; errors name files and kernels, not
# symbols); build/cuda/bin keeps the full ones.
stripped=build/cuda/device-bin
rm -rf "$stripped" && mkdir -p "$stripped"
for program in partrain test_cuda test_gpu_communicators; do strip -o "$stripped/$program" "$bin/$program"; done
bash "$shared/pack.sh" "${pack_options[@]+"${pack_options[@]}"}" "$stripped/partrain" "$stripped/test_cuda" \
  "$stripped/test_gpu_communicators" > .devdata/pack.log 2>&1 || { tail -20 .devdata/pack.log >&2; exit 1; }
packed=$SECONDS

mib() { du -sb "$@" | awk '{ total += $1 } END { printf "%.1f", total / 1048576 }'; }
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | awk '{ printf "%.1f", $1 / 1048576 }')
echo "== what travels: tree $tree MiB + .devdeps $(mib .devdeps) MiB + .devdata $(mib .devdata) MiB" \
     "= $(awk -v a="$tree" -v b="$(mib .devdeps)" -v c="$(mib .devdata)" 'BEGIN { printf "%.1f", a + b + c }') MiB (limit 48)"
echo "== times: build $((built - started)) s, data $((prepared - built)) s, references $((referenced - prepared)) s," \
     "pack $((packed - referenced)) s; total $((SECONDS - started)) s"
echo "device command: bash jobscripts/device-checks.sh   (carry .devdeps .devdata)"
