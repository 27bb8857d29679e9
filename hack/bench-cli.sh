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

measure() { # name file [table flags...]
  local name=$1 file=$2 start end rss
  shift 2
  start=$(date +%s.%N)
  rss=$( { /usr/bin/time -f '%M' bin/netpol table -f "$file" --ports tcp/80,udp/53 -o json "$@" > "$dir/$name.json"; } 2>&1 | tail -1)
  end=$(date +%s.%N)
  local cells
  cells=$(grep -o '"allowed"' "$dir/$name.json" | wc -l)
  printf '%-12s wall %6.2f s  peak RSS %5d MB  cells %d\n' "$name" "$(echo "$end - $start" | bc)" "$((rss / 1024))" "$cells"
  echo "$end - $start" | bc > "$dir/$name.time"
}
ratio() { # what a b
  printf 'ratio %s: %.2f\n' "$1" "$(echo "$(cat "$dir/$2.time") / $(cat "$dir/$3.time")" | bc -l)"
}
measure baseline "$dir/baseline.yaml"
measure policies "$dir/scale.yaml"
ratio policies/baseline policies baseline
# The same table traced through every node's compiled tables (--engine
# nft), next to the evaluator's; both must print the same cells.
measure nft-baseline "$dir/baseline.yaml" --engine nft
measure nft "$dir/scale.yaml" --engine nft
ratio nft/eval nft policies
cmp -s "$dir/policies.json" "$dir/nft.json" && echo "engines agree on every cell" || { echo "engines DIFFER" >&2; exit 1; }
