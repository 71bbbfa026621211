#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 600) from its seed corpus, one after the
# other, and prints a table: executions per second and the coverage libFuzzer reports
# at the end (cov: edges; ft: features; corpus size), with the load average beside it.
# Builds build-fuzz/ first (scripts/fuzz.sh's build). A crash stops the run and names
# the input; add it to fuzz/regressions/TARGET/ as a regression test once fixed.
#   bench/fuzz.sh [SECONDS]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-600}
build=${CORRAL_FUZZ_BUILD:-$root/build-fuzz}
# Builds (and runs each target for one second, so a broken build shows here).
bash "$root/scripts/fuzz.sh" 1 >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf '%-14s %8s %10s %8s %8s %9s %s\n' target seconds exec/s cov ft corpus load
for bin in "$build"/fuzz/*_fuzz; do
  name=$(basename "$bin" _fuzz)
  mkdir -p "$work/$name"
  log="$work/$name.log"
  if ! "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$work/$name/" "$work/$name" "$root/fuzz/corpus/$name" >"$log" 2>&1; then
    echo "$name: FAILED; the input and the report:" >&2
    ls "$work/$name"/crash-* "$work/$name"/timeout-* "$work/$name"/oom-* 2>/dev/null >&2 || true
    tail -30 "$log" >&2
    exit 1
  fi
  done_line=$(grep -E '#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
  runs=$(grep -E 'stat::number_of_executed_units' "$log" | awk '{print $2}')
  cov=$(sed -E 's/.*cov: ([0-9]+).*/\1/' <<<"$done_line")
  ft=$(sed -E 's/.*ft: ([0-9]+).*/\1/' <<<"$done_line")
  corp=$(sed -E 's/.*corp: ([0-9]+)\/.*/\1/' <<<"$done_line")
  printf '%-14s %8s %10s %8s %8s %9s %s\n' "$name" "$seconds" "$((runs / seconds))" "$cov" "$ft" "$corp" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
done
