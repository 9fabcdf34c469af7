#!/usr/bin/env bash
# Scale benchmark (issue 13 item 6; docs/validation.md §Benchmarks, planning): planning in three
# dimensions at the sizes the papers target, on the analytic cost model.
#   1. GPT-3 175B on 1,024 devices of 80 GiB, 8 per node (configs/gpt3-175b.toml: t, zero, stages,
#      replicas and microbatches left to the planner) against Megatron-LM's published layout of the
#      same model (configs/megatron-gpt3-175b-manual.toml: t 8, 16 stages, data parallel 8, 1F1B,
#      recomputation) predicted by the same cost model: samples/s of both, their ratio, TFLOP/s per
#      device and MFU, and the wall time of `partrain plan`.
#   2. RaNNC's 12.9 B enlarged BERT (256 layers, hidden 2048, 32 heads; configs/bert-enlarged.toml)
#      on 32 devices of 32 GiB (4 nodes x 8), global batch 256, fp32, the config's default devices
#      (1 TFLOP/s, as plan_benchmark): the 3D plan against RaNNC's own space (tensor_parallel 1,
#      no ZeRO) under the same cost model; only the ratio and the wall times mean anything here.
#   3. With --trillion instead (issue 25): planning speed at Narayanan et al.'s (SC'21) Table 1 sizes,
#      everything left to the planner: the 1T GPT (128 layers, hidden 25600, 160 heads, global
#      batch 2048) on 3,072 devices and GPT-3 175B on 1,024: wall seconds, peak resident memory of
#      `partrain plan`, the layout and its predicted samples/s. Each run is held to 6 GB of virtual
#      memory and 300 s, so a regression cannot take the machine.
# Usage: validation/perf/scale_benchmark.sh [--check] [--quick | --trillion] [PARTRAIN_BINARY]
#   --check     exit 1 unless the GPT-3 plan is found within 60 s of wall time, has tensor_parallel > 1
#               and predicts at least Megatron's samples/s (the CTest scale_plan_gpt3); with
#               --trillion: unless the 1T GPT is planned within 60 s and GPT-3 175B within 15 s,
#               each in at most 2 GiB resident, both with tensor_parallel > 1 (the CTest
#               scale_plan_trillion)
#   --quick     GPT-3 only, without the sub-pipelined (Merak §6.3) row
#   --trillion  only the planning-speed runs of item 3
# Exit codes: 0 done (and, with --check, the checks held); 1 a check failed; 2 a command failed.
set -euo pipefail

# Bad input: one line "scale_benchmark.sh: error: ..." and exit status 2 (as the validation scripts).
fail() { echo "scale_benchmark.sh: error: $*" >&2; exit 2; }
check=0
quick=0
trillion=0
binary=""
for argument in "$@"; do
  case "$argument" in
    --check) check=1 ;;
    --quick) quick=1 ;;
    --trillion) trillion=1 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    -*) fail "unknown option $argument (see --help)" ;;
    *) [ -z "$binary" ] || fail "two binaries given: $binary and $argument"; binary="$argument" ;;
  esac
done
root="$(cd "$(dirname "$0")/../.." && pwd)"
binary="${binary:-$root/build/cpu/bin/partrain}"
[ "$quick$trillion" != 11 ] || fail "--quick and --trillion exclude each other"
[ -x "$binary" ] && [ -f "$binary" ] || fail "PARTRAIN_BINARY $binary: no partrain binary there (build the partrain target)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# run NAME ARGS...: `partrain plan ARGS` into $work/NAME.out, its wall time into $work/NAME.wall.
run() {
  local name="$1"
  shift
  local start end
  start=$(date +%s.%N)
  if ! "$binary" plan "$@" > "$work/$name.out" 2>&1; then
    echo "scale_benchmark.sh: partrain plan $* failed:" >&2
    tail -5 "$work/$name.out" >&2
    exit 2
  fi
  end=$(date +%s.%N)
  echo "$start $end" | awk '{ printf "%.2f\n", $2 - $1 }' > "$work/$name.wall"
}

# field NAME WHAT: a figure from the output of run NAME.
field() {
  local file="$work/$1.out"
  case "$2" in
    step_ms) sed -n 's/^predicted: \([0-9.]*\) ms per step.*/\1/p' "$file" | head -1 ;;
    batch) sed -n 's/^model: .* global batch \([0-9]*\),.*/\1/p' "$file" | head -1 ;;
    samples) awk -v b="$(field "$1" batch)" -v ms="$(field "$1" step_ms)" 'BEGIN { printf "%.4g", b / (ms / 1000) }' ;;
    tflops) sed -n 's/^predicted: \([0-9.]*\) TFLOP\/s per device.*/\1/p' "$file" | head -1 ;;
    mfu) sed -n 's/^predicted: .*(MFU \([0-9.]*\)%.*/\1/p' "$file" | head -1 ;;
    recompute_tflops) sed -n 's/^predicted: .*); \([0-9.]*\) TFLOP\/s with recomputation/\1/p' "$file" | head -1 ;;
    layout) grep -m1 '^plan: ' "$file" | sed 's/^plan: //' ;;
    tensor_parallel) grep -m1 '^plan: ' "$file" | sed -n 's/.*tensor parallel \([0-9]*\).*/\1/p' | grep . || echo 1 ;;
    planning) sed -n 's/^planning_seconds: \([0-9.]*\)/\1/p' "$file" ;;
  esac
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }'; }

