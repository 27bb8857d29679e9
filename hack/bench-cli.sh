#!/usr/bin/env bash
# Scale harness for `netpol table`: the issue's synthetic cluster (1,000 pods,
# 50 namespaces, 500 NetworkPolicies, 50 Admin/Baseline policies), full table
# on 2 ports as JSON, against the same pods without policies (the baseline,
# same run). Prints wall time and peak RSS of the real binary.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go run ./hack/synth > "$dir/scale.yaml"
go run ./hack/synth -network-policies 0 -admin-policies 0 > "$dir/baseline.yaml"

measure() { # name file
  local start end rss
  start=$(date +%s.%N)
  rss=$( { /usr/bin/time -f '%M' bin/netpol table -f "$2" --ports tcp/80,udp/53 -o json > "$dir/$1.json"; } 2>&1 | tail -1)
  end=$(date +%s.%N)
  local cells
  cells=$(grep -c '"allowed"' "$dir/$1.json")
  printf '%-9s wall %6.2f s  peak RSS %5d MB  cells %d\n' "$1" "$(echo "$end - $start" | bc)" "$((rss / 1024))" "$cells"
  echo "$end - $start" | bc > "$dir/$1.time"
}
measure baseline "$dir/baseline.yaml"
measure policies "$dir/scale.yaml"
printf 'ratio policies/baseline wall: %.2f\n' "$(echo "$(cat "$dir/policies.time") / $(cat "$dir/baseline.time")" | bc -l)"
