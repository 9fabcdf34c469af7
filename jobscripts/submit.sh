#!/usr/bin/env bash
# Submits a training job with the resources its plan needs: the world size comes from --plan FILE
# (its "world_size"), else from --set parallel.world_size=N, else from the experiment file's
# [parallel] world_size; [parallel] devices_per_node decides single node or multi node.
#   jobscripts/submit.sh configs/bert-large.toml --plan runs/plan-64.json [--set ...] [-- sbatch options]
# Prints the sbatch command and the job id. PRESET, PARTRAIN_BINARY and SLURM_MPI_TYPE pass through.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 CONFIG.toml [--plan FILE] [--set section.key=value ...] [-- sbatch options]" >&2; exit 2; }
config=$1; shift
[ -f "$config" ] || { echo "$0: $config: no such experiment file" >&2; exit 2; }
train_args=() sbatch_args=() plan=""
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; sbatch_args=("$@"); break ;;
    --plan) plan=$2; train_args+=("$1" "$2"); shift 2 ;;
    *) train_args+=("$1"); shift ;;
  esac
done

# world size and devices per node: plan file > --set > config file
read -r world per_node < <(/usr/bin/python3 - "$config" "$plan" "${train_args[@]}" <<'PY'
import json, sys, tomllib
config, plan, args = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(config, "rb") as f:
    parallel = tomllib.load(f).get("parallel", {})
world, per_node = parallel.get("world_size", 0), parallel.get("devices_per_node", 8)
for i, a in enumerate(args):
    if a == "--set" and i + 1 < len(args):
        key, _, value = args[i + 1].partition("=")
        if key == "parallel.world_size": world = int(value)
        if key == "parallel.devices_per_node": per_node = int(value)
if plan:
    world = json.load(open(plan))["world_size"]
if world <= 0:
    sys.exit(f"submit: {config}: no world size: give --plan FILE, --set parallel.world_size=N or [parallel] world_size")
print(world, per_node)
PY
)
if [ "$world" -le "$per_node" ]; then
  command=(sbatch --parsable --ntasks="$world" "${sbatch_args[@]}" "$root/jobscripts/slurm-single-node.sbatch" "$config" "${train_args[@]}")
else
  nodes=$(( (world + per_node - 1) / per_node ))
  [ $(( world % nodes )) -eq 0 ] || { echo "submit: $world ranks do not spread evenly over $nodes nodes of $per_node" >&2; exit 2; }
  command=(sbatch --parsable --nodes="$nodes" --ntasks-per-node=$(( world / nodes )) "${sbatch_args[@]}"
           "$root/jobscripts/slurm-multi-node.sbatch" "$config" "${train_args[@]}")
fi
echo "submit: ${command[*]}"
"${command[@]}"