# measured NAME ARGS...: `partrain plan ARGS` under 6 GB of virtual memory and 300 s, into
# $work/NAME.out, its wall seconds into $work/NAME.wall and its peak resident KiB into $work/NAME.rss.
measured() {
  local name="$1"
  shift
  if ! python3 - "$work/$name" "$binary" plan "$@" <<'PYTHON'
import resource, subprocess, sys, time
prefix, command = sys.argv[1], sys.argv[2:]
def limit():
    resource.setrlimit(resource.RLIMIT_AS, (6_000_000 * 1024, 6_000_000 * 1024))
start = time.monotonic()
with open(prefix + ".out", "w") as out:
    try:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, preexec_fn=limit, timeout=300).returncode
    except subprocess.TimeoutExpired:
        code = 124
wall = time.monotonic() - start
open(prefix + ".wall", "w").write("%.2f\n" % wall)
open(prefix + ".rss", "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(code)
PYTHON
  then
    echo "scale_benchmark.sh: partrain plan $* failed (or passed 300 s / 6 GB):" >&2
    tail -5 "$work/$name.out" >&2
    exit 2
  fi
}

# machine_slowdown: CPU seconds of a fixed, branchy, allocation-heavy reference loop (the planner's
# kind of work) over the 0.59 s it takes on a quiet Intel Xeon @ 2.5 GHz (the machine the bounds were
# set on), the fastest of three.
machine_slowdown() {
  python3 - <<'PYTHON'
import time
def reference():
    table, total = {}, 0
    for i in range(1_500_000):
        key = (i * 2654435761) % 100003
        table[key] = table.get(key, 0) + (i & 7)
        total += table[key] if key & 1 else -1
    return total
best = float("inf")
for _ in range(3):
    start = time.process_time()
    reference()
    best = min(best, time.process_time() - start)
print("%.2f" % (best / 0.59))
PYTHON
}

