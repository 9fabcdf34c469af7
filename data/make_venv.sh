#!/usr/bin/env bash
# Makes the data venv data/.venv (git-ignored) for data/prepare.sh --tokenizer: the system
# interpreter /usr/bin/python3 with its Debian modules (--system-site-packages: h5py, numpy,
# sentencepiece) plus data/requirements.txt from PyPI. Idempotent: returns at once when the venv
# already imports everything. Prints the venv's python on its last line.
#   data/make_venv.sh [VENV_DIR]
set -euo pipefail
script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${1:-$script_dir/.venv}"
python="$venv/bin/python"
probe="import h5py, numpy, tokenizers"
if [ -x "$python" ] && "$python" -c "$probe" 2>/dev/null; then
  echo "$python"
  exit 0
fi
if ! /usr/bin/python3 -c "import ensurepip, venv" 2>/dev/null; then
  echo "make_venv: installing python3-venv" >&2
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-venv >&2
fi
echo "make_venv: making $venv (system site packages + data/requirements.txt)" >&2
/usr/bin/python3 -m venv --system-site-packages "$venv" >&2
"$python" -m pip install -q -r "$script_dir/requirements.txt" >&2
"$python" -c "$probe"
echo "$python"
