#!/usr/bin/env bash
# One node's policy table on the easy and the realistic synthetic shapes
# (internal/synth), at each size in BENCH_LAYOUT_PODS (default 10000 30000;
# 100000 is opt-in: the address layout's table on the realistic shape grows
# as pods x policies), in both layouts (identities: the agent's; addresses).
# For each: node-001's (realistic) or node-1's (easy) chains, rules, sets and
# set elements, and `netpol compile --node` from the YAML file, whole path:
# wall time and peak RSS. Counts scale as the issue asks: a namespace and a
# node per 100 pods, a NetworkPolicy per 10, an admin policy per 100, a
# Service per 5.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go build -o "$dir/synth" ./hack/synth
printf '%-10s %-10s %7s %7s %7s %6s %10s %8s %9s\n' shape layout pods chains rules sets elements wall peakRSS
for pods in ${BENCH_LAYOUT_PODS:-10000 30000}; do
  for shape in easy realistic; do
    node=node-1
    [ "$shape" = realistic ] && node=node-001
    "$dir/synth" -shape "$shape" -pods "$pods" -namespaces $((pods / 100)) -nodes $((pods / 100)) \
      -network-policies $((pods / 10)) -admin-policies $((pods / 100)) -services $((pods / 5)) > "$dir/state.yaml"
    for layout in addresses identities; do
      start=$(date +%s.%N)
      /usr/bin/time -f '%M' -o "$dir/rss" bin/netpol compile -f "$dir/state.yaml" --node "$node" --layout "$layout" --stats > /dev/null 2> "$dir/stats"
      end=$(date +%s.%N)
      rss=$(tail -1 "$dir/rss")
      # "node N: C chains, R rules, S sets, E set elements"
      read -r chains rules sets elements < <(sed -n 's/^node [^:]*: \([0-9]*\) chains, \([0-9]*\) rules, \([0-9]*\) sets, \([0-9]*\) set elements$/\1 \2 \3 \4/p' "$dir/stats")
      printf '%-10s %-10s %7d %7d %7d %6d %10d %7.2fs %6d MB\n' "$shape" "$layout" "$pods" "$chains" "$rules" "$sets" "$elements" \
        "$(echo "$end - $start" | bc)" "$((rss / 1024))"
    done
  done
done
