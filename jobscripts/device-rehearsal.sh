#!/usr/bin/env bash
# Rehearses the GPU device command here, without a GPU (issue 23 item 2): jobscripts/device-checks.sh
# runs in a bare Debian 12 root (debootstrap minbase + python3: no MPI, HDF5, OpenBLAS, toml++, CUDA,
# xz) under `env -i`, with the working tree, .devdeps/ and .devdata/ as a device `run` carries them and
# CUDA's libraries only in a pip-like /opt/torch/.venv/.../nvidia/*/lib, as on the GPU machine. Every
# check must get as far as "no CUDA device": a loader, MPI or path error fails the rehearsal.
#
#   sudo jobscripts/device-rehearsal.sh          (after jobscripts/device-pack.sh)
# Needs root (chroot, mount) and debootstrap (installed here when missing; the first run downloads
# Debian's minbase, about 60 MB, into $PRISTINE). Env: BARE (/tmp/partrain-rehearsal), PRISTINE
# (/tmp/partrain-rehearsal.pristine), CUDA_LIB (/usr/local/cuda/lib), CHECKS (passed on).
# Output: the device command's files in $BARE/out (device-checks.log, device-checks.json), a verdict.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
BARE=${BARE:-/tmp/partrain-rehearsal}
PRISTINE=${PRISTINE:-/tmp/partrain-rehearsal.pristine}
CUDA_LIB=${CUDA_LIB:-/usr/local/cuda/lib}
[ "$(id -u)" = 0 ] || { echo "device-rehearsal.sh: needs root (chroot, mount)" >&2; exit 2; }
case $BARE in /tmp/?*) ;; *) echo "device-rehearsal.sh: BARE must be under /tmp" >&2; exit 2 ;; esac
for folder in .devdeps .devdata; do
  [ -d "$folder" ] || { echo "device-rehearsal.sh: no $folder/ (run jobscripts/device-pack.sh first)" >&2; exit 2; }
done
started=$SECONDS

unmount_all() {
  local mount
  for mount in dev/shm sys proc; do if mountpoint -q "$BARE/$mount"; then umount "$BARE/$mount"; fi; done
}
trap unmount_all EXIT
unmount_all
if [ ! -x "$PRISTINE/usr/bin/python3" ]; then
  command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  rm -rf --one-file-system "$PRISTINE"
  debootstrap --variant=minbase --include=python3 bookworm "$PRISTINE" http://deb.debian.org/debian >/dev/null
fi
rm -rf --one-file-system "$BARE"
cp -a "$PRISTINE" "$BARE"

# The GPU machine's pip CUDA 13 layout (nvidia/cu13/lib, nvidia/cudnn/lib, nvidia/nccl/lib).
nvidia=$BARE/opt/torch/.venv/lib/python3.12/site-packages/nvidia
mkdir -p "$nvidia/cu13/lib" "$nvidia/cudnn/lib" "$nvidia/nccl/lib"
put() { cp "$(readlink -f "$CUDA_LIB/$1")" "$2/$1"; }
for library in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do put "$library" "$nvidia/cu13/lib"; done
for library in "$CUDA_LIB"/libcudnn*.so.9; do put "${library##*/}" "$nvidia/cudnn/lib"; done
put libnccl.so.2 "$nvidia/nccl/lib"

# What a device `run` sends: tracked and untracked-not-ignored files, plus the carried folders.
mkdir -p "$BARE/work/repo" "$BARE/out"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$BARE/work/repo"
cp -a .devdeps .devdata "$BARE/work/repo/"
mount -t proc proc "$BARE/proc"
mount -t sysfs sysfs "$BARE/sys"
mount -t tmpfs shm "$BARE/dev/shm"
prepared=$SECONDS

echo "== device-checks.sh in the bare root (env -i, no GPU)"
set +e
chroot "$BARE" /usr/bin/env -i HOME=/root TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  OUT=/out CHECKS="${CHECKS:-versions ops nccl training resume pipeline profile benchmark}" \
  /bin/bash -c 'cd /work/repo && bash jobscripts/device-checks.sh' > /dev/null 2>&1
set -e
ran=$SECONDS
log=$BARE/out/device-checks.log
[ -f "$log" ] || { echo "device-rehearsal.sh: FAILED: no device-checks.log came out" >&2; exit 1; }
tar -xzf "$BARE/out/logs.tar.gz" -C "$BARE/out" 2>/dev/null || true

# Verdict: no loader, MPI or path error anywhere; every check failed for want of a GPU (or, for the
# PyTorch side of the benchmark, of torch, which the bare root lacks: its logs are not scanned, nor
# nvidia-smi's, which the bare root lacks too).
problems=$(grep -rhE --exclude='torch-*.log' --exclude=nvidia-smi.log "error while loading shared libraries|cannot open shared object|undefined symbol|version .GLIBC|mpirun: Error|ORTE_ERROR|No such file or directory|command not found|Permission denied|Traceback" \
  "$log" "$BARE/out/logs" 2>/dev/null | grep -v "nvidia-smi: command not found" | sort -u | head -20 || true)
python3 - "$BARE/out/device-checks.json" <<'PY' > "$BARE/out/verdict.txt"
import json, re, sys
checks = json.load(open(sys.argv[1]))["checks"]
wanting_gpu = re.compile(r"no GPU|no CUDA device|nvidia-smi|no nvidia|CUDA test skipped|NCCL tests skipped|skipped|"
                         r"torch|see benchmark.md")
for check in checks:
    ok = check["status"] == "pass" or wanting_gpu.search(check["detail"])
    print(f"{'ok  ' if ok else 'FAIL'} {check['check']}: {check['detail'][:160]!r}")
PY
cat "$BARE/out/verdict.txt"
echo "== times: preparing the root $((prepared - started)) s, device command $((ran - prepared)) s"
if [ -n "$problems" ] || grep -q '^FAIL' "$BARE/out/verdict.txt"; then
  echo "device-rehearsal.sh: FAILED"
  [ -z "$problems" ] || printf 'loader / MPI / path errors:\n%s\n' "$problems"
  exit 1
fi
echo "device-rehearsal.sh: every step got as far as the missing GPU, with no loader, MPI or path error"
