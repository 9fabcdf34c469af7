#!/usr/bin/env bash
# The slow CTest "data_prepare": runs data/prepare.sh into a temporary directory, checks the HDF5
# headers with h5dump -H, then reads the files with the C++ readers (test_datasets' PreparedData.*).
#   data/check_prepare.sh PATH/TO/test_datasets
set -euo pipefail
script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
test_binary="$1"
output="$(mktemp -d)"
trap 'rm -rf "$output"' EXIT
"$script_dir/prepare.sh" "$output" --vocab-size 8000
for file in text.h5 text.model text.vocab fashion_mnist.h5; do
  [ -s "$output/$file" ] || { echo "check_prepare: $file missing or empty" >&2; exit 1; }
done
header="$(h5dump -H "$output/fashion_mnist.h5")"
grep -q 'DATASPACE  SIMPLE { ( 60000, 28, 28 )' <<<"$header" || { echo "check_prepare: train/images not [60000,28,28]" >&2; exit 1; }
grep -q 'DATASPACE  SIMPLE { ( 10000, 28, 28 )' <<<"$header" || { echo "check_prepare: test/images not [10000,28,28]" >&2; exit 1; }
h5dump -H "$output/text.h5" | grep -q 'DATASET "tokens"' || { echo "check_prepare: text.h5 has no /tokens" >&2; exit 1; }
PARTRAIN_PREPARED_DATA="$output" "$test_binary" --gtest_filter='PreparedData.*'
