#!/usr/bin/env bash
# Tarnawski et al.'s integer programs on the published workloads (the inputs of their Table 1,
# ctest/data/dnn-partitioning), through `partrain plan --planner ip`: per workload the ideal DP's
# optimum, the contiguous program cold (no start) and warm (DP start), the paper's reachability
# form of it, the non-contiguous program (DP start), and for inference the latency program. Prints a
# Markdown table (value, proven bound, gap, status, solver seconds) next to Table 1's published values.
# A measurement, not a test: long (up to 5 runs x time limit per workload). validation/README.md
# records one run.
#   validation/perf/ip_table1.sh [--time-limit S] [--threads N] [--binary PATH] [--only REGEX]
set -euo pipefail

# Bad input: one line "ip_table1.sh: error: ..." and exit status 2 (as the validation scripts).
fail() { echo "ip_table1.sh: error: $*" >&2; exit 2; }
value_of() { [ $# -ge 2 ] || fail "$1 needs a value (see --help)"; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
binary=$root/build/cpu/bin/partrain
time_limit=600
threads=1
only=.
while [ $# -gt 0 ]; do
  case "$1" in
    --time-limit) value_of "$@"; time_limit=$2; shift 2 ;;
    --threads) value_of "$@"; threads=$2; shift 2 ;;
    --binary) value_of "$@"; binary=$2; shift 2 ;;
    --only) value_of "$@"; only=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) fail "unknown option $1 (see --help)" ;;
  esac
done
[[ $time_limit =~ ^[0-9]+([.][0-9]+)?$ ]] && [ "$time_limit" != 0 ] || fail "--time-limit $time_limit: expected positive seconds"
[[ $threads =~ ^[1-9][0-9]*$ ]] || fail "--threads $threads: expected a positive integer"
[ -x "$binary" ] && [ -f "$binary" ] || fail "--binary $binary: no partrain binary there (build it, or pass --binary)"
data=$root/ctest/data/dnn-partitioning/throughput-inputs

# file | published DP (contiguous) | published IP non-contiguous (Table 1, "TPS" columns)
rows=(
  "OperatorGraphs/bert_l-3_inference.json|27.92|21.91"
  "OperatorGraphs/bert_l-3_training.json|65.30|54.21"
  "OperatorGraphs/bert_l-12_inference.json|147.48|130.03"
  "LayerGraphs/bert24_inference.json|17.79|17.71"
  "LayerGraphs/bert24_training.json|41.75|39.79"
  "LayerGraphs/resnet50_inference.json|33.77|33.31"
  "LayerGraphs/resnet50_training.json|78.63|76.65"
)

# One ip run: prints "value | bound | gap % | status | seconds".
ip_run() {
  local output
  if ! output=$("$binary" plan --workload "$1" --planner ip --time-limit "$time_limit" --threads "$threads" "${@:2}" 2>&1); then
    echo "error: $(echo "$output" | tail -1) | | | |"
    return
  fi
  local value bound gap status seconds
  value=$(echo "$output" | sed -n 's/^\(max_load_ms\|latency_ms\): //p')
  bound=$(echo "$output" | sed -n 's/^bound_ms: //p')
  gap=$(echo "$output" | sed -n 's/^gap: [0-9.]* (\(.*\)%)$/\1/p')
  status=$(echo "$output" | sed -n 's/^status: //p')
  seconds=$(echo "$output" | sed -n 's/^solver_seconds: \([0-9.]*\) (cpu \([0-9.]*\)),.*/\1 (\2)/p')
  echo "$value | $bound | $gap | $status | $seconds"
}

echo "time limit ${time_limit} s per run, ${threads} CBC thread(s), $("$binary" --version)"
echo
echo "| workload | program | value ms | bound ms | gap % | status | solver s wall (cpu) | published |"
echo "|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
  IFS='|' read -r file published_dp published_ip <<<"$row"
  [[ $file =~ $only ]] || continue
  path=$data/$file
  name=$(basename "$file" .json)
  dp=$("$binary" plan --workload "$path" --planner ideals | sed -n 's/^max_load_ms: //p')
  echo "| $name | ideals DP | $dp | | | | | $published_dp |"
  echo "| $name | IP contiguous, cold | $(ip_run "$path" --contiguous --cold) | $published_dp |"
  echo "| $name | IP contiguous, DP start | $(ip_run "$path" --contiguous) | $published_dp |"
  echo "| $name | IP contiguous (16), DP start | $(ip_run "$path" --contiguous --contiguity reachability) | $published_dp |"
  echo "| $name | IP non-contiguous, DP start | $(ip_run "$path") | $published_ip |"
  if [[ $file == *inference* ]]; then
    echo "| $name | IP latency | $(ip_run "$path" --objective latency) | |"
  fi
done
