#!/usr/bin/env bash
# Installs every Debian package partrain needs to build and test. Idempotent: when all packages are
# already present it returns at once without touching apt.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  ccache                                # one compile of the library for the cpu and cuda presets (run-tests.sh)
  libopenmpi-dev openmpi-bin            # MPI runtime and compiler wrappers
  libhdf5-openmpi-dev hdf5-tools        # parallel HDF5 (checkpoints, datasets) and h5dump
  libtomlplusplus-dev                   # experiment files
  libopenblas-dev                       # CPU GEMM (BLAS calls outside the kernels' hot paths)
  libdnnl-dev                           # oneDNN: the CPU convolutions (optional in CMake: PARTRAIN_WITH_ONEDNN)
  libsentencepiece-dev sentencepiece    # tokeniser
  libgtest-dev libgmock-dev             # unit tests
  libcli11-dev nlohmann-json3-dev       # command line, JSON (plans, metrics, traces)
  coinor-libcbc-dev                     # MIP solver (CBC) for Tarnawski's integer programs (partition/tarnawski/integer_program)
  slurmctld slurmd slurm-client munge   # one-machine Slurm for the slurm CTest (jobscripts/slurm-local-cluster.sh);
                                        # srun's PMIx plugin comes with slurmd (slurm-wlm-basic-plugins)
  python3-matplotlib                    # validation/plot_run.py (loss, throughput, pipeline timeline)
  python3-venv                          # the data venv of data/prepare.sh --tokenizer (data/make_venv.sh)
  clang libclang-rt-14-dev libomp-dev   # libFuzzer targets (fuzz preset) with clang's OpenMP
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$package")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
