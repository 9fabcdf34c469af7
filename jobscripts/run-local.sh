#!/usr/bin/env bash
# The main job on one machine: installs the dependencies, builds partrain, prepares the data if it is
# missing, and trains with mpirun.
# Usage: jobscripts/run-local.sh CONFIG.toml [--set section.key=value ...] [other partrain train options]
# Environment: RANKS (default 4), PRESET (default cpu), JOBS (build jobs, default: cores).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 CONFIG.toml [--set section.key=value ...]" >&2; exit 2; }
config=$1; shift
[ -f "$config" ] || { echo "$0: $config: no such experiment file" >&2; exit 2; }
ranks=${RANKS:-4}
preset=${PRESET:-cpu}

config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")
cd "$root"
jobscripts/install-deps.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "${JOBS:-$(nproc)}" --target partrain
[ -f data/prepared/text.h5 ] && [ -f data/prepared/fashion_mnist.h5 ] || data/prepare.sh
source jobscripts/mpi-env.sh
echo "run-local: mpirun -np $ranks build/$preset/bin/partrain train $config $*"
exec mpirun -np "$ranks" --oversubscribe --allow-run-as-root "build/$preset/bin/partrain" train "$config" "$@"
