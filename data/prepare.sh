#!/usr/bin/env bash
# Prepares partrain's training data as HDF5 (see data/README.md).
#   data/prepare.sh [OUTPUT_DIR] [--vocab-size N] [--images N]
# Installs (apt-get, idempotent; sudo when not root) the Debian packages holding the data and tools,
# then writes OUTPUT_DIR/text.h5 (+ text.model, text.vocab) and OUTPUT_DIR/fashion_mnist.h5.
# Default OUTPUT_DIR: data/prepared/ beside this script.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
output_dir="$script_dir/prepared"
vocab_size=8000
image_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --vocab-size) vocab_size="$2"; shift 2 ;;
    --vocab-size=*) vocab_size="${1#*=}"; shift ;;
    --images) image_args=(--images "$2"); shift 2 ;;        # a small subset (e.g. to carry to a GPU)
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    -*) echo "prepare.sh: unknown option $1" >&2; exit 2 ;;
    *) output_dir="$1"; shift ;;
  esac
done

packages=(
  wordnet-base dataset-fashion-mnist                      # the data
  sentencepiece                                           # spm_train
  python3 python3-h5py python3-numpy python3-sentencepiece  # the system interpreter's modules
)
missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$package")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "prepare.sh: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The system interpreter, not a pyenv/venv python that lacks the Debian modules.
python=/usr/bin/python3
mkdir -p "$output_dir"
start=$(date +%s)
"$python" "$script_dir/prepare_images.py" "$output_dir" "${image_args[@]+"${image_args[@]}"}"
"$python" "$script_dir/prepare_text.py" "$output_dir" --vocab-size "$vocab_size"
echo "prepare.sh: done in $(( $(date +%s) - start )) s:"
ls -l "$output_dir"