if [ "$trillion" = 1 ]; then
  echo "== planning speed (issue 25): everything left to the planner, analytic cost model, 80 GiB devices, 8 per node"
  plan_trillion() {
    measured trillion "$root/configs/gpt3-175b.toml" --world-size 3072 --set model.layers=128 --set model.hidden=25600 \
      --set model.heads=160 --set train.global_batch=2048
  }
  plan_gpt3() { measured gpt3 "$root/configs/gpt3-175b.toml" --world-size 1024; }
  plan_trillion
  plan_gpt3
  for name in trillion gpt3; do
    echo "-- $name"
    sed -n '/^layouts tried/,/^plan: /p' "$work/$name.out" | sed '$d'
  done
  printf '%-9s %8s %12s %10s %8s %8s  %s\n' "model" "devices" "step ms" "samples/s" "wall s" "RSS MiB" "layout"
  for name in trillion gpt3; do
    devices=$([ "$name" = trillion ] && echo 3072 || echo 1024)
    printf '%-9s %8s %12s %10s %8s %8d  %s\n' "$name" "$devices" "$(field $name step_ms)" "$(field $name samples)" \
      "$(cat "$work/$name.wall")" "$(( $(cat "$work/$name.rss") / 1024 ))" "$(field $name layout)"
  done
  failed=0
  if [ "$check" = 1 ]; then
    for spec in trillion:60 gpt3:15; do
      name=${spec%%:*}
      most=${spec##*:}
      wall=$(cat "$work/$name.wall")
      # A shared VM's speed moves by up to 1.7x for minutes at a time (GPT-3 took 7.9-16.1 s
      # within one hour, same binary, nothing else running): a wall time over the bound is measured
      # once more, and the bound is scaled by how much slower than on a quiet machine a fixed
      # reference loop runs just before it. A planner that itself got slower still fails.
      if awk -v w="$wall" -v m="$most" 'BEGIN { exit !(w >= m) }'; then
        slowdown=$(machine_slowdown)
        most=$(awk -v m="$most" -v f="$slowdown" 'BEGIN { printf "%.1f", m * (f > 1 ? f : 1) }')
        echo "planning $name took $wall s: measuring it once more (this machine runs the reference loop" \
             "${slowdown}x as slow as when quiet: bound $most s)"
        "plan_$name"
        wall=$(awk -v a="$wall" -v b="$(cat "$work/$name.wall")" 'BEGIN { print (a < b ? a : b) }')
      fi
      rss=$(( $(cat "$work/$name.rss") / 1024 ))
      t=$(field $name tensor_parallel)
      if awk -v w="$wall" -v m="$most" 'BEGIN { exit !(w >= m) }'; then
        echo "CHECK FAILED: planning $name took $wall s (>= $most s)"; failed=1
      fi
      if [ "$rss" -gt 2048 ]; then echo "CHECK FAILED: planning $name peaked at $rss MiB resident (> 2048)"; failed=1; fi
      if [ "$t" -le 1 ]; then echo "CHECK FAILED: the $name plan has tensor_parallel $t (expected > 1)"; failed=1; fi
    done
    [ "$failed" = 0 ] && echo "checks passed: the 1T GPT within 60 s, GPT-3 175B within 15 s, each within 2 GiB resident"
  fi
  exit "$failed"
fi

echo "== GPT-3 175B on 1024 devices of 80 GiB (8 per node), global batch 1536, bf16, analytic cost model"
run gpt3 "$root/configs/gpt3-175b.toml" --world-size 1024 --device-memory 80GiB
run megatron "$root/configs/megatron-gpt3-175b-manual.toml" --world-size 1024 --device-memory 80GiB
ours=$(field gpt3 samples)
theirs=$(field megatron samples)
ours_ms=$(field gpt3 step_ms)
theirs_ms=$(field megatron step_ms)
sed -n '/^layouts tried/,/^plan: /p' "$work/gpt3.out" | sed '$d'
for name in gpt3 megatron; do echo "$name: $(field $name layout)"; done
printf '%-10s %12s %10s %9s %7s %16s %9s %7s\n' "plan" "step ms" "samples/s" "TFLOP/s" "MFU %" "TFLOP/s w/ rec." "plan s" "wall s"
for name in gpt3 megatron; do
  printf '%-10s %12s %10s %9s %7s %16s %9.2f %7s\n' "$name" "$(field $name step_ms)" "$(field $name samples)" \
    "$(field $name tflops)" "$(field $name mfu)" "$(field $name recompute_tflops)" "$(field $name planning)" \
    "$(cat "$work/$name.wall")"
done
echo "ratio ours / Megatron (samples/s): $(ratio "$(field megatron step_ms)" "$(field gpt3 step_ms)")"
if [ "$quick" = 0 ]; then
  # Merak §6.3: the same search with sub-pipelined TMP, whose overlap the cost model credits.
  run merak "$root/configs/gpt3-175b.toml" --world-size 1024 --device-memory 80GiB --set parallel.sub_pipelined_tmp=true
  echo "merak (sub-pipelined TMP): $(field merak layout)"
  printf '%-10s %12s %10s %9s %7s %9.2f %7s
' merak "$(field merak step_ms)" "$(field merak samples)" \
    "$(field merak tflops)" "$(field merak mfu)" "$(field merak planning)" "$(cat "$work/merak.wall")"
  echo "ratio sub-pipelined / Megatron (samples/s): $(ratio "$(field megatron step_ms)" "$(field merak step_ms)")"
fi

failed=0
if [ "$check" = 1 ]; then
  wall=$(cat "$work/gpt3.wall")
  t=$(field gpt3 tensor_parallel)
  if awk -v w="$wall" 'BEGIN { exit !(w >= 60) }'; then echo "CHECK FAILED: planning GPT-3 took $wall s (>= 60 s)"; failed=1; fi
  if [ "$t" -le 1 ]; then echo "CHECK FAILED: the GPT-3 plan has tensor_parallel $t (expected > 1)"; failed=1; fi
  if awk -v a="$ours_ms" -v b="$theirs_ms" 'BEGIN { exit !(a > b) }'; then
    echo "CHECK FAILED: the GPT-3 plan predicts $ours samples/s, below Megatron's layout ($theirs)"; failed=1
  fi
  [ "$failed" = 0 ] && echo "checks passed: found in $wall s, tensor_parallel $t, $ours >= $theirs samples/s"
fi

if [ "$quick" = 0 ]; then
  echo
  echo "== RaNNC's enlarged BERT (256 layers, hidden 2048, 12.9 B parameters) on 32 devices of 32 GiB (4 x 8), global batch 256, fp32"
  bert=("$root/configs/bert-enlarged.toml" --world-size 32 --device-memory 32GiB --set model.hidden=2048
        --set model.layers=256 --set model.heads=32 --set train.global_batch=256)
  run bert3d "${bert[@]}" --set parallel.tensor_parallel=auto --set parallel.zero=auto
  run bert1d "${bert[@]}" --set parallel.tensor_parallel=1 --set parallel.zero=0
  sed -n '/^layouts tried/,/^plan: /p' "$work/bert3d.out" | sed '$d'
  for name in bert3d bert1d; do echo "$name: $(field $name layout)"; done
  printf '%-10s %12s %10s %9s %7s\n' "plan" "step ms" "samples/s" "plan s" "wall s"
  for name in bert3d bert1d; do
    printf '%-10s %12s %10s %9.2f %7s\n' "$name" "$(field $name step_ms)" "$(field $name samples)" "$(field $name planning)" \
      "$(cat "$work/$name.wall")"
  done
  echo "ratio 3D / RaNNC's space (samples/s): $(ratio "$(field bert1d step_ms)" "$(field bert3d step_ms)")"
fi
exit "$failed"
