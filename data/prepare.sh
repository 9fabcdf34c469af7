#!/usr/bin/env bash
# Prepares partrain's training data as HDF5 (see data/README.md).
#   data/prepare.sh [OUTPUT_DIR] [--vocab-size N] [--images N] [--documents N]
#   data/prepare.sh [OUTPUT_DIR] --tokenizer PATH [--documents N]
# Installs (apt-get, idempotent; sudo when not root) the Debian packages holding the data and tools,
# then writes OUTPUT_DIR/text.h5 (+ text.model, text.vocab) and OUTPUT_DIR/fashion_mnist.h5.
# Default OUTPUT_DIR: data/prepared/ beside this script.
# --tokenizer PATH: tokenise with a published model's Hugging Face tokenizer instead of training
# SentencePiece (a tokenizer.json, or a model directory as save_pretrained writes it; WordPiece,
# byte-level BPE); writes only OUTPUT_DIR/text.h5 (+ text.tokenizer.json), in the data venv
# (data/make_venv.sh). Default OUTPUT_DIR then: data/prepared/hf-NAME/, NAME the model directory's.
# --images N, --documents N: only the first N training images / text documents (the tokenizer still
# learns from all of them): small files to carry to a GPU machine.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
output_dir=""
vocab_size=8000
image_args=()
text_args=()
tokenizer=""
while [ $# -gt 0 ]; do
  case "$1" in
    --vocab-size) vocab_size="$2"; shift 2 ;;
    --vocab-size=*) vocab_size="${1#*=}"; shift ;;
    --images) image_args=(--images "$2"); shift 2 ;;        # a small subset (e.g. to carry to a GPU)
    --documents) text_args=(--documents "$2"); shift 2 ;;   # the same for the text
    --tokenizer) tokenizer="$2"; shift 2 ;;
    --tokenizer=*) tokenizer="${1#*=}"; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "prepare.sh: unknown option $1" >&2; exit 2 ;;
    *) output_dir="$1"; shift ;;
  esac
done
if [ -n "$tokenizer" ]; then
  [ -e "$tokenizer" ] || { echo "prepare.sh: --tokenizer $tokenizer: no such file or directory" >&2; exit 2; }
  if [ -z "$output_dir" ]; then
    name_of="$tokenizer"
    [ -d "$name_of" ] || name_of="$(dirname "$name_of")"
    output_dir="$script_dir/prepared/hf-$(basename "$(cd "$name_of" && pwd)")"
  fi
fi
output_dir="${output_dir:-$script_dir/prepared}"

packages=(
  wordnet-base dataset-fashion-mnist                      # the data
  sentencepiece                                           # spm_train
  python3 python3-h5py python3-numpy python3-sentencepiece  # the system interpreter's modules
  python3-venv                                            # the data venv (--tokenizer)
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

mkdir -p "$output_dir"
start=$(date +%s)
if [ -n "$tokenizer" ]; then
  # The data venv: the system interpreter's Debian modules plus PyPI's tokenizers (idempotent).
  python="$("$script_dir/make_venv.sh" | tail -1)"
  "$python" "$script_dir/prepare_text.py" "$output_dir" --tokenizer "$tokenizer" "${text_args[@]+"${text_args[@]}"}"
  "$python" "$script_dir/prepare_pos.py" "$output_dir"
else
  # The system interpreter, not a pyenv/venv python that lacks the Debian modules.
  python=/usr/bin/python3
  "$python" "$script_dir/prepare_images.py" "$output_dir" "${image_args[@]+"${image_args[@]}"}"
  "$python" "$script_dir/prepare_text.py" "$output_dir" --vocab-size "$vocab_size" "${text_args[@]+"${text_args[@]}"}"
  "$python" "$script_dir/prepare_pos.py" "$output_dir"
fi
echo "prepare.sh: done in $(( $(date +%s) - start )) s:"
ls -l "$output_dir"
